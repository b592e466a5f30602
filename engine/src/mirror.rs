//! Mirrors of a targeted space's metadata on K+1 of its targets, so that the loss of the
//! backing directory's disk loses nothing the targets could still serve.
//!
//! The backing directory keeps the primary copy: superblock, metadata table, placement
//! records and targets table. At every read-write mount, K+1 usable targets in distinct
//! failure domains (lowest index first) become the mirror holders: the primary's files are
//! copied into each holder's directory (`ckptfs-superblock`, `ckptfs-meta`,
//! `ckptfs-placement`, `ckptfs-table`), and from then on every write and sync of the
//! metadata table and of the placement records goes to the primary and to every holder
//! (the syncs in parallel), so a commit is durable on all of them when it returns. The
//! primary alone is read.
//!
//! Protocol, so that a holder's copy is used only while it is current:
//! - the targets table carries a generation, bumped at every rewrite, and a mirror flag
//!   per target; each rewrite goes to the primary and to every flagged holder;
//! - a mount first clears every flag (a new generation on the primary and the old holders),
//!   then copies, then sets the flags of the holders it copied to (another generation): a
//!   crash in between leaves no holder claiming a half-made copy;
//! - a holder whose write or sync fails is dropped for the rest of the mount, and its flag
//!   cleared at once (a new generation, written to the primary and the other holders);
//! - `ckptfs recover` rebuilds a lost backing directory from the holder copies: the newest
//!   generation among the holders' tables names the current holders, and only a holder
//!   whose own table has that generation is copied from.
//!
//! Cost: the metadata bytes written K+1 more times and K+1 more syncs per commit (run side
//! by side), and a copy of the metadata (K+1 times) at every mount.

use crate::device::Device;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

pub(crate) const MIRROR_SUPERBLOCK: &str = "ckptfs-superblock";
pub(crate) const MIRROR_META: &str = "ckptfs-meta";
pub(crate) const MIRROR_PLACEMENT: &str = "ckptfs-placement";
pub(crate) const MIRROR_TABLE: &str = "ckptfs-table";
/// Every file a holder keeps.
pub(crate) const MIRROR_FILES: [&str; 4] = [
    MIRROR_SUPERBLOCK,
    MIRROR_META,
    MIRROR_PLACEMENT,
    MIRROR_TABLE,
];

/// The holders of one mount, and which of them were dropped.
pub(crate) struct MirrorSet {
    dropped: Mutex<BTreeSet<usize>>,
    on_drop: Box<dyn Fn(usize) + Send + Sync>,
}

impl MirrorSet {
    /// `on_drop(target)` runs once per holder dropped (it clears the holder's flag).
    pub fn new(on_drop: Box<dyn Fn(usize) + Send + Sync>) -> Arc<Self> {
        Arc::new(MirrorSet {
            dropped: Mutex::new(BTreeSet::new()),
            on_drop,
        })
    }

    pub(crate) fn is_dropped(&self, t: usize) -> bool {
        self.dropped.lock().contains(&t)
    }

    /// Stops writing the mirror on target `t` for the rest of the mount.
    pub(crate) fn drop_holder(&self, t: usize, why: &io::Error) {
        if self.dropped.lock().insert(t) {
            log::error!(
                "the metadata mirror on target {t} failed ({why}); it is no longer written, \
                 and the next mount copies the metadata to a healthy target again"
            );
            (self.on_drop)(t);
        }
    }
}

/// A device written to a primary and to the mirrors still in the set; read from the
/// primary. An error of the primary is the caller's; a mirror's drops that mirror.
pub(crate) struct MirrorDevice {
    primary: Arc<dyn Device>,
    mirrors: Vec<(usize, Arc<dyn Device>)>,
    set: Arc<MirrorSet>,
}

impl MirrorDevice {
    pub fn new(
        primary: Arc<dyn Device>,
        mirrors: Vec<(usize, Arc<dyn Device>)>,
        set: Arc<MirrorSet>,
    ) -> Self {
        MirrorDevice {
            primary,
            mirrors,
            set,
        }
    }

    fn live(&self) -> impl Iterator<Item = &(usize, Arc<dyn Device>)> {
        self.mirrors
            .iter()
            .filter(|(t, _)| !self.set.is_dropped(*t))
    }
}

impl Device for MirrorDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.primary.read_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.primary.write_at(buf, off)?;
        for (t, d) in self.live() {
            if let Err(e) = d.write_at(buf, off) {
                self.set.drop_holder(*t, &e);
            }
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let live: Vec<&(usize, Arc<dyn Device>)> = self.live().collect();
        if live.is_empty() {
            return self.primary.sync();
        }
        // Side by side: a commit waits for the slowest copy, not for their sum.
        let (primary, failed) = std::thread::scope(|s| {
            let hs: Vec<_> = live
                .iter()
                .map(|(t, d)| s.spawn(move || (*t, d.sync())))
                .collect();
            let primary = self.primary.sync();
            let failed: Vec<(usize, io::Error)> = hs
                .into_iter()
                .filter_map(|h| match h.join() {
                    Ok((_, Ok(()))) => None,
                    Ok((t, Err(e))) => Some((t, e)),
                    Err(_) => None,
                })
                .collect();
            (primary, failed)
        });
        for (t, e) in failed {
            self.set.drop_holder(t, &e);
        }
        primary
    }

    fn len(&self) -> u64 {
        self.primary.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.primary.set_len(len)?;
        for (t, d) in self.live() {
            if let Err(e) = d.set_len(len) {
                self.set.drop_holder(*t, &e);
            }
        }
        Ok(())
    }

    /// The primary's: a copy that cannot grow is dropped, as one that cannot be written.
    fn room_low(&self) -> bool {
        self.primary.room_low()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Failing;
    impl Device for Failing {
        fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
            Err(io::Error::other("dead"))
        }
        fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
            Err(io::Error::other("dead"))
        }
        fn sync(&self) -> io::Result<()> {
            Err(io::Error::other("dead"))
        }
        fn len(&self) -> u64 {
            0
        }
    }

    /// Writes reach the primary and every live mirror; a failing mirror is dropped once,
    /// the others go on; the primary's bytes are what reads see.
    #[test]
    fn writes_reach_every_live_mirror_and_a_failing_one_is_dropped() {
        let drops = Arc::new(AtomicUsize::new(0));
        let d2 = drops.clone();
        let set = MirrorSet::new(Box::new(move |t| {
            assert_eq!(t, 2);
            d2.fetch_add(1, Ordering::SeqCst);
        }));
        let p = Arc::new(MemDevice::new(64));
        let m1 = Arc::new(MemDevice::new(64));
        let dev = MirrorDevice::new(
            p.clone(),
            vec![(1, m1.clone() as Arc<dyn Device>), (2, Arc::new(Failing))],
            set.clone(),
        );
        dev.write_at(b"hello", 3).unwrap();
        dev.sync().unwrap();
        dev.write_at(b"world", 10).unwrap();
        dev.sync().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(set.is_dropped(2) && !set.is_dropped(1));
        let (mut a, mut b) = ([0u8; 20], [0u8; 20]);
        dev.read_at(&mut a, 0).unwrap();
        m1.read_at(&mut b, 0).unwrap();
        assert_eq!(a, b);
        assert_eq!(&a[3..8], b"hello");
        assert_eq!(&a[10..15], b"world");
    }
}
