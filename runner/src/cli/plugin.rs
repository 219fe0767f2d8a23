//! `knotless-run plugin check PATH`: the conformance suite against an executor binary.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};

use super::ExecutorArgs;
use crate::conformance;

/// `plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Run the conformance suite against an executor program and say what passed and failed.
    Check(CheckArgs),
}

/// `plugin check` flags.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The executor program.
    pub path: PathBuf,
    /// Options for the executor under test.
    #[command(flatten)]
    pub executor: ExecutorArgs,
}

/// Runs the subcommand.
pub async fn main(command: PluginCommand) -> anyhow::Result<ExitCode> {
    let PluginCommand::Check(mut args) = command;
    if args.executor.executor.is_some() || args.executor.executor_plugin.is_some() {
        bail!("plugin check takes the executor as PATH, not --executor or --executor-plugin");
    }
    args.executor.executor_plugin = Some(args.path.clone());
    let config = args.executor.host_config("", &format!("check-{}", std::process::id()))?;
    crate::say!("plugin check {}", args.path.display());
    let checks = conformance::run(config, |check| match &check.outcome {
        Ok(detail) => crate::say!("  ok    {}: {detail}", check.name),
        Err(why) => crate::say!("  FAIL  {}: {why}", check.name),
    })
    .await;
    let failed = checks.iter().filter(|check| check.outcome.is_err()).count();
    crate::say!("{} passed, {failed} failed", checks.len() - failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
