//! The three streams of an exec over the API's websocket, ended when the exec ends however
//! it ends.
//!
//! kube-rs hands out the exec's stdout and stderr as halves of in-memory pipes whose writing
//! halves belong to the websocket's task. When the server sends the final Status, the task
//! closes them; when the connection breaks instead (no Status: a lost stream), the task ends
//! with an error and the pipes are never closed, so a reader would wait for ever, and a writer
//! of stdin would block once its buffer is full. [`Ended`] is fired when the task has ended, by
//! a Status or not; [`Drained`] reads a stream to what the task wrote and then gives end of
//! file, and [`Refused`] fails writes once the exec has ended.
//!
//! The exec's stdin is never closed ([`Held`]): before Kubernetes 1.30 the exec's websocket
//! (`v4.channel.k8s.io`) has no signal for the end of stdin, and kube-rs closes the whole
//! websocket instead, which loses the rest of the output and the exit code. So every command
//! the executor runs knows the end of its input from the input itself (the step payload's
//! `exit`, the sweep's one line, an upload's frames) or gets no stdin at all, and the stdin
//! stays open until the exec has ended, on every version.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Fired when the exec's websocket task has ended: whatever it wrote is in the pipes.
#[derive(Clone, Default)]
pub struct Ended(CancellationToken);

impl Ended {
    /// Says the exec has ended when dropped: when its task ends, or is aborted.
    pub fn fire_on_drop(&self) -> tokio_util::sync::DropGuard {
        self.0.clone().drop_guard()
    }

    fn wait(&self) -> Pin<Box<WaitForCancellationFutureOwned>> {
        Box::pin(self.0.clone().cancelled_owned())
    }
}

/// A stream of the exec, read to its end, or to what was written before the exec ended.
pub struct Drained<R> {
    inner: R,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<R> Drained<R> {
    /// `inner`, ended with `ended`.
    pub fn new(inner: R, ended: &Ended) -> Self {
        Self { inner, ended: ended.wait() }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Drained<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(read) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            return Poll::Ready(read);
        }
        ready!(this.ended.as_mut().poll(cx));
        // Nothing more will be written: what is there is read, then end of file.
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(read) => Poll::Ready(read),
            Poll::Pending => Poll::Ready(Ok(())),
        }
    }
}

/// The exec's stdin: writes fail once the exec has ended, instead of waiting for ever.
pub struct Refused<W> {
    inner: W,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<W> Refused<W> {
    /// `inner`, refused once `ended` fired.
    pub fn new(inner: W, ended: &Ended) -> Self {
        Self { inner, ended: ended.wait() }
    }

    fn gone(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        ready!(self.ended.as_mut().poll(cx));
        Poll::Ready(io::Error::new(io::ErrorKind::BrokenPipe, "the exec has ended"))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Refused<W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Poll::Ready(written) = Pin::new(&mut this.inner).poll_write(cx, data) {
            return Poll::Ready(written);
        }
        this.gone(cx).map(Err)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(flushed) = Pin::new(&mut this.inner).poll_flush(cx) {
            return Poll::Ready(flushed);
        }
        this.gone(cx).map(Err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(shut) = Pin::new(&mut this.inner).poll_shutdown(cx) {
            return Poll::Ready(shut);
        }
        this.gone(cx).map(Err)
    }
}

/// The exec's stdin, kept open until the exec has ended: shutting it down only flushes, and
/// dropping it hands it to `keeper`, which holds it until then.
pub struct Held<W> {
    inner: Option<W>,
    keeper: Option<tokio::sync::oneshot::Sender<W>>,
}

impl<W> Held<W> {
    /// `inner`, handed to `keeper` when dropped.
    pub fn new(inner: W, keeper: tokio::sync::oneshot::Sender<W>) -> Self {
        Self { inner: Some(inner), keeper: Some(keeper) }
    }

    fn inner(&mut self) -> io::Result<&mut W> {
        self.inner.as_mut().ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "stdin was handed over"))
    }
}

impl<W> Drop for Held<W> {
    fn drop(&mut self) {
        if let (Some(inner), Some(keeper)) = (self.inner.take(), self.keeper.take()) {
            // The exec has ended already when no one keeps it: then it may close.
            let _ = keeper.send(inner);
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Held<W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self.inner() {
            Ok(inner) => Pin::new(inner).poll_write(cx, data),
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner() {
            Ok(inner) => Pin::new(inner).poll_flush(cx),
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    /// Flushes, and leaves the stream open.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A pipe whose writer is dropped without closing it (kube-rs's, when the connection
    /// breaks) ends for the reader once the exec has ended, after what was written.
    #[tokio::test]
    async fn a_stream_never_closed_ends_after_its_data_once_the_exec_ended() {
        let (reader, mut writer) = tokio::io::simplex(1024);
        let ended = Ended::default();
        let fire = ended.fire_on_drop();
        let mut drained = Drained::new(reader, &ended);
        writer.write_all(b"partial").await.expect("write");
        let reading = tokio::spawn(async move {
            let mut data = Vec::new();
            drained.read_to_end(&mut data).await.map(|_| data)
        });
        drop(writer);
        // The writer is gone, the pipe is not closed: the read waits until the exec ends.
        tokio::task::yield_now().await;
        assert!(!reading.is_finished());
        drop(fire);
        assert_eq!(reading.await.expect("join").expect("read"), b"partial");
    }

    /// A stdin shut down and dropped is never closed: its reader gets no end of file, and the
    /// keeper holds it, still open, until the exec has ended.
    #[tokio::test]
    async fn a_held_stdin_is_never_closed_before_the_exec_ended() {
        let (mut reader, writer) = tokio::io::simplex(1024);
        let (keeper, kept) = tokio::sync::oneshot::channel();
        let mut held = Held::new(writer, keeper);
        held.write_all(b"payload").await.expect("write");
        held.shutdown().await.expect("shutdown");
        drop(held);
        let mut data = [0u8; 7];
        reader.read_exact(&mut data).await.expect("read");
        assert_eq!(&data, b"payload");
        let reading = tokio::spawn(async move {
            let mut more = [0u8; 8];
            reader.read(&mut more).await
        });
        tokio::task::yield_now().await;
        assert!(!reading.is_finished(), "no end of file after a shutdown");
        let mut writer = kept.await.expect("the keeper holds the stdin");
        writer.write_all(b"!").await.expect("still open");
        assert_eq!(reading.await.expect("join").expect("read"), 1);
    }

    /// A stdin whose reader is gone, and whose buffer is full, refuses the write once the
    /// exec has ended.
    #[tokio::test]
    async fn a_full_stdin_refuses_writes_once_the_exec_ended() {
        let (reader, writer) = tokio::io::simplex(8);
        drop(reader);
        let ended = Ended::default();
        let fire = ended.fire_on_drop();
        let mut refused = Refused::new(writer, &ended);
        let writing = tokio::spawn(async move { refused.write_all(&[0u8; 64]).await });
        tokio::task::yield_now().await;
        assert!(!writing.is_finished());
        drop(fire);
        let error = writing.await.expect("join").expect_err("refused");
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    }
}
