//! The git forge: repositories are anything the git CLI can fetch, mirrored (bare) under
//! `<state>/mirrors/`; branches are `refs/heads/*`; a pull is `refs/pulls/<n>/head` (its head
//! commit) with an optional `refs/pulls/<n>/base/<branch>` naming its base branch (its value is
//! not read; without it the base is the default branch); a pull queued for landing on a branch
//! is `refs/queue/<branch>/<n>` (pointing at the head to land) and a landed one is marked
//! `refs/pulls/<n>/merged` (pointing at the batch that landed it); checks are files under the
//! state folder ([`CheckStore`]), and a check a runner publishes for the others (a pre-flight
//! pinned to it) is `refs/checks/<commit>/<run id>`, a blob holding its record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};

use super::discover::{RECORD_FILE, RepositoryRecord, candidates};
use super::merge::{Batch, Merged, commit_tree, make_batch, merge_tree};
use super::{Forge, ForgeEvent, Prepared, PullRef, Repository, Snapshot, unchanged};
use crate::checkout::Checkout;
use crate::checks::{CheckRecord, CheckStore};
use crate::git::Git;
use crate::names::fnv;
use crate::report::LogSink;

/// How the git forge finds repositories.
#[derive(Debug, Clone)]
pub struct GitForgeConfig {
    /// The state folder.
    pub state: PathBuf,
    /// The repositories given on the command line.
    pub repositories: Vec<String>,
    /// `--discover DIR`.
    pub discover: Option<PathBuf>,
    /// This runner's id, which a discovered repository's record must name.
    pub runner_id: String,
    /// `--default-runner ID`: the runner of discovered repositories whose record names none.
    pub default_runner: Option<String>,
    /// `--fetch-timeout`: how long one fetch or first clone of a repository may take.
    pub fetch_timeout: std::time::Duration,
}

/// The repositories given on the command line as looked up: by each as given, the repository
/// it names once it could be; and all of them, sorted, once each could.
type Given = (std::collections::HashMap<String, Repository>, Option<Vec<Repository>>);

/// The embedded git forge.
pub struct GitForge {
    config: GitForgeConfig,
    checks: CheckStore,
    /// A lock a repository, held while its mirror is fetched: the daemon's look and the queue's
    /// lander both refresh, and other repositories are fetched meanwhile.
    fetching: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// By key, for a local repository: the fingerprints of its refs before its last fetch and
    /// of the mirror's after it, and the snapshot that fetch gave.
    fetched: std::sync::Mutex<std::collections::HashMap<String, (u64, u64, Snapshot)>>,
    /// The inotify watch of local repositories and their mirrors.
    watch: unchanged::RefWatch,
    /// By repository as given, the repository it names, once it could be looked up; and all of
    /// them, sorted, once each could.
    given: std::sync::Mutex<Given>,
    /// Since a round found every repository quiet: the watch's count of changes then, and when
    /// the first of them is to be read again.
    idle: std::sync::Mutex<Option<(u64, std::time::Instant)>>,
}

/// A repository's key: its name and a hash of its URL (`demo-1a2b3c4d`).
pub fn repository_key(url: &str) -> String {
    format!("{}-{:08x}", repository_name(url), fnv(url.as_bytes()) as u32)
}

/// The name a repository's key starts with: the last part of its URL or path, without `.git`
/// (`demo` for `/srv/git/demo.git`, `/srv/git/demo/.git` and `ssh://host/demo`), in letters,
/// digits, `-` and `_`, at most 40.
pub fn repository_name(url: &str) -> String {
    let trimmed = url.trim_end_matches('/').trim_end_matches(".git").trim_end_matches('/');
    let name = trimmed.rsplit(['/', ':']).next().unwrap_or("repository");
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .take(40)
        .collect();
    if safe.is_empty() { "repository".to_string() } else { safe }
}

/// A command-line repository as the runner watches it: an existing local path made absolute,
/// anything else (a URL) as given.
pub fn normalize_url(given: &str) -> String {
    if given.contains("://") {
        return given.to_string();
    }
    std::fs::canonicalize(given).map(|path| path.to_string_lossy().into_owned()).unwrap_or_else(|_| given.to_string())
}

impl GitForge {
    /// A git forge over `config`.
    pub fn new(config: GitForgeConfig) -> GitForge {
        let checks = CheckStore::new(&config.state);
        GitForge {
            config,
            checks,
            fetching: std::sync::Mutex::default(),
            fetched: std::sync::Mutex::default(),
            watch: unchanged::RefWatch::default(),
            given: std::sync::Mutex::default(),
            idle: std::sync::Mutex::default(),
        }
    }

    /// The check store.
    pub fn checks(&self) -> &CheckStore {
        &self.checks
    }

    fn mirror(&self, repository: &Repository) -> PathBuf {
        self.config.state.join("mirrors").join(format!("{}.git", repository.key))
    }

    fn watch(url: &str) -> Repository {
        let url = normalize_url(url);
        Repository { key: repository_key(&url), url }
    }

    /// The repositories given on the command line, sorted, each made absolute once it exists
    /// (a path that does not exist yet is looked up again at each round); the list is kept once
    /// every one was looked up.
    fn given(&self) -> Vec<Repository> {
        let (known, all) = &mut *knotless_protocol::sdk::lock(&self.given);
        if let Some(all) = all {
            return all.clone();
        }
        let mut found: Vec<Repository> = Vec::new();
        let mut every = true;
        for url in &self.config.repositories {
            match known.get(url) {
                Some(repository) => found.push(repository.clone()),
                None => {
                    let repository = Self::watch(url);
                    let settled = url.contains("://")
                        || repository.url != *url
                        || Path::new(url).is_absolute() && Path::new(url).exists();
                    if settled {
                        known.insert(url.clone(), repository.clone());
                    } else {
                        every = false;
                    }
                    found.push(repository);
                }
            }
        }
        found.sort();
        found.dedup();
        if every {
            *all = Some(found.clone());
        }
        found
    }
}

impl GitForge {
    /// Whether a remote repository's refs are the mirror's, by one `git ls-remote`; `false`
    /// when that cannot tell (the fetch then says why).
    async fn remote_unchanged(&self, mirror: &Path, limit: std::time::Duration) -> bool {
        let remote = Git::in_folder(mirror).run_within(&["ls-remote", "--quiet", "origin"], limit).await;
        let local = git_in(mirror, &["for-each-ref", "--format=%(objectname) %(refname)"]).await;
        match (remote, local) {
            (Ok(remote), Ok(local)) => unchanged::same_refs(&String::from_utf8_lossy(&remote), &local),
            _ => false,
        }
    }
}

async fn git_in(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    Git::in_folder(dir).text(args).await
}

impl Forge for GitForge {
    async fn repositories(&self) -> anyhow::Result<Vec<Repository>> {
        let mut found: Vec<Repository> = self.given();
        if let Some(dir) = &self.config.discover {
            for path in candidates(dir) {
                // A repository without a record (or naming no runner) belongs to the default
                // runner, if there is one.
                let record = match git_in(&path, &["show", &format!("HEAD:{RECORD_FILE}")]).await {
                    Ok(text) => match RepositoryRecord::parse(&text) {
                        Ok(record) => record,
                        Err(error) => {
                            tracing::warn!("--discover: {}: {error:#}", path.display());
                            continue;
                        }
                    },
                    Err(_) => RepositoryRecord::default(),
                };
                let runner = &self.config.runner_id;
                let named = record.names(runner)
                    || (record.runners.is_empty() && self.config.default_runner.as_deref() == Some(runner.as_str()));
                if named {
                    found.push(Self::watch(&path.to_string_lossy()));
                }
            }
        }
        if self.config.discover.is_some() {
            found.sort();
            found.dedup();
        }
        Ok(found)
    }

    fn quiet(&self, repository: &Repository) -> bool {
        self.watch.quiet(&repository.key)
    }

    fn all_quiet(&self) -> bool {
        if self.config.discover.is_some() {
            return false;
        }
        let mut idle = knotless_protocol::sdk::lock(&self.idle);
        let changes = self.watch.changes();
        if let Some((seen, until)) = *idle
            && seen == changes
            && std::time::Instant::now() < until
        {
            return true;
        }
        *idle = None;
        let Some(all) = knotless_protocol::sdk::lock(&self.given).1.clone() else { return false };
        let mut until: Option<std::time::Instant> = None;
        for repository in &all {
            let Some(quiet_until) = self.watch.quiet_until(&repository.key) else { return false };
            until = Some(until.map_or(quiet_until, |until| until.min(quiet_until)));
        }
        *idle = until.map(|until| (changes, until));
        idle.is_some()
    }

    async fn refresh(&self, repository: &Repository) -> anyhow::Result<Snapshot> {
        let mirror = self.mirror(repository);
        let lock = {
            let mut locks = self.fetching.lock().unwrap_or_else(|poison| poison.into_inner());
            Arc::clone(locks.entry(repository.key.clone()).or_default())
        };
        let _fetching = lock.lock().await;
        // Past --fetch-timeout, git and what it started are stopped; the next round tries again.
        let limit = self.config.fetch_timeout;
        // Read now, so a change from here on marks it again (its folders watched first).
        self.watch.settle(&repository.key, || {
            let origin_dir = unchanged::local_git_dir(&repository.url)?;
            mirror.join("HEAD").is_file().then(|| [origin_dir, mirror.clone()])
        });
        // A local repository whose refs and mirror's refs are as they were after the last
        // fetch has nothing new: no process runs.
        let origin_dir = unchanged::local_git_dir(&repository.url);
        let origin_refs = origin_dir.as_deref().and_then(unchanged::refs_fingerprint);
        if let Some(origin_refs) = origin_refs {
            let mirror_refs = unchanged::refs_fingerprint(&mirror);
            let fetched = knotless_protocol::sdk::lock(&self.fetched);
            if let Some((before, after, snapshot)) = fetched.get(&repository.key)
                && *before == origin_refs
                && Some(*after) == mirror_refs
            {
                self.watch.read(&repository.key, snapshot.queued.is_empty());
                return Ok(snapshot.clone());
            }
        }
        if mirror.join("HEAD").is_file() && origin_dir.is_none() && self.remote_unchanged(&mirror, limit).await {
            tracing::debug!(repository = %repository.url, "its refs are the mirror's: not fetched");
        } else if mirror.join("HEAD").is_file() {
            Git::in_folder(&mirror)
                .run_within(&["fetch", "--prune", "--quiet", "origin"], limit)
                .await
                .with_context(|| format!("cannot fetch {} (--fetch-timeout {})", repository.url, limit.as_secs()))?;
        } else {
            let parent = mirror.parent().context("a mirror has no folder")?;
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
            let partial = parent.join(format!(".{}.partial", repository.key));
            let _ = std::fs::remove_dir_all(&partial);
            let partial_path = partial.to_string_lossy();
            Git::outside()
                .run_within(&["clone", "--mirror", "--quiet", "--", &repository.url, &partial_path], limit)
                .await
                .with_context(|| format!("cannot mirror {} (--fetch-timeout {})", repository.url, limit.as_secs()))?;
            std::fs::rename(&partial, &mirror).with_context(|| format!("cannot create {}", mirror.display()))?;
        }
        let listing = git_in(
            &mirror,
            &["for-each-ref", "--format=%(objectname) %(refname)", "refs/heads", "refs/pulls", "refs/queue"],
        )
        .await?;
        let default_branch = git_in(&mirror, &["symbolic-ref", "--quiet", "HEAD"])
            .await
            .ok()
            .and_then(|head| head.trim().strip_prefix("refs/heads/").map(str::to_string));
        let snapshot = parse_refs(&listing, default_branch);
        let mut fetched = knotless_protocol::sdk::lock(&self.fetched);
        match (origin_refs, unchanged::refs_fingerprint(&mirror)) {
            (Some(before), Some(after)) => {
                fetched.insert(repository.key.clone(), (before, after, snapshot.clone()));
            }
            _ => {
                fetched.remove(&repository.key);
            }
        }
        self.watch.read(&repository.key, snapshot.queued.is_empty());
        Ok(snapshot)
    }

    async fn prepare(&self, repository: &Repository, event: &ForgeEvent) -> anyhow::Result<Prepared> {
        let mirror = self.mirror(repository);
        match event {
            ForgeEvent::Push { branch, commit, .. } => Ok(Prepared {
                checkout: Checkout::Revision { repo: mirror, commit: commit.clone() },
                commit: commit.clone(),
                git_ref: format!("refs/heads/{branch}"),
            }),
            ForgeEvent::Pull { number, pull } => {
                let base_ref = format!("refs/heads/{}", pull.base);
                let base = git_in(&mirror, &["rev-parse", "--verify", "--quiet", &format!("{base_ref}^{{commit}}")])
                    .await
                    .with_context(|| format!("pull {number}: its base branch {} does not exist", pull.base))?;
                let base = base.trim();
                let tree =
                    match merge_tree(&mirror, base, &pull.head).await.with_context(|| format!("pull {number}"))? {
                        Merged::Tree(tree) => tree,
                        Merged::Conflict(files) => bail!(
                            "pull {number}: its head {} does not merge cleanly into {} at {base}: conflict in {}",
                            pull.head,
                            pull.base,
                            files.join(", ")
                        ),
                    };
                let message = format!("knotless: pull {number} ({}) merged into {}", pull.head, pull.base);
                let commit = commit_tree(&mirror, &tree, &[base, &pull.head], &[], &message)
                    .await
                    .with_context(|| format!("pull {number}: cannot make the merge"))?;
                Ok(Prepared {
                    checkout: Checkout::Revision { repo: mirror, commit: commit.clone() },
                    commit,
                    git_ref: format!("refs/pulls/{number}/head"),
                })
            }
        }
    }

    async fn changed_paths(&self, repository: &Repository, event: &ForgeEvent) -> anyhow::Result<Option<Vec<String>>> {
        let range = match event {
            ForgeEvent::Push { before: Some(before), commit, .. } => format!("{before}..{commit}"),
            ForgeEvent::Push { before: None, .. } => return Ok(None),
            // From the merge base of the base branch and the head.
            ForgeEvent::Pull { pull, .. } => format!("refs/heads/{}...{}", pull.base, pull.head),
        };
        let mirror = self.mirror(repository);
        let listing = Git::in_folder(&mirror).run(&["diff", "--name-only", "--no-renames", "-z", &range, "--"]).await?;
        let paths = listing.split(|&byte| byte == 0).filter(|path| !path.is_empty());
        Ok(Some(paths.map(|path| String::from_utf8_lossy(path).into_owned()).collect()))
    }

    async fn read_default(&self, repository: &Repository, path: &str) -> anyhow::Result<Option<String>> {
        let mirror = self.mirror(repository);
        let spec = format!("HEAD:{path}");
        if git_in(&mirror, &["cat-file", "-e", &spec]).await.is_err() {
            return Ok(None);
        }
        Ok(Some(git_in(&mirror, &["show", &spec]).await?))
    }

    fn put_check(&self, check: &CheckRecord) -> anyhow::Result<()> {
        self.checks.put(check)
    }

    async fn publish_check(&self, repository: &Repository, check: &CheckRecord) -> anyhow::Result<()> {
        let mirror = self.mirror(repository);
        let mut record = check.clone();
        // Where this runner keeps the outputs means nothing to another one.
        record.outputs_dir = None;
        let text = serde_json::to_vec(&record).context("cannot encode a check")?;
        let blob = hash_object(&mirror, &text).await?;
        let name = check_ref(check)?;
        git_in(&mirror, &["push", "--quiet", "--force", &repository.url, &format!("{blob}:{name}")])
            .await
            .with_context(|| format!("cannot publish the check {} to {}", check.run_id, repository.url))?;
        // Seen at once here too, not only after the next fetch.
        git_in(&mirror, &["update-ref", &name, &blob]).await?;
        Ok(())
    }

    async fn published_checks(&self, repository: &Repository, commit: &str) -> anyhow::Result<Vec<CheckRecord>> {
        let mirror = self.mirror(repository);
        if !is_commit_id(commit) {
            bail!("{commit:?} is not a commit id");
        }
        let listing = git_in(
            &mirror,
            &["for-each-ref", "--format=%(objectname) %(objecttype)", &format!("refs/checks/{commit}/")],
        )
        .await?;
        let mut found = Vec::new();
        for (blob, kind) in listing.lines().filter_map(|line| line.split_once(' ')) {
            if kind != "blob" {
                continue;
            }
            let text = Git::in_folder(&mirror).run(&["cat-file", "blob", blob]).await?;
            match serde_json::from_slice::<CheckRecord>(&text) {
                Ok(check) if check.target.commit == commit => found.push(check),
                Ok(_) => tracing::warn!("refs/checks/{commit}: a check of another commit is ignored"),
                Err(error) => tracing::warn!("refs/checks/{commit}: not a check record ({error}): ignored"),
            }
        }
        Ok(found)
    }

    async fn unpublish_check(&self, repository: &Repository, check: &CheckRecord) -> anyhow::Result<()> {
        let mirror = self.mirror(repository);
        let name = check_ref(check)?;
        git_in(&mirror, &["push", "--quiet", &repository.url, &format!(":{name}")])
            .await
            .with_context(|| format!("cannot take the check {} out of {}", check.run_id, repository.url))?;
        git_in(&mirror, &["update-ref", "-d", &name]).await?;
        Ok(())
    }

    fn run_output(&self, check: &CheckRecord) -> anyhow::Result<Box<dyn LogSink>> {
        Ok(Box::new(self.checks.live_log(&check.repository_key, &check.run_id)?))
    }

    fn put_log(&self, check: &CheckRecord, log: &str) -> anyhow::Result<()> {
        self.checks.put_log(&check.repository_key, &check.run_id, log)
    }

    async fn land(&self, repository: &Repository, branch: &str, commit: &str, pulls: &[u64]) -> anyhow::Result<()> {
        // One atomic push without force: refused unless the branch fast-forwards; the pulls are
        // marked merged and leave the queue in the same push. It names the URL, not `origin`,
        // since a mirror's remote pushes only as `--mirror`.
        let mirror = self.mirror(repository);
        let mut args = vec!["push".to_string(), "--atomic".into(), "--quiet".into(), repository.url.clone()];
        args.push(format!("{commit}:refs/heads/{branch}"));
        for number in pulls {
            args.push(format!("{commit}:refs/pulls/{number}/merged"));
            args.push(format!(":refs/queue/{branch}/{number}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        git_in(&mirror, &args)
            .await
            .with_context(|| format!("cannot land {commit} on {branch} of {}", repository.url))?;
        Ok(())
    }

    async fn dequeue(&self, repository: &Repository, branch: &str, number: u64) -> anyhow::Result<()> {
        let mirror = self.mirror(repository);
        let spec = format!(":refs/queue/{branch}/{number}");
        git_in(&mirror, &["push", "--quiet", &repository.url, &spec])
            .await
            .with_context(|| format!("cannot take pull {number} out of the queue of {branch}"))?;
        Ok(())
    }

    async fn batch(
        &self,
        repository: &Repository,
        branch: &str,
        base: &str,
        pulls: &[(u64, String)],
    ) -> anyhow::Result<Batch> {
        make_batch(&self.mirror(repository), branch, base, pulls).await
    }
}

/// The ref a published check is kept under: `refs/checks/<commit>/<run id>`.
fn check_ref(check: &CheckRecord) -> anyhow::Result<String> {
    let commit = &check.target.commit;
    let run = &check.run_id;
    let safe = !run.is_empty() && run.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !is_commit_id(commit) || !safe {
        bail!("cannot publish the check {run:?} of {commit:?}: not a commit id and a run id");
    }
    Ok(format!("refs/checks/{commit}/{run}"))
}

/// Whether `text` is a full commit id (SHA-1 or SHA-256, lowercase hex).
fn is_commit_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Writes `data` as a blob of `mirror`; its id.
async fn hash_object(mirror: &Path, data: &[u8]) -> anyhow::Result<String> {
    let id = Git::in_folder(mirror).run_with_input(&["hash-object", "-w", "--stdin"], data).await?;
    Ok(String::from_utf8_lossy(&id).trim().to_string())
}

/// Reads `for-each-ref` lines into a snapshot.
fn parse_refs(listing: &str, default_branch: Option<String>) -> Snapshot {
    let mut branches = BTreeMap::new();
    let mut heads = BTreeMap::new();
    let mut bases = BTreeMap::new();
    let mut landed = std::collections::BTreeSet::new();
    let mut queued: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    for line in listing.lines() {
        let Some((object, name)) = line.split_once(' ') else { continue };
        if let Some((branch, number)) = name.strip_prefix("refs/queue/").and_then(|rest| rest.rsplit_once('/')) {
            if let Ok(number) = number.parse::<u64>() {
                queued.entry(branch.to_string()).or_default().insert(number, object.to_string());
            }
        } else if let Some(branch) = name.strip_prefix("refs/heads/") {
            branches.insert(branch.to_string(), object.to_string());
        } else if let Some(rest) = name.strip_prefix("refs/pulls/") {
            let Some((number, what)) = rest.split_once('/') else { continue };
            let Ok(number) = number.parse::<u64>() else { continue };
            if what == "head" {
                heads.insert(number, object.to_string());
            } else if what == "merged" {
                landed.insert(object.to_string());
            } else if let Some(base) = what.strip_prefix("base/") {
                bases.insert(number, base.to_string());
            }
        }
    }
    let fallback = default_branch.clone().unwrap_or_else(|| "main".to_string());
    let pulls = heads
        .into_iter()
        .map(|(number, head)| {
            (number, PullRef { head, base: bases.remove(&number).unwrap_or_else(|| fallback.clone()) })
        })
        .collect();
    Snapshot { default_branch, branches, pulls, queued, landed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_check_is_named_only_by_a_commit_id_and_a_safe_run_id() {
        let target = crate::checks::CheckTarget {
            event: crate::workflow::Event::Pull,
            commit: "a".repeat(40),
            git_ref: "refs/pulls/1/head".into(),
            pull: Some(1),
            head: None,
            base: None,
        };
        let check = |run: &str, commit: &str| {
            let mut target = target.clone();
            target.commit = commit.to_string();
            CheckRecord::queued(run.to_string(), ("r", "k"), "w", &target, false, "ci")
        };
        let good = "a".repeat(40);
        assert_eq!(check_ref(&check("pre-1f", &good)).expect("a ref"), format!("refs/checks/{good}/pre-1f"));
        for run in ["", "..", "a/b", "x\nrefs/heads/main", "a b", "../../heads/main"] {
            assert!(check_ref(&check(run, &good)).is_err(), "{run:?}");
        }
        for commit in ["", "main", "A".repeat(40).as_str(), &format!("{good}/x"), &"a".repeat(41)] {
            assert!(check_ref(&check("pre-1", commit)).is_err(), "{commit:?}");
        }
        assert!(check_ref(&check("pre-1", &"b".repeat(64))).is_ok());
    }

    #[test]
    fn refs_read_into_branches_and_pulls() {
        let listing = "a refs/heads/main\nb refs/heads/feature/x\nc refs/pulls/7/head\nd refs/pulls/7/base/feature/x\ne refs/pulls/8/head\n";
        let snapshot = parse_refs(listing, Some("main".into()));
        assert_eq!(snapshot.branches.get("feature/x").map(String::as_str), Some("b"));
        assert_eq!(snapshot.pulls[&7], PullRef { head: "c".into(), base: "feature/x".into() });
        assert_eq!(snapshot.pulls[&8], PullRef { head: "e".into(), base: "main".into() });
        let more = format!("{listing}f refs/queue/feature/x/7\ng refs/pulls/7/merged\n");
        let snapshot = parse_refs(&more, Some("main".into()));
        assert_eq!(snapshot.queued["feature/x"][&7], "f");
        assert!(snapshot.landed.contains("g"));
    }

    #[test]
    fn keys_are_readable_and_distinct() {
        let one = repository_key("/srv/git/demo.git");
        assert!(one.starts_with("demo-"), "{one}");
        assert_ne!(one, repository_key("ssh://host/demo.git"));
        assert!(repository_key("file:///x/").starts_with("x-"));
    }
}
