//! The cluster's API, through kube-rs: one client per kubeconfig, built anew when the file
//! changes (so the refresh unit's new token is used by the next request, without a restart),
//! creates with `fieldValidation=Strict`, execs over the API's websocket, and the API's
//! answers as executor errors read from the Status the server sent (its code, reason and
//! causes), never from the text of an error.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status as ExecStatus;
use knotless_protocol::ExecutorError;
use knotless_protocol::sdk::remote::{Exec, Writer};
use kube::api::{Api, AttachParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{Request, Status};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::task::AbortOnDropHandle;

use crate::config::Config;
use crate::exec::{Drained, Ended, Held, Refused};
use crate::manifest::CONTAINER;

/// How long one API request (not a watch, not an exec) may take.
pub const CALL_LIMIT: Duration = Duration::from_secs(60);

/// The buffer of an exec's stdout and stderr between the websocket and the reader.
const EXEC_BUFFER: usize = 64 * 1024;

/// What identifies one version of the kubeconfig file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: SystemTime,
    len: u64,
    inode: u64,
}

/// The cluster of the configuration.
pub struct Cluster {
    kubeconfig: PathBuf,
    context: Option<String>,
    /// The namespace of every object.
    pub namespace: String,
    cached: Mutex<Option<(Stamp, Client)>>,
}

/// A client of one version of the kubeconfig, and the server it reaches.
#[derive(Clone)]
pub struct Client {
    /// The kube-rs client.
    pub inner: kube::Client,
    /// The same without kube-rs's retries of 429 and 5xx answers, for the requests of an
    /// ending, which retry within their own bound (`ending.rs`).
    pub once: kube::Client,
    /// The API server's URL, for messages.
    pub server: String,
    /// The kubeconfig it was read from, for messages.
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// The cluster of `config` (nothing is read yet).
    pub fn new(config: &Config) -> Cluster {
        Cluster {
            kubeconfig: config.kubeconfig.clone(),
            context: config.context.clone(),
            namespace: config.namespace.clone(),
            cached: Mutex::new(None),
        }
    }

    /// The client of the kubeconfig as it is now: the cached one unless the file changed.
    pub async fn client(&self) -> Result<Client, ExecutorError> {
        let shown = self.kubeconfig.display();
        let metadata = std::fs::metadata(&self.kubeconfig)
            .map_err(|error| ExecutorError::configuration(format!("--kubeconfig {shown}: {error}")))?;
        let stamp = Stamp {
            modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            len: metadata.len(),
            inode: metadata.ino(),
        };
        if let Some((known, client)) = &*knotless_protocol::sdk::lock(&self.cached)
            && *known == stamp
        {
            return Ok(client.clone());
        }
        let file = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|error| ExecutorError::configuration(format!("--kubeconfig {shown}: {error}")))?;
        let options = KubeConfigOptions { context: self.context.clone(), cluster: None, user: None };
        let mut config = kube::Config::from_custom_kubeconfig(file, &options).await.map_err(|error| {
            let context = self.context.as_deref().map(|c| format!(" (--context {c})")).unwrap_or_default();
            ExecutorError::configuration(format!("--kubeconfig {shown}{context}: {error}"))
        })?;
        config.connect_timeout = Some(Duration::from_secs(10));
        config.read_timeout = None;
        let server = config.cluster_url.to_string();
        let made = |config: kube::Config| {
            kube::Client::try_from(config).map_err(|error| {
                ExecutorError::configuration(format!(
                    "--kubeconfig {shown}: cannot make a client for {server}: {error}"
                ))
            })
        };
        let mut without_retries = config.clone();
        without_retries.default_retry = false;
        let once = made(without_retries)?;
        let inner = made(config)?;
        let client = Client { inner, once, server: server.clone(), kubeconfig: self.kubeconfig.clone() };
        *knotless_protocol::sdk::lock(&self.cached) = Some((stamp, client.clone()));
        tracing::debug!(server = %client.server, "kubernetes client made from the kubeconfig");
        Ok(client)
    }
}

impl Client {
    /// The namespaced API of `K`.
    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.inner.clone(), namespace)
    }

    /// Creates `object` with `fieldValidation=Strict`: a field the server does not know, or
    /// a value it refuses, is an error before anything exists; `None` when an object of that
    /// name exists already.
    pub async fn create<K>(&self, namespace: &str, object: &K, what: &str) -> Result<Option<K>, ExecutorError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope> + Serialize + DeserializeOwned + Clone,
        <K as kube::Resource>::DynamicType: Default,
    {
        let url = K::url_path(&Default::default(), Some(namespace));
        let body = serde_json::to_vec(object).map_err(|error| ExecutorError::infrastructure(error.to_string()))?;
        let mut request = Request::new(url)
            .create(&PostParams::default(), body)
            .map_err(|error| ExecutorError::infrastructure(format!("{what}: {error}")))?;
        let strict = format!("{}&fieldValidation=Strict", request.uri());
        let strict = if request.uri().query().is_some() { strict } else { strict.replacen('&', "?", 1) };
        *request.uri_mut() =
            strict.parse().map_err(|error| ExecutorError::infrastructure(format!("{what}: {error}")))?;
        self.unless(what, self.inner.request::<K>(request), Status::is_already_exists).await
    }

    /// [`Client::limited`], where an answer that `expected` accepts (a NotFound of a delete,
    /// an AlreadyExists of a create) is `None`, not an error.
    pub async fn unless<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
        expected: fn(&Status) -> bool,
    ) -> Result<Option<T>, ExecutorError> {
        let raw = async {
            match call.await {
                Ok(value) => Ok(Some(value)),
                Err(kube::Error::Api(status)) if expected(&status) => Ok(None),
                Err(error) => Err(error),
            }
        };
        self.limited(what, raw).await
    }

    /// Runs a request within [`CALL_LIMIT`], its error read as an executor error.
    pub async fn limited<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ExecutorError> {
        match tokio::time::timeout(CALL_LIMIT, call).await {
            Ok(result) => result.map_err(|error| self.error(what, &error)),
            Err(_) => Err(ExecutorError::infrastructure(format!(
                "{what}: the API server {} did not answer within {} s",
                self.server,
                CALL_LIMIT.as_secs()
            ))),
        }
    }

    /// An error of the API as the executor says it: who refused what, and what to fix.
    pub fn error(&self, what: &str, error: &kube::Error) -> ExecutorError {
        let kubeconfig = self.kubeconfig.display();
        match error {
            kube::Error::Api(status) => match status.code {
                401 => ExecutorError::infrastructure(format!(
                    "{what}: the API server {} refused the credential of --kubeconfig {kubeconfig} \
                     (401 Unauthorized): its token expired or was revoked; refresh it \
                     (deploy/refresh-kubeconfig.sh, run by knotless-refresh-kubeconfig.timer) and \
                     the next run uses the new one",
                    self.server
                )),
                403 => ExecutorError::infrastructure(format!(
                    "{what}: forbidden: {} (the credential of --kubeconfig {kubeconfig} lacks this \
                     permission: see deploy/scoped-kubeconfig.sh)",
                    status.message
                )),
                422 => invalid(what, status),
                // A value that does not even decode (a quantity) is refused before validation.
                400 if status.message.contains("quantities must match") => ExecutorError::configuration(format!(
                    "{what}: the API server refused it: a resource request is not a quantity (--cpu-request, \
                     --memory-request, or the workflow's resources; e.g. 500m, 2, 1Gi): {}",
                    status.message
                )),
                400 if status.message.contains("unknown field") => ExecutorError::infrastructure(format!(
                    "{what}: the API server does not know a field the executor sent ({}): is the \
                     cluster older than Kubernetes 1.27, the oldest the executor supports?",
                    status.message
                )),
                404 if namespace_missing(status) => ExecutorError::configuration(format!(
                    "{what}: --namespace {}: no such namespace on {}",
                    status.details.as_ref().map(|details| details.name.as_str()).unwrap_or_default(),
                    self.server
                )),
                _ => ExecutorError::infrastructure(format!(
                    "{what}: the API server answered {} {}: {}",
                    status.code, status.reason, status.message
                )),
            },
            other => ExecutorError::infrastructure(format!(
                "{what}: cannot reach the API server {}: {}",
                self.server,
                chain(other)
            )),
        }
    }

    /// Starts `argv` in `container` of the session's pod over the API's exec websocket, its three streams
    /// piped; the exit code comes from the status channel (`None` when the stream ended
    /// without one). `said` receives the status's message when it is not a plain exit code.
    /// Its stdin is never closed ([`crate::exec::Held`]): the command must know where its input
    /// ends.
    pub async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        argv: Vec<String>,
        said: Option<std::sync::Arc<Mutex<Option<String>>>>,
    ) -> Result<Exec, ExecutorError> {
        self.exec_with(namespace, pod, container, argv, said, true).await
    }

    /// [`Client::exec`] of a command that reads no stdin: it gets none (reading it gives end of
    /// file), and the exec's stdin is a sink.
    pub async fn exec_without_stdin(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        argv: Vec<String>,
        said: Option<std::sync::Arc<Mutex<Option<String>>>>,
    ) -> Result<Exec, ExecutorError> {
        self.exec_with(namespace, pod, container, argv, said, false).await
    }

    async fn exec_with(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        argv: Vec<String>,
        said: Option<std::sync::Arc<Mutex<Option<String>>>>,
        with_stdin: bool,
    ) -> Result<Exec, ExecutorError> {
        let pods: Api<Pod> = self.api(namespace);
        let params = AttachParams::default()
            .container(container)
            .stdin(with_stdin)
            .stdout(true)
            .stderr(true)
            .max_stdin_buf_size(EXEC_BUFFER)
            .max_stdout_buf_size(EXEC_BUFFER)
            .max_stderr_buf_size(EXEC_BUFFER);
        let what = if container == CONTAINER {
            format!("exec in pod {pod}")
        } else {
            format!("exec in container {container} of pod {pod}")
        };
        let mut process = self.limited(&what, pods.exec(pod, argv, &params)).await?;
        let missing = || ExecutorError::infrastructure(format!("{what}: the exec has no stream"));
        let stdin = if with_stdin { Some(process.stdin().ok_or_else(missing)?) } else { None };
        let stdout = process.stdout().ok_or_else(missing)?;
        let stderr = process.stderr().ok_or_else(missing)?;
        let status = process.take_status().ok_or_else(missing)?;
        // The status resolves when the websocket's task ends, with the Status or without (a
        // broken connection): then the streams are ended, which kube-rs does only for the first.
        let exited = Ended::default();
        let (stdout, stderr) = (Drained::new(stdout, &exited), Drained::new(stderr, &exited));
        // Dropped, the stdin is kept by the task below until the exec has ended: closing it
        // would close the websocket of a server older than 1.30, and its Status with it.
        let (keeper, kept) = tokio::sync::oneshot::channel();
        let stdin: Writer = match stdin {
            Some(stdin) => Box::new(Held::new(Refused::new(stdin, &exited), keeper)),
            None => Box::new(tokio::io::sink()),
        };
        let fire = exited.fire_on_drop();
        // Dropping the exec before it ended aborts this task, and with it the websocket's.
        let waiting = AbortOnDropHandle::new(tokio::spawn(async move {
            let status = status.await;
            // The websocket's task is kept until it has ended: dropping it aborts it.
            drop(process);
            drop(fire);
            drop(kept);
            status
        }));
        let ended = async move {
            let status = waiting.await.ok().flatten();
            let code = status.as_ref().and_then(exit_code);
            if code.is_none()
                && let (Some(status), Some(said)) = (&status, &said)
            {
                let reason = status.reason.clone().unwrap_or_default();
                let message = status.message.clone().unwrap_or_default();
                *knotless_protocol::sdk::lock(said) = Some(format!("{reason} {message}").trim().to_string());
            }
            code
        };
        Ok(Exec { stdin, stdout: Box::new(stdout), stderr: Box::new(stderr), ended: Box::pin(ended) })
    }
}

/// The exit code of an exec's final Status (the status channel's): 0 for `Success`, the
/// `ExitCode` cause of a `NonZeroExitCode` failure; `None` for any other failure.
pub fn exit_code(status: &ExecStatus) -> Option<i32> {
    if status.status.as_deref() == Some("Success") {
        return Some(0);
    }
    if status.reason.as_deref() != Some("NonZeroExitCode") {
        return None;
    }
    let causes = status.details.as_ref()?.causes.as_ref()?;
    causes
        .iter()
        .find(|cause| cause.reason.as_deref() == Some("ExitCode"))
        .and_then(|cause| cause.message.as_deref()?.trim().parse().ok())
}

/// Whether a 404 is about the namespace itself.
fn namespace_missing(status: &Status) -> bool {
    status.details.as_ref().is_some_and(|details| details.kind == "namespaces")
}

/// A 422 Invalid: each refused field named with the flag that sets it.
fn invalid(what: &str, status: &Status) -> ExecutorError {
    let causes: Vec<String> = status
        .details
        .as_ref()
        .map(|details| {
            details
                .causes
                .iter()
                .map(|cause| match flag_of(&cause.field) {
                    Some(flag) => format!("{flag}: {} ({})", cause.message, cause.field),
                    None => format!("{}: {}", cause.field, cause.message),
                })
                .collect()
        })
        .unwrap_or_default();
    let said = if causes.is_empty() { status.message.clone() } else { causes.join("; ") };
    ExecutorError::configuration(format!("{what}: the API server refused it: {said}"))
}

/// The flag (or workflow field) that sets a field of the Job, from its path in a 422.
pub fn flag_of(field: &str) -> Option<&'static str> {
    let field = field.to_ascii_lowercase();
    if field.contains("requests[cpu]") || field.contains("requests.cpu") {
        Some("--cpu-request (or the workflow's resources.cpu)")
    } else if field.contains("requests[memory]") || field.contains("requests.memory") {
        Some("--memory-request (or the workflow's resources.memory)")
    } else if field.contains("limits[memory]") || field.contains("limits.memory") {
        Some("--executor-option memory-limit (or the workflow's resources.memory)")
    } else if field.contains("nodeselector") {
        Some("--node-selector")
    } else if field.contains("serviceaccountname") {
        Some("--service-account")
    } else if field.ends_with(".image") {
        Some("--image (or the workflow's image)")
    } else if field.starts_with("metadata.namespace") {
        Some("--namespace")
    } else {
        None
    }
}

/// An error and its sources, on one line.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        let said = next.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn failure(reason: &str, causes: &[(&str, &str)]) -> ExecStatus {
        let causes: Vec<_> =
            causes.iter().map(|(reason, message)| json!({"reason": reason, "message": message})).collect();
        serde_json::from_value(json!({"status": "Failure", "reason": reason, "details": {"causes": causes}}))
            .expect("a status")
    }

    #[test]
    fn exit_codes_come_from_the_status_channel() {
        let success: ExecStatus = serde_json::from_value(json!({"metadata": {}, "status": "Success"})).expect("status");
        assert_eq!(exit_code(&success), Some(0));
        assert_eq!(exit_code(&failure("NonZeroExitCode", &[("ExitCode", "3")])), Some(3));
        assert_eq!(exit_code(&failure("NonZeroExitCode", &[])), None);
        assert_eq!(exit_code(&failure("InternalError", &[("ExitCode", "3")])), None);
    }

    #[test]
    fn refused_fields_name_their_flags() {
        let field = "spec.template.spec.containers[0].resources.requests[cpu]";
        assert_eq!(flag_of(field), Some("--cpu-request (or the workflow's resources.cpu)"));
        assert_eq!(flag_of("spec.template.spec.nodeSelector"), Some("--node-selector"));
        assert_eq!(flag_of("spec.template.spec.serviceAccountName"), Some("--service-account"));
        assert_eq!(flag_of("spec.template.spec.containers[0].image"), Some("--image (or the workflow's image)"));
        assert_eq!(flag_of("spec.backoffLimit"), None);
    }
}
