//! The forge, as the runner sees it: one narrow trait over the repositories that name this
//! runner, their events (pushes, pulls), checking out what a run executes, writing checks and
//! streaming run output, and landing a batch. [`GitForge`] is the embedded default.

mod discover;
mod git;
mod merge;
mod unchanged;

use std::collections::BTreeMap;
use std::future::Future;

use serde::{Deserialize, Serialize};

pub use discover::{RECORD_FILE, RepositoryRecord};
pub use git::{GitForge, GitForgeConfig, normalize_url, repository_key, repository_name};
pub use merge::Batch;

use crate::checkout::Checkout;
use crate::checks::CheckRecord;
use crate::report::LogSink;

/// A watched repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Repository {
    /// Its key: a file name under the state folder, stable for its URL.
    pub key: String,
    /// Where it is fetched from: a path, `file://` or `ssh://` URL.
    pub url: String,
}

/// A pull request: its head commit and the branch it goes into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRef {
    /// The head commit.
    pub head: String,
    /// The base branch's name.
    pub base: String,
}

/// What a repository holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The default branch, when known.
    pub default_branch: Option<String>,
    /// Each branch's head commit.
    pub branches: BTreeMap<String, String>,
    /// The open pulls, by number.
    pub pulls: BTreeMap<u64, PullRef>,
    /// The merge queue of each branch: pull number to the head queued for landing.
    pub queued: BTreeMap<String, BTreeMap<u64, String>>,
    /// The commits that landed through the merge queue (a pull's `merged` mark names them).
    pub landed: std::collections::BTreeSet<String>,
}

/// What the runner saw of a repository last time (kept in `state.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// Each branch's head commit.
    pub branches: BTreeMap<String, String>,
    /// Each pull's head commit.
    pub pulls: BTreeMap<u64, String>,
}

impl Seen {
    /// What `snapshot` shows.
    pub fn of(snapshot: &Snapshot) -> Seen {
        Seen {
            branches: snapshot.branches.clone(),
            pulls: snapshot.pulls.iter().map(|(number, pull)| (*number, pull.head.clone())).collect(),
        }
    }

    /// Whether `snapshot` shows what this saw (`Seen::of(snapshot) == *self`, without a copy).
    pub fn shows(&self, snapshot: &Snapshot) -> bool {
        self.branches == snapshot.branches
            && self.pulls.len() == snapshot.pulls.len()
            && self.pulls.iter().zip(&snapshot.pulls).all(|((a, head), (b, pull))| a == b && *head == pull.head)
    }
}

/// Something that starts runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum ForgeEvent {
    /// A branch's head is a commit not run yet.
    Push {
        /// The branch.
        branch: String,
        /// Its new head.
        commit: String,
        /// Its head before, when it had one this runner saw (not a new branch, not the first
        /// sight of the repository): what `on.push.paths` compares the new head with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<String>,
    },
    /// A pull's head is new.
    Pull {
        /// The pull's number.
        number: u64,
        /// Its head and base.
        #[serde(flatten)]
        pull: PullRef,
    },
}

/// The events between what was seen and what is there now.
///
/// A new head on a branch is one push event for that head only (not for every commit in
/// between). At the first sight of a repository (`previous` is `None`) every branch's current
/// head runs once, a commit heading several branches once. A pull runs when its head changes
/// (and at first sight), with `pulls` only. A commit that landed through the merge queue is no
/// push run: its batch's checks are its checks.
pub fn events(previous: Option<&Seen>, snapshot: &Snapshot, pulls: bool) -> Vec<ForgeEvent> {
    let empty = Seen::default();
    let seen = previous.unwrap_or(&empty);
    let mut commits = std::collections::BTreeSet::new();
    let mut found = Vec::new();
    let mut branches: Vec<_> = snapshot.branches.iter().collect();
    // The default branch first, so a commit heading several branches runs as a push to it.
    branches.sort_by_key(|(branch, _)| Some(*branch) != snapshot.default_branch.as_ref());
    for (branch, commit) in branches {
        if snapshot.landed.contains(commit) {
            continue;
        }
        if seen.branches.get(branch) != Some(commit) && commits.insert(commit.clone()) {
            let before = seen.branches.get(branch).cloned();
            found.push(ForgeEvent::Push { branch: branch.clone(), commit: commit.clone(), before });
        }
    }
    if pulls {
        for (number, pull) in &snapshot.pulls {
            if seen.pulls.get(number) != Some(&pull.head) {
                found.push(ForgeEvent::Pull { number: *number, pull: pull.clone() });
            }
        }
    }
    found
}

/// What a run executes, once the forge made it.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The files.
    pub checkout: Checkout,
    /// The commit run (for a pull, the temporary merge).
    pub commit: String,
    /// The ref for `KNOTLESS_REF`.
    pub git_ref: String,
}

/// The forge behind the runner.
pub trait Forge: Send + Sync + 'static {
    /// The repositories that name this runner.
    fn repositories(&self) -> impl Future<Output = anyhow::Result<Vec<Repository>>> + Send;

    /// Fetches a repository and tells what it holds now.
    fn refresh(&self, repository: &Repository) -> impl Future<Output = anyhow::Result<Snapshot>> + Send;

    /// Whether the repository certainly holds nothing new since its last refresh, known
    /// without reading it (a watched repository no change touched, its merge queue empty): a
    /// round passes it by. A refresh always reads.
    fn quiet(&self, _repository: &Repository) -> bool {
        false
    }

    /// Whether a round would pass by every repository (each quiet, and no other to look
    /// for), told without a look at each: nothing changed since a round found them all quiet.
    fn all_quiet(&self) -> bool {
        false
    }

    /// Makes the checkout of an event: a push's commit, or a pull's head merged with its base
    /// (a merge that conflicts is an error whose message says so).
    fn prepare(
        &self,
        repository: &Repository,
        event: &ForgeEvent,
    ) -> impl Future<Output = anyhow::Result<Prepared>> + Send;

    /// The paths an event changed, for `paths:` filters: a push's, from its head before to
    /// its new head; a pull's, from where its head left its base branch to its head. `None`
    /// when it cannot say (a push with no head before it).
    fn changed_paths(
        &self,
        repository: &Repository,
        event: &ForgeEvent,
    ) -> impl Future<Output = anyhow::Result<Option<Vec<String>>>> + Send;

    /// A file of the repository's default branch (the repository record, the sealed secrets),
    /// `None` when absent. Pulls cannot change what this reads.
    fn read_default(
        &self,
        repository: &Repository,
        path: &str,
    ) -> impl Future<Output = anyhow::Result<Option<String>>> + Send;

    /// Writes (creates or replaces) a check.
    fn put_check(&self, check: &CheckRecord) -> anyhow::Result<()>;

    /// Makes a finished check visible to the repository's other runners: a pre-flight pinned
    /// to this runner, which the lander waits for.
    fn publish_check(
        &self,
        repository: &Repository,
        check: &CheckRecord,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The checks of `commit` that runners published, as of the last [`Forge::refresh`].
    fn published_checks(
        &self,
        repository: &Repository,
        commit: &str,
    ) -> impl Future<Output = anyhow::Result<Vec<CheckRecord>>> + Send;

    /// Takes a published check away (a retry: its runner runs it anew).
    fn unpublish_check(
        &self,
        repository: &Repository,
        check: &CheckRecord,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Where a running check's output streams, line by line.
    fn run_output(&self, check: &CheckRecord) -> anyhow::Result<Box<dyn LogSink>>;

    /// Stores a finished check's whole log (masked, capped).
    fn put_log(&self, check: &CheckRecord, log: &str) -> anyhow::Result<()>;

    /// Lands a passing batch: moves `branch` to `commit`, only as a fast-forward, and marks
    /// `pulls` merged (out of the queue), all at once.
    fn land(
        &self,
        repository: &Repository,
        branch: &str,
        commit: &str,
        pulls: &[u64],
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Takes an ejected pull out of `branch`'s merge queue.
    fn dequeue(
        &self,
        repository: &Repository,
        branch: &str,
        number: u64,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Makes the batch of `pulls` (number, head; in queue order) on `base`, `branch`'s head.
    fn batch(
        &self,
        repository: &Repository,
        branch: &str,
        base: &str,
        pulls: &[(u64, String)],
    ) -> impl Future<Output = anyhow::Result<Batch>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(branches: &[(&str, &str)], pulls: &[(u64, &str)]) -> Snapshot {
        Snapshot {
            default_branch: Some("main".into()),
            branches: branches.iter().map(|(b, c)| (b.to_string(), c.to_string())).collect(),
            pulls: pulls.iter().map(|(n, h)| (*n, PullRef { head: h.to_string(), base: "main".into() })).collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_seen_shows_exactly_the_snapshots_it_was_made_of() {
        let snapshots = [
            snapshot(&[("main", "a")], &[]),
            snapshot(&[("main", "b")], &[]),
            snapshot(&[("main", "a"), ("x", "a")], &[]),
            snapshot(&[("main", "a")], &[(1, "c")]),
            snapshot(&[("main", "a")], &[(1, "d")]),
            snapshot(&[("main", "a")], &[(2, "c")]),
            snapshot(&[("main", "a")], &[(1, "c"), (2, "c")]),
        ];
        for seen in &snapshots {
            for other in &snapshots {
                assert_eq!(Seen::of(seen).shows(other), Seen::of(seen) == Seen::of(other), "{seen:?} {other:?}");
            }
        }
    }

    #[test]
    fn first_sight_runs_each_head_once_and_later_only_what_moved() {
        let now = snapshot(&[("dev", "a"), ("main", "a"), ("x", "b")], &[(1, "c")]);
        let first = events(None, &now, true);
        assert_eq!(
            first,
            vec![
                ForgeEvent::Push { branch: "main".into(), commit: "a".into(), before: None },
                ForgeEvent::Push { branch: "x".into(), commit: "b".into(), before: None },
                ForgeEvent::Pull { number: 1, pull: PullRef { head: "c".into(), base: "main".into() } },
            ]
        );
        let seen = Seen::of(&now);
        assert!(events(Some(&seen), &now, true).is_empty());
        let later = snapshot(&[("dev", "a"), ("main", "d"), ("x", "b")], &[(1, "c")]);
        assert_eq!(
            events(Some(&seen), &later, false),
            vec![ForgeEvent::Push { branch: "main".into(), commit: "d".into(), before: Some("a".into()) }]
        );
        let mut landed = later.clone();
        landed.landed.insert("d".into());
        assert!(events(Some(&seen), &landed, false).is_empty(), "a landed batch is no push run");
    }
}
