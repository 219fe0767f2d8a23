//! The wake-up socket: `<state>/notify.sock`, a Unix socket where `knotless-run notify REPO`
//! (from a post-receive hook) writes one line naming a repository, so the daemon looks at it at
//! once instead of at its next poll, and where `knotless-run trigger` writes one JSON line
//! asking for a manual run ([`Trigger`]) and reads back its run ids or why not.

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

/// What the socket asks of the daemon.
#[derive(Debug)]
pub enum Wake {
    /// Look at this repository now; the answer is whether the daemon watches it, or why not.
    Look(String, oneshot::Sender<Result<(), String>>),
    /// Run a workflow by hand; the answer is its run ids, or why not.
    Trigger(Trigger, oneshot::Sender<Result<Vec<String>, String>>),
}

/// The most a trigger's line may hold.
const MAX_LINE: u64 = 64 * 1024;

/// Listens on the socket and sends each request to `wake`.
pub fn listen(state: &Path, wake: mpsc::UnboundedSender<Wake>) -> anyhow::Result<()> {
    let path = socket_path(state);
    if path.exists() {
        std::fs::remove_file(&path).with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(&path).with_context(|| format!("cannot listen on {}", path.display()))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let wake = wake.clone();
            tokio::spawn(async move {
                let (reader, mut writer) = stream.into_split();
                let mut line = String::new();
                let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(reader, MAX_LINE));
                if reader.read_line(&mut line).await.is_err() || line.trim().is_empty() {
                    return;
                }
                let answer = match line.trim_start().starts_with('{') {
                    false => {
                        let (reply, answer) = oneshot::channel();
                        let _ = wake.send(Wake::Look(line.trim().to_string(), reply));
                        match answer.await {
                            Ok(Ok(())) => "ok".to_string(),
                            Ok(Err(why)) => format!("error {}", why.replace('\n', " ")),
                            Err(_) => "error the runner is stopping".to_string(),
                        }
                    }
                    true => match serde_json::from_str::<Trigger>(line.trim()) {
                        Err(error) => format!("error the trigger is not understood: {error}"),
                        Ok(trigger) => {
                            let (reply, answer) = oneshot::channel();
                            let _ = wake.send(Wake::Trigger(trigger, reply));
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
