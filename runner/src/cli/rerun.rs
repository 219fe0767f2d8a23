//! `knotless-run rerun REPO RUN`: asks the daemon to run a check's workflow again on the same
//! commit, with a new check that names the one it repeats.

use std::process::ExitCode;

use clap::Args;

use super::daemon::StateArgs;
use crate::daemon::notify::Rerun;

/// `rerun` flags.
#[derive(Debug, Args)]
pub struct RerunArgs {
    /// The repository, as the daemon watches it (its path or URL).
    #[arg(value_name = "REPO")]
    pub repository: String,
    /// The id of the run to repeat, as `knotless-run checks` prints it.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// A variable for every step of the new run, over the workflow's `env` (and kept by a
    /// rerun of that run); repeat for more. Not a secret.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = super::trigger::parse_input)]
    pub env: Vec<(String, String)>,
    /// The state folder.
    #[command(flatten)]
    pub state: StateArgs,
}

/// Runs the subcommand: prints the new run's id; exits 1 when the daemon refuses (naming
/// why), 2 when no daemon answers.
pub async fn main(args: RerunArgs) -> anyhow::Result<ExitCode> {
    let env = super::trigger::variables("--env", args.env)?;
    let rerun = Rerun { repository: crate::forge::normalize_url(&args.repository), rerun: args.run.clone(), env };
    match crate::daemon::notify::rerun(&args.state.state, &rerun).await? {
        Ok(run) => {
            println!("run {} runs again as run {run}", crate::printable::name(&args.run));
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            crate::say_err!("knotless-run: {why}");
            Ok(ExitCode::FAILURE)
        }
    }
}
