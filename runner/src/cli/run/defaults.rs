//! `run`'s defaults files: `~/.config/knotless/run.toml` (the user's) and the repository's
//! `.knotless/run.toml`. The repository's wins over the user's, but for the executor: a
//! repository may choose one only where the user chose none, so that it can never lower the
//! isolation the user asked for. Flags win over both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::printable;

/// One defaults file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// `--executor`.
    executor: Option<String>,
    /// `--image`.
    image: Option<String>,
    /// Variables for every step, under `--env-file` and `--env`.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// `--outputs` (the user's file only).
    outputs: Option<PathBuf>,
    /// `--jobs`.
    jobs: Option<usize>,
    /// `--plugin-dir` (the user's file only).
    #[serde(rename = "plugin-dir")]
    plugin_dir: Option<PathBuf>,
    /// `false`: no warning that an executor isolates nothing (the user's file only).
    #[serde(rename = "isolation-warning")]
    isolation_warning: Option<bool>,
}

/// The defaults `run` starts from.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Defaults {
    /// The executor's name.
    pub executor: Option<String>,
    /// The default image.
    pub image: Option<String>,
    /// Variables for every step, each with the file that gave it.
    pub env: BTreeMap<String, (String, PathBuf)>,
    /// Where outputs go.
    pub outputs: Option<PathBuf>,
    /// How many workflows run at once.
    pub jobs: Option<usize>,
    /// Where executors are looked for.
    pub plugin_dir: Option<PathBuf>,
    /// Whether `run` warns that an executor isolates nothing (default: yes).
    pub isolation_warning: Option<bool>,
    /// Which file chose the executor: the user's or the repository's.
    pub executor_from: Option<PathBuf>,
    /// What the files asked for that was not taken, and why.
    pub notes: Vec<String>,
}

/// The largest defaults file read.
const MAX_BYTES: u64 = 64 << 10;

/// The user's defaults file: `$XDG_CONFIG_HOME/knotless/run.toml`, or under `~/.config`.
pub fn user_file() -> Option<PathBuf> {
    let config =
        std::env::var_os("XDG_CONFIG_HOME").filter(|dir| !dir.is_empty()).map(PathBuf::from).or_else(|| {
            std::env::var_os("HOME").filter(|home| !home.is_empty()).map(|home| PathBuf::from(home).join(".config"))
        })?;
    Some(config.join("knotless").join("run.toml"))
}

/// Reads the user's file alone (when there is one).
pub fn load_user(user: Option<&Path>) -> anyhow::Result<Defaults> {
    let mut defaults = Defaults::default();
    if let Some(path) = user {
        apply(&mut defaults, path, false)?;
    }
    Ok(defaults)
}

/// Reads the user's file (when there is one) and then the repository's, each optional.
pub fn load(user: Option<&Path>, repository_root: &Path) -> anyhow::Result<Defaults> {
    let mut defaults = Defaults::default();
    if let Some(path) = user {
        apply(&mut defaults, path, false)?;
    }
    apply(&mut defaults, &repository_root.join(".knotless").join("run.toml"), true)?;
    Ok(defaults)
}

/// Reads the file at `path` into `defaults`, over what they hold (nothing when there is no
/// file); a repository's file (`from_repository`) may not change what is the user's to choose.
fn apply(defaults: &mut Defaults, path: &Path, from_repository: bool) -> anyhow::Result<()> {
    let shown = printable::name(&path.display().to_string()).into_owned();
    let Some(file) = read(path, &shown, from_repository)? else { return Ok(()) };
    let key = |name: &str, what: &dyn std::fmt::Display| anyhow::anyhow!("{shown}: {name}: {what}");
    if let Some(executor) = file.executor {
        let plain = !executor.is_empty() && executor.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !plain {
            return Err(key(
                "executor",
                &format!("{:?} is not an executor name (letters, digits, - and _)", printable::name(&executor)),
            ));
        }
        match (&defaults.executor, &defaults.executor_from) {
            // The user chose: a repository cannot change it, least of all to less isolation.
            (Some(chosen), Some(by)) if from_repository && *chosen != executor => defaults.notes.push(format!(
                "{shown} asks for executor {executor}; {} chose {chosen}, which stands (--executor {executor} runs it there)",
                printable::name(&by.display().to_string())
            )),
            _ => {
                defaults.executor = Some(executor);
                defaults.executor_from = Some(path.to_path_buf());
            }
        }
    }
    if let Some(image) = file.image {
        if image.trim().is_empty() {
            return Err(key("image", &"is empty"));
        }
        defaults.image = Some(image);
    }
    for (name, value) in file.env {
        super::check_variable_name(&name).map_err(|error| key(&format!("env.{}", printable::name(&name)), &error))?;
        defaults.env.insert(name, (value, path.to_path_buf()));
    }
    if let Some(outputs) = file.outputs {
        if from_repository {
            // Each run empties its outputs folders: a repository must not choose which.
            bail!("{shown}: outputs: only your own ~/.config/knotless/run.toml or --outputs may say where outputs go");
        }
        if !outputs.is_absolute() {
            return Err(key("outputs", &"must be an absolute path"));
        }
        defaults.outputs = Some(outputs);
    }
    for (name, given) in
        [("plugin-dir", file.plugin_dir.is_some()), ("isolation-warning", file.isolation_warning.is_some())]
    {
        if given && from_repository {
            bail!("{shown}: {name}: only your own ~/.config/knotless/run.toml may set it");
        }
    }
    if let Some(dir) = file.plugin_dir {
        if !dir.is_absolute() {
            return Err(key("plugin-dir", &"must be an absolute path"));
        }
        defaults.plugin_dir = Some(dir);
    }
    if let Some(warn) = file.isolation_warning {
        defaults.isolation_warning = Some(warn);
    }
    if let Some(jobs) = file.jobs {
        if jobs == 0 {
            return Err(key("jobs", &"must be at least 1"));
        }
        defaults.jobs = Some(jobs);
    }
    Ok(())
}

/// The file at `path`, parsed, or `None` when there is none; an error names the file, and the
/// line and column where it does not parse.
fn read(path: &Path, shown: &str, from_repository: bool) -> anyhow::Result<Option<File>> {
    // A repository's file is its own regular file: a link could point anywhere (a FIFO that
    // never ends, `/dev/zero`, a credentials file whose values an error would quote).
    let metadata = if from_repository { std::fs::symlink_metadata(path) } else { std::fs::metadata(path) };
    match metadata {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error).with_context(|| format!("cannot read {shown}")),
        Ok(metadata) if metadata.is_symlink() => bail!("{shown}: a link; a repository's run.toml must be a file"),
        Ok(metadata) if !metadata.is_file() => bail!("{shown}: not a regular file"),
        Ok(metadata) if metadata.len() > MAX_BYTES => bail!("{shown}: {} bytes, over {MAX_BYTES}", metadata.len()),
        Ok(_) => {}
    }
    let mut text = String::new();
    let file = std::fs::File::open(path).with_context(|| format!("cannot read {shown}"))?;
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_BYTES + 1), &mut text)
        .with_context(|| format!("cannot read {shown} as UTF-8 text"))?;
    if text.len() as u64 > MAX_BYTES {
        bail!("{shown}: over {MAX_BYTES} bytes");
    }
    let file: File = toml::from_str(&text).map_err(|error| {
        let place = match error.span() {
            Some(span) => {
                let (line, column) = line_column(&text, span.start);
                format!("{shown}, line {line}, column {column}")
            }
            None => shown.to_string(),
        };
        anyhow::anyhow!("{place}: {}", printable::name(error.message()))
    })?;
    Ok(Some(file))
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn the_repository_file_wins_over_the_user_file_and_env_merges() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = write(
            dir.path(),
            "user/run.toml",
            "executor = \"docker\"\nimage = \"debian:12\"\njobs = 3\noutputs = \"/tmp/out\"\n[env]\nA = \"user\"\nB = \"user\"\n",
        );
        write(dir.path(), "repo/.knotless/run.toml", "image = \"rust:1\"\n[env]\nB = \"repo\"\n");
        let defaults = load(Some(&user), &dir.path().join("repo")).expect("load");
        assert_eq!(defaults.executor.as_deref(), Some("docker"));
        assert_eq!(defaults.image.as_deref(), Some("rust:1"));
        assert_eq!(defaults.jobs, Some(3));
        assert_eq!(defaults.outputs, Some(PathBuf::from("/tmp/out")));
        assert_eq!(defaults.env["A"].0, "user");
        assert_eq!(defaults.env["B"].0, "repo");
    }

    #[test]
    fn a_repository_never_changes_the_executor_the_user_chose() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = write(dir.path(), "user/run.toml", "executor = \"docker\"\n");
        write(dir.path(), "repo/.knotless/run.toml", "executor = \"shell\"\n");
        let defaults = load(Some(&user), &dir.path().join("repo")).expect("load");
        assert_eq!(defaults.executor.as_deref(), Some("docker"), "the user's isolation stands");
        assert_eq!(defaults.notes.len(), 1, "{:?}", defaults.notes);
        assert!(
            defaults.notes[0].contains("run.toml asks for executor shell;")
                && defaults.notes[0].contains("chose docker, which stands (--executor shell runs it there)"),
            "{:?}",
            defaults.notes
        );
        // Where the user chose none, the repository's is taken (more isolation, or the same).
        let defaults = load(Some(&dir.path().join("none.toml")), &dir.path().join("repo")).expect("load");
        assert_eq!(defaults.executor.as_deref(), Some("shell"));
        assert!(defaults.notes.is_empty());
        write(dir.path(), "repo/.knotless/run.toml", "executor = \"docker\"\n");
        let defaults = load(Some(&user), &dir.path().join("repo")).expect("load");
        assert_eq!(defaults.executor.as_deref(), Some("docker"));
        assert!(defaults.notes.is_empty(), "the same choice: {:?}", defaults.notes);
    }

    #[test]
    fn the_plugin_folder_and_the_isolation_warning_are_the_users_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = write(dir.path(), "user/run.toml", "plugin-dir = \"/opt/knotless\"\nisolation-warning = false\n");
        let defaults = load(Some(&user), &dir.path().join("repo")).expect("load");
        assert_eq!(defaults.plugin_dir, Some(PathBuf::from("/opt/knotless")));
        assert_eq!(defaults.isolation_warning, Some(false));
        for text in ["plugin-dir = \"/tmp/evil\"\n", "isolation-warning = false\n"] {
            write(dir.path(), "repo/.knotless/run.toml", text);
            let error = format!("{:#}", load(None, &dir.path().join("repo")).expect_err(text));
            assert!(error.contains("only your own ~/.config/knotless/run.toml may set it"), "{error}");
        }
        let relative = write(dir.path(), "user/run.toml", "plugin-dir = \"lib\"\n");
        let error = format!("{:#}", load(Some(&relative), &dir.path().join("none")).expect_err("relative"));
        assert!(error.contains("plugin-dir: must be an absolute path"), "{error}");
    }

    #[test]
    fn no_file_is_no_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let defaults = load(Some(&dir.path().join("none.toml")), dir.path()).expect("load");
        assert_eq!(defaults, Defaults::default());
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = [
            ("executor = \"docker\"\nimgae = \"x\"\n", "line 2, column 1", "imgae"),
            ("jobs = \"four\"\n", "line 1, column 8", "string"),
            ("jobs = 0\n", "jobs", "at least 1"),
            ("executor = \"../bin/evil\"\n", "executor", "not an executor name"),
            ("[env]\nCI = \"x\"\n", "env.CI", "set by the run"),
            ("[env]\n\"A B\" = \"x\"\n", "env.A B", "not a variable name"),
            ("outputs = \"relative\"\n", "outputs", "absolute"),
            ("executor = \n", "line 1", ""),
        ];
        for (text, place, what) in cases {
            let path = write(dir.path(), "user.toml", text);
            let error = format!("{:#}", load(Some(&path), &dir.path().join("repo")).expect_err(text));
            assert!(error.contains(&path.display().to_string()), "{text:?}: {error}");
            assert!(error.contains(place) && error.contains(what), "{text:?}: {error}");
        }
    }

    #[test]
    fn a_repository_may_not_say_where_outputs_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), ".knotless/run.toml", "outputs = \"/home\"\n");
        let error = format!("{:#}", load(None, dir.path()).expect_err("refused"));
        assert!(error.contains(".knotless/run.toml: outputs: only your own"), "{error}");
    }

    #[test]
    fn a_repository_file_that_is_a_link_a_fifo_or_huge_is_refused_unread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(".knotless/run.toml");
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        let secret = write(dir.path(), "credentials", "token = 12345\n");
        std::os::unix::fs::symlink(&secret, &file).expect("symlink");
        let error = format!("{:#}", load(None, dir.path()).expect_err("a link"));
        assert!(error.contains("a link") && !error.contains("12345"), "{error}");
        std::fs::remove_file(&file).expect("rm");
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).expect("mkfifo");
        let error = format!("{:#}", load(None, dir.path()).expect_err("a FIFO"));
        assert!(error.contains("not a regular file"), "{error}");
        std::fs::remove_file(&file).expect("rm");
        std::fs::write(&file, "#".repeat(70 << 10)).expect("write");
        let error = format!("{:#}", load(None, dir.path()).expect_err("huge"));
        assert!(error.contains("over 65536"), "{error}");
        // The user's own file may be a link (to a dotfiles folder), but not to a device.
        let user = dir.path().join("user.toml");
        std::os::unix::fs::symlink(&secret, &user).expect("symlink");
        std::fs::remove_file(&file).expect("rm");
        let error = format!("{:#}", load(Some(&user), dir.path()).expect_err("not a run.toml"));
        assert!(error.contains("unknown field `token`"), "{error}");
        std::fs::remove_file(&user).expect("rm");
        std::os::unix::fs::symlink("/dev/zero", &user).expect("symlink");
        let error = format!("{:#}", load(Some(&user), dir.path()).expect_err("a device"));
        assert!(error.contains("not a regular file"), "{error}");
    }

    #[test]
    fn a_hostile_file_name_or_key_is_shown_escaped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), "a\u{1b}[31m\nb.toml", "\"x\u{1b}[2J\" = 1\n");
        let error = format!("{:#}", load(Some(&path), dir.path()).expect_err("refused"));
        assert!(!error.contains('\u{1b}') && !error.contains('\n'), "{error:?}");
    }
}
