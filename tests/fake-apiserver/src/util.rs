//! Small helpers: RFC 3339 timestamps as the API server writes them (`metav1.Time`, second
//! precision, UTC), random names as `names.SimpleNameGenerator` makes them
//! (staging/src/k8s.io/apiserver/pkg/storage/names/generate.go with the alphabet of
//! staging/src/k8s.io/apimachinery/pkg/util/rand/rand.go), UIDs, durations and JSON access.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// `utilrand.String`'s alphabet: no vowels (no words), no look-alike characters.
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

static RNG: Mutex<u64> = Mutex::new(0);

/// The next pseudo-random number (xorshift64*, seeded from the clock and the PID).
pub fn random() -> u64 {
    let mut state = RNG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if *state == 0 {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        *state = nanos ^ (u64::from(std::process::id()) << 32) | 1;
    }
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// `n` random characters of `utilrand.String`'s alphabet.
pub fn random_suffix(n: usize) -> String {
    (0..n).map(|_| ALPHANUMS[(random() % ALPHANUMS.len() as u64) as usize] as char).collect()
}

/// A version-4 UUID as the API server assigns `metadata.uid`.
pub fn uid() -> String {
    let (a, b) = (random(), random());
    let hex = format!("{a:016x}{b:016x}");
    format!("{}-{}-4{}-{:x}{}-{}", &hex[0..8], &hex[8..12], &hex[13..16], 8 + (b >> 60) % 4, &hex[17..20], &hex[20..32])
}

/// Now, as `metav1.Time` marshals it (`2006-01-02T15:04:05Z`).
pub fn now() -> String {
    rfc3339(SystemTime::now())
}

/// A time as `metav1.Time` marshals it: RFC 3339 in UTC, whole seconds.
pub fn rfc3339(time: SystemTime) -> String {
    let seconds = time.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let at = jiff::Timestamp::from_second(seconds).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `now + d` formatted.
pub fn later(d: Duration) -> String {
    rfc3339(SystemTime::now() + d)
}

/// The string at a JSON pointer, or "".
pub fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The object's namespace and name.
pub fn ns_name(value: &Value) -> (String, String) {
    (text(value, "/metadata/namespace").to_string(), text(value, "/metadata/name").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_names() {
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_700_000_000)), "2023-11-14T22:13:20Z");
        assert_eq!(uid().len(), 36);
        assert_eq!(random_suffix(5).len(), 5);
    }
}
