//! Mirrors of a targeted space's metadata on K+1 of its targets, so that the loss of the
//! backing directory's disk loses nothing the targets could still serve.
//!
//! The backing directory keeps the primary copy: superblock, metadata table, placement
//! records and targets table. At every read-write mount, K+1 usable targets in distinct
//! failure domains (lowest index first) become the mirror holders: the primary's files are
//! copied into each holder's directory (`ckptfs-superblock`, `ckptfs-meta`,
//! `ckptfs-placement`, `ckptfs-table`; a holder of the last mount has its copies compared
//! with the primary instead, and what differed rewritten and reported), and from then on every write and sync of the
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
//!   cleared at once (a new generation, written to the primary and the other holders); so
//!   is one whose copy is no longer the file open here (`MirrorDevice::watch`);
//! - `ckptfs recover` rebuilds a lost backing directory from the holder copies: the newest
//!   generation among the holders' tables names the current holders, and only a holder
//!   whose own table has that generation is copied from.
//!
//! - `ckptfs scrub` compares every holder's copies with the primary, a window at a time with
//!   the writes held off (`MirrorDevice::verify`), and rewrites from the primary whatever
//!   differs: nothing else reads the copies while mounted, so damage on a holder's disk
//!   would stay unseen until `recover` copied it back.
//!
//! Cost: the metadata bytes written K+1 more times and K+1 more syncs per commit (run side
//! by side), and a copy of the metadata (K+1 times) at every mount.

use crate::device::Device;
use crate::error::{DevResult, Fault};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::io;
use std::path::PathBuf;
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
    pub(crate) fn drop_holder(&self, t: usize, why: &Fault) {
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
    /// Where each holder's copy lies (`with_paths`), in the order of `mirrors`: what
    /// `watch` compares the open files with. Empty: not watched (the tests' memory devices).
    paths: Vec<PathBuf>,
    set: Arc<MirrorSet>,
    /// When `sync` last ran `watch` (`device::WATCH_INTERVAL`; reports and scrubs run it
    /// every time).
    watched: crate::device::WatchClock,
    /// Held by every write and resize (to the primary and then each copy) and while
    /// `verify` compares a window: so no write is half-applied to the copies it compares,
    /// and writes of the same bytes from several threads land in the same order on every
    /// copy (with a shared hold, two racing writes could end the primary with one's bytes
    /// and a copy with the other's, a copy silently stale until the next scrub). The
    /// metadata table and the placement records are written by one thread at a time
    /// anyway (redb's single writer; placement under its map's lock), so this costs them no
    /// parallelism.
    gate: Mutex<()>,
}

/// Bytes `MirrorDevice::verify` compares at a time, with the writes held off: 1 MiB.
pub(crate) const VERIFY_WINDOW: usize = 1 << 20;

/// What `MirrorDevice::verify` found on one holder's copy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CopyCheck {
    /// 4 KiB blocks of the copy that differed from the primary and were rewritten.
    pub blocks_rewritten: u64,
    /// The copy's length differed from the primary's (it was set to the primary's).
    pub length_fixed: bool,
}

/// Writes over a copy's window `got` (at `off`) every 4 KiB block that differs from the
/// primary's `want`, through `write(bytes, offset)`; returns how many it rewrote. Shared by
/// `MirrorDevice::verify` (while mounted) and the refresh of an old holder's copies at
/// mount (`layout::targets`).
pub(crate) fn mend(
    want: &[u8],
    got: &[u8],
    off: u64,
    mut write: impl FnMut(&[u8], u64) -> DevResult<()>,
) -> DevResult<u64> {
    const BLOCK: usize = 4096;
    let mut fixed = 0;
    for (i, (w, g)) in want.chunks(BLOCK).zip(got.chunks(BLOCK)).enumerate() {
        if w != g {
            write(w, off + (i * BLOCK) as u64)?;
            fixed += 1;
        }
    }
    Ok(fixed)
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
            paths: Vec::new(),
            set,
            watched: Default::default(),
            gate: Mutex::new(()),
        }
    }

    /// The paths of the holders' copies, one per mirror in the order given to `new`, so
    /// that `watch` notices a copy removed or replaced while mounted.
    pub fn with_paths(mut self, paths: Vec<PathBuf>) -> Self {
        assert_eq!(paths.len(), self.mirrors.len(), "one path per mirror");
        self.paths = paths;
        self
    }

    /// Drops every live holder whose copy is no longer the file this device writes: its
    /// path removed (by a cleanup of the target directory, say) or replaced (by a restore
    /// or a copy). Writes to the open file still succeed, so nothing else notices: status
    /// went on listing the holder, and `scrub` compared the open file and found it whole,
    /// while `ckptfs recover` would have found no copy, or a stale one, at that path.
    /// Dropping clears the holder's flag at once, so status says the metadata has fewer
    /// mirrors and `recover` never copies from it; the next mount copies the metadata to a
    /// healthy target again. Per live holder one fstat and one stat. Returns the holders
    /// dropped, with why.
    pub(crate) fn watch(&self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for ((t, d), path) in self.mirrors.iter().zip(&self.paths) {
            if self.set.is_dropped(*t) {
                continue;
            }
            let now = match d.file_now() {
                Some(Ok(now)) => now,
                // Not a file, or an fstat that failed: its I/O errors drop it as usual.
                _ => continue,
            };
            let why = match now.at(path) {
                Ok(crate::device::PathNow::Same) => continue,
                Ok(crate::device::PathNow::Replaced) => {
                    "was replaced while mounted (by a restore or a copy?)"
                }
                Ok(crate::device::PathNow::Removed) => "was removed while mounted",
                Err(e) => {
                    // A path the daemon cannot stat now (a permission or network error)
                    // says nothing of the file it has open.
                    log::warn!(
                        "metadata mirror on target {t}: stat {}: {e}",
                        path.display()
                    );
                    continue;
                }
            };
            let why = format!("{} {why}", path.display());
            self.set
                .drop_holder(*t, &Fault::Os(io::Error::other(why.clone())));
            out.push((*t, why));
        }
        out
    }

    /// Compares every live copy with the primary, window by window with the writes held
    /// off, and writes the primary's bytes over any 4 KiB block of a copy that differs
    /// (silent damage on a holder's disk would otherwise stay unseen until `ckptfs recover`
    /// copied it back as the space's metadata). The primary is what the daemon reads and
    /// commits through, so it is the reference. A copy that cannot be read or written is
    /// dropped as a failing one is. Returns, per holder compared, what was found; memory:
    /// two windows.
    pub(crate) fn verify(&self) -> Vec<(usize, DevResult<CopyCheck>)> {
        let mut out = Vec::new();
        let mut want = vec![0u8; VERIFY_WINDOW];
        let mut got = vec![0u8; VERIFY_WINDOW];
        for (t, d) in self.live() {
            let mut check = CopyCheck::default();
            let r = (|| -> DevResult<()> {
                let mut off = 0u64;
                loop {
                    let _g = self.gate.lock();
                    let len = self.primary.len();
                    if off == 0 && d.len() != len {
                        d.set_len(len)?;
                        check.length_fixed = true;
                    }
                    if off >= len {
                        return Ok(());
                    }
                    let n = (len - off).min(VERIFY_WINDOW as u64) as usize;
                    self.primary.read_at(&mut want[..n], off)?;
                    d.read_at(&mut got[..n], off)?;
                    let fixed = mend(&want[..n], &got[..n], off, |b, at| d.write_at(b, at))?;
                    check.blocks_rewritten += fixed;
                    if fixed > 0 {
                        d.sync()?;
                    }
                    off += n as u64;
                }
            })();
            match r {
                Ok(()) => out.push((*t, Ok(check))),
                Err(e) => {
                    self.set.drop_holder(*t, &e);
                    out.push((*t, Err(e)));
                }
            }
        }
        out
    }

    fn live(&self) -> impl Iterator<Item = &(usize, Arc<dyn Device>)> {
        self.mirrors
            .iter()
            .filter(|(t, _)| !self.set.is_dropped(*t))
    }
}

impl Device for MirrorDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> DevResult<()> {
        self.primary.read_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> DevResult<()> {
        let _g = self.gate.lock();
        self.primary.write_at(buf, off)?;
        for (t, d) in self.live() {
            if let Err(e) = d.write_at(buf, off) {
                self.set.drop_holder(*t, &e);
            }
        }
        Ok(())
    }

    fn sync(&self) -> DevResult<()> {
        if !self.paths.is_empty() && self.watched.due() {
            self.watch();
        }
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
            let failed: Vec<(usize, Fault)> = hs
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

    fn set_len(&self, len: u64) -> DevResult<()> {
        let _g = self.gate.lock();
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
        fn read_at(&self, _: &mut [u8], _: u64) -> DevResult<()> {
            Err(io::Error::other("dead").into())
        }
        fn write_at(&self, _: &[u8], _: u64) -> DevResult<()> {
            Err(io::Error::other("dead").into())
        }
        fn sync(&self) -> DevResult<()> {
            Err(io::Error::other("dead").into())
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

    /// A holder's copy removed, another's replaced (a copy renamed over it), while mounted:
    /// `watch` drops exactly those two (their flags cleared through `on_drop`, once), and
    /// writes go on to the untouched holder. Before `watch`, nothing noticed: the writes
    /// into the open files kept succeeding and `verify` compared those open files.
    #[test]
    fn a_copy_removed_or_replaced_while_mounted_drops_its_holder() {
        use crate::device::FileDevice;
        let dir = std::env::temp_dir().join(format!("ckptfs-mwatch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let open = |name: &str| -> (PathBuf, Arc<dyn Device>) {
            let path = dir.join(name);
            let f = crate::device::new_test_file(&path);
            (path, Arc::new(FileDevice::growable(f).unwrap()))
        };
        let (_, primary) = open("primary");
        let holders: Vec<(PathBuf, Arc<dyn Device>)> =
            ["m1", "m2", "m3"].iter().map(|n| open(n)).collect();
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let d2 = dropped.clone();
        let set = MirrorSet::new(Box::new(move |t| d2.lock().push(t)));
        let dev = MirrorDevice::new(
            primary.clone(),
            holders
                .iter()
                .enumerate()
                .map(|(i, (_, d))| (i + 1, d.clone()))
                .collect(),
            set.clone(),
        )
        .with_paths(holders.iter().map(|(p, _)| p.clone()).collect());
        dev.set_len(8192).unwrap();
        dev.write_at(b"before", 0).unwrap();
        dev.sync().unwrap();
        assert!(dev.watch().is_empty(), "nothing happened yet");
        std::fs::remove_file(&holders[0].0).unwrap();
        let copy = dir.join("m2.copy");
        std::fs::copy(&holders[1].0, &copy).unwrap();
        std::fs::rename(&copy, &holders[1].0).unwrap();
        let found = dev.watch();
        assert_eq!(
            found.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [1, 2],
            "{found:?}"
        );
        assert!(found[0].1.contains("removed"), "{found:?}");
        assert!(found[1].1.contains("replaced"), "{found:?}");
        assert!(dev.watch().is_empty(), "dropped once");
        assert_eq!(*dropped.lock(), [1, 2]);
        assert!(set.is_dropped(1) && set.is_dropped(2) && !set.is_dropped(3));
        dev.write_at(b"after!", 0).unwrap();
        dev.sync().unwrap();
        let mut b = [0u8; 6];
        holders[2].1.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"after!", "the untouched holder is still written");
        holders[1].1.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"before", "the dropped one is not");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `verify` racing with writers of overlapping bytes (seeded): it never takes a write in
    /// flight for damage (no block rewritten while nothing was damaged), every copy equals
    /// the primary after (racing writes landed in one order on all of them),
    /// and damage put into one copy between writes is found and mended, block by block,
    /// with the other copies left alone. `CKPTFS_SEED` replays one seed.
    #[test]
    fn verify_mends_damage_and_never_mistakes_writes_in_flight_for_it() {
        use rand::rngs::SmallRng;
        use rand::{Rng, RngCore, SeedableRng};
        let seeds: Vec<u64> = match std::env::var("CKPTFS_SEED") {
            Ok(s) => vec![s.parse().expect("CKPTFS_SEED is a number")],
            Err(_) => (0..8).collect(),
        };
        const LEN: usize = 3 * VERIFY_WINDOW + 12_345;
        for seed in seeds {
            let set = MirrorSet::new(Box::new(|t| panic!("mirror {t} dropped")));
            let p = Arc::new(MemDevice::new(LEN));
            let m1 = Arc::new(MemDevice::new(LEN));
            let m2 = Arc::new(MemDevice::new(LEN));
            let dev = Arc::new(MirrorDevice::new(
                p.clone(),
                vec![
                    (1, m1.clone() as Arc<dyn Device>),
                    (2, m2.clone() as Arc<dyn Device>),
                ],
                set,
            ));
            let stop = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                for w in 0..3u64 {
                    let (dev, stop) = (&dev, &stop);
                    s.spawn(move || {
                        let mut rng = SmallRng::seed_from_u64(seed * 16 + w);
                        let mut buf = vec![0u8; 3 * 4096];
                        while !stop.load(Ordering::Relaxed) {
                            // Writers overlap, in a hot window shared by all three most of
                            // the time: writes of the same bytes must land in the same
                            // order on every copy.
                            let n = rng.random_range(1..buf.len());
                            let off = if rng.random_bool(0.8) {
                                rng.random_range(0..(4 * 4096 - n) as u64)
                            } else {
                                rng.random_range(0..(LEN - n) as u64)
                            };
                            rng.fill_bytes(&mut buf[..n]);
                            dev.write_at(&buf[..n], off).unwrap();
                        }
                    });
                }
                // The writers stop before any finding is asserted, so a failure fails
                // the test instead of leaving the scope waiting for them.
                let found: Vec<(usize, CopyCheck)> = (0..4)
                    .flat_map(|_| dev.verify())
                    .map(|(t, r)| (t, r.unwrap()))
                    .collect();
                stop.store(true, Ordering::Relaxed);
                for (t, c) in found {
                    assert_eq!(
                        c,
                        CopyCheck::default(),
                        "seed {seed}: mirror {t} mended while undamaged"
                    );
                }
            });
            let whole = |d: &MemDevice| {
                let mut b = vec![0u8; LEN];
                d.read_at(&mut b, 0).unwrap();
                b
            };
            assert!(
                whole(&m1) == whole(&p) && whole(&m2) == whole(&p),
                "seed {seed}"
            );
            // Damage in four distinct blocks of copy 2 (two in one window), the last byte
            // included: exactly those are mended.
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut blocks = std::collections::BTreeSet::new();
            for off in [
                0u64,
                rng.random_range(4096..VERIFY_WINDOW as u64 / 2),
                rng.random_range(VERIFY_WINDOW as u64..2 * VERIFY_WINDOW as u64),
                LEN as u64 - 1,
            ] {
                m2.corrupt(off);
                blocks.insert(off / 4096);
            }
            let found: Vec<(usize, CopyCheck)> = dev
                .verify()
                .into_iter()
                .map(|(t, r)| (t, r.unwrap()))
                .collect();
            assert_eq!(
                found,
                vec![
                    (1, CopyCheck::default()),
                    (
                        2,
                        CopyCheck {
                            blocks_rewritten: blocks.len() as u64,
                            length_fixed: false
                        }
                    )
                ],
                "seed {seed}"
            );
            assert!(whole(&m2) == whole(&p), "seed {seed}: mended");
        }
    }
}
