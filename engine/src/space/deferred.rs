//! Namespace changes held until the next metadata transaction: attribute changes of files
//! open for writing, and creates of regular files.
//!
//! An untar sets the owner, the mode and the times of every file it writes (`fchown`,
//! `fchmod`, `futimens`) before closing it: three transactions per file on top of the
//! create and the close's commit, which writes the same record again. Held here instead,
//! they ride in the next transaction of any kind, usually that file's own close. The create
//! itself (a file opened with `O_CREAT` that did not exist) is held the same way, so a new
//! small file costs one transaction, its close's, instead of two: its inode number, history
//! id and readdir cookie come from a block reserved by an earlier transaction
//! (`Txn::reserve_ids`, `RESERVE` at a time), and its rows are written by the transaction
//! that applies it.
//!
//! What keeps this as safe as a transaction per change:
//! - every write transaction begins by applying every held change (`Space::begin_write`),
//!   creates first, before its own: the table never holds a later change without an
//!   earlier held one, so the journal's records, and a crash, keep a prefix of what was
//!   acknowledged;
//! - every durability point without a transaction of its own (a close that commits
//!   nothing, `fsync` of a directory, unmount) first runs one (`Space::sync_meta`,
//!   `sync_all`), so a change before it is durable when it returns, as the durability
//!   contract says of every namespace change;
//! - reads through the namespace see what is held (`overlay`, `created`, `created_named`,
//!   `created_in`: records, lookups, listings, the parent's times);
//! - a change leaves the set only once a transaction that applied it committed
//!   (`settle`, by generation): an aborted one leaves it for the next; a commit settles
//!   before the next transaction takes its snapshot (`Space::commit_gate`), so no create
//!   is applied twice;
//! - a create is checked (the parent is a directory, the name is free) against the table
//!   and what is held, under `Space::ns_gate`, which every namespace transaction holds from
//!   its start to its commit: nothing can take the name or remove the parent between the
//!   check and the transaction that applies it.
//!
//! Bounds: at most `MAX_HELD` inodes with held attributes and `MAX_HELD_CREATES` held
//! creates; a change past either runs a transaction instead (the fs layer holds only
//! changes of files open for writing and creates of files it opens, so this is reached
//! only with that many such files and nothing else committed meanwhile).

use crate::catalog::DirEntry;
use crate::format::{HistoryId, HistoryRecord, InodeId, InodeRecord, Timestamp};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// Inodes whose attribute changes may be held at once.
pub(crate) const MAX_HELD: usize = 4096;

/// Creates that may be held at once.
pub(crate) const MAX_HELD_CREATES: usize = 4096;

/// Inode numbers, history ids and readdir cookies reserved by one transaction for held
/// creates (`Txn::reserve_ids`): one transaction in this many creates reserves; a remount
/// or crash skips what was left (64-bit counters).
pub(crate) const RESERVE: u64 = 1024;

/// A regular file's create, held for the next transaction (`Txn::apply_create`).
#[derive(Clone, Debug)]
pub(crate) struct HeldCreate {
    pub(crate) parent: InodeId,
    pub(crate) name: Vec<u8>,
    pub(crate) ino: InodeId,
    pub(crate) cookie: u64,
    /// Its record as created (`history` set).
    pub(crate) rec: InodeRecord,
    /// When: the parent's mtime and ctime.
    pub(crate) at: Timestamp,
    /// Its generation, in the order of every held change (`held_before`).
    pub(crate) gen: u64,
}

/// Ids reserved for held creates: the next of each (inode, history, cookie) and how many
/// are left.
struct Pool {
    next: [u64; 3],
    left: u64,
}

#[derive(Default)]
struct Creates {
    /// By inode number: the order they were made in (numbers come from one block at a
    /// time, ascending).
    by_ino: BTreeMap<InodeId, HeldCreate>,
    by_name: HashMap<(InodeId, Vec<u8>), InodeId>,
    /// Each parent with held creates: the newest one's time and how many.
    dirs: HashMap<InodeId, (Timestamp, usize)>,
    pool: Option<Pool>,
}

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
    /// Inode -> (generation, attributes): the newest change of each, and the generation of
    /// the oldest change of it no committed transaction applied (`held_before`).
    held: Mutex<HashMap<InodeId, (u64, Attrs, u64)>>,
    next_gen: std::sync::atomic::AtomicU64,
    /// Cheap check for the common case of nothing held.
    any: std::sync::atomic::AtomicBool,
    creates: Mutex<Creates>,
    /// Cheap check: some create is held.
    any_creates: std::sync::atomic::AtomicBool,
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
        let first = h.get(&ino).map_or(g, |(_, _, f)| *f);
        h.insert(ino, (g, Attrs::of(rec), first));
        self.any.store(true, std::sync::atomic::Ordering::Release);
        true
    }

    /// Nothing is held: no attribute change, no create.
    pub(crate) fn is_empty(&self) -> bool {
        !self.any.load(std::sync::atomic::Ordering::Acquire) && !self.holds_creates()
    }

    fn holds_creates(&self) -> bool {
        self.any_creates.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Holds the create `make` builds from the ids it is given (inode number, history id,
    /// readdir cookie), and returns it. None when no ids are reserved or the set is full:
    /// the caller creates in a transaction instead (which reserves more, `add_ids`).
    /// The caller checked the create under `Space::ns_gate`, which it holds.
    pub(crate) fn hold_create(
        &self,
        make: impl FnOnce(InodeId, HistoryId, u64) -> HeldCreate,
    ) -> Option<HeldCreate> {
        let mut c = self.creates.lock();
        if c.by_ino.len() >= MAX_HELD_CREATES {
            return None;
        }
        let pool = c.pool.as_mut().filter(|p| p.left > 0)?;
        let [ino, hid, cookie] = pool.next;
        pool.next = [ino + 1, hid + 1, cookie + 1];
        pool.left -= 1;
        let mut h = make(InodeId(ino), HistoryId(hid), cookie);
        h.gen = self
            .next_gen
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.by_name.insert((h.parent, h.name.clone()), h.ino);
        let d = c.dirs.entry(h.parent).or_insert((h.at, 0));
        d.0 = d.0.max(h.at);
        d.1 += 1;
        c.by_ino.insert(h.ino, h.clone());
        self.any_creates
            .store(true, std::sync::atomic::Ordering::Release);
        Some(h)
    }

    /// The generation the next held change will have: a mark for `held_before`.
    pub(crate) fn mark(&self) -> u64 {
        self.next_gen.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Some change held before `mark` was taken is in no committed transaction yet: what a
    /// close, which owes durability to the changes made before it, must commit.
    pub(crate) fn held_before(&self, mark: u64) -> bool {
        if self.is_empty() {
            return false;
        }
        self.held.lock().values().any(|(_, _, first)| *first < mark)
            || self.creates.lock().by_ino.values().any(|h| h.gen < mark)
    }

    /// A transaction reserved `n` of each id from `first` (`Txn::reserve_ids`).
    pub(crate) fn add_ids(&self, first: [u64; 3], n: u64) {
        self.creates.lock().pool = Some(Pool {
            next: first,
            left: n,
        });
    }

    /// Every held create, in the order they were made, for a transaction to apply.
    pub(crate) fn snapshot_creates(&self) -> Vec<HeldCreate> {
        if !self.holds_creates() {
            return Vec::new();
        }
        self.creates.lock().by_ino.values().cloned().collect()
    }

    /// A transaction that applied the creates of `inos` committed: they are in the table.
    pub(crate) fn settle_creates(&self, inos: &[InodeId]) {
        if inos.is_empty() {
            return;
        }
        let mut c = self.creates.lock();
        for ino in inos {
            let Some(h) = c.by_ino.remove(ino) else {
                continue;
            };
            c.by_name.remove(&(h.parent, h.name));
            if let Some(d) = c.dirs.get_mut(&h.parent) {
                d.1 -= 1;
                if d.1 == 0 {
                    c.dirs.remove(&h.parent);
                }
            }
        }
        if c.by_ino.is_empty() {
            self.any_creates
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// The record of a held create.
    pub(crate) fn created(&self, ino: InodeId) -> Option<InodeRecord> {
        if !self.holds_creates() {
            return None;
        }
        self.creates.lock().by_ino.get(&ino).map(|h| h.rec.clone())
    }

    /// The inode a held create named `name` in `parent`.
    pub(crate) fn created_named(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        if !self.holds_creates() {
            return None;
        }
        self.creates
            .lock()
            .by_name
            .get(&(parent, name.to_vec()))
            .copied()
    }

    /// The history record of a held create's new history.
    pub(crate) fn created_history(&self, hid: HistoryId) -> Option<HistoryRecord> {
        if !self.holds_creates() {
            return None;
        }
        let c = self.creates.lock();
        c.by_ino
            .values()
            .find(|h| h.rec.history == hid)
            .map(|h| HistoryRecord {
                ino: h.ino,
                unlinked: None,
                path: Vec::new(),
            })
    }

    /// The held creates in `dir` with cookies greater than `after`, for `merge_listing`.
    pub(crate) fn created_in(&self, dir: InodeId, after: u64) -> Vec<DirEntry> {
        if !self.holds_creates() {
            return Vec::new();
        }
        let c = self.creates.lock();
        if !c.dirs.contains_key(&dir) {
            return Vec::new();
        }
        c.by_ino
            .values()
            .filter(|h| h.parent == dir && h.cookie > after)
            .map(|h| DirEntry {
                cookie: h.cookie,
                name: h.name.clone(),
                ino: h.ino,
            })
            .collect()
    }

    /// A directory's record, `rec` as read from the table, with the times held creates in
    /// it gave it.
    pub(crate) fn overlay_dir(&self, dir: InodeId, rec: &mut InodeRecord) {
        if !self.holds_creates() {
            return;
        }
        if let Some((at, _)) = self.creates.lock().dirs.get(&dir) {
            rec.mtime = rec.mtime.max(*at);
            rec.ctime = rec.ctime.max(*at);
        }
    }

    /// Every held change, with its generation, for a transaction to apply.
    pub(crate) fn snapshot(&self) -> Vec<(InodeId, u64, Attrs)> {
        if self.is_empty() {
            return Vec::new();
        }
        let h = self.held.lock();
        let mut v: Vec<_> = h.iter().map(|(i, (g, a, _))| (*i, *g, *a)).collect();
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
            match h.get_mut(ino) {
                Some((cur, _, _)) if cur == g => {
                    h.remove(ino);
                }
                // Changed again since: what is not in the table yet came after `g`.
                Some((_, _, first)) => *first = (*first).max(g + 1),
                None => {}
            }
        }
        if h.is_empty() {
            self.any.store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// `rec`, as `ino`'s record read from the table (or held, `created`), with its held
    /// change, and a directory's times with its held creates.
    pub(crate) fn overlay(&self, ino: InodeId, rec: &mut InodeRecord) {
        if self.is_empty() {
            return;
        }
        if self.any.load(std::sync::atomic::Ordering::Acquire) {
            if let Some((_, a, _)) = self.held.lock().get(&ino) {
                a.set(rec);
            }
        }
        self.overlay_dir(ino, rec);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.lock().len()
    }
}

/// `listed` (entries of a directory after some cookie, at most `limit`, from the table)
/// with `held` (`Deferred::created_in`, taken before the table was read) among them, in
/// cookie order, at most `limit`. A create its transaction applied is listed by the table
/// already until it settles: listed once.
pub(crate) fn merge_listing(listed: &mut Vec<DirEntry>, mut held: Vec<DirEntry>, limit: usize) {
    if held.is_empty() {
        return;
    }
    held.retain(|h| !listed.iter().any(|e| e.ino == h.ino));
    listed.extend(held);
    listed.sort_unstable_by_key(|e| e.cookie);
    listed.truncate(limit);
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

    fn held(d: &Deferred, parent: u64, name: &str) -> Option<HeldCreate> {
        d.hold_create(|ino, hid, cookie| {
            let mut r = rec(0o644);
            r.history = hid;
            HeldCreate {
                parent: InodeId(parent),
                name: name.as_bytes().to_vec(),
                ino,
                cookie,
                rec: r,
                at: Timestamp {
                    secs: 4_000_000_000,
                    nanos: 0,
                },
                gen: 0,
            }
        })
    }

    #[test]
    fn held_creates_take_reserved_ids_and_are_read_until_settled() {
        let d = Deferred::default();
        assert!(
            held(&d, 1, "a").is_none(),
            "no ids reserved: a transaction creates"
        );
        d.add_ids([100, 50, 1000], 3);
        let a = held(&d, 1, "a").expect("held");
        let b = held(&d, 1, "b").expect("held");
        let c = held(&d, 2, "c").expect("held");
        assert_eq!(
            (a.ino, a.rec.history, a.cookie),
            (InodeId(100), HistoryId(50), 1000)
        );
        assert_eq!((c.ino, c.cookie), (InodeId(102), 1002));
        assert!(held(&d, 1, "d").is_none(), "the reserved ids are used up");
        assert!(!d.is_empty());
        assert_eq!(d.created_named(InodeId(1), b"b"), Some(b.ino));
        assert_eq!(d.created_named(InodeId(2), b"b"), None);
        assert_eq!(d.created_history(HistoryId(51)).map(|h| h.ino), Some(b.ino));
        // A listing of directory 1 from the table (cookies 999 and 1001 taken there too)
        // with the held ones among them, in cookie order, at most `limit`.
        let entry = |cookie, name: &str, ino| DirEntry {
            cookie,
            name: name.as_bytes().to_vec(),
            ino: InodeId(ino),
        };
        let mut listed = vec![entry(999, "old", 7), entry(1001, "mid", 8)];
        merge_listing(&mut listed, d.created_in(InodeId(1), 0), 3);
        let order: Vec<u64> = listed.iter().map(|e| e.cookie).collect();
        assert_eq!(
            order,
            [999, 1000, 1001],
            "merged by cookie, cut at the limit"
        );
        let mut dir = rec(0o755);
        d.overlay(InodeId(1), &mut dir);
        assert_eq!(
            (dir.mtime.secs, dir.ctime.secs),
            (4_000_000_000, 4_000_000_000),
            "the parent's times with its held creates"
        );
        // The transaction that applied a and b committed; c stays.
        let snap: Vec<InodeId> = d.snapshot_creates().iter().map(|h| h.ino).collect();
        assert_eq!(snap, [a.ino, b.ino, c.ino], "in the order they were made");
        d.settle_creates(&[a.ino, b.ino]);
        assert_eq!(d.created(a.ino), None);
        assert_eq!(d.created_named(InodeId(1), b"a"), None);
        assert!(d.created(c.ino).is_some());
        d.settle_creates(&[c.ino]);
        assert!(d.is_empty());
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
