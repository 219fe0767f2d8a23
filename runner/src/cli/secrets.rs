//! `knotless-run secrets public-key|new-key|seal NAME`: the runner's age recipient, a new key
//! made on purpose, and sealing a value to it for owners without the age CLI.

use std::io::Read as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Subcommand;

use super::daemon::StateArgs;
use crate::secrets::{RunnerKey, SEALED_FILE};

/// `secrets` subcommands.
#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Print the runner's age recipient (creating its key at first use): seal with
    /// `age -r <recipient> -a`.
    PublicKey {
        /// The state folder.
        #[command(flatten)]
        state: StateArgs,
    },
    /// Make a new key where none is (the old one was lost) and print its recipient: every
    /// secret sealed to the old key must be sealed again.
    NewKey {
        /// The state folder.
        #[command(flatten)]
        state: StateArgs,
    },
    /// Read a value on stdin and print it sealed to this runner, ready for .knotless/secrets.yml.
    Seal {
        /// The secret's name.
        name: String,
        /// The state folder.
        #[command(flatten)]
        state: StateArgs,
    },
}

/// Runs the subcommand.
pub async fn main(command: SecretsCommand) -> anyhow::Result<ExitCode> {
    match command {
        SecretsCommand::PublicKey { state } => {
            let key = RunnerKey::load_or_create(&state.state)?;
            crate::say!("{}", key.recipient());
        }
        SecretsCommand::NewKey { state } => {
            let key = RunnerKey::create_new(&state.state)?;
            crate::say_err!("# a new key: seal every secret again to");
            crate::say!("{}", key.recipient());
        }
        SecretsCommand::Seal { name, state } => {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                bail!("secret name {name:?}: use letters, digits and '_'");
            }
            let key = RunnerKey::load_or_create(&state.state)?;
            let mut value = String::new();
            std::io::stdin().read_to_string(&mut value).context("cannot read the value on stdin")?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            let sealed = key.seal(value.as_bytes())?;
            crate::say_err!("# add to {SEALED_FILE} on the default branch:");
            crate::say!("{name}: |");
            for line in sealed.lines() {
                crate::say!("  {line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
