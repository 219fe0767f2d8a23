//! The `knotless-executor-docker` binary: logs to stderr and serves the protocol on stdin and stdout.

use knotless_executor_docker::DockerExecutor;

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let executor = DockerExecutor::default();
    if let Some(code) = knotless_protocol::sdk::command_line(&executor) {
        return Ok(code);
    }
    knotless_protocol::sdk::init_logging();
    knotless_protocol::sdk::serve(executor).await?;
    Ok(std::process::ExitCode::SUCCESS)
}
