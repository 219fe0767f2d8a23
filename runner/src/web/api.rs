//! `/api/`: the same data as the pages, as JSON: the records `checks --json` prints (the same
//! bytes, a page of the newest at a time), a check's record, a branch's merge queue record, the
//! repositories and the runner.

use axum::Router;
use axum::extract::{Path, Query, State};
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

/// How many checks a page of `/api/repositories/KEY/checks` holds by default, and at most.
pub const PER_PAGE: usize = 100;
/// See [`PER_PAGE`].
pub const MAX_PER_PAGE: usize = 1000;

/// `?page=N&per_page=M`: page 1 holds the newest checks.
#[derive(Debug, serde::Deserialize)]
struct Paging {
    page: Option<usize>,
    per_page: Option<usize>,
}

/// The range of `total` records (oldest first) that page `page` of `per_page` holds, counted
/// from the newest; and whether an older page follows.
fn page_range(total: usize, page: usize, per_page: usize) -> (std::ops::Range<usize>, bool) {
    let newest_skipped = (page - 1).saturating_mul(per_page).min(total);
    let end = total - newest_skipped;
    let start = end.saturating_sub(per_page);
    (start..end, start > 0)
}

async fn checks(
    State(app): State<App>,
    Path(key): Path<String>,
    paging: Result<Query<Paging>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(paging)) = paging else {
        return (axum::http::StatusCode::BAD_REQUEST, "page and per_page are positive whole numbers\n").into_response();
    };
    let page = paging.page.unwrap_or(1);
    let per_page = paging.per_page.unwrap_or(PER_PAGE);
    if page == 0 || per_page == 0 || per_page > MAX_PER_PAGE {
        let why = format!("page counts from 1, and per_page from 1 to {MAX_PER_PAGE}\n");
        return (axum::http::StatusCode::BAD_REQUEST, why).into_response();
    }
    let link_key = key.clone();
    let work = move || {
        app.view.repository(&key)?;
        let records = app.view.records(&key);
        let (range, older) = page_range(records.len(), page, per_page);
        let shown: Vec<&CheckRecord> = records[range].iter().map(|record| record.as_ref()).collect();
        Some((pretty(&shown)?, records.len(), older))
    };
    match tokio::task::spawn_blocking(work).await.ok().flatten() {
        Some((text, total, older)) => {
            let mut response = ([(header::CONTENT_TYPE, "application/json")], text).into_response();
            let headers = response.headers_mut();
            headers.insert("x-total-count", total.into());
            if older {
                let next = format!(
                    "</api/repositories/{link_key}/checks?page={}&per_page={per_page}>; rel=\"next\"",
                    page + 1
                );
                if let Ok(value) = header::HeaderValue::from_str(&next) {
                    headers.insert(header::LINK, value);
                }
            }
            response
        }
        None => not_found_response(),
    }
}

/// A check record, with its commit's subject and author (`commit_info`) when the mirror
/// holds it (a pull's head's, for a pull).
async fn check(State(app): State<App>, Path((key, run)): Path<(String, String)>) -> Response {
    answer(move || {
        let record = app.view.check(&key, &run)?;
        let mut value = serde_json::to_value(&record).ok()?;
        let shown = record.target.head.as_deref().unwrap_or(&record.target.commit);
        if let Some(info) = app.view.commits(&key, &[shown]).remove(shown) {
            value["commit_info"] = serde_json::json!({
                "subject": info.subject,
                "author": info.author,
                "authored_at": info.authored_ms,
            });
        }
        pretty(&value)
    })
    .await
}

async fn queue(State(app): State<App>, Path((key, branch)): Path<(String, String)>) -> Response {
    answer(move || pretty(&app.view.queue(&key, &branch)?)).await
}

async fn runner(State(app): State<App>) -> Response {
    answer(move || pretty(&app.view.runner())).await
}

#[cfg(test)]
mod tests {
    use super::page_range;

    #[test]
    fn pages_count_from_the_newest() {
        assert_eq!(page_range(250, 1, 100), (150..250, true));
        assert_eq!(page_range(250, 2, 100), (50..150, true));
        assert_eq!(page_range(250, 3, 100), (0..50, false));
        assert_eq!(page_range(250, 4, 100), (0..0, false));
        assert_eq!(page_range(100, 1, 100), (0..100, false));
        assert_eq!(page_range(0, 1, 100), (0..0, false));
        assert_eq!(page_range(10, usize::MAX, usize::MAX), (0..0, false));
    }
}
