//! The conformance suite of `knotless-run plugin check` (the `knotless-conformance` crate), with
//! the assertion an executor's own test makes of it.

pub use knotless_conformance::*;
use knotless_host::HostConfig;

/// Runs the whole suite with `config` (see [`program`]), writing each case's line to stderr as
/// `plugin check` prints it, and panics naming every case that did not pass.
pub async fn assert_passes(config: HostConfig) -> Vec<Check> {
    let program = config.process.path.display().to_string();
    let checks = run(config, |check| eprintln!("{}", report_line(check))).await;
    if let Some(failures) = not_passed(&checks) {
        panic!("{program} does not pass the conformance suite:\n{failures}");
    }
    checks
}
