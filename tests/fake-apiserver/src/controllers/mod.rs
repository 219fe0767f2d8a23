//! The control plane's controllers and the nodes' kubelets, run as one reconcile loop over
//! the store (each pass idempotent, run on every change and at least every 100 ms), as the
//! kube-controller-manager's, kube-scheduler's and cluster-autoscaler's informer-driven loops
//! converge on the same state.

pub mod autoscaler;
pub mod gc;
pub mod job;
pub mod kubelet;
pub mod nodes;
pub mod scheduler;

use std::time::Duration;

use crate::app::Shared;
use crate::util::text;

/// Runs every controller until the process ends.
pub async fn run(app: Shared) {
    let mut changed = app.changed.clone();
    let mut attempts = scheduler::Attempts::new();
    loop {
        let spawn = {
            let mut state = app.lock();
            let config = &app.config;
            nodes::sync(&mut state, config);
            job::sync(&mut state, config);
            gc::sync(&mut state);
            scheduler::sync(&mut state, &mut attempts);
            autoscaler::sync(&mut state, config);
            // The kubelets: a worker for every pod bound to a node.
            let mut spawn = Vec::new();
            for pod in state.store.list("pods", None) {
                let uid = text(&pod, "/metadata/uid").to_string();
                let node = text(&pod, "/spec/nodeName");
                if node.is_empty() || state.rt.workers.contains(&uid) || !state.rt.nodes.contains_key(node) {
                    continue;
                }
                state.rt.workers.insert(uid.clone());
                spawn.push((
                    text(&pod, "/metadata/namespace").to_string(),
                    text(&pod, "/metadata/name").to_string(),
                    uid,
                ));
            }
            spawn
        };
        for (namespace, name, uid) in spawn {
            tokio::spawn(kubelet::run(app.clone(), namespace, name, uid));
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), changed.changed()).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
