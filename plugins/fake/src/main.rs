//! The entry point of `knotless-executor-fake`: the command line, `--help`, the modes that act
//! before the handshake, and the exit code.

mod mode;
mod orphans;
mod server;
mod sessions;
mod step;
mod transfer;
mod wire;

use anyhow::Context as _;

use crate::mode::Mode;

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Cli {
    /// Print the usage.
    Help,
    /// Serve, in a mode when one was given.
    Serve(Option<Mode>),
}

/// Reads the arguments: nothing, `--help`, or `--mode MODE` (also `--mode=MODE`).
fn parse(args: &[String]) -> anyhow::Result<Cli> {
    match args {
        [] => Ok(Cli::Serve(None)),
        [flag] if flag == "--help" || flag == "-h" => Ok(Cli::Help),
        [flag, mode] if flag == "--mode" => Ok(Cli::Serve(Some(mode.parse()?))),
        [flag] if flag.starts_with("--mode=") => Ok(Cli::Serve(Some(flag["--mode=".len()..].parse()?))),
        _ => anyhow::bail!("unexpected arguments {args:?}; see --help"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match parse(&args) {
        Ok(Cli::Help) => {
            print!("{}", mode::usage());
            std::process::exit(0);
        }
        Ok(Cli::Serve(mode)) => mode,
        Err(error) => {
            eprintln!("fake: {error:#}");
            std::process::exit(2);
        }
    };
    if mode == Some(Mode::ExitBeforeHandshake) {
        eprintln!("fake: exiting before the handshake");
        std::process::exit(3);
    }
    let code = match serve(mode) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("fake: {error:#}");
            1
        }
    };
    // Exit at once: a transfer thread still blocked on a side channel must not hold the
    // process open after the runner said goodbye.
    std::process::exit(code);
}

fn serve(mode: Option<Mode>) -> anyhow::Result<()> {
    orphans::become_subreaper();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(server::run(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &[&str]) -> Vec<String> {
        text.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn the_command_line_takes_a_mode_or_help() {
        assert_eq!(parse(&args(&[])).expect("parse"), Cli::Serve(None));
        assert_eq!(parse(&args(&["--help"])).expect("parse"), Cli::Help);
        assert_eq!(parse(&args(&["--mode", "garbage"])).expect("parse"), Cli::Serve(Some(Mode::Garbage)));
        assert_eq!(parse(&args(&["--mode=drop-output"])).expect("parse"), Cli::Serve(Some(Mode::DropOutput)));
        assert!(parse(&args(&["--mode", "nope"])).is_err());
        assert!(parse(&args(&["--mode"])).is_err());
        assert!(parse(&args(&["extra", "args", "here"])).is_err());
    }
}
