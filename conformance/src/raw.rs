//! The cases that need an executor process of their own, on a connection the case drives itself:
//! the version refusal (a handshake the host would never offer), 1 MiB of output to a reader that
//! takes the executor's stdout slowly, and the end of the executor's stdin.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use knotless_protocol::ErrorKind;
use knotless_protocol::messages::*;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

use super::Outcome;
use super::suite::command_params;
use knotless_host::{
    Answer, Closed, Connection, ExecutorProcess, HostConfig, Reply, SessionEvent, StderrWatch, describe_status,
};

/// How many bytes of output the slow reader's step writes.
const SLOW_OUTPUT: usize = 1 << 20;

/// The slow reader takes at most this many bytes of the executor's stdout at a time...
const PACE_BYTES: usize = 16 << 10;

/// ... and waits this long before the next: 800 KiB a second, a few seconds for the 1.4 MB of
/// frames of 1 MiB of output, which leaves the executor's writes blocked most of that time.
const PACE_PAUSE: Duration = Duration::from_millis(20);

/// How long an executor may take to exit once its stdin ended.
const EXIT_BOUND: Duration = Duration::from_secs(30);

/// An executor process of a case's own.
pub(super) struct Raw {
    pub process: ExecutorProcess,
    pub connection: Arc<Connection>,
    name: String,
}

impl Raw {
    /// Spawns the executor; `paced` reads its stdout slowly.
    fn spawn(config: &HostConfig, paced: bool) -> Result<Raw, String> {
        // Nobody reads these: a closed channel drops them without holding the reader back.
        Raw::spawn_watched(config, paced, None, mpsc::channel(1).0)
    }

    /// Spawns the executor as [`Raw::spawn`] does; `watch` sees every line of its stderr and
    /// `unrouted` gets its `log` lines that name no session.
    pub fn spawn_watched(
        config: &HostConfig,
        paced: bool,
        watch: Option<StderrWatch>,
        unrouted: mpsc::Sender<LogParams>,
    ) -> Result<Raw, String> {
        let (process, stdin, stdout) =
            ExecutorProcess::spawn_watched(&config.process, watch).map_err(|error| format!("{error:#}"))?;
        let connection = if paced {
            Connection::new(Paced { inner: stdout, pause: None }, stdin, unrouted)
        } else {
            Connection::new(stdout, stdin, unrouted)
        };
        Ok(Raw { process, connection, name: config.process.name.clone() })
    }

    /// Initializes the executor and starts `start`'s session; its id and its events.
    async fn open(
        &self,
        config: &HostConfig,
        start: &StartParams,
    ) -> Result<(String, tokio::sync::mpsc::Receiver<SessionEvent>), String> {
        let (session, events, _) = self.open_with_paths(config, start).await?;
        Ok((session, events))
    }

    /// As [`Raw::open`], with the session's folders.
    pub async fn open_with_paths(
        &self,
        config: &HostConfig,
        start: &StartParams,
    ) -> Result<(String, tokio::sync::mpsc::Receiver<SessionEvent>, SessionPaths), String> {
        self.initialize(config, config.offer_versions.clone()).await.map_err(|why| self.failed(why))?;
        let events = self.connection.subscribe(&start.session);
        let started = self
            .request::<rpc::Start>(start, Duration::from_millis(start.timeout_ms))
            .await
            .map_err(|why| self.failed(why))?;
        Ok((start.session.clone(), events, started.paths))
    }

    /// Starts `start`'s session and a step in it that says `started` and sleeps, and waits until
    /// it said so: the receiver of the step's answer, and the task that takes the session's
    /// events from then on (the answer to a cancelled step, log lines).
    async fn sleeping_step(
        &self,
        config: &HostConfig,
        start: &StartParams,
    ) -> Result<(tokio::sync::oneshot::Receiver<Answer>, tokio::task::JoinHandle<()>), String> {
        let (session, mut events) = self.open(config, start).await?;
        let params = CommandParams { timeout_ms: 600_000, ..command_params(&session, "echo started; sleep 120") };
        self.connection.set_running(&session, Some(params.step));
        let (_, answer) = self.connection.send(method::COMMAND, &params).await;
        let started = async {
            let mut output = Vec::new();
            while let Some(event) = events.recv().await {
                if let SessionEvent::Output { bytes, .. } = event {
                    output.extend_from_slice(&bytes);
                    if output.starts_with(b"started") {
                        return true;
                    }
                }
            }
            false
        };
        match tokio::time::timeout(Duration::from_secs(20), started).await {
            Ok(true) => {}
            Ok(false) => return Err(self.failed("the executor went away before its step said `started`".into())),
            Err(_) => return Err(self.failed("the step did not say `started` within 20 s".into())),
        }
        let drain = tokio::spawn(async move { while events.recv().await.is_some() {} });
        Ok((answer, drain))
    }

    /// Sends a request and waits `within` for its answer.
    pub async fn request<M: Method>(&self, params: &M::Params, within: Duration) -> Result<M::Result, String> {
        let method = M::NAME;
        let (_, answer) = self.connection.send(method, params).await;
        match tokio::time::timeout(within, answer).await {
            Ok(Ok(Ok(value))) => knotless_host::decode(method, &value),
            Ok(Ok(Err(Reply::Error(error)))) => {
                Err(format!("{method} answered {}: {}", error.kind.code(), error.message))
            }
            Ok(Ok(Err(Reply::Lost(cause)))) => Err(format!("executor {} {cause} during {method}", self.name)),
            Ok(Err(_)) => Err(format!("no answer to {method}")),
            Err(_) => Err(format!("no answer to {method} within {within:?}")),
        }
    }

    async fn initialize(&self, config: &HostConfig, versions: Vec<u32>) -> Result<InitializeResult, String> {
        let params = InitializeParams {
            protocol_versions: versions,
            runner: config.runner.clone(),
            config: config.options.clone(),
        };
        self.request::<rpc::Initialize>(&params, config.handshake_timeout).await
    }

    /// Asks the executor to shut down, then makes sure it is gone.
    pub async fn end(self, grace: Duration) {
        let _ = self.request::<rpc::Shutdown>(&Empty {}, Duration::from_secs(60)).await;
        self.connection.close(Closed::ByRunner("check done".into()));
        if self.process.wait_exit(grace).await.is_none() {
            self.process.terminate(grace).await;
        }
    }

    /// Adds the stderr tail to a failure.
    pub fn failed(&self, why: String) -> String {
        format!("{why}; {}", self.process.tail().render())
    }
}

/// Offers only a version no executor speaks, and expects the refusal.
pub(super) async fn version_refusal(config: &HostConfig) -> Outcome {
    let raw = Raw::spawn(config, false)?;
    let params = InitializeParams {
        protocol_versions: vec![999],
        runner: config.runner.clone(),
        config: config.options.clone(),
    };
    let (_, answer) = raw.connection.send(method::INITIALIZE, &params).await;
    let answer = tokio::time::timeout(Duration::from_secs(30), answer).await;
    raw.connection.close(Closed::ByRunner("check done".into()));
    raw.process.terminate(Duration::from_secs(2)).await;
    match answer {
        Ok(Ok(Err(Reply::Error(error)))) if error.kind == ErrorKind::UnsupportedVersion => {
            let supported = error.data.as_ref().and_then(|data| data.get("supported")).filter(|value| value.is_array());
            match supported {
                Some(supported) => Ok(format!("refused version 999, speaks {supported}")),
                None => Err("the refusal has no data.supported list".into()),
            }
        }
        Ok(Ok(Err(Reply::Error(error)))) => {
            Err(format!("expected error -32005, got {}: {}", error.kind.code(), error.message))
        }
        Ok(Ok(Ok(result))) => Err(format!("accepted version 999: {result}")),
        Ok(Ok(Err(Reply::Lost(cause)))) => Err(format!("the executor {cause}; {}", raw.process.tail().render())),
        Ok(Err(_)) => Err("no answer".into()),
        Err(_) => Err("no answer within 30 s".into()),
    }
}

/// A step writes 1 MiB to stdout at once while this reader takes the executor's stdout slowly:
/// the executor must wait for the pipe, never drop output, and answer only after all of it.
pub(super) async fn slow_reader(config: &HostConfig, start: StartParams) -> Outcome {
    let raw = Raw::spawn(config, true)?;
    let outcome = read_slowly(&raw, config, start).await;
    raw.end(config.grace).await;
    outcome
}

async fn read_slowly(raw: &Raw, config: &HostConfig, start: StartParams) -> Outcome {
    let (session, mut events) = raw.open(config, &start).await?;
    let params = CommandParams {
        timeout_ms: 120_000,
        ..command_params(&session, &format!("seq 1 1000000 | head -c {SLOW_OUTPUT}"))
    };
    raw.connection.set_running(&session, Some(params.step));
    let started = Instant::now();
    let answer = raw.request::<rpc::Command>(&params, Duration::from_secs(180));
    tokio::pin!(answer);
    let mut stdout = Vec::new();
    let mut take = |event: SessionEvent| {
        if let SessionEvent::Output { stream: Stream::Stdout, bytes, .. } = event {
            stdout.extend_from_slice(&bytes);
        }
    };
    let result = loop {
        tokio::select! {
            biased;
            Some(event) = events.recv() => take(event),
            result = &mut answer => break result,
        }
    };
    while let Ok(event) = events.try_recv() {
        take(event);
    }
    let took = started.elapsed();
    raw.connection.set_running(&session, None);
    let stop = StopParams { session: session.clone(), keep: false, timeout_ms: 60_000 };
    let stopped = raw.request::<rpc::Stop>(&stop, Duration::from_secs(60)).await;
    let result = result.map_err(|why| raw.failed(why))?;
    if result.exit_code != 0 {
        return Err(format!("the step exited {}, expected 0", result.exit_code));
    }
    let expected = counted_lines(SLOW_OUTPUT);
    if stdout != expected {
        let same = stdout.iter().zip(&expected).take_while(|(got, wanted)| got == wanted).count();
        return Err(format!(
            "{} of the {} bytes arrived, the first {same} of them as written",
            stdout.len(),
            expected.len()
        ));
    }
    stopped.map_err(|why| format!("stop: {why}"))?;
    Ok(format!("{} bytes arrived whole, read over {} ms", stdout.len(), took.as_millis()))
}

/// The first `bytes` bytes of `seq 1 1000000`.
fn counted_lines(bytes: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(bytes + 8);
    let mut line = 1;
    while text.len() < bytes {
        text.extend_from_slice(format!("{line}\n").as_bytes());
        line += 1;
    }
    text.truncate(bytes);
    text
}

/// Starts a session and a step that sleeps on an executor of its own, closes its stdin once the
/// step runs, and waits for it to exit. Says how long it took.
pub(super) async fn end_of_stdin(config: &HostConfig, start: StartParams) -> Result<String, String> {
    let raw = Raw::spawn(config, false)?;
    let outcome = close_stdin(&raw, config, start).await;
    // Whatever went wrong, the executor is let wind down its step before it is stopped: killed
    // at once, it would leave the step running.
    raw.connection.end_input().await;
    raw.process.wait_exit(config.grace).await;
    raw.connection.close(Closed::ByRunner("check done".into()));
    raw.process.terminate(config.grace).await;
    outcome
}

async fn close_stdin(raw: &Raw, config: &HostConfig, start: StartParams) -> Result<String, String> {
    // The step's answer comes after stdin ended, if at all: it is not waited for here.
    let (_answer, drain) = raw.sleeping_step(config, &start).await?;
    raw.connection.end_input().await;
    let ended = Instant::now();
    let status = raw.process.wait_exit(EXIT_BOUND).await;
    drain.abort();
    match status {
        Some(status) => Ok(format!(
            "exited by itself {} ms after the end of its stdin ({})",
            ended.elapsed().as_millis(),
            describe_status(Some(status))
        )),
        None => Err(raw.failed(format!("did not exit within {EXIT_BOUND:?} of the end of its stdin"))),
    }
}

/// A reader that takes at most [`PACE_BYTES`] at a time and then waits [`PACE_PAUSE`].
struct Paced<R> {
    inner: R,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Paced<R> {
    fn poll_read(self: Pin<&mut Self>, context: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(pause) = &mut this.pause {
            ready!(pause.as_mut().poll(context));
            this.pause = None;
        }
        let mut chunk = [0u8; PACE_BYTES];
        let limit = buf.remaining().min(PACE_BYTES);
        let mut limited = ReadBuf::new(&mut chunk[..limit]);
        ready!(Pin::new(&mut this.inner).poll_read(context, &mut limited))?;
        buf.put_slice(limited.filled());
        if !limited.filled().is_empty() {
            this.pause = Some(Box::pin(tokio::time::sleep(PACE_PAUSE)));
        }
        Poll::Ready(Ok(()))
    }
}

/// The rule a `shutdown` that leaves a request unanswered breaks.
const SHUTDOWN_RULE: &str = "§5.12: `shutdown` cancels every request in flight, and the requests it cancelled are \
                             still answered -32003 (CANCELLED) (or with their result, when they ended first)";

/// Starts a session and a step that sleeps on an executor of its own, sends `shutdown` once the
/// step runs, and expects both answered and the executor gone by itself.
pub(super) async fn shutdown_in_flight(config: &HostConfig, start: StartParams) -> Outcome {
    let raw = Raw::spawn(config, false)?;
    let outcome = shut_down_with_a_step(&raw, config, start).await;
    raw.connection.close(Closed::ByRunner("check done".into()));
    raw.process.terminate(config.grace).await;
    outcome
}

async fn shut_down_with_a_step(raw: &Raw, config: &HostConfig, start: StartParams) -> Outcome {
    let (step, drain) = raw.sleeping_step(config, &start).await?;
    let began = Instant::now();
    let shutdown = raw.request::<rpc::Shutdown>(&Empty {}, EXIT_BOUND);
    let step = async {
        match tokio::time::timeout(EXIT_BOUND, step).await {
            Ok(Ok(Ok(_))) => Ok("a result".to_string()),
            Ok(Ok(Err(Reply::Error(error)))) if error.kind == ErrorKind::Cancelled => Ok("-32003".to_string()),
            Ok(Ok(Err(Reply::Error(error)))) => Err(format!(
                "the step in flight was answered {} ({}), neither -32003 nor a result",
                error.kind.code(),
                error.message
            )),
            Ok(Ok(Err(Reply::Lost(cause)))) => Err(format!("the step in flight was never answered: executor {cause}")),
            Ok(Err(_)) => Err("the step in flight was never answered".to_string()),
            Err(_) => Err(format!("the step in flight was not answered within {EXIT_BOUND:?}")),
        }
    };
    let (shutdown, step) = tokio::join!(shutdown, step);
    let status = raw.process.wait_exit(EXIT_BOUND).await;
    drain.abort();
    let step = step.map_err(|why| format!("{why}; {SHUTDOWN_RULE}"))?;
    shutdown.map_err(|why| raw.failed(format!("shutdown: {why}")))?;
    if status.is_none() {
        return Err(raw.failed(format!("did not exit within {EXIT_BOUND:?} of answering shutdown")));
    }
    Ok(format!(
        "the step in flight answered {step}, shutdown answered, exited by itself {} ms after shutdown",
        began.elapsed().as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_readers_output_is_seq_cut_at_its_size() {
        assert_eq!(counted_lines(6), b"1\n2\n3\n");
        assert_eq!(counted_lines(5), b"1\n2\n3");
        assert_eq!(counted_lines(SLOW_OUTPUT).len(), SLOW_OUTPUT);
    }

    #[tokio::test]
    async fn a_paced_reader_gives_everything_a_little_at_a_time() {
        use tokio::io::AsyncReadExt as _;
        let data = vec![7u8; 3 * PACE_BYTES + 5];
        let mut paced = Paced { inner: data.as_slice(), pause: None };
        let started = Instant::now();
        let mut read = Vec::new();
        paced.read_to_end(&mut read).await.expect("read");
        assert_eq!(read, data);
        assert!(started.elapsed() >= PACE_PAUSE * 3, "{:?}", started.elapsed());
    }
}
