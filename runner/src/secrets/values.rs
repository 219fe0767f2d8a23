//! What the runner makes of a run's secret values before the run: what is masked (each value,
//! and each line of a multi-line value), which values are too short to mask without masking
//! ordinary text, and whether a step's environment could hold them at all.

use std::collections::BTreeMap;

/// The fewest characters a line of a multi-line secret needs to be masked on its own; a
/// whole secret shorter than this is masked, with a warning.
pub const SHORTEST_MASKED: usize = 4;

/// The most bytes one environment string (`NAME=value` and its terminating NUL) may take:
/// Linux's `MAX_ARG_STRLEN`. A longer one makes `execve` fail with `E2BIG`.
pub const MAX_ENV_STRING: usize = 131_072;

/// The most bytes a step's environment may take in all (each string, its NUL and its
/// pointer), on a typical Linux system: a quarter of the usual 8 MiB stack limit, which
/// bounds a program's arguments and environment together (`ARG_MAX`).
pub const MAX_ENV_TOTAL: usize = 2 << 20;

/// The values the masker is built with: each secret whole and, as GitHub Actions registers a
/// multi-line secret, each of its lines (without a trailing `\r`) of at least
/// [`SHORTEST_MASKED`] characters, so that a line of a key printed on its own is masked too.
pub fn masked<'a>(values: impl IntoIterator<Item = &'a String>) -> Vec<&'a str> {
    let mut masked = Vec::new();
    for value in values {
        masked.push(value.as_str());
        if !value.contains('\n') {
            continue;
        }
        let lines = value.split('\n').map(|line| line.strip_suffix('\r').unwrap_or(line));
        masked.extend(lines.filter(|line| line.chars().count() >= SHORTEST_MASKED));
    }
    masked
}

/// The names of the secrets whose values are too short to mask safely: masking one masks
/// every occurrence of its characters, wherever they are. An empty value masks nothing and is
/// not named.
pub fn too_short(secrets: &BTreeMap<String, String>) -> Vec<&str> {
    secrets
        .iter()
        .filter(|(_, value)| (1..SHORTEST_MASKED).contains(&value.chars().count()))
        .map(|(name, _)| name.as_str())
        .collect()
}

/// The warning about secret `name`, too short to mask safely; it names the secret, never its
/// value.
pub fn too_short_warning(name: &str) -> String {
    format!(
        "warning: secret {name} is shorter than {SHORTEST_MASKED} characters: masking it masks every occurrence of \
         those characters in the log"
    )
}

/// Why `step` could not start with `env` and `secrets` in its environment, if it could not: a
/// secret whose `NAME=value` passes [`MAX_ENV_STRING`], or, all together, an environment
/// passing [`MAX_ENV_TOTAL`]. It names the secrets, never their values.
pub fn environment_refusal(
    step: &str,
    env: &BTreeMap<String, String>,
    secrets: &BTreeMap<String, String>,
) -> Option<String> {
    // `NAME=value`, its NUL, and for the whole environment its pointer.
    let string = |name: &str, value: &str| name.len() + 1 + value.len() + 1;
    if let Some((name, value)) = secrets.iter().find(|(name, value)| string(name, value) > MAX_ENV_STRING) {
        return Some(format!(
            "secret {name} is {} bytes: step {step} could not start with it in its environment, where {name}=value \
             may take at most {} bytes (Linux's MAX_ARG_STRLEN, {MAX_ENV_STRING} bytes with its NUL; past it every \
             program fails with E2BIG, Argument list too long): pass it as a file instead",
            value.len(),
            MAX_ENV_STRING - 1
        ));
    }
    let pointer = std::mem::size_of::<usize>();
    let total: usize = env
        .iter()
        .filter(|(name, _)| !secrets.contains_key(*name))
        .chain(secrets)
        .map(|(name, value)| string(name, value) + pointer)
        .sum();
    if secrets.is_empty() || total <= MAX_ENV_TOTAL {
        return None;
    }
    let mut largest: Vec<_> = secrets.iter().collect();
    largest.sort_by_key(|(name, value)| std::cmp::Reverse(string(name, value)));
    let names: Vec<_> = largest.iter().take(3).map(|(name, value)| format!("{name}, {} bytes", value.len())).collect();
    Some(format!(
        "step {step}'s environment would take at least {total} bytes with its secrets ({}), over the {MAX_ENV_TOTAL} \
         bytes a program's arguments and environment may take together on a typical Linux system (ARG_MAX, a \
         quarter of the 8 MiB stack limit; past it every program fails with E2BIG, Argument list too long): pass \
         the largest secrets as files instead",
        names.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::Masker;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
    }

    fn mask(values: &[&str], text: &str) -> String {
        let values: Vec<String> = values.iter().map(|value| value.to_string()).collect();
        let masker = Masker::new(masked(&values)).expect("a masker");
        String::from_utf8(masker.mask(text.as_bytes())).expect("UTF-8")
    }

    #[test]
    fn each_line_of_a_multi_line_secret_is_masked_as_well_as_the_whole() {
        let key = "-----BEGIN KEY-----\r\nMIIEvQIBADANBg\r\nab\r\nxyz\n-----END KEY-----";
        assert_eq!(mask(&[key], &format!("whole: {key}.")), "whole: ***.");
        assert_eq!(mask(&[key], "a line: MIIEvQIBADANBg, and its \\r stays\r\n"), "a line: ***, and its \\r stays\r\n");
        assert_eq!(mask(&[key], "-----BEGIN KEY----- then -----END KEY-----"), "*** then ***");
        // Lines shorter than four characters are not masked on their own.
        assert_eq!(mask(&[key], "ab xyz abc"), "ab xyz abc");
        // A secret of one line is masked whole, and nothing of it alone.
        assert_eq!(mask(&["hunter22"], "hunter22 hunter"), "*** hunter");
    }

    #[test]
    fn secrets_too_short_to_mask_are_named_and_the_warning_never_shows_a_value() {
        let secrets = map(&[("PIN", "123"), ("TOKEN", "s3cr3t-t0ken"), ("EMPTY", ""), ("FOUR", "abcd"), ("E", "é")]);
        assert_eq!(too_short(&secrets), ["E", "PIN"]);
        let warning = too_short_warning("PIN");
        assert_eq!(
            warning,
            "warning: secret PIN is shorter than 4 characters: masking it masks every occurrence of those characters \
             in the log"
        );
        assert!(!warning.contains("123"), "{warning}");
    }

    #[test]
    fn a_secret_too_large_for_one_environment_string_is_named_with_the_bound() {
        let env = map(&[("CI", "true")]);
        // `BIG=` and its NUL take 5 bytes: the largest value that fits is 131067 bytes.
        let fits = map(&[("BIG", &"x".repeat(MAX_ENV_STRING - 5))]);
        assert_eq!(environment_refusal("deploy", &env, &fits), None);
        let over = map(&[("BIG", &"x".repeat(MAX_ENV_STRING - 4))]);
        let refusal = environment_refusal("deploy", &env, &over).expect("a refusal");
        assert!(refusal.starts_with("secret BIG is 131068 bytes: step deploy could not start"), "{refusal}");
        assert!(refusal.contains("at most 131071 bytes") && refusal.contains("E2BIG"), "{refusal}");
        assert!(!refusal.contains("xxxx"), "{refusal}");
    }

    #[test]
    fn secrets_that_fill_the_whole_environment_are_named_with_the_bound() {
        let part = "x".repeat(MAX_ENV_STRING - 100);
        let env = map(&[("CI", "true")]);
        let names: Vec<String> = (0..17).map(|index| format!("PART_{index:02}")).collect();
        let fits = names[..15].iter().map(|name| (name.clone(), part.clone())).collect();
        assert_eq!(environment_refusal("deploy", &env, &fits), None);
        let over = names.iter().map(|name| (name.clone(), part.clone())).collect();
        let refusal = environment_refusal("deploy", &env, &over).expect("a refusal");
        assert!(refusal.starts_with("step deploy's environment would take at least "), "{refusal}");
        assert!(refusal.contains("(PART_00, 130972 bytes; PART_01, 130972 bytes; PART_02, 130972 bytes)"), "{refusal}");
        assert!(refusal.contains("over the 2097152 bytes"), "{refusal}");
    }
}
