//! The merge queue as `knotless-run checks REPO --queue BRANCH` prints it: each queued pull and
//! its state (with the ejection reason), then each batch with its pulls and checks.

use std::fmt::Write as _;

use super::QueueState;
use crate::checks::CheckRecord;

/// A commit as shown: its first ten characters.
fn short(commit: &str) -> String {
    commit.chars().take(10).collect()
}

/// One check of a pull or a batch: its run id, workflow, status and cause.
fn check_line(out: &mut String, checks: &[CheckRecord], run_id: &str) {
    match checks.iter().find(|check| check.run_id == run_id) {
        Some(check) => {
            let cause = check.cause.as_deref().map(|cause| format!(" ({cause})")).unwrap_or_default();
            let _ = writeln!(out, "    check {}  {}  {}{cause}", check.run_id, check.workflow, check.status.as_str());
        }
        None => {
            let _ = writeln!(out, "    check {run_id}  (no record)");
        }
    }
}

/// The queue and its batches' checks, as text.
pub fn render(queue: &QueueState, checks: &[CheckRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "merge queue of {} into {}", queue.repository, queue.branch);
    if queue.entries.is_empty() {
        let _ = writeln!(out, "  (empty)");
    }
    for entry in &queue.entries {
        let reason = entry.reason.as_deref().map(|reason| format!(": {reason}")).unwrap_or_default();
        let batch = entry.batch.as_deref().map(|batch| format!(" (batch {})", short(batch))).unwrap_or_default();
        let _ =
            writeln!(out, "  pull/{} {}  {}{reason}{batch}", entry.number, short(&entry.head), entry.state.as_str());
        for run_id in &entry.preflights {
            check_line(&mut out, checks, run_id);
        }
    }
    for batch in &queue.batches {
        let pulls: Vec<String> = batch.pulls.iter().map(|number| format!("pull/{number}")).collect();
        let cause = batch.cause.as_deref().map(|cause| format!(": {cause}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "batch {} on {} of {}  {}{cause}",
            short(&batch.commit),
            short(&batch.base),
            pulls.join(", "),
            batch.status
        );
        for run_id in &batch.runs {
            check_line(&mut out, checks, run_id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{BatchRecord, Entry, EntryState};

    #[test]
    fn entries_show_their_state_and_reason_and_batches_their_pulls() {
        let queue = QueueState {
            repository: "/srv/demo".into(),
            branch: "main".into(),
            entries: vec![Entry {
                number: 3,
                head: "0123456789abcdef".into(),
                state: EntryState::Ejected,
                reason: Some("pre-flight lint failed".into()),
                preflights: vec!["lint-1".into()],
                batch: None,
                queued_at: 1,
                dequeued: false,
                retry: false,
            }],
            batches: vec![BatchRecord {
                commit: "fedcba9876543210".into(),
                base: "aaaaaaaaaaaa".into(),
                pulls: vec![3, 4],
                status: crate::queue::BatchStatus::Failed,
                runs: vec!["test-2".into()],
                cause: Some("batch test failed".into()),
            }],
        };
        let text = render(&queue, &[]);
        assert!(text.contains("pull/3 0123456789  ejected: pre-flight lint failed"), "{text}");
        assert!(text.contains("batch fedcba9876 on aaaaaaaaaa of pull/3, pull/4  failed: batch test failed"), "{text}");
        assert!(text.contains("check lint-1  (no record)"), "{text}");
    }

    #[test]
    fn an_empty_queue_says_so() {
        let queue = QueueState { repository: "/srv/demo".into(), branch: "main".into(), ..QueueState::default() };
        let text = render(&queue, &[]);
        assert_eq!(text, "merge queue of /srv/demo into main\n  (empty)\n");
    }
}
