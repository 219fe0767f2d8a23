//! The executor's main loop: frames in from stdin, requests dispatched through a jsonrpsee
//! `RpcModule`, responses and notifications out through one writer task that owns stdout.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jsonrpsee::core::server::{ConnectionId, Extensions, MethodCallback, Methods, RpcModule};
use jsonrpsee::types::{ErrorCode, ErrorObjectOwned, Id, Params};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::transfer::{DownloadStream, UploadStream};
use super::{Context, Executor, Notifier};
use crate::channel;
use crate::envelope::{ErrorResponse, Message, Response, Unreadable};
use crate::error::{ErrorKind, ExecutorError, UnsupportedVersionData};
use crate::framing;
use crate::messages::*;
use crate::version::SUPPORTED_VERSIONS;

/// Serves `executor` on stdin and stdout until `shutdown` or the end of stdin.
///
/// When stdin and stdout are pipes, as when the runner starts the executor, they are read and
/// written without blocking; tokio's own `stdin()` and `stdout()` hand every read and write to a
/// blocking thread, which costs a thread wake-up per message. Anything else (a terminal, a file)
/// falls back to them.
pub async fn serve<E: Executor>(executor: E) -> anyhow::Result<()> {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let input = std::io::stdin().as_fd().try_clone_to_owned().and_then(pipe::Receiver::from_owned_fd);
    let output = std::io::stdout().as_fd().try_clone_to_owned().and_then(pipe::Sender::from_owned_fd);
    match (input, output) {
        (Ok(input), Ok(output)) => serve_io(executor, input, output).await,
        _ => serve_io(executor, tokio::io::stdin(), tokio::io::stdout()).await,
    }
}

/// Serves `executor` on any pair of streams (tests drive an executor in memory with this).
pub async fn serve_io<E, R, W>(executor: E, input: R, output: W) -> anyhow::Result<()>
where
    E: Executor,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (frames, writer) = spawn_writer(output);
    let state = Arc::new(State {
        executor,
        version: OnceLock::new(),
        in_flight: Mutex::new(HashMap::new()),
        notifier: Notifier { frames: frames.clone() },
    });
    let module: Methods = methods(state.clone())?.into();
    let mut input = FramedRead::new(input, framing::codec());
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let frame = match input.next().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(error)) => {
                let response = error_response(
                    serde_json::Value::Null,
                    ErrorCode::ParseError.code(),
                    &format!("bad frame: {error}"),
                );
                let _ = frames.send(response).await;
                continue;
            }
        };
        let message = match read_message(&frame) {
            Ok(message) => message,
            Err(response) => {
                let _ = frames.send(response).await;
                continue;
            }
        };
        let Some(method) = message.method_name().map(std::borrow::Cow::into_owned) else {
            let id = message.id.unwrap_or(serde_json::Value::Null);
            let _ =
                frames.send(error_response(id, ErrorCode::InvalidRequest.code(), "a message without a method")).await;
            continue;
        };
        let Some(id) = message.id.clone() else {
            notified(&state, &method, message.params);
            continue;
        };
        if method == method::SHUTDOWN {
            wind_down(&state, &mut tasks).await;
            let _ = frames.send(framing::encode(&Response::new(&id, &Empty {}))).await;
            drop(input);
            drop(module);
            drop(state);
            return finish(tasks, frames, writer).await;
        }
        let (request_id, params) = match checked(&message) {
            Ok(checked) => checked,
            Err(why) => {
                let text = format!("invalid request: {why}");
                let _ = frames.send(error_response(id, ErrorCode::InvalidRequest.code(), &text)).await;
                continue;
            }
        };
        let token = CancellationToken::new();
        state.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).insert(id_key(&id), token.clone());
        let module = module.clone();
        let state = state.clone();
        let frames = frames.clone();
        tasks.spawn(async move {
            let response = dispatch(&module, &state, request_id, params, &method, token).await;
            state.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&id_key(&id));
            let _ = frames.send(response).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    // The runner closed stdin: it is gone, so nothing it started may outlive it.
    wind_down(&state, &mut tasks).await;
    drop(module);
    drop(state);
    finish(tasks, frames, writer).await
}

/// Spawns the task that owns `output`: it writes every frame sent on the returned channel, in
/// order, until the last sender is dropped.
fn spawn_writer<W>(output: W) -> (mpsc::Sender<Vec<u8>>, tokio::task::JoinHandle<anyhow::Result<()>>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (frames, mut outgoing) = mpsc::channel::<Vec<u8>>(256);
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(frame) = outgoing.recv().await {
            output.write_all(&frame).await?;
            output.flush().await?;
        }
        anyhow::Ok(())
    });
    (frames, writer)
}

/// The message in `frame`, or the error response that refuses it: a frame that is not JSON,
/// or JSON that is no message.
fn read_message(frame: &[u8]) -> Result<Message<'_>, Vec<u8>> {
    Message::read(frame).map_err(|unreadable| match unreadable {
        Unreadable::NotJson(error) => {
            let text = format!("not JSON ({error}): {}", framing::first_bytes(frame));
            error_response(serde_json::Value::Null, ErrorCode::ParseError.code(), &text)
        }
        Unreadable::NotAMessage(error) => {
            let why = error.map(|error| format!(" ({error})")).unwrap_or_default();
            let text = format!("a message without a method{why}");
            error_response(serde_json::Value::Null, ErrorCode::InvalidRequest.code(), &text)
        }
    })
}

/// Takes a notification (a message without an id): a `cancel` cancels the request it names;
/// any other is ignored.
fn notified<E>(state: &State<E>, method: &str, params: Option<&serde_json::value::RawValue>) {
    if method == method::CANCEL
        && let Some(params) = params.and_then(|params| serde_json::from_str::<CancelParams>(params.get()).ok())
    {
        state.cancel(&params.id);
    }
}

/// Cancels every request in flight, gives them [`SETTLE_CANCELLED`] to end, then shuts the
/// executor down.
async fn wind_down<E: Executor>(state: &State<E>, tasks: &mut tokio::task::JoinSet<()>) {
    state.cancel_all();
    settle(tasks).await;
    state.executor.shutdown().await;
}

/// How long the requests cancelled at `shutdown` or at the end of stdin get to end (and answer)
/// before the executor stops its sessions: a step's cancellation kills its processes in the
/// session, which stopping the session under it would turn into an error.
const SETTLE_CANCELLED: Duration = Duration::from_secs(10);

async fn settle(tasks: &mut tokio::task::JoinSet<()>) {
    let _ = tokio::time::timeout(SETTLE_CANCELLED, async { while tasks.join_next().await.is_some() {} }).await;
}

async fn finish(
    mut tasks: tokio::task::JoinSet<()>,
    frames: mpsc::Sender<Vec<u8>>,
    writer: tokio::task::JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    // Requests still running were cancelled; one that ignores it must not keep the process.
    let drained = tokio::time::timeout(Duration::from_secs(30), async { while tasks.join_next().await.is_some() {} });
    if drained.await.is_err() {
        tasks.abort_all();
    }
    drop(frames);
    // The writer ends when the last notifier is dropped; a notifier kept by the executor
    // beyond shutdown must not hold the process open.
    match tokio::time::timeout(Duration::from_secs(5), writer).await {
        Ok(joined) => joined?,
        Err(_) => Ok(()),
    }
}

struct State<E> {
    executor: E,
    version: OnceLock<u32>,
    in_flight: Mutex<HashMap<String, CancellationToken>>,
    notifier: Notifier,
}

impl<E> State<E> {
    fn cancel(&self, id: &serde_json::Value) {
        if let Some(token) = self.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).get(&id_key(id)) {
            token.cancel();
        }
    }

    fn cancel_all(&self) {
        for token in self.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).values() {
            token.cancel();
        }
    }
}

fn id_key(id: &serde_json::Value) -> String {
    id.to_string()
}

fn error_response(id: serde_json::Value, code: i32, message: &str) -> Vec<u8> {
    framing::encode(&ErrorResponse::new(&id, code, message))
}

/// The request's id and parameters as jsonrpsee takes them, or why it is no JSON-RPC 2.0
/// request.
fn checked(message: &Message<'_>) -> Result<(Id<'static>, Params<'static>), String> {
    if !message.is_v2() {
        return Err("\"jsonrpc\" is not \"2.0\"".to_string());
    }
    let id = match &message.id {
        Some(serde_json::Value::Null) => Id::Null,
        Some(serde_json::Value::String(id)) => Id::Str(id.clone().into()),
        Some(serde_json::Value::Number(id)) if id.is_u64() => Id::Number(id.as_u64().unwrap_or_default()),
        _ => return Err("its id is neither a string, a whole number nor null".to_string()),
    };
    Ok((id, Params::new(message.params.map(|params| params.get())).into_owned()))
}

/// Runs one request through the module, with this request's context in its extensions.
async fn dispatch<E: Executor>(
    module: &Methods,
    state: &State<E>,
    id: Id<'static>,
    params: Params<'static>,
    method: &str,
    token: CancellationToken,
) -> Vec<u8> {
    let Some(MethodCallback::Async(callback)) = module.method(method) else {
        let id = serde_json::to_value(&id).unwrap_or(serde_json::Value::Null);
        return error_response(id, ErrorCode::MethodNotFound.code(), &format!("unknown method {method}"));
    };
    let mut extensions = Extensions::new();
    extensions.insert(Context {
        cancel: token,
        notifier: state.notifier.clone(),
        received: Instant::now(),
        left_out: Default::default(),
    });
    let response = callback(id, params, ConnectionId(0), usize::MAX, extensions).await;
    let mut line = response.into_json().get().as_bytes().to_vec();
    line.push(b'\n');
    line
}

type Reply<T> = Result<T, ErrorObjectOwned>;

/// A request's parameters as `T`; a request without any has `{}` (a `ping` needs none).
fn parse<T: DeserializeOwned>(params: &Params<'_>) -> Result<T, ExecutorError> {
    let none = Params::new(Some("{}"));
    let params = if params.as_str().is_some() { params } else { &none };
    params
        .parse::<T>()
        .map_err(|error| ExecutorError::new(ErrorKind::Protocol, format!("invalid params: {}", error.message())))
}

fn context(extensions: &Extensions) -> Context {
    extensions.get::<Context>().cloned().unwrap_or_else(|| Context {
        cancel: CancellationToken::new(),
        notifier: Notifier { frames: mpsc::channel(1).0 },
        received: Instant::now(),
        left_out: Default::default(),
    })
}

fn require_initialized<E>(state: &State<E>) -> Result<(), ExecutorError> {
    match state.version.get() {
        Some(_) => Ok(()),
        None => Err(ExecutorError::new(ErrorKind::NotInitialized, "initialize first")),
    }
}

fn to_reply<T>(result: Result<T, ExecutorError>) -> Reply<T> {
    result.map_err(|error| {
        if error.kind == ErrorKind::Protocol {
            ErrorObjectOwned::owned(ErrorCode::InvalidParams.code(), error.message, error.data)
        } else {
            error.to_error_object()
        }
    })
}

/// Races an operation against its deadline and its cancellation. A `timeout_ms` of 0 is a
/// deadline already passed: the operation is not begun.
async fn guarded<T>(
    context: &Context,
    timeout_ms: u64,
    what: &str,
    operation: impl Future<Output = Result<T, ExecutorError>>,
) -> Result<T, ExecutorError> {
    if timeout_ms == 0 {
        return Err(ExecutorError::timeout(format!("{what} was given a timeout_ms of 0: its deadline has passed")));
    }
    tokio::select! {
        result = tokio::time::timeout(Duration::from_millis(timeout_ms), operation) => {
            result.unwrap_or_else(|_| Err(ExecutorError::timeout(format!("{what} took longer than {timeout_ms} ms"))))
        }
        () = context.cancelled() => Err(ExecutorError::cancelled()),
    }
}

fn methods<E: Executor>(state: Arc<State<E>>) -> anyhow::Result<RpcModule<State<E>>> {
    let mut module = RpcModule::from_arc(state);
    module.register_async_method(rpc::Initialize::NAME, |params, state, _| async move {
        to_reply(initialize(&state, &params).await)
    })?;
    register::<rpc::Ping, E, _, _>(&mut module, |_, _, _| async { Ok(Empty {}) })?;
    register::<rpc::Start, E, _, _>(&mut module, |state, params, context| async move {
        let timeout_ms = params.timeout_ms;
        guarded(&context, timeout_ms, "start", state.executor.start(params, context.clone())).await
    })?;
    register::<rpc::Command, E, _, _>(&mut module, |state, params, context| async move {
        state.executor.command(params, context).await
    })?;
    register::<rpc::Stop, E, _, _>(&mut module, |state, params, context| async move {
        let timeout_ms = params.timeout_ms;
        guarded(&context, timeout_ms, "stop", state.executor.stop(params, context.clone())).await
    })?;
    register::<rpc::Cleanup, E, _, _>(&mut module, |state, params, context| async move {
        let timeout_ms = params.timeout_ms;
        guarded(&context, timeout_ms, "cleanup", state.executor.cleanup(params, context.clone())).await
    })?;
    register::<rpc::Upload, E, _, _>(&mut module, |state, params, context| async move {
        let work = async {
            let (upload, counter) = UploadStream::new(connect(&params).await?, params.max_bytes);
            transfer_result(state.executor.upload(&params, upload, context.clone()).await, &counter, params.max_bytes)
        };
        guarded(&context, params.timeout_ms, "upload", work).await
    })?;
    register::<rpc::Download, E, _, _>(&mut module, |state, params, context| async move {
        let work = async {
            let (download, counter) = DownloadStream::new(connect(&params).await?, params.max_bytes);
            let done = state.executor.download(&params, download, context.clone()).await;
            transfer_result(done, &counter, params.max_bytes)
                .map(|result| TransferResult { left_out: context.take_left_out(), ..result })
        };
        guarded(&context, params.timeout_ms, "download", work).await
    })?;
    Ok(module)
}

/// Registers method `M`, answered by `handler` once the executor is initialized and the
/// parameters parse as `M`'s.
fn register<M, E, F, Fut>(module: &mut RpcModule<State<E>>, handler: F) -> anyhow::Result<()>
where
    M: Method,
    E: Executor,
    F: Fn(Arc<State<E>>, M::Params, Context) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<M::Result, ExecutorError>> + Send,
{
    module.register_async_method(M::NAME, move |params, state, extensions| {
        let handler = handler.clone();
        async move {
            let answer = async {
                require_initialized(&state)?;
                let params: M::Params = parse(&params)?;
                handler(state, params, context(&extensions)).await
            };
            to_reply(answer.await)
        }
    })?;
    Ok(())
}

/// The `data` of a version refusal: both sides' versions.
fn unsupported_version_data(offered: &[u32]) -> serde_json::Value {
    let data = UnsupportedVersionData { offered: offered.to_vec(), supported: SUPPORTED_VERSIONS.to_vec() };
    serde_json::to_value(data).unwrap_or(serde_json::Value::Null)
}

async fn initialize<E: Executor>(state: &State<E>, params: &Params<'_>) -> Result<InitializeResult, ExecutorError> {
    let params: InitializeParams = parse(params)?;
    let Some(version) = crate::version::negotiate(&params.protocol_versions, SUPPORTED_VERSIONS) else {
        let info = state.executor.info();
        return Err(ExecutorError::new(
            ErrorKind::UnsupportedVersion,
            format!(
                "the runner offers protocol versions {:?}; executor {} {} speaks {:?}",
                params.protocol_versions, info.name, info.version, SUPPORTED_VERSIONS
            ),
        )
        .with_data(unsupported_version_data(&params.protocol_versions)));
    };
    if state.version.get().is_some() {
        return Err(ExecutorError::new(ErrorKind::Protocol, "initialize was already answered"));
    }
    let capabilities = state.executor.initialize(&params).await?;
    let _ = state.version.set(version);
    Ok(InitializeResult { protocol_version: version, executor: state.executor.info(), capabilities })
}

async fn connect(params: &TransferParams) -> Result<interprocess::local_socket::tokio::Stream, ExecutorError> {
    channel::connect(&params.channel).await.map_err(|error| {
        ExecutorError::infrastructure(format!("cannot connect to the side channel {}: {error}", params.channel))
    })
}

fn transfer_result(
    result: Result<(), ExecutorError>,
    counter: &super::transfer::Counter,
    max_bytes: u64,
) -> Result<TransferResult, ExecutorError> {
    if counter.over() {
        return Err(ExecutorError::new(
            ErrorKind::TooLarge,
            format!("the tar stream is over its bound of {max_bytes} bytes"),
        ));
    }
    result.map(|()| TransferResult { bytes: counter.bytes(), left_out: Vec::new() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;
    use tokio::io::{AsyncBufReadExt, BufReader};

    /// An executor that is never initialized: every method but `initialize` is refused
    /// before it is reached.
    struct Never;

    impl Executor for Never {
        fn info(&self) -> ExecutorInfo {
            ExecutorInfo { name: "never".into(), version: "0".into() }
        }
        async fn initialize(&self, _: &InitializeParams) -> Result<Capabilities, ExecutorError> {
            Err(ExecutorError::configuration("not here"))
        }
        async fn start(&self, _: StartParams, _: Context) -> Result<StartResult, ExecutorError> {
            unreachable!("never initialized")
        }
        async fn command(&self, _: CommandParams, _: Context) -> Result<CommandResult, ExecutorError> {
            unreachable!("never initialized")
        }
        async fn stop(&self, _: StopParams, _: Context) -> Result<StopResult, ExecutorError> {
            unreachable!("never initialized")
        }
        async fn cleanup(&self, _: CleanupParams, _: Context) -> Result<CleanupResult, ExecutorError> {
            unreachable!("never initialized")
        }
        async fn upload(&self, _: &TransferParams, _: UploadStream, _: Context) -> Result<(), ExecutorError> {
            unreachable!("never initialized")
        }
        async fn download(&self, _: &TransferParams, _: DownloadStream, _: Context) -> Result<(), ExecutorError> {
            unreachable!("never initialized")
        }
    }

    #[tokio::test]
    async fn each_message_is_routed_by_its_id_method_and_version_as_json_rpc_says() {
        let (mut runner, input) = tokio::io::duplex(1 << 16);
        let (output, answers) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve_io(Never, input, output));
        let mut answers = BufReader::new(answers).lines();
        let mut exchange = async |line: &str| {
            runner.write_all(format!("{line}\n").as_bytes()).await.expect("write");
            let answer = answers.next_line().await.expect("read").expect("an answer");
            serde_json::from_str::<serde_json::Value>(&answer).expect("JSON")
        };
        let answered = |answer: &serde_json::Value, id: serde_json::Value, code: i32| {
            assert_eq!(answer["id"], id, "{answer}");
            assert_eq!(answer["error"]["code"], code, "{answer}");
        };
        // A null id is a request's, answered; here refused before `initialize`.
        let answer = exchange(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#).await;
        answered(&answer, serde_json::Value::Null, code::NOT_INITIALIZED);
        let answer = exchange(r#"{"jsonrpc":"1.0","id":1,"method":"ping","params":{}}"#).await;
        answered(&answer, 1.into(), ErrorCode::InvalidRequest.code());
        let answer = exchange(r#"{"id":2,"method":"ping"}"#).await;
        answered(&answer, 2.into(), ErrorCode::InvalidRequest.code());
        let answer = exchange(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#).await;
        answered(&answer, serde_json::json!({"a": 1}), ErrorCode::InvalidRequest.code());
        let answer = exchange(r#"{"jsonrpc":"2.0","id":-3,"method":"ping"}"#).await;
        answered(&answer, (-3).into(), ErrorCode::InvalidRequest.code());
        let answer = exchange(r#"{"jsonrpc":"2.0","id":4,"method":7}"#).await;
        answered(&answer, 4.into(), ErrorCode::InvalidRequest.code());
        assert_eq!(answer["error"]["message"], "a message without a method");
        let answer = exchange("hello from a careless print").await;
        answered(&answer, serde_json::Value::Null, ErrorCode::ParseError.code());
        // JSON that is no object is no message: a batch, even one whose items would fill the
        // fields in order, a number.
        for line in [r#"[{"jsonrpc":"2.0","id":7,"method":"ping"}]"#, r#"["2.0","ping",8]"#, "9"] {
            let answer = exchange(line).await;
            answered(&answer, serde_json::Value::Null, ErrorCode::InvalidRequest.code());
            assert!(
                answer["error"]["message"].as_str().is_some_and(|text| text.starts_with("a message without a method"))
            );
        }
        // Notifications get no answer, a cancel of nothing included: the next answer is the
        // next request's.
        let answer = exchange(concat!(
            r#"{"jsonrpc":"2.0","method":"ping"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"cancel","params":{"id":9}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":"five","method":"nope","params":[1]}"#
        ))
        .await;
        answered(&answer, "five".into(), ErrorCode::MethodNotFound.code());
        let answer = exchange(r#"{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocol_versions":[1],"runner":{"name":"r","version":"0","id":"r"},"config":{}}}"#).await;
        answered(&answer, 6.into(), code::CONFIGURATION);
        drop(runner);
        served.await.expect("joined").expect("served to the end of its input");
    }
}
