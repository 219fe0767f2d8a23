//! `upload` and `download`: tar streams on the runner's side channel, counted byte for byte,
//! unpacked with the protocol crate's vetting and packed without following links.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use knotless_protocol::channel;
use knotless_protocol::error::code;
use knotless_protocol::messages::{TransferParams, TransferResult};
use knotless_protocol::tarball::{self, UnpackError};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::io::SyncIoBridge;

use crate::mode::Mode;
use crate::server::Setup;
use crate::wire::{Fault, result};

/// Reads the tar stream to its end and unpacks it at the path.
pub async fn upload(setup: &Setup, params: &TransferParams) -> Result<Value, Fault> {
    let dest = setup.sessions.resolve(&params.session, &params.path)?;
    let stream = connect(params).await?;
    let max_bytes = params.max_bytes;
    let handle = tokio::runtime::Handle::current();
    let slow_upload = setup.mode == Mode::SlowUpload;
    let bytes = blocking(move || {
        let stream = SyncIoBridge::new_with_handle(stream, handle);
        let mut input = Counting { inner: Paced { inner: stream, slow: slow_upload }, bytes: 0 };
        let unpacked = tarball::unpack_vetted(&mut input, &dest, max_bytes);
        if let Err(error) = unpacked {
            return Err(match error {
                UnpackError::TooLarge { .. } | UnpackError::Refused { .. } => {
                    Fault::new(code::TOO_LARGE, error.to_string())
                }
                UnpackError::Io(_) => Fault::infrastructure(error.to_string()),
            });
        }
        // Whatever follows the archive is part of the stream the runner counted.
        io::copy(&mut input, &mut io::sink()).map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
        if input.bytes > max_bytes {
            return Err(too_large(max_bytes));
        }
        Ok(input.bytes)
    })
    .await?;
    result(&TransferResult { bytes })
}

/// Writes a tar stream of the contents of the path.
pub async fn download(setup: &Setup, params: &TransferParams) -> Result<Value, Fault> {
    let source = setup.sessions.resolve(&params.session, &params.path)?;
    if !source.is_dir() {
        return Err(Fault::new(code::NOT_FOUND, format!("no folder {} in session {}", params.path, params.session)));
    }
    let stream = connect(params).await?;
    let max_bytes = params.max_bytes;
    let handle = tokio::runtime::Handle::current();
    let bytes = blocking(move || pack(source, SyncIoBridge::new_with_handle(stream, handle), max_bytes)).await?;
    let bytes = if setup.mode == Mode::BadTransfer {
        eprintln!("fake: answering one byte more than written (simulated)");
        bytes + 1
    } else {
        bytes
    };
    result(&TransferResult { bytes })
}

fn pack<T: AsyncWrite + Unpin>(source: PathBuf, stream: SyncIoBridge<T>, max_bytes: u64) -> Result<u64, Fault> {
    let output = Counting { inner: stream, bytes: 0 };
    let packed = tarball::pack_dir(&source, Bounded { inner: output, max_bytes });
    let mut bounded = packed.map_err(|error| {
        if error.kind() == io::ErrorKind::FileTooLarge {
            too_large(max_bytes)
        } else {
            Fault::infrastructure(format!("cannot pack {}: {error}", source.display()))
        }
    })?;
    bounded.flush().map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
    let bytes = bounded.inner.bytes;
    // Closing our end ends the stream for the runner.
    bounded.inner.inner.shutdown().map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
    Ok(bytes)
}

async fn connect(params: &TransferParams) -> Result<impl AsyncRead + AsyncWrite + Unpin + Send + 'static, Fault> {
    channel::connect(&params.channel).await.map_err(|error| {
        Fault::infrastructure(format!("cannot connect to the side channel {}: {error}", params.channel))
    })
}

fn too_large(max_bytes: u64) -> Fault {
    Fault::new(code::TOO_LARGE, format!("the tar stream is over its bound of {max_bytes} bytes"))
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, Fault> + Send + 'static) -> Result<T, Fault> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|error| Err(Fault::infrastructure(format!("the transfer failed: {error}"))))
}

/// Counts the bytes that pass.
/// A reader that, when `slow`, takes a second for each MiB it gives (`slow-upload`).
struct Paced<T> {
    inner: T,
    slow: bool,
}

impl<T: Read> Read for Paced<T> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let limit = if self.slow { buffer.len().min(64 << 10) } else { buffer.len() };
        let read = self.inner.read(&mut buffer[..limit])?;
        if self.slow {
            std::thread::sleep(std::time::Duration::from_secs_f64(read as f64 / f64::from(1u32 << 20)));
        }
        Ok(read)
    }
}

struct Counting<T> {
    inner: T,
    bytes: u64,
}

impl<T: Read> Read for Counting<T> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.bytes += read as u64;
        Ok(read)
    }
}

impl<T: Write> Write for Counting<T> {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buffer)?;
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Refuses to write past a bound.
struct Bounded<T> {
    inner: Counting<T>,
    max_bytes: u64,
}

impl<T: Write> Write for Bounded<T> {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        if self.inner.bytes + buffer.len() as u64 > self.max_bytes {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "over the bound"));
        }
        self.inner.write(buffer)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
