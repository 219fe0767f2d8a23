//! Executor options named as the operator gave them: an executor names an option as a flag
//! (`--foo`), but only the runner knows whether it came from its own flag or from
//! `--executor-option foo=...`, so the runner renames it in the executor's messages.

use std::collections::BTreeMap;

/// How `--executor-option KEY=VALUE` is named in messages.
pub fn executor_option_flag(key: &str) -> String {
    format!("--executor-option {key}=...")
}

/// `message` with each `--KEY` of an option in `given` named as `given` says (its flag as the
/// operator wrote it). A `--KEY` that goes on (`--KEY-more`, `--KEYs`) or that ends a longer
/// word (`a--KEY`) is another flag and stays.
pub fn as_given(message: &str, given: &BTreeMap<String, String>) -> String {
    let flag_char = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
    let mut named = String::with_capacity(message.len());
    // `message[..copied]` is in `named`; the search goes on from `from`.
    let (mut copied, mut from) = (0, 0);
    while let Some(offset) = message[from..].find("--") {
        let at = from + offset;
        let after = &message[at + 2..];
        let starts_word = message[..at].chars().next_back().is_none_or(|c| !flag_char(c));
        let whole = given
            .iter()
            .filter(|(key, _)| {
                !key.is_empty()
                    && after.starts_with(key.as_str())
                    && after[key.len()..].chars().next().is_none_or(|c| !flag_char(c))
            })
            .max_by_key(|(key, _)| key.len());
        match whole {
            Some((key, flag)) if starts_word => {
                named.push_str(&message[copied..at]);
                named.push_str(flag);
                copied = at + 2 + key.len();
                from = copied;
            }
            _ => from = at + 2,
        }
    }
    named.push_str(&message[copied..]);
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(message: &str, options: &[&str], expected: &str) {
        let given = options.iter().map(|key| (key.to_string(), executor_option_flag(key))).collect();
        assert_eq!(as_given(message, &given), expected, "{message}");
    }

    #[test]
    fn an_option_given_with_executor_option_is_named_so() {
        check(
            "unknown option --foo for the shell executor",
            &["foo"],
            "unknown option --executor-option foo=... for the shell executor",
        );
        check("--work-dir: not absolute; --foo", &["work-dir"], "--executor-option work-dir=...: not absolute; --foo");
        check("--foo, --foo.", &["foo"], "--executor-option foo=..., --executor-option foo=....");
        // The longest key that is whole wins.
        check("--a-b x", &["a", "a-b"], "--executor-option a-b=... x");
    }

    #[test]
    fn other_flags_and_words_stay() {
        // Given by its own flag: named --foo by the executor already.
        check("unknown option --image", &[], "unknown option --image");
        check("--foobar --foo-x a--foo ---foo", &["foo"], "--foobar --foo-x a--foo ---foo");
        check("foo -- foo --", &["foo"], "foo -- foo --");
        check("", &["foo"], "");
        check("ünï --ü ü", &["ü"], "ünï --executor-option ü=... ü");
    }
}
