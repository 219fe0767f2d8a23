//! A step's stdout and stderr pipes, read as chunks from whichever has bytes first: the loop
//! every executor that runs a local process (a shell, `docker exec`) needs.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::messages::Stream;
use crate::version::MAX_OUTPUT_CHUNK;

/// The two output pipes of a step's process.
pub struct OutputPipes<O, E> {
    stdout: Option<O>,
    stderr: Option<E>,
    stdout_buffer: Vec<u8>,
    stderr_buffer: Vec<u8>,
}

impl<O: AsyncRead + Unpin, E: AsyncRead + Unpin> OutputPipes<O, E> {
    /// Reads `stdout` and `stderr` (a missing one counts as closed).
    pub fn new(stdout: Option<O>, stderr: Option<E>) -> Self {
        OutputPipes {
            stdout,
            stderr,
            // Reserved, not filled: reads go into the spare capacity (no 128 KiB of zeroes a
            // step).
            stdout_buffer: Vec::with_capacity(MAX_OUTPUT_CHUNK),
            stderr_buffer: Vec::with_capacity(MAX_OUTPUT_CHUNK),
        }
    }

    /// Whether either pipe is still open.
    pub fn is_open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some()
    }

    /// Whether stderr is still open.
    pub fn stderr_open(&self) -> bool {
        self.stderr.is_some()
    }

    /// Whether stdout is still open.
    pub fn stdout_open(&self) -> bool {
        self.stdout.is_some()
    }

    /// Stops reading both pipes.
    pub fn close(&mut self) {
        self.stdout = None;
        self.stderr = None;
    }

    /// The next chunk from either pipe, or `None` when one just closed (a read error closes
    /// it too). Never resolves when both are closed: check [`OutputPipes::is_open`] first.
    /// Cancel-safe: no bytes are lost when the future is dropped unfinished.
    pub async fn read(&mut self) -> Option<(Stream, Vec<u8>)> {
        let OutputPipes { stdout, stderr, stdout_buffer, stderr_buffer } = self;
        tokio::select! {
            read = read_from(stdout, stdout_buffer) => match read {
                Some(count) => Some((Stream::Stdout, stdout_buffer[..count].to_vec())),
                None => {
                    *stdout = None;
                    None
                }
            },
            read = read_from(stderr, stderr_buffer) => match read {
                Some(count) => Some((Stream::Stderr, stderr_buffer[..count].to_vec())),
                None => {
                    *stderr = None;
                    None
                }
            },
        }
    }
}

/// Reads from a pipe that may be closed already (then it never resolves) into `buffer`'s
/// capacity, which it replaces; `None` at its end.
async fn read_from<R: AsyncRead + Unpin>(pipe: &mut Option<R>, buffer: &mut Vec<u8>) -> Option<usize> {
    buffer.clear();
    match pipe {
        Some(pipe) => match pipe.read_buf(buffer).await {
            Ok(count) if count > 0 => Some(count),
            _ => None,
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn chunks_come_from_both_pipes_and_a_close_is_reported_once() {
        let (mut out_writer, out_reader) = tokio::io::duplex(1024);
        let (mut err_writer, err_reader) = tokio::io::duplex(1024);
        let mut pipes = OutputPipes::new(Some(out_reader), Some(err_reader));
        out_writer.write_all(b"out").await.expect("write");
        assert_eq!(pipes.read().await, Some((Stream::Stdout, b"out".to_vec())));
        err_writer.write_all(b"err").await.expect("write");
        assert_eq!(pipes.read().await, Some((Stream::Stderr, b"err".to_vec())));
        drop(out_writer);
        assert_eq!(pipes.read().await, None);
        assert!(pipes.is_open() && pipes.stderr_open());
        drop(err_writer);
        assert_eq!(pipes.read().await, None);
        assert!(!pipes.is_open());
    }

    #[tokio::test]
    async fn a_chunk_is_at_most_the_bound_and_all_bytes_come_in_order() {
        let sent: Vec<u8> = (0..3 * MAX_OUTPUT_CHUNK + 17).map(|index| (index % 251) as u8).collect();
        let (mut writer, reader) = tokio::io::duplex(4 * MAX_OUTPUT_CHUNK);
        writer.write_all(&sent).await.expect("write");
        drop(writer);
        let mut pipes = OutputPipes::new(Some(reader), None::<tokio::io::DuplexStream>);
        let mut received = Vec::new();
        while let Some((stream, chunk)) = pipes.read().await {
            assert_eq!(stream, Stream::Stdout);
            assert!(!chunk.is_empty() && chunk.len() <= MAX_OUTPUT_CHUNK, "{}", chunk.len());
            received.extend_from_slice(&chunk);
        }
        assert_eq!(received, sent);
    }
}
