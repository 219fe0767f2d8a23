//! The `knotless-executor-shell` binary: logs to stderr and serves the protocol on stdin and
//! stdout.

fn main() -> anyhow::Result<std::process::ExitCode> {
    knotless_protocol::sdk::main(knotless_executor_shell::ShellExecutor::default())
}
