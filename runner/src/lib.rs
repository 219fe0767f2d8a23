//! knotless-run
