//! The status page's flags (`--http`, `--http-public`) and its token from the environment,
//! validated into the page's configuration before the daemon starts anything, and the metrics'
//! own listener (`--metrics`).

use std::net::SocketAddr;

use clap::Args;

use crate::web::{TOKEN_VARIABLE, WebConfig};

/// The status page's flags.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Serve a read-only status page at ADDR (e.g. 127.0.0.1:8080 or localhost:8080; port 0
    /// picks a free port, logged); loopback addresses only, unless --http-public.
    #[arg(long, value_name = "ADDR", value_parser = listen_address)]
    pub http: Option<SocketAddr>,
    /// Allow a non-loopback --http address; every request then needs the token of
    /// KNOTLESS_HTTP_TOKEN (the env file) or a session opened by a one-time link.
    #[arg(long, requires = "http")]
    pub http_public: bool,
    /// The address of the TLS-terminating proxy in front of the page: a login through it with
    /// `X-Forwarded-Proto: https` gets a `Secure` session cookie.
    #[arg(long, value_name = "IP", requires = "http")]
    pub http_trusted_proxy: Option<std::net::IpAddr>,
    /// Serve the daemon's metrics at http://ADDR/metrics (Prometheus text format; e.g.
    /// 127.0.0.1:9100 or localhost:9100; port 0 picks a free port, logged), with no token: they
    /// name no repository, workflow or path. The page (--http) serves them too.
    #[arg(long, value_name = "ADDR", value_parser = listen_address)]
    pub metrics: Option<SocketAddr>,
}

impl HttpArgs {
    /// The page's configuration, when one is asked for; refused when it would be open to the
    /// network without a token.
    pub fn config(&self) -> anyhow::Result<Option<WebConfig>> {
        let Some(addr) = self.http else { return Ok(None) };
        let token = std::env::var(TOKEN_VARIABLE).ok().filter(|token| !token.is_empty());
        let config = WebConfig { addr, public: self.http_public, token, trusted_proxy: self.http_trusted_proxy };
        config.check()?;
        Ok(Some(config))
    }
}

/// An address to listen at: `IP:PORT`, or `HOST:PORT` resolved now (its first IPv4 address,
/// else its first).
fn listen_address(given: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = given.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if given.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
        return Err(format!("{given:?} is not HOST:PORT or IP:PORT (for example 127.0.0.1:8080 or localhost:8080)"));
    }
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(given)
        .map_err(|error| format!("cannot resolve {given:?}: {error}"))?
        .collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{given:?} resolves to no address"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_an_ip_and_port_or_a_host_name_and_port() {
        assert_eq!(listen_address("127.0.0.1:8080"), Ok("127.0.0.1:8080".parse().expect("addr")));
        assert_eq!(listen_address("[::1]:0"), Ok("[::1]:0".parse().expect("addr")));
        let localhost = listen_address("localhost:8080").expect("localhost resolves");
        assert!(localhost.ip().is_loopback() && localhost.port() == 8080, "{localhost}");
        for bad in ["localhost", "8080", ":8080", "localhost:http", "localhost:65536"] {
            let error = listen_address(bad).expect_err(bad);
            assert!(error.contains("HOST:PORT"), "{bad}: {error}");
        }
        let error = listen_address("no-such-host.invalid:8080").expect_err("unresolvable");
        assert!(error.contains("cannot resolve \"no-such-host.invalid:8080\""), "{error}");
    }
}
