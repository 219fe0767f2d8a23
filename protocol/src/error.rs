//! Error codes, the failure classes they map to, and the typed error executors return.

use jsonrpsee::types::ErrorObjectOwned;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The protocol's own error codes, in the JSON-RPC server range. JSON-RPC's standard codes
/// (-32700 parse error, -32600 invalid request, -32601 method not found, -32602 invalid params,
/// -32603 internal error) keep their meanings.
pub mod code {
    /// The environment failed: an image missing, a pod unschedulable, a node lost, a stream
    /// dropped, a token expired.
    pub const INFRASTRUCTURE: i32 = -32001;
    /// The executor's configuration or the request is wrong: a missing kubeconfig, no
    /// `docker` engine, an image this executor cannot take.
    pub const CONFIGURATION: i32 = -32002;
    /// The request was cancelled by a `cancel` notification.
    pub const CANCELLED: i32 = -32003;
    /// The request ran past its `timeout_ms`. For `command` this is the step's own failure:
    /// it was killed at its timeout and has no exit code.
    pub const TIMEOUT: i32 = -32004;
    /// The executor speaks none of the versions the runner offered.
    pub const UNSUPPORTED_VERSION: i32 = -32005;
    /// The session is not known (never started, stopped, or lost).
    pub const UNKNOWN_SESSION: i32 = -32006;
    /// The path does not exist in the session.
    pub const NOT_FOUND: i32 = -32007;
    /// A transfer went past its `max_bytes`, or a tar entry was refused.
    pub const TOO_LARGE: i32 = -32008;
    /// A request other than `initialize` came before `initialize`.
    pub const NOT_INITIALIZED: i32 = -32009;
    /// The step failed without an exit code for a reason of its own (for example the kernel's
    /// out-of-memory killer), as opposed to a fault of the environment.
    pub const STEP_FAILED: i32 = -32010;
}

/// The kind of an executor error; each has one code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// [`code::INFRASTRUCTURE`].
    Infrastructure,
    /// [`code::CONFIGURATION`].
    Configuration,
    /// [`code::CANCELLED`].
    Cancelled,
    /// [`code::TIMEOUT`].
    Timeout,
    /// [`code::UNSUPPORTED_VERSION`].
    UnsupportedVersion,
    /// [`code::UNKNOWN_SESSION`].
    UnknownSession,
    /// [`code::NOT_FOUND`].
    NotFound,
    /// [`code::TOO_LARGE`].
    TooLarge,
    /// [`code::NOT_INITIALIZED`].
    NotInitialized,
    /// [`code::STEP_FAILED`].
    StepFailed,
    /// A standard JSON-RPC error, or a code this version does not define.
    Protocol,
}

impl ErrorKind {
    /// The wire code.
    pub fn code(self) -> i32 {
        match self {
            ErrorKind::Infrastructure => code::INFRASTRUCTURE,
            ErrorKind::Configuration => code::CONFIGURATION,
            ErrorKind::Cancelled => code::CANCELLED,
            ErrorKind::Timeout => code::TIMEOUT,
            ErrorKind::UnsupportedVersion => code::UNSUPPORTED_VERSION,
            ErrorKind::UnknownSession => code::UNKNOWN_SESSION,
            ErrorKind::NotFound => code::NOT_FOUND,
            ErrorKind::TooLarge => code::TOO_LARGE,
            ErrorKind::NotInitialized => code::NOT_INITIALIZED,
            ErrorKind::StepFailed => code::STEP_FAILED,
            ErrorKind::Protocol => jsonrpsee::types::error::INTERNAL_ERROR_CODE,
        }
    }

    /// The kind of a wire code.
    pub fn from_code(code: i32) -> ErrorKind {
        match code {
            code::INFRASTRUCTURE => ErrorKind::Infrastructure,
            code::CONFIGURATION => ErrorKind::Configuration,
            code::CANCELLED => ErrorKind::Cancelled,
            code::TIMEOUT => ErrorKind::Timeout,
            code::UNSUPPORTED_VERSION => ErrorKind::UnsupportedVersion,
            code::UNKNOWN_SESSION => ErrorKind::UnknownSession,
            code::NOT_FOUND => ErrorKind::NotFound,
            code::TOO_LARGE => ErrorKind::TooLarge,
            code::NOT_INITIALIZED => ErrorKind::NotInitialized,
            code::STEP_FAILED => ErrorKind::StepFailed,
            _ => ErrorKind::Protocol,
        }
    }

    /// The failure class of this kind when it ends a `command`.
    pub fn step_class(self) -> FailureClass {
        match self {
            ErrorKind::Timeout | ErrorKind::StepFailed => FailureClass::Step,
            ErrorKind::Cancelled => FailureClass::Cancelled,
            ErrorKind::Configuration | ErrorKind::UnsupportedVersion => FailureClass::Configuration,
            _ => FailureClass::Infrastructure,
        }
    }
}

/// How a run ends when an operation fails; the run's status follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The step's own failure: a non-zero exit, or killed at its timeout. The run is `failure`.
    Step,
    /// The environment or the executor failed. The run is `error`.
    Infrastructure,
    /// The configuration is wrong. The run is `error`.
    Configuration,
    /// Someone cancelled the run. The run is `cancelled`.
    Cancelled,
}

/// The `data` of an `UNSUPPORTED_VERSION` error (-32005): both sides' versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UnsupportedVersionData {
    /// The versions the runner offered in `initialize`.
    pub offered: Vec<u32>,
    /// The versions the executor speaks.
    pub supported: Vec<u32>,
}

/// An error an executor answers a request with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ExecutorError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// One line, lowercase, naming what to fix or what failed.
    pub message: String,
    /// Structured detail (for example the supported versions).
    pub data: Option<serde_json::Value>,
}

impl ExecutorError {
    /// An error of a kind with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ExecutorError { kind, message: message.into(), data: None }
    }

    /// Adds structured detail.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }

    /// [`ErrorKind::Infrastructure`].
    pub fn infrastructure(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Infrastructure, message)
    }

    /// [`ErrorKind::Configuration`].
    pub fn configuration(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Configuration, message)
    }

    /// [`ErrorKind::Cancelled`].
    pub fn cancelled() -> Self {
        Self::new(ErrorKind::Cancelled, "cancelled")
    }

    /// [`ErrorKind::Timeout`].
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// [`ErrorKind::UnknownSession`].
    pub fn unknown_session(session: &str) -> Self {
        Self::new(ErrorKind::UnknownSession, format!("no session {session}"))
    }

    /// The JSON-RPC error object.
    pub fn to_error_object(&self) -> ErrorObjectOwned {
        ErrorObjectOwned::owned(self.kind.code(), self.message.clone(), self.data.clone())
    }

    /// Reads a JSON-RPC error object.
    pub fn from_error_object(object: &jsonrpsee::types::ErrorObject<'_>) -> Self {
        ExecutorError {
            kind: ErrorKind::from_code(object.code()),
            message: object.message().to_string(),
            data: object.data().and_then(|raw| serde_json::from_str(raw.get()).ok()),
        }
    }
}

impl From<ExecutorError> for ErrorObjectOwned {
    fn from(error: ExecutorError) -> Self {
        error.to_error_object()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_code() {
        let kinds = [
            ErrorKind::Infrastructure,
            ErrorKind::Configuration,
            ErrorKind::Cancelled,
            ErrorKind::Timeout,
            ErrorKind::UnsupportedVersion,
            ErrorKind::UnknownSession,
            ErrorKind::NotFound,
            ErrorKind::TooLarge,
            ErrorKind::NotInitialized,
            ErrorKind::StepFailed,
        ];
        for kind in kinds {
            assert_eq!(ErrorKind::from_code(kind.code()), kind);
        }
        assert_eq!(ErrorKind::from_code(-32601), ErrorKind::Protocol);
    }

    #[test]
    fn a_timed_out_step_is_the_step_failing() {
        assert_eq!(ErrorKind::Timeout.step_class(), FailureClass::Step);
        assert_eq!(ErrorKind::Infrastructure.step_class(), FailureClass::Infrastructure);
        assert_eq!(ErrorKind::Cancelled.step_class(), FailureClass::Cancelled);
        assert_eq!(ErrorKind::Configuration.step_class(), FailureClass::Configuration);
    }
}
