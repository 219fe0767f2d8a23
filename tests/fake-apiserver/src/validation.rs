//! Value validation on create, as pkg/apis/core/validation/validation.go (`ValidatePodSpec`,
//! `validateContainers` with its duplicate names, `ValidateEnv`, `ValidateHostAliases`,
//! `ValidateResourceRequirements`, `ValidateNodeSelector`),
//! pkg/apis/batch/validation/validation.go (`ValidateJob`: restartPolicy, backoffLimit,
//! activeDeadlineSeconds, ttlSecondsAfterFinished) and the name and label checks of
//! staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go
//! (`IsDNS1123Subdomain`, `IsDNS1123Label`, `IsQualifiedName`, `IsValidLabelValue`,
//! `IsEnvVarName`) and of ip.go (`IsValidIPForLegacyField` with strict validation) do them.
//! The API server checks only that an image is non-empty without surrounding whitespace: a
//! malformed reference is the kubelet's to refuse (`InvalidImageName`).

use serde_json::{Value, json};

use crate::status::FieldError;

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const ENV_VAR_MSG: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn dns_label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `IsDNS1123Subdomain`: the first error, if any.
pub fn dns1123_subdomain(s: &str) -> Option<String> {
    if s.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    (!s.split('.').all(dns_label_ok)).then(|| SUBDOMAIN_MSG.to_string())
}

/// `IsDNS1123Label`.
pub fn dns1123_label(s: &str) -> Option<String> {
    if s.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    (!dns_label_ok(s)).then(|| LABEL_MSG.to_string())
}

/// `IsEnvVarName`: every error (the regex, then `hasChDirPrefix`).
pub fn env_var_name(s: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let bytes = s.as_bytes();
    let ok = bytes.first().is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_'))
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !ok {
        errors.push(ENV_VAR_MSG.to_string());
    }
    if s == "." {
        errors.push("must not be '.'".into());
    } else if s == ".." {
        errors.push("must not be '..'".into());
    } else if s.starts_with("..") {
        errors.push("must not start with '..'".into());
    }
    errors
}

/// `IsValidIPForLegacyField` with strict validation (`parseIP`): the first error, if any.
/// Go's sloppy parser takes IPv4 octets with leading zeros, which the strict check then refuses.
pub fn ip_address(s: &str) -> Option<String> {
    match s.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some() => {
            Some("must not be an IPv4-mapped IPv6 address".into())
        }
        Ok(_) => None,
        Err(_) => {
            let octets: Vec<&str> = s.split('.').collect();
            let sloppy = octets.len() == 4
                && octets.iter().all(|o| {
                    !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()) && o.parse::<u32>().is_ok_and(|v| v <= 255)
                });
            Some(if sloppy {
                "must not have leading 0s".into()
            } else {
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".into()
            })
        }
    }
}

fn name_part_ok(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// `IsQualifiedName`: label keys, nodeSelector keys.
pub fn qualified_name(s: &str) -> Option<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if let Some(error) = dns1123_subdomain(prefix) {
            return Some(format!("prefix part {error}"));
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    (!name_part_ok(name)).then(|| QUALIFIED_MSG.to_string())
}

/// `IsValidLabelValue`.
pub fn label_value(s: &str) -> Option<String> {
    if s.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    (!s.is_empty() && !name_part_ok(s)).then(|| LABEL_VALUE_MSG.to_string())
}

/// `ValidateLabels` / `ValidateNodeSelector`: keys qualified names, values label values.
pub fn labels(map: Option<&Value>, field: &str, errors: &mut Vec<FieldError>) {
    for (key, value) in map.and_then(Value::as_object).into_iter().flatten() {
        if let Some(error) = qualified_name(key) {
            errors.push(FieldError::invalid(field, &json!(key), error));
        }
        let value = value.as_str().unwrap_or("");
        if let Some(error) = label_value(value) {
            errors.push(FieldError::invalid(field, &json!(value), error));
        }
    }
}

/// `ValidateObjectMeta`: name (subdomain or label), labels, owner references.
pub fn object_meta(object: &Value, label_name: bool, errors: &mut Vec<FieldError>) {
    let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        errors.push(FieldError::required("metadata.name", "name or generateName is required"));
    } else if let Some(error) = if label_name { dns1123_label(name) } else { dns1123_subdomain(name) } {
        errors.push(FieldError::invalid("metadata.name", &json!(name), error));
    }
    labels(object.pointer("/metadata/labels"), "metadata.labels", errors);
    owner_references(object, errors);
}

/// `ValidateOwnerReferences` (staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go),
/// on create and on every update: each reference names a version, a kind, a name and a uid,
/// and at most one is the controller.
pub fn owner_references(object: &Value, errors: &mut Vec<FieldError>) {
    let references = object.pointer("/metadata/ownerReferences").and_then(Value::as_array);
    let mut controller: Option<String> = None;
    for reference in references.into_iter().flatten() {
        let field = |name: &str| reference.get(name).and_then(Value::as_str).unwrap_or("");
        let version = field("apiVersion").rsplit('/').next().unwrap_or("");
        let checks = [
            ("apiVersion", version.is_empty(), "version must not be empty"),
            ("kind", field("kind").is_empty(), "must not be empty"),
            ("name", field("name").is_empty(), "must not be empty"),
            ("uid", field("uid").is_empty(), "must not be empty"),
        ];
        for (name, empty, detail) in checks {
            if empty {
                errors.push(FieldError::invalid(
                    format!("metadata.ownerReferences.{name}"),
                    &json!(field(name)),
                    detail,
                ));
            }
        }
        if reference.get("controller").and_then(Value::as_bool) == Some(true) {
            let this = format!("{}/{}", field("kind"), field("name"));
            match &controller {
                Some(first) => errors.push(FieldError::invalid(
                    "metadata.ownerReferences",
                    &json!(references),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"
                    ),
                )),
                None => controller = Some(this),
            }
        }
    }
}

/// `ValidatePathSegmentName` (RBAC objects).
pub fn path_segment_meta(object: &Value, errors: &mut Vec<FieldError>) {
    let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        errors.push(FieldError::required("metadata.name", "name or generateName is required"));
    } else if name == "." || name == ".." {
        errors.push(FieldError::invalid("metadata.name", &json!(name), format!("may not be '{name}'")));
    } else if name.contains(['/', '%']) {
        errors.push(FieldError::invalid("metadata.name", &json!(name), "may not contain '/'"));
    }
    labels(object.pointer("/metadata/labels"), "metadata.labels", errors);
}

fn nonnegative(value: Option<&Value>, field: &str, errors: &mut Vec<FieldError>) {
    if let Some(v) = value.and_then(Value::as_i64)
        && v < 0
    {
        errors.push(FieldError::invalid(field, &json!(v), "must be greater than or equal to 0"));
    }
}

/// `ValidatePodSpec`, the parts the executor's pods use.
pub fn pod_spec(spec: &Value, path: &str, job: bool, errors: &mut Vec<FieldError>) {
    let mut volumes = Vec::new();
    for (i, volume) in spec.get("volumes").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let name = volume.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            errors.push(FieldError::required(format!("{path}.volumes[{i}].name"), ""));
        } else if let Some(error) = dns1123_label(name) {
            errors.push(FieldError::invalid(format!("{path}.volumes[{i}].name"), &json!(name), error));
        }
        volumes.push(name.to_string());
    }
    let containers = spec.get("containers").and_then(Value::as_array).cloned().unwrap_or_default();
    if containers.is_empty() {
        errors.push(FieldError::required(format!("{path}.containers"), ""));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, container) in containers.iter().enumerate() {
        let at = format!("{path}.containers[{i}]");
        let name = container.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            errors.push(FieldError::required(format!("{at}.name"), ""));
        } else if let Some(error) = dns1123_label(name) {
            errors.push(FieldError::invalid(format!("{at}.name"), &json!(name), error));
        }
        if !names.insert(name) {
            errors.push(FieldError::duplicate(format!("{at}.name"), &json!(name)));
        }
        let image = container.get("image").and_then(Value::as_str).unwrap_or("");
        if image.is_empty() {
            errors.push(FieldError::required(format!("{at}.image"), ""));
        } else if image.trim() != image {
            errors.push(FieldError::invalid(
                format!("{at}.image"),
                &json!(image),
                "must not have leading or trailing whitespace",
            ));
        }
        for kind in ["limits", "requests"] {
            for (resource, quantity) in
                container.pointer(&format!("/resources/{kind}")).and_then(Value::as_object).into_iter().flatten()
            {
                let field = format!("{at}.resources.{kind}[{resource}]");
                if let Some(error) = qualified_name(resource) {
                    errors.push(FieldError::invalid(&field, &json!(resource), error));
                }
                let text = quantity.as_str().map(str::to_string).unwrap_or_else(|| quantity.to_string());
                if crate::quantity::parse(&text).is_some_and(|v| v < 0.0) {
                    errors.push(FieldError::invalid(&field, &json!(text), "must be greater than or equal to 0"));
                }
            }
        }
        // ValidateResourceRequirements: no request above its limit.
        let quantity_text = |value: &Value| value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string());
        for (resource, request) in
            container.pointer("/resources/requests").and_then(Value::as_object).into_iter().flatten()
        {
            let Some(limit) = container.pointer("/resources/limits").and_then(|limits| limits.get(resource)) else {
                continue;
            };
            let (request, limit) = (quantity_text(request), quantity_text(limit));
            if let (Some(asked), Some(most)) = (crate::quantity::parse(&request), crate::quantity::parse(&limit))
                && asked > most
            {
                errors.push(FieldError::invalid(
                    format!("{at}.resources.requests[{resource}]"),
                    &json!(request),
                    format!("must be less than or equal to {resource} limit of {limit}"),
                ));
            }
        }
        for (j, env) in container.get("env").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let name = env.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                errors.push(FieldError::required(format!("{at}.env[{j}].name"), ""));
            } else {
                for error in env_var_name(name) {
                    errors.push(FieldError::invalid(format!("{at}.env[{j}].name"), &json!(name), error));
                }
            }
        }
        for (j, mount) in container.get("volumeMounts").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let name = mount.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                errors.push(FieldError::required(format!("{at}.volumeMounts[{j}].name"), ""));
            } else if !volumes.iter().any(|v| v == name) {
                errors.push(FieldError::not_found(format!("{at}.volumeMounts[{j}].name"), &json!(name)));
            }
            if mount.get("mountPath").and_then(Value::as_str).unwrap_or("").is_empty() {
                errors.push(FieldError::required(format!("{at}.volumeMounts[{j}].mountPath"), ""));
            }
        }
    }
    for (i, alias) in spec.get("hostAliases").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let ip = alias.get("ip").and_then(Value::as_str).unwrap_or("");
        if let Some(error) = ip_address(ip) {
            errors.push(FieldError::invalid(format!("{path}.hostAliases[{i}].ip"), &json!(ip), error));
        }
        for (j, hostname) in alias.get("hostnames").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let hostname = hostname.as_str().unwrap_or("");
            if let Some(error) = dns1123_subdomain(hostname) {
                let field = format!("{path}.hostAliases[{i}].hostnames[{j}]");
                errors.push(FieldError::invalid(field, &json!(hostname), error));
            }
        }
    }
    let restart = spec.get("restartPolicy").cloned().unwrap_or(json!("Always"));
    if job {
        if restart != json!("Never") && restart != json!("OnFailure") {
            errors.push(FieldError::not_supported(format!("{path}.restartPolicy"), &restart, &["OnFailure", "Never"]));
        }
    } else if !["Always", "OnFailure", "Never"].iter().any(|r| restart == json!(r)) {
        errors.push(FieldError::not_supported(
            format!("{path}.restartPolicy"),
            &restart,
            &["Always", "OnFailure", "Never"],
        ));
    }
    labels(spec.get("nodeSelector"), &format!("{path}.nodeSelector"), errors);
    if let Some(sa) = spec.get("serviceAccountName").and_then(Value::as_str)
        && !sa.is_empty()
        && let Some(error) = dns1123_subdomain(sa)
    {
        errors.push(FieldError::invalid(format!("{path}.serviceAccountName"), &json!(sa), error));
    }
    nonnegative(spec.get("terminationGracePeriodSeconds"), &format!("{path}.terminationGracePeriodSeconds"), errors);
    if let Some(v) = spec.get("activeDeadlineSeconds").and_then(Value::as_i64)
        && v <= 0
    {
        errors.push(FieldError::invalid(
            format!("{path}.activeDeadlineSeconds"),
            &json!(v),
            "must be between 1 and 2147483647, inclusive",
        ));
    }
}

/// `ValidateJob` (create).
pub fn job(job: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    object_meta(job, false, &mut errors);
    let spec = job.get("spec").cloned().unwrap_or_default();
    nonnegative(spec.get("backoffLimit"), "spec.backoffLimit", &mut errors);
    nonnegative(spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds", &mut errors);
    nonnegative(spec.get("ttlSecondsAfterFinished"), "spec.ttlSecondsAfterFinished", &mut errors);
    nonnegative(spec.get("parallelism"), "spec.parallelism", &mut errors);
    nonnegative(spec.get("completions"), "spec.completions", &mut errors);
    labels(spec.pointer("/template/metadata/labels"), "spec.template.metadata.labels", &mut errors);
    match spec.pointer("/template/spec") {
        Some(pod) => pod_spec(pod, "spec.template.spec", true, &mut errors),
        None => errors.push(FieldError::required("spec.template.spec.containers", "")),
    }
    errors
}

/// `ValidatePodCreate`.
pub fn pod(pod: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    object_meta(pod, false, &mut errors);
    pod_spec(pod.get("spec").unwrap_or(&Value::Null), "spec", false, &mut errors);
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert!(dns1123_subdomain("my-job.x").is_none());
        assert!(dns1123_subdomain("My_Job").is_some());
        assert!(dns1123_label("a.b").is_some());
        assert!(qualified_name("kubernetes.io/hostname").is_none());
        assert!(qualified_name("bad key!").is_some());
        assert!(qualified_name("Example.COM/x").is_some());
        assert!(label_value("").is_none());
        assert!(label_value("-x").is_some());
        assert!(label_value(&"a".repeat(64)).is_some());
    }

    #[test]
    fn env_names_and_ips() {
        assert!(env_var_name("MY_ENV.NAME-1").is_empty());
        assert!(env_var_name("_x").is_empty());
        assert_eq!(env_var_name("1X"), vec![ENV_VAR_MSG.to_string()]);
        assert_eq!(env_var_name("A=B"), vec![ENV_VAR_MSG.to_string()]);
        assert_eq!(env_var_name(".."), vec!["must not be '..'".to_string()]);
        assert_eq!(env_var_name("..x"), vec!["must not start with '..'".to_string()]);
        assert_eq!(ip_address("127.0.0.1"), None);
        assert_eq!(ip_address("2001:db8::1"), None);
        assert_eq!(ip_address("010.0.0.1").as_deref(), Some("must not have leading 0s"));
        assert_eq!(ip_address("::ffff:1.2.3.4").as_deref(), Some("must not be an IPv4-mapped IPv6 address"));
        assert_eq!(
            ip_address("300.1.1.1").as_deref(),
            Some("must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)")
        );
        assert!(ip_address("web").is_some() && ip_address("").is_some());
    }

    #[test]
    fn a_request_above_its_limit_is_refused_as_upstream_words_it() {
        let pod = |resources: Value| {
            json!({"metadata": {"name": "p", "namespace": "n"}, "spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox:1.36", "resources": resources}]}})
        };
        let errors = super::pod(&pod(json!({"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}})));
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            shown.iter().any(|error| error.contains("spec.containers[0].resources.requests[memory]")
                && error.contains("must be less than or equal to memory limit of 1Gi")),
            "{shown:?}"
        );
        let within =
            super::pod(&pod(json!({"requests": {"memory": "512Mi", "cpu": "4"}, "limits": {"memory": "8Gi"}})));
        assert!(within.iter().all(|error| !error.to_string().contains("limit of")), "{within:?}");
    }
}
