//! `pods/exec` over a websocket, as the API server's stream translator and the kubelet's
//! streaming server answer it (staging/src/k8s.io/apiserver/pkg/util/wsstream/conn.go,
//! pkg/kubelet/cri/streaming/remotecommand/websocket.go and httpstream.go): subprotocol
//! `v5.channel.k8s.io` (with the CLOSE channel 255) or `v4.channel.k8s.io`, the first of the
//! client's that the modelled version speaks (`version.rs`: only v4 before 1.30); binary
//! frames whose first byte is the channel (0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize);
//! an empty frame on the lowest writable channel once connected; the `metav1.Status` on
//! channel 3 at the end (`NonZeroExitCode` with the `ExitCode` cause). The errors before the
//! upgrade are the registry's (pkg/registry/core/pod/strategy.go `ExecLocation`: container
//! not valid, completed pod) and the kubelet's (`container not found`).
//!
//! The command runs in the namespaces of the container the `container` parameter names (the
//! only one, if the pod has one; `nsenter --target <its PID 1> --pid --mount --root --wd`) with
//! a clean environment. Output is read only as fast as the socket takes it: one
//! 32 KiB read at a time through a queue of 8 frames. Mid-step faults fire at the first stdout
//! byte of a `sh -s` exec, once each.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::api::RequestInfo;
use crate::app::Shared;
use crate::controllers::nodes;
use crate::registry::{self, DeleteOptions, Propagation};
use crate::resources;
use crate::sandbox::POD_PATH;
use crate::status::ApiError;
use crate::util::text;

const CHUNK: usize = 32 * 1024;
const MID_STEP_FAULTS: [&str; 3] = ["drop-exec-stream", "job-deleted-mid-step", "node-lost-mid-step"];

/// The fault that loses the next exec's Status: its output comes whole, then the connection
/// breaks.
const DROP_STATUS: &str = "drop-exec-status";

struct Session {
    namespace: String,
    pod: String,
    node: String,
    init: i32,
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    v5: bool,
    fault: Option<String>,
    /// The node's kubelet does not answer: the dial's error, sent once the dial times out.
    unreachable: Option<String>,
}

fn flag(query: &[(String, String)], key: &str) -> bool {
    query.iter().any(|(k, v)| k == key && (v == "true" || v == "1"))
}

pub async fn handle(app: Shared, info: RequestInfo, mut parts: Parts, query: Vec<(String, String)>) -> Response {
    match prepare(&app, &info, &query) {
        Err(error) => error.into_response(),
        Ok(mut session) => {
            // In the order the client wrote them (the extractor keeps them sorted).
            let requested: Vec<String> = parts
                .headers
                .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
                .iter()
                .filter_map(|protocols| protocols.to_str().ok())
                .flat_map(|protocols| protocols.split(',').map(str::to_string).collect::<Vec<_>>())
                .collect();
            let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
                Ok(upgrade) => upgrade,
                Err(_) => return ApiError::bad_request("Upgrade request required").into_response(),
            };
            // The first of the client's protocols the server speaks, as of its version.
            let version = app.config.kubernetes_version;
            let Some(protocol) = version.negotiate(requested.iter().map(String::as_str)) else {
                return ApiError::bad_request(format!(
                    "websocket: no supported subprotocol ({})",
                    version.exec_protocols().join(", ")
                ))
                .into_response();
            };
            let upgrade = upgrade.protocols([protocol]);
            session.v5 = protocol == crate::version::V5;
            if let Some(error) = session.unreachable.take() {
                let timeout = app.config.exec_dial_timeout;
                return upgrade.on_upgrade(move |socket| unreachable(socket, error, timeout)).into_response();
            }
            {
                // A connection that breaks between the command's end and its Status, for any
                // command: what a client sees when it loses the Status.
                let mut state = app.lock();
                if state.rt.faults.contains(DROP_STATUS) && !state.rt.fired.contains(DROP_STATUS) {
                    state.rt.fired.insert(DROP_STATUS.to_string());
                    session.fault = Some(DROP_STATUS.to_string());
                }
            }
            if session.command == ["sh", "-s"] && session.fault.is_none() {
                let mut state = app.lock();
                let fault =
                    MID_STEP_FAULTS.iter().find(|f| state.rt.faults.contains(**f) && !state.rt.fired.contains(**f));
                if let Some(fault) = fault {
                    let fault = fault.to_string();
                    state.rt.fired.insert(fault.clone());
                    session.fault = Some(fault);
                }
            }
            upgrade.on_upgrade(move |socket| run(app, socket, session)).into_response()
        }
    }
}

fn prepare(app: &Shared, info: &RequestInfo, query: &[(String, String)]) -> Result<Session, ApiError> {
    let command: Vec<String> = query.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
    let state = app.lock();
    let pod = state
        .store
        .get("pods", &info.namespace, &info.name)
        .cloned()
        .ok_or_else(|| ApiError::not_found("pods", "", &info.name))?;
    let requested = query.iter().find(|(k, _)| k == "container").map(|(_, v)| v.as_str());
    let container = crate::api::container_of(&pod, &info.name, requested)?;
    let phase = text(&pod, "/status/phase");
    if phase == "Succeeded" || phase == "Failed" {
        return Err(ApiError::bad_request(format!(
            "cannot exec into a container in a completed pod; current phase is {phase}"
        )));
    }
    if command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least one command for the container"));
    }
    let node = text(&pod, "/spec/nodeName").to_string();
    if state.rt.nodes.get(&node).is_some_and(|n| n.lost_at.is_some()) {
        let address = state
            .store
            .get("nodes", "", &node)
            .and_then(|n| n.pointer("/status/addresses").and_then(Value::as_array).cloned())
            .and_then(|a| a.iter().find(|a| text(a, "/type") == "InternalIP").map(|a| text(a, "/address").to_string()))
            .unwrap_or_default();
        return Ok(Session {
            namespace: info.namespace.clone(),
            pod: info.name.clone(),
            node,
            init: 0,
            command,
            stdin: flag(query, "stdin"),
            stdout: flag(query, "stdout"),
            stderr: flag(query, "stderr"),
            v5: true,
            fault: None,
            unreachable: Some(format!("error dialing backend: dial tcp {address}:10250: i/o timeout")),
        });
    }
    // The kubelet finds the container among those running (pkg/kubelet/kubelet.go
    // `findContainer`): one not started yet, or ended, is not found.
    let init = state
        .rt
        .pods
        .get(&(info.namespace.clone(), info.name.clone()))
        .filter(|p| p.uid == text(&pod, "/metadata/uid"))
        .and_then(|p| p.init_pids.get(&container).copied())
        .ok_or_else(|| ApiError::bad_request(format!("container not found (\"{container}\")")))?;
    Ok(Session {
        namespace: info.namespace.clone(),
        pod: info.name.clone(),
        node,
        init,
        command,
        stdin: flag(query, "stdin"),
        stdout: flag(query, "stdout"),
        stderr: flag(query, "stderr"),
        v5: true,
        fault: None,
        unreachable: None,
    })
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::Binary(Bytes::from(bytes))
}

fn fire(app: &Shared, session: &Session, fault: &str) {
    let mut state = app.lock();
    match fault {
        "job-deleted-mid-step" => {
            let job = state.store.get("pods", &session.namespace, &session.pod).and_then(|p| {
                p.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .and_then(|r| r.iter().find(|r| text(r, "/kind") == "Job"))
                    .map(|r| text(r, "/name").to_string())
            });
            if let (Some(job), Some(jobs)) = (job, resources::by_key("jobs")) {
                let _ = registry::delete(
                    &mut state,
                    jobs,
                    &session.namespace,
                    &job,
                    DeleteOptions { grace: None, propagation: Some(Propagation::Background) },
                );
            }
        }
        "node-lost-mid-step" => {
            nodes::set_lost(&mut state, &session.node, true);
        }
        _ => {}
    }
}

/// An exec to a pod whose node does not answer: the API server has upgraded the client's
/// connection before it dials the kubelet (the websocket-to-SPDY translator,
/// staging/src/k8s.io/apiserver/pkg/util/proxy/streamtranslator.go), so the client sees the
/// upgrade, then silence until the kubelet client's dial times out (30 s, the `net.Dialer` of
/// pkg/kubelet/client/kubelet_client.go; `--exec-dial-timeout`), then the error as a Status on
/// the error channel, and the close.
async fn unreachable(socket: WebSocket, error: String, timeout: Duration) {
    let (mut sink, mut stream) = socket.split();
    let read = async { while let Some(Ok(_)) = stream.next().await {} };
    tokio::select! {
        _ = tokio::time::sleep(timeout) => {}
        // The client gave up first: nothing to answer.
        _ = read => return,
    }
    let status = json!({"metadata": {}, "status": "Failure", "message": error, "reason": "InternalError", "code": 500});
    let _ = sink.send(frame(3, status.to_string().as_bytes())).await;
    let _ = sink.send(Message::Close(None)).await;
}

async fn run(app: Shared, socket: WebSocket, session: Session) {
    let (mut sink, mut stream) = socket.split();
    let spawned = Command::new("nsenter")
        .args(["--target", &session.init.to_string(), "--pid", "--mount", "--root", "--wd", "--"])
        .args(["/bin/env", "-i", &format!("PATH={POD_PATH}"), "HOME=/root", &format!("HOSTNAME={}", session.pod)])
        .args(&session.command)
        .env_clear()
        .stdin(if session.stdin { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(false)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            let status = json!({"metadata": {}, "status": "Failure", "message": format!("failed to exec in container: {error}"), "reason": "InternalError"});
            let _ = sink.send(frame(3, status.to_string().as_bytes())).await;
            let _ = sink.send(Message::Close(None)).await;
            return;
        }
    };
    let first = if session.stdout {
        1
    } else if session.stderr {
        2
    } else {
        3
    };
    if sink.send(frame(first, &[])).await.is_err() {
        return;
    }
    let (tx, mut rx) = mpsc::channel::<Message>(8);
    let writer = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            if sink.send(message).await.is_err() {
                return None;
            }
        }
        Some(sink)
    });
    let mut child_stdin = child.stdin.take();
    let v5 = session.v5;
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = stream.next().await {
            match message {
                Message::Binary(data) if data.first() == Some(&0) => {
                    if let Some(pipe) = child_stdin.as_mut()
                        && pipe.write_all(&data[1..]).await.is_err()
                    {
                        child_stdin = None;
                    }
                }
                Message::Binary(data) if v5 && data.as_ref() == [255, 0] => child_stdin = None,
                Message::Close(_) => break,
                _ => {}
            }
        }
        drop(child_stdin);
    });
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let errors_tx = tx.clone();
    let forward_stderr = session.stderr;
    let errors = tokio::spawn(async move {
        let mut buffer = vec![0u8; CHUNK];
        while let Some(pipe) = stderr.as_mut() {
            match pipe.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) if forward_stderr => {
                    if errors_tx.send(frame(2, &buffer[..n])).await.is_err() {
                        break;
                    }
                }
                Ok(_) => {}
            }
        }
    });
    let mut fault = session.fault.clone();
    let mut buffer = vec![0u8; CHUNK];
    let mut dropped = false;
    let mut unreachable = false;
    while let Some(pipe) = stdout.as_mut() {
        let n = match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if session.stdout && tx.send(frame(1, &buffer[..n])).await.is_err() {
            break;
        }
        if let Some(name) = fault.take_if(|name| name != DROP_STATUS) {
            if name == "drop-exec-stream" {
                // Let the byte out, then lose the connection without a status.
                tokio::time::sleep(Duration::from_millis(50)).await;
                dropped = true;
                break;
            }
            fire(&app, &session, &name);
            if name == "node-lost-mid-step" {
                // The API server proxies an exec to the node's kubelet; with the node gone the
                // stream hangs, open and silent, whatever becomes of the processes.
                unreachable = true;
                break;
            }
        }
    }
    if unreachable || dropped {
        if unreachable {
            // Open until the client closes it; nothing more is sent.
            let _ = reader.await;
        } else {
            reader.abort();
        }
        drop(tx);
        writer.abort();
        errors.abort();
        // The process goes on in the pod; keep its pipes drained.
        tokio::spawn(async move {
            if let Some(mut pipe) = stdout {
                let _ = tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await;
            }
            let _ = child.wait().await;
        });
        return;
    }
    let _ = errors.await;
    if fault.as_deref() == Some(DROP_STATUS) {
        let _ = child.wait().await;
        // Every output frame goes out, then the connection breaks: no Status, no close.
        drop(tx);
        let sink = writer.await;
        reader.abort();
        let _ = reader.await;
        drop(sink);
        return;
    }
    let code = match child.wait().await {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
        }
        Err(_) => 137,
    };
    let status = if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({"metadata": {}, "status": "Failure",
               "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", session.command.join(" ")),
               "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
    };
    let _ = tx.send(frame(3, status.to_string().as_bytes())).await;
    drop(tx);
    reader.abort();
    if let Ok(Some(mut sink)) = writer.await {
        let _ = sink.send(Message::Close(None)).await;
    }
}
