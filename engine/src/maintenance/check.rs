//! `ckptfs check`: reads back every committed chunk and checks the metadata invariants of
//! FORMAT.md, and says precisely which files and revisions any damage touches.
//!
//! The metadata table itself is protected by redb's page checksums, verified when the space
//! is opened; this module checks what those cannot: that the data file still holds what the
//! metadata names, and that the tables agree with each other.
//!
//! The tables' cross-checks are the catalog's (`catalog::audit`: the only code besides the
//! catalog's own that reads redb's tables); this module runs them over one read snapshot and
//! does what needs the store and the targets.
//!
//! Memory: the audit's (one hash -> count entry and one (offset, length, hash) entry per
//! chunk record), plus one bit of state per data-file segment; chunk data is read one chunk
//! at a time.
//!
//! On a mounted space the check runs against one read snapshot of the metadata, while writers
//! and gc go on. Each chunk is read through its current record, not the snapshot's (gc may
//! have moved it and reused the old place), and a failure is confirmed by a second read.
//!
//! A space over several targets also gets a parity pass after the chunk pass: every row of
//! shards holding live chunks is read whole, its parity re-encoded from its data and compared
//! with the parity stored (`Erasure::verify_parity`, at most `targets::VERIFY_ROWS` rows in
//! memory). The chunk pass cannot see damaged parity (reads use the data shards), so without
//! it a row could silently have less redundancy than the space promises.

use crate::catalog::audit;
pub use crate::catalog::audit::{
    hash_hex, CheckReport, ChunkUse, Damage, DamagedChunk, DamagedRevision,
};
use crate::error::{ChunkDamage, Result};
use crate::format::*;
use crate::placement::Location;
use crate::space::Space;
use crate::store::ChunkStore;
use std::collections::HashMap;
use std::time::Instant;

/// Checks `space`: every chunk record is read back and verified once, and the tables are
/// checked against each other. `progress(done, total)` counts stored bytes read.
/// Errors are only for a check that could not run (the metadata table failing to read);
/// everything it finds is in the report.
pub fn check(space: &Space, progress: &mut dyn FnMut(u64, u64)) -> Result<CheckReport> {
    let start = Instant::now();
    let sb = space.superblock().clone();
    let seg_bytes = sb.segment_bytes as u64;
    let range = space.segment_range();
    let mut r = CheckReport {
        reserved_bytes: (range.end - range.start) * seg_bytes,
        ..CheckReport::default()
    };
    // Damage on a metadata mirror is repaired when the space is opened (the copy is
    // rewritten from the primary), so it is a warning, not a problem: said here so an
    // offline check, which opens the space to run, does not repair it unseen.
    for f in space.report().mirror_findings() {
        r.warning(format!("when the space was opened: {f}"));
    }
    let reader = space.reader()?;
    let t = reader.raw()?;

    // Counters first: every id in use must be below its counter.
    let [next_ino, next_rev, next_cookie, next_history] = audit::check_counters(&t, &mut r)?;
    if let Err(e) = space.settings().config() {
        r.problem(format!("retention config unreadable: {e}"));
    }

    // Free segments: in range; what is not free is in use.
    let free = audit::check_free(&t, &range, &mut r)?;
    r.free_bytes = free.len() as u64 * seg_bytes;
    r.used_bytes = r.reserved_bytes - r.free_bytes;

    let counted = audit::check_extents(&t, &mut r, next_rev)?;
    let (mut placed, mut missing) =
        audit::check_chunks(&t, &mut r, counted, &free, (seg_bytes, &range), &|h| {
            space.store().is_pinned(h)
        })?;
    audit::check_revisions(&t, &mut r, next_rev)?;
    audit::check_inodes_and_histories(
        &t,
        &mut r,
        next_ino,
        next_history,
        space.slots().is_shared(),
    )?;
    audit::check_dirents(&t, &mut r, next_cookie)?;
    if space.slots().is_shared() {
        audit::check_versions(&t, &reader, &mut r)?;
    }
    audit::check_xattrs(&t, &mut r)?;

    // A space over several targets: the parity pass reads its shards through the live
    // placement (stripe locks held per segment, so no row is read half-written).
    let view = space.report().erasure();

    // Read back every chunk once, in data-file order.
    placed.sort_unstable_by_key(|p| p.0);
    let live_rows = view.as_ref().map_or_else(Vec::new, |v| {
        v.rows_holding(
            placed
                .iter()
                .map(|&(off, len, _)| (Location::of(DataOffset(off), seg_bytes), len as u64)),
        )
    });
    // Progress counts bytes read: stored chunks, then whole rows of shards.
    let row_cost = view.as_ref().map_or(0, |v| {
        (v.redundancy().shards() * crate::targets::BLOCK) as u64
    });
    let chunk_total: u64 = placed.iter().map(|p| p.1 as u64).sum();
    let total =
        chunk_total + live_rows.iter().map(|(_, r)| r.end - r.start).sum::<u64>() * row_cost;
    let mut done = 0u64;
    progress(0, total);
    let mut damaged: HashMap<ChunkHash, DamagedChunk> = HashMap::new();
    // Data-file ranges of the chunks found damaged or repaired: where a parity mismatch is
    // explained by damaged data.
    let mut suspect: Vec<(u64, u64)> = Vec::new();
    for &(off, len, h) in &placed {
        let verified = verify(space.store(), &h)?;
        if matches!(verified, Verified::Repaired(_) | Verified::Damaged(..)) {
            suspect.push((off, off + len as u64));
        }
        match verified {
            Verified::Intact => r.chunks_verified += 1,
            Verified::Repaired(rec) => {
                r.chunks_verified += 1;
                r.repaired_chunks += 1;
                r.warning(format!(
                    "chunk {h} at {} ({} bytes) had damaged shards; its bytes were rebuilt \
                     from the other shards (see `ckptfs targets`)",
                    rec.offset.0, rec.stored_len
                ));
            }
            Verified::Gone => {}
            Verified::Damaged(rec, reason) => {
                damaged.insert(
                    h,
                    DamagedChunk {
                        hash: h,
                        offset: rec.offset,
                        stored_len: rec.stored_len,
                        reason,
                        uses: Vec::new(),
                    },
                );
            }
        }
        r.bytes_verified += len as u64;
        done += len as u64;
        progress(done, total);
    }
    if let Some(v) = &view {
        let store = space.store();
        // A segment with findings counts only if gc did not empty it while the pass ran (then
        // its rows may have been written again, and read half-written).
        let mut keep = |seg: u64| still_holds(store, &placed, seg, seg_bytes);
        let rep = v.verify_parity(&live_rows, &mut keep, &mut |d, _| {
            progress(chunk_total + d * row_cost, total)
        });
        parity_warnings(&mut r, &rep, &suspect, seg_bytes, v.redundancy());
        r.parity = Some(rep);
    }
    for h in missing.drain(..) {
        damaged.insert(
            h,
            DamagedChunk {
                hash: h,
                offset: DataOffset(0),
                stored_len: 0,
                reason: Damage::Missing,
                uses: Vec::new(),
            },
        );
    }
    if !damaged.is_empty() {
        audit::collect_uses(&t, &mut damaged)?;
        let mut d: Vec<DamagedChunk> = damaged.into_values().collect();
        d.sort_by_key(|d| (d.offset, d.hash));
        r.damaged = d;
    }
    r.seconds = start.elapsed().as_secs_f64();
    Ok(r)
}

/// Some chunk the snapshot placed in segment `seg` is still committed there: the segment was
/// not emptied and reused since (its rows are never written twice while it holds chunks).
fn still_holds(
    store: &ChunkStore,
    placed: &[(u64, u32, ChunkHash)],
    seg: u64,
    seg_bytes: u64,
) -> bool {
    let from = placed.partition_point(|p| p.0 < seg * seg_bytes);
    placed[from..]
        .iter()
        .take_while(|p| p.0 < (seg + 1) * seg_bytes)
        .any(|&(off, _, h)| match store.committed_record(&h) {
            Ok(Some(rec)) => rec.offset.0 == off,
            Ok(None) => false,
            // Cannot tell: keep what the pass found.
            Err(_) => true,
        })
}

/// Warnings naming the rows whose parity disagrees with their data, with what the chunk pass
/// says of the data and how to restore the redundancy.
fn parity_warnings(
    r: &mut CheckReport,
    rep: &crate::targets::ParityReport,
    suspect: &[(u64, u64)],
    seg_bytes: u64,
    red: crate::targets::Redundancy,
) {
    let m = red.data;
    let row_bytes = (m * crate::targets::BLOCK) as u64;
    for s in &rep.segments {
        let target = |i: usize| s.targets.get(i).copied().flatten();
        let name = |i: usize| match target(i) {
            Some(t) => format!("shard {i} (target {t})"),
            None => format!("shard {i}"),
        };
        let list = |v: &mut dyn Iterator<Item = usize>| v.map(name).collect::<Vec<_>>().join(", ");
        for row in &s.inconsistent {
            let start = s.segment * seg_bytes + row.row * row_bytes;
            let end = start + row_bytes;
            let at = suspect.partition_point(|x| x.1 <= start);
            let bad_data = suspect.get(at).is_some_and(|x| x.0 < end);
            let differ = list(&mut row.parity_shards.iter().copied());
            // What the row says: the shards whose exclusion leaves the others consistent are
            // the damaged ones (a damaged data shard makes every parity shard differ from
            // the data as stored, so the differing parity names nothing by itself); then
            // what the chunk pass says (it sees whole chunks, which span rows).
            let chunks = match bad_data {
                true => "a chunk spanning this row failed its blake3 check (above)",
                false => "every live chunk in the row verified by blake3",
            };
            let verdict = match row.damaged_shards.is_empty() {
                false => format!(
                    "{} holds damaged or stale bytes (the other shards of the row agree with \
                     each other); {chunks}",
                    list(&mut row.damaged_shards.iter().copied())
                ),
                true => format!(
                    "the row cannot tell which shard is damaged (too few shards left to \
                     outvote it); {chunks}"
                ),
            };
            r.warning(format!(
                "segment {} row {}: the stored parity disagrees with the data as stored \
                 (differing parity: {differ}; data: {}): {verdict}. The row survives the loss \
                 of fewer targets than {red} promises until `ckptfs scrub` rewrites it from \
                 verified data",
                s.segment,
                row.row,
                list(&mut (0..m)),
            ));
        }
        let unlisted = s.inconsistent_rows - s.inconsistent.len() as u64;
        if unlisted > 0 {
            r.warning(format!(
                "segment {}: {unlisted} more rows whose parity disagrees with their data",
                s.segment
            ));
        }
    }
}

enum Verified {
    Intact,
    /// Damaged as stored, rebuilt from redundancy (`ChunkStore::repair`).
    Repaired(ChunkRecord),
    /// gc deleted the chunk after the snapshot was taken.
    Gone,
    Damaged(ChunkRecord, Damage),
}

/// Reads a chunk through its current record and verifies it.
fn verify(store: &ChunkStore, h: &ChunkHash) -> Result<Verified> {
    let mut last: Option<ChunkRecord> = None;
    // A failure is only damage when a second look at an unchanged record fails the same way:
    // on a mounted space gc may move a chunk between reading its record and its bytes.
    for _ in 0..3 {
        let Some(rec) = store.committed_record(h)? else {
            return Ok(Verified::Gone);
        };
        let damage = match store.reader().read_as_stored(h, &rec) {
            Err(e) => Some(Damage::Io(e.to_string())),
            Ok(stored) => {
                let seen = stored.unverified_bytes().to_vec();
                match stored.verify() {
                    Ok(_) => None,
                    Err(_) => Some(classify(&rec, &seen)),
                }
            }
        };
        let Some(damage) = damage else {
            return Ok(Verified::Intact);
        };
        if store.reader().repair(*h, rec).is_some() {
            return Ok(Verified::Repaired(rec));
        }
        let same = last.is_some_and(|l| l.offset == rec.offset && l.stored_len == rec.stored_len);
        if same {
            return Ok(Verified::Damaged(rec, damage));
        }
        last = Some(rec);
    }
    let rec = last.expect("set in the loop");
    Ok(Verified::Damaged(
        rec,
        Damage::Io("chunk kept moving while checked".into()),
    ))
}

fn classify(rec: &ChunkRecord, stored: &[u8]) -> Damage {
    match rec.codec {
        Codec::Raw => Damage::HashMismatch,
        _ => match crate::codec::decode(rec.codec, stored.to_vec(), rec.raw_len as usize) {
            Err(ChunkDamage::Decode(why)) => Damage::Decode(why),
            Err(ChunkDamage::HashMismatch) => Damage::HashMismatch,
            Ok(_) => Damage::HashMismatch,
        },
    }
}
