//! Step payloads for executors that run steps through a remote shell (an exec into a container
//! or pod, ssh, ...): the script written to the stdin of `sh -s`, and the sentinel that proves
//! the step's end and carries its exit code.
//!
//! The payload ([`build`]) is one `{ ...; }` block, so `sh` reads it whole before running any
//! of it (a stream cut short runs nothing, never the exports without the script): first the
//! snapshot of the environment's processes ([`SNAPSHOT`], shell builtins only, so it starts
//! nothing), printed on stderr as `\n<nonce>:procs:<shell pid> <pid>:<start time> ...\n`;
//! then `export NAME='value'` for every variable and then every secret (single-quoted, `'`
//! written `'\''`, so a secret wins over a variable of the same name), `cd -- <workdir>`, the
//! script as `sh -ec '<script>'` with stdin from `/dev/null`, then `printf '%s:out\n' <nonce>`
//! on stdout (the mark that the step's stdout is whole: the two streams may come with delays
//! of their own, and the exit code on stderr may come first; with no newline before it, so
//! that the filter never holds back the end of a line while it waits to see whether a mark
//! begins there), then
//! `printf '\n%s:%d\n' <nonce> "$?" >&2`, and `exit`: the shell ends there, never reading its
//! stdin again, so a transport whose stdin cannot be closed (an exec before Kubernetes 1.30)
//! ends all the same. The step's processes are then every process of the
//! environment that is not in the snapshot, not init, and not a descendant of a process in
//! the snapshot (a service an earlier step started forks its workers): [`SWEEP`] kills them,
//! whatever they did to their environment, session or process group.
//! The script runs as a child of the payload's shell, never through `exec`, so the shell
//! itself prints the sentinel when it ends: a remote exec may stay open while anything holds
//! its output (a service the step left running), so the step's completion is proven by the
//! sentinel, never by the end of the stream. Values are never in an argv, a file, or the
//! environment of the local client: the payload goes on the exec's stdin.
//!
//! [`SentinelFilter`] takes the sentinel out of the stderr stream, across chunk boundaries,
//! and yields the exit code, and the mark out of stdout; a stream that ends without them is a
//! lost stream, never a result.
//! [`nonce`] makes the per-step nonce from the kernel's random source.

use std::collections::BTreeMap;
use std::io::Read;

use crate::error::ExecutorError;

/// Quotes a value for POSIX `sh`: `'...'`, each `'` written `'\''`.
pub fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Whether a name can be a shell variable: ASCII letters, digits and `_`, not starting with a
/// digit.
pub fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|char| char.is_ascii_alphanumeric() || char == '_')
}

/// Refuses variables and secrets whose names cannot be exported, with a configuration error
/// naming them (never a value).
pub fn check_names(env: &BTreeMap<String, String>, secrets: &BTreeMap<String, String>) -> Result<(), ExecutorError> {
    for (kind, names) in [("variable", env), ("secret", secrets)] {
        if let Some(name) = names.keys().find(|name| !is_variable_name(name)) {
            return Err(ExecutorError::configuration(format!(
                "{kind} name {name:?} cannot be exported to a step: use letters, digits and '_'"
            )));
        }
    }
    Ok(())
}

/// What one step's payload is made of.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    /// The step's variables.
    pub env: &'a BTreeMap<String, String>,
    /// The step's secrets, exported after the variables.
    pub secrets: &'a BTreeMap<String, String>,
    /// The folder to run in.
    pub workdir: &'a str,
    /// The script.
    pub script: &'a str,
    /// The sentinel's nonce, fresh for every step (see [`nonce`]).
    pub nonce: &'a str,
}

/// Lists the environment's live processes but the shell itself as ` <pid>:<start time> ...`
/// in `$knotless_procs`, with shell builtins only. The start time (`/proc/<pid>/stat` field
/// 22) tells a process from a later one given the same pid; a process whose `stat` cannot be
/// read whole (a name holding a newline) is left out, so it is never spared.
pub const SNAPSHOT: &str = r#"knotless_procs=
for knotless_d in /proc/[0-9]*; do
  [ "${knotless_d#/proc/}" = "$$" ] && continue
  knotless_l=; read -r knotless_l 2>/dev/null <"$knotless_d/stat" || continue
  set -- ${knotless_l##*') '}
  [ "$#" -ge 20 ] && [ "$1" != Z ] || continue
  shift 19; knotless_procs="$knotless_procs ${knotless_d#/proc/}:$1"
done
"#;

/// Reads the environment's count of processes the kernel killed for memory (the `oom_kill`
/// line of the cgroup's `memory.events`, v2, or `memory.oom_control`, v1) into `$knotless_n`,
/// `-` when neither can be read; with shell builtins only.
pub const OOM_KILLS: &str = r#"knotless_oom() {
  knotless_n=-
  for knotless_f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
    [ -r "$knotless_f" ] || continue
    while read -r knotless_k knotless_v; do
      [ "$knotless_k" = oom_kill ] && knotless_n=$knotless_v
    done <"$knotless_f"
    [ "$knotless_n" = - ] || break
  done
}
"#;

/// Kills every process of the environment that is new since a snapshot: `$1` is the
/// payload's shell (killed but not counted); the snapshot (`<pid>:<start> ...`) is the line
/// on its stdin (it may be longer than an argument may be).
/// Spares init (pid 1), itself and what it starts, and every descendant of a process in the
/// snapshot. SIGKILL, round after round until no new process is left (a process forking
/// while it works is found in the next round); prints how many it killed. Shell builtins
/// only, but `sleep` between rounds.
pub const SWEEP: &str = r#"own=$$ payload=$1 n=0 hit=" " round=0 snap=
read -r snap || :
snap=" $snap "
while [ "$round" -lt 100 ]; do
  round=$((round + 1)); old=" "; table=" "; new=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = 1 ] || [ "$p" = "$own" ] && continue
    l=; read -r l 2>/dev/null <"$d/stat" || continue
    set -- ${l##*') '}
    if [ "$#" -ge 20 ]; then
      [ "$1" = Z ] && continue
      pp=$2; shift 19; st=$1
    else
      pp=0; st=-
    fi
    table="$table$p:$pp "
    case "$snap" in *" $p:$st "*) old="$old$p "; continue ;; esac
    new="$new $p:$pp"
  done
  victims=
  for e in $new; do
    p=${e%%:*}; a=${e#*:}; hops=0; spared=
    while [ "$hops" -lt 256 ]; do
      [ "$a" = "$own" ] && { spared=1; break; }
      case "$a" in 0|1) break ;; esac
      case "$old" in *" $a "*) spared=1; break ;; esac
      case "$table" in *" $a:"*) r=${table#*" $a:"}; a=${r%% *} ;; *) break ;; esac
      hops=$((hops + 1))
    done
    [ -z "$spared" ] && victims="$victims $p"
  done
  [ -z "$victims" ] && break
  for p in $victims; do
    kill -9 "$p" 2>/dev/null
    case "$hit" in *" $p "*) ;; *) hit="$hit$p "; [ "$p" = "$payload" ] || n=$((n + 1)) ;; esac
  done
  sleep 0.02 2>/dev/null || :
done
echo "$n""#;

/// The argv that runs [`SWEEP`] for a step: `sh -c <sweep> sh <payload pid>`; its stdin is
/// [`Snapshot::line`].
pub fn sweep_argv(snapshot: &Snapshot) -> Vec<String> {
    ["sh", "-c", SWEEP, "sh", &snapshot.shell.to_string()].into_iter().map(str::to_string).collect()
}

/// What the payload's snapshot said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The payload's shell, the step's parent.
    pub shell: u32,
    /// ` <pid>:<start> ...`: the processes there before the step.
    pub processes: String,
}

impl Snapshot {
    /// The stdin of [`SWEEP`].
    pub fn line(&self) -> String {
        format!("{}\n", self.processes)
    }

    fn parse(text: &[u8]) -> Option<Snapshot> {
        let text = std::str::from_utf8(text).ok()?;
        let (shell, processes) = text.split_once(' ').unwrap_or((text, ""));
        let wellformed = processes.split_whitespace().all(|entry| {
            entry.split_once(':').is_some_and(|(pid, start)| pid.parse::<u32>().is_ok() && start.parse::<u64>().is_ok())
        });
        if !wellformed {
            return None;
        }
        Some(Snapshot { shell: shell.parse().ok()?, processes: processes.trim().to_string() })
    }
}

/// The payload for `sh -s` (see the module's documentation). A bad name (see
/// [`check_names`]) or a value `sh` cannot hold (a NUL byte) is a configuration error.
pub fn build(step: &Step<'_>) -> Result<String, ExecutorError> {
    check_names(step.env, step.secrets)?;
    let mut payload = String::from("{\n");
    payload.push_str(SNAPSHOT);
    payload.push_str(&format!("printf '\\n%s:procs:%s%s\\n' {} \"$$\" \"$knotless_procs\" >&2\n", quote(step.nonce)));
    payload.push_str(OOM_KILLS);
    let oom = format!("knotless_oom; printf '\\n%s:oom:%s\\n' {} \"$knotless_n\" >&2\n", quote(step.nonce));
    payload.push_str(&oom);
    for (name, value) in step.env.iter().chain(step.secrets.iter()) {
        if value.contains('\0') {
            return Err(ExecutorError::configuration(format!("variable {name} holds a NUL byte, which sh cannot")));
        }
        payload.push_str(&format!("export {name}={}\n", quote(value)));
    }
    payload.push_str(&format!(
        "cd -- {} && sh -ec {} </dev/null\nknotless_rc=$?\nprintf '%s:out\\n' {}\n{oom}printf '\\n%s:%d\\n' {} \"$knotless_rc\" >&2\nexit\n}}\n",
        quote(step.workdir),
        quote(step.script),
        quote(step.nonce),
        quote(step.nonce)
    ));
    Ok(payload)
}

/// `bytes` random bytes from the kernel (`/dev/urandom`), as lowercase hex.
pub fn random_hex(bytes: usize) -> Result<String, ExecutorError> {
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut buffer))
        .map_err(|error| ExecutorError::infrastructure(format!("cannot read /dev/urandom: {error}")))?;
    Ok(buffer.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// A fresh sentinel nonce: 128 random bits as hex.
pub fn nonce() -> Result<String, ExecutorError> {
    random_hex(16)
}

/// The longest message the payload prints (its snapshot): 1 MiB.
const MAX_MESSAGE: usize = 1 << 20;

/// Strips the payload's messages from a stderr stream: the snapshot `\n<nonce>:procs:...\n`
/// and the sentinel `\n<nonce>:<code>\n`, passing every other byte on in order and holding
/// back only the bytes that could start a message, and keeps what they carry. Only the first
/// snapshot counts, and only before the sentinel.
pub struct SentinelFilter {
    needle: Vec<u8>,
    held: Vec<u8>,
    in_message: bool,
    code: Option<i32>,
    snapshot: Option<Snapshot>,
    snapshot_seen: bool,
    /// The environment's count of OOM kills before the step and after it, as the payload read
    /// them (`None` where it could not).
    oom: (Option<Option<u64>>, Option<Option<u64>>),
    /// Whether the payload's mark of the end of the step's stdout was seen (on stdout).
    output_ended: bool,
}

impl SentinelFilter {
    /// A filter for `nonce`.
    pub fn new(nonce: &str) -> SentinelFilter {
        SentinelFilter {
            needle: format!("\n{nonce}:").into_bytes(),
            held: Vec::new(),
            in_message: false,
            code: None,
            snapshot: None,
            snapshot_seen: false,
            oom: (None, None),
            output_ended: false,
        }
    }

    /// A filter for the mark of the end of stdout, `<nonce>:out`, with no newline before it.
    pub fn for_stdout(nonce: &str) -> SentinelFilter {
        SentinelFilter { needle: format!("{nonce}:").into_bytes(), ..SentinelFilter::new(nonce) }
    }

    /// Whether the payload's mark that the step's stdout is whole was seen: on stdout, after
    /// everything the step wrote there (what it left running may write more).
    pub fn output_ended(&self) -> bool {
        self.output_ended
    }

    /// How many processes the kernel killed for memory in the environment while the step ran,
    /// when the payload could read the count before and after it.
    pub fn oom_kills(&self) -> Option<u64> {
        match self.oom {
            (Some(Some(before)), Some(Some(after))) => Some(after.saturating_sub(before)),
            _ => None,
        }
    }

    /// The exit code, once the whole sentinel was seen.
    pub fn code(&self) -> Option<i32> {
        self.code
    }

    /// The snapshot of the processes there before the step, once seen whole.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }

    /// Takes a chunk; returns the bytes to pass on.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        let mut out = Vec::new();
        loop {
            if self.code.is_some() || self.output_ended {
                out.append(&mut self.held);
                return out;
            }
            if !self.in_message {
                match find(&self.held, &self.needle) {
                    Some(at) => {
                        out.extend(self.held.drain(..at));
                        self.held.drain(..self.needle.len());
                        self.in_message = true;
                    }
                    None => {
                        let keep = partial_suffix(&self.held, &self.needle);
                        let cut = self.held.len() - keep;
                        out.extend(self.held.drain(..cut));
                        return out;
                    }
                }
            }
            let Some(end) = self.held.iter().position(|byte| *byte == b'\n') else {
                if self.held.len() > MAX_MESSAGE {
                    // Nothing the payload prints is this long: drop it, and no snapshot counts.
                    self.held.clear();
                    self.in_message = false;
                    self.snapshot_seen = true;
                }
                return out;
            };
            let message: Vec<u8> = self.held.drain(..=end).collect();
            let message = &message[..end];
            self.in_message = false;
            if let Some(snapshot) = message.strip_prefix(b"procs:") {
                if !self.snapshot_seen {
                    self.snapshot_seen = true;
                    self.snapshot = Snapshot::parse(snapshot);
                }
            } else if message == b"out" {
                self.output_ended = true;
            } else if let Some(count) = message.strip_prefix(b"oom:") {
                let count = std::str::from_utf8(count).ok().and_then(|count| count.trim().parse::<u64>().ok());
                match self.oom {
                    (None, _) => self.oom.0 = Some(count),
                    (Some(_), None) => self.oom.1 = Some(count),
                    _ => {}
                }
            } else {
                self.code = Some(String::from_utf8_lossy(message).trim().parse().unwrap_or(-1));
            }
        }
    }

    /// The end of the stream: what is still held, unless it is a message cut short.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.in_message {
            self.held.clear();
            Vec::new()
        } else {
            std::mem::take(&mut self.held)
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// The length of the longest suffix of `data` that is a proper prefix of `needle`.
fn partial_suffix(data: &[u8], needle: &[u8]) -> usize {
    (1..needle.len().min(data.len() + 1)).rev().find(|&len| data.ends_with(&needle[..len])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_newlines_and_dollars() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME `x` \"y\"\nz"), "'$HOME `x` \"y\"\nz'");
        assert_eq!(quote("a\nb $x"), "'a\nb $x'");
        assert_eq!(quote(""), "''");
    }

    /// A small deterministic generator (xorshift), so the property test needs no crate.
    struct Generator(u64);

    impl Generator {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn string(&mut self) -> String {
            const ALPHABET: &[&str] = &[
                "'", "\\", "\n", "$", "`", "\"", " ", "\t", "a", "Z", "0", "%", "-", "!", "*", "{", "}", "é", "$(",
                "''",
            ];
            let length = (self.next() % 24) as usize;
            (0..length).map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize]).collect()
        }
    }

    #[test]
    fn quoted_values_round_trip_through_sh() {
        let mut generator = Generator(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            let value = generator.string();
            let output = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", quote(&value)))
                .output()
                .expect("run sh");
            assert!(output.status.success(), "{value:?}: {output:?}");
            assert_eq!(String::from_utf8_lossy(&output.stdout), value, "quoted as {}", quote(&value));
        }
    }

    #[test]
    fn variable_names() {
        assert!(is_variable_name("A_1") && is_variable_name("_x"));
        assert!(!is_variable_name("1A") && !is_variable_name("A-B") && !is_variable_name(""));
        let env = BTreeMap::from([("GOOD_1".to_string(), "x".to_string())]);
        assert!(check_names(&env, &BTreeMap::new()).is_ok());
        for bad in ["1X", "A-B", "", "A B"] {
            let secrets = BTreeMap::from([(bad.to_string(), "value".to_string())]);
            let error = check_names(&env, &secrets).expect_err(bad);
            assert!(error.message.contains(&format!("{bad:?}")), "{}", error.message);
            assert!(!error.message.contains("value"), "{}", error.message);
        }
    }

    fn step<'a>(env: &'a BTreeMap<String, String>, secrets: &'a BTreeMap<String, String>) -> Step<'a> {
        Step { env, secrets, workdir: "/work", script: "echo 'hi'", nonce: "n0" }
    }

    #[test]
    fn the_stdout_filter_never_holds_a_line_back_and_takes_the_mark_out() {
        let mut filter = SentinelFilter::for_stdout("n0");
        assert_eq!(filter.push(b"running\n"), b"running\n", "a whole line goes on at once");
        assert_eq!(filter.push(b"half n"), b"half ", "what may begin the mark waits");
        assert_eq!(filter.push(b"o more\n"), b"no more\n");
        assert!(!filter.output_ended());
        assert_eq!(filter.push(b"last, no newline"), b"last, no newline");
        assert_eq!(filter.push(b"n0:o"), b"");
        assert_eq!(filter.push(b"ut\nleft running\n"), b"left running\n");
        assert!(filter.output_ended());
    }

    #[test]
    fn the_payload_snapshots_then_exports_then_runs_then_reports() {
        let env = BTreeMap::from([("V".to_string(), "it's".to_string())]);
        let secrets = BTreeMap::from([("S".to_string(), "s3cr3t".to_string())]);
        let payload = build(&step(&env, &secrets)).expect("payload");
        let procs = r#"printf '\n%s:procs:%s%s\n' 'n0' "$$" "$knotless_procs" >&2
"#;
        let oom = r#"knotless_oom; printf '\n%s:oom:%s\n' 'n0' "$knotless_n" >&2
"#;
        let tail = r#"export V='it'\''s'
export S='s3cr3t'
cd -- '/work' && sh -ec 'echo '\''hi'\''' </dev/null
knotless_rc=$?
printf '%s:out\n' 'n0'
"#;
        let end = r#"printf '\n%s:%d\n' 'n0' "$knotless_rc" >&2
exit
}
"#;
        assert_eq!(payload, format!("{{\n{SNAPSHOT}{procs}{OOM_KILLS}{oom}{tail}{oom}{end}"));
        let bad = BTreeMap::from([("A-B".to_string(), String::new())]);
        assert!(build(&step(&bad, &secrets)).is_err());
        let nul = BTreeMap::from([("A".to_string(), "a\0b".to_string())]);
        assert!(build(&step(&nul, &secrets)).is_err());
    }

    /// Runs `sh -s` with `input`; returns its stdout and its stderr, each through a filter, and
    /// stderr's filter; stdout's must have seen the mark of its end.
    fn run_payload(input: &str, nonce: &str) -> (String, Vec<u8>, SentinelFilter) {
        use std::io::Write;
        let mut child = std::process::Command::new("sh")
            .arg("-s")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run sh");
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write");
        let output = child.wait_with_output().expect("wait");
        let mut filter = SentinelFilter::new(nonce);
        let mut stderr = filter.push(&output.stderr);
        stderr.extend(filter.finish());
        let mut out_filter = SentinelFilter::for_stdout(nonce);
        let mut stdout = out_filter.push(&output.stdout);
        stdout.extend(out_filter.finish());
        assert!(out_filter.output_ended() || filter.code().is_none(), "the mark of stdout's end came");
        (String::from_utf8_lossy(&stdout).into_owned(), stderr, filter)
    }

    /// The payload's shell ends at the payload's end with its stdin still open: a transport
    /// that cannot end a command's stdin (an exec before Kubernetes 1.30) still sees it end.
    #[test]
    fn the_payload_ends_its_shell_without_the_end_of_its_stdin() {
        use std::io::Write;
        let env = BTreeMap::new();
        let dir = std::env::temp_dir();
        let workdir = dir.to_string_lossy();
        let payload = build(&Step { workdir: &workdir, script: "exit 5", ..step(&env, &env) }).expect("payload");
        let mut child = std::process::Command::new("sh")
            .arg("-s")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run sh");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(payload.as_bytes()).expect("write");
        stdin.flush().expect("flush");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() > until {
                let _ = child.kill();
                panic!("the shell waits for the end of its stdin");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(status.success(), "{status:?}");
        drop(stdin);
    }

    #[test]
    fn the_payload_runs_in_sh_and_reports_through_the_filter() {
        let env = BTreeMap::from([("V".to_string(), "it's $x".to_string())]);
        let secrets = BTreeMap::from([("V".to_string(), "secret wins".to_string())]);
        let dir = std::env::temp_dir();
        let workdir = dir.to_string_lossy();
        let payload = build(&Step {
            workdir: &workdir,
            script: r#"printf '%s|%s' "$V" "${knotless_procs-unset}"; printf err >&2; exit 3"#,
            nonce: "abc123",
            ..step(&env, &secrets)
        })
        .expect("payload");
        let (stdout, stderr, filter) = run_payload(&payload, "abc123");
        // The snapshot's variables stay in the payload's shell.
        assert_eq!(stdout, "secret wins|unset");
        assert_eq!(String::from_utf8_lossy(&stderr), "err");
        assert_eq!(filter.code(), Some(3));
        let snapshot = filter.snapshot().expect("a snapshot");
        let listed = format!(" {} ", snapshot.processes);
        assert!(listed.contains(&format!(" {}:", std::process::id())), "this test is in {snapshot:?}");
        assert!(!listed.contains(&format!(" {}:", snapshot.shell)), "the payload's shell is not: {snapshot:?}");
        let readable = ["/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"]
            .iter()
            .any(|file| std::fs::read_to_string(file).is_ok_and(|text| text.contains("oom_kill ")));
        assert_eq!(filter.oom_kills().is_some(), readable, "the count of OOM kills is read where it can be");
    }

    #[test]
    fn the_oom_kills_are_the_count_after_the_step_less_the_count_before() {
        let mut filter = SentinelFilter::new("n0");
        let passed = filter.push(b"a\nn0:oom:3\nb\nn0:oom:5\n\nn0:oom:9\nc\nn0:0\n");
        assert_eq!(passed, b"abc", "a third count is taken out too, and ignored");
        assert_eq!((filter.code(), filter.oom_kills()), (Some(0), Some(2)));
        let mut unreadable = SentinelFilter::new("n0");
        unreadable.push(b"\nn0:oom:-\n\nn0:oom:-\n\nn0:137\n");
        assert_eq!((unreadable.code(), unreadable.oom_kills()), (Some(137), None));
        let mut cut = SentinelFilter::new("n0");
        cut.push(b"\nn0:oom:1\n\nn0:137\n");
        assert_eq!((cut.code(), cut.oom_kills()), (Some(137), None), "no count after the step: none");
    }

    /// A script, run in a pid namespace of its own as a container is, that leaves processes
    /// hiding in every way and runs the sweep (`$1`), then says which live.
    const HIDE_THEN_SWEEP: &str = r#"sweep=$1
sh -c 'echo $$ > old; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
while [ ! -s old ]; do sleep 0.01; done
SNAPSHOT
sh -c 'sleep 300 & echo $! > worker; wait' </dev/null >/dev/null 2>&1 &
(setsid sh -c 'echo $$ > hidden1; exec sleep 300' </dev/null >/dev/null 2>&1 &)
sh -c 'sh -c "trap \"\" TERM; echo \$\$ > hidden2; exec sleep 300" </dev/null >/dev/null 2>&1 & exit 0'
env -i sh -c 'echo $$ > hidden3; kill -STOP $$; exec sleep 300' </dev/null >/dev/null 2>&1 &
while [ ! -s hidden1 ] || [ ! -s hidden2 ] || [ ! -s hidden3 ] || [ ! -s worker ]; do sleep 0.01; done
printf '%s\n' "$knotless_procs" > snapshot
sh -c "$sweep" sh $$ < snapshot > killed
for f in old worker hidden1 hidden2 hidden3; do
  if kill -0 "$(cat $f)" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$(cat $f)/status"; then echo "$f lives"; else echo "$f dead"; fi
done
"#;

    #[test]
    fn the_sweep_kills_what_hides_and_spares_what_was_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = HIDE_THEN_SWEEP.replace("SNAPSHOT\n", SNAPSHOT);
        // `--fork`: the script's shell is pid 1, as a container's init; `--mount-proc`: the
        // sweep sees the namespace's processes only.
        let output = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script, "sh", SWEEP])
            .current_dir(dir.path())
            .output()
            .expect("unshare");
        assert!(output.status.success(), "{output:?}");
        // The worker's shell was made after the snapshot, but by nothing of the step's: it is
        // new, and killed with its sleep; the process there before lives on.
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "old lives\nworker dead\nhidden1 dead\nhidden2 dead\nhidden3 dead\n",
            "{output:?}"
        );
        let killed = std::fs::read_to_string(dir.path().join("killed")).expect("killed");
        // worker's shell and sleep, and the three hidden ones.
        assert_eq!(killed.trim(), "5", "{output:?}");
    }

    #[test]
    fn the_sweep_spares_the_workers_an_old_process_forks() {
        let dir = tempfile::tempdir().expect("tempdir");
        // An old process that forks a worker after the snapshot, when told to.
        let script = format!(
            r#"sweep=$1
sh -c 'echo $$ > old; while [ ! -e go ]; do sleep 0.01; done; sleep 300 & echo $! > worker; wait' </dev/null >/dev/null 2>&1 &
while [ ! -s old ]; do sleep 0.01; done
{SNAPSHOT}touch go; while [ ! -s worker ]; do sleep 0.01; done
printf '%s\n' "$knotless_procs" > snapshot
sh -c "$sweep" sh $$ < snapshot > killed
kill -0 "$(cat worker)" && echo worker lives"#
        );
        let output = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script, "sh", SWEEP])
            .current_dir(dir.path())
            .output()
            .expect("unshare");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "worker lives\n", "{output:?}");
        let killed = std::fs::read_to_string(dir.path().join("killed")).expect("killed");
        assert_eq!(killed.trim(), "0", "{output:?}");
    }

    #[test]
    fn the_sentinel_is_stripped_across_every_chunk_boundary() {
        let stream = b"err\n\nabc:42\nlater";
        for split in 0..=stream.len() {
            for second in split..=stream.len() {
                let mut filter = SentinelFilter::new("abc");
                let mut out = filter.push(&stream[..split]);
                out.extend(filter.push(&stream[split..second]));
                out.extend(filter.push(&stream[second..]));
                out.extend(filter.finish());
                assert_eq!(out, b"err\nlater", "split at {split} and {second}");
                assert_eq!(filter.code(), Some(42));
            }
        }
    }

    #[test]
    fn the_snapshot_is_taken_out_across_every_chunk_boundary_and_only_the_first_counts() {
        let stream = b"a\n\nabc:procs:9 1:5 2:6\nb\n\nabc:procs:8\n\nabc:0\nlater";
        for split in 0..=stream.len() {
            let mut filter = SentinelFilter::new("abc");
            let mut out = filter.push(&stream[..split]);
            out.extend(filter.push(&stream[split..]));
            out.extend(filter.finish());
            assert_eq!(out, b"a\nb\nlater", "split at {split}");
            assert_eq!(filter.code(), Some(0));
            let expected = Snapshot { shell: 9, processes: "1:5 2:6".to_string() };
            assert_eq!(filter.snapshot(), Some(&expected));
        }
        let mut filter = SentinelFilter::new("abc");
        filter.push(b"\nabc:procs:9 1:x\n");
        assert_eq!(filter.snapshot(), None, "a malformed snapshot is no snapshot");
    }

    #[test]
    fn look_alikes_pass_through_and_no_sentinel_means_no_code() {
        let mut filter = SentinelFilter::new("abc");
        let mut out = filter.push(b"partial\nab");
        out.extend(filter.push(b"X\nabc"));
        out.extend(filter.finish());
        assert_eq!(out, b"partial\nabX\nabc");
        assert_eq!(filter.code(), None);
    }

    #[test]
    fn nonces_are_fresh_hex() {
        let (first, second) = (nonce().expect("nonce"), nonce().expect("nonce"));
        assert_eq!(first.len(), 32);
        assert!(first.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert_ne!(first, second);
    }
}
