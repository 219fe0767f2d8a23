//! The fake's object store: one JSON file in the state folder, read and written under an
//! exclusive `flock`, plus the injected failures of `inject.json` and the call log.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The store's content.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Data {
    /// Every object, as Kubernetes JSON.
    #[serde(default)]
    pub objects: Vec<Value>,
    /// A counter for names and uids.
    #[serde(default)]
    pub seq: u64,
    /// Injections already fired (each mid-step one fires once).
    #[serde(default)]
    pub fired: BTreeSet<String>,
}

/// The locked store.
pub struct Store {
    pub dir: PathBuf,
    pub data: Data,
    _lock: Flock<File>,
}

impl Store {
    /// Locks and reads the store of a state folder.
    pub fn open(dir: &Path) -> anyhow::Result<Store> {
        std::fs::create_dir_all(dir)?;
        let lock = File::create(dir.join("lock")).context("lock file")?;
        let lock =
            Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, errno)| anyhow::anyhow!("flock: {errno}"))?;
        let path = dir.join("store.json");
        let data = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).context("store.json")?,
            Err(_) => Data::default(),
        };
        Ok(Store { dir: dir.to_path_buf(), data, _lock: lock })
    }

    /// Writes the store back (the lock goes with `self`).
    pub fn save(&self) -> anyhow::Result<()> {
        let path = self.dir.join("store.json");
        let temporary = self.dir.join("store.json.tmp");
        std::fs::write(&temporary, serde_json::to_vec_pretty(&self.data)?)?;
        std::fs::rename(temporary, path)?;
        Ok(())
    }

    /// A fresh number.
    pub fn next(&mut self) -> u64 {
        self.data.seq += 1;
        self.data.seq
    }

    /// The index of an object.
    pub fn find(&self, kind: &str, namespace: &str, name: &str) -> Option<usize> {
        self.data.objects.iter().position(|object| {
            kind_of(object) == kind
                && text(object, "/metadata/namespace") == namespace
                && text(object, "/metadata/name") == name
        })
    }
}

/// A string at a JSON pointer, or "".
pub fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// An object's kind.
pub fn kind_of(object: &Value) -> &str {
    text(object, "/kind")
}

/// The failures asked for in `inject.json`: a list of names, or an object whose keys are.
pub fn injected(dir: &Path) -> BTreeSet<String> {
    let Ok(bytes) = std::fs::read(dir.join("inject.json")) else { return BTreeSet::new() };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        Ok(Value::Object(map)) => map.keys().cloned().collect(),
        _ => BTreeSet::new(),
    }
}

/// Appends one call to `calls.jsonl`: argv, environment, and stdin when read.
pub fn log_call(dir: &Path, argv: &[String], stdin: Option<&[u8]>) {
    let env: Vec<String> =
        std::env::vars_os().map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())).collect();
    let line = serde_json::json!({
        "argv": argv,
        "env": env,
        "stdin": stdin.map(|bytes| String::from_utf8_lossy(bytes).into_owned()),
    });
    if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(dir.join("calls.jsonl")) {
        let _ = writeln!(file, "{line}");
    }
}

/// Whether an object's labels match a selector (`k=v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
/// `k notin (a,b)`, comma-separated).
pub fn matches_labels(object: &Value, selector: &str) -> bool {
    let labels = object.pointer("/metadata/labels").and_then(Value::as_object);
    let label = |key: &str| labels.and_then(|labels| labels.get(key)).and_then(Value::as_str);
    split_terms(selector).iter().all(|term| {
        let term = term.trim();
        if let Some((key, values)) = term.split_once(" notin ") {
            return label(key.trim()).is_none_or(|value| !set(values).contains(value));
        }
        if let Some((key, values)) = term.split_once(" in ") {
            return label(key.trim()).is_some_and(|value| set(values).contains(value));
        }
        if let Some((key, value)) = term.split_once("!=") {
            return label(key.trim()) != Some(value.trim());
        }
        if let Some((key, value)) = term.split_once('=') {
            return label(key.trim().trim_end_matches('=')) == Some(value.trim());
        }
        if let Some(key) = term.strip_prefix('!') {
            return label(key).is_none();
        }
        term.is_empty() || label(term).is_some()
    })
}

/// Whether an object matches a field selector of `a.b=c` terms.
pub fn matches_fields(object: &Value, selector: &str) -> bool {
    selector.split(',').filter(|term| !term.is_empty()).all(|term| match term.split_once('=') {
        Some((path, value)) => text(object, &format!("/{}", path.replace('.', "/"))) == value,
        None => false,
    })
}

fn set(values: &str) -> BTreeSet<&str> {
    values.trim().trim_start_matches('(').trim_end_matches(')').split(',').map(str::trim).collect()
}

fn split_terms(selector: &str) -> Vec<String> {
    let (mut terms, mut current, mut depth) = (Vec::new(), String::new(), 0);
    for char in selector.chars() {
        match char {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(char);
    }
    terms.push(current);
    terms
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors() {
        let object = json!({"metadata": {"labels": {"a": "1", "b": "x"}, "name": "n"}});
        assert!(matches_labels(&object, "a=1,b"));
        assert!(matches_labels(&object, "a=1,b notin (y,z)"));
        assert!(!matches_labels(&object, "b notin (x,z)"));
        assert!(matches_labels(&object, "b in (x)"));
        assert!(!matches_labels(&object, "a!=1"));
        assert!(matches_fields(&object, "metadata.name=n"));
    }
}
