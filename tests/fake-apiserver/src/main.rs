//! `knotless-fake-apiserver`: a fake Kubernetes API server for the Kubernetes executor's tests.
//! It speaks the real REST, watch and exec-websocket API over an in-memory store and models
//! the controllers that act on it (Job, garbage collector, TTL, scheduler, cluster-autoscaler,
//! node lifecycle, kubelet). Each module names the upstream component and file it follows.
//!
//! `knotless-fake-apiserver --state DIR --rootfs ROOTFS.tar [flags]` binds 127.0.0.1:0, writes
//! `DIR/kubeconfig`, prints `ready DIR/kubeconfig`, and serves until SIGTERM/SIGINT or until
//! its stdin closes; on exit it kills the sandbox of every container it started.

mod api;
mod app;
mod auth;
mod controllers;
mod events;
mod exec;
mod fake;
mod isolation;
mod networkpolicy;
mod quantity;
mod registry;
mod resources;
mod sandbox;
mod selectors;
mod status;
mod store;
mod strict;
mod util;
mod validation;
mod version;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::app::{App, Config, Token};

/// A flag's duration, as the runner's workflows and flags write one (`2s`, `200ms`, `10m`).
fn duration(text: &str) -> Result<Duration, String> {
    knotless_protocol::duration::parse_duration(text)
        .ok_or_else(|| format!("{text:?}: {}", knotless_protocol::duration::DURATION_HINT))
}

/// A fake Kubernetes API server with controllers and a kubelet that runs pods as sandboxes.
#[derive(Debug, Parser)]
#[command(name = "knotless-fake-apiserver")]
struct Cli {
    /// Folder for the kubeconfig and the pods' roots and logs.
    #[arg(long)]
    state: PathBuf,
    /// The root filesystem every image runs (tests/support/rootfs.sh builds it).
    #[arg(long)]
    rootfs: PathBuf,
    /// The Kubernetes version the server reports and models: its exec speaks
    /// `v5.channel.k8s.io` from 1.30, and only `v4.channel.k8s.io` before.
    #[arg(long, default_value = version::DEFAULT, value_parser = version::KubeVersion::parse)]
    kubernetes_version: version::KubeVersion,
    /// Nodes at start.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// Allocatable CPU per node.
    #[arg(long, default_value = "2")]
    node_cpu: String,
    /// Allocatable memory per node.
    #[arg(long, default_value = "4Gi")]
    node_memory: String,
    /// Largest node group size for the autoscaler (0: no autoscaler).
    #[arg(long, default_value_t = 0)]
    autoscale_max: usize,
    /// How long a pod is unschedulable before the autoscaler acts (scan interval).
    #[arg(long, default_value = "10s", value_parser = duration)]
    scale_up_delay: Duration,
    /// How long a new node takes to become Ready.
    #[arg(long, default_value = "5s", value_parser = duration)]
    node_provision: Duration,
    /// How long a node is empty before it is removed (scale-down-unneeded-time).
    #[arg(long, default_value = "600s", value_parser = duration)]
    scale_down_after: Duration,
    /// How long a silent kubelet's node stays Ready (node-monitor-grace-period).
    #[arg(long, default_value = "40s", value_parser = duration)]
    node_monitor_grace: Duration,
    /// The default toleration of the unreachable/not-ready NoExecute taints.
    #[arg(long, default_value = "300s", value_parser = duration)]
    eviction_toleration: Duration,
    /// How long an image pull takes.
    #[arg(long, default_value = "0s", value_parser = duration)]
    image_pull: Duration,
    /// The kubelet's first image pull back-off (doubling, at most 300 s).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pull_backoff: Duration,
    /// The Job controller's first pod-create retry back-off (doubling).
    #[arg(long, default_value = "10s", value_parser = duration)]
    job_backoff: Duration,
    /// The default terminationGracePeriodSeconds.
    #[arg(long, default_value = "30s", value_parser = duration)]
    grace: Duration,
    /// How long an exec to a pod on a lost node waits for the kubelet's dial before it fails
    /// (the API server's kubelet client dials with a 30 s timeout).
    #[arg(long, default_value = "30s", value_parser = duration)]
    exec_dial_timeout: Duration,
    /// Whether watches serve streaming lists (`sendInitialEvents`, the WatchList feature);
    /// `--watch-list false` refuses them as a server without the feature does.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    watch_list: bool,
    /// Another image that exists (repeatable).
    #[arg(long = "image")]
    images: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.state).with_context(|| format!("cannot create {}", cli.state.display()))?;
    let dir = std::fs::canonicalize(&cli.state)?;
    let rootfs =
        std::fs::canonicalize(&cli.rootfs).with_context(|| format!("no rootfs at {}", cli.rootfs.display()))?;
    let admin_token = format!("{:016x}{:016x}", util::random(), util::random());
    let config = Config {
        dir: dir.clone(),
        rootfs,
        kubernetes_version: cli.kubernetes_version,
        nodes: cli.nodes,
        node_cpu: cli.node_cpu,
        node_memory: cli.node_memory,
        autoscale_max: cli.autoscale_max,
        scale_up_delay: cli.scale_up_delay,
        node_provision: cli.node_provision,
        scale_down_after: cli.scale_down_after,
        node_monitor_grace: cli.node_monitor_grace,
        eviction_toleration: cli.eviction_toleration,
        image_pull: cli.image_pull,
        pull_backoff: cli.pull_backoff,
        job_backoff: cli.job_backoff,
        grace: cli.grace,
        exec_dial_timeout: cli.exec_dial_timeout,
        watch_list: cli.watch_list,
        images: cli.images,
    };
    for (name, value) in [("--node-cpu", &config.node_cpu), ("--node-memory", &config.node_memory)] {
        if quantity::parse(value).is_none() {
            anyhow::bail!("{name} {value}: {}", quantity::FORMAT_WRONG);
        }
    }
    let app = App::new(config.clone());
    {
        let mut state = app.lock();
        state
            .rt
            .tokens
            .insert(admin_token.clone(), Token { user: auth::ADMIN.into(), service_account: None, expires: None });
        let namespaces = resources::by_key("namespaces").context("namespaces")?;
        for ns in ["default", "kube-system", "knotless-runs"] {
            registry::create(
                &mut state,
                &config,
                &Token { user: auth::ADMIN.into(), service_account: None, expires: None },
                namespaces,
                "",
                json!({"metadata": {"name": ns}}),
                strict::FieldValidation::Ignore,
            )
            .map_err(|e| anyhow::anyhow!(e.message()))?;
        }
        for _ in 0..config.nodes {
            controllers::nodes::add(&mut state, &config, Duration::ZERO);
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let server = format!("http://{address}");
    if let Ok(mut s) = app.server.lock() {
        *s = server.clone();
    }
    let kubeconfig = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    namespace: default\n    user: admin\ncurrent-context: fake\nusers:\n- name: admin\n  user:\n    token: {admin_token}\npreferences: {{}}\n"
    );
    let partial = dir.join("kubeconfig.partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, &kubeconfig)?;
    tokio::spawn(controllers::run(app.clone()));
    let router = api::router(app.clone());
    let serve = axum::serve(listener, router);
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready {}", kubeconfig.display())?;
        out.flush()?;
    }
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
        let stdin_closed = async {
            let mut stdin = tokio::io::stdin();
            let mut buffer = [0u8; 1024];
            while let Ok(n) = stdin.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::select! {
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending::<()>().await } } => {}
            _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending::<()>().await } } => {}
            _ = stdin_closed => {}
        }
    };
    tokio::select! {
        result = serve => result?,
        _ = stop => {}
    }
    // Kill every container's sandbox: SIGKILL to a PID namespace's init takes all its processes.
    let pids: Vec<i32> = app.lock().rt.pods.values().flat_map(|p| p.init_pids.values().copied()).collect();
    for pid in pids {
        sandbox::signal(pid, Signal::SIGKILL);
    }
    // Not a return: the runtime would wait for the blocking thread that reads stdin, which
    // may never end (a stdin held open by the caller, as conformance.sh does).
    std::process::exit(0)
}
