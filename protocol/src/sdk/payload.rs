//! Step payloads for executors that run steps through a remote shell (an exec into a container
//! or pod, ssh, ...): the script written to the stdin of `sh -s`, and the sentinel that proves
//! the step's end and carries its exit code.
//!
//! The payload ([`build`]) is one `{ ...; }` block, so `sh` reads it whole before running any
//! of it (a stream cut short runs nothing, never the exports without the script):
//! `export NAME='value'` for every variable and then every secret (single-quoted, `'` written
//! `'\''`, so a secret wins over a variable of the same name), `export <marker variable>=...`
//! so the step's processes can be found again in `/proc`, `cd -- <workdir>`, the script as
//! `sh -ec '<script>'` with stdin from `/dev/null`, then `printf '\n%s:%d\n' <nonce> "$?" >&2`.
//! The script runs as a child of the payload's shell, never through `exec`, so the shell
//! itself prints the sentinel when it ends: a remote exec may stay open while anything holds
//! its output (a service the step left running), so the step's completion is proven by the
//! sentinel, never by the end of the stream. Values are never in an argv, a file, or the
//! environment of the local client: the payload goes on the exec's stdin.
//!
//! [`SentinelFilter`] takes the sentinel out of the stderr stream, across chunk boundaries,
//! and yields the exit code; a stream that ends without it is a lost stream, never a result.
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

/// Refuses variables and secrets whose names cannot be exported, or that would replace the
/// marker variable `reserved`, with a configuration error naming them (never a value).
pub fn check_names(
    env: &BTreeMap<String, String>,
    secrets: &BTreeMap<String, String>,
    reserved: &str,
) -> Result<(), ExecutorError> {
    for (kind, names) in [("variable", env), ("secret", secrets)] {
        if let Some(name) = names.keys().find(|name| !is_variable_name(name) || name.as_str() == reserved) {
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
    /// The name of the variable that marks every process of the step.
    pub marker_variable: &'a str,
    /// Its value for this step.
    pub marker: &'a str,
    /// The folder to run in.
    pub workdir: &'a str,
    /// The script.
    pub script: &'a str,
    /// The sentinel's nonce, fresh for every step (see [`nonce`]).
    pub nonce: &'a str,
}

/// The payload for `sh -s` (see the module's documentation). A bad name (see
/// [`check_names`]) or a value `sh` cannot hold (a NUL byte) is a configuration error.
pub fn build(step: &Step<'_>) -> Result<String, ExecutorError> {
    check_names(step.env, step.secrets, step.marker_variable)?;
    if !is_variable_name(step.marker_variable) {
        return Err(ExecutorError::configuration(format!(
            "marker variable {:?} is not a shell variable name",
            step.marker_variable
        )));
    }
    let mut payload = String::from("{\n");
    for (name, value) in step.env.iter().chain(step.secrets.iter()) {
        if value.contains('\0') {
            return Err(ExecutorError::configuration(format!("variable {name} holds a NUL byte, which sh cannot")));
        }
        payload.push_str(&format!("export {name}={}\n", quote(value)));
    }
    payload.push_str(&format!("export {}={}\n", step.marker_variable, quote(step.marker)));
    payload.push_str(&format!(
        "cd -- {} && sh -ec {} </dev/null\nprintf '\\n%s:%d\\n' {} \"$?\" >&2\n}}\n",
        quote(step.workdir),
        quote(step.script),
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

/// Strips the sentinel `\n<nonce>:<code>\n` from a stderr stream, passing every other byte on
/// in order and holding back only the bytes that could be its start, and keeps the exit code
/// it carries.
pub struct SentinelFilter {
    needle: Vec<u8>,
    held: Vec<u8>,
    code: Option<i32>,
    found_needle: bool,
}

impl SentinelFilter {
    /// A filter for `nonce`.
    pub fn new(nonce: &str) -> SentinelFilter {
        SentinelFilter { needle: format!("\n{nonce}:").into_bytes(), held: Vec::new(), code: None, found_needle: false }
    }

    /// The exit code, once the whole sentinel was seen.
    pub fn code(&self) -> Option<i32> {
        self.code
    }

    /// Takes a chunk; returns the bytes to pass on.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        if self.code.is_some() {
            return std::mem::take(&mut self.held);
        }
        if !self.found_needle {
            match find(&self.held, &self.needle) {
                Some(at) => {
                    let out = self.held[..at].to_vec();
                    self.held.drain(..at + self.needle.len());
                    self.found_needle = true;
                    return [out, self.parse_code()].concat();
                }
                None => {
                    let keep = partial_suffix(&self.held, &self.needle);
                    let cut = self.held.len() - keep;
                    return self.held.drain(..cut).collect();
                }
            }
        }
        self.parse_code()
    }

    /// After the needle: the digits up to `\n` give the code; what follows is passed on.
    fn parse_code(&mut self) -> Vec<u8> {
        let Some(end) = self.held.iter().position(|byte| *byte == b'\n') else {
            return Vec::new();
        };
        let digits = String::from_utf8_lossy(&self.held[..end]).into_owned();
        self.code = Some(digits.trim().parse().unwrap_or(-1));
        self.held.drain(..=end);
        std::mem::take(&mut self.held)
    }

    /// The end of the stream: what is still held, unless it is a sentinel cut short.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.found_needle && self.code.is_none() {
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
        assert!(check_names(&env, &BTreeMap::new(), "MARK").is_ok());
        for bad in ["1X", "A-B", "", "A B", "MARK"] {
            let secrets = BTreeMap::from([(bad.to_string(), "value".to_string())]);
            let error = check_names(&env, &secrets, "MARK").expect_err(bad);
            assert!(error.message.contains(&format!("{bad:?}")), "{}", error.message);
            assert!(!error.message.contains("value"), "{}", error.message);
        }
    }

    fn step<'a>(env: &'a BTreeMap<String, String>, secrets: &'a BTreeMap<String, String>) -> Step<'a> {
        Step { env, secrets, marker_variable: "MARK", marker: "m1", workdir: "/work", script: "echo 'hi'", nonce: "n0" }
    }

    #[test]
    fn the_payload_exports_then_runs_then_reports() {
        let env = BTreeMap::from([("V".to_string(), "it's".to_string())]);
        let secrets = BTreeMap::from([("S".to_string(), "s3cr3t".to_string())]);
        assert_eq!(
            build(&step(&env, &secrets)).expect("payload"),
            "{\nexport V='it'\\''s'\nexport S='s3cr3t'\nexport MARK='m1'\n\
             cd -- '/work' && sh -ec 'echo '\\''hi'\\''' </dev/null\nprintf '\\n%s:%d\\n' 'n0' \"$?\" >&2\n}\n"
        );
        let bad = BTreeMap::from([("A-B".to_string(), String::new())]);
        assert!(build(&step(&bad, &secrets)).is_err());
        let nul = BTreeMap::from([("A".to_string(), "a\0b".to_string())]);
        assert!(build(&step(&nul, &secrets)).is_err());
    }

    #[test]
    fn the_payload_runs_in_sh_and_reports_through_the_filter() {
        use std::io::Write;
        let env = BTreeMap::from([("V".to_string(), "it's $x".to_string())]);
        let secrets = BTreeMap::from([("V".to_string(), "secret wins".to_string())]);
        let dir = std::env::temp_dir();
        let workdir = dir.to_string_lossy();
        let payload = build(&Step {
            workdir: &workdir,
            script: "printf '%s|%s' \"$V\" \"$MARK\"; printf err >&2; exit 3",
            nonce: "abc123",
            ..step(&env, &secrets)
        })
        .expect("payload");
        let mut child = std::process::Command::new("sh")
            .arg("-s")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run sh");
        child.stdin.take().expect("stdin").write_all(payload.as_bytes()).expect("write");
        let output = child.wait_with_output().expect("wait");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "secret wins|m1");
        let mut filter = SentinelFilter::new("abc123");
        let mut stderr = filter.push(&output.stderr);
        stderr.extend(filter.finish());
        assert_eq!(String::from_utf8_lossy(&stderr), "err");
        assert_eq!(filter.code(), Some(3));
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
