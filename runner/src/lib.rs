//! knotless-run: the CI runner of the knotless forge and the host of its executors.
//!
//! The runner knows executors only through the protocol (`knotless-protocol`); it never calls
//! `kubectl` or `docker` itself.

pub mod cache;
pub mod checkout;
pub mod checks;
pub mod cli;
pub mod conformance;
pub mod daemon;
pub mod engine;
pub mod forge;
pub mod host;
pub mod mask;
pub mod printable;
pub mod queue;
pub mod secrets;
pub mod workflow;
