//! The variables and secrets `run` and the daemon give steps from files and flags: `NAME=VALUE`
//! pairs, each name checked as a variable name, each file named in its errors.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::printable;
use crate::workflow::check_variable_name;

/// The variables of the defaults files, then `--env-file`, then `--env`, each over the one
/// before, their names checked.
pub(crate) fn step_variables(
    given: &[String],
    file: Option<&std::path::Path>,
    defaults: &BTreeMap<String, (String, PathBuf)>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let check = |name: &str, place: &dyn Fn() -> String| -> anyhow::Result<()> {
        check_variable_name(name).map_err(|error| anyhow::anyhow!("{}: {error}", place()))
    };
    let mut variables: BTreeMap<String, String> =
        defaults.iter().map(|(name, (value, _))| (name.clone(), value.clone())).collect();
    if let Some(file) = file {
        variables.extend(pairs_file(file, "--env-file")?);
    }
    for entry in given {
        let place = || format!("--env {}", printable::name(entry));
        let (name, value) = match entry.split_once('=') {
            Some((name, value)) => (name, value.to_string()),
            None => {
                let value = std::env::var(entry)
                    .with_context(|| format!("{}: the variable {entry} is not set here", place()))?;
                (entry.as_str(), value)
            }
        };
        check(name, &place)?;
        variables.insert(name.to_string(), value);
    }
    Ok(variables)
}

/// The `NAME=VALUE` lines of `file`, given by `flag`: the value taken as it is, blank lines
/// and lines starting with `#` skipped, each name checked.
fn pairs_file(file: &std::path::Path, flag: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let shown = printable::name(&file.display().to_string()).into_owned();
    let text = std::fs::read_to_string(file).with_context(|| format!("{flag} {shown}"))?;
    let mut pairs = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let place = || format!("{flag} {shown}, line {}", index + 1);
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            // Never the line itself: it may hold a secret.
            bail!("{}: expected NAME=VALUE", place());
        };
        check_variable_name(name).map_err(|error| anyhow::anyhow!("{}: {error}", place()))?;
        pairs.insert(name.to_string(), value.to_string());
    }
    Ok(pairs)
}

/// The secrets of `--secret-file FILE`, with a warning when others may read the file.
pub(super) fn secret_file(file: &std::path::Path) -> anyhow::Result<BTreeMap<String, String>> {
    use std::os::unix::fs::PermissionsExt as _;
    let secrets = pairs_file(file, "--secret-file")?;
    if let Ok(metadata) = std::fs::metadata(file)
        && metadata.permissions().mode() & 0o077 != 0
    {
        let shown = printable::name(&file.display().to_string()).into_owned();
        crate::say_err!(
            "warning: --secret-file {shown} may be read by others (mode {:o}): chmod 600 {shown}",
            metadata.permissions().mode() & 0o777
        );
    }
    Ok(secrets)
}
