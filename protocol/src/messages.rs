//! The parameters and results of every protocol message, as serde types.
//!
//! Unknown fields are ignored when reading, so a newer peer may add fields within a version.
//! Optional fields are omitted when writing.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The method names of version 1, as they appear on the wire.
pub mod method {
    /// Runner to executor, first request: version negotiation and configuration.
    pub const INITIALIZE: &str = "initialize";
    /// Runner to executor: create a session, the run's environment.
    pub const START: &str = "start";
    /// Runner to executor: run one step in a session.
    pub const COMMAND: &str = "command";
    /// Runner to executor: end a session and delete its resources.
    pub const STOP: &str = "stop";
    /// Runner to executor: delete everything this runner left, but the sessions in flight.
    pub const CLEANUP: &str = "cleanup";
    /// Runner to executor: a tar stream on the side channel into a session path.
    pub const UPLOAD: &str = "upload";
    /// Runner to executor: a tar stream of a session path out on the side channel.
    pub const DOWNLOAD: &str = "download";
    /// Runner to executor: a no-op, answered at once (liveness and benchmarks).
    pub const PING: &str = "ping";
    /// Runner to executor: stop every session and exit after the reply.
    pub const SHUTDOWN: &str = "shutdown";
    /// Runner to executor notification: cancel a request still in flight.
    pub const CANCEL: &str = "cancel";
    /// Executor to runner notification: bytes a step wrote.
    pub const OUTPUT: &str = "output";
    /// Executor to runner notification: a line for a run's log (or the runner's log).
    pub const LOG: &str = "log";
}

/// A request method: its name and the types of its parameters and its result, so that a
/// request and its answer cannot be paired with another method's types. One unit type per
/// method in [`rpc`].
pub trait Method {
    /// Its name on the wire ([`method`]).
    const NAME: &'static str;
    /// Its `params`.
    type Params: Serialize + serde::de::DeserializeOwned + Send + Sync + 'static;
    /// Its `result`.
    type Result: Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static;
}

/// A notification: its name and the type of its parameters, one unit type per notification in
/// [`rpc`], so that a notification cannot be written with another's parameters.
pub trait Notify {
    /// Its name on the wire ([`method`]).
    const NAME: &'static str;
    /// Its `params`.
    type Params: Serialize + serde::de::DeserializeOwned + Send + Sync + 'static;
}

/// The request methods ([`Method`]) and the notifications ([`Notify`]), as types.
pub mod rpc {
    use super::*;

    macro_rules! methods {
        ($($(#[$doc:meta])* $name:ident = $wire:path: $params:ty => $result:ty;)*) => {$(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $name;

            impl Method for $name {
                const NAME: &'static str = $wire;
                type Params = $params;
                type Result = $result;
            }
        )*};
    }

    methods! {
        /// `initialize`.
        Initialize = method::INITIALIZE: InitializeParams => InitializeResult;
        /// `start`.
        Start = method::START: StartParams => StartResult;
        /// `command`.
        Command = method::COMMAND: CommandParams => CommandResult;
        /// `stop`.
        Stop = method::STOP: StopParams => StopResult;
        /// `cleanup`.
        Cleanup = method::CLEANUP: CleanupParams => CleanupResult;
        /// `upload`.
        Upload = method::UPLOAD: TransferParams => TransferResult;
        /// `download`.
        Download = method::DOWNLOAD: TransferParams => TransferResult;
        /// `ping`.
        Ping = method::PING: Empty => Empty;
        /// `shutdown`.
        Shutdown = method::SHUTDOWN: Empty => Empty;
    }

    macro_rules! notifications {
        ($($(#[$doc:meta])* $name:ident = $wire:path: $params:ty;)*) => {$(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $name;

            impl Notify for $name {
                const NAME: &'static str = $wire;
                type Params = $params;
            }
        )*};
    }

    notifications! {
        /// `output`, executor to runner.
        Output = method::OUTPUT: OutputParams;
        /// `log`, executor to runner.
        Log = method::LOG: LogParams;
        /// `cancel`, runner to executor.
        Cancel = method::CANCEL: CancelParams;
    }
}

/// `initialize` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InitializeParams {
    /// Every protocol version the runner speaks.
    pub protocol_versions: Vec<u32>,
    /// Who is asking.
    pub runner: RunnerInfo,
    /// The executor options the operator gave (for example `namespace` for `--namespace`).
    /// The executor validates them and refuses unknown or bad ones with a configuration error.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

/// The runner's identity, sent in `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunnerInfo {
    /// The program's name, `knotless-run`.
    pub name: String,
    /// The program's version.
    pub version: String,
    /// The runner's id. The executor labels every resource it creates with it, and `cleanup`
    /// touches only resources carrying it.
    pub id: String,
}

/// `initialize` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InitializeResult {
    /// The version the executor picked from the runner's offer.
    pub protocol_version: u32,
    /// Who answers.
    pub executor: ExecutorInfo,
    /// What the executor can do.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// The executor's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExecutorInfo {
    /// A short name, such as `shell` or `kubernetes`; the runner prefixes the executor's log
    /// lines with it.
    pub name: String,
    /// The executor's own version.
    pub version: String,
}

/// What an executor can do. Unknown capabilities are ignored by the runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Capabilities {
    /// What keeps one run from another and from the host.
    pub isolation: Isolation,
    /// Whether paths outside the work folder (cache paths such as `/cache`) can be uploaded to
    /// and downloaded from.
    pub caches: bool,
    /// Whether secrets reach a step only through its own environment.
    pub secrets: bool,
    /// Whether the session has an outputs folder that can be downloaded.
    pub outputs: bool,
    /// Whether `start` honours the `image` field.
    pub images: bool,
    /// Whether sessions are cut off from each other's network.
    pub network_policy: bool,
    /// Whether `start` runs the session's `services` beside it, reachable from its steps by
    /// name. The runner never sends services to an executor without it: a workflow that has
    /// some ends with a configuration error naming this capability.
    pub services: bool,
    /// The most sessions one executor process serves at once; absent means no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            isolation: Isolation::None,
            caches: false,
            secrets: false,
            outputs: false,
            images: false,
            network_policy: false,
            services: false,
            max_sessions: None,
        }
    }
}

/// How isolated a session is from the host and from other sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(transform = crate::schema::any_other_string("unknown"))]
pub enum Isolation {
    /// Host processes: nothing is isolated.
    None,
    /// A container on a shared kernel.
    Container,
    /// A virtual machine or a node of its own.
    Vm,
    /// A kind this runner does not know.
    #[serde(other)]
    Unknown,
}

/// `start` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StartParams {
    /// The session id, chosen by the runner, unique for this runner. Every later request about
    /// the session names it.
    pub session: String,
    /// What the session is for; executors put it in labels, annotations and log lines.
    #[serde(default)]
    pub run: RunInfo,
    /// The image to run in, for executors that take images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Resource requests.
    #[serde(default)]
    pub resources: Resources,
    /// Whether the session may use the network. Executors that can cut it off do so when false.
    #[serde(default)]
    pub network: bool,
    /// The whole run's deadline, in milliseconds from now: an executor may give its environment
    /// this lifetime (for example a Job's `activeDeadlineSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_timeout_ms: Option<u64>,
    /// How long `start` itself may take.
    pub timeout_ms: u64,
    /// Keep the environment after `stop` (for debugging).
    #[serde(default)]
    pub keep: bool,
    /// Containers to run beside the session, each reachable from its steps by its name, and
    /// healthy before `start` answers; removed with the session. Only sent to an executor whose
    /// capabilities say `services`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<Service>,
}

/// A service of a session: a container beside it (a database, a web server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Service {
    /// The name the session's steps reach it by (a DNS label: lowercase letters, digits and
    /// `-`, starting with a letter, at most 63 characters).
    pub name: String,
    /// Its image, which the executor runs as it runs a session's (never pulling it, for the
    /// Docker executor).
    pub image: String,
    /// Its command, replacing the image's; absent: the image's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Its variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A `sh -c` command run in the service until it exits 0, which makes it healthy; absent:
    /// healthy once running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// How long it may take to become healthy, in milliseconds.
    pub health_timeout_ms: u64,
}

impl Service {
    /// Refuses services a container, a host name and variables cannot be made of: a name that
    /// is not a DNS label starting with a letter, a name given twice, an empty image, a
    /// variable name that is not `[A-Za-z_][A-Za-z0-9_]*`. The runner never sends such
    /// services; an executor checks them all the same before it makes anything.
    pub fn check_all(services: &[Service]) -> Result<(), crate::ExecutorError> {
        let refuse = |message: String| Err(crate::ExecutorError::configuration(message));
        let mut seen = std::collections::BTreeSet::new();
        for service in services {
            let name = &service.name;
            let label = name.len() <= 63
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && !name.ends_with('-')
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !label {
                return refuse(format!(
                    "service name {name:?} is not a host name: lowercase letters, digits and -, starting with a letter"
                ));
            }
            if !seen.insert(name.as_str()) {
                return refuse(format!("service {name} is named twice"));
            }
            if service.image.trim().is_empty() {
                return refuse(format!("service {name} has no image"));
            }
            let variable = |key: &String| {
                key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            };
            if let Some(key) = service.env.keys().find(|key| !variable(key)) {
                return refuse(format!(
                    "service {name}: variable name {key:?} is not letters, digits and _, not starting with a digit"
                ));
            }
        }
        Ok(())
    }
}

/// The run a session belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct RunInfo {
    /// The run's id.
    pub id: String,
    /// The repository, as the forge names it.
    pub repository: String,
    /// The commit being run.
    pub commit: String,
    /// The workflow's name.
    pub workflow: String,
    /// The key of the check the run reports to.
    pub check_key: String,
}

/// Resource requests, in Kubernetes quantity syntax (`500m`, `2`, `512Mi`, `4Gi`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Resources {
    /// CPU request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

/// `start` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StartResult {
    /// Where things are inside the session.
    pub paths: SessionPaths,
    /// A short human description (for example `job knotless-run-4 in knotless-runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The folders of a session, as paths inside the environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionPaths {
    /// The checkout; steps run here. `/work` in a container.
    pub work: String,
    /// Shared steps go in numbered folders under it. `/steps` in a container.
    pub steps: String,
    /// Files a run writes here become the check's outputs. `/outputs` in a container.
    pub outputs: String,
}

/// `command` parameters: one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CommandParams {
    /// The session to run in.
    pub session: String,
    /// The step's number within the run, from 0; `output` notifications carry it back.
    pub step: u32,
    /// The step's name, for log lines.
    #[serde(default)]
    pub name: String,
    /// A POSIX shell script, run as with `sh -ec`.
    pub script: String,
    /// Variables for the step (the run's variables and the workflow's and step's `env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The secrets granted to this step, by name. They MUST reach the step's environment only:
    /// never an argv, a file, a log or the executor's own environment.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    /// The folder to run in; the session's work folder when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The step's timeout: past it, the step and every process it started are killed and the
    /// request fails with the `TIMEOUT` error.
    pub timeout_ms: u64,
}

/// `command` result: the step ran to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CommandResult {
    /// The step's real exit code; 128 + N when a signal N ended it.
    pub exit_code: i32,
    /// How long the step ran.
    pub duration_ms: u64,
    /// How many processes the step left running that the executor killed afterwards.
    #[serde(default)]
    pub killed_processes: u32,
}

/// Which stream of a step an `output` notification comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// `output` notification: bytes a step wrote, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputParams {
    /// The session.
    pub session: String,
    /// The step's number, as in `command`.
    pub step: u32,
    /// Which stream.
    pub stream: Stream,
    /// The bytes, base64 (standard alphabet, padded).
    pub data: String,
}

/// The level of a `log` notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Progress worth showing in the run's log.
    Info,
    /// Something is off, but the run goes on.
    Warn,
    /// Something failed.
    Error,
}

/// `log` notification: a line for a session's run log, or for the runner's own log when no
/// session is named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LogParams {
    /// The session the line is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// How serious it is.
    pub level: LogLevel,
    /// One line of text.
    pub message: String,
}

/// `cancel` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelParams {
    /// The `id` of the request to cancel.
    #[schemars(with = "crate::schema::RequestId")]
    pub id: serde_json::Value,
}

/// `stop` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StopParams {
    /// The session to end.
    pub session: String,
    /// Leave the environment in place (for debugging) and only forget the session.
    #[serde(default)]
    pub keep: bool,
    /// How long `stop` may take.
    pub timeout_ms: u64,
}

/// One resource an executor removed, or kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Resource {
    /// What it is: `job`, `pod`, `container`, `folder`, `process-group`, ...
    pub kind: String,
    /// Its name.
    pub name: String,
    /// The session it belonged to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// `stop` result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StopResult {
    /// What was deleted (nothing when keeping).
    #[serde(default)]
    pub removed: Vec<Resource>,
}

/// `cleanup` parameters: the orphan sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CleanupParams {
    /// The sessions still in flight: their resources MUST be left alone. Everything else
    /// carrying this runner's id MUST be removed.
    #[serde(default)]
    pub keep: Vec<String>,
    /// Also remove the environments of kept sessions (started or stopped with `keep`) whose
    /// owner is gone or is this process, which a sweep otherwise leaves to the operator.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remove_kept: bool,
    /// How long `cleanup` may take.
    pub timeout_ms: u64,
}

/// `cleanup` result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CleanupResult {
    /// What was deleted.
    #[serde(default)]
    pub removed: Vec<Resource>,
    /// What could not be deleted, one message each.
    #[serde(default)]
    pub failures: Vec<String>,
}

/// `upload` and `download` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TransferParams {
    /// The session.
    pub session: String,
    /// The folder inside the session: `upload` unpacks into it (creating it), `download` packs
    /// its contents.
    pub path: String,
    /// The filesystem path of the runner's Unix socket carrying the tar stream. The executor
    /// connects to it once.
    pub channel: String,
    /// The most bytes of tar stream allowed; past it the transfer fails with `TOO_LARGE`.
    pub max_bytes: u64,
    /// How long the transfer may take.
    pub timeout_ms: u64,
}

/// `upload` and `download` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TransferResult {
    /// The bytes of tar stream the executor read (`upload`) or wrote (`download`). The runner
    /// compares it with its own count: a difference is a lost stream.
    pub bytes: u64,
    /// `download` only: the entries the executor left out of the stream, each with why (a
    /// FIFO, a socket, a device node, a symlink whose target leaves the folder), at most
    /// [`MAX_LEFT_OUT`]. Absent when none was. The runner keeps no cache a download left
    /// something out of: it would not work as the steps left it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
}

/// The most entries a `download` result lists as left out.
pub const MAX_LEFT_OUT: usize = 64;

/// An entry a `download` left out of its stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeftOut {
    /// Its path, relative to the folder downloaded.
    pub path: String,
    /// Why, in a few words: `a FIFO`, `a symlink whose target leaves the folder`.
    pub reason: String,
}

/// The parameters of `ping` and `shutdown`, and the result of `ping`, `shutdown`: an empty
/// object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}
