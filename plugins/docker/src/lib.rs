//! The Docker executor: one container per session on the local Docker engine, driven through
//! the `docker` CLI.
//!
//! A session is a container made from the workflow's image (never pulled), labelled with the
//! runner's id and the session, with no capabilities, no privilege escalation, no host mount,
//! no network unless asked, and an init process that reaps zombies. A step is
//! `docker exec -i <container> sh -s` with its variables and secrets on stdin, run by the
//! SDK's remote-shell step loop ([`knotless_protocol::sdk::remote`]), which finds a step's
//! processes as those the container did not hold before it; files come and go as tar streams
//! through `docker cp`.
//!
//! Invariants:
//! - stdout is the protocol's: nothing in this crate prints.
//! - every docker call goes through [`docker::Docker`]; every argv is built in [`argv`].
//! - no variable or secret value is ever on a command line or in the container's config.
//! - `cleanup` and `shutdown` touch only containers labelled with this runner's id.

// No function over 80 lines (the threshold is clippy.toml's): a longer one is split into
// steps with names.
#![warn(clippy::too_many_lines)]

pub mod argv;
mod cleanup;
mod command;
pub mod config;
pub mod docker;
mod pids;
mod services;
mod session;
mod transfer;

use knotless_protocol::sdk::{Executor, Initialized, Sessions};
use knotless_protocol::*;

pub use config::Config;
pub use session::Session;

/// The Docker executor. Build it with `default()` and hand it to `sdk::serve`.
#[derive(Default)]
pub struct DockerExecutor {
    config: Initialized<Config>,
    sessions: Sessions<Session>,
}

impl Executor for DockerExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo { name: "docker".to_string(), version: env!("CARGO_PKG_VERSION").to_string() }
    }

    async fn initialize(&self, params: &InitializeParams) -> Result<Capabilities, ExecutorError> {
        let config = Config::from_params(params)?;
        let version = config.probe().await?;
        tracing::info!(engine = %version, host = %config.docker.host_shown(), docker = %config.docker.program.display(),
            "the docker engine answers");
        self.config.set(config);
        Ok(config::capabilities())
    }

    // session::start, command::run, session::stop, cleanup::cleanup, transfer::upload,
    // transfer::download, session::shutdown.
    knotless_protocol::sdk::operations!();
}
