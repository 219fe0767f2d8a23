//! End-to-end tests: the real `knotless-run` binary, real executors, real processes and git.

mod deploy;
mod executor_faults;
mod plugin_check;
mod python_executor;
mod run_command;
