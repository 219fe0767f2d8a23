//! The HTTP front: request info (staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go:
//! verbs from methods, `watch=true`, namespaces, subresources), authentication and
//! authorization filters, request accounting, and the REST handlers of
//! staging/src/k8s.io/apiserver/pkg/endpoints/handlers (get, list, watch, create, update,
//! patch, delete, deletecollection), with discovery, `pods/log`, `serviceaccounts/token` and
//! `selfsubjectaccessreviews`. Watches stream newline-delimited `{"type","object"}` events
//! (handlers/watch.go), with BOOKMARKs when `allowWatchBookmarks`, the WatchList initial-events
//! bookmark (`k8s.io/initial-events-end`) when `sendInitialEvents=true`, and an ERROR 410
//! event for a resourceVersion older than the kept history.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Value, json};

use crate::app::{Shared, Token};
use crate::auth::{self, Attributes};
use crate::registry::{self, DeleteOptions};
use crate::resources::{self, Resource};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::WatchSpec;
use crate::strict::{self, FieldValidation};
use crate::util::text;

/// The largest request body (the API server's 3 MiB limit).
const MAX_BODY: usize = 3 << 20;

pub fn router(app: Shared) -> Router {
    Router::new().route("/fake/{*rest}", any(crate::fake::handle)).fallback(handle).with_state(app)
}

/// `RequestInfo`.
#[derive(Debug, Clone, Default)]
pub struct RequestInfo {
    pub resource_request: bool,
    pub path: String,
    pub verb: String,
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub resource: String,
    pub name: String,
    pub subresource: String,
}

impl RequestInfo {
    pub fn parse(method: &Method, path: &str, query: &[(String, String)]) -> Self {
        let mut info = Self { path: path.to_string(), ..Self::default() };
        let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
        let rest: &[&str] = match segments.as_slice() {
            ["api", version, rest @ ..] if !rest.is_empty() => {
                info.version = version.to_string();
                rest
            }
            ["apis", group, version, rest @ ..] if !rest.is_empty() => {
                info.group = group.to_string();
                info.version = version.to_string();
                rest
            }
            _ => {
                info.verb = method.as_str().to_lowercase();
                return info;
            }
        };
        info.resource_request = true;
        let mut parts = rest.to_vec();
        if parts[0] == "namespaces" && parts.len() > 1 {
            info.namespace = parts[1].to_string();
            if parts.len() > 2 && parts[2] != "status" && parts[2] != "finalize" {
                parts.drain(..2);
            }
        }
        info.resource = parts[0].to_string();
        info.name = parts.get(1).map(|s| s.to_string()).unwrap_or_default();
        info.subresource = parts.get(2).map(|s| s.to_string()).unwrap_or_default();
        let watch = query.iter().any(|(k, v)| k == "watch" && (v == "true" || v == "1"));
        info.verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if info.name.is_empty() => "deletecollection",
            Method::DELETE => "delete",
            _ if watch => "watch",
            _ if info.name.is_empty() => "list",
            _ => "get",
        }
        .to_string();
        info
    }

    /// The accounting key: `create jobs`, `get pods/log`, `get /version`.
    pub fn stat_key(&self) -> String {
        if !self.resource_request {
            return format!("{} {}", self.verb, self.path);
        }
        if self.subresource.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}/{}", self.verb, self.resource, self.subresource)
        }
    }

    pub fn attributes(&self) -> Attributes {
        Attributes {
            verb: self.verb.clone(),
            group: self.group.clone(),
            resource: self.resource.clone(),
            subresource: self.subresource.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_query(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn param<'a>(query: &'a [(String, String)], key: &str) -> Option<&'a str> {
    query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

pub fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    let mut response = (status, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for warning in warnings {
        let escaped = warning.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            headers.append(header::WARNING, value);
        }
    }
    response
}

/// Every API request, counted by what it asked (`verb resource`) and, when refused, by its
/// answer's code too (`verb resource code`, in `refused`).
async fn handle(State(app): State<Shared>, request: Request) -> Response {
    let query = parse_query(request.uri().query());
    let info = RequestInfo::parse(request.method(), request.uri().path(), &query);
    let response = respond(app.clone(), request).await;
    let code = response.status().as_u16();
    if code >= 400 {
        *app.lock().rt.stats.refused.entry(format!("{} {code}", info.stat_key())).or_default() += 1;
    }
    response
}

async fn respond(app: Shared, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let query = parse_query(parts.uri.query());
    let info = RequestInfo::parse(&parts.method, parts.uri.path(), &query);
    let who = {
        let mut state = app.lock();
        state.rt.stats.requests += 1;
        *state.rt.stats.by.entry(info.stat_key()).or_default() += 1;
        if let Some(refused) = crate::fake::refused(&state) {
            return refused;
        }
        let authorization = parts.headers.get(header::AUTHORIZATION).and_then(|h| h.to_str().ok());
        auth::authenticate(&state, authorization)
    };
    let who = match who {
        Ok(who) => who,
        Err(error) => return error.into_response(),
    };
    if !info.resource_request {
        return discovery(&app, &info).unwrap_or_else(IntoResponse::into_response);
    }
    let Some(resource) = resources::find(&info.group, &info.version, &info.resource).copied() else {
        return ApiError::not_found_path().into_response();
    };
    if !info.subresource.is_empty() && !resources::has_subresource(resource.plural, &info.subresource) {
        return ApiError::not_found_path().into_response();
    }
    {
        let state = app.lock();
        let (allowed, _) = auth::allowed(&state, &who, &info.attributes());
        if !allowed {
            return auth::forbidden(&who, &info.attributes()).into_response();
        }
    }
    if info.subresource == "exec" {
        return crate::exec::handle(app, info, parts, query).await;
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(bytes) => bytes,
        Err(_) => return ApiError::bad_request("request body too large").into_response(),
    };
    let result = if info.verb == "watch" {
        watch(&app, &resource, &info, &query)
    } else {
        dispatch(&app, &who, &resource, &info, &query, &parts.headers, &bytes)
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

fn discovery(app: &Shared, info: &RequestInfo) -> Result<Response, ApiError> {
    let path = info.path.trim_end_matches('/');
    let server = app.server.lock().map(|s| s.clone()).unwrap_or_default();
    let body = match path {
        "/version" => app.config.kubernetes_version.info(),
        "/api" => resources::core_versions(server.trim_start_matches("http://")),
        "/apis" => resources::group_list(),
        "/api/v1" => resources::resource_list("", "v1").ok_or_else(ApiError::not_found_path)?,
        "/healthz" | "/livez" | "/readyz" => return Ok((StatusCode::OK, "ok").into_response()),
        other => {
            let parts: Vec<&str> = other.trim_start_matches('/').split('/').collect();
            match parts.as_slice() {
                ["apis", group] => resources::group(group).ok_or_else(ApiError::not_found_path)?,
                ["apis", group, version] => {
                    resources::resource_list(group, version).ok_or_else(ApiError::not_found_path)?
                }
                _ => return Err(ApiError::not_found_path()),
            }
        }
    };
    Ok(json_response(200, &body, &[]))
}

fn selectors(resource: &Resource, query: &[(String, String)]) -> Result<(LabelSelector, FieldSelector), ApiError> {
    Ok((
        LabelSelector::parse(param(query, "labelSelector").unwrap_or(""))?,
        FieldSelector::parse(resource.plural, param(query, "fieldSelector").unwrap_or(""))?,
    ))
}

fn body_json(bytes: &Bytes) -> Result<Value, ApiError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("json: {e}")))
}

fn dispatch(
    app: &Shared,
    who: &Token,
    resource: &Resource,
    info: &RequestInfo,
    query: &[(String, String)],
    headers: &HeaderMap,
    bytes: &Bytes,
) -> Result<Response, ApiError> {
    if resource.namespaced && info.namespace.is_empty() && !matches!(info.verb.as_str(), "list" | "watch") {
        return Err(ApiError::not_found_path());
    }
    let namespace = if resource.namespaced { info.namespace.as_str() } else { "" };
    let key = resource.key();
    match (info.verb.as_str(), info.subresource.as_str()) {
        ("get", "log") => pod_log(app, namespace, &info.name, query),
        ("get", _) => {
            let state = app.lock();
            let object = state
                .store
                .get(key, namespace, &info.name)
                .cloned()
                .ok_or_else(|| ApiError::not_found(resource.plural, resource.group, &info.name))?;
            Ok(json_response(200, &object, &[]))
        }
        ("list", _) => {
            let (labels, fields) = selectors(resource, query)?;
            let state = app.lock();
            let scope = (!info.namespace.is_empty() && resource.namespaced).then_some(info.namespace.as_str());
            let items: Vec<Value> = state
                .store
                .list(key, scope)
                .into_iter()
                .filter(|o| labels.matches(o.pointer("/metadata/labels")) && fields.matches(resource.plural, o))
                .collect();
            let list = json!({"kind": format!("{}List", resource.kind), "apiVersion": resource.api_version(),
                              "metadata": {"resourceVersion": state.store.revision().to_string()}, "items": items});
            Ok(json_response(200, &list, &[]))
        }
        ("create", "token") => {
            let body = body_json(bytes)?;
            strict::decode(
                "TokenRequest",
                "authentication.k8s.io/v1",
                &body,
                FieldValidation::parse(param(query, "fieldValidation"))?,
            )?;
            let mut state = app.lock();
            let answer = auth::token_request(&mut state, namespace, &info.name, body)?;
            Ok(json_response(201, &answer, &[]))
        }
        ("create", "") => {
            if !resource.can("create") {
                return Err(ApiError::method_not_allowed(resource.plural, resource.group, "create"));
            }
            let body = body_json(bytes)?;
            let mode = FieldValidation::parse(param(query, "fieldValidation"))?;
            let mut state = app.lock();
            if resource.plural == "selfsubjectaccessreviews" {
                strict::decode(resource.kind, &resource.api_version(), &body, mode)?;
                return Ok(json_response(201, &auth::self_subject_access_review(&state, who, body), &[]));
            }
            let (object, warnings) = registry::create(&mut state, &app.config, who, resource, namespace, body, mode)?;
            Ok(json_response(201, &object, &warnings))
        }
        ("update", sub) | ("patch", sub) if sub.is_empty() || sub == "status" => {
            if !resource.can(&info.verb) {
                return Err(ApiError::method_not_allowed(resource.plural, resource.group, &info.verb));
            }
            let body = body_json(bytes)?;
            let mode = FieldValidation::parse(param(query, "fieldValidation"))?;
            let content_type = headers.get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("");
            let mut state = app.lock();
            let old = state.store.get(key, namespace, &info.name).cloned();
            let mut new = if info.verb == "update" {
                body
            } else {
                match old.clone() {
                    Some(mut current) => {
                        apply_patch(&mut current, &body, content_type)?;
                        current
                    }
                    None if content_type.starts_with("application/apply-patch") => body,
                    None => return Err(ApiError::not_found(resource.plural, resource.group, &info.name)),
                }
            };
            let warnings = strict::decode(resource.kind, &resource.api_version(), &new, mode)?;
            if text(&new, "/metadata/name") != info.name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({})",
                    text(&new, "/metadata/name"),
                    info.name
                )));
            }
            let Some(old) = old else {
                if matches!(resource.plural, "roles" | "rolebindings")
                    || content_type.starts_with("application/apply-patch")
                {
                    let (object, w) = registry::create(&mut state, &app.config, who, resource, namespace, new, mode)?;
                    return Ok(json_response(201, &object, &w));
                }
                return Err(ApiError::not_found(resource.plural, resource.group, &info.name));
            };
            let given = text(&new, "/metadata/resourceVersion");
            if info.verb == "update" && !given.is_empty() && given != text(&old, "/metadata/resourceVersion") {
                return Err(conflict(resource, &info.name));
            }
            for field in ["uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"] {
                match old["metadata"].get(field) {
                    Some(value) => new["metadata"][field] = value.clone(),
                    None => {
                        if let Some(meta) = new["metadata"].as_object_mut() {
                            meta.remove(field);
                        }
                    }
                }
            }
            new["metadata"]["namespace"] = old["metadata"]["namespace"].clone();
            new["apiVersion"] = json!(resource.api_version());
            new["kind"] = json!(resource.kind);
            // `ValidateObjectMetaUpdate`'s owner references, and a policy's spec
            // (`ValidateNetworkPolicyUpdate`).
            let mut errors = Vec::new();
            crate::validation::owner_references(&new, &mut errors);
            if resource.plural == "networkpolicies" && info.subresource.is_empty() {
                crate::networkpolicy::validate_spec(&new, &mut errors);
            }
            if !errors.is_empty() {
                return Err(ApiError::invalid(resource.kind, resource.group, &info.name, &errors));
            }
            if info.subresource == "status" {
                let status = new.get("status").cloned();
                new = old.clone();
                if let Some(status) = status {
                    new["status"] = status;
                }
            } else if matches!(resource.plural, "pods" | "jobs") {
                new["status"] = old.get("status").cloned().unwrap_or(Value::Null);
            }
            let stored = state.store.update(key, new.clone()).unwrap_or(new);
            Ok(json_response(200, &stored, &warnings))
        }
        ("delete", "") => {
            let body = body_json(bytes)?;
            let options = DeleteOptions::parse(query, Some(&body))?;
            let mut warnings = Vec::new();
            if resource.plural == "jobs" && options.propagation.is_none() {
                warnings.push(registry::JOB_ORPHAN_WARNING.to_string());
            }
            let mut state = app.lock();
            let (code, answer) = registry::delete(&mut state, resource, namespace, &info.name, options)?;
            Ok(json_response(code, &answer, &warnings))
        }
        ("deletecollection", "") => {
            if !resource.can("deletecollection") {
                return Err(ApiError::method_not_allowed(resource.plural, resource.group, "deletecollection"));
            }
            let body = body_json(bytes)?;
            let options = DeleteOptions::parse(query, Some(&body))?;
            let (labels, fields) = selectors(resource, query)?;
            let mut warnings = Vec::new();
            if resource.plural == "jobs" && options.propagation.is_none() {
                warnings.push(registry::JOB_ORPHAN_WARNING.to_string());
            }
            let mut state = app.lock();
            let doomed: Vec<Value> = state
                .store
                .list(key, Some(namespace))
                .into_iter()
                .filter(|o| labels.matches(o.pointer("/metadata/labels")) && fields.matches(resource.plural, o))
                .collect();
            let mut items = Vec::new();
            for object in doomed {
                let name = text(&object, "/metadata/name").to_string();
                if let Ok((_, answer)) = registry::delete(&mut state, resource, namespace, &name, options) {
                    items.push(if text(&answer, "/kind") == "Status" { object } else { answer });
                }
            }
            let list = json!({"kind": format!("{}List", resource.kind), "apiVersion": resource.api_version(),
                              "metadata": {"resourceVersion": state.store.revision().to_string()}, "items": items});
            Ok(json_response(200, &list, &warnings))
        }
        (verb, _) => Err(ApiError::method_not_allowed(resource.plural, resource.group, verb)),
    }
}

fn conflict(resource: &Resource, name: &str) -> ApiError {
    let mut error = ApiError::already_exists(resource.plural, resource.group, name);
    error.body["reason"] = json!("Conflict");
    error.body["message"] = json!(format!(
        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
        crate::status::qualified(resource.plural, resource.group)
    ));
    error
}

/// JSON merge patch (RFC 7386; strategic merge and apply treated as merge), or JSON patch.
fn apply_patch(target: &mut Value, patch: &Value, content_type: &str) -> Result<(), ApiError> {
    fn merge(target: &mut Value, patch: &Value) {
        match patch {
            Value::Object(fields) => {
                if !target.is_object() {
                    *target = json!({});
                }
                for (key, value) in fields {
                    if value.is_null() {
                        if let Some(map) = target.as_object_mut() {
                            map.remove(key);
                        }
                    } else {
                        merge(&mut target[key.as_str()], value);
                    }
                }
            }
            other => *target = other.clone(),
        }
    }
    if content_type.starts_with("application/json-patch+json") {
        for op in patch.as_array().into_iter().flatten() {
            let path = text(op, "/path");
            match text(op, "/op") {
                "add" | "replace" => {
                    let value = op.get("value").cloned().unwrap_or(Value::Null);
                    let (parent, last) = path.rsplit_once('/').unwrap_or(("", path));
                    let last = last.replace("~1", "/").replace("~0", "~");
                    match target.pointer_mut(parent) {
                        Some(Value::Array(items)) if last == "-" => items.push(value),
                        Some(Value::Array(items)) => match last.parse::<usize>() {
                            Ok(i) if i <= items.len() => {
                                if text(op, "/op") == "add" {
                                    items.insert(i, value)
                                } else if i < items.len() {
                                    items[i] = value
                                }
                            }
                            _ => return Err(ApiError::bad_request(format!("invalid JSON patch path {path}"))),
                        },
                        Some(parent) => parent[last.as_str()] = value,
                        None => {
                            return Err(ApiError::bad_request(format!(
                                "jsonpatch add operation does not apply: doc is missing path: \"{path}\""
                            )));
                        }
                    }
                }
                "remove" => {
                    let (parent, last) = path.rsplit_once('/').unwrap_or(("", path));
                    match target.pointer_mut(parent) {
                        Some(Value::Object(map)) => {
                            map.remove(&last.replace("~1", "/").replace("~0", "~"));
                        }
                        Some(Value::Array(items)) => {
                            if let Ok(i) = last.parse::<usize>()
                                && i < items.len()
                            {
                                items.remove(i);
                            }
                        }
                        _ => {}
                    }
                }
                "test" if target.pointer(path) != op.get("value") => {
                    return Err(ApiError::invalid("", "", "", &[]));
                }
                _ => {}
            }
        }
        return Ok(());
    }
    merge(target, patch);
    Ok(())
}

/// `pods/log`: `PodLogOptions` validated (pkg/apis/core/validation/validation.go
/// `ValidatePodLogOptions`: `tailLines` not negative), the container chosen as
/// pkg/registry/core/pod/strategy.go `ValidateContainer` does (the `container` parameter, or the
/// only container; on a pod of more, a 400 naming them), its state checked as the kubelet's
/// `validateContainerLogStatus` does (a waiting container has no log yet), then its log file,
/// its last `tailLines` lines if asked.
fn pod_log(app: &Shared, namespace: &str, name: &str, query: &[(String, String)]) -> Result<Response, ApiError> {
    let tail = match param(query, "tailLines") {
        None | Some("") => None,
        Some(value) => match value.parse::<i64>() {
            Ok(lines) if lines < 0 => {
                return Err(ApiError::invalid(
                    "PodLogOptions",
                    "",
                    name,
                    &[crate::status::FieldError::invalid(
                        "tailLines",
                        &json!(lines),
                        "must be greater than or equal to 0",
                    )],
                ));
            }
            Ok(lines) => Some(usize::try_from(lines).unwrap_or(usize::MAX)),
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "tailLines: strconv.ParseInt: parsing {value:?}: invalid syntax"
                )));
            }
        },
    };
    let pod =
        app.lock().store.get("pods", namespace, name).cloned().ok_or_else(|| ApiError::not_found("pods", "", name))?;
    let container = container_of(&pod, name, param(query, "container"))?;
    let status = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .and_then(|statuses| statuses.iter().find(|s| text(s, "/name") == container));
    if status.is_none_or(|s| s.pointer("/state/waiting").is_some()) {
        let reason = match status.map(|s| text(s, "/state/waiting/reason")).unwrap_or("") {
            "" => "ContainerCreating",
            reason => reason,
        };
        return Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
        )));
    }
    let path = crate::sandbox::container_dir(&app.config.dir, namespace, name, &container).join("log");
    let mut data = std::fs::read(path).unwrap_or_default();
    if let Some(lines) = tail {
        let starts: Vec<usize> = data
            .split_inclusive(|b| *b == b'\n')
            .scan(0, |offset, line| {
                let start = *offset;
                *offset += line.len();
                Some(start)
            })
            .collect();
        let from = match starts.len().checked_sub(lines) {
            _ if lines == 0 => data.len(),
            Some(first) => starts[first],
            None => 0,
        };
        data.drain(..from);
    }
    let mut response = (StatusCode::OK, data).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(response)
}

struct WatchStream {
    app: Shared,
    first: std::vec::IntoIter<(&'static str, Value)>,
    initial_end: Option<Value>,
    rx: tokio::sync::mpsc::Receiver<(&'static str, Value)>,
    deadline: Instant,
    bookmarks: bool,
    next_bookmark: Instant,
    kind: &'static str,
    api_version: String,
    done: bool,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut data = json!({"type": kind, "object": object}).to_string().into_bytes();
    data.push(b'\n');
    Bytes::from(data)
}

/// How often a watch with `allowWatchBookmarks` gets a BOOKMARK.
const BOOKMARK_EVERY: Duration = Duration::from_secs(5);

async fn next_line(mut s: WatchStream) -> Option<(Result<Bytes, Infallible>, WatchStream)> {
    if s.done {
        return None;
    }
    if let Some((kind, object)) = s.first.next() {
        return Some((Ok(line(kind, &object)), s));
    }
    if let Some(end) = s.initial_end.take() {
        return Some((Ok(line("BOOKMARK", &end)), s));
    }
    let wake = if s.bookmarks { s.next_bookmark.min(s.deadline) } else { s.deadline };
    tokio::select! {
        event = s.rx.recv() => event.map(|(kind, object)| (Ok(line(kind, &object)), s)),
        _ = tokio::time::sleep_until(wake.into()) => {
            if Instant::now() >= s.deadline {
                return None;
            }
            s.next_bookmark = Instant::now() + BOOKMARK_EVERY;
            let rv = s.app.lock().store.revision().to_string();
            let bookmark = json!({"kind": s.kind, "apiVersion": s.api_version, "metadata": {"resourceVersion": rv}});
            Some((Ok(line("BOOKMARK", &bookmark)), s))
        }
    }
}

fn watch(
    app: &Shared,
    resource: &Resource,
    info: &RequestInfo,
    query: &[(String, String)],
) -> Result<Response, ApiError> {
    let (labels, mut fields) = selectors(resource, query)?;
    if !info.name.is_empty() {
        fields = FieldSelector::parse(resource.plural, &format!("metadata.name={}", info.name))?;
    }
    let send_initial = param(query, "sendInitialEvents") == Some("true");
    let bookmarks = param(query, "allowWatchBookmarks") == Some("true");
    // A server without the WatchList feature refuses streaming lists
    // (staging/src/k8s.io/apimachinery/pkg/apis/meta/internalversion/validation `ValidateListOptions`).
    if send_initial && !app.config.watch_list {
        return Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            &[crate::status::FieldError::forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            )],
        ));
    }
    if send_initial && (param(query, "resourceVersionMatch") != Some("NotOlderThan") || !bookmarks) {
        return Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            &[crate::status::FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )],
        ));
    }
    let from = match param(query, "resourceVersion") {
        None | Some("") => None,
        Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "invalid resource version: strconv.ParseUint: parsing \"{rv}\": invalid syntax"
            ))
        })?),
    };
    let timeout = param(query, "timeoutSeconds").and_then(|t| t.parse::<u64>().ok()).unwrap_or(1800);
    let spec = WatchSpec {
        resource: resource.key(),
        namespace: (!info.namespace.is_empty() && resource.namespaced).then(|| info.namespace.clone()),
        labels,
        fields,
    };
    let mut state = app.lock();
    let (first, rx, initial_end) = match state.store.watch(spec, if send_initial { None } else { from }) {
        Ok((first, rx)) => {
            let end = send_initial.then(|| {
                json!({"kind": resource.kind, "apiVersion": resource.api_version(),
                       "metadata": {"resourceVersion": state.store.revision().to_string(),
                                    "annotations": {"k8s.io/initial-events-end": "true"}}})
            });
            (first, rx, end)
        }
        Err(error) => {
            let (_tx, rx) = tokio::sync::mpsc::channel(1);
            (vec![("ERROR", error.body)], rx, None)
        }
    };
    drop(state);
    let expired = first.first().is_some_and(|(kind, _)| *kind == "ERROR");
    let stream = WatchStream {
        app: app.clone(),
        first: first.into_iter(),
        initial_end,
        rx,
        deadline: Instant::now() + Duration::from_secs(timeout),
        bookmarks,
        next_bookmark: Instant::now() + BOOKMARK_EVERY,
        kind: resource.kind,
        api_version: resource.api_version(),
        done: false,
    };
    let stream = futures::stream::unfold(stream, move |mut s| async move {
        if expired && s.first.len() == 0 {
            s.done = true;
        }
        let first_pending = s.first.len() > 0;
        let result = next_line(s).await;
        result.map(|(item, mut s)| {
            if expired && first_pending && s.first.len() == 0 {
                s.done = true;
            }
            (item, s)
        })
    });
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

/// The container a request about pod `name` is for (`pods/log`, `pods/exec`): the one named
/// by `container`, or the pod's only one; as the API server answers otherwise.
pub(crate) fn container_of(pod: &Value, name: &str, requested: Option<&str>) -> Result<String, ApiError> {
    let containers: Vec<String> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| text(c, "/name").to_string())
        .collect();
    match requested {
        Some(container) if !container.is_empty() => match containers.iter().any(|c| c == container) {
            true => Ok(container.to_string()),
            false => Err(ApiError::bad_request(format!("container {container} is not valid for pod {name}"))),
        },
        _ if containers.len() == 1 => Ok(containers[0].clone()),
        _ => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}
