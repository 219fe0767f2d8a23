//! knotless-testkit: what an executor's tests need, as a dev-dependency.
//!
//! - [`Harness`] serves any [`Executor`](knotless_protocol::sdk::Executor) in memory through the
//!   SDK's `serve_io` and speaks JSON-RPC lines to it, as a runner would, recording every answer
//!   and notification: tests of one operation at a time, without a process.
//! - [`conformance`] is the suite of `knotless-run plugin check` (the `knotless-conformance`
//!   crate): [`conformance::assert_passes`] runs every case against an executor's built
//!   program, hosted as the runner hosts it ([`host`], the `knotless-host` crate), and fails the
//!   test naming each case that did not pass.
//! - [`eventually`] and [`wait_until`] poll a condition with a deadline; [`processes`] looks at
//!   `/proc` for what a step left running or where a secret shows; [`bin`] finds another
//!   package's built program.
//!
//! ```no_run
//! use knotless_testkit::{Harness, answer, conformance, unique_runner_id};
//! use serde_json::json;
//! # #[derive(Default)] struct MyExecutor;
//! # impl knotless_protocol::sdk::Executor for MyExecutor {
//! #   fn info(&self) -> knotless_protocol::ExecutorInfo { unimplemented!() }
//! #   async fn initialize(&self, _: &knotless_protocol::InitializeParams) -> Result<knotless_protocol::Capabilities, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn start(&self, _: knotless_protocol::StartParams, _: knotless_protocol::sdk::Context) -> Result<knotless_protocol::StartResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn command(&self, _: knotless_protocol::CommandParams, _: knotless_protocol::sdk::Context) -> Result<knotless_protocol::CommandResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn stop(&self, _: knotless_protocol::StopParams, _: knotless_protocol::sdk::Context) -> Result<knotless_protocol::StopResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn cleanup(&self, _: knotless_protocol::CleanupParams, _: knotless_protocol::sdk::Context) -> Result<knotless_protocol::CleanupResult, knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn upload(&self, _: &knotless_protocol::TransferParams, _: knotless_protocol::sdk::UploadStream, _: knotless_protocol::sdk::Context) -> Result<(), knotless_protocol::ExecutorError> { unimplemented!() }
//! #   async fn download(&self, _: &knotless_protocol::TransferParams, _: knotless_protocol::sdk::DownloadStream, _: knotless_protocol::sdk::Context) -> Result<(), knotless_protocol::ExecutorError> { unimplemented!() }
//! # }
//! # async fn tests() {
//! // One operation, in memory.
//! let harness = Harness::serve(MyExecutor::default(), unique_runner_id("test"));
//! harness.initialize(json!({})).await.expect("initialize");
//! harness.start("s").await;
//! let (id, reply) = harness.send("command", json!({"session": "s", "step": 0, "script": "sleep 60", "timeout_ms": 60_000})).await;
//! harness.cancel(id).await;
//! assert_eq!(answer(reply).await.expect_err("cancelled").0, -32003);
//!
//! // Every case of the suite, against the built program.
//! conformance::assert_passes(conformance::program("target/debug/knotless-executor-mine", &[])).await;
//! # }
//! ```

mod built;
pub mod conformance;
mod harness;
pub mod processes;
mod wait;

pub use built::{bin, bin_dir};
pub use harness::{ANSWER_WITHIN, Harness, PIPE_BYTES, Reply, RpcError, answer, unique_runner_id};
/// The executor host the conformance suite drives a program through (`knotless-host`).
pub use knotless_host as host;
pub use wait::{eventually, wait_until};
