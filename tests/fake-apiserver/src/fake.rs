//! The control endpoints under `/fake/` (no authentication, not counted): faults, tokens,
//! a dump of every object, request accounting, the nodes (lose and restore a node's kubelet),
//! the watches (end them all early, or open a watch gap), and the isolation checker's
//! violations (`isolation.rs`).

use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::api::json_response;
use crate::app::{Shared, Token};
use crate::auth::ADMIN;
use crate::controllers::nodes;
use crate::resources;
use crate::status::ApiError;
use crate::util::text;

/// Every fault name.
pub const FAULTS: &[&str] = &[
    "failed-create",
    "pull-denied",
    "pull-rate-limited",
    "pull-unavailable",
    "oom-kill",
    "policy-forbidden",
    "token-expired",
    "drop-exec-stream",
    "drop-exec-status",
    "job-deleted-mid-step",
    "node-lost-mid-step",
    "api-429",
    "api-500",
    "api-503",
];

/// While one of these faults is set, every API request (a watch or an exec too; the control
/// endpoints never) is answered with it before authentication, as the filters in front of the
/// handlers answer: 429 from the priority-and-fairness or max-in-flight filter, in plain text
/// with `Retry-After: 1` (staging/src/k8s.io/apiserver/pkg/server/filters/maxinflight.go
/// `tooManyRequests`), a 500 from a failing storage, a 503 from a load balancer with no healthy
/// API server behind it. Watches already open go on.
pub fn refused(state: &crate::app::State) -> Option<Response> {
    let faults = &state.rt.faults;
    if faults.contains("api-429") {
        let mut response =
            (axum::http::StatusCode::TOO_MANY_REQUESTS, "Too many requests, please try again later.\n").into_response();
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        Some(response)
    } else if faults.contains("api-500") {
        Some(ApiError::internal("rpc error: code = Unavailable desc = etcdserver: request timed out").into_response())
    } else if faults.contains("api-503") {
        Some(ApiError::service_unavailable().into_response())
    } else {
        None
    }
}

fn bad(message: &str) -> Response {
    json_response(400, &json!({"error": message}), &[])
}

pub async fn handle(State(app): State<Shared>, method: Method, Path(rest): Path<String>, body: Bytes) -> Response {
    let body: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let mut state = app.lock();
    match (method.as_str(), parts.as_slice()) {
        ("POST", ["faults"]) => {
            let Some(list) = body.get("faults").and_then(Value::as_array) else {
                return bad("want {\"faults\": [...]}");
            };
            let mut faults = std::collections::BTreeSet::new();
            for fault in list {
                let name = fault.as_str().unwrap_or("");
                if !FAULTS.contains(&name) {
                    return bad(&format!("unknown fault {name:?}; known: {}", FAULTS.join(", ")));
                }
                faults.insert(name.to_string());
            }
            state.rt.fired.retain(|f| faults.contains(f));
            state.rt.faults = faults;
            json_response(200, &json!({"faults": state.rt.faults}), &[])
        }
        ("GET", ["faults"]) => json_response(200, &json!({"faults": state.rt.faults, "fired": state.rt.fired}), &[]),
        ("POST", ["tokens"]) => {
            let token = text(&body, "/token").to_string();
            if token.is_empty() {
                return bad("want {\"token\": \"...\", \"expires_in_s\": N}");
            }
            let expires = body
                .get("expires_in_s")
                .and_then(Value::as_f64)
                .map(|s| SystemTime::now() + Duration::from_secs_f64(s.max(0.0)));
            state.rt.tokens.insert(token, Token { user: ADMIN.into(), service_account: None, expires });
            json_response(200, &json!({"ok": true}), &[])
        }
        ("POST", ["tokens", "revoke"]) => {
            let removed = state.rt.tokens.remove(text(&body, "/token")).is_some();
            json_response(200, &json!({"revoked": removed}), &[])
        }
        ("GET", ["objects"]) => json_response(200, &json!(state.store.all()), &[]),
        ("GET", ["violations"]) => json_response(200, &state.store.isolation.report(), &[]),
        ("GET", ["stats"]) => json_response(
            200,
            &json!({"requests": state.rt.stats.requests, "by": state.rt.stats.by, "refused": state.rt.stats.refused}),
            &[],
        ),
        ("POST", ["stats", "reset"]) => {
            state.rt.stats = Default::default();
            json_response(200, &json!({"requests": 0}), &[])
        }
        ("POST", ["watches", "end"]) => {
            state.store.end_watches();
            json_response(200, &json!({"ended": true}), &[])
        }
        ("POST", ["watches", "gap"]) => {
            // A watch gap: every watch ends, the Jobs and pods of the namespace go while none
            // is open (deleted with no grace, their finalizers done), and the history is
            // compacted, so a watch resumed from before the gap gets 410 Gone and never sees
            // those deletions: only a fresh list shows them gone.
            let namespace = text(&body, "/namespace").to_string();
            state.store.end_watches();
            let mut deleted = Vec::new();
            for resource in ["jobs", "pods"] {
                for object in state.store.list(resource, Some(&namespace)) {
                    let name = text(&object, "/metadata/name").to_string();
                    if let Some(key) = resources::by_key(resource).map(|r| r.key())
                        && state.store.remove(key, &namespace, &name).is_some()
                    {
                        deleted.push(format!("{resource}/{name}"));
                    }
                }
            }
            state.store.compact();
            json_response(200, &json!({"deleted": deleted}), &[])
        }
        ("GET", ["nodes"]) => {
            let list: Vec<Value> = state
                .store
                .list("nodes", None)
                .iter()
                .map(|n| {
                    let name = text(n, "/metadata/name").to_string();
                    let ready = n
                        .pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .and_then(|c| c.iter().find(|c| text(c, "/type") == "Ready"))
                        .map(|c| text(c, "/status").to_string())
                        .unwrap_or_default();
                    let lost = state.rt.nodes.get(&name).is_some_and(|r| r.lost_at.is_some());
                    json!({"name": name, "ready": ready, "lost": lost})
                })
                .collect();
            json_response(200, &json!(list), &[])
        }
        ("POST", ["nodes", name, action @ ("lose" | "restore")]) => {
            if nodes::set_lost(&mut state, name, *action == "lose") {
                json_response(200, &json!({"node": name, "lost": *action == "lose"}), &[])
            } else {
                json_response(404, &json!({"error": format!("no node {name}")}), &[])
            }
        }
        _ => json_response(404, &json!({"error": "unknown control endpoint"}), &[]).into_response(),
    }
}
