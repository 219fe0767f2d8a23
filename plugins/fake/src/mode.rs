//! The fake's behaviours: the well-behaved `ok` mode and every way it misbehaves on purpose,
//! with their names on the command line and in the `mode` config key.

use std::fmt;
use std::str::FromStr;

/// How the fake behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A minimal but real executor.
    Ok,
    /// Writes a line to stderr and exits 3 before reading anything.
    ExitBeforeHandshake,
    /// Answers `initialize` with protocol version 99, as a result.
    WrongVersion,
    /// Answers `initialize` with UNSUPPORTED_VERSION, speaking only version 2.
    RefuseVersion,
    /// Writes a line that is not JSON at the first `command`, then keeps running.
    Garbage,
    /// Writes a line that is not JSON on stdout before answering anything.
    GarbageAtStart,
    /// `command` never answers and `cancel` is ignored.
    HangInStep,
    /// `command` sends one output notification and exits 101.
    CrashMidStep,
    /// `start` succeeds, then every `command` answers UNKNOWN_SESSION.
    LoseSession,
    /// `cancel` is ignored: a step runs to its end or its timeout.
    NoReplyToCancel,
    /// `command` runs for real but sends no output notifications.
    DropOutput,
    /// `command` does not enforce `timeout_ms`.
    IgnoreTimeout,
    /// `download` answers one byte more than it wrote.
    BadTransfer,
    /// `upload` reads the tar stream at 1 MiB a second, as a slow link would.
    SlowUpload,
    /// `command` does not enforce `timeout_ms`, and answers `cancel` with a normal result,
    /// exit code 0, as if the step had passed.
    CancelAnswersOk,
    /// Steps run in the session's folder instead of its work folder.
    WrongWorkdir,
    /// A second `start` of a live session is accepted, as if it were new.
    DuplicateStart,
    /// `stop` of a session never started answers a result, removing nothing.
    StopUnknownOk,
    /// `command` answers, then sends the step's output.
    LateOutput,
    /// Step output is dropped while stdout is full (the runner reads slowly).
    DropOutputWhenSlow,
    /// An upload's FIFOs and device nodes are skipped instead of refusing the upload.
    AcceptSpecialUploads,
    /// A download holds the folder's FIFOs and links that leave it.
    ArchiveSpecialFiles,
    /// At a step's timeout only its process group is killed, not what left the group.
    LeaveProcessesAtTimeout,
    /// At a cancel only a step's process group is killed, not what left the group.
    LeaveProcessesAtCancel,
    /// At the end of stdin the fake exits without stopping its sessions.
    LeaveSessionsAtEof,
    /// `download` writes half of its stream, answers an error, and writes the rest when the
    /// session stops, waiting until the runner has closed its end.
    BreakDownload,
    /// `download` writes half of its stream, then nothing until the request is cancelled.
    StallDownload,
    /// `ping` is answered before `initialize`.
    PingBeforeInitialize,
    /// `initialize` accepts options it does not know.
    AcceptUnknownOptions,
    /// A request of an unknown method is answered with a result.
    AnswerUnknownMethods,
    /// Step output is decoded as UTF-8 (invalid bytes replaced) and encoded again.
    LossyOutput,
    /// A step ended by a signal is answered with exit code 0.
    SignalAsZero,
    /// A step's secrets are on its shell's command line.
    SecretOnCommandLine,
    /// A step's secrets are written to the fake's stderr.
    SecretOnStderr,
    /// A step's secrets are written to a file in its session's folder.
    SecretInFile,
    /// A step's secrets are sent in a `log` notification.
    SecretInLog,
    /// Processes a step given secrets left running are not killed.
    LeaveProcessesAfterSecrets,
    /// `upload` and `download` ignore `timeout_ms`.
    NoTransferDeadline,
    /// `start`, `stop` and `cleanup` ignore `timeout_ms`.
    NoSessionDeadline,
    /// `stop` removes the session's folder even when asked to keep it.
    IgnoreKeep,
    /// `cleanup` removes kept sessions' folders even without `remove_kept`.
    SweepKept,
    /// `download` writes the whole folder whatever its `max_bytes`.
    DownloadPastMax,
    /// `upload` keeps setuid, setgid and sticky bits.
    KeepModeBits,
    /// Requests run one at a time: nothing is read while one runs.
    SerialRequests,
    /// `shutdown` is answered and the fake exits without answering the requests in flight or
    /// stopping its sessions.
    ShutdownDropsRequests,
    /// `upload` names entries by their tar header alone, ignoring GNU long names and pax paths.
    IgnoreLongNames,
    /// `upload` writes each entry at its path, through whatever links the destination holds.
    WriteThroughLinks,
}

/// Every mode with its name and a one-line description, in the order of the usage text.
pub const MODES: &[(Mode, &str, &str)] = &[
    (Mode::Ok, "ok", "a minimal but real executor (the default)"),
    (Mode::ExitBeforeHandshake, "exit-before-handshake", "write a line to stderr and exit 3 before reading anything"),
    (Mode::WrongVersion, "wrong-version", "answer initialize with protocol_version 99 (a result, not an error)"),
    (Mode::RefuseVersion, "refuse-version", "answer initialize with UNSUPPORTED_VERSION, speaking only [2]"),
    (Mode::Garbage, "garbage", "at the first command write a line that is not JSON instead of output"),
    (Mode::GarbageAtStart, "garbage-at-start", "write a line that is not JSON before answering anything"),
    (Mode::HangInStep, "hang-in-step", "never answer command, and ignore cancel"),
    (Mode::CrashMidStep, "crash-mid-step", "at command send one output notification, then exit 101"),
    (Mode::LoseSession, "lose-session", "start succeeds, then every command answers UNKNOWN_SESSION"),
    (Mode::NoReplyToCancel, "no-reply-to-cancel", "ignore cancel: a step runs to its timeout"),
    (Mode::DropOutput, "drop-output", "run steps for real but send no output notifications"),
    (Mode::IgnoreTimeout, "ignore-timeout", "run steps without enforcing timeout_ms"),
    (Mode::BadTransfer, "bad-transfer", "answer download with one byte more than was written"),
    (Mode::SlowUpload, "slow-upload", "read uploads at 1 MiB a second, as a slow link would"),
    (Mode::CancelAnswersOk, "cancel-answers-ok", "ignore timeout_ms and answer cancel with exit code 0"),
    (Mode::WrongWorkdir, "wrong-workdir", "run steps in the session's folder instead of its work folder"),
    (Mode::DuplicateStart, "duplicate-start", "accept a second start of a live session, as if it were new"),
    (Mode::StopUnknownOk, "stop-unknown-ok", "answer stop of a session never started with a result"),
    (Mode::LateOutput, "late-output", "answer a step's command, then send its output"),
    (Mode::DropOutputWhenSlow, "drop-output-when-slow", "drop step output while stdout is full (a slow reader)"),
    (Mode::AcceptSpecialUploads, "accept-special-uploads", "skip FIFOs and device nodes in an upload, not refuse it"),
    (Mode::ArchiveSpecialFiles, "archive-special-files", "put FIFOs and links that leave the folder in a download"),
    (Mode::LeaveProcessesAtTimeout, "leave-processes-at-timeout", "at a step's timeout kill only its process group"),
    (Mode::LeaveProcessesAtCancel, "leave-processes-at-cancel", "at a cancel kill only the step's process group"),
    (Mode::LeaveSessionsAtEof, "leave-sessions-at-eof", "at the end of stdin exit without stopping the sessions"),
    (Mode::BreakDownload, "break-download", "answer download with an error halfway, send the rest at stop"),
    (Mode::StallDownload, "stall-download", "send half of a download, then nothing until cancelled"),
    (Mode::PingBeforeInitialize, "ping-before-initialize", "answer ping before initialize"),
    (Mode::AcceptUnknownOptions, "accept-unknown-options", "accept options it does not know at initialize"),
    (Mode::AnswerUnknownMethods, "answer-unknown-methods", "answer a request of an unknown method with a result"),
    (Mode::LossyOutput, "lossy-output", "decode step output as UTF-8 and encode it again"),
    (Mode::SignalAsZero, "signal-as-zero", "answer a step ended by a signal with exit code 0"),
    (Mode::SecretOnCommandLine, "secret-on-command-line", "put a step's secrets on its shell's command line"),
    (Mode::SecretOnStderr, "secret-on-stderr", "write a step's secrets to stderr"),
    (Mode::SecretInFile, "secret-in-file", "write a step's secrets to a file in its session's folder"),
    (Mode::SecretInLog, "secret-in-log", "send a step's secrets in a log notification"),
    (Mode::LeaveProcessesAfterSecrets, "leave-processes-after-secrets", "leave what a step given secrets left"),
    (Mode::NoTransferDeadline, "no-transfer-deadline", "ignore timeout_ms in upload and download"),
    (Mode::NoSessionDeadline, "no-session-deadline", "ignore timeout_ms in start, stop and cleanup"),
    (Mode::IgnoreKeep, "ignore-keep", "remove a session's folder at stop even when asked to keep it"),
    (Mode::SweepKept, "sweep-kept", "remove kept sessions' folders in every cleanup"),
    (Mode::DownloadPastMax, "download-past-max", "write a whole download whatever its max_bytes"),
    (Mode::KeepModeBits, "keep-mode-bits", "keep setuid, setgid and sticky bits in an upload"),
    (Mode::SerialRequests, "serial-requests", "run requests one at a time, reading nothing meanwhile"),
    (Mode::ShutdownDropsRequests, "shutdown-drops-requests", "answer shutdown and exit, leaving what is in flight"),
    (Mode::IgnoreLongNames, "ignore-long-names", "name upload entries by their header alone (no long names)"),
    (Mode::WriteThroughLinks, "write-through-links", "write upload entries through links in the destination"),
];

impl Mode {
    /// The mode's name on the command line.
    pub fn name(self) -> &'static str {
        MODES.iter().find(|(mode, _, _)| *mode == self).map_or("ok", |(_, name, _)| name)
    }

    /// Whether the mode acts before the handshake, so that only `--mode` can choose it.
    pub fn before_handshake(self) -> bool {
        matches!(
            self,
            Mode::ExitBeforeHandshake | Mode::GarbageAtStart | Mode::PingBeforeInitialize | Mode::AcceptUnknownOptions
        )
    }

    /// Whether `cancel` notifications are ignored.
    pub fn ignores_cancel(self) -> bool {
        matches!(self, Mode::HangInStep | Mode::NoReplyToCancel)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Mode> {
        MODES.iter().find(|(_, name, _)| *name == text).map(|(mode, _, _)| *mode).ok_or_else(|| {
            let names: Vec<&str> = MODES.iter().map(|(_, name, _)| *name).collect();
            anyhow::anyhow!("unknown mode {text:?}; the modes are {}", names.join(", "))
        })
    }
}

/// The usage text of `--help`.
pub fn usage() -> String {
    let mut text = String::from(
        "knotless-executor-fake: a deliberately misbehaving executor for testing knotless-run\n\n\
         usage: knotless-executor-fake [--mode MODE]\n\
         \x20      knotless-executor-fake --help\n\n\
         It speaks the executor protocol (JSON-RPC 2.0, one message a line) on stdin and stdout.\n\
         Without --mode, the `mode` config key of initialize chooses the mode (modes that act\n\
         before the handshake need --mode). Config keys: work-dir (default $TMPDIR/knotless-fake),\n\
         ledger (a file rewritten with the live session ids after every start, stop and cleanup),\n\
         mode, and the capabilities it declares: isolation (none, container or vm), secrets,\n\
         outputs and caches (true unless false), images (false unless true).\n\nmodes:\n",
    );
    for (_, name, description) in MODES {
        text.push_str(&format!("  {name:<28}{description}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_round_trips_through_its_name() {
        for (mode, name, _) in MODES {
            assert_eq!(name.parse::<Mode>().expect("parse"), *mode);
            assert_eq!(mode.name(), *name);
        }
        assert!("crash".parse::<Mode>().is_err());
    }

    #[test]
    fn the_usage_lists_every_mode() {
        let text = usage();
        for (_, name, _) in MODES {
            assert!(text.contains(name), "{name} missing from the usage");
        }
    }
}
