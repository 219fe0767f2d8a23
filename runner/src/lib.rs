//! knotless-run: the CI runner of the knotless forge and the host of its executors.
//!
//! The runner knows executors only through the protocol (`knotless-protocol`); it never calls
//! `kubectl` or `docker` itself and speaks to no cluster.

/// `println!` that never panics: when stdout is closed (a pager quit, a pipe's reader died)
/// the line is dropped and the runner goes on.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics: a closed stderr drops the line.
#[macro_export]
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod cache;
pub mod checkout;
pub mod checks;
pub mod cli;
pub mod daemon;
pub mod engine;
pub mod forge;
pub mod mask;
pub mod metrics;
pub mod queue;
pub mod retention;
pub mod secrets;
pub mod web;
pub mod workflow;

/// The executor host, a crate of its own so that executors' tests can use it without the runner.
pub use knotless_host as host;
/// Text made safe for a terminal (it lives with the host, whose messages use it too).
pub use knotless_host::printable;
/// The conformance suite of `plugin check`, from the test kit, where executors' own tests run it.
pub use knotless_testkit::conformance;
