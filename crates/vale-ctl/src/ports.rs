//! Host ports: `attach` and `detach`.
//!
//! `attach`'s flags are not written here: they come from the kinds' registration entries
//! (`vale_switch::host::KINDS`: each kind's [`Flag`], help paragraph and [`Arg`]s), so a kind
//! added to valed is offered by vale-ctl with no change to it. [`flags`] adds them to the
//! derived command line: each kind's flag (`--tap NAME`) joins a required group with the
//! generic form's KIND, and each kind's other arguments become options (`--persist`), one
//! per flag however many kinds share it (`--vni`: vxlan and geneve). [`request`] reads them
//! back into what valed takes, a kind and its KEY=VALUE arguments, and refuses an option the
//! chosen kind does not take.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use clap::builder::PossibleValuesParser;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgGroup, ArgMatches};
use vale_abi::control::Request;
use vale_switch::host::{Arg, Kind, KindArgs, Shape, KINDS};

use crate::cli::{AttachCmd, Cli};
use crate::client::{ask, done, Failure};

/// What `attach` asks valed for: a kind and its arguments.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Attach {
    pub(crate) kind: String,
    pub(crate) args: KindArgs,
}

/// `vale-ctl attach PORT ...`: the request made from the command line ([`request`]).
pub(crate) fn attach(cli: &Cli, sock: &UnixStream, c: &AttachCmd) -> Result<(), Failure> {
    let req = Request::Attach {
        port: c.port.clone(),
        kind: c.request.kind.clone(),
        args: c.request.args.clone(),
    };
    done(cli, ask(sock, &req)?)
}

/// `vale-ctl detach PORT`.
pub(crate) fn detach(cli: &Cli, sock: &UnixStream, port: &str) -> Result<(), Failure> {
    let req = Request::Detach {
        port: port.to_string(),
    };
    done(cli, ask(sock, &req)?)
}

/// The help of the generic form's KIND: the kinds' names.
pub(crate) fn kind_help() -> String {
    let names: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
    format!(
        "The generic form: a port kind ({}), then its arguments",
        names.join(", ")
    )
}

/// The arguments of kind `k` that are options of their own: all but the one its flag carries.
fn options(k: &'static Kind) -> impl Iterator<Item = &'static Arg> {
    k.args.iter().filter(move |a| Some(a.key) != k.flag.value)
}

/// Adds the kinds' flags and options to `attach` (the derived command), with their help: the
/// kinds' paragraphs after the command's own, then the generic form of each kind.
pub(crate) fn flags(mut cmd: clap::Command) -> clap::Command {
    let names: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
    let names = names.join(", ");
    let mut group = ArgGroup::new("device").required(true);
    let mut shown: Vec<&str> = Vec::new();
    for k in KINDS {
        let flag = match k.flag.value.and_then(|key| k.arg(key)) {
            Some(a) => option(k.flag.long, a),
            None => clap::Arg::new(k.flag.long)
                .long(k.flag.long)
                .action(ArgAction::SetTrue),
        };
        cmd = cmd.arg(flag.help(k.flag.help));
        group = group.arg(k.flag.long);
        for a in options(k) {
            if !shown.contains(&a.long()) {
                shown.push(a.long());
                cmd = cmd.arg(option(a.long(), a).help(a.help));
            }
        }
    }
    let generic: Vec<String> = KINDS.iter().map(generic_form).collect();
    let about = cmd
        .get_long_about()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let paragraphs: Vec<&str> = KINDS.iter().map(|k| k.about).collect();
    let long_about = format!(
        "{about}\n\n{}\n\n\
The generic form 'vale-ctl attach PORT KIND KEY=VALUE...' names any kind valed knows with its \
arguments as the control protocol carries them: {}; valed refuses a kind or an argument it \
does not know, naming those it does. The options of a kind may be given with its generic form \
too.",
        paragraphs.join("\n\n"),
        generic.join(", "),
    );
    let short = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
    cmd.about(format!("{short}: {names}"))
        .long_about(long_about)
        .group(group.arg("kind"))
}

/// The clap option `--long` for argument `a`, which takes what `a`'s shape says.
fn option(long: &'static str, a: &Arg) -> clap::Arg {
    let o = clap::Arg::new(long).long(long).value_name(a.value_name);
    match a.shape {
        Shape::Text => o,
        Shape::Switch => o.action(ArgAction::SetTrue),
        Shape::Choice(words) => o.value_parser(PossibleValuesParser::new(words.iter().copied())),
        Shape::Range(lo, hi) => o.value_parser(clap::value_parser!(u64).range(lo..=hi)),
        Shape::Path => o.value_parser(clap::value_parser!(PathBuf)),
        Shape::List => o.action(ArgAction::Append),
    }
}

/// `'tap name=NAME [persist=yes]'`: kind `k` in the generic form.
fn generic_form(k: &Kind) -> String {
    let mut s = format!("'{}", k.name);
    for a in k.args {
        let v = match a.shape {
            Shape::Switch => "yes".to_string(),
            Shape::List => format!("{0}[,{0}...]", a.value_name),
            _ => a.value_name.to_string(),
        };
        match a.required {
            true => s += &format!(" {}={v}", a.key),
            false => s += &format!(" [{}={v}]", a.key),
        }
    }
    s + "'"
}

/// The value of argument `a`, given as option `id`, as the control protocol carries it.
fn value(a: &Arg, id: &str, m: &ArgMatches) -> String {
    let text = || m.get_one::<String>(id).cloned().unwrap_or_default();
    match a.shape {
        Shape::Switch => "yes".to_string(),
        Shape::Text | Shape::Choice(_) => text(),
        Shape::Range(..) => m.get_one::<u64>(id).map(u64::to_string).unwrap_or_default(),
        Shape::Path => m
            .get_one::<PathBuf>(id)
            .map(|p| absolute(p))
            .unwrap_or_default(),
        Shape::List => {
            let values: Vec<&str> = m
                .get_many::<String>(id)
                .map(|v| v.map(String::as_str).collect())
                .unwrap_or_default();
            values.join(",")
        }
    }
}

/// `path` made absolute: valed resolves no path against our directory.
fn absolute(path: &Path) -> String {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    path.to_string_lossy().into_owned()
}

/// `--tap (tap)`.
fn flag_of(k: &Kind) -> String {
    format!("--{} ({})", k.flag.long, k.name)
}

/// What `attach` asks valed for: the kind that its flag or the generic form (`c`, and the
/// matches `m` of the kinds' flags and options) names, with its arguments. An option the kind
/// does not take, or a required one missing after a kind's flag, is a usage error.
pub(crate) fn request(c: &AttachCmd, m: &ArgMatches) -> Result<Attach, (ErrorKind, String)> {
    let given = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    let flagged = KINDS.iter().find(|k| given(k.flag.long));
    let (name, kind, named) = match (flagged, &c.kind) {
        (Some(k), _) => (k.name.to_string(), Some(k), format!("--{}", k.flag.long)),
        (None, Some(name)) => {
            let k = KINDS.iter().find(|k| k.name == name);
            (name.clone(), k, format!("kind '{name}'"))
        }
        (None, None) => unreachable!("clap requires a kind's flag or KIND"),
    };
    let mut args = KindArgs::new();
    // The generic form's KEY=VALUEs, as given but for paths (made absolute) and lists (a key
    // given again adds to its list).
    for (key, v) in &c.kind_args {
        let shape = kind.and_then(|k| k.arg(key)).map(|a| a.shape);
        let v = match shape {
            Some(Shape::Path) => absolute(Path::new(v)),
            _ => v.clone(),
        };
        match (shape, args.get_mut(key)) {
            (Some(Shape::List), Some(list)) => *list = format!("{list},{v}"),
            _ => drop(args.insert(key.clone(), v)),
        }
    }
    if let Some(k) = flagged {
        if let Some(a) = k.flag.value.and_then(|key| k.arg(key)) {
            args.insert(a.key.to_string(), value(a, k.flag.long, m));
        }
    }
    // The options, each the argument of the kind that has that flag.
    let mut seen: Vec<&str> = Vec::new();
    for o in KINDS.iter().flat_map(options) {
        if seen.contains(&o.long()) || !given(o.long()) {
            continue;
        }
        seen.push(o.long());
        let Some(a) = kind.and_then(|k| options(k).find(|a| a.long() == o.long())) else {
            let owners: Vec<String> = KINDS
                .iter()
                .filter(|k| options(k).any(|a| a.long() == o.long()))
                .map(flag_of)
                .collect();
            let message = format!(
                "--{} belongs to {}, not {named}",
                o.long(),
                owners.join(" and ")
            );
            return Err((ErrorKind::ArgumentConflict, message));
        };
        if args.contains_key(a.key) {
            let message = format!("--{} and {}= give the same argument twice", o.long(), a.key);
            return Err((ErrorKind::ArgumentConflict, message));
        }
        args.insert(a.key.to_string(), value(a, o.long(), m));
    }
    // After a kind's flag, its required options (the generic form's are valed's to check).
    if let Some(k) = flagged {
        if let Some(a) = k
            .args
            .iter()
            .find(|a| a.required && !args.contains_key(a.key))
        {
            let message = format!("{} needs --{} <{}>", flag_of(k), a.long(), a.value_name);
            return Err((ErrorKind::MissingRequiredArgument, message));
        }
    }
    Ok(Attach { kind: name, args })
}

#[cfg(test)]
mod tests {
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
        let (kind, message) =
            refused("--vxlan --vni 1 --local 10.0.0.1 --remote 10.0.0.2 --mode xdp");
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
        let (kind, message) = refused("--vxlan --vni 42 --local 10.0.0.1");
        assert_eq!(kind, ErrorKind::MissingRequiredArgument);
        assert!(
            message.contains("--vxlan (vxlan) needs --remote <ADDR>"),
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
}
