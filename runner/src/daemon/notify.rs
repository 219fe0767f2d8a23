//! The wake-up socket: `<state>/notify.sock`, a Unix socket where `knotless-run notify REPO`
//! (from a post-receive hook) writes one line naming a repository, so the daemon looks at it at
//! once instead of at its next poll, and where `knotless-run trigger` and `knotless-run rerun`
//! write one JSON line asking for a manual run ([`Trigger`]) or a run again ([`Rerun`]) and
//! read back the run ids or why not.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// The socket's name in the state folder.
pub const SOCKET: &str = "notify.sock";

/// The socket's path.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join(SOCKET)
}

/// A request for a manual run of a workflow (`knotless-run trigger`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    /// The repository, as the daemon watches it.
    pub repository: String,
    /// The workflow's name (a matrix's file stem runs every combination).
    pub workflow: String,
    /// The branch to run on; the default branch when `None`.
    pub branch: Option<String>,
    /// Values for the workflow's declared inputs.
    #[serde(default)]
    pub inputs: std::collections::BTreeMap<String, String>,
}

/// A request to run a check's workflow again on its commit (`knotless-run rerun`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rerun {
    /// The repository, as the daemon watches it.
    pub repository: String,
    /// The id of the run to repeat.
    pub rerun: String,
    /// Variables for every step of the new run, over the workflow's `env`.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// What the socket asks of the daemon.
#[derive(Debug)]
pub enum Wake {
    /// Look at this repository now; the answer is whether the daemon watches it, or why not.
    Look(String, oneshot::Sender<Result<(), String>>),
    /// Run a workflow by hand; the answer is its run ids, or why not.
    Trigger(Trigger, oneshot::Sender<Result<Vec<String>, String>>),
    /// Run a check again; the answer is the new run's id, or why not.
    Rerun(Rerun, oneshot::Sender<Result<Vec<String>, String>>),
}

/// A JSON line's request, before the channel of its answer is made.
#[derive(Debug)]
enum Asked {
    Trigger(Trigger),
    Rerun(Rerun),
}

impl Asked {
    /// The wake-up of this request, answered on `reply`.
    fn wake(self, reply: oneshot::Sender<Result<Vec<String>, String>>) -> Wake {
        match self {
            Asked::Trigger(trigger) => Wake::Trigger(trigger, reply),
            Asked::Rerun(rerun) => Wake::Rerun(rerun, reply),
        }
    }
}

/// A JSON line's request: a rerun names the run it repeats, a trigger does not.
fn request(line: &str) -> Result<Asked, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|error| format!("the request is not understood: {error}"))?;
    if value.get("rerun").is_some() {
        let rerun = serde_json::from_value(value).map_err(|error| format!("the rerun is not understood: {error}"))?;
        Ok(Asked::Rerun(rerun))
    } else {
        let trigger =
            serde_json::from_value(value).map_err(|error| format!("the trigger is not understood: {error}"))?;
        Ok(Asked::Trigger(trigger))
    }
}

/// The most a trigger's line may hold.
const MAX_LINE: u64 = 64 * 1024;

/// How many requests wait for the daemon at most; past it a client waits to be read.
pub const WAITING: usize = 64;

/// How the socket serves its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How many clients are served at once; the next waits in the socket's backlog until one
    /// is done.
    pub connections: usize,
    /// How long a client has to send its line; one that sends none by then is closed.
    pub read_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { connections: 64, read_timeout: std::time::Duration::from_secs(10) }
    }
}

/// How long to wait before accepting again after the `failures`-th failure in a row: a
/// failure that lasts (EMFILE, out of file descriptors) is retried every second at most, never
/// in a loop that takes a core.
fn accept_backoff(failures: u32) -> std::time::Duration {
    std::time::Duration::from_millis(10u64 << failures.min(7)).min(std::time::Duration::from_secs(1))
}

/// Listens on the socket and sends each request to `wake` (bounded: a flood of requests waits
/// in the socket's clients, not in the daemon's memory).
pub fn listen(state: &Path, wake: mpsc::Sender<Wake>) -> anyhow::Result<()> {
    listen_with(state, wake, Limits::default())
}

/// [`listen`] with its limits given.
pub fn listen_with(state: &Path, wake: mpsc::Sender<Wake>, limits: Limits) -> anyhow::Result<()> {
    let path = socket_path(state);
    if path.exists() {
        std::fs::remove_file(&path).with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(&path).with_context(|| format!("cannot listen on {}", path.display()))?;
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.connections));
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            // A slot first: past the bound, clients wait in the backlog, not in tasks.
            let Ok(permit) = std::sync::Arc::clone(&permits).acquire_owned().await else { return };
            let stream = match listener.accept().await {
                Ok((stream, _)) => {
                    failures = 0;
                    stream
                }
                Err(error) => {
                    failures += 1;
                    if failures == 1 {
                        tracing::warn!("the notify socket cannot accept a client: {error}; trying again");
                    }
                    tokio::time::sleep(accept_backoff(failures)).await;
                    continue;
                }
            };
            let wake = wake.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let (reader, mut writer) = stream.into_split();
                let mut line = String::new();
                let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(reader, MAX_LINE));
                let read = tokio::time::timeout(limits.read_timeout, reader.read_line(&mut line)).await;
                if !matches!(read, Ok(Ok(_))) || line.trim().is_empty() {
                    return;
                }
                let answer = match line.trim_start().starts_with('{') {
                    false => {
                        let (reply, answer) = oneshot::channel();
                        let _ = wake.send(Wake::Look(line.trim().to_string(), reply)).await;
                        match answer.await {
                            Ok(Ok(())) => "ok".to_string(),
                            Ok(Err(why)) => format!("error {}", why.replace('\n', " ")),
                            Err(_) => "error the runner is stopping".to_string(),
                        }
                    }
                    true => match request(line.trim()) {
                        Err(why) => format!("error {}", why.replace('\n', " ")),
                        Ok(request) => {
                            let (reply, answer) = oneshot::channel();
                            let _ = wake.send(request.wake(reply)).await;
                            match answer.await {
                                Ok(Ok(runs)) => format!("ok {}", runs.join(" ")),
                                Ok(Err(why)) => format!("error {}", why.replace('\n', " ")),
                                Err(_) => "error the runner is stopping".to_string(),
                            }
                        }
                    },
                };
                let _ = writer.write_all(format!("{answer}\n").as_bytes()).await;
            });
        }
    });
    Ok(())
}

/// Tells the daemon under `state` to look at `repository` now: `Ok(Err(why))` when it refuses
/// (it does not watch that repository).
pub async fn send(state: &Path, repository: &str) -> anyhow::Result<Result<(), String>> {
    let answer = ask(state, repository).await?;
    match answer.split_once(' ').unwrap_or((answer.as_str(), "")) {
        ("ok", _) => Ok(Ok(())),
        ("error", why) => Ok(Err(why.to_string())),
        _ => bail!("the runner answered {answer:?}"),
    }
}

/// Asks the daemon under `state` for a manual run: its run ids, or why the daemon refused.
pub async fn trigger(state: &Path, trigger: &Trigger) -> anyhow::Result<Result<Vec<String>, String>> {
    let answer = ask(state, &serde_json::to_string(trigger)?).await?;
    match answer.split_once(' ').unwrap_or((answer.as_str(), "")) {
        ("ok", runs) => Ok(Ok(runs.split_whitespace().map(str::to_string).collect())),
        ("error", why) => Ok(Err(why.to_string())),
        _ => bail!("the runner answered {answer:?}"),
    }
}

/// Asks the daemon under `state` to run a check again: the new run's id, or why the daemon
/// refused.
pub async fn rerun(state: &Path, rerun: &Rerun) -> anyhow::Result<Result<String, String>> {
    let answer = ask(state, &serde_json::to_string(rerun)?).await?;
    match answer.split_once(' ').unwrap_or((answer.as_str(), "")) {
        ("ok", run) if !run.trim().is_empty() => Ok(Ok(run.trim().to_string())),
        ("error", why) => Ok(Err(why.to_string())),
        _ => bail!("the runner answered {answer:?}"),
    }
}

/// Writes `line` to the socket and reads the runner's one-line answer.
async fn ask(state: &Path, line: &str) -> anyhow::Result<String> {
    let path = socket_path(state);
    let mut stream = UnixStream::connect(&path).await.with_context(|| {
        format!("no runner listens on {} (is the daemon running with this --state?)", path.display())
    })?;
    stream.write_all(format!("{line}\n").as_bytes()).await.context("cannot write to the runner")?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).await.context("cannot read the runner's answer")?;
    Ok(answer.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients that send nothing hold a slot for the read timeout at most, and no more of them
    /// are served at once than the bound: the next client waits for a slot, then is answered.
    #[tokio::test]
    async fn silent_clients_are_closed_and_no_more_are_served_at_once_than_the_bound() {
        use tokio::io::AsyncReadExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let (wake, mut woken) = mpsc::channel(WAITING);
        let limits = Limits { connections: 4, read_timeout: std::time::Duration::from_millis(800) };
        listen_with(dir.path(), wake, limits).expect("listen");
        let path = socket_path(dir.path());
        let mut silent = Vec::new();
        for _ in 0..limits.connections {
            silent.push(UnixStream::connect(&path).await.expect("connect"));
        }
        let state = dir.path().to_path_buf();
        let asking = tokio::spawn(async move { send(&state, "/srv/repo").await });
        // Every slot is held: the fifth client's line is not read before a silent one goes.
        let early = tokio::time::timeout(std::time::Duration::from_millis(300), woken.recv()).await;
        assert!(early.is_err(), "a fifth client was served while four held every slot");
        for mut client in silent {
            let mut rest = Vec::new();
            let closed = tokio::time::timeout(std::time::Duration::from_secs(10), client.read_to_end(&mut rest)).await;
            assert!(matches!(closed, Ok(Ok(0))), "a silent client was not closed: {closed:?}");
        }
        let Some(Wake::Look(repository, reply)) = woken.recv().await else { panic!("no wake-up") };
        assert_eq!(repository, "/srv/repo");
        reply.send(Ok(())).expect("the client waits");
        assert_eq!(asking.await.expect("the client").expect("an answer"), Ok(()));
    }

    #[test]
    fn a_lasting_accept_failure_is_retried_at_most_every_second() {
        assert_eq!(accept_backoff(1), std::time::Duration::from_millis(20));
        assert!(accept_backoff(3) < accept_backoff(4));
        assert_eq!(accept_backoff(60), std::time::Duration::from_secs(1));
    }

    #[test]
    fn a_json_line_is_a_rerun_when_it_names_a_run_and_a_trigger_otherwise() {
        let (reply, _) = oneshot::channel();
        let rerun = request(r#"{"repository":"/r","rerun":"ci-1","env":{"DEBUG":"1"}}"#).expect("a rerun").wake(reply);
        assert!(matches!(&rerun, Wake::Rerun(rerun, _) if rerun.rerun == "ci-1" && rerun.env["DEBUG"] == "1"));
        let (reply, _) = oneshot::channel();
        let trigger =
            request(r#"{"repository":"/r","workflow":"release","branch":null}"#).expect("a trigger").wake(reply);
        assert!(matches!(&trigger, Wake::Trigger(trigger, _) if trigger.workflow == "release"));
        for (line, why) in [
            (
                r#"{"repository":"/r","rerun":"ci-1","workflow":"x"}"#,
                "the rerun is not understood: unknown field `workflow`",
            ),
            (r#"{"repository":"/r"}"#, "the trigger is not understood: missing field `workflow`"),
            ("{nonsense", "the request is not understood"),
        ] {
            let error = request(line).expect_err("refused");
            assert!(error.starts_with(why), "{line}: {error}");
        }
    }
}
