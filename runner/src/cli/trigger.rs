//! `knotless-run trigger REPO WORKFLOW`: asks the daemon for a manual run of a workflow that
//! has `manual` in its `on`, on the head of a branch, with its inputs.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;

use super::daemon::StateArgs;
use crate::daemon::notify::Trigger;

/// `trigger` flags.
#[derive(Debug, Args)]
pub struct TriggerArgs {
    /// The repository, as the daemon watches it (its path or URL).
    #[arg(value_name = "REPO")]
    pub repository: String,
    /// The workflow's name (its file's stem; a matrix runs every combination).
    #[arg(value_name = "WORKFLOW")]
    pub workflow: String,
    /// The branch whose head runs (default: the repository's default branch).
    #[arg(long = "ref", value_name = "BRANCH")]
    pub branch: Option<String>,
    /// A value for one of the workflow's inputs (`on.manual.inputs`), given to its steps as a
    /// variable; repeat for more.
    #[arg(long = "input", value_name = "NAME=VALUE", value_parser = parse_input)]
    pub inputs: Vec<(String, String)>,
    /// The state folder.
    #[command(flatten)]
    pub state: StateArgs,
}

/// A `NAME=VALUE` flag's value (`--input`, `rerun --env`), its name one steps may be given.
pub(super) fn parse_input(text: &str) -> Result<(String, String), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    super::run::check_variable_name(name)?;
    Ok((name.to_string(), value.to_string()))
}

/// The values of a repeated `NAME=VALUE` flag by name; a name given twice is refused.
pub(super) fn variables(flag: &str, given: Vec<(String, String)>) -> anyhow::Result<BTreeMap<String, String>> {
    let mut variables = BTreeMap::new();
    for (name, value) in given {
        if variables.insert(name.clone(), value).is_some() {
            anyhow::bail!("{flag} {name} is given twice");
        }
    }
    Ok(variables)
}

/// Runs the subcommand: prints each run id queued; exits 1 when the daemon refuses (naming
/// why), 2 when no daemon answers.
pub async fn main(args: TriggerArgs) -> anyhow::Result<ExitCode> {
    let inputs = variables("--input", args.inputs)?;
    let trigger = Trigger {
        repository: crate::forge::normalize_url(&args.repository),
        workflow: args.workflow.clone(),
        branch: args.branch,
        inputs,
    };
    let runs = match crate::daemon::notify::trigger(&args.state.state, &trigger).await? {
        Ok(runs) => runs,
        Err(why) => {
            crate::say_err!("knotless-run: {why}");
            return Ok(ExitCode::FAILURE);
        }
    };
    for run in runs {
        println!("queued {} as run {run}", crate::printable::name(&args.workflow));
    }
    Ok(ExitCode::SUCCESS)
}
