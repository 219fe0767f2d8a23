//! The cases of a step's end that is not its own: its timeout, its cancellation, and the
//! processes it started (one in the background, one in a session of its own after `setsid`) that
//! must be gone once the executor answered.

use std::collections::BTreeMap;
use std::time::Duration;

use knotless_protocol::ErrorKind;
use tokio_util::sync::CancellationToken;

use super::Outcome;
use super::suite::{Ran, Step, Suite, exited, quoted};
use knotless_host::{HostError, Session};

/// The timeout of the step whose processes must not outlive its timeout: long enough for it to
/// start them.
const LEFTOVERS_TIMEOUT_MS: u64 = 3_000;

/// How long the processes of a step get to show they are alive once told to: they poll every
/// tenth of a second.
const WATCH: &str = "30";

/// How a step is ended: from outside, or by itself after it was given a secret.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    Timeout,
    Cancel,
    Secrets,
}

/// The rule a step given secrets whose processes outlive it breaks.
const SECRETS_RULE: &str = "§7: after a step that was given secrets, processes the step left running MUST be \
                            killed before the executor answers";

impl Ending {
    fn kind(self) -> Option<ErrorKind> {
        match self {
            Ending::Timeout => Some(ErrorKind::Timeout),
            Ending::Cancel => Some(ErrorKind::Cancelled),
            Ending::Secrets => None,
        }
    }

    fn answer(self) -> &'static str {
        match self {
            Ending::Timeout => "-32004 (TIMEOUT)",
            Ending::Cancel => "-32003 (CANCELLED)",
            Ending::Secrets => "exit code 0",
        }
    }

    fn folder(self) -> &'static str {
        match self {
            Ending::Timeout => "timeout",
            Ending::Cancel => "cancel",
            Ending::Secrets => "secrets",
        }
    }
}

impl Suite {
    pub async fn timeout(&self, session: &Session) -> Outcome {
        let ran =
            self.run_step(session, Step { timeout_ms: 1_500, ..Step::new("sleep 60") }, &cancelled_after(None)).await;
        answered(&ran, Ending::Timeout)?;
        Ok(format!("killed and answered TIMEOUT after {} ms", ran.elapsed.as_millis()))
    }

    pub async fn cancellation(&self, session: &Session) -> Outcome {
        let cancel = cancelled_after(Some(Duration::from_secs(10)));
        let step =
            Step { timeout_ms: 120_000, cancel_on_output: Some("started"), ..Step::new("echo started; sleep 60") };
        let ran = self.run_step(session, step, &cancel).await;
        if !String::from_utf8_lossy(&ran.stdout).contains("started") {
            return Err(format!("never saw the step's output `started` ({})", describe(&ran)));
        }
        answered(&ran, Ending::Cancel)?;
        Ok(format!("answered CANCELLED after {} ms", ran.elapsed.as_millis()))
    }

    pub async fn left_after_timeout(&self, session: &Session) -> Outcome {
        self.left_after(session, Ending::Timeout).await
    }

    pub async fn left_after_cancel(&self, session: &Session) -> Outcome {
        self.left_after(session, Ending::Cancel).await
    }

    /// A step given a secret starts the same processes and exits 0 at once.
    pub async fn left_after_secrets(&self, session: &Session) -> Outcome {
        self.left_after(session, Ending::Secrets).await.map_err(|why| format!("{why}; {SECRETS_RULE}"))
    }

    /// The step starts a process in the background and one in a session of its own (`setsid`),
    /// each polling for a `go` file, says `started` once both run, and sleeps. Once the executor
    /// answered the timeout or the cancel, a step of the same session makes `go` and watches
    /// for a while: a process of the first step still alive then writes its `survived` file.
    async fn left_after(&self, session: &Session, ending: Ending) -> Outcome {
        let folder = format!("{}/leftovers-{}", session.paths().work, ending.folder());
        let script = format!(
            "D={folder}\nmkdir -p \"$D\"\n\
             (touch \"$D/alive-background\"; while [ ! -e \"$D/go\" ]; do sleep 0.1; done; \
             touch \"$D/survived-background\") </dev/null >/dev/null 2>&1 &\n\
             setsid sh -c 'touch \"$0/alive-setsid\"; while [ ! -e \"$0/go\" ]; do sleep 0.1; done; \
             touch \"$0/survived-setsid\"' \"$D\" </dev/null >/dev/null 2>&1 &\n\
             while [ ! -e \"$D/alive-background\" ] || [ ! -e \"$D/alive-setsid\" ]; do sleep 0.05; done\n\
             echo started\n{rest}",
            folder = quoted(&folder),
            rest = if ending == Ending::Secrets { "" } else { "sleep 60\n" }
        );
        let (cancel, step) = match ending {
            Ending::Timeout => (cancelled_after(None), Step { timeout_ms: LEFTOVERS_TIMEOUT_MS, ..Step::new(&script) }),
            Ending::Cancel => (
                cancelled_after(Some(Duration::from_secs(20))),
                Step { timeout_ms: 120_000, cancel_on_output: Some("started"), ..Step::new(&script) },
            ),
            Ending::Secrets => (
                cancelled_after(None),
                Step {
                    secrets: BTreeMap::from([("CHECK_LEFTOVER_SECRET".to_string(), format!("s3cr3t-{}", self.nonce))]),
                    ..Step::new(&script)
                },
            ),
        };
        let ran = self.run_step(session, step, &cancel).await;
        match ending {
            Ending::Secrets => exited(&ran, 0)?,
            _ => answered(&ran, ending)?,
        }
        let watch = format!(
            "D={folder}\n\
             if [ ! -e \"$D/alive-background\" ] || [ ! -e \"$D/alive-setsid\" ]; then \
             echo 'the processes had not started' >&2; exit 3; fi\n\
             touch \"$D/go\"\ni=0\n\
             while [ $i -lt {WATCH} ]; do \
             if [ -e \"$D/survived-background\" ] || [ -e \"$D/survived-setsid\" ]; then break; fi; \
             sleep 0.1; i=$((i+1)); done\nls \"$D\"\n",
            folder = quoted(&folder)
        );
        let watched = self.step(session, &watch).await;
        exited(&watched, 0).map_err(|why| format!("watching for the step's processes: {why}"))?;
        let listing = String::from_utf8_lossy(&watched.stdout);
        let survivors: Vec<&str> =
            [("survived-background", "the one in the background"), ("survived-setsid", "the one after setsid")]
                .into_iter()
                .filter(|(file, _)| listing.lines().any(|line| line == *file))
                .map(|(_, which)| which)
                .collect();
        if !survivors.is_empty() {
            return Err(format!(
                "processes of the step outlived the answer {}: {}",
                ending.answer(),
                survivors.join(" and ")
            ));
        }
        Ok(format!(
            "answered {} after {} ms; neither process of the step (in the background, after setsid) outlived it",
            ending.answer(),
            ran.elapsed.as_millis()
        ))
    }
}

/// A token cancelled after `after`, if given (the fallback of a cancel on output that never
/// comes).
fn cancelled_after(after: Option<Duration>) -> CancellationToken {
    let cancel = CancellationToken::new();
    if let Some(after) = after {
        let fallback = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(after) => fallback.cancel(),
                () = fallback.cancelled() => {}
            }
        });
    }
    cancel
}

/// The step was answered with the error of `ending`.
fn answered(ran: &Ran, ending: Ending) -> Result<(), String> {
    match &ran.result {
        Err(HostError::Answered { error, .. }) if Some(error.kind) == ending.kind() => Ok(()),
        Ok(result) => Err(match ending {
            Ending::Timeout => format!("the step ran to its end (exit code {}) past its timeout", result.exit_code),
            Ending::Cancel | Ending::Secrets => {
                format!("the step ran to its end (exit code {}) after a cancel", result.exit_code)
            }
        }),
        Err(error) => Err(format!("expected {}, got: {error}", ending.answer())),
    }
}

fn describe(ran: &Ran) -> String {
    match &ran.result {
        Ok(result) => format!("exit code {}", result.exit_code),
        Err(error) => error.to_string(),
    }
}
