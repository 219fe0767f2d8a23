//! Authentication and authorization.
//!
//! - Bearer tokens (staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken):
//!   unknown, revoked or expired → 401 `Unauthorized`.
//! - Service account tokens from the TokenRequest subresource
//!   (pkg/registry/core/serviceaccount/storage/token.go: `expirationSeconds` defaults to 3600,
//!   at least 600), user `system:serviceaccount:NS:SA`.
//! - RBAC (plugin/pkg/auth/authorizer/rbac/rbac.go, `RuleAllows` in
//!   pkg/apis/rbac/v1/evaluation_helpers.go): Roles bound by RoleBindings in the request's
//!   namespace to the service account; `*` for verbs, groups and resources, `resource/sub` and
//!   `*/sub` for subresources, resourceNames. What every authenticated user may do comes from
//!   the default `system:basic-user` and `system:discovery` ClusterRoles
//!   (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go).
//! - The 403 message of `forbiddenMessage` (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go).
//! - Exec over a websocket GET is authorized as `create` (KEP-4006 follow-up, feature gate
//!   `AuthorizePodWebsocketUpgradeCreatePermission`, beta and on by default in 1.35 per
//!   kubernetes/website feature-gates docs).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::app::{State, Token};
use crate::status::ApiError;
use crate::util::{self, text};

/// The admin user.
pub const ADMIN: &str = "kubernetes-admin";

/// What a request does, for authorization.
#[derive(Debug, Clone, Default)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// The token's identity, if valid now.
pub fn authenticate(state: &State, header: Option<&str>) -> Result<Token, ApiError> {
    if state.rt.faults.contains("token-expired") {
        return Err(ApiError::unauthorized());
    }
    let token = header.and_then(|h| h.strip_prefix("Bearer ")).map(str::trim).ok_or_else(ApiError::unauthorized)?;
    let found = state.rt.tokens.get(token).cloned().ok_or_else(ApiError::unauthorized)?;
    if found.expires.is_some_and(|at| SystemTime::now() >= at) {
        return Err(ApiError::unauthorized());
    }
    if let Some((ns, sa)) = &found.service_account
        && state.store.get("serviceaccounts", ns, sa).is_none()
    {
        return Err(ApiError::unauthorized());
    }
    Ok(found)
}

fn list_has(list: Option<&Value>, wanted: &str) -> bool {
    list.and_then(Value::as_array).is_some_and(|items| items.iter().any(|i| i == "*" || i == wanted))
}

fn resource_matches(rule: &Value, resource: &str, sub: &str) -> bool {
    let combined = if sub.is_empty() { resource.to_string() } else { format!("{resource}/{sub}") };
    rule.get("resources").and_then(Value::as_array).is_some_and(|items| {
        items.iter().filter_map(Value::as_str).any(|r| {
            r == "*" || r == combined || (!sub.is_empty() && (r == format!("*/{sub}") || r == format!("{resource}/*")))
        })
    })
}

/// Whether the request is allowed, and the RBAC reason.
pub fn allowed(state: &State, who: &Token, attrs: &Attributes) -> (bool, String) {
    let Some((sa_ns, sa)) = &who.service_account else { return (true, String::new()) };
    // system:basic-user and system:discovery.
    if attrs.group == "authorization.k8s.io" && attrs.resource.starts_with("self") && attrs.verb == "create" {
        return (true, "RBAC: allowed by ClusterRoleBinding \"system:basic-user\" of ClusterRole \"system:basic-user\" to Group \"system:authenticated\"".into());
    }
    if attrs.namespace.is_empty() {
        return (false, String::new());
    }
    for binding in state.store.list("rolebindings", Some(&attrs.namespace)) {
        let bound = binding.get("subjects").and_then(Value::as_array).is_some_and(|subjects| {
            subjects.iter().any(|s| {
                text(s, "/kind") == "ServiceAccount"
                    && text(s, "/name") == sa
                    && (match text(s, "/namespace") {
                        "" => attrs.namespace == *sa_ns,
                        ns => ns == sa_ns,
                    })
            })
        });
        if !bound || text(&binding, "/roleRef/kind") != "Role" {
            continue;
        }
        let role_name = text(&binding, "/roleRef/name");
        let Some(role) = state.store.get("roles", &attrs.namespace, role_name) else { continue };
        for rule in role.get("rules").and_then(Value::as_array).into_iter().flatten() {
            let names_ok = rule
                .get("resourceNames")
                .and_then(Value::as_array)
                .is_none_or(|names| names.is_empty() || names.iter().any(|n| n == attrs.name.as_str()));
            if list_has(rule.get("verbs"), &attrs.verb)
                && list_has(rule.get("apiGroups"), &attrs.group)
                && resource_matches(rule, &attrs.resource, &attrs.subresource)
                && names_ok
            {
                let reason = format!(
                    "RBAC: allowed by RoleBinding \"{}/{}\" of Role \"{role_name}\" to ServiceAccount \"{sa}/{sa_ns}\"",
                    text(&binding, "/metadata/name"),
                    attrs.namespace
                );
                return (true, reason);
            }
        }
    }
    (false, String::new())
}

/// The 403 for a denied request.
pub fn forbidden(who: &Token, attrs: &Attributes) -> ApiError {
    let resource = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let scope = if attrs.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", attrs.namespace)
    };
    let reason = format!(
        "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        who.user, attrs.verb, attrs.group
    );
    ApiError::forbidden(&attrs.resource, &attrs.group, &attrs.name, &reason)
}

/// `POST selfsubjectaccessreviews`.
pub fn self_subject_access_review(state: &State, who: &Token, mut review: Value) -> Value {
    let spec = review.get("spec").cloned().unwrap_or_default();
    let (allowed, reason) = if let Some(attrs) = spec.get("resourceAttributes") {
        let attrs = Attributes {
            verb: text(attrs, "/verb").into(),
            group: text(attrs, "/group").into(),
            resource: text(attrs, "/resource").into(),
            subresource: text(attrs, "/subresource").into(),
            namespace: text(attrs, "/namespace").into(),
            name: text(attrs, "/name").into(),
        };
        allowed(state, who, &attrs)
    } else {
        (true, String::new())
    };
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = json!({"allowed": allowed});
    if !reason.is_empty() {
        review["status"]["reason"] = json!(reason);
    }
    review
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

/// `POST serviceaccounts/{name}/token`: a JWT-shaped token for the service account.
pub fn token_request(state: &mut State, namespace: &str, name: &str, mut request: Value) -> Result<Value, ApiError> {
    let sa = state
        .store
        .get("serviceaccounts", namespace, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found("serviceaccounts", "", name))?;
    let seconds = request.pointer("/spec/expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
    if seconds < 600 {
        return Err(ApiError::invalid(
            "TokenRequest",
            "authentication.k8s.io",
            name,
            &[crate::status::FieldError::invalid(
                "spec.expirationSeconds",
                &json!(seconds),
                "may not specify a duration less than 10 minutes",
            )],
        ));
    }
    let now = SystemTime::now();
    let expires = now + Duration::from_secs(seconds as u64);
    let at = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let audiences = request
        .pointer("/spec/audiences")
        .cloned()
        .unwrap_or_else(|| json!(["https://kubernetes.default.svc.cluster.local"]));
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let claims = json!({"aud": audiences, "exp": at(expires), "iat": at(now), "nbf": at(now),
        "iss": "https://kubernetes.default.svc.cluster.local", "jti": util::uid(), "sub": user,
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": text(&sa, "/metadata/uid")}}});
    let signature: Vec<u8> = (0..32).flat_map(|_| util::random().to_le_bytes()).take(256).collect();
    let token = format!(
        "{}.{}.{}",
        b64(br#"{"alg":"RS256","kid":"fake"}"#),
        b64(claims.to_string().as_bytes()),
        b64(&signature)
    );
    state.rt.tokens.insert(
        token.clone(),
        Token { user, service_account: Some((namespace.into(), name.into())), expires: Some(expires) },
    );
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"] = json!({"name": name, "namespace": namespace, "creationTimestamp": null});
    request["spec"]["audiences"] = audiences;
    request["spec"]["expirationSeconds"] = json!(seconds);
    if request.pointer("/spec/boundObjectRef").is_none() {
        request["spec"]["boundObjectRef"] = Value::Null;
    }
    request["status"] = json!({"token": token, "expirationTimestamp": util::rfc3339(expires)});
    Ok(request)
}
