//! The daemon's retention: the state folder pruned at start and hourly (see
//! [`crate::retention`]), with what the daemon knows: the repositories watched now and their
//! open pulls.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Daemon;
use crate::forge::Forge;
use crate::retention::{self, Keep};

/// How often the state folder is pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

impl<F: Forge> Daemon<F> {
    /// Prunes the state folder now, then every hour until the handover.
    pub(super) fn keep_pruning(self: &Arc<Self>) {
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                daemon.prune().await;
                tokio::select! {
                    () = daemon.handover.cancelled() => return,
                    () = tokio::time::sleep(PRUNE_EVERY) => {}
                }
            }
        });
    }

    /// Prunes once; a mirror removed takes its repository's remembered heads with it, so a
    /// repository watched again is looked at as new (its records say what already ran).
    async fn prune(&self) {
        let state = self.state.snapshot();
        let watched: BTreeSet<String> = match self.forge.repositories().await {
            Ok(repositories) => repositories.into_iter().map(|repository| repository.key).collect(),
            Err(error) => {
                tracing::warn!("no pruning this hour: cannot list the repositories: {error:#}");
                return;
            }
        };
        let open_pulls = state
            .repositories
            .iter()
            .map(|(key, known)| (key.clone(), known.seen.pulls.keys().copied().collect()))
            .collect();
        let keep = Keep { watched, open_pulls };
        let (folder, policy) = (self.config.state.clone(), self.config.retention);
        let pruned =
            match tokio::task::spawn_blocking(move || retention::prune(&folder, &policy, &keep, SystemTime::now()))
                .await
            {
                Ok(pruned) => pruned,
                Err(error) => {
                    tracing::error!("the pruning failed: {error}");
                    return;
                }
            };
        if !pruned.mirrors.is_empty() {
            self.state.update(|state| {
                for key in &pruned.mirrors {
                    state.repositories.remove(key);
                }
            });
        }
        if let Some(summary) = pruned.summary() {
            tracing::info!("{summary}");
        }
        for failure in &pruned.failures {
            tracing::warn!("pruning: {failure}");
        }
    }
}
