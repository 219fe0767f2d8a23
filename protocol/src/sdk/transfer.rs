//! The executor's ends of the side channel: a reader and a writer that count bytes and stop
//! at the transfer's bound.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use interprocess::local_socket::tokio::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Shared between a stream and the SDK, which reports the count in the result.
#[derive(Default)]
pub(crate) struct Counter {
    bytes: AtomicU64,
    over: AtomicBool,
}

impl Counter {
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    pub(crate) fn over(&self) -> bool {
        self.over.load(Ordering::SeqCst)
    }

    fn add(&self, count: usize, max: u64) -> io::Result<()> {
        let total = self.bytes.fetch_add(count as u64, Ordering::SeqCst) + count as u64;
        if total > max {
            self.over.store(true, Ordering::SeqCst);
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, format!("transfer over its bound of {max} bytes")));
        }
        Ok(())
    }
}

/// The tar stream of an `upload`, read from the runner. Read it to its end.
pub struct UploadStream {
    stream: Stream,
    counter: Arc<Counter>,
    max: u64,
}

impl UploadStream {
    pub(crate) fn new(stream: Stream, max: u64) -> (UploadStream, Arc<Counter>) {
        let counter = Arc::new(Counter::default());
        (UploadStream { stream, counter: counter.clone(), max }, counter)
    }
}

impl AsyncRead for UploadStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                Poll::Ready(this.counter.add(read, this.max))
            }
            other => other,
        }
    }
}

/// The tar stream of a `download`, written to the runner. Dropping it ends the stream.
pub struct DownloadStream {
    stream: Stream,
    counter: Arc<Counter>,
    max: u64,
}

impl DownloadStream {
    pub(crate) fn new(stream: Stream, max: u64) -> (DownloadStream, Arc<Counter>) {
        let counter = Arc::new(Counter::default());
        (DownloadStream { stream, counter: counter.clone(), max }, counter)
    }
}

impl AsyncWrite for DownloadStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.counter.bytes() + buf.len() as u64 > this.max {
            this.counter.over.store(true, Ordering::SeqCst);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("transfer over its bound of {} bytes", this.max),
            )));
        }
        match Pin::new(&mut this.stream).poll_write(cx, buf) {
            Poll::Ready(Ok(written)) => {
                let _ = this.counter.add(written, u64::MAX);
                Poll::Ready(Ok(written))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
