//! `/api/`: the same data as the pages, as JSON: the records `checks --json` prints (the same
//! bytes), a check's record, a branch's merge queue record, the repositories and the runner.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use super::App;
use super::routes::not_found_response;
use crate::checks::CheckRecord;

pub(super) fn router() -> Router<App> {
    Router::new()
        .route("/api/repositories", get(repositories))
        .route("/api/repositories/{key}/checks", get(checks))
        .route("/api/repositories/{key}/checks/{run}", get(check))
        .route("/api/repositories/{key}/queue/{*branch}", get(queue))
        .route("/api/runner", get(runner))
        .route("/api/{*rest}", get(|| async { not_found_response() }))
}

/// Pretty JSON and a newline, as `checks --json` prints it.
fn pretty<T: Serialize>(value: &T) -> Option<String> {
    let mut text = serde_json::to_string_pretty(value).ok()?;
    text.push('\n');
    Some(text)
}

/// Reads and encodes off the async workers; 404 when there is nothing.
async fn answer(work: impl FnOnce() -> Option<String> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(work).await.ok().flatten() {
        Some(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        None => not_found_response(),
    }
}

async fn repositories(State(app): State<App>) -> Response {
    answer(move || pretty(&app.view.repositories())).await
}

async fn checks(State(app): State<App>, Path(key): Path<String>) -> Response {
    answer(move || {
        app.view.repository(&key)?;
        let records = app.view.records(&key);
        pretty(&records.iter().map(|record| record.as_ref()).collect::<Vec<&CheckRecord>>())
    })
    .await
}

async fn check(State(app): State<App>, Path((key, run)): Path<(String, String)>) -> Response {
    answer(move || pretty(&app.view.check(&key, &run)?)).await
}

async fn queue(State(app): State<App>, Path((key, branch)): Path<(String, String)>) -> Response {
    answer(move || pretty(&app.view.queue(&key, &branch)?)).await
}

async fn runner(State(app): State<App>) -> Response {
    answer(move || pretty(&app.view.runner())).await
}
