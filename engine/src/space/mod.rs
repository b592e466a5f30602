//! A backing space: the composition of a layout (placement, lease, publisher, union) with
//! the catalog and the chunk store, file commits and statistics. Formatting is in
//! `create`, opening and composing each layout in `open`, the targets' table, mirrors and
//! `recover` in `layout::targets`; maintenance (gc, check, rebuild, scrub) in their modules.

pub use crate::catalog::Config;
use crate::catalog::{self, Reader, Txn};
use crate::device::{Device, FileDevice};
use crate::error::{Corruption, Error, Missing, Result};
use crate::format::HistoryRecord;
use crate::format::*;
use crate::manifest::{PubExtent, PubNode, PubVersion, Record, Union};
use crate::slots::{Lease, SlotRequest};
use crate::store::ChunkStore;
use crate::targets::{Redundancy, TargetSpec, TargetsTable};
use crate::write::{ChunkIo, ExtentMap, FileState};
use std::fs::{self, File};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod create;
mod group;
mod mirrors;
mod open;
mod watch;
pub(crate) use crate::layout::{
    existing_ancestor, open_private, preallocate, store_table, sync_dir, take_lock,
    write_file_durably, write_superblock, SharedTable,
};
pub use crate::layout::{
    free_disk_bytes, lock_holder, mark_features, read_backing_dir, read_superblock, recover,
    slot_table, Devices, Recovered,
};
pub use open::OnDevices;

/// The smallest reserved space `format` accepts.
pub const MIN_SPACE_BYTES: u64 = 16 << 20;

/// What a commit makes of the revision it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seal {
    /// A complete revision (the last writer closed the file): listed and kept by retention.
    Complete,
    /// An fsync point of a file still being written: durable, not listed, replaced by the
    /// next commit.
    FsyncPoint,
}

/// What a commit does to an unsealed current revision (an earlier fsync point).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Previous {
    /// Replace it: it was only ever an intermediate state of this writer.
    Replace,
    /// Keep it: another handle that wrote it has yet to close and seal it.
    Keep,
}

/// One listed revision of a path.
#[derive(Clone, Debug)]
pub struct RevisionInfo {
    pub id: RevisionId,
    pub rec: RevisionRecord,
    pub current: bool,
}

/// What redundancy the listed (sealed) revisions of a space over several targets have.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RevisionRedundancy {
    /// K: what a revision whose shards are all on healthy targets can lose.
    pub full_tolerance: i64,
    /// (how many more targets they can lose, revisions), most first; below 0: lost (its
    /// chunks in a segment with fewer than M shards left).
    pub listed: Vec<(i64, u64)>,
    /// Revisions short of full redundancy, worst first, at most `LISTED_MAX`.
    pub short: Vec<ShortRevision>,
    pub short_total: u64,
}

impl RevisionRedundancy {
    pub const LISTED_MAX: usize = 100;
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShortRevision {
    pub revision: u64,
    pub history: HistoryId,
    pub can_lose: i64,
}

pub struct Space {
    dir: PathBuf,
    sb: Superblock,
    /// The metadata table: it alone begins write transactions.
    catalog: catalog::Catalog,
    /// The metadata table's device: asked whether it kept room to grow (`ingest`).
    meta: Arc<dyn Device>,
    store: Arc<ChunkStore>,
    /// Held for the life of the Space: its flock is what makes a second mount fail. None for
    /// a space opened on devices (tests), whose caller guarantees exclusive use. Taken
    /// again if its file is removed or replaced while mounted (`watch`).
    lock: parking_lot::Mutex<Option<File>>,
    /// The backing directory's files this open watches (`watch`).
    watch: watch::BackingWatch,
    /// One gc at a time (and a repair of one segment holds it too: no chunk moves then).
    pub(crate) gc_lock: parking_lot::Mutex<()>,
    /// File commits that arrive together share a transaction (`group`).
    commits: group::CommitGroup<catalog::WriteTxn>,
    /// Bumped by every gc under `gc_lock`: a repair pass knows its snapshot of where the
    /// chunks are still holds while this has not changed.
    pub(crate) gc_epoch: std::sync::atomic::AtomicU64,
    /// What gc did since the space was opened (for `stats`).
    pub(crate) gc_totals: parking_lot::Mutex<GcTotals>,
    /// Shared while a reader pins a revision and loads it; exclusive while gc samples the pins
    /// and commits its retention transaction, so a revision is never dropped under a reader
    /// that pinned it after gc started.
    pub(crate) pin_gate: parking_lot::RwLock<()>,
    /// The revisions open files and restores hold (see `pins`).
    pub(crate) pins: Arc<crate::pins::RevisionPins>,
    /// Opened by `open_read_only`: every metadata write transaction is refused, the data
    /// file refuses writes, and the lock is shared.
    read_only: bool,
    /// The slot this space is (slot 0 of a single-slot space) and the data-file segments
    /// it allocates from.
    slot: SlotId,
    segment_range: std::ops::Range<u64>,
    /// The parts of the space only some layouts have (publisher, union, clock, lease,
    /// targets, mirrors). Last, so its lease is released after the table and the store
    /// above have closed.
    pub(crate) layout: crate::layout::Layout,
}

impl Drop for Space {
    fn drop(&mut self) {
        // The store is still open here (fields drop after this): the released header
        // says what the slot holds.
        if let Some(l) = self.lease() {
            l.refresh_usage();
        }
    }
}

/// What the gc runs since the space was opened did (dry runs excluded): the counters
/// `ckptfs stats` reports (a daemon's lifetime; zero offline).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GcTotals {
    pub runs: u64,
    pub revisions_dropped: u64,
    pub bytes_freed: u64,
    pub bytes_copied: u64,
    pub seconds: f64,
}

/// What `ckptfs stats` reports. Its JSON form (serde, field names as here, plus the derived
/// ratios of `StatsReport`) is what the daemon answers and `ckptfs stats --json` prints.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    /// Sum of the sizes of the current (linked) regular files.
    pub logical_bytes: u64,
    /// Bytes of data extents over all kept revisions, current or not (holes excluded): what
    /// would be stored without dedup.
    pub referenced_bytes: u64,
    /// Bytes physically held in the data file for committed chunks (after compression).
    pub stored_bytes: u64,
    /// Uncompressed size of all distinct committed chunks.
    pub raw_chunk_bytes: u64,
    /// Distinct bytes the kept revisions name: per chunk its size, or what its references
    /// cover if less (a chunk a truncate cut, one a later write covered in part), nothing
    /// for a chunk gc has yet to free. What `dedup_ratio` divides by, so it is never below
    /// 1. Absent from an older daemon's answer, hence the default.
    #[serde(default)]
    pub named_chunk_bytes: u64,
    pub chunks: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// fifos, sockets and device nodes
    pub special: u64,
    pub revisions: u64,
    pub reserved_bytes: u64,
    /// Bytes of the data file in use (segments not free, including dead chunks gc has not
    /// reclaimed yet).
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub chunk_avg_bytes: u32,
    /// An earlier backing I/O failure has made the space refuse writes.
    pub failed: bool,
    /// Why (`failed`): the first failure's reason. Absent from the answer of a daemon
    /// started by an older build, hence the default.
    #[serde(default)]
    pub failure: Option<String>,
    /// The backing filesystem is full: the metadata table could not keep room to grow, and
    /// new data gets ENOSPC until room is freed there (`Error::BackingFull`).
    #[serde(default)]
    pub backing_full: bool,
    /// Time spent per data-path stage since the space was opened (empty offline).
    #[serde(with = "crate::write::pipeline::stage_map")]
    pub stages: Vec<crate::write::pipeline::StageTime>,
    /// gc since the space was opened (a daemon's lifetime; zero offline). Absent from the
    /// answer of a daemon started by an older build, hence the default.
    #[serde(default)]
    pub gc: GcTotals,
    /// The cutters' carried chunks now and their spills since the space was opened
    /// (`spill`; zero offline). Absent from an older daemon's answer, hence the default.
    #[serde(default)]
    pub carries: crate::write::spill::CarryTotals,
    /// Where the stored bytes are: live, kept revisions of present files, kept revisions of
    /// removed files (the trash), unreferenced (`usage`).
    #[serde(default)]
    pub split: crate::usage::Split,
    /// File commits since the space was opened, and the metadata transactions they took
    /// (commits that arrive together share one: `group`). Zero offline; absent from an
    /// older daemon's answer, hence the default.
    #[serde(default)]
    pub commits: CommitTotals,
}

/// Drops a group's transaction whose changes failed (`group`).
fn abort_group_txn(txn: catalog::WriteTxn) {
    if let Err(e) = txn.abort() {
        log::warn!("aborting a grouped commit's transaction: {e}");
    }
}

/// See `Stats::commits`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CommitTotals {
    /// File commits (closes and fsyncs that had bytes to commit).
    pub files: u64,
    /// Transactions those file commits were grouped into.
    pub transactions: u64,
    /// Durable metadata transactions of every kind (file commits' groups, namespace syncs):
    /// each costs the table's syncs.
    #[serde(default)]
    pub durable: u64,
    /// Manifest writes of a multi-slot space (appends and snapshots): each costs a sync of
    /// the manifest and one of the slot header.
    #[serde(default)]
    pub publications: u64,
}

impl Stats {
    /// Bytes of the data file in use that hold no committed chunk: dead chunks, padding and
    /// uncommitted saves, which gc's compaction can give back (retention may free more).
    pub fn reclaimable_bytes(&self) -> u64 {
        self.used_bytes.saturating_sub(self.stored_bytes)
    }

    /// Referenced bytes (all kept revisions) per distinct chunk byte: how much dedup saves
    /// (1.0 = nothing). None while no current file holds data: a ratio of kept or removed
    /// revisions only would read as if the space held something deduplicated.
    pub fn dedup_ratio(&self) -> Option<f64> {
        (self.logical_bytes > 0).then_some(())?;
        ratio(self.referenced_bytes, self.named_chunk_bytes)
    }
    /// Distinct chunk bytes per stored byte: how much compression saves. None when nothing
    /// is stored.
    pub fn compression_ratio(&self) -> Option<f64> {
        ratio(self.raw_chunk_bytes, self.stored_bytes)
    }
}

/// `Stats` with the figures derived from it, as the JSON of `ckptfs stats` carries them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StatsReport {
    #[serde(flatten)]
    pub stats: Stats,
    /// null when there is nothing to compare (see `Stats::dedup_ratio`).
    pub dedup_ratio: Option<f64>,
    pub compression_ratio: Option<f64>,
    pub reclaimable_bytes: u64,
}

impl From<Stats> for StatsReport {
    fn from(stats: Stats) -> StatsReport {
        StatsReport {
            dedup_ratio: stats.dedup_ratio(),
            compression_ratio: stats.compression_ratio(),
            reclaimable_bytes: stats.reclaimable_bytes(),
            stats,
        }
    }
}

/// a / b, or None when either is empty (no ratio of nothing).
fn ratio(a: u64, b: u64) -> Option<f64> {
    (a > 0 && b > 0).then(|| a as f64 / b as f64)
}

impl Space {
    /// What `ckptfs advise` needs from this space (this slot's revisions on a multi-slot
    /// space): recent checkpoints measured from the revisions' write times, the failure
    /// model kept in its config, and failed targets since format. Reads at most
    /// `advice::REVISIONS_SCANNED` revisions.
    pub fn advice_inputs(&self) -> Result<crate::advice::AdviceInputs> {
        let r = self.reader()?;
        let writes = r.recent_write_times(crate::advice::REVISIONS_SCANNED)?;
        let config = r.advice_config()?;
        let failures = self.targets_report().map_or(0, |t| {
            t.targets.iter().filter(|t| t.state != "ok").count() as u64
        });
        let now = Timestamp::now();
        let now = now.secs as f64 + now.nanos as f64 / 1e9;
        Ok(crate::advice::AdviceInputs::new(
            now,
            &writes,
            config,
            failures,
            now - self.sb.created_unix_s as f64,
        ))
    }

    pub fn set_advice_config(&self, c: &crate::advice::AdviceConfig) -> Result<()> {
        let txn = self.begin_write(true)?;
        Txn::open(&txn)?.set_advice_config(c)?;
        self.commit(txn)?;
        Ok(())
    }

    /// What redundancy each revision has right now, on a space over several targets: the
    /// worst segment its chunks are in decides how many more targets it can lose. One pass
    /// over the extent table (no data is read). None for a one-target space.
    pub fn revision_redundancy(&self) -> Result<Option<RevisionRedundancy>> {
        let Some(t) = self.layout.targets.as_ref() else {
            return Ok(None);
        };
        let full = t.redundancy().parity as i64;
        let seg = u64::from(self.sb.segment_bytes);
        let revs = self
            .reader()?
            .revisions_by_segments(seg, |s| t.tolerance(s).unwrap_or(i64::MAX))?;
        let mut by: std::collections::BTreeMap<i64, u64> = Default::default();
        let mut short = Vec::new();
        for (rev, rr, tol) in revs {
            if !rr.sealed {
                continue;
            }
            let tol = tol.unwrap_or(full).min(full);
            *by.entry(tol).or_default() += 1;
            if tol < full {
                short.push(ShortRevision {
                    revision: rev.0,
                    history: rr.history,
                    can_lose: tol,
                });
            }
        }
        short.sort_by_key(|s| (s.can_lose, s.revision));
        let short_total = short.len() as u64;
        short.truncate(RevisionRedundancy::LISTED_MAX);
        Ok(Some(RevisionRedundancy {
            full_tolerance: full,
            listed: by.into_iter().rev().collect(),
            short,
            short_total,
        }))
    }

    /// The targets table of a space over targets (`rebuild --replace` edits it).
    pub(crate) fn targets_table(&self) -> Option<&SharedTable> {
        self.layout.targets_table.as_ref()
    }

    /// The erasure-coded placement of a space over several targets.
    pub fn erasure(&self) -> Option<&Arc<crate::targets::Erasure>> {
        self.layout.targets.as_ref()
    }

    /// The targets of a space over several (None for a one-target space).
    pub fn targets_report(&self) -> Option<crate::targets::TargetsReport> {
        self.watch_backing();
        let mut r = self.layout.targets.as_ref()?.report();
        // Before the flags are read: a copy removed or replaced while mounted is no mirror.
        self.watch_mirrors();
        if let Some(t) = &self.layout.targets_table {
            let t = t.lock();
            for (i, rep) in r.targets.iter_mut().enumerate() {
                rep.metadata_mirror = t.mirror.get(i).copied().unwrap_or(false);
            }
        }
        if self.is_shared() {
            r.slot = Some(self.slot.0);
        }
        Some(r)
    }

    /// Records `features` in the superblock (on disk first) unless it has them already.
    /// Called before the first write that needs them, so a build that does not know them
    /// never finds their data without the flag that makes it refuse.
    pub(crate) fn add_features(&mut self, features: Features) -> Result<()> {
        if self.sb.features.contains(features) {
            return Ok(());
        }
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let sb = self.sb.with_features(features);
        write_superblock(&self.dir, &sb)?;
        log::info!(
            "superblock: feature flags now compat {:#x}, ro_compat {:#x}, incompat {:#x} \
             (format version {})",
            sb.features.compat,
            sb.features.ro_compat,
            sb.features.incompat,
            sb.version
        );
        self.sb = sb;
        Ok(())
    }

    /// The codec policy for new chunks. The shuffle codecs mark the superblock first
    /// (`Features::INCOMPAT_SHUFFLE_CODECS`), so builds without them refuse the space
    /// instead of reporting its chunks as corrupt. `Lz4` writes them too, for chunks LZ4
    /// would crawl through (`codec`): spaces are formatted with the flag, and one formatted
    /// before gets it here, but not a multi-slot one, whose superblock every node shares (a
    /// default mount on each node would rewrite it, at once): that keeps to `Lz4Plain`
    /// until a mount with `--codec shuffle` marks it. `Lz4Plain` marks nothing.
    pub fn set_codec_policy(&mut self, policy: crate::codec::Policy) -> Result<()> {
        use crate::codec::Policy;
        let marked = self.sb.features.contains(Features::INCOMPAT_SHUFFLE_CODECS);
        let shared = self.sb.features.contains(Features::INCOMPAT_SLOTS);
        let mut policy = policy;
        if !self.read_only {
            match policy {
                Policy::Lz4Plain => {}
                Policy::Lz4 if !marked && shared => {
                    log::info!(
                        "this multi-slot space was formatted before codecs 2 and 3 were the \
                         default's: arrays LZ4 crawls through are stored as plain LZ4 (a \
                         mount with --codec shuffle marks the space for them)"
                    );
                    policy = Policy::Lz4Plain;
                }
                Policy::Lz4 | Policy::Shuffle => {
                    self.add_features(Features::INCOMPAT_SHUFFLE_CODECS)?
                }
                // Where the float codec does not pay, chunks are stored as `Lz4` stores them,
                // byte-shuffled storms included.
                Policy::Float => self.add_features(
                    Features::INCOMPAT_FLOAT_CODEC.union(Features::INCOMPAT_SHUFFLE_CODECS),
                )?,
            }
        }
        self.store.set_codec_policy(policy);
        Ok(())
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Records the mountpoint in the lock file, so tools can find the mount from the space.
    pub fn set_lock_note(&mut self, note: &str) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let lock = self.lock.get_mut();
        let lock = lock
            .as_ref()
            .ok_or_else(|| Error::Invalid("this space has no lock file".into()))?;
        lock.set_len(0)?;
        lock.write_all_at(note.as_bytes(), 0)?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The slot this space is (0 for a single-slot space).
    pub fn slot(&self) -> SlotId {
        self.slot
    }

    /// The data-file segments this space (slot) allocates from.
    pub(crate) fn segment_range(&self) -> std::ops::Range<u64> {
        self.segment_range.clone()
    }

    /// The lease of a slot of a multi-slot space.
    pub fn lease(&self) -> Option<&Arc<Lease>> {
        self.layout.lease.as_ref().map(|g| &g.0)
    }

    /// The other slots' published namespaces (a multi-slot space).
    pub fn union(&self) -> Option<&Arc<Union>> {
        self.layout.union.as_ref()
    }

    /// Whether this is a slot of a shared namespace (a mounted slot of a multi-slot space).
    pub fn is_shared(&self) -> bool {
        self.layout.union.is_some()
    }

    /// A new stamp of the shared namespace's clock (`stamp`), past every stamp this node has
    /// seen in the other slots' records.
    pub fn stamp(&self) -> u64 {
        match (&self.layout.clock, &self.layout.union) {
            (Some(c), Some(u)) => {
                c.observe(u.max_stamp());
                c.tick()
            }
            _ => crate::slots::now_unix_ns(),
        }
    }

    /// Announces a change of the shared namespace touching `keys` and waits until it may
    /// go on (`nslock`); the intent is withdrawn when the guard drops. `prio`: the
    /// change's first stamp.
    pub fn ns_lock(&self, keys: &[u64], prio: u64) -> Result<crate::nslock::NsGuard<'_>> {
        let (Some(lease), Some(u)) = (self.lease(), &self.layout.union) else {
            return Err(Error::Invalid("not a slot of a shared namespace".into()));
        };
        crate::nslock::lock(lease, u, keys, prio)
    }

    /// A version record of local inode `ino` as other nodes read it: its attributes, its
    /// order among the object's versions, a file's extents with each chunk's stored place.
    /// None for an inode that is gone or is no version.
    fn pub_version(&self, r: &Reader, ino: InodeId) -> Result<Option<PubVersion>> {
        let Some(rec) = r.inode(ino)? else {
            return Ok(None);
        };
        let Some(meta) = r.version(ino)? else {
            return Ok(None);
        };
        let mut extents = Vec::new();
        if rec.kind == NodeKind::File && rec.current_rev.0 != 0 {
            for (off, e) in r.extents(rec.current_rev)? {
                let c = r
                    .chunk(&e.chunk)?
                    .ok_or(Corruption::UnknownChunk(e.chunk))?;
                extents.push(PubExtent {
                    off,
                    len: e.len,
                    chunk_off: e.chunk_off,
                    hash: e.chunk,
                    at: c.offset,
                    stored_len: c.stored_len,
                    raw_len: c.raw_len,
                    codec: c.codec,
                });
            }
        }
        let node = PubNode {
            ino,
            kind: rec.kind,
            perm: rec.perm,
            uid: rec.uid,
            gid: rec.gid,
            mtime: rec.mtime,
            ctime: rec.ctime,
            size: match rec.kind {
                NodeKind::Symlink => rec.target.len() as u64,
                NodeKind::File => rec.size,
                _ => 0,
            },
            // A device node's number travels in the revision field (files only have one).
            rev: match rec.kind {
                NodeKind::File => rec.current_rev.0,
                NodeKind::CharDevice | NodeKind::BlockDevice => rec.rdev as u64,
                _ => 0,
            },
            target: match rec.kind {
                NodeKind::Symlink => rec.target,
                _ => Vec::new(),
            },
            extents: extents.into(),
        };
        Ok(Some(PubVersion { meta, node }))
    }

    /// The committed version records of local inodes `inos` (those that are versions).
    pub fn version_records(&self, inos: &[InodeId]) -> Result<Vec<Record>> {
        let r = self.reader()?;
        let mut out = Vec::with_capacity(inos.len());
        for &i in inos {
            match self.pub_version(&r, i)? {
                Some(v) => out.push(Record::Version(v)),
                None => out.push(Record::Drop(i)),
            }
        }
        Ok(out)
    }

    /// Every record of this slot's part of the shared namespace, as committed: its
    /// bindings and the versions of its inodes.
    pub fn own_records(&self) -> Result<Vec<Record>> {
        let r = self.reader()?;
        let mut out: Vec<Record> = r
            .bindings()?
            .into_iter()
            .map(|(p, n, b)| Record::Bind(p, n, b))
            .collect();
        for (ino, _) in r.versions()? {
            if let Some(v) = self.pub_version(&r, ino)? {
                out.push(Record::Version(v));
            }
        }
        Ok(out)
    }

    /// Publishes `recs` (records of what this slot committed) to the other nodes: appended
    /// to the manifest, or a snapshot of everything when the half is full. Makes pending
    /// namespace changes durable first: nothing is published that a crash could take back.
    pub fn publish(&self, recs: &[Record]) -> Result<()> {
        let Some(p) = &self.layout.publisher else {
            return Ok(());
        };
        if recs.is_empty() {
            return Ok(());
        }
        self.sync_meta_if_dirty()?;
        if p.append(recs)? {
            return Ok(());
        }
        self.publish_snapshot()
    }

    /// Of a slot over targets: restores the redundancy of its manifest area, which holds
    /// no chunks for `repair` to verify (`Publisher::renew`: a short half is re-placed
    /// while it holds nothing published; `rewrite`: the published records are written
    /// afresh too). Returns whether anything was re-placed or rewritten.
    pub(crate) fn renew_manifest(
        &self,
        er: &crate::targets::Erasure,
        rewrite: bool,
    ) -> Result<bool> {
        let Some(p) = &self.layout.publisher else {
            return Ok(false);
        };
        let share = self.sb.slot_share(self.slot);
        let h = self.sb.manifest_half_segments(self.slot);
        let segs = |half: u64| share.start + half * h..share.start + (half + 1) * h;
        self.sync_meta_if_dirty()?;
        let recs = self.own_records()?;
        p.renew(
            &recs,
            rewrite,
            &|half| segs(half).all(|s| !er.needs_rebuild(s)),
            &|half| {
                for s in segs(half) {
                    crate::placement::Placement::prepare(er, SegmentId(s))?;
                }
                Ok(())
            },
        )
    }

    /// Publishes this slot's whole part of the shared namespace as a new manifest
    /// generation (at mount, when a half fills up, after gc moved chunks).
    pub fn publish_snapshot(&self) -> Result<()> {
        let Some(p) = &self.layout.publisher else {
            return Ok(());
        };
        self.sync_meta_if_dirty()?;
        let recs = self.own_records()?;
        p.snapshot(&recs)
    }

    pub fn chunks(&self) -> &dyn ChunkIo {
        &*self.store
    }

    /// Copies the bytes of another slot's published extents within `[off, off +
    /// out.len())` into `out` (which starts at file offset `off`; holes left untouched).
    /// The chunks are read by the one chunk reader this slot's own files use (its cache,
    /// coalescing of adjacent chunks into one device read, verification, and the
    /// placement's repair), at the locations the owner published, and painted by the one
    /// painter (`ExtentMap::paint`). `Corrupt` when a location is stale (the owner moved
    /// the chunk): the caller reads the owner's manifest again.
    pub fn read_published(
        &self,
        extents: &[&crate::manifest::PubExtent],
        off: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let end = off + out.len() as u64;
        let mut pieces = Vec::with_capacity(extents.len());
        let mut chunks = Vec::with_capacity(extents.len());
        for e in extents {
            let (s, t) = (e.off.max(off), e.off.saturating_add(e.len as u64).min(end));
            if s < t {
                // A malformed offset saturates, and `ExtentMap::paint` reports it.
                let chunk_off = u32::try_from(s - e.off)
                    .ok()
                    .and_then(|d| e.chunk_off.checked_add(d))
                    .unwrap_or(u32::MAX);
                let ext = crate::format::Extent {
                    chunk: e.hash,
                    chunk_off,
                    len: (t - s) as u32,
                };
                pieces.push((s, ext));
                chunks.push((e.hash, e.chunk_record()));
            }
        }
        let chunks = self.store.get_many_at(&chunks)?;
        crate::write::ExtentMap::paint(&pieces, &chunks, off, |at, bytes| {
            out[at..at + bytes.len()].copy_from_slice(bytes)
        })
    }

    /// Starts reading another slot's published extents' chunks ahead of a sequential
    /// reader (`ChunkStore::prefetch_at`: the read-ahead this slot's files get).
    pub fn prefetch_published(&self, extents: &[&crate::manifest::PubExtent]) {
        self.store
            .prefetch_at(extents.iter().map(|e| (e.hash, e.chunk_record())).collect())
    }

    /// Counts a FUSE request read from the kernel in the `transport` stage (`cpu_ns`: the
    /// FUSE layer's weighted sample, when it took one).
    pub fn count_transport(&self, bytes: usize, cpu_ns: Option<u64>) {
        self.store.stages().transport.add_cpu(bytes, cpu_ns);
    }

    /// Counts a dispatched FUSE request in the `dispatch` stage (`cpu_ns`: the FUSE layer's
    /// weighted sample of the dispatch's CPU less its stages', when it took one).
    pub fn count_dispatch(&self, cpu_ns: Option<u64>) {
        self.store.stages().dispatch.add_cpu(0, cpu_ns);
    }

    /// The `reply` stage: the copy of a read's bytes into its reply
    /// (`ExtentMap::read_pieces_to`) and the kernel's copy of the reply (timed in the mount).
    pub fn reply_stage(&self) -> &crate::write::pipeline::Stage {
        &self.store.stages().reply
    }

    /// Takes a write request's bytes into `file`, timed as the `ingest` stage.
    pub fn ingest(&self, file: &mut FileState, off: u64, data: &[u8]) -> Result<()> {
        // The backing filesystem filled up: no new data, so the commits under way keep the
        // table's room (a table write the filesystem refused would fail the whole space).
        if self.meta.room_low() {
            return Err(Error::BackingFull);
        }
        self.store
            .stages()
            .ingest
            .time(data.len(), || file.write(&*self.store, off, data))
    }

    /// `ingest` of bytes shared with the caller (`FileState::write_shared`): a sequential
    /// write of half a stream segment or more is cut and stored from the caller's buffer,
    /// uncopied.
    pub fn ingest_shared(
        &self,
        file: &mut FileState,
        off: u64,
        data: crate::write::pipeline::SharedBytes,
    ) -> Result<()> {
        if self.meta.room_low() {
            return Err(Error::BackingFull);
        }
        let n = data.len();
        self.store
            .stages()
            .ingest
            .time(n, || file.write_shared(&*self.store, off, data))
    }

    /// The chunk store itself: for the engine's own tests and benchmarks, which measure its
    /// caches and pools. The `fs` and `mount` crates use the methods below instead.
    #[doc(hidden)]
    pub fn store(&self) -> &ChunkStore {
        &self.store
    }

    /// Usable bytes of the space (this slot's share of a multi-slot space).
    pub fn capacity(&self) -> u64 {
        self.store.capacity()
    }

    /// Bytes of a segment, the unit the space is allocated and freed in.
    pub fn segment_bytes(&self) -> u64 {
        self.store.segment_bytes()
    }

    /// Bytes free for new chunks now (see `ChunkStore::free_bytes`).
    pub fn free_bytes(&self) -> u64 {
        self.store.free_bytes()
    }

    /// An earlier write or sync to the backing space failed: the space refuses changes
    /// until it is opened again (sticky failure).
    pub fn is_failed(&self) -> bool {
        self.store.is_failed()
    }

    /// Starts reading chunks a sequential reader will ask for soon (`ChunkStore::prefetch`).
    pub fn prefetch(&self, chunks: Vec<ChunkHash>) {
        self.store.prefetch(chunks)
    }

    /// Pins chunks another file's extents name, for a metadata-only copy
    /// (`ChunkStore::pin_stored`).
    pub fn pin_stored(&self, chunks: &[ChunkHash]) -> Result<crate::pins::ChunkPins> {
        self.store.pin_stored(chunks)
    }

    /// Housekeeping the daemon runs a few times a second: frees the spare read buffers
    /// when reads stopped, and returns segments a gc emptied whose grace is over.
    pub fn idle_tick(&self) {
        self.store.release_idle_read_buffers();
        self.store.release_due(false);
    }

    /// Forgets the decoded chunks this mount keeps (`ChunkStore::drop_cache`).
    pub fn drop_caches(&self) {
        self.store.drop_cache()
    }

    /// Store threads for submitted pieces (0: on the submitting thread).
    pub fn set_workers(&self, n: usize) {
        self.store.set_workers(n)
    }

    pub fn workers(&self) -> usize {
        self.store.workers()
    }

    /// Compresses new chunks in batches with `codec` (the GPU) from now on; `None`: LZ4
    /// on the store threads (`ChunkStore::set_batch_codec`).
    pub fn set_batch_codec(&self, codec: Option<Arc<dyn ckptfs_kernels::BatchCodec>>) {
        self.store.set_batch_codec(codec)
    }

    /// How predicted chunks are confirmed: by fingerprint where one is known, or by blake3
    /// (`--confirm`; `predict`'s module doc).
    pub fn confirm_by_fingerprint(&self, on: bool) {
        self.store.confirm_by_fingerprint(on)
    }

    /// Where bytes changed in place are cut: at the previous revision's boundaries, or by
    /// content (`--cuts`; `predict`'s module doc).
    pub fn follow_changes(&self, on: bool) {
        self.store.follow_changes(on)
    }

    /// The committed record of a chunk, if it is committed.
    pub fn committed_record(&self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        self.store.committed_record(h)
    }

    /// The catalog itself: for the engine's tests that damage a space on purpose
    /// (`Catalog::raw`). Everything else reads and writes through `reader` and `ns_write`.
    #[doc(hidden)]
    pub fn catalog(&self) -> &catalog::Catalog {
        &self.catalog
    }

    /// Runs a namespace change in one write transaction. `durable` commits make it (and every
    /// earlier non-durable commit) survive a crash; the others are ordered but may be lost.
    pub fn ns_write<R, E: From<Error>>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut Txn) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        if self.read_only {
            return Err(Error::ReadOnly.into());
        }
        if self.store.is_failed() {
            return Err(Error::Failed.into());
        }
        let txn = self.begin_write(durable)?;
        let r = {
            let mut t = Txn::open(&txn)?;
            f(&mut t)
        };
        match r {
            Ok(v) => {
                self.commit(txn)?;
                Ok(v)
            }
            Err(e) => {
                txn.abort()?;
                Err(e)
            }
        }
    }

    /// Begins a metadata transaction (`Catalog::begin`: the durability policy), refused on
    /// a read-only space and after a failed write (sticky failure).
    pub(crate) fn begin_write(&self, durable: bool) -> Result<catalog::WriteTxn> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if self.store.is_failed() {
            return Err(Error::Failed);
        }
        self.catalog.begin(durable)
    }

    /// Commits a metadata transaction. A failed commit is sticky like a failed data write:
    /// the table's state on disk is unknown, so nothing more may be acknowledged.
    ///
    /// First (at most once per `device::WATCH_INTERVAL`) the backing directory's files are
    /// looked at (`watch`): a commit into a table or data file that was removed or replaced,
    /// or while a second mount holds the lock, is refused rather than acknowledged.
    pub(crate) fn commit(&self, txn: catalog::WriteTxn) -> Result<()> {
        self.watch_backing_due();
        if self.store.is_failed() {
            // Dropping the transaction aborts it.
            return Err(Error::Failed);
        }
        self.catalog
            .commit(txn)
            .map_err(|e| self.store.fail_with(e))
    }

    /// Runs `load` under the pin gate and pins the revision it returns before the gate
    /// opens again (see `pins`): gc keeps that revision until the pin is dropped. `ino`:
    /// the open inode the pin belongs to, which gc then keeps too even when unlinked.
    pub fn pin<T, E: From<Error>>(
        &self,
        ino: Option<InodeId>,
        load: impl FnOnce() -> std::result::Result<(RevisionId, T), E>,
    ) -> std::result::Result<(crate::pins::RevisionPin, T), E> {
        let _gate = self.pin_gate.read();
        let (rev, t) = load()?;
        Ok((self.pins.pin(rev, ino), t))
    }

    /// Counts one kernel reference to `ino` (a lookup or a create the kernel is answered
    /// with) if its record exists; false if it does not (gc removed it since the caller
    /// read its name: look the name up again). Under the pin gate, so gc either samples the
    /// reference or has committed the removal this check sees; gc keeps a held inode's
    /// record, unlinked or not, until `forget_inode` (see `pins`).
    pub fn hold_inode(&self, ino: InodeId) -> Result<bool> {
        let _gate = self.pin_gate.read();
        if self.get_inode(ino)?.is_none() {
            return Ok(false);
        }
        self.pins.hold(ino);
        Ok(true)
    }

    /// File commits since the space was opened (`Stats::commits`).
    pub fn commit_count(&self) -> u64 {
        self.commits.counts().0
    }

    /// The kernel forgot `n` references to `ino` (FUSE FORGET).
    pub fn forget_inode(&self, ino: InodeId, n: u64) {
        self.pins.forget(ino, n);
    }

    /// Waits until the kernel has forgotten every one of `inos` (after it was told to drop
    /// their names), at most `limit`; whether it has.
    pub fn wait_forgotten(&self, inos: &[InodeId], limit: std::time::Duration) -> bool {
        self.pins.wait_forgotten(inos, limit)
    }

    /// A read snapshot of the catalog.
    pub(crate) fn reader(&self) -> Result<Reader> {
        self.catalog.reader()
    }

    pub fn get_inode(&self, ino: InodeId) -> Result<Option<InodeRecord>> {
        self.reader()?.inode(ino)
    }

    /// The extended attributes of `ino`.
    pub fn xattrs(&self, ino: InodeId) -> Result<Xattrs> {
        self.reader()?.xattrs(ino)
    }

    /// One extended attribute of `ino`.
    pub fn xattr(&self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.reader()?.xattr(ino, name)
    }

    /// What revision `rev` recorded of its file's extended attributes.
    pub fn revision_xattrs(&self, rev: RevisionId) -> Result<Xattrs> {
        self.reader()?.revision_xattrs(rev)
    }

    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        self.reader()?.lookup(parent, name)
    }

    pub fn list_dir(
        &self,
        dir: InodeId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<catalog::DirEntry>> {
        self.reader()?.list_dir(dir, after, limit)
    }

    /// The extent map of a committed revision.
    pub fn load_map(&self, rev: RevisionId) -> Result<ExtentMap> {
        if rev.0 == 0 {
            return Ok(ExtentMap::new());
        }
        load_map_from(&self.reader()?, rev)
    }

    /// Opens a file's committed content for reading and writing.
    pub fn load_file(&self, rec: &InodeRecord) -> Result<FileState> {
        let rev = rec.current_rev;
        // A revision without its record has no extent rows either, and would load as a
        // file of holes (zeros, not its bytes): a current revision that is gone is a
        // damaged catalog, answered EIO, never read as zeros.
        let map = if rev.0 == 0 {
            ExtentMap::new()
        } else {
            // One snapshot for both reads.
            let r = self.reader()?;
            if r.revision(rev)?.is_none() {
                return Err(Corruption::Missing(Missing::Revision(rev)).into());
            }
            load_map_from(&r, rev)?
        };
        if let Some((o, e)) = map.iter().next_back() {
            if o + e.len as u64 > rec.size {
                return Err(Corruption::Record {
                    record: "extent map",
                    why: format!("it reaches past the size of its file ({} bytes)", rec.size),
                }
                .into());
            }
        }
        // A file opened here is often rewritten next (O_TRUNC with a fixed checkpoint name) or
        // read by a restarted job whose next checkpoint resembles it: predict its chunks.
        self.store.learn(map.iter(), self.sb.chunk.max_bytes);
        let state = FileState::new(self.sb.chunk, map, rec.size, self.store.new_pins());
        // Of a shared namespace, any file may be a layer under or over other nodes' (it
        // becomes one when another node writes it, also while it is open here): its holes
        // and zeros are kept as written from the start.
        Ok(match self.layout.union.is_some() {
            true => state.into_layered(),
            false => state,
        })
    }

    /// Commits `file` (after `finish`) as a new revision of `ino`'s history, with `rec` as its
    /// inode record. Protocol: write out and sync the data file, then one durable metadata
    /// transaction names the new chunks, the revision and its extents, and records the
    /// segments taken since the last commit. A crash before the transaction commits leaves
    /// the previous revision current and intact: new chunks only go to segments that were
    /// free in the committed metadata. An unsealed current revision (an fsync point) is
    /// replaced rather than kept, so fsync adds no listed revision.
    pub fn commit_file(
        &self,
        ino: InodeId,
        file: &mut FileState,
        rec: &mut InodeRecord,
        seal: Seal,
    ) -> Result<RevisionId> {
        self.commit_file_keeping(ino, file, rec, seal, Previous::Replace, None)
    }

    /// `commit_file`, saying what becomes of an unsealed current revision, and recording in
    /// the same transaction the truncate `clip` (stamp, length) an O_TRUNC open of a shared
    /// namespace's layer made (its version record's `clip_stamp`/`clip_len`): one durable
    /// commit for the close, and no crash can leave the truncate recorded without the bytes
    /// that go with it.
    pub fn commit_file_keeping(
        &self,
        ino: InodeId,
        file: &mut FileState,
        rec: &mut InodeRecord,
        seal: Seal,
        previous: Previous,
        clip: Option<(u64, u64)>,
    ) -> Result<RevisionId> {
        assert_eq!(rec.kind, NodeKind::File);
        assert!(
            rec.history != HistoryId::NONE,
            "regular file without a history"
        );
        let t_commit = self.store.stages().commit.start();
        // Every segment this file's chunks went to was taken when they were appended
        // (before the file was settled), so it is in this list.
        let taken = self.store.taken_segments();
        // In a transaction shared with the commits that arrive with this one (`group`);
        // the changes start from the caller's record each time they are applied. Whoever
        // commits the group first writes out and syncs the data file: one sync covers the
        // chunks of every member (appended before they joined), and while it waits for the
        // disk, more commits gather for the next group.
        //
        // (Not synced beforehand, outside the group, though the group's transaction holds
        // the table's one writer while it syncs: with writers streaming other files, the
        // group found new bytes to sync again, and a step of 4 writers of 64 MiB files
        // wrote 10-20% slower with 10-40% more daemon CPU per GiB.)
        let (rev, applied) = self.commits.run(
            || self.begin_write(true),
            |txn| self.commit_group_txn(txn),
            abort_group_txn,
            |txn| {
                let mut rec = rec.clone();
                let mut t = Txn::open(txn)?;
                let rev = t.next_revision_id()?;
                t.mark_taken(&taken)?;
                // The namespace owns nlink, the history and which revision is current (a
                // rename or unlink may have changed them since the caller's copy was taken):
                // take them from the stored record, inside this transaction.
                if let Some(stored) = t.get_inode(ino)? {
                    rec.adopt_namespace(&stored);
                }
                let prev = rec.current_rev;
                let replace = prev.0 != 0
                    && previous == Previous::Replace
                    && t.revision(prev)?
                        .is_some_and(|p| !p.sealed && p.history == rec.history);
                let rr = RevisionRecord {
                    size: file.size(),
                    committed: Timestamp::now(),
                    new_stored_bytes: 0,
                    sealed: seal == Seal::Complete,
                    history: rec.history,
                    write_ms: file.write_ms(),
                };
                let pending = |h: &ChunkHash| self.store.pending_record(h);
                if replace {
                    t.replace_revision(prev, rev, &rr, file.map().iter(), ino, pending)?;
                } else {
                    t.put_revision(rev, &rr, file.map().iter(), ino, pending)?;
                }
                rec.size = file.size();
                rec.current_rev = rev;
                t.put_inode(ino, &rec)?;
                if let Some((stamp, len)) = clip {
                    if let Some(mut m) = t.version(ino)? {
                        m.created = m.created.max(stamp);
                        m.clip_stamp = stamp;
                        m.clip_len = len;
                        t.put_version(ino, &m)?;
                    }
                }
                Ok((rev, rec))
            },
            true,
        )?;
        *rec = applied;
        self.store.stages().commit.stop(t_commit, 0);
        self.store.recorded_taken(&taken);
        // Durable now: the pins of the chunks this commit names can go.
        drop(file.take_pins());
        // The next revision of this file (or of one like it) is cut by predicting these
        // chunks again. Complete revisions only: an fsync point's map is one the file's own
        // close will teach again, and a file fsynced often would relearn it each time.
        if seal == Seal::Complete {
            self.store.learn(file.map().iter(), self.sb.chunk.max_bytes);
        }
        Ok(rev)
    }

    /// Commits a group's transaction (`group`): the data file first (one sync covers the
    /// chunks of every member, appended before they joined), then the table.
    fn commit_group_txn(&self, txn: catalog::WriteTxn) -> Result<()> {
        match self.store.flush_sync() {
            Ok(()) => self.commit(txn),
            Err(e) => {
                abort_group_txn(txn);
                Err(e)
            }
        }
    }

    /// Tests: holds every file commit back until the guard drops (as if one were being
    /// made durable), so that the commits started meanwhile gather into one transaction.
    #[doc(hidden)]
    pub fn hold_commits(&self) -> impl Drop + '_ {
        self.commits.hold()
    }

    /// Tests: waits until `n` file commits are held back by `hold_commits`.
    #[doc(hidden)]
    pub fn wait_for_held_commits(&self, n: usize) {
        self.commits.wait_for_waiting(n)
    }

    /// Marks a revision complete: its file's last writer has let go of it. `file` is the
    /// file's state, whose chunk sequence the cutters learn now: a revision committed at an
    /// fsync point was not learned then (`commit_file`), and a file fsynced before its close
    /// has nothing left to commit at the close, so it would never be learned, and its next
    /// revision would be cut by content throughout (every checkpoint of a job that fsyncs).
    pub fn seal(&self, rev: RevisionId, file: &FileState) -> Result<()> {
        let txn = self.begin_write(true)?;
        if !Txn::open(&txn)?.seal(rev)? {
            txn.abort()?;
            return Ok(());
        }
        self.commit(txn)?;
        self.store.learn(file.map().iter(), self.sb.chunk.max_bytes);
        Ok(())
    }

    pub fn config(&self) -> Result<Config> {
        self.reader()?.config()
    }

    pub fn set_config(&self, c: &Config) -> Result<()> {
        let txn = self.begin_write(true)?;
        Txn::open(&txn)?.set_config(c)?;
        self.commit(txn)?;
        Ok(())
    }

    /// Walks `path` (relative to the root, `/`-separated) through the namespace.
    pub fn resolve(&self, path: &[u8]) -> Result<Option<InodeId>> {
        let mut ino = InodeId::ROOT;
        for part in path.split(|b| *b == b'/').filter(|p| !p.is_empty()) {
            match self.lookup(ino, part)? {
                Some(i) => ino = i,
                None => return Ok(None),
            }
        }
        Ok(Some(ino))
    }

    /// The history of `path`: that of the file there now, else that of the most recently
    /// unlinked file that lived there and is still retained.
    pub fn history_of_path(&self, path: &[u8]) -> Result<Option<HistoryId>> {
        if let Some(ino) = self.resolve(path)? {
            if let Some(rec) = self.get_inode(ino)? {
                if rec.kind == NodeKind::File {
                    return Ok(Some(rec.history));
                }
            }
        }
        let want: Vec<u8> = path
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join(&b'/');
        self.reader()?.unlinked_history_at(&want)
    }

    /// The history of the most recently unlinked file that lived at `path` (components
    /// joined by '/'), if it is still retained.
    pub fn unlinked_history_at(&self, path: &[u8]) -> Result<Option<HistoryId>> {
        self.reader()?.unlinked_history_at(path)
    }

    /// History ids greater than `after`, at most `limit`.
    pub fn history_ids(&self, after: HistoryId, limit: usize) -> Result<Vec<HistoryId>> {
        self.reader()?.history_ids(after, limit)
    }

    pub fn history(&self, hid: HistoryId) -> Result<HistoryRecord> {
        self.reader()?.history(hid)
    }

    /// The listed revisions of a history, oldest first: the complete ones. An fsync point
    /// (the content of a file still being written) is durable but not listed.
    pub fn revisions(&self, hid: HistoryId) -> Result<Vec<RevisionInfo>> {
        let h = self.history(hid)?;
        let current = if h.unlinked.is_none() {
            self.get_inode(h.ino)?.map(|r| r.current_rev)
        } else {
            None
        };
        let r = self.reader()?;
        let mut out = Vec::new();
        for rev in r.history_revisions(hid)? {
            let rec = r
                .revision(rev)?
                .ok_or(Corruption::Missing(Missing::Revision(rev)))?;
            let is_current = current == Some(rev);
            if rec.sealed {
                out.push(RevisionInfo {
                    id: rev,
                    rec,
                    current: is_current,
                });
            }
        }
        Ok(out)
    }

    pub fn revision(&self, rev: RevisionId) -> Result<Option<RevisionRecord>> {
        self.reader()?.revision(rev)
    }

    /// A read-only file state holding the content of a revision.
    pub fn load_revision(&self, rev: RevisionId) -> Result<FileState> {
        let rr = self
            .revision(rev)?
            .ok_or_else(|| Error::Invalid(format!("no revision {}", rev.0)))?;
        Ok(FileState::new(
            self.sb.chunk,
            self.load_map(rev)?,
            rr.size,
            self.store.new_pins(),
        ))
    }

    /// Makes every earlier non-durable metadata commit durable (fsync of a directory). In
    /// the file commits' group (`group`): a sync that arrives while commits are gathering
    /// rides in their transaction instead of costing one of its own.
    pub fn sync_meta(&self) -> Result<()> {
        self.commits
            .run(
                || self.begin_write(true),
                |txn| self.commit_group_txn(txn),
                abort_group_txn,
                |_| Ok(()),
                false,
            )
            .map(drop)
    }

    /// `sync_meta` when a namespace change is not yet durable; nothing otherwise. A close
    /// that had no data to commit calls this, so a file created empty (a "done" marker) or an
    /// unlink before it survives a crash once close returns.
    pub(crate) fn sync_meta_if_dirty(&self) -> Result<()> {
        self.sync_meta_since(self.catalog.mark())
    }

    /// A mark of the namespace changes made so far, for `sync_meta_since`.
    pub fn meta_mark(&self) -> u64 {
        self.catalog.mark()
    }

    /// `sync_meta` unless every namespace change made before `mark` was taken is durable
    /// already (a durable commit began after them): what a close owes the changes that came
    /// before it, and not the ones other threads make meanwhile.
    pub fn sync_meta_since(&self, mark: u64) -> Result<()> {
        if !self.catalog.durable_since(mark) {
            self.sync_meta()?;
        }
        Ok(())
    }

    pub fn stats(&self) -> Result<Stats> {
        let r = self.reader()?;
        let mut s = Stats {
            reserved_bytes: self.store.capacity(),
            free_bytes: self.store.free_bytes(),
            chunk_avg_bytes: self.sb.chunk.avg_bytes,
            failed: {
                self.watch_backing();
                self.store.is_failed()
            },
            failure: self.store.failure(),
            backing_full: self.meta.room_low(),
            stages: self.store.stages().snapshot(),
            gc: self.gc_totals.lock().clone(),
            carries: self.store.pipeline().carries.totals(),
            commits: {
                let (files, transactions) = self.commits.counts();
                CommitTotals {
                    files,
                    transactions,
                    durable: self.catalog.durable_commits(),
                    publications: self.layout.publisher.as_ref().map_or(0, |p| p.written()),
                }
            },
            ..Stats::default()
        };
        s.used_bytes = s.reserved_bytes - s.free_bytes;
        r.for_each_inode(|_, rec| {
            if rec.nlink == 0 {
                return;
            }
            match rec.kind {
                NodeKind::Dir => s.dirs += 1,
                NodeKind::Symlink => s.symlinks += 1,
                NodeKind::Fifo
                | NodeKind::Socket
                | NodeKind::CharDevice
                | NodeKind::BlockDevice => s.special += 1,
                NodeKind::File => {
                    s.files += 1;
                    s.logical_bytes += rec.size;
                }
            }
        })?;
        s.dirs = s.dirs.saturating_sub(1); // the root is not counted
        r.for_each_extent(|e| s.referenced_bytes += e.len as u64)?;
        s.revisions = r.revision_count()?;
        r.for_each_chunk(|_, c| {
            s.chunks += 1;
            s.stored_bytes += c.stored_len as u64;
            s.raw_chunk_bytes += c.raw_len as u64;
            Ok(())
        })?;
        s.named_chunk_bytes = crate::usage::named_bytes(&r, s.chunks)?;
        s.split = crate::usage::split(&r, s.stored_bytes)?;
        Ok(s)
    }
}

/// The extent map of revision `rev` as `r` reads it.
fn load_map_from(r: &Reader, rev: RevisionId) -> Result<ExtentMap> {
    let mut map = ExtentMap::new();
    for (off, e) in r.extents(rev)? {
        map.push_loaded(off, e)?;
    }
    Ok(map)
}
