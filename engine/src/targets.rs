//! A space over several storage targets, erasure-coded (`format --target DIR ...
//! --redundancy M+K`): the `Placement` that keeps each segment as M data shards and K parity
//! shards on M+K targets in distinct failure domains, so every committed byte survives the
//! loss of any K of them.
//!
//! - A target is a directory on its own disk (or node-local device, or PFS pool) holding one
//!   preallocated file, `ckptfs-target`: a 4 KiB header naming the space and the target's
//!   index, then `slots` shard slots of `shard_bytes` each. Nothing is created afterwards.
//! - A segment of `segment_bytes = M * shard_bytes` is rows of M 4 KiB blocks: logical
//!   block `b` of the segment is block `b / M` of data shard `b % M`; parity shard `j` holds
//!   the Reed-Solomon parity (`reed-solomon-simd`) of each row at the same block. The chunk
//!   store writes whole rows only (`write_align`) and pads the last one at a commit, so a
//!   row and its parity, once written, are never written again: no write hole.
//! - Placement is per segment, chosen when the store starts filling it (`prepare`) and
//!   recorded durably in the space's `placement` file (128 bytes a segment, see FORMAT.md)
//!   before any of its bytes is written: M+K targets, one per failure domain, greedily by
//!   predicted availability (fewer observed errors first) and measured write bandwidth, the
//!   emptiest first among equals. With fewer than M+K healthy domains a segment gets fewer
//!   parity shards (a loud warning in the log; `rebuild` adds them back later); with fewer
//!   than M, the write fails.
//! - Reads go to the data shards. A shard that cannot be read (missing target, EIO) is
//!   rebuilt from any M others; a chunk that fails its blake3 check (a silently damaged
//!   shard) is repaired by `read_repair`, which reads the chunk's rows of every shard once
//!   and excludes one shard, then two, ... until the check passes (shards found bad before
//!   first). Both are counted, and the shard found bad is remembered (`Suspects`; another
//!   slot's segments apart, `foreign_bad`): later reads of its segment rebuild its part
//!   from the others instead of failing their check on it again, until a repair rewrites it.
//! - A target that fails a write or a sync is failed (sticky, per target): the space goes
//!   on degraded while every segment written keeps at least M durable shards. Read errors
//!   only count against the target's availability.
//!
//! Memory: a read or write holds its own bytes plus M+K shard buffers of the same size
//! (bounded by the store's read and write sizes); the placement map holds `(M+K) * 6` bytes
//! per placed segment; `verify_parity` (`ckptfs check`) holds `VERIFY_ROWS` rows of every
//! shard.

mod health;
mod repair;

use crate::error::{DevResult, Fault};
pub(crate) use health::SUSPECTS_MAX;
use health::{Suspects, WarnKind, Warnings};
#[cfg(test)]
use repair::REPAIR_ROWS;
pub(crate) use repair::{SegmentChunk, SegmentJob, Throttle};

use crate::device::{Device, IoBuf, DIRECT_ALIGN};
use crate::error::TargetFault;
pub(crate) use crate::format::targets::{Placed, ShardAt, TargetHeader, TARGET_HEADER_BYTES};
pub use crate::format::targets::{Redundancy, TargetSpec, TargetsTable, RECORD_BYTES};
use crate::format::SegmentId;
pub(crate) use crate::format::{PLACEMENT_FILE, TARGETS_FILE};
use crate::placement::{Location, Placement};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Bytes of a block: the unit of a row, of a shard's rows and of direct I/O.
pub const BLOCK: usize = DIRECT_ALIGN;
/// The file each target directory holds.
pub const TARGET_FILE: &str = "ckptfs-target";
/// Lock stripes over segments (see `Erasure::stripes`).
const STRIPES: usize = 64;

/// One storage target as the placement sees it.
pub struct Target {
    pub path: PathBuf,
    pub domain: String,
    /// None: it could not be opened (the reason is in `failed_reason`).
    dev: Option<Arc<dyn Device>>,
    slots: u64,
    failed: AtomicBool,
    failed_reason: Mutex<Option<String>>,
    /// I/O errors seen on it (reads and writes): what predicts its availability.
    errors: AtomicU64,
    /// Since the mount: reads of its shards that failed, and shards found holding damaged
    /// bytes (a chunk verified only without them, or parity that disagrees with verified
    /// data). Shown by `targets`, `stats` and `--prometheus`.
    read_errors: AtomicU64,
    verify_errors: AtomicU64,
    /// Blocks of its shards rewritten in place by a repair since the mount.
    repaired_blocks: AtomicU64,
    /// Written since the last sync, so the next sync covers it.
    dirty: AtomicBool,
    bytes_written: AtomicU64,
    write_ns: AtomicU64,
    bytes_read: AtomicU64,
    /// Its file was found cut short outside ckptfs (see `CutShort`): the shards past the
    /// cut are lost on it until a repair rewrites them.
    cut: Mutex<Option<CutShort>>,
}

/// A target file found shorter than its reserved size (a copy that ran out of room, a
/// truncate by mistake): every shard reaching past byte `at` lost its bytes there. The
/// file is extended again at a read-write open, so its length no longer says so: `marker`
/// (`cut_marker`, in the target's directory) does, until this node's repairs have
/// rewritten every such shard of its own segments.
#[derive(Clone, Debug)]
pub(crate) struct CutShort {
    pub at: u64,
    pub marker: Option<PathBuf>,
}

/// The file in a target's directory that remembers, for slot `slot` (0 on a single-slot
/// space), that the target file was cut short at the byte it holds (decimal text), until
/// that slot's node has repaired every shard of its segments past it.
pub fn cut_marker(dir: &Path, slot: u32) -> PathBuf {
    dir.join(format!("{TARGET_FILE}.cut-{slot}"))
}

/// The offset a cut marker (`targets::cut_marker`) holds; None where there is none. One that
/// cannot be read or does not hold a number counts every shard as cut off (the header's end).
pub(crate) fn read_cut_marker(path: &Path) -> Option<u64> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(text.trim().parse::<u64>().unwrap_or_else(|_| {
            log::error!(
                "{} does not hold a byte offset ({text:?}): every shard on its target is taken \
                 as cut off",
                path.display()
            );
            TARGET_HEADER_BYTES
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            log::error!(
                "{}: {e}: every shard on its target is taken as cut off",
                path.display()
            );
            Some(TARGET_HEADER_BYTES)
        }
    }
}

impl Target {
    /// A target whose file is open (`dev`), or that could not be opened (`Err(reason)`).
    pub fn new(
        path: PathBuf,
        domain: String,
        slots: u64,
        dev: Result<Arc<dyn Device>, String>,
    ) -> Target {
        let (dev, reason) = match dev {
            Ok(d) => (Some(d), None),
            Err(r) => (None, Some(r)),
        };
        Target {
            path,
            domain,
            failed: AtomicBool::new(dev.is_none()),
            dev,
            slots,
            failed_reason: Mutex::new(reason),
            errors: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            verify_errors: AtomicU64::new(0),
            repaired_blocks: AtomicU64::new(0),
            dirty: AtomicBool::new(false),
            bytes_written: AtomicU64::new(0),
            write_ns: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            cut: Mutex::new(None),
        }
    }

    fn healthy(&self) -> bool {
        !self.failed.load(Ordering::SeqCst)
    }

    /// Predicted availability in (0, 1]: 1 for a target that never erred, less the more
    /// errors it showed (a target that has been failing gets fewer new shards).
    fn availability(&self) -> f64 {
        1.0 / (1.0 + self.errors.load(Ordering::Relaxed) as f64)
    }

    /// Measured write bandwidth in bytes/s (None before the first write).
    fn bandwidth(&self) -> Option<f64> {
        let ns = self.write_ns.load(Ordering::Relaxed);
        (ns > 0).then(|| self.bytes_written.load(Ordering::Relaxed) as f64 * 1e9 / ns as f64)
    }
}

/// What `ckptfs targets` and `stats` show of one target.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TargetReport {
    pub index: u16,
    pub path: String,
    pub domain: String,
    /// "ok", "degraded: WHY" (shards on it found unreadable or damaged since the mount and
    /// not repaired yet), "failed: REASON" or "retired: REASON".
    pub state: String,
    pub errors: u64,
    /// Since the mount: failed reads of its shards, and shards found damaged.
    #[serde(default)]
    pub read_errors: u64,
    #[serde(default)]
    pub verify_errors: u64,
    /// Blocks of its shards a repair rewrote since the mount.
    #[serde(default)]
    pub repaired_blocks: u64,
    /// Its shards known unreadable or damaged now (found since the mount, not repaired).
    #[serde(default)]
    pub suspect_shards: u64,
    pub shards: u64,
    pub free_shards: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub write_mib_s: Option<f64>,
    /// Holds a current mirror of the space's metadata (`mirror.rs`).
    #[serde(default)]
    pub metadata_mirror: bool,
}

/// The whole set: per target, and what redundancy the data has right now.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TargetsReport {
    pub redundancy: String,
    pub targets: Vec<TargetReport>,
    /// Placed segments whose shards are all on healthy targets.
    pub segments_full: u64,
    /// Placed segments missing some shards (a failed target, or placed short), by how many
    /// more shards each could lose: `[lost-tolerance] = segments`.
    pub segments_degraded: Vec<(u64, u64)>,
    /// Placed segments with fewer than M shards left, or holding a chunk no M shards gave
    /// back verified (more shards damaged than the parity covers): their chunks are lost.
    pub segments_lost: u64,
    /// Reads since the mount of chunks that no M shards gave back verified (EIO to the
    /// reader, `ckptfs check` lists them). Absent from an older daemon's answer.
    #[serde(default)]
    pub chunks_lost_reads: u64,
    pub reconstructed_reads: u64,
    pub repaired_reads: u64,
    /// Of one slot of a space shared by several nodes: that slot (the segment counts are
    /// its segments'; the other slots report theirs through their own mounts).
    #[serde(default)]
    pub slot: Option<u32>,
}

impl TargetsReport {
    /// Some data has less redundancy than the space's M+K (a failed target still holds
    /// shards, or segments are short or lost). A failed target that holds none (replaced,
    /// `rebuild` moved its shards) does not count.
    pub fn degraded(&self) -> bool {
        self.segments_lost > 0
            || !self.segments_degraded.is_empty()
            || self
                .targets
                .iter()
                .any(|t| t.state != "ok" && (t.shards > 0 || t.state.starts_with("degraded")))
    }

    /// Targets that failed, and targets with shards found unreadable or damaged.
    pub fn failed_and_degraded(&self) -> (usize, usize) {
        let failed = self
            .targets
            .iter()
            .filter(|t| t.state.starts_with("failed"))
            .count();
        let degraded = self
            .targets
            .iter()
            .filter(|t| t.state.starts_with("degraded"))
            .count();
        (failed, degraded)
    }
}

/// What `Erasure::rebuild` did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RebuildReport {
    /// Placed segments looked at.
    pub segments_checked: u64,
    /// Segments whose missing shards were rebuilt (all, or some: see `segments_short`).
    pub segments_rebuilt: u64,
    pub shards_written: u64,
    pub bytes_written: u64,
    /// Segments still short of shards afterwards: no healthy target with room in a failure
    /// domain the segment does not use yet (add targets), or a write failed.
    pub segments_short: u64,
    /// Segments with fewer than M shards on healthy targets: nothing to rebuild from.
    pub segments_lost: u64,
    pub seconds: f64,
    /// Committed chunks read back and verified by blake3 (as stored, or rebuilt from the
    /// other shards); every shard written was encoded from these.
    #[serde(default)]
    pub chunks_verified: u64,
    /// Of them, chunks whose stored bytes failed the check and that verified only rebuilt
    /// without some shard: those shards held damaged bytes.
    #[serde(default)]
    pub chunks_repaired: u64,
    /// Committed chunks that no combination of the readable shards verifies: lost. Their
    /// rows are rewritten nowhere (nothing says what they should hold).
    #[serde(default)]
    pub chunks_lost: u64,
    /// The first `MAX_LISTED_LOST` of them: (segment, offset in it, stored length).
    #[serde(default)]
    pub lost: Vec<(u64, u64, u32)>,
    /// 4 KiB blocks of shards on healthy targets rewritten in place because they were
    /// damaged, stale or unreadable.
    #[serde(default)]
    pub blocks_rewritten: u64,
    /// Segments being written while visited: their rows were copied to new shards but
    /// nothing was rewritten in place (a later `ckptfs scrub` verifies them).
    #[serde(default)]
    pub segments_busy: u64,
    /// Shard reads that failed.
    #[serde(default)]
    pub read_errors: u64,
    /// `scrub`: the holders' copies of the metadata table and of the placement records
    /// compared with the primary (`mirror.rs`), one per holder and file.
    #[serde(default)]
    pub mirror_copies_checked: u64,
    /// 4 KiB blocks of those copies that differed from the primary (damage on a holder's
    /// disk) and were rewritten from it.
    #[serde(default)]
    pub mirror_blocks_rewritten: u64,
    /// Holders' copies of the superblock and of the targets table that differed from the
    /// primary's and were rewritten.
    #[serde(default)]
    pub mirror_files_rewritten: u64,
    /// Holders whose copy could not be read or written: dropped (no longer claimed
    /// current; the next mount copies the metadata to a healthy target again).
    #[serde(default)]
    pub mirror_failures: Vec<String>,
}

impl RebuildReport {
    /// A committed chunk is lost.
    fn lose(&mut self, seg: u64, offset: u64, len: u32) {
        self.chunks_lost += 1;
        if self.lost.len() < MAX_LISTED_LOST {
            self.lost.push((seg, offset, len));
        }
    }

    /// Everything committed survived (nothing lost, nothing short).
    pub(crate) fn is_whole(&self) -> bool {
        self.chunks_lost == 0 && self.segments_lost == 0 && self.segments_short == 0
    }
}

/// Lost chunks a `RebuildReport` lists (the rest are counted).
pub(crate) const MAX_LISTED_LOST: usize = 100;

/// Rows `Erasure::verify_parity` reads at a time, whatever the segment size. Memory: the M+K
/// shards of that many blocks (at most 64 x 4 KiB x `MAX_SHARDS` = 4 MiB), as much again for
/// the re-encoded parity and any data shards rebuilt, and the Reed-Solomon codec's work space.
pub(crate) const VERIFY_ROWS: u64 = 64;
/// Segments with findings a `ParityReport` lists (the rest are counted), and rows (or row
/// ranges) of each kind it lists per segment.
pub(crate) const MAX_LISTED_SEGMENTS: usize = 1000;
pub(crate) const MAX_LISTED_ROWS: usize = 64;

/// What `Erasure::verify_parity` found: each row's parity re-encoded from its data shards and
/// compared with the parity shards stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParityReport {
    /// Segments with rows to check.
    pub segments_checked: u64,
    /// Rows looked at (those `verify_parity` was given: the rows holding live chunks).
    pub rows_checked: u64,
    /// Rows whose stored parity differs from what their data encodes to.
    pub rows_inconsistent: u64,
    /// Rows missing some shards (a failed target, a read error, placed short) but with at
    /// least M readable, by how many more shards each can lose: `[(tolerance, rows)]`. At
    /// tolerance 0 a row's parity cannot be checked (any M shards agree with each other).
    pub rows_degraded: Vec<(u64, u64)>,
    /// Rows with fewer than M readable shards: what their missing data shards held is lost.
    pub rows_unrecoverable: u64,
    /// Segments with any of the above, in segment order (at most `MAX_LISTED_SEGMENTS`).
    pub segments: Vec<SegmentParity>,
    pub segments_omitted: u64,
}

#[cfg(test)]
impl ParityReport {
    /// Every row checked has all its shards and parity that matches its data.
    fn is_whole(&self) -> bool {
        self.rows_inconsistent == 0 && self.rows_degraded.is_empty() && self.rows_unrecoverable == 0
    }
}

impl ParityReport {}

/// One segment's findings.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentParity {
    pub segment: u64,
    /// The target of each shard (data shards first; None: not placed).
    pub targets: Vec<Option<u16>>,
    pub rows_checked: u64,
    pub inconsistent_rows: u64,
    /// The first `MAX_LISTED_ROWS` of them.
    pub inconsistent: Vec<InconsistentRow>,
    /// Shards unreadable in some row checked.
    pub missing_shards: Vec<usize>,
    /// Rows missing shards but with at least M readable, and the fewest more shards any of
    /// them can lose.
    pub degraded_rows: u64,
    pub tolerance: Option<u64>,
    pub unrecoverable_rows: u64,
    /// Their `[start, end)` row ranges, the first `MAX_LISTED_ROWS`.
    pub unrecoverable: Vec<(u64, u64)>,
}

impl SegmentParity {
    fn has_findings(&self) -> bool {
        self.inconsistent_rows + self.degraded_rows + self.unrecoverable_rows > 0
    }
}

/// A row whose stored parity differs from the encoding of its data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InconsistentRow {
    pub row: u64,
    /// The parity shards (index M and up) whose stored bytes differ from the parity the
    /// row's data shards, as stored, encode to. A damaged *data* shard makes every parity
    /// shard differ, so this does not say which shard is bad: `damaged_shards` does.
    pub parity_shards: Vec<usize>,
    /// The shards found damaged: the fewest whose exclusion leaves the rest of the row
    /// consistent, when that is unique and more than M shards remain to agree (else empty:
    /// the row cannot tell which).
    #[serde(default)]
    pub damaged_shards: Vec<usize>,
    /// Every data shard was read as stored, none rebuilt from parity. Then parity shards
    /// differing while others agree are the damaged ones (one damaged data shard changes
    /// every parity shard of a Reed-Solomon code); all differing leaves it open.
    pub data_read: bool,
}

/// The erasure-coded placement over several targets (see the module comment).
pub struct Erasure {
    r: Redundancy,
    segment_bytes: u64,
    segments: u64,
    shard_bytes: u64,
    /// Every target the space has had, by index (a replaced one stays, failed: placement
    /// records name targets by index). Appended to by `add_target`.
    targets: RwLock<Vec<Arc<Target>>>,
    /// Writes to a segment take its stripe shared; `rebuild` of a segment takes it
    /// exclusive, so no row is written between its reconstruction and the switch of the
    /// segment's record.
    stripes: Vec<RwLock<()>>,
    /// The space's `placement` file: one record per segment.
    map_dev: Arc<dyn Device>,
    map: RwLock<Vec<Option<Placed>>>,
    /// Free shard slots per target.
    free: Mutex<Vec<BTreeSet<u32>>>,
    /// Segments written since the last sync (checked for enough durable shards).
    touched: Mutex<BTreeSet<u64>>,
    reconstructed: AtomicU64,
    repaired: AtomicU64,
    /// Segments holding a chunk that no set of M shards gave back verified (more shards
    /// damaged than the parity covers), with how many such reads: lost data, whatever the
    /// targets' states say, until the segment is placed again (gc freed it). At most one
    /// entry per placed segment.
    lost: Mutex<BTreeMap<u64, u64>>,
    /// Shards found unreadable or damaged since the mount and not repaired (`Suspects`).
    suspects: Mutex<Suspects>,
    /// The same for other slots' segments (their owners repair them; this node only reads
    /// around them): which shard of a segment, where it was when found bad. A segment its
    /// owner re-placed since names other places, so the entry stops matching. At most
    /// `SUSPECTS_MAX` entries; when full it is emptied (reads then find the damage again).
    foreign_bad: Mutex<HashMap<(u64, usize), ShardAt>>,
    /// Repeated warnings, one line per target and kind per `WARN_INTERVAL`.
    warnings: Warnings,
    /// Records a target's failure durably (the space's `targets` table), so it stays failed
    /// at the next mount.
    on_fail: Mutex<Option<FailHook>>,
    /// Records that a target's file was found cut short while mounted (its cut markers,
    /// `cut_marker`) and returns this node's marker, with this node's slot (whose marker
    /// another node may write): set on a read-write mount.
    on_cut: Mutex<Option<(u32, CutHook)>>,
    /// When `sync` last ran `watch_files` (`device::WATCH_INTERVAL`).
    watched: crate::device::WatchClock,
    /// Of one slot of a multi-slot space (`Share`): the segments this node places and
    /// writes. Only their records are kept in `map`; another slot's segment's record is
    /// read from the placement file at each read (its owner re-places it at will).
    own: Option<Range<u64>>,
}

/// One slot's part of a space over targets shared by several nodes: the segments it places
/// and writes, and the shard slots of every target it places them in (the other slots own
/// the rest, so no two nodes ever take the same shard slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub segments: Range<u64>,
    pub shard_slots: Range<u32>,
}

impl Share {
    /// Slot `slot` of `slots`' share of a space whose targets have `per_target` shard
    /// slots each, for its segments `segments`: an equal part of every target's shard
    /// slots, in slot order (FORMAT.md "Slots over targets").
    pub fn of(slot: u32, slots: u32, per_target: u64, segments: Range<u64>) -> Share {
        let (i, n) = (slot as u64, slots.max(1) as u64);
        Share {
            segments,
            shard_slots: (i * per_target / n) as u32..((i + 1) * per_target / n) as u32,
        }
    }
}

/// Times a foreign record that fails its checksum (caught mid-rewrite) is read again.
const RECORD_READS: usize = 3;

/// Called with a target's index when it fails.
pub(crate) type FailHook = Box<dyn Fn(u16) + Send + Sync>;

/// See `Erasure::on_cut`: the target's directory, the byte its file was cut at; this node's
/// marker.
pub(crate) type CutHook =
    Box<dyn Fn(&Path, u64) -> std::result::Result<PathBuf, String> + Send + Sync>;

/// A damaged record of the targets' on-disk structures (`record` names which).
/// A placement record (or the placement file) that contradicts the space.
fn bad(segment: Option<u64>, why: String) -> Fault {
    TargetFault::BadPlacement { segment, why }.into()
}

impl Erasure {
    /// Opens the placement over `targets` (in index order; a target that failed to open is
    /// there, failed) with the placement file `map_dev`, which lists every segment's record.
    pub fn open(
        r: Redundancy,
        shard_bytes: u64,
        segments: u64,
        targets: Vec<Target>,
        map_dev: Arc<dyn Device>,
    ) -> DevResult<Erasure> {
        Self::open_share(r, shard_bytes, segments, targets, map_dev, None)
    }

    /// `open` for one slot of a multi-slot space: it places and writes only `share`'s
    /// segments, in `share`'s shard slots, and reads every other segment where its
    /// record says at the time of the read.
    pub(crate) fn open_share(
        r: Redundancy,
        shard_bytes: u64,
        segments: u64,
        targets: Vec<Target>,
        map_dev: Arc<dyn Device>,
        share: Option<Share>,
    ) -> DevResult<Erasure> {
        if !shard_bytes.is_multiple_of(BLOCK as u64) || shard_bytes == 0 {
            return Err(bad(
                None,
                format!("gives a shard size of {shard_bytes}, not a whole number of blocks"),
            ));
        }
        if map_dev.len() < segments * RECORD_BYTES as u64 {
            return Err(bad(
                None,
                format!(
                    "has {} bytes, {} segments need {}",
                    map_dev.len(),
                    segments,
                    segments * RECORD_BYTES as u64
                ),
            ));
        }
        let mut raw = vec![0u8; (segments as usize) * RECORD_BYTES];
        map_dev.read_at(&mut raw, 0)?;
        let mut map = Vec::with_capacity(segments as usize);
        let mut free: Vec<BTreeSet<u32>> = targets
            .iter()
            .map(|t| match &share {
                None => (0..t.slots as u32).collect(),
                Some(sh) => sh
                    .shard_slots
                    .clone()
                    .filter(|&x| (x as u64) < t.slots)
                    .collect(),
            })
            .collect();
        for (s, rec) in raw.chunks(RECORD_BYTES).enumerate() {
            if share
                .as_ref()
                .is_some_and(|sh| !sh.segments.contains(&(s as u64)))
            {
                // Another slot's: read afresh whenever it is read (`placed`).
                map.push(None);
                continue;
            }
            let p = match Placed::decode(rec) {
                Ok(p) => p,
                Err(e) => {
                    // A record is rewritten only when its segment is free (re-placed before
                    // new data), so a torn one held nothing: it is unplaced.
                    log::warn!("placement record of segment {s} {e}; treating it as unplaced");
                    None
                }
            };
            if let Some(p) = &p {
                if p.shards.len() != r.shards() {
                    return Err(bad(
                        Some(s as u64),
                        format!("has {} shards, the space is {r}", p.shards.len()),
                    ));
                }
                for sh in p.shards.iter().flatten() {
                    let t = free.get_mut(sh.target as usize).ok_or_else(|| {
                        bad(
                            Some(s as u64),
                            format!("names target {}, unknown", sh.target),
                        )
                    })?;
                    if !t.remove(&sh.slot) {
                        return Err(bad(
                            Some(s as u64),
                            format!(
                                "names slot {} of target {}, which is taken or out of range",
                                sh.slot, sh.target
                            ),
                        ));
                    }
                }
            }
            map.push(p);
        }
        Ok(Erasure {
            r,
            segment_bytes: shard_bytes * r.data as u64,
            segments,
            shard_bytes,
            targets: RwLock::new(targets.into_iter().map(Arc::new).collect()),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            map_dev,
            map: RwLock::new(map),
            free: Mutex::new(free),
            touched: Mutex::new(BTreeSet::new()),
            reconstructed: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
            lost: Mutex::new(BTreeMap::new()),
            suspects: Mutex::new(Suspects::default()),
            foreign_bad: Mutex::new(HashMap::new()),
            warnings: Warnings::default(),
            on_fail: Mutex::new(None),
            on_cut: Mutex::new(None),
            watched: Default::default(),
            own: share.map(|s| s.segments),
        })
    }

    /// Places segment `seg` unless it is placed already: for segments written outside the
    /// store's allocation (a slot's manifest area), whose bytes must never be dropped by a
    /// re-placement.
    pub(crate) fn place_if_unplaced(&self, seg: u64) -> DevResult<()> {
        if self
            .map
            .read()
            .get(seg as usize)
            .is_some_and(|p| p.is_some())
        {
            return Ok(());
        }
        self.prepare(SegmentId(seg))
    }

    /// Whether this node places and writes segment `seg` (every segment, unless it is one
    /// slot of a multi-slot space).
    pub fn owns(&self, seg: u64) -> bool {
        self.own.as_ref().is_none_or(|o| o.contains(&seg))
    }

    /// Segment `seg`'s record as the placement file holds it now (another slot's segment).
    fn read_record(&self, seg: u64) -> DevResult<Placed> {
        let mut b = [0u8; RECORD_BYTES];
        let mut why = String::new();
        for _ in 0..RECORD_READS {
            self.map_dev.read_at(&mut b, seg * RECORD_BYTES as u64)?;
            match Placed::decode(&b) {
                Ok(Some(p)) if p.shards.len() == self.r.shards() => {
                    if let Some(t) = p
                        .shards
                        .iter()
                        .flatten()
                        .find(|a| a.target as usize >= self.targets.read().len())
                    {
                        return Err(bad(
                            Some(seg),
                            format!(
                                "names target {}, which the targets table does not have",
                                t.target
                            ),
                        ));
                    }
                    return Ok(p);
                }
                Ok(Some(p)) => {
                    return Err(bad(
                        Some(seg),
                        format!("has {} shards, the space is {}", p.shards.len(), self.r),
                    ))
                }
                Ok(None) => return Err(TargetFault::Unplaced { segment: seg }.into()),
                Err(e) => why = format!("does not decode ({e})"),
            }
        }
        Err(bad(Some(seg), why))
    }

    /// Sets what records a target's failure durably (see `on_fail`).
    pub(crate) fn set_fail_hook(&self, hook: FailHook) {
        *self.on_fail.lock() = Some(hook);
    }

    /// Sets what records a target file cut short while mounted, and the slot whose markers
    /// are this node's (see `on_cut`).
    pub(crate) fn set_cut_hook(&self, slot: u32, hook: CutHook) {
        *self.on_cut.lock() = Some((slot, hook));
    }

    /// Looks at each healthy target's file as the filesystem has it now, for what was done
    /// to it outside ckptfs while mounted, which the I/O itself would show only when a read
    /// reaches the damage (until then `stats` said full redundancy):
    /// - the file at the target's path is not the one open here (removed, or replaced by a
    ///   copy, an older one say): what this node writes goes to a file nobody will find
    ///   again, so the target is failed now (its shards read from the others, `rebuild`
    ///   places them again);
    /// - the file is shorter than its reserved size: cut short, as a read-write open finds
    ///   a file cut while unmounted (`cut_short`, and its markers through `on_cut`), so
    ///   `stats` says DEGRADED and `rebuild` rewrites the shards past the cut;
    /// - this node's cut marker appeared: another node of a multi-slot space found the cut
    ///   first and extended the file again, so its length says nothing here any more.
    ///
    /// Called by `sync` (at commits, at most once per `device::WATCH_INTERVAL`) and before every
    /// report, so a status never counts a shard the file no longer holds: per target one
    /// fstat, one stat and one open of this node's marker (absent but after a cut). What it cannot
    /// see: a cut that this node's writes extended past again before it looked (the bytes
    /// in between read as zeros, which blake3 finds on a read, and `scrub` finds anyway).
    pub(crate) fn watch_files(&self) {
        for (i, t) in self.all().iter().enumerate() {
            let Some(dev) = t.dev.as_ref().filter(|_| t.healthy()) else {
                continue;
            };
            let now = match dev.file_now() {
                None => continue,
                Some(Ok(now)) => now,
                Some(Err(e)) => {
                    log::warn!("target {i}: fstat of its open file: {e}");
                    continue;
                }
            };
            let path = t.path.join(TARGET_FILE);
            let gone = match now.at(&path) {
                Ok(crate::device::PathNow::Same) => None,
                Ok(crate::device::PathNow::Replaced) => Some(
                    "replaced while mounted (by a copy?): what was written to the file open \
                     here is lost with it",
                ),
                Ok(crate::device::PathNow::Removed) => Some(
                    "removed while mounted: what was written to it is lost once this mount \
                     lets it go",
                ),
                Err(e) => {
                    // A path the daemon cannot stat now (a permission or network error)
                    // says nothing of the file it has open; its I/O errors count as usual.
                    log::warn!("target {i}: stat {}: {e}", path.display());
                    continue;
                }
            };
            if let Some(why) = gone {
                self.fail_target(i as u16, format!("{} was {why}", path.display()));
                continue;
            }
            let want = TARGET_HEADER_BYTES + t.slots * self.shard_bytes;
            let short = (now.len < want).then_some(now.len);
            let hook = self.on_cut.lock();
            let mine = hook.as_ref().map(|(slot, _)| cut_marker(&t.path, *slot));
            let marked = mine.as_deref().and_then(read_cut_marker);
            let at = match (short, marked) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => continue,
            };
            if t.cut.lock().as_ref().is_some_and(|c| c.at <= at) {
                continue;
            }
            let marker = match (short, hook.as_ref()) {
                (Some(_), Some((_, h))) => match h(&t.path, at) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        // Without a marker the next mount sees the cut only while the file
                        // is still short; this mount reads around and rebuilds it anyway.
                        log::error!("target {i}: recording that its file was cut short: {e}");
                        None
                    }
                },
                _ => mine,
            };
            drop(hook);
            let n = self.cut_short(i as u16, CutShort { at, marker });
            log::error!(
                "target {i}: {} was cut short to {at} bytes while mounted ({want} reserved{}): \
                 {n} shard(s) of this node's segments reach past the cut, counted missing and \
                 read from the other targets until `ckptfs rebuild` rewrites them",
                path.display(),
                match short {
                    Some(_) => "",
                    None => "; another node found it first and extended it again",
                }
            );
        }
    }

    pub fn redundancy(&self) -> Redundancy {
        self.r
    }

    /// Target `i`.
    fn tg(&self, i: u16) -> Arc<Target> {
        self.targets.read()[i as usize].clone()
    }

    /// Every target, by index.
    fn all(&self) -> Vec<Arc<Target>> {
        self.targets.read().clone()
    }

    fn row_bytes(&self) -> u64 {
        (self.r.data * BLOCK) as u64
    }

    fn fail_target(&self, t: u16, why: String) {
        let tg = self.tg(t);
        if !tg.failed.swap(true, Ordering::SeqCst) {
            log::error!(
                "target {t} ({}) failed: {why}; the space is degraded (`ckptfs rebuild` \
                 restores full redundancy)",
                tg.path.display()
            );
            *tg.failed_reason.lock() = Some(why);
            if let Some(h) = self.on_fail.lock().as_ref() {
                h(t);
            }
        }
    }

    fn shard_offset(&self, slot: u32, block_in_shard: u64) -> u64 {
        TARGET_HEADER_BYTES + slot as u64 * self.shard_bytes + block_in_shard * BLOCK as u64
    }

    fn placed(&self, seg: u64) -> DevResult<Placed> {
        if !self.owns(seg) {
            return self.read_record(seg);
        }
        self.map
            .read()
            .get(seg as usize)
            .cloned()
            .flatten()
            .ok_or_else(|| TargetFault::Unplaced { segment: seg }.into())
    }

    /// Picks the targets of a new placement: healthy ones with a free slot, the best of
    /// each failure domain, best first (availability x bandwidth, then the most free slots).
    fn choose(&self, free: &[BTreeSet<u32>]) -> Vec<u16> {
        self.choose_for(free, &BTreeSet::new(), self.r.shards())
    }

    /// `choose` of up to `count` targets outside the failure domains `taken`.
    fn choose_for(
        &self,
        free: &[BTreeSet<u32>],
        taken: &BTreeSet<String>,
        count: usize,
    ) -> Vec<u16> {
        let all = self.all();
        let max_bw = self
            .all()
            .iter()
            .filter_map(|t| t.bandwidth())
            .fold(0.0f64, f64::max);
        let score = |i: usize| {
            let t = &all[i];
            // Bandwidth relative to the fastest; an unmeasured target counts as the fastest.
            let bw: f64 = match (t.bandwidth(), max_bw > 0.0) {
                (Some(b), true) => b / max_bw,
                _ => 1.0,
            };
            t.availability() * bw.sqrt()
        };
        let mut cands: Vec<usize> = (0..all.len())
            .filter(|&i| all[i].healthy() && !free[i].is_empty())
            .collect();
        cands.sort_by(|&a, &b| {
            score(b)
                .total_cmp(&score(a))
                .then(free[b].len().cmp(&free[a].len()))
                .then(a.cmp(&b))
        });
        let mut domains = taken.clone();
        let mut out = Vec::new();
        for i in cands {
            if out.len() == count {
                break;
            }
            if domains.insert(all[i].domain.clone()) {
                out.push(i as u16);
            }
        }
        out
    }

    /// Shards of `p` (segment `seg`) readable as far as anyone knows now: on a healthy
    /// target, and not found unreadable or damaged since the mount (`Suspects`).
    fn readable_shards(&self, all: &[Arc<Target>], sus: &Suspects, seg: u64, p: &Placed) -> usize {
        p.shards
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                s.is_some_and(|a| all[a.target as usize].healthy() && !sus.holds(seg, *i, a.target))
            })
            .count()
    }

    /// Shards placed on target `t` (0 for a retired one: `rebuild` moved them all).
    pub(crate) fn shards_on(&self, t: u16) -> u64 {
        self.map
            .read()
            .iter()
            .flatten()
            .map(|p| p.shards.iter().flatten().filter(|s| s.target == t).count() as u64)
            .sum()
    }

    /// Target `t`'s file was found cut short (`cut`): every shard of this node's segments
    /// on it that reaches past the cut is suspect (read around, counted as missing, visited
    /// by `rebuild`) until a repair rewrites it. Returns how many there are.
    pub(crate) fn cut_short(&self, t: u16, cut: CutShort) -> u64 {
        let map = self.map.read();
        let mut sus = self.suspects.lock();
        let mut n = 0;
        for (seg, p) in map.iter().enumerate() {
            let Some(p) = p else { continue };
            for (i, a) in p.shards.iter().enumerate() {
                let Some(a) = a.filter(|a| a.target == t) else {
                    continue;
                };
                // Only this node's segments are in `map` (another slot's are read afresh).
                if self.shard_offset(a.slot, self.shard_bytes / BLOCK as u64) > cut.at {
                    sus.add(seg as u64, i, t);
                    n += 1;
                }
            }
        }
        drop((sus, map));
        *self.tg(t).cut.lock() = Some(cut);
        n
    }

    /// After a repair pass: a target cut short whose shards past the cut are all rewritten
    /// (none of this node's is suspect any more) forgets it, and its marker goes.
    pub(crate) fn forget_repaired_cuts(&self) {
        let all = self.all();
        let suspect = self.suspects.lock().per_target(all.len());
        for (i, t) in all.iter().enumerate() {
            let mut cut = t.cut.lock();
            if cut.is_none() || suspect[i] != (false, 0) {
                continue;
            }
            if let Some(m) = cut.as_ref().and_then(|c| c.marker.as_ref()) {
                let gone = std::fs::remove_file(m)
                    .or_else(|e| match e.kind() {
                        io::ErrorKind::NotFound => Ok(()),
                        _ => Err(e),
                    })
                    .and_then(|()| {
                        std::fs::File::open(m.parent().unwrap_or(Path::new(".")))?.sync_all()
                    });
                if let Err(e) = gone {
                    // Kept, it only makes the next mount suspect those shards again.
                    log::warn!("removing {}: {e}", m.display());
                    continue;
                }
            }
            log::info!(
                "target {i} ({}): no shard of this node's segments past the cut in its file \
                 is left to rewrite",
                t.path.display()
            );
            *cut = None;
        }
    }

    /// Counts of placed segments by state: (full, degraded by remaining tolerance, lost).
    /// A shard found unreadable or damaged since the mount counts as missing until a repair
    /// rewrites it: the redundancy is what is readable now.
    fn segment_states(&self) -> (u64, BTreeSet<(u64, u64)>, u64) {
        let all = self.all();
        let map = self.map.read();
        let sus = self.suspects.lock();
        let found_lost = self.lost.lock();
        let (mut full, mut lost) = (0, 0);
        let mut by_tol: HashMap<u64, u64> = HashMap::new();
        for (seg, p) in map.iter().enumerate() {
            let Some(p) = p else { continue };
            if found_lost.contains_key(&(seg as u64)) {
                lost += 1;
                continue;
            }
            let ok = self.readable_shards(&all, &sus, seg as u64, p);
            if ok == self.r.shards() {
                full += 1;
            } else if ok < self.r.data {
                lost += 1;
            } else {
                *by_tol.entry((ok - self.r.data) as u64).or_default() += 1;
            }
        }
        (full, by_tol.into_iter().collect(), lost)
    }

    /// The targets' state; first looks at their files (`watch_files`).
    pub fn report(&self) -> TargetsReport {
        self.watch_files();
        let map = self.map.read();
        let all = self.all();
        let mut used = vec![0u64; all.len()];
        for p in map.iter().flatten() {
            for s in p.shards.iter().flatten() {
                used[s.target as usize] += 1;
            }
        }
        drop(map);
        self.flush_warnings();
        let suspect = self.suspects.lock().per_target(all.len());
        let free = self.free.lock();
        let targets = all
            .iter()
            .enumerate()
            .map(|(i, t)| TargetReport {
                index: i as u16,
                path: t.path.display().to_string(),
                domain: t.domain.clone(),
                state: match (t.healthy(), used[i], t.cut.lock().as_ref().map(|c| c.at)) {
                    (true, _, Some(at)) => format!(
                        "degraded: its file was cut short outside ckptfs (at byte {at}); {} \
                         shard(s) past the cut are lost on it until `ckptfs rebuild` (or \
                         `scrub`) rewrites them",
                        match suspect[i].0 {
                            true => "all its".to_string(),
                            false => suspect[i].1.to_string(),
                        }
                    ),
                    (true, _, _) if suspect[i].0 => "degraded: found unreadable or damaged \
                        since the mount, counted as missing until repaired (`ckptfs scrub`)"
                        .into(),
                    (true, _, _) if suspect[i].1 > 0 => format!(
                        "degraded: {} shard(s) found unreadable or damaged since the mount \
                         and not repaired (`ckptfs scrub` repairs them)",
                        suspect[i].1
                    ),
                    (true, _, _) => "ok".into(),
                    // Nothing of the space is on it any more.
                    (false, 0, _) => format!(
                        "retired: {}",
                        t.failed_reason.lock().clone().unwrap_or_default()
                    ),
                    (false, _, _) => format!(
                        "failed: {}",
                        t.failed_reason.lock().clone().unwrap_or_default()
                    ),
                },
                errors: t.errors.load(Ordering::Relaxed),
                read_errors: t.read_errors.load(Ordering::Relaxed),
                verify_errors: t.verify_errors.load(Ordering::Relaxed),
                repaired_blocks: t.repaired_blocks.load(Ordering::Relaxed),
                suspect_shards: suspect[i].1,
                shards: used[i],
                free_shards: free[i].len() as u64,
                bytes_written: t.bytes_written.load(Ordering::Relaxed),
                bytes_read: t.bytes_read.load(Ordering::Relaxed),
                write_mib_s: t.bandwidth().map(|b| b / (1 << 20) as f64),
                metadata_mirror: false,
            })
            .collect();
        drop(free);
        let (full, degraded, lost) = self.segment_states();
        TargetsReport {
            redundancy: self.r.to_string(),
            targets,
            segments_full: full,
            segments_degraded: degraded.into_iter().collect(),
            segments_lost: lost,
            chunks_lost_reads: self.lost.lock().values().sum(),
            reconstructed_reads: self.reconstructed.load(Ordering::Relaxed),
            repaired_reads: self.repaired.load(Ordering::Relaxed),
            slot: None,
        }
    }

    /// Reads blocks [b0, b1) of shard `i` of segment `seg` placed as `p`; None when the
    /// shard is not there or not readable (counted against its target, and the shard
    /// suspect until a repair rewrites it).
    fn read_shard(&self, seg: u64, p: &Placed, i: usize, b0: u64, b1: u64) -> Option<IoBuf> {
        let at = p.shards[i]?;
        let t = self.tg(at.target);
        let dev = t.dev.as_ref().filter(|_| t.healthy())?;
        let mut buf = IoBuf::new();
        buf.extend_zeros(((b1 - b0) as usize) * BLOCK);
        match dev.read_at(buf.as_mut_slice(), self.shard_offset(at.slot, b0)) {
            Ok(()) => {
                t.bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
                Some(buf)
            }
            Err(e) => {
                t.errors.fetch_add(1, Ordering::Relaxed);
                t.read_errors.fetch_add(1, Ordering::Relaxed);
                self.suspect(seg, i, at);
                self.warnings.warn(at.target, WarnKind::Read, || {
                    format!(
                        "reading shard {i} of segment {seg} from target {} ({}): {e}; \
                         rebuilding it from the others",
                        at.target,
                        t.path.display()
                    )
                });
                None
            }
        }
    }

    /// Shard `i` of segment `seg`, at `at`, was found unreadable or damaged: reads go
    /// around it from now on (`known_bad`), until a repair rewrites it.
    fn suspect(&self, seg: u64, i: usize, at: ShardAt) {
        if self.owns(seg) {
            self.suspects.lock().add(seg, i, at.target);
        } else {
            // Another slot's segment is its owner's to repair (its scrub finds the damage);
            // in `suspects` it would never be cleared, and this node's report would stay
            // degraded. Remembered apart, for reads only.
            let mut f = self.foreign_bad.lock();
            if f.len() >= SUSPECTS_MAX {
                f.clear();
            }
            f.insert((seg, i), at);
        }
    }

    /// Shards of segment `seg` (placed as `p`) found unreadable or damaged since the mount
    /// and not rewritten since: a read goes around them instead of failing its check on
    /// them chunk after chunk (each failure costing a re-read of the whole row).
    fn known_bad(&self, seg: u64, p: &Placed) -> Vec<usize> {
        let placed = p
            .shards
            .iter()
            .enumerate()
            .filter_map(|(i, a)| Some((i, (*a)?)));
        if self.owns(seg) {
            let sus = self.suspects.lock();
            if !sus.in_segment(seg) && !sus.any_whole() {
                return Vec::new();
            }
            placed
                .filter(|(i, a)| sus.holds(seg, *i, a.target))
                .map(|(i, _)| i)
                .collect()
        } else {
            let f = self.foreign_bad.lock();
            placed
                .filter(|(i, a)| f.get(&(seg, *i)) == Some(a))
                .map(|(i, _)| i)
                .collect()
        }
    }

    /// A shard found damaged by a verification (blake3, or parity against verified data).
    fn damaged_shard(&self, seg: u64, i: usize, at: ShardAt, how: &str) {
        let t = at.target;
        let tg = self.tg(t);
        tg.errors.fetch_add(1, Ordering::Relaxed);
        tg.verify_errors.fetch_add(1, Ordering::Relaxed);
        self.suspect(seg, i, at);
        self.warnings.warn(t, WarnKind::Damaged, || {
            format!(
                "segment {seg}: shard {i} on target {t} ({}) holds damaged bytes; {how}",
                tg.path.display()
            )
        });
    }

    /// Writes the repeated-warning summaries whose interval has passed (the daemon calls it
    /// a few times a second; anything that reads the state may).
    pub fn flush_warnings(&self) {
        self.warnings
            .flush(Instant::now(), &|t| self.tg(t).path.display().to_string());
    }

    /// Rows [r0, r1) of segment `p` as the M data shards' blocks, reconstructing the
    /// data shards in `want` that `have` lacks from any M shards read (excluding those in
    /// `exclude`, shards suspected bad).
    fn reconstruct(
        &self,
        seg: u64,
        p: &Placed,
        r0: u64,
        r1: u64,
        mut have: Vec<Option<IoBuf>>,
        exclude: &[usize],
    ) -> DevResult<Vec<Option<IoBuf>>> {
        let (m, k) = (self.r.data, self.r.parity);
        // Read what is missing until M shards are at hand.
        let count = |h: &[Option<IoBuf>]| {
            h.iter()
                .enumerate()
                .filter(|(i, b)| b.is_some() && !exclude.contains(i))
                .count()
        };
        for i in 0..m + k {
            if count(&have) >= m {
                break;
            }
            if have[i].is_none() && !exclude.contains(&i) {
                have[i] = self.read_shard(seg, p, i, r0, r1);
            }
        }
        if count(&have) < m {
            return Err(TargetFault::Unreadable {
                segment: seg,
                readable: count(&have),
                needed: m,
            }
            .into());
        }
        let missing: Vec<usize> = (0..m)
            .filter(|i| have[*i].is_none() || exclude.contains(i))
            .collect();
        if missing.is_empty() {
            return Ok(have);
        }
        let originals = (0..m)
            .filter(|i| !exclude.contains(i))
            .filter_map(|i| have[i].as_ref().map(|b| (i, b.as_slice())));
        let recovery = (m..m + k)
            .filter(|i| !exclude.contains(i))
            .filter_map(|i| have[i].as_ref().map(|b| (i - m, b.as_slice())));
        let restored = reed_solomon_simd::decode(m, k, originals, recovery)
            .map_err(|e| Fault::from(TargetFault::Codec(format!("decode: {e}"))))?;
        for i in missing {
            let data = restored
                .get(&i)
                .ok_or_else(|| TargetFault::Codec(format!("decode did not restore shard {i}")))?;
            let mut b = IoBuf::new();
            b.extend_from_slice(data);
            have[i] = Some(b);
        }
        Ok(have)
    }

    /// Copies logical bytes [off, off+len) of the segment out of data shards holding rows
    /// [r0, ..).
    fn assemble(&self, shards: &[Option<IoBuf>], r0: u64, off: u64, buf: &mut [u8]) {
        let m = self.r.data as u64;
        let mut pos = 0usize;
        while pos < buf.len() {
            let o = off + pos as u64;
            let b = o / BLOCK as u64;
            let (row, col) = (b / m, (b % m) as usize);
            let in_block = (o % BLOCK as u64) as usize;
            let n = (BLOCK - in_block).min(buf.len() - pos);
            let src = shards[col]
                .as_ref()
                .expect("assembled shards are all present");
            let at = (row - r0) as usize * BLOCK + in_block;
            buf[pos..pos + n].copy_from_slice(&src.as_slice()[at..at + n]);
            pos += n;
        }
    }

    /// The rows covering segment bytes [off, off+len), and which data shards they need.
    fn rows_of(&self, off: u64, len: usize) -> (u64, u64, Vec<bool>) {
        let m = self.r.data as u64;
        let b0 = off / BLOCK as u64;
        let b1 = (off + len as u64).div_ceil(BLOCK as u64);
        let (r0, r1) = (b0 / m, b1.div_ceil(m));
        let mut need = vec![false; self.r.data];
        for b in b0..b1 {
            need[(b % m) as usize] = true;
        }
        (r0, r1, need)
    }

    /// Reads segment bytes `off..` into `buf`; with `around`, around shards known bad
    /// (`known_bad`), else as stored (missing shards are still rebuilt).
    fn read_in_segment(&self, seg: u64, off: u64, buf: &mut [u8], around: bool) -> DevResult<()> {
        let p = self.placed(seg)?;
        let (r0, r1, need) = self.rows_of(off, buf.len());
        let bad = match around {
            true => self.known_bad(seg, &p),
            false => Vec::new(),
        };
        if bad.iter().any(|&i| i < self.r.data && need[i]) {
            // A shard this read needs was found bad: rebuild its part from the others
            // rather than hand the caller bytes known to fail their check. Where too few
            // others are readable, read it after all (the check decides).
            let none = vec![None; self.r.shards()];
            if let Ok(have) = self.reconstruct(seg, &p, r0, r1, none, &bad) {
                self.reconstructed.fetch_add(1, Ordering::Relaxed);
                self.assemble(&have, r0, off, buf);
                return Ok(());
            }
        }
        let mut have: Vec<Option<IoBuf>> = vec![None; self.r.shards()];
        let mut short = false;
        for (i, n) in need.iter().enumerate() {
            if *n {
                have[i] = self.read_shard(seg, &p, i, r0, r1);
                short |= have[i].is_none();
            }
        }
        if short {
            have = self
                .reconstruct(seg, &p, r0, r1, have, &[])
                .map_err(|e| io::Error::new(e.kind(), format!("segment {seg}: {e}")))?;
            self.reconstructed.fetch_add(1, Ordering::Relaxed);
        }
        // Shards not needed stay None; fill them so `assemble` only touches needed ones.
        self.assemble(&have, r0, off, buf);
        Ok(())
    }

    fn write_in_segment(&self, seg: u64, off: u64, buf: &[u8]) -> DevResult<()> {
        if !self.owns(seg) {
            return Err(TargetFault::Foreign { segment: seg }.into());
        }
        let _stripe = self.stripes[seg as usize % STRIPES].read();
        let p = self.placed(seg)?;
        let (m, k) = (self.r.data, self.r.parity);
        let rows = buf.len() / (m * BLOCK);
        let r0 = off / self.row_bytes();
        let mut cols: Vec<IoBuf> = (0..m).map(|_| IoBuf::new()).collect();
        for r in 0..rows {
            for (c, col) in cols.iter_mut().enumerate() {
                let at = (r * m + c) * BLOCK;
                col.extend_from_slice(&buf[at..at + BLOCK]);
            }
        }
        let mut shards = cols;
        if k > 0 {
            let parity = reed_solomon_simd::encode(m, k, shards.iter().map(|c| c.as_slice()))
                .map_err(|e| Fault::from(TargetFault::Codec(format!("encode: {e}"))))?;
            for p in parity {
                let mut b = IoBuf::new();
                b.extend_from_slice(&p);
                shards.push(b);
            }
        }
        let mut written = 0;
        for (i, data) in shards.iter().enumerate() {
            let Some(at) = p.shards[i] else { continue };
            let t = self.tg(at.target);
            let Some(dev) = t.dev.as_ref().filter(|_| t.healthy()) else {
                continue;
            };
            let start = Instant::now();
            match dev.write_at(data.as_slice(), self.shard_offset(at.slot, r0)) {
                Ok(()) => {
                    t.write_ns
                        .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    t.bytes_written
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    t.dirty.store(true, Ordering::SeqCst);
                    written += 1;
                }
                // This node lost its slot: nothing is wrong with the target.
                Err(e) if e.is_fenced() => return Err(e),
                Err(e) => {
                    t.errors.fetch_add(1, Ordering::Relaxed);
                    self.fail_target(at.target, format!("write: {e}"));
                }
            }
        }
        self.touched.lock().insert(seg);
        if written < m {
            return Err(TargetFault::Unwritable {
                segment: seg,
                written,
                needed: m,
            }
            .into());
        }
        Ok(())
    }

    /// Adds a target (a replacement, see `rebuild`); returns its index.
    pub(crate) fn add_target(&self, t: Target) -> u16 {
        let slots = t.slots;
        let mut ts = self.targets.write();
        ts.push(Arc::new(t));
        self.free.lock().push((0..slots as u32).collect());
        (ts.len() - 1) as u16
    }

    /// Fails target `t` on purpose (it is being replaced), recording it like a failure.
    pub fn retire(&self, t: u16, why: &str) {
        self.fail_target(t, why.to_string());
        // Also when it had failed already (missing at open): recorded, so it is never used
        // again even if its file comes back.
        if let Some(h) = self.on_fail.lock().as_ref() {
            h(t);
        }
    }

    /// The index of the target whose directory is `path`, or whose index `path` is.
    pub(crate) fn find_target(&self, path: &str) -> Option<u16> {
        if let Ok(i) = path.parse::<u16>() {
            return ((i as usize) < self.all().len()).then_some(i);
        }
        let want = std::path::Path::new(path);
        self.all()
            .iter()
            .position(|t| t.path == want)
            .map(|i| i as u16)
    }

    /// The failure domain of target `t`.
    pub(crate) fn domain_of(&self, t: u16) -> String {
        self.tg(t).domain.clone()
    }

    /// The rows of each segment that the extents `(at, len)` cover, for `verify_parity`:
    /// sorted by segment and row, overlapping and adjacent ranges merged. Bytes past a
    /// segment's end are left out (`check` reports such records).
    pub(crate) fn rows_holding(
        &self,
        extents: impl IntoIterator<Item = (Location, u64)>,
    ) -> Vec<(u64, Range<u64>)> {
        let row = self.row_bytes();
        let rows = self.shard_bytes / BLOCK as u64;
        let mut out: Vec<(u64, Range<u64>)> = extents
            .into_iter()
            .map(|(at, len)| {
                let r0 = at.offset / row;
                let r1 = (at.offset + len).div_ceil(row).min(rows);
                (at.segment.0, r0..r1)
            })
            .filter(|(_, r)| !r.is_empty())
            .collect();
        out.sort_unstable_by_key(|(s, r)| (*s, r.start));
        out.dedup_by(|next, prev| {
            let joins = prev.0 == next.0 && next.1.start <= prev.1.end;
            if joins {
                prev.1.end = prev.1.end.max(next.1.end);
            }
            joins
        });
        out
    }

    /// Re-encodes the parity of `rows` (per segment, as `rows_holding` lists them) from their
    /// data shards and compares it with the parity shards stored; counts the rows missing
    /// shards and those with fewer than M readable. Rows are read whole (all M+K shards),
    /// `VERIFY_ROWS` at a time, each segment under its stripe, so no write or rebuild
    /// changes a row while it is read.
    ///
    /// Only rows written under the segment's current placement can be checked. Rows never
    /// written are zero in every shard, which is consistent (zero data encodes to zero
    /// parity), but a shard slot reused from another segment still holds that segment's bytes
    /// past the new fill, which agree with no parity. The caller passes the rows holding live
    /// chunks: the store wrote each of them whole, data and parity, before committing them.
    ///
    /// `keep(segment)` is asked after a segment with findings was read: false drops them (on
    /// a mounted space, gc emptied the segment and it was filled again meanwhile).
    /// `progress(rows done, rows)`.
    pub(crate) fn verify_parity(
        &self,
        rows: &[(u64, Range<u64>)],
        keep: &mut dyn FnMut(u64) -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> ParityReport {
        let total: u64 = rows.iter().map(|(_, r)| r.end - r.start).sum();
        let mut rep = ParityReport::default();
        let mut by_tol: BTreeMap<u64, u64> = BTreeMap::new();
        let mut done = 0;
        progress(0, total);
        let mut i = 0;
        while i < rows.len() {
            let seg = rows[i].0;
            let n = rows[i..].iter().take_while(|(s, _)| *s == seg).count();
            let ranges = &rows[i..i + n];
            i += n;
            rep.segments_checked += 1;
            let mut sp = SegmentParity {
                segment: seg,
                ..SegmentParity::default()
            };
            let mut tol = BTreeMap::new();
            let _stripe =
                (seg < self.segments).then(|| self.stripes[seg as usize % STRIPES].write());
            let placed = self.map.read().get(seg as usize).cloned().flatten();
            for (_, r) in ranges {
                let Some(p) = &placed else {
                    // Live chunks in a segment never placed: nothing of them can be read.
                    let len = r.end - r.start;
                    sp.rows_checked += len;
                    sp.unrecoverable_rows += len;
                    if sp.unrecoverable.len() < MAX_LISTED_ROWS {
                        sp.unrecoverable.push((r.start, r.end));
                    }
                    continue;
                };
                sp.targets = p.shards.iter().map(|s| s.map(|a| a.target)).collect();
                let mut r0 = r.start;
                while r0 < r.end {
                    let r1 = (r0 + VERIFY_ROWS).min(r.end);
                    self.verify_rows(p, r0, r1, &mut sp, &mut tol);
                    done += r1 - r0;
                    progress(done, total);
                    r0 = r1;
                }
            }
            rep.rows_checked += sp.rows_checked;
            if !sp.has_findings() || !keep(seg) {
                continue;
            }
            rep.rows_inconsistent += sp.inconsistent_rows;
            rep.rows_unrecoverable += sp.unrecoverable_rows;
            for (t, n) in tol {
                *by_tol.entry(t).or_default() += n;
            }
            if rep.segments.len() < MAX_LISTED_SEGMENTS {
                rep.segments.push(sp);
            } else {
                rep.segments_omitted += 1;
            }
        }
        rep.rows_degraded = by_tol.into_iter().collect();
        progress(total, total);
        rep
    }

    /// Shard `i` of `p` is on a healthy target with an open file: a failed read of it is a
    /// read error, not a missing target.
    fn readable(&self, p: &Placed, i: usize) -> bool {
        p.shards[i].is_some_and(|a| {
            let t = self.tg(a.target);
            t.healthy() && t.dev.is_some()
        })
    }

    /// `verify_parity` of rows [r0, r1) of the segment placed as `p`, into `sp`; `tol`
    /// counts its degraded rows by tolerance.
    fn verify_rows(
        &self,
        p: &Placed,
        r0: u64,
        r1: u64,
        sp: &mut SegmentParity,
        tol: &mut BTreeMap<u64, u64>,
    ) {
        let (m, k) = (self.r.data, self.r.parity);
        let seg = sp.segment;
        let shards: Vec<Option<IoBuf>> = (0..m + k)
            .map(|i| self.read_shard(seg, p, i, r0, r1))
            .collect();
        // A read error may be one bad sector: read again row by row, so only its rows count.
        if r1 - r0 > 1 && (0..m + k).any(|i| shards[i].is_none() && self.readable(p, i)) {
            drop(shards);
            for r in r0..r1 {
                self.verify_rows(p, r, r + 1, sp, tol);
            }
            return;
        }
        let rows = r1 - r0;
        sp.rows_checked += rows;
        let present = shards.iter().filter(|s| s.is_some()).count();
        for (i, s) in shards.iter().enumerate() {
            if s.is_none() && !sp.missing_shards.contains(&i) {
                sp.missing_shards.push(i);
                sp.missing_shards.sort_unstable();
            }
        }
        if present < m {
            sp.unrecoverable_rows += rows;
            let listed = sp.unrecoverable.len();
            match sp.unrecoverable.last_mut() {
                Some(last) if last.1 == r0 => last.1 = r1,
                _ if listed < MAX_LISTED_ROWS => sp.unrecoverable.push((r0, r1)),
                _ => {}
            }
            return;
        }
        if present < m + k {
            let t = (present - m) as u64;
            sp.degraded_rows += rows;
            sp.tolerance = Some(sp.tolerance.map_or(t, |x| x.min(t)));
            *tol.entry(t).or_default() += rows;
        }
        if present == m {
            // Any M shards agree with each other (so does a row of a space without parity):
            // nothing to compare.
            return;
        }
        let data_read = shards[..m].iter().all(Option::is_some);
        let restored = if data_read {
            BTreeMap::new()
        } else {
            let originals = (0..m).filter_map(|i| shards[i].as_ref().map(|b| (i, b.as_slice())));
            let recovery =
                (m..m + k).filter_map(|i| shards[i].as_ref().map(|b| (i - m, b.as_slice())));
            match reed_solomon_simd::decode(m, k, originals, recovery) {
                Ok(r) => r,
                Err(e) => {
                    log::warn!("segment {seg} rows {r0}..{r1}: Reed-Solomon decode: {e}");
                    return;
                }
            }
        };
        let data: Vec<&[u8]> = (0..m)
            .map(|i| match &shards[i] {
                Some(b) => b.as_slice(),
                None => restored.get(&i).map_or(&[][..], Vec::as_slice),
            })
            .collect();
        let parity = match reed_solomon_simd::encode(m, k, data) {
            Ok(p) => p,
            Err(e) => {
                log::warn!("segment {seg} rows {r0}..{r1}: Reed-Solomon encode: {e}");
                return;
            }
        };
        for row in 0..rows as usize {
            let at = row * BLOCK..(row + 1) * BLOCK;
            let differ: Vec<usize> = (m..m + k)
                .filter(|&i| {
                    shards[i]
                        .as_ref()
                        .is_some_and(|s| s.as_slice()[at.clone()] != parity[i - m][at.clone()])
                })
                .collect();
            if !differ.is_empty() {
                sp.inconsistent_rows += 1;
                let row_shards: Vec<Option<&[u8]>> = shards
                    .iter()
                    .map(|s| s.as_ref().map(|b| &b.as_slice()[at.clone()]))
                    .collect();
                let damaged = self.locate_damage(&row_shards);
                if damaged.is_empty() && self.is_lost(seg) {
                    // More shards damaged than the parity locates, in a segment whose chunks
                    // no M shards gave back (the chunk pass found them lost): unrecoverable.
                    let r = r0 + row as u64;
                    sp.unrecoverable_rows += 1;
                    let listed = sp.unrecoverable.len();
                    match sp.unrecoverable.last_mut() {
                        Some(last) if last.1 == r => last.1 = r + 1,
                        _ if listed < MAX_LISTED_ROWS => sp.unrecoverable.push((r, r + 1)),
                        _ => {}
                    }
                }
                for &i in &damaged {
                    if let Some(a) = p.shards[i] {
                        self.damaged_shard(
                            seg,
                            i,
                            a,
                            "the other shards of its row agree with each other (`ckptfs scrub` \
                             rewrites it)",
                        );
                    }
                }
                if sp.inconsistent.len() < MAX_LISTED_ROWS {
                    sp.inconsistent.push(InconsistentRow {
                        row: r0 + row as u64,
                        parity_shards: differ,
                        damaged_shards: damaged,
                        data_read,
                    });
                }
            }
        }
    }

    /// Splits [at, at+len) at segment boundaries: (segment, offset in it, range in buf).
    fn pieces(&self, at: Location, len: usize) -> Vec<(u64, u64, std::ops::Range<usize>)> {
        let mut out = Vec::new();
        let (mut seg, mut off, mut pos) = (at.segment.0, at.offset, 0usize);
        while pos < len {
            let n = ((self.segment_bytes - off) as usize).min(len - pos);
            out.push((seg, off, pos..pos + n));
            pos += n;
            seg += 1;
            off = 0;
        }
        out
    }
}

impl Placement for Erasure {
    fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    fn write_align(&self) -> usize {
        self.row_bytes() as usize
    }

    fn read(&self, at: Location, buf: &mut [u8]) -> DevResult<()> {
        let len = buf.len();
        for (seg, off, range) in self.pieces(at, len) {
            self.read_in_segment(seg, off, &mut buf[range], true)?;
        }
        Ok(())
    }

    fn read_as_stored(&self, at: Location, buf: &mut [u8]) -> DevResult<()> {
        let len = buf.len();
        for (seg, off, range) in self.pieces(at, len) {
            self.read_in_segment(seg, off, &mut buf[range], false)?;
        }
        Ok(())
    }

    fn write(&self, at: Location, buf: &[u8]) -> DevResult<()> {
        let row = self.row_bytes();
        if !at.offset.is_multiple_of(row) || !(buf.len() as u64).is_multiple_of(row) {
            return Err(TargetFault::Misaligned {
                segment: at.segment.0,
                offset: at.offset,
                len: buf.len(),
            }
            .into());
        }
        for (seg, off, range) in self.pieces(at, buf.len()) {
            self.write_in_segment(seg, off, &buf[range])?;
        }
        Ok(())
    }

    fn sync(&self) -> DevResult<()> {
        if self.watched.due() {
            self.watch_files();
        }
        for (i, t) in self.all().iter().enumerate() {
            let Some(dev) = t.dev.as_ref().filter(|_| t.healthy()) else {
                continue;
            };
            if t.dirty.swap(false, Ordering::SeqCst) {
                if let Err(e) = dev.sync() {
                    if e.is_fenced() {
                        t.dirty.store(true, Ordering::SeqCst);
                        return Err(e);
                    }
                    t.errors.fetch_add(1, Ordering::Relaxed);
                    self.fail_target(i as u16, format!("sync: {e}"));
                }
            }
        }
        // Every segment written since the last sync must keep M durable shards.
        let touched = std::mem::take(&mut *self.touched.lock());
        let all = self.all();
        for seg in touched {
            let p = self.placed(seg)?;
            let ok = p
                .shards
                .iter()
                .flatten()
                .filter(|s| all[s.target as usize].healthy())
                .count();
            if ok < self.r.data {
                return Err(TargetFault::Unwritable {
                    segment: seg,
                    written: ok,
                    needed: self.r.data,
                }
                .into());
            }
        }
        Ok(())
    }

    fn prepare(&self, seg: SegmentId) -> DevResult<()> {
        if !self.owns(seg.0) {
            return Err(TargetFault::Foreign { segment: seg.0 }.into());
        }
        let mut map = self.map.write();
        let s = seg.0 as usize;
        if let Some(p) = &map[s] {
            // Still whole on healthy targets: keep it (no record to write).
            let whole = p
                .shards
                .iter()
                .all(|sh| sh.is_some_and(|a| self.tg(a.target).healthy()));
            if whole {
                // Free, about to be written afresh: what was found of its old bytes is moot.
                self.suspects.lock().clear_segment(seg.0);
                self.lost.lock().remove(&seg.0);
                return Ok(());
            }
        }
        let mut free = self.free.lock();
        // The segment is free (the store only prepares segments it takes): its old shard
        // slots hold nothing live.
        let old = map[s].take();
        if let Some(p) = &old {
            for sh in p.shards.iter().flatten() {
                free[sh.target as usize].insert(sh.slot);
            }
        }
        let chosen = self.choose(&free);
        if chosen.len() < self.r.data {
            // Put the old placement back: nothing changed on disk.
            if let Some(p) = &old {
                for sh in p.shards.iter().flatten() {
                    free[sh.target as usize].remove(&sh.slot);
                }
            }
            map[s] = old;
            return Err(TargetFault::TooFewTargets {
                usable: chosen.len(),
                needed: self.r.data,
            }
            .into());
        }
        if chosen.len() < self.r.shards() {
            log::warn!(
                "segment {s} placed with {} parity shards instead of {}: only {} healthy \
                 targets in distinct failure domains; it survives the loss of {} targets \
                 until `ckptfs rebuild` adds the rest",
                chosen.len() - self.r.data,
                self.r.parity,
                chosen.len(),
                chosen.len() - self.r.data
            );
        }
        let mut shards: Vec<Option<ShardAt>> = chosen
            .iter()
            .map(|&t| {
                let slot = free[t as usize]
                    .pop_first()
                    .expect("chosen targets have a free slot");
                Some(ShardAt { target: t, slot })
            })
            .collect();
        shards.resize(self.r.shards(), None);
        let p = Placed {
            generation: old.as_ref().map_or(1, |o| o.generation + 1),
            shards,
        };
        let rec = p.encode();
        let written = self
            .map_dev
            .write_at(&rec, (s * RECORD_BYTES) as u64)
            .and_then(|()| self.map_dev.sync());
        if let Err(e) = written {
            for sh in p.shards.iter().flatten() {
                free[sh.target as usize].insert(sh.slot);
            }
            return Err(e);
        }
        map[s] = Some(p);
        // Its old shards held nothing live: what was found of them no longer matters.
        self.suspects.lock().clear_segment(seg.0);
        self.lost.lock().remove(&seg.0);
        Ok(())
    }

    fn read_repair(
        &self,
        at: Location,
        buf: &mut [u8],
        check: &mut dyn FnMut(&[u8]) -> bool,
    ) -> DevResult<bool> {
        let pieces = self.pieces(at, buf.len());
        let [(seg, off, _)] = pieces[..] else {
            return Ok(false);
        };
        let p = self.placed(seg)?;
        let (m, k) = (self.r.data, self.r.parity);
        let (r0, r1, need) = self.rows_of(off, buf.len());
        let all: Vec<Option<IoBuf>> = (0..m + k)
            .map(|i| self.read_shard(seg, &p, i, r0, r1))
            .collect();
        let present: Vec<usize> = (0..m + k).filter(|i| all[*i].is_some()).collect();
        // Exclude one shard, then two, ... until the bytes pass the check. While every
        // needed data shard is present, a set of parity shards alone changes no data byte
        // and is skipped; once one is missing, the reconstruction reads parity, and a stale
        // parity shard (a target that failed mid-row, or came back with old bytes) is as
        // likely the culprit as a data shard.
        let data_whole = (0..m).all(|i| !need[i] || all[i].is_some());
        // Shards found bad before are the likeliest culprits: tried first, alone and with
        // each other shard (a second damaged shard in these rows).
        let bad: Vec<usize> = self
            .known_bad(seg, &p)
            .into_iter()
            .filter(|i| present.contains(i))
            .collect();
        let mut first: Vec<Vec<usize>> = Vec::new();
        if !bad.is_empty() && bad.len() <= k {
            first.push(bad.clone());
            if bad.len() < k {
                for &i in present.iter().filter(|i| !bad.contains(i)) {
                    let mut set = bad.clone();
                    set.push(i);
                    set.sort_unstable();
                    first.push(set);
                }
            }
        }
        let sets = first
            .into_iter()
            .chain((1..=k).flat_map(|size| combinations(&present, size)));
        for set in sets {
            if data_whole && !set.iter().any(|&i| i < m && need[i]) {
                continue;
            }
            if present.len() - set.len() < m {
                continue;
            }
            let Ok(shards) = self.reconstruct(seg, &p, r0, r1, all.clone(), &set) else {
                continue;
            };
            let mut tmp = vec![0u8; buf.len()];
            self.assemble(&shards, r0, off, &mut tmp);
            if check(&tmp) {
                buf.copy_from_slice(&tmp);
                self.repaired.fetch_add(1, Ordering::Relaxed);
                for &i in &set {
                    if let Some(a) = p.shards[i] {
                        self.damaged_shard(
                            seg,
                            i,
                            a,
                            "the read was repaired from the other shards (`ckptfs scrub` \
                             rewrites it)",
                        );
                    }
                }
                return Ok(true);
            }
        }
        // No M shards give this chunk back: more of its shards are damaged than the parity
        // covers. Its segment's data is lost, which the status says from now on.
        *self.lost.lock().entry(seg).or_default() += 1;
        log::error!(
            "segment {seg}: a chunk no set of {m} of its {} shards gives back verified: lost \
             (more shards damaged than the redundancy {} covers)",
            m + k,
            self.r
        );
        Ok(false)
    }
}

/// Every `size`-element subset of `items`, in order.
fn combinations(items: &[usize], size: usize) -> Vec<Vec<usize>> {
    if size == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for (i, &x) in items.iter().enumerate() {
        for mut rest in combinations(&items[i + 1..], size - 1) {
            rest.insert(0, x);
            out.push(rest);
        }
    }
    out
}

impl Erasure {
    /// Whether a read found data of segment `seg` lost (`read_repair`).
    pub(crate) fn is_lost(&self, seg: u64) -> bool {
        self.lost.lock().contains_key(&seg)
    }

    /// How many more targets segment `seg` can lose: its shards readable now (on healthy
    /// targets, not found unreadable or damaged since the mount) less M (below 0: lost).
    /// None for a segment not placed.
    pub(crate) fn tolerance(&self, seg: u64) -> Option<i64> {
        let all = self.all();
        let map = self.map.read();
        let p = map.get(seg as usize)?.as_ref()?;
        if self.is_lost(seg) {
            return Some(-1);
        }
        let ok = self.readable_shards(&all, &self.suspects.lock(), seg, p);
        Some(ok as i64 - self.r.data as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    const SHARD: u64 = 16 * BLOCK as u64;

    fn setup(n: usize, r: Redundancy, segments: u64, slots: u64) -> (Erasure, Vec<Arc<MemDevice>>) {
        setup_sized(n, r, segments, slots, SHARD)
    }

    fn setup_sized(
        n: usize,
        r: Redundancy,
        segments: u64,
        slots: u64,
        shard: u64,
    ) -> (Erasure, Vec<Arc<MemDevice>>) {
        let devs: Vec<Arc<MemDevice>> = (0..n)
            .map(|_| {
                Arc::new(MemDevice::new(
                    (TARGET_HEADER_BYTES + slots * shard) as usize,
                ))
            })
            .collect();
        let targets = devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Target::new(
                    PathBuf::from(format!("t{i}")),
                    format!("d{i}"),
                    slots,
                    Ok(d.clone() as Arc<dyn Device>),
                )
            })
            .collect();
        let map = Arc::new(MemDevice::new(segments as usize * RECORD_BYTES));
        (
            Erasure::open(r, shard, segments, targets, map).unwrap(),
            devs,
        )
    }

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn loc(seg: u64, off: u64) -> Location {
        Location {
            segment: SegmentId(seg),
            offset: off,
        }
    }

    #[test]
    fn records_and_headers_round_trip() {
        let p = Placed {
            generation: 7,
            shards: vec![
                Some(ShardAt { target: 3, slot: 9 }),
                None,
                Some(ShardAt { target: 0, slot: 0 }),
            ],
        };
        assert_eq!(Placed::decode(&p.encode()).unwrap(), Some(p.clone()));
        let mut bad = p.encode();
        bad[20] ^= 1;
        assert!(Placed::decode(&bad).is_err());
        assert_eq!(Placed::decode(&[0u8; RECORD_BYTES]).unwrap(), None);
        let h = TargetHeader {
            space_uuid: [5; 16],
            index: 4,
            shard_bytes: SHARD,
            slots: 12,
        };
        assert_eq!(TargetHeader::decode(&h.encode()).unwrap(), h);
        assert_eq!(
            Redundancy::parse("3+2").unwrap(),
            Redundancy { data: 3, parity: 2 }
        );
        let table = TargetsTable {
            redundancy: Redundancy { data: 3, parity: 2 },
            shard_bytes: SHARD,
            slots: 40,
            segments: 30,
            targets: vec![
                TargetSpec::parse("/nvme0/ckpt").unwrap(),
                TargetSpec::parse("/pfs/p:domain=pfs").unwrap(),
            ],
            failed: vec![false, true],
            mirror: vec![true, false],
            generation: 9,
        };
        assert_eq!(table.targets[1].domain, "pfs");
        assert_eq!(TargetsTable::decode(&table.encode()).unwrap(), table);
        let mut bad = table.encode();
        bad[70] ^= 1;
        assert!(TargetsTable::decode(&bad).is_err());
        assert!(TargetSpec::parse("/x:domain=").is_err());
        assert!(Redundancy::parse("3").is_err());
        assert!(Redundancy::parse("0+2").is_err());
        assert!(Redundancy::parse("12+5").is_err());
    }

    /// The same bytes come back with no target lost, with any K lost, and EIO with K+1
    /// lost; rows written in several writes encode as one.
    #[test]
    fn any_k_targets_may_be_lost() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, _) = setup(5, r, 4, 8);
        let row = e.write_align();
        let data = pattern(1, 3 * SHARD as usize);
        for seg in 0..2 {
            e.prepare(SegmentId(seg)).unwrap();
            // Two writes: 5 rows, then the rest.
            e.write(loc(seg, 0), &data[..5 * row]).unwrap();
            e.write(loc(seg, 5 * row as u64), &data[5 * row..]).unwrap();
        }
        e.sync().unwrap();
        let read = |e: &Erasure, seg: u64, off: usize, len: usize| {
            let mut b = vec![0u8; len];
            e.read(loc(seg, off as u64), &mut b).map(|()| b)
        };
        for (off, len) in [(0, 100), (4095, 2), (7000, 50_000), (0, data.len())] {
            assert_eq!(read(&e, 1, off, len).unwrap(), &data[off..off + len]);
        }
        for lost in combinations(&[0, 1, 2, 3, 4], 2) {
            for &t in &lost {
                e.tg(t as u16).failed.store(true, Ordering::SeqCst);
            }
            for (off, len) in [(0, 100), (4095, 2), (7000, 50_000), (0, data.len())] {
                assert_eq!(
                    read(&e, 0, off, len).unwrap(),
                    &data[off..off + len],
                    "lost {lost:?}"
                );
            }
            for &t in &lost {
                e.tg(t as u16).failed.store(false, Ordering::SeqCst);
            }
        }
        for t in 0..3 {
            e.tg(t as u16).failed.store(true, Ordering::SeqCst);
        }
        // Which three: the data shards of segment 0 may be anywhere; with 3 of 5 gone,
        // only 2 remain for every segment.
        assert!(read(&e, 0, 0, 100).is_err());
        assert!(e.report().segments_lost > 0);
    }

    /// Damaged bytes in up to K shards of the rows read are found and repaired by the
    /// check; with K+1 damaged the check never passes (never wrong bytes).
    #[test]
    fn damaged_shards_are_found_by_the_check() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, devs) = setup(5, r, 2, 4);
        let data = pattern(2, 3 * SHARD as usize);
        e.prepare(SegmentId(0)).unwrap();
        e.write(loc(0, 0), &data).unwrap();
        let p = e.placed(0).unwrap();
        let want = blake3::hash(&data[10_000..60_000]);
        let mut check = |b: &[u8]| blake3::hash(b) == want;
        let damage = |i: usize| {
            let a = p.shards[i].unwrap();
            // Block 1 of the shard: within the rows [10_000, 60_000) covers.
            devs[a.target as usize].corrupt(e.shard_offset(a.slot, 1) + 17);
        };
        damage(1);
        let mut buf = vec![0u8; 50_000];
        e.read(loc(0, 10_000), &mut buf).unwrap();
        assert!(!check(&buf), "the damage is in the bytes read");
        assert!(e.read_repair(loc(0, 10_000), &mut buf, &mut check).unwrap());
        assert_eq!(buf, &data[10_000..60_000]);
        damage(3);
        assert!(e.read_repair(loc(0, 10_000), &mut buf, &mut check).unwrap());
        assert_eq!(buf, &data[10_000..60_000]);
        damage(0);
        assert!(!e.read_repair(loc(0, 10_000), &mut buf, &mut check).unwrap());
        assert_eq!(e.report().repaired_reads, 2);
    }

    /// A shard found damaged is remembered: later reads of other rows of its segment go
    /// around it (rebuilt from the others) instead of returning bytes that fail their
    /// check and re-reading the whole row to repair each chunk. Before, the second read
    /// below returned the damaged bytes.
    #[test]
    fn a_shard_found_damaged_is_read_around_by_later_reads() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, devs) = setup(5, r, 2, 4);
        let data = pattern(4, 3 * SHARD as usize);
        e.prepare(SegmentId(0)).unwrap();
        e.write(loc(0, 0), &data).unwrap();
        let p = e.placed(0).unwrap();
        let a = p.shards[1].unwrap();
        // Shard 1's blocks 1 and 5: logical blocks 4 and 16 of the segment.
        devs[a.target as usize].corrupt(e.shard_offset(a.slot, 1) + 17);
        devs[a.target as usize].corrupt(e.shard_offset(a.slot, 5) + 99);
        let (x0, x1) = (4 * BLOCK, 5 * BLOCK);
        let want = blake3::hash(&data[x0..x1]);
        let mut buf = vec![0u8; x1 - x0];
        e.read(loc(0, x0 as u64), &mut buf).unwrap();
        assert_ne!(buf, &data[x0..x1], "the damage is in the bytes read");
        let mut check = |b: &[u8]| blake3::hash(b) == want;
        assert!(e
            .read_repair(loc(0, x0 as u64), &mut buf, &mut check)
            .unwrap());
        assert_eq!(buf, &data[x0..x1]);
        // Another row of the same shard: read around it, without touching its target.
        let bad_reads = e.tg(a.target).bytes_read.load(Ordering::Relaxed);
        let (y0, y1) = (16 * BLOCK, 17 * BLOCK + 100);
        let mut buf = vec![0u8; y1 - y0];
        e.read(loc(0, y0 as u64), &mut buf).unwrap();
        assert_eq!(
            buf,
            &data[y0..y1],
            "a later read returned the damaged shard's bytes"
        );
        assert_eq!(
            e.tg(a.target).bytes_read.load(Ordering::Relaxed),
            bad_reads,
            "the shard known damaged was read again"
        );
        assert_eq!(e.report().repaired_reads, 1);
        // Rows the damage did not reach read the same either way.
        let mut all = vec![0u8; data.len()];
        e.read(loc(0, 0), &mut all).unwrap();
        assert_eq!(all, data);
    }

    /// A data shard missing and a parity shard damaged (a target that failed mid-row, or
    /// came back with stale bytes): the reconstruction reads parity, so the damaged parity
    /// shard must be a candidate for exclusion too. Found by the target crash driver.
    #[test]
    fn a_damaged_parity_shard_is_excluded_when_a_data_shard_is_missing() {
        let r = Redundancy { data: 3, parity: 2 };
        for (gone, bad) in [(0, 3), (1, 3), (2, 3)] {
            let (e, devs) = setup(5, r, 2, 4);
            let data = pattern(3, 3 * SHARD as usize);
            e.prepare(SegmentId(0)).unwrap();
            e.write(loc(0, 0), &data).unwrap();
            let p = e.placed(0).unwrap();
            let want = blake3::hash(&data[..30_000]);
            let mut check = |b: &[u8]| blake3::hash(b) == want;
            e.tg(p.shards[gone].unwrap().target)
                .failed
                .store(true, Ordering::SeqCst);
            let a = p.shards[bad].unwrap();
            devs[a.target as usize].corrupt(e.shard_offset(a.slot, 0) + 100);
            let mut buf = vec![0u8; 30_000];
            e.read(loc(0, 0), &mut buf).unwrap();
            assert!(!check(&buf), "shard {gone} gone, parity {bad} damaged");
            assert!(e.read_repair(loc(0, 0), &mut buf, &mut check).unwrap());
            assert_eq!(
                buf,
                &data[..30_000],
                "shard {gone} gone, parity {bad} damaged"
            );
        }
    }

    /// Equal targets share the shards evenly, one per failure domain; a target with
    /// errors gets none while enough others remain; too few domains place short.
    #[test]
    fn placement_spreads_and_avoids_failing_targets() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, _) = setup(7, r, 70, 64);
        for s in 0..35 {
            e.prepare(SegmentId(s)).unwrap();
        }
        let rep = e.report();
        let counts: Vec<u64> = rep.targets.iter().map(|t| t.shards).collect();
        assert_eq!(counts.iter().sum::<u64>(), 35 * 5);
        assert!(
            counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
            "{counts:?}"
        );
        e.tg(2).errors.store(5, Ordering::Relaxed);
        for s in 35..70 {
            e.prepare(SegmentId(s)).unwrap();
        }
        let after: Vec<u64> = e.report().targets.iter().map(|t| t.shards).collect();
        // The distribution, for the record (`--no-capture`).
        println!("shards per target, 35 segments of 3+2 on 7 equal targets: {counts:?}");
        println!("after 35 more with target 2 erring: {after:?}");
        assert_eq!(
            after[2], counts[2],
            "the erring target got new shards: {after:?}"
        );
        for s in 0..70 {
            let p = e.placed(s).unwrap();
            let doms: BTreeSet<u16> = p.shards.iter().flatten().map(|a| a.target).collect();
            assert_eq!(doms.len(), 5);
        }

        let (e, _) = setup(4, r, 4, 8);
        e.prepare(SegmentId(0)).unwrap();
        assert_eq!(e.placed(0).unwrap().shards.iter().flatten().count(), 4);
        e.tg(0).failed.store(true, Ordering::SeqCst);
        e.tg(1).failed.store(true, Ordering::SeqCst);
        assert!(
            e.prepare(SegmentId(1)).is_err(),
            "2 healthy targets < M = 3"
        );
    }

    /// A failed target's shards are rebuilt onto a replacement: afterwards any two other
    /// targets may be lost too, and every byte reads back.
    #[test]
    fn rebuild_onto_a_replacement_restores_full_redundancy() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, _) = setup(5, r, 6, 8);
        let data = pattern(4, 3 * SHARD as usize);
        for seg in 0..3 {
            e.prepare(SegmentId(seg)).unwrap();
            e.write(loc(seg, 0), &data).unwrap();
        }
        e.sync().unwrap();
        e.retire(1, "test");
        assert_eq!(e.report().segments_full, 0);
        let spare = Arc::new(MemDevice::new((TARGET_HEADER_BYTES + 8 * SHARD) as usize));
        let t = e.add_target(Target::new(
            PathBuf::from("spare"),
            "d1".into(),
            8,
            Ok(spare as Arc<dyn Device>),
        ));
        assert_eq!(t, 5);
        let rep = repair_all(&e, &[0, 1, 2], &data);
        assert_eq!(rep.segments_rebuilt, 3, "{rep:?}");
        assert!(rep.is_whole() && rep.chunks_repaired == 0, "{rep:?}");
        assert_eq!(rep.segments_short + rep.segments_lost, 0, "{rep:?}");
        assert_eq!(e.report().segments_full, 3);
        for lost in combinations(&[0, 2, 3, 4, 5], 2) {
            for &i in &lost {
                e.tg(i as u16).failed.store(true, Ordering::SeqCst);
            }
            for seg in 0..3 {
                let mut b = vec![0u8; data.len()];
                e.read(loc(seg, 0), &mut b).unwrap();
                assert!(b == data, "segment {seg} with {lost:?} lost");
            }
            for &i in &lost {
                e.tg(i as u16).failed.store(false, Ordering::SeqCst);
            }
        }
        // Nothing to do twice.
        let again = repair_all(&e, &[0, 1, 2], &data);
        assert_eq!(again.segments_rebuilt, 0);
        assert_eq!(again.blocks_rewritten, 0, "{again:?}");
    }

    /// The committed chunks of a segment holding `data` from offset 0: 50,000-byte pieces,
    /// so chunks straddle rows and share them.
    fn chunks_of(data: &[u8]) -> Vec<SegmentChunk> {
        (0..data.len())
            .step_by(50_000)
            .map(|o| SegmentChunk {
                offset: o as u64,
                len: 50_000.min(data.len() - o) as u32,
            })
            .collect()
    }

    /// Repairs segments `segs`, each holding `data` from offset 0 (verified against it, as
    /// the space verifies against the chunks' blake3).
    fn repair_all(e: &Erasure, segs: &[u64], data: &[u8]) -> RebuildReport {
        let mut rep = RebuildReport::default();
        let mut th = Throttle::new(None);
        let chunks = chunks_of(data);
        for &seg in segs {
            let mut verify = |i: usize, b: &[u8]| {
                let c = chunks[i];
                b == &data[c.offset as usize..c.offset as usize + c.len as usize]
            };
            let job = SegmentJob {
                seg,
                chunks: &chunks,
                busy: false,
            };
            e.repair_segment(&job, &mut verify, &mut rep, &mut th)
                .unwrap();
        }
        rep
    }

    /// Reads segment `seg` whole with the targets `lost` failed (restored afterwards).
    fn read_without(e: &Erasure, seg: u64, len: usize, lost: &[usize]) -> DevResult<Vec<u8>> {
        for &i in lost {
            e.tg(i as u16).failed.store(true, Ordering::SeqCst);
        }
        let mut b = vec![0u8; len];
        let r = e.read(loc(seg, 0), &mut b).map(|()| b);
        for &i in lost {
            e.tg(i as u16).failed.store(false, Ordering::SeqCst);
        }
        r
    }

    /// Issue 36: silent damage on one target, then a healthy target replaced. The rebuild
    /// must verify what it reconstructs, repair the damaged shard from the others, and write
    /// only verified data to the new target: afterwards any two targets may be lost and
    /// every byte still reads back. (It used to encode the damage into the new shard.)
    #[test]
    fn a_rebuild_repairs_damage_it_finds_and_never_encodes_it() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, devs) = setup(5, r, 2, 4);
        let data = pattern(7, 3 * SHARD as usize);
        e.prepare(SegmentId(0)).unwrap();
        e.write(loc(0, 0), &data).unwrap();
        e.sync().unwrap();
        let p = e.placed(0).unwrap();
        // Damage spread over data shard 0, as flipped bytes in one target's file.
        let t0 = p.shards[0].unwrap();
        for b in 0..SHARD / BLOCK as u64 {
            devs[t0.target as usize].corrupt(e.shard_offset(t0.slot, b) + 7 * b + 3);
        }
        // Replace the target of parity shard 3 (healthy).
        let t3 = p.shards[3].unwrap().target;
        e.retire(t3, "test");
        let spare = Arc::new(MemDevice::new((TARGET_HEADER_BYTES + 4 * SHARD) as usize));
        e.add_target(Target::new(
            PathBuf::from("spare"),
            format!("d{t3}"),
            4,
            Ok(spare as Arc<dyn Device>),
        ));
        let rep = repair_all(&e, &[0], &data);
        assert!(rep.is_whole(), "nothing may be reported lost: {rep:?}");
        assert_eq!(
            rep.chunks_verified,
            chunks_of(&data).len() as u64,
            "{rep:?}"
        );
        assert!(
            rep.chunks_repaired > 0 && rep.blocks_rewritten > 0,
            "{rep:?}"
        );
        assert_eq!(
            e.report().targets[t0.target as usize].repaired_blocks,
            rep.blocks_rewritten
        );
        // Every pair of the five targets now holding the segment may go.
        let now: Vec<usize> = e
            .placed(0)
            .unwrap()
            .shards
            .iter()
            .map(|a| a.unwrap().target as usize)
            .collect();
        for lost in combinations(&now, 2) {
            let got = read_without(&e, 0, data.len(), &lost);
            assert!(
                got.as_deref().ok() == Some(&data[..]),
                "segment 0 with targets {lost:?} lost"
            );
        }
        // A second pass finds nothing left to do.
        let again = repair_all(&e, &[0], &data);
        assert_eq!(
            (again.chunks_repaired, again.blocks_rewritten),
            (0, 0),
            "{again:?}"
        );
    }

    /// A scrub (no failed target) rewrites a damaged parity block in place, names the
    /// damaged shard only, and leaves the row consistent; damage in every row of three of
    /// five shards is beyond repair: those chunks are reported lost, and the shards that
    /// cannot be verified are left as they are.
    #[test]
    fn a_scrub_rewrites_damaged_blocks_and_reports_what_it_cannot_verify() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, devs) = setup(5, r, 2, 4);
        let data = pattern(8, 3 * SHARD as usize);
        e.prepare(SegmentId(0)).unwrap();
        e.write(loc(0, 0), &data).unwrap();
        e.sync().unwrap();
        let p = e.placed(0).unwrap();
        let at = |i: usize| p.shards[i].unwrap();
        devs[at(4).target as usize].corrupt(e.shard_offset(at(4).slot, 5) + 9);
        let rep = repair_all(&e, &[0], &data);
        assert_eq!(
            (rep.chunks_repaired, rep.blocks_rewritten),
            (0, 1),
            "{rep:?}"
        );
        let targets = e.report().targets;
        assert_eq!(targets[at(4).target as usize].verify_errors, 1);
        assert!((0..4).all(|i| targets[at(i).target as usize].verify_errors == 0));
        let rows = e.rows_holding([(loc(0, 0), data.len() as u64)]);
        assert!(e
            .verify_parity(&rows, &mut keep_all, &mut |_, _| {})
            .is_whole());

        // Three shards damaged in every block: no combination of readable shards verifies.
        for i in [0, 1, 3] {
            for b in 0..SHARD / BLOCK as u64 {
                devs[at(i).target as usize].corrupt(e.shard_offset(at(i).slot, b) + 11);
            }
        }
        let snap = |d: &Arc<MemDevice>| {
            let mut v = vec![0u8; d.len() as usize];
            d.read_at(&mut v, 0).unwrap();
            v
        };
        let before: Vec<Vec<u8>> = devs.iter().map(snap).collect();
        let rep = repair_all(&e, &[0], &data);
        assert_eq!(rep.chunks_lost, chunks_of(&data).len() as u64, "{rep:?}");
        assert!(!rep.is_whole());
        assert_eq!(
            rep.blocks_rewritten, 0,
            "nothing unverified is written: {rep:?}"
        );
        let after: Vec<Vec<u8>> = devs.iter().map(snap).collect();
        assert!(before == after, "no target changed");
    }

    /// A segment of several repair windows, damaged on both sides of a window boundary in
    /// the bytes of a chunk that straddles it: each row is rewritten only by the window that
    /// owns it, after verifying every chunk with bytes in it, so nothing is lost and every
    /// pair of targets may go afterwards.
    #[test]
    fn damage_across_a_window_boundary_is_repaired_from_verified_chunks() {
        let r = Redundancy { data: 3, parity: 2 };
        let shard = 4 * REPAIR_ROWS * BLOCK as u64;
        let (e, devs) = setup_sized(5, r, 1, 2, shard);
        let data = pattern(10, 3 * shard as usize);
        e.prepare(SegmentId(0)).unwrap();
        e.write(loc(0, 0), &data).unwrap();
        e.sync().unwrap();
        let p = e.placed(0).unwrap();
        let row = e.write_align() as u64;
        let boundary = REPAIR_ROWS * row;
        let chunks = chunks_of(&data);
        assert!(
            chunks
                .iter()
                .any(|c| c.offset < boundary && c.offset + c.len as u64 > boundary),
            "a chunk straddles the first window boundary"
        );
        // Rows on both sides of the boundary, data shard 0 and parity shard 3.
        for (i, b) in [(0, REPAIR_ROWS - 1), (0, REPAIR_ROWS), (3, REPAIR_ROWS)] {
            let a = p.shards[i].unwrap();
            devs[a.target as usize].corrupt(e.shard_offset(a.slot, b) + 99);
        }
        let mut rep = RebuildReport::default();
        let mut verify = |i: usize, b: &[u8]| {
            let c = chunks[i];
            b == &data[c.offset as usize..c.offset as usize + c.len as usize]
        };
        let job = SegmentJob {
            seg: 0,
            chunks: &chunks,
            busy: false,
        };
        e.repair_segment(&job, &mut verify, &mut rep, &mut Throttle::new(None))
            .unwrap();
        assert!(rep.is_whole(), "{rep:?}");
        assert_eq!(
            rep.chunks_verified,
            chunks.len() as u64,
            "each chunk counted once: {rep:?}"
        );
        assert_eq!(rep.blocks_rewritten, 3, "{rep:?}");
        for lost in combinations(&[0, 1, 2, 3, 4], 2) {
            let got = read_without(&e, 0, data.len(), &lost);
            assert!(
                got.as_deref().ok() == Some(&data[..]),
                "with targets {lost:?} lost"
            );
        }
    }

    /// A shard found damaged lowers what the segment can lose until it is repaired: the
    /// redundancy reported is what is readable now.
    #[test]
    fn found_damage_lowers_the_tolerance_until_repaired() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, devs) = setup(5, r, 2, 4);
        let data = pattern(9, 3 * SHARD as usize);
        e.prepare(SegmentId(0)).unwrap();
        e.write(loc(0, 0), &data).unwrap();
        e.sync().unwrap();
        assert_eq!(e.tolerance(0), Some(2));
        let a = e.placed(0).unwrap().shards[1].unwrap();
        devs[a.target as usize].corrupt(e.shard_offset(a.slot, 0) + 1);
        let mut buf = vec![0u8; 50_000];
        let want = data[..50_000].to_vec();
        let mut check = |b: &[u8]| b == &want[..];
        assert!(e.read_repair(loc(0, 0), &mut buf, &mut check).unwrap());
        assert_eq!(e.tolerance(0), Some(1), "shard 1 is known damaged");
        let t = &e.report().targets[a.target as usize];
        assert!(t.state.starts_with("degraded"), "{t:?}");
        assert_eq!((t.verify_errors, t.suspect_shards), (1, 1));
        assert!(e.report().degraded());
        let rep = repair_all(&e, &[0], &data);
        assert!(rep.is_whole() && rep.blocks_rewritten == 1, "{rep:?}");
        assert_eq!(e.tolerance(0), Some(2), "repaired");
        assert_eq!(e.report().targets[a.target as usize].state, "ok");
    }

    /// Segment 0 written whole, segment 1 five rows: the rows `verify_parity` is given.
    fn written_rows(e: &Erasure) -> Vec<(u64, Range<u64>)> {
        let row = e.write_align() as u64;
        let data = pattern(5, 3 * SHARD as usize);
        e.prepare(SegmentId(0)).unwrap();
        e.write(loc(0, 0), &data).unwrap();
        e.prepare(SegmentId(1)).unwrap();
        e.write(loc(1, 0), &data[..5 * row as usize]).unwrap();
        e.sync().unwrap();
        // Chunks as check sees them: not row-aligned, some sharing a row.
        e.rows_holding([
            (loc(1, 4 * row + 7), 100),
            (loc(0, 0), 3 * SHARD),
            (loc(1, 0), 2 * row - 1),
            (loc(1, 2 * row - 1), 2 * row),
        ])
    }

    fn keep_all(_: u64) -> bool {
        true
    }

    /// Parity that disagrees with its data is found in exactly the row damaged, and only in
    /// the rows given; a damaged parity shard is told apart from damaged data.
    #[test]
    fn verify_parity_finds_exactly_the_inconsistent_rows() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, devs) = setup(5, r, 4, 8);
        let rows = written_rows(&e);
        assert_eq!(rows, vec![(0, 0..16), (1, 0..5)]);
        let verify = |keep: &mut dyn FnMut(u64) -> bool| {
            let mut last = (0, 0);
            let rep = e.verify_parity(&rows, keep, &mut |d, t| last = (d, t));
            assert_eq!(last, (21, 21));
            rep
        };
        let clean = verify(&mut keep_all);
        assert!(clean.is_whole(), "{clean:?}");
        assert_eq!((clean.segments_checked, clean.rows_checked), (2, 21));
        assert!(clean.segments.is_empty());

        let damage = |seg: u64, shard: usize, row: u64| {
            let a = e.placed(seg).unwrap().shards[shard].unwrap();
            devs[a.target as usize].corrupt(e.shard_offset(a.slot, row) + 100);
        };
        // Parity shard 3 of segment 1, row 2; and row 9, never written, which is not checked.
        damage(1, 3, 2);
        damage(1, 3, 9);
        let rep = verify(&mut keep_all);
        assert_eq!(rep.rows_inconsistent, 1, "{rep:?}");
        assert_eq!(rep.segments.len(), 1);
        let s = &rep.segments[0];
        assert_eq!((s.segment, s.inconsistent_rows), (1, 1));
        assert_eq!(
            s.inconsistent,
            vec![InconsistentRow {
                row: 2,
                parity_shards: vec![3],
                damaged_shards: vec![3],
                data_read: true
            }]
        );
        let p = e.placed(1).unwrap();
        assert_eq!(
            s.targets,
            p.shards
                .iter()
                .map(|a| a.map(|a| a.target))
                .collect::<Vec<_>>()
        );
        assert!(s.missing_shards.is_empty() && s.degraded_rows + s.unrecoverable_rows == 0);

        // Data shard 1 of segment 0, row 15: every parity shard disagrees with the data as
        // stored, and it is the data shard that is named, not the healthy parity (issue 36).
        damage(0, 1, 15);
        let rep = verify(&mut keep_all);
        assert_eq!(rep.rows_inconsistent, 2, "{rep:?}");
        assert_eq!(rep.segments[0].segment, 0);
        assert_eq!(
            rep.segments[0].inconsistent,
            vec![InconsistentRow {
                row: 15,
                parity_shards: vec![3, 4],
                damaged_shards: vec![1],
                data_read: true
            }]
        );
        // A segment reused meanwhile (`keep` says no): its findings are dropped.
        let rep = verify(&mut |seg| seg != 0);
        assert_eq!(rep.rows_inconsistent, 1);
        assert_eq!(rep.segments.len(), 1);
        assert_eq!(rep.rows_checked, 21);
    }

    /// Missing shards: rows counted by how many more they can lose, still checked while
    /// more than M remain (the data rebuilt from parity); with 3 of 5 targets failed, every
    /// row is unrecoverable.
    #[test]
    fn verify_parity_counts_missing_shards_and_unrecoverable_rows() {
        let r = Redundancy { data: 3, parity: 2 };
        let (e, devs) = setup(5, r, 4, 8);
        let rows = written_rows(&e);
        let fail = |t: u16| e.tg(t).failed.store(true, Ordering::SeqCst);
        // The target of segment 1's data shard 0 fails, and parity shard 4 is damaged at row 3.
        let p1 = e.placed(1).unwrap();
        fail(p1.shards[0].unwrap().target);
        let a = p1.shards[4].unwrap();
        devs[a.target as usize].corrupt(e.shard_offset(a.slot, 3) + 5);
        let rep = e.verify_parity(&rows, &mut keep_all, &mut |_, _| {});
        assert_eq!(rep.rows_degraded, vec![(1, 21)], "{rep:?}");
        assert_eq!((rep.rows_inconsistent, rep.rows_unrecoverable), (1, 0));
        let s1 = rep.segments.iter().find(|s| s.segment == 1).unwrap();
        assert_eq!(s1.inconsistent.len(), 1);
        assert_eq!(s1.inconsistent[0].row, 3);
        assert!(!s1.inconsistent[0].data_read);
        assert!(
            s1.inconsistent[0].damaged_shards.is_empty(),
            "with M + 1 shards left, no shard can be told damaged: {:?}",
            s1.inconsistent[0]
        );
        assert_eq!(
            (s1.missing_shards.clone(), s1.tolerance),
            (vec![0], Some(1))
        );

        // A second target: M shards left, nothing to compare, no redundancy left.
        let other = (0..5u16)
            .find(|t| !e.tg(*t).failed.load(Ordering::SeqCst))
            .unwrap();
        fail(other);
        let rep = e.verify_parity(&rows, &mut keep_all, &mut |_, _| {});
        assert_eq!(rep.rows_degraded, vec![(0, 21)], "{rep:?}");
        assert_eq!((rep.rows_inconsistent, rep.rows_unrecoverable), (0, 0));

        // A third: every segment has 2 of its 5 shards.
        let third = (0..5u16)
            .find(|t| !e.tg(*t).failed.load(Ordering::SeqCst))
            .unwrap();
        fail(third);
        let rep = e.verify_parity(&rows, &mut keep_all, &mut |_, _| {});
        assert_eq!(rep.rows_unrecoverable, 21, "{rep:?}");
        assert!(rep.rows_degraded.is_empty());
        let ranges: Vec<(u64, Vec<(u64, u64)>)> = rep
            .segments
            .iter()
            .map(|s| (s.segment, s.unrecoverable.clone()))
            .collect();
        assert_eq!(ranges, vec![(0, vec![(0, 16)]), (1, vec![(0, 5)])]);
        assert!(rep.segments.iter().all(|s| s.missing_shards.len() == 3));

        // A segment never placed holding live rows: unrecoverable too.
        let rep = e.verify_parity(&[(3, 0..2)], &mut keep_all, &mut |_, _| {});
        assert_eq!(rep.rows_unrecoverable, 2);
    }

    /// A space opened again finds every placement where it was put.
    #[test]
    fn placements_are_durable() {
        let r = Redundancy { data: 2, parity: 1 };
        let (e, devs) = setup(3, r, 3, 4);
        let data = pattern(3, 2 * SHARD as usize);
        e.prepare(SegmentId(1)).unwrap();
        e.write(loc(1, 0), &data).unwrap();
        e.sync().unwrap();
        let map = e.map_dev.clone();
        let targets = devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Target::new(
                    PathBuf::from(format!("t{i}")),
                    format!("d{i}"),
                    4,
                    Ok(d.clone() as Arc<dyn Device>),
                )
            })
            .collect();
        let e2 = Erasure::open(r, SHARD, 3, targets, map).unwrap();
        let mut b = vec![0u8; data.len()];
        e2.read(loc(1, 0), &mut b).unwrap();
        assert_eq!(b, data);
        assert_eq!(e2.report().targets.iter().map(|t| t.shards).sum::<u64>(), 3);
    }
}
