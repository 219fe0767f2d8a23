//! Starts the fake API server for a test and connects kube-rs to it.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

/// The target folder (`CARGO_TARGET_TMPDIR` is `<target>/tmp`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().to_path_buf()
}

/// The busybox rootfs, built once under a lock.
pub fn rootfs() -> PathBuf {
    let tar = target_dir().join("knotless-rootfs.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../support/rootfs.sh");
    let lock = target_dir().join("knotless-rootfs.lock");
    let status = Command::new("flock").arg(&lock).arg("bash").arg(&script).arg(&tar).status().unwrap();
    assert!(status.success(), "rootfs.sh failed");
    tar
}

pub struct Server {
    child: Child,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub url: String,
    pub token: String,
    pub client: Client,
}

impl Server {
    pub async fn start(args: &[&str]) -> Self {
        let rootfs = rootfs();
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-apiserver-{}-{}", std::process::id(), unique()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_knotless-fake-apiserver"))
            .arg("--state")
            .arg(&dir)
            .arg("--rootfs")
            .arg(&rootfs)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let kubeconfig =
            PathBuf::from(line.trim().strip_prefix("ready ").unwrap_or_else(|| panic!("bad ready line {line:?}")));
        let text = std::fs::read_to_string(&kubeconfig).unwrap();
        let url = text.lines().find_map(|l| l.trim().strip_prefix("server: ")).unwrap().to_string();
        let token = text.lines().find_map(|l| l.trim().strip_prefix("token: ")).unwrap().to_string();
        let client = client_for(&kubeconfig).await;
        Self { child, dir, kubeconfig, url, token, client }
    }

    /// A client with another bearer token.
    pub async fn client_with_token(&self, token: &str) -> Client {
        let mut config = Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&self.kubeconfig).unwrap(),
            &KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        config.auth_info.token = Some(token.to_string().into());
        Client::try_from(config).unwrap()
    }

    /// A control endpoint.
    pub async fn fake(&self, method: &str, path: &str, body: Value) -> Value {
        let request = http_request(method, &format!("/fake/{path}"), Some(body), None);
        let text = self.client.request_text(request).await.unwrap();
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    pub async fn faults(&self, faults: &[&str]) {
        self.fake("POST", "faults", json!({"faults": faults})).await;
    }

    pub async fn namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
            .await
            .unwrap();
    }

    /// Events about an object, by field selector.
    pub async fn events(&self, namespace: &str, name: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        api.list(&ListParams::default().fields(&format!("involvedObject.name={name}"))).await.unwrap().items
    }

    pub async fn create_job(&self, namespace: &str, job: Value) -> Job {
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await.unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix_term(self.child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nix_term(pid: u32) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill").arg("-TERM").arg(pid.to_string()).status()
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

pub async fn client_for(kubeconfig: &Path) -> Client {
    let config =
        Config::from_custom_kubeconfig(Kubeconfig::read_from(kubeconfig).unwrap(), &KubeConfigOptions::default())
            .await
            .unwrap();
    Client::try_from(config).unwrap()
}

/// A raw request for `Client::request*`.
pub fn http_request(
    method: &str,
    path: &str,
    body: Option<Value>,
    content_type: Option<&str>,
) -> http::Request<Vec<u8>> {
    let mut builder = http::Request::builder().method(method).uri(path);
    if body.is_some() {
        builder = builder.header("Content-Type", content_type.unwrap_or("application/json"));
    }
    builder.body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default()).unwrap()
}

/// Polls `check` until it gives a value (at most `seconds`).
pub async fn eventually<T, F, Fut>(seconds: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Job running `script` with `sh -c`.
pub fn job(name: &str, script: &str, extra_spec: Value) -> Value {
    let mut job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "knotless"}},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"step": name}}, "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "run", "image": "busybox", "command": ["sh", "-c", script]}]}}}
    });
    if let Some(extra) = extra_spec.as_object() {
        for (k, v) in extra {
            job["spec"][k] = v.clone();
        }
    }
    job
}

pub fn json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap()
}

/// An exec into one container of a pod (`container=NAME`), without stdin: its stdout, its
/// stderr and the Status (`None` when the stream ended without one).
pub async fn exec_in(
    pods: &Api<Pod>,
    name: &str,
    container: &str,
    command: &[&str],
) -> (String, String, Option<Status>) {
    let params = AttachParams::default().container(container).stdin(false).stdout(true).stderr(true);
    let mut attached = pods.exec(name, command.to_vec(), &params).await.unwrap();
    let mut out_reader = attached.stdout().unwrap();
    let mut err_reader = attached.stderr().unwrap();
    let status = attached.take_status().unwrap();
    let (out, err, status) = read_until_status(&mut out_reader, &mut err_reader, status).await;
    drop(attached);
    (String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned(), status)
}

/// An exec's stdout and stderr, read while waiting for its Status (kube-rs closes them only
/// after a Status), then what they still hold.
pub async fn read_until_status(
    out_reader: &mut (impl tokio::io::AsyncRead + Unpin),
    err_reader: &mut (impl tokio::io::AsyncRead + Unpin),
    status: impl std::future::Future<Output = Option<Status>>,
) -> (Vec<u8>, Vec<u8>, Option<Status>) {
    use tokio::io::AsyncReadExt;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut out_open, mut err_open) = (true, true);
    tokio::pin!(status);
    let status = loop {
        tokio::select! {
            status = &mut status => break status,
            read = out_reader.read_buf(&mut out), if out_open => out_open = matches!(read, Ok(n) if n > 0),
            read = err_reader.read_buf(&mut err), if err_open => err_open = matches!(read, Ok(n) if n > 0),
        }
    };
    while out_open && matches!(out_reader.read_buf(&mut out).now_or_never(), Some(Ok(n)) if n > 0) {}
    while err_open && matches!(err_reader.read_buf(&mut err).now_or_never(), Some(Ok(n)) if n > 0) {}
    (out, err, status)
}
