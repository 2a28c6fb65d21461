//! The command line of `attach` against the generic form, for every registered kind.

use clap::error::ErrorKind;

use super::*;
use crate::cli::{try_parse_from, Command};

/// The request `vale-ctl attach vale0:a ARGS...` makes, or why it is refused.
fn attach(args: &str) -> Result<Attach, clap::Error> {
    let argv = ["vale-ctl", "attach", "vale0:a"]
        .into_iter()
        .map(String::from);
    let cli = try_parse_from(argv.chain(args.split_whitespace().map(String::from)))?;
    match cli.command {
        Command::Attach(c) => Ok(c.request),
        _ => panic!("not attach"),
    }
}

fn ok(args: &str) -> Attach {
    attach(args).unwrap_or_else(|e| panic!("attach {args}: {e}"))
}

fn refused(args: &str) -> (ErrorKind, String) {
    match attach(args) {
        Ok(a) => panic!("attach {args} is accepted: {a:?}"),
        Err(e) => (e.kind(), e.to_string()),
    }
}

/// Every kind's flag and options ask valed for what the generic form does.
#[test]
fn a_kinds_flags_are_its_generic_form() {
    for (flags, generic) in [
        ("--tap t1", "tap name=t1"),
        ("--tap t1 --persist", "tap name=t1 persist=yes"),
        (
            "--iface eth0 --mode xdp-generic",
            "nic iface=eth0 mode=xdp-generic",
        ),
        (
            "--vhost-user /run/vm.sock --client --queues 2",
            "vhost-user path=/run/vm.sock client=yes queues=2",
        ),
        (
            "--vxlan --vni 42 --local 10.0.0.1 --remote 10.0.0.2 --remote 10.0.0.3 \
             --dstport 4790 --learn-limit 16",
            "vxlan vni=42 local=10.0.0.1 remote=10.0.0.2,10.0.0.3 dstport=4790 learn-limit=16",
        ),
        (
            "--geneve --vni 7 --local fd00::1 --remote fd00::2,fd00::3",
            "geneve vni=7 local=fd00::1 remote=fd00::2 remote=fd00::3",
        ),
        // A kind's options after its generic form.
        ("--tap t1 --persist", "tap name=t1 --persist"),
        (
            "--vxlan --vni 42 --local 10.0.0.1 --remote 10.0.0.2",
            "vxlan --vni 42 local=10.0.0.1 --remote 10.0.0.2",
        ),
    ] {
        assert_eq!(ok(flags), ok(generic), "{flags} | {generic}");
    }
    let vxlan = ok("--vxlan --vni 42 --local 10.0.0.1 --remote 10.0.0.2 --remote 10.0.0.3");
    assert_eq!(vxlan.kind, "vxlan");
    assert_eq!(vxlan.args["remote"], "10.0.0.2,10.0.0.3");
    assert_eq!(
        ok("--geneve --vni 7 --local ::1 --remote ::2").kind,
        "geneve"
    );
    let tap = ok("--tap t1 --persist");
    assert_eq!(tap.kind, "tap");
    assert_eq!(
        tap.args,
        [
            ("name".into(), "t1".into()),
            ("persist".into(), "yes".into())
        ]
        .into()
    );
}

/// valed resolves no relative path: vale-ctl sends it absolute, from either form.
#[test]
fn a_relative_path_is_sent_absolute() {
    let abs = std::env::current_dir().unwrap().join("vm1.sock");
    let abs = abs.to_str().unwrap();
    let flags = ok("--vhost-user vm1.sock --client --queues 16");
    assert_eq!(flags.kind, "vhost-user");
    assert_eq!(flags.args["path"], abs);
    assert_eq!(flags.args["client"], "yes");
    assert_eq!(flags.args["queues"], "16");
    assert_eq!(flags, ok("vhost-user path=vm1.sock client=yes queues=16"));
}

/// An option of another kind is a usage error that says whose it is.
#[test]
fn another_kinds_option_is_refused() {
    let (kind, message) = refused("--vxlan --vni 1 --local 10.0.0.1 --remote 10.0.0.2 --mode xdp");
    assert_eq!(kind, ErrorKind::ArgumentConflict);
    assert!(
        message.contains("--mode belongs to --iface (nic), not --vxlan"),
        "{message}"
    );
    let (kind, message) = refused("--tap t1 --vni 1");
    assert_eq!(kind, ErrorKind::ArgumentConflict);
    assert!(
        message.contains("--vni belongs to --vxlan (vxlan) and --geneve (geneve), not --tap"),
        "{message}"
    );
    for args in [
        "--tap t1 --mode xdp",
        "--iface eth0 --persist",
        "--vhost-user /s --learn-limit 3",
    ] {
        assert_eq!(refused(args).0, ErrorKind::ArgumentConflict, "{args}");
    }
    let (_, message) = refused("nic iface=eth0 --client");
    assert!(
        message.contains("--client belongs to --vhost-user (vhost-user), not kind 'nic'"),
        "{message}"
    );
    // Not two kinds, nor a kind's flag with the generic form.
    assert_eq!(
        refused("--tap t1 --iface eth0").0,
        ErrorKind::ArgumentConflict
    );
    assert_eq!(
        refused("--tap t1 tap name=t2").0,
        ErrorKind::ArgumentConflict
    );
    assert_eq!(refused("").0, ErrorKind::MissingRequiredArgument);
    // The same argument twice.
    assert_eq!(
        refused("tap name=t1 persist=yes --persist").0,
        ErrorKind::ArgumentConflict
    );
}

/// Values are checked as the kind describes them, before valed is asked.
#[test]
fn values_are_checked() {
    let (kind, message) = refused("--vhost-user /s --queues 17");
    assert_eq!(kind, ErrorKind::ValueValidation);
    assert!(message.contains("17 is not in 1..=16"), "{message}");
    assert_eq!(
        refused("--vhost-user /s --queues 0").0,
        ErrorKind::ValueValidation
    );
    assert_eq!(
        refused("--iface eth0 --mode fast").0,
        ErrorKind::InvalidValue
    );
    assert_eq!(
        refused("--vxlan --vni 16777216 --local a --remote b").0,
        ErrorKind::ValueValidation
    );
    let (kind, message) = refused("--vxlan --vni 42 --remote 10.0.0.2");
    assert_eq!(kind, ErrorKind::MissingRequiredArgument);
    assert!(
        message.contains("--vxlan (vxlan) needs --local <ADDR>"),
        "{message}"
    );
}

/// Every registered kind has its flag in `attach`, with the kind's help.
#[test]
fn every_kind_has_its_flag() {
    let mut cmd = crate::cli::command();
    cmd.build();
    let attach = cmd.find_subcommand("attach").unwrap();
    for k in KINDS {
        let flag = attach
            .get_arguments()
            .find(|a| a.get_long() == Some(k.flag.long))
            .unwrap_or_else(|| panic!("no --{}", k.flag.long));
        assert_eq!(flag.get_help().unwrap().to_string(), k.flag.help);
        let about = attach.get_long_about().unwrap().to_string();
        assert!(about.contains(k.about), "{} not in attach --help", k.name);
    }
}
