//! The Kubernetes executor: one `batch/v1` Job per session on a cluster, through the
//! Kubernetes API (kube-rs); no `kubectl`, no process of any kind.
//!
//! A session is a Job whose pod keeps a shell alive; steps, uploads and downloads are execs
//! into it over the API's websocket ([`api`]). Manifests are typed `k8s-openapi` structs
//! created with strict field validation ([`manifest`]); the pod's state and the events about
//! it come from watches ([`watch`]); a step's variables and secrets travel only in the
//! `sh -s` payload on the exec's stdin ([`knotless_protocol::sdk::payload`]), and its end is
//! proven by a sentinel carrying a nonce and the exit code, checked against the exec's status
//! channel, never inferred from a closed stream.
//!
//! Invariants:
//! - stdout is the protocol's: nothing in this crate prints.
//! - no value reaches a URL, a manifest, a Secret object or a file.
//! - `cleanup` and `shutdown` touch only objects labelled with this runner, and `cleanup` only
//!   those of a session not in flight whose owner process is provably gone ([`cleanup`]).
//! - every run has a default-deny-ingress NetworkPolicy of its own, made before its Job and
//!   owned by its pod, so it outlives the pod and the garbage collector deletes it ([`policy`]).

// No function over 80 lines (the threshold is clippy.toml's): a longer one is split into
// steps with names.
#![warn(clippy::too_many_lines)]

pub mod api;
mod cleanup;
mod command;
pub mod config;
pub mod credential;
mod ending;
mod exec;
pub mod manifest;
pub mod names;
pub mod pod;
mod policy;
mod ready;
mod services;
mod session;
mod transfer;
mod watch;

use std::collections::BTreeSet;

use knotless_protocol::owner::Owner;
use knotless_protocol::sdk::{Executor, Initialized, Sessions};
use knotless_protocol::*;

pub use config::Config;
pub use session::Session;

use crate::api::Cluster;

/// The Kubernetes executor. Build it with `default()` and hand it to `sdk::serve`.
#[derive(Default)]
pub struct KubernetesExecutor {
    config: Initialized<Config>,
    cluster: Initialized<Cluster>,
    sessions: Sessions<Session>,
    /// The sessions whose start is in flight.
    starting: std::sync::Mutex<BTreeSet<String>>,
    /// This process's lock, whose token every object it makes carries.
    owner: Initialized<Owner>,
}

impl Executor for KubernetesExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo { name: "kubernetes".to_string(), version: env!("CARGO_PKG_VERSION").to_string() }
    }

    async fn initialize(&self, params: &InitializeParams) -> Result<Capabilities, ExecutorError> {
        let config = Config::from_params(params)?;
        let cluster = Cluster::new(&config);
        // The kubeconfig and its context are read now: a bad one fails here, naming the flag.
        cluster.client().await?;
        if self.owner.get().is_err() {
            let folder = knotless_protocol::owner::owners_dir();
            let owner = Owner::acquire_in(&folder).map_err(|error| {
                ExecutorError::infrastructure(format!(
                    "cannot take this process's owner lock in {}: {error} (the folder must be this user's, \
                     mode 0700; it is $XDG_RUNTIME_DIR/knotless-owners, or knotless-owners-UID in the \
                     temporary folder)",
                    folder.display()
                ))
            })?;
            tracing::info!(owner = %owner.token(), "owner lock taken");
            self.owner.set(owner);
        }
        tracing::info!(
            kubeconfig = %config.kubeconfig.display(),
            namespace = %config.namespace,
            image = %config.image,
            "kubernetes executor ready"
        );
        self.cluster.set(cluster);
        self.config.set(config);
        Ok(config::capabilities())
    }

    // session::start, command::run, session::stop, cleanup::cleanup, transfer::upload,
    // transfer::download, session::shutdown.
    knotless_protocol::sdk::operations!();
}

#[cfg(test)]
mod tests {
    /// The executor reaches the cluster only through the API: no module starts a process.
    #[test]
    fn no_module_starts_a_process() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut read = 0;
        for entry in std::fs::read_dir(&src).expect("src").flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).expect("read");
                // Spelled in pieces, so that this test does not find itself.
                for spawning in [["process", "::Command"], ["Command", "::new"], ["process", "::Stdio"]] {
                    let spawning = spawning.concat();
                    assert!(!text.contains(&spawning), "{} uses {spawning}", path.display());
                }
                read += 1;
            }
        }
        assert!(read >= 10, "read {read} modules");
    }
}
