//! The step payload written to `kubectl exec -i <pod> -- sh -s`, and the sentinel that proves
//! the step's end.
//!
//! The payload is one `{ ...; }` block, so `sh` parses it whole before running any of it:
//! `export NAME='value'` for every variable and secret (single-quoted, `'` as `'\''`), the
//! step's marker variable, then the script in a subshell, `cd` to the workdir and
//! `exec sh -ec '<script>'` with stdin from `/dev/null`, then
//! `printf '\n<nonce>:%d\n' $? >&2`. Values are never in argv, a file, or kubectl's
//! environment. The sentinel is stripped from stderr by [`SentinelFilter`]; a stream that
//! closes without it is a lost stream, never a result.

use std::collections::BTreeMap;

use knotless_protocol::ExecutorError;

/// The variable that marks every process of a step, so leftovers can be found in `/proc`.
pub const MARKER: &str = "KNOTLESS_STEP_MARKER";

/// Quotes a value for POSIX `sh`: `'...'`, with `'` written as `'\''`.
pub fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// Whether a name can be exported by `sh`.
pub fn is_shell_name(name: &str) -> bool {
    name.starts_with(|char: char| char.is_ascii_alphabetic() || char == '_')
        && name.chars().all(|char| char.is_ascii_alphanumeric() || char == '_')
}

/// What a step payload is made of.
pub struct Step<'a> {
    /// Variables, then secrets (a secret wins over a variable of the same name).
    pub env: &'a BTreeMap<String, String>,
    /// The step's secrets.
    pub secrets: &'a BTreeMap<String, String>,
    /// The marker value of this step.
    pub marker: &'a str,
    /// The folder to run in.
    pub workdir: &'a str,
    /// The script.
    pub script: &'a str,
    /// The sentinel nonce.
    pub nonce: &'a str,
}

/// The payload for `sh -s`. A value that `sh` cannot hold (a NUL) or a bad name is refused.
pub fn build(step: &Step<'_>) -> Result<String, ExecutorError> {
    let mut payload = String::from("{\n");
    for (name, value) in step.env.iter().chain(step.secrets.iter()) {
        if !is_shell_name(name) || name == MARKER {
            return Err(ExecutorError::configuration(format!("variable name {name:?} is not a valid shell name")));
        }
        if value.contains('\0') {
            return Err(ExecutorError::configuration(format!("variable {name} holds a NUL byte, which sh cannot")));
        }
        payload.push_str(&format!("export {name}={}\n", quote(value)));
    }
    payload.push_str(&format!("export {MARKER}={}\n", quote(step.marker)));
    payload.push_str(&format!(
        "( cd {} && exec sh -ec {} ) </dev/null\nprintf '\\n%s:%d\\n' {} \"$?\" >&2\n}}\n",
        quote(step.workdir),
        quote(step.script),
        quote(step.nonce)
    ));
    Ok(payload)
}

/// Strips the sentinel `\n<nonce>:<code>\n` from a stderr stream, holding back only the bytes
/// that could be its start, and keeps the exit code it carries.
pub struct SentinelFilter {
    needle: Vec<u8>,
    held: Vec<u8>,
    code: Option<i32>,
    found_at_needle: bool,
}

impl SentinelFilter {
    /// A filter for `nonce`.
    pub fn new(nonce: &str) -> SentinelFilter {
        SentinelFilter {
            needle: format!("\n{nonce}:").into_bytes(),
            held: Vec::new(),
            code: None,
            found_at_needle: false,
        }
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
        if !self.found_at_needle {
            match find(&self.held, &self.needle) {
                Some(at) => {
                    let out = self.held[..at].to_vec();
                    self.held.drain(..at + self.needle.len());
                    self.found_at_needle = true;
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

    /// The end of the stream: what is still held, when no sentinel came.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.found_at_needle { Vec::new() } else { std::mem::take(&mut self.held) }
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
    fn quoting_survives_quotes_and_newlines() {
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote("a\nb $x"), "'a\nb $x'");
        assert!(is_shell_name("A_1") && !is_shell_name("1A") && !is_shell_name("A-B"));
    }

    #[test]
    fn payload_shape() {
        let env = BTreeMap::from([("V".to_string(), "it's".to_string())]);
        let secrets = BTreeMap::from([("S".to_string(), "s3cr3t".to_string())]);
        let step =
            Step { env: &env, secrets: &secrets, marker: "m1", workdir: "/work", script: "echo hi", nonce: "n0" };
        let payload = build(&step).expect("payload");
        assert_eq!(
            payload,
            "{\nexport V='it'\\''s'\nexport S='s3cr3t'\nexport KNOTLESS_STEP_MARKER='m1'\n\
             ( cd '/work' && exec sh -ec 'echo hi' ) </dev/null\nprintf '\\n%s:%d\\n' 'n0' \"$?\" >&2\n}\n"
        );
        let bad = BTreeMap::from([("A-B".to_string(), String::new())]);
        assert!(build(&Step { env: &bad, ..step }).is_err());
    }

    #[test]
    fn the_sentinel_is_stripped_across_chunk_boundaries() {
        let stream = b"err\n\nabc:7\n";
        for split in 0..=stream.len() {
            let mut filter = SentinelFilter::new("abc");
            let mut out = filter.push(&stream[..split]);
            out.extend(filter.push(&stream[split..]));
            out.extend(filter.finish());
            assert_eq!(out, b"err\n", "split at {split}");
            assert_eq!(filter.code(), Some(7));
        }
    }

    #[test]
    fn no_sentinel_means_no_code() {
        let mut filter = SentinelFilter::new("abc");
        let mut out = filter.push(b"partial\nab");
        out.extend(filter.finish());
        assert_eq!(out, b"partial\nab");
        assert_eq!(filter.code(), None);
    }
}
