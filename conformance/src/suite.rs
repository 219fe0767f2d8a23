//! What the cases share: the session ids of one run of the suite, starting a session, running a
//! step and reading what it did, and the checks of a step's answer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use knotless_protocol::ErrorKind;
use knotless_protocol::messages::*;
use tokio_util::sync::CancellationToken;

use knotless_host::{ExecutorHost, HostConfig, HostError, Session, SessionEvent};

/// One run of the suite against one executor.
pub(super) struct Suite {
    pub host: Arc<ExecutorHost>,
    pub config: HostConfig,
    /// Makes this run's session ids and values its own.
    pub nonce: String,
}

/// What a step did, as seen through the protocol.
pub(super) struct Ran {
    pub result: Result<CommandResult, HostError>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub elapsed: Duration,
}

/// A step to run.
#[derive(Default)]
pub(super) struct Step<'a> {
    pub script: &'a str,
    pub timeout_ms: u64,
    pub env: BTreeMap<String, String>,
    pub secrets: BTreeMap<String, String>,
    /// Cancel the step once its output holds this.
    pub cancel_on_output: Option<&'a str>,
}

impl<'a> Step<'a> {
    /// `script`, given a minute.
    pub fn new(script: &'a str) -> Step<'a> {
        Step { script, timeout_ms: 60_000, ..Step::default() }
    }
}

impl Suite {
    pub fn new(host: Arc<ExecutorHost>, config: HostConfig) -> Suite {
        Suite { host, config, nonce: nonce() }
    }

    pub fn session_id(&self, name: &str) -> String {
        format!("check-{}-{name}", self.nonce)
    }

    pub fn start_params(&self, name: &str) -> StartParams {
        StartParams {
            session: self.session_id(name),
            run: RunInfo { id: self.session_id(name), workflow: "plugin-check".into(), ..RunInfo::default() },
            image: None,
            resources: Resources::default(),
            network: false,
            run_timeout_ms: Some(600_000),
            timeout_ms: 300_000,
            keep: false,
            services: Vec::new(),
        }
    }

    pub async fn open(&self, name: &str) -> Result<Session, String> {
        let session = self
            .host
            .open(self.start_params(name), &CancellationToken::new())
            .await
            .map_err(|error| error.to_string())?;
        let paths = session.paths();
        for (folder, path) in [("work", &paths.work), ("steps", &paths.steps), ("outputs", &paths.outputs)] {
            if !path.starts_with('/') {
                return Err(format!("start answered the {folder} folder {path:?}, not an absolute path"));
            }
        }
        Ok(session)
    }

    pub async fn step(&self, session: &Session, script: &str) -> Ran {
        self.run_step(session, Step::new(script), &CancellationToken::new()).await
    }

    pub async fn run_step(&self, session: &Session, step: Step<'_>, cancel: &CancellationToken) -> Ran {
        let params = CommandParams {
            session: session.id().to_string(),
            step: 0,
            name: "check".into(),
            script: step.script.to_string(),
            env: step.env,
            secrets: step.secrets,
            workdir: None,
            timeout_ms: step.timeout_ms,
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let started = Instant::now();
        let result = session
            .command(params, cancel, |event| {
                if let SessionEvent::Output { stream, bytes, .. } = event {
                    let buffer = if stream == Stream::Stdout { &mut stdout } else { &mut stderr };
                    buffer.extend_from_slice(&bytes);
                    if step.cancel_on_output.is_some_and(|marker| String::from_utf8_lossy(buffer).contains(marker)) {
                        cancel.cancel();
                    }
                }
            })
            .await;
        Ran { result, stdout, stderr, elapsed: started.elapsed() }
    }

    /// A request about a session that should be unknown must fail as one.
    pub async fn expect_unknown<M: Method>(&self, params: &M::Params) -> Result<(), String> {
        let method = M::NAME;
        let never = CancellationToken::new();
        let answer = self.host.call::<M>(params, Duration::from_secs(30), &never).await;
        expect_error(method, answer, ErrorKind::UnknownSession, "-32006 (UNKNOWN_SESSION)")
    }

    /// A command on a session that should be gone must fail as an unknown session.
    pub async fn expect_gone(&self, session: &str) -> Result<(), String> {
        let params = command_params(session, "true");
        self.expect_unknown::<rpc::Command>(&params)
            .await
            .map_err(|why| format!("session {session} should be gone: {why}"))
    }
}

/// A `command` for a session, as a raw request.
pub(super) fn command_params(session: &str, script: &str) -> CommandParams {
    CommandParams {
        session: session.to_string(),
        step: 0,
        name: "check".into(),
        script: script.into(),
        env: BTreeMap::new(),
        secrets: BTreeMap::new(),
        workdir: None,
        timeout_ms: 30_000,
    }
}

/// The step ran to its end with exit code `expected`; otherwise why not, with its stderr.
pub(super) fn exited(ran: &Ran, expected: i32) -> Result<(), String> {
    match &ran.result {
        Ok(result) if result.exit_code == expected => Ok(()),
        Ok(result) => Err(format!(
            "the step exited {}, expected {expected}{}",
            result.exit_code,
            stderr_of(&ran.stderr).map(|text| format!(" (its stderr: {text})")).unwrap_or_default()
        )),
        Err(error) => Err(error.to_string()),
    }
}

/// A step's stderr for a message: its first 300 bytes, if it wrote any.
fn stderr_of(stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(&stderr[..stderr.len().min(300)]).trim().to_string();
    (!text.is_empty()).then_some(text)
}

pub(super) fn expect_output(what: &str, got: &[u8], expected: &str) -> Result<(), String> {
    if got == expected.as_bytes() {
        Ok(())
    } else {
        Err(format!("{what} was {:?}, expected {expected:?}", String::from_utf8_lossy(got)))
    }
}

/// Quotes a string for `sh`.
pub(super) fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn nonce() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{:x}{:x}", nanos & 0xffff_ffff, std::process::id())
}

/// An answer that must be the error `kind` (`expected` as the message writes it); `what` names
/// the request in the message.
pub fn expect_error<T>(
    what: &str,
    answer: Result<T, HostError>,
    kind: ErrorKind,
    expected: &str,
) -> Result<(), String> {
    match answer {
        Err(HostError::Answered { error, .. }) if error.kind == kind => Ok(()),
        Err(HostError::Answered { error, .. }) => {
            Err(format!("{what} answered {} ({}), expected {expected}", error.kind.code(), error.message))
        }
        Err(error) => Err(format!("{what}: {error}")),
        Ok(_) => Err(format!("{what} answered a result, expected {expected}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(result: Result<CommandResult, HostError>, stderr: &str) -> Ran {
        Ran { result, stdout: Vec::new(), stderr: stderr.as_bytes().to_vec(), elapsed: Duration::ZERO }
    }

    fn exit(code: i32) -> Result<CommandResult, HostError> {
        Ok(CommandResult { exit_code: code, duration_ms: 1, killed_processes: 0 })
    }

    #[test]
    fn a_step_that_exits_otherwise_than_expected_fails_its_case() {
        assert_eq!(exited(&ran(exit(0), ""), 0), Ok(()));
        assert_eq!(
            exited(&ran(exit(2), "sh: cd: can't cd to sh\n"), 0),
            Err("the step exited 2, expected 0 (its stderr: sh: cd: can't cd to sh)".to_string())
        );
        assert_eq!(exited(&ran(exit(0), ""), 7), Err("the step exited 0, expected 7".to_string()));
        let fault = HostError::fault(knotless_host::Fault::Lost, "executor fake closed its stdout");
        assert_eq!(exited(&ran(Err(fault), ""), 0), Err("executor fake closed its stdout".to_string()));
    }

    #[test]
    fn quoting_keeps_every_character() {
        assert_eq!(quoted("a b"), "'a b'");
        assert_eq!(quoted("it's"), r"'it'\''s'");
    }
}
