//! The `knotless-executor-docker` binary: logs to stderr and serves the protocol on stdin and stdout.

use knotless_executor_docker::DockerExecutor;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    knotless_protocol::sdk::init_logging();
    knotless_protocol::sdk::serve(DockerExecutor::default()).await
}
