//! The cases of a session's life: the sweep at start, a refused second `start`, requests about
//! a session never started, `stop`, `cleanup`, and the end of the executor's stdin.

use std::time::Duration;

use knotless_protocol::ErrorKind;
use knotless_protocol::messages::*;
use tokio_util::sync::CancellationToken;

use super::suite::{Suite, command_params, exited};
use super::{Outcome, raw};
use crate::host::{HostError, Session};

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
        let params = CleanupParams { keep, timeout_ms: 120_000 };
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
