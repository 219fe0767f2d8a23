//! Watches, not polling: a session's pod by its labels for the session's whole life (its
//! start, each step, its stop), and the events about one object while its pod starts. Each
//! is one watch request, resumed from the last resourceVersion when the server ends it
//! (`timeoutSeconds`), and started anew from the current state after a 410 Gone.
//!
//! Both are bounded: the pod watch keeps only the latest pod, the event watch hands events
//! on through a small channel and drops what a slow reader has no room for (events are
//! advice; the pod's own status is what decides).

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, WatchEvent, WatchParams};
use kube::core::Status;
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use crate::api::Client;

/// How long the server keeps one watch open before the client resumes it.
const WATCH_SECONDS: u32 = 290;

/// How many events wait for their reader at most.
const EVENTS: usize = 64;

/// What the pod watch saw last.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The run's pod, as last seen.
    pub pod: Option<Pod>,
    /// The pod was deleted (its object is gone).
    pub deleted: bool,
    /// The watch cannot be made (a refused credential, a lost server): why.
    pub error: Option<String>,
}

/// The watch of a session's pod.
pub struct PodWatch {
    /// The latest of what the watch saw.
    pub seen: watch::Receiver<Seen>,
    _task: AbortOnDropHandle<()>,
}

impl PodWatch {
    /// Watches the pods of `selector` in `namespace`.
    pub fn start(client: &Client, namespace: &str, selector: &str) -> PodWatch {
        let (sender, seen) = watch::channel(Seen::default());
        let api: Api<Pod> = client.api(namespace);
        let selector = selector.to_string();
        let client = client.clone();
        let task = tokio::spawn(async move {
            let mut version = "0".to_string();
            let mut failures = 0u32;
            loop {
                let params = WatchParams::default().labels(&selector).timeout(WATCH_SECONDS);
                let stream = match api.watch(&params, &version).await {
                    Ok(stream) => stream,
                    Err(error) => {
                        if gone(&error) {
                            version = "0".into();
                            continue;
                        }
                        failures += 1;
                        if failures >= 3 {
                            let error = client.error("watch the run's pod", &error);
                            sender.send_modify(|seen| seen.error = Some(error.message));
                        }
                        tokio::time::sleep(Duration::from_millis(500 * u64::from(failures.min(10)))).await;
                        continue;
                    }
                };
                failures = 0;
                sender.send_modify(|seen| seen.error = None);
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => {
                            version = pod.metadata.resource_version.clone().unwrap_or(version);
                            sender.send_modify(|seen| {
                                seen.pod = Some(pod);
                                seen.deleted = false;
                            });
                        }
                        Ok(WatchEvent::Deleted(pod)) => {
                            version = pod.metadata.resource_version.clone().unwrap_or(version);
                            sender.send_modify(|seen| {
                                seen.pod = None;
                                seen.deleted = true;
                            });
                        }
                        Ok(WatchEvent::Bookmark(bookmark)) => version = bookmark.metadata.resource_version,
                        Ok(WatchEvent::Error(status)) => {
                            if expired(&status) {
                                version = "0".into();
                            }
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
        });
        PodWatch { seen, _task: AbortOnDropHandle::new(task) }
    }
}

/// The watch of the events about one object.
pub struct EventWatch {
    /// The events, as they come.
    pub events: mpsc::Receiver<Event>,
    _task: AbortOnDropHandle<()>,
}

impl EventWatch {
    /// Watches the events whose `involvedObject.name` is `name` in `namespace`.
    pub fn start(client: &Client, namespace: &str, name: &str) -> EventWatch {
        let (sender, events) = mpsc::channel(EVENTS);
        let api: Api<Event> = client.api(namespace);
        let fields = format!("involvedObject.name={name}");
        let task = tokio::spawn(async move {
            let mut version = "0".to_string();
            loop {
                let params = WatchParams::default().fields(&fields).timeout(WATCH_SECONDS);
                let stream = match api.watch(&params, &version).await {
                    Ok(stream) => stream,
                    Err(error) => {
                        if gone(&error) {
                            version = "0".into();
                        } else {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        continue;
                    }
                };
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(WatchEvent::Added(event) | WatchEvent::Modified(event)) => {
                            version = event.metadata.resource_version.clone().unwrap_or(version);
                            // A full channel drops the event: its reader is behind.
                            let _ = sender.try_send(event);
                        }
                        Ok(WatchEvent::Deleted(_)) => {}
                        Ok(WatchEvent::Bookmark(bookmark)) => version = bookmark.metadata.resource_version,
                        Ok(WatchEvent::Error(status)) => {
                            if expired(&status) {
                                version = "0".into();
                            }
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if sender.is_closed() {
                    return;
                }
            }
        });
        EventWatch { events, _task: AbortOnDropHandle::new(task) }
    }
}

/// Whether a watch request was refused for an expired resourceVersion.
fn gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if expired(status))
}

fn expired(status: &Status) -> bool {
    status.code == 410 || status.reason == "Expired" || status.reason == "Gone"
}
