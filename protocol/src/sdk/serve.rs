//! The executor's main loop: frames in from stdin, requests dispatched through a jsonrpsee
//! `RpcModule`, responses and notifications out through one writer task that owns stdout.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jsonrpsee::core::server::{ConnectionId, Extensions, MethodCallback, Methods, RpcModule};
use jsonrpsee::types::{ErrorCode, ErrorObjectOwned, Params};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::transfer::{DownloadStream, UploadStream};
use super::{Context, Executor, Notifier};
use crate::channel;
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
    let (frames, mut outgoing) = mpsc::channel::<Vec<u8>>(256);
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(frame) = outgoing.recv().await {
            output.write_all(&frame).await?;
            output.flush().await?;
        }
        anyhow::Ok(())
    });
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
        let message: serde_json::Value = match serde_json::from_slice(&frame) {
            Ok(message) => message,
            Err(error) => {
                let text = format!("not JSON ({error}): {}", framing::first_bytes(&frame));
                let _ = frames.send(error_response(serde_json::Value::Null, ErrorCode::ParseError.code(), &text)).await;
                continue;
            }
        };
        let Some(method) = message.get("method").and_then(|method| method.as_str()).map(str::to_string) else {
            let id = message.get("id").cloned().unwrap_or(serde_json::Value::Null);
            let _ =
                frames.send(error_response(id, ErrorCode::InvalidRequest.code(), "a message without a method")).await;
            continue;
        };
        let Some(id) = message.get("id").cloned() else {
            if method == method::CANCEL
                && let Some(params) =
                    message.get("params").and_then(|params| serde_json::from_value::<CancelParams>(params.clone()).ok())
            {
                state.cancel(&params.id);
            }
            continue;
        };
        if method == method::SHUTDOWN {
            state.cancel_all();
            state.executor.shutdown().await;
            let _ = frames.send(framing::encode(&serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}}))).await;
            drop(input);
            drop(module);
            drop(state);
            return finish(tasks, frames, writer).await;
        }
        let token = CancellationToken::new();
        state.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).insert(id_key(&id), token.clone());
        let module = module.clone();
        let state = state.clone();
        let frames = frames.clone();
        tasks.spawn(async move {
            let response = dispatch(&module, &state, &frame, &id, &method, token).await;
            state.in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&id_key(&id));
            let _ = frames.send(response).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    // The runner closed stdin: it is gone, so nothing it started may outlive it.
    state.cancel_all();
    state.executor.shutdown().await;
    drop(module);
    drop(state);
    finish(tasks, frames, writer).await
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
    framing::encode(&serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
}

/// Runs one request through the module, with this request's context in its extensions.
async fn dispatch<E: Executor>(
    module: &Methods,
    state: &State<E>,
    frame: &[u8],
    id: &serde_json::Value,
    method: &str,
    token: CancellationToken,
) -> Vec<u8> {
    let request: jsonrpsee::types::Request<'_> = match serde_json::from_slice(frame) {
        Ok(request) => request,
        Err(error) => {
            return error_response(id.clone(), ErrorCode::InvalidRequest.code(), &format!("invalid request: {error}"));
        }
    };
    let Some(MethodCallback::Async(callback)) = module.method(method) else {
        return error_response(id.clone(), ErrorCode::MethodNotFound.code(), &format!("unknown method {method}"));
    };
    let mut extensions = Extensions::new();
    extensions.insert(Context { cancel: token, notifier: state.notifier.clone(), received: Instant::now() });
    let params = Params::new(request.params.as_ref().map(|raw| raw.get())).into_owned();
    let response = callback(request.id.into_owned(), params, ConnectionId(0), usize::MAX, extensions).await;
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

/// Races an operation against its deadline and its cancellation.
async fn guarded<T>(
    context: &Context,
    timeout_ms: u64,
    what: &str,
    operation: impl Future<Output = Result<T, ExecutorError>>,
) -> Result<T, ExecutorError> {
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
            transfer_result(
                state.executor.download(&params, download, context.clone()).await,
                &counter,
                params.max_bytes,
            )
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
    result.map(|()| TransferResult { bytes: counter.bytes() })
}
