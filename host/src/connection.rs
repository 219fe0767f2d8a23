//! One JSON-RPC connection to an executor: requests out with their ids, responses matched back,
//! and the executor's notifications routed to the session they name, in the order they came.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use knotless_protocol::envelope::{Message, Notification, Request, Unreadable};
use knotless_protocol::framing;
use knotless_protocol::messages::{LogLevel, LogParams, Notify, Stream, method};
use knotless_protocol::{ExecutorError, error::ErrorKind};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// What an executor told the runner about a session besides answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// Bytes a step wrote.
    Output {
        /// The step's number.
        step: u32,
        /// Which stream.
        stream: Stream,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// A line for the run's log.
    Log {
        /// How serious.
        level: LogLevel,
        /// The line.
        message: String,
    },
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// The executor closed its stdout (it exited, most likely).
    EndOfStream,
    /// The executor wrote something that is not a protocol message.
    Garbage(String),
    /// Reading failed.
    ReadFailed(String),
    /// The runner closed it (shutdown, or the executor was killed).
    ByRunner(String),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::EndOfStream => write!(f, "closed its stdout"),
            Closed::Garbage(detail) => write!(f, "broke the protocol: {detail}"),
            Closed::ReadFailed(detail) => write!(f, "could not be read: {detail}"),
            Closed::ByRunner(detail) => write!(f, "{detail}"),
        }
    }
}

/// The outcome of one request, before the host interprets it: its `result` as written.
pub type Answer = Result<Box<RawValue>, Reply>;

/// A request that did not end in a result.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The executor answered with an error.
    Error(ExecutorError),
    /// The connection ended first; the host words the cause.
    Lost(Closed),
}

/// What a frame gives to deliver, with back-pressure: an event for a session's channel, or a
/// `log` line for the runner's own log (no session takes it).
enum Deliver {
    Session(mpsc::Sender<SessionEvent>, SessionEvent),
    Unrouted(LogParams),
}

type Delivery = Option<Deliver>;

/// How many `log` lines no session takes may wait for the runner's own log before the reader
/// waits (and so the executor, whose stdout is then not read).
pub const UNROUTED_LOGS: usize = 256;

/// An `output` notification's params, its strings borrowed.
#[derive(serde::Deserialize)]
struct OutputRef<'a> {
    /// Borrowed from the frame unless written with escapes.
    #[serde(borrow)]
    session: std::borrow::Cow<'a, str>,
    step: u32,
    stream: Stream,
    #[serde(borrow)]
    data: std::borrow::Cow<'a, str>,
}

/// A whole `output` notification, nothing else in it (a message with an `id` is not one).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputNotification<'a> {
    jsonrpc: &'a str,
    method: &'a str,
    #[serde(borrow)]
    params: OutputRef<'a>,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;
type Sessions = Arc<Mutex<HashMap<String, mpsc::Sender<SessionEvent>>>>;

/// How many events of one session wait for the run to take them: past that the reader stops
/// reading the executor's stdout until the run catches up, so a step that prints faster than
/// its log is written slows down instead of filling the runner's memory; nothing is dropped.
pub const SESSION_EVENTS: usize = 256;

/// How many bytes of frames the reader reads between two yields to the runtime.
const YIELD_EVERY: usize = 256 * 1024;

/// A live connection. Cheap to share; every method takes `&self`.
pub struct Connection {
    writer: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    pending: Pending,
    sessions: Sessions,
    next_id: AtomicU64,
    /// The step running in each session, as the runner asked for it: output for any other
    /// step, or for a session running none, breaks the protocol.
    running: Mutex<HashMap<String, u32>>,
    /// The session of each `command` in flight, by request id: its answer ends the step there
    /// and then, in the order the executor wrote, so output after it breaks the protocol.
    commands: Mutex<HashMap<u64, String>>,
    closed: CancellationToken,
    cause: Arc<Mutex<Option<Closed>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl Connection {
    /// Starts reading `input` in a task and returns the connection. `unrouted` gets `log`
    /// notifications that name no known session.
    pub fn new<R, W>(input: R, output: W, unrouted: mpsc::Sender<LogParams>) -> Arc<Connection>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let connection = Arc::new(Connection {
            writer: tokio::sync::Mutex::new(Box::new(output)),
            pending: Arc::default(),
            sessions: Arc::default(),
            next_id: AtomicU64::new(1),
            running: Mutex::default(),
            commands: Mutex::default(),
            closed: CancellationToken::new(),
            cause: Arc::default(),
        });
        let reader = connection.clone();
        tokio::spawn(async move {
            let cause = reader.read_loop(input, unrouted).await;
            reader.close(cause);
        });
        connection
    }

    async fn read_loop<R: AsyncRead + Unpin>(&self, input: R, unrouted: mpsc::Sender<LogParams>) -> Closed {
        let mut frames = FramedRead::new(input, framing::codec());
        let mut since_yield = 0usize;
        loop {
            let frame = tokio::select! {
                frame = frames.next() => frame,
                () = self.closed.cancelled() => return Closed::ByRunner("closed by the runner".into()),
            };
            let frame = match frame {
                None => return Closed::EndOfStream,
                Some(Ok(frame)) => frame,
                Some(Err(error)) => return Closed::ReadFailed(error.to_string()),
            };
            // A long stream of frames (step output) yields to the runtime every 256 KiB: the
            // run that takes the output then goes on on the runtime's other worker while this
            // one reads; without it, both would take turns on one worker.
            since_yield += frame.len();
            if since_yield >= YIELD_EVERY {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
            match self.handle_frame(&frame) {
                Err(detail) => return Closed::Garbage(detail),
                // Back-pressure: the next frame is read only once the run (or the runner's own
                // log) took this one.
                Ok(Some(Deliver::Session(sender, event))) => {
                    tokio::select! {
                        _ = sender.send(event) => {}
                        () = self.closed.cancelled() => return Closed::ByRunner("closed by the runner".into()),
                    }
                }
                Ok(Some(Deliver::Unrouted(log))) => {
                    tokio::select! {
                        _ = unrouted.send(log) => {}
                        () = self.closed.cancelled() => return Closed::ByRunner("closed by the runner".into()),
                    }
                }
                Ok(None) => {}
            }
        }
    }

    /// Routes one frame; an error describes a protocol violation. Step output is returned with
    /// its session's channel, for the reader to deliver with back-pressure.
    fn handle_frame(&self, frame: &[u8]) -> Result<Delivery, String> {
        // Step output, most of the frames, parsed straight into its fields with its data
        // borrowed from the frame (unless written with escapes); anything else is read once
        // into an envelope below.
        if let Ok(output) = serde_json::from_slice::<OutputNotification>(frame)
            && output.jsonrpc == "2.0"
            && output.method == method::OUTPUT
        {
            return self.route_output(output.params, frame);
        }
        let not_a_message = |why: &str| format!("{why}: first bytes `{}`", framing::first_bytes(frame));
        let message = match Message::read(frame) {
            Ok(message) => message,
            Err(Unreadable::NotAMessage(_)) => {
                return Err(not_a_message("a JSON value that is not a JSON-RPC message"));
            }
            Err(Unreadable::NotJson(_)) => return Err(not_a_message("a line that is not JSON")),
        };
        if !message.is_v2() {
            return Err(not_a_message("a message without \"jsonrpc\": \"2.0\""));
        }
        match (&message.id, message.method) {
            (Some(id), None) => {
                // A response, to a request the runner sent and that has not been answered yet;
                // one for a request the runner stopped waiting for is dropped.
                let sent = id.as_u64().filter(|id| *id > 0 && *id < self.next_id.load(Ordering::SeqCst));
                let Some(id) = sent else {
                    return Err(not_a_message(&format!("a response with an id the runner never sent ({id})")));
                };
                let answer = if let Some(error) = message.error {
                    let kind = ErrorKind::from_code(i32::try_from(error.code).unwrap_or(0));
                    Err(Reply::Error(ExecutorError { kind, message: error.message, data: error.data }))
                } else if let Some(result) = message.result {
                    Ok(result.to_owned())
                } else {
                    return Err(not_a_message("a response with neither result nor error"));
                };
                let Some(sender) = lock(&self.pending).remove(&id) else {
                    return Err(not_a_message(&format!("a second answer to request {id}")));
                };
                if let Some(session) = lock(&self.commands).remove(&id) {
                    lock(&self.running).remove(&session);
                }
                let _ = sender.send(answer);
                Ok(None)
            }
            (None, Some(_)) => {
                let params = message.params.map_or("null", RawValue::get);
                match message.method_name().as_deref() {
                    Some(method::OUTPUT) => {
                        let output = serde_json::from_str::<OutputRef>(params)
                            .map_err(|error| not_a_message(&format!("a bad output notification ({error})")))?;
                        self.route_output(output, frame)
                    }
                    Some(method::LOG) => {
                        let log = serde_json::from_str::<LogParams>(params)
                            .map_err(|error| not_a_message(&format!("a bad log notification ({error})")))?;
                        // A session's log line waits its turn while the session runs a step (its
                        // run takes it); otherwise, or when the run is not taking them, it goes to
                        // the runner's own log rather than block the reader.
                        let session = log.session.clone().unwrap_or_default();
                        let sender = lock(&self.sessions).get(&session).cloned();
                        let running = lock(&self.running).contains_key(&session);
                        let event = SessionEvent::Log { level: log.level, message: log.message.clone() };
                        match sender {
                            Some(sender) if running => Ok(Some(Deliver::Session(sender, event))),
                            Some(sender) if sender.try_send(event).is_ok() => Ok(None),
                            _ => Ok(Some(Deliver::Unrouted(log))),
                        }
                    }
                    // Unknown notifications are ignored, so executors may add their own.
                    Some(_) => Ok(None),
                    None => Err(not_a_message("a method that is not a string")),
                }
            }
            (Some(_), Some(_)) => Err(not_a_message("a request (executors may only answer and notify)")),
            (None, None) => Err(not_a_message("a message with neither id nor method")),
        }
    }

    /// Decodes step output and finds the channel of its session, if it is for the step the
    /// session runs.
    fn route_output(&self, output: OutputRef<'_>, frame: &[u8]) -> Result<Delivery, String> {
        let not_a_message = |why: &str| format!("{why}: first bytes `{}`", framing::first_bytes(frame));
        let bytes = base64_simd::STANDARD
            .decode_to_vec(output.data.as_bytes())
            .map_err(|error| not_a_message(&format!("output that is not base64 ({error})")))?;
        let running = lock(&self.running).get(output.session.as_ref()).copied();
        match running {
            Some(step) if step == output.step => {}
            Some(step) => {
                return Err(not_a_message(&format!(
                    "output for step {} of session {} while step {step} runs",
                    output.step, output.session
                )));
            }
            None => {
                return Err(not_a_message(&format!("output for session {} while it runs no step", output.session)));
            }
        }
        let event = SessionEvent::Output { step: output.step, stream: output.stream, bytes };
        Ok(lock(&self.sessions).get(output.session.as_ref()).map(|sender| Deliver::Session(sender.clone(), event)))
    }

    /// Receives the events of `session` from now on.
    pub fn subscribe(&self, session: &str) -> mpsc::Receiver<SessionEvent> {
        let (sender, receiver) = mpsc::channel(SESSION_EVENTS);
        lock(&self.sessions).insert(session.to_string(), sender);
        receiver
    }

    /// Marks `step` of `session` running (`Some`) or none (`None`): output is accepted for the
    /// running step only.
    pub fn set_running(&self, session: &str, step: Option<u32>) {
        let mut running = lock(&self.running);
        match step {
            Some(step) => running.insert(session.to_string(), step),
            None => running.remove(session),
        };
    }

    /// Stops routing events of `session`.
    pub fn unsubscribe(&self, session: &str) {
        lock(&self.sessions).remove(session);
    }

    /// Sends a request; the receiver gets its answer, or the reason the connection ended.
    pub async fn send<P: Serialize>(&self, method: &str, params: &P) -> (u64, oneshot::Receiver<Answer>) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (sender, receiver) = oneshot::channel();
        lock(&self.pending).insert(id, sender);
        let request = Request::named(id, method, params);
        if method == method::COMMAND
            && let Ok(command) = serde_json::to_value(params)
            && let Some(session) = command["session"].as_str()
        {
            lock(&self.commands).insert(id, session.to_string());
        }
        let frame = framing::encode(&request);
        if let Some(cause) = self.cause() {
            self.fail(id, cause);
        } else if let Err(error) = self.write(&frame).await {
            self.fail(id, Closed::ReadFailed(format!("cannot write to its stdin: {error}")));
        }
        (id, receiver)
    }

    /// Sends a notification; errors are ignored (a dead connection reports itself elsewhere).
    pub async fn notify<N: Notify>(&self, params: &N::Params) {
        let frame = framing::encode(&Notification::of::<N>(params));
        let _ = self.write(&frame).await;
    }

    /// Closes the executor's stdin (it reads the end of its input) and keeps reading its
    /// stdout; what is sent after this goes nowhere.
    pub async fn end_input(&self) {
        let mut writer = self.writer.lock().await;
        let _ = writer.shutdown().await;
        *writer = Box::new(tokio::io::sink());
    }

    async fn write(&self, frame: &[u8]) -> std::io::Result<()> {
        let mut writer = self.writer.lock().await;
        writer.write_all(frame).await?;
        writer.flush().await
    }

    fn fail(&self, id: u64, cause: Closed) {
        if let Some(sender) = lock(&self.pending).remove(&id) {
            let _ = sender.send(Err(Reply::Lost(cause)));
        }
    }

    /// Ends the connection: every request waiting gets `cause`.
    pub fn close(&self, cause: Closed) {
        {
            let mut slot = lock(&self.cause);
            if slot.is_none() {
                *slot = Some(cause.clone());
            }
        }
        self.closed.cancel();
        let waiting: Vec<_> = lock(&self.pending).drain().collect();
        let cause = self.cause().unwrap_or(cause);
        for (_, sender) in waiting {
            let _ = sender.send(Err(Reply::Lost(cause.clone())));
        }
        lock(&self.sessions).clear();
    }

    /// Why the connection ended, if it has.
    pub fn cause(&self) -> Option<Closed> {
        lock(&self.cause).clone()
    }

    /// Resolves when the connection ends.
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }
}

/// Decodes a result into its type; a result of the wrong shape is a protocol violation.
pub fn decode<R: DeserializeOwned>(method: &str, result: &RawValue) -> Result<R, String> {
    serde_json::from_str(result.get()).map_err(|error| {
        format!(
            "answered {method} with a result of the wrong shape ({error}): `{}`",
            framing::first_bytes(result.get().as_bytes())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_data_edge_cases_are_decoded_as_the_standard_engine_decodes_them() {
        use base64::Engine as _;
        let standard = base64::engine::general_purpose::STANDARD;
        for text in [
            "", "QQ==", "QR==", "QUI=", "QUJ=", "QUJD", "QQ", "QQ=", "Q===", "QQ===", "=QUJD", "QUJD=", "QUJD====",
            "QQ==QQ==", "QUJD\n", " QUJD", "QU JD", "QUJD-_", "QUJD-_8=", "+/8=", "QUJD!", "QUJDRA", "QUJDRA=",
            "QUJDRA==",
        ] {
            assert_eq!(
                base64_simd::STANDARD.decode_to_vec(text.as_bytes()).ok(),
                standard.decode(text.as_bytes()).ok(),
                "{text:?}"
            );
        }
    }

    proptest::proptest! {
        /// Step output is decoded with a SIMD decoder: it takes exactly what the `base64`
        /// crate's standard engine takes (padded, canonical), and gives the same bytes.
        #[test]
        fn output_data_is_decoded_as_the_standard_engine_decodes_it(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
            noise in "[A-Za-z0-9+/=\\-_ \n.]{0,24}",
            at in 0usize..300,
        ) {
            use base64::Engine as _;
            let standard = base64::engine::general_purpose::STANDARD;
            let encoded = standard.encode(&bytes);
            proptest::prop_assert_eq!(base64_simd::STANDARD.decode_to_vec(encoded.as_bytes()).ok(), Some(bytes));
            // The same with noise put in, or in place of the end: both refuse it, or both give
            // the same bytes.
            let cut = at.min(encoded.len());
            for mangled in [format!("{}{noise}{}", &encoded[..cut], &encoded[cut..]), format!("{}{noise}", &encoded[..cut])] {
                proptest::prop_assert_eq!(
                    base64_simd::STANDARD.decode_to_vec(mangled.as_bytes()).ok(),
                    standard.decode(mangled.as_bytes()).ok(),
                    "{:?}", mangled
                );
            }
        }
    }

    #[test]
    fn an_output_notification_is_parsed_in_place_and_anything_more_is_not_one() {
        let frame = br#"{"jsonrpc":"2.0","method":"output","params":{"session":"s1","step":3,"stream":"stderr","data":"aGk="}}"#;
        let parsed = serde_json::from_slice::<OutputNotification>(frame).expect("the fast path takes it");
        assert_eq!(
            (parsed.params.session.as_ref(), parsed.params.step, parsed.params.data.as_ref()),
            ("s1", 3, "aGk=")
        );
        assert!(matches!(parsed.params.data, std::borrow::Cow::Borrowed(_)), "the data is borrowed from the frame");
        let with_id = br#"{"jsonrpc":"2.0","id":1,"method":"output","params":{"session":"s1","step":3,"stream":"stderr","data":""}}"#;
        assert!(serde_json::from_slice::<OutputNotification>(with_id).is_err());
    }

    /// A connection to an executor played by the test through the other end of a pipe of
    /// `capacity` bytes.
    fn connected(capacity: usize) -> (Arc<Connection>, tokio::io::DuplexStream) {
        let (runner_side, executor_side) = tokio::io::duplex(capacity);
        let (read, write) = tokio::io::split(runner_side);
        let (unrouted, _) = mpsc::channel(UNROUTED_LOGS);
        (Connection::new(read, write, unrouted), executor_side)
    }

    /// Sends `output` (an output notification for step 0 of session `s1`, which runs) and
    /// then the answer to its `command` with `result` (`ID` replaced by its id); the event
    /// routed once the answer came, and the answer.
    async fn output_then_answer(output: &str, result: &str) -> (Option<SessionEvent>, Box<RawValue>) {
        let (connection, mut executor_side) = connected(1 << 16);
        let mut events = connection.subscribe("s1");
        connection.set_running("s1", Some(0));
        let (id, answer) = connection.send("command", &serde_json::json!({})).await;
        let answer_line = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
        executor_side.write_all(format!("{output}\n{answer_line}\n").as_bytes()).await.expect("write");
        let result = answer.await.expect("answered").expect("a result");
        (events.try_recv().ok(), result)
    }

    /// An executor flooding `log` lines no session takes fills a bounded queue, and then waits
    /// on its own stdout: the runner holds at most so many, whatever it sends.
    #[tokio::test]
    async fn log_lines_no_session_takes_push_back_on_the_executor() {
        let (runner_side, mut executor_side) = tokio::io::duplex(4096);
        let (read, write) = tokio::io::split(runner_side);
        let (unrouted, mut logs) = mpsc::channel(UNROUTED_LOGS);
        let _connection = Connection::new(read, write, unrouted);
        let line = "{\"jsonrpc\":\"2.0\",\"method\":\"log\",\"params\":{\"level\":\"info\",\"message\":\"flood\"}}\n";
        let sent = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&sent);
        let flood = tokio::spawn(async move {
            while executor_side.write_all(line.as_bytes()).await.is_ok() {
                if counted.fetch_add(1, Ordering::SeqCst) + 1 == 100_000 {
                    break;
                }
            }
        });
        // Nobody reads the runner's log: the executor's writes stop, once the queue and the
        // pipe are full, and stay stopped.
        let mut last = u64::MAX;
        let mut still = 0;
        while still < 5 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let now = sent.load(Ordering::SeqCst);
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        // The queue, the pipe and the reader's buffer (a few KiB) hold what was written.
        let bound = (UNROUTED_LOGS + (64 << 10) / line.len()) as u64;
        assert!(last <= bound, "the executor wrote {last} lines into a runner that took none (bound {bound})");
        assert_eq!(logs.len(), UNROUTED_LOGS, "the queue is full, and no fuller");
        // Taking them lets it go on to its end.
        let mut taken = 0;
        while taken < 100_000 && logs.recv().await.is_some() {
            taken += 1;
        }
        flood.await.expect("the flood");
        assert_eq!((taken, sent.load(Ordering::SeqCst)), (100_000, 100_000));
    }

    #[tokio::test]
    async fn output_reaches_the_session_before_the_answer_that_follows_it() {
        let (event, result) = output_then_answer(
            r#"{"jsonrpc":"2.0","method":"output","params":{"session":"s1","step":0,"stream":"stdout","data":"aGk="}}"#,
            r#"{"exit_code":0,"duration_ms":1}"#,
        )
        .await;
        let result: knotless_protocol::CommandResult = decode("command", &result).expect("a command result");
        assert_eq!(result.exit_code, 0);
        let event = event.expect("the output was routed before the answer");
        assert_eq!(event, SessionEvent::Output { step: 0, stream: Stream::Stdout, bytes: b"hi".to_vec() });
    }

    #[tokio::test]
    async fn output_and_answers_written_with_escapes_are_read_as_their_text() {
        // `\u0031` is `1`, `\u003d` is `=`, `\/` is `/`: text written with escapes is its text.
        let (event, result) = output_then_answer(
            r#"{"jsonrpc":"2.0","method":"output","params":{"session":"s\u0031","step":0,"stream":"stdout","data":"aGk\u003d"}}"#,
            r#"{"exit_code":0,"duration_ms":1,"note":"a\/b"}"#,
        )
        .await;
        let event = event.expect("the output was routed");
        assert_eq!(event, SessionEvent::Output { step: 0, stream: Stream::Stdout, bytes: b"hi".to_vec() });
        let result: serde_json::Value = decode("command", &result).expect("a result");
        assert_eq!(result["note"], "a/b");
    }

    #[tokio::test]
    async fn garbage_closes_the_connection_and_fails_what_waits() {
        let (connection, mut executor_side) = connected(1 << 16);
        let (_, answer) = connection.send("ping", &serde_json::json!({})).await;
        executor_side.write_all(b"hello there\n").await.expect("write");
        let reply = answer.await.expect("answered");
        let Err(Reply::Lost(Closed::Garbage(detail))) = reply else {
            panic!("expected garbage, got {reply:?}");
        };
        assert!(detail.contains("`hello there`"), "{detail}");
    }

    /// Sends `lines` after a `command` for step 0 of session `s1` (marked running) and returns
    /// why the connection closed.
    async fn closed_by(lines: &[&str]) -> String {
        let (connection, mut executor_side) = connected(1 << 16);
        let _events = connection.subscribe("s1");
        connection.set_running("s1", Some(0));
        let (id, answer) = connection.send("command", &serde_json::json!({})).await;
        let mut text = String::new();
        for line in lines {
            text.push_str(&line.replace("ID", &id.to_string()));
            text.push('\n');
        }
        executor_side.write_all(text.as_bytes()).await.expect("write");
        connection.closed().await;
        drop(answer);
        match connection.cause() {
            Some(Closed::Garbage(detail)) => detail,
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn answers_and_output_the_runner_did_not_ask_for_break_the_protocol() {
        let ok = r#"{"jsonrpc":"2.0","id":ID,"result":{"exit_code":0,"duration_ms":1}}"#;
        let never_sent = closed_by(&[r#"{"jsonrpc":"2.0","id":977,"result":{}}"#]).await;
        assert!(
            never_sent.contains("an id the runner never sent (977)") && never_sent.contains("first bytes"),
            "{never_sent}"
        );
        let string_id = closed_by(&[r#"{"jsonrpc":"2.0","id":"1","result":{}}"#]).await;
        assert!(string_id.contains("never sent (\"1\")"), "{string_id}");
        let zero = closed_by(&[r#"{"jsonrpc":"2.0","id":0,"error":{"code":-32603,"message":"x"}}"#]).await;
        assert!(zero.contains("never sent (0)"), "{zero}");
        let twice = closed_by(&[ok, ok]).await;
        assert!(twice.contains("a second answer to request"), "{twice}");
        let other_step = closed_by(&[
            r#"{"jsonrpc":"2.0","method":"output","params":{"session":"s1","step":3,"stream":"stdout","data":"aGk="}}"#,
        ])
        .await;
        assert!(other_step.contains("output for step 3 of session s1 while step 0 runs"), "{other_step}");
        let unknown = closed_by(&[
            r#"{"jsonrpc":"2.0","method":"output","params":{"session":"nope","step":0,"stream":"stdout","data":"aGk="}}"#,
        ])
        .await;
        assert!(unknown.contains("output for session nope while it runs no step"), "{unknown}");
        let null_id = closed_by(&[r#"{"jsonrpc":"2.0","id":null,"result":{}}"#]).await;
        assert!(null_id.contains("never sent (null)"), "{null_id}");
        let no_kind = closed_by(&[r#"{"jsonrpc":"2.0","method":7}"#]).await;
        assert!(no_kind.contains("a method that is not a string"), "{no_kind}");
        let array = closed_by(&["[1, 2]"]).await;
        assert!(array.contains("a JSON value that is not a JSON-RPC message"), "{array}");
        let no_version = closed_by(&[r#"{"id":1,"result":{}}"#]).await;
        assert!(no_version.contains("without \"jsonrpc\": \"2.0\""), "{no_version}");
    }

    #[tokio::test]
    async fn output_after_the_answer_to_its_command_breaks_the_protocol() {
        let (connection, mut executor_side) = connected(1 << 16);
        let mut events = connection.subscribe("s1");
        connection.set_running("s1", Some(0));
        let (id, answer) = connection.send(method::COMMAND, &serde_json::json!({"session": "s1"})).await;
        // The runner has not yet taken the answer when the late output comes: the answer
        // itself ended the step.
        let lines = format!(
            "{}\n{}\n",
            format_args!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"exit_code":0,"duration_ms":1}}}}"#),
            r#"{"jsonrpc":"2.0","method":"output","params":{"session":"s1","step":0,"stream":"stdout","data":"aGk="}}"#,
        );
        executor_side.write_all(lines.as_bytes()).await.expect("write");
        connection.closed().await;
        assert!(answer.await.expect("answered").is_ok());
        assert!(events.try_recv().is_err(), "the late output reached the session");
        let Some(Closed::Garbage(detail)) = connection.cause() else {
            panic!("expected a protocol error, got {:?}", connection.cause());
        };
        assert!(detail.contains("output for session s1 while it runs no step"), "{detail}");
    }

    #[tokio::test]
    async fn a_run_that_does_not_take_its_output_slows_the_executor_and_loses_nothing() {
        let (connection, mut executor_side) = connected(4096);
        let mut events = connection.subscribe("s1");
        connection.set_running("s1", Some(0));
        let frames = SESSION_EVENTS * 8;
        let writer = tokio::spawn(async move {
            let line = r#"{"jsonrpc":"2.0","method":"output","params":{"session":"s1","step":0,"stream":"stdout","data":"aGk="}}"#;
            for _ in 0..frames {
                executor_side.write_all(format!("{line}\n").as_bytes()).await.expect("write");
            }
            executor_side
        });
        // Nobody takes the events: the executor's writes block once the channel and the pipe
        // are full, instead of the runner holding everything.
        let mut writer = writer;
        let blocked = tokio::time::timeout(std::time::Duration::from_millis(300), &mut writer).await.is_err();
        assert!(blocked, "the executor wrote everything while nobody read it");
        let mut received = 0;
        while received < frames {
            events.recv().await.expect("an event");
            received += 1;
        }
        writer.await.expect("the writer finishes once the run takes its output");
        assert_eq!(received, frames);
    }
}
