//! The wake-up socket: `<state>/notify.sock`, a Unix socket where `knotless-run notify REPO`
//! (from a post-receive hook) writes one line naming a repository, so the daemon looks at it at
//! once instead of at its next poll.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// The socket's name in the state folder.
pub const SOCKET: &str = "notify.sock";

/// The socket's path.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join(SOCKET)
}

/// Listens on the socket and sends each repository named to `wake`.
pub fn listen(state: &Path, wake: mpsc::UnboundedSender<String>) -> anyhow::Result<()> {
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
                let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(reader, 64 * 1024));
                if reader.read_line(&mut line).await.is_ok() && !line.trim().is_empty() {
                    let _ = wake.send(line.trim().to_string());
                    let _ = writer.write_all(b"ok\n").await;
                }
            });
        }
    });
    Ok(())
}

/// Tells the daemon under `state` to look at `repository` now.
pub async fn send(state: &Path, repository: &str) -> anyhow::Result<()> {
    let path = socket_path(state);
    let mut stream = UnixStream::connect(&path).await.with_context(|| {
        format!("no runner listens on {} (is the daemon running with this --state?)", path.display())
    })?;
    stream.write_all(format!("{repository}\n").as_bytes()).await.context("cannot write to the runner")?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).await.context("cannot read the runner's answer")?;
    if answer.trim() != "ok" {
        bail!("the runner did not acknowledge the notification");
    }
    Ok(())
}
