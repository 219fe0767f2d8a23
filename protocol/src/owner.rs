//! Owners: who made a resource, and whether that process still lives, so that a sweep takes
//! only what is provably dead.
//!
//! A process that makes resources (a session folder, a container, a Job, a cache layer) takes
//! an [`Owner`] once: a lock file it holds with `flock` for its whole life, which the kernel
//! releases when the process ends, however it ends (`kill -9` included). Every resource it
//! makes carries the owner's [`Owner::token`] (a label, an annotation, a file beside it). A
//! sweep asks [`liveness`] of a resource's token and removes the resource only when the answer
//! is [`Liveness::Dead`]: the lock file is gone, or nobody holds it.
//!
//! The lock files live in one folder a user ([`owners_dir`]): `$XDG_RUNTIME_DIR/knotless-owners`
//! when that is set, else `knotless-owners-<uid>` in the temporary folder. That folder holds a
//! `realm` file, a random id made once, and the token names it: `<realm>:<lock file path>`.
//! A sweep that cannot read the same realm at that path (another machine, another container
//! with its own `/tmp`, another user) cannot tell, and says [`Liveness::Unknown`]: the resource
//! is left for its owner, or for a sweep that can tell. So two runners, whatever their cache or
//! temporary folders, never take each other's live resources.

use std::fs::File;
use std::io::{ErrorKind, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The name of the file holding a folder's realm.
const REALM: &str = "realm";

/// The extension of the lock files.
const LOCK: &str = "lock";

/// What a sweep knows of a resource's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The owner holds its lock: the resource is in use.
    Alive,
    /// The owner is gone: its lock file is missing, or nobody holds it.
    Dead,
    /// This process cannot tell (another machine or filesystem, a token of another shape, a
    /// lock file it may not open): the resource is not swept.
    Unknown,
}

/// This process's lock: held until it is dropped or the process ends.
pub struct Owner {
    token: String,
    path: PathBuf,
    _lock: Flock<File>,
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Owner").field("token", &self.token).finish()
    }
}

impl Owner {
    /// Takes a fresh lock in [`owners_dir`].
    pub fn acquire() -> std::io::Result<Owner> {
        Owner::acquire_in(&owners_dir())
    }

    /// Takes a fresh lock in `dir`, made (mode 0700) if missing; a folder owned by another
    /// user, or a link, is refused. Lock files nobody holds any more are removed on the way.
    pub fn acquire_in(dir: &Path) -> std::io::Result<Owner> {
        let realm = realm_of(dir, true)?;
        sweep_dead_locks(dir);
        let instance = random_hex(8)?;
        let path = dir.join(format!("{instance}.{LOCK}"));
        // Made under another name and locked before it is given its own, so that no sweep
        // of the folder ever finds it unlocked.
        let making = dir.join(format!(".{instance}.making"));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&making)?;
        let lock =
            Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| std::io::Error::from(errno))?;
        if let Err(error) = std::fs::rename(&making, &path) {
            let _ = std::fs::remove_file(&making);
            return Err(error);
        }
        let token = format!("{realm}:{}", path.display());
        Ok(Owner { token, path, _lock: lock })
    }

    /// The token that names this owner on its resources: `<realm>:<lock file path>`.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `token` is this owner's.
    pub fn is(&self, token: &str) -> bool {
        self.token == token
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Removed while still locked: a sweep finding it gone knows the owner is.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// This process's owner, taken in [`owners_dir`] at the first call and held until the process
/// ends (its lock file is then removed by the next sweep or [`Owner::acquire`] that finds it).
pub fn this_process() -> std::io::Result<&'static Owner> {
    static OWNER: std::sync::OnceLock<Owner> = std::sync::OnceLock::new();
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if let Some(owner) = OWNER.get() {
        return Ok(owner);
    }
    let _making = MAKING.lock().unwrap_or_else(|poison| poison.into_inner());
    if let Some(owner) = OWNER.get() {
        return Ok(owner);
    }
    let owner = Owner::acquire()?;
    Ok(OWNER.get_or_init(|| owner))
}

/// The folder of the lock files: `$XDG_RUNTIME_DIR/knotless-owners` when that variable names
/// an absolute folder, else `knotless-owners-<uid>` in the temporary folder.
pub fn owners_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(runtime) if runtime.is_absolute() && runtime.is_dir() => runtime.join("knotless-owners"),
        _ => std::env::temp_dir().join(format!("knotless-owners-{}", nix::unistd::getuid())),
    }
}

/// Whether the owner named by `token` lives (see the module's documentation). Never blocks.
pub fn liveness(token: &str) -> Liveness {
    let Some((realm, path)) = token.split_once(':') else { return Liveness::Unknown };
    let path = Path::new(path);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|name| name.to_str())) else {
        return Liveness::Unknown;
    };
    let well_formed = path.is_absolute()
        && path.components().all(|component| matches!(component, Component::RootDir | Component::Normal(_)))
        && name.strip_suffix(&format!(".{LOCK}")).is_some_and(|stem| is_hex(stem) && !stem.is_empty())
        && is_hex(realm)
        && !realm.is_empty();
    if !well_formed {
        return Liveness::Unknown;
    }
    match realm_of(dir, false) {
        Ok(found) if found == realm => {}
        _ => return Liveness::Unknown,
    }
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NOFOLLOW).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::NotFound => return Liveness::Dead,
        Err(_) => return Liveness::Unknown,
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(_unlocked_on_drop) => {
            // Nobody holds it, and nobody ever will again: a lock file is taken once.
            let _ = std::fs::remove_file(path);
            Liveness::Dead
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Liveness::Alive,
        Err(_) => Liveness::Unknown,
    }
}

/// The realm of `dir`: read, or, with `make`, made with the folder when missing. A folder that
/// is a link, or not this user's, or open to others, is refused.
fn realm_of(dir: &Path, make: bool) -> std::io::Result<String> {
    if make {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
            Err(error) => return Err(error),
        }
    }
    let metadata = std::fs::symlink_metadata(dir)?;
    if !metadata.is_dir() || metadata.uid() != nix::unistd::getuid().as_raw() || metadata.mode() & 0o077 != 0 {
        return Err(std::io::Error::new(
            ErrorKind::PermissionDenied,
            format!("{} is not a private folder of this user", dir.display()),
        ));
    }
    let file = dir.join(REALM);
    match read_realm(&file) {
        Ok(realm) => return Ok(realm),
        Err(error) if error.kind() == ErrorKind::NotFound && make => {}
        Err(error) => return Err(error),
    }
    // Written whole under another name, then linked into place: a process that loses the race
    // reads the winner's.
    let realm = random_hex(8)?;
    let making = dir.join(format!(".{REALM}.{}", random_hex(8)?));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&making)
        .and_then(|mut making| making.write_all(realm.as_bytes()));
    let linked = written.and_then(|()| std::fs::hard_link(&making, &file));
    let _ = std::fs::remove_file(&making);
    match linked {
        Ok(()) => Ok(realm),
        Err(error) if error.kind() == ErrorKind::AlreadyExists => read_realm(&file),
        Err(error) => Err(error),
    }
}

fn read_realm(file: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NOFOLLOW).open(file)?.read_to_string(&mut text)?;
    let realm = text.trim();
    if realm.is_empty() || !is_hex(realm) {
        return Err(std::io::Error::new(ErrorKind::InvalidData, format!("{} holds no realm", file.display())));
    }
    Ok(realm.to_string())
}

/// Removes the lock files in `dir` that nobody holds.
fn sweep_dead_locks(dir: &Path) {
    let Ok(realm) = realm_of(dir, false) else { return };
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(&format!(".{LOCK}")) {
            // `liveness` removes a dead one.
            let _ = liveness(&format!("{realm}:{}", entry.path().display()));
        }
    }
}

fn is_hex(text: &str) -> bool {
    text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// `bytes` random bytes from the kernel, as hex.
fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buffer = vec![0u8; bytes];
    File::open("/dev/urandom")?.read_exact(&mut buffer)?;
    Ok(buffer.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_alive_while_it_holds_its_lock_and_dead_once_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let owners = dir.path().join("owners");
        let owner = Owner::acquire_in(&owners).expect("owner");
        assert_eq!(liveness(owner.token()), Liveness::Alive);
        let other = Owner::acquire_in(&owners).expect("another");
        assert_ne!(owner.token(), other.token());
        let token = owner.token().to_string();
        drop(owner);
        assert_eq!(liveness(&token), Liveness::Dead);
        assert_eq!(liveness(other.token()), Liveness::Alive);
    }

    #[test]
    fn a_lock_file_nobody_holds_is_dead_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let owners = dir.path().join("owners");
        let owner = Owner::acquire_in(&owners).expect("owner");
        let token = owner.token().to_string();
        // A process killed before it could remove its file: the file stays, unlocked.
        let path = owner.path.clone();
        let kept = dir.path().join("kept");
        std::fs::hard_link(&path, &kept).expect("link");
        drop(owner);
        std::fs::rename(&kept, &path).expect("put back");
        assert!(path.exists());
        assert_eq!(liveness(&token), Liveness::Dead);
        assert!(!path.exists(), "a dead lock file is removed");
    }

    #[test]
    fn a_token_of_another_realm_or_shape_is_unknown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let owners = dir.path().join("owners");
        let owner = Owner::acquire_in(&owners).expect("owner");
        let (_, path) = owner.token().split_once(':').expect("token");
        let elsewhere = format!("0123456789abcdef:{path}");
        assert_eq!(liveness(&elsewhere), Liveness::Unknown, "another machine's /tmp at the same path");
        let missing_dir = format!("{}:/nonexistent/knotless-owners/0011223344556677.lock", "aa");
        assert_eq!(liveness(&missing_dir), Liveness::Unknown);
        for token in
            ["", "no-colon", "aa:relative/x.lock", "aa:/tmp/../etc/passwd", "zz:/tmp/x.lock", "aa:/tmp/x.lock\n"]
        {
            assert_eq!(liveness(token), Liveness::Unknown, "{token:?}");
        }
    }

    #[test]
    fn a_folder_of_another_shape_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = dir.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
        assert!(Owner::acquire_in(&open).is_err(), "a folder others may write is refused");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).expect("symlink");
        assert!(Owner::acquire_in(&link).is_err(), "a link is refused");
    }

    #[test]
    fn a_child_process_holding_the_lock_keeps_its_owner_alive_until_it_dies() {
        use std::io::BufRead as _;
        use std::os::unix::process::CommandExt as _;
        // The owner is another process: flock(1) holds the lock file (its child does not: `-o`)
        // and says so once it does; this process asks, as another process's sweep would.
        let dir = tempfile::tempdir().expect("tempdir");
        let owners = dir.path().join("owners");
        let owner = Owner::acquire_in(&owners).expect("owner");
        let token = owner.token().to_string();
        let path = owner.path.clone();
        drop(owner);
        let mut child = std::process::Command::new("flock")
            .args(["-x", "-o", &path.to_string_lossy(), "sh", "-c", "echo locked; exec sleep 30"])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("flock(1)");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
        assert_eq!(line, "locked\n");
        assert_eq!(liveness(&token), Liveness::Alive);
        let group = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL).expect("kill");
        child.wait().expect("wait");
        assert_eq!(liveness(&token), Liveness::Dead);
    }
}
