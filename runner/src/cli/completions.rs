//! `knotless-run completions SHELL`: the shell's completion script for `knotless-run`, on
//! stdout (clap_complete, from the same definition as `--help`).

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

use super::Cli;

/// `completions` flags.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_name = "SHELL", value_enum)]
    pub shell: Shell,
}

/// The completion script of `shell`.
pub fn script(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "knotless-run", &mut script);
    script
}

/// Runs the subcommand.
pub fn main(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    // Made whole first: clap_complete panics on a failed write, and a closed stdout is one.
    let script = script(args.shell);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script).and_then(|()| stdout.flush()).context("cannot write the completions to stdout")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;

    #[test]
    fn every_shell_completes_every_visible_subcommand() {
        let subcommands: Vec<String> = Cli::command()
            .get_subcommands()
            .filter(|command| !command.is_hide_set())
            .map(|command| command.get_name().to_string())
            .collect();
        assert!(subcommands.iter().any(|name| name == "completions"), "{subcommands:?}");
        for shell in Shell::value_variants() {
            let script = String::from_utf8(script(*shell)).expect("a script is text");
            for name in &subcommands {
                assert!(script.contains(name.as_str()), "{shell}: no {name}");
            }
        }
    }
}
