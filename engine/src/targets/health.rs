//! What is known about the targets' health since the mount: which shards were found
//! unreadable or damaged (so the redundancy reported is what is readable now, not what the
//! placement promises), and the warnings about them, aggregated so a failing target cannot
//! fill the disk with its log.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// (segment, shard) pairs `Suspects` remembers. Past this, a target with more is counted
/// unreadable as a whole (conservative: its shards count as missing everywhere) until a
/// repair pass over every segment clears it. 65,536 entries are about 3 MiB.
pub(crate) const SUSPECTS_MAX: usize = 65_536;

/// Shards found unreadable (a failed read) or damaged (a chunk verified only without them,
/// parity disagreeing with verified data) since the mount, and not rewritten since. Each
/// entry names the target the shard was on: a segment re-placed since (its old shards freed)
/// does not match it any more.
#[derive(Default)]
pub(crate) struct Suspects {
    by_segment: BTreeMap<u64, Vec<(usize, u16)>>,
    count: usize,
    /// Targets with more suspect shards than `SUSPECTS_MAX` let us remember.
    whole: Vec<u16>,
}

impl Suspects {
    pub fn add(&mut self, seg: u64, shard: usize, target: u16) {
        if self.whole.contains(&target) {
            return;
        }
        let v = self.by_segment.entry(seg).or_default();
        if v.iter().any(|&(i, t)| i == shard && t == target) {
            return;
        }
        if self.count >= SUSPECTS_MAX {
            // No room to say which: the whole target is suspect, and its entries go.
            self.whole.push(target);
            self.forget_target(target);
            return;
        }
        v.push((shard, target));
        self.count += 1;
    }

    fn forget_target(&mut self, target: u16) {
        let mut count = 0;
        self.by_segment.retain(|_, v| {
            v.retain(|&(_, t)| t != target);
            count += v.len();
            !v.is_empty()
        });
        self.count = count;
    }

    /// Shard `shard` of `seg`, on `target`, is not readable as far as is known.
    pub fn holds(&self, seg: u64, shard: usize, target: u16) -> bool {
        self.whole.contains(&target)
            || self
                .by_segment
                .get(&seg)
                .is_some_and(|v| v.iter().any(|&(i, t)| i == shard && t == target))
    }

    /// Some target is suspect as a whole.
    pub(crate) fn any_whole(&self) -> bool {
        !self.whole.is_empty()
    }

    /// Some shard of `seg` is suspect.
    pub(crate) fn in_segment(&self, seg: u64) -> bool {
        self.by_segment.contains_key(&seg)
    }

    /// A repair rewrote (or verified) every shard of `seg`; or it was re-placed.
    pub(crate) fn clear_segment(&mut self, seg: u64) {
        if let Some(v) = self.by_segment.remove(&seg) {
            self.count -= v.len();
        }
    }

    /// Shard `shard` of `seg` was rewritten.
    pub(crate) fn clear_shard(&mut self, seg: u64, shard: usize) {
        if let Some(v) = self.by_segment.get_mut(&seg) {
            let before = v.len();
            v.retain(|&(i, _)| i != shard);
            self.count -= before - v.len();
            if v.is_empty() {
                self.by_segment.remove(&seg);
            }
        }
    }

    /// A repair pass visited every segment: targets counted unreadable as a whole are judged
    /// by what that pass found (its own entries) from now on.
    pub(crate) fn clear_whole(&mut self) {
        self.whole.clear();
    }

    /// Per target (by index, `n` targets): (suspect as a whole, suspect shards).
    pub(crate) fn per_target(&self, n: usize) -> Vec<(bool, u64)> {
        let mut out = vec![(false, 0u64); n];
        for v in self.by_segment.values() {
            for &(_, t) in v {
                if let Some(o) = out.get_mut(t as usize) {
                    o.1 += 1;
                }
            }
        }
        for &t in &self.whole {
            if let Some(o) = out.get_mut(t as usize) {
                o.0 = true;
            }
        }
        out
    }
}

/// How long one warning line stands for its target and kind: the first of a kind is logged
/// at once, the rest of the interval are counted, and one line says how many there were.
pub(crate) const WARN_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WarnKind {
    /// A read of a shard failed.
    Read,
    /// A shard held damaged bytes.
    Damaged,
}

impl WarnKind {
    fn what(self) -> &'static str {
        match self {
            WarnKind::Read => "failed reads",
            WarnKind::Damaged => "damaged shards found",
        }
    }
}

struct Window {
    start: Instant,
    /// Warnings counted but not logged in this window, and the latest of them.
    more: u64,
    last: String,
}

/// Repeated warnings, aggregated per (target, kind): at most one line per `WARN_INTERVAL`
/// with a count. Memory: one window per target and kind.
#[derive(Default)]
pub(crate) struct Warnings {
    windows: Mutex<HashMap<(u16, WarnKind), Window>>,
}

impl Warnings {
    /// A warning about `target`; `msg` is formatted only when it is logged or kept as the
    /// latest.
    pub fn warn(&self, target: u16, kind: WarnKind, msg: impl FnOnce() -> String) {
        let now = Instant::now();
        let mut w = self.windows.lock();
        match w.get_mut(&(target, kind)) {
            Some(win) if now.duration_since(win.start) < WARN_INTERVAL => {
                win.more += 1;
                win.last = msg();
            }
            Some(win) => {
                // A new interval: close the old one, log this one.
                summary(target, kind, win);
                let m = msg();
                log::warn!("{m}");
                *win = Window {
                    start: now,
                    more: 0,
                    last: String::new(),
                };
            }
            None => {
                log::warn!("{}", msg());
                w.insert(
                    (target, kind),
                    Window {
                        start: now,
                        more: 0,
                        last: String::new(),
                    },
                );
            }
        }
    }

    /// Logs the summary of every window whose interval has passed.
    pub fn flush(&self, now: Instant, path: &dyn Fn(u16) -> String) {
        let mut w = self.windows.lock();
        w.retain(|&(t, kind), win| {
            if now.duration_since(win.start) < WARN_INTERVAL {
                return true;
            }
            if win.more > 0 {
                log::warn!(
                    "target {t} ({}): {} more {} in the last {} s (the latest: {})",
                    path(t),
                    win.more,
                    kind.what(),
                    WARN_INTERVAL.as_secs(),
                    win.last
                );
            }
            false
        });
    }

    /// Warnings counted and not logged yet, all targets (for tests).
    #[cfg(test)]
    pub fn pending(&self) -> u64 {
        self.windows.lock().values().map(|w| w.more).sum()
    }
}

fn summary(target: u16, kind: WarnKind, win: &Window) {
    if win.more > 0 {
        log::warn!(
            "target {target}: {} more {} in the last {} s (the latest: {})",
            win.more,
            kind.what(),
            WARN_INTERVAL.as_secs(),
            win.last
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspects_are_remembered_per_shard_and_target_and_cleared_by_repairs() {
        let mut s = Suspects::default();
        s.add(3, 1, 7);
        s.add(3, 1, 7);
        assert!(s.holds(3, 1, 7));
        assert!(
            !s.holds(3, 1, 8),
            "another target now holds shard 1 of segment 3"
        );
        assert!(!s.holds(3, 2, 7));
        assert_eq!(s.per_target(9)[7], (false, 1));
        s.clear_shard(3, 1);
        assert!(!s.holds(3, 1, 7));
        assert_eq!(s.count, 0);
    }

    #[test]
    fn past_the_bound_a_target_is_suspect_as_a_whole() {
        let mut s = Suspects::default();
        for seg in 0..SUSPECTS_MAX as u64 {
            s.add(seg, 0, 1);
        }
        assert_eq!(s.count, SUSPECTS_MAX);
        s.add(u64::MAX, 0, 2);
        assert!(s.holds(0, 4, 2) && s.holds(99, 0, 2), "target 2 as a whole");
        assert!(s.holds(5, 0, 1), "target 1's entries stay");
        assert_eq!(s.per_target(3)[2], (true, 0));
        s.clear_whole();
        assert!(!s.holds(0, 4, 2));
    }

    #[test]
    fn repeated_warnings_count_instead_of_logging() {
        let w = Warnings::default();
        for _ in 0..1000 {
            w.warn(0, WarnKind::Read, || "x".into());
        }
        assert_eq!(w.pending(), 999, "one logged, the rest counted");
        w.warn(1, WarnKind::Read, || "y".into());
        assert_eq!(w.pending(), 999, "another target has its own window");
        w.flush(Instant::now() + WARN_INTERVAL, &|t| t.to_string());
        assert_eq!(w.pending(), 0);
        assert_eq!(w.windows.lock().len(), 0);
    }
}
