//! A backing space: format, open (with its lock), file commits and statistics.

pub use crate::catalog::Config;
use crate::catalog::{self, Reader, Txn};
use crate::device::{Device, FileDevice, MetaBackend};
use crate::error::{Corruption, Error, Missing, Result};
use crate::filemap::{ChunkIo, ExtentMap, FileState};
use crate::format::HistoryRecord;
use crate::format::*;
use crate::manifest::{PubExtent, PubNode, PubVersion, Publisher, Record, Union};
use crate::slots::{FencedDevice, Lease, SlotRequest, SlotTable};
use crate::store::ChunkStore;
use crate::targets::{Redundancy, TargetSpec, TargetsTable};
use redb::{Database, Durability};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// The smallest reserved space `format` accepts.
pub const MIN_SPACE_BYTES: u64 = 16 << 20;
/// Environment variable naming I/O faults to inject (tests only; see `sim::parse_faults`).
pub const FAULTS_ENV: &str = "CKPTFS_FAULTS";
/// Page cache redb may use for the metadata table.
const META_CACHE_BYTES: usize = 64 << 20;

/// The devices a space keeps its bytes on: the reserved data file and the metadata table.
#[derive(Clone)]
pub struct Devices {
    pub data: Arc<dyn Device>,
    pub meta: Arc<dyn Device>,
}

/// Opens (or with `create`, creates) the metadata table on `meta`. An existing table is opened
/// with redb's full integrity check: every page checksum verified and the allocator state
/// rebuilt. That costs one read of the table per mount, and turns a table damaged outside
/// redb into a clear error instead of a panic or wrong answers later.
fn open_db(meta: &Arc<dyn Device>, create: bool, failed: Arc<AtomicBool>) -> Result<Database> {
    if !create && meta.is_empty() {
        return Err(Corruption::Catalog("is empty".into()).into());
    }
    Database::builder()
        .set_cache_size(META_CACHE_BYTES)
        .set_check_integrity_on_open(!create)
        .create_with_backend(MetaBackend {
            dev: meta.clone(),
            failed,
        })
        .map_err(|e| match e {
            // An error of the device itself (it carries an errno); redb reports what it
            // finds wrong in the file's contents (a bad magic number) as an I/O error too,
            // without one, and that is damage.
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if io.raw_os_error().is_some() =>
            {
                Error::from(io)
            }
            other => {
                Corruption::Catalog(format!("is damaged and cannot be opened: {other}")).into()
            }
        })
}

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
    db: Arc<Database>,
    /// The metadata table's device: asked whether it kept room to grow (`ingest`).
    meta: Arc<dyn Device>,
    store: Arc<ChunkStore>,
    /// Held for the life of the Space: its flock is what makes a second mount fail. None for
    /// a space opened on devices (tests), whose caller guarantees exclusive use.
    lock: Option<File>,
    /// One gc at a time (and a repair of one segment holds it too: no chunk moves then).
    pub(crate) gc_lock: parking_lot::Mutex<()>,
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
    /// A non-durable namespace change has committed since the last durable commit.
    ns_dirty: std::sync::atomic::AtomicBool,
    /// Opened by `open_read_only`: every metadata write transaction is refused, the data
    /// file refuses writes, and the lock is shared.
    read_only: bool,
    /// The slot this space is (slot 0 of a single-slot space) and the data-file segments
    /// it allocates from.
    slot: SlotId,
    segment_range: std::ops::Range<u64>,
    /// Of a multi-slot space: this slot's manifest writer, and the other slots' manifests.
    publisher: Option<Publisher>,
    union: Option<Arc<Union>>,
    /// Of a slot of a shared namespace: its clock (`stamp`).
    clock: Option<Arc<crate::stamp::Clock>>,
    /// The storage targets of a space over several (`format --target`): their state for
    /// `ckptfs targets` and `stats`.
    targets: Option<Arc<crate::targets::Erasure>>,
    targets_table: Option<SharedTable>,
    /// The lease of a slot of a multi-slot space. Last, so it is released after the table
    /// and the store above have closed.
    lease: Option<crate::slots::LeaseGuard>,
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
    /// The backing filesystem is full: the metadata table could not keep room to grow, and
    /// new data gets ENOSPC until room is freed there (`Error::BackingFull`).
    #[serde(default)]
    pub backing_full: bool,
    /// Time spent per data-path stage since the space was opened (empty offline).
    #[serde(with = "crate::pipeline::stage_map")]
    pub stages: Vec<crate::pipeline::StageTime>,
    /// gc since the space was opened (a daemon's lifetime; zero offline). Absent from the
    /// answer of a daemon started by an older build, hence the default.
    #[serde(default)]
    pub gc: GcTotals,
    /// The cutters' carried chunks now and their spills since the space was opened
    /// (`spill`; zero offline). Absent from an older daemon's answer, hence the default.
    #[serde(default)]
    pub carries: crate::spill::CarryTotals,
    /// Where the stored bytes are: live, kept revisions of present files, kept revisions of
    /// removed files (the trash), unreferenced (`usage`).
    #[serde(default)]
    pub split: crate::usage::Split,
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
        ratio(self.referenced_bytes, self.raw_chunk_bytes)
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

pub(crate) fn open_private(path: &Path, create: bool) -> Result<File> {
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(path)?)
}

/// The superblock of backing directory `dir`, with a clear error when `dir` is missing.
/// The superblock of backing directory `dir`, refused with a clear error when `dir` is not a
/// space, or has feature flags this build cannot honour for the use (`writable`).
pub fn read_backing_dir(dir: &Path, writable: bool) -> Result<Superblock> {
    if !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "backing directory {} does not exist or is not a directory",
            dir.display()
        )));
    }
    let sb = read_superblock(dir)?;
    let unknown = sb.features.unknown();
    if unknown.incompat != 0 {
        return Err(Error::NotASpace(format!(
            "{} uses features this ckptfs does not know (incompatible feature flags {:#x}); \
             use the ckptfs that made it, or a newer one",
            dir.display(),
            unknown.incompat
        )));
    }
    if writable && unknown.ro_compat != 0 {
        return Err(Error::Invalid(format!(
            "{} uses features this ckptfs can read but not write (read-only compatible \
             feature flags {:#x}); mount it with --read-only, or use a newer ckptfs",
            dir.display(),
            unknown.ro_compat
        )));
    }
    Ok(sb)
}

/// Writes superblock `sb` into `dir` so that a crash leaves the old one or the new one:
/// a temporary file, fsynced, renamed over the old, and the directory fsynced.
fn write_superblock(dir: &Path, sb: &Superblock) -> Result<()> {
    let tmp = dir.join("superblock.tmp");
    let mut f = open_private(&tmp, true)?;
    f.write_all(&sb.encode())?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(SUPERBLOCK_FILE))?;
    sync_dir(dir)
}

/// The error for a directory without a lock file.
fn no_lock_file(dir: &Path) -> Error {
    Error::NotASpace(format!(
        "{} is not a ckptfs backing space (no lock file); run `ckptfs format {}`",
        dir.display(),
        dir.display()
    ))
}

/// Takes the space's lock without blocking; the lock file says who holds it.
fn take_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let mut f = open_private(&path, false).map_err(|e| match e {
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => no_lock_file(dir),
        other => other,
    })?;
    // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        // Held shared: read-only mounts, which leave no note in the file (the note there is
        // an earlier holder's).
        let probe = File::open(&path)?;
        // SAFETY: as above; the probe's lock goes with `probe`.
        if unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return Err(Error::Locked(format!(
                "backing space {} is mounted read-only by another ckptfs process; unmount \
                 that first",
                dir.display()
            )));
        }
        let mut who = String::new();
        let _ = f.read_to_string(&mut who);
        return Err(Error::Locked(format!(
            "backing space {} is in use by another ckptfs process ({})",
            dir.display(),
            who.trim()
        )));
    }
    Ok(f)
}

/// The lock of a read-only open: shared with other read-only opens, refused while a
/// read-write holder has the space. Opens the lock file read-only and writes nothing.
fn take_shared_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let f = File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => no_lock_file(dir),
        _ => Error::from(e),
    })?;
    // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        return Err(Error::Locked(format!(
            "backing space {} is in use by another ckptfs process ({}); a read-only mount \
             needs it unmounted",
            dir.display(),
            lock_holder(dir).unwrap_or_default().trim()
        )));
    }
    Ok(f)
}

/// Reads the lock file of a space, which names the process and mountpoint holding it.
pub fn lock_holder(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join(LOCK_FILE))
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// Adds `features` to the superblock of the unmounted space in `dir` (`format --codec
/// float` marks a space it has just made).
pub fn mark_features(dir: &Path, features: Features) -> Result<()> {
    let sb = read_superblock(dir)?;
    if !sb.features.contains(features) {
        write_superblock(dir, &sb.with_features(features))?;
    }
    Ok(())
}

pub fn read_superblock(dir: &Path) -> Result<Superblock> {
    let path = dir.join(SUPERBLOCK_FILE);
    match fs::read(&path) {
        Ok(b) => Superblock::decode(&b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotASpace(format!(
            "{} is not a ckptfs backing space (no superblock); run `ckptfs format {}`",
            dir.display(),
            dir.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Bytes available to unprivileged users on the filesystem holding `dir`.
pub fn free_disk_bytes(dir: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Invalid("path contains a NUL byte".into()))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Validates a space's size, chunk size and policy; returns the chunk bounds and the segment
/// size they imply.
fn geometry(size_bytes: u64, chunk_avg_bytes: u32, config: &Config) -> Result<(ChunkParams, u32)> {
    let chunk = ChunkParams::from_avg(chunk_avg_bytes)?;
    config.validate()?;
    let segment_bytes = Superblock::segment_bytes_for(chunk);
    let min = MIN_SPACE_BYTES.max(2 * segment_bytes as u64);
    if size_bytes < min {
        return Err(Error::Invalid(format!(
            "size {size_bytes} bytes is below the minimum of {} MiB for this chunk size",
            min >> 20
        )));
    }
    Ok((chunk, segment_bytes))
}

fn multi_slot_refusal(dir: &Path, sb: &Superblock) -> Error {
    Error::Invalid(format!(
        "{} has {} slots, each mounted by its own node: run this through a mountpoint \
         (it acts on that mount's slot); `ckptfs slots {}` lists them",
        dir.display(),
        sb.slots,
        dir.display()
    ))
}

/// The most slots a space may have (its headers file is 8 KiB per slot).
pub const MAX_SLOTS: u32 = 16384;

fn new_superblock(
    size_bytes: u64,
    chunk: ChunkParams,
    segment_bytes: u32,
    slots: u32,
) -> Superblock {
    let now = Timestamp::now();
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(
        &blake3::hash(format!("{:?}{}{}", now, std::process::id(), size_bytes).as_bytes())
            .as_bytes()[..16],
    );
    let features = match slots > 1 {
        true => Features::AT_FORMAT
            .union(Features::INCOMPAT_SLOTS)
            .union(Features::INCOMPAT_SHARED_NAMESPACE),
        false => Features::AT_FORMAT,
    };
    Superblock {
        version: features.format_version(),
        features,
        uuid,
        data_size_bytes: size_bytes,
        chunk,
        segment_bytes,
        created_unix_s: now.secs as u64,
        slots,
    }
}

/// Writes an empty table onto `meta` (which must be empty): the root directory, the
/// counters, `config`, and `segments` free.
fn init_meta(
    meta: &Arc<dyn Device>,
    config: &Config,
    segments: std::ops::Range<u64>,
    shared_slot: Option<SlotId>,
) -> Result<()> {
    let db = open_db(meta, true, Arc::default())?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let root = InodeRecord {
        parent: InodeId::ROOT,
        ..InodeRecord::new(NodeKind::Dir, 0o755, uid, gid)
    };
    let mut txn = db.begin_write()?;
    txn.set_two_phase_commit(true);
    catalog::create_tables(&txn)?;
    {
        let mut t = Txn::open(&txn)?;
        t.init(&root, config, segments)?;
        if let Some(slot) = shared_slot {
            // A slot of a shared namespace numbers its inodes in its own range, so an
            // inode number names one object on every node (FORMAT.md "Shared namespace").
            t.set_ino_floor(crate::format::slot_ino_base(slot))?;
            t.create_shared_tables()?;
            // Every slot's root is a version of the one root.
            t.put_version(
                InodeId::ROOT,
                &crate::format::VersionMeta {
                    of: InodeId::ROOT,
                    ..Default::default()
                },
            )?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// The `slots/` directory of a new multi-slot space: the headers file (its head, then two
/// zeroed header copies per slot: sparse until written) and one empty table file per slot,
/// filled at the slot's first claim. Nothing is created in it afterwards.
fn format_slot_files(dir: &Path, sb: &Superblock, config: &Config) -> Result<()> {
    let sdir = dir.join(SLOTS_DIR);
    fs::DirBuilder::new().mode(0o700).create(&sdir)?;
    let headers = open_private(&sdir.join(SLOT_HEADERS_FILE), true)?;
    let head = SlotTableHead {
        uuid: sb.uuid,
        slots: sb.slots,
        config: [
            config.keep_revisions,
            config.keep_age_secs,
            config.keep_unlinked_secs,
            config.auto_gc_free_percent,
        ],
    };
    {
        use std::os::unix::fs::FileExt;
        headers.write_all_at(&head.encode(), 0)?;
    }
    headers.set_len(slot_table_len(sb.slots))?;
    headers.sync_all()?;
    for i in 0..sb.slots {
        drop(open_private(&dir.join(slot_meta_file(SlotId(i))), true)?);
    }
    sync_dir(&sdir)
}

/// The slot headers of multi-slot space `sb` in `dir`, checked against its superblock.
pub fn slot_table(
    dir: &Path,
    sb: &Superblock,
    writable: bool,
) -> Result<(SlotTable, SlotTableHead)> {
    let path = dir.join(SLOTS_DIR).join(SLOT_HEADERS_FILE);
    let f = match writable {
        true => open_private(&path, false),
        false => Ok(File::open(&path)?),
    }
    .map_err(|e| match e {
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
            Error::from(Corruption::Layout(format!("{} is missing", path.display())))
        }
        other => other,
    })?;
    table_on(
        Arc::new(crate::device::SharedFile::new(f)?),
        sb,
        &path.display().to_string(),
    )
}

/// The slot table on device `dev`, checked against superblock `sb` (`what` names the
/// device in errors).
fn table_on(
    dev: Arc<dyn Device>,
    sb: &Superblock,
    what: &str,
) -> Result<(SlotTable, SlotTableHead)> {
    let mut b = vec![0u8; SLOT_TABLE_HEAD_LEN as usize];
    dev.read_at(&mut b, 0)?;
    let head = SlotTableHead::decode(&b)?;
    if head.uuid != sb.uuid || head.slots != sb.slots {
        return Err(Corruption::Layout(format!(
            "{what} belongs to another space or says {} slots (the superblock says {})",
            head.slots, sb.slots
        ))
        .into());
    }
    let need = slot_table_len(sb.slots);
    if dev.len() < need {
        return Err(
            Corruption::Layout(format!("{what} is {} bytes, {need} expected", dev.len())).into(),
        );
    }
    Ok((SlotTable::new(dev, sb.slots), head))
}

/// Where a claimed slot's chunks and manifest live.
enum SlotData {
    /// The space's data file: the slot's writable device, and the same file read around
    /// this node's page cache for other slots' manifests (`SharedFile`).
    File {
        data: Arc<dyn Device>,
        shared: Arc<dyn Device>,
    },
    /// Erasure-coded targets, opened with this slot's share (`targets::Share`) and every
    /// write fenced by the lease.
    Targets(Arc<crate::targets::Erasure>),
}

/// Slot `slot`'s segments of the data file `data`, checked against the superblock.
fn slot_data_file(
    sb: &Superblock,
    data: Arc<dyn Device>,
    slot: SlotId,
) -> Result<Arc<crate::placement::SingleFile>> {
    if data.len() != sb.data_size_bytes {
        return Err(Corruption::Layout(format!(
            "the data file is {} bytes, the superblock says {}",
            data.len(),
            sb.data_size_bytes
        ))
        .into());
    }
    let range = sb.slot_segments(slot);
    Ok(Arc::new(crate::placement::SingleFile::new(
        data,
        sb.segment_bytes as u64,
        range.end - range.start,
    )))
}

/// Opens the slot `lease` holds of multi-slot space `sb`: its metadata table on `meta`,
/// its chunks and manifest on `data`, every write fenced by the lease, the slot's table
/// made at its first claim (from the policy in the slot table's head), and the slot's
/// publisher and view of the other slots attached. Slots over a data file and slots over
/// targets differ only in the placement under the store and the publisher.
fn open_claimed(
    sb: Superblock,
    meta: Arc<dyn Device>,
    data: SlotData,
    lease: Arc<Lease>,
    table: SlotTable,
    head: &SlotTableHead,
) -> Result<Space> {
    let slot = lease.slot();
    if !sb.features.contains(Features::INCOMPAT_SHARED_NAMESPACE) {
        return Err(Error::OldSlotNamespace);
    }
    let fence = |inner| -> Arc<dyn Device> {
        Arc::new(FencedDevice {
            inner,
            lease: lease.clone(),
        })
    };
    let meta = fence(meta);
    if meta.is_empty() {
        // The slot's first claim: its table starts from the policy given at format.
        let [keep_revisions, keep_age_secs, keep_unlinked_secs, auto_gc_free_percent] = head.config;
        let config = Config {
            keep_revisions,
            keep_age_secs,
            keep_unlinked_secs,
            auto_gc_free_percent,
        };
        init_meta(&meta, &config, sb.slot_segments(slot), Some(slot))?;
        log::info!("slot {slot}: first claim, metadata table created");
    }
    // The store's placement; the device the manifest is written to (in batches of `align`
    // bytes) and other slots' manifests are read from.
    let (place, manifests, align, erasure): (Arc<dyn crate::placement::Placement>, _, _, _) =
        match data {
            SlotData::File { data, shared } => {
                let place = slot_data_file(&sb, fence(data), slot)?;
                let written = place.device();
                (place, (written, shared), crate::device::DIRECT_ALIGN, None)
            }
            SlotData::Targets(er) => {
                // The manifest area is written outside the store's allocation: placed once,
                // and never re-placed (that would drop the published manifest).
                for seg in sb.slot_share(slot).start..sb.slot_segments(slot).start {
                    er.place_if_unplaced(seg)?;
                }
                let dev: Arc<dyn Device> = Arc::new(crate::placement::PlacedDevice {
                    place: er.clone(),
                    len: sb.data_size_bytes,
                });
                let align = crate::placement::Placement::write_align(&*er);
                (er.clone() as _, (dev.clone(), dev), align, Some(er))
            }
        };
    let mut space = Space::open_placed(sb.clone(), meta, place, slot)?;
    space.publisher = Some(Publisher::new(&sb, manifests.0, align, lease.clone()));
    let repair = erasure
        .clone()
        .map(|e| e as Arc<dyn crate::placement::Placement>);
    let union = Arc::new(Union::new(table, manifests.1, repair, sb, slot));
    let floor = space.reader()?.ns_stamp()?;
    space.clock = Some(Arc::new(crate::stamp::Clock::new(floor)));
    space.union = Some(union);
    space.targets = erasure;
    let store = Arc::downgrade(&space.store);
    lease.set_usage(Box::new(move || {
        let s = store.upgrade()?;
        Some(s.capacity().saturating_sub(s.free_bytes()))
    }));
    Ok(space)
}

impl Space {
    /// `format_slots` on devices: checks the geometry, writes the slot table's head onto
    /// `headers` (empty) and returns the superblock. Slot tables are made at first claim.
    pub fn format_slots_devices(
        data: &Arc<dyn Device>,
        headers: &Arc<dyn Device>,
        chunk_avg_bytes: u32,
        config: Config,
        slots: u32,
    ) -> Result<Superblock> {
        let size_bytes = data.len();
        let (chunk, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        if slots < 2 || (size_bytes / segment_bytes as u64) / (slots as u64) < MIN_SLOT_SEGMENTS {
            return Err(Error::Invalid(format!(
                "{slots} slots do not fit this space"
            )));
        }
        let sb = new_superblock(size_bytes, chunk, segment_bytes, slots);
        let head = SlotTableHead {
            uuid: sb.uuid,
            slots,
            config: [
                config.keep_revisions,
                config.keep_age_secs,
                config.keep_unlinked_secs,
                config.auto_gc_free_percent,
            ],
        };
        headers.set_len(slot_table_len(slots))?;
        headers.write_at(&head.encode(), 0)?;
        headers.sync()?;
        Ok(sb)
    }

    /// Claims a slot of multi-slot space `sb` on devices (`devs.meta`: that slot's table,
    /// `headers`: the slot table) and opens it as a mount does, without files or locks:
    /// for the crash and fault tests. The caller names the slot whose table it passes.
    pub fn open_slot_devices(
        sb: Superblock,
        devs: Devices,
        headers: Arc<dyn Device>,
        req: &SlotRequest,
        settle: Duration,
    ) -> Result<Space> {
        let (table, head) = table_on(headers, &sb, "the slot table")?;
        let lease = Lease::claim(table.clone(), req, settle)?;
        let data = SlotData::File {
            shared: devs.data.clone(),
            data: devs.data,
        };
        let mut space = open_claimed(sb, devs.meta, data, lease.clone(), table, &head)?;
        space.lease = Some(crate::slots::LeaseGuard(lease));
        Ok(space)
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Reserves `len` bytes for `f` (fallocate; a sparse file where the filesystem cannot) and
/// makes the size durable.
pub(crate) fn preallocate(f: &File, len: u64) -> Result<()> {
    // SAFETY: fallocate on a valid descriptor; arguments are plain integers.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            log::warn!("fallocate is not supported here; the file is sparse");
            f.set_len(len)?;
        } else {
            return Err(e.into());
        }
    }
    f.sync_all()?;
    Ok(())
}

/// Checks a target set for `format --target` and works out its layout: at least M+K
/// targets in M+K failure domains, each a directory that is empty or holds only an old
/// target file (with `force`), none the backing directory, each disk with room for its
/// targets' files. Changes nothing.
fn target_table(
    dir: &Path,
    size_bytes: u64,
    segment_bytes: u32,
    specs: &[TargetSpec],
    r: Redundancy,
    force: bool,
    nslots: u32,
) -> Result<TargetsTable> {
    if specs.len() < r.shards() {
        return Err(Error::Invalid(format!(
            "--redundancy {r} needs at least {} targets; {} given",
            r.shards(),
            specs.len()
        )));
    }
    if specs.len() > u16::MAX as usize - 1 {
        return Err(Error::Invalid("too many targets".into()));
    }
    let specs: Vec<TargetSpec> = specs
        .iter()
        .enumerate()
        .map(|(i, t)| TargetSpec {
            path: t.path.clone(),
            domain: match t.domain.is_empty() {
                true => format!("target{i}"),
                false => t.domain.clone(),
            },
        })
        .collect();
    let specs = &specs[..];
    let domains: std::collections::BTreeSet<&str> =
        specs.iter().map(|t| t.domain.as_str()).collect();
    if domains.len() < r.shards() {
        return Err(Error::Invalid(format!(
            "--redundancy {r} puts each segment's {} shards in distinct failure domains; the \
             targets name only {} ({}): add targets or domains, or lower the redundancy",
            r.shards(),
            domains.len(),
            domains.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    let (segments, shard_bytes, slots) =
        target_geometry(size_bytes, segment_bytes, r, specs.len(), nslots);
    let table = TargetsTable {
        redundancy: r,
        shard_bytes,
        slots,
        segments,
        targets: specs.to_vec(),
        failed: vec![false; specs.len()],
        mirror: vec![false; specs.len()],
        generation: 1,
    };
    let backing = fs::canonicalize(dir).ok();
    let mut seen = std::collections::BTreeSet::new();
    let mut need_by_dev: std::collections::BTreeMap<u64, (u64, PathBuf)> = Default::default();
    for t in specs {
        if t.path.exists() && !t.path.is_dir() {
            return Err(Error::Invalid(format!(
                "target {} is not a directory",
                t.path.display()
            )));
        }
        if t.path.is_dir() {
            let canon = fs::canonicalize(&t.path)?;
            if Some(&canon) == backing.as_ref() {
                return Err(Error::Invalid(format!(
                    "target {} is the backing directory itself; give each target its own \
                     directory",
                    t.path.display()
                )));
            }
            if !seen.insert(canon) {
                return Err(Error::Invalid(format!(
                    "target {} is given twice",
                    t.path.display()
                )));
            }
            let names: Vec<String> = fs::read_dir(&t.path)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<_>>()?;
            if names.iter().any(|n| n != crate::targets::TARGET_FILE) {
                return Err(Error::Invalid(format!(
                    "target {} is not empty and is not a ckptfs target; refusing to format it",
                    t.path.display()
                )));
            }
            if !names.is_empty() && !force {
                return Err(Error::Invalid(format!(
                    "target {} already holds a ckptfs target file; use --force to erase it",
                    t.path.display()
                )));
            }
        } else if !seen.insert(t.path.clone()) {
            return Err(Error::Invalid(format!(
                "target {} is given twice",
                t.path.display()
            )));
        }
        let existing = t
            .path
            .ancestors()
            .find(|p| p.is_dir())
            .unwrap_or(Path::new("."));
        let dev = fs::metadata(existing)?.dev();
        let old =
            fs::metadata(t.path.join(crate::targets::TARGET_FILE)).map_or(0, |m| m.blocks() * 512);
        let e = need_by_dev
            .entry(dev)
            .or_insert((0, existing.to_path_buf()));
        e.0 = (e.0 + table.target_file_bytes()).saturating_sub(old);
    }
    for (need, at) in need_by_dev.values() {
        let free = free_disk_bytes(at)?;
        if *need > free {
            return Err(Error::Invalid(format!(
                "the targets on the disk of {} need {need} bytes; it has {free} free",
                at.display()
            )));
        }
    }
    Ok(table)
}

/// The layout of a space over `targets` targets shared by `nslots` slots: (segments,
/// shard bytes, shard slots per target). Segments are whole rows of M blocks (see
/// `targets`); each slot gets an equal part of every target's shard slots
/// (`targets::Share`), enough for an even share of its segments' shards plus a quarter,
/// so placement can prefer the better targets (and avoid failing ones) without running any
/// out, and never more than one slot per segment (a target holds at most one shard of a
/// segment).
fn target_geometry(
    size_bytes: u64,
    segment_bytes: u32,
    r: Redundancy,
    targets: usize,
    nslots: u32,
) -> (u64, u64, u64) {
    let row = (r.data * crate::targets::BLOCK) as u32;
    let segment_bytes = segment_bytes / row * row;
    let segments = size_bytes / segment_bytes as u64;
    let shard_bytes = segment_bytes as u64 / r.data as u64;
    let n = nslots.max(1) as u64;
    // The largest slot share (`Superblock::slot_share` rounds down and up).
    let share = segments.div_ceil(n);
    let even = (share * r.shards() as u64).div_ceil(targets as u64);
    let per_slot = (even + even / 4 + 1).min(share).max(1);
    (segments, shard_bytes, per_slot * n)
}

/// Writes a targeted space's files: each target's file (header, preallocated), the
/// `placement` file (a zero record per segment), the `targets` table and an empty
/// metadata table. Returns the superblock to write last.
fn format_target_files(
    dir: &Path,
    table: &TargetsTable,
    chunk_avg_bytes: u32,
    config: &Config,
    nslots: u32,
) -> Result<Superblock> {
    let segment_bytes = (table.shard_bytes * table.redundancy.data as u64) as u32;
    let size_bytes = table.segments * segment_bytes as u64;
    let chunk = ChunkParams::from_avg(chunk_avg_bytes)?;
    let mut sb = new_superblock(size_bytes, chunk, segment_bytes, nslots);
    sb = sb.with_features(Features::INCOMPAT_TARGETS);
    for (i, t) in table.targets.iter().enumerate() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&t.path)?;
        let path = t.path.join(crate::targets::TARGET_FILE);
        let _ = fs::remove_file(&path);
        // A mirror of an earlier space here must not be taken for this one's.
        for name in crate::mirror::MIRROR_FILES {
            let _ = fs::remove_file(t.path.join(name));
        }
        let f = open_private(&path, true)?;
        preallocate(&f, table.target_file_bytes())?;
        let h = crate::targets::TargetHeader {
            space_uuid: sb.uuid,
            index: i as u16,
            shard_bytes: table.shard_bytes,
            slots: table.slots,
        };
        use std::os::unix::fs::FileExt;
        f.write_all_at(&h.encode(), 0)?;
        f.sync_all()?;
        sync_dir(&t.path)?;
    }
    let placement = open_private(&dir.join(crate::targets::PLACEMENT_FILE), true)?;
    preallocate(
        &placement,
        table.segments * crate::targets::RECORD_BYTES as u64,
    )?;
    store_table(dir, &mut table.clone())?;
    if nslots > 1 {
        // Each slot's table is made at its first claim, as in a multi-slot data file.
        format_slot_files(dir, &sb, config)?;
        return Ok(sb);
    }
    let meta = open_private(&dir.join(META_FILE), true)?;
    meta.set_len(0)?;
    let meta: Arc<dyn Device> = Arc::new(FileDevice::growable(meta)?);
    init_meta(&meta, config, 0..table.segments, None)?;
    Ok(sb)
}

/// Writes `name` in `dir` so a crash leaves the old file or the new one (temporary file,
/// fsync, rename, directory fsync).
fn write_file_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    write_file_durably_via(dir, name, &format!("{name}.tmp"), bytes)
}

/// `write_file_durably` through the temporary file `tmp` (a slot's own, where several
/// nodes may replace the same file).
fn write_file_durably_via(dir: &Path, name: &str, tmp: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(tmp);
    let mut f = open_private(&tmp, true)?;
    f.set_len(0)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Writes the targets table with a new generation: to the backing directory, and to every
/// target flagged as holding a metadata mirror (`mirror.rs`). A holder's copy that cannot
/// be written is logged; its older generation keeps `recover` from using it.
pub(crate) fn store_table(dir: &Path, table: &mut TargetsTable) -> Result<()> {
    table.generation += 1;
    let bytes = table.encode();
    write_file_durably(dir, crate::targets::TARGETS_FILE, &bytes)?;
    for (i, t) in table.targets.iter().enumerate() {
        if table.mirror[i] {
            if let Err(e) = write_file_durably(&t.path, crate::mirror::MIRROR_TABLE, &bytes) {
                log::error!(
                    "writing the targets table's copy on target {i} ({}): {e}",
                    t.path.display()
                );
            }
        }
    }
    Ok(())
}

/// `store_table` by one slot of a multi-slot space, whose nodes each record the target
/// failures they meet: the failures already in the file are kept (merged into `table`),
/// and the temporary file is this slot's own. Two nodes recording at the same moment can
/// still lose one flag: its target then counts as healthy at the next mount, where its
/// stale shards fail their checks and are rebuilt.
fn store_table_shared(dir: &Path, table: &mut TargetsTable, slot: SlotId) -> Result<()> {
    if let Ok(on_disk) = fs::read(dir.join(crate::targets::TARGETS_FILE))
        .map_err(Error::from)
        .and_then(|b| {
            TargetsTable::decode(&b).map_err(|e| {
                Corruption::Layout(format!("{}: {e}", crate::targets::TARGETS_FILE)).into()
            })
        })
    {
        if on_disk.targets.len() == table.targets.len() {
            for (f, d) in table.failed.iter_mut().zip(&on_disk.failed) {
                *f |= *d;
            }
        }
        table.generation = table.generation.max(on_disk.generation);
    }
    table.generation += 1;
    let name = crate::targets::TARGETS_FILE;
    write_file_durably_via(dir, name, &format!("{name}.{slot}.tmp"), &table.encode())
}

/// Copies `src` to `name` in `dir` so a crash leaves the old file or the new one.
fn copy_durably(src: &Path, dir: &Path, name: &str) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    fs::copy(src, &tmp)?;
    File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Makes K+1 usable targets in distinct failure domains (lowest index first) the holders
/// of the metadata mirror for this mount: clears every flag, copies the backing
/// directory's metadata to each, then flags those copied (see `mirror.rs` for why in this
/// order). Returns the holders.
fn refresh_mirrors(dir: &Path, table: &mut TargetsTable, usable: &[bool]) -> Result<Vec<usize>> {
    let want = table.redundancy.parity + 1;
    let mut domains = std::collections::BTreeSet::new();
    let mut chosen = Vec::new();
    for (i, t) in table.targets.iter().enumerate() {
        if chosen.len() < want && usable[i] && !table.failed[i] && domains.insert(&t.domain) {
            chosen.push(i);
        }
    }
    if table.mirror.iter().any(|m| *m) {
        // The old holders' copies of the table say so too.
        let old = table.mirror.clone();
        table.mirror.iter_mut().for_each(|m| *m = false);
        table.generation += 1;
        let bytes = table.encode();
        write_file_durably(dir, crate::targets::TARGETS_FILE, &bytes)?;
        for (i, t) in table.targets.iter().enumerate() {
            if old[i] {
                let _ = write_file_durably(&t.path, crate::mirror::MIRROR_TABLE, &bytes);
            }
        }
    }
    let mut holders = Vec::new();
    for i in chosen {
        let to = &table.targets[i].path;
        let copied = [
            (SUPERBLOCK_FILE, crate::mirror::MIRROR_SUPERBLOCK),
            (META_FILE, crate::mirror::MIRROR_META),
            (
                crate::targets::PLACEMENT_FILE,
                crate::mirror::MIRROR_PLACEMENT,
            ),
        ]
        .iter()
        .try_for_each(|(from, name)| copy_durably(&dir.join(from), to, name));
        match copied {
            Ok(()) => holders.push(i),
            Err(e) => log::error!(
                "copying the metadata to target {i} ({}) failed: {e}; it holds no mirror",
                to.display()
            ),
        }
    }
    for &i in &holders {
        table.mirror[i] = true;
    }
    store_table(dir, table)?;
    if holders.len() < want {
        log::warn!(
            "the metadata is mirrored on {} target(s), fewer than K+1 = {want}: losing the \
             backing directory and {} of those targets would lose the space",
            holders.len(),
            holders.len()
        );
    }
    Ok(holders)
}

/// What `recover` did.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recovered {
    /// The target whose mirror was copied, and its directory.
    pub holder: usize,
    pub holder_dir: PathBuf,
    /// The targets table generation recovered.
    pub generation: u64,
    pub targets: usize,
}

/// Rebuilds the backing directory `backing` of a space over several targets from the
/// metadata mirror its targets hold (`mirror.rs`), starting from the target directory
/// `from`: of the holders' copies of the targets table, the newest generation names the
/// current holders, and the first of them whose own copy has that generation is copied.
/// Refuses a `backing` that holds a space (unless `force`) or anything else.
pub fn recover(backing: &Path, from: &Path, force: bool) -> Result<Recovered> {
    let read_table = |dir: &Path| -> Option<TargetsTable> {
        TargetsTable::decode(&fs::read(dir.join(crate::mirror::MIRROR_TABLE)).ok()?).ok()
    };
    let first = read_table(from).ok_or_else(|| {
        Error::Invalid(format!(
            "{} holds no metadata mirror of a ckptfs space (no readable {}): give the \
             directory of a target that held one (`ckptfs targets` says which do)",
            from.display(),
            crate::mirror::MIRROR_TABLE
        ))
    })?;
    // Every copy of the table the targets it names hold, and the newest of them.
    let mut copies: Vec<(usize, PathBuf, TargetsTable)> = Vec::new();
    for (i, t) in first.targets.iter().enumerate() {
        if let Some(tab) = read_table(&t.path) {
            copies.push((i, t.path.clone(), tab));
        }
    }
    let newest = copies
        .iter()
        .map(|(_, _, t)| t)
        .chain(std::iter::once(&first))
        .max_by_key(|t| t.generation)
        .expect("at least the first copy")
        .clone();
    let holder = copies
        .iter()
        .filter(|(i, _, t)| newest.mirror[*i] && t.generation == newest.generation)
        .find(|(_, p, _)| {
            crate::mirror::MIRROR_FILES
                .iter()
                .all(|n| p.join(n).is_file())
        })
        .ok_or_else(|| {
            Error::Invalid(format!(
                "no target holds a current metadata mirror (the newest targets table, \
                 generation {}, names {:?}; none of them has all its files at that \
                 generation)",
                newest.generation,
                (0..newest.targets.len())
                    .filter(|i| newest.mirror[*i])
                    .collect::<Vec<_>>()
            ))
        })?;
    let (holder, holder_dir) = (holder.0, holder.1.clone());
    // The superblock copy must be this space's: its uuid is in every target's header.
    let sb_bytes = fs::read(holder_dir.join(crate::mirror::MIRROR_SUPERBLOCK))?;
    let sb = Superblock::decode(&sb_bytes)?;
    if !sb.features.contains(Features::INCOMPAT_TARGETS) {
        return Err(Error::Invalid(format!(
            "the superblock copy in {} is not a targeted space's",
            holder_dir.display()
        )));
    }
    if backing.exists() {
        let names: Vec<String> = fs::read_dir(backing)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        let ours = names.iter().all(|n| {
            let n = n.strip_suffix(".tmp").unwrap_or(n);
            TARGETED_SPACE_FILES.contains(&n)
        });
        if !ours {
            return Err(Error::Invalid(format!(
                "{} holds files that are not a ckptfs space's; recover into an empty                  directory",
                backing.display()
            )));
        }
        if names.iter().any(|n| n == SUPERBLOCK_FILE || n == META_FILE) && !force {
            return Err(Error::Invalid(format!(
                "{} still holds a space's metadata; recover is for a backing directory \
                 that was lost (--force replaces what is there)",
                backing.display()
            )));
        }
    } else {
        fs::create_dir_all(backing)?;
    }
    // Held while the files are replaced: refuses a space that is mounted.
    drop(open_private(&backing.join(LOCK_FILE), true)?);
    drop(open_private(&backing.join(LOG_FILE), true)?);
    let _lock = take_lock(backing)?;
    for (from_name, to_name) in [
        (crate::mirror::MIRROR_META, META_FILE),
        (
            crate::mirror::MIRROR_PLACEMENT,
            crate::targets::PLACEMENT_FILE,
        ),
        (crate::mirror::MIRROR_SUPERBLOCK, SUPERBLOCK_FILE),
    ] {
        copy_durably(&holder_dir.join(from_name), backing, to_name)?;
    }
    write_file_durably(backing, crate::targets::TARGETS_FILE, &newest.encode())?;
    log::info!(
        "recovered the metadata of {} from target {holder} ({}), table generation {}",
        backing.display(),
        holder_dir.display(),
        newest.generation
    );
    Ok(Recovered {
        holder,
        holder_dir,
        generation: newest.generation,
        targets: newest.targets.len(),
    })
}

/// Opens the targets of the targeted space in `dir` as its placement. A target whose
/// file is missing, unreadable or not this space's is failed (the reason kept for
/// `ckptfs targets`); fewer than M usable targets refuse the open.
fn open_targets(
    dir: &Path,
    sb: &Superblock,
    read_only: bool,
    wrap: &dyn Fn(&'static str, Arc<dyn Device>) -> Arc<dyn Device>,
    lease: Option<&Arc<Lease>>,
) -> Result<(Arc<crate::targets::Erasure>, SharedTable, Option<Mirrors>)> {
    let bytes = fs::read(dir.join(crate::targets::TARGETS_FILE)).map_err(|e| {
        Error::NotASpace(format!(
            "{}: its targets table {} cannot be read: {e}",
            dir.display(),
            crate::targets::TARGETS_FILE
        ))
    })?;
    let mut table = TargetsTable::decode(&bytes)
        .map_err(|e| Corruption::Layout(format!("{}: {e}", crate::targets::TARGETS_FILE)))?;
    let mut targets = Vec::new();
    let mut opened_ok = Vec::new();
    let mut usable = 0;
    for (i, t) in table.targets.iter().enumerate() {
        let path = t.path.join(crate::targets::TARGET_FILE);
        let opened = (|| -> std::result::Result<Arc<dyn Device>, String> {
            if table.failed[i] {
                return Err(
                    "it failed while mounted earlier (see daemon.log), so its shards may be \
                     stale; `ckptfs rebuild` replaces it"
                        .into(),
                );
            }
            let f = OpenOptions::new()
                .read(true)
                .write(!read_only)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let mut head = vec![0u8; crate::targets::TARGET_HEADER_BYTES as usize];
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut head, 0)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let h = crate::targets::TargetHeader::decode(&head)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if h.space_uuid != sb.uuid || h.index as usize != i {
                return Err(format!(
                    "{} belongs to another space or is another target (index {})",
                    path.display(),
                    h.index
                ));
            }
            if h.shard_bytes != table.shard_bytes || h.slots != table.slots {
                return Err(format!("{} has another layout", path.display()));
            }
            let dev: Arc<dyn Device> = match read_only {
                true => Arc::new(crate::device::ReadOnlyDevice(Arc::new(
                    FileDevice::new(f).map_err(|e| e.to_string())?,
                ))),
                false => Arc::new(FileDevice::new_direct(f).map_err(|e| e.to_string())?),
            };
            Ok(wrap(crate::sim::target_device_name(i), dev))
        })();
        if let Err(e) = &opened {
            log::error!("target {i} ({}) is not usable: {e}", t.path.display());
        } else {
            usable += 1;
        }
        opened_ok.push(opened.is_ok());
        targets.push(crate::targets::Target::new(
            t.path.clone(),
            t.domain.clone(),
            table.slots,
            opened,
        ));
    }
    let r = table.redundancy;
    if usable < r.data {
        return Err(Error::Targets(crate::error::TargetFault::TooFewOpen {
            usable,
            total: table.targets.len(),
            needed: r.data,
        }));
    }
    // The metadata of a multi-slot space is each slot's own table, written by its node
    // while it runs: it is not mirrored on the targets (see FORMAT.md "Slots over
    // targets").
    let mirrored = !read_only && lease.is_none();
    let holders = match mirrored {
        false => Vec::new(),
        true => refresh_mirrors(dir, &mut table, &opened_ok)?,
    };
    let map = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(dir.join(crate::targets::PLACEMENT_FILE))?;
    let mut map: Arc<dyn Device> = match lease {
        // Other nodes write their segments' records: read around this node's page cache,
        // and write only while this node holds its slot.
        Some(l) => Arc::new(FencedDevice {
            inner: Arc::new(crate::device::SharedFile::new(map)?),
            lease: l.clone(),
        }),
        None => Arc::new(FileDevice::new(map)?),
    };
    let table = Arc::new(parking_lot::Mutex::new(table));
    let mirrors = match mirrored {
        false => None,
        true => {
            let (dir, t) = (dir.to_path_buf(), table.clone());
            let set = crate::mirror::MirrorSet::new(Box::new(move |i| {
                let mut t = t.lock();
                t.mirror[i] = false;
                if let Err(e) = store_table(&dir, &mut t) {
                    log::error!("recording that the mirror on target {i} was dropped: {e}");
                }
            }));
            let paths: Vec<(usize, PathBuf)> = {
                let t = table.lock();
                holders
                    .iter()
                    .map(|&i| (i, t.targets[i].path.clone()))
                    .collect()
            };
            let mut devs = Vec::new();
            for (i, p) in &paths {
                let f = open_private(&p.join(crate::mirror::MIRROR_PLACEMENT), false)?;
                let d: Arc<dyn Device> = Arc::new(FileDevice::new(f)?);
                devs.push((*i, wrap(crate::sim::mirror_device_name(*i), d)));
            }
            map = Arc::new(crate::mirror::MirrorDevice::new(map, devs, set.clone()));
            Some(Mirrors {
                set,
                holders: paths,
            })
        }
    };
    let (shard_bytes, segments) = {
        let t = table.lock();
        (t.shard_bytes, t.segments)
    };
    let share = lease.map(|l| {
        crate::targets::Share::of(
            l.slot().0,
            sb.slots,
            table.lock().slots,
            sb.slot_share(l.slot()),
        )
    });
    let erasure = Arc::new(crate::targets::Erasure::open_share(
        r,
        shard_bytes,
        segments,
        targets,
        map,
        share,
    )?);
    if !read_only {
        let dir = dir.to_path_buf();
        let table = table.clone();
        let slot = lease.map(|l| l.slot());
        erasure.set_fail_hook(Box::new(move |t| {
            let mut table = table.lock();
            table.failed[t as usize] = true;
            let stored = match slot {
                None => store_table(&dir, &mut table),
                Some(s) => store_table_shared(&dir, &mut table, s),
            };
            if let Err(e) = stored {
                log::error!(
                    "recording that target {t} failed in {}: {e}; it will be used again at \
                     the next mount, where its stale shards fail their checks and are rebuilt",
                    crate::targets::TARGETS_FILE
                );
            }
        }));
    }
    Ok((erasure, table, mirrors))
}

/// A targeted space's `targets` table, shared by the fail hook and `rebuild`.
pub(crate) type SharedTable = Arc<parking_lot::Mutex<TargetsTable>>;

/// The metadata mirror holders of a read-write mount: the metadata table's device is
/// wrapped once it is opened.
struct Mirrors {
    set: Arc<crate::mirror::MirrorSet>,
    holders: Vec<(usize, PathBuf)>,
}

impl Space {
    /// Creates a backing space in `dir`. Refuses a directory holding anything that is not a
    /// ckptfs space, and an existing space unless `force` (and never one that is mounted).
    pub fn format(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
    ) -> Result<()> {
        Self::format_slots(dir, size_bytes, chunk_avg_bytes, config, force, 1)
    }

    /// `format` with `slots` slots: each a node's writable partition of the space (its own
    /// share of the data file's segments and its own metadata table, made at its first
    /// claim). One slot is the plain single-node layout.
    pub fn format_slots(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
        slots: u32,
    ) -> Result<()> {
        Self::format_layout(dir, size_bytes, chunk_avg_bytes, config, force, slots, None)
    }

    /// `format` of a space whose data lies on several storage targets, erasure-coded as
    /// `r` (see `targets`): `dir` holds the superblock, the metadata table (with `slots`
    /// above 1: each slot's, made at its first claim) and the placement records; each
    /// target directory gets one preallocated `ckptfs-target` file. With several slots,
    /// several nodes share the space as with `format_slots`, each placing its own
    /// segments in its own part of every target (`targets::Share`).
    #[allow(clippy::too_many_arguments)]
    pub fn format_targets(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
        targets: &[TargetSpec],
        r: Redundancy,
        slots: u32,
    ) -> Result<()> {
        Self::format_layout(
            dir,
            size_bytes,
            chunk_avg_bytes,
            config,
            force,
            slots,
            Some((targets, r)),
        )
    }

    fn format_layout(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
        slots: u32,
        targets: Option<(&[TargetSpec], Redundancy)>,
    ) -> Result<()> {
        // Every refusal comes before the first change to `dir`.
        let (_, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        let table = match targets {
            Some((specs, r)) => Some(target_table(
                dir,
                size_bytes,
                segment_bytes,
                specs,
                r,
                force,
                slots,
            )?),
            None => None,
        };
        if slots == 0 || slots > MAX_SLOTS {
            return Err(Error::Invalid(format!(
                "--slots {slots} is out of range (1 to {MAX_SLOTS})"
            )));
        }
        let segments = size_bytes / segment_bytes as u64;
        if slots > 1 && segments / (slots as u64) < MIN_SLOT_SEGMENTS {
            return Err(Error::Invalid(format!(
                "size {size_bytes} bytes holds {segments} segments of {} MiB; {slots} slots \
                 need at least {MIN_SLOT_SEGMENTS} each (two for chunks, two for the slot's \
                 manifest), so at least {} MiB",
                segment_bytes >> 20,
                (MIN_SLOT_SEGMENTS * slots as u64 * segment_bytes as u64) >> 20
            )));
        }
        if dir.exists() && !dir.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        let names: Vec<String> = if dir.is_dir() {
            fs::read_dir(dir)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<_>>()?
        } else {
            Vec::new()
        };
        let old_space = !names.is_empty();
        if old_space
            && !names.iter().all(|n| {
                // A crash while a small file was replaced leaves its `.tmp` beside it
                // (`NAME.tmp`, or `NAME.SLOT.tmp` of a slot's `store_table_shared`).
                let n = n.as_str();
                let n = n
                    .strip_suffix(".tmp")
                    .map_or(n, |b| b.split('.').next().unwrap_or(b));
                SPACE_FILES.contains(&n)
                    || SLOTTED_SPACE_FILES.contains(&n)
                    || TARGETED_SPACE_FILES.contains(&n)
            })
        {
            return Err(Error::Invalid(format!(
                "{} is not empty and is not a ckptfs space; refusing to format it",
                dir.display()
            )));
        }
        if old_space && !force {
            return Err(Error::Invalid(format!(
                "{} already holds a ckptfs space; use --force to erase it and format anew",
                dir.display()
            )));
        }
        // Every refusal comes before the first change: a refused format leaves DIR (and an old
        // space in it) as it was. Erasing the old space gives its data file's blocks back.
        let existing = dir
            .ancestors()
            .find(|p| p.is_dir())
            .unwrap_or(Path::new("."));
        let reclaimed = if old_space {
            fs::metadata(dir.join(DATA_FILE)).map_or(0, |m| m.blocks() * 512)
        } else {
            0
        };
        let free = free_disk_bytes(existing)?.saturating_add(reclaimed);
        if table.is_none() && size_bytes > free {
            return Err(Error::Invalid(format!(
                "size {size_bytes} bytes is larger than the free space on that disk ({free} bytes)"
            )));
        }
        // Only the owner may change a space's files: a new backing dir is 0700 (whatever the
        // umask), and format takes group/other write away from an existing one.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let perm = fs::metadata(dir)?.permissions();
        if perm.mode() & 0o022 != 0 {
            fs::set_permissions(
                dir,
                fs::Permissions::from_mode(perm.mode() & 0o7777 & !0o022),
            )?;
        }
        // Hold the old space's lock while erasing it, so a mounted space is never erased.
        let _guard = if names.iter().any(|n| n == LOCK_FILE) {
            Some(take_lock(dir)?)
        } else {
            None
        };
        // Other nodes do not share this node's flock: a slot with a live lease is a mount.
        if names.iter().any(|n| n == SLOTS_DIR) {
            if let Ok(sb) = read_superblock(dir) {
                let (table, _) = slot_table(dir, &sb, false)?;
                let now = crate::slots::now_unix_ns();
                let live: Vec<String> = table
                    .all()?
                    .iter()
                    .filter(|h| crate::slots::is_live(h, now))
                    .map(|h| crate::slots::describe_holder(h, now))
                    .collect();
                if !live.is_empty() {
                    return Err(Error::Locked(format!(
                        "{} is mounted: {}; unmount it everywhere first",
                        dir.display(),
                        live.join("; ")
                    )));
                }
            }
        }
        for n in &names {
            if n == SLOTS_DIR {
                fs::remove_dir_all(dir.join(n))?;
            } else if n != LOCK_FILE {
                fs::remove_file(dir.join(n))?;
            }
        }

        if let Some(table) = &table {
            let sb = format_target_files(dir, table, chunk_avg_bytes, &config, slots)?;
            drop(open_private(&dir.join(LOCK_FILE), true)?);
            drop(open_private(&dir.join(LOG_FILE), true)?);
            return write_superblock(dir, &sb);
        }
        let data = open_private(&dir.join(DATA_FILE), true)?;
        preallocate(&data, size_bytes).inspect_err(|_| {
            let _ = fs::remove_file(dir.join(DATA_FILE));
        })?;

        let sb = if slots == 1 {
            let meta = open_private(&dir.join(META_FILE), true)?;
            meta.set_len(0)?;
            let devs = Devices {
                data: Arc::new(FileDevice::new(data)?),
                meta: Arc::new(FileDevice::growable(meta)?),
            };
            Self::format_devices(&devs, chunk_avg_bytes, config)?
        } else {
            let (chunk, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
            let sb = new_superblock(size_bytes, chunk, segment_bytes, slots);
            format_slot_files(dir, &sb, &config)?;
            sb
        };
        drop(open_private(&dir.join(LOCK_FILE), true)?);
        drop(open_private(&dir.join(LOG_FILE), true)?);

        // The superblock goes last: a directory without one is never mistaken for a space.
        write_superblock(dir, &sb)
    }

    /// Writes an empty space's metadata table onto `devs.meta` (which must be empty) for a
    /// data device of `devs.data.len()` bytes; returns the superblock describing it. The
    /// caller stores the superblock (`format` writes it to its own file, last).
    pub fn format_devices(
        devs: &Devices,
        chunk_avg_bytes: u32,
        config: Config,
    ) -> Result<Superblock> {
        let size_bytes = devs.data.len();
        let (chunk, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        if !devs.meta.is_empty() {
            return Err(Error::Invalid(
                "the metadata device is not empty; refusing to format over it".into(),
            ));
        }
        init_meta(
            &devs.meta,
            &config,
            0..size_bytes / segment_bytes as u64,
            None,
        )?;
        Ok(new_superblock(size_bytes, chunk, segment_bytes, 1))
    }

    /// Opens a space for exclusive use; fails if another process holds it. Of a multi-slot
    /// space, claims the first free slot.
    pub fn open(dir: &Path) -> Result<Space> {
        Self::open_with(dir, &SlotRequest::default())
    }

    /// Opens a single-slot space for an offline command (gc, check, config of a backing
    /// directory). A multi-slot space is refused: each of its slots is some node's, reached
    /// through that node's mount.
    pub fn open_offline(dir: &Path) -> Result<Space> {
        let sb = read_backing_dir(dir, true)?;
        if sb.slots > 1 {
            return Err(multi_slot_refusal(dir, &sb));
        }
        Self::open(dir)
    }

    /// Opens a space for writing: a single-slot space exclusively (its lock), a multi-slot
    /// space by claiming the slot `req` asks for (see `slots`).
    pub fn open_with(dir: &Path, req: &SlotRequest) -> Result<Space> {
        let sb = read_backing_dir(dir, true)?;
        if sb.slots == 1 {
            if let Some(s) = req.slot.filter(|s| s.0 != 0) {
                return Err(Error::Invalid(format!(
                    "slot {s} does not exist: {} has one slot (format it with --slots N for \
                     several nodes)",
                    dir.display()
                )));
            }
        }
        let (lock, lease, meta_file) = if sb.slots == 1 {
            let mut lock = take_lock(dir)?;
            lock.set_len(0)?;
            lock.write_all(format!("pid {}", std::process::id()).as_bytes())?;
            (lock, None, PathBuf::from(META_FILE))
        } else {
            // Shared: `format --force` on this node waits for every mount of it; other
            // nodes see the leases.
            let lock = File::open(dir.join(LOCK_FILE)).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => no_lock_file(dir),
                _ => Error::from(e),
            })?;
            // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
            unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
            let (table, _) = slot_table(dir, &sb, true)?;
            let settle = (req.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
            let lease = Lease::claim(table, req, settle)?;
            let meta = PathBuf::from(slot_meta_file(lease.slot()));
            (lock, Some(lease), meta)
        };
        if sb.features.contains(Features::INCOMPAT_TARGETS) {
            return Self::open_targeted(dir, sb, lock, lease, &meta_file);
        }
        let mut devs = Devices {
            data: Arc::new(FileDevice::new_direct(open_private(
                &dir.join(DATA_FILE),
                false,
            )?)?),
            meta: Arc::new(FileDevice::growable(open_private(
                &dir.join(&meta_file),
                false,
            )?)?),
        };
        let mut injected = None;
        // Fault injection for tests of what applications see on a mounted space; off unless
        // the variable is set (and then logged loudly).
        if let Some(spec) = std::env::var_os(FAULTS_ENV) {
            let faults = crate::sim::parse_faults(&spec.to_string_lossy())
                .map_err(|e| Error::Invalid(format!("{FAULTS_ENV}: {e}")))?;
            log::warn!("{FAULTS_ENV} is set: injecting I/O faults {faults:?}");
            let disk = crate::sim::SimDisk::new();
            injected = Some((disk.clone(), faults));
            let wrap = |name, inner| -> Arc<dyn Device> {
                Arc::new(crate::sim::FaultyDevice {
                    name,
                    disk: disk.clone(),
                    inner,
                })
            };
            devs = Devices {
                data: wrap("data", devs.data),
                meta: wrap("meta", devs.meta),
            };
        }
        let mut space = match &lease {
            None => Space::open_devices_slot(sb, devs, SlotId(0))?,
            Some(lease) => {
                let (table, head) = slot_table(dir, &sb, false)?;
                let shared: Arc<dyn Device> = Arc::new(crate::device::SharedFile::new(
                    File::open(dir.join(DATA_FILE))?,
                )?);
                let data = SlotData::File {
                    data: devs.data,
                    shared,
                };
                open_claimed(sb, devs.meta, data, lease.clone(), table, &head)?
            }
        };
        space.lease = lease.map(crate::slots::LeaseGuard);
        // Armed once the space is open: operation counts start after the open's own I/O
        // (the integrity check), so a test can name "the first commit's write".
        if let Some((disk, faults)) = injected {
            for f in faults {
                disk.inject(f);
            }
        }
        space.attach_writable(dir, lock);
        // Spaces formatted before the feature flags have the attribute tables now (the open
        // added them if they were missing): say so.
        space.add_features(Features::COMPAT_XATTRS)?;
        Ok(space)
    }

    /// `open_with` of a space over several targets (single slot, lock held): the
    /// metadata table in `dir`, the data on the targets. `CKPTFS_FAULTS` may name a target
    /// (`target0`, `target1`, ...) to fail its I/O.
    fn open_targeted(
        dir: &Path,
        sb: Superblock,
        lock: File,
        lease: Option<Arc<Lease>>,
        meta_file: &Path,
    ) -> Result<Space> {
        let mut injected = None;
        let faults = match std::env::var_os(FAULTS_ENV) {
            Some(spec) => {
                let f = crate::sim::parse_faults(&spec.to_string_lossy())
                    .map_err(|e| Error::Invalid(format!("{FAULTS_ENV}: {e}")))?;
                log::warn!("{FAULTS_ENV} is set: injecting I/O faults {f:?}");
                Some((crate::sim::SimDisk::new(), f))
            }
            None => None,
        };
        let wrap = |name: &'static str, dev: Arc<dyn Device>| -> Arc<dyn Device> {
            let dev: Arc<dyn Device> = match &faults {
                Some((disk, _)) => Arc::new(crate::sim::FaultyDevice {
                    name,
                    disk: disk.clone(),
                    inner: dev,
                }),
                None => dev,
            };
            match &lease {
                // A slot of a multi-slot space writes to the targets only while it holds
                // its lease.
                Some(l) => Arc::new(FencedDevice {
                    inner: dev,
                    lease: l.clone(),
                }),
                None => dev,
            }
        };
        let (erasure, table, mirrors) = open_targets(dir, &sb, false, &wrap, lease.as_ref())?;
        let mut meta: Arc<dyn Device> = Arc::new(FileDevice::growable(open_private(
            &dir.join(meta_file),
            false,
        )?)?);
        if let Some((disk, _)) = &faults {
            meta = Arc::new(crate::sim::FaultyDevice {
                name: "meta",
                disk: disk.clone(),
                inner: meta,
            });
        }
        if let Some(m) = mirrors {
            let mut devs = Vec::new();
            for (i, p) in &m.holders {
                let f = open_private(&p.join(crate::mirror::MIRROR_META), false)?;
                let d: Arc<dyn Device> = Arc::new(FileDevice::growable(f)?);
                devs.push((*i, wrap(crate::sim::mirror_device_name(*i), d)));
            }
            meta = Arc::new(crate::mirror::MirrorDevice::new(meta, devs, m.set));
        }
        if let Some((disk, f)) = faults {
            injected = Some((disk, f));
        }
        let mut space = match lease {
            None => Space::open_placed(sb, meta, erasure.clone(), SlotId(0))?,
            Some(lease) => {
                let (slots, head) = slot_table(dir, &sb, false)?;
                let data = SlotData::Targets(erasure.clone());
                let mut space = open_claimed(sb, meta, data, lease.clone(), slots, &head)?;
                space.lease = Some(crate::slots::LeaseGuard(lease));
                space
            }
        };
        if let Some((disk, faults)) = injected {
            for f in faults {
                disk.inject(f);
            }
        }
        space.targets = Some(erasure);
        space.targets_table = Some(table);
        space.attach_writable(dir, lock);
        if space.is_shared() {
            space.add_features(Features::COMPAT_XATTRS)?;
        }
        Ok(space)
    }

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
        let Some(t) = self.targets.as_ref() else {
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
        self.targets_table.as_ref()
    }

    /// The erasure-coded placement of a space over several targets.
    pub fn erasure(&self) -> Option<&Arc<crate::targets::Erasure>> {
        self.targets.as_ref()
    }

    /// The targets of a space over several (None for a one-target space).
    pub fn targets_report(&self) -> Option<crate::targets::TargetsReport> {
        let mut r = self.targets.as_ref()?.report();
        if let Some(t) = &self.targets_table {
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
    pub fn add_features(&mut self, features: Features) -> Result<()> {
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
    /// instead of reporting its chunks as corrupt.
    pub fn set_codec_policy(&mut self, policy: crate::codec::Policy) -> Result<()> {
        if !self.read_only {
            match policy {
                crate::codec::Policy::Lz4 => {}
                crate::codec::Policy::Shuffle => {
                    self.add_features(Features::INCOMPAT_SHUFFLE_CODECS)?
                }
                crate::codec::Policy::Float => self.add_features(Features::INCOMPAT_FLOAT_CODEC)?,
            }
        }
        self.store.set_codec_policy(policy);
        Ok(())
    }

    /// Opens the space in `dir` for reading only, writing nothing to the directory: the data
    /// file and the table are opened read-only, the table's own bookkeeping writes (and the
    /// repair of a table a crash left) stay in memory (`OverlayDevice`), the lock is shared
    /// (other read-only opens may share it; a read-write mount may not) and records no pid.
    /// Every change is refused with `Error::ReadOnly`.
    pub fn open_read_only(dir: &Path) -> Result<Space> {
        let sb = read_backing_dir(dir, false)?;
        if sb.slots > 1 {
            return Err(multi_slot_refusal(dir, &sb));
        }
        let lock = take_shared_lock(dir)?;
        let ro = |name: &str| -> Result<File> { Ok(File::open(dir.join(name))?) };
        if sb.features.contains(Features::INCOMPAT_TARGETS) {
            let (erasure, table, _) = open_targets(dir, &sb, true, &|_, d| d, None)?;
            let meta = Arc::new(crate::device::OverlayDevice::new(Arc::new(
                FileDevice::growable(ro(META_FILE)?)?,
            )));
            let mut space = Space::open_placed(sb, meta, erasure.clone(), SlotId(0))?;
            space.targets = Some(erasure);
            space.targets_table = Some(table);
            space.read_only = true;
            space.dir = dir.to_path_buf();
            space.lock = Some(lock);
            return Ok(space);
        }
        let devs = Devices {
            data: Arc::new(crate::device::ReadOnlyDevice(Arc::new(FileDevice::new(
                ro(DATA_FILE)?,
            )?))),
            meta: Arc::new(crate::device::OverlayDevice::new(Arc::new(
                FileDevice::growable(ro(META_FILE)?)?,
            ))),
        };
        let mut space = Space::open_devices(sb, devs)?;
        space.read_only = true;
        space.dir = dir.to_path_buf();
        space.lock = Some(lock);
        Ok(space)
    }

    /// Ties a space opened for writing to its backing directory: its lock, and the spill
    /// file for carried chunks beyond their memory budget (`spill`), next to the space.
    fn attach_writable(&mut self, dir: &Path, lock: File) {
        self.dir = dir.to_path_buf();
        self.lock = Some(lock);
        self.store
            .pipeline()
            .carries
            .spill_to(dir, self.sb.chunk.max_bytes as usize);
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Opens the space that `sb` describes on the given devices (the caller holds whatever
    /// makes it the only user). The metadata table's page checksums are all verified here,
    /// so a damaged table is reported at open instead of trusted.
    pub fn open_devices(sb: Superblock, devs: Devices) -> Result<Space> {
        Self::open_devices_slot(sb, devs, SlotId(0))
    }

    /// For simulations: writes the metadata table of a space over `targets` erasure-coded
    /// targets onto `meta` (empty) and returns its superblock and targets table (paths
    /// `simN`), whose geometry says how large each target device must be.
    pub fn format_targets_devices(
        meta: &Arc<dyn Device>,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        r: Redundancy,
        targets: usize,
    ) -> Result<(Superblock, TargetsTable)> {
        let (chunk, seg) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        let (segments, shard_bytes, slots) = target_geometry(size_bytes, seg, r, targets, 1);
        init_meta(meta, &config, 0..segments, None)?;
        let segment_bytes = (shard_bytes * r.data as u64) as u32;
        let sb = new_superblock(segments * segment_bytes as u64, chunk, segment_bytes, 1)
            .with_features(Features::INCOMPAT_TARGETS);
        let table = TargetsTable {
            redundancy: r,
            shard_bytes,
            slots,
            segments,
            targets: (0..targets)
                .map(|i| TargetSpec {
                    path: PathBuf::from(format!("sim{i}")),
                    domain: format!("target{i}"),
                })
                .collect(),
            failed: vec![false; targets],
            mirror: vec![false; targets],
            generation: 1,
        };
        Ok((sb, table))
    }

    /// For simulations: opens a space over an erasure-coded placement already built on
    /// simulated devices.
    pub fn open_targets_devices(
        sb: Superblock,
        meta: Arc<dyn Device>,
        erasure: Arc<crate::targets::Erasure>,
    ) -> Result<Space> {
        let mut space = Self::open_placed(sb, meta, erasure.clone(), SlotId(0))?;
        space.targets = Some(erasure);
        Ok(space)
    }

    /// `open_devices` for slot `slot` of the space: the table is that slot's, and only the
    /// slot's share of the data file is allocated from.
    pub fn open_devices_slot(sb: Superblock, devs: Devices, slot: SlotId) -> Result<Space> {
        let place = slot_data_file(&sb, devs.data, slot)?;
        Self::open_placed(sb, devs.meta, place, slot)
    }

    /// Opens slot `slot` of the space `sb` describes, with its metadata table on `meta` and
    /// its segments where `place` puts them.
    fn open_placed(
        sb: Superblock,
        meta: Arc<dyn Device>,
        place: Arc<dyn crate::placement::Placement>,
        slot: SlotId,
    ) -> Result<Space> {
        let range = sb.slot_segments(slot);
        let failed = Arc::new(AtomicBool::new(false));
        let db = Arc::new(open_db(&meta, false, failed.clone())?);
        if catalog::add_missing_tables(&db)? {
            log::info!(
                "added the extended-attribute tables to a space formatted by an earlier build"
            );
        }
        let free = Reader::new(&db)?.free_segments()?;
        if let Some(seg) = free.iter().find(|s| !range.contains(&s.0)) {
            return Err(Corruption::Layout(format!(
                "the catalog lists segment {seg} as free, outside this slot's segments \
                 {}..{} of the data file",
                range.start, range.end
            ))
            .into());
        }
        if failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other(
                "writing the metadata table failed while opening it",
            )));
        }
        let store = ChunkStore::new(
            place,
            crate::pipeline::Pipeline::new(),
            Arc::new(catalog::ChunkIndex(db.clone())),
            free,
            failed,
        );
        Ok(Space {
            dir: PathBuf::new(),
            sb,
            db,
            meta,
            store,
            lock: None,
            gc_lock: parking_lot::Mutex::new(()),
            gc_epoch: std::sync::atomic::AtomicU64::new(0),
            gc_totals: parking_lot::Mutex::new(GcTotals::default()),
            pin_gate: parking_lot::RwLock::new(()),
            pins: Arc::default(),
            ns_dirty: std::sync::atomic::AtomicBool::new(false),
            read_only: false,
            slot,
            segment_range: range,
            publisher: None,
            union: None,
            clock: None,
            lease: None,
            targets: None,
            targets_table: None,
        })
    }

    /// Records the mountpoint in the lock file, so tools can find the mount from the space.
    pub fn set_lock_note(&mut self, note: &str) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let lock = self
            .lock
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
    pub fn segment_range(&self) -> std::ops::Range<u64> {
        self.segment_range.clone()
    }

    /// The lease of a slot of a multi-slot space.
    pub fn lease(&self) -> Option<&Arc<Lease>> {
        self.lease.as_ref().map(|g| &g.0)
    }

    /// The other slots' published namespaces (a multi-slot space).
    pub fn union(&self) -> Option<&Arc<Union>> {
        self.union.as_ref()
    }

    /// Whether this is a slot of a shared namespace (a mounted slot of a multi-slot space).
    pub fn is_shared(&self) -> bool {
        self.union.is_some()
    }

    /// A new stamp of the shared namespace's clock (`stamp`), past every stamp this node has
    /// seen in the other slots' records.
    pub fn stamp(&self) -> u64 {
        match (&self.clock, &self.union) {
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
        let (Some(lease), Some(u)) = (self.lease(), &self.union) else {
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
        let Some(p) = &self.publisher else {
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
        let Some(p) = &self.publisher else {
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
        let Some(p) = &self.publisher else {
            return Ok(());
        };
        self.sync_meta_if_dirty()?;
        let recs = self.own_records()?;
        p.snapshot(&recs)
    }

    pub fn chunk_params(&self) -> ChunkParams {
        self.sb.chunk
    }

    pub fn chunks(&self) -> &dyn ChunkIo {
        &*self.store
    }

    /// The verified bytes of another slot's published extents' chunks, in order: read by
    /// the one chunk reader this slot's own files use (its cache, coalescing of adjacent
    /// chunks into one device read, verification, and the placement's repair), at the
    /// locations the owner published. `Corrupt` when a location is stale (the owner moved
    /// the chunk): the caller reads the owner's manifest again.
    pub fn read_published(
        &self,
        extents: &[&crate::manifest::PubExtent],
    ) -> Result<Vec<crate::chunk::ChunkBytes>> {
        let chunks: Vec<(ChunkHash, ChunkRecord)> =
            extents.iter().map(|e| (e.hash, e.chunk_record())).collect();
        self.store.get_many_at(&chunks)
    }

    /// Starts reading another slot's published extents' chunks ahead of a sequential
    /// reader (`ChunkStore::prefetch_at`: the read-ahead this slot's files get).
    pub fn prefetch_published(&self, extents: &[&crate::manifest::PubExtent]) {
        self.store
            .prefetch_at(extents.iter().map(|e| (e.hash, e.chunk_record())).collect())
    }

    /// Takes a write request's bytes into `file`, timed as the `ingest` stage.
    pub fn ingest(&self, file: &mut FileState, off: u64, data: &[u8]) -> Result<()> {
        // The backing filesystem filled up: no new data, so the commits under way keep the
        // table's room (a table write the filesystem refused would fail the whole space).
        if self.meta.room_low() {
            return Err(Error::BackingFull);
        }
        let t = std::time::Instant::now();
        let r = file.write(&*self.store, off, data);
        self.store.stages().ingest.add(t.elapsed(), data.len());
        r
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

    /// The committed record of a chunk, if it is committed.
    pub fn committed_record(&self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        self.store.committed_record(h)
    }

    /// The metadata table itself: for the engine's tests that damage a space on purpose.
    /// Everything else reads and writes through the catalog (`reader`, `ns_write`); only
    /// the engine begins and commits write transactions.
    #[doc(hidden)]
    pub fn db(&self) -> &Database {
        &self.db
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
                if !durable {
                    self.ns_dirty
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                }
                Ok(v)
            }
            Err(e) => {
                txn.abort().map_err(Error::from)?;
                Err(e)
            }
        }
    }

    /// Begins a metadata transaction. A durable one commits in two phases (its pages are
    /// synced before the commit slot naming them is written), so on open redb never has to
    /// fall back to the previous commit: an acknowledged commit cannot be silently rolled
    /// back, and a damaged table is an error. Costs one more fdatasync of the table per
    /// durable commit. Non-durable transactions (namespace changes) become durable with the
    /// next durable one.
    pub(crate) fn begin_write(&self, durable: bool) -> Result<redb::WriteTransaction> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if self.store.is_failed() {
            return Err(Error::Failed);
        }
        let mut txn = self.db.begin_write()?;
        if durable {
            txn.set_two_phase_commit(true);
            // Write transactions run one at a time: every non-durable commit so far is
            // before this one, and becomes durable with it.
            self.ns_dirty
                .store(false, std::sync::atomic::Ordering::SeqCst);
        } else {
            txn.set_durability(Durability::None)
                .map_err(|e| Error::Meta(e.to_string()))?;
        }
        Ok(txn)
    }

    /// Commits a metadata transaction. A failed commit is sticky like a failed data write:
    /// the table's state on disk is unknown, so nothing more may be acknowledged.
    pub(crate) fn commit(&self, txn: redb::WriteTransaction) -> Result<()> {
        txn.commit()
            .map_err(|e| self.store.fail_with(Error::from(e)))
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

    /// A read snapshot of the catalog.
    pub fn reader(&self) -> Result<Reader> {
        Reader::new(&self.db)
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
        let mut map = ExtentMap::new();
        if rev.0 == 0 {
            return Ok(map);
        }
        for (off, e) in self.reader()?.extents(rev)? {
            map.push_loaded(off, e)?;
        }
        Ok(map)
    }

    /// Opens a file's committed content for reading and writing.
    pub fn load_file(&self, rec: &InodeRecord) -> Result<FileState> {
        let map = self.load_map(rec.current_rev)?;
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
        Ok(FileState::new(
            self.sb.chunk,
            map,
            rec.size,
            self.store.new_pins(),
        ))
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
        self.commit_file_keeping(ino, file, rec, seal, Previous::Replace)
    }

    /// `commit_file`, saying what becomes of an unsealed current revision.
    pub fn commit_file_keeping(
        &self,
        ino: InodeId,
        file: &mut FileState,
        rec: &mut InodeRecord,
        seal: Seal,
        previous: Previous,
    ) -> Result<RevisionId> {
        assert_eq!(rec.kind, NodeKind::File);
        assert!(
            rec.history != HistoryId::NONE,
            "regular file without a history"
        );
        self.store.flush_sync()?;
        let t_commit = std::time::Instant::now();
        let taken = self.store.taken_segments();
        let txn = self.begin_write(true)?;
        let rev = {
            let mut t = Txn::open(&txn)?;
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
            t.put_inode(ino, rec)?;
            rev
        };
        self.commit(txn)?;
        self.store.stages().commit.add(t_commit.elapsed(), 0);
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

    /// Marks a revision complete: its file's last writer has let go of it.
    pub fn seal(&self, rev: RevisionId) -> Result<()> {
        let txn = self.begin_write(true)?;
        if !Txn::open(&txn)?.seal(rev)? {
            txn.abort()?;
            return Ok(());
        }
        self.commit(txn)?;
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

    /// Makes every earlier non-durable metadata commit durable (fsync of a directory).
    pub fn sync_meta(&self) -> Result<()> {
        self.ns_write(true, |_| Ok::<(), Error>(()))
    }

    /// `sync_meta` when a namespace change is not yet durable; nothing otherwise. A close
    /// that had no data to commit calls this, so a file created empty (a "done" marker) or an
    /// unlink before it survives a crash once close returns.
    pub fn sync_meta_if_dirty(&self) -> Result<()> {
        if self.ns_dirty.load(std::sync::atomic::Ordering::SeqCst) {
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
            failed: self.store.is_failed(),
            backing_full: self.meta.room_low(),
            stages: self.store.stages().snapshot(),
            gc: self.gc_totals.lock().clone(),
            carries: self.store.pipeline().carries.totals(),
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
        s.split = crate::usage::split(&r, s.stored_bytes)?;
        Ok(s)
    }
}
