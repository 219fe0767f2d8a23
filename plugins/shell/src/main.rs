//! The `knotless-executor-shell` binary: logs to stderr and serves the protocol on stdin and
//! stdout.

use std::process::ExitCode;

use knotless_executor_shell::ShellExecutor;
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<ExitCode> {
    // Stdout carries protocol frames only: every log line goes to stderr.
    let filter = EnvFilter::try_from_env("KNOTLESS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // A closed stderr (the runner died) drops log lines instead of panicking the executor.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_env_filter(filter)
        .init();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The protocol's loop runs as a task: a wake-up of `block_on`'s own future costs a write
    // to the runtime's eventfd and one more `epoll_wait`, once a step.
    runtime.block_on(async { tokio::spawn(knotless_protocol::sdk::serve(ShellExecutor::default())).await })??;
    Ok(ExitCode::SUCCESS)
}
