//! The status page's flags (`--http`, `--http-public`) and its token from the environment,
//! validated into the page's configuration before the daemon starts anything.

use std::net::SocketAddr;

use clap::Args;

use crate::web::{TOKEN_VARIABLE, WebConfig};

/// The status page's flags.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Serve a read-only status page at ADDR (e.g. 127.0.0.1:8080; port 0 picks a free port,
    /// logged); loopback addresses only, unless --http-public.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Allow a non-loopback --http address; every request then needs the token of
    /// KNOTLESS_HTTP_TOKEN (the env file) or a session opened by a one-time link.
    #[arg(long, requires = "http")]
    pub http_public: bool,
}

impl HttpArgs {
    /// The page's configuration, when one is asked for; refused when it would be open to the
    /// network without a token.
    pub fn config(&self) -> anyhow::Result<Option<WebConfig>> {
        let Some(addr) = self.http else { return Ok(None) };
        let token = std::env::var(TOKEN_VARIABLE).ok().filter(|token| !token.is_empty());
        let config = WebConfig { addr, public: self.http_public, token };
        config.check()?;
        Ok(Some(config))
    }
}

/// What the runner page shows of this runner: its flags and its executor's handshake.
pub async fn summary(args: &super::daemon::DaemonArgs, host: &crate::host::ExecutorHost) -> crate::web::RunnerSummary {
    let handshake = host.info().await.ok();
    crate::web::RunnerSummary {
        runner_id: host.config().runner.id.clone(),
        executor_name: host.name().to_string(),
        executor: handshake.as_ref().map(|info| info.executor.clone()),
        protocol_version: handshake.as_ref().map(|info| info.protocol_version),
        capabilities: handshake.map(|info| info.capabilities),
        concurrency: args.concurrency.max(1),
        poll_seconds: args.poll.max(1),
        pulls: args.pulls,
        queue: args.queue,
        started_at: crate::checks::now_ms(),
    }
}
