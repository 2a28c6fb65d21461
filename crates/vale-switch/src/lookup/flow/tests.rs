use super::*;
use crate::ErrorKind;

const A: u8 = 0xa;
const B: u8 = 0xb;

fn args(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A flow table with `rules`, ports vale0:p0..p3 at indices 0..3.
fn table(rules: &str) -> Flow {
    let f = Flow::new(&args(&[("rules", rules)])).unwrap();
    for i in 0..4u16 {
        f.port_added(i, &format!("vale0:p{i}"));
    }
    f
}

fn eth(dst: u8, src: u8, ty: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, dst, 2, 0, 0, 0, 0, src];
    f.extend_from_slice(&ty.to_be_bytes());
    f
}

/// Ethernet + IPv4 (`proto`) + 4 bytes of ports, padded to 60.
fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, sport: u16, dport: u16) -> Vec<u8> {
    let mut f = eth(B, A, 0x0800);
    let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, proto, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.resize(60, 0);
    f
}

/// Ethernet + IPv6 with extension headers `ext` (next header, bytes) then `proto` ports.
fn v6(src: Ipv6Addr, dst: Ipv6Addr, ext: &[(u8, Vec<u8>)], proto: u8, dport: u16) -> Vec<u8> {
    let mut f = eth(B, A, 0x86dd);
    let first = ext.first().map_or(proto, |e| e.0);
    f.extend_from_slice(&[0x60, 0, 0, 0, 0, 0, first, 64]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    for (i, (_, body)) in ext.iter().enumerate() {
        let next = ext.get(i + 1).map_or(proto, |e| e.0);
        let mut b = body.clone();
        b[0] = next;
        f.extend_from_slice(&b);
    }
    f.extend_from_slice(&1000u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.resize(f.len().max(60), 0);
    f
}

fn tag(f: &[u8], vid: u16) -> Vec<u8> {
    let mut f = f.to_vec();
    f.splice(12..12, [0x81, 0x00, (vid >> 8) as u8, vid as u8]);
    f
}

fn port(index: PortIndex) -> SourcePort {
    SourcePort {
        index,
        ring: 0,
        learn_limit: LearningBridge::DEFAULT_LEARN_LIMIT,
    }
}

/// Where `frame` from port `from` goes, its first slot cut at `first_len`.
fn decide_cut(t: &Flow, from: PortIndex, frame: &[u8], first_len: usize) -> u16 {
    let mut m = [FrameMeta::new(
        frame.as_ptr(),
        first_len as u32,
        frame.len() as u32,
        0,
    )];
    t.lookup(port(from), &mut m, 1);
    m[0].dst
}

fn decide(t: &Flow, from: PortIndex, frame: &[u8]) -> u16 {
    decide_cut(t, from, frame, frame.len())
}

fn hits(t: &Flow) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = t
        .dump("vale0")
        .rules
        .iter()
        .map(|r| (r.id, r.hits))
        .collect();
    v.sort();
    v
}

#[test]
fn the_grammar_reads_good_rules() {
    let r = parse_rule("prio=10 ip,nw_dst=10.1.2.3/8,tcp,tp_dst=22 actions=drop").unwrap();
    assert_eq!(r.priority, 10);
    assert_eq!(r.action, Action::Drop);
    assert_eq!(render_match(&r.matches), "tcp,nw_dst=10.0.0.0/8,tp_dst=22");
    let cases = [
        ("actions=normal", "", DEFAULT_PRIORITY, "normal"),
        ("priority=0,actions=flood", "", 0, "flood"),
        (
            "in_port=vale0:a dl_src=02:00:00:00:00:0a actions=output:vale0:b",
            "in_port=vale0:a,dl_src=02:00:00:00:00:0a",
            DEFAULT_PRIORITY,
            "output:vale0:b",
        ),
        (
            "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00,actions=drop",
            "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "dl_type=0x88b5 actions=drop",
            "dl_type=0x88b5",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "dl_vlan=10 actions=drop",
            "dl_vlan=10",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "dl_vlan=none actions=drop",
            "dl_vlan=none",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "ip,nw_proto=47 actions=drop",
            "ip,nw_proto=47",
            DEFAULT_PRIORITY,
            "drop",
        ),
        ("arp actions=flood", "arp", DEFAULT_PRIORITY, "flood"),
        (
            "udp6,ipv6_src=2001:db8::1/32,tp_src=53 actions=drop",
            "udp6,ipv6_src=2001:db8::/32,tp_src=53",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "ipv6,ipv6_dst=fe80::1 actions=drop",
            "ipv6,ipv6_dst=fe80::1/128",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "udp,tp_dst=0x1000/0xf000 actions=drop",
            "udp,tp_dst=4096/0xf000",
            DEFAULT_PRIORITY,
            "drop",
        ),
        ("icmp6 actions=drop", "icmp6", DEFAULT_PRIORITY, "drop"),
        (
            "ip,nw_src=0.0.0.0/0 actions=drop",
            "ip,nw_src=0.0.0.0/0",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "ipv6,ipv6_dst=::/0 actions=drop",
            "ipv6,ipv6_src=::/0",
            DEFAULT_PRIORITY,
            "drop",
        ),
        (
            "udp,tp_dst=0/0 actions=drop",
            "udp,tp_src=0/0x0000",
            DEFAULT_PRIORITY,
            "drop",
        ),
    ];
    for (text, m, prio, action) in cases {
        let r = parse_rule(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(render_match(&r.matches), m, "{text}");
        assert_eq!(
            (r.priority, r.action.to_string().as_str()),
            (prio, action),
            "{text}"
        );
        // The canonical text reads back to the same rule.
        let again = parse_rule(&format!("prio={prio} {m} actions={action}")).unwrap();
        assert_eq!(again, r, "{text}");
    }
}

#[test]
fn the_grammar_refuses_bad_rules_saying_why() {
    let cases = [
        ("tcp,tp_dst=22", "no 'actions='"),
        ("tcp,tp_dst=22 actions=", "no action"),
        ("tcp actions=output", "unknown action"),
        ("tcp actions=drop,flood", "exactly one action"),
        ("tcp actions=output:b", "bad name"),
        ("tcp,tp_dst=70000 actions=drop", "out of range"),
        ("tp_dst=22 actions=drop", "need tcp or udp"),
        ("ip,tp_dst=22 actions=drop", "need tcp or udp"),
        ("nw_dst=10.0.0.1 actions=drop", "need ip"),
        ("ipv6,nw_dst=10.0.0.1 actions=drop", "need ip"),
        ("ip,ipv6_dst=::1 actions=drop", "need ipv6"),
        ("nw_proto=6 actions=drop", "needs ip or ipv6"),
        ("ip,nw_dst=10.0.0.300 actions=drop", "not an IPv4 address"),
        ("ip,nw_dst=10.0.0.0/33 actions=drop", "not a prefix length"),
        ("ipv6,ipv6_dst=::1/129 actions=drop", "not a prefix length"),
        ("dl_src=02:00:00:00:00 actions=drop", "not a MAC address"),
        ("dl_vlan=4096 actions=drop", "out of range"),
        ("prio=65536 actions=drop", "out of range"),
        ("prio=1,prio=2 actions=drop", "given twice"),
        ("tcp,udp actions=drop", "nw_proto is given twice (6 and 17)"),
        ("ipv6,tcp actions=drop", "dl_type is given twice"),
        ("dl_type=0x0806,ip actions=drop", "dl_type is given twice"),
        ("nw_dts=1.2.3.4 actions=drop", "unknown field 'nw_dts'"),
        ("bogus actions=drop", "unknown field 'bogus'"),
        ("ip,nw_dst=10.0.0.1actions=drop", "runs into"),
        ("in_port=a actions=drop", "bad name"),
    ];
    for (text, why) in cases {
        match parse_rule(text) {
            Ok(r) => panic!("{text} was taken: {r:?}"),
            Err(e) => assert!(
                e.to_string().contains(why),
                "{text}: '{e}' does not say '{why}'"
            ),
        }
    }
    let e = parse_rules("# comment\n\nactions=drop\n  tcp,tp_dst=x actions=drop\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 4") && e.contains("'tcp,tp_dst=x actions=drop'"),
        "{e}"
    );
}

#[test]
fn each_field_matches_frame_by_frame() {
    let t = table(
        "prio=100 in_port=vale0:p1 actions=output:vale0:p3\n\
         prio=90 dl_src=02:00:00:00:00:0c actions=output:vale0:p2\n\
         prio=80 dl_dst=02:00:00:00:00:0c actions=output:vale0:p2\n\
         prio=70 dl_vlan=7 actions=output:vale0:p1\n\
         prio=60 dl_type=0x88b5 actions=flood\n\
         prio=50 udp,nw_src=192.168.1.0/24,tp_src=53 actions=output:vale0:p1\n\
         prio=40 tcp,nw_dst=10.0.0.0/8,tp_dst=22 actions=drop\n\
         prio=35 ip,nw_proto=47 actions=output:vale0:p3\n\
         prio=30 tcp6,ipv6_dst=2001:db8::/32,tp_dst=80 actions=output:vale0:p2\n\
         prio=20 ipv6,ipv6_src=fe80::/10 actions=output:vale0:p3\n\
         prio=10 ip actions=output:vale0:p2\n",
    );
    let ssh = v4([1, 1, 1, 1], [10, 9, 8, 7], 6, 4000, 22);
    assert_eq!(decide(&t, 0, &ssh), DEST_DROP, "tcp to 10/8 port 22");
    assert_eq!(decide(&t, 1, &ssh), 3, "in_port wins");
    assert_eq!(
        decide(&t, 0, &v4([1, 1, 1, 1], [11, 9, 8, 7], 6, 4000, 22)),
        2,
        "not 10/8"
    );
    assert_eq!(
        decide(&t, 0, &v4([1, 1, 1, 1], [10, 9, 8, 7], 6, 4000, 23)),
        2,
        "port 23"
    );
    assert_eq!(
        decide(&t, 0, &v4([1, 1, 1, 1], [10, 9, 8, 7], 17, 4000, 22)),
        2,
        "udp"
    );
    assert_eq!(
        decide(&t, 0, &v4([192, 168, 1, 9], [1, 2, 3, 4], 17, 53, 9)),
        1,
        "dns"
    );
    assert_eq!(
        decide(&t, 0, &v4([192, 168, 2, 9], [1, 2, 3, 4], 17, 53, 9)),
        2,
        "/24"
    );
    assert_eq!(
        decide(&t, 0, &v4([1, 1, 1, 1], [2, 2, 2, 2], 47, 0, 0)),
        3,
        "gre"
    );
    let mut c_src = ssh.clone();
    c_src[11] = 0xc;
    assert_eq!(decide(&t, 0, &c_src), 2, "dl_src");
    let mut c_dst = v4([1, 1, 1, 1], [1, 1, 1, 1], 6, 1, 1);
    c_dst[5] = 0xc;
    assert_eq!(decide(&t, 0, &c_dst), 2, "dl_dst");
    assert_eq!(decide(&t, 0, &tag(&ssh, 7)), 1, "vlan 7");
    assert_eq!(
        decide(&t, 0, &tag(&ssh, 8)),
        DEST_DROP,
        "vlan 8: the ip rules apply"
    );
    let mut other = eth(B, A, 0x88b5);
    other.resize(60, 0);
    assert_eq!(decide(&t, 0, &other), DEST_FLOOD, "dl_type");
    let web: Ipv6Addr = "2001:db8::80".parse().unwrap();
    let ll: Ipv6Addr = "fe80::1".parse().unwrap();
    let g: Ipv6Addr = "2002::1".parse().unwrap();
    assert_eq!(
        decide(&t, 0, &v6(g, web, &[], 6, 80)),
        2,
        "tcp6 to 2001:db8::/32"
    );
    assert_eq!(decide(&t, 0, &v6(ll, web, &[], 6, 81)), 3, "fe80::/10");
    assert_eq!(
        decide(&t, 0, &v6(g, g, &[], 6, 80)),
        DEST_FLOOD,
        "no rule: normal floods"
    );
    assert_eq!(t.dump("vale0").missed, 1);
}

#[test]
fn priorities_ties_and_the_default() {
    let t = table(
        "prio=5 udp actions=output:vale0:p1\n\
         prio=5 ip actions=output:vale0:p2\n\
         prio=9 udp,tp_dst=9 actions=output:vale0:p3\n",
    );
    let u9 = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 9);
    let u8 = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 8);
    assert_eq!(decide(&t, 0, &u9), 3, "higher priority");
    assert_eq!(decide(&t, 0, &u8), 1, "tie: the first added");
    let dump = t.dump("vale0");
    let order: Vec<u64> = dump.rules.iter().map(|r| r.id).collect();
    assert_eq!(order, vec![3, 1, 2], "the order they are tried");
    assert_eq!(dump.default, "normal");
    // The default: normal learns, then finds; drop, flood, output.
    let mut arp = eth(0xff, A, 0x0806);
    arp[..6].copy_from_slice(&[0xff; 6]);
    arp.resize(60, 0);
    assert_eq!(decide(&t, 2, &arp), DEST_FLOOD, "normal floods broadcast");
    let mut back = eth(A, B, 0x0806);
    back.resize(60, 0);
    assert_eq!(decide(&t, 1, &back), 2, "normal: A was learnt on port 2");
    for (d, want) in [
        ("drop", DEST_DROP),
        ("flood", DEST_FLOOD),
        ("output:vale0:p3", 3),
    ] {
        let t = Flow::new(&args(&[("default", d)])).unwrap();
        t.port_added(3, "vale0:p3");
        assert_eq!(decide(&t, 0, &back), want, "default {d}");
        assert_eq!(t.dump("x").default, d);
    }
    assert!(Flow::new(&args(&[("default", "nowhere")])).is_err());
    assert!(Flow::new(&args(&[("rulez", "")])).is_err());
}

#[test]
fn hit_counters_count_and_survive_changes() {
    let t = table("prio=1 udp actions=output:vale0:p1\nprio=2 tcp actions=output:vale0:p2\n");
    let u = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 9);
    let p = v4([1, 1, 1, 1], [2, 2, 2, 2], 6, 1, 9);
    let batch: Vec<&Vec<u8>> = vec![&u, &u, &p, &u, &p, &p, &p];
    let mut m: Vec<FrameMeta> = batch
        .iter()
        .map(|f| FrameMeta::new(f.as_ptr(), 60, 60, 0))
        .collect();
    t.lookup(port(0), &mut m, 1);
    let dsts: Vec<u16> = m.iter().map(|f| f.dst).collect();
    assert_eq!(dsts, vec![1, 1, 2, 1, 2, 2, 2]);
    assert_eq!(hits(&t), vec![(1, 3), (2, 4)]);
    // A change rebuilds the classifier; the rules that stay keep their counts.
    let added = t.add_text("prio=3 udp,tp_dst=10 actions=drop").unwrap();
    assert_eq!(added[0].id, 3);
    assert_eq!(hits(&t), vec![(1, 3), (2, 4), (3, 0)]);
    t.del("2").unwrap();
    assert_eq!(hits(&t), vec![(1, 3), (3, 0)]);
    assert_eq!(
        decide(&t, 0, &p),
        DEST_FLOOD,
        "tcp: no rule now, normal floods"
    );
    assert_eq!(decide(&t, 0, &u), 1);
    assert_eq!(hits(&t), vec![(1, 4), (3, 0)]);
}

#[test]
fn add_and_del_are_all_or_nothing() {
    let t = table("prio=1 udp actions=drop\nprio=1 tcp,tp_dst=22 actions=drop\n");
    let e = t
        .add_text("prio=2 udp actions=flood\nprio=2 udp,tp_dst=x actions=flood")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2"), "{e}");
    assert_eq!(t.dump("vale0").rules.len(), 2, "nothing added");
    assert!(t
        .del("99")
        .unwrap_err()
        .to_string()
        .contains("no rule with id 99"));
    assert!(t
        .del("tcp")
        .unwrap_err()
        .to_string()
        .contains("no rule has exactly"));
    assert!(t.del("tcp,tp_dst=22 actions=drop").is_err());
    assert!(t.del("prio=2 tcp,tp_dst=22").is_err(), "another priority");
    let gone = t.del("tcp,tp_dst=22").unwrap();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].matches, "tcp,tp_dst=22");
    t.add_text("prio=7 udp actions=flood").unwrap();
    let gone = t.del("udp").unwrap();
    assert_eq!(gone.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 3]);
    assert!(t.dump("vale0").rules.is_empty());
    assert_eq!(
        t.add_text("id=5").unwrap_err().to_string(),
        "bad rule at line 1, 'id=5': no 'actions=' (a rule is '[prio=N] MATCH actions=ACTION')"
    );
    assert!(t
        .add_text("\n# nothing\n")
        .unwrap_err()
        .to_string()
        .contains("no rule given"));
}

#[test]
fn ports_come_and_go_by_name() {
    let t = Flow::new(&args(&[(
        "rules",
        "in_port=vale0:late actions=output:vale0:b\nactions=output:vale0:late",
    )]))
    .unwrap();
    let f = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 9);
    t.port_added(0, "vale0:a");
    assert_eq!(decide(&t, 0, &f), DEST_DROP, "vale0:late is not there");
    assert_eq!(t.counters()[3], ("no_port".to_string(), 1));
    t.port_added(5, "vale0:late");
    assert_eq!(decide(&t, 0, &f), 5);
    assert_eq!(decide(&t, 5, &f), DEST_DROP, "from late: b is not there");
    t.port_added(1, "vale0:b");
    assert_eq!(decide(&t, 5, &f), 1);
    // Names survive a rebuild.
    t.add_text("prio=1 arp actions=drop").unwrap();
    assert_eq!(decide(&t, 5, &f), 1);
    assert_eq!(decide(&t, 0, &f), 5);
    t.port_removed(5);
    assert_eq!(decide(&t, 0, &f), DEST_DROP);
    assert_eq!(decide(&t, 5, &f), DEST_DROP, "index 5 is nobody now");
    assert_eq!(t.port_names(), vec!["vale0:late", "vale0:b"]);
}

#[test]
fn malformed_frames_never_match_what_they_lack() {
    let t = table(
        "prio=9 udp,tp_dst=0 actions=output:vale0:p1\n\
         prio=8 ip,nw_src=0.0.0.0/0 actions=output:vale0:p2\n\
         prio=7 ipv6,ipv6_src=::/0 actions=output:vale0:p3\n\
         prio=1 actions=drop\n",
    );
    let f = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 0, 0);
    assert_eq!(decide(&t, 0, &f), 1, "whole: port 0 matches");
    // Cut at every length: never a read past first_len (checked under Miri/ASan by the
    // slice bounds), never a match on a field not there.
    for cut in 14..=f.len() {
        let d = decide_cut(&t, 0, &f, cut);
        let want = if cut >= 14 + 20 + 4 {
            1
        } else if cut >= 14 + 20 {
            2
        } else {
            DEST_DROP
        };
        assert_eq!(d, want, "cut at {cut}");
    }
    // A later fragment has no ports; the first has.
    let mut later = f.clone();
    later[14 + 6] = 0x00;
    later[14 + 7] = 0x10;
    assert_eq!(decide(&t, 0, &later), 2);
    let mut first = f.clone();
    first[14 + 6] = 0x20; // more fragments, offset 0
    assert_eq!(decide(&t, 0, &first), 1);
    // Bad IHL, bad version: not IP as far as the rules go.
    let mut bad = f.clone();
    bad[14] = 0x44;
    assert_eq!(decide(&t, 0, &bad), DEST_DROP);
    bad[14] = 0x65;
    assert_eq!(decide(&t, 0, &bad), DEST_DROP);
    // An IHL longer than the frame: addresses known, ports not.
    let mut long = f.clone();
    long[14] = 0x4f;
    assert_eq!(decide(&t, 0, &long), 2);
    // A tag cut short.
    let tagged = tag(&f, 3);
    assert_eq!(decide_cut(&t, 0, &tagged, 15), DEST_DROP);
    assert_eq!(decide_cut(&t, 0, &tagged, 17), DEST_DROP);
}

#[test]
fn ipv6_extension_headers_are_walked_within_bounds() {
    let t = table(
        "prio=9 udp6,tp_dst=53 actions=output:vale0:p1\n\
         prio=8 ipv6,nw_proto=44 actions=output:vale0:p2\n\
         prio=7 ipv6,nw_proto=60 actions=output:vale0:p3\n\
         prio=6 ipv6,nw_proto=17 actions=flood\n\
         prio=1 actions=drop\n",
    );
    let (s, d): (Ipv6Addr, Ipv6Addr) = (
        "2001:db8::1".parse().unwrap(),
        "2001:db8::2".parse().unwrap(),
    );
    let hop = (0u8, vec![0u8; 8]);
    let dst_opt = (60u8, vec![0u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let frag0 = (44u8, vec![0u8, 0, 0, 1, 0, 0, 0, 1]);
    let frag_later = (44u8, vec![0u8, 0, 0, 0x08, 0, 0, 0, 1]);
    let ah = (51u8, vec![0u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(decide(&t, 0, &v6(s, d, &[], 17, 53)), 1);
    assert_eq!(
        decide(
            &t,
            0,
            &v6(s, d, &[hop.clone(), dst_opt.clone(), ah], 17, 53)
        ),
        1
    );
    assert_eq!(
        decide(&t, 0, &v6(s, d, &[frag0], 17, 53)),
        1,
        "first fragment"
    );
    assert_eq!(
        decide(&t, 0, &v6(s, d, &[frag_later], 17, 53)),
        DEST_FLOOD,
        "later: udp, no ports"
    );
    // More extension headers than are walked: the protocol is where the walk stopped.
    let many: Vec<(u8, Vec<u8>)> = (0..MAX_EXT_HEADERS + 1).map(|_| dst_opt.clone()).collect();
    let f = v6(s, d, &many, 17, 53);
    assert_eq!(decide(&t, 0, &f), 3);
    // Cut anywhere: no panic, no read past the cut.
    let f = v6(s, d, &[hop, dst_opt], 17, 53);
    for cut in 14..=f.len() {
        decide_cut(&t, 0, &f, cut);
    }
    assert_eq!(
        decide_cut(&t, 0, &f, 14 + 40 + 8 + 1),
        2 + 1,
        "cut in the options: stopped there"
    );
}

#[test]
fn the_cache_follows_rule_changes() {
    // Enough masks for the cache to be used.
    let mut rules = String::new();
    for len in 8..=32 {
        rules += &format!(
            "prio={len} ip,nw_dst=10.0.0.0/{len} actions=output:vale0:p{}\n",
            len % 3 + 1
        );
    }
    let t = table(&rules);
    assert!(t.current.load().subtables.len() > CACHE_ABOVE_MASKS);
    let f = v4([1, 1, 1, 1], [10, 0, 0, 0], 17, 1, 9);
    assert_eq!(decide(&t, 0, &f), (32 % 3 + 1) as u16);
    assert_eq!(decide(&t, 0, &f), (32 % 3 + 1) as u16, "from the cache");
    t.del("prio=32 ip,nw_dst=10.0.0.0/32").unwrap();
    assert_eq!(
        decide(&t, 0, &f),
        (31 % 3 + 1) as u16,
        "a stale entry is not taken"
    );
    // Mixed keys in one batch, many times over: the same as the search's answer.
    let frames: Vec<Vec<u8>> = (0..64u8)
        .map(|i| v4([1, 1, 1, 1], [10, 0, i % 4, i], 17, 1, 9))
        .collect();
    for _ in 0..3 {
        let mut m: Vec<FrameMeta> = frames
            .iter()
            .map(|f| FrameMeta::new(f.as_ptr(), 60, 60, 0))
            .collect();
        t.lookup(port(0), &mut m, 1);
        for (f, m) in frames.iter().zip(&m) {
            let a = u32::from_be_bytes(f[30..34].try_into().unwrap());
            let len = (a ^ 0x0a00_0000).leading_zeros().min(31);
            assert_eq!(m.dst, (len % 3 + 1) as u16, "{a:x}");
        }
    }
}

/// With many masks (prefix tracking on), every frame gets the rule a linear scan of the
/// rules picks: random prefixes of a few addresses on v4 and v6 sources and
/// destinations, random protocols and ports, frames near and far from the prefixes.
#[test]
fn prefix_tracking_decides_as_a_linear_scan() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let v4s = [
        [10, 1, 2, 3],
        [10, 1, 200, 4],
        [192, 168, 9, 9],
        [245, 0, 0, 1],
    ];
    let v6s: [Ipv6Addr; 3] = [
        "2001:db8::1".parse().unwrap(),
        "2001:db8:0:ff::2".parse().unwrap(),
        "fe80::9".parse().unwrap(),
    ];
    let mut text = String::new();
    for _ in 0..400 {
        let prio = 1 + rnd(5);
        let mut m = vec![];
        let v6 = rnd(3) == 0;
        m.push(if rnd(2) == 0 { "udp" } else { "tcp" }.to_string());
        if v6 {
            m[0] += "6";
        }
        for field in ["src", "dst"] {
            if rnd(4) != 0 {
                m.push(if v6 {
                    let a = v6s[rnd(3) as usize];
                    format!("ipv6_{field}={a}/{}", 1 + rnd(128))
                } else {
                    let a = Ipv4Addr::from(v4s[rnd(4) as usize]);
                    format!("nw_{field}={a}/{}", 1 + rnd(32))
                });
            }
        }
        if rnd(3) == 0 {
            m.push(format!("tp_dst={}", rnd(3)));
        }
        text += &format!("prio={prio} {} actions=drop\n", m.join(","));
    }
    let t = table(&text);
    let c = t.counters();
    assert!(c
        .iter()
        .any(|(k, v)| k == "masks" && *v > TRACK_ABOVE_MASKS as u64));
    assert!(
        c.iter().any(|(k, v)| k == "tracked_fields" && *v == 4),
        "{c:?}"
    );
    let rules = parse_rules(&text).unwrap();
    let ids: Vec<u64> = hits(&t).iter().map(|h| h.0).collect();
    for _ in 0..4000 {
        // An address of the pool with its last bits (0 to all) random.
        let near = |a: u128, bits: u32, rnd: &mut dyn FnMut(u64) -> u64| {
            let keep = rnd(bits as u64 + 1) as u32;
            let low = if keep == bits {
                0
            } else {
                !0u128 >> (128 - bits + keep)
            };
            a ^ (rnd(u64::MAX) as u128 * 0x9e37_79b9_7f4a_7c15) & low
        };
        let (proto, dport) = (if rnd(2) == 0 { 17 } else { 6 }, rnd(4) as u16);
        let f = if rnd(3) == 0 {
            let s = near(u128::from(v6s[rnd(3) as usize]), 128, &mut rnd);
            let d = near(u128::from(v6s[rnd(3) as usize]), 128, &mut rnd);
            v6(s.into(), d.into(), &[], proto, dport)
        } else {
            let s = near(
                u32::from(Ipv4Addr::from(v4s[rnd(4) as usize])) as u128,
                32,
                &mut rnd,
            );
            let d = near(
                u32::from(Ipv4Addr::from(v4s[rnd(4) as usize])) as u128,
                32,
                &mut rnd,
            );
            v4(
                (s as u32).to_be_bytes(),
                (d as u32).to_be_bytes(),
                proto,
                7,
                dport,
            )
        };
        let k = extract(
            &FrameMeta::new(f.as_ptr(), f.len() as u32, f.len() as u32, 0),
            0,
        );
        let want = rules
            .iter()
            .enumerate()
            .filter(|(_, r)| k.and(&r.matches.mask) == r.matches.value.and(&r.matches.mask))
            .max_by_key(|(i, r)| (r.priority, std::cmp::Reverse(*i)))
            .map(|(i, _)| ids[i]);
        let before = hits(&t);
        decide(&t, 0, &f);
        let got: Vec<u64> = hits(&t)
            .iter()
            .zip(&before)
            .filter(|(a, b)| a.1 != b.1)
            .map(|(a, _)| a.0)
            .collect();
        assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{f:02x?}");
    }
}

#[test]
fn the_table_is_bounded() {
    let t = Flow::new(&[]).unwrap();
    let many = "udp actions=drop\n".repeat(MAX_RULES);
    t.add_text(&many).unwrap();
    let e = t.add_text("tcp actions=drop").unwrap_err().to_string();
    assert!(e.contains("limit of 200000"), "{e}");
    assert_eq!(t.counters()[1], ("masks".to_string(), 1));
    assert!(parse_rules(&"udp actions=drop\n".repeat(MAX_RULES + 1)).is_err());
}

#[test]
fn a_dump_page_by_page_is_the_dump() {
    let t = Flow::new(&[]).unwrap();
    let text: String = (0..1000)
        .map(|i| format!("prio={} udp,tp_dst={i} actions=drop\n", i % 7))
        .collect();
    t.add_text(&text).unwrap();
    let whole = t.dump("vale0").rules;
    for max in [1, 7, 999, 1000, 5000] {
        let (mut pages, mut after) = (Vec::new(), 0);
        loop {
            let p = t.dump_page("vale0", after, max);
            assert!(p.rules.len() <= max);
            pages.extend(p.rules);
            match p.next {
                Some(n) => after = n,
                None => break,
            }
        }
        assert_eq!(pages, whole, "pages of {max}");
    }
}

/// The module's commands, as valed carries them: text in, the JSON of a `FlowTable` out, each
/// refusal of the kind valed's reply gives it.
#[test]
fn commands_add_del_dump_through_the_control_seam() {
    let t = table("");
    let ctx = ControlCtx { switch: "vale0" };
    let kind = |e: Error| crate::Error::from(e).kind;
    let table = |s: String| serde_json::from_str::<FlowTable>(&s).expect("a FlowTable");
    let added = table(
        t.control(
            ctx,
            "add",
            "prio=5 udp actions=drop\ntcp actions=output:vale0:p1",
        )
        .unwrap(),
    );
    assert_eq!(added.switch, "vale0");
    assert_eq!(added.rules.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2]);
    // All or none, a bad rule is an invalid argument.
    let e = t.control(ctx, "add", "udp actions=flood\nudp,bogus=1 actions=drop");
    assert_eq!(kind(e.unwrap_err()), ErrorKind::InvalidArgument);
    // A port of another switch is refused, as at installation.
    let e = t.control(ctx, "add", "actions=output:vale1:x").unwrap_err();
    assert!(e.to_string().contains("not on switch 'vale0'"), "{e}");
    assert_eq!(table(t.control(ctx, "dump", "").unwrap()).rules.len(), 2);
    // Paged: `after=N` with the `next` of the page before.
    let many: String = (0..FLOW_DUMP_PAGE + 10)
        .map(|i| format!("udp,tp_dst={i} actions=drop\n"))
        .collect();
    t.control(ctx, "add", &many).unwrap();
    let first = table(t.control(ctx, "dump", "").unwrap());
    assert_eq!(first.rules.len(), FLOW_DUMP_PAGE);
    let next = first.next.expect("more after the first page");
    let second = table(t.control(ctx, "dump", &format!("after={next}")).unwrap());
    assert_eq!(second.rules.len(), 12);
    assert_eq!(second.next, None);
    let e = t.control(ctx, "dump", "after=x").unwrap_err();
    assert_eq!(kind(e), ErrorKind::InvalidArgument);
    let gone = table(t.control(ctx, "del", "2").unwrap());
    assert_eq!(gone.rules[0].id, 2);
    assert_eq!(
        kind(t.control(ctx, "del", "2").unwrap_err()),
        ErrorKind::NotFound
    );
    // An unknown command is unsupported, and says which there are.
    let e = t.control(ctx, "frobnicate", "").unwrap_err();
    assert_eq!(
        e.to_string(),
        "lookup module 'flow' has no command 'frobnicate' (known: add, del, dump)"
    );
    assert_eq!(kind(e), ErrorKind::Unsupported);
    // Only reading is open to anyone.
    assert!(t.open_op("dump"));
    assert!(!t.open_op("add") && !t.open_op("del") && !t.open_op("frobnicate"));
}

/// A module without commands says so, of the Unsupported kind; a learning bridge saves
/// nothing and takes nothing back.
#[test]
fn a_module_without_commands_refuses_them() {
    let m = crate::lookup::make("learning", &[]).unwrap();
    let ctx = ControlCtx { switch: "vale0" };
    let e = m.control(ctx, "dump", "").unwrap_err();
    assert_eq!(
        e.to_string(),
        "lookup module 'learning' has no command 'dump': it takes no commands"
    );
    assert_eq!(crate::Error::from(e).kind, ErrorKind::Unsupported);
    assert!(m.save().is_empty());
    assert!(m.restore(ctx, &[]).is_ok());
    assert!(m.restore(ctx, &["x".into()]).is_err());
}

/// What the module saves, taken back by a module made afresh, is the same table: the same
/// rules in the same order, with the same ids.
#[test]
fn saved_rules_restore_the_same_table() {
    let t = table("prio=5 udp actions=drop\ntcp,tp_dst=22 actions=output:vale0:p1\nactions=flood");
    t.del("1").unwrap();
    t.add_text("arp actions=normal").unwrap();
    let lines = t.save();
    assert_eq!(
        lines,
        [
            "prio=32768 tcp,tp_dst=22 actions=output:vale0:p1",
            "prio=32768 actions=flood",
            "prio=32768 arp actions=normal",
        ]
    );
    let again = Flow::new(&[]).unwrap();
    again
        .restore(ControlCtx { switch: "vale0" }, &lines)
        .unwrap();
    let view = |f: &Flow| {
        f.dump("vale0")
            .rules
            .into_iter()
            .map(|r| (r.priority, r.matches, r.actions))
            .collect::<Vec<_>>()
    };
    assert_eq!(view(&again), view(&t));
    assert_eq!(again.save(), lines);
    // A rule naming a port of another switch is refused, all or none.
    let e = again
        .restore(ControlCtx { switch: "vale1" }, &lines)
        .unwrap_err();
    assert!(e.to_string().contains("not on switch 'vale1'"), "{e}");
}

/// At installation the module refuses a switch its rules cannot be on, and shows its `rules`
/// argument as a line, not saved (the rules are its state).
#[test]
fn installing_summarises_the_rules_argument() {
    let rules = "udp actions=drop\nactions=output:vale0:b";
    let t = Flow::new(&args(&[("rules", rules), ("default", "drop")])).unwrap();
    let mut kept = vec![
        KeptArg {
            key: "rules".into(),
            value: rules.into(),
            saved: true,
        },
        KeptArg {
            key: "default".into(),
            value: "drop".into(),
            saved: true,
        },
    ];
    let e = t.installing(ControlCtx { switch: "vale1" }, &mut kept);
    assert!(e.unwrap_err().to_string().contains("not on switch 'vale1'"));
    t.installing(ControlCtx { switch: "vale0" }, &mut kept)
        .unwrap();
    assert_eq!(kept[0].value, "(2 rules at load; see vale-ctl flow dump)");
    assert!(!kept[0].saved);
    assert!(kept[1].saved && kept[1].value == "drop");
}
