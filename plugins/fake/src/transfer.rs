//! `upload` and `download`: tar streams on the runner's side channel, counted byte for byte,
//! unpacked with the protocol crate's vetting and packed without following links; and the
//! downloads broken or stalled halfway on purpose (`break-download`, `stall-download`).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use knotless_protocol::channel;
use knotless_protocol::error::code;
use knotless_protocol::messages::{TransferParams, TransferResult};
use knotless_protocol::tarball::{self, UnpackError};
use serde_json::Value;
use tokio::io::AsyncWrite;
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
    let special = setup.mode == Mode::AcceptSpecialUploads;
    let keep_mode_bits = setup.mode == Mode::KeepModeBits;
    let careless = match setup.mode {
        Mode::IgnoreLongNames => Some(Careless::HeaderNames),
        Mode::WriteThroughLinks => Some(Careless::ThroughLinks),
        _ => None,
    };
    let bytes = blocking(move || {
        let stream = SyncIoBridge::new_with_handle(stream, handle);
        let mut input = Counting { inner: Paced { inner: stream, slow: slow_upload }, bytes: 0 };
        let unpacked = if let Some(careless) = careless {
            read_whole(&mut input, max_bytes).and_then(|archive| unpack_carelessly(&archive, &dest, careless))
        } else if keep_mode_bits {
            read_whole(&mut input, max_bytes).and_then(|archive| {
                let unpacked = tarball::unpack_vetted(archive.as_slice(), &dest, max_bytes)
                    .map_err(|error| Fault::new(code::TOO_LARGE, error.to_string()))?;
                restore_mode_bits(&archive, &dest)?;
                Ok(unpacked)
            })
        } else if special {
            without_special_files(&mut input, max_bytes).and_then(|archive| {
                tarball::unpack_vetted(archive.as_slice(), &dest, max_bytes).map_err(|error| match error {
                    UnpackError::Io(error) => Fault::infrastructure(format!("cannot unpack: {error}")),
                    refused => Fault::new(code::TOO_LARGE, refused.to_string()),
                })
            })
        } else {
            tarball::unpack_vetted(&mut input, &dest, max_bytes).map_err(|error| match error {
                UnpackError::TooLarge { .. } | UnpackError::Refused { .. } => {
                    Fault::new(code::TOO_LARGE, error.to_string())
                }
                UnpackError::Io(_) => Fault::infrastructure(error.to_string()),
            })
        };
        let _unpacked = unpacked?;
        // Whatever follows the archive is part of the stream the runner counted.
        io::copy(&mut input, &mut io::sink()).map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
        if input.bytes > max_bytes {
            return Err(too_large(max_bytes));
        }
        Ok(input.bytes)
    })
    .await?;
    result(&TransferResult { bytes, left_out: Vec::new() })
}

/// Writes a tar stream of the contents of the path.
pub async fn download(setup: &Setup, params: &TransferParams) -> Result<Value, Fault> {
    let source = setup.sessions.resolve(&params.session, &params.path)?;
    if !source.is_dir() {
        return Err(Fault::new(code::NOT_FOUND, format!("no folder {} in session {}", params.path, params.session)));
    }
    let stream = connect(params).await?;
    if matches!(setup.mode, Mode::BreakDownload | Mode::StallDownload) {
        return broken_download(setup, params, source, stream).await;
    }
    let max_bytes = match setup.mode {
        Mode::DownloadPastMax => {
            eprintln!("fake: ignoring the download's max_bytes of {} (simulated)", params.max_bytes);
            u64::MAX
        }
        _ => params.max_bytes,
    };
    let handle = tokio::runtime::Handle::current();
    let special = setup.mode == Mode::ArchiveSpecialFiles;
    let bytes =
        blocking(move || pack(source, SyncIoBridge::new_with_handle(stream, handle), max_bytes, special)).await?;
    let bytes = if setup.mode == Mode::BadTransfer {
        eprintln!("fake: answering one byte more than written (simulated)");
        bytes + 1
    } else {
        bytes
    };
    result(&TransferResult { bytes, left_out: Vec::new() })
}

/// The rest of each session's broken download, by session, with its stream (`break-download`).
#[derive(Default)]
pub struct HeldDownloads(std::sync::Mutex<HashMap<String, (UnixStream, Vec<u8>)>>);

impl HeldDownloads {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, (UnixStream, Vec<u8>)>> {
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Sends the rest of `session`'s broken download, if any, ends the stream, then waits (at
    /// most `timeout`) until the runner has closed its end: a runner still reading the stream
    /// has unpacked what it was sent before the session's stop is answered.
    pub async fn send_rest(&self, session: &str, timeout: std::time::Duration) {
        let Some((mut stream, rest)) = self.held().remove(session) else { return };
        eprintln!("fake: sending the rest of the broken download at the session's stop (simulated)");
        let _ = tokio::task::spawn_blocking(move || -> io::Result<()> {
            stream.write_all(&rest)?;
            stream.shutdown(std::net::Shutdown::Write)?;
            stream.set_read_timeout(Some(timeout.max(std::time::Duration::from_millis(1))))?;
            let mut sink = [0u8; 512];
            while stream.read(&mut sink)? > 0 {}
            Ok(())
        })
        .await;
    }
}

/// The side channel's stream as a blocking socket.
fn blocking_socket(stream: interprocess::local_socket::tokio::Stream) -> io::Result<UnixStream> {
    let interprocess::local_socket::tokio::Stream::UdSocket(socket) = stream;
    let socket = UnixStream::from(std::os::fd::OwnedFd::try_from(socket)?);
    socket.set_nonblocking(false)?;
    Ok(socket)
}

/// Writes half of the tar stream of `source`, then: `break-download` keeps the rest for the
/// session's stop and answers an error; `stall-download` writes nothing more until the request
/// is cancelled or passes its deadline.
async fn broken_download(
    setup: &Setup,
    params: &TransferParams,
    source: PathBuf,
    stream: interprocess::local_socket::tokio::Stream,
) -> Result<Value, Fault> {
    let max_bytes = params.max_bytes;
    let stream_error = |error: io::Error| Fault::infrastructure(format!("tar stream: {error}"));
    let mut stream = blocking_socket(stream).map_err(stream_error)?;
    let (stream, rest) = blocking(move || {
        let bounded = Bounded { inner: Counting { inner: Vec::new(), bytes: 0 }, max_bytes };
        let packed = match tarball::pack_dir(&source, bounded) {
            Ok(bounded) => bounded.inner.inner,
            Err(error) if error.kind() == io::ErrorKind::FileTooLarge => return Err(too_large(max_bytes)),
            Err(error) => return Err(Fault::infrastructure(format!("cannot pack {}: {error}", source.display()))),
        };
        let half = packed.len() / 2 / 512 * 512;
        stream.write_all(&packed[..half]).map_err(stream_error)?;
        Ok((stream, packed[half..].to_vec()))
    })
    .await?;
    if setup.mode == Mode::StallDownload {
        eprintln!("fake: stalling a download halfway (simulated)");
        // The stream stays open until this future is dropped (cancelled, or past its deadline).
        let _held_until_dropped = stream;
        match std::future::pending::<std::convert::Infallible>().await {}
    }
    eprintln!("fake: breaking a download halfway (simulated)");
    setup.held_downloads.held().insert(params.session.clone(), (stream, rest));
    Err(Fault::infrastructure(format!("the download of {} broke halfway (simulated)", params.path)))
}

/// Packs `source`; with `special`, its FIFOs and links that leave it too, as a careless
/// executor would (`archive-special-files`).
fn pack<T: AsyncWrite + Unpin>(
    source: PathBuf,
    stream: SyncIoBridge<T>,
    max_bytes: u64,
    special: bool,
) -> Result<u64, Fault> {
    let output = Counting { inner: stream, bytes: 0 };
    let bounded = Bounded { inner: output, max_bytes };
    let packed = if special { pack_everything(&source, bounded) } else { tarball::pack_dir(&source, bounded) };
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

async fn connect(params: &TransferParams) -> Result<interprocess::local_socket::tokio::Stream, Fault> {
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

/// What a careless reader does besides the vetted unpacking.
#[derive(Clone, Copy)]
enum Careless {
    /// Moves each file with a GNU long name or a pax path to the name of its own header, as a
    /// reader that knows neither would have written it (`ignore-long-names`).
    HeaderNames,
    /// Writes each file whose folder in the destination is a link through that link first
    /// (`write-through-links`).
    ThroughLinks,
}

/// Unpacks `archive` vetted, with what `careless` does wrong before or after.
fn unpack_carelessly(archive: &[u8], dest: &std::path::Path, careless: Careless) -> Result<tarball::Unpacked, Fault> {
    let broken = |error: io::Error| Fault::infrastructure(format!("tar stream: {error}"));
    let files = || -> io::Result<Vec<(PathBuf, PathBuf, Vec<u8>)>> {
        let mut files = Vec::new();
        for entry in tar::Archive::new(archive).entries()? {
            let mut entry = entry?;
            if entry.header().entry_type().is_file() {
                let (whole, header) = (entry.path()?.into_owned(), entry.header().path()?.into_owned());
                let mut data = Vec::new();
                entry.read_to_end(&mut data)?;
                files.push((whole, header, data));
            }
        }
        Ok(files)
    };
    let files = files().map_err(broken)?;
    if let Careless::ThroughLinks = careless {
        for (whole, _, data) in &files {
            let target = dest.join(whole);
            if target.parent().is_some_and(|parent| parent.is_symlink()) {
                eprintln!("fake: writing {} through a link in the destination (simulated)", whole.display());
                std::fs::write(&target, data).map_err(broken)?;
            }
        }
    }
    let unpacked = tarball::unpack_vetted(archive, dest, u64::MAX).map_err(|error| match error {
        UnpackError::Io(error) => broken(error),
        refused => Fault::new(code::TOO_LARGE, refused.to_string()),
    })?;
    if let Careless::HeaderNames = careless {
        for (whole, header, _) in &files {
            if whole != header {
                eprintln!("fake: unpacking {} at its header's name (simulated)", whole.display());
                let target = dest.join(header);
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(broken)?;
                }
                std::fs::rename(dest.join(whole), &target).map_err(broken)?;
            }
        }
    }
    Ok(unpacked)
}

/// The whole tar stream, up to `max_bytes`.
fn read_whole(input: &mut impl Read, max_bytes: u64) -> Result<Vec<u8>, Fault> {
    let mut archive = Vec::new();
    input
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut archive)
        .map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
    if archive.len() as u64 > max_bytes {
        return Err(too_large(max_bytes));
    }
    Ok(archive)
}

/// Gives every file and folder of `archive` unpacked in `dest` its mode from the archive, setuid,
/// setgid and sticky bits included, as a careless executor would (`keep-mode-bits`).
fn restore_mode_bits(archive: &[u8], dest: &std::path::Path) -> Result<(), Fault> {
    use std::os::unix::fs::PermissionsExt as _;
    eprintln!("fake: keeping the upload's setuid, setgid and sticky bits (simulated)");
    let mut entries = tar::Archive::new(archive);
    let entries = entries.entries().map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
    for entry in entries {
        let entry = entry.map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
        let (Ok(path), Ok(mode)) = (entry.path(), entry.header().mode()) else {
            continue;
        };
        let kind = entry.header().entry_type();
        if kind.is_file() || kind.is_dir() {
            let target = dest.join(path);
            if let Err(error) = std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode & 0o7777)) {
                eprintln!("fake: cannot set the mode of {}: {error}", target.display());
            }
        }
    }
    Ok(())
}

/// Packs every entry under `root`, special files and links that leave it included, links never
/// followed: their names and targets written as they are.
fn pack_everything<W: Write>(root: &std::path::Path, out: W) -> io::Result<W> {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::FileTypeExt as _;
    eprintln!("fake: packing special files into a download (simulated)");
    let mut builder = tar::Builder::new(out);
    let mut folders = vec![PathBuf::new()];
    while let Some(folder) = folders.pop() {
        let mut entries = std::fs::read_dir(root.join(&folder))?.collect::<io::Result<Vec<_>>>()?;
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            let relative = folder.join(entry.file_name());
            let kind = entry.file_type()?;
            let mut header = tar::Header::new_gnu();
            header.set_mode(std::os::unix::fs::PermissionsExt::mode(&entry.metadata()?.permissions()) & 0o7777);
            header.set_size(0);
            let raw_name = relative.as_os_str().as_bytes();
            let name = &mut header.as_old_mut().name;
            let length = raw_name.len().min(name.len());
            name[..length].copy_from_slice(&raw_name[..length]);
            let data = if kind.is_symlink() {
                header.set_entry_type(tar::EntryType::Symlink);
                let target = std::fs::read_link(entry.path())?;
                let raw_target = target.as_os_str().as_bytes();
                let link = &mut header.as_old_mut().linkname;
                let length = raw_target.len().min(link.len());
                link[..length].copy_from_slice(&raw_target[..length]);
                Vec::new()
            } else if kind.is_fifo() {
                header.set_entry_type(tar::EntryType::Fifo);
                Vec::new()
            } else if kind.is_dir() {
                header.set_entry_type(tar::EntryType::Directory);
                folders.push(relative);
                Vec::new()
            } else {
                let data = std::fs::read(entry.path())?;
                header.set_size(data.len() as u64);
                data
            };
            header.set_cksum();
            builder.append(&header, data.as_slice())?;
        }
    }
    builder.into_inner()
}

/// Reads a whole upload (at most `max_bytes`) and leaves its FIFOs and device nodes out, as a
/// careless executor would (`accept-special-uploads`); any other entry is kept as it came.
fn without_special_files(input: &mut impl Read, max_bytes: u64) -> Result<Vec<u8>, Fault> {
    let mut stream = Vec::new();
    input
        .take(max_bytes + 1)
        .read_to_end(&mut stream)
        .map_err(|error| Fault::infrastructure(format!("tar stream: {error}")))?;
    if stream.len() as u64 > max_bytes {
        return Err(too_large(max_bytes));
    }
    let bad = |error: io::Error| Fault::infrastructure(format!("tar stream: {error}"));
    let mut archive = tar::Archive::new(stream.as_slice());
    let mut builder = tar::Builder::new(Vec::new());
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let mut header = entry.header().clone();
        if matches!(header.entry_type(), tar::EntryType::Fifo | tar::EntryType::Char | tar::EntryType::Block) {
            eprintln!("fake: skipping a special file in an upload (simulated)");
            continue;
        }
        // A GNU long name or a pax path is written again as a long name; any other name as it
        // came, hostile ones included, for the vetting to refuse.
        let path = entry.path().map_err(bad)?.into_owned();
        if header.path().map_err(bad)? == path {
            builder.append(&header, &mut entry).map_err(bad)?;
        } else {
            builder.append_data(&mut header, &path, &mut entry).map_err(bad)?;
        }
    }
    builder.into_inner().map_err(bad)
}

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
