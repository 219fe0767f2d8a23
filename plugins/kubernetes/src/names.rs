//! Names and labels: Kubernetes object names and label values made from runner ids and
//! session ids, which may hold characters Kubernetes refuses.

/// The label every object of a runner carries; its value is [`label_value`] of the runner id.
pub const RUNNER_LABEL: &str = "dev.knotless.runner";
/// The label of one run's objects; its value is [`label_value`] of the session id.
pub const RUN_LABEL: &str = "dev.knotless.run";
/// Annotation: the raw runner id.
pub const RUNNER_ANNOTATION: &str = "dev.knotless.runner-id";
/// Annotation: the raw session id.
pub const SESSION_ANNOTATION: &str = "dev.knotless.session";
/// Annotation: the check key of the run.
pub const CHECK_KEY_ANNOTATION: &str = "dev.knotless.check-key";
/// Annotation: the token of the executor process that made the object
/// ([`knotless_protocol::owner`]), which the orphan sweep tests before it takes anything.
pub const OWNER_ANNOTATION: &str = "dev.knotless.owner";

/// FNV-1a, 64 bits: a stable short hash with no dependency.
pub fn hash(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// A valid label value for any text: the text itself when it is one (at most 63 of
/// `[A-Za-z0-9._-]`, starting and ending alphanumeric), else a cleaned prefix and a hash.
pub fn label_value(text: &str) -> String {
    let valid = !text.is_empty()
        && text.len() <= 63
        && text.chars().all(|char| char.is_ascii_alphanumeric() || matches!(char, '-' | '_' | '.'))
        && text.starts_with(|char: char| char.is_ascii_alphanumeric())
        && text.ends_with(|char: char| char.is_ascii_alphanumeric());
    if valid {
        return text.to_string();
    }
    let cleaned: String = text
        .chars()
        .map(|char| if char.is_ascii_alphanumeric() || matches!(char, '-' | '_' | '.') { char } else { '-' })
        .take(40)
        .collect();
    let cleaned = cleaned.trim_matches(|char: char| !char.is_ascii_alphanumeric());
    if cleaned.is_empty() { format!("h{:016x}", hash(text)) } else { format!("{cleaned}-{:016x}", hash(text)) }
}

/// The Job's name for a session: `knotless-<session, cleaned>-<hash of runner and session>`,
/// a DNS label short enough for the pod names the Job controller derives from it.
pub fn job_name(runner_id: &str, session: &str) -> String {
    let cleaned: String = session
        .to_ascii_lowercase()
        .chars()
        .map(|char| if char.is_ascii_alphanumeric() { char } else { '-' })
        .take(30)
        .collect();
    let cleaned = cleaned.trim_matches('-');
    let suffix = format!("{:08x}", hash(&format!("{runner_id}\n{session}")) & 0xffff_ffff);
    if cleaned.is_empty() { format!("knotless-{suffix}") } else { format!("knotless-{cleaned}-{suffix}") }
}

/// A run's NetworkPolicy: the name of its Job (another kind of object, so no clash).
pub fn policy_name(runner_id: &str, session: &str) -> String {
    job_name(runner_id, session)
}

/// The prefix of a service's container in the run's pod.
pub const SERVICE_PREFIX: &str = "service-";

/// The container of the service `name` in the run's pod: `service-NAME`, a DNS label (a long
/// name is cut and given a hash), never the run's own container.
pub fn service_container(name: &str) -> String {
    let whole = format!("{SERVICE_PREFIX}{name}");
    if whole.len() <= 63 {
        return whole;
    }
    let cut: String = name.chars().take(63 - SERVICE_PREFIX.len() - 9).collect();
    format!("{SERVICE_PREFIX}{}-{:08x}", cut.trim_end_matches('-'), hash(name) & 0xffff_ffff)
}

/// Whether a name is a DNS label (namespaces, most object names).
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|char| char.is_ascii_lowercase() || char.is_ascii_digit() || char == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_valid_for_any_text() {
        assert_eq!(label_value("run-1"), "run-1");
        for text in ["", "-x", "a/b", &"x".repeat(80), "é"] {
            let value = label_value(text);
            assert!(value.len() <= 63 && value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
            assert!(value.starts_with(|c: char| c.is_ascii_alphanumeric()), "{value}");
        }
        assert_ne!(label_value("a/b"), label_value("a:b"));
    }

    #[test]
    fn job_names_are_short_dns_labels() {
        for session in ["check-1-a", "Run_42", "", &"y".repeat(100)] {
            let name = job_name("runner", session);
            assert!(is_dns_label(&name) && name.len() <= 52, "{name}");
        }
        assert_ne!(job_name("a", "s"), job_name("b", "s"));
        assert!(is_dns_label(&policy_name("r", "s")));
    }

    #[test]
    fn service_containers_are_dns_labels_apart_from_the_run_container() {
        assert_eq!(service_container("db"), "service-db");
        let long = format!("a{}", "-b".repeat(31));
        let other = format!("a{}c", "-b".repeat(30));
        for name in ["run", "db", long.as_str(), other.as_str(), &"x".repeat(63)] {
            let container = service_container(name);
            assert!(is_dns_label(&container) && container != "run", "{container}");
        }
        assert_ne!(service_container(&long), service_container(&other));
    }
}
