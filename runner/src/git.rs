//! The one place the runner runs `git`: the forge's mirrors, the merge queue's batches,
//! `run`'s checkouts of a local repository, and the command line's lookups all go through
//! [`Git`]. Every command is `git -C FOLDER ARGS...` (or `git ARGS...` where no repository is
//! involved), its stdin closed unless the caller pipes it.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use anyhow::{Context, bail};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

/// `git`, in one repository's folder or in none.
#[derive(Debug, Clone)]
pub struct Git {
    folder: Option<PathBuf>,
}

impl Git {
    /// `git -C folder`.
    pub fn in_folder(folder: &Path) -> Git {
        Git { folder: Some(folder.to_path_buf()) }
    }

    /// `git` outside any repository (`clone`, `check-ref-format`).
    pub fn outside() -> Git {
        Git { folder: None }
    }

    /// What it says in errors: `in FOLDER`, or nothing.
    fn place(&self) -> String {
        self.folder.as_ref().map(|folder| format!(" in {}", folder.display())).unwrap_or_default()
    }

    /// The command, for a caller that streams its stdin or stdout (`archive`).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("git");
        if let Some(folder) = &self.folder {
            command.arg("-C").arg(folder);
        }
        // A caller that gives up on it stops it.
        command.args(args).stdin(Stdio::null()).kill_on_drop(true);
        command
    }

    /// Runs it to its end with `envs` added; its output whatever its exit status, for a
    /// caller that reads the status itself (`merge-tree` exits 1 on a conflict).
    pub async fn output_with(&self, args: &[&str], envs: &[(&str, &str)]) -> anyhow::Result<Output> {
        let mut command = self.command(args);
        command.envs(envs.iter().copied());
        command.output().await.with_context(|| format!("cannot run git {}{}", first(args), self.place()))
    }

    /// Runs it; its stdout, or an error naming the command and holding its stderr.
    pub async fn run(&self, args: &[&str]) -> anyhow::Result<Vec<u8>> {
        let output = self.output_with(args, &[]).await?;
        self.success(args, output)
    }

    /// Like [`Git::run`], but stopped past `limit`, with every process it started (an `ssh`,
    /// a remote helper): it runs in a process group of its own, killed whole.
    pub async fn run_within(&self, args: &[&str], limit: std::time::Duration) -> anyhow::Result<Vec<u8>> {
        let mut command = self.command(args);
        command.process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = command.spawn().with_context(|| format!("cannot run git {}{}", first(args), self.place()))?;
        // Killed whole when the limit passes, or when the caller gives up on it (a stopping
        // runner drops the fetches still running).
        let mut group = Group(child.id().and_then(|pid| i32::try_from(pid).ok()).map(nix::unistd::Pid::from_raw));
        match tokio::time::timeout(limit, child.wait_with_output()).await {
            Ok(output) => {
                group.0 = None;
                let output = output.with_context(|| format!("cannot run git {}{}", first(args), self.place()))?;
                self.success(args, output)
            }
            Err(_) => {
                drop(group);
                bail!("git {}{} gave no answer within {} s: stopped", first(args), self.place(), limit.as_secs())
            }
        }
    }

    /// Like [`Git::run`], its stdout as text, trimmed.
    pub async fn line(&self, args: &[&str]) -> anyhow::Result<String> {
        Ok(String::from_utf8_lossy(&self.run(args).await?).trim().to_string())
    }

    /// Like [`Git::run`], its stdout as text.
    pub async fn text(&self, args: &[&str]) -> anyhow::Result<String> {
        Ok(String::from_utf8_lossy(&self.run(args).await?).into_owned())
    }

    /// Runs it with `input` on its stdin (`hash-object --stdin`).
    pub async fn run_with_input(&self, args: &[&str], input: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run git {}{}", first(args), self.place()))?;
        let mut stdin = child.stdin.take().context("git has no stdin")?;
        // Written beside the wait, so that a git that answers before reading cannot block it.
        let write = async move {
            let written = stdin.write_all(input).await;
            drop(stdin);
            written
        };
        let (written, output) = tokio::join!(write, child.wait_with_output());
        let output = output.with_context(|| format!("cannot run git {}{}", first(args), self.place()))?;
        written.with_context(|| format!("cannot write to git {}", first(args)))?;
        self.success(args, output)
    }

    /// Whether it exits 0 (`check-ref-format`, `rev-parse --verify`); its output is dropped.
    pub async fn succeeds(&self, args: &[&str]) -> bool {
        let mut command = self.command(args);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        command.status().await.is_ok_and(|status| status.success())
    }

    fn success(&self, args: &[&str], output: Output) -> anyhow::Result<Vec<u8>> {
        if !output.status.success() {
            bail!("git {}{} failed: {}", args.join(" "), self.place(), String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(output.stdout)
    }
}

/// A process group that is killed when dropped, unless its leader was waited for.
struct Group(Option<nix::unistd::Pid>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

fn first<'a>(args: &[&'a str]) -> &'a str {
    args.first().copied().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_command_names_itself_its_folder_and_what_git_said() {
        let folder = tempfile::tempdir().expect("tempdir");
        let error = Git::in_folder(folder.path()).run(&["rev-parse", "HEAD"]).await.expect_err("not a repository");
        let message = format!("{error:#}");
        assert!(message.contains("git rev-parse HEAD in "), "{message}");
        assert!(message.contains(&folder.path().display().to_string()), "{message}");
        assert!(message.contains("not a git repository"), "{message}");
    }

    #[tokio::test]
    async fn input_reaches_git_and_its_answer_comes_back() {
        let folder = tempfile::tempdir().expect("tempdir");
        let git = Git::in_folder(folder.path());
        git.run(&["init", "--quiet"]).await.expect("init");
        let blob = git.run_with_input(&["hash-object", "-w", "--stdin"], b"hello\n").await.expect("hash-object");
        let id = String::from_utf8_lossy(&blob).trim().to_string();
        assert_eq!(id, "ce013625030ba8dba906f756967f9e9ca394464a");
        assert_eq!(git.text(&["cat-file", "blob", &id]).await.expect("cat-file"), "hello\n");
        assert!(Git::outside().succeeds(&["check-ref-format", "--branch", "main"]).await);
        assert!(!Git::outside().succeeds(&["check-ref-format", "--branch", "a..b"]).await);
    }

    /// Every module of the runner but this one reaches git through [`Git`].
    #[test]
    fn no_other_module_starts_git() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut folders = vec![src];
        let mut read = 0;
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).expect("src").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") && !path.ends_with("src/git.rs") {
                    let text = std::fs::read_to_string(&path).expect("read");
                    // Spelled in pieces, so that this test does not find itself.
                    let spawning = ["Command::new(", "\"git\")"].concat();
                    assert!(!text.contains(&spawning), "{} starts git itself", path.display());
                    read += 1;
                }
            }
        }
        assert!(read >= 40, "read {read} modules");
    }
}
