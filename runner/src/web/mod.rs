//! The status page (`--http ADDR`): a read-only, server-rendered view of what the daemon keeps
//! under its state folder (repositories, checks, logs, outputs, merge queues, the runner), with
//! the same data as JSON under `/api/`. Pages are maud templates, so every value is escaped;
//! the only script is the live log's, which streams the masked log over Server-Sent Events.
//!
//! It reads only through [`view::View`]; it never writes, and serves no file but a check's
//! masked log and the outputs its record lists. It also serves the daemon's metrics at
//! `/metrics`, behind the same credentials as the pages; [`start_metrics`] serves them alone on
//! a listener of their own (`--metrics`), without credentials.

mod api;
mod auth;
mod format;
mod live;
mod log_view;
pub mod outputs;
mod pages;
mod routes;
mod scrape;
mod terminal;
pub mod view;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::http::{HeaderValue, header};
use tokio_util::sync::CancellationToken;

pub use auth::TOKEN_MIN;
pub use view::{RunnerSummary, View};

/// The variable of the runner's environment (its env file) that holds the token of a public
/// page.
pub const TOKEN_VARIABLE: &str = "KNOTLESS_HTTP_TOKEN";

/// The Content-Security-Policy of every page: its own stylesheet and script, images and the
/// live log's stream from itself, nothing else.
pub const PAGE_CSP: &str = "default-src 'none'; img-src 'self'; style-src 'self'; script-src 'self'; \
                            connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// How the page is served.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// Where it listens (port 0: a free port, logged).
    pub addr: SocketAddr,
    /// Whether a non-loopback address is allowed (`--http-public`).
    pub public: bool,
    /// The token a public page asks for.
    pub token: Option<String>,
    /// `--http-trusted-proxy`: the TLS-terminating proxy whose `X-Forwarded-Proto: https`
    /// makes the session cookie `Secure`.
    pub trusted_proxy: Option<std::net::IpAddr>,
}

impl WebConfig {
    /// Refuses a page that would be open to the network without a token.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.addr.ip().is_loopback() && !self.public {
            bail!(
                "--http {}: not a loopback address; a status page reachable from the network needs \
                 --http-public and a token in {TOKEN_VARIABLE} (the env file)",
                self.addr
            );
        }
        if self.public {
            match &self.token {
                None => bail!(
                    "--http-public needs a token: set {TOKEN_VARIABLE} in the runner's env file \
                     (at least {TOKEN_MIN} characters, e.g. `openssl rand -hex 32`)"
                ),
                Some(token) if token.trim().len() < TOKEN_MIN || token.trim() != token => bail!(
                    "{TOKEN_VARIABLE} is too short or has spaces around it: give at least \
                     {TOKEN_MIN} characters (e.g. `openssl rand -hex 32`)"
                ),
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// The shared state of the handlers.
#[derive(Clone)]
struct App {
    view: Arc<View>,
    auth: Arc<auth::Auth>,
    trusted_proxy: Option<std::net::IpAddr>,
    /// The daemon's metrics, served at `/metrics` when given.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Cancelled when the page stops: live logs end.
    stopping: CancellationToken,
}

/// Stops what [`start_with_metrics`] and [`start_metrics`] serve: no new connection is taken,
/// each open one ends once its response in flight is written (a live log ends at once), and
/// [`Stop::stop`] waits for them, up to a grace.
#[derive(Clone, Default)]
pub struct Stop {
    token: CancellationToken,
    connections: tokio_util::task::TaskTracker,
}

impl Stop {
    /// Stops serving and waits, at most `grace`, for the open connections to end; says
    /// whether they all did.
    pub async fn stop(&self, grace: Duration) -> bool {
        self.token.cancel();
        self.connections.close();
        tokio::time::timeout(grace, self.connections.wait()).await.is_ok()
    }
}

/// What one client may hold of the page.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a client may take to send a request's headers, counted from the connection's
    /// opening or from the end of the last response: a connection that sends nothing, or
    /// dribbles a header line at a time, is closed then.
    pub header_timeout: Duration,
    /// The most connections served at once; more wait in the listen queue until one closes.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { header_timeout: Duration::from_secs(10), max_connections: 256 }
    }
}

/// Binds the page's address and serves it in the background; returns the bound address (also
/// logged).
pub async fn start(config: WebConfig, view: View) -> anyhow::Result<SocketAddr> {
    start_with(config, view, Limits::default()).await
}

/// [`start`] with `limits`.
pub async fn start_with(config: WebConfig, view: View, limits: Limits) -> anyhow::Result<SocketAddr> {
    start_with_metrics(config, view, limits, None, &Stop::default()).await
}

/// [`start_with`], also serving `metrics` at `/metrics`, behind the page's credentials, until
/// `stop`.
pub async fn start_with_metrics(
    config: WebConfig,
    view: View,
    limits: Limits,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    stop: &Stop,
) -> anyhow::Result<SocketAddr> {
    config.check()?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("--http {}: cannot listen there", config.addr))?;
    let addr = listener.local_addr().context("the status page's address")?;
    let token = if config.public { config.token } else { None };
    let view = Arc::new(view.hiding_host_paths(config.public));
    // Every repository's records read once now, so that no request pays for the first read.
    let warming = Arc::clone(&view);
    tokio::task::spawn_blocking(move || {
        for repository in warming.repositories() {
            warming.records(&repository.key);
        }
    });
    let app = App {
        view,
        auth: Arc::new(auth::Auth::new(token)),
        trusted_proxy: config.trusted_proxy,
        metrics,
        stopping: stop.token.clone(),
    };
    let router = routes::router(app);
    tracing::info!(http = %addr, "status page at http://{addr}/");
    tokio::spawn(serve(listener, router, limits, "the status page", stop.clone()));
    Ok(addr)
}

/// Binds `addr` and serves `metrics` there in the background, at `/metrics` and nothing else,
/// to anyone who can connect, within `limits`; returns the bound address (also logged).
pub async fn start_metrics(
    addr: SocketAddr,
    metrics: Arc<crate::metrics::Metrics>,
    limits: Limits,
    stop: &Stop,
) -> anyhow::Result<SocketAddr> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("--metrics {addr}: cannot listen there"))?;
    let addr = listener.local_addr().context("the metrics' address")?;
    tracing::info!(metrics = %addr, "metrics at http://{addr}/metrics");
    tokio::spawn(serve(listener, scrape::router(metrics), limits, "the metrics listener", stop.clone()));
    Ok(addr)
}

/// Serves HTTP/1.1 on `listener`: at most `limits.max_connections` at once (the others wait to
/// be accepted), each closed when a request's headers take longer than `limits.header_timeout`
/// or it stays idle that long between requests (hyper's `header_read_timeout` runs in both).
async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Limits,
    what: &'static str,
    stop: Stop,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(limits.header_timeout);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot,
            () = stop.token.cancelled() => return,
        };
        let Ok(slot) = slot else { return };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.token.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, say: wait rather than spin, and leave the rest of the
                // process what it has.
                tracing::warn!("{what} cannot accept a connection: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        // Each request knows the address it came from (`ConnectInfo`).
        let routes = router.clone().layer(axum::Extension(axum::extract::ConnectInfo(peer)));
        let service = hyper_util::service::TowerToHyperService::new(routes);
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).with_upgrades();
        let stopping = stop.token.clone();
        stop.connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = stopping.cancelled() => {
                    // The response in flight is written, then the connection ends.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = ended {
                tracing::debug!("a connection to {what} ended: {error}");
            }
            drop(slot);
        });
    }
}

/// Sets the headers every response carries: no sniffing, no framing, no referrer, and the
/// page's policy on whatever sets none of its own.
fn harden(headers: &mut axum::http::HeaderMap) {
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.entry(header::CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(PAGE_CSP));
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
}

#[cfg(test)]
mod tests;
