//! Values as the pages show them: durations, times, sizes, short commits, trust levels. Plain
//! text only; the templates escape it.

use crate::checks::CheckRecord;
use crate::workflow::Event;

/// A duration in milliseconds: `350 ms`, `4.2 s`, `3 min 5 s`, `2 h 4 min`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// A check's duration: when it ran, how long; while it runs, how long so far.
pub fn check_duration(record: &CheckRecord, now_ms: u64) -> String {
    match (record.duration_ms, record.started_at) {
        (Some(ms), _) => duration(ms),
        (None, Some(started)) if !record.status.is_final() => {
            format!("{} so far", duration(now_ms.saturating_sub(started)))
        }
        _ => String::new(),
    }
}

/// Unix milliseconds as a UTC time, `2026-12-01 09:30:05 UTC`.
pub fn time(ms: u64) -> String {
    match i64::try_from(ms).ok().and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok()) {
        Some(at) => at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        None => format!("{ms} ms after 1970"),
    }
}

/// How long before `now_ms` a time was, as people say it: `just now`, `3 minutes ago`,
/// `2 hours ago`, `5 days ago`; a time after `now_ms` (another clock) is `just now`.
pub fn ago(ms: u64, now_ms: u64) -> String {
    let seconds = now_ms.saturating_sub(ms) / 1000;
    let (count, unit) = match seconds {
        0..45 => return "just now".to_string(),
        45..3_600 => (seconds.div_ceil(60).max(1), "minute"),
        3_600..86_400 => (seconds / 3_600, "hour"),
        86_400..2_592_000 => (seconds / 86_400, "day"),
        2_592_000..31_536_000 => (seconds / 2_592_000, "month"),
        _ => (seconds / 31_536_000, "year"),
    };
    format!("{count} {unit}{} ago", if count == 1 { "" } else { "s" })
}

/// A commit's first ten characters.
pub fn short(commit: &str) -> &str {
    commit.get(..10).unwrap_or(commit)
}

/// The trust level of a check: `push`, `pull` or `batch`.
pub fn trust(record: &CheckRecord) -> &'static str {
    match record.target.event {
        Event::Push => "push",
        Event::Manual => "manual",
        Event::Queue => "batch",
        Event::Pull if record.trusted => "push",
        Event::Pull => "pull",
    }
}

/// What a check ran on: `main`, `pull/7`, `batch of main`.
pub fn target(record: &CheckRecord) -> String {
    if let Some(number) = record.target.pull {
        return format!("pull/{number}");
    }
    if record.target.event == Event::Queue {
        return format!("batch of {}", record.target.base.as_deref().unwrap_or("?"));
    }
    record.target.git_ref.trim_start_matches("refs/heads/").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_people_write_them() {
        assert_eq!(duration(350), "350 ms");
        assert_eq!(duration(4_200), "4.2 s");
        assert_eq!(duration(185_000), "3 min 5 s");
        assert_eq!(duration(7_440_000), "2 h 4 min");
        assert_eq!(time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(time(1_798_761_600_000), "2027-01-01 00:00:00 UTC");
        assert_eq!(time(951_782_400_000 + 3_723_000), "2000-02-29 01:02:03 UTC");
        assert_eq!(crate::printable::size(512), "512 B");
        assert_eq!(crate::printable::size(3_500), "3.4 KiB");
        let now = 1_798_761_600_000;
        assert_eq!(ago(now - 10_000, now), "just now");
        assert_eq!(ago(now + 10_000, now), "just now");
        assert_eq!(ago(now - 60_000, now), "1 minute ago");
        assert_eq!(ago(now - 180_000, now), "3 minutes ago");
        assert_eq!(ago(now - 7_200_000, now), "2 hours ago");
        assert_eq!(ago(now - 86_400_000, now), "1 day ago");
        assert_eq!(ago(now - 40 * 86_400_000, now), "1 month ago");
        assert_eq!(ago(now - 800 * 86_400_000, now), "2 years ago");
        assert_eq!(short("0123456789abcdef"), "0123456789");
        assert_eq!(short("abc"), "abc");
    }
}
