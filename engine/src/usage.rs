//! Where the used space is: `ckptfs stats` splits the stored bytes by what would free them.
//!
//! - live: chunks a current file's content references (only removing or rewriting files
//!   frees them);
//! - kept revisions of present files: chunks only older revisions of files that still exist
//!   reference (retention, `keep-revisions` and `keep-age`, keeps them);
//! - kept revisions of removed files, the trash: chunks only removed files' revisions
//!   reference (`keep-unlinked` keeps them while there is room; a writer short of room, the
//!   automatic gc below its watermark, or `ckptfs gc --empty-trash` empties it, oldest
//!   removal first).
//!
//! - unreferenced: chunks no revision references any more (the next gc deletes them).
//!
//! A chunk shared by several counts where the most alive of them puts it (live, then kept
//! revisions, then trash), so the four add up to the stored bytes and each says what
//! dropping that kind of revision would give back.
//!
//! Memory: the revisions of current files (8 bytes each) and removed histories (8 bytes
//! each), plus one entry (8-byte hash prefix, two counts) per distinct chunk that a
//! non-current revision references, at most `SPLIT_CHUNKS_MAX` at a time: with more, the
//! extents are read again once per share of the hash space (`passes`). Two chunks whose
//! hashes share their first 8 bytes would be counted together (odds about n^2 / 2^65: one in
//! ten million for a million chunks), which can only move bytes between the categories.

use crate::catalog::Reader;
use crate::error::Result;
use crate::format::*;
use std::collections::{HashMap, HashSet};

/// Chunk entries the split holds at once (about 24 bytes each: 24 MiB).
pub(crate) const SPLIT_CHUNKS_MAX: usize = 1 << 20;

/// The stored bytes by what holds them (see the module comment).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Split {
    /// Stored bytes of chunks some current file references.
    pub live_bytes: u64,
    /// Stored bytes of chunks only kept older revisions of present files reference.
    pub kept_revision_bytes: u64,
    /// Those revisions (sealed or fsync points, excluding current ones).
    pub kept_revisions: u64,
    /// Stored bytes of chunks only removed files' revisions reference: what emptying the
    /// trash frees.
    pub trash_bytes: u64,
    /// Revisions of removed files kept, and their files (histories).
    pub trash_revisions: u64,
    pub trash_files: u64,
    /// Stored bytes of chunks nothing references any more (the next gc deletes them).
    pub unreferenced_bytes: u64,
    /// Passes over the extents the split took (more than one when more chunks than
    /// `SPLIT_CHUNKS_MAX` needed counting).
    pub passes: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Live,
    Kept,
    Trash,
}

/// Distinct bytes the kept revisions name (`Stats::named_chunk_bytes`): per referenced
/// chunk, the smaller of its size and the bytes its references cover. The references are
/// summed per chunk in passes of at most `SPLIT_CHUNKS_MAX` chunks (by hash prefix), so the
/// memory stays bounded whatever the space holds.
pub(crate) fn named_bytes(r: &Reader, chunks: u64) -> Result<u64> {
    let passes = (chunks as usize).div_ceil(SPLIT_CHUNKS_MAX).max(1) as u64;
    let mut named = 0u64;
    for pass in 0..passes {
        let mut refs: HashMap<u64, u64> = HashMap::new();
        r.for_each_extent(|e| {
            let p = prefix(&e.chunk);
            if p % passes == pass {
                *refs.entry(p).or_default() += e.len as u64;
            }
        })?;
        // Chunks held only by the object-store tier are named all the same.
        r.for_each_chunk_record(|h, c| {
            if let Some(n) = refs.get(&prefix(&h)) {
                named += (*n).min(c.raw_len as u64);
            }
            Ok(())
        })?;
    }
    Ok(named)
}

fn prefix(h: &ChunkHash) -> u64 {
    u64::from_le_bytes(h.0[..8].try_into().expect("8 bytes"))
}

/// The split of `r`'s snapshot; `stored_bytes` is the sum of all chunk records' stored
/// lengths (what `live_bytes` is the rest of).
pub fn split(r: &Reader, stored_bytes: u64) -> Result<Split> {
    let mut current: HashSet<u64> = HashSet::new();
    r.for_each_inode(|_, rec| {
        if rec.kind == NodeKind::File && rec.nlink > 0 && rec.current_rev.0 != 0 {
            current.insert(rec.current_rev.0);
        }
    })?;
    let mut removed: HashSet<u64> = HashSet::new();
    r.for_each_history(|hid, h| {
        if h.unlinked.is_some() {
            removed.insert(hid.0);
        }
        Ok(())
    })?;
    let mut s = Split::default();
    // Revision classes, one lookup per revision (extents come in revision order), with the
    // history of a removed file's revision.
    let mut last: Option<(RevisionId, Class, u64)> = None;
    let mut class_of = |rev: RevisionId| -> Result<(Class, u64)> {
        if let Some((r0, c, h)) = last {
            if r0 == rev {
                return Ok((c, h));
            }
        }
        let (c, h) = if current.contains(&rev.0) {
            (Class::Live, 0)
        } else {
            match r.revision(rev)? {
                Some(rr) if removed.contains(&rr.history.0) => (Class::Trash, rr.history.0),
                _ => (Class::Kept, 0),
            }
        };
        last = Some((rev, c, h));
        Ok((c, h))
    };
    // Revisions by class (those of holes only have no extents and are not counted).
    let mut trash_files: HashSet<u64> = HashSet::new();
    let mut non_current = 0u64;
    let mut rev_seen: Option<RevisionId> = None;
    r.for_each_revision_extent(|rev, _| {
        let (c, h) = class_of(rev)?;
        if c != Class::Live {
            non_current += 1;
        }
        if rev_seen != Some(rev) {
            rev_seen = Some(rev);
            match c {
                Class::Live => {}
                Class::Kept => s.kept_revisions += 1,
                Class::Trash => {
                    s.trash_revisions += 1;
                    trash_files.insert(h);
                }
            }
        }
        Ok(())
    })?;
    s.trash_files = trash_files.len() as u64;
    drop(trash_files);
    let passes = (non_current as usize).div_ceil(SPLIT_CHUNKS_MAX).max(1) as u64;
    s.passes = passes;
    for pass in 0..passes {
        let mine = |h: &ChunkHash| prefix(h) % passes == pass;
        // Per chunk: references from kept revisions, from removed files' revisions.
        let mut refs: HashMap<u64, (u64, u64)> = HashMap::new();
        r.for_each_revision_extent(|rev, e| {
            if !mine(&e.chunk) {
                return Ok(());
            }
            match class_of(rev)?.0 {
                Class::Live => {}
                Class::Kept => refs.entry(prefix(&e.chunk)).or_default().0 += 1,
                Class::Trash => refs.entry(prefix(&e.chunk)).or_default().1 += 1,
            }
            Ok(())
        })?;
        r.for_each_chunk(|h, c| {
            if !mine(&h) {
                return Ok(());
            }
            if c.refs == 0 {
                s.unreferenced_bytes += c.stored_len as u64;
                return Ok(());
            }
            if let Some(&(kept, trash)) = refs.get(&prefix(&h)) {
                // Every reference is from a non-current revision: no current file holds it.
                if kept + trash >= c.refs {
                    match kept {
                        0 => s.trash_bytes += c.stored_len as u64,
                        _ => s.kept_revision_bytes += c.stored_len as u64,
                    }
                }
            }
            Ok(())
        })?;
    }
    s.live_bytes =
        stored_bytes.saturating_sub(s.kept_revision_bytes + s.trash_bytes + s.unreferenced_bytes);
    Ok(s)
}
