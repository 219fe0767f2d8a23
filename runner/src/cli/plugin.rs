//! `knotless-run plugin check PATH` (or `--executor NAME`, `--executor-plugin PATH`): the
//! conformance suite against an executor binary.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{ArgGroup, Args, Subcommand};

use super::ExecutorArgs;
use crate::conformance::{self, Verdict, report_line};
use crate::printable;

/// `plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Run the conformance suite against an executor program and say what passed and failed.
    Check(CheckArgs),
}

/// `plugin check` flags: the executor is PATH, `--executor NAME` or `--executor-plugin PATH`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("program").required(true).args(["path", "executor", "executor_plugin"])))]
pub struct CheckArgs {
    /// The executor program (or name one with --executor or --executor-plugin).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Options for the executor under test.
    #[command(flatten)]
    pub executor: ExecutorArgs,
}

/// Runs the subcommand.
pub async fn main(command: PluginCommand) -> anyhow::Result<ExitCode> {
    let PluginCommand::Check(mut args) = command;
    if let Some(path) = args.path.take() {
        if !crate::host::is_executable(&path) {
            bail!("{}: not an executable file", printable::name(&path.display().to_string()));
        }
        args.executor.executor_plugin = Some(path);
    }
    // The group makes PATH, --executor and --executor-plugin one choice, and one is given.
    let config = args.executor.host_config("", &format!("check-{}", std::process::id()))?;
    crate::say!("plugin check {}", printable::name(&config.process.path.display().to_string()));
    let checks = conformance::run(config, |check| crate::say!("{}", report_line(check))).await;
    let count = |wanted: fn(&Verdict) -> bool| checks.iter().filter(|check| wanted(&check.verdict)).count();
    let passed = count(|verdict| matches!(verdict, Verdict::Passed(_)));
    let failed = count(|verdict| matches!(verdict, Verdict::Failed(_)));
    let not_run = count(|verdict| matches!(verdict, Verdict::NotRun(_)));
    crate::say!("{passed} passed, {failed} failed, {not_run} not run");
    Ok(if failed == 0 && not_run == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
