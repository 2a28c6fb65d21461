//! Host ports: `attach` and `detach`.
//!
//! `attach`'s flags are not written here: they come from the kinds' registration entries
//! (`vale_switch::host::KINDS`: each kind's [`Flag`], help paragraph and [`Arg`]s), so a kind
//! added to valed is offered by vale-ctl with no change to it. [`flags`] adds them to the
//! derived command line: each kind's flag (`--FLAG [VALUE]`) joins a required group with the
//! generic form's KIND, and each kind's other arguments become options, one per flag however
//! many kinds share it (two kinds of one module may). [`request`] reads them
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

/// `'KIND key=VALUE [key=VALUE]...'`: kind `k` in the generic form.
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

/// `--FLAG (KIND)`: how usage errors name kind `k`.
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
mod tests;
