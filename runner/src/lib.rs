//! knotless-run: the CI runner of the knotless forge and the host of its executors.
//!
//! The runner knows executors only through the protocol (`knotless-protocol`); it never calls
//! `kubectl` or `docker` itself and speaks to no cluster.

// No function over 80 lines (the threshold is clippy.toml's): a longer one is split into
// steps with names.
#![warn(clippy::too_many_lines)]

/// `println!` that never panics: when stdout is closed (a pager quit, a pipe's reader died)
/// the line is dropped and the runner goes on.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics: a closed stderr drops the line.
#[macro_export]
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod cache;
pub mod checkout;
pub mod checks;
pub mod cli;
pub mod daemon;
pub mod engine;
pub mod forge;
pub mod git;
pub mod mask;
pub mod metrics;
pub mod names;
pub mod queue;
pub mod report;
pub mod retention;
pub mod secrets;
pub mod state;
pub mod web;
pub mod workflow;

/// The conformance suite of `plugin check`, a crate of its own, which executors' own tests run
/// through the test kit.
pub use knotless_conformance as conformance;
/// The executor host, a crate of its own so that executors' tests can use it without the runner.
pub use knotless_host as host;
/// Text made safe for a terminal (it lives with the host, whose messages use it too).
pub use knotless_host::printable;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// The top-level modules of `src/` and the others each one names through `crate::`.
    fn uses() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut texts: BTreeMap<String, String> = BTreeMap::new();
        for entry in std::fs::read_dir(&src).expect("src").flatten() {
            let path = entry.path();
            let name = path.file_stem().expect("name").to_string_lossy().into_owned();
            if name == "lib" || name == "main" {
                continue;
            }
            let text = texts.entry(name).or_default();
            let mut files: Vec<PathBuf> = vec![path];
            while let Some(file) = files.pop() {
                if file.is_dir() {
                    files.extend(std::fs::read_dir(&file).expect("folder").flatten().map(|entry| entry.path()));
                } else if file.extension().is_some_and(|ext| ext == "rs") {
                    text.push_str(&std::fs::read_to_string(&file).expect("read"));
                }
            }
        }
        let names: BTreeSet<String> = texts.keys().cloned().collect();
        texts
            .iter()
            .map(|(module, text)| {
                let used = text
                    .split("crate::")
                    .skip(1)
                    .map(|after| after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>())
                    .filter(|used| used != module && names.contains(used))
                    .collect();
                (module.clone(), used)
            })
            .collect()
    }

    /// A cycle through `module`, if there is one: the modules on it, `module` first and last.
    fn cycle_from(module: &str, uses: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        let mut path = vec![module.to_string()];
        let mut next: Vec<Vec<String>> = vec![uses[module].iter().cloned().collect()];
        let mut seen = BTreeSet::new();
        while let Some(choices) = next.last_mut() {
            let Some(step) = choices.pop() else {
                next.pop();
                path.pop();
                continue;
            };
            if step == module {
                path.push(step);
                return Some(path);
            }
            if seen.insert(step.clone()) {
                next.push(uses[&step].iter().cloned().collect());
                path.push(step);
            }
        }
        None
    }

    /// Each binary's version has its section in CHANGELOG.md, under the binary's name: a bump
    /// comes with what it brings.
    #[test]
    fn each_binarys_version_has_its_changelog_section() {
        let changelog = include_str!("../../CHANGELOG.md");
        let packages = [
            include_str!("../Cargo.toml"),
            include_str!("../../plugins/kubernetes/Cargo.toml"),
            include_str!("../../plugins/docker/Cargo.toml"),
            include_str!("../../plugins/shell/Cargo.toml"),
        ];
        for manifest in packages {
            let field = |key: &str| {
                manifest
                    .lines()
                    .find_map(|line| {
                        line.strip_prefix(key)?.trim().strip_prefix('=')?.trim().strip_prefix('"')?.strip_suffix('"')
                    })
                    .map(str::to_string)
            };
            let (name, version) = (field("name").expect("a name"), field("version").expect("a version of its own"));
            let section = changelog.split(&format!("\n## {name}\n")).nth(1).map(|rest| rest.split("\n## ").next());
            let section = section.flatten().unwrap_or_else(|| panic!("CHANGELOG.md has no section ## {name}"));
            assert!(section.contains(&format!("\n### {version}\n")), "CHANGELOG.md's {name} has no ### {version}");
        }
    }

    /// runner/src's top-level modules form a one-way graph, in the order ARCHITECTURE.md gives:
    /// each module names only modules before it there.
    #[test]
    fn modules_form_a_one_way_graph() {
        let uses = uses();
        assert!(uses.len() >= 18, "found {} modules", uses.len());
        let cycles: Vec<String> =
            uses.keys().filter_map(|module| cycle_from(module, &uses)).map(|cycle| cycle.join(" → ")).collect();
        assert!(cycles.is_empty(), "modules that use each other:\n{}", cycles.join("\n"));

        let architecture = include_str!("../../ARCHITECTURE.md");
        let line = architecture
            .lines()
            .find(|line| line.starts_with("The top-level modules of `runner/src/`"))
            .expect("ARCHITECTURE.md gives the order of runner/src's modules");
        let order: Vec<&str> = line.split('`').skip(3).step_by(2).collect();
        let listed: BTreeSet<&str> = order.iter().copied().collect();
        let found: BTreeSet<&str> = uses.keys().map(String::as_str).collect();
        assert_eq!(listed, found, "ARCHITECTURE.md's order names every module once");
        assert_eq!(listed.len(), order.len(), "ARCHITECTURE.md's order names a module twice");
        for (at, module) in order.iter().enumerate() {
            let later: Vec<&String> =
                uses[*module].iter().filter(|used| !order[..at].contains(&used.as_str())).collect();
            assert!(later.is_empty(), "{module} uses {later:?}, which ARCHITECTURE.md orders after it");
        }
    }
}
