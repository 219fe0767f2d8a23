//! What a run checks out: the working tree of a folder (git's tracked and untracked files, not
//! the ignored ones) or a commit (`git archive`), as a tar stream, and the workflows it holds.

use std::path::{Path, PathBuf};

use crate::git::Git;
use anyhow::{Context as _, bail};
use tokio::io::AsyncRead;

use crate::workflow::{self, Workflow, WorkflowError};

/// Where a run's files come from.
#[derive(Debug, Clone)]
pub enum Checkout {
    /// A folder as it is now: a git work tree's tracked and untracked files, or every file of
    /// a plain folder.
    WorkingTree {
        /// The folder.
        root: PathBuf,
        /// Whether it is a git work tree.
        git: bool,
    },
    /// A commit of a git repository.
    Revision {
        /// The repository (a work tree or a bare repository).
        repo: PathBuf,
        /// The full commit id.
        commit: String,
    },
}

/// What a checkout is, for the run variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckoutInfo {
    /// The commit id, or `working-tree` for a plain folder.
    pub commit: String,
    /// The ref (`refs/heads/main`), or empty when unknown.
    pub git_ref: String,
    /// A name for the repository: its folder's name.
    pub repository: String,
}

async fn git_line(repo: &Path, args: &[&str]) -> anyhow::Result<String> {
    Git::in_folder(repo).line(args).await
}

impl Checkout {
    /// The repository's folder.
    pub fn root(&self) -> &Path {
        match self {
            Checkout::WorkingTree { root, .. } => root,
            Checkout::Revision { repo, .. } => repo,
        }
    }

    /// The checkout, for messages: its folder, and the commit when it is one.
    pub fn describe(&self) -> String {
        match self {
            Checkout::WorkingTree { root, .. } => root.display().to_string(),
            Checkout::Revision { repo, commit } => format!("{} at {}", repo.display(), &commit[..commit.len().min(12)]),
        }
    }

    /// The checkout of `path` at `rev`, or its working tree when `rev` is `None`. In a git
    /// work tree, `path` may be any folder under the repository: the nearest folder up from
    /// it (to the work tree's root) that holds `.knotless/workflows` is taken, else the root.
    pub async fn resolve(path: &Path, rev: Option<&str>) -> anyhow::Result<(Checkout, CheckoutInfo)> {
        let given = std::fs::canonicalize(path).with_context(|| format!("no folder {}", path.display()))?;
        if !given.is_dir() {
            bail!("{} is not a folder", given.display());
        }
        let git_tree =
            git_line(&given, &["rev-parse", "--is-inside-work-tree"]).await.is_ok_and(|answer| answer == "true");
        // In a subfolder of a repository: the nearest folder up to the work tree's root that
        // holds `.knotless/workflows`, or that root.
        let root = match git_tree {
            true => match git_line(&given, &["rev-parse", "--show-toplevel"]).await {
                Ok(top) if !top.is_empty() => {
                    let top = std::fs::canonicalize(&top).unwrap_or_else(|_| given.clone());
                    given
                        .ancestors()
                        .take_while(|folder| folder.starts_with(&top))
                        .find(|folder| folder.join(".knotless/workflows").is_dir())
                        .map(Path::to_path_buf)
                        .unwrap_or(top)
                }
                _ => given,
            },
            false => given,
        };
        let repository =
            root.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_else(|| "repository".into());
        match rev {
            Some(rev) => {
                let spec = format!("{rev}^{{commit}}");
                // `--quiet` says nothing of why: the message says it, without git's empty words.
                let commit = git_line(&root, &["rev-parse", "--verify", "--quiet", &spec]).await.map_err(|_| {
                    anyhow::anyhow!(
                        "--rev {}: no such commit in {} (a branch, a tag or a commit id it holds)",
                        crate::printable::name(rev),
                        root.display()
                    )
                })?;
                let full_ref = git_line(&root, &["rev-parse", "--symbolic-full-name", rev]).await.unwrap_or_default();
                let info = CheckoutInfo { commit: commit.clone(), git_ref: full_ref, repository };
                Ok((Checkout::Revision { repo: root, commit }, info))
            }
            None => {
                let (commit, git_ref) = if git_tree {
                    let commit =
                        git_line(&root, &["rev-parse", "--verify", "--quiet", "HEAD"]).await.unwrap_or_default();
                    let git_ref = git_line(&root, &["symbolic-ref", "--quiet", "HEAD"]).await.unwrap_or_default();
                    (if commit.is_empty() { "working-tree".to_string() } else { commit }, git_ref)
                } else {
                    ("working-tree".to_string(), String::new())
                };
                Ok((Checkout::WorkingTree { root, git: git_tree }, CheckoutInfo { commit, git_ref, repository }))
            }
        }
    }

    /// A tar stream of the checkout, or of one folder in it (its contents at the archive's
    /// root), made as it is read: never held whole on disk or in memory. What went wrong
    /// before the first byte (a missing folder, git refusing) is an error here; what goes
    /// wrong later ends the stream with an error, never with a clean end.
    pub async fn archive(&self, folder: Option<&str>) -> anyhow::Result<Archive> {
        match self {
            Checkout::WorkingTree { root, git } => {
                let base = match folder {
                    Some(folder) => root.join(folder),
                    None => root.clone(),
                };
                if !base.is_dir() {
                    bail!("no folder {}", base.display());
                }
                let files = if *git { Some(tracked_and_untracked(&base).await?) } else { None };
                // A pipe the packing thread writes with plain blocking writes: closing its write
                // end, however the packing ends, ends the reader's stream.
                let (reader, writer) = archive_pipe().context("cannot make a pipe for the checkout")?;
                let packing = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let writer = std::io::BufWriter::with_capacity(ARCHIVE_PIPE, std::fs::File::from(writer));
                    let mut writer = match files {
                        Some(files) => knotless_protocol::tarball::pack_paths(&base, &files, writer),
                        None => knotless_protocol::tarball::pack_dir(&base, writer),
                    }
                    .with_context(|| format!("cannot pack {}", base.display()))?;
                    std::io::Write::flush(&mut writer)?;
                    Ok(())
                });
                let done = async move { packing.await.context("the packing task ended")? };
                Ok(Archive::new(reader, done))
            }
            Checkout::Revision { repo, commit } => {
                let tree = match folder {
                    Some(folder) => format!("{commit}:{folder}"),
                    None => commit.clone(),
                };
                let mut child = Git::in_folder(repo)
                    .command(&["archive", "--format=tar", &tree])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .with_context(|| format!("cannot run git in {}", repo.display()))?;
                let stdout = child.stdout.take().context("git archive has no stdout")?;
                widen(&stdout);
                let stderr = child.stderr.take().context("git archive has no stderr")?;
                let repo = repo.clone();
                let done = async move {
                    // Its stderr is read beside its stdout, so a chatty git cannot block.
                    let (status, said) = tokio::join!(child.wait(), read_bounded(stderr, 64 << 10));
                    let status = status.with_context(|| format!("cannot wait for git in {}", repo.display()))?;
                    if !status.success() {
                        bail!(
                            "git archive {tree} in {} failed: {}",
                            repo.display(),
                            String::from_utf8_lossy(&said).trim()
                        );
                    }
                    Ok(())
                };
                Ok(Archive::new(stdout, done))
            }
        }
    }

    /// Whether the checkout has `folder` (relative).
    pub async fn has_folder(&self, folder: &str) -> bool {
        match self {
            Checkout::WorkingTree { root, .. } => root.join(folder).is_dir(),
            Checkout::Revision { repo, commit } => {
                let tree = format!("{commit}:{folder}");
                git_line(repo, &["cat-file", "-t", &tree]).await.is_ok_and(|kind| kind == "tree")
            }
        }
    }

    /// The workflows of the checkout, and the errors of those that did not load.
    pub async fn workflows(&self) -> anyhow::Result<(Vec<Workflow>, Vec<WorkflowError>)> {
        match self {
            Checkout::WorkingTree { root, .. } => Ok(workflow::load_dir(root)),
            Checkout::Revision { .. } => {
                let scratch = tempfile::tempdir().context("cannot create a temporary folder")?;
                let folder = ".knotless/workflows";
                if self.has_folder(folder).await {
                    let archive = tokio_util::io::SyncIoBridge::new(self.archive(Some(folder)).await?);
                    let dest = scratch.path().join(folder);
                    tokio::task::spawn_blocking(move || {
                        knotless_protocol::tarball::unpack_vetted(archive, &dest, 64 << 20)
                    })
                    .await?
                    .context("cannot read the workflows of the commit")?;
                }
                Ok(workflow::load_dir(scratch.path()))
            }
        }
    }
}

/// Everything `reader` says until its end, of which the first `bound` bytes are kept.
async fn read_bounded(mut reader: impl AsyncRead + Unpin, bound: usize) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let (mut kept, mut buffer) = (Vec::new(), vec![0; 8 << 10]);
    while let Ok(count @ 1..) = reader.read(&mut buffer).await {
        let room = bound.saturating_sub(kept.len()).min(count);
        kept.extend_from_slice(&buffer[..room]);
    }
    kept
}

/// How many bytes of a working tree's tar stream the packing thread writes at once.
const ARCHIVE_PIPE: usize = 256 << 10;

/// How many bytes of a checkout's tar stream may wait in its pipe (Linux's default limit for
/// an unprivileged process): fewer wake-ups of the maker and the upload than the 64 KiB a
/// pipe starts with.
const PIPE_SIZE: i32 = 1 << 20;

/// Has a pipe hold up to [`PIPE_SIZE`] bytes, if the system allows it (else it keeps its size).
fn widen(pipe: &impl std::os::fd::AsFd) {
    let _ = nix::fcntl::fcntl(pipe, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
}

/// A pipe for a working tree's tar stream: its read end for the upload, its write end for the
/// packing thread.
fn archive_pipe() -> std::io::Result<(tokio::net::unix::pipe::Receiver, std::os::fd::OwnedFd)> {
    let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    widen(&writer);
    Ok((tokio::net::unix::pipe::Receiver::from_owned_fd(reader)?, writer))
}

/// A checkout's tar stream as it is made. It ends cleanly only when its maker (the packing
/// thread, `git archive`) succeeded; otherwise its end is an error, and
/// [`Archive::failure`] says what went wrong, so that a failed pack is never taken for a
/// short checkout, nor blamed on the executor.
pub struct Archive {
    reader: std::pin::Pin<Box<dyn AsyncRead + Send>>,
    done: Option<futures::future::BoxFuture<'static, anyhow::Result<()>>>,
    failure: Option<String>,
}

impl Archive {
    fn new(
        reader: impl AsyncRead + Send + 'static,
        done: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> Archive {
        Archive { reader: Box::pin(reader), done: Some(Box::pin(done)), failure: None }
    }

    /// Why the stream could not be made whole, once it ended with an error.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }
}

impl AsyncRead for Archive {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffer: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let filled = buffer.filled().len();
        let this = &mut *self;
        match this.reader.as_mut().poll_read(context, buffer) {
            Poll::Ready(Ok(())) if buffer.filled().len() == filled => {}
            Poll::Ready(Err(error)) => {
                // The maker's own failure says more than a broken pipe.
                if let Some(Poll::Ready(Err(failure))) = this.done.as_mut().map(|done| done.as_mut().poll(context)) {
                    this.done = None;
                    this.failure = Some(format!("{failure:#}"));
                    return Poll::Ready(Err(std::io::Error::other(format!("{failure:#}"))));
                }
                return Poll::Ready(Err(error));
            }
            other => return other,
        }
        // The end of the stream: clean only if its maker succeeded.
        let Some(done) = this.done.as_mut() else {
            return match &this.failure {
                Some(failure) => Poll::Ready(Err(std::io::Error::other(failure.clone()))),
                None => Poll::Ready(Ok(())),
            };
        };
        match done.as_mut().poll(context) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                this.done = None;
                match result {
                    Ok(()) => Poll::Ready(Ok(())),
                    Err(failure) => {
                        this.failure = Some(format!("{failure:#}"));
                        Poll::Ready(Err(std::io::Error::other(format!("{failure:#}"))))
                    }
                }
            }
        }
    }
}

/// The files git would commit in `base`: tracked and untracked, not ignored, still present.
async fn tracked_and_untracked(base: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let listing =
        Git::in_folder(base).run(&["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."]).await?;
    let mut files: Vec<PathBuf> = listing
        .split(|&byte| byte == 0)
        .filter(|name| !name.is_empty())
        .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
        .filter(|name| std::fs::symlink_metadata(base.join(name)).is_ok_and(|metadata| !metadata.is_dir()))
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;

    use super::*;

    /// How many descriptors of this process are open on `path`.
    fn open_on(path: &Path) -> usize {
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return 0 };
        entries.flatten().filter(|entry| std::fs::read_link(entry.path()).is_ok_and(|target| target == path)).count()
    }

    #[test]
    fn a_working_tree_archive_dropped_unread_ends_its_packing_and_closes_its_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let folder = std::fs::canonicalize(dir.path()).expect("canonical");
        // Larger than the pipe and the packing thread's buffer: the thread waits to write
        // with the file open.
        let big = folder.join("big.bin");
        std::fs::write(&big, vec![7u8; 8 << 20]).expect("write");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let (opened, closed) = runtime.block_on(async {
            let (checkout, _) = Checkout::resolve(&folder, None).await.expect("resolves");
            let mut archive = checkout.archive(None).await.expect("packs");
            let mut header = [0u8; 512];
            archive.read_exact(&mut header).await.expect("the first header");
            let opened = knotless_testkit::eventually(Duration::from_secs(10), || open_on(&big) == 1).await;
            drop(archive);
            (opened, knotless_testkit::eventually(Duration::from_secs(10), || open_on(&big) == 0).await)
        });
        // A packing thread that never ends must fail the test, not hang it.
        runtime.shutdown_timeout(Duration::from_secs(1));
        assert!(opened, "the packing thread has the file open");
        assert!(closed, "the packing thread still holds the file after its archive was dropped");
    }
}
