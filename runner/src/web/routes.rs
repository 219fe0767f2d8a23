//! The page's routes: the HTML pages, the log as text and as a live stream, outputs, the
//! one-time login links, static files, `/api/`, and the daemon's metrics (`/metrics`). Anything
//! not found, or not this runner's to show, is 404.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use futures::StreamExt as _;
use maud::Markup;
use serde::Deserialize;

use super::outputs;
use super::pages::{self, ShownOutput};
use super::view::{CommitInfo, View};
use super::{App, api, auth, live};
use crate::checks::{CheckRecord, now_ms};

const STYLE: &str = include_str!("static/style.css");
const SCRIPT: &str = include_str!("static/page.js");
const ICON: &str = include_str!("static/favicon.svg");

/// Every route, behind the credentials check and the hardening headers.
pub(super) fn router(app: App) -> Router {
    let guarded = Router::new()
        .route("/", get(index))
        .route("/runner", get(runner))
        .route("/repositories/{key}", get(repository))
        .route("/repositories/{key}/checks/{run}", get(check))
        .route("/repositories/{key}/checks/{run}/log", get(log_text))
        .route("/repositories/{key}/checks/{run}/log/live", get(log_live))
        .route("/repositories/{key}/checks/{run}/outputs/{*path}", get(output))
        .route("/repositories/{key}/queue/{*branch}", get(queue))
        .route("/login-link", post(login_link))
        .route("/metrics", get(metrics))
        .merge(api::router())
        .route("/static/style.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }))
        .route(
            "/static/page.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT) }),
        )
        .route("/static/favicon.svg", get(icon))
        .route("/favicon.ico", get(icon))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard));
    Router::new()
        .route("/login/{link}", get(login))
        .merge(guarded)
        .layer(axum::middleware::map_response(|mut response: Response| async move {
            super::harden(response.headers_mut());
            response
        }))
        .with_state(app)
}

/// The page's icon (also at `/favicon.ico`, where browsers look when a page names none).
async fn icon() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "image/svg+xml"), (header::CACHE_CONTROL, "max-age=86400")], ICON)
}

/// Lets through what the credentials allow; 401 otherwise.
async fn guard(State(app): State<App>, request: Request, next: Next) -> Response {
    if app.auth.allows(request.headers()) {
        return next.run(request).await;
    }
    let mut response =
        (StatusCode::UNAUTHORIZED, "a token or a session is needed: see docs/guide/status-page.md\n").into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The subjects and authors of the first `count` commits `records` ran on, by the commit each
/// ran on: a pull's head's for a pull's merge (what its author wrote).
fn commits_of<'a>(
    view: &View,
    key: &str,
    records: impl Iterator<Item = &'a CheckRecord>,
    count: usize,
) -> HashMap<String, CommitInfo> {
    let mut shown: Vec<(&str, &str)> = Vec::new();
    for record in records {
        let commit = record.target.commit.as_str();
        if shown.iter().any(|(ran, _)| *ran == commit) {
            continue;
        }
        if shown.len() == count {
            break;
        }
        shown.push((commit, record.target.head.as_deref().unwrap_or(commit)));
    }
    let hashes: Vec<&str> = shown.iter().map(|(_, hash)| *hash).collect();
    let found = view.commits(key, &hashes);
    shown.into_iter().filter_map(|(ran, hash)| Some((ran.to_string(), found.get(hash)?.clone()))).collect()
}

/// Runs a read of the view off the async workers.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, StatusCode> {
    tokio::task::spawn_blocking(work).await.map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
}

pub(super) fn not_found_response() -> Response {
    (StatusCode::NOT_FOUND, pages::not_found()).into_response()
}

async fn not_found() -> Response {
    not_found_response()
}

fn page(markup: Option<Markup>) -> Response {
    match markup {
        Some(markup) => markup.into_response(),
        None => not_found_response(),
    }
}

async fn index(State(app): State<App>) -> Result<Response, StatusCode> {
    blocking(move || {
        let view = &app.view;
        let repositories = view.repositories();
        let records: Vec<_> = repositories.iter().map(|repository| view.records(&repository.key)).collect();
        let heads: Vec<_> = repositories
            .into_iter()
            .zip(&records)
            .map(|(repository, records)| {
                let heads: Vec<&CheckRecord> = records
                    .iter()
                    .map(|record| record.as_ref())
                    .filter(|record| repository.seen.branches.values().any(|commit| *commit == record.target.commit))
                    .collect();
                (repository, heads)
            })
            .collect();
        pages::index(&view.runner(), &heads).into_response()
    })
    .await
}

async fn runner(State(app): State<App>) -> Result<Response, StatusCode> {
    blocking(move || pages::runner(&app.view.runner()).into_response()).await
}

async fn repository(State(app): State<App>, Path(key): Path<String>) -> Result<Response, StatusCode> {
    blocking(move || {
        let view = &app.view;
        let repository = view.repository(&key)?;
        let records = view.records(&key);
        let unreadable = view.unreadable(&key);
        let commits = commits_of(view, &key, records.iter().rev().map(|record| record.as_ref()), pages::RECENT_COMMITS);
        let queues = view.queue_branches(&key);
        Some(pages::repository(&repository, &records, &unreadable, &queues, &commits, now_ms()))
    })
    .await
    .map(page)
}

async fn check(State(app): State<App>, Path((key, run)): Path<(String, String)>) -> Result<Response, StatusCode> {
    blocking(move || {
        let view = &app.view;
        let record = view.check(&key, &run)?;
        let dir = view.outputs_dir(&record);
        // Only the first few outputs that are not images are looked into for a preview: a
        // page stays small and quick whatever a run left.
        let mut looked_into = 0;
        let shown: Vec<ShownOutput> = record
            .outputs
            .iter()
            .filter(|output| outputs::find(&record, &output.path).is_some())
            .map(|output| {
                let (kind, preview) = match outputs::image_type(&output.path) {
                    Some(media) => (outputs::Kind::Image(media), None),
                    None if looked_into < outputs::MAX_PREVIEWS => {
                        looked_into += 1;
                        outputs::classify(&dir, output)
                    }
                    None => (outputs::Kind::Other, None),
                };
                ShownOutput { path: output.path.clone(), bytes: output.bytes, kind, preview }
            })
            .collect();
        let bytes = std::fs::read(view.log_path(&record)).unwrap_or_default();
        // A running log shows its whole lines; the stream goes on from there.
        let (shown_bytes, live_from) = if record.status.is_final() {
            (&bytes[..], None)
        } else {
            let whole = bytes.iter().rposition(|&byte| byte == b'\n').map_or(0, |end| end + 1);
            (&bytes[..whole], Some(whole as u64))
        };
        let commits = commits_of(view, &key, std::iter::once(&record), 1);
        let commit = commits.get(&record.target.commit);
        Some(pages::check(&record, commit, &shown, shown_bytes, live_from, now_ms()))
    })
    .await
    .map(page)
}

async fn log_text(State(app): State<App>, Path((key, run)): Path<(String, String)>) -> Result<Response, StatusCode> {
    blocking(move || {
        let record = app.view.check(&key, &run)?;
        let bytes = std::fs::read(app.view.log_path(&record)).unwrap_or_default();
        Some(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], crate::printable::log(&bytes)).into_response())
    })
    .await
    .map(|response| response.unwrap_or_else(not_found_response))
}

#[derive(Deserialize)]
struct From {
    from: Option<u64>,
}

async fn log_live(
    State(app): State<App>,
    Path((key, run)): Path<(String, String)>,
    Query(query): Query<From>,
    headers: HeaderMap,
) -> Result<Response, StatusCode> {
    let view = Arc::clone(&app.view);
    let found = blocking(move || view.check(&key, &run).map(|record| (view.log_path(&record), record))).await?;
    let Some((log, record)) = found else { return Ok(not_found_response()) };
    // A browser that reconnects says where it was.
    let resumed = headers.get("last-event-id").and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    let offset = resumed.or(query.from).unwrap_or(0);
    let stream = live::events(Arc::clone(&app.view), record.repository_key, record.run_id, log, offset)
        .take_until(app.stopping.clone().cancelled_owned());

    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

async fn output(
    State(app): State<App>,
    Path((key, run, path)): Path<(String, String, String)>,
) -> Result<Response, StatusCode> {
    blocking(move || {
        let view = &app.view;
        let record = view.check(&key, &run)?;
        let listed = outputs::find(&record, &path)?;
        let (file, length) = outputs::open(&view.outputs_dir(&record), listed)?;
        let media = outputs::image_type(&listed.path);
        let mut response =
            Response::new(Body::from_stream(tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file))));
        let headers = response.headers_mut();
        let content_type = media.unwrap_or("application/octet-stream");
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(outputs::OUTPUT_CSP));
        let disposition = outputs::disposition(media.is_some(), &listed.path);
        headers.insert(header::CONTENT_DISPOSITION, HeaderValue::from_str(&disposition).ok()?);
        Some(response)
    })
    .await
    .map(|response| response.unwrap_or_else(not_found_response))
}

async fn queue(State(app): State<App>, Path((key, branch)): Path<(String, String)>) -> Result<Response, StatusCode> {
    blocking(move || {
        let view = &app.view;
        let queue = view.queue(&key, &branch)?;
        let records = view.records(&key);
        let by_run: HashMap<&str, &CheckRecord> =
            records.iter().map(|record| (record.run_id.as_str(), record.as_ref())).collect();
        Some(pages::queue(&key, &queue, &by_run))
    })
    .await
    .map(page)
}

/// `GET /metrics`: the daemon's metrics, when the page serves them.
async fn metrics(State(app): State<App>) -> Response {
    match &app.metrics {
        Some(metrics) => super::scrape::answer(metrics),
        None => not_found_response(),
    }
}

/// `POST /login-link` with the token: a link that opens a session once.
async fn login_link(State(app): State<App>, headers: HeaderMap) -> Response {
    if !app.auth.has_token(&headers) {
        return (StatusCode::FORBIDDEN, "only the token makes login links\n").into_response();
    }
    match app.auth.new_link() {
        Ok(link) => format!("/login/{link}\n").into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot make a link: {error}\n")).into_response(),
    }
}

/// `GET /login/LINK`: a fresh, unused link sets the session cookie and goes home. The cookie is
/// `Secure` when the request came through the trusted proxy over HTTPS.
async fn login(
    State(app): State<App>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    Path(link): Path<String>,
) -> Response {
    let Some(session) = app.auth.redeem(&link) else { return not_found_response() };
    let over_https = headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"));
    let secure = if over_https && app.trusted_proxy == Some(peer.ip()) { "; Secure" } else { "" };
    let cookie = format!(
        "{}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        auth::COOKIE,
        auth::SESSION_LIFETIME.as_secs()
    );
    let mut response = Redirect::to("/").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
