//! knotless-run
pub mod mask;
pub mod workflow;
