//! Tables for people: `list`, `lookup` and `flow dump` as text (`--json` prints the replies
//! as they are).

use vale_abi::control::{FlowTable, LookupInfo, PortInfo, SwitchInfo};
use vale_abi::name::parse_port;

use crate::cli::FlowOp;
use crate::client::Failure;

/// `vale-ctl flow` as text: the rules, each with its id and hits.
pub(crate) fn render_flows(t: &FlowTable, op: &FlowOp) -> String {
    let mut s = match op {
        FlowOp::Dump => format!(
            "{}  flow  rules {}  default {}  missed {}\n",
            t.switch,
            t.rules.len(),
            t.default,
            t.missed
        ),
        FlowOp::Add { .. } => format!("{}  added {}\n", t.switch, t.rules.len()),
        FlowOp::Del { .. } => format!("{}  deleted {}\n", t.switch, t.rules.len()),
    };
    let wi = t
        .rules
        .iter()
        .map(|r| r.id.to_string().len())
        .max()
        .unwrap_or(0);
    let wh = t
        .rules
        .iter()
        .map(|r| r.hits.to_string().len())
        .max()
        .unwrap_or(0);
    for r in &t.rules {
        let m = if r.matches.is_empty() {
            String::new()
        } else {
            format!("{} ", r.matches)
        };
        s += &format!(
            "  id={:<wi$}  hits={:<wh$}  prio={} {m}actions={}\n",
            r.id, r.hits, r.priority, r.actions
        );
    }
    s
}

/// `vale-ctl lookup valeX` as text.
pub(crate) fn render_lookup(l: &LookupInfo) -> String {
    let mut s = format!("{}  lookup {}  ({})\n", l.switch, l.module, l.source);
    for a in &l.args {
        s += &format!("  arg {}={}\n", a.key, a.value);
    }
    let w = l.counters.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in &l.counters {
        s += &format!("  {:<w$}  {}\n", c.name, c.value);
    }
    s
}

/// A switch to show, with its real number of ports (its `ports` may be filtered to one).
pub(crate) struct View {
    pub(crate) info: SwitchInfo,
    pub(crate) total_ports: usize,
}

/// Keeps what `list NAME` asked for: everything, one switch, or one port in its switch.
pub(crate) fn select(switches: Vec<SwitchInfo>, name: Option<&str>) -> Result<Vec<View>, Failure> {
    let mut views = switches.into_iter().map(|info| View {
        total_ports: info.ports.len(),
        info,
    });
    let Some(name) = name else {
        return Ok(views.collect());
    };
    let (sw_name, port) = match parse_port(name) {
        Ok((sw, _)) => (sw, Some(name)),
        Err(_) => (name, None),
    };
    let mut view = views
        .find(|v| v.info.name == sw_name)
        .ok_or_else(|| Failure::Refused(format!("no such switch '{sw_name}'")))?;
    if let Some(port) = port {
        view.info.ports.retain(|p| p.name == port);
        if view.info.ports.is_empty() {
            return Err(Failure::Refused(format!("no such port '{port}'")));
        }
    }
    Ok(vec![view])
}

/// Column titles, and whether each column holds numbers (right-aligned).
pub(crate) const COLUMNS: [(&str, bool); 20] = [
    ("NAME", false),
    ("KIND", false),
    ("DEVICE", false),
    ("STATE", false),
    ("UID", true),
    ("PID", true),
    ("PERSIST", false),
    ("RINGS", true),
    ("SLOTS", true),
    ("BUF", true),
    ("MOD(us)", true),
    ("LEARNT", true),
    ("TX-PKTS", true),
    ("TX-BYTES", true),
    ("RX-PKTS", true),
    ("RX-BYTES", true),
    ("RX-DROP", true),
    ("TX-DROP", true),
    ("BAD", true),
    ("NOLEARN", true),
];

pub(crate) fn port_row(p: &PortInfo) -> Vec<String> {
    // A port nobody holds has no memory, so no ring geometry to show.
    let mapped = p.tx_rings != 0 || p.rx_rings != 0;
    let geometry = |v: String| if mapped { v } else { "-".to_string() };
    let c = &p.counters;
    vec![
        p.name.clone(),
        p.kind.clone(),
        match (&p.device, &p.mode) {
            (Some(d), Some(m)) => format!("{d}/{m}"),
            (Some(d), None) => d.clone(),
            _ => "-".to_string(),
        },
        if p.state.is_empty() { "-" } else { &p.state }.to_string(),
        p.owner_uid.to_string(),
        p.owner_pid
            .map_or_else(|| "-".to_string(), |pid| pid.to_string()),
        if p.persistent { "yes" } else { "no" }.to_string(),
        geometry(format!("{}/{}", p.tx_rings, p.rx_rings)),
        geometry(p.slots.to_string()),
        geometry(p.buf_size.to_string()),
        p.moderation_us.to_string(),
        format!("{}/{}", p.learnt, p.learn_limit),
        c.tx_packets.to_string(),
        c.tx_bytes.to_string(),
        c.rx_packets.to_string(),
        c.rx_bytes.to_string(),
        c.rx_drops.to_string(),
        c.tx_drops.to_string(),
        c.bad_input.to_string(),
        c.learn_refused.to_string(),
    ]
}

/// The human form of `list`: per switch a header line and an indented port table, every
/// table aligned to the same column widths.
pub(crate) fn render(views: &[View]) -> String {
    let header: Vec<String> = COLUMNS.iter().map(|(t, _)| t.to_string()).collect();
    let rows: Vec<Vec<Vec<String>>> = views
        .iter()
        .map(|v| v.info.ports.iter().map(port_row).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows.iter().flatten() {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &[String]| {
        let mut text = String::from(" ");
        for (i, cell) in cells.iter().enumerate() {
            let pad = " ".repeat(widths[i] - cell.chars().count());
            text.push(' ');
            if COLUMNS[i].1 {
                text.push_str(&pad);
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.push_str(&pad);
            }
            text.push(' ');
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    let mut out = String::new();
    for (i, (view, rows)) in views.iter().zip(&rows).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let sw = &view.info;
        out.push_str(&format!(
            "{}  lookup {}  batch {}  ports {}\n",
            sw.name, sw.lookup, sw.batch, view.total_ports
        ));
        if !rows.is_empty() {
            line(&mut out, &header);
            for row in rows {
                line(&mut out, row);
            }
        }
        for p in &sw.ports {
            if let Some(n) = &p.negotiated {
                out.push_str(&format!("  {}: {n}\n", p.name));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, owner: Option<u32>) -> PortInfo {
        PortInfo {
            name: name.into(),
            kind: "native".into(),
            persistent: owner.is_none(),
            owner_pid: owner,
            tx_rings: if owner.is_some() { 1 } else { 0 },
            rx_rings: if owner.is_some() { 1 } else { 0 },
            slots: if owner.is_some() { 1024 } else { 0 },
            buf_size: if owner.is_some() { 2048 } else { 0 },
            ..Default::default()
        }
    }

    fn switches() -> Vec<SwitchInfo> {
        vec![
            SwitchInfo {
                name: "vale0".into(),
                lookup: "learning".into(),
                batch: 512,
                ports: vec![port("vale0:a", None), port("vale0:b", Some(4242))],
            },
            SwitchInfo {
                name: "vale1".into(),
                lookup: "hub".into(),
                batch: 64,
                ports: vec![port("vale1:long-port-name", Some(7))],
            },
        ]
    }

    #[test]
    fn select_filters() {
        assert_eq!(select(switches(), None).ok().unwrap().len(), 2);
        let v = select(switches(), Some("vale1")).ok().unwrap();
        assert_eq!((v.len(), v[0].info.name.as_str()), (1, "vale1"));
        let v = select(switches(), Some("vale0:b")).ok().unwrap();
        assert_eq!((v[0].info.ports.len(), v[0].total_ports), (1, 2));
        assert_eq!(v[0].info.ports[0].name, "vale0:b");
        match select(switches(), Some("vale9")) {
            Err(Failure::Refused(m)) => assert_eq!(m, "no such switch 'vale9'"),
            _ => panic!(),
        }
        match select(switches(), Some("vale0:z")) {
            Err(Failure::Refused(m)) => assert_eq!(m, "no such port 'vale0:z'"),
            _ => panic!(),
        }
    }

    #[test]
    fn render_aligns() {
        let text = render(&select(switches(), None).ok().unwrap());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "vale0  lookup learning  batch 512  ports 2");
        assert!(lines[1].trim_start().starts_with("NAME"));
        assert!(lines[2].contains("  -  ") && lines[2].contains(" yes "));
        assert!(lines[3].contains(" 4242 ") && lines[3].contains(" 1/1 "));
        assert_eq!(lines[4], "");
        assert_eq!(lines[5], "vale1  lookup hub  batch 64  ports 1");
        // Every table line puts BAD's right edge in the same place.
        let ends: Vec<usize> = [1, 2, 3, 6, 7].iter().map(|&i| lines[i].len()).collect();
        assert!(ends.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert_eq!(render(&[]), "");
    }
}
