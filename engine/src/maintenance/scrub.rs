//! `ckptfs scrub` and the repair half of `ckptfs rebuild` on a space over several targets:
//! segment by segment, the erasure placement verifies every committed chunk by blake3
//! before it encodes anything from it (`targets::repair`), rebuilds shards on failed targets
//! onto healthy ones, and rewrites in place what it finds damaged, stale or unreadable on
//! the others. `rebuild` visits the segments with shards on failed targets or found
//! unreadable or damaged since the mount; `scrub` visits every segment.
//!
//! Where the chunks are comes from one read snapshot per batch of segments. While a segment
//! is repaired gc is held off (its turn, `GcState::turn`), so none of its chunks moves and it is not freed;
//! if a gc ran since the snapshot (`GcState::epoch`), the snapshot is taken again first. A segment
//! that held chunks not committed yet when its snapshot was taken (the store's
//! `uncommitted_segments`, asked before the snapshot) may hold chunks the snapshot lacks, so
//! nothing in it is rewritten in place (its rows are still copied to new shards). The
//! segment being filled is not such a segment by itself: its rows on disk are final.
//!
//! Memory: one u32 per segment (the chunk counts that cut the work into batches), and per
//! batch one entry (about 60 bytes) per chunk, at most `REPAIR_BATCH_CHUNKS` (beyond that a
//! batch is one segment); plus the erasure placement's window (`targets::REPAIR_ROWS`).

use crate::chunk::StoredRef;
use crate::device::{Device, FileDevice};
use crate::error::{Error, Result};
use crate::format::*;
use crate::space::{
    existing_ancestor, free_disk_bytes, open_private, preallocate, store_table, sync_dir, Space,
};
use crate::targets::TargetSpec;
use crate::targets::{RebuildReport, SegmentChunk, SegmentJob, Throttle};
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;

/// Chunk entries one batch of segments holds (about 60 bytes each: 15 MiB).
pub(crate) const REPAIR_BATCH_CHUNKS: usize = 1 << 18;

/// Which segments a repair pass visits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Visit {
    /// Those with shards on failed targets (or placed short), or found unreadable or
    /// damaged since the mount: `ckptfs rebuild`.
    Rebuild,
    /// Every placed segment: `ckptfs scrub`.
    Scrub,
}

/// Why `rebuild --replace OLD=NEW` is refused on a space of several slots (the CLI says it
/// before asking a daemon, whose control interface answers only an errno).
pub fn replace_refused_on_shared(old: &str, new: &Path) -> Error {
    Error::Invalid(format!(
        "rebuild --replace {old}={} is not supported on a space shared by several nodes: \
         every node would have to open the new target first. Run `ckptfs rebuild` without \
         --replace on every node's mount (each re-places its own segments' shards on the \
         healthy targets)",
        new.display()
    ))
}

/// A committed chunk of a batch: where it is and how to verify it.
#[derive(Clone, Copy)]
struct Entry {
    seg: u64,
    chunk: SegmentChunk,
    hash: ChunkHash,
    rec: ChunkRecord,
}

impl Space {
    /// `ckptfs rebuild`: restores full redundancy of a space over several targets (see
    /// `Erasure::rebuild`). With `replace` (OLD: a target's index or directory; NEW: an
    /// empty or new directory, `DIR[:domain=LABEL]`, by default in OLD's domain), NEW is
    /// formatted as a new target first and OLD retired, so OLD's shards move to NEW.
    pub fn rebuild(
        &self,
        replace: Option<(&str, &TargetSpec)>,
        throttle_bytes_s: Option<f64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<crate::targets::RebuildReport> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        let Some(er) = self.report().erasure() else {
            return Err(Error::OneTarget);
        };
        if let Some((old, new)) = replace {
            if self.slots().is_shared() {
                // Every node would have to open the new target before any shard lands on
                // it; nodes learn the targets only when they mount.
                return Err(replace_refused_on_shared(old, &new.path));
            }
            let table = self.targets_table().ok_or(Error::OneTarget)?;
            let old_i = er.find_target(old).ok_or_else(|| {
                Error::Invalid(format!(
                    "no target {old}: give its index or its directory (`ckptfs targets` \
                     lists them)"
                ))
            })?;
            let mut t = table.lock();
            let mut spec = new.clone();
            if spec.domain.is_empty() {
                spec.domain = er.domain_of(old_i);
            }
            if t.targets.iter().any(|x| x.path == spec.path) {
                return Err(Error::Invalid(format!(
                    "{} is already a target of this space",
                    spec.path.display()
                )));
            }
            if spec.path.exists() {
                let busy = !spec.path.is_dir() || fs::read_dir(&spec.path)?.next().is_some();
                if busy {
                    return Err(Error::Invalid(format!(
                        "{} is not an empty directory; a replacement target must be new",
                        spec.path.display()
                    )));
                }
            }
            let existing = existing_ancestor(&spec.path);
            let free = free_disk_bytes(existing)?;
            if t.target_file_bytes() > free {
                return Err(Error::Invalid(format!(
                    "{} needs {} bytes for the target file; its disk has {free} free",
                    spec.path.display(),
                    t.target_file_bytes()
                )));
            }
            let index = t.targets.len();
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&spec.path)?;
            let path = spec.path.join(crate::targets::TARGET_FILE);
            let f = open_private(&path, true)?;
            preallocate(&f, t.target_file_bytes())?;
            let h = crate::targets::TargetHeader {
                space_uuid: self.superblock().uuid,
                index: index as u16,
                shard_bytes: t.shard_bytes,
                slots: t.slots,
            };
            {
                use std::os::unix::fs::FileExt;
                f.write_all_at(&h.encode(), 0)?;
            }
            f.sync_all()?;
            sync_dir(&spec.path)?;
            // The table names the new target before any shard lands on it.
            t.targets.push(spec.clone());
            t.failed.push(false);
            t.mirror.push(false);
            store_table(self.dir(), &mut t)?;
            drop(t);
            let added = er.add_target(crate::targets::Target::new(
                spec.path.clone(),
                spec.domain.clone(),
                h.slots,
                Ok(Arc::new(FileDevice::new_direct(f)?) as Arc<dyn Device>),
            ));
            log::info!(
                "target {added} ({}) added to replace target {old_i}",
                spec.path.display()
            );
            er.retire(
                old_i,
                &format!("replaced by target {added} ({})", spec.path.display()),
            );
        }
        self.repair(Visit::Rebuild, throttle_bytes_s, progress)
    }

    /// `ckptfs scrub`: reads every segment of a space over several targets, verifies every
    /// committed chunk, and repairs what redundancy allows (see the module comment).
    /// `throttle_bytes_s` caps what it writes; `progress(segments done, segments)`.
    pub fn scrub(
        &self,
        throttle_bytes_s: Option<f64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<RebuildReport> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        if self.report().erasure().is_none() {
            return Err(Error::OneTarget);
        }
        let mut rep = self.repair(Visit::Scrub, throttle_bytes_s, progress)?;
        self.verify_mirrors(&mut rep);
        Ok(rep)
    }

    /// The repair pass behind `rebuild` and `scrub`.
    pub(crate) fn repair(
        &self,
        visit: Visit,
        throttle_bytes_s: Option<f64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<RebuildReport> {
        let er = self.report().erasure().ok_or(Error::OneTarget)?.clone();
        let start = std::time::Instant::now();
        let seg_bytes = u64::from(self.superblock().segment_bytes);
        let range = self.segment_range();
        let segments = range.end - range.start;
        let mut rep = RebuildReport::default();
        let mut throttle = Throttle::new(throttle_bytes_s);
        // A target suspect as a whole: a rebuild visits every segment with a shard on it
        // (`needs_rebuild`), so, as after a scrub, it is judged by what the pass finds.
        let whole_before = er.any_whole_suspect();
        // Chunks per segment, to cut the pass into batches of bounded memory.
        let mut counts = vec![0u32; segments as usize];
        self.reader()?.for_each_chunk(|_, c| {
            let s = c.offset.0 / seg_bytes;
            if range.contains(&s) {
                let n = &mut counts[(s - range.start) as usize];
                *n = n.saturating_add(1);
            }
            Ok(())
        })?;
        let mut first = range.start;
        while first < range.end {
            let mut last = first + 1;
            let mut total = counts[(first - range.start) as usize] as usize;
            while last < range.end {
                let n = counts[(last - range.start) as usize] as usize;
                if total + n > REPAIR_BATCH_CHUNKS {
                    break;
                }
                total += n;
                last += 1;
            }
            self.repair_batch(&er, visit, first..last, &mut rep, &mut throttle)?;
            progress(last - range.start, segments);
            first = last;
        }
        if self.renew_manifest(&er, visit == Visit::Scrub)? {
            log::info!("{visit:?}: the slot's manifest was written afresh on healthy targets");
        }
        if visit == Visit::Scrub || (whole_before && rep.is_whole()) {
            er.repair_pass_done();
        }
        er.forget_repaired_cuts();
        rep.seconds = start.elapsed().as_secs_f64();
        let level = match rep.is_whole() && rep.chunks_repaired + rep.blocks_rewritten == 0 {
            true => log::Level::Info,
            false => log::Level::Warn,
        };
        log::log!(
            level,
            "{}: {} chunks verified, {} repaired from the other shards, {} lost; {} shard \
             blocks rewritten in place, {} shards rebuilt onto other targets in {:.1} s",
            match visit {
                Visit::Rebuild => "rebuild",
                Visit::Scrub => "scrub",
            },
            rep.chunks_verified,
            rep.chunks_repaired,
            rep.chunks_lost,
            rep.blocks_rewritten,
            rep.shards_written,
            rep.seconds
        );
        Ok(rep)
    }

    /// Repairs segments `segs` from one snapshot of their chunks, taken again whenever a gc
    /// ran meanwhile.
    fn repair_batch(
        &self,
        er: &crate::targets::Erasure,
        visit: Visit,
        segs: std::ops::Range<u64>,
        rep: &mut RebuildReport,
        throttle: &mut Throttle,
    ) -> Result<()> {
        let seg_bytes = u64::from(self.superblock().segment_bytes);
        let mut next = segs.start;
        'snapshot: while next < segs.end {
            let epoch = self.gc_state().epoch();
            // Taken before the snapshot: a segment with no uncommitted chunk then had every
            // chunk it holds on disk committed, so the snapshot has them all.
            let busy_then: BTreeSet<SegmentId> = self.store().uncommitted_segments();
            let mut entries: Vec<Entry> = Vec::new();
            self.reader()?.for_each_chunk(|hash, rec| {
                let seg = rec.offset.0 / seg_bytes;
                let offset = rec.offset.0 % seg_bytes;
                // A record reaching past its segment is `check`'s to report.
                if (next..segs.end).contains(&seg) && offset + rec.stored_len as u64 <= seg_bytes {
                    entries.push(Entry {
                        seg,
                        chunk: SegmentChunk {
                            offset,
                            len: rec.stored_len,
                        },
                        hash,
                        rec,
                    });
                }
                Ok(())
            })?;
            entries.sort_unstable_by_key(|e| (e.seg, e.chunk.offset));
            while next < segs.end {
                let seg = next;
                let from = entries.partition_point(|e| e.seg < seg);
                let to = entries.partition_point(|e| e.seg <= seg);
                let mine = &entries[from..to];
                let wanted = match visit {
                    Visit::Rebuild => er.needs_rebuild(seg),
                    Visit::Scrub => er.is_placed(seg),
                };
                if !wanted {
                    next += 1;
                    continue;
                }
                let _no_gc = self.gc_state().turn();
                if self.gc_state().epoch() != epoch {
                    continue 'snapshot;
                }
                let busy = busy_then.contains(&SegmentId(seg))
                    || self
                        .store()
                        .uncommitted_segments()
                        .contains(&SegmentId(seg));
                let chunks: Vec<SegmentChunk> = mine.iter().map(|e| e.chunk).collect();
                let job = SegmentJob {
                    seg,
                    chunks: &chunks,
                    busy,
                };
                let mut verify = |i: usize, bytes: &[u8]| {
                    let e = &mine[i];
                    StoredRef::new(e.hash, e.rec, bytes).verify_raw().is_ok()
                };
                er.repair_segment(&job, &mut verify, rep, throttle)?;
                next += 1;
            }
        }
        Ok(())
    }
}
