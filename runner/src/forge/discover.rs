//! `--discover DIR`: the git repositories under a folder whose repository record, a file on
//! their default branch, names this runner.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The repository record, read from the default branch only.
pub const RECORD_FILE: &str = ".knotless/repository.yml";

/// `.knotless/repository.yml`: who runs this repository's workflows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryRecord {
    /// The ids of the runners named by the repository.
    #[serde(default)]
    pub runners: Vec<String>,
    /// The ids of the named runners that may push (land the merge queue).
    #[serde(default)]
    pub pushers: Vec<String>,
}

impl RepositoryRecord {
    /// Reads a record's text.
    pub fn parse(text: &str) -> anyhow::Result<RepositoryRecord> {
        let record: Option<RepositoryRecord> = serde_saphyr::from_str(text)
            .map_err(|error| anyhow::anyhow!("{RECORD_FILE} is not a repository record: {error}"))?;
        Ok(record.unwrap_or_default())
    }

    /// The merge-queue lander: the first named runner that may push, else the first named
    /// runner; `None` when no runner is named. It is chosen whether or not it is running.
    pub fn lander(&self) -> Option<&str> {
        self.runners
            .iter()
            .find(|runner| self.pushers.contains(runner))
            .or_else(|| self.runners.first())
            .map(String::as_str)
    }

    /// Whether it names `runner_id`.
    pub fn names(&self, runner_id: &str) -> bool {
        self.runners.iter().any(|runner| runner == runner_id)
    }
}

/// Whether `path` is a git repository (a work tree's root or a bare repository).
pub fn is_git_repository(path: &Path) -> bool {
    path.join(".git").exists() || (path.join("HEAD").is_file() && path.join("objects").is_dir())
}

/// The git repositories directly under `dir` or one folder deeper (`owner/name`), sorted.
pub fn candidates(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let children = |dir: &Path| -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.is_dir())
            .collect();
        paths.sort();
        paths
    };
    for child in children(dir) {
        if is_git_repository(&child) {
            found.push(child);
        } else {
            found.extend(children(&child).into_iter().filter(|grandchild| is_git_repository(grandchild)));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_runners() {
        let record = RepositoryRecord::parse("runners: [alpha, beta]\n").expect("record");
        assert!(record.names("beta") && !record.names("gamma"));
        assert!(RepositoryRecord::parse("").expect("empty").runners.is_empty());
        assert!(RepositoryRecord::parse("runner: [x]\n").is_err());
        assert_eq!(record.lander(), Some("alpha"));
        let pushing = RepositoryRecord::parse("runners: [a, b, c]\npushers: [c, b]\n").expect("record");
        assert_eq!(pushing.lander(), Some("b"));
        assert_eq!(RepositoryRecord::default().lander(), None);
    }
}
