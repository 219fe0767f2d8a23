//! The knotless executor protocol, version 1: the wire types, version constants, error codes,
//! framing, the side channel for tar streams, and the SDK that serves an executor.
//!
//! This crate never spawns a process and knows nothing of Kubernetes or Docker. The runner
//! uses the types to speak to executors; an executor written in Rust implements
//! [`sdk::Executor`] and calls [`sdk::serve`] from its `main`.

// No function over 80 lines (the threshold is clippy.toml's): a longer one is split into
// steps with names.
#![warn(clippy::too_many_lines)]

pub mod channel;
pub mod duration;
pub mod envelope;
pub mod error;
pub mod framing;
pub mod kept;
pub mod messages;
pub mod owner;
pub mod schema;
pub mod sdk;
pub mod tarball;
pub mod version;

pub use error::{ErrorKind, ExecutorError, FailureClass};
pub use messages::*;
pub use version::{PROTOCOL_VERSION, SUPPORTED_VERSIONS};
