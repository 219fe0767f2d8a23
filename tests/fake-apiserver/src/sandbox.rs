//! A pod's containers as Linux sandboxes (moved from tests/fake-kubectl/src/pods.rs), one per
//! container as the runtime gives each its own root filesystem and PID namespace: a busybox
//! root folder unpacked from the rootfs tar into `DIR/pods/<ns>/<pod>/<container>/root`, the
//! container's command as PID 1 of its own PID and mount namespaces (`unshare --pid --fork
//! --mount --mount-proc --root --wd`), with a clean environment as a container runtime gives
//! (PATH, HOSTNAME, HOME and the container's `env`), stdout and stderr to the container's log
//! (`<container>/log`), its PID 1 in `<container>/init.pid` while it runs, and the kubelet's
//! managed `/etc/hosts` written into its root (pkg/kubelet/kubelet_pods.go `makeHostsMount`
//! mounts one file into every container; here each root gets a copy). The sandboxes share the
//! host's network namespace rather than one of the pod's own: containers of a pod reach each
//! other on 127.0.0.1 as in a real pod, and so do those of other pods. `setpriv --pdeathsig
//! KILL` and `unshare --kill-child` tie a sandbox to this server: if it dies, its pods die.
//! Signals go to PID 1 as the runtime sends them (a PID 1 without a handler ignores TERM, as in
//! a real container); freezing (node lost) stops every process of the PID namespace.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// `PATH` inside a pod (the busybox image's).
pub const POD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The folder of a pod's files: `DIR/pods/<ns>/<pod>`.
pub fn pod_dir(dir: &Path, namespace: &str, pod: &str) -> PathBuf {
    dir.join("pods").join(namespace).join(pod)
}

/// The folder of a container's files: `DIR/pods/<ns>/<pod>/<container>` (`root`, `log`,
/// `init.pid`).
pub fn container_dir(dir: &Path, namespace: &str, pod: &str, container: &str) -> PathBuf {
    pod_dir(dir, namespace, pod).join(container)
}

/// What a container runs.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: String,
    pub mounts: Vec<String>,
    /// The pod's hostname (`HOSTNAME`).
    pub hostname: String,
    /// The kubelet-managed `/etc/hosts`, if the kubelet writes one.
    pub hosts: Option<String>,
}

/// Unpacks the container's root and starts it; the unshare process and the host PID of the
/// container's PID 1 (`None` if it already exited).
pub async fn start(
    dir: &Path,
    rootfs: &Path,
    namespace: &str,
    pod: &str,
    container: &str,
    spec: &ContainerSpec,
) -> anyhow::Result<(Child, Option<i32>)> {
    let base = container_dir(dir, namespace, pod, container);
    let root = base.join("root");
    tokio::fs::create_dir_all(&root).await?;
    let status = Command::new("tar").arg("-xf").arg(rootfs).arg("-C").arg(&root).status().await.context("tar")?;
    if !status.success() {
        bail!("cannot unpack {} into {}", rootfs.display(), root.display());
    }
    if let Some(hosts) = &spec.hosts {
        tokio::fs::create_dir_all(root.join("etc")).await?;
        tokio::fs::write(root.join("etc/hosts"), hosts).await.context("/etc/hosts")?;
    }
    // A container runtime gives every container these devices.
    for (name, minor) in [("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)] {
        let node = root.join("dev").join(name);
        if !node.exists() {
            let made = Command::new("mknod")
                .args(["-m", "666"])
                .arg(&node)
                .args(["c", "1", &minor.to_string()])
                .status()
                .await;
            if !made.is_ok_and(|s| s.success()) {
                bail!("cannot make {}", node.display());
            }
        }
    }
    for mount in &spec.mounts {
        tokio::fs::create_dir_all(root.join(mount.trim_start_matches('/'))).await?;
    }
    let wd = if spec.working_dir.is_empty() { "/".to_string() } else { spec.working_dir.clone() };
    tokio::fs::create_dir_all(root.join(wd.trim_start_matches('/'))).await?;
    let log = std::fs::OpenOptions::new().create(true).append(true).open(base.join("log"))?;
    let mut command = Command::new("setpriv");
    command
        .args([
            "--pdeathsig",
            "KILL",
            "unshare",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            "--mount",
            "--mount-proc=/proc",
        ])
        .arg(format!("--root={}", root.display()))
        .arg(format!("--wd={wd}"))
        .arg("--")
        .args(&spec.command)
        .env_clear()
        .env("PATH", POD_PATH)
        .env("HOSTNAME", &spec.hostname)
        .env("HOME", "/root");
    for (name, value) in &spec.env {
        command.env(name, value);
    }
    let child = command
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .context("unshare")?;
    let mut child = child;
    let Some(unshare) = child.id() else { return Ok((child, None)) };
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|pid| pid.parse().ok()) {
            std::fs::write(base.join("init.pid"), format!("{pid}\n"))?;
            return Ok((child, Some(pid)));
        }
        if child.try_wait()?.is_some() {
            return Ok((child, None));
        }
        if Instant::now() > until {
            bail!("the sandbox of container {container} of pod {namespace}/{pod} did not start");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends a signal to PID 1 of a sandbox.
pub fn signal(init: i32, signal: Signal) {
    if init <= 1 {
        return;
    }
    let _ = kill(Pid::from_raw(init), signal);
}

/// Every process of the sandbox's PID namespace (host PIDs).
pub fn processes(init: i32) -> Vec<i32> {
    if init <= 1 {
        return Vec::new();
    }
    let Ok(target) = std::fs::read_link(format!("/proc/{init}/ns/pid")) else { return Vec::new() };
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|ns| ns == target) {
            pids.push(pid);
        }
    }
    pids
}

/// Stops (node lost) or continues (node back) every process of a sandbox.
pub fn freeze(init: i32, frozen: bool) {
    if init <= 1 {
        return;
    }
    let signal = if frozen { Signal::SIGSTOP } else { Signal::SIGCONT };
    for pid in processes(init) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// Removes a finished container's root (its log stays).
pub async fn remove_root(dir: &Path, namespace: &str, pod: &str, container: &str) {
    let _ = tokio::fs::remove_dir_all(container_dir(dir, namespace, pod, container).join("root")).await;
}
