//! A backing space: the composition of a layout (placement, lease, publisher, union) with
//! the catalog and the chunk store, file commits and statistics. Formatting is in
//! `create`, opening and composing each layout in `open`, the targets' table, mirrors and
//! `recover` in `layout::targets`; maintenance (gc, check, rebuild, scrub) in their modules.

pub use crate::catalog::Config;
use crate::catalog::{self, Reader, Txn};
use crate::device::{Device, FileDevice};
use crate::error::{Corruption, Error, Missing, Result};
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
mod deferred;
mod export;
mod faces;
mod group;
mod mirrors;
mod namespace;
mod open;
mod watch;
pub(crate) use crate::layout::{
    existing_ancestor, open_private, preallocate, store_table, sync_dir, take_lock,
    write_superblock, SharedTable,
};
pub use crate::layout::{
    free_disk_bytes, lock_holder, mark_features, read_backing_dir, read_superblock, recover,
    slot_table, write_file_durably, Devices, Recovered,
};
pub use export::{CheckedChunk, Tree, TreeNode};
pub use faces::{Data, Files, Pins, Report, Settings, Slots, Stages, Tuning};
pub use namespace::Namespace;
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
    /// What gc and the segment repairs coordinate through (see `GcState`).
    gc: GcState,
    /// File commits that arrive together share a transaction (`group`).
    commits: group::CommitGroup<catalog::WriteTxn>,
    /// Held by the thread making a due checkpoint (`after_commit`).
    checkpoint_turn: parking_lot::Mutex<()>,
    /// Closes are durable when they return (`set_close_durable`).
    close_durable: std::sync::atomic::AtomicBool,
    /// Attribute changes of files open for writing, applied by the next write transaction
    /// (`deferred`).
    deferred: deferred::Deferred,
    /// Held by every namespace transaction (`ns_write`) from its start to its commit, and
    /// by a create being checked and held (`Namespace::create_file`): what a held create
    /// was checked against stays true until a transaction applies it (`deferred`).
    ns_gate: parking_lot::Mutex<()>,
    /// Held from a transaction's commit until what it applied is settled (`commit_quiet`),
    /// and while the next one takes what is held (`begin_write`): a held create is never
    /// taken by a transaction after the one that applied it committed.
    commit_gate: parking_lot::Mutex<()>,
    /// Shared while a reader pins a revision and loads it; exclusive while gc samples the pins
    /// and commits its retention transaction, so a revision is never dropped under a reader
    /// that pinned it after gc started.
    pin_gate: parking_lot::RwLock<()>,
    /// The revisions open files and restores hold (see `pins`).
    pins: Arc<crate::pins::RevisionPins>,
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
    layout: crate::layout::Layout,
}

impl Drop for Space {
    fn drop(&mut self) {
        // redb's close makes the transactions committed without a sync the table's state:
        // the chunks they name must be in the data file first (with a journal, a small
        // commit's chunks may still be in the store's buffer, their bytes only in the
        // journal). If that fails, the space fails, the table is not written any more, and
        // the next open applies the journal instead.
        if !self.read_only && !self.store.is_failed() {
            if let Err(e) = self.store.flush_sync() {
                log::error!("writing out the data file at close failed: {e}");
            }
        }
        // The store is still open here (fields drop after this): the released header
        // says what the slot holds.
        if let Some(l) = self.slots().lease() {
            l.refresh_usage();
        }
    }
}

/// What gc and the segment repairs (`maintenance`) coordinate through: one of them at a
/// time (a repair of a segment takes the same turn, so no chunk moves under it), the count of
/// gcs begun (a repair's snapshot of where chunks lie holds while it has not changed), and
/// what the gcs since the open did. Maintenance reaches it as `Space::gc_state`, not as
/// fields of the space.
#[derive(Default)]
pub(crate) struct GcState {
    turn: parking_lot::Mutex<()>,
    epoch: std::sync::atomic::AtomicU64,
    totals: parking_lot::Mutex<GcTotals>,
}

impl GcState {
    /// One gc or one segment repair at a time: held while it runs.
    pub(crate) fn turn(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.turn.lock()
    }

    /// Chunks may move and segments be freed from now on: a repair's snapshot of where
    /// chunks lie, taken before, is stale. Called by gc under its turn.
    pub(crate) fn begin_moves(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many gcs have begun moving chunks.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// What the gcs since the open did (`ckptfs stats`).
    pub(crate) fn totals(&self) -> parking_lot::MutexGuard<'_, GcTotals> {
        self.totals.lock()
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
    /// Chunks (and their stored bytes) held only by the object-store tier, fetched on
    /// demand (a space mounted from a bucket): not in `chunks` or `stored_bytes`. Absent
    /// from an older daemon's answer, hence the default.
    #[serde(default)]
    pub remote_chunks: u64,
    #[serde(default)]
    pub remote_bytes: u64,
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
    /// When a close is durable: `close` (when it returns) or `fsync` (at the next fsync,
    /// directory fsync or unmount; `ckptfs mount --durability`). `close` offline; empty in
    /// an older daemon's answer.
    #[serde(default)]
    pub durability: String,
    /// Durable commits go through the journal (a single-slot space on a data file).
    #[serde(default)]
    pub journal: bool,
    /// Of a multi-slot space's mount: when it sees other nodes' changes, `strict` or
    /// `close-to-open` (`ckptfs mount --coherence`, set by the mount); empty otherwise.
    #[serde(default)]
    pub coherence: String,
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
    /// The targets table of a space over targets (`rebuild --replace` edits it).
    pub(crate) fn targets_table(&self) -> Option<&SharedTable> {
        self.layout.targets_table.as_ref()
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
                    Features::INCOMPAT_FLOAT_CODEC
                        .union(Features::INCOMPAT_FLOAT_ROTATE3)
                        .union(Features::INCOMPAT_SHUFFLE_CODECS),
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
        let recs = self.slots().own_records()?;
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

    /// The chunk store itself: for the engine's own tests and benchmarks, which measure its
    /// caches and pools. The `fs` and `mount` crates use the methods below instead.
    #[doc(hidden)]
    pub fn store(&self) -> &ChunkStore {
        &self.store
    }

    /// What gc and the segment repairs coordinate through (`maintenance`).
    pub(crate) fn gc_state(&self) -> &GcState {
        &self.gc
    }

    /// The catalog itself: for the engine's tests that damage a space on purpose
    /// (`Catalog::raw`). Everything else reads and writes through `reader` and `ns_write`.
    #[doc(hidden)]
    pub fn catalog(&self) -> &catalog::Catalog {
        &self.catalog
    }

    /// Runs a change of the tables in one write transaction: the typed namespace
    /// operations (`ns`) and the engine's own changes go through it. Public for the
    /// engine's tests and benchmarks, which build odd states on purpose; the filesystem
    /// uses `ns()` (`engine/tests/layering.rs` checks). `durable` commits make it (and
    /// every earlier non-durable commit) survive a crash; the others are ordered but may
    /// be lost.
    #[doc(hidden)]
    pub fn ns_write<R, E: From<Error>>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut Txn) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        let gate = self.ns_gate.lock();
        let txn = self.begin_write(durable)?;
        let r = {
            let mut t = Txn::open(&txn)?;
            f(&mut t)
        };
        match r {
            Ok(v) => {
                let record = self.commit_unwritten(txn)?;
                // Other namespace changes need not wait while this one's record is written
                // (behind a flush under way, perhaps).
                drop(gate);
                self.write_out(record)?;
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
        self.refuse_changes()?;
        let txn = self.catalog.begin(durable)?;
        // Held changes come first, before this transaction's own (`deferred`).
        self.apply_held(&txn, true)?;
        Ok(txn)
    }

    /// Applies to `txn` what is held (`deferred`) that it has not applied yet: creates,
    /// then attribute changes (which may be of a file created since). At its beginning
    /// (`begin_write`, `first`), and in a commit group's transaction before each member's
    /// change: a file created and closed while the group gathered must find its create
    /// applied, and its close owes durability to every change made before it.
    fn apply_held(&self, txn: &catalog::WriteTxn, first: bool) -> Result<()> {
        if self.deferred.is_empty() {
            return Ok(());
        }
        // At the beginning, not while the transaction before settles (`commit_gate`);
        // later the group's transaction is this one, which no one else commits.
        let settled = first.then(|| self.commit_gate.lock());
        let (mut creates, mut attrs) = (self.deferred.snapshot_creates(), self.deferred.snapshot());
        drop(settled);
        let mut done = txn.applied.lock();
        creates.retain(|c| !done.creates.contains(&c.ino));
        attrs.retain(|(i, g, _)| !done.attrs.contains(&(*i, *g)));
        if creates.is_empty() && attrs.is_empty() {
            return Ok(());
        }
        let mut t = Txn::open(txn)?;
        for c in &creates {
            t.apply_create(c.parent, &c.name, c.ino, c.cookie, &c.rec, c.at)?;
        }
        for (ino, _, a) in &attrs {
            t.set_attrs(*ino, |r| a.set(r))?;
        }
        done.creates.extend(creates.iter().map(|c| c.ino));
        done.attrs.extend(attrs.iter().map(|(i, g, _)| (*i, *g)));
        Ok(())
    }

    /// A read-only space, or one whose writes failed, takes no change.
    pub(crate) fn refuse_changes(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if self.store.is_failed() {
            return Err(Error::Failed);
        }
        Ok(())
    }

    /// Commits a metadata transaction. A failed commit is sticky like a failed data write:
    /// the table's state on disk is unknown, so nothing more may be acknowledged.
    ///
    /// First (at most once per `device::WATCH_INTERVAL`) the backing directory's files are
    /// looked at (`watch`): a commit into a table or data file that was removed or replaced,
    /// or while a second mount holds the lock, is refused rather than acknowledged.
    ///
    /// A non-durable commit returns once its journal record is in the journal file
    /// (`write_out`), in the default mode: a change that returned survives the daemon's
    /// death, as a change on a local filesystem survives its process's.
    pub(crate) fn commit(&self, txn: catalog::WriteTxn) -> Result<()> {
        let record = self.commit_unwritten(txn)?;
        self.write_out(record)
    }

    /// `commit` but the last step: the journal record it still has to write (`write_out`).
    fn commit_unwritten(&self, txn: catalog::WriteTxn) -> Result<Option<u64>> {
        let durable = txn.durable();
        let unwritten = match self.commit_quiet(txn, false)? {
            Some(seq) if durable => {
                self.make_durable(seq)?;
                None
            }
            Some(seq) if self.close_durable() => Some(seq),
            // `--durability fsync`: a daemon's death may lose what came after the last
            // fsync, the record stays queued until the next flush.
            _ => None,
        };
        self.after_commit(false)?;
        Ok(unwritten)
    }

    /// Writes journal record `seq` and every one before it into the journal file, unsynced
    /// (`Journal::make_written`): one `pwrite` of a journal block, usually. A record behind
    /// one whose chunks are only in the data file waits for that file's sync (a durable
    /// close's, which its own flush was about to make anyway). Where the journal has no
    /// room, a checkpoint (which covers the record).
    fn write_out(&self, record: Option<u64>) -> Result<()> {
        match record {
            Some(seq) => self.reach(seq, false),
            None => Ok(()),
        }
    }

    /// `commit` up to redb's commit: with a journal, the record number a durable commit
    /// waits for (`make_durable`), which a commit group's member waits for after the group
    /// (`group`), not while the next group gathers. Without a journal, a durable commit
    /// syncs the data file first when it may make durable a file commit made without a
    /// sync (`data_first`: a group's commit, or any durable commit on a mount that defers
    /// durability to fsync), whose chunks must be on disk by then.
    fn commit_quiet(&self, txn: catalog::WriteTxn, data_first: bool) -> Result<Option<u64>> {
        self.watch_backing_due();
        if self.store.is_failed() {
            // Dropping the transaction aborts it.
            return Err(Error::Failed);
        }
        let data_first = data_first || !self.close_durable();
        if self.catalog.journal().is_none() && txn.durable() && data_first {
            if let Err(e) = self.store.flush_sync() {
                abort_group_txn(txn);
                return Err(e);
            }
        }
        let applied = std::mem::take(&mut *txn.applied.lock());
        let _settling = self.commit_gate.lock();
        let r = self
            .catalog
            .commit(txn, &*self.store)
            .map_err(|e| self.store.fail_with(e))?;
        self.deferred.settle_creates(&applied.creates);
        self.deferred.settle(&applied.attrs);
        Ok(r)
    }

    /// Waits until journal record `seq` and every one before it is durable; where the
    /// journal has no room for them, makes a checkpoint (which covers them).
    fn make_durable(&self, seq: u64) -> Result<()> {
        self.reach(seq, true)
    }

    /// `make_durable`, or with `durable` false `write_out`: the record reached, a checkpoint
    /// where the journal has no room, a failure made sticky.
    fn reach(&self, seq: u64, durable: bool) -> Result<()> {
        match self.catalog.make_durable(seq, durable) {
            Ok(true) => Ok(()),
            Ok(false) => self.checkpoint(),
            Err(e) => Err(self.store.fail_with(e)),
        }
    }

    /// After a commit: the journal's queue kept to its bound, and with `due` a checkpoint
    /// made when one is due (by the one thread that finds it due first; the others go on).
    /// Only the close path passes `due`: gc and the namespace commit holding locks of their
    /// own, and a checkpoint that can wait is not made under them.
    fn after_commit(&self, due: bool) -> Result<()> {
        if !self
            .catalog
            .bound_queue()
            .map_err(|e| self.store.fail_with(e))?
        {
            return self.checkpoint();
        }
        if due && self.catalog.checkpoint_due() {
            if let Some(_turn) = self.checkpoint_turn.try_lock() {
                if self.catalog.checkpoint_due() {
                    return self.checkpoint();
                }
            }
        }
        Ok(())
    }

    /// Makes the metadata table itself durable, with everything committed so far, after
    /// the data file's sync: the journal starts over (a space without one: a durable
    /// commit). Unmount, offline commands and a journal past its bound make one. In the
    /// file commits' group, so a checkpoint that arrives while commits gather rides in
    /// their transaction.
    pub fn checkpoint(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.commits
            .run(
                || self.begin_write(true),
                |txn| self.commit_quiet(txn, true).map(drop),
                abort_group_txn,
                |txn| {
                    txn.want_checkpoint();
                    Ok(())
                },
                false,
            )
            .map(drop)
    }

    /// Makes everything committed so far durable, and the table hold all of it: a
    /// checkpoint if anything went into the journal since the last (unmount), or without
    /// a journal a durable commit.
    pub fn sync_all(&self) -> Result<()> {
        self.commit_held()?;
        match self.catalog.journal() {
            _ if self.read_only => Ok(()),
            Some(j) if j.dirty() => self.checkpoint(),
            Some(_) => Ok(()),
            None => self.sync_meta(),
        }
    }

    /// Whether closes are durable when they return (the default), or only at the next
    /// fsync, syncfs or unmount (`set_close_durable`).
    pub fn close_durable(&self) -> bool {
        self.close_durable
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Chooses what a close promises: with `false` (`ckptfs mount --durability fsync`), a
    /// close commits its file without waiting for any sync, and `fsync` of any file or
    /// directory, `sync_meta` and unmount make everything committed before them durable. A
    /// crash loses at most the closes after the last of those, in order (a later close is
    /// never kept without an earlier one), and never a revision made durable.
    pub fn set_close_durable(&self, on: bool) {
        self.close_durable
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// File commits since the space was opened (`Stats::commits`).
    pub fn commit_count(&self) -> u64 {
        self.commits.counts().0
    }

    /// A read snapshot of the catalog.
    pub(crate) fn reader(&self) -> Result<Reader> {
        self.catalog.reader()
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
        let durable = self.close_durable();
        let (rev, applied) = self.commits.run(
            || self.begin_write(durable),
            |txn| self.commit_group_txn(txn),
            abort_group_txn,
            |txn| {
                if durable {
                    txn.want_durable();
                }
                // What was held since the group's transaction began (this file's create
                // among it, if it was made meanwhile).
                self.apply_held(txn, false)?;
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
        // With a journal the group's transaction is in redb now, and its record queued:
        // durable once the journal's next sync (shared with the closes that arrive
        // meanwhile) is done.
        if durable {
            self.make_durable(self.catalog.mark())?;
        }
        self.after_commit(true)?;
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

    /// Commits a group's transaction (`group`). Without a journal, the data file first (one
    /// sync covers the chunks of every member, appended before they joined), then the
    /// table; with one, its record is queued and each member waits for it after the group.
    fn commit_group_txn(&self, txn: catalog::WriteTxn) -> Result<()> {
        self.commit_quiet(txn, true).map(drop)
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
        let txn = self.begin_write(self.close_durable())?;
        if !Txn::open(&txn)?.seal(rev)? {
            txn.abort()?;
            return Ok(());
        }
        self.commit(txn)?;
        self.store.learn(file.map().iter(), self.sb.chunk.max_bytes);
        Ok(())
    }

    /// Makes every earlier non-durable metadata commit durable (fsync of a directory). In
    /// the file commits' group (`group`): a sync that arrives while commits are gathering
    /// rides in their transaction instead of costing one of its own.
    pub fn sync_meta(&self) -> Result<()> {
        self.commit_held()?;
        if self.catalog.journal().is_some() {
            // Every commit so far has its record queued: one sync of the journal.
            self.make_durable(self.catalog.mark())?;
            return self.after_commit(true);
        }
        self.commits
            .run(
                || self.begin_write(true),
                |txn| self.commit_group_txn(txn),
                abort_group_txn,
                |txn| {
                    txn.want_durable();
                    Ok(())
                },
                false,
            )
            .map(drop)
    }

    /// `sync_meta` when a namespace change is not yet durable; nothing otherwise. A close
    /// that had no data to commit calls this, so a file created empty (a "done" marker) or an
    /// unlink before it survives a crash once close returns.
    pub(crate) fn sync_meta_if_dirty(&self) -> Result<()> {
        self.sync_meta_since(self.sync_mark())
    }

    /// The records of `inos` with what is held (`deferred`): held creates' records,
    /// attribute changes, directories' times. Held creates are looked at before the table
    /// is read: one settled in between is in the table by then (settled after its commit).
    pub(crate) fn inodes_held(&self, inos: &[InodeId]) -> Result<Vec<Option<InodeRecord>>> {
        if self.deferred.is_empty() {
            return self.reader()?.inodes(inos);
        }
        let created: Vec<_> = inos.iter().map(|i| self.deferred.created(*i)).collect();
        let mut recs = self.reader()?.inodes(inos)?;
        for ((ino, r), c) in inos.iter().zip(recs.iter_mut()).zip(created) {
            if r.is_none() {
                *r = c;
            }
            if let Some(r) = r {
                self.deferred.overlay(*ino, r);
            }
        }
        Ok(recs)
    }

    /// Commits the held changes (`deferred`), if any, in a transaction of their own: what a
    /// durability point without a transaction of its own runs first.
    fn commit_held(&self) -> Result<()> {
        if self.deferred.is_empty() || self.read_only {
            return Ok(());
        }
        self.ns_write(false, |_| Ok::<(), Error>(()))
    }

    /// The metadata transactions committed so far (a count that only grows; tests and the
    /// object-store tier compare two).
    pub fn meta_mark(&self) -> u64 {
        self.catalog.mark()
    }

    /// A mark of the namespace changes made so far, committed and held, for
    /// `sync_meta_since`.
    pub fn sync_mark(&self) -> SyncMark {
        // The held changes' first: a change held after it is read has a later generation.
        let held = self.deferred.mark();
        SyncMark {
            committed: self.catalog.mark(),
            held,
        }
    }

    /// `sync_meta` unless every namespace change made before `mark` was taken is durable
    /// already (a durable commit began after them, and none of them is still held): what a
    /// close owes the changes that came before it, and not the ones other threads make
    /// meanwhile (other writers' creates, held until their own closes).
    pub fn sync_meta_since(&self, mark: SyncMark) -> Result<()> {
        if self.deferred.held_before(mark.held) || !self.catalog.durable_since(mark.committed) {
            self.sync_meta()?;
        }
        Ok(())
    }
}

/// See `Space::sync_mark`.
#[derive(Clone, Copy, Debug)]
pub struct SyncMark {
    committed: u64,
    held: u64,
}

/// The extent map of revision `rev` as `r` reads it.
fn load_map_from(r: &Reader, rev: RevisionId) -> Result<ExtentMap> {
    map_of(r.extents(rev)?)
}

/// A revision's extent map from its rows (checked as they are pushed).
fn map_of(rows: Vec<(u64, crate::format::Extent)>) -> Result<ExtentMap> {
    let mut map = ExtentMap::new();
    for (off, e) in rows {
        map.push_loaded(off, e)?;
    }
    Ok(map)
}
