//! The operator's secrets file (`--secrets-file`): `NAME=value` lines (blank lines and `#`
//! comments ignored) or a YAML mapping, readable by its owner only.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, bail};

/// Reads the operator's file of granted values.
pub fn read_operator_file(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    super::check_private(path, "--secrets-file")?;
    let text = std::fs::read_to_string(path).with_context(|| format!("--secrets-file {}", path.display()))?;
    parse(&text).with_context(|| format!("--secrets-file {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let meaningful: Vec<&str> =
        text.lines().filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#')).collect();
    let looks_like_lines = meaningful
        .iter()
        .all(|line| line.split_once('=').is_some_and(|(name, _)| !name.is_empty() && name.chars().all(is_name_char)));
    let mut values = BTreeMap::new();
    if looks_like_lines {
        for line in meaningful {
            if let Some((name, value)) = line.split_once('=') {
                values.insert(name.to_string(), value.to_string());
            }
        }
        return Ok(values);
    }
    let parsed: Option<BTreeMap<String, String>> =
        serde_saphyr::from_str(text).context("neither NAME=value lines nor a YAML mapping of names to values")?;
    for name in parsed.iter().flat_map(|map| map.keys()) {
        if name.is_empty() || !name.chars().all(is_name_char) {
            bail!("{name:?} is not a secret name (letters, digits and '_')");
        }
    }
    values.extend(parsed.unwrap_or_default());
    Ok(values)
}

fn is_name_char(char: char) -> bool {
    char.is_ascii_alphanumeric() || char == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_yaml_both_read() {
        let lines = parse("# comment\nTOKEN=a=b\n\nOTHER=\n").expect("lines");
        assert_eq!(lines.get("TOKEN").map(String::as_str), Some("a=b"));
        assert_eq!(lines.get("OTHER").map(String::as_str), Some(""));
        let yaml = parse("TOKEN: value\n").expect("yaml");
        assert_eq!(yaml.get("TOKEN").map(String::as_str), Some("value"));
    }

    #[test]
    fn a_readable_file_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secrets");
        std::fs::write(&path, "A=1\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let error = read_operator_file(&path).expect_err("refused").to_string();
        assert!(error.contains("--secrets-file") && error.contains("0600"), "{error}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(read_operator_file(&path).expect("read").len(), 1);
    }
}
