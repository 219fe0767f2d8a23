//! Cases of single rules in the session `start` made: output is bytes (§5.5), a death by signal
//! is `128 + N` (§6), a transfer ends by its deadline and at its cancel (§8), a download stops
//! before its `max_bytes` (§8), and an upload drops setuid, setgid and sticky bits (§8).

use std::time::{Duration, Instant};

use knotless_protocol::ErrorKind;
use knotless_protocol::messages::*;
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::Outcome;
use super::suite::{Suite, exited, quoted};
use knotless_host::{HostError, Session};

const BYTES_RULE: &str = "§5.5: output is bytes: an executor MUST NOT decode, re-encode, split into lines or drop \
                          any of it";
const SIGNAL_RULE: &str = "§6: when a signal N ended the step, `exit_code` MUST be 128 + N";
const DEADLINE_RULE: &str = "§8: the whole transfer, connecting included, MUST end within `timeout_ms`, or fail \
                             with -32004 (TIMEOUT)";
const CANCEL_RULE: &str =
    "§5.7: a cancelled request MUST still be answered, with -32003 (CANCELLED) when it was given up";
const MAX_BYTES_RULE: &str = "§8: on `download` an executor MUST stop writing before `max_bytes` would be passed, \
                              and fail with -32008 (TOO_LARGE)";
const MODE_BITS_RULE: &str = "§8: whoever unpacks an upload MUST drop setuid, setgid and sticky bits";

/// The deadline of the transfers that must time out.
const TRANSFER_TIMEOUT: Duration = Duration::from_millis(1_500);

/// The `max_bytes` of the download that must stop before it, and the size of the file it packs.
const SMALL_MAX: u64 = 64 << 10;
const LARGE_FILE: u64 = 256 << 10;

/// A side channel of the suite's own, which it accepts on and then uses as a case needs.
struct Channel {
    dir: tempfile::TempDir,
    listener: UnixListener,
}

impl Channel {
    fn new() -> Result<Channel, String> {
        let dir = tempfile::Builder::new()
            .prefix("knotless-check-")
            .tempdir()
            .map_err(|error| format!("cannot make a folder for a channel: {error}"))?;
        let listener = UnixListener::bind(dir.path().join("channel.sock"))
            .map_err(|error| format!("cannot listen on a channel: {error}"))?;
        Ok(Channel { dir, listener })
    }

    fn path(&self) -> String {
        self.dir.path().join("channel.sock").display().to_string()
    }

    fn params(&self, session: &Session, path: &str, max_bytes: u64, timeout: Duration) -> TransferParams {
        TransferParams {
            session: session.id().to_string(),
            path: path.to_string(),
            channel: self.path(),
            max_bytes,
            timeout_ms: timeout.as_millis() as u64,
        }
    }

    async fn accept(&self) -> Option<UnixStream> {
        self.listener.accept().await.ok().map(|(stream, _)| stream)
    }
}

/// The bytes 0 to 255, and what `printf` writes them from.
fn every_byte() -> (Vec<u8>, String) {
    let bytes: Vec<u8> = (0..=255).collect();
    let format: String = bytes.iter().map(|byte| format!("\\{byte:03o}")).collect();
    (bytes, format)
}

/// Where two byte strings first differ, for a message.
fn first_difference(got: &[u8], expected: &[u8]) -> String {
    match got.iter().zip(expected).position(|(got, expected)| got != expected) {
        Some(at) => format!("byte {at} was 0x{:02x}, sent 0x{:02x}", got[at], expected[at]),
        None => format!("{} bytes came back, {} were sent", got.len(), expected.len()),
    }
}

impl Suite {
    /// A step writes every byte value on stdout, and the same backwards on stderr.
    pub async fn every_byte(&self, session: &Session) -> Outcome {
        let (bytes, format) = every_byte();
        let backwards: Vec<u8> = bytes.iter().rev().copied().collect();
        let reversed: String = backwards.iter().map(|byte| format!("\\{byte:03o}")).collect();
        let ran = self.step(session, &format!("printf '{format}'\nprintf '{reversed}' >&2")).await;
        exited(&ran, 0)?;
        let mut faults = Vec::new();
        if ran.stdout != bytes {
            faults.push(format!("stdout: {}", first_difference(&ran.stdout, &bytes)));
        }
        if ran.stderr != backwards {
            faults.push(format!("stderr: {}", first_difference(&ran.stderr, &backwards)));
        }
        if !faults.is_empty() {
            return Err(format!("the bytes 0-255 did not come back as written ({}); {BYTES_RULE}", faults.join(", ")));
        }
        Ok("the bytes 0-255 came back as written on both streams".into())
    }

    /// A step that sends itself SIGTERM ends with exit code 143.
    pub async fn signal(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "kill -TERM $$\nsleep 5").await;
        match &ran.result {
            Ok(result) if result.exit_code == 143 => Ok("a step ended by SIGTERM has exit code 143".into()),
            Ok(result) => Err(format!(
                "a step ended by SIGTERM was answered with exit code {}, expected 143; {SIGNAL_RULE}",
                result.exit_code
            )),
            Err(error) => Err(error.to_string()),
        }
    }

    /// An upload whose stream never comes, and a download nobody reads, each end by their
    /// deadline with TIMEOUT; an upload cancelled while it waits is answered CANCELLED.
    pub async fn transfer_deadlines(&self, session: &Session) -> Outcome {
        let work = session.paths().work.clone();
        let folder = format!("{work}/deadlines");
        // More than any socket's buffers: the download blocks until its deadline.
        let ran = self
            .step(session, &format!("mkdir -p {0}\nhead -c 8388608 /dev/urandom > {0}/data", quoted(&folder)))
            .await;
        exited(&ran, 0).map_err(|why| format!("making the file to download: {why}"))?;
        let mut faults = Vec::new();
        // Each upload has a folder of its own: an executor may go on unpacking an abandoned upload
        // (and then remove its staging folder, beside its destination) while the download packs.
        let (upload, took) =
            self.held_transfer::<rpc::Upload>(session, &format!("{work}/deadline-upload/up"), None).await?;
        if let Some(fault) =
            expect_kind(&upload, ErrorKind::Timeout, "an upload whose stream never came", DEADLINE_RULE)
        {
            faults.push(fault);
        }
        let upload_took = took;
        let (download, took) = self.held_transfer::<rpc::Download>(session, &folder, None).await?;
        if let Some(fault) = expect_kind(&download, ErrorKind::Timeout, "a download nobody read", DEADLINE_RULE) {
            faults.push(fault);
        }
        let download_took = took;
        let (cancelled, cancel_took) = self
            .held_transfer::<rpc::Upload>(
                session,
                &format!("{work}/cancelled-upload/up"),
                Some(Duration::from_millis(500)),
            )
            .await?;
        if let Some(fault) =
            expect_kind(&cancelled, ErrorKind::Cancelled, "an upload cancelled while it waited", CANCEL_RULE)
        {
            faults.push(fault);
        }
        if !faults.is_empty() {
            return Err(faults.join("; "));
        }
        Ok(format!(
            "timed out after {} ms (upload) and {} ms (download) of {} ms; cancelled in {} ms",
            upload_took.as_millis(),
            download_took.as_millis(),
            TRANSFER_TIMEOUT.as_millis(),
            cancel_took.as_millis()
        ))
    }

    /// A transfer on a channel the suite accepts and then neither writes nor reads; cancelled
    /// after `cancel_after` if given (its deadline is then a minute), else left to its deadline.
    async fn held_transfer<M: Method<Params = TransferParams, Result = TransferResult>>(
        &self,
        session: &Session,
        path: &str,
        cancel_after: Option<Duration>,
    ) -> Result<(Result<TransferResult, HostError>, Duration), String> {
        let channel = Channel::new()?;
        let timeout = if cancel_after.is_some() { Duration::from_secs(60) } else { TRANSFER_TIMEOUT };
        let params = channel.params(session, path, 1 << 30, timeout);
        let cancel = CancellationToken::new();
        if let Some(after) = cancel_after {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                cancel.cancel();
            });
        }
        let started = Instant::now();
        let call = self.host.call::<M>(&params, timeout, &cancel);
        tokio::pin!(call);
        let mut held = None;
        let answer = loop {
            tokio::select! {
                answer = &mut call => break answer,
                stream = channel.accept(), if held.is_none() => held = Some(stream),
            }
        };
        Ok((answer, started.elapsed()))
    }

    /// A download of a folder larger than its `max_bytes` writes no more than them and fails
    /// with TOO_LARGE.
    pub async fn download_over_max(&self, session: &Session) -> Outcome {
        let folder = format!("{}/over-max", session.paths().work);
        let script = format!("mkdir -p {0}\nhead -c {LARGE_FILE} /dev/urandom > {0}/data", quoted(&folder));
        let ran = self.step(session, &script).await;
        exited(&ran, 0).map_err(|why| format!("making the file to download: {why}"))?;
        let channel = Channel::new()?;
        let params = channel.params(session, &folder, SMALL_MAX, Duration::from_secs(60));
        let never = CancellationToken::new();
        let call = self.host.call::<rpc::Download>(&params, Duration::from_secs(60), &never);
        tokio::pin!(call);
        let mut reading: Option<tokio::task::JoinHandle<u64>> = None;
        let answer = loop {
            tokio::select! {
                answer = &mut call => break answer,
                stream = channel.accept(), if reading.is_none() => {
                    reading = Some(tokio::spawn(async move {
                        let Some(stream) = stream else { return 0 };
                        // Counted, not kept; bounded all the same.
                        tokio::io::copy(&mut stream.take(LARGE_FILE * 4), &mut tokio::io::sink()).await.unwrap_or(0)
                    }));
                }
            }
        };
        let written = match reading {
            Some(reading) => tokio::time::timeout(Duration::from_secs(10), reading).await.ok().and_then(Result::ok),
            None => Some(0),
        };
        let written = written.ok_or("the download's stream did not end within 10 s of its answer")?;
        let mut faults = Vec::new();
        if let Some(fault) = expect_kind(&answer, ErrorKind::TooLarge, "a download over its max_bytes", MAX_BYTES_RULE)
        {
            faults.push(fault);
        }
        if written > SMALL_MAX {
            faults.push(format!("{written} bytes were written for a max_bytes of {SMALL_MAX}; {MAX_BYTES_RULE}"));
        }
        if !faults.is_empty() {
            return Err(faults.join("; "));
        }
        Ok(format!("{written} bytes written for a max_bytes of {SMALL_MAX}, answered TOO_LARGE"))
    }

    /// An upload of a setuid file, a setgid file and a sticky folder keeps none of those bits.
    pub async fn mode_bits(&self, session: &Session) -> Outcome {
        let folder = format!("{}/mode-bits", session.paths().work);
        let archive = special_modes().map_err(|error| format!("cannot make the archive: {error}"))?;
        let never = CancellationToken::new();
        session
            .upload(&folder, archive.as_slice(), 1 << 20, Duration::from_secs(60), &never)
            .await
            .map_err(|error| format!("the upload: {error}"))?;
        let ran = self.step(session, &format!("cd {}\nstat -c '%a %n' setuid setgid sticky", quoted(&folder))).await;
        exited(&ran, 0).map_err(|why| format!("reading the modes: {why}"))?;
        let listing = String::from_utf8_lossy(&ran.stdout).to_string();
        let mut kept = Vec::new();
        for line in listing.lines() {
            let (mode, name) = line.split_once(' ').ok_or_else(|| format!("cannot read `stat` output {line:?}"))?;
            let mode = u32::from_str_radix(mode, 8).map_err(|_| format!("cannot read `stat` output {line:?}"))?;
            if mode & 0o7000 != 0 {
                kept.push(format!("{name} has mode {mode:o}"));
            }
        }
        if listing.lines().count() != 3 {
            return Err(format!("expected the modes of three entries, `stat` said {listing:?}"));
        }
        if !kept.is_empty() {
            return Err(format!("the upload kept special bits: {}; {MODE_BITS_RULE}", kept.join(", ")));
        }
        Ok(format!("uploaded 4755, 2755 and 1777, found {}", listing.trim().replace('\n', ", ")))
    }
}

/// A tar archive of a setuid file, a setgid file and a sticky folder.
fn special_modes() -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, mode, kind) in [
        ("setuid", 0o4755, tar::EntryType::Regular),
        ("setgid", 0o2755, tar::EntryType::Regular),
        ("sticky", 0o1777, tar::EntryType::Directory),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(0);
        header.set_mtime(0);
        header.set_path(name)?;
        header.set_cksum();
        builder.append(&header, std::io::empty())?;
    }
    builder.into_inner()
}

/// The answer was the error `kind`; otherwise why not, with `rule`.
fn expect_kind<T>(answer: &Result<T, HostError>, kind: ErrorKind, what: &str, rule: &str) -> Option<String> {
    match answer {
        Err(HostError::Answered { error, .. }) if error.kind == kind => None,
        Err(HostError::Answered { error, .. }) => Some(format!(
            "{what} was answered {} ({}), expected {}; {rule}",
            error.kind.code(),
            error.message,
            kind.code()
        )),
        Err(error) => Some(format!("{what}: {error}; {rule}")),
        Ok(_) => Some(format!("{what} was answered with a result, expected {}; {rule}", kind.code())),
    }
}

const CONCURRENCY_RULE: &str =
    "§2: an executor MUST handle requests concurrently: a long `command` MUST NOT delay a `ping`";
const LONG_NAMES_RULE: &str =
    "§8: readers MUST accept POSIX ustar, GNU tar and pax, including pax extended headers and GNU long names";
const THROUGH_LINKS_RULE: &str = "§8: an executor that unpacks an upload MUST apply the runner's refusals, and never \
                                  write through a link already in the destination";

/// How long a `ping` may take while a step runs.
const PING_BOUND: Duration = Duration::from_secs(1);

/// A path longer than the 100 bytes of a ustar name: `long-names/aaa…/file`.
fn long_path(kind: &str) -> String {
    format!("{kind}-{}/{}", "d".repeat(90), "f".repeat(60))
}

/// An archive holding a file under a GNU long name and one under a pax `path` record.
fn long_names() -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    // The tar crate writes a GNU long-name entry for a path over 100 bytes in a GNU header.
    let mut gnu = tar::Header::new_gnu();
    gnu.set_mode(0o644);
    gnu.set_mtime(0);
    gnu.set_size(4);
    builder.append_data(&mut gnu, long_path("gnu"), &b"gnu\n"[..])?;
    // A pax extended header whose `path` record names the next entry.
    builder.append_pax_extensions([("path", long_path("pax").as_bytes())])?;
    let mut pax = tar::Header::new_ustar();
    pax.set_mode(0o644);
    pax.set_mtime(0);
    pax.set_size(4);
    pax.set_path("pax-short-name")?;
    pax.set_cksum();
    builder.append(&pax, &b"pax\n"[..])?;
    builder.into_inner()
}

/// An archive whose one file goes through `link/`, which the destination already holds.
fn through_link() -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_size(8);
    builder.append_data(&mut header, "link/escaped", &b"escaped\n"[..])?;
    builder.into_inner()
}

impl Suite {
    /// A `ping` sent while a step sleeps is answered at once.
    pub async fn ping_during_step(&self, session: &Session) -> Outcome {
        let never = CancellationToken::new();
        let step = self.step(session, "sleep 3");
        let ping = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let started = Instant::now();
            let answer = self.host.call::<rpc::Ping>(&Empty {}, Duration::from_secs(10), &never).await;
            (answer, started.elapsed())
        };
        let (ran, (answer, took)) = tokio::join!(step, ping);
        exited(&ran, 0).map_err(|why| format!("the step: {why}"))?;
        answer.map_err(|error| format!("a `ping` during a step: {error}"))?;
        if took > PING_BOUND || took >= ran.elapsed.saturating_sub(Duration::from_millis(500)) {
            return Err(format!(
                "a `ping` sent 500 ms into a step of 3 s was answered {} ms later, the step after {} ms; \
                 {CONCURRENCY_RULE}",
                took.as_millis(),
                ran.elapsed.as_millis()
            ));
        }
        Ok(format!("answered in {} ms while the step ran", took.as_millis()))
    }

    /// A file under a GNU long name and one under a pax `path` record land at their long names.
    pub async fn long_names(&self, session: &Session) -> Outcome {
        let folder = format!("{}/long-names", session.paths().work);
        let archive = long_names().map_err(|error| format!("cannot make the archive: {error}"))?;
        let never = CancellationToken::new();
        session
            .upload(&folder, archive.as_slice(), 1 << 20, Duration::from_secs(60), &never)
            .await
            .map_err(|error| format!("an upload with a GNU long name and a pax path: {error}; {LONG_NAMES_RULE}"))?;
        let (gnu, pax) = (long_path("gnu"), long_path("pax"));
        let script = format!("cd {}\ncat {} {}", quoted(&folder), quoted(&gnu), quoted(&pax));
        let ran = self.step(session, &script).await;
        if exited(&ran, 0).is_err() || ran.stdout != b"gnu\npax\n" {
            let listing = self.step(session, &format!("cd {}\nfind . -type f", quoted(&folder))).await;
            return Err(format!(
                "the files did not land at their long names (found: {}); {LONG_NAMES_RULE}",
                String::from_utf8_lossy(&listing.stdout).trim().replace('\n', ", ")
            ));
        }
        Ok("a GNU long name and a pax path of 151 bytes each unpacked at their names".into())
    }

    /// An upload into a folder whose `link` leads out of it writes nothing where the link leads.
    pub async fn through_links(&self, session: &Session) -> Outcome {
        let work = session.paths().work.clone();
        let (dest, outside) = (format!("{work}/through-link"), format!("{work}/through-link-target"));
        let script = format!("mkdir -p {0} {1}\nln -s {1} {0}/link", quoted(&dest), quoted(&outside));
        let ran = self.step(session, &script).await;
        exited(&ran, 0).map_err(|why| format!("making the link: {why}"))?;
        let archive = through_link().map_err(|error| format!("cannot make the archive: {error}"))?;
        let never = CancellationToken::new();
        // Refused, or unpacked without following the link: either keeps the rule.
        let answer = session.upload(&dest, archive.as_slice(), 1 << 20, Duration::from_secs(60), &never).await;
        let ran = self.step(session, &format!("if [ -e {}/escaped ]; then echo written; fi", quoted(&outside))).await;
        exited(&ran, 0).map_err(|why| format!("looking where the link leads: {why}"))?;
        if ran.stdout.starts_with(b"written") {
            return Err(format!(
                "an upload of link/escaped into a folder whose `link` leads to {outside} wrote {outside}/escaped; \
                 {THROUGH_LINKS_RULE}"
            ));
        }
        Ok(match answer {
            Ok(_) => "taken, and nothing written through the link".into(),
            Err(error) => format!("refused ({error}), nothing written through the link"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_written_by_its_octal_escape() {
        let (bytes, format) = every_byte();
        assert_eq!(bytes.len(), 256);
        assert!(format.starts_with("\\000\\001") && format.ends_with("\\376\\377"), "{format}");
        assert_eq!(first_difference(&[1, 2, 9], &[1, 2, 3]), "byte 2 was 0x09, sent 0x03");
        assert_eq!(first_difference(&[1], &[1, 2]), "1 bytes came back, 2 were sent");
    }
}
