//! The shell executor: runs each session's steps as host processes in a per-session folder.
//!
//! It isolates nothing. A session is a folder `<work-dir>/<runner-id>/<session>/` holding
//! `work/`, `steps/`, `outputs/`, `home/` and `tmp/`; a step is `/bin/sh -ec <script>` in its
//! own process group, with a cleared environment holding only the step's variables and its
//! own secrets, under a step reaper ([`reaper`]): a child subreaper whose descendants are
//! exactly the step's processes, however they hide (`setsid`, a double fork, a cleared
//! environment), kept by the session for its next step when the step left nothing.
//!
//! Invariants:
//! - stdout is the protocol's: nothing in this crate prints (a reaper's stdio is `/dev/null`).
//! - variables and secrets reach a step through its environment only, never an argv or a file.
//! - a step's processes are found through its reaper's process tree, never by a scan of the
//!   host's `/proc`; when a reaper dies, its orphans come back to the executor, also a
//!   subreaper, which kills them.
//! - `cleanup` and `shutdown` touch only folders and processes of this runner id.

// No function over 80 lines (the threshold is clippy.toml's): a longer one is split into
// steps with names.
#![warn(clippy::too_many_lines)]

mod cleanup;
mod command;
mod config;
pub mod processes;
pub mod reaper;
mod session;
mod transfer;

use std::sync::atomic::AtomicBool;

use knotless_protocol::sdk::{Executor, Initialized, Sessions};
use knotless_protocol::*;

pub use config::Config;
pub use session::Session;

/// The shell executor: build it with `default()` and hand it to `sdk::serve`.
///
/// It makes its process a child subreaper, and when a step kills its reaper, every child of
/// the process that is not a reaper is killed as that step's: a program that serves the
/// executor (its own binary, or a test) must start no children of its own.
#[derive(Default)]
pub struct ShellExecutor {
    config: Initialized<Config>,
    sessions: Sessions<Session>,
    image_warned: AtomicBool,
}

impl Executor for ShellExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo { name: "shell".to_string(), version: env!("CARGO_PKG_VERSION").to_string() }
    }

    async fn initialize(&self, params: &InitializeParams) -> Result<Capabilities, ExecutorError> {
        let config = Config::from_params(params)?;
        reaper::adopt_orphans().map_err(|error| {
            ExecutorError::infrastructure(format!("cannot make the shell executor a child subreaper: {error}"))
        })?;
        tracing::warn!(
            work_dir = %config.work_dir.display(),
            "the shell executor isolates nothing: steps run as host processes with this user's rights"
        );
        self.config.set(config);
        Ok(config::capabilities())
    }

    // session::start, command::run, session::stop, cleanup::cleanup, transfer::upload,
    // transfer::download, session::shutdown.
    knotless_protocol::sdk::operations!();
}
