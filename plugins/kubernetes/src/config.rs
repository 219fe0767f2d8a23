//! The executor's configuration: the options `initialize` accepts, their defaults, and the
//! capabilities it reports.
//!
//! Defaults: `--kubeconfig` is the first file of `KUBECONFIG`, else `$HOME/.kube/config`;
//! `--context` the kubeconfig's current context; `--namespace` is `default`, `--image` is
//! `busybox:1.36`, requests of `250m` CPU and `512Mi` memory, a memory limit of
//! `--executor-option memory-limit=8Gi` that a workflow's `resources.memory` may change up to
//! `--executor-option memory-max=16Gi`, no CPU limit, no service account, no node selector,
//! `--executor-option ttl-seconds=600`, `--executor-option ready-timeout=300` and
//! `--executor-option scale-up-timeout=480` (seconds).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use knotless_protocol::{Capabilities, ExecutorError, InitializeParams, Isolation};

/// The options this executor takes, as the runner spells them.
const OPTIONS: &[&str] = &[
    "kubeconfig",
    "context",
    "namespace",
    "image",
    "cpu-request",
    "memory-request",
    "memory-limit",
    "memory-max",
    "service-account",
    "node-selector",
    "ttl-seconds",
    "ready-timeout",
    "scale-up-timeout",
];

/// The image when neither the workflow nor `--image` names one.
pub const DEFAULT_IMAGE: &str = "busybox:1.36";

/// The CPU request of a run whose workflow and flags set none: a share the scheduler keeps for
/// it on its node. There is no CPU limit: a busy neighbour is slowed by its request's share,
/// not ended.
pub const DEFAULT_CPU_REQUEST: &str = "250m";

/// The memory request of a run whose workflow and flags set none.
pub const DEFAULT_MEMORY_REQUEST: &str = "512Mi";

/// The memory limit of a run whose workflow sets none: past it the kernel kills the run's
/// processes (OOMKilled), never a neighbour's.
pub const DEFAULT_MEMORY_LIMIT: &str = "8Gi";

/// The most memory a workflow's `resources` may ask for.
pub const DEFAULT_MEMORY_MAX: &str = "16Gi";

/// What `initialize` accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The kubeconfig, read anew whenever it changes.
    pub kubeconfig: PathBuf,
    /// The kubeconfig context, when not the current one.
    pub context: Option<String>,
    /// The namespace of every object.
    pub namespace: String,
    /// The default image.
    pub image: String,
    /// The CPU request of a run whose workflow sets none.
    pub cpu_request: String,
    /// The memory request of a run whose workflow sets none (at most its memory limit).
    pub memory_request: String,
    /// The memory limit of a run whose workflow sets none.
    pub memory_limit: String,
    /// The most memory a workflow may ask for, in bytes.
    pub memory_max: u64,
    /// The pod's service account.
    pub service_account: Option<String>,
    /// The pod's node selector.
    pub node_selector: BTreeMap<String, String>,
    /// `ttlSecondsAfterFinished` of a Job not kept.
    pub ttl_seconds: i32,
    /// How long a pod may take to become Ready, at most, not counting its wait for a node (the
    /// start's own timeout may be shorter).
    pub ready_timeout_secs: u64,
    /// How long an Unschedulable pod waits for a node, from when it was first Unschedulable,
    /// whether shorter or longer than the ready timeout (the start's own timeout may be shorter).
    pub scale_up_timeout_secs: u64,
    /// The runner's id, raw.
    pub runner_id: String,
}

impl Config {
    /// Validates `initialize`'s options, and that the kubeconfig is there.
    pub fn from_params(params: &InitializeParams) -> Result<Config, ExecutorError> {
        Config::from_map(
            &params.config,
            &params.runner.id,
            std::env::var("HOME").ok(),
            std::env::var("KUBECONFIG").ok(),
        )
    }

    /// [`Config::from_params`] with the environment given (for tests).
    pub fn from_map(
        options: &BTreeMap<String, String>,
        runner_id: &str,
        home: Option<String>,
        kubeconfig_env: Option<String>,
    ) -> Result<Config, ExecutorError> {
        if options.contains_key("kubectl") {
            return Err(ExecutorError::configuration(
                "--kubectl: the kubernetes executor talks to the Kubernetes API itself and runs no kubectl: \
                 drop the flag",
            ));
        }
        if let Some(unknown) = options.keys().find(|key| !OPTIONS.contains(&key.as_str())) {
            return Err(ExecutorError::configuration(format!(
                "unknown option --{unknown} for the kubernetes executor (it takes --{})",
                OPTIONS.join(", --")
            )));
        }
        if runner_id.is_empty() {
            return Err(ExecutorError::configuration("the runner id is empty"));
        }
        let get = |key: &str| options.get(key).filter(|value| !value.is_empty()).cloned();
        let home = home.filter(|home| !home.is_empty()).unwrap_or_else(|| "/root".to_string());
        let from_env = kubeconfig_env.and_then(|list| list.split(':').find(|path| !path.is_empty()).map(PathBuf::from));
        let kubeconfig =
            get("kubeconfig").map(PathBuf::from).or(from_env).unwrap_or_else(|| Path::new(&home).join(".kube/config"));
        if let Err(error) = std::fs::File::open(&kubeconfig) {
            let why = if error.kind() == std::io::ErrorKind::NotFound {
                "no such file".to_string()
            } else {
                error.to_string()
            };
            return Err(ExecutorError::configuration(format!("--kubeconfig {}: {why}", kubeconfig.display())));
        }
        let namespace = get("namespace").unwrap_or_else(|| "default".to_string());
        if !crate::names::is_dns_label(&namespace) {
            return Err(ExecutorError::configuration(format!("--namespace {namespace:?}: not a valid namespace name")));
        }
        let node_selector = match get("node-selector") {
            None => BTreeMap::new(),
            Some(list) => parse_node_selector(&list)?,
        };
        let memory = |option: &str, default: &str| -> Result<(String, u64), ExecutorError> {
            let text = get(option).unwrap_or_else(|| default.to_string());
            let bytes = knotless_protocol::sdk::quantity::memory_bytes(&text).map_err(|_| {
                ExecutorError::configuration(format!(
                    "--executor-option {option}={text}: not a memory quantity such as 512Mi or 8Gi"
                ))
            })?;
            Ok((text, bytes))
        };
        let (memory_limit, limit_bytes) = memory("memory-limit", DEFAULT_MEMORY_LIMIT)?;
        let (_, memory_max) = memory("memory-max", DEFAULT_MEMORY_MAX)?;
        if limit_bytes > memory_max {
            return Err(ExecutorError::configuration(format!(
                "--executor-option memory-limit={memory_limit} is over --executor-option memory-max \
                 ({limit_bytes} > {memory_max} bytes)"
            )));
        }
        let ttl_seconds = number(options, "ttl-seconds", 600)?;
        let ready_timeout_secs = number(options, "ready-timeout", 300)?;
        let scale_up_timeout_secs = number(options, "scale-up-timeout", 480)?;
        Ok(Config {
            kubeconfig,
            context: get("context"),
            namespace,
            image: get("image").unwrap_or_else(|| DEFAULT_IMAGE.to_string()),
            cpu_request: get("cpu-request").unwrap_or_else(|| DEFAULT_CPU_REQUEST.to_string()),
            memory_request: get("memory-request").unwrap_or_else(|| DEFAULT_MEMORY_REQUEST.to_string()),
            memory_limit,
            memory_max,
            service_account: get("service-account"),
            node_selector,
            ttl_seconds: i32::try_from(ttl_seconds).map_err(|_| {
                ExecutorError::configuration(format!("--executor-option ttl-seconds={ttl_seconds}: too large"))
            })?,
            ready_timeout_secs,
            scale_up_timeout_secs,
            runner_id: runner_id.to_string(),
        })
    }
}

impl Config {
    /// The memory request and limit of a run: what its workflow's `resources.memory` asks for
    /// as both, within `memory-max`, or `--memory-request` (at most the limit) and
    /// `memory-limit`. A quantity that cannot be read here is passed on for the API server
    /// to refuse, naming its field.
    pub fn memory_of(&self, asked: Option<&str>) -> Result<(String, String), ExecutorError> {
        use knotless_protocol::sdk::quantity::memory_bytes;
        if let Some(asked) = asked {
            if let Ok(bytes) = memory_bytes(asked)
                && bytes > self.memory_max
            {
                return Err(ExecutorError::configuration(format!(
                    "the workflow's resources ask for memory {asked:?} ({bytes} bytes), over the kubernetes \
                     executor's most, {} bytes: ask for less, or raise --executor-option memory-max",
                    self.memory_max
                )));
            }
            return Ok((asked.to_string(), asked.to_string()));
        }
        let limit = self.memory_limit.clone();
        let request = match (memory_bytes(&self.memory_request), memory_bytes(&limit)) {
            (Ok(request), Ok(most)) if request > most => limit.clone(),
            _ => self.memory_request.clone(),
        };
        Ok((request, limit))
    }
}

/// `KEY=VALUE,KEY=VALUE` of `--node-selector`.
pub fn parse_node_selector(list: &str) -> Result<BTreeMap<String, String>, ExecutorError> {
    let mut selector = BTreeMap::new();
    for pair in list.split(',').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => {
                selector.insert(key.to_string(), value.to_string());
            }
            _ => return Err(ExecutorError::configuration(format!("--node-selector {pair:?}: expected KEY=VALUE"))),
        }
    }
    Ok(selector)
}

fn number(options: &BTreeMap<String, String>, key: &str, default: u64) -> Result<u64, ExecutorError> {
    match options.get(key) {
        None => Ok(default),
        Some(value) => value.parse::<u64>().map_err(|_| {
            ExecutorError::configuration(format!("--executor-option {key}={value}: expected a number of seconds"))
        }),
    }
}

/// What the Kubernetes executor can do.
pub fn capabilities() -> Capabilities {
    Capabilities {
        isolation: Isolation::Vm,
        caches: true,
        secrets: true,
        outputs: true,
        images: true,
        network_policy: true,
        services: true,
        max_sessions: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    #[test]
    fn a_missing_kubeconfig_names_the_flag() {
        let error =
            Config::from_map(&options(&[("kubeconfig", "/no/such/kubeconfig")]), "r", None, None).expect_err("refused");
        assert_eq!(error.message, "--kubeconfig /no/such/kubeconfig: no such file");
    }

    #[test]
    fn kubectl_or_an_unknown_option_is_refused_naming_the_flag() {
        let file = tempfile::NamedTempFile::new().expect("file");
        let kubeconfig = file.path().to_string_lossy().into_owned();
        let error = Config::from_map(
            &options(&[("kubeconfig", &kubeconfig), ("kubectl", "/usr/bin/kubectl")]),
            "r",
            None,
            None,
        )
        .expect_err("refused");
        assert!(error.message.starts_with("--kubectl: the kubernetes executor talks to the Kubernetes API itself"));
        let error = Config::from_map(&options(&[("kubeconfig", &kubeconfig), ("colour", "red")]), "r", None, None)
            .expect_err("refused");
        assert!(error.message.starts_with("unknown option --colour"), "{}", error.message);
    }

    #[test]
    fn defaults_and_node_selector() {
        let file = tempfile::NamedTempFile::new().expect("file");
        let kubeconfig = file.path().to_string_lossy().into_owned();
        let config =
            Config::from_map(&options(&[("kubeconfig", &kubeconfig), ("node-selector", "a=1,b=2")]), "r", None, None)
                .expect("accepted");
        assert_eq!(config.namespace, "default");
        assert_eq!(config.image, DEFAULT_IMAGE);
        assert_eq!(config.ttl_seconds, 600);
        assert_eq!((config.ready_timeout_secs, config.scale_up_timeout_secs), (300, 480));
        assert_eq!((config.cpu_request.as_str(), config.memory_request.as_str()), ("250m", "512Mi"));
        assert_eq!((config.memory_limit.as_str(), config.memory_max), ("8Gi", 16 << 30));
        let from_env = Config::from_map(&BTreeMap::new(), "r", None, Some(format!(":{kubeconfig}:/other")))
            .expect("KUBECONFIG's first file");
        assert_eq!(from_env.kubeconfig, file.path());
        assert_eq!(config.node_selector, options(&[("a", "1"), ("b", "2")]));
        assert!(parse_node_selector("novalue").is_err());
    }

    #[test]
    fn a_memory_limit_over_the_most_or_not_a_quantity_is_refused_naming_the_option() {
        let file = tempfile::NamedTempFile::new().expect("file");
        let kubeconfig = file.path().to_string_lossy().into_owned();
        let refused = |pairs: &[(&str, &str)]| {
            let mut all = options(pairs);
            all.insert("kubeconfig".into(), kubeconfig.clone());
            Config::from_map(&all, "r", None, None).expect_err("refused").message
        };
        let over = refused(&[("memory-limit", "20Gi")]);
        assert!(over.contains("memory-limit=20Gi is over --executor-option memory-max"), "{over}");
        let bad = refused(&[("memory-max", "plenty")]);
        assert!(bad.starts_with("--executor-option memory-max=plenty: not a memory quantity"), "{bad}");
        let mut raised = options(&[("memory-limit", "20Gi"), ("memory-max", "32Gi")]);
        raised.insert("kubeconfig".into(), kubeconfig.clone());
        let config = Config::from_map(&raised, "r", None, None).expect("accepted");
        assert_eq!((config.memory_limit.as_str(), config.memory_max), ("20Gi", 32 << 30));
    }

    #[test]
    fn a_workflows_memory_is_its_request_and_limit_within_the_most() {
        let file = tempfile::NamedTempFile::new().expect("file");
        let kubeconfig = file.path().to_string_lossy().into_owned();
        let config = |pairs: &[(&str, &str)]| {
            let mut all = options(pairs);
            all.insert("kubeconfig".into(), kubeconfig.clone());
            Config::from_map(&all, "r", None, None).expect("accepted")
        };
        let defaults = config(&[]);
        assert_eq!(defaults.memory_of(None).expect("defaults"), ("512Mi".to_string(), "8Gi".to_string()));
        assert_eq!(defaults.memory_of(Some("2Gi")).expect("asked"), ("2Gi".to_string(), "2Gi".to_string()));
        let over = defaults.memory_of(Some("17Gi")).expect_err("over the most").message;
        assert!(over.contains("over the kubernetes executor's most") && over.contains("memory-max"), "{over}");
        // A request above the limit is the limit: the API server would refuse it.
        let small = config(&[("memory-limit", "256Mi")]);
        assert_eq!(small.memory_of(None).expect("capped"), ("256Mi".to_string(), "256Mi".to_string()));
        // What cannot be read here is the API server's to refuse, naming the field.
        assert_eq!(defaults.memory_of(Some("lots")).expect("passed on").1, "lots");
    }
}
