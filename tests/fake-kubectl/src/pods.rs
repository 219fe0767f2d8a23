//! The pod lifecycle: a Job's pod, Ready at once or failing as injected, and its sandbox: a
//! busybox root folder with the container's command running as PID 1 of its own PID and
//! mount namespaces (`unshare --pid --fork --mount --mount-proc`, then `chroot`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::store::{Store, text};

/// `PATH` inside a pod.
pub const POD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A pod's root folder.
pub fn root_of(dir: &Path, pod: &str) -> PathBuf {
    dir.join("pods").join(pod).join("root")
}

/// Creates the pod of a Job, with the status the injections ask for, and runs it.
pub fn create_for_job(
    store: &mut Store,
    job: &Value,
    injected: &std::collections::BTreeSet<String>,
) -> anyhow::Result<()> {
    let job_name = text(job, "/metadata/name").to_string();
    let namespace = text(job, "/metadata/namespace").to_string();
    let number = store.next();
    let pod_name = format!("{job_name}-{:05x}", number * 7919 % 0xfffff);
    let template = job.pointer("/spec/template").cloned().unwrap_or_default();
    let mut labels = template.pointer("/metadata/labels").cloned().unwrap_or_else(|| json!({}));
    labels["job-name"] = json!(job_name);
    let spec = template.get("spec").cloned().unwrap_or_default();
    let image = text(&spec, "/containers/0/image").to_string();
    let waiting = |reason: &str, message: String| {
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
               "containerStatuses": [{"name": "run", "image": image, "ready": false, "state": {"waiting": {"reason": reason, "message": message}}}]})
    };
    let mut events = Vec::new();
    let status = if injected.contains("image-missing") {
        let message =
            format!("rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": not found");
        events.push(("Failed", format!("Failed to pull image \"{image}\": {message}")));
        waiting("ErrImagePull", message)
    } else if injected.contains("pull-denied") {
        let message = format!(
            "failed to pull image \"{image}\": pull access denied, repository does not allow it: 401 Unauthorized"
        );
        events.push(("Failed", message.clone()));
        waiting("ErrImagePull", message)
    } else if injected.contains("unschedulable") {
        let message = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available.".to_string();
        events.push(("FailedScheduling", message.clone()));
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]})
    } else {
        json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
               "containerStatuses": [{"name": "run", "image": image, "ready": true, "state": {"running": {}}}]})
    };
    let running = text(&status, "/phase") == "Running";
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels,
                     "annotations": template.pointer("/metadata/annotations").cloned().unwrap_or_else(|| json!({})),
                     "ownerReferences": [{"kind": "Job", "name": job_name}]},
        "spec": spec, "status": status,
    });
    if running {
        let command: Vec<String> = spec
            .pointer("/containers/0/command")
            .and_then(Value::as_array)
            .map(|items| items.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_else(|| vec!["sh".into(), "-c".into(), "sleep 1000000".into()]);
        let init = start_sandbox(&store.dir, &pod_name, &command)?;
        pod["metadata"]["annotations"]["fake.knotless.dev/init-pid"] = json!(init.to_string());
    }
    for (reason, message) in events {
        let number = store.next();
        store.data.objects.push(
            json!({"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": reason, "message": message,
            "metadata": {"name": format!("{pod_name}.{number}"), "namespace": namespace},
            "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": namespace}}),
        );
    }
    store.data.objects.push(pod);
    Ok(())
}

/// Makes the pod's root from `rootfs.tar` and starts the container's command as PID 1 of new
/// PID and mount namespaces; the host PID of that PID 1.
fn start_sandbox(dir: &Path, pod: &str, command: &[String]) -> anyhow::Result<i32> {
    let root = root_of(dir, pod);
    std::fs::create_dir_all(&root)?;
    let rootfs = dir.join("rootfs.tar");
    let status = Command::new("tar").arg("-xf").arg(&rootfs).arg("-C").arg(&root).status().context("tar")?;
    if !status.success() {
        bail!("cannot unpack {} into {}", rootfs.display(), root.display());
    }
    // A container runtime gives every container these devices.
    for (name, minor) in [("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)] {
        let node = root.join("dev").join(name);
        if !node.exists() {
            let made =
                Command::new("mknod").args(["-m", "666"]).arg(&node).args(["c", "1", &minor.to_string()]).status();
            if !made.is_ok_and(|status| status.success()) {
                bail!("cannot make {}", node.display());
            }
        }
    }
    let child = Command::new("unshare")
        .arg("--pid")
        .arg("--fork")
        .arg("--mount")
        .arg(format!("--mount-proc={}", root.join("proc").display()))
        .arg("chroot")
        .arg(&root)
        .args(command)
        .env_clear()
        .env("PATH", POD_PATH)
        .env("HOSTNAME", pod)
        .env("HOME", "/root")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("unshare")?;
    let unshare = child.id();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|pid| pid.parse().ok()) {
            return Ok(pid);
        }
        if Instant::now() > until {
            bail!("the sandbox of pod {pod} did not start");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The host PID of a pod's PID 1, if it runs.
pub fn init_pid(pod: &Value) -> Option<i32> {
    text(pod, "/metadata/annotations/fake.knotless.dev~1init-pid").parse().ok()
}

/// Kills every process of a pod: SIGKILL to PID 1 of its namespace takes all of them.
pub fn kill_sandbox(pod: &Value) {
    if let Some(pid) = init_pid(pod) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Deletes pods (killing their processes) and the Jobs named; the names deleted.
pub fn delete_where(store: &mut Store, doomed: &dyn Fn(&Value) -> bool) -> Vec<Value> {
    let (gone, kept): (Vec<Value>, Vec<Value>) =
        std::mem::take(&mut store.data.objects).into_iter().partition(|o| doomed(o));
    store.data.objects = kept;
    let mut removed = Vec::new();
    for object in gone {
        if text(&object, "/kind") == "Job" {
            let job = text(&object, "/metadata/name").to_string();
            let namespace = text(&object, "/metadata/namespace").to_string();
            removed.extend(delete_where(store, &|pod| {
                text(pod, "/kind") == "Pod"
                    && text(pod, "/metadata/namespace") == namespace
                    && text(pod, "/metadata/labels/job-name") == job
            }));
        }
        if text(&object, "/kind") == "Pod" {
            kill_sandbox(&object);
        }
        removed.push(object);
    }
    removed
}

/// Marks a pod as lost with its node, and kills its processes.
pub fn lose_node(store: &mut Store, pod_name: &str) {
    for object in &mut store.data.objects {
        if text(object, "/kind") == "Pod" && text(object, "/metadata/name") == pod_name {
            kill_sandbox(object);
            object["status"] = json!({"phase": "Failed", "reason": "NodeLost",
                "message": format!("Node fake-node-1 which was running pod {pod_name} is unresponsive")});
        }
    }
}
