//! The daemon's metrics, served at `/metrics` (on the status page, and on its own `--metrics`
//! listener) in the Prometheus text exposition format, version 0.0.4: runs ended by status and
//! trust, their durations, the runs in flight and waiting, the duration of each round of
//! fetches, executor restarts, what cleanup sweeps removed and failed to, and the pulls in the
//! merge queues by state.
//!
//! One [`Metrics`], shared in an `Arc`, holds the only registry; the daemon tells it what
//! happens through its methods, and the page encodes it on each scrape. No value names a
//! repository, a workflow, a branch or a path: labels take only the few fixed values listed
//! with each metric.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::checks::CheckRecord;
use crate::host::ExecutorHost;
use crate::queue::{EntryState, QueueState, QueueStore};
use crate::state::InFlightStatus;

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The upper bounds of the run duration's buckets, in seconds.
pub const RUN_BUCKETS: [f64; 10] = [1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

/// The upper bounds of the poll round duration's buckets, in seconds.
pub const POLL_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// The states of a pull still in a merge queue, as its record names them, and as the
/// `knotless_queue_pulls` gauge labels them.
const QUEUE_STATES: [(EntryState, &str); 3] =
    [(EntryState::Waiting, "waiting"), (EntryState::Ready, "ready"), (EntryState::InBatch, "in-batch")];

/// Labels of a few fixed values each.
type Labels<const N: usize> = [(&'static str, &'static str); N];

/// The daemon's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    runs: Family<Labels<2>, Counter>,
    run_duration: Histogram,
    running: Gauge,
    queued: Gauge,
    poll_duration: Histogram,
    queue_pulls: Family<Labels<1>, Gauge>,
    /// The live pulls of each merge queue (by repository key and branch), in the order of
    /// [`QUEUE_STATES`]: the gauge is their sum.
    queues: Mutex<BTreeMap<(String, String), [i64; 3]>>,
    /// What is read on each scrape: the executor host's counts, and the daemon's own sweeps.
    scraped: std::sync::Arc<Scraped>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let runs = Family::<Labels<2>, Counter>::default();
        registry.register(
            "knotless_runs",
            "Runs that ended, by status (success, failure, error, cancelled, skipped) and workflow_trust \
             (trusted: a push or manual run; untrusted: a pull)",
            runs.clone(),
        );
        let run_duration = Histogram::new(RUN_BUCKETS);
        registry.register(
            "knotless_run_duration_seconds",
            "How long each run that started took, from its start to its end",
            run_duration.clone(),
        );
        let running = Gauge::default();
        registry.register("knotless_runs_in_flight", "Runs running now", running.clone());
        let queued = Gauge::default();
        registry.register(
            "knotless_runs_queued",
            "Runs queued, waiting for a slot or for the runs they need",
            queued.clone(),
        );
        let poll_duration = Histogram::new(POLL_BUCKETS);
        registry.register(
            "knotless_poll_duration_seconds",
            "How long each round over every watched repository took: the fetches and the runs queued",
            poll_duration.clone(),
        );
        let queue_pulls = Family::<Labels<1>, Gauge>::default();
        registry.register(
            "knotless_queue_pulls",
            "Pulls in the merge queues this runner lands, by state (waiting: for pre-flights; ready: they \
             passed; in-batch: in the batch being checked)",
            queue_pulls.clone(),
        );
        for (_, state) in QUEUE_STATES {
            queue_pulls.get_or_create(&[("state", state)]).set(0);
        }
        let scraped = std::sync::Arc::new(Scraped::default());
        registry.register_collector(Box::new(std::sync::Arc::clone(&scraped)));
        Metrics {
            registry,
            runs,
            run_duration,
            running,
            queued,
            poll_duration,
            queue_pulls,
            queues: Mutex::default(),
            scraped,
        }
    }

    /// The metrics in the text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Counts the executor host's restarts and sweeps (read from it on each scrape).
    pub fn watch_host(&self, host: &std::sync::Arc<ExecutorHost>) {
        *lock(&self.scraped.host) = Some(std::sync::Arc::downgrade(host));
    }

    /// A check became final: counted by status and trust, and its duration observed when it
    /// ran.
    pub fn run_ended(&self, check: &CheckRecord) {
        let trust = if check.trusted { "trusted" } else { "untrusted" };
        self.runs.get_or_create(&[("status", check.status.as_str()), ("workflow_trust", trust)]).inc();
        if let Some(took) = check.duration_ms {
            self.run_duration.observe(took as f64 / 1000.0);
        }
    }

    /// The runs in flight now, each queued or running.
    pub fn in_flight(&self, runs: impl IntoIterator<Item = InFlightStatus>) {
        let (mut running, mut queued) = (0, 0);
        for status in runs {
            match status {
                InFlightStatus::Running => running += 1,
                InFlightStatus::Queued => queued += 1,
            }
        }
        self.running.set(running);
        self.queued.set(queued);
    }

    /// A round over every watched repository took `took`.
    pub fn poll_took(&self, took: Duration) {
        self.poll_duration.observe(took.as_secs_f64());
    }

    /// A sweep of the state folder removed `removed` things and failed `failures` times.
    pub fn swept(&self, removed: usize, failures: usize) {
        self.scraped.removed.fetch_add(removed as u64, Ordering::Relaxed);
        self.scraped.failures.fetch_add(failures as u64, Ordering::Relaxed);
    }

    /// A merge queue's record as it was written.
    pub fn queue_saved(&self, repository_key: &str, queue: &QueueState) {
        let counts = QUEUE_STATES.map(|(state, _)| queue.entries.iter().filter(|entry| entry.state == state).count());
        let mut queues = lock(&self.queues);
        queues.insert((repository_key.to_string(), queue.branch.clone()), counts.map(|count| count as i64));
        for (index, (_, state)) in QUEUE_STATES.iter().enumerate() {
            let total = queues.values().map(|counts| counts[index]).sum();
            self.queue_pulls.get_or_create(&[("state", *state)]).set(total);
        }
    }

    /// Takes in the merge queue records kept under the state folder `state`.
    pub fn read_queues(&self, state: &Path) {
        let store = QueueStore::new(state);
        let keys = std::fs::read_dir(state.join("queue")).into_iter().flatten().flatten();
        for key in keys.filter_map(|entry| entry.file_name().into_string().ok()) {
            for branch in store.branches(&key) {
                if let Ok(Some(queue)) = store.load(&key, &branch) {
                    self.queue_saved(&key, &queue);
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// The metrics read on each scrape.
#[derive(Debug, Default)]
struct Scraped {
    host: Mutex<Option<Weak<ExecutorHost>>>,
    /// What the daemon's own sweeps of the state folder removed and failed to.
    removed: AtomicU64,
    failures: AtomicU64,
}

/// Help lines here end with a full stop, as the registry ends those of the metrics it holds.
impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let host = lock(&self.host).as_ref().and_then(Weak::upgrade);
        let counters = host.as_ref().map(|host| host.counters());
        let restarts = ConstCounter::new(counters.map_or(0, |counters| counters.restarts()));
        let mut family = encoder.encode_descriptor(
            "knotless_executor_restarts",
            "Executor processes started again in place of one that was lost (it exited, hung or broke the \
             protocol), by executor.",
            None,
            restarts.metric_type(),
        )?;
        if let Some(host) = &host {
            restarts.encode(family.encode_family(&[("executor", host.name())])?)?;
        }
        let removed = self.removed.load(Ordering::Relaxed) + counters.map_or(0, |counters| counters.cleanup_removed());
        let removed = ConstCounter::new(removed);
        let metric = encoder.encode_descriptor(
            "knotless_cleanup_swept",
            "What cleanup sweeps removed: the executor's resources left by runs, and what dead runs left in \
             the state folder.",
            None,
            removed.metric_type(),
        )?;
        removed.encode(metric)?;
        let failures =
            self.failures.load(Ordering::Relaxed) + counters.map_or(0, |counters| counters.cleanup_failures());
        let failures = ConstCounter::new(failures);
        let metric = encoder.encode_descriptor(
            "knotless_cleanup_failures",
            "What cleanup sweeps could not remove, and sweeps that failed whole.",
            None,
            failures.metric_type(),
        )?;
        failures.encode(metric)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use prometheus_parse::{Scrape, Value};

    use super::*;
    use crate::checks::CheckTarget;
    use crate::queue::Entry;
    use crate::report::RunStatus;
    use crate::workflow::Event;

    fn check(status: RunStatus, trusted: bool, duration_ms: Option<u64>) -> CheckRecord {
        let target = CheckTarget {
            event: if trusted { Event::Push } else { Event::Pull },
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            git_ref: "refs/heads/main".into(),
            pull: None,
            head: None,
            base: None,
        };
        let mut check = CheckRecord::queued("run".into(), ("/srv/repo", "repo"), "build", &target, trusted, "me");
        check.end(status, "why");
        check.duration_ms = duration_ms;
        check
    }

    fn entry(number: u64, state: EntryState) -> Entry {
        Entry {
            number,
            head: "feedfacefeedfacefeedfacefeedfacefeedface".into(),
            state,
            reason: None,
            preflights: Vec::new(),
            batch: None,
            queued_at: 0,
            dequeued: false,
            retry: false,
        }
    }

    /// Parses the encoded metrics as Prometheus would.
    pub(crate) fn parse(text: &str) -> Scrape {
        Scrape::parse(text.lines().map(|line| Ok(line.to_string()))).expect("the text format")
    }

    /// The value of the sample `name` whose labels are `labels` (and no others).
    pub(crate) fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        scrape
            .samples
            .iter()
            .find(|sample| {
                sample.metric == name
                    && sample.labels.len() == labels.len()
                    && labels.iter().all(|(key, value)| sample.labels.get(key) == Some(*value))
            })
            .map(|sample| match &sample.value {
                Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => *value,
                Value::Histogram(_) | Value::Summary(_) => f64::NAN,
            })
    }

    #[test]
    fn what_the_daemon_records_is_encoded_with_its_labels_and_help() {
        let metrics = Metrics::new();
        metrics.run_ended(&check(RunStatus::Success, true, Some(2_500)));
        metrics.run_ended(&check(RunStatus::Success, true, Some(40_000)));
        metrics.run_ended(&check(RunStatus::Failure, false, Some(700)));
        metrics.run_ended(&check(RunStatus::Skipped, true, None));
        metrics.in_flight([InFlightStatus::Running, InFlightStatus::Queued, InFlightStatus::Queued]);
        metrics.poll_took(Duration::from_millis(300));
        metrics.swept(3, 1);
        let queue = QueueState {
            repository: "/srv/repo".into(),
            branch: "main".into(),
            entries: vec![
                entry(1, EntryState::Merged),
                entry(2, EntryState::InBatch),
                entry(3, EntryState::Waiting),
                entry(4, EntryState::Waiting),
            ],
            batches: Vec::new(),
        };
        metrics.queue_saved("repo", &queue);
        metrics.queue_saved(
            "other",
            &QueueState { branch: "dev".into(), entries: vec![entry(9, EntryState::Ready)], ..queue.clone() },
        );
        // Written again, a queue replaces what it was.
        metrics.queue_saved("repo", &QueueState { entries: vec![entry(3, EntryState::Waiting)], ..queue });

        let text = metrics.encode().expect("encoded");
        let scrape = parse(&text);
        let runs =
            |status, trust| value(&scrape, "knotless_runs_total", &[("status", status), ("workflow_trust", trust)]);
        assert_eq!(runs("success", "trusted"), Some(2.0), "{text}");
        assert_eq!(runs("failure", "untrusted"), Some(1.0), "{text}");
        assert_eq!(runs("skipped", "trusted"), Some(1.0), "{text}");
        assert_eq!(runs("failure", "trusted"), None, "no run, no series: {text}");
        assert_eq!(value(&scrape, "knotless_run_duration_seconds_count", &[]), Some(3.0), "the skipped run never ran");
        assert_eq!(value(&scrape, "knotless_run_duration_seconds_sum", &[]), Some(43.2));
        let buckets = scrape
            .samples
            .iter()
            .find_map(|sample| match &sample.value {
                Value::Histogram(buckets) if sample.metric == "knotless_run_duration_seconds" => Some(buckets.clone()),
                _ => None,
            })
            .expect("the duration's buckets");
        let at = |bound: f64| buckets.iter().find(|bucket| bucket.less_than == bound).map(|bucket| bucket.count);
        assert_eq!(
            (at(1.0), at(5.0), at(30.0), at(60.0), at(f64::INFINITY)),
            (Some(1.0), Some(2.0), Some(2.0), Some(3.0), Some(3.0))
        );
        assert_eq!(buckets.len(), RUN_BUCKETS.len() + 1, "{buckets:?}");
        assert_eq!(value(&scrape, "knotless_runs_in_flight", &[]), Some(1.0));
        assert_eq!(value(&scrape, "knotless_runs_queued", &[]), Some(2.0));
        assert_eq!(value(&scrape, "knotless_poll_duration_seconds_count", &[]), Some(1.0));
        assert_eq!(value(&scrape, "knotless_cleanup_swept_total", &[]), Some(3.0));
        assert_eq!(value(&scrape, "knotless_cleanup_failures_total", &[]), Some(1.0));
        let pulls = |state| value(&scrape, "knotless_queue_pulls", &[("state", state)]);
        assert_eq!((pulls("waiting"), pulls("ready"), pulls("in-batch")), (Some(1.0), Some(1.0), Some(0.0)), "{text}");
        // Without an executor host, no executor is named, but the metric is described.
        assert!(!scrape.samples.iter().any(|sample| sample.metric == "knotless_executor_restarts_total"), "{text}");
        for (name, kind) in [
            ("knotless_runs_total", "counter"),
            ("knotless_run_duration_seconds", "histogram"),
            ("knotless_runs_in_flight", "gauge"),
            ("knotless_runs_queued", "gauge"),
            ("knotless_poll_duration_seconds", "histogram"),
            ("knotless_executor_restarts_total", "counter"),
            ("knotless_cleanup_swept_total", "counter"),
            ("knotless_cleanup_failures_total", "counter"),
            ("knotless_queue_pulls", "gauge"),
        ] {
            assert!(text.contains(&format!("\n# TYPE {name} {kind}\n")), "{name}: {text}");
            assert!(scrape.docs.contains_key(name), "{name} has a HELP line: {text}");
        }
        assert!(!text.contains("# EOF"), "the Prometheus text format, not OpenMetrics: {text}");
    }

    #[test]
    fn queue_records_kept_in_the_state_folder_are_counted_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = QueueStore::new(dir.path());
        let queue = |branch: &str, entries| QueueState {
            repository: "/srv/repo".into(),
            branch: branch.into(),
            entries,
            batches: Vec::new(),
        };
        store
            .save("repo-a", &queue("main", vec![entry(1, EntryState::Ready), entry(2, EntryState::Ejected)]))
            .expect("save");
        store.save("repo-a", &queue("release/1", vec![entry(3, EntryState::Ready)])).expect("save");
        store.save("repo-b", &queue("main", vec![entry(1, EntryState::Waiting)])).expect("save");
        let metrics = Metrics::new();
        metrics.read_queues(dir.path());
        let scrape = parse(&metrics.encode().expect("encoded"));
        let pulls = |state| value(&scrape, "knotless_queue_pulls", &[("state", state)]);
        assert_eq!((pulls("waiting"), pulls("ready"), pulls("in-batch")), (Some(1.0), Some(2.0), Some(0.0)));
    }
}
