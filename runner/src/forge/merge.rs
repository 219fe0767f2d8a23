//! Merges made in a bare mirror with git plumbing, never touching a work tree: a pull's head
//! merged with its base (two parents), and a merge-queue batch (the base plus the queued pulls
//! merged one after another, squashed into one commit whose only parent is the base, so landing
//! it is a fast-forward). Commits get the date of the newest commit they merge, so the same
//! inputs always make the same commit id: a pull run and a pre-flight of the same merge share
//! their checks, and a batch retried with the same pulls is the same commit. A batch of one
//! pull is authored as its head commit (name, email, date) and titled with its subject; a
//! batch of several is the runner's, listing the pulls and crediting their authors with
//! `Co-authored-by:` trailers.

use std::path::Path;

use crate::git::Git;
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

/// The name and email the runner commits as.
const RUNNER_NAME: &str = "knotless-run";
const RUNNER_EMAIL: &str = "knotless-run@localhost";

/// Who wrote a pull's head commit and when, and its subject: the pull's title (the git forge
/// has no other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Author {
    /// The author's name.
    pub name: String,
    /// The author's email.
    pub email: String,
    /// The author date, as git takes it (`<Unix seconds> <offset>`).
    pub date: String,
    /// The head commit's subject.
    pub subject: String,
}

/// The author, author date and subject of `commit`.
pub async fn author_of(mirror: &Path, commit: &str) -> anyhow::Result<Author> {
    let args = ["log", "-1", "--date=raw", "--format=%an%x00%ae%x00%ad%x00%s", commit];
    let output = run_git(mirror, &args, &[]).await?;
    if !output.status.success() {
        bail!("cannot read the author of {commit}: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.trim_end_matches('\n').splitn(4, '\0').map(str::to_string);
    let mut next = || fields.next().unwrap_or_default();
    Ok(Author { name: next(), email: next(), date: next(), subject: next() })
}

/// `git commit-tree`, authored and committed by knotless-run at the newest date of its parents
/// (and `extra`).
pub async fn commit_tree(
    mirror: &Path,
    tree: &str,
    parents: &[&str],
    extra: &[&str],
    message: &str,
) -> anyhow::Result<String> {
    commit_tree_as(mirror, tree, parents, extra, message, None).await
}

/// Like [`commit_tree`], authored by `author` at its date when given (git refuses an empty
/// name or email: such an author is left out).
pub async fn commit_tree_as(
    mirror: &Path,
    tree: &str,
    parents: &[&str],
    extra: &[&str],
    message: &str,
    author: Option<&Author>,
) -> anyhow::Result<String> {
    let dated: Vec<&str> = parents.iter().chain(extra).copied().collect();
    let date = newest_date(mirror, &dated).await?;
    let mut args = vec!["commit-tree", tree];
    for parent in parents {
        args.extend(["-p", parent]);
    }
    args.extend(["-m", message]);
    let author = author.filter(|author| !author.name.trim().is_empty() && !author.email.trim().is_empty());
    let (name, email, author_date) = match author {
        Some(author) => (author.name.as_str(), author.email.as_str(), author.date.as_str()),
        None => (RUNNER_NAME, RUNNER_EMAIL, date.as_str()),
    };
    let envs = [
        ("GIT_AUTHOR_NAME", name),
        ("GIT_AUTHOR_EMAIL", email),
        ("GIT_COMMITTER_NAME", RUNNER_NAME),
        ("GIT_COMMITTER_EMAIL", RUNNER_EMAIL),
        ("GIT_AUTHOR_DATE", author_date),
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
    let mut authors = Vec::new();
    for (number, head) in pulls.iter().filter(|(n, _)| batch.pulls.contains(n)) {
        authors.push((*number, author_of(mirror, head).await?));
    }
    let message = batch_message(branch, &authors);
    let author = match authors.as_slice() {
        [(_, alone)] => Some(alone),
        _ => None,
    };
    batch.commit = Some(commit_tree_as(mirror, &tree, &[base], &heads, &message, author).await?);
    Ok(batch)
}

/// The message of a batch of `pulls` (number, its head's author and subject), in queue order:
/// for one pull, its title and a `Pull: N` trailer (the batch is authored as that pull's
/// head); for several, a list of their titles and one `Co-authored-by:` trailer per distinct
/// author (the runner is the author).
pub fn batch_message(branch: &str, pulls: &[(u64, Author)]) -> String {
    let title = |number: u64, author: &Author| match author.subject.trim() {
        "" => format!("Pull {number}"),
        subject => subject.to_string(),
    };
    if let [(number, author)] = pulls {
        return format!("{}\n\nPull: {number}\n", title(*number, author));
    }
    let listed: Vec<String> = pulls.iter().map(|(number, _)| format!("#{number}")).collect();
    let mut message = format!("Merge queue batch of {} into {branch}\n\n", listed.join(", "));
    for (number, author) in pulls {
        message.push_str(&format!("- #{number}: {}\n", title(*number, author)));
    }
    let mut credited: Vec<String> = Vec::new();
    let mut trailers = String::new();
    for (_, author) in pulls {
        let email = author.email.trim().to_lowercase();
        if author.name.trim().is_empty() || email.is_empty() || email == RUNNER_EMAIL || credited.contains(&email) {
            continue;
        }
        trailers.push_str(&format!("Co-authored-by: {} <{}>\n", author.name.trim(), author.email.trim()));
        credited.push(email);
    }
    if !trailers.is_empty() {
        message.push('\n');
        message.push_str(&trailers);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::{Author, batch_message};

    fn by(name: &str, email: &str, subject: &str) -> Author {
        Author { name: name.into(), email: email.into(), date: "1 +0000".into(), subject: subject.into() }
    }

    #[test]
    fn a_batch_message_names_its_pulls_and_credits_each_author_once() {
        let one = [(7, by("Ada", "ada@example.com", "Add one"))];
        assert_eq!(batch_message("main", &one), "Add one\n\nPull: 7\n");
        let several = [
            (1, by("Ada", "ada@example.com", "Add one")),
            (2, by("Grace", "grace@example.com", "")),
            (3, by("Ada L.", "ADA@example.com", "Add three")),
            (4, by("knotless-run", "knotless-run@localhost", "Made here")),
        ];
        assert_eq!(
            batch_message("main", &several),
            "Merge queue batch of #1, #2, #3, #4 into main\n\n- #1: Add one\n- #2: Pull 2\n- #3: Add three\n\
             - #4: Made here\n\nCo-authored-by: Ada <ada@example.com>\nCo-authored-by: Grace <grace@example.com>\n"
        );
    }
}
