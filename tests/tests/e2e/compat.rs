//! Wire compatibility with earlier releases, from the transcripts under tests/compat/RELEASE/
//! (`knotless_tests::compat`, recorded by `make compat-record`): this tree's executors answer
//! the requests an earlier runner sent as that release's executors did, and this tree's runner
//! runs the workflow against an executor answering as an earlier one did. A failure says what
//! an operator mixing the two releases would meet.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use knotless_tests::cluster::FakeCluster;
use knotless_tests::compat::{self, Entry, is_request, is_response, method, missing, response_to, stream_of};
use knotless_tests::{bin, knotless_run, ran};
use serde_json::Value;

fn compat_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("compat")
}

/// Every transcript, as (release, executor, path).
fn transcripts() -> Vec<(String, String, PathBuf)> {
    let mut found = Vec::new();
    for release in std::fs::read_dir(compat_root()).expect("tests/compat") {
        let release = release.expect("an entry").path();
        let Ok(files) = std::fs::read_dir(&release) else { continue };
        for file in files {
            let path = file.expect("an entry").path();
            if path.extension().is_some_and(|extension| extension == "jsonl") {
                let name = |name: Option<&std::ffi::OsStr>| name.unwrap_or_default().to_string_lossy().into_owned();
                found.push((name(release.file_name()), name(path.file_stem()), path));
            }
        }
    }
    found.sort();
    assert!(
        found.iter().any(|(release, _, _)| release == "0.1.0"),
        "no transcripts of 0.1.0 under {}",
        compat_root().display()
    );
    found
}

/// A copy of the transcript and its flags in `into`, with `from` replaced by `to`.
fn edited(path: &Path, into: &Path, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(path).expect("the transcript");
    assert!(text.contains(from), "{} has no {from}", path.display());
    let copy = into.join(path.file_name().expect("a file name"));
    std::fs::write(&copy, text.replace(from, to)).expect("write the copy");
    std::fs::copy(path.with_extension("args"), copy.with_extension("args")).expect("copy the flags");
    copy
}

/// A copy of the transcript with a field of each `command` result renamed, as a release that
/// renamed it would have answered.
fn renamed_exit_code(path: &Path, into: &Path) -> PathBuf {
    edited(path, into, "\"exit_code\":", "\"exit_status\":")
}

/// This tree's executor, answering a recorded runner's requests; what differs from the
/// recorded answers, in words.
fn replay_against_executor(transcript: &Path) -> Vec<String> {
    let folder = tempfile::tempdir().expect("a folder");
    let root = folder.path();
    let entries = compat::read(transcript, root).expect("the transcript");
    let name = transcript.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    // The Kubernetes executor's cluster: a fake one, its kubeconfig where the recording's was.
    let _cluster = (name == "kubernetes").then(|| {
        let cluster = FakeCluster::start(&["--grace", "2s", "--nodes", "1"]);
        std::fs::copy(&cluster.kubeconfig, root.join("kubeconfig")).expect("copy the kubeconfig");
        cluster
    });
    let mut executor = Executor::start(&name);
    let (runner, recorded) = compat::speakers(&entries);
    let mut session = Replay { entries: &entries, paths: Vec::new(), failures: Vec::new(), runner, recorded };
    for (at, entry) in entries.iter().enumerate() {
        let Entry::Runner(message) = entry else { continue };
        let mut message = session.substituted(message);
        if !is_request(&message) {
            executor.send(&message);
            continue;
        }
        let recorded_stream = stream_of(&entries, &message["id"]);
        let stream = Stream::open(&mut message, root, recorded_stream);
        executor.send(&message);
        let (answer, output) = executor.answer(&message["id"]);
        let streamed = stream.map(Stream::finish);
        let old = response_to(&entries, at, &message["id"]).expect("each recorded request has its answer");
        session.compare(&message, old, &answer, &output, streamed.as_ref());
        if session.failures.len() > 20 {
            break;
        }
    }
    executor.finish();
    session.failures
}

/// One replay's state: the paths the executor answered in place of the recorded ones, and
/// what differed.
struct Replay<'a> {
    entries: &'a [Entry],
    paths: Vec<(String, String)>,
    failures: Vec<String>,
    runner: String,
    recorded: String,
}

impl Replay<'_> {
    /// A recorded request, with each path the recorded executor answered replaced by the one
    /// this executor answered.
    fn substituted(&self, message: &Value) -> Value {
        let mut text = message.to_string();
        for (old, new) in &self.paths {
            text = text.replace(old.as_str(), new);
        }
        serde_json::from_str(&text).expect("still JSON")
    }

    fn compare(&mut self, request: &Value, old: &Value, new: &Value, output: &str, streamed: Option<&Streamed>) {
        let name = method(request).unwrap_or_default();
        let id = &request["id"];
        let now = new.pointer("/result/executor").map_or_else(
            || "this executor".to_string(),
            |executor| format!("knotless-executor-{} {}", executor["name"], executor["version"]).replace('"', ""),
        );
        let said = |message: &Value| match message.get("error") {
            Some(error) => format!("error {}", error["code"]),
            None => "a result".to_string(),
        };
        if said(old) != said(new) {
            self.failures.push(format!(
                "`{name}` (request {id}): {now} answered {} where {} answered {}: {new}",
                said(new),
                self.recorded,
                said(old)
            ));
            return;
        }
        let (Some(old), Some(new)) = (old.get("result"), new.get("result")) else { return };
        for lacking in missing(old, new, "result") {
            self.failures.push(format!(
                "`{name}` (request {id}): {} reads what {} answered, and this answer differs: {lacking}",
                self.runner, self.recorded
            ));
        }
        match name {
            "start" => self.learn_paths(old, new),
            "command" => self.compare_step(id, old, new, output),
            "upload" | "download" => self.compare_stream(name, id, new, streamed),
            _ => {}
        }
    }

    fn learn_paths(&mut self, old: &Value, new: &Value) {
        let Some(old) = old.get("paths").and_then(Value::as_object) else { return };
        for (key, value) in old {
            if let (Some(old), Some(new)) = (value.as_str(), new["paths"][key].as_str()) {
                self.paths.push((old.to_string(), new.to_string()));
            }
        }
        // The longest first, so a folder's path is not replaced inside a longer one's.
        self.paths.sort_by_key(|(old, _)| std::cmp::Reverse(old.len()));
    }

    fn compare_step(&mut self, id: &Value, old: &Value, new: &Value, output: &str) {
        if old.get("exit_code") != new.get("exit_code") {
            self.failures.push(format!(
                "`command` (request {id}): exit code {} where {} gave {}",
                new["exit_code"], self.recorded, old["exit_code"]
            ));
        }
        let recorded = self.substituted(&Value::String(recorded_output(self.entries, id)));
        if recorded.as_str() != Some(output) {
            self.failures.push(format!(
                "`command` (request {id}): the step wrote {output:?} where under {} it wrote {recorded}",
                self.recorded
            ));
        }
    }

    fn compare_stream(&mut self, name: &str, id: &Value, new: &Value, streamed: Option<&Streamed>) {
        let Some(streamed) = streamed else { return };
        if new["bytes"].as_u64() != Some(streamed.bytes) {
            self.failures.push(format!(
                "`{name}` (request {id}): bytes {} for a stream of {} bytes: {} would call it a lost stream",
                new["bytes"], streamed.bytes, self.runner
            ));
        }
        if let Some(recorded) = &streamed.recorded_entries
            && recorded != &streamed.entries
        {
            self.failures.push(format!(
                "`{name}` (request {id}): the stream holds {:?} where under {} it held {recorded:?}",
                streamed.entries, self.recorded
            ));
        }
    }
}

/// What the recorded executor wrote for the step of request `id`, both streams, as
/// `stream: text` lines.
fn recorded_output(entries: &[Entry], id: &Value) -> String {
    let Some(at) = entries
        .iter()
        .position(|entry| matches!(entry, Entry::Runner(message) if is_request(message) && &message["id"] == id))
    else {
        return String::new();
    };
    let mut output = Output::default();
    for entry in &entries[at + 1..] {
        let Entry::Executor(message) = entry else { continue };
        if is_response(message) && &message["id"] == id {
            break;
        }
        if method(message) == Some("output") {
            output.add(message);
        }
    }
    output.text()
}

/// A step's output, each stream's bytes in order (the order between the two streams is not
/// the protocol's to keep).
#[derive(Default)]
struct Output(BTreeMap<String, Vec<u8>>);

impl Output {
    fn add(&mut self, message: &Value) {
        let data = message["params"]["data"].as_str().unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default();
        let stream = message["params"]["stream"].as_str().unwrap_or_default().to_string();
        self.0.entry(stream).or_default().extend(bytes);
    }

    fn text(&self) -> String {
        self.0.iter().map(|(stream, bytes)| format!("{stream}: {}", String::from_utf8_lossy(bytes))).collect()
    }
}

/// This tree's executor, spoken to line by line.
struct Executor {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
}

impl Executor {
    fn start(name: &str) -> Executor {
        let mut child = Command::new(bin(&format!("knotless-executor-{name}")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the executor");
        let stdout = child.stdout.take().expect("its stdout");
        let (sender, lines) = std::sync::mpsc::sync_channel(1024);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let message = serde_json::from_str(&line).unwrap_or(Value::String(line));
                if sender.send(message).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Executor { child, stdin, lines }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("the executor's stdin");
        writeln!(stdin, "{message}").and_then(|()| stdin.flush()).expect("write to the executor");
    }

    /// The answer to request `id`, and the output the executor sent before it.
    fn answer(&mut self, id: &Value) -> (Value, String) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut output = Output::default();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(message) if is_response(&message) && &message["id"] == id => return (message, output.text()),
                Ok(message) if method(&message) == Some("output") => output.add(&message),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("no answer to request {id} within 120 s"),
                Err(RecvTimeoutError::Disconnected) => panic!("the executor ended before answering request {id}"),
            }
        }
    }

    fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "the executor did not exit after its stdin closed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The side channel of a replayed `upload` or `download`: a socket of the test's in place of
/// the recorded one; an upload writes the recorded stream, a download reads the executor's.
struct Stream {
    thread: JoinHandle<Vec<u8>>,
    upload: bool,
    recorded: Option<Vec<u8>>,
}

/// What went over a side channel.
struct Streamed {
    bytes: u64,
    entries: Vec<String>,
    recorded_entries: Option<Vec<String>>,
}

impl Stream {
    fn open(request: &mut Value, folder: &Path, recorded: Option<&[u8]>) -> Option<Stream> {
        let upload = match method(request) {
            Some("upload") => true,
            Some("download") => false,
            _ => return None,
        };
        let path = folder.join(format!("channel-{}.sock", request["id"]));
        let listener = UnixListener::bind(&path).expect("bind a channel");
        request["params"]["channel"] = Value::String(path.display().to_string());
        let data = recorded.map(<[u8]>::to_vec);
        let written = data.clone().unwrap_or_default();
        let thread = std::thread::spawn(move || {
            // An executor that answers without connecting (an error) leaves nothing to move.
            let Some(mut connection) = accepted(&listener) else { return Vec::new() };
            if upload {
                connection.write_all(&written).expect("write the stream");
                written
            } else {
                let mut read = Vec::new();
                connection.read_to_end(&mut read).expect("read the stream");
                read
            }
        });
        Some(Stream { thread, upload, recorded: data })
    }

    fn finish(self) -> Streamed {
        let data = self.thread.join().expect("the channel's thread");
        let recorded_entries = if self.upload { None } else { self.recorded.as_deref().map(tar_entries) };
        Streamed { bytes: data.len() as u64, entries: tar_entries(&data), recorded_entries }
    }
}

/// The executor's connection to a channel, within a minute.
fn accepted(listener: &UnixListener) -> Option<std::os::unix::net::UnixStream> {
    listener.set_nonblocking(true).expect("a non-blocking listener");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((connection, _)) => {
                connection.set_nonblocking(false).expect("a blocking connection");
                connection.set_read_timeout(Some(Duration::from_secs(60))).expect("a read timeout");
                return Some(connection);
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => panic!("accept on a channel: {error}"),
        }
    }
    None
}

/// The paths, types and contents of a tar stream's entries, sorted; the folder itself (`.`),
/// which a reader skips, left out.
fn tar_entries(data: &[u8]) -> Vec<String> {
    let mut archive = tar::Archive::new(data);
    let mut entries: Vec<String> = archive
        .entries()
        .expect("a tar stream")
        .filter_map(|entry| {
            let mut entry = entry.expect("an entry");
            let path = entry.path().expect("a path").display().to_string();
            let path = path.trim_start_matches("./");
            if path.is_empty() || path == "." {
                return None;
            }
            let kind = format!("{:?}", entry.header().entry_type());
            let mut contents = Vec::new();
            entry.read_to_end(&mut contents).expect("its contents");
            Some(format!("{path} {kind} {}", String::from_utf8_lossy(&contents).escape_debug()))
        })
        .collect();
    entries.sort();
    entries
}

#[test]
fn this_trees_executors_answer_an_earlier_runner_as_its_own_executors_did() {
    for (release, executor, path) in transcripts() {
        let failures = replay_against_executor(&path);
        assert!(
            failures.is_empty(),
            "knotless-executor-{executor} of this tree behind a knotless-run {release} ({}):\n{}",
            path.display(),
            failures.join("\n")
        );
    }
}

#[test]
fn an_answer_with_a_renamed_result_field_is_named_as_an_earlier_runner_would_meet_it() {
    let folder = tempfile::tempdir().expect("a folder");
    let (_, _, path) =
        transcripts().into_iter().find(|(_, executor, _)| executor == "shell").expect("a shell transcript");
    let failures = replay_against_executor(&renamed_exit_code(&path, folder.path()));
    assert!(
        failures.iter().any(|failure| failure.contains("`result.exit_status` is missing")
            && failure.contains("knotless-run 0.1.0 reads what knotless-executor-shell 0.1.0 answered")),
        "{failures:#?}"
    );
}

/// This tree's runner runs the recorded workflow against `compat-replay` answering as the
/// recorded executor did; the run's result and its output.
fn run_against_recording(root: &Path, transcript: &Path, executor: &str) -> knotless_tests::Ran {
    let plugin = root.join(executor);
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nexec '{}' '{}' '{}'\n",
            bin("compat-replay").display(),
            transcript.display(),
            root.display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let repo = knotless_tests::Repo::init(&root.join("repo"));
    for file in ["greeting.txt", ".knotless/workflows/compat.yml"] {
        let text = std::fs::read_to_string(compat_root().join("workflow").join(file)).expect("the workflow's files");
        repo.write(file, &text);
    }
    repo.commit("compat");
    let mut args = vec!["run", repo.path().to_str().expect("UTF-8"), "--executor-plugin"];
    args.extend([plugin.to_str().expect("UTF-8"), "--runner-id", "compat", "--secret", "COMPAT_TOKEN"]);
    // The flags of the recorded run, its folder standing for this one's.
    let flags = std::fs::read_to_string(transcript.with_extension("args")).expect("the recorded run's flags");
    let flags: Vec<String> =
        flags.lines().map(|flag| flag.replace(compat::ROOT, root.to_str().expect("UTF-8"))).collect();
    args.extend(flags.iter().map(String::as_str));
    std::fs::write(root.join("kubeconfig"), "").expect("a kubeconfig the replay never reads");
    let mut command = knotless_run(&args);
    command.env("COMPAT_TOKEN", "compat-token-value").env("XDG_CACHE_HOME", root.join("cache")).current_dir(root);
    ran(command)
}

#[test]
fn this_runner_runs_the_workflow_against_each_earlier_executor() {
    for (release, executor, path) in transcripts() {
        let root = tempfile::tempdir().expect("a folder");
        let run = run_against_recording(root.path(), &path, &executor);
        let context = format!("knotless-run of this tree with a knotless-executor-{executor} {release}");
        assert_eq!(run.code, Some(0), "{context}:\n{}", run.both());
        for line in [
            "compat/checkout | a greeting from the checkout",
            "compat/secret | the token is ***",
            "compat/streams | hello on stderr",
        ] {
            assert!(run.stdout.contains(line), "{context}: no {line:?} in\n{}", run.both());
        }
        assert!(!run.both().contains("compat-token-value"), "{context}: the secret was shown:\n{}", run.both());
        let outputs = run
            .stdout
            .lines()
            .find_map(|line| line.strip_prefix("compat: 2 output file(s) in "))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{context}: no line of the 2 output files:\n{}", run.both()));
        assert!(outputs.starts_with(root.path()), "{context}: outputs in {}", outputs.display());
        let read = |file: &str| {
            std::fs::read(outputs.join(file))
                .unwrap_or_else(|error| panic!("{context}: {file}: {error}\n{}", run.both()))
        };
        assert_eq!(read("greeting.txt"), b"hello from the outputs\n", "{context}");
        assert_eq!(read("nested/data.bin"), b"binary\0bytes\n", "{context}");
    }
}

#[test]
fn a_renamed_result_field_fails_the_run_with_what_the_runner_tells_its_operator() {
    let folder = tempfile::tempdir().expect("a folder");
    let (_, _, path) =
        transcripts().into_iter().find(|(_, executor, _)| executor == "shell").expect("a shell transcript");
    let run = run_against_recording(folder.path(), &renamed_exit_code(&path, folder.path()), "shell");
    assert_ne!(run.code, Some(0), "{}", run.both());
    let said = "compat: error: step checkout: executor shell answered command with a result of the wrong shape (missing field `exit_code`";
    assert!(run.stdout.contains(said), "the runner's error names the field it missed:\n{}", run.both());
    assert!(
        !run.stdout.contains("executor shell executor shell"),
        "each message names the executor once:\n{}",
        run.both()
    );
}

#[test]
fn a_request_without_a_field_an_earlier_runner_sent_fails_the_run_naming_it() {
    let folder = tempfile::tempdir().expect("a folder");
    let (_, _, path) = transcripts()
        .into_iter()
        .find(|(release, executor, _)| release == "0.1.0" && executor == "shell")
        .expect("a shell transcript");
    // As if this runner had stopped sending a field the recorded one sent with each step.
    let transcript = edited(
        &path,
        folder.path(),
        "\"method\":\"command\",\"params\":{",
        "\"method\":\"command\",\"params\":{\"deadline_ms\":1000,",
    );
    let run = run_against_recording(folder.path(), &transcript, "shell");
    assert_ne!(run.code, Some(0), "{}", run.both());
    let said = "invalid params: `params.deadline_ms` is missing, which knotless-run 0.1.0 sent and knotless-executor-shell 0.1.0 may need";
    assert!(run.stdout.contains(said), "the runner shows the executor's refusal:\n{}", run.both());
}
