//! Watches, not polling: a session's pod by its labels for the session's whole life (its
//! start, each step, its stop), and the events about one object while its pod starts. Each
//! is a `kube::runtime::watcher`: it resumes a watch the server ended from the last
//! resourceVersion, and after a 410 Gone (a watch gap) lists again and replaces its view of
//! the objects, so a pod deleted while the watch was away is seen gone. The initial list is a
//! streaming list (one watch request) where the server offers it, and a list then a watch
//! where it refuses one.
//!
//! Both are bounded: the pod watch keeps only the latest pod, the event watch hands events
//! on through a small channel and drops what a slow reader has no room for (events are
//! advice; the pod's own status is what decides).

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event as Watched};
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use crate::api::Client;

/// How long the server keeps one watch open before the client resumes it.
const WATCH_SECONDS: u32 = 290;

/// How many events wait for their reader at most.
const EVENTS: usize = 64;

/// How many failures in a row before the pod watch says it cannot be made.
const FAILURES: u32 = 3;

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
        let config = watcher::Config::default().labels(selector).timeout(WATCH_SECONDS);
        let client = client.clone();
        let task = tokio::spawn(async move {
            // The pod of a list in progress: the view is replaced when the list is whole.
            let mut listed: Option<Pod> = None;
            let mut failures = 0u32;
            let events = watched(api, config);
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(error) => {
                        failures += 1;
                        if failures >= FAILURES {
                            let message = match kube_error(&error) {
                                Some(error) => client.error("watch the run's pod", error).message,
                                None => format!("watch the run's pod: {error}"),
                            };
                            sender.send_modify(|seen| seen.error = Some(message));
                        }
                        continue;
                    }
                };
                failures = 0;
                match event {
                    Watched::Init => listed = None,
                    Watched::InitApply(pod) => listed = Some(pod),
                    Watched::InitDone => {
                        let pod = listed.take();
                        sender.send_modify(|seen| {
                            seen.error = None;
                            seen.deleted = pod.is_none() && (seen.deleted || seen.pod.is_some());
                            seen.pod = pod;
                        });
                    }
                    Watched::Apply(pod) => sender.send_modify(|seen| {
                        seen.error = None;
                        seen.pod = Some(pod);
                        seen.deleted = false;
                    }),
                    Watched::Delete(_) => sender.send_modify(|seen| {
                        seen.error = None;
                        seen.pod = None;
                        seen.deleted = true;
                    }),
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
        let config = watcher::Config::default().fields(&fields).timeout(WATCH_SECONDS);
        let task = tokio::spawn(async move {
            let watched = watched(api, config);
            futures::pin_mut!(watched);
            while let Some(event) = watched.next().await {
                if let Ok(Watched::Apply(event) | Watched::InitApply(event)) = event {
                    // A full channel drops the event: its reader is behind.
                    let _ = sender.try_send(event);
                }
                if sender.is_closed() {
                    return;
                }
            }
        });
        EventWatch { events, _task: AbortOnDropHandle::new(task) }
    }
}

/// The watcher of `config`'s objects, with the default back-off between failed attempts: a
/// streaming list first, and a list then a watch from the first refusal of one on (a server
/// without the WatchList feature refuses `sendInitialEvents` as invalid).
fn watched<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = watcher::Result<Watched<K>>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let streaming = watcher::watcher(api.clone(), config.clone().streaming_lists()).default_backoff();
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen_refusal = refused.clone();
    let first = streaming
        .map(move |event| {
            if let Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))) = &event
                && matches!(status.code, 400 | 422)
            {
                seen_refusal.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            event
        })
        .take_while(move |_| std::future::ready(!refused.load(std::sync::atomic::Ordering::SeqCst)));
    first.chain(futures::stream::once(async move { watcher::watcher(api, config).default_backoff() }).flatten())
}

/// The client's error inside a watcher's, if it holds one.
fn kube_error(error: &watcher::Error) -> Option<&kube::Error> {
    match error {
        watcher::Error::InitialListFailed(error)
        | watcher::Error::WatchStartFailed(error)
        | watcher::Error::WatchFailed(error) => Some(error),
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => None,
    }
}
