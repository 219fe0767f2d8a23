//! Sessions: `start` creates a session's folder, `stop` kills its processes and removes it,
//! `shutdown` stops every session this process started, and session paths are resolved here.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use knotless_protocol::sdk::Context;
use knotless_protocol::*;

use crate::ShellExecutor;
use crate::config::{check_component, create_private_dir_all};
use crate::processes::GRACE;
use crate::reaper::Reaper;

/// The folders of a session, under its root.
pub const FOLDERS: &[&str] = &["work", "steps", "outputs", "home", "tmp"];

/// A session this process started.
pub struct Session {
    /// The session id.
    pub id: String,
    /// `<work-dir>/<runner-id>/<session>`, canonical.
    pub root: PathBuf,
    /// Started with `keep`: `stop` and `shutdown` leave it in place.
    pub keep: bool,
    /// The reapers of steps that left processes running.
    lingering: Mutex<Vec<Reaper>>,
    /// A reaper whose step left nothing, for the next step.
    idle: Mutex<Option<Reaper>>,
    /// Cancelled when the session stops: a step still running is killed as if cancelled.
    pub stopped: tokio_util::sync::CancellationToken,
}

impl Session {
    /// Keeps the reaper of a step whose processes go on running, until the session stops.
    pub fn linger(&self, reaper: Reaper) {
        knotless_protocol::sdk::lock(&self.lingering).push(reaper);
    }

    /// The reaper of a step that left nothing, if there is one, for the next step.
    pub fn take_idle(&self) -> Option<Reaper> {
        knotless_protocol::sdk::lock(&self.idle).take()
    }

    /// Keeps the reaper of a step that left nothing for the next step; ends it when the
    /// session already keeps one, or has stopped.
    pub fn keep_idle(&self, reaper: Reaper) {
        let extra = {
            let mut idle = knotless_protocol::sdk::lock(&self.idle);
            match idle.is_none() && !self.stopped.is_cancelled() {
                true => idle.replace(reaper),
                false => Some(reaper),
            }
        };
        if let Some(extra) = extra {
            tokio::spawn(extra.finish());
        }
    }

    /// Kills every process the session's steps left running, and ends its idle reaper.
    /// Returns the pids it killed.
    pub async fn kill_lingering(&self) -> Vec<i32> {
        if let Some(idle) = self.take_idle() {
            idle.finish().await;
        }
        let reapers = std::mem::take(&mut *knotless_protocol::sdk::lock(&self.lingering));
        let mut killed = Vec::new();
        let mut lost = false;
        for reaper in reapers {
            let ended = reaper.end(GRACE).await;
            if !ended.stuck.is_empty() {
                tracing::warn!(session = %self.id, stuck = ?ended.stuck, "processes outlived SIGKILL");
            }
            killed.extend(ended.killed);
            lost |= ended.lost;
        }
        if lost {
            crate::reaper::kill_orphans().await;
        }
        killed
    }

    /// One of the session's folders ([`FOLDERS`]).
    pub fn folder(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Resolves a path the runner gave (absolute, or relative to the session's root) to a
    /// path inside the session, refusing `..`, paths elsewhere, and paths that a symlink
    /// leads out of the session.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, ExecutorError> {
        let outside = || ExecutorError::configuration(format!("path {path} is outside session {}", self.id));
        let given = Path::new(path);
        if given.components().any(|component| component == Component::ParentDir) {
            return Err(outside());
        }
        let joined = if given.is_absolute() { given.to_path_buf() } else { self.root.join(given) };
        let relative = joined.strip_prefix(&self.root).map_err(|_| outside())?;
        let mut resolved = self.root.clone();
        for component in relative.components() {
            if let Component::Normal(name) = component {
                resolved.push(name);
            }
        }
        // The deepest part that exists must stay inside once symlinks are followed.
        let mut existing = resolved.as_path();
        while std::fs::symlink_metadata(existing).is_err() {
            existing = existing.parent().ok_or_else(outside)?;
        }
        let real = existing.canonicalize().map_err(|error| {
            ExecutorError::infrastructure(format!(
                "cannot resolve {} in session {}: {error}",
                existing.display(),
                self.id
            ))
        })?;
        if !real.starts_with(&self.root) {
            return Err(outside());
        }
        Ok(resolved)
    }
}

/// `start`: creates `<work-dir>/<runner-id>/<session>/` (mode 0700) and its folders.
pub async fn start(
    executor: &ShellExecutor,
    params: StartParams,
    context: Context,
) -> Result<StartResult, ExecutorError> {
    let config = executor.config.get()?;
    check_component("session id", &params.session)?;
    if let Some(image) = &params.image {
        if !executor.image_warned.swap(true, Ordering::SeqCst) {
            tracing::warn!(%image, "the shell executor takes no image: steps run on the host");
        }
        context
            .log(
                &params.session,
                LogLevel::Warn,
                format!("the shell executor ignores the image {image}: steps run on the host"),
            )
            .await;
    }
    if executor.sessions.lock().contains_key(&params.session) {
        return Err(ExecutorError::configuration(format!("session {} is already started", params.session)));
    }
    let runner_dir = config.runner_dir();
    let root = runner_dir.join(&params.session);
    // Its owner is written before the folder is made: no sweep ever finds the folder without it.
    mark_owner(&runner_dir, &params.session)?;
    {
        use std::os::unix::fs::DirBuilderExt;
        // Not recursive: an existing folder is an error, atomically.
        std::fs::DirBuilder::new().mode(0o700).create(&root).map_err(|error| {
            forget_owner(&runner_dir, &params.session);
            match error.kind() {
                std::io::ErrorKind::AlreadyExists => ExecutorError::configuration(format!(
                    "session {} already exists at {}",
                    params.session,
                    root.display()
                )),
                _ => ExecutorError::infrastructure(format!(
                    "cannot create the session folder {}: {error}",
                    root.display()
                )),
            }
        })?;
    }
    if params.keep
        && let Err(error) = knotless_protocol::kept::mark(&config.runner_id, &params.session)
    {
        let _ = std::fs::remove_dir(&root);
        forget_owner(&runner_dir, &params.session);
        return Err(ExecutorError::infrastructure(format!("cannot mark session {} kept: {error}", params.session)));
    }
    let session = Session {
        id: params.session.clone(),
        root,
        keep: params.keep,
        lingering: Mutex::default(),
        idle: Mutex::default(),
        stopped: tokio_util::sync::CancellationToken::new(),
    };
    for name in FOLDERS {
        let folder = session.folder(name);
        if let Err(error) = create_private_dir_all(&folder) {
            let _ = std::fs::remove_dir_all(&session.root);
            forget_owner(&runner_dir, &session.id);
            return Err(ExecutorError::infrastructure(format!("cannot create {}: {error}", folder.display())));
        }
    }
    let paths = SessionPaths {
        work: session.folder("work").to_string_lossy().into_owned(),
        steps: session.folder("steps").to_string_lossy().into_owned(),
        outputs: session.folder("outputs").to_string_lossy().into_owned(),
    };
    if !params.keep {
        // A mark left of an earlier session of this id, which the operator removed by hand.
        knotless_protocol::kept::unmark(&config.runner_id, &params.session);
    }
    let description = format!("folder {}", session.root.display());
    tracing::debug!(session = %session.id, root = %session.root.display(), "session started");
    executor.sessions.lock().insert(session.id.clone(), Arc::new(session));
    Ok(StartResult { paths, description: Some(description) })
}

/// `stop`: kills the session's processes and removes its folder, unless keeping (then the
/// session is marked kept and forgotten, and nothing is removed).
pub async fn stop(executor: &ShellExecutor, params: StopParams, context: Context) -> Result<StopResult, ExecutorError> {
    let session = executor.sessions.get(&params.session)?;
    let keep = params.keep || session.keep;
    if keep {
        let config = executor.config.get()?;
        knotless_protocol::kept::mark(&config.runner_id, &session.id).map_err(|error| {
            ExecutorError::infrastructure(format!("cannot mark session {} kept: {error}", session.id))
        })?;
    }
    executor.sessions.lock().remove(&params.session);
    if keep {
        context.log(&session.id, LogLevel::Info, format!("kept the session folder {}", session.root.display())).await;
        return Ok(StopResult { removed: Vec::new() });
    }
    let removed = remove_session(&session).await?;
    Ok(StopResult { removed })
}

/// `shutdown`: stops every session this process started that is not kept.
pub async fn shutdown(executor: &ShellExecutor) {
    let sessions: Vec<Arc<Session>> = executor.sessions.lock().drain().map(|(_, session)| session).collect();
    for session in sessions {
        if session.keep {
            tracing::info!(session = %session.id, root = %session.root.display(), "keeping the session at shutdown");
            continue;
        }
        match remove_session(&session).await {
            Ok(removed) => {
                tracing::info!(session = %session.id, removed = removed.len(), "stopped the session at shutdown")
            }
            Err(error) => {
                tracing::error!(session = %session.id, "cannot stop the session at shutdown: {error}")
            }
        }
    }
}

/// Kills every process the session's steps left running, then removes its folder. Returns
/// what it removed.
pub async fn remove_session(session: &Session) -> Result<Vec<Resource>, ExecutorError> {
    session.stopped.cancel();
    let killed = session.kill_lingering().await;
    let mut removed: Vec<Resource> = killed
        .iter()
        .map(|pid| Resource { kind: "process".to_string(), name: pid.to_string(), session: Some(session.id.clone()) })
        .collect();
    if !killed.is_empty() {
        tracing::info!(session = %session.id, processes = ?killed, "killed the session's processes");
    }
    let mut folder = remove_folder(&session.id, &session.root).await?;
    removed.append(&mut folder);
    Ok(removed)
}

/// The folder beside the sessions that holds each one's owner: `<runner dir>/.owners/`.
pub const OWNERS: &str = ".owners";

/// The file naming the owner of session `session`.
pub fn owner_file(runner_dir: &Path, session: &str) -> PathBuf {
    runner_dir.join(OWNERS).join(session)
}

/// Writes this process's owner token as the owner of `session`, whole (a temporary file linked
/// into place), unless the session has an owner already.
fn mark_owner(runner_dir: &Path, session: &str) -> Result<(), ExecutorError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let owner = knotless_protocol::owner::this_process().map_err(|error| {
        ExecutorError::infrastructure(format!(
            "cannot take a lock in {} to mark the sessions of this process: {error}",
            knotless_protocol::owner::owners_dir().display()
        ))
    })?;
    let file = owner_file(runner_dir, session);
    let owners = runner_dir.join(OWNERS);
    let making = owners.join(format!(".{session}.{}", std::process::id()));
    let mut written = Ok(());
    // Another process removes the folder when it holds nothing: made again if it went between.
    for _ in 0..3 {
        written = create_private_dir_all(&owners)
            .and_then(|()| {
                std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&making)
            })
            .and_then(|mut making| making.write_all(owner.token().as_bytes()))
            .and_then(|()| std::fs::hard_link(&making, &file));
        let _ = std::fs::remove_file(&making);
        if !matches!(&written, Err(error) if error.kind() == std::io::ErrorKind::NotFound) {
            break;
        }
    }
    written.map_err(|error| match error.kind() {
        std::io::ErrorKind::AlreadyExists => ExecutorError::configuration(format!(
            "session {session} already exists: {} names its owner",
            file.display()
        )),
        _ => ExecutorError::infrastructure(format!("cannot write {}: {error}", file.display())),
    })
}

/// Removes the file naming the owner of `session`, and the folder of owner files when that was
/// its last.
pub fn forget_owner(runner_dir: &Path, session: &str) {
    let _ = std::fs::remove_file(owner_file(runner_dir, session));
    // Fails, harmlessly, while the folder holds another session's owner.
    let _ = std::fs::remove_dir(runner_dir.join(OWNERS));
}

/// The owner token of `session`, if its file holds one.
pub fn read_owner(runner_dir: &Path, session: &str) -> Option<String> {
    std::fs::read_to_string(owner_file(runner_dir, session)).ok()
}

/// Removes a session's folder. Returns it, unless it was not there.
pub async fn remove_folder(session: &str, root: &Path) -> Result<Vec<Resource>, ExecutorError> {
    let mut removed = Vec::new();
    let tree = root.to_path_buf();
    let removal = tokio::task::spawn_blocking(move || remove_tree(&tree))
        .await
        .unwrap_or_else(|error| Err(std::io::Error::other(error.to_string())));
    let gone =
        matches!(&removal, Ok(())) || matches!(&removal, Err(error) if error.kind() == std::io::ErrorKind::NotFound);
    if gone && let Some(runner_dir) = root.parent() {
        forget_owner(runner_dir, session);
    }
    match removal {
        Ok(()) => removed.push(Resource {
            kind: "folder".to_string(),
            name: root.to_string_lossy().into_owned(),
            session: Some(session.to_string()),
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(ExecutorError::infrastructure(format!(
                "cannot remove the session folder {}: {error}",
                root.display()
            )));
        }
    }
    Ok(removed)
}

/// Removes a folder and everything in it, even folders a step made read-only (as Go's module
/// cache is): those are made writable and the removal tried again.
fn remove_tree(root: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(root) {
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
            make_writable(root);
            std::fs::remove_dir_all(root)
        }
        other => other,
    }
}

/// Gives this user write and search rights on every folder under `path` (links not followed).
fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return;
    };
    if !metadata.is_dir() {
        return;
    }
    let mode = metadata.permissions().mode();
    if mode & 0o700 != 0o700 {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o700));
    }
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            make_writable(&entry.path());
        }
    }
}
