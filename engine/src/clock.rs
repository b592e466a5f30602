//! The engine's time: every decision by age or elapsed time reads it here (file and
//! revision times, retention ages, advice intervals, write durations, slot leases, the grace
//! before a freed segment is reused, the automatic gc's back-off), so a test can move time
//! forward instead of sleeping through it.
//!
//! The clock is the system's, plus an offset that only grows. The offset is per process (a
//! daemon is one space's process; `nextest` runs each test in its own), and only tests move
//! it: engine tests call `advance`, and a daemon started with `CKPTFS_TEST_CLOCK=1` accepts
//! the `clock` control request (a mount without it refuses the request). Intervals that pace
//! work rather than decide anything (poll and renewal periods, profiling figures, timeouts
//! of waits) stay on the real clock: skipping ahead must not make a thread spin.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// How far this process's clock is ahead of the system's, in nanoseconds (only grows, so
/// `instant()` is monotonic like `Instant::now()`).
static AHEAD_NS: AtomicU64 = AtomicU64::new(0);

/// The environment variable that lets a daemon's clock be moved (`clock` control request).
pub const TEST_CLOCK_ENV: &str = "CKPTFS_TEST_CLOCK";

fn ahead() -> Duration {
    Duration::from_nanos(AHEAD_NS.load(Ordering::Acquire))
}

/// Wall-clock time now.
pub fn now() -> SystemTime {
    SystemTime::now() + ahead()
}

/// Monotonic time now: compare only with other `instant()` readings.
pub fn instant() -> Instant {
    Instant::now() + ahead()
}

/// Time since `t`, an earlier `instant()` reading (zero if `t` is later).
pub fn since(t: Instant) -> Duration {
    instant().saturating_duration_since(t)
}

/// Moves this process's clock forward by `d` (tests only; see the module doc).
pub fn advance(d: Duration) {
    AHEAD_NS.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::AcqRel);
}

/// How far `advance` has moved the clock so far.
pub fn advanced() -> Duration {
    ahead()
}

/// Whether this process was started to let tests move its clock.
pub fn movable() -> bool {
    std::env::var_os(TEST_CLOCK_ENV).is_some_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advancing_moves_both_clocks_and_never_back() {
        let (w, i) = (now(), instant());
        advance(Duration::from_secs(3600));
        assert!(now().duration_since(w).unwrap() >= Duration::from_secs(3600));
        assert!(since(i) >= Duration::from_secs(3600));
        assert!(advanced() >= Duration::from_secs(3600));
        // A reading taken before an advance stays earlier than every later one.
        let later = instant();
        assert!(instant() >= later);
    }
}
