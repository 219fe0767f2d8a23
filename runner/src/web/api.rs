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
fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_string_pretty(value) {
        Ok(mut text) => {
            text.push('\n');
            ([(header::CONTENT_TYPE, "application/json")], text).into_response()
        }
        Err(_) => not_found_response(),
    }
}

async fn off<T: Send + 'static>(work: impl FnOnce() -> Option<T> + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok().flatten()
}

fn answer<T: Serialize>(value: Option<T>) -> Response {
    value.as_ref().map_or_else(not_found_response, json)
}

async fn repositories(State(app): State<App>) -> Response {
    answer(off(move || Some(app.view.repositories())).await)
}

async fn checks(State(app): State<App>, Path(key): Path<String>) -> Response {
    let records = off(move || {
        app.view.repository(&key)?;
        let records = app.view.records(&key);
        Some(records.iter().map(|record| record.as_ref().clone()).collect::<Vec<CheckRecord>>())
    })
    .await;
    answer(records)
}

async fn check(State(app): State<App>, Path((key, run)): Path<(String, String)>) -> Response {
    answer(off(move || app.view.check(&key, &run)).await)
}

async fn queue(State(app): State<App>, Path((key, branch)): Path<(String, String)>) -> Response {
    answer(off(move || app.view.queue(&key, &branch)).await)
}

async fn runner(State(app): State<App>) -> Response {
    answer(off(move || Some(app.view.runner())).await)
}
