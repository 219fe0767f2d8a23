//! The command line: flags parsed with clap, validated into the host's configuration, and one
//! file per subcommand.

mod executor_args;
mod plugin;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use executor_args::ExecutorArgs;

/// knotless-run: the CI runner of the knotless forge.
#[derive(Debug, Parser)]
#[command(name = "knotless-run", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a repository's workflows once, locally, and exit non-zero when one does not succeed.
    Run(run::RunArgs),
    /// Work with executor plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
}

/// Parses the command line, runs it, and gives the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("knotless-run: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::main(args).await,
            Command::Plugin(command) => plugin::main(command).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("knotless-run: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Logs to stderr: human lines on a terminal, JSON lines otherwise when `KNOTLESS_LOG_FORMAT`
/// is `json`. The filter comes from `KNOTLESS_LOG` (default `info`).
fn init_tracing() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("KNOTLESS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if std::env::var("KNOTLESS_LOG_FORMAT").is_ok_and(|format| format == "json") {
        builder.json().init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).with_target(false).init();
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every flag of every subcommand, as `--name`.
    fn flags(command: &clap::Command, into: &mut Vec<String>) {
        for argument in command.get_arguments() {
            if let Some(long) = argument.get_long() {
                if long != "help" && long != "version" {
                    into.push(format!("--{long}"));
                }
            }
        }
        for subcommand in command.get_subcommands() {
            flags(subcommand, into);
        }
    }

    #[test]
    fn the_reference_names_every_flag_of_the_help() {
        let reference = include_str!("../../../docs/reference/cli.md");
        let mut all = Vec::new();
        flags(&Cli::command(), &mut all);
        let missing: Vec<_> = all.iter().filter(|flag| !reference.contains(&format!("`{flag}"))).collect();
        assert!(missing.is_empty(), "docs/reference/cli.md does not describe {missing:?}");
        Cli::command().debug_assert();
    }

    #[test]
    fn the_reference_names_no_flag_the_help_lacks() {
        let reference = include_str!("../../../docs/reference/cli.md");
        let mut all = Vec::new();
        flags(&Cli::command(), &mut all);
        let mut unknown = Vec::new();
        for piece in reference.split('`').skip(1).step_by(2) {
            if let Some(flag) =
                piece.strip_prefix("--").map(|rest| format!("--{}", rest.split([' ', '=']).next().unwrap_or("")))
            {
                if !all.contains(&flag) && flag != "--help" {
                    unknown.push(flag);
                }
            }
        }
        assert!(unknown.is_empty(), "docs/reference/cli.md describes flags knotless-run lacks: {unknown:?}");
    }
}
