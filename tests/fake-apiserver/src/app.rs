//! The server's shared state: configuration (the flags), the store, and the runtime state the
//! controllers keep beside the objects (what a real controller keeps in memory: back-offs,
//! timers, the kubelet's sandboxes).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use crate::store::Store;

/// The flags.
#[derive(Debug, Clone)]
pub struct Config {
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    pub kubernetes_version: crate::version::KubeVersion,
    pub nodes: usize,
    pub node_cpu: String,
    pub node_memory: String,
    pub autoscale_max: usize,
    pub scale_up_delay: Duration,
    pub node_provision: Duration,
    pub scale_down_after: Duration,
    pub node_monitor_grace: Duration,
    pub eviction_toleration: Duration,
    pub image_pull: Duration,
    pub pull_backoff: Duration,
    pub job_backoff: Duration,
    pub grace: Duration,
    pub exec_dial_timeout: Duration,
    pub watch_list: bool,
    pub images: Vec<String>,
}

/// A bearer token.
#[derive(Debug, Clone)]
pub struct Token {
    pub user: String,
    /// Admin (system:masters) or a service account `(namespace, name)`.
    pub service_account: Option<(String, String)>,
    pub expires: Option<SystemTime>,
}

/// The kubelet's record of a pod it runs.
#[derive(Debug, Default, Clone)]
pub struct PodRuntime {
    pub uid: String,
    /// Container name → host PID of its PID 1, for each container running now.
    pub init_pids: BTreeMap<String, i32>,
}

/// A node's runtime: its kubelet's health.
#[derive(Debug, Clone)]
pub struct NodeRuntime {
    /// When the kubelet stopped (node-lost fault).
    pub lost_at: Option<Instant>,
    /// When the node becomes Ready (provisioning).
    pub ready_at: Instant,
    /// Since when no pod runs on it.
    pub empty_since: Option<Instant>,
    /// Images present on the node.
    pub images: BTreeSet<String>,
}

/// Request accounting.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: u64,
    pub by: BTreeMap<String, u64>,
    /// The refused ones, by `verb resource code`.
    pub refused: BTreeMap<String, u64>,
}

#[derive(Default)]
pub struct Runtime {
    pub faults: BTreeSet<String>,
    pub fired: BTreeSet<String>,
    pub tokens: BTreeMap<String, Token>,
    pub stats: Stats,
    pub nodes: BTreeMap<String, NodeRuntime>,
    pub pods: BTreeMap<(String, String), PodRuntime>,
    /// Job uid → (create failures so far, next attempt).
    pub job_backoff: BTreeMap<String, (u32, Instant)>,
    /// Pod uid → when the autoscaler first saw it unschedulable, and whether it decided.
    pub pending: BTreeMap<String, (Instant, bool)>,
    /// Pod uid → when the node controller started its eviction clock.
    pub evictions: BTreeMap<String, Instant>,
    pub node_seq: usize,
    /// Pod uids with a kubelet worker.
    pub workers: BTreeSet<String>,
}

pub struct State {
    pub store: Store,
    pub rt: Runtime,
}

pub struct App {
    pub config: Config,
    state: Mutex<State>,
    pub changed: watch::Receiver<u64>,
    pub server: Mutex<String>,
}

pub type Shared = Arc<App>;

impl App {
    pub fn new(config: Config) -> Shared {
        let (tx, rx) = watch::channel(0);
        Arc::new(Self {
            config,
            state: Mutex::new(State { store: Store::new(tx), rt: Runtime::default() }),
            changed: rx,
            server: Mutex::new(String::new()),
        })
    }

    /// The state, locked (never held across an await).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn fault(&self, name: &str) -> bool {
        self.lock().rt.faults.contains(name)
    }
}
