//! Waits that poll a condition with a deadline, never a sleep that hopes to win a race: one for
//! async tests, one for blocking ones.

use std::time::{Duration, Instant};

/// How often a wait looks at its condition again.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Polls `condition` until it holds or `within` passes; returns whether it held.
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Some(held) = settled(&mut condition, deadline) {
            return held;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Polls `condition` until it holds or `within` passes, blocking the thread between looks;
/// returns whether it held.
pub fn wait_until(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Some(held) = settled(&mut condition, deadline) {
            return held;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// `Some(true)` once the condition holds, `Some(false)` once the deadline passed without it.
fn settled(condition: &mut impl FnMut() -> bool, deadline: Instant) -> Option<bool> {
    if condition() {
        Some(true)
    } else if Instant::now() > deadline {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_condition_that_comes_to_hold_is_seen_and_one_that_never_does_times_out() {
        let started = Instant::now();
        assert!(eventually(Duration::from_secs(10), || started.elapsed() > Duration::from_millis(50)).await);
        assert!(!eventually(Duration::from_millis(50), || false).await);
        let started = Instant::now();
        assert!(wait_until(Duration::from_secs(10), || started.elapsed() > Duration::from_millis(50)));
        let started = Instant::now();
        assert!(!wait_until(Duration::from_millis(50), || false));
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
