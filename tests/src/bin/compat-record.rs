//! Records a transcript of the protocol (`knotless_tests::compat`): started by a runner as its
//! executor, it starts the real executor, passes every line both ways unchanged, and writes each
//! to the transcript with the recording's folder written `$ROOT`. A side channel's tar stream
//! goes through a socket of its own, so it is recorded too.
//!
//! Usage: compat-record TRANSCRIPT ROOT EXECUTOR

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use knotless_tests::compat::{Entry, ROOT, method};
use serde_json::Value;

/// The most bytes of one side channel's stream the recorder holds.
const MAX_STREAM: u64 = 64 * 1024 * 1024;

/// The transcript, shared by the threads that write to it.
#[derive(Clone)]
struct Transcript {
    file: Arc<Mutex<std::fs::File>>,
    root: String,
}

impl Transcript {
    fn write(&self, entry: &Entry) {
        let line = entry.line().replace(&self.root, ROOT);
        let mut file = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(error) = writeln!(file, "{line}") {
            eprintln!("compat-record: cannot write the transcript: {error}");
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [transcript, root, executor] = args.as_slice() else {
        anyhow::bail!("usage: compat-record TRANSCRIPT ROOT EXECUTOR");
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(transcript)
        .with_context(|| format!("open {transcript}"))?;
    let transcript = Transcript { file: Arc::new(Mutex::new(file)), root: root.clone() };
    let sockets = tempfile::tempdir()?;
    let mut child = Command::new(executor)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {executor}"))?;
    let mut to_executor = child.stdin.take().context("the executor's stdin")?;
    let from_executor = child.stdout.take().context("the executor's stdout")?;
    // The runner's lines go to the executor from a thread of their own; this one passes the
    // executor's back, and ends when the executor has gone (after `shutdown`, say), as the
    // executor it stands for would.
    {
        let transcript = transcript.clone();
        let sockets = sockets.path().to_path_buf();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                let line = match serde_json::from_str::<Value>(&line) {
                    Ok(message) => {
                        transcript.write(&Entry::Runner(message.clone()));
                        relayed(message, &sockets, &transcript).unwrap_or(line)
                    }
                    Err(_) => line,
                };
                if writeln!(to_executor, "{line}").and_then(|()| to_executor.flush()).is_err() {
                    break;
                }
            }
        });
    }
    let mut stdout = std::io::stdout().lock();
    for line in BufReader::new(from_executor).lines().map_while(Result::ok) {
        if let Ok(message) = serde_json::from_str(&line) {
            transcript.write(&Entry::Executor(message));
        }
        if writeln!(stdout, "{line}").and_then(|()| stdout.flush()).is_err() {
            break;
        }
    }
    let status = child.wait()?;
    drop(sockets);
    std::process::exit(status.code().unwrap_or(1));
}

/// For an `upload` or a `download`: the request with its channel replaced by a socket of ours,
/// whose stream a thread relays to the runner's and records.
fn relayed(mut message: Value, sockets: &Path, transcript: &Transcript) -> Option<String> {
    let upload = match method(&message) {
        Some("upload") => true,
        Some("download") => false,
        _ => return None,
    };
    let id = message.get("id")?.clone();
    let theirs = PathBuf::from(message.pointer("/params/channel")?.as_str()?);
    let ours = sockets.join(format!("{}.sock", id.to_string().trim_matches('"')));
    let listener = UnixListener::bind(&ours).ok()?;
    *message.pointer_mut("/params/channel")? = Value::String(ours.display().to_string());
    let transcript = transcript.clone();
    std::thread::spawn(move || {
        if let Err(error) = relay(&listener, &theirs, upload, id, &transcript) {
            eprintln!("compat-record: the side channel failed: {error:#}");
        }
    });
    Some(message.to_string())
}

fn relay(
    listener: &UnixListener,
    theirs: &Path,
    upload: bool,
    id: Value,
    transcript: &Transcript,
) -> anyhow::Result<()> {
    let (executor, _) = listener.accept()?;
    let runner = UnixStream::connect(theirs)?;
    let (mut from, mut to) = if upload { (runner, executor) } else { (executor, runner) };
    let mut data = Vec::new();
    (&mut from).take(MAX_STREAM + 1).read_to_end(&mut data)?;
    anyhow::ensure!(
        data.len() as u64 <= MAX_STREAM,
        "a side channel of over {MAX_STREAM} bytes: a transcript records a small run, as tests/compat/workflow is"
    );
    to.write_all(&data)?;
    to.shutdown(std::net::Shutdown::Write)?;
    transcript.write(&Entry::Stream { id, data });
    Ok(())
}
