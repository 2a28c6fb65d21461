//! vale-ctl: the vale control tool.
//!
//! Speaks valed's control protocol ([`vale_abi::control`]) over `<run dir>/valed.sock`: one
//! request, one reply, per invocation. It never starts valed.
//!
//! This file parses the command line ([`cli`]) and hands each command to its family: switches
//! and their knobs ([`switches`]), host ports ([`ports`]), lookup modules and flow tables
//! ([`modules`]), captures ([`capture`]) and live rates ([`top`]). The conversation with valed
//! is in [`client`], the tables for people in [`render`].

use std::process::ExitCode;

mod capture;
mod cli;
mod client;
mod modules;
mod ports;
mod render;
mod switches;
mod top;

use cli::{Cli, Command};
use client::{connect, Failure};

/// Exit status when valed refused a request or the conversation failed.
const EXIT_FAILED: u8 = 1;
/// Exit status of a usage error.
const EXIT_USAGE: u8 = 2;
/// Exit status when no valed answers for the run directory.
const EXIT_NO_DAEMON: u8 = 3;

fn main() -> ExitCode {
    vale_man::write_if_asked("1", cli::command);
    let cli = cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NoDaemon(dir, e)) => {
            eprintln!("vale-ctl: no valed running for {} ({e})", dir.display());
            ExitCode::from(EXIT_NO_DAEMON)
        }
        Err(Failure::Refused(message)) => {
            eprintln!("vale-ctl: {message}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(Failure::Other(e)) => {
            eprintln!("vale-ctl: {e:#}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(Failure::Usage(message)) => {
            eprintln!("vale-ctl: {message}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    // Usage errors clap cannot see come before any word with valed: the module commands make
    // their request (and read their rules files) before connecting.
    match &cli.command {
        Command::Lookup(c) => return modules::lookup(cli, c),
        Command::Flow { switch, op } => return modules::flow(cli, switch, op),
        Command::Module { switch, op, body } => {
            return modules::module(cli, switch, op, body.as_deref())
        }
        _ => {}
    }
    let sock = connect(cli)?;
    match &cli.command {
        Command::Capture(c) => capture::command(&sock, c),
        Command::Top(c) => top::command(&sock, c, cli.json),
        Command::List { name } => switches::list(cli, &sock, name.as_deref()),
        Command::Create { port } => switches::create(cli, &sock, port),
        Command::Destroy { name } => switches::destroy(cli, &sock, name),
        Command::Save => switches::save(cli, &sock),
        Command::Set {
            target,
            knob,
            value,
        } => switches::set(cli, &sock, target, knob, value),
        Command::Attach(c) => ports::attach(cli, &sock, c),
        Command::Detach { port } => ports::detach(cli, &sock, port),
        Command::Lookup(_) | Command::Flow { .. } | Command::Module { .. } => {
            unreachable!("answered above")
        }
    }
}
