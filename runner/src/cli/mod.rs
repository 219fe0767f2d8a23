//! The command line: flags parsed with clap, validated into the host's configuration, and one
//! file per subcommand.

mod cache;
mod checks;
mod completions;
mod daemon;
mod executor_args;
mod http_args;
mod kubeconfig;
mod logs;
mod manpage;
mod notify;
mod plugin;
mod rerun;
mod run;
mod secrets;
mod trigger;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use executor_args::ExecutorArgs;

/// knotless-run: the CI runner of the knotless forge.
#[derive(Debug, Parser)]
#[command(name = "knotless-run", version = knotless_protocol::version_line!(), about, long_about = None, propagate_version = true)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do; without a subcommand, serve as the daemon watching REPO...
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The daemon.
    #[command(flatten)]
    pub daemon: daemon::DaemonArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a repository's workflows once, locally, and exit non-zero when one does not succeed.
    Run(Box<run::RunArgs>),
    /// Work with executor plugins.
    #[command(subcommand)]
    Plugin(Box<plugin::PluginCommand>),
    /// List a repository's checks.
    Checks(checks::ChecksArgs),
    /// Print a run's log.
    Logs(logs::LogsArgs),
    /// Wake the daemon to look at a repository now (for a post-receive hook).
    Notify(notify::NotifyArgs),
    /// Ask the daemon to run a workflow that has a manual trigger, on the head of a branch.
    Trigger(trigger::TriggerArgs),
    /// Ask the daemon to run a check's workflow again on the same commit.
    Rerun(rerun::RerunArgs),
    /// The runner's secrets key: print its recipient, seal a value to it.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// The Kubernetes executor's scoped credential: make it, check it.
    #[command(subcommand)]
    Kubeconfig(kubeconfig::KubeconfigCommand),
    /// List or prune the caches `run` keeps.
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// Print the completion script of SHELL for knotless-run.
    Completions(completions::CompletionsArgs),
    /// Print the manual page (roff), or write every page into --dir (for packagers).
    #[command(hide = true)]
    Manpage(manpage::ManpageArgs),
}

/// Parses the command line, runs it, and gives the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(matches!(cli.command, Some(Command::Run(_))));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            crate::say_err!("knotless-run: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            // As a task on a worker, not `block_on`'s own future: each answer of the executor
            // then wakes the run on the thread that read it, not across threads, once a step.
            Some(Command::Run(args)) => match tokio::spawn(run::main(*args)).await {
                Ok(result) => result,
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(error) => Err(anyhow::anyhow!("the run was stopped: {error}")),
            },
            Some(Command::Plugin(command)) => plugin::main(*command).await,
            Some(Command::Checks(args)) => checks::checks(args).await,
            Some(Command::Logs(args)) => logs::main(args).await,
            Some(Command::Notify(args)) => notify::main(args).await,
            Some(Command::Trigger(args)) => trigger::main(args).await,
            Some(Command::Rerun(args)) => rerun::main(args).await,
            Some(Command::Secrets(command)) => secrets::main(command).await,
            Some(Command::Kubeconfig(command)) => kubeconfig::main(command).await,
            Some(Command::Cache(command)) => cache::main(command).await,
            Some(Command::Completions(args)) => completions::main(args),
            Some(Command::Manpage(args)) => manpage::main(args),
            None => daemon::main(cli.daemon).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            crate::say_err!("knotless-run: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Whether `NO_COLOR` asks for no colour (set and not empty, as no-color.org says).
pub fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty())
}

/// Logs to stderr: human lines on a terminal, JSON lines otherwise; `KNOTLESS_LOG_FORMAT`
/// (`json`, or `human` alias `text`) overrides. The filter comes from `KNOTLESS_LOG` (default
/// `info`). For `run` (`local`), which speaks to a person, the default filter is `warn` and the
/// format text, JSON only when asked. Colour only on a terminal and without `NO_COLOR`.
fn init_tracing(local: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let default = if local { "warn" } else { "info" };
    let filter = EnvFilter::try_from_env("KNOTLESS_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // A closed stderr drops log lines: reporting that on stderr would panic the runner.
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).log_internal_errors(false);
    let json = match std::env::var("KNOTLESS_LOG_FORMAT").as_deref() {
        Ok("json") => true,
        Ok("human" | "text") => false,
        _ => !local && !std::io::stderr().is_terminal(),
    };
    if json {
        builder.json().init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal() && !no_color()).with_target(false).init();
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every flag of every subcommand, as `--name`.
    fn flags(command: &clap::Command, into: &mut Vec<String>) {
        for argument in command.get_arguments() {
            if let Some(long) = argument.get_long()
                && long != "help"
                && long != "version"
            {
                into.push(format!("--{long}"));
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
    fn every_enum_flag_lists_its_values_in_help() {
        let mut command = Cli::command();
        let run = command.find_subcommand_mut("run").expect("run");
        let help = run.render_long_help().to_string();
        for values in ["[possible values: push, pull, queue, manual]", "auto:", "always:", "never:"] {
            assert!(help.contains(values), "run --help lacks {values:?}:\n{help}");
        }
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
                && !all.contains(&flag)
                && flag != "--help"
            {
                unknown.push(flag);
            }
        }
        assert!(unknown.is_empty(), "docs/reference/cli.md describes flags knotless-run lacks: {unknown:?}");
    }
}
