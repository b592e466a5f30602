//! Attribute changes of files open for writing, held until the next metadata transaction.
//!
//! An untar sets the owner, the mode and the times of every file it writes (`fchown`,
//! `fchmod`, `futimens`) before closing it: three transactions per file on top of the
//! create and the close's commit, which writes the same record again. Held here instead,
//! they ride in the next transaction of any kind, usually that file's own close.
//!
//! What keeps this as safe as a transaction per change:
//! - every write transaction begins by applying every held change (`Space::begin_write`),
//!   before its own: the table never holds a later change without an earlier held one, so
//!   the journal's records, and a crash, keep a prefix of what was acknowledged;
//! - every durability point without a transaction of its own (a close that commits
//!   nothing, `fsync` of a directory, unmount) first runs one (`Space::sync_meta`,
//!   `sync_all`), so a change before it is durable when it returns, as the durability
//!   contract says of every namespace change;
//! - reads of a record through the namespace see the held change (`overlay`);
//! - a change leaves the set only once a transaction that applied it committed
//!   (`settle`, by generation): an aborted one leaves it for the next.
//!
//! Bound: at most `MAX_HELD` inodes; the change that would pass it runs a transaction
//! instead (the fs layer holds only changes of files open for writing, so this is reached
//! only with that many such files changed and nothing else committed meanwhile).

use crate::format::{InodeId, InodeRecord, Timestamp};
use parking_lot::Mutex;
use std::collections::HashMap;

/// Inodes whose attribute changes may be held at once.
pub(crate) const MAX_HELD: usize = 4096;

/// The attributes a held change sets (whole values, not deltas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attrs {
    perm: u32,
    uid: u32,
    gid: u32,
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
}

impl Attrs {
    pub(crate) fn of(r: &InodeRecord) -> Self {
        Attrs {
            perm: r.perm,
            uid: r.uid,
            gid: r.gid,
            atime: r.atime,
            mtime: r.mtime,
            ctime: r.ctime,
        }
    }

    pub(crate) fn set(&self, r: &mut InodeRecord) {
        r.perm = self.perm;
        r.uid = self.uid;
        r.gid = self.gid;
        r.atime = self.atime;
        r.mtime = self.mtime;
        r.ctime = self.ctime;
    }
}

#[derive(Default)]
pub(crate) struct Deferred {
    /// Inode -> (generation, attributes): the newest change of each.
    held: Mutex<HashMap<InodeId, (u64, Attrs)>>,
    next_gen: std::sync::atomic::AtomicU64,
    /// Cheap check for the common case of nothing held.
    any: std::sync::atomic::AtomicBool,
}

impl Deferred {
    /// Holds `rec`'s attributes as `ino`'s. False when the set is full: the caller commits
    /// the change itself.
    pub(crate) fn hold(&self, ino: InodeId, rec: &InodeRecord) -> bool {
        let mut h = self.held.lock();
        if h.len() >= MAX_HELD && !h.contains_key(&ino) {
            return false;
        }
        let g = self
            .next_gen
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        h.insert(ino, (g, Attrs::of(rec)));
        self.any.store(true, std::sync::atomic::Ordering::Release);
        true
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.any.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every held change, with its generation, for a transaction to apply.
    pub(crate) fn snapshot(&self) -> Vec<(InodeId, u64, Attrs)> {
        if self.is_empty() {
            return Vec::new();
        }
        let h = self.held.lock();
        let mut v: Vec<_> = h.iter().map(|(i, (g, a))| (*i, *g, *a)).collect();
        // One order whatever the map's: the same rows in the same order for every record.
        v.sort_unstable_by_key(|(i, _, _)| i.0);
        v
    }

    /// A transaction that applied `applied` committed: those changes are in the table now
    /// (a change made since, of a newer generation, stays held).
    pub(crate) fn settle(&self, applied: &[(InodeId, u64)]) {
        if applied.is_empty() {
            return;
        }
        let mut h = self.held.lock();
        for (ino, g) in applied {
            if h.get(ino).is_some_and(|(cur, _)| cur == g) {
                h.remove(ino);
            }
        }
        if h.is_empty() {
            self.any.store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// `rec`, as `ino`'s record read from the table, with its held change.
    pub(crate) fn overlay(&self, ino: InodeId, rec: &mut InodeRecord) {
        if self.is_empty() {
            return;
        }
        if let Some((_, a)) = self.held.lock().get(&ino) {
            a.set(rec);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::NodeKind;

    fn rec(perm: u32) -> InodeRecord {
        InodeRecord::new(NodeKind::File, perm, 0, 0)
    }

    #[test]
    fn a_change_made_after_a_transaction_took_its_snapshot_stays_held() {
        let d = Deferred::default();
        assert!(d.is_empty());
        assert!(d.hold(InodeId(7), &rec(0o600)));
        let snap = d.snapshot();
        assert_eq!(snap.len(), 1);
        // A newer change of the same inode while that transaction commits.
        assert!(d.hold(InodeId(7), &rec(0o640)));
        d.settle(&snap.iter().map(|(i, g, _)| (*i, *g)).collect::<Vec<_>>());
        let mut r = rec(0o777);
        d.overlay(InodeId(7), &mut r);
        assert_eq!(r.perm, 0o640, "the newer change is still held and read");
        let snap = d.snapshot();
        d.settle(&snap.iter().map(|(i, g, _)| (*i, *g)).collect::<Vec<_>>());
        assert!(d.is_empty());
        let mut r = rec(0o777);
        d.overlay(InodeId(7), &mut r);
        assert_eq!(r.perm, 0o777, "nothing held: the table's record");
    }

    #[test]
    fn the_set_is_bounded() {
        let d = Deferred::default();
        for i in 0..MAX_HELD as u64 {
            assert!(d.hold(InodeId(i + 10), &rec(0o600)));
        }
        assert!(!d.hold(InodeId(1), &rec(0o600)), "full: the caller commits");
        assert!(
            d.hold(InodeId(10), &rec(0o644)),
            "a held inode may change again"
        );
        assert_eq!(d.len(), MAX_HELD);
    }
}
