//! The shared namespace's clock (FORMAT.md "Stamps"): a hybrid logical clock. A stamp is
//! nanoseconds since the Unix epoch, raised past every stamp this node has seen, so a
//! change that follows another (it saw the other's records first) always has the higher
//! stamp, whatever the nodes' wall clocks say; and stamps stay close to wall time, which
//! makes them usable as a directory's change time.

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Clock {
    last: AtomicU64,
}

impl Clock {
    /// A clock that starts past `floor` (the highest stamp stored or seen).
    pub fn new(floor: u64) -> Clock {
        Clock {
            last: AtomicU64::new(floor),
        }
    }

    /// A new stamp: above every stamp taken or observed before.
    pub fn tick(&self) -> u64 {
        let now = crate::slots::now_unix_ns();
        let mut last = self.last.load(Ordering::Acquire);
        loop {
            let next = now.max(last + 1);
            match self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return next,
                Err(l) => last = l,
            }
        }
    }

    /// Records that a stamp `s` exists somewhere: later ticks are above it.
    pub fn observe(&self, s: u64) {
        self.last.fetch_max(s, Ordering::AcqRel);
    }
}

/// A stamp as a time (for the change and modification times of directories).
pub fn to_time(stamp: u64) -> crate::format::Timestamp {
    crate::format::Timestamp {
        secs: (stamp / 1_000_000_000) as i64,
        nanos: (stamp % 1_000_000_000) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_rise_past_what_was_observed() {
        let c = Clock::new(0);
        let a = c.tick();
        let b = c.tick();
        assert!(b > a);
        let far = crate::slots::now_unix_ns() + 3_600_000_000_000;
        c.observe(far);
        assert!(c.tick() > far);
        assert_eq!(to_time(1_500_000_000).nanos, 500_000_000);
    }
}
