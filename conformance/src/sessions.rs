//! The cases of a session's life: the sweep at start, a refused second `start`, requests about
//! a session never started, `stop`, `cleanup`, and the end of the executor's stdin.

use std::time::Duration;

use knotless_protocol::ErrorKind;
use knotless_protocol::messages::*;
use tokio_util::sync::CancellationToken;

use super::suite::{Suite, command_params, exited, expect_error};
use super::{Outcome, raw};
use knotless_host::{HostError, Session};

impl Suite {
    /// What a runner sends when it starts: `cleanup`, keeping nothing (this run's runner id is
    /// its own, so there is nothing of another run's to keep).
    pub async fn cleanup_at_start(&self) -> Outcome {
        let result = self.sweep(Vec::new()).await.map_err(|error| format!("cleanup: {error}"))?;
        if !result.failures.is_empty() {
            return Err(format!("the sweep failed: {}", result.failures.join("; ")));
        }
        Ok(format!("answered; removed {} resource(s)", result.removed.len()))
    }

    async fn sweep(&self, keep: Vec<String>) -> Result<CleanupResult, HostError> {
        let params = CleanupParams { keep, remove_kept: false, timeout_ms: 120_000 };
        self.host.call::<rpc::Cleanup>(&params, Duration::from_secs(120), &CancellationToken::new()).await
    }

    /// A second `start` with the id of a live session is refused with CONFIGURATION, and the
    /// session goes on as it was: a file a step wrote in it is still there.
    pub async fn duplicate_start(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "echo before > duplicate-start").await;
        exited(&ran, 0).map_err(|why| format!("a step before the second start: {why}"))?;
        let params = self.start_params("a");
        let never = CancellationToken::new();
        let answer = self.host.call::<rpc::Start>(&params, Duration::from_secs(300), &never).await;
        let refusal = match answer {
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::Configuration => error.message,
            Err(HostError::Answered { error, .. }) => {
                return Err(format!(
                    "a second start of session {} answered {} ({}), expected -32002 (CONFIGURATION)",
                    session.id(),
                    error.kind.code(),
                    error.message
                ));
            }
            Err(error) => return Err(error.to_string()),
            Ok(_) => return Err(format!("a second start of the live session {} was accepted", session.id())),
        };
        let ran = self.step(session, "cat duplicate-start").await;
        exited(&ran, 0).map_err(|why| format!("after the refused second start, the session no longer works: {why}"))?;
        if ran.stdout != b"before\n" {
            return Err("after the refused second start, the session lost what a step wrote in it".into());
        }
        Ok(format!("refused with CONFIGURATION ({refusal}); the session went on"))
    }

    /// `command`, `stop`, `upload` and `download` naming a session never started are each
    /// answered UNKNOWN_SESSION.
    pub async fn unknown_sessions(&self) -> Outcome {
        let session = self.session_id("never-started");
        self.expect_unknown::<rpc::Command>(&command_params(&session, "true")).await?;
        let stop = StopParams { session: session.clone(), keep: false, timeout_ms: 30_000 };
        self.expect_unknown::<rpc::Stop>(&stop).await?;
        for method in [method::UPLOAD, method::DOWNLOAD] {
            self.unknown_transfer(method, &session).await?;
        }
        Ok("command, stop, upload and download answered UNKNOWN_SESSION".into())
    }

    /// A transfer naming `session`, its side channel served (an empty archive for an upload)
    /// should the executor connect before it looks the session up.
    async fn unknown_transfer(&self, method: &str, session: &str) -> Result<(), String> {
        let folder = tempfile::tempdir().map_err(|error| format!("cannot make a side channel's folder: {error}"))?;
        let socket = folder.path().join("channel.sock");
        let listener = knotless_protocol::channel::ChannelListener::bind(&socket)
            .map_err(|error| format!("cannot open a side channel: {error}"))?;
        let upload = method == method::UPLOAD;
        let served = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            if let Ok(mut stream) = listener.accept().await {
                if upload {
                    let _ = stream.write_all(&[0; 1024]).await;
                } else {
                    let _ = stream.read_to_end(&mut Vec::new()).await;
                }
            }
        });
        let params = TransferParams {
            session: session.to_string(),
            path: "/work".into(),
            channel: socket.to_string_lossy().into_owned(),
            max_bytes: 1 << 20,
            timeout_ms: 30_000,
        };
        let outcome = match upload {
            true => self.expect_unknown::<rpc::Upload>(&params).await,
            false => self.expect_unknown::<rpc::Download>(&params).await,
        };
        served.abort();
        outcome
    }

    pub async fn stop(&self, session: Session) -> Outcome {
        let id = session.id().to_string();
        let stopped = session.stop(false, Duration::from_secs(120)).await.map_err(|error| error.to_string())?;
        self.expect_gone(&id).await?;
        Ok(format!("removed {} resource(s); the session is gone", stopped.removed.len()))
    }

    /// `cleanup` keeping one session removes another (and says so), then keeps the one it
    /// names, which still runs steps. One session lives at a time, as `cleanup` judges each by
    /// its id: the executor may give each a machine of its own, and have one.
    pub async fn cleanup(&self) -> Outcome {
        let kept_id = self.session_id("kept");
        let left = self.open("left").await.map_err(|error| format!("start: {error}"))?;
        let removed = self.cleanup_removing(&left, &kept_id).await;
        drop(left);
        let removed = removed?;
        let kept = self.open("kept").await.map_err(|error| format!("start: {error}"))?;
        let outcome = self.cleanup_keeping(&kept).await;
        let stopped = kept.stop(false, Duration::from_secs(120)).await;
        let kept = outcome?;
        stopped.map_err(|error| format!("stop of the kept session: {error}"))?;
        Ok(format!("{removed}; {kept}"))
    }

    /// A sweep keeping `kept` (not `left`) removes `left` and names it.
    async fn cleanup_removing(&self, left: &Session, kept: &str) -> Outcome {
        let result = self.sweep(vec![kept.to_string()]).await.map_err(|error| format!("cleanup: {error}"))?;
        let left_id = left.id();
        let named = result
            .removed
            .iter()
            .any(|resource| resource.session.as_deref() == Some(left_id) || resource.name.contains(left_id));
        self.expect_gone(left_id).await?;
        if !named {
            return Err(format!("cleanup did not report removing session {left_id}: {:?}", result.removed));
        }
        Ok("removed the session not in flight".into())
    }

    /// A sweep keeping `kept` leaves it working.
    async fn cleanup_keeping(&self, kept: &Session) -> Outcome {
        let result = self.sweep(vec![kept.id().to_string()]).await.map_err(|error| format!("cleanup: {error}"))?;
        let ran = self.step(kept, "true").await;
        exited(&ran, 0).map_err(|why| format!("the kept session no longer works: {why}"))?;
        if let Some(resource) = result
            .removed
            .iter()
            .find(|resource| resource.session.as_deref() == Some(kept.id()) || resource.name.contains(kept.id()))
        {
            return Err(format!("cleanup reported removing the kept session's {} {}", resource.kind, resource.name));
        }
        Ok("kept the session named".into())
    }

    /// A `timeout_ms` of 0 is a deadline already passed (§5): `stop` of a live session, `start`
    /// of a new one and `cleanup` are each answered TIMEOUT without doing their work, so the
    /// live session still runs steps and the new one is unknown.
    pub async fn zero_deadlines(&self) -> Outcome {
        const RULE: &str = "§5: given a `timeout_ms` of 0, a deadline already passed, an executor MUST answer \
                            -32004 (TIMEOUT) without beginning the work";
        let never = CancellationToken::new();
        let session = self.open("zero-deadline").await.map_err(|error| format!("start: {error}"))?;
        let stop = StopParams { session: session.id().to_string(), keep: false, timeout_ms: 0 };
        let stopped =
            expect_timeout("stop", self.host.call::<rpc::Stop>(&stop, Duration::from_secs(120), &never).await);
        let ran = self.step(&session, "true").await;
        let gone = session.stop(false, Duration::from_secs(120)).await;
        stopped.map_err(|why| format!("{RULE}: {why}"))?;
        exited(&ran, 0)
            .map_err(|why| format!("{RULE}: after a stop given 0 ms the session no longer runs steps: {why}"))?;
        gone.map_err(|error| format!("stop: {error}"))?;

        let start = StartParams { timeout_ms: 0, ..self.start_params("zero-deadline-start") };
        let started = self.host.call::<rpc::Start>(&start, Duration::from_secs(300), &never).await;
        if started.is_ok() {
            let stop = StopParams { session: start.session.clone(), keep: false, timeout_ms: 120_000 };
            let _ = self.host.call::<rpc::Stop>(&stop, Duration::from_secs(120), &never).await;
        }
        expect_timeout("start", started).map_err(|why| format!("{RULE}: {why}"))?;
        self.expect_gone(&start.session).await.map_err(|why| format!("{RULE}: after a start given 0 ms: {why}"))?;

        let cleanup = CleanupParams { keep: Vec::new(), remove_kept: false, timeout_ms: 0 };
        let swept = self.host.call::<rpc::Cleanup>(&cleanup, Duration::from_secs(120), &never).await;
        expect_timeout("cleanup", swept).map_err(|why| format!("{RULE}: {why}"))?;
        Ok("stop, start and cleanup given 0 ms each answered TIMEOUT, and did nothing".into())
    }

    /// `stop` with `keep` leaves the environment in place (§5.8), and a `cleanup` leaves it too
    /// (§5.9): a `start` of the same session is then refused, since its environment is still
    /// there (§5.3); then `cleanup` with `remove_kept` removes it (§5.9), so that the suite
    /// leaves nothing behind.
    pub async fn keep(&self) -> Outcome {
        let session = self.open("keep").await.map_err(|error| format!("start: {error}"))?;
        let id = session.id().to_string();
        let ran = self.step(&session, "echo kept > kept").await;
        let stopped = session.stop(true, Duration::from_secs(120)).await;
        let left = self.sweep(Vec::new()).await;
        let refused = self.start_kept(&id).await;
        let swept = self.sweep_kept().await;
        exited(&ran, 0).map_err(|why| format!("a step before the stop: {why}"))?;
        let stopped = stopped.map_err(|error| format!("stop with keep: {error}"))?;
        if let Some(resource) = stopped.removed.first() {
            return Err(format!(
                "§5.8: with `keep`, `stop` MUST leave the environment in place; it answered removing {} {}",
                resource.kind, resource.name
            ));
        }
        let left = left.map_err(|error| format!("cleanup: {error}"))?;
        if let Some(resource) = left.removed.iter().find(|resource| names(resource, &id)) {
            return Err(format!(
                "§5.9: `cleanup` without `remove_kept` MUST leave a kept session's environment; it removed {} {} of the \
                 kept session {id}",
                resource.kind, resource.name
            ));
        }
        let refusal = refused?;
        let swept = swept.map_err(|error| format!("cleanup with remove_kept: {error}"))?;
        if !swept.removed.iter().any(|resource| names(resource, &id)) {
            return Err(format!(
                "§5.9: `cleanup` with `remove_kept` MUST remove a kept session whose owner is this process; it did not \
                 name session {id}, which is left behind: {:?}",
                swept.removed
            ));
        }
        Ok(format!(
            "kept through a stop and a cleanup: a second start was refused ({refusal}); cleanup with remove_kept \
             removed it"
        ))
    }

    /// A `start` of the kept session `id`, which must be refused with CONFIGURATION. A session
    /// it starts all the same is stopped.
    async fn start_kept(&self, id: &str) -> Outcome {
        let never = CancellationToken::new();
        let params = self.start_params("keep");
        match self.host.call::<rpc::Start>(&params, Duration::from_secs(300), &never).await {
            Err(HostError::Answered { error, .. }) if error.kind == ErrorKind::Configuration => Ok(error.message),
            Err(HostError::Answered { error, .. }) => Err(format!(
                "a start of the kept session {id} answered {} ({}), expected -32002 (CONFIGURATION): its environment \
                 is still there",
                error.kind.code(),
                error.message
            )),
            Err(error) => Err(format!("a start of the kept session {id}: {error}")),
            Ok(_) => {
                let stop = StopParams { session: id.to_string(), keep: false, timeout_ms: 120_000 };
                let _ = self.host.call::<rpc::Stop>(&stop, Duration::from_secs(120), &never).await;
                Err(format!(
                    "§5.8: with `keep`, `stop` MUST leave the environment in place; a new start of session {id} was \
                     accepted, so it was gone"
                ))
            }
        }
    }

    async fn sweep_kept(&self) -> Result<CleanupResult, HostError> {
        let params = CleanupParams { keep: Vec::new(), remove_kept: true, timeout_ms: 120_000 };
        self.host.call::<rpc::Cleanup>(&params, Duration::from_secs(120), &CancellationToken::new()).await
    }

    /// A second executor process, of this runner id, starts a session and a step that sleeps;
    /// then its stdin is closed. It must exit by itself within the bound, and leave nothing of
    /// the session: a `cleanup` of this executor (every session of the suite stopped by now)
    /// finds nothing of it to remove.
    pub async fn end_of_stdin(&self) -> Outcome {
        let session = self.session_id("end-of-stdin");
        let exited = raw::end_of_stdin(&self.config, self.start_params("end-of-stdin")).await?;
        let result = self.sweep(Vec::new()).await.map_err(|error| format!("cleanup afterwards: {error}"))?;
        let left: Vec<String> = result
            .removed
            .iter()
            .filter(|resource| {
                resource.session.as_deref() == Some(session.as_str()) || resource.name.contains(&session)
            })
            .map(|resource| format!("{} {}", resource.kind, resource.name))
            .collect();
        if !left.is_empty() {
            return Err(format!(
                "the executor exited without stopping session {session}: a cleanup afterwards removed {}",
                left.join(", ")
            ));
        }
        Ok(format!("{exited}, and left nothing of its session"))
    }
}

/// An answer to a request given 0 ms that must be TIMEOUT.
fn expect_timeout<T>(method: &str, answer: Result<T, HostError>) -> Result<(), String> {
    expect_error(&format!("{method} given 0 ms"), answer, ErrorKind::Timeout, "-32004 (TIMEOUT)")
}

/// Whether a removed resource names session `id`, in `session` or in its name.
fn names(resource: &Resource, id: &str) -> bool {
    resource.session.as_deref() == Some(id) || resource.name.contains(id)
}
