//! The Kubernetes executor: one `batch/v1` Job per session on a cluster, driven through
//! `kubectl`.
//!
//! A session is a Job whose pod keeps a shell alive; steps, uploads and downloads are
//! `kubectl exec -i` into it. Manifests are typed `k8s-openapi` structs piped to
//! `kubectl apply -f -` ([`manifest`]); every kubectl argv is built by a pure function
//! ([`kubectl`]); a step's variables and secrets travel only in the `sh -s` payload on the
//! exec stream ([`knotless_protocol::sdk::payload`]), and its end is proven by a sentinel
//! carrying a nonce and the exit code, never inferred from a closed stream.
//!
//! Invariants:
//! - stdout is the protocol's: nothing in this crate prints.
//! - no value reaches an argv, a manifest, a Secret object, kubectl's environment or a file.
//! - `cleanup` and `shutdown` touch only objects labelled with this runner.
//! - the runner's NetworkPolicy exists while this process has sessions: it is applied before
//!   each Job, deleted when the last session stops, and by `cleanup` with an empty `keep`.

mod cleanup;
mod command;
pub mod config;
pub mod kubectl;
pub mod manifest;
pub mod names;
pub mod pod;
mod session;
mod transfer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use knotless_protocol::sdk::{Context, DownloadStream, Executor, UploadStream};
use knotless_protocol::*;

pub use config::Config;
pub use session::Session;

use crate::kubectl::Kubectl;

/// The Kubernetes executor. Build it with `default()` and hand it to `sdk::serve`.
#[derive(Default)]
pub struct KubernetesExecutor {
    config: Mutex<Option<Arc<Config>>>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Serializes the NetworkPolicy's apply and delete with the count of sessions starting.
    policy: tokio::sync::Mutex<usize>,
}

impl KubernetesExecutor {
    /// The configuration `initialize` accepted.
    fn config(&self) -> Result<Arc<Config>, ExecutorError> {
        lock(&self.config).clone().ok_or_else(|| ExecutorError::new(ErrorKind::NotInitialized, "initialize first"))
    }

    /// The kubectl client of the configuration.
    fn kubectl(&self) -> Result<Kubectl, ExecutorError> {
        let config = self.config()?;
        Ok(Kubectl::new(&config))
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

impl Executor for KubernetesExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo { name: "kubernetes".to_string(), version: env!("CARGO_PKG_VERSION").to_string() }
    }

    async fn initialize(&self, params: &InitializeParams) -> Result<Capabilities, ExecutorError> {
        let config = Config::from_params(params)?;
        tracing::info!(
            kubeconfig = %config.kubeconfig.display(),
            namespace = %config.namespace,
            kubectl = %config.kubectl.display(),
            image = %config.image,
            "kubernetes executor ready"
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
