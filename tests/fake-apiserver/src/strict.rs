//! Decoding a request body as the API server does: into the typed object (here the
//! k8s-openapi type), failing with `transformDecodeError`'s 400 `<Kind> in version "v1" cannot
//! be handled as a <Kind>: ...` (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go),
//! quantities decoded with `resource.ParseQuantity`, and field validation
//! (`fieldValidation=Strict|Warn|Ignore`, KEP-2885, staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go):
//! a field of the request that does not survive decode and re-encode is unknown; Strict refuses
//! it (`strict decoding error: unknown field "spec.foo"`), Warn (the default) answers with a
//! `Warning` header per field.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::status::ApiError;

/// `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

impl FieldValidation {
    pub fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Strict") => Ok(Self::Strict),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}. Must be one of: Ignore, Warn, Strict"
            ))),
        }
    }
}

fn roundtrip<T: DeserializeOwned + Serialize>(body: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(body.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

fn unknown(request: &Value, encoded: &Value, path: &str, out: &mut Vec<String>) {
    match (request, encoded) {
        (Value::Object(request), Value::Object(encoded)) => {
            for (key, value) in request {
                let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                match encoded.get(key) {
                    _ if value.is_null() => {}
                    None => out.push(at),
                    Some(inner) => unknown(value, inner, &at, out),
                }
            }
        }
        (Value::Array(request), Value::Array(encoded)) => {
            for (i, (value, inner)) in request.iter().zip(encoded).enumerate() {
                unknown(value, inner, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Every quantity of a pod spec must parse.
fn quantities(spec: Option<&Value>) -> bool {
    let containers = spec.and_then(|s| s.get("containers")).and_then(Value::as_array).into_iter().flatten();
    containers.into_iter().all(|c| {
        ["limits", "requests"].iter().all(|kind| {
            c.pointer(&format!("/resources/{kind}")).and_then(Value::as_object).into_iter().flatten().all(|(_, q)| {
                let text = q.as_str().map(str::to_string).unwrap_or_else(|| q.to_string());
                crate::quantity::parse(&text).is_some()
            })
        })
    })
}

/// Decodes `body` as `kind`; the `Warning` texts (unknown fields under Warn).
pub fn decode(kind: &str, api_version: &str, body: &Value, mode: FieldValidation) -> Result<Vec<String>, ApiError> {
    use k8s_openapi::api::{authentication, authorization, batch, core, networking, rbac};
    let version = api_version.rsplit('/').next().unwrap_or(api_version);
    let cannot = |detail: &str| {
        ApiError::bad_request(format!("{kind} in version \"{version}\" cannot be handled as a {kind}: {detail}"))
    };
    if !body.is_object() {
        return Err(cannot("the body is not a JSON object"));
    }
    if let Some(given) = body.get("kind").and_then(Value::as_str)
        && given != kind
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({api_version})",
            body.get("apiVersion").and_then(Value::as_str).unwrap_or("")
        )));
    }
    let pod_spec = match kind {
        "Job" => body.pointer("/spec/template/spec"),
        "Pod" => body.get("spec"),
        _ => None,
    };
    if !quantities(pod_spec) {
        return Err(cannot(crate::quantity::FORMAT_WRONG));
    }
    let mut full = body.clone();
    full["apiVersion"] = Value::from(api_version);
    full["kind"] = Value::from(kind);
    let encoded = match kind {
        "Job" => roundtrip::<batch::v1::Job>(&full),
        "Pod" => roundtrip::<core::v1::Pod>(&full),
        "Namespace" => roundtrip::<core::v1::Namespace>(&full),
        "ServiceAccount" => roundtrip::<core::v1::ServiceAccount>(&full),
        "NetworkPolicy" => roundtrip::<networking::v1::NetworkPolicy>(&full),
        "Role" => roundtrip::<rbac::v1::Role>(&full),
        "RoleBinding" => roundtrip::<rbac::v1::RoleBinding>(&full),
        "TokenRequest" => roundtrip::<authentication::v1::TokenRequest>(&full),
        "SelfSubjectAccessReview" => roundtrip::<authorization::v1::SelfSubjectAccessReview>(&full),
        "Event" => roundtrip::<core::v1::Event>(&full),
        _ => Ok(full.clone()),
    }
    .map_err(|e| cannot(&e))?;
    let mut fields = Vec::new();
    unknown(&full, &encoded, "", &mut fields);
    let texts: Vec<String> = fields.iter().map(|f| format!("unknown field \"{f}\"")).collect();
    match mode {
        FieldValidation::Strict if !texts.is_empty() => {
            Err(ApiError::bad_request(format!("strict decoding error: {}", texts.join(", "))))
        }
        FieldValidation::Warn => Ok(texts),
        _ => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields() {
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"foo": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox", "bar": 2}]}}}});
        let error = decode("Job", "batch/v1", &job, FieldValidation::Strict).err().map(|e| e.message());
        assert_eq!(
            error.as_deref(),
            Some(
                "strict decoding error: unknown field \"spec.foo\", unknown field \"spec.template.spec.containers[0].bar\""
            )
        );
        assert_eq!(decode("Job", "batch/v1", &job, FieldValidation::Warn).map(|w| w.len()).ok(), Some(2));
        let bad = json!({"metadata": {"name": "j"}, "spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "2 cores"}}}]}}}});
        assert_eq!(decode("Job", "batch/v1", &bad, FieldValidation::Warn).err().map(|e| e.code), Some(400));
    }
}
