//! Durations as workflows, flags and executors' options write them: `90s`, `10m`, `1h30m`,
//! `500ms`, `90d`. The one reading of a duration with units, for the runner and executors alike.

use std::time::Duration;

/// The hint every duration error ends with.
pub const DURATION_HINT: &str = "expected e.g. 90s, 10m, 1h";

/// Parses a duration made of one or more `<integer><unit>` parts, units `ms`, `s`, `m`, `h` and
/// `d`, largest first (`1h30m`, `2m30s`, `1s500ms`, `1d12h`); `None` when the text is not one.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut rest = text;
    let mut total = Duration::ZERO;
    // Each unit may appear once, in decreasing order: rank 5 = d, 4 = h ... 1 = ms.
    let mut last_rank = u8::MAX;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_millis, rank, unit_len) = if rest.starts_with("ms") {
            (1, 1, 2)
        } else if rest.starts_with('s') {
            (1_000, 2, 1)
        } else if rest.starts_with('m') {
            (60_000, 3, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 4, 1)
        } else if rest.starts_with('d') {
            (86_400_000, 5, 1)
        } else {
            return None;
        };
        if rank >= last_rank {
            return None;
        }
        last_rank = rank;
        rest = &rest[unit_len..];
        let millis = number.checked_mul(unit_millis)?;
        total = total.checked_add(Duration::from_millis(millis))?;
    }
    Some(total)
}

/// Formats a duration the way a workflow would write it (`1h30m`, `90ms`, `0s`).
pub fn format_duration(duration: Duration) -> String {
    let mut millis = duration.as_millis();
    if millis == 0 {
        return "0s".to_string();
    }
    let mut text = String::new();
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if millis >= size {
            text.push_str(&format!("{}{unit}", millis / size));
            millis %= size;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Option<u64>) {
        assert_eq!(parse_duration(text).map(|d| d.as_millis() as u64), expected, "{text:?}");
    }

    #[test]
    fn parses_durations() {
        check("90s", Some(90_000));
        check("10m", Some(600_000));
        check("1h", Some(3_600_000));
        check("1h30m", Some(5_400_000));
        check("500ms", Some(500));
        check("1m30s", Some(90_000));
        check("1s500ms", Some(1_500));
        check("1h2m3s4ms", Some(3_723_004));
        check("90d", Some(90 * 86_400_000));
        check("1d12h", Some(36 * 3_600_000));
        check("12h1d", None);
        check("0s", Some(0));
        check("", None);
        check("10", None);
        check("10 minutes", None);
        check("10min", None);
        check("1.5h", None);
        check("-1s", None);
        check("30m1h", None);
        check("1m1m", None);
        check(" 10m", None);
        check("10M", None);
        check("99999999999999999999h", None);
    }

    #[test]
    fn formats_durations() {
        for (millis, text) in [(0, "0s"), (500, "500ms"), (90_000, "1m30s"), (5_400_000, "1h30m")] {
            assert_eq!(format_duration(Duration::from_millis(millis)), text);
            assert_eq!(parse_duration(text), Some(Duration::from_millis(millis)));
        }
    }
}
