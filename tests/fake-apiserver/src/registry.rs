//! The REST storage strategies: create (defaults, admission, validation) and delete (graceful
//! deletion, finalizers, propagation policy), per resource, as in:
//!
//! - defaults: pkg/apis/core/v1/defaults.go (`SetDefaults_PodSpec`, `SetDefaults_Container`:
//!   `imagePullPolicy` Always for `:latest` or no tag, else IfNotPresent; `SetDefaults_Pod`: a
//!   container's requests default to its limits, on pods and not on templates),
//!   pkg/apis/batch/v1/defaults.go (`SetDefaults_Job`: backoffLimit 6, completions and
//!   parallelism 1, podReplacementPolicy TerminatingOrFailed) and pkg/registry/batch/job/strategy.go
//!   (`generateSelector`: the `batch.kubernetes.io/controller-uid` selector and the four labels);
//! - admission (in upstream's order, mutating then validating): NamespaceLifecycle
//!   (plugin/pkg/admission/namespace/lifecycle), ServiceAccount (plugin/pkg/admission/serviceaccount:
//!   `error looking up service account NS/SA: serviceaccount "SA" not found`),
//!   DefaultTolerationSeconds (plugin/pkg/admission/defaulttolerationseconds), Priority, and
//!   PodSecurity (staging/src/k8s.io/pod-security-admission, enforcing on pods, warning on Jobs);
//! - delete: staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go (`Delete`,
//!   `updateForGracefulDeletionAndFinalizers`: the `orphan` and `foregroundDeletion` finalizers,
//!   202 while the object stays) and pkg/registry/core/pod/strategy.go (`CheckGracefulDelete`:
//!   the pod's terminationGracePeriodSeconds, 0 for an unscheduled or terminated pod), with
//!   batch/v1 Jobs defaulting to orphaning their pods (pkg/registry/batch/job/strategy.go
//!   `DefaultGarbageCollectionPolicy`) and warning so (pkg/registry/batch/job/storage/storage.go).

use serde_json::{Value, json};

use crate::app::{Config, State, Token};
use crate::resources::{self, Resource};
use crate::status::ApiError;
use crate::strict::{self, FieldValidation};
use crate::util::{self, text};
use crate::validation;

/// `deleteOptionWarnings` of the Job storage.
pub const JOB_ORPHAN_WARNING: &str = "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress this warning";

/// The PodSecurity `restricted` refusal of the `failed-create` fault.
pub fn pod_security_violation(container: &str) -> String {
    format!(
        "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"{container}\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"{container}\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"{container}\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"{container}\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
    )
}

/// Whether an image reference has no tag (or `:latest`) and no digest.
fn latest(image: &str) -> bool {
    if image.contains('@') {
        return false;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        None => true,
        Some((_, tag)) => tag == "latest",
    }
}

/// `SetDefaults_PodSpec` and `SetDefaults_Container`.
pub fn default_pod_spec(spec: &mut Value, config: &Config) {
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(config.grace.as_secs())),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
    ];
    for (field, value) in defaults {
        if spec.get(field).is_none_or(Value::is_null) {
            spec[field] = value;
        }
    }
    if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        for container in containers {
            let image = text(container, "/image").to_string();
            let container_defaults = [
                ("imagePullPolicy", json!(if latest(&image) { "Always" } else { "IfNotPresent" })),
                ("terminationMessagePath", json!("/dev/termination-log")),
                ("terminationMessagePolicy", json!("File")),
                ("resources", json!({})),
            ];
            for (field, value) in container_defaults {
                if container.get(field).is_none_or(Value::is_null) {
                    container[field] = value;
                }
            }
        }
    }
    if let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        for volume in volumes {
            if let Some(empty_dir) = volume.get_mut("emptyDir")
                && empty_dir.is_null()
            {
                *empty_dir = json!({});
            }
        }
    }
}

/// The QoS class of a pod (pkg/apis/core/v1/helper/qos).
fn qos_class(spec: &Value) -> &'static str {
    let containers = spec.get("containers").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let requests = c.pointer("/resources/requests").and_then(Value::as_object);
        let limits = c.pointer("/resources/limits").and_then(Value::as_object);
        any |= requests.is_some_and(|r| !r.is_empty()) || limits.is_some_and(|l| !l.is_empty());
        for resource in ["cpu", "memory"] {
            let limit = limits.and_then(|l| l.get(resource));
            let request = requests.and_then(|r| r.get(resource)).or(limit);
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Fills `metadata.name` from `generateName` (`names.SimpleNameGenerator`).
fn generate_name(object: &mut Value) {
    if text(object, "/metadata/name").is_empty() {
        let prefix = text(object, "/metadata/generateName").to_string();
        if !prefix.is_empty() {
            object["metadata"]["name"] = json!(format!("{prefix}{}", util::random_suffix(5)));
        }
    }
}

/// Clears what a client may not set on create.
fn prepare(object: &mut Value, namespace: &str, namespaced: bool) {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    if let Some(meta) = object["metadata"].as_object_mut() {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "selfLink",
        ] {
            meta.remove(field);
        }
        if namespaced {
            meta.insert("namespace".into(), json!(namespace));
        } else {
            meta.remove("namespace");
        }
    }
}

/// NamespaceLifecycle.
fn namespace_admission(state: &State, resource: &Resource, namespace: &str) -> Result<(), ApiError> {
    if !resource.namespaced {
        return Ok(());
    }
    match state.store.get("namespaces", "", namespace) {
        None => Err(ApiError::not_found("namespaces", "", namespace)),
        Some(ns) if ns.pointer("/metadata/deletionTimestamp").is_some() => Err(ApiError::forbidden(
            resource.plural,
            resource.group,
            "",
            &format!("unable to create new content in namespace {namespace} because it is being terminated"),
        )),
        Some(_) => Ok(()),
    }
}

/// The pod admission chain on a defaulted pod: ServiceAccount, DefaultTolerationSeconds,
/// Priority (mutating), then validation, then PodSecurity (the `failed-create` fault).
pub fn admit_pod(state: &State, config: &Config, pod: &mut Value) -> Result<(), ApiError> {
    // Mutating admission runs before the name is generated: its errors name the prefix
    // (`extractResourceName` in staging/src/k8s.io/apiserver/pkg/admission/errors.go).
    let (namespace, mut name) = util::ns_name(pod);
    if name.is_empty() {
        name = text(pod, "/metadata/generateName").to_string();
    }
    let spec = &mut pod["spec"];
    if text(spec, "/serviceAccountName").is_empty() {
        let sa = match text(spec, "/serviceAccount") {
            "" => "default",
            sa => sa,
        }
        .to_string();
        spec["serviceAccountName"] = json!(sa);
    }
    let sa = text(spec, "/serviceAccountName").to_string();
    spec["serviceAccount"] = json!(sa);
    if state.store.get("serviceaccounts", &namespace, &sa).is_none() {
        return Err(ApiError::forbidden(
            "pods",
            "",
            &name,
            &format!("error looking up service account {namespace}/{sa}: serviceaccount \"{sa}\" not found"),
        ));
    }
    let mut tolerations = spec.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
        if !tolerations.iter().any(|t| text(t, "/key") == key) {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                                    "tolerationSeconds": config.eviction_toleration.as_secs()}));
        }
    }
    spec["tolerations"] = json!(tolerations);
    spec["priority"] = json!(0);
    spec["preemptionPolicy"] = json!("PreemptLowerPriority");
    generate_name(pod);
    let name = text(pod, "/metadata/name").to_string();
    let errors = validation::pod(pod);
    if !errors.is_empty() {
        return Err(ApiError::invalid("Pod", "", &name, &errors));
    }
    if state.rt.faults.contains("failed-create") {
        let container = text(pod, "/spec/containers/0/name").to_string();
        return Err(ApiError::forbidden("pods", "", &name, &pod_security_violation(&container)));
    }
    let qos = qos_class(&pod["spec"]);
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
    Ok(())
}

/// `SetDefaults_Pod`: a container's request of a resource it has a limit of and no request
/// for is that limit (on a pod only, never on a template: a Job's template keeps what it said).
fn default_requests_to_limits(spec: &mut Value) {
    for container in spec.get_mut("containers").and_then(Value::as_array_mut).into_iter().flatten() {
        let Some(limits) = container.pointer("/resources/limits").and_then(Value::as_object).cloned() else {
            continue;
        };
        let resources = &mut container["resources"];
        if !resources.get("requests").is_some_and(Value::is_object) {
            resources["requests"] = json!({});
        }
        for (resource, limit) in limits {
            if resources["requests"].get(&resource).is_none() {
                resources["requests"][resource] = limit;
            }
        }
    }
}

/// Creates a pod through admission (the job controller's path and `POST pods`).
pub fn create_pod(state: &mut State, config: &Config, mut pod: Value) -> Result<Value, ApiError> {
    let namespace = text(&pod, "/metadata/namespace").to_string();
    let pods = resources::by_key("pods").copied().ok_or_else(|| ApiError::internal("no pods"))?;
    namespace_admission(state, &pods, &namespace)?;
    if let Some(spec) = pod.get_mut("spec") {
        default_pod_spec(spec, config);
        default_requests_to_limits(spec);
    }
    admit_pod(state, config, &mut pod)?;
    state.store.create(&pods, pod)
}

/// `POST` of a resource: decode, defaults, admission, validation, store. The object and warnings.
pub fn create(
    state: &mut State,
    config: &Config,
    who: &Token,
    resource: &Resource,
    namespace: &str,
    mut body: Value,
    mode: FieldValidation,
) -> Result<(Value, Vec<String>), ApiError> {
    let mut warnings = strict::decode(resource.kind, &resource.api_version(), &body, mode)?;
    prepare(&mut body, namespace, resource.namespaced);
    if resource.plural != "pods" {
        generate_name(&mut body);
    }
    namespace_admission(state, resource, namespace)?;
    let name = text(&body, "/metadata/name").to_string();
    let mut errors = Vec::new();
    match resource.plural {
        "pods" => return create_pod(state, config, body).map(|pod| (pod, warnings)),
        "jobs" => {
            let uid = util::uid();
            body["metadata"]["uid"] = json!(uid);
            let spec = &mut body["spec"];
            for (field, value) in [
                ("parallelism", json!(1)),
                ("completions", json!(1)),
                ("backoffLimit", json!(6)),
                ("completionMode", json!("NonIndexed")),
                ("suspend", json!(false)),
                ("podReplacementPolicy", json!("TerminatingOrFailed")),
                ("manualSelector", Value::Null),
            ] {
                if spec.get(field).is_none_or(Value::is_null) && !value.is_null() {
                    spec[field] = value;
                }
            }
            if !spec.pointer("/template/metadata").is_some_and(Value::is_object) {
                spec["template"]["metadata"] = json!({});
            }
            let labels = &mut spec["template"]["metadata"]["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            for (key, value) in [
                ("batch.kubernetes.io/controller-uid", &uid),
                ("batch.kubernetes.io/job-name", &name),
                ("controller-uid", &uid),
                ("job-name", &name),
            ] {
                labels[key] = json!(value);
            }
            spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
            if let Some(pod_spec) = spec.pointer_mut("/template/spec") {
                default_pod_spec(pod_spec, config);
            }
            body["status"] = json!({});
            errors = validation::job(&body);
            if errors.is_empty() && state.rt.faults.contains("failed-create") {
                let container = text(&body, "/spec/template/spec/containers/0/name").to_string();
                warnings
                    .push(format!("would {}", pod_security_violation(&container).replacen("violates", "violate", 1)));
            }
        }
        "namespaces" => {
            validation::object_meta(&body, true, &mut errors);
            body["spec"] = json!({"finalizers": ["kubernetes"]});
            body["status"] = json!({"phase": "Active"});
            body["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        "serviceaccounts" | "networkpolicies" => {
            validation::object_meta(&body, false, &mut errors);
            if resource.plural == "networkpolicies" {
                if state.rt.faults.contains("policy-forbidden") {
                    return Err(crate::auth::forbidden(
                        who,
                        &crate::auth::Attributes {
                            verb: "create".into(),
                            group: resource.group.into(),
                            resource: resource.plural.into(),
                            namespace: namespace.into(),
                            ..Default::default()
                        },
                    ));
                }
                if body.pointer("/spec/policyTypes").is_none() {
                    let mut types = vec![json!("Ingress")];
                    if body.pointer("/spec/egress").is_some() {
                        types.push(json!("Egress"));
                    }
                    body["spec"]["policyTypes"] = json!(types);
                }
                crate::networkpolicy::validate_spec(&body, &mut errors);
            }
        }
        "roles" | "rolebindings" => {
            validation::path_segment_meta(&body, &mut errors);
            if resource.plural == "rolebindings" && text(&body, "/roleRef/name").is_empty() {
                errors.push(crate::status::FieldError::required("roleRef.name", ""));
            }
        }
        "events" => validation::object_meta(&body, false, &mut errors),
        _ => return Err(ApiError::method_not_allowed(resource.plural, resource.group, "create")),
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid(resource.kind, resource.group, &name, &errors));
    }
    let object = state.store.create(resource, body)?;
    if resource.plural == "namespaces"
        && let Some(sa) = resources::by_key("serviceaccounts")
    {
        // The serviceaccounts controller (pkg/controller/serviceaccount) creates `default`.
        let _ = state.store.create(sa, json!({"metadata": {"name": "default", "namespace": name}}));
    }
    Ok((object, warnings))
}

/// `metav1.DeletionPropagation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Orphan,
    Background,
    Foreground,
}

/// DeleteOptions that matter here.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeleteOptions {
    pub grace: Option<i64>,
    pub propagation: Option<Propagation>,
}

impl DeleteOptions {
    /// From the query and/or a DeleteOptions body.
    pub fn parse(query: &[(String, String)], body: Option<&Value>) -> Result<Self, ApiError> {
        let get = |k: &str| query.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let mut options = Self::default();
        let policy = get("propagationPolicy")
            .or_else(|| body.and_then(|b| b.get("propagationPolicy")).and_then(Value::as_str).map(str::to_string));
        if let Some(policy) = policy {
            options.propagation = Some(match policy.as_str() {
                "Orphan" => Propagation::Orphan,
                "Background" => Propagation::Background,
                "Foreground" => Propagation::Foreground,
                other => {
                    return Err(ApiError::invalid(
                        "DeleteOptions",
                        "",
                        "",
                        &[crate::status::FieldError::not_supported(
                            "propagationPolicy",
                            &json!(other),
                            &["Foreground", "Background", "Orphan", "nil"],
                        )],
                    ));
                }
            });
        }
        let orphan = get("orphanDependents")
            .map(|v| v == "true")
            .or_else(|| body.and_then(|b| b.get("orphanDependents")).and_then(Value::as_bool));
        if let Some(orphan) = orphan {
            options.propagation = Some(if orphan { Propagation::Orphan } else { Propagation::Background });
        }
        options.grace = get("gracePeriodSeconds")
            .and_then(|v| v.parse().ok())
            .or_else(|| body.and_then(|b| b.get("gracePeriodSeconds")).and_then(Value::as_i64));
        Ok(options)
    }
}

fn add_finalizer(object: &mut Value, finalizer: &str) {
    let finalizers = &mut object["metadata"]["finalizers"];
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    if let Some(list) = finalizers.as_array_mut()
        && !list.iter().any(|f| f == finalizer)
    {
        list.push(json!(finalizer));
    }
}

/// Deletes an object: the HTTP code (200 gone, 202 still there) and the body.
pub fn delete(
    state: &mut State,
    resource: &Resource,
    namespace: &str,
    name: &str,
    options: DeleteOptions,
) -> Result<(u16, Value), ApiError> {
    let key = resource.key();
    let Some(mut object) = state.store.get(key, namespace, name).cloned() else {
        return Err(ApiError::not_found(resource.plural, resource.group, name));
    };
    let propagation = options.propagation.unwrap_or(if resource.plural == "jobs" {
        Propagation::Orphan
    } else {
        Propagation::Background
    });
    let already = object.pointer("/metadata/deletionTimestamp").is_some();
    let mut grace = 0;
    if resource.plural == "pods" {
        let phase = text(&object, "/status/phase");
        let unscheduled = text(&object, "/spec/nodeName").is_empty();
        let default = object.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(30);
        grace = options.grace.unwrap_or(default).max(0);
        if unscheduled || phase == "Succeeded" || phase == "Failed" {
            grace = 0;
        }
        if already {
            let current = object.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
            grace = grace.min(current);
        }
    }
    if resource.plural == "namespaces" {
        if !already {
            object["metadata"]["deletionTimestamp"] = json!(util::now());
            object["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            object["status"]["phase"] = json!("Terminating");
            add_finalizer(&mut object, "kubernetes");
            state.store.update(key, object.clone());
        }
        return Ok((202, state.store.get(key, namespace, name).cloned().unwrap_or(object)));
    }
    match propagation {
        Propagation::Foreground => add_finalizer(&mut object, "foregroundDeletion"),
        Propagation::Orphan => add_finalizer(&mut object, "orphan"),
        Propagation::Background => {}
    }
    let has_finalizers =
        object.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
    if !has_finalizers && grace == 0 {
        let uid = text(&object, "/metadata/uid").to_string();
        let gone = state.store.remove(key, namespace, name).unwrap_or(object);
        if resource.plural == "pods" {
            return Ok((200, gone));
        }
        return Ok((
            200,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "group": resource.group, "kind": resource.plural, "uid": uid}}),
        ));
    }
    if !already || grace == 0 {
        let when = if grace > 0 { util::later(std::time::Duration::from_secs(grace as u64)) } else { util::now() };
        if !already || grace == 0 {
            object["metadata"]["deletionTimestamp"] = json!(when);
        }
        object["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    }
    match state.store.update(key, object.clone()) {
        Some(stored) => Ok((202, stored)),
        None => Ok((200, object)),
    }
}
