//! The conformance suite: runs an executor binary through every operation of the protocol and
//! says, case by case, what passed, what failed and what could not run, and how long each took.
//! `knotless-run plugin check` runs it from the command line; an executor's own tests run it with
//! `knotless_testkit::conformance::assert_passes`, which fails the test naming each case that
//! did not pass. It is a crate of its own so that the runner ships it without any test helper.
//!
//! Every case can fail: each names what it expects, and a misbehaving fake executor mode fails it
//! (`plugins/fake`). Once the executor is gone (it exited, broke the protocol, or was stopped as
//! hung) the fault is reported once, in the case that saw it, and every later case is `not run`.

// No function over 80 lines (the threshold is clippy.toml's): a longer one is split into
// steps with names.
#![warn(clippy::too_many_lines)]

mod processes;
mod raw;
mod rules;
mod secrets;
mod sessions;
mod steps;
mod suite;
mod transfers;
mod wire;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use knotless_protocol::messages::*;
use tokio_util::sync::CancellationToken;

use knotless_host::{ExecutorHost, HostConfig, ProcessSpec, Session, printable};
use suite::Suite;

/// The cases, in the order they run.
pub mod case {
    /// `initialize` is answered.
    pub const HANDSHAKE: &str = "handshake";
    /// A version the executor does not speak is refused.
    pub const VERSION_REFUSAL: &str = "version refusal";
    /// Requests before `initialize` are refused with NOT_INITIALIZED (§4).
    pub const BEFORE_INITIALIZE: &str = "requests before initialize";
    /// An unknown option is refused, named (§5.1).
    pub const UNKNOWN_OPTION: &str = "unknown option";
    /// Frames that are not JSON, not requests, of an unknown method or with bad params (§2).
    pub const MALFORMED: &str = "malformed and unknown requests";
    /// `ping` is answered.
    pub const PING: &str = "ping";
    /// The sweep a runner sends when it starts.
    pub const CLEANUP_AT_START: &str = "cleanup at start";
    /// A session starts.
    pub const START: &str = "start";
    /// A second `start` of a live session is refused.
    pub const DUPLICATE_START: &str = "duplicate start";
    /// Requests about a session never started are refused.
    pub const UNKNOWN_SESSIONS: &str = "unknown sessions";
    /// A step's output and exit code.
    pub const OUTPUT_AND_EXIT: &str = "step output and exit code";
    /// Every output notification of a step comes before its result.
    pub const OUTPUT_BEFORE_RESULT: &str = "output before the result";
    /// A non-zero exit is a result.
    pub const NON_ZERO_EXIT: &str = "non-zero exit";
    /// Every byte value of output comes back as written (§5.5).
    pub const EVERY_BYTE: &str = "every byte of output";
    /// A step ended by a signal has exit code 128 + N (§6).
    pub const SIGNAL: &str = "death by signal";
    /// A `ping` during a step is answered at once (§2).
    pub const PING_DURING_STEP: &str = "ping during a step";
    /// Variables arrive verbatim; a secret reaches only its own step.
    pub const VARIABLES: &str = "variables and secrets";
    /// Steps run in the work folder.
    pub const WORKING_FOLDER: &str = "working folder";
    /// A step past its timeout is killed and answered TIMEOUT.
    pub const TIMEOUT: &str = "step timeout";
    /// No process of a timed-out step outlives the answer.
    pub const LEFT_AFTER_TIMEOUT: &str = "processes left after a timeout";
    /// A cancelled step is answered CANCELLED.
    pub const CANCELLATION: &str = "cancellation";
    /// No process of a cancelled step outlives the answer.
    pub const LEFT_AFTER_CANCEL: &str = "processes left after a cancel";
    /// No process of a step given secrets outlives the answer (§7).
    pub const LEFT_AFTER_SECRETS: &str = "processes left after a step given secrets";
    /// A tree comes back as it went.
    pub const ROUND_TRIP: &str = "upload and download";
    /// Hostile uploads are refused.
    pub const UPLOAD_REFUSALS: &str = "upload refusals";
    /// An upload drops setuid, setgid and sticky bits (§8).
    pub const MODE_BITS: &str = "setuid, setgid and sticky bits";
    /// GNU long names and pax paths in an upload (§8).
    pub const LONG_NAMES: &str = "long names in an upload";
    /// An upload never writes through a link already in its destination (§8).
    pub const THROUGH_LINKS: &str = "a link already in an upload's destination";
    /// Special files stay out of a download.
    pub const SPECIAL_DOWNLOAD: &str = "special files in a download";
    /// A missing path is NOT_FOUND.
    pub const MISSING_DOWNLOAD: &str = "download of a missing path";
    /// Transfers end by their deadline and at their cancel (§8, §5.7).
    pub const TRANSFER_DEADLINES: &str = "transfer deadlines and cancel";
    /// A download stops before its max_bytes (§8).
    pub const DOWNLOAD_OVER_MAX: &str = "download over max_bytes";
    /// 1 MiB of output reaches a slow reader whole.
    pub const SLOW_READER: &str = "1 MiB of output with a slow reader";
    /// A secret is on no command line, in no file, log line or stderr line (§7).
    pub const SECRETS: &str = "secrets out of sight";
    /// `shutdown` with a step in flight answers both and exits (§5.12).
    pub const SHUTDOWN_IN_FLIGHT: &str = "shutdown with a step in flight";
    /// `start`, `stop` and `cleanup` given a `timeout_ms` of 0 answer TIMEOUT, doing nothing (§5).
    pub const ZERO_DEADLINES: &str = "a deadline already passed";
    /// `stop` with `keep` leaves the environment, and `cleanup` with `remove_kept` removes it (§5.8).
    pub const KEEP: &str = "stop with keep";
    /// A stopped session is gone.
    pub const STOP: &str = "stop";
    /// `cleanup` removes what is not kept and keeps what is.
    pub const CLEANUP: &str = "cleanup of sessions not in flight";
    /// At the end of its stdin the executor stops its sessions and exits.
    pub const END_OF_STDIN: &str = "end of stdin";
    /// `shutdown` is answered and the executor exits.
    pub const SHUTDOWN: &str = "shutdown";

    /// The cases that run in the session `start` made, before `stop`.
    pub const IN_SESSION: &[&str] = &[
        OUTPUT_BEFORE_RESULT,
        OUTPUT_AND_EXIT,
        NON_ZERO_EXIT,
        EVERY_BYTE,
        SIGNAL,
        PING_DURING_STEP,
        DUPLICATE_START,
        UNKNOWN_SESSIONS,
        VARIABLES,
        WORKING_FOLDER,
        TIMEOUT,
        LEFT_AFTER_TIMEOUT,
        CANCELLATION,
        LEFT_AFTER_CANCEL,
        LEFT_AFTER_SECRETS,
        ROUND_TRIP,
        UPLOAD_REFUSALS,
        MODE_BITS,
        LONG_NAMES,
        THROUGH_LINKS,
        SPECIAL_DOWNLOAD,
        MISSING_DOWNLOAD,
        TRANSFER_DEADLINES,
        DOWNLOAD_OVER_MAX,
    ];

    /// The cases before the session of [`IN_SESSION`] starts, in order.
    pub const BEFORE_SESSION: &[&str] =
        &[HANDSHAKE, VERSION_REFUSAL, BEFORE_INITIALIZE, UNKNOWN_OPTION, MALFORMED, PING, CLEANUP_AT_START, START];

    /// The cases after it, in order.
    /// Each holds one session at a time: on Kubernetes, a runner's runs never share a node.
    pub const AFTER_SESSION: &[&str] =
        &[STOP, SLOW_READER, SECRETS, SHUTDOWN_IN_FLIGHT, ZERO_DEADLINES, KEEP, CLEANUP, END_OF_STDIN, SHUTDOWN];

    /// Every case, in order.
    pub fn all() -> impl Iterator<Item = &'static str> {
        BEFORE_SESSION.iter().chain(IN_SESSION).chain(AFTER_SESSION).copied()
    }
}

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It passed; what it saw.
    Passed(String),
    /// It failed; why.
    Failed(String),
    /// It could not run; why (the executor was gone, or a case it needs failed).
    NotRun(String),
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked (one of [`case::all`]).
    pub name: &'static str,
    /// How it ended.
    pub verdict: Verdict,
    /// How long it took, when it ran.
    pub took: Option<Duration>,
}

/// What a case found: `Ok(detail)` when it passed, `Err(why)` when it failed.
type Outcome = Result<String, String>;

/// Why the cases in the session cannot run.
const NO_SESSION: &str = "no session: `start` failed";

/// Runs the suite; `report` sees each case as it ends, and every case of [`case::all`] is
/// reported once, in order.
pub async fn run(mut config: HostConfig, report: impl FnMut(&Check)) -> Vec<Check> {
    // The executor is judged as one process serving every session, as the protocol lets one.
    config.process_per_session = false;
    let mut record = Recorder { checks: Vec::new(), report, host: None, blocked: None };
    let started = Instant::now();
    let host = match ExecutorHost::start(config.clone()).await {
        Ok(host) => host,
        Err(error) => {
            record.record(case::HANDSHAKE, Verdict::Failed(error.to_string()), Some(started.elapsed()));
            return record.finish("the handshake failed");
        }
    };
    // The executor under test is judged alone: one that died is not replaced until the end.
    host.set_replaces_dead(false);
    record.host = Some(host.clone());
    record.case(case::HANDSHAKE, handshake(&host)).await;
    let suite = Suite::new(host.clone(), config.clone());
    record.case(case::VERSION_REFUSAL, raw::version_refusal(&config)).await;
    record.case(case::BEFORE_INITIALIZE, wire::before_initialize(&config, suite.start_params("never"))).await;
    record.case(case::UNKNOWN_OPTION, wire::unknown_option(&config)).await;
    record.case(case::MALFORMED, wire::malformed(&config)).await;
    record.case(case::PING, ping(&host)).await;
    record.case(case::CLEANUP_AT_START, suite.cleanup_at_start()).await;
    let session = record
        .case_with(case::START, async {
            let session = suite.open("a").await?;
            let detail = format!("work folder {}", session.paths().work);
            Ok((session, detail))
        })
        .await;
    match &session {
        Some(session) => in_session(&mut record, &suite, session).await,
        None => {
            for name in case::IN_SESSION {
                record.skip(name, NO_SESSION);
            }
        }
    }
    match session {
        Some(session) => record.case(case::STOP, suite.stop(session)).await,
        None => record.skip(case::STOP, NO_SESSION),
    }
    // After `stop`: no case holds two sessions at once, so the suite runs where an executor
    // gives each run a machine of its own and there is one (a Kubernetes node).
    record.case(case::SLOW_READER, raw::slow_reader(&config, suite.start_params("slow-reader"))).await;
    record.case(case::SECRETS, secrets::out_of_sight(&config, suite.start_params("secrets"), &suite.nonce)).await;
    record.case(case::SHUTDOWN_IN_FLIGHT, raw::shutdown_in_flight(&config, suite.start_params("shutdown"))).await;
    record.case(case::ZERO_DEADLINES, suite.zero_deadlines()).await;
    record.case(case::KEEP, suite.keep()).await;
    record.case(case::CLEANUP, suite.cleanup()).await;
    record.case(case::END_OF_STDIN, suite.end_of_stdin()).await;
    if record.blocked.is_some() {
        // The executor is gone: sweep what it left with a fresh one, as a runner would.
        host.set_replaces_dead(true);
        host.shutdown().await;
        return record.finish("");
    }
    let started = Instant::now();
    let outcome = shutdown(&host).await;
    record.record(case::SHUTDOWN, verdict_of(outcome), Some(started.elapsed()));
    record.finish("")
}

/// Runs the cases of [`case::IN_SESSION`], in order, in the session `start` made.
async fn in_session<F: FnMut(&Check)>(record: &mut Recorder<F>, suite: &Suite, session: &Session) {
    record.case(case::OUTPUT_BEFORE_RESULT, suite.output_before_result(session)).await;
    record.case(case::OUTPUT_AND_EXIT, suite.output_and_exit(session)).await;
    record.case(case::NON_ZERO_EXIT, suite.non_zero(session)).await;
    record.case(case::EVERY_BYTE, suite.every_byte(session)).await;
    record.case(case::SIGNAL, suite.signal(session)).await;
    record.case(case::PING_DURING_STEP, suite.ping_during_step(session)).await;
    record.case(case::DUPLICATE_START, suite.duplicate_start(session)).await;
    record.case(case::UNKNOWN_SESSIONS, suite.unknown_sessions()).await;
    record.case(case::VARIABLES, suite.variables(session)).await;
    record.case(case::WORKING_FOLDER, suite.workdir(session)).await;
    record.case(case::TIMEOUT, suite.timeout(session)).await;
    record.case(case::LEFT_AFTER_TIMEOUT, suite.left_after_timeout(session)).await;
    record.case(case::CANCELLATION, suite.cancellation(session)).await;
    record.case(case::LEFT_AFTER_CANCEL, suite.left_after_cancel(session)).await;
    record.case(case::LEFT_AFTER_SECRETS, suite.left_after_secrets(session)).await;
    record.case(case::ROUND_TRIP, suite.round_trip(session)).await;
    record.case(case::UPLOAD_REFUSALS, suite.upload_refusals(session)).await;
    record.case(case::MODE_BITS, suite.mode_bits(session)).await;
    record.case(case::LONG_NAMES, suite.long_names(session)).await;
    record.case(case::THROUGH_LINKS, suite.through_links(session)).await;
    record.case(case::SPECIAL_DOWNLOAD, suite.special_download(session)).await;
    record.case(case::MISSING_DOWNLOAD, suite.missing(session)).await;
    record.case(case::TRANSFER_DEADLINES, suite.transfer_deadlines(session)).await;
    record.case(case::DOWNLOAD_OVER_MAX, suite.download_over_max(session)).await;
}

/// One case's line: `  ok       NAME (12 ms): detail`, `  FAIL     NAME (3 ms): why` or
/// `  not run  NAME: why`. What the executor under test answered is shown escaped: it is its
/// text.
pub fn report_line(check: &Check) -> String {
    let took = check.took.map(|took| format!(" ({} ms)", took.as_millis())).unwrap_or_default();
    let (tag, text) = match &check.verdict {
        Verdict::Passed(detail) => ("ok", detail),
        Verdict::Failed(why) => ("FAIL", why),
        Verdict::NotRun(why) => ("not run", why),
    };
    format!("  {tag:<7}  {}{took}: {}", check.name, printable::name(text))
}

/// How an executor's own test hosts its built program for the suite: the name is the file's
/// without `knotless-executor-`, the runner id `conformance-<pid>`, and the versions and
/// timeouts are the defaults of `plugin check`.
pub fn program(path: impl Into<PathBuf>, options: &[(&str, &str)]) -> HostConfig {
    let path = path.into();
    let file = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let name = file.strip_prefix("knotless-executor-").unwrap_or(&file).to_string();
    let runner = RunnerInfo {
        name: "knotless-conformance".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        id: format!("conformance-{}", std::process::id()),
    };
    let options: BTreeMap<String, String> =
        options.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
    HostConfig::new(ProcessSpec { name, path, pass_env: Vec::new() }, runner, options)
}

/// The lines of the cases that did not pass, if any did not (a suite that did not report each
/// case once did not pass either).
pub fn not_passed(checks: &[Check]) -> Option<String> {
    let lines: Vec<String> =
        checks.iter().filter(|check| !matches!(check.verdict, Verdict::Passed(_))).map(report_line).collect();
    let every_case = checks.iter().map(|check| check.name).eq(case::all());
    match (lines.is_empty(), every_case) {
        (true, true) => None,
        (true, false) => Some(format!(
            "  the suite reported {} cases, not each of {:?} once",
            checks.len(),
            case::all().collect::<Vec<_>>()
        )),
        (false, _) => Some(lines.join("\n")),
    }
}

fn verdict_of(outcome: Outcome) -> Verdict {
    match outcome {
        Ok(detail) => Verdict::Passed(detail),
        Err(why) => Verdict::Failed(why),
    }
}

/// Records the cases as they end, and knows when the executor is gone.
struct Recorder<F> {
    checks: Vec<Check>,
    report: F,
    host: Option<Arc<ExecutorHost>>,
    /// Why every later case cannot run, once the executor is gone.
    blocked: Option<String>,
}

impl<F: FnMut(&Check)> Recorder<F> {
    fn record(&mut self, name: &'static str, verdict: Verdict, took: Option<Duration>) {
        let check = Check { name, verdict, took };
        (self.report)(&check);
        self.checks.push(check);
    }

    /// A case that could not run for a reason of its own (a case it needs failed).
    fn skip(&mut self, name: &'static str, reason: &str) {
        let reason = self.blocked.clone().unwrap_or_else(|| reason.to_string());
        self.record(name, Verdict::NotRun(reason), None);
    }

    /// Runs a case, unless the executor is gone.
    async fn case(&mut self, name: &'static str, case: impl Future<Output = Outcome>) {
        if let Some(reason) = self.blocked.clone() {
            self.record(name, Verdict::NotRun(reason), None);
            return;
        }
        let started = Instant::now();
        let outcome = case.await;
        self.after(name, outcome, started.elapsed()).await;
    }

    /// Runs a case that makes something later cases need, unless the executor is gone.
    async fn case_with<T>(
        &mut self,
        name: &'static str,
        case: impl Future<Output = Result<(T, String), String>>,
    ) -> Option<T> {
        if let Some(reason) = self.blocked.clone() {
            self.record(name, Verdict::NotRun(reason), None);
            return None;
        }
        let started = Instant::now();
        let (made, outcome) = match case.await {
            Ok((made, detail)) => (Some(made), Ok(detail)),
            Err(why) => (None, Err(why)),
        };
        self.after(name, outcome, started.elapsed()).await;
        made
    }

    /// Records a case that ran, and whether the executor was lost in it: its fault is said here,
    /// once.
    async fn after(&mut self, name: &'static str, outcome: Outcome, took: Duration) {
        let lost = match &self.host {
            Some(host) => host.gone().await,
            None => None,
        };
        if lost.is_some() && self.blocked.is_none() {
            self.blocked = Some(format!("the executor was gone in `{name}`"));
        }
        let verdict = match (outcome, lost) {
            (outcome, None) => verdict_of(outcome),
            (Err(why), Some((cause, _))) if why.contains(&cause) => Verdict::Failed(why),
            (Err(why), Some((_, whole))) => Verdict::Failed(format!("{why}; then the executor was gone: {whole}")),
            (Ok(_), Some((_, whole))) => Verdict::Failed(format!("the executor was gone after this case: {whole}")),
        };
        self.record(name, verdict, Some(took));
    }

    /// Marks every case not reported yet `not run`, and returns the report.
    fn finish(mut self, reason: &str) -> Vec<Check> {
        let reason = self.blocked.clone().unwrap_or_else(|| reason.to_string());
        for name in case::all() {
            if !self.checks.iter().any(|check| check.name == name) {
                self.record(name, Verdict::NotRun(reason.clone()), None);
            }
        }
        self.checks
    }
}

async fn handshake(host: &Arc<ExecutorHost>) -> Outcome {
    let info = host.info().await.map_err(|error| error.to_string())?;
    if info.executor.name.is_empty() || info.executor.version.is_empty() {
        return Err("the executor did not give its name and version".into());
    }
    Ok(format!(
        "{} {}, protocol {}, isolation {:?}",
        info.executor.name, info.executor.version, info.protocol_version, info.capabilities.isolation
    ))
}

async fn ping(host: &Arc<ExecutorHost>) -> Outcome {
    let started = Instant::now();
    host.call::<rpc::Ping>(&Empty {}, Duration::from_secs(10), &CancellationToken::new())
        .await
        .map_err(|error| error.to_string())?;
    Ok(format!("answered in {} µs", started.elapsed().as_micros()))
}

async fn shutdown(host: &Arc<ExecutorHost>) -> Outcome {
    if host.shutdown().await {
        Ok("answered and exited by itself".into())
    } else {
        Err("did not exit after answering shutdown; it had to be killed".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &'static str, verdict: Verdict) -> Check {
        Check { name, verdict, took: Some(Duration::from_millis(3)) }
    }

    #[test]
    fn a_failed_or_unrun_case_is_named_and_a_full_pass_is_not() {
        let mut checks: Vec<Check> = case::all().map(|name| check(name, Verdict::Passed("fine".into()))).collect();
        assert_eq!(not_passed(&checks), None);
        let ping = checks.iter().position(|check| check.name == case::PING).expect("ping");
        checks[ping].verdict = Verdict::Failed("no answer".into());
        checks[ping + 1] = Check { name: checks[ping + 1].name, verdict: Verdict::NotRun("gone".into()), took: None };
        assert_eq!(
            not_passed(&checks).as_deref(),
            Some("  FAIL     ping (3 ms): no answer\n  not run  cleanup at start: gone")
        );
        // A suite that reported fewer cases than it has did not pass either.
        checks.truncate(2);
        assert!(not_passed(&checks).is_some_and(|why| why.contains("reported 2 cases")));
    }

    #[test]
    fn a_program_is_named_as_plugin_check_names_it() {
        let config = program("/build/knotless-executor-shell", &[("work-dir", "/tmp/w")]);
        assert_eq!(config.process.name, "shell");
        assert_eq!(config.options, BTreeMap::from([("work-dir".to_string(), "/tmp/w".to_string())]));
        assert!(config.runner.id.starts_with("conformance-"), "{}", config.runner.id);
    }
}
