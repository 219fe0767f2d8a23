//! The cases of a step's answer: its output and exit code, its output before its result, a
//! non-zero exit, variables and secrets, and the folder it runs in.

use std::collections::BTreeMap;
use std::time::Duration;

use knotless_protocol::messages::*;
use tokio_util::sync::CancellationToken;

use super::Outcome;
use super::suite::{Ran, Step, Suite, exited, expect_output};
use knotless_host::Session;

/// How many lines the step of `output before the result` writes on each stream.
const LINES: usize = 200;

impl Suite {
    pub async fn output_and_exit(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "printf 'out\\n'; printf 'err\\n' >&2").await;
        exited(&ran, 0)?;
        expect_output("stdout", &ran.stdout, "out\n")?;
        expect_output("stderr", &ran.stderr, "err\n")?;
        Ok("stdout and stderr streamed, exit code 0".into())
    }

    /// A step that writes line after line on both streams and exits at once: when its result
    /// comes, all of its output has come, and nothing comes after it (the runner takes output
    /// after the result for a broken protocol, which the `ping` after it shows).
    pub async fn output_before_result(&self, session: &Session) -> Outcome {
        let script = format!(
            "i=0\nwhile [ $i -lt {LINES} ]; do echo \"out $i\"; echo \"err $i\" >&2; i=$((i+1)); done\nprintf last"
        );
        let ran = self.step(session, &script).await;
        let never = CancellationToken::new();
        let after = self.host.call::<rpc::Ping>(&Empty {}, Duration::from_secs(10), &never).await;
        if let Err(error) = &ran.result {
            return Err(error.to_string());
        }
        let (stdout, stderr) = expected_lines();
        let mut faults = Vec::new();
        if let Err(why) = exited(&ran, 0) {
            faults.push(why);
        }
        faults.extend(arrived("stdout", &ran.stdout, &stdout));
        faults.extend(arrived("stderr", &ran.stderr, &stderr));
        if let Err(error) = after {
            faults.push(format!("a ping after the result: {error}"));
        }
        if !faults.is_empty() {
            return Err(faults.join("; "));
        }
        Ok(format!("{} bytes of output, all before the result", stdout.len() + stderr.len()))
    }

    pub async fn non_zero(&self, session: &Session) -> Outcome {
        let ran = self.step(session, "exit 7").await;
        exited(&ran, 7)?;
        Ok("exit code 7".into())
    }

    pub async fn variables(&self, session: &Session) -> Outcome {
        let value = "it's a value\nwith two lines and $dollars";
        let secret = format!("s3cr3t-{}", self.nonce);
        let step = Step {
            env: BTreeMap::from([("CHECK_VARIABLE".to_string(), value.to_string())]),
            secrets: BTreeMap::from([("CHECK_SECRET".to_string(), secret.clone())]),
            ..Step::new("printf '%s|%s' \"$CHECK_VARIABLE\" \"$CHECK_SECRET\"")
        };
        let ran = self.run_step(session, step, &CancellationToken::new()).await;
        exited(&ran, 0)?;
        expect_output("stdout", &ran.stdout, &format!("{value}|{secret}"))?;
        let ran = self.step(session, "printf '%s' \"${CHECK_SECRET-unset}\"").await;
        exited(&ran, 0).map_err(|why| format!("the next step: {why}"))?;
        expect_output("the next step's stdout", &ran.stdout, "unset")?;
        Ok("variables arrive verbatim; a secret reaches only its own step".into())
    }

    /// The step says where it runs and where the work folder is, both as the environment sees
    /// them (`pwd -P`), and must exit 0.
    pub async fn workdir(&self, session: &Session) -> Outcome {
        let work = session.paths().work.clone();
        let step = Step {
            env: BTreeMap::from([("CHECK_WORK".to_string(), work.clone())]),
            ..Step::new("here=$(pwd -P)\ncd \"$CHECK_WORK\"\nprintf '%s\\n%s\\n' \"$here\" \"$(pwd -P)\"")
        };
        let ran = self.run_step(session, step, &CancellationToken::new()).await;
        workdir_verdict(&ran, &work)
    }
}

/// The lines the step of `output before the result` writes, on stdout and on stderr.
fn expected_lines() -> (String, String) {
    let mut stdout: String = (0..LINES).map(|line| format!("out {line}\n")).collect();
    stdout.push_str("last");
    let stderr = (0..LINES).map(|line| format!("err {line}\n")).collect();
    (stdout, stderr)
}

/// What of a stream had arrived when the result came, if not all of it.
fn arrived(stream: &str, got: &[u8], expected: &str) -> Option<String> {
    if got == expected.as_bytes() {
        return None;
    }
    Some(if expected.as_bytes().starts_with(got) {
        format!("when the result came, {} of the {} bytes of {stream} had arrived", got.len(), expected.len())
    } else {
        format!("{stream} was not what the step wrote ({} bytes, expected {})", got.len(), expected.len())
    })
}

/// The verdict of `working folder`: the step exited 0 and ran where the work folder is.
fn workdir_verdict(ran: &Ran, work: &str) -> Outcome {
    exited(ran, 0)?;
    let shown = String::from_utf8_lossy(&ran.stdout);
    let mut lines = shown.lines();
    match (lines.next(), lines.next()) {
        (Some(here), Some(there)) if !here.is_empty() && here == there => Ok(format!("steps run in {work}")),
        (Some(here), Some(there)) => Err(format!("steps run in {here}, expected the work folder {work} ({there})")),
        _ => Err(format!("the step did not say where it ran: its stdout was {shown:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(exit_code: i32, stdout: &str) -> Ran {
        Ran {
            result: Ok(CommandResult { exit_code, duration_ms: 1, killed_processes: 0 }),
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn the_working_folder_case_fails_when_its_step_fails_or_runs_elsewhere() {
        let work = "/w/s/work";
        let check = |exit_code, stdout: &str| workdir_verdict(&ran(exit_code, stdout), work).is_ok();
        assert!(check(0, "/w/s/work\n/w/s/work\n"));
        // The folder is right, but the step failed.
        assert!(!check(2, "/w/s/work\n/w/s/work\n"));
        assert!(!check(0, "/w/s\n/w/s/work\n"));
        assert!(!check(0, ""));
        assert!(!check(0, "\n\n"));
    }

    #[test]
    fn output_that_had_not_all_arrived_is_told_apart_from_other_output() {
        assert_eq!(arrived("stdout", b"ab", "ab"), None);
        assert_eq!(
            arrived("stdout", b"a", "abc"),
            Some("when the result came, 1 of the 3 bytes of stdout had arrived".to_string())
        );
        assert_eq!(
            arrived("stderr", b"x", "abc"),
            Some("stderr was not what the step wrote (1 bytes, expected 3)".into())
        );
    }
}
