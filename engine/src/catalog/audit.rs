//! The metadata tables checked against each other for `ckptfs check` (FORMAT.md's
//! invariants): counters above every id in use, free segments in range, extents and chunk
//! records with their reference counts, revisions and histories, inodes, directory entries
//! and listings, the shared namespace's versions, extended attributes; and, for damaged
//! chunks, every file revision that uses them. Here, beside the tables, because these walks
//! read redb's tables directly; `maintenance::check` runs them over one read snapshot, then
//! reads back every chunk through the store and the parity through the targets.
//!
//! Memory: one hash -> count entry and one (offset, length, hash) entry per chunk record;
//! the extent, revision, history and directory tables are streamed; only the damaged
//! chunks' references are collected.

use super::{self as catalog, RawTables};
use crate::error::{Error, Result};
use crate::format::*;
use redb::ReadableTable;
use std::collections::{BTreeMap, BTreeSet, HashMap};

type Tables = RawTables;

/// Metadata problems kept in a report; the rest are only counted (a badly damaged table
/// could otherwise produce one line per record).
pub(crate) const MAX_PROBLEMS: usize = 1000;
/// Directory levels followed when rebuilding a path (a loop in damaged metadata ends here).
const MAX_PATH_DEPTH: usize = 4096;

/// Why a chunk could not be read back as committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// The data file could not be read there.
    Io(String),
    /// The stored bytes decode but do not hash to the chunk's name (or have the wrong length).
    HashMismatch,
    /// The stored bytes are not a valid encoding for the chunk's codec.
    Decode(String),
    /// Extents name the chunk but the chunk table has no record of it.
    Missing,
}

impl Damage {
    /// A stable short name (JSON `reason`).
    pub fn kind(&self) -> &'static str {
        match self {
            Damage::Io(_) => "io_error",
            Damage::HashMismatch => "hash_mismatch",
            Damage::Decode(_) => "decode_failure",
            Damage::Missing => "missing",
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Damage::Io(m) => format!("I/O error: {m}"),
            Damage::HashMismatch => "blake3 hash mismatch".into(),
            Damage::Decode(m) => format!("does not decode: {m}"),
            Damage::Missing => "no chunk record".into(),
        }
    }
}

/// One extent of one revision that names a damaged chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkUse {
    pub history: HistoryId,
    /// The path as the metadata knows it: where the file is now for a live history, the
    /// path it had when it was removed for an unlinked one. None when it cannot be rebuilt.
    pub path: Option<Vec<u8>>,
    pub unlinked: bool,
    pub revision: RevisionId,
    /// The file's current content (what a read of the path returns).
    pub current: bool,
    /// Listed as a revision (complete checkpoint), as opposed to an fsync point.
    pub sealed: bool,
    /// File bytes `[file_start, file_end)` of the revision come from the chunk.
    pub file_start: u64,
    pub file_end: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedChunk {
    pub hash: ChunkHash,
    /// Where the record says the chunk is (0 and 0 for a missing record).
    pub offset: DataOffset,
    pub stored_len: u32,
    pub reason: Damage,
    /// Every extent naming the chunk, in (revision, file offset) order. Empty for a chunk
    /// no kept revision references (dedup could still revive it, so it counts as damage).
    pub uses: Vec<ChunkUse>,
}

/// The damage of one revision of one file: every byte range that cannot be read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedRevision {
    pub history: HistoryId,
    pub path: Option<Vec<u8>>,
    pub unlinked: bool,
    pub revision: RevisionId,
    pub current: bool,
    pub sealed: bool,
    /// Sorted, merged `[start, end)` file ranges.
    pub ranges: Vec<(u64, u64)>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckReport {
    pub inodes: u64,
    pub histories: u64,
    pub revisions: u64,
    pub extents: u64,
    /// Chunk records in the table.
    pub chunks: u64,
    /// Chunks read back, decoded and hash-checked (each once, however many references).
    pub chunks_verified: u64,
    /// Stored bytes read back.
    pub bytes_verified: u64,
    /// Usable bytes of the data file (whole segments).
    pub reserved_bytes: u64,
    /// Bytes of segments not in the free-segment table.
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Stored bytes of all chunk records in the data file (live data; `used - stored` is
    /// dead or unused).
    pub stored_bytes: u64,
    /// Chunk records held only by the object-store tier (of `chunks`): not read back here
    /// (`ckptfs check --remote` verifies the bucket's copies).
    pub remote_chunks: u64,
    /// Chunks whose stored bytes were damaged but were rebuilt from the other shards of a
    /// space over several targets (each also named in `warnings`): intact data, less
    /// redundancy until it is rewritten.
    pub repaired_chunks: u64,
    pub damaged: Vec<DamagedChunk>,
    /// The parity pass of a space over several targets (None for a one-target space, or when
    /// the targets could not be opened for it: then a warning says why). Its inconsistent
    /// rows are also named in `warnings`.
    pub parity: Option<crate::targets::ParityReport>,
    /// Metadata inconsistencies (at most `MAX_PROBLEMS`; the rest are counted below).
    pub problems: Vec<String>,
    pub problems_omitted: u64,
    /// Harmless findings: space that is leaked until repaired, but no data at risk.
    pub warnings: Vec<String>,
    pub seconds: f64,
}

impl CheckReport {
    /// Nothing damaged and the metadata consistent.
    ///
    /// The parity pass does not count: clean means every live byte reads back and verifies,
    /// which the chunk pass establishes. A row whose parity disagrees with its data, or that
    /// misses shards, has lost redundancy, not data (damaged data shows up in the chunk
    /// pass as a damaged or repaired chunk), so it is a warning, like a repaired chunk; a row
    /// with fewer than M shards loses the live chunks in its missing shards, and those are in
    /// `damaged` already.
    pub fn is_clean(&self) -> bool {
        self.damaged.is_empty() && self.problems.is_empty() && self.problems_omitted == 0
    }

    /// Every live row has its M+K shards, consistent, and no chunk needed rebuilding from
    /// the other shards: the space survives what its redundancy promises. Not so is damage
    /// too (a shard holding wrong bytes, a lost target): `ckptfs check` exits 1 for it,
    /// though `is_clean` may hold.
    pub fn redundancy_full(&self) -> bool {
        self.repaired_chunks == 0
            && self.parity.as_ref().is_none_or(|p| {
                p.rows_inconsistent == 0 && p.rows_degraded.is_empty() && p.rows_unrecoverable == 0
            })
    }

    pub(crate) fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        } else {
            self.problems_omitted += 1;
        }
    }

    pub(crate) fn warning(&mut self, w: String) {
        if self.warnings.len() < MAX_PROBLEMS {
            self.warnings.push(w);
        }
    }

    /// The damage grouped per (history, revision), ordered by path then revision.
    pub fn damaged_revisions(&self) -> Vec<DamagedRevision> {
        let mut by: BTreeMap<(HistoryId, RevisionId), DamagedRevision> = BTreeMap::new();
        for d in &self.damaged {
            for u in &d.uses {
                by.entry((u.history, u.revision))
                    .or_insert_with(|| DamagedRevision {
                        history: u.history,
                        path: u.path.clone(),
                        unlinked: u.unlinked,
                        revision: u.revision,
                        current: u.current,
                        sealed: u.sealed,
                        ranges: Vec::new(),
                    })
                    .ranges
                    .push((u.file_start, u.file_end));
            }
        }
        let mut out: Vec<DamagedRevision> = by.into_values().collect();
        for r in &mut out {
            r.ranges.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(r.ranges.len());
            for &(s, e) in &r.ranges {
                match merged.last_mut() {
                    Some(last) if s <= last.1 => last.1 = last.1.max(e),
                    _ => merged.push((s, e)),
                }
            }
            r.ranges = merged;
        }
        out.sort_by(|a, b| (&a.path, a.revision).cmp(&(&b.path, b.revision)));
        out
    }
}

/// The id counters (inode, revision, readdir cookie, history), u64::MAX for a missing one
/// (reported), so no id is found above it.
pub(crate) fn check_counters(t: &Tables, r: &mut CheckReport) -> Result<[u64; 4]> {
    let mut counters = [0u64; 4];
    for (i, name) in [
        catalog::NEXT_INO,
        catalog::NEXT_REV,
        catalog::NEXT_COOKIE,
        catalog::NEXT_HISTORY,
    ]
    .iter()
    .enumerate()
    {
        match t.counters.get(*name)? {
            Some(v) => counters[i] = v.value(),
            None => {
                r.problem(format!("counter {name} is missing"));
                counters[i] = u64::MAX;
            }
        }
    }
    Ok(counters)
}

/// The free segments, each in this slot's range (one outside it is reported, not kept).
pub(crate) fn check_free(
    t: &Tables,
    range: &std::ops::Range<u64>,
    r: &mut CheckReport,
) -> Result<BTreeSet<u64>> {
    let mut free = BTreeSet::new();
    for item in t.free.iter()? {
        let seg = item?.0.value();
        if !range.contains(&seg) {
            r.problem(format!(
                "free segment {seg} lies outside this slot's segments {}..{}",
                range.start, range.end
            ));
        } else {
            free.insert(seg);
        }
    }
    Ok(free)
}

/// A revision row, decoded if it decodes.
pub(crate) fn revision_of(
    t: &Tables,
    rev: u64,
) -> Result<Option<std::result::Result<RevisionRecord, Error>>> {
    Ok(t.revisions
        .get(rev)?
        .map(|v| RevisionRecord::decode(v.value())))
}

pub(crate) fn hash_of(key: &[u8]) -> Option<ChunkHash> {
    key.try_into().ok().map(ChunkHash)
}

/// Extents: each revision's are sorted, non-overlapping and inside the revision's size.
/// Returns, per chunk hash, how many extents name it and how many of its bytes they use
/// (checked against the chunk records in `check_chunks`).
pub(crate) fn check_extents(
    t: &Tables,
    r: &mut CheckReport,
    next_rev: u64,
) -> Result<HashMap<ChunkHash, (u64, u32)>> {
    let mut counted: HashMap<ChunkHash, (u64, u32)> = HashMap::new();
    let mut cur: Option<(u64, Option<RevisionRecord>)> = None;
    let mut prev_end = 0u64;
    for item in t.extents.iter()? {
        let (k, v) = item?;
        let (rev, off) = k.value();
        r.extents += 1;
        if cur.as_ref().map(|c| c.0) != Some(rev) {
            let rr = match revision_of(t, rev)? {
                Some(Ok(rr)) => Some(rr),
                Some(Err(e)) => {
                    r.problem(format!("revision {rev}: record does not decode: {e}"));
                    None
                }
                None => {
                    r.problem(format!(
                        "extents of revision {rev} exist but the revision does not"
                    ));
                    None
                }
            };
            if rev >= next_rev {
                r.problem(format!(
                    "extents of revision {rev} at or above next_rev {next_rev}"
                ));
            }
            cur = Some((rev, rr));
            prev_end = 0;
        }
        let e = match Extent::decode(v.value()) {
            Ok(e) => e,
            Err(e) => {
                r.problem(format!("extent ({rev}, {off}) does not decode: {e}"));
                continue;
            }
        };
        let c = counted.entry(e.chunk).or_insert((0, 0));
        c.0 += 1;
        c.1 = c.1.max(e.chunk_off.saturating_add(e.len));
        let end = off.saturating_add(e.len as u64);
        if off < prev_end {
            r.problem(format!(
                "extent ({rev}, {off}) overlaps the previous one (ending at {prev_end})"
            ));
        }
        if let Some((_, Some(rr))) = &cur {
            if end > rr.size {
                r.problem(format!(
                    "extent ({rev}, {off}) ends at {end}, past the revision size {}",
                    rr.size
                ));
            }
        }
        prev_end = prev_end.max(end);
    }
    Ok(counted)
}

/// Chunk records: decodable, references as counted, inside one used segment of the data
/// file, not overlapping. Returns the chunks to read back as (offset, stored length, hash),
/// and the hashes extents name that have no record.
#[allow(clippy::type_complexity)]
pub(crate) fn check_chunks(
    t: &Tables,
    r: &mut CheckReport,
    mut counted: HashMap<ChunkHash, (u64, u32)>,
    free: &BTreeSet<u64>,
    (seg_bytes, range): (u64, &std::ops::Range<u64>),
    is_pinned: &dyn Fn(&ChunkHash) -> bool,
) -> Result<(Vec<(u64, u32, ChunkHash)>, Vec<ChunkHash>)> {
    let mut placed = Vec::new();
    for item in t.chunks.iter()? {
        let (k, v) = item?;
        r.chunks += 1;
        let Some(h) = hash_of(k.value()) else {
            r.problem(format!(
                "chunk key of {} bytes is not a blake3 hash",
                k.value().len()
            ));
            continue;
        };
        let (refs_counted, used_len) = counted.remove(&h).unwrap_or((0, 0));
        let rec = match ChunkRecord::decode(v.value()) {
            Ok(rec) => rec,
            Err(e) => {
                r.problem(format!("chunk {h:?}: record does not decode: {e}"));
                continue;
            }
        };
        if rec.refs != refs_counted {
            r.problem(format!(
                "chunk {h:?}: reference count {} but {} extents name it",
                rec.refs, refs_counted
            ));
        }
        if rec.refs == 0
            && refs_counted == 0
            && t.candidates.get(h.0.as_slice())?.is_none()
            && !is_pinned(&h)
        {
            r.warning(format!(
                "chunk {h:?} at data offset {} is unreferenced but not queued for gc \
                 ({} bytes leaked until it is)",
                rec.offset.0, rec.stored_len
            ));
        }
        if used_len > rec.raw_len {
            r.problem(format!(
                "chunk {h:?}: extents use {used_len} bytes of it, it has {}",
                rec.raw_len
            ));
        }
        if rec.is_remote() {
            // Held only by the object-store tier: no bytes here to place or read back
            // (`check --remote` verifies the bucket's).
            r.remote_chunks += 1;
            continue;
        }
        r.stored_bytes += rec.stored_len as u64;
        let (off, end) = (rec.offset.0, rec.offset.0 + rec.stored_len as u64);
        let seg = off / seg_bytes;
        if off < range.start * seg_bytes || end > range.end * seg_bytes {
            r.problem(format!(
                "chunk {h:?}: bytes {off}..{end} lie outside this slot's segments {}..{}",
                range.start, range.end
            ));
        } else if (end - 1) / seg_bytes != seg {
            r.problem(format!(
                "chunk {h:?}: bytes {off}..{end} cross a segment boundary"
            ));
        } else if free.contains(&seg) {
            r.problem(format!(
                "chunk {h:?}: bytes {off}..{end} lie in segment {seg}, which is listed free"
            ));
        }
        placed.push((off, rec.stored_len, h));
    }
    let mut missing: Vec<ChunkHash> = counted.into_keys().collect();
    missing.sort_unstable();
    for h in &missing {
        r.problem(format!("extents name chunk {h:?}, which has no record"));
    }
    // Overlaps, in data-file order.
    placed.sort_unstable_by_key(|p| p.0);
    let mut prev: Option<(u64, ChunkHash)> = None;
    for &(off, len, h) in &placed {
        if let Some((prev_end, ph)) = prev {
            if off < prev_end {
                r.problem(format!(
                    "chunk {h:?} at {off} overlaps chunk {ph:?}, which ends at {prev_end}"
                ));
            }
        }
        let end = off + len as u64;
        if prev.is_none_or(|(e, _)| end > e) {
            prev = Some((end, h));
        }
    }
    Ok((placed, missing))
}

/// Revisions belong to an existing history that lists them; listed revisions exist.
pub(crate) fn check_revisions(t: &Tables, r: &mut CheckReport, next_rev: u64) -> Result<()> {
    for item in t.revisions.iter()? {
        let (k, v) = item?;
        let rev = k.value();
        r.revisions += 1;
        if rev == 0 || rev >= next_rev {
            r.problem(format!("revision {rev} outside 1..next_rev ({next_rev})"));
        }
        let rr = match RevisionRecord::decode(v.value()) {
            Ok(rr) => rr,
            Err(e) => {
                r.problem(format!("revision {rev}: record does not decode: {e}"));
                continue;
            }
        };
        if t.histories.get(rr.history.0)?.is_none() {
            r.problem(format!(
                "revision {rev} belongs to history {}, which does not exist",
                rr.history
            ));
        }
        if t.history_revs.get((rr.history.0, rev))?.is_none() {
            r.problem(format!(
                "revision {rev} is not listed in its history {}",
                rr.history
            ));
        }
    }
    for item in t.history_revs.iter()? {
        let (hid, rev) = item?.0.value();
        match revision_of(t, rev)? {
            None => r.problem(format!(
                "history {hid} lists revision {rev}, which does not exist"
            )),
            Some(Ok(rr)) if rr.history.0 != hid => r.problem(format!(
                "history {hid} lists revision {rev}, which belongs to history {}",
                rr.history
            )),
            Some(_) => {}
        }
        if t.histories.get(hid)?.is_none() {
            r.problem(format!(
                "revision {rev} is listed under history {hid}, which does not exist"
            ));
        }
    }
    Ok(())
}

/// Extended attributes belong to inodes and revisions that exist, within the limits.
pub(crate) fn check_xattrs(t: &Tables, r: &mut CheckReport) -> Result<()> {
    for item in t.xattrs.iter()? {
        let (k, v) = item?;
        let (ino, name) = k.value();
        if t.inodes.get(ino)?.is_none() {
            r.problem(format!(
                "extended attribute of inode {ino}, which does not exist"
            ));
        }
        if name.is_empty() || name.len() > XATTR_NAME_MAX || v.value().len() > XATTR_VALUE_MAX {
            r.problem(format!(
                "inode {ino}: extended attribute of {} name bytes and {} value bytes is outside the limits",
                name.len(),
                v.value().len()
            ));
        }
    }
    for item in t.rev_xattrs.iter()? {
        let (k, v) = item?;
        let rev = k.value();
        if t.revisions.get(rev)?.is_none() {
            r.problem(format!(
                "extended attributes recorded for revision {rev}, which does not exist"
            ));
        }
        if let Err(e) = decode_xattrs(v.value()) {
            r.problem(format!("revision {rev}: {e}"));
        }
    }
    Ok(())
}

/// Inodes: current revisions exist, belong to the file's history and match its size;
/// directories have directory parents. Histories: a live one names the file that has it.
pub(crate) fn check_inodes_and_histories(
    t: &Tables,
    r: &mut CheckReport,
    next_ino: u64,
    next_history: u64,
    shared: bool,
) -> Result<()> {
    if t.inodes.get(InodeId::ROOT.0)?.is_none() {
        r.problem("the root directory (inode 1) is missing".into());
    }
    for item in t.inodes.iter()? {
        let (k, v) = item?;
        let ino = k.value();
        r.inodes += 1;
        if ino == 0 || ino >= next_ino {
            r.problem(format!("inode {ino} outside 1..next_ino ({next_ino})"));
        }
        let rec = match InodeRecord::decode(v.value()) {
            Ok(rec) => rec,
            Err(e) => {
                r.problem(format!("inode {ino}: record does not decode: {e}"));
                continue;
            }
        };
        match rec.kind {
            NodeKind::File => {
                if rec.nlink > 0 {
                    match t.histories.get(rec.history.0)? {
                        None => r.problem(format!(
                            "file inode {ino} commits into history {}, which does not exist",
                            rec.history
                        )),
                        Some(v) => match HistoryRecord::decode(v.value()) {
                            Ok(h) if h.unlinked.is_some() || h.ino.0 != ino => r.problem(format!(
                                "file inode {ino} commits into history {}, which belongs \
                                     to {}",
                                rec.history,
                                if h.unlinked.is_some() {
                                    "a removed path".to_string()
                                } else {
                                    format!("inode {}", h.ino.0)
                                }
                            )),
                            _ => {}
                        },
                    }
                }
                if rec.current_rev.0 != 0 {
                    match revision_of(t, rec.current_rev.0)? {
                        None => r.problem(format!(
                            "file inode {ino}: current revision {} does not exist",
                            rec.current_rev.0
                        )),
                        Some(Ok(rr)) => {
                            // A file replaced by a rename keeps its content's revision in the
                            // history its path went on with, and commits (if still open) into
                            // a history of its own: only linked files must agree.
                            if rr.history != rec.history && rec.nlink > 0 {
                                r.problem(format!(
                                    "file inode {ino}: current revision {} belongs to history \
                                     {}, the file to {}",
                                    rec.current_rev.0, rr.history, rec.history
                                ));
                            }
                            if rr.size != rec.size {
                                r.problem(format!(
                                    "file inode {ino}: size {} but its current revision {} \
                                     has {}",
                                    rec.size, rec.current_rev.0, rr.size
                                ));
                            }
                        }
                        Some(Err(_)) => {}
                    }
                } else if rec.size != 0 {
                    r.problem(format!(
                        "file inode {ino} has size {} but no committed revision",
                        rec.size
                    ));
                }
            }
            // In a shared namespace a directory's place is its bindings', anywhere.
            NodeKind::Dir if shared => {}
            NodeKind::Dir => match t.inodes.get(rec.parent.0)? {
                None => r.problem(format!(
                    "directory inode {ino}: parent {} does not exist",
                    rec.parent.0
                )),
                Some(p) => {
                    if InodeRecord::decode(p.value()).is_ok_and(|p| p.kind != NodeKind::Dir) {
                        r.problem(format!(
                            "directory inode {ino}: parent {} is not a directory",
                            rec.parent.0
                        ));
                    }
                }
            },
            _ => {}
        }
    }
    for item in t.histories.iter()? {
        let (k, v) = item?;
        let hid = k.value();
        r.histories += 1;
        if hid == 0 || hid >= next_history {
            r.problem(format!(
                "history {hid} outside 1..next_history ({next_history})"
            ));
        }
        let h = match HistoryRecord::decode(v.value()) {
            Ok(h) => h,
            Err(e) => {
                r.problem(format!("history {hid}: record does not decode: {e}"));
                continue;
            }
        };
        if h.unlinked.is_none() {
            let owner = t
                .inodes
                .get(h.ino.0)?
                .map(|v| InodeRecord::decode(v.value()));
            match owner {
                Some(Ok(rec)) if rec.kind == NodeKind::File && rec.history.0 == hid => {}
                Some(Ok(_)) => r.problem(format!(
                    "history {hid} names inode {}, which is not the file that has it",
                    h.ino.0
                )),
                Some(Err(_)) => {}
                None => r.problem(format!(
                    "history {hid} names inode {}, which does not exist",
                    h.ino.0
                )),
            }
        }
    }
    Ok(())
}

/// A slot of a shared namespace: every inode is a version of an object (its own, or
/// another's), and every version record names an inode of this slot. Bindings may name
/// any slot's objects, so they are checked where all slots are seen: by every node's
/// view, not here.
pub(crate) fn check_versions(
    t: &Tables,
    reader: &crate::catalog::Reader,
    r: &mut CheckReport,
) -> Result<()> {
    let versions: std::collections::HashMap<u64, crate::format::VersionMeta> = reader
        .versions()?
        .into_iter()
        .map(|(i, m)| (i.0, m))
        .collect();
    for (ino, m) in &versions {
        if t.inodes.get(*ino)?.is_none() {
            r.problem(format!(
                "version record of inode {ino} (of object {}), which does not exist",
                m.of.0
            ));
        }
    }
    for item in t.inodes.iter()? {
        let ino = item?.0.value();
        if !versions.contains_key(&ino) {
            r.problem(format!("inode {ino} has no version record"));
        }
    }
    Ok(())
}

/// Directory entries name existing inodes in existing directories, each with its readdir
/// twin, and cookies below the counter.
pub(crate) fn check_dirents(t: &Tables, r: &mut CheckReport, next_cookie: u64) -> Result<()> {
    for item in t.dirents.iter()? {
        let (k, v) = item?;
        let (parent, name) = k.value();
        let (child, cookie) = v.value();
        let shown = String::from_utf8_lossy(name).into_owned();
        match t.inodes.get(parent)? {
            None => r.problem(format!(
                "entry {shown:?} lives in directory {parent}, which does not exist"
            )),
            Some(p) => {
                if InodeRecord::decode(p.value()).is_ok_and(|p| p.kind != NodeKind::Dir) {
                    r.problem(format!(
                        "entry {shown:?} lives in inode {parent}, which is not a directory"
                    ));
                }
            }
        }
        if t.inodes.get(child)?.is_none() {
            r.problem(format!(
                "entry {shown:?} in directory {parent} names inode {child}, which does not exist"
            ));
        }
        if cookie >= next_cookie {
            r.problem(format!(
                "entry {shown:?} in directory {parent}: cookie {cookie} at or above next_cookie"
            ));
        }
        match t.dirlist.get((parent, cookie))? {
            Some(n) if n.value() == name => {}
            _ => r.problem(format!(
                "entry {shown:?} in directory {parent} has no readdir entry at cookie {cookie}"
            )),
        }
    }
    for item in t.dirlist.iter()? {
        let (k, v) = item?;
        let (parent, cookie) = k.value();
        let name = v.value();
        match t.dirents.get((parent, name))? {
            Some(e) if e.value().1 == cookie => {}
            _ => r.problem(format!(
                "readdir entry {:?} (cookie {cookie}) in directory {parent} has no directory entry",
                String::from_utf8_lossy(name)
            )),
        }
    }
    Ok(())
}

/// Fills in every extent naming a damaged chunk, with its file's path and revision.
pub(crate) fn collect_uses(
    t: &Tables,
    damaged: &mut HashMap<ChunkHash, DamagedChunk>,
) -> Result<()> {
    struct RevInfo {
        history: HistoryId,
        sealed: bool,
    }
    let mut revs: HashMap<u64, Option<RevInfo>> = HashMap::new();
    let mut found: Vec<(ChunkHash, u64, u64, u64)> = Vec::new();
    for item in t.extents.iter()? {
        let (k, v) = item?;
        let Ok(e) = Extent::decode(v.value()) else {
            continue;
        };
        if damaged.contains_key(&e.chunk) {
            let (rev, off) = k.value();
            found.push((e.chunk, rev, off, off + e.len as u64));
            if let std::collections::hash_map::Entry::Vacant(slot) = revs.entry(rev) {
                slot.insert(match revision_of(t, rev)? {
                    Some(Ok(rr)) => Some(RevInfo {
                        history: rr.history,
                        sealed: rr.sealed,
                    }),
                    _ => None,
                });
            }
        }
    }
    // Histories and their paths, once each.
    struct HistInfo {
        path: Option<Vec<u8>>,
        unlinked: bool,
        current: RevisionId,
    }
    let mut hists: HashMap<HistoryId, HistInfo> = HashMap::new();
    let mut live_inos: HashMap<u64, HistoryId> = HashMap::new();
    for info in revs.values().flatten() {
        if hists.contains_key(&info.history) {
            continue;
        }
        let h = t
            .histories
            .get(info.history.0)?
            .and_then(|v| HistoryRecord::decode(v.value()).ok());
        let hi = match h {
            Some(h) if h.unlinked.is_some() => HistInfo {
                path: Some(h.path),
                unlinked: true,
                current: RevisionId(0),
            },
            Some(h) => {
                live_inos.insert(h.ino.0, info.history);
                let current = t
                    .inodes
                    .get(h.ino.0)?
                    .and_then(|v| InodeRecord::decode(v.value()).ok())
                    .map_or(RevisionId(0), |rec| rec.current_rev);
                HistInfo {
                    path: None,
                    unlinked: false,
                    current,
                }
            }
            None => HistInfo {
                path: None,
                unlinked: false,
                current: RevisionId(0),
            },
        };
        hists.insert(info.history, hi);
    }
    if !live_inos.is_empty() {
        for (ino, path) in paths_of(t, &live_inos.keys().copied().collect())? {
            if let Some(hi) = live_inos.get(&ino).and_then(|hid| hists.get_mut(hid)) {
                hi.path = Some(path);
            }
        }
    }
    for (h, rev, start, end) in found {
        let Some(d) = damaged.get_mut(&h) else {
            continue;
        };
        let info = revs.get(&rev).and_then(|i| i.as_ref());
        let hist = info.and_then(|i| hists.get(&i.history));
        d.uses.push(ChunkUse {
            history: info.map_or(HistoryId::NONE, |i| i.history),
            path: hist.and_then(|h| h.path.clone()),
            unlinked: hist.is_some_and(|h| h.unlinked),
            revision: RevisionId(rev),
            current: hist.is_some_and(|h| h.current == RevisionId(rev)),
            sealed: info.is_some_and(|i| i.sealed),
            file_start: start,
            file_end: end,
        });
    }
    Ok(())
}

/// Paths (from the root, without a leading `/`) of the given file inodes: one pass over the
/// directory entries, then up through each directory's own name.
pub(crate) fn paths_of(t: &Tables, inos: &BTreeSet<u64>) -> Result<HashMap<u64, Vec<u8>>> {
    let mut out = HashMap::new();
    for item in t.dirents.iter()? {
        let (k, v) = item?;
        let child = v.value().0;
        if !inos.contains(&child) || out.contains_key(&child) {
            continue;
        }
        let (parent, name) = k.value();
        let mut parts = vec![name.to_vec()];
        let mut dir = InodeId(parent);
        let mut ok = true;
        for _ in 0..MAX_PATH_DEPTH {
            if dir == InodeId::ROOT {
                break;
            }
            match t.inode(dir) {
                Ok(Some(rec)) => {
                    parts.push(rec.target.clone());
                    dir = rec.parent;
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if ok && dir == InodeId::ROOT {
            parts.reverse();
            out.insert(child, parts.join(&b'/'));
        }
    }
    Ok(out)
}

/// The full hash in hex (`ChunkHash`'s Debug shows only its first 8 bytes).
pub fn hash_hex(h: &ChunkHash) -> String {
    h.0.iter().map(|b| format!("{b:02x}")).collect()
}
