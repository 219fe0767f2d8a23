//! Merges made in a bare mirror with git plumbing, never touching a work tree: a pull's head
//! merged with its base (two parents), and a merge-queue batch (the base plus the queued pulls
//! merged one after another, squashed into one commit whose only parent is the base, so landing
//! it is a fast-forward). Commits get the date of the newest commit they merge, so the same
//! inputs always make the same commit id: a pull run and a pre-flight of the same merge share
//! their checks, and a batch retried with the same pulls is the same commit.

use std::path::Path;

use super::client::Git;
use anyhow::bail;

/// What merging one commit into another gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// The merged tree.
    Tree(String),
    /// The files that conflict.
    Conflict(Vec<String>),
}

/// A batch: its commit, the pulls in it, and the pulls left out because they conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The squashed commit (its parent is the base), `None` when no pull merged.
    pub commit: Option<String>,
    /// The pulls in it, in queue order.
    pub pulls: Vec<u64>,
    /// The pulls that conflict with the base plus the pulls before them, and the files.
    pub conflicts: Vec<(u64, Vec<String>)>,
}

async fn run_git(mirror: &Path, args: &[&str], envs: &[(&str, &str)]) -> anyhow::Result<std::process::Output> {
    Git::in_folder(mirror).output_with(args, envs).await
}

/// `git merge-tree --write-tree ours theirs`.
pub async fn merge_tree(mirror: &Path, ours: &str, theirs: &str) -> anyhow::Result<Merged> {
    let output =
        run_git(mirror, &["merge-tree", "--write-tree", "--name-only", "--no-messages", ours, theirs], &[]).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = stdout.lines();
    let tree = lines.next().unwrap_or("").trim().to_string();
    if output.status.code() == Some(1) {
        return Ok(Merged::Conflict(lines.filter(|line| !line.is_empty()).map(str::to_string).collect()));
    }
    if !output.status.success() || tree.is_empty() {
        bail!("git merge-tree failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(Merged::Tree(tree))
}

/// The newest committer date (Unix seconds) of `commits`.
async fn newest_date(mirror: &Path, commits: &[&str]) -> anyhow::Result<String> {
    let mut args = vec!["show", "-s", "--format=%ct"];
    args.extend(commits);
    let output = run_git(mirror, &args, &[]).await?;
    if !output.status.success() {
        bail!("cannot read commit dates: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    let newest = String::from_utf8_lossy(&output.stdout).lines().filter_map(|l| l.trim().parse::<u64>().ok()).max();
    Ok(format!("{} +0000", newest.unwrap_or(0)))
}

/// `git commit-tree`, authored by knotless-run at the newest date of its parents (and `extra`).
pub async fn commit_tree(
    mirror: &Path,
    tree: &str,
    parents: &[&str],
    extra: &[&str],
    message: &str,
) -> anyhow::Result<String> {
    let dated: Vec<&str> = parents.iter().chain(extra).copied().collect();
    let date = newest_date(mirror, &dated).await?;
    let mut args = vec!["commit-tree", tree];
    for parent in parents {
        args.extend(["-p", parent]);
    }
    args.extend(["-m", message]);
    let who = "knotless-run";
    let mail = "knotless-run@localhost";
    let envs = [
        ("GIT_AUTHOR_NAME", who),
        ("GIT_AUTHOR_EMAIL", mail),
        ("GIT_COMMITTER_NAME", who),
        ("GIT_COMMITTER_EMAIL", mail),
        ("GIT_AUTHOR_DATE", date.as_str()),
        ("GIT_COMMITTER_DATE", date.as_str()),
    ];
    let output = run_git(mirror, &args, &envs).await?;
    if !output.status.success() {
        bail!("cannot make a commit: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The batch of `pulls` (number, head) on `base`: each head merged in turn into what the ones
/// before it made; a head that conflicts is left out; the result is squashed onto the base.
pub async fn make_batch(mirror: &Path, branch: &str, base: &str, pulls: &[(u64, String)]) -> anyhow::Result<Batch> {
    let mut current = base.to_string();
    let mut batch = Batch { commit: None, pulls: Vec::new(), conflicts: Vec::new() };
    let mut heads: Vec<&str> = Vec::new();
    for (number, head) in pulls {
        match merge_tree(mirror, &current, head).await? {
            Merged::Conflict(files) => batch.conflicts.push((*number, files)),
            Merged::Tree(tree) => {
                let message = format!("knotless: batch step, pull {number}");
                current = commit_tree(mirror, &tree, &[&current, head], &[], &message).await?;
                batch.pulls.push(*number);
                heads.push(head);
            }
        }
    }
    if batch.pulls.is_empty() {
        return Ok(batch);
    }
    let tree =
        String::from_utf8_lossy(&run_git(mirror, &["rev-parse", &format!("{current}^{{tree}}")], &[]).await?.stdout)
            .trim()
            .to_string();
    let listed: Vec<String> = batch.pulls.iter().map(|number| format!("#{number}")).collect();
    let mut message = format!("knotless: merge queue batch of {} into {branch}\n\n", listed.join(", "));
    for (number, head) in pulls.iter().filter(|(n, _)| batch.pulls.contains(n)) {
        message.push_str(&format!("pull {number}: {head}\n"));
    }
    batch.commit = Some(commit_tree(mirror, &tree, &[base], &heads, &message).await?);
    Ok(batch)
}
