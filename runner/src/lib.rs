//! knotless-run: the CI runner of the knotless forge and the host of its executors.

pub mod host;
