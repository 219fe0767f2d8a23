//! Secrets: the runner's key pair (`secrets-key.json`), values sealed to it by owners with the
//! age format (x25519 recipients, ASCII armor), the repository's sealed file read from its
//! default branch, and the operator's file of granted values, which takes precedence.

mod operator;
pub mod values;

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::str::FromStr as _;

use age::secrecy::ExposeSecret as _;
use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

pub use operator::read_operator_file;

/// The key file's name in the state folder.
pub const KEY_FILE: &str = "secrets-key.json";
/// Where a repository keeps its sealed values, on its default branch.
pub const SEALED_FILE: &str = ".knotless/secrets.yml";

/// `secrets-key.json`.
#[derive(Serialize, Deserialize)]
struct KeyFile {
    /// The age identity (`AGE-SECRET-KEY-1...`).
    identity: String,
    /// The age recipient (`age1...`): the public key owners seal to.
    recipient: String,
}

/// Whether `<state>/checks` holds anything: the daemon ran checks there.
fn has_checks(state: &Path) -> bool {
    std::fs::read_dir(state.join("checks")).is_ok_and(|mut entries| entries.next().is_some())
}

/// The runner's key pair.
pub struct RunnerKey {
    identity: age::x25519::Identity,
    recipient: age::x25519::Recipient,
}

impl std::fmt::Debug for RunnerKey {
    /// Never prints the identity.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RunnerKey").field("recipient", &self.recipient.to_string()).finish()
    }
}

impl RunnerKey {
    /// Reads `<state>/secrets-key.json`, creating it (mode 0600) when absent from a state
    /// folder that never held a check. One missing where checks were run is refused: every
    /// secret was sealed to the key that went with it, and a new key would silently open none.
    pub fn load_or_create(state: &Path) -> anyhow::Result<RunnerKey> {
        let path = state.join(KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                check_private(&path, "the secrets key")?;
                let file: KeyFile = serde_json::from_slice(&bytes)
                    .with_context(|| format!("{} is not a secrets key file", path.display()))?;
                let identity = age::x25519::Identity::from_str(&file.identity)
                    .map_err(|error| anyhow::anyhow!("{}: bad identity: {error}", path.display()))?;
                let recipient = identity.to_public();
                Ok(RunnerKey { identity, recipient })
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if has_checks(state) {
                    bail!(
                        "{} is missing, but {} holds checks of earlier runs: the repositories' secrets were sealed \
                         to the key it held, and no other key opens them. Put the file back from a backup; or, to \
                         make a new key on purpose, run `knotless-run secrets new-key --state {}` and seal every \
                         secret again to the recipient it prints",
                        path.display(),
                        state.display(),
                        state.display()
                    );
                }
                RunnerKey::create(state, &path)
            }
            Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Makes a new `<state>/secrets-key.json`, on purpose: refused when one is there.
    pub fn create_new(state: &Path) -> anyhow::Result<RunnerKey> {
        let path = state.join(KEY_FILE);
        if std::fs::symlink_metadata(&path).is_ok() {
            bail!("{} exists: a new key is made only where none is (move that one away first)", path.display());
        }
        RunnerKey::create(state, &path)
    }

    fn create(state: &Path, path: &Path) -> anyhow::Result<RunnerKey> {
        std::fs::create_dir_all(state).with_context(|| format!("cannot create {}", state.display()))?;
        let identity = age::x25519::Identity::generate();
        let recipient = identity.to_public();
        let file =
            KeyFile { identity: identity.to_string().expose_secret().to_string(), recipient: recipient.to_string() };
        let bytes = serde_json::to_vec_pretty(&file).context("cannot encode the secrets key")?;
        let temporary = path.with_extension("json.tmp");
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .with_context(|| format!("cannot create {}", temporary.display()))?;
        std::io::Write::write_all(&mut out, &bytes)
            .and_then(|()| out.sync_all())
            .with_context(|| format!("cannot write {}", temporary.display()))?;
        std::fs::rename(&temporary, path).with_context(|| format!("cannot create {}", path.display()))?;
        tracing::info!("created the secrets key {} (recipient {recipient})", path.display());
        Ok(RunnerKey { identity, recipient })
    }

    /// The recipient (public key) owners seal values to: `age1...`.
    pub fn recipient(&self) -> String {
        self.recipient.to_string()
    }

    /// Seals `value` to this runner: armored age text.
    pub fn seal(&self, value: &[u8]) -> anyhow::Result<String> {
        age::encrypt_and_armor(&self.recipient, value).map_err(|error| anyhow::anyhow!("cannot seal: {error}"))
    }

    /// Opens a sealed value.
    pub fn open(&self, sealed: &str) -> anyhow::Result<String> {
        let bytes = age::decrypt(&self.identity, sealed.trim().as_bytes())
            .map_err(|error| anyhow::anyhow!("cannot open: {error}"))?;
        String::from_utf8(bytes).context("the sealed value is not UTF-8")
    }
}

/// Refuses a file that others than its owner may read.
pub fn check_private(path: &Path, what: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let metadata = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!("{what} {} has mode {mode:o}: make it 0600 (chmod 600 {})", path.display(), path.display());
    }
    Ok(())
}

/// The values a repository's sealed file grants: `NAME: <armored age text>` lines of YAML.
/// Values that do not open are left out and named in the second list, with why.
pub fn open_sealed_file(key: &RunnerKey, text: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let mut granted = BTreeMap::new();
    let mut problems = Vec::new();
    let sealed: BTreeMap<String, String> = match serde_saphyr::from_str(text) {
        Ok(Some(map)) => map,
        Ok(None) => BTreeMap::new(),
        Err(error) => {
            problems.push(format!("{SEALED_FILE} is not a mapping of names to sealed values: {error}"));
            return (granted, problems);
        }
    };
    for (name, value) in sealed {
        match key.open(&value) {
            Ok(value) => {
                granted.insert(name, value);
            }
            Err(error) => problems.push(format!("secret {name} in {SEALED_FILE} {error}")),
        }
    }
    (granted, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_lost_where_checks_ran_is_refused_until_a_new_one_is_made_on_purpose() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = RunnerKey::load_or_create(dir.path()).expect("create").recipient();
        std::fs::create_dir_all(dir.path().join("checks/demo-1")).expect("mkdir");
        std::fs::remove_file(dir.path().join(KEY_FILE)).expect("lose the key");
        let refused = format!("{:#}", RunnerKey::load_or_create(dir.path()).expect_err("refused"));
        assert!(refused.contains(&dir.path().join(KEY_FILE).display().to_string()), "{refused}");
        assert!(refused.contains("knotless-run secrets new-key --state"), "{refused}");
        assert!(!dir.path().join(KEY_FILE).exists(), "no key made silently");
        let second = RunnerKey::create_new(dir.path()).expect("a new key on purpose").recipient();
        assert_ne!(first, second);
        assert_eq!(RunnerKey::load_or_create(dir.path()).expect("reload").recipient(), second);
        let again = format!("{:#}", RunnerKey::create_new(dir.path()).expect_err("a key is there"));
        assert!(again.contains("exists"), "{again}");
        assert_eq!(RunnerKey::load_or_create(dir.path()).expect("reload").recipient(), second, "left as it was");
    }

    #[test]
    fn a_key_is_created_private_and_reloaded() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let key = RunnerKey::load_or_create(dir.path()).expect("create");
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).expect("key").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = RunnerKey::load_or_create(dir.path()).expect("reload");
        assert_eq!(key.recipient(), again.recipient());
        let sealed = key.seal(b"hunter2").expect("seal");
        assert!(sealed.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"));
        assert_eq!(again.open(&sealed).expect("open"), "hunter2");
    }

    #[test]
    fn a_sealed_file_grants_what_opens_and_names_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = RunnerKey::load_or_create(dir.path()).expect("create");
        let sealed = key.seal(b"v1").expect("seal");
        let indented: String = sealed.lines().map(|line| format!("  {line}\n")).collect();
        let text = format!("TOKEN: |\n{indented}BROKEN: nonsense\n");
        let (granted, problems) = open_sealed_file(&key, &text);
        assert_eq!(granted.get("TOKEN").map(String::as_str), Some("v1"));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("BROKEN"), "{problems:?}");
    }
}
