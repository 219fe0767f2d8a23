//! `metav1.Status` error bodies with the reasons, codes and messages of
//! staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go (`NewNotFound`, `NewAlreadyExists`,
//! `NewInvalid`, `NewForbidden`, `NewBadRequest`, `NewUnauthorized`, `NewResourceExpired`,
//! `NewMethodNotSupported`, `NewInternalError`) and the field errors of
//! staging/src/k8s.io/apimachinery/pkg/util/validation/field/errors.go.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A failed request: its HTTP code and Status body.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub body: Value,
}

/// A qualified resource (`jobs.batch`, `pods`).
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") }
}

impl ApiError {
    fn new(code: u16, reason: &str, message: String, details: Option<Value>) -> Self {
        let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code});
        if let Some(details) = details {
            body["details"] = details;
        }
        Self { code, body }
    }

    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
            Some(json!({"name": name, "group": group, "kind": resource})),
        )
        .tidy()
    }

    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
            Some(json!({"name": name, "group": group, "kind": resource})),
        )
        .tidy()
    }

    /// `NewInvalid(qualifiedKind, name, errs)`: `Job.batch "x" is invalid: <errors>`.
    pub fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let qualified_kind = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        let aggregate = if errors.len() == 1 {
            errors[0].to_string()
        } else {
            format!("[{}]", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.kind.reason(), "message": e.cause_message(), "field": e.field}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {aggregate}"),
            Some(json!({"name": name, "group": group, "kind": kind, "causes": causes})),
        )
        .tidy()
    }

    /// `NewForbidden(resource, name, err)`.
    pub fn forbidden(resource: &str, group: &str, name: &str, reason: &str) -> Self {
        let subject = if name.is_empty() {
            qualified(resource, group)
        } else {
            format!("{} \"{name}\"", qualified(resource, group))
        };
        Self::new(
            403,
            "Forbidden",
            format!("{subject} is forbidden: {reason}"),
            Some(json!({"name": name, "group": group, "kind": resource})),
        )
        .tidy()
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message.into(), None)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized".into(), None)
    }

    /// A watch from a compacted resourceVersion (`storage.NewTooLargeResourceVersionError`'s
    /// sibling: the cacher's `too old resource version` Gone error).
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(410, "Expired", format!("too old resource version: {requested} ({oldest})"), None)
    }

    pub fn method_not_allowed(resource: &str, group: &str, action: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("{action} is not supported on resources of kind \"{}\"", qualified(resource, group)),
            Some(json!({"group": group, "kind": resource})),
        )
        .tidy()
    }

    pub fn not_found_path() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource".into(), Some(json!({})))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(json!({"causes": [{"message": message}]})),
        )
    }

    /// What a load balancer in front of an API server with no healthy backend answers, in the
    /// API's own shape (`NewServiceUnavailable`, staging/src/k8s.io/apimachinery/pkg/api/errors).
    pub fn service_unavailable() -> Self {
        Self::new(503, "ServiceUnavailable", "the server is currently unable to handle the request".into(), None)
    }

    /// Drops empty `details` members as `omitempty` does.
    fn tidy(mut self) -> Self {
        if let Some(details) = self.body.get_mut("details").and_then(Value::as_object_mut) {
            details.retain(|_, v| v.as_str() != Some(""));
        }
        self
    }

    pub fn message(&self) -> String {
        self.body["message"].as_str().unwrap_or("").to_string()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (code, self.body.to_string()).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    Invalid,
    Required,
    NotSupported,
    Forbidden,
    NotFound,
    Duplicate,
}

impl FieldErrorKind {
    fn reason(self) -> &'static str {
        match self {
            Self::Invalid => "FieldValueInvalid",
            Self::Required => "FieldValueRequired",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Forbidden => "FieldValueForbidden",
            Self::NotFound => "FieldValueNotFound",
            Self::Duplicate => "FieldValueDuplicate",
        }
    }
    fn text(self) -> &'static str {
        match self {
            Self::Invalid => "Invalid value",
            Self::Required => "Required value",
            Self::NotSupported => "Unsupported value",
            Self::Forbidden => "Forbidden",
            Self::NotFound => "Not found",
            Self::Duplicate => "Duplicate value",
        }
    }
}

/// One `field.Error`.
#[derive(Debug, Clone)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    /// The bad value, rendered as Go's `%#v`-ish quoting does for strings and numbers.
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl Into<String>) -> Self {
        Self { kind: FieldErrorKind::Invalid, field: field.into(), value: Some(render(value)), detail: detail.into() }
    }
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { kind: FieldErrorKind::Required, field: field.into(), value: None, detail: detail.into() }
    }
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let list = supported.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
        Self {
            kind: FieldErrorKind::NotSupported,
            field: field.into(),
            value: Some(render(value)),
            detail: format!("supported values: {list}"),
        }
    }
    pub fn not_found(field: impl Into<String>, value: &Value) -> Self {
        Self { kind: FieldErrorKind::NotFound, field: field.into(), value: Some(render(value)), detail: String::new() }
    }
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Self { kind: FieldErrorKind::Duplicate, field: field.into(), value: Some(render(value)), detail: String::new() }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { kind: FieldErrorKind::Forbidden, field: field.into(), value: None, detail: detail.into() }
    }

    /// `ErrorBody()`: the message without the field.
    fn cause_message(&self) -> String {
        let mut s = self.kind.text().to_string();
        if let Some(value) = &self.value {
            s.push_str(": ");
            s.push_str(value);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.cause_message())
    }
}

fn render(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}
