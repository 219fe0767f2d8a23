//! The side channel for tar streams: a Unix socket on a filesystem path.
//!
//! The runner binds a listener in a folder only it can enter (mode 0700), sends the socket's
//! path in `upload` or `download`, and accepts one connection. The executor connects, and the
//! writing side closes the connection to end the stream. Bulk bytes never cross the JSON
//! channel.

use std::io;
use std::path::{Path, PathBuf};

use interprocess::local_socket::tokio::{Listener, Stream};
use interprocess::local_socket::traits::tokio::{Listener as _, Stream as _};
use interprocess::local_socket::{GenericFilePath, ListenerOptions, ToFsName};

/// A bound side channel waiting for the executor to connect.
pub struct ChannelListener {
    path: PathBuf,
    listener: Listener,
}

impl ChannelListener {
    /// Binds a socket at `path`, which must not exist. Its folder should be private to the
    /// runner.
    pub fn bind(path: &Path) -> io::Result<ChannelListener> {
        let name = path.to_path_buf().to_fs_name::<GenericFilePath>()?;
        let listener = ListenerOptions::new().name(name).create_tokio()?;
        Ok(ChannelListener { path: path.to_path_buf(), listener })
    }

    /// The path to send to the executor.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the executor to connect.
    pub async fn accept(&self) -> io::Result<Stream> {
        self.listener.accept().await
    }
}

impl Drop for ChannelListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Connects to the runner's side channel (the executor's side).
pub async fn connect(path: &str) -> io::Result<Stream> {
    let name = path.to_fs_name::<GenericFilePath>()?;
    Stream::connect(name).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_cross_the_channel_and_closing_ends_the_stream() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = ChannelListener::bind(&dir.path().join("x.sock")).expect("bind");
        let path = listener.path().to_string_lossy().into_owned();
        let writer = tokio::spawn(async move {
            let mut stream = connect(&path).await.expect("connect");
            stream.write_all(b"hello side channel").await.expect("write");
        });
        let mut stream = listener.accept().await.expect("accept");
        let mut received = Vec::new();
        stream.read_to_end(&mut received).await.expect("read");
        writer.await.expect("join");
        assert_eq!(received, b"hello side channel");
        let socket = listener.path().to_path_buf();
        drop(listener);
        assert!(!socket.exists(), "the socket file is removed with the listener");
    }
}
