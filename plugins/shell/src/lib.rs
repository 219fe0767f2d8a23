//! The shell executor: runs each session's steps as host processes in a per-session folder.
//!
//! It isolates nothing. A session is a folder `<work-dir>/<runner-id>/<session>/` holding
//! `work/`, `steps/`, `outputs/`, `home/` and `tmp/`; a step is `/bin/sh -ec <script>` in its
//! own process group, with a cleared environment holding only the step's variables, its own
//! secrets and the marker variable [`processes::MARKER`], by which every process a session
//! started is found in `/proc` again, even one that left the process group.
//!
//! Invariants:
//! - stdout is the protocol's: nothing in this crate prints.
//! - variables and secrets reach a step through its environment only, never an argv or a file.
//! - `cleanup` and `shutdown` touch only folders and processes of this runner id.

mod cleanup;
mod command;
mod config;
pub mod processes;
mod session;
mod transfer;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use knotless_protocol::sdk::{Context, DownloadStream, Executor, UploadStream};
use knotless_protocol::*;

pub use config::Config;
pub use session::Session;

/// The shell executor. Build it with `default()` and hand it to `sdk::serve`.
#[derive(Default)]
pub struct ShellExecutor {
    config: Mutex<Option<Arc<Config>>>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    image_warned: AtomicBool,
}

impl ShellExecutor {
    /// The configuration `initialize` accepted.
    fn config(&self) -> Result<Arc<Config>, ExecutorError> {
        lock(&self.config).clone().ok_or_else(|| ExecutorError::new(ErrorKind::NotInitialized, "initialize first"))
    }

    /// The sessions this process started and has not stopped.
    fn sessions(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        lock(&self.sessions)
    }

    /// A session this process started, or the protocol's unknown-session error.
    fn session(&self, session: &str) -> Result<Arc<Session>, ExecutorError> {
        self.sessions().get(session).cloned().ok_or_else(|| ExecutorError::unknown_session(session))
    }
}

/// Locks a mutex, taking the data even if a panicking thread poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl Executor for ShellExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo { name: "shell".to_string(), version: env!("CARGO_PKG_VERSION").to_string() }
    }

    async fn initialize(&self, params: &InitializeParams) -> Result<Capabilities, ExecutorError> {
        let config = Config::from_params(params)?;
        tracing::warn!(
            work_dir = %config.work_dir.display(),
            "the shell executor isolates nothing: steps run as host processes with this user's rights"
        );
        *lock(&self.config) = Some(Arc::new(config));
        Ok(config::capabilities())
    }

    async fn start(&self, params: StartParams, context: Context) -> Result<StartResult, ExecutorError> {
        session::start(self, params, context).await
    }

    async fn command(&self, params: CommandParams, context: Context) -> Result<CommandResult, ExecutorError> {
        command::run(self, params, context).await
    }

    async fn stop(&self, params: StopParams, context: Context) -> Result<StopResult, ExecutorError> {
        session::stop(self, params, context).await
    }

    async fn cleanup(&self, params: CleanupParams, context: Context) -> Result<CleanupResult, ExecutorError> {
        cleanup::cleanup(self, params, context).await
    }

    async fn upload(&self, params: &TransferParams, data: UploadStream, context: Context) -> Result<(), ExecutorError> {
        transfer::upload(self, params, data, context).await
    }

    async fn download(
        &self,
        params: &TransferParams,
        data: DownloadStream,
        context: Context,
    ) -> Result<(), ExecutorError> {
        transfer::download(self, params, data, context).await
    }

    async fn shutdown(&self) {
        session::shutdown(self).await
    }
}
