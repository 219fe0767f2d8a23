//! A session on an executor: its steps with their live output, its tar transfers over the side
//! channel (the byte counts of both ends compared), and its end.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use knotless_protocol::channel::ChannelListener;
use knotless_protocol::messages::*;
use knotless_protocol::tarball;
use knotless_protocol::{ErrorKind, ExecutorError, FailureClass};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ExecutorHost, Fault, HostError, Live, SessionEvent};

/// The buffer an upload is copied through.
const UPLOAD_BUFFER: usize = 256 << 10;

/// A session: the environment of one run.
pub struct Session {
    host: Arc<ExecutorHost>,
    live: Arc<Live>,
    id: String,
    start: StartResult,
    events: tokio::sync::Mutex<mpsc::Receiver<SessionEvent>>,
    /// The bytes of tar stream the latest transfer has moved so far.
    moved: Arc<AtomicU64>,
    /// Set once `stop` was sent: a session dropped before has its process shut down.
    stopped: bool,
}

/// What a download brought: the bytes of tar stream and the entries unpacked, and what the
/// executor said it left out of the stream (at most [`MAX_LEFT_OUT`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Downloaded {
    pub bytes: u64,
    pub entries: u64,
    pub left_out: Vec<LeftOut>,
}

impl Session {
    pub(super) fn new(
        host: Arc<ExecutorHost>,
        live: Arc<Live>,
        id: String,
        start: StartResult,
        events: mpsc::Receiver<SessionEvent>,
    ) -> Session {
        Session {
            host,
            live,
            id,
            start,
            events: tokio::sync::Mutex::new(events),
            moved: Arc::default(),
            stopped: false,
        }
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session's folders.
    pub fn paths(&self) -> &SessionPaths {
        &self.start.paths
    }

    /// The executor's description of the environment.
    pub fn description(&self) -> Option<&str> {
        self.start.description.as_deref()
    }

    /// The bytes of tar stream the latest (or the running) upload or download has moved.
    pub fn transferred(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// A reader that counts what `reader` gives into [`Session::transferred`], from zero.
    fn counted<R: AsyncRead>(&self, reader: R) -> tokio_util::io::InspectReader<R, impl FnMut(&[u8]) + use<R>> {
        self.moved.store(0, Ordering::Relaxed);
        let moved = Arc::clone(&self.moved);
        tokio_util::io::InspectReader::new(reader, move |bytes: &[u8]| {
            moved.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        })
    }

    /// Whether the executor serving this session is still connected.
    pub fn is_alive(&self) -> bool {
        !self.live.connection.is_closed()
    }

    /// Events that arrived outside a step (for example during `start`).
    pub async fn drain_events(&self) -> Vec<SessionEvent> {
        let mut events = self.events.lock().await;
        let mut drained = Vec::new();
        while let Ok(event) = events.try_recv() {
            drained.push(event);
        }
        drained
    }

    /// Runs one step; `on_event` sees its output and log lines as they come, all of them
    /// before this returns.
    pub async fn command(
        &self,
        params: CommandParams,
        cancel: &CancellationToken,
        mut on_event: impl FnMut(SessionEvent),
    ) -> Result<CommandResult, HostError> {
        let timeout = Duration::from_millis(params.timeout_ms);
        self.live.connection.set_running(&params.session, Some(params.step));
        let call = self.host.call_on::<rpc::Command>(&self.live, &params, timeout, cancel);
        tokio::pin!(call);
        let mut events = self.events.lock().await;
        let result = loop {
            tokio::select! {
                biased;
                Some(event) = events.recv() => on_event(event),
                result = &mut call => break result,
            }
        };
        // The connection routes every notification before the answer that follows it.
        while let Ok(event) = events.try_recv() {
            on_event(event);
        }
        self.live.connection.set_running(&params.session, None);
        result
    }

    /// The runner's verdict on a step's answer (see [`judge`]).
    pub fn judge(
        &self,
        step: u32,
        result: Result<CommandResult, HostError>,
        took: Duration,
        timeout: Duration,
        cancelled: bool,
    ) -> Result<CommandResult, HostError> {
        judge(self.host.name(), step, result, took, timeout, cancelled)
    }

    /// Streams a tar archive from `source` into `path` in the session.
    pub async fn upload(
        &self,
        path: &str,
        mut source: impl AsyncRead + Unpin + Send,
        max_bytes: u64,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<u64, HostError> {
        let (listener, params) = self.transfer(path, max_bytes, timeout)?;
        let abandon = CancellationToken::new();
        let call = self.host.call_on::<rpc::Upload>(&self.live, &params, timeout, cancel);
        let send = async {
            let mut stream = unless_abandoned(&abandon, listener.accept()).await?;
            // Large reads and writes: tokio's `copy` moves 8 KiB at a time.
            let mut source = tokio::io::BufReader::with_capacity(UPLOAD_BUFFER, self.counted(&mut source));
            // Nothing here runs apart from this future: an abandoned copy is simply dropped.
            let sent = unless_abandoned(&abandon, tokio::io::copy_buf(&mut source, &mut stream)).await?;
            drop(stream);
            io::Result::Ok(sent)
        };
        let (answer, sent) = race(call, send, &abandon).await;
        let result = answer?;
        let sent = sent.map_err(|error| self.lost_stream(format!("the upload to {path} did not complete: {error}")))?;
        if sent != result.bytes {
            return Err(self.lost_stream(format!(
                "sent {sent} bytes of tar stream to {path}, the executor read {}",
                result.bytes
            )));
        }
        Ok(sent)
    }

    /// Streams `path` in the session out as tar and unpacks it, vetted, into `dest`.
    ///
    /// The unpacking runs on a blocking thread; it has ended before this returns, whatever the
    /// executor answered: an error answer (or a stream left unfinished) abandons the stream,
    /// which fails the unpacking's next read, and the thread is awaited. So nothing of a failed
    /// download is written into `dest` after this returns. When this future is dropped instead,
    /// the stream is abandoned all the same and the thread ends at its next read.
    pub async fn download(
        &self,
        path: &str,
        dest: &Path,
        max_bytes: u64,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Downloaded, HostError> {
        let (listener, params) = self.transfer(path, max_bytes, timeout)?;
        let abandon = CancellationToken::new();
        let _abandoned_when_dropped = abandon.clone().drop_guard();
        let call = self.host.call_on::<rpc::Download>(&self.live, &params, timeout, cancel);
        let dest = dest.to_path_buf();
        let receive = async {
            let stream = unless_abandoned(&abandon, listener.accept()).await?;
            // Bound what is read even if the executor ignores `max_bytes`.
            let bounded = self.counted(Abandonable::new(stream.take(max_bytes + 1), &abandon));
            let bridge = tokio_util::io::SyncIoBridge::new(bounded);
            // Awaited to its end, never dropped: its reader fails once the stream is abandoned.
            tokio::task::spawn_blocking(move || tarball::unpack_vetted(bridge, &dest, max_bytes))
                .await
                .map_err(io::Error::other)?
                .map_err(io::Error::other)
        };
        let (answer, received) = race(call, receive, &abandon).await;
        // The runner's own reading of the stream names best what was wrong with it (the bound
        // and the entry that crossed it, a refused entry), whatever the executor answered.
        if let Some(refusal) = received.as_ref().err().and_then(|error| error.get_ref()).and_then(|error| {
            error.downcast_ref::<tarball::UnpackError>().filter(|refusal| {
                matches!(refusal, tarball::UnpackError::TooLarge { .. } | tarball::UnpackError::Refused { .. })
            })
        }) {
            return Err(HostError::fault(
                Fault::Refused,
                format!("refused the download of {path} from executor {}: {refusal}", self.host.name()),
            ));
        }
        let result = answer?;
        let unpacked = received.map_err(|error| self.lost_stream(format!("the download of {path} failed: {error}")))?;
        if unpacked.bytes != result.bytes {
            return Err(self.lost_stream(format!(
                "received {} bytes of tar stream from {path}, the executor wrote {}",
                unpacked.bytes, result.bytes
            )));
        }
        let mut left_out = result.left_out;
        left_out.truncate(MAX_LEFT_OUT);
        Ok(Downloaded { bytes: unpacked.bytes, entries: unpacked.entries, left_out })
    }

    fn transfer(
        &self,
        path: &str,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<(ChannelListener, TransferParams), HostError> {
        let socket = self.host.next_channel();
        let listener = ChannelListener::bind(&socket).map_err(|error| {
            HostError::fault(Fault::Runner, format!("cannot open a side channel at {}: {error}", socket.display()))
        })?;
        let params = TransferParams {
            session: self.id.clone(),
            path: path.to_string(),
            channel: socket.to_string_lossy().into_owned(),
            max_bytes,
            timeout_ms: timeout.as_millis() as u64,
        };
        Ok((listener, params))
    }

    fn lost_stream(&self, detail: String) -> HostError {
        HostError::fault(Fault::LostStream, format!("executor {} lost a tar stream: {detail}", self.host.name()))
    }

    /// Ends the session; its resources are deleted unless `keep`. With a process a session,
    /// the process then waits for the next session, or, when the stop failed, is shut down.
    pub async fn stop(mut self, keep: bool, timeout: Duration) -> Result<StopResult, HostError> {
        self.stopped = true;
        let params = StopParams { session: self.id.clone(), keep, timeout_ms: timeout.as_millis() as u64 };
        let never = CancellationToken::new();
        let result = self.host.call_on::<rpc::Stop>(&self.live, &params, timeout, &never).await;
        self.live.connection.unsubscribe(&self.id);
        self.host.session_ended(&self.id);
        if self.host.config.process_per_session {
            match &result {
                Ok(_) => self.host.give_back(self.live.clone()).await,
                Err(_) => {
                    self.host.shut_down(self.live.clone()).await;
                }
            }
        }
        result
    }
}

impl Drop for Session {
    /// A session dropped before its `stop` (its run's task ended early) has its own process
    /// shut down, which stops the session; with one process for all, it stays until `cleanup`.
    fn drop(&mut self) {
        if self.stopped || !self.host.config.process_per_session {
            return;
        }
        self.live.connection.unsubscribe(&self.id);
        self.host.session_ended(&self.id);
        let (host, live) = (self.host.clone(), self.live.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                host.shut_down(live).await;
            });
        }
    }
}

/// How long the runner's end of a stream may take to finish once the executor has answered.
const STREAM_AFTER_ANSWER: Duration = Duration::from_secs(10);

/// Waits for the answer to a transfer and for the runner's end of its stream, which has always
/// ended when this returns. When the answer is an error, or the stream has not finished
/// [`STREAM_AFTER_ANSWER`] after a good one, the stream is abandoned (the executor may never
/// have connected, or may write on after its answer) and waited for to its end: `stream` must
/// end soon once `abandon` is cancelled.
async fn race<A, S>(
    call: impl std::future::Future<Output = Result<A, HostError>>,
    stream: impl std::future::Future<Output = io::Result<S>>,
    abandon: &CancellationToken,
) -> (Result<A, HostError>, io::Result<S>) {
    tokio::pin!(call);
    tokio::pin!(stream);
    let mut streamed = None;
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
            done = &mut stream, if streamed.is_none() => streamed = Some(done),
        }
    };
    if let Some(done) = streamed {
        return (answer, done);
    }
    if answer.is_err() {
        abandon.cancel();
        return (answer, stream.await);
    }
    let streamed = match tokio::time::timeout(STREAM_AFTER_ANSWER, &mut stream).await {
        Ok(done) => done,
        Err(_) => {
            abandon.cancel();
            let _ = stream.await;
            Err(io::Error::other("the executor answered but never finished the stream"))
        }
    };
    (answer, streamed)
}

/// The error of a stream the runner abandoned.
fn abandoned() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the runner abandoned the stream")
}

/// What `work` gives, or the abandoned error once `abandon` is cancelled (`work` is then
/// dropped: it must start nothing that outlives it).
async fn unless_abandoned<T>(
    abandon: &CancellationToken,
    work: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::select! {
        biased;
        () = abandon.cancelled() => Err(abandoned()),
        done = work => done,
    }
}

/// A reader that fails with the abandoned error once its token is cancelled, even while it
/// waits for bytes: a blocking thread reading through it ends at its next read.
struct Abandonable<R> {
    inner: R,
    abandoned: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl<R> Abandonable<R> {
    fn new(inner: R, abandon: &CancellationToken) -> Abandonable<R> {
        Abandonable { inner, abandoned: Box::pin(abandon.clone().cancelled_owned()) }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Abandonable<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffer: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if std::future::Future::poll(self.abandoned.as_mut(), context).is_ready() {
            return std::task::Poll::Ready(Err(abandoned()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(context, buffer)
    }
}

/// The runner's verdict on a step's answer: the runner owns the step's deadline and its
/// cancellation, whatever the executor answered. A user's cancel ends the step cancelled, and
/// an answer that came `took` after the request, past the step's `timeout` (the runner's
/// `cancel` for the deadline included), ends it timed out, even with an exit code 0. An
/// executor's own fault (it died, broke the protocol, hit an infrastructure or configuration
/// error) stays what it is.
pub fn judge(
    executor: &str,
    step: u32,
    result: Result<CommandResult, HostError>,
    took: Duration,
    timeout: Duration,
    cancelled: bool,
) -> Result<CommandResult, HostError> {
    let answered = match &result {
        Ok(result) => format!("exit code {}", result.exit_code),
        Err(HostError::Answered { error, .. })
            if matches!(error.kind.step_class(), FailureClass::Step | FailureClass::Cancelled) =>
        {
            format!("{:?}", error.kind)
        }
        Err(_) => return result,
    };
    let said = match &result {
        Err(HostError::Answered { error, .. }) => Some(error.kind),
        _ => None,
    };
    let error = if cancelled {
        ExecutorError::cancelled()
    } else if took >= timeout {
        ExecutorError::timeout(format!(
            "step {step} passed its timeout of {}: the answer came after {}",
            crate::printable::duration(timeout),
            crate::printable::duration(took)
        ))
    } else {
        return result;
    };
    // The executor's own word that the step failed for a reason of its own (it exhausted its
    // environment's pids, the kernel killed it for memory) is a failure too, and says more.
    if said == Some(error.kind) || (error.kind == ErrorKind::Timeout && said == Some(ErrorKind::StepFailed)) {
        return result;
    }
    tracing::warn!(executor = %executor, step, answered = %answered, verdict = ?error.kind,
        "the executor answered after the step was cancelled or passed its deadline: the runner's verdict stands");
    Err(HostError::Answered { executor: executor.to_string(), method: method::COMMAND.to_string(), error })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(error: ExecutorError) -> Result<CommandResult, HostError> {
        Err(HostError::Answered { executor: "x".into(), method: "command".into(), error })
    }

    #[test]
    fn an_answer_past_the_deadline_is_a_timeout_unless_it_names_the_steps_own_failure() {
        let (late, timeout) = (Duration::from_secs(9), Duration::from_secs(8));
        let passed = Ok(CommandResult { exit_code: 0, duration_ms: 9000, killed_processes: 0 });
        let verdict = judge("x", 0, passed, late, timeout, false).expect_err("a timeout");
        assert_eq!(verdict.kind(), Some(ErrorKind::Timeout));
        let own = ExecutorError::new(ErrorKind::StepFailed, "step s exhausted its pids limit of 1024");
        let verdict = judge("x", 0, answered(own), late, timeout, false).expect_err("a failure");
        assert_eq!(verdict.kind(), Some(ErrorKind::StepFailed));
        assert!(verdict.to_string().contains("exhausted its pids limit"), "{verdict}");
        let own = ExecutorError::new(ErrorKind::StepFailed, "step s ran out of memory");
        let verdict = judge("x", 0, answered(own), late, timeout, true).expect_err("cancelled");
        assert_eq!(verdict.kind(), Some(ErrorKind::Cancelled), "a cancel stays the user's");
    }

    #[test]
    fn a_late_answer_names_its_times_as_people_read_them() {
        let (late, timeout) = (Duration::from_nanos(19_746_319_455), Duration::from_millis(19_700));
        let passed = Ok(CommandResult { exit_code: 0, duration_ms: 19_746, killed_processes: 0 });
        let verdict = judge("x", 3, passed, late, timeout, false).expect_err("a timeout");
        assert_eq!(
            verdict.to_string(),
            "executor x: command: step 3 passed its timeout of 19.7 s: the answer came after 19.7 s"
        );
    }
}
