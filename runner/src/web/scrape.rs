//! `GET /metrics`: the daemon's metrics in the Prometheus text format, on the status page
//! (behind its credentials) and alone on the `--metrics` listener.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::metrics::{CONTENT_TYPE, Metrics};

/// The metrics, encoded now.
pub(super) fn answer(metrics: &Metrics) -> Response {
    match metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "the metrics cannot be encoded\n").into_response(),
    }
}

/// The `--metrics` listener's routes: `/metrics`, and 404 for anything else.
pub(super) fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(|State(metrics): State<Arc<Metrics>>| async move { answer(&metrics) }))
        .fallback(|| async { (StatusCode::NOT_FOUND, "only /metrics is served here\n") })
        .layer(axum::middleware::map_response(|mut response: Response| async move {
            super::harden(response.headers_mut());
            response
        }))
        .with_state(metrics)
}
