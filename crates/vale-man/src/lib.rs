//! Man pages of the vale tools (valed, vale-ctl, vale-pktgen), rendered by clap_mangen from
//! the very clap definitions that give their `--help`, so the two never disagree.
//!
//! Each tool calls [`write_if_asked`] first thing in `main`. Run as
//! `TOOL --write-man-pages DIR`, it writes its pages into DIR (one per command and
//! subcommand, as git does: `vale-ctl.1`, `vale-ctl-list.1`, ...), prints their paths and
//! exits; the option is not in `--help` and means nothing else. The Debian package
//! (scripts/package-deb.sh) makes its pages this way from the release binaries it ships.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The first argument that asks a tool for its man pages.
pub const OPTION: &str = "--write-man-pages";

/// If the command line is `TOOL --write-man-pages DIR`, writes the pages of `command()` (in
/// man section `section`) into DIR and exits; otherwise returns at once.
pub fn write_if_asked(section: &str, command: impl FnOnce() -> clap::Command) {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(OPTION)) {
        return;
    }
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: {OPTION} DIR");
        std::process::exit(2);
    };
    match write(command(), section, Path::new(&dir)) {
        Ok(pages) => {
            let mut out = std::io::stdout().lock();
            for p in pages {
                let _ = writeln!(out, "{}", p.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("cannot write man pages into {}: {e}", dir.to_string_lossy());
            std::process::exit(1);
        }
    }
}

/// Writes the page of `cmd` and one for each of its subcommands (recursively, not the
/// generated `help`) into `dir`, in section `section`. Returns the files written.
pub fn write(cmd: clap::Command, section: &str, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    // Gives each subcommand its display name ("vale-ctl-list") and its full usage.
    cmd.build();
    let version = cmd.get_version().unwrap_or_default().to_string();
    let page = Page {
        section,
        source: format!("vale {version}"),
        date: date(),
    };
    let mut written = Vec::new();
    walk(&cmd, &page, dir, &mut written)?;
    Ok(written)
}

/// What the `.TH` line of every page says besides its name.
struct Page<'a> {
    section: &'a str,
    source: String,
    date: String,
}

fn walk(
    cmd: &clap::Command,
    page: &Page,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone())
        .section(page.section)
        .date(&page.date)
        .source(&page.source)
        .manual("vale");
    written.push(man.generate_to(dir)?);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        walk(sub, page, dir, written)?;
    }
    Ok(())
}

/// The pages' date, YYYY-MM-DD: that of `SOURCE_DATE_EPOCH` (reproducible builds; the
/// package script sets it to the last commit's time), else today's (UTC). A date must be
/// there: clap_mangen leaves an empty one out of `.TH`, shifting the fields after it.
fn date() -> String {
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The Gregorian date of day `z` since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    #[command(name = "tool", version, about = "A tool")]
    struct Cli {
        /// The first knob
        #[arg(long)]
        knob: Option<u32>,
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(clap::Subcommand)]
    enum Sub {
        /// Lists things
        List {
            /// Only this one
            name: Option<String>,
        },
    }

    #[test]
    fn a_page_per_command_with_the_help_text() {
        let dir = std::env::temp_dir().join(format!("vale-man-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pages = write(<Cli as clap::CommandFactory>::command(), "1", &dir).unwrap();
        let names: Vec<_> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["tool.1", "tool-list.1"]);
        let top = std::fs::read_to_string(&pages[0]).unwrap();
        let th = top.lines().find(|l| l.starts_with(".TH ")).unwrap();
        // Five fields: name, section, date, source, manual.
        assert!(
            th.starts_with(".TH tool 1 20") && th.ends_with(" vale"),
            "{th}"
        );
        assert!(
            top.contains("The first knob") && top.contains("vale"),
            "{top}"
        );
        let list = std::fs::read_to_string(&pages[1]).unwrap();
        assert!(list.contains("Only this one"), "{list}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_415), (2025, 11, 23));
    }
}
