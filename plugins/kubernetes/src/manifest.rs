//! The manifests, built from typed Kubernetes API structs: a session's Job, its
//! default-deny-ingress NetworkPolicy, and the patch that gives the policy its pod as owner.
//! Pure functions, snapshot-tested.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EmptyDirVolumeSource, EnvVar, HostAlias, PodAffinityTerm, PodAntiAffinity, PodSpec,
    PodTemplateSpec, ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use knotless_protocol::Service;

use crate::names::{service_container as service_container_name, *};

/// The container's command: keep the pod alive until told to stop, and stop at once on TERM.
pub const KEEP_ALIVE: &str = "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done";

/// The name of the one container.
pub const CONTAINER: &str = "run";

/// The run's folders: an `emptyDir` volume each, mounted at `/NAME` in the run's container.
const FOLDERS: [&str; 3] = ["work", "steps", "outputs"];

/// Everything a Job manifest is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpecInput {
    /// The raw runner id.
    pub runner_id: String,
    /// The raw session id.
    pub session: String,
    /// The check key of the run.
    pub check_key: String,
    /// The namespace.
    pub namespace: String,
    /// The image.
    pub image: String,
    /// CPU request.
    pub cpu: Option<String>,
    /// Memory request.
    pub memory: Option<String>,
    /// Memory limit: past it the kernel kills the run's processes.
    pub memory_limit: Option<String>,
    /// The pod's service account.
    pub service_account: Option<String>,
    /// The pod's node selector.
    pub node_selector: BTreeMap<String, String>,
    /// `activeDeadlineSeconds`.
    pub deadline_secs: Option<i64>,
    /// `ttlSecondsAfterFinished`; `None` when keeping.
    pub ttl_secs: Option<i32>,
    /// The run's services: a container each in the pod, reached by name through `hostAliases`.
    pub services: Vec<Service>,
    /// The token of the executor process that makes the run's objects.
    pub owner: String,
}

/// The labels of a session's Job and pod.
pub fn labels(runner_id: &str, session: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(RUNNER_LABEL.to_string(), label_value(runner_id)), (RUN_LABEL.to_string(), label_value(session))])
}

/// The annotations of a session's Job, pod and policy: the raw ids, the check key, and the
/// token of the executor process that made them.
pub fn annotations(input: &JobSpecInput) -> BTreeMap<String, String> {
    BTreeMap::from([
        (RUNNER_ANNOTATION.to_string(), input.runner_id.clone()),
        (SESSION_ANNOTATION.to_string(), input.session.clone()),
        (CHECK_KEY_ANNOTATION.to_string(), input.check_key.clone()),
        (OWNER_ANNOTATION.to_string(), input.owner.clone()),
    ])
}

/// The session's Job.
pub fn job(input: &JobSpecInput) -> Job {
    let labels = labels(&input.runner_id, &input.session);
    let meta = ObjectMeta {
        name: Some(job_name(&input.runner_id, &input.session)),
        namespace: Some(input.namespace.clone()),
        labels: Some(labels.clone()),
        annotations: Some(annotations(input)),
        ..ObjectMeta::default()
    };
    let mut containers = vec![run_container(input)];
    containers.extend(input.services.iter().map(service_container));
    // The pod's containers share one network namespace: a service listens on the pod's
    // loopback, and its name resolves there through the kubelet-managed /etc/hosts.
    let host_aliases = (!input.services.is_empty()).then(|| {
        vec![HostAlias {
            ip: "127.0.0.1".to_string(),
            hostnames: Some(input.services.iter().map(|service| service.name.clone()).collect()),
        }]
    });
    let pod = PodSpec {
        containers,
        host_aliases,
        restart_policy: Some("Never".to_string()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        termination_grace_period_seconds: Some(5),
        service_account_name: input.service_account.clone(),
        node_selector: (!input.node_selector.is_empty()).then(|| input.node_selector.clone()),
        affinity: Some(Affinity { pod_anti_affinity: Some(anti_affinity(&input.runner_id)), ..Affinity::default() }),
        volumes: Some(
            FOLDERS
                .iter()
                .map(|folder| Volume {
                    name: folder.to_string(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                })
                .collect(),
        ),
        ..PodSpec::default()
    };
    Job {
        metadata: meta,
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: input.deadline_secs,
            ttl_seconds_after_finished: input.ttl_secs,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(annotations(input)),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// The run's container: its image kept alive by [`KEEP_ALIVE`] in `/work`, with the run's
/// requests, its memory limit, its folders, and no privileges.
fn run_container(input: &JobSpecInput) -> Container {
    let mut requests = BTreeMap::new();
    if let Some(cpu) = &input.cpu {
        requests.insert("cpu".to_string(), Quantity(cpu.clone()));
    }
    if let Some(memory) = &input.memory {
        requests.insert("memory".to_string(), Quantity(memory.clone()));
    }
    let mut limits = BTreeMap::new();
    if let Some(memory) = &input.memory_limit {
        limits.insert("memory".to_string(), Quantity(memory.clone()));
    }
    Container {
        name: CONTAINER.to_string(),
        image: Some(input.image.clone()),
        command: Some(vec!["sh".to_string(), "-c".to_string(), KEEP_ALIVE.to_string()]),
        working_dir: Some("/work".to_string()),
        resources: (!requests.is_empty() || !limits.is_empty()).then(|| ResourceRequirements {
            requests: (!requests.is_empty()).then_some(requests),
            limits: (!limits.is_empty()).then_some(limits),
            ..ResourceRequirements::default()
        }),
        security_context: Some(unprivileged()),
        volume_mounts: Some(
            FOLDERS
                .iter()
                .map(|folder| VolumeMount {
                    name: folder.to_string(),
                    mount_path: format!("/{folder}"),
                    ..VolumeMount::default()
                })
                .collect(),
        ),
        ..Container::default()
    }
}

/// The pod's anti-affinity: it is never scheduled on a node that runs a pod of the same runner,
/// so a runner's runs never share a node.
fn anti_affinity(runner_id: &str) -> PodAntiAffinity {
    PodAntiAffinity {
        required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(RUNNER_LABEL.to_string(), label_value(runner_id))])),
                ..LabelSelector::default()
            }),
            topology_key: "kubernetes.io/hostname".to_string(),
            ..PodAffinityTerm::default()
        }]),
        ..PodAntiAffinity::default()
    }
}

/// What no container of the pod may do: gain privileges.
fn unprivileged() -> SecurityContext {
    SecurityContext { allow_privilege_escalation: Some(false), privileged: Some(false), ..SecurityContext::default() }
}

/// A service's container: its image with its command as the image's `CMD` (`args`: the
/// entrypoint stays), its variables, none of the run's folders.
fn service_container(service: &Service) -> Container {
    let env: Vec<EnvVar> = service
        .env
        .iter()
        .map(|(name, value)| EnvVar { name: name.clone(), value: Some(value.clone()), ..EnvVar::default() })
        .collect();
    Container {
        name: service_container_name(&service.name),
        image: Some(service.image.clone()),
        args: service.command.clone(),
        env: (!env.is_empty()).then_some(env),
        security_context: Some(unprivileged()),
        ..Container::default()
    }
}

/// A run's NetworkPolicy: the run's pod (the runner's and the run's labels, which its
/// template carries) denies all ingress. Egress is not restricted.
pub fn network_policy(input: &JobSpecInput) -> NetworkPolicy {
    let labels = labels(&input.runner_id, &input.session);
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(policy_name(&input.runner_id, &input.session)),
            namespace: Some(input.namespace.clone()),
            labels: Some(labels.clone()),
            annotations: Some(annotations(input)),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(labels), ..LabelSelector::default() }),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: None,
            egress: None,
        }),
    }
}

/// A pod that owns a run's NetworkPolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOwner {
    /// The pod's name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

/// The merge patch that makes `pods` the owners of a run's NetworkPolicy: plain owner
/// references, neither controller nor blocking (a pod's deletion never waits for its policy,
/// and setting `blockOwnerDeletion` would need the right to delete the pod's finalizers).
pub fn owned_by(pods: &[PodOwner]) -> NetworkPolicy {
    let references = pods
        .iter()
        .map(|pod| OwnerReference {
            api_version: "v1".to_string(),
            kind: "Pod".to_string(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            controller: None,
            block_owner_deletion: None,
        })
        .collect();
    NetworkPolicy { metadata: ObjectMeta { owner_references: Some(references), ..ObjectMeta::default() }, spec: None }
}

/// `activeDeadlineSeconds` from the run's timeout: rounded up, at least one second.
pub fn deadline_secs(run_timeout_ms: Option<u64>) -> Option<i64> {
    run_timeout_ms.map(|ms| i64::try_from(ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX))
}

/// An object as the JSON piped to `kubectl apply -f -`, with `apiVersion` and `kind`.
pub fn to_json<T: serde::Serialize>(object: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> JobSpecInput {
        JobSpecInput {
            runner_id: "did:plc:runner/alice".into(),
            session: "run-42".into(),
            check_key: "repo/main/build".into(),
            namespace: "knotless-runs".into(),
            image: "busybox:1.36".into(),
            cpu: Some("500m".into()),
            memory: Some("512Mi".into()),
            memory_limit: Some("8Gi".into()),
            service_account: Some("knotless-runner".into()),
            node_selector: BTreeMap::from([("pool".to_string(), "runs".to_string())]),
            deadline_secs: deadline_secs(Some(120_500)),
            ttl_secs: Some(600),
            services: Vec::new(),
            owner: "0123456789abcdef:/run/user/1000/knotless-owners/fedcba9876543210.lock".into(),
        }
    }

    #[test]
    fn the_job_manifest() {
        insta::assert_json_snapshot!("job", job(&input()));
    }

    #[test]
    fn a_kept_job_has_no_ttl_and_no_requests_when_none_are_given() {
        let kept = JobSpecInput {
            ttl_secs: None,
            cpu: None,
            memory: None,
            memory_limit: None,
            deadline_secs: None,
            ..input()
        };
        insta::assert_json_snapshot!("job_kept", job(&kept));
    }

    #[test]
    fn services_are_containers_of_the_pod_reached_by_name() {
        let services = vec![
            Service {
                name: "db".into(),
                image: "postgres:16".into(),
                command: None,
                env: BTreeMap::from([("POSTGRES_PASSWORD".to_string(), "test".to_string())]),
                health: Some("pg_isready".into()),
                health_timeout_ms: 30_000,
            },
            Service {
                name: "web".into(),
                image: "busybox:1.36".into(),
                command: Some(vec!["httpd".into(), "-f".into()]),
                env: BTreeMap::new(),
                health: None,
                health_timeout_ms: 60_000,
            },
        ];
        insta::assert_json_snapshot!("job_with_services", job(&JobSpecInput { services, ..input() }));
    }

    #[test]
    fn the_network_policy_selects_the_run_pod_alone() {
        let policy = network_policy(&input());
        insta::assert_json_snapshot!("network_policy", policy);
        let job = job(&input());
        let template = job.spec.and_then(|spec| spec.template.metadata).and_then(|meta| meta.labels);
        let selector = policy.spec.and_then(|spec| spec.pod_selector).and_then(|selector| selector.match_labels);
        assert_eq!(selector, template, "the policy selects the pod by the labels its template carries");
        let other = network_policy(&JobSpecInput { session: "run-43".into(), ..input() });
        assert_ne!(other.metadata.name, network_policy(&input()).metadata.name);
    }

    #[test]
    fn the_patch_that_gives_the_policy_its_pod_as_owner() {
        let pod = PodOwner {
            name: "knotless-run-42-0a1b2c3d-x7k2p".into(),
            uid: "6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab".into(),
        };
        insta::assert_json_snapshot!("network_policy_owned_by", owned_by(&[pod]));
    }

    #[test]
    fn the_security_settings_hold() {
        let value = serde_json::to_value(job(&input())).expect("json");
        let pod = &value["spec"]["template"]["spec"];
        assert_eq!(value["apiVersion"], "batch/v1");
        assert_eq!(value["kind"], "Job");
        assert_eq!(value["spec"]["backoffLimit"], 0);
        assert_eq!(value["spec"]["activeDeadlineSeconds"], 121);
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["enableServiceLinks"], false);
        assert_eq!(pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"], false);
        assert!(!value.to_string().contains("hostPath"));
        let term = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(value["metadata"]["annotations"]["dev.knotless.runner-id"], "did:plc:runner/alice");
        assert_eq!(deadline_secs(Some(1)), Some(1));
    }
}
