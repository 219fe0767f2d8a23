//! The executor's program on a command line: it names its version and the protocol versions
//! it speaks, and refuses any argument the runner would never give it, without serving.

use std::process::Command;

const PROGRAM: &str = env!("CARGO_BIN_EXE_knotless-executor-shell");

#[test]
fn version_names_the_executor_its_version_and_the_protocol_versions() {
    let output = Command::new(PROGRAM).arg("--version").output().expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    assert_eq!(text, format!("knotless-executor-shell {} (protocol 1)\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn an_unknown_argument_is_refused_by_name_with_exit_code_2() {
    let output = Command::new(PROGRAM).arg("--work-dir=/tmp").output().expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let text = String::from_utf8(output.stderr).expect("UTF-8");
    assert!(text.contains("unexpected argument \"--work-dir=/tmp\""), "{text}");
    assert!(output.stdout.is_empty(), "nothing served: {:?}", output.stdout);
}
