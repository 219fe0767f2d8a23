//! `knotless-run notify REPO`: wakes the daemon to look at a repository now (for a
//! post-receive hook).

use std::process::ExitCode;

use clap::Args;

use super::daemon::StateArgs;

/// `notify` flags.
#[derive(Debug, Args)]
pub struct NotifyArgs {
    /// The repository, as the daemon watches it (its path or URL).
    #[arg(value_name = "REPO")]
    pub repository: String,
    /// The state folder.
    #[command(flatten)]
    pub state: StateArgs,
}

/// Runs the subcommand.
pub async fn main(args: NotifyArgs) -> anyhow::Result<ExitCode> {
    let repository = crate::forge::normalize_url(&args.repository);
    if let Err(why) = crate::daemon::notify::send(&args.state.state, &repository).await? {
        crate::say_err!("knotless-run: {why}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
