//! What goes on the stdin of `docker exec -i <container> sh -s` for a step, the script that
//! sweeps a step's processes out of the container's `/proc`, and the scanner that finds the
//! step's exit report in its stderr.
//!
//! The payload exports the step's variables and secrets as single-quoted `export` lines, tags
//! the step with its marker variable [`MARKER`], runs the script as `sh -ec '<script>'` with
//! stdin from `/dev/null`, then prints `<sentinel> <exit code>` on stderr. The report is
//! needed because `docker exec` ends only when every process holding its output ends: a
//! service a step leaves running would keep it open, so the step's completion is proven by
//! the report, and `docker exec`'s own end is only awaited for a short while after it.

use std::collections::BTreeMap;

use knotless_protocol::ExecutorError;

/// The variable every process of a step carries, so the sweep finds them in `/proc`.
pub const MARKER: &str = "KNOTLESS_STEP";

/// Kills, inside the container, every process whose environment holds `KNOTLESS_STEP=$1`,
/// round after round until none is left, and prints how many it killed.
pub const SWEEP: &str = r#"m="KNOTLESS_STEP=$1"; seen=" "; n=0; round=0
while [ "$round" -lt 20 ]; do
  round=$((round + 1)); found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    if tr '\000' '\n' < "$d/environ" 2>/dev/null | grep -qxF -e "$m"; then
      kill -9 "$p" 2>/dev/null && found=1
      case "$seen" in *" $p "*) ;; *) seen="$seen$p "; n=$((n + 1)) ;; esac
    fi
  done
  [ "$found" = 0 ] && break
done
echo "$n""#;

/// Quotes a value for POSIX sh: `'...'`, each `'` written `'\''`.
pub fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Whether a name can be a shell variable: letters, digits and `_`, not starting with a digit.
pub fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|char| char.is_ascii_alphanumeric() || char == '_')
}

/// Refuses variables and secrets whose names cannot be exported, naming them (never a value).
pub fn check_names(env: &BTreeMap<String, String>, secrets: &BTreeMap<String, String>) -> Result<(), ExecutorError> {
    for (kind, names) in [("variable", env), ("secret", secrets)] {
        if let Some(name) = names.keys().find(|name| !is_variable_name(name) || name.as_str() == MARKER) {
            return Err(ExecutorError::configuration(format!(
                "{kind} name {name:?} cannot be exported to a step: use letters, digits and '_'"
            )));
        }
    }
    Ok(())
}

/// What one step runs.
pub struct Step<'a> {
    pub env: &'a BTreeMap<String, String>,
    pub secrets: &'a BTreeMap<String, String>,
    pub marker: &'a str,
    pub workdir: &'a str,
    pub script: &'a str,
    pub sentinel: &'a str,
}

/// The payload of a step (see the module's documentation). Secrets come after variables, so
/// a secret wins over a variable of the same name.
pub fn step(step: &Step<'_>) -> String {
    let mut payload = String::new();
    for (name, value) in step.env.iter().chain(step.secrets.iter()) {
        payload.push_str(&format!("export {name}={}\n", quote(value)));
    }
    payload.push_str(&format!("export {MARKER}={}\n", quote(step.marker)));
    payload.push_str(&format!(
        "cd -- {} && sh -ec {} </dev/null\nprintf '%s %d\\n' {} \"$?\" >&2\n",
        quote(step.workdir),
        quote(step.script),
        quote(step.sentinel)
    ));
    payload
}

/// `n` random bytes from the kernel, as hex.
pub fn random_hex(bytes: usize) -> Result<String, ExecutorError> {
    use std::io::Read;
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut buffer))
        .map_err(|error| ExecutorError::infrastructure(format!("cannot read /dev/urandom: {error}")))?;
    Ok(buffer.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Finds `<sentinel> <code>\n` in a stderr stream and takes it out, passing every other byte
/// through in order. Bytes that may be the start of the sentinel are held back until known.
pub struct ExitScanner {
    sentinel: Vec<u8>,
    held: Vec<u8>,
    code: Option<i32>,
}

impl ExitScanner {
    pub fn new(sentinel: &str) -> ExitScanner {
        ExitScanner { sentinel: format!("{sentinel} ").into_bytes(), held: Vec::new(), code: None }
    }

    /// The exit code reported, once seen.
    pub fn code(&self) -> Option<i32> {
        self.code
    }

    /// Takes in a chunk; returns the bytes to pass on.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.code.is_some() {
            return bytes.to_vec();
        }
        self.held.extend_from_slice(bytes);
        if let Some(start) = find(&self.held, &self.sentinel) {
            let after = start + self.sentinel.len();
            let Some(newline) = self.held[after..].iter().position(|&byte| byte == b'\n') else {
                let out = self.held[..start].to_vec();
                self.held.drain(..start);
                return out;
            };
            let number = String::from_utf8_lossy(&self.held[after..after + newline]).trim().to_string();
            self.code = Some(number.parse().unwrap_or(-1));
            let mut out = self.held[..start].to_vec();
            out.extend_from_slice(&self.held[after + newline + 1..]);
            self.held.clear();
            return out;
        }
        // Hold back the longest tail that is a start of the sentinel.
        let keep = (1..self.sentinel.len().min(self.held.len() + 1))
            .rev()
            .find(|&length| self.held.ends_with(&self.sentinel[..length]))
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_vec();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// The bytes still held when the stream ended.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME `x` \"y\"\nz"), "'$HOME `x` \"y\"\nz'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn variable_names() {
        let env = BTreeMap::from([("GOOD_1".to_string(), "x".to_string())]);
        assert!(check_names(&env, &BTreeMap::new()).is_ok());
        for bad in ["1X", "A-B", "", "A B", "KNOTLESS_STEP"] {
            let secrets = BTreeMap::from([(bad.to_string(), "value".to_string())]);
            let error = check_names(&env, &secrets).expect_err(bad);
            assert!(!error.message.contains("value"), "{}", error.message);
        }
    }

    #[test]
    fn the_payload_exports_then_runs_then_reports() {
        let env = BTreeMap::from([("A".to_string(), "it's".to_string())]);
        let secrets = BTreeMap::from([("S".to_string(), "hush".to_string())]);
        let payload = step(&Step {
            env: &env,
            secrets: &secrets,
            marker: "m1",
            workdir: "/work",
            script: "echo 'hi'",
            sentinel: "knotless-exit-x",
        });
        assert_eq!(
            payload,
            "export A='it'\\''s'\nexport S='hush'\nexport KNOTLESS_STEP='m1'\n\
             cd -- '/work' && sh -ec 'echo '\\''hi'\\''' </dev/null\nprintf '%s %d\\n' 'knotless-exit-x' \"$?\" >&2\n"
        );
    }

    #[test]
    fn the_scanner_takes_out_the_report_even_split_across_chunks() {
        let mut scanner = ExitScanner::new("SENT");
        let mut out = Vec::new();
        for chunk in ["err\nSE", "NT", " 4", "2\nlater"] {
            out.extend(scanner.feed(chunk.as_bytes()));
        }
        out.extend(scanner.finish());
        assert_eq!(String::from_utf8_lossy(&out), "err\nlater");
        assert_eq!(scanner.code(), Some(42));
    }

    #[test]
    fn the_scanner_passes_look_alikes_through() {
        let mut scanner = ExitScanner::new("SENT");
        let mut out = scanner.feed(b"SEN");
        out.extend(scanner.feed(b"X SE"));
        out.extend(scanner.finish());
        assert_eq!(String::from_utf8_lossy(&out), "SENX SE");
        assert_eq!(scanner.code(), None);
    }
}
