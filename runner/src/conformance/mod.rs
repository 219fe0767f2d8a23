//! The conformance suite of `knotless-run plugin check`: runs an executor binary through every
//! operation of the protocol and says, check by check, what passed and what failed.

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use knotless_protocol::messages::*;
use knotless_protocol::{ErrorKind, tarball};
use tokio_util::sync::CancellationToken;

use crate::host::{
    Closed, Connection, ExecutorHost, ExecutorProcess, HostConfig, HostError, Reply, Session, SessionEvent,
};

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// `Ok(detail)` when it passed, `Err(why)` when it failed.
    pub outcome: Result<String, String>,
}

type Outcome = Result<String, String>;

/// Runs the suite; `report` sees each check as it ends.
pub async fn run(config: HostConfig, mut report: impl FnMut(&Check)) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut record = |name: &'static str, outcome: Outcome| {
        let check = Check { name, outcome };
        report(&check);
        checks.push(check);
    };
    let host = match ExecutorHost::start(config.clone()).await {
        Ok(host) => host,
        Err(error) => {
            record("handshake", Err(error.to_string()));
            return checks;
        }
    };
    record("handshake", handshake(&host).await);
    record("version refusal", version_refusal(&config).await);
    record("ping", ping(&host).await);
    let suite = Suite { host: host.clone(), nonce: nonce() };
    match suite.open("a").await {
        Err(error) => record("start", Err(error)),
        Ok(session) => {
            record("start", Ok(format!("work folder {}", session.paths().work)));
            record("step output and exit code", suite.output_and_exit(&session).await);
            record("non-zero exit", suite.non_zero(&session).await);
            record("variables and secrets", suite.variables(&session).await);
            record("working folder", suite.workdir(&session).await);
            record("step timeout", suite.timeout(&session).await);
            record("cancellation", suite.cancellation(&session).await);
            record("upload and download", suite.round_trip(&session).await);
            record("download of a missing path", suite.missing(&session).await);
            record("stop", suite.stop(session).await);
        }
    }
    record("cleanup of sessions not in flight", suite.cleanup().await);
    record("shutdown", shutdown(&host).await);
    checks
}

async fn handshake(host: &Arc<ExecutorHost>) -> Outcome {
    let info = host.info().await.map_err(|error| error.to_string())?;
    if info.executor.name.is_empty() || info.executor.version.is_empty() {
        return Err("the executor did not give its name and version".into());
    }
    Ok(format!(
        "{} {}, protocol {}, isolation {:?}",
        info.executor.name, info.executor.version, info.protocol_version, info.capabilities.isolation
    ))
}

/// Offers only a version no executor speaks, on a raw connection, and expects the refusal.
async fn version_refusal(config: &HostConfig) -> Outcome {
    let (process, stdin, stdout) = ExecutorProcess::spawn(&config.process).map_err(|error| format!("{error:#}"))?;
    let (unrouted, _logs) = tokio::sync::mpsc::unbounded_channel();
    let connection = Connection::new(stdout, stdin, unrouted);
    let params = InitializeParams {
        protocol_versions: vec![999],
        runner: config.runner.clone(),
        config: config.options.clone(),
    };
    let (_, answer) = connection.send(method::INITIALIZE, &params).await;
    let answer = tokio::time::timeout(Duration::from_secs(30), answer).await;
    connection.close(Closed::ByRunner("check done".into()));
    process.terminate(Duration::from_secs(2)).await;
    match answer {
        Ok(Ok(Err(Reply::Error(error)))) if error.kind == ErrorKind::UnsupportedVersion => {
            let supported = error.data.as_ref().and_then(|data| data.get("supported")).filter(|value| value.is_array());
            match supported {
                Some(supported) => Ok(format!("refused version 999, speaks {supported}")),
                None => Err("the refusal has no data.supported list".into()),
            }
        }
        Ok(Ok(Err(Reply::Error(error)))) => {
            Err(format!("expected error -32005, got {}: {}", error.kind.code(), error.message))
        }
        Ok(Ok(Ok(result))) => Err(format!("accepted version 999: {result}")),
        Ok(Ok(Err(Reply::Lost(cause)))) => Err(format!("the executor {cause}; {}", process.tail().render())),
        Ok(Err(_)) => Err("no answer".into()),
        Err(_) => Err("no answer within 30 s".into()),
    }
}

async fn ping(host: &Arc<ExecutorHost>) -> Outcome {
    let started = Instant::now();
    host.call::<_, Empty>(method::PING, &Empty {}, Duration::from_secs(10), &CancellationToken::new())
        .await
        .map_err(|error| error.to_string())?;
    Ok(format!("answered in {} µs", started.elapsed().as_micros()))
}

async fn shutdown(host: &Arc<ExecutorHost>) -> Outcome {
    if host.shutdown().await {
        Ok("answered and exited by itself".into())
    } else {
        Err("did not exit after answering shutdown; it had to be killed".into())
    }
}

fn nonce() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{:x}{:x}", nanos & 0xffff_ffff, std::process::id())
}

struct Suite {
    host: Arc<ExecutorHost>,
    nonce: String,
}

/// What a step did, as seen through the protocol.
struct Ran {
    result: Result<CommandResult, HostError>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    elapsed: Duration,
}

impl Suite {
    fn session_id(&self, name: &str) -> String {
        format!("check-{}-{name}", self.nonce)
    }

    async fn open(&self, name: &str) -> Result<Session, String> {
        let params = StartParams {
            session: self.session_id(name),
            run: RunInfo { id: self.session_id(name), workflow: "plugin-check".into(), ..RunInfo::default() },
            image: None,
            resources: Resources::default(),
            network: false,
            run_timeout_ms: Some(600_000),
            timeout_ms: 300_000,
            keep: false,
        };
        self.host.open(params, &CancellationToken::new()).await.map_err(|error| error.to_string())
    }

    async fn step(&self, session: &Session, script: &str, timeout_ms: u64, secrets: BTreeMap<String, String>) -> Ran {
        self.step_with(session, script, timeout_ms, BTreeMap::new(), secrets, &CancellationToken::new(), None).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn step_with(
        &self,
        session: &Session,
        script: &str,
        timeout_ms: u64,
        env: BTreeMap<String, String>,
        secrets: BTreeMap<String, String>,
        cancel: &CancellationToken,
        cancel_on_output: Option<&str>,
    ) -> Ran {
        let params = CommandParams {
            session: session.id().to_string(),
            step: 0,
            name: "check".into(),
            script: script.to_string(),
            env,
            secrets,
            workdir: None,
            timeout_ms,
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let started = Instant::now();
        let result = session
            .command(params, cancel, |event| {
                if let SessionEvent::Output { stream, bytes, .. } = event {
                    let buffer = if stream == Stream::Stdout { &mut stdout } else { &mut stderr };
                    buffer.extend_from_slice(&bytes);
                    if cancel_on_output.is_some_and(|marker| String::from_utf8_lossy(buffer).contains(marker)) {
                        cancel.cancel();
                    }
                }
            })
            .await;
        Ran { result, stdout, stderr, elapsed: started.elapsed() }
    }

    async fn output_and_exit(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "printf 'out\\n'; printf 'err\\n' >&2", 60_000, BTreeMap::new()).await;
        let result = ran.result.map_err(|error| error.to_string())?;
        if result.exit_code != 0 {
            return Err(format!("exit code {}, expected 0", result.exit_code));
        }
        expect_output("stdout", &ran.stdout, "out\n")?;
        expect_output("stderr", &ran.stderr, "err\n")?;
        Ok("stdout and stderr streamed, exit code 0".into())
    }

    async fn non_zero(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "exit 7", 60_000, BTreeMap::new()).await;
        match ran.result {
            Ok(result) if result.exit_code == 7 => Ok("exit code 7".into()),
            Ok(result) => Err(format!("exit code {}, expected 7", result.exit_code)),
            Err(error) => Err(error.to_string()),
        }
    }

    async fn variables(&self, session: &Session) -> Outcome {
        let value = "it's a value\nwith two lines and $dollars";
        let secret = format!("s3cr3t-{}", self.nonce);
        let env = BTreeMap::from([("CHECK_VARIABLE".to_string(), value.to_string())]);
        let secrets = BTreeMap::from([("CHECK_SECRET".to_string(), secret.clone())]);
        let script = "printf '%s|%s' \"$CHECK_VARIABLE\" \"$CHECK_SECRET\"";
        let ran = self.step_with(session, script, 60_000, env, secrets, &CancellationToken::new(), None).await;
        ran.result.map_err(|error| error.to_string())?;
        expect_output("stdout", &ran.stdout, &format!("{value}|{secret}"))?;
        let ran = self.step(session, "printf '%s' \"${CHECK_SECRET-unset}\"", 60_000, BTreeMap::new()).await;
        ran.result.map_err(|error| error.to_string())?;
        expect_output("the next step's stdout", &ran.stdout, "unset")?;
        Ok("variables arrive verbatim; a secret reaches only its own step".into())
    }

    async fn workdir(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "pwd -P; cd \"$0\" 2>/dev/null; true", 60_000, BTreeMap::new()).await;
        ran.result.map_err(|error| error.to_string())?;
        let shown = String::from_utf8_lossy(&ran.stdout).trim().to_string();
        let expected = std::fs::canonicalize(&session.paths().work)
            .map(|path| path.display().to_string())
            .unwrap_or_else(|_| session.paths().work.clone());
        if shown == expected || shown == session.paths().work {
            Ok(format!("steps run in {shown}"))
        } else {
            Err(format!("steps run in {shown}, expected the work folder {}", session.paths().work))
        }
    }

    async fn timeout(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "sleep 60", 1_500, BTreeMap::new()).await;
        match ran.result {
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::Timeout => {
                Ok(format!("killed and answered TIMEOUT after {} ms", ran.elapsed.as_millis()))
            }
            Ok(result) => {
                Err(format!("the step ran to its end (exit code {}) past its timeout of 1500 ms", result.exit_code))
            }
            Err(error) => Err(format!("expected TIMEOUT, got: {error}")),
        }
    }

    async fn cancellation(&self, session: &Session) -> Outcome {
        let cancel = CancellationToken::new();
        // Cancel when the step says it started, or after 10 s if its output never comes.
        let fallback = cancel.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            fallback.cancel();
        });
        let script = "echo started; sleep 60";
        let ran =
            self.step_with(session, script, 120_000, BTreeMap::new(), BTreeMap::new(), &cancel, Some("started")).await;
        timer.abort();
        if !String::from_utf8_lossy(&ran.stdout).contains("started") {
            return Err(format!(
                "never saw the step's output `started` (result: {:?})",
                ran.result.map(|r| r.exit_code)
            ));
        }
        match ran.result {
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::Cancelled => {
                Ok(format!("answered CANCELLED after {} ms", ran.elapsed.as_millis()))
            }
            Ok(result) => Err(format!("the step ran to its end (exit code {}) after a cancel", result.exit_code)),
            Err(error) => Err(format!("expected CANCELLED, got: {error}")),
        }
    }

    async fn round_trip(&self, session: &Session) -> Outcome {
        let source = tempfile::tempdir().map_err(|error| error.to_string())?;
        make_tree(source.path()).map_err(|error| format!("cannot make the test tree: {error}"))?;
        let archive = tarball::pack_dir(source.path(), Vec::new()).map_err(|error| error.to_string())?;
        let path = format!("{}/check-transfer", session.paths().work);
        let never = CancellationToken::new();
        let sent = session
            .upload(&path, archive.as_slice(), 1 << 20, Duration::from_secs(60), &never)
            .await
            .map_err(|error| format!("upload: {error}"))?;
        let back = tempfile::tempdir().map_err(|error| error.to_string())?;
        let dest = back.path().join("tree");
        session
            .download(&path, &dest, 1 << 20, Duration::from_secs(60), &never)
            .await
            .map_err(|error| format!("download: {error}"))?;
        compare_trees(source.path(), &dest)?;
        Ok(format!("{sent} bytes up and back, modes, symlinks and empty folders kept"))
    }

    async fn missing(&self, session: &Session) -> Outcome {
        let back = tempfile::tempdir().map_err(|error| error.to_string())?;
        let path = format!("{}/no-such-path-{}", session.paths().work, self.nonce);
        let never = CancellationToken::new();
        match session.download(&path, &back.path().join("x"), 1 << 20, Duration::from_secs(60), &never).await {
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::NotFound => {
                Ok("answered NOT_FOUND".into())
            }
            Err(error) => Err(format!("expected NOT_FOUND, got: {error}")),
            Ok(_) => Err("a missing path downloaded as if it existed".into()),
        }
    }

    async fn stop(&self, session: Session) -> Outcome {
        let id = session.id().to_string();
        let stopped = session.stop(false, Duration::from_secs(120)).await.map_err(|error| error.to_string())?;
        self.expect_gone(&id).await?;
        Ok(format!("removed {} resource(s); the session is gone", stopped.removed.len()))
    }

    /// A command on a session that should be gone must fail as an unknown session.
    async fn expect_gone(&self, session: &str) -> Result<(), String> {
        let params = CommandParams {
            session: session.to_string(),
            step: 0,
            name: "check".into(),
            script: "true".into(),
            env: BTreeMap::new(),
            secrets: BTreeMap::new(),
            workdir: None,
            timeout_ms: 30_000,
        };
        let never = CancellationToken::new();
        match self.host.call::<_, CommandResult>(method::COMMAND, &params, Duration::from_secs(30), &never).await {
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::UnknownSession => Ok(()),
            Err(error) => Err(format!("a command in session {session} should fail with UNKNOWN_SESSION, got: {error}")),
            Ok(_) => Err(format!("session {session} still runs commands")),
        }
    }

    async fn cleanup(&self) -> Outcome {
        let left = self.open("left").await.map_err(|error| format!("start: {error}"))?;
        let kept = self.open("kept").await.map_err(|error| format!("start: {error}"))?;
        let params = CleanupParams { keep: vec![kept.id().to_string()], timeout_ms: 120_000 };
        let never = CancellationToken::new();
        let result: CleanupResult = self
            .host
            .call(method::CLEANUP, &params, Duration::from_secs(120), &never)
            .await
            .map_err(|error| format!("cleanup: {error}"))?;
        let left_id = left.id().to_string();
        let named = result.removed.iter().any(|resource| {
            resource.session.as_deref() == Some(left_id.as_str()) || resource.name.contains(left_id.as_str())
        });
        self.expect_gone(&left_id).await?;
        let ran = self.step(&kept, "true", 60_000, BTreeMap::new()).await;
        let kept_works = ran.result.map_err(|error| format!("the kept session no longer works: {error}"))?;
        drop(left);
        kept.stop(false, Duration::from_secs(120)).await.map_err(|error| format!("stop: {error}"))?;
        if !named {
            return Err(format!("cleanup did not report removing session {left_id}: {:?}", result.removed));
        }
        Ok(format!("removed the session not in flight, kept the other (exit {})", kept_works.exit_code))
    }
}

fn expect_output(what: &str, got: &[u8], expected: &str) -> Result<(), String> {
    if got == expected.as_bytes() {
        Ok(())
    } else {
        Err(format!("{what} was {:?}, expected {expected:?}", String::from_utf8_lossy(got)))
    }
}

fn make_tree(root: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(root.join("empty"))?;
    std::fs::create_dir_all(root.join("a/b"))?;
    std::fs::write(root.join("run.sh"), "#!/bin/sh\necho ran\n")?;
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(root.join("data"), "data\n")?;
    std::fs::set_permissions(root.join("data"), std::fs::Permissions::from_mode(0o640))?;
    std::fs::write(root.join("a/b/deep.txt"), "deep\n")?;
    symlink("data", root.join("link"))?;
    symlink("../../run.sh", root.join("a/b/up"))?;
    Ok(())
}

fn compare_trees(expected: &Path, got: &Path) -> Result<(), String> {
    for relative in ["empty", "a", "a/b", "run.sh", "data", "a/b/deep.txt", "link", "a/b/up"] {
        let want = std::fs::symlink_metadata(expected.join(relative)).map_err(|error| error.to_string())?;
        let have =
            std::fs::symlink_metadata(got.join(relative)).map_err(|_| format!("{relative} did not come back"))?;
        if want.file_type().is_symlink() {
            let target =
                std::fs::read_link(got.join(relative)).map_err(|_| format!("{relative} came back as no symlink"))?;
            let wanted = std::fs::read_link(expected.join(relative)).map_err(|error| error.to_string())?;
            if target != wanted {
                return Err(format!("{relative} points to {}, expected {}", target.display(), wanted.display()));
            }
            continue;
        }
        if want.is_dir() != have.is_dir() {
            return Err(format!("{relative} changed between folder and file"));
        }
        if !want.is_dir() {
            let mode = have.permissions().mode() & 0o777;
            if mode != want.permissions().mode() & 0o777 {
                return Err(format!(
                    "{relative} came back with mode {mode:o}, expected {:o}",
                    want.permissions().mode() & 0o777
                ));
            }
            if std::fs::read(got.join(relative)).ok() != std::fs::read(expected.join(relative)).ok() {
                return Err(format!("{relative} came back with other content"));
            }
        }
    }
    Ok(())
}
