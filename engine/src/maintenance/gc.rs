//! Garbage collection: plan, then apply, in four steps, each its own transaction.
//!
//! 1. Drop revisions outside the retention policy (and retired histories and unlinked inodes
//!    that nothing holds). Chunks whose reference count reaches zero are queued in the
//!    GC_CANDIDATES table.
//! 2. Under the store's exclusive barrier (no chunk lookup or pin in flight), delete the
//!    queued chunk records that are still unreferenced and unpinned.
//! 3. Compact: copy the chunks of mostly-dead segments to free segments, then, under the
//!    barrier, point their records at the copies and mark the old segments free.
//! 4. Segments become reusable only after the commit freeing them is durable and every chunk
//!    lookup that might still see the old location has finished.
//!
//! Memory: one u64 of live bytes per segment of the data file, plus the records of the chunks
//! being moved in one round (at most `ROUND_SEGMENTS` segments). Everything else streams from
//! the metadata table.
//!
//! Every gc is a plan applied (`GcPlan`): retention's decisions (`retention::decide`, a pure
//! function tested table by table) are taken once, over one read snapshot of the catalog and
//! outside the table's one writer, so closes keep committing while gc reads every history.
//! `ckptfs gc --dry-run` prints that plan with what it frees (`GcPlan::report`); gc applies
//! the very plan (`Space::run_gc`), where the space may only veto: a revision pinned or made
//! current since the plan is kept and counted (`GcReport::planned_kept`), nothing outside the
//! plan is dropped. Compaction is planned by one function (`compaction_plan`) over the
//! segments' usage: the dry run over the usage the plan's frees leave, gc over the usage
//! after it freed them, so on a space nobody writes to the dry run's figures are gc's. Under
//! pressure (a writer waiting for room) gc plans again after each pass, as the room it made
//! changes what is worth copying next.

use crate::catalog::{Config, Reader, Txn};
use crate::error::{Corruption, Error, Missing, Result};
use crate::format::*;
use crate::space::{GcTotals, Space};
use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

/// Segments compacted per round (bounds the records held in memory while copying).
pub(crate) const ROUND_SEGMENTS: usize = 16;
/// A segment is compacted when less than this fraction of it holds live chunks (without
/// space pressure; see `GcOptions::pressure`).
pub(crate) const COMPACT_LIVE_FRACTION: f64 = 0.5;
/// Under pressure, compaction copies a segment's live bytes only if they are at most this
/// many times the bytes emptying it frees (the segment is at most 75% live), so every byte
/// gc writes buys back at least a third of a byte. Three is what the 75% rule needs: on a
/// space whose kept bytes fit in 75% of it, the emptiest used segment is at most 75% live.
/// Before this bound every segment with one dead byte qualified, and a full space of live
/// data was copied over and over for the few KiB of padding each copy freed (issue 36:
/// gigabytes a minute, for as long as it stayed mounted).
pub(crate) const PRESSURE_COPY_PER_FREED: u64 = 3;
/// The automatic gc (free space below the watermark, no writer waiting) copies at most one
/// byte per byte it frees: it makes room ahead of writers, and is not worth more wear.
pub const AUTO_COPY_PER_FREED: u64 = 1;
/// The trash entries (removed files' histories) one gc looks at at a time, oldest removal
/// first: bounds the memory of choosing which to empty (about 32 bytes each).
pub(crate) const TRASH_BATCH: usize = 4096;
/// Compaction passes one gc runs under space pressure at most.
pub(crate) const PRESSURE_PASSES: usize = 64;

/// How long segments gc emptied in a slot of a multi-slot space stay unused (unless a writer
/// needs the room): longer than other nodes take to read the manifest gc publishes.
pub(crate) const REMOTE_READ_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The automatic gc's first wait after a run that left free space below the watermark, and
/// the longest: each such run doubles it, a run that reaches the watermark ends it. A run
/// that finds nothing still reads the whole chunk table and commits twice; on a space full
/// of live data, retrying every tick would do that four times a second for nothing.
pub(crate) const AUTO_BACKOFF_FIRST: Duration = Duration::from_secs(15);
pub(crate) const AUTO_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// When the automatic gc may run again (see `AUTO_BACKOFF_FIRST`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    /// Not before this (None: now).
    until: Option<Instant>,
    /// The current wait (zero after a run that reached its goal).
    wait: Duration,
}

impl Backoff {
    pub fn ready(&self, now: Instant) -> bool {
        self.until.is_none_or(|t| now >= t)
    }

    /// A run ended at `now`; `reached` says whether it left free space at its goal.
    pub fn record(&mut self, now: Instant, reached: bool) {
        if reached {
            *self = Backoff::default();
            return;
        }
        self.wait = match self.wait.is_zero() {
            true => AUTO_BACKOFF_FIRST,
            false => (self.wait * 2).min(AUTO_BACKOFF_MAX),
        };
        self.until = Some(now + self.wait);
    }

    /// The wait now in force (zero when none).
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

#[derive(Clone, Debug, Default)]
pub struct GcOptions {
    pub dry_run: bool,
    /// Revisions open readers or writers are using; never dropped.
    pub pinned_revisions: HashSet<RevisionId>,
    /// Inodes with open handles or held by the kernel (looked up, not yet forgotten); an
    /// unlinked one keeps its record and the revision it reads.
    pub open_inodes: HashSet<InodeId>,
    /// When set, compaction sleeps this fraction of the time it works (0.5 = run at most
    /// two thirds of the time), so writers keep most of the disk.
    pub throttle: Option<f64>,
    /// Space pressure (a writer waiting for room, free space below the auto-gc watermark):
    /// compact every segment with dead bytes, emptiest first, round after round, using gc's
    /// reserve segment, instead of only mostly-dead segments.
    pub pressure: bool,
    /// Under pressure, stop compacting once this many bytes are free (0: never stop early).
    /// With a goal, gc also empties the trash (the kept revisions of removed files), oldest
    /// removal first, whatever `keep_unlinked` says, when what compaction can free cheaply
    /// does not reach the goal: `keep_unlinked` protects removed files only while there is
    /// room.
    pub room_goal_bytes: u64,
    /// Under pressure: the most live bytes compaction copies per byte it frees (None:
    /// `PRESSURE_COPY_PER_FREED`). Without pressure a segment must be less than half live.
    pub copy_per_freed: Option<u64>,
    /// Empty the whole trash now (`ckptfs gc --empty-trash`): removed files keep only the
    /// revisions open handles read.
    pub empty_trash: bool,
}

impl GcTotals {
    fn add(&mut self, r: &GcReport) {
        self.runs += 1;
        self.revisions_dropped += r.revisions_dropped;
        self.bytes_freed += r.bytes_freed;
        self.bytes_copied += r.bytes_copied;
        self.seconds += r.seconds;
    }
}

/// What a gc did (or, with `dry_run`, would do). Its JSON form (serde, field names as here)
/// is what the daemon answers and `ckptfs gc --json` prints.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GcReport {
    pub dry_run: bool,
    pub revisions_dropped: u64,
    /// Of `revisions_dropped`: revisions of removed files dropped before `keep_unlinked` ran
    /// out, to make room (or by `--empty-trash`).
    #[serde(default)]
    pub trash_revisions_dropped: u64,
    pub histories_dropped: u64,
    /// Revisions the plan dropped that gc kept when applying it: pinned (opened), restored
    /// or made current between the plan and its application.
    #[serde(default)]
    pub planned_kept: u64,
    pub inodes_dropped: u64,
    pub chunks_freed: u64,
    /// Stored bytes of the chunks freed.
    pub bytes_freed: u64,
    /// Live bytes copied out of compacted segments.
    pub bytes_copied: u64,
    pub segments_compacted: u64,
    /// Segments returned to the free list (compacted or found empty).
    pub segments_freed: u64,
    pub free_bytes_before: u64,
    pub free_bytes_after: u64,
    pub seconds: f64,
}

/// Progress of a running gc, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub enum GcProgress {
    Revisions { histories_done: u64, histories: u64 },
    Chunks { done: u64, total: u64 },
    Compact { segments_done: u64, segments: u64 },
}

impl Space {
    /// gc: plans (`gc_plan`) and, unless `opts.dry_run`, applies that plan (`run_gc`). The
    /// revisions pinned now (`Space::pin`) are sampled under the pin gate when planning and
    /// again right before the drops commit, and kept, with the pins in `opts`.
    pub fn gc(&self, opts: &GcOptions, progress: &mut dyn FnMut(GcProgress)) -> Result<GcReport> {
        if opts.dry_run {
            return Ok(self.gc_plan(opts, true, progress)?.report);
        }
        // One gc at a time, from its plan to the end of its application: a second gc plans
        // against what the first left.
        let _one = self.gc_state().turn();
        let plan = self.gc_plan(opts, false, progress)?;
        let r = self.run_gc(&plan, opts, progress)?;
        self.gc_state().totals().add(&r);
        Ok(r)
    }

    fn run_gc(
        &self,
        plan: &GcPlan,
        opts: &GcOptions,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<GcReport> {
        // Chunks may move and segments be freed from here on (see `scrub`).
        self.gc_state().begin_moves();
        self.store().release_due(opts.pressure);
        if self.store().is_failed() {
            return Err(Error::Failed);
        }
        let start = Instant::now();
        let mut r = GcReport {
            free_bytes_before: self.store().free_bytes(),
            ..GcReport::default()
        };
        let back = self.store().reclaim_unrecorded();
        if !back.is_empty() {
            log::info!(
                "gc: {} segments of uncommitted, abandoned chunks are free again",
                back.len()
            );
        }
        let (config, now) = (plan.config, plan.now);

        // 1. Apply the plan's drops. The next transaction begins before the pin gate opens
        // again, as it always has: nothing commits between the two.
        let txn = {
            let _gate = self.pins().gate_for_gc();
            let mut opts = opts.clone();
            self.sample_pins(&mut opts.pinned_revisions, &mut opts.open_inodes)?;
            let txn = self.begin_write(true)?;
            self.apply_retention(&mut Txn::open(&txn)?, &config, now, &opts, plan, &mut r)?;
            self.commit(txn)?;
            self.begin_write(true)?
        };

        // 2. Delete unreferenced, unpinned chunks.
        {
            let _excl = self.store().exclusive();
            self.delete_dead_chunks(&mut Txn::open(&txn)?, &mut r, progress)?;
            self.commit(txn)?;
        }

        // 2b. Short of room: the trash, oldest removal first, before copying live bytes.
        if opts.pressure && opts.room_goal_bytes > 0 {
            self.room_from_trash(opts, &mut r, progress)?;
        }

        // 3 and 4. Compact in rounds until no victim is left or no room to copy into.
        self.compact(opts, &mut r, progress)?;
        r.free_bytes_after = self.store().free_bytes();
        r.seconds = start.elapsed().as_secs_f64();
        // A gc that found nothing is not news: under a full space every waiting write asks.
        let level = if r.revisions_dropped + r.chunks_freed + r.segments_freed > 0 {
            log::Level::Info
        } else {
            log::Level::Debug
        };
        log::log!(
            level,
            "gc: dropped {} revisions, freed {} chunks ({} bytes), copied {} bytes, freed {} segments in {:.2}s",
            r.revisions_dropped,
            r.chunks_freed,
            r.bytes_freed,
            r.bytes_copied,
            r.segments_freed,
            r.seconds
        );
        Ok(r)
    }

    /// Samples the pins (the caller holds the pin gate exclusively) and adds the revision
    /// that every unlinked inode among the open and held ones reads: an open handle pins its
    /// revision itself, but an inode the kernel only holds (looked up before a rename over
    /// its name, an `O_PATH` descriptor) is opened by number later and must find its bytes,
    /// which retention no longer counts as its history's current revision once the name
    /// is gone. Bound: one catalog read per open or held inode.
    fn sample_pins(
        &self,
        revs: &mut HashSet<RevisionId>,
        inos: &mut HashSet<InodeId>,
    ) -> Result<()> {
        self.pins().sample(revs, inos);
        let r = self.reader()?;
        for ino in inos.iter() {
            if let Some(rec) = r.inode(*ino)? {
                if rec.nlink == 0 && rec.current_rev.0 != 0 {
                    revs.insert(rec.current_rev);
                }
            }
        }
        Ok(())
    }

    /// Drops what `plan` drops, as far as the space allows now: a history's planned
    /// revisions are dropped only where retention, asked again with the pins sampled now and
    /// the history as it is now, still lets them go (a revision pinned, restored or made
    /// current since the plan stays, counted in `planned_kept`); a history goes only if the
    /// plan said so and nothing of it is left; a planned dead inode only if it still is
    /// (unlinked, nobody holding it). Nothing outside the plan is touched, and only the
    /// planned histories are read: the full walk was the plan's, on a read snapshot.
    fn apply_retention(
        &self,
        t: &mut Txn,
        config: &Config,
        now: Timestamp,
        opts: &GcOptions,
        plan: &GcPlan,
        r: &mut GcReport,
    ) -> Result<()> {
        for d in &plan.drops {
            let Some((id, h)) = t.history_from(d.history)? else {
                r.planned_kept += d.revisions.len() as u64;
                continue;
            };
            if id != d.history {
                r.planned_kept += d.revisions.len() as u64;
                continue;
            }
            let facts = history_facts(
                &h,
                |ino| t.get_inode(ino),
                t.history_revisions(d.history)?,
                |x| t.revision(x),
            )?;
            let now_says = match d.trash > 0 && opts.empty_trash {
                true => retention::empty(&opts.pinned_revisions, &facts),
                false => retention::decide(config, now, &opts.pinned_revisions, &facts),
            };
            let mut dropped = 0usize;
            for rev in d.revisions.iter().filter(|x| now_says.drop.contains(x)) {
                t.drop_revision(*rev)?;
                dropped += 1;
            }
            r.revisions_dropped += dropped as u64;
            r.trash_revisions_dropped += (d.trash as usize).min(dropped) as u64;
            r.planned_kept += (d.revisions.len() - dropped) as u64;
            if d.drop_history && now_says.drop_history && dropped == facts.revisions.len() {
                t.remove_history(d.history)?;
                r.histories_dropped += 1;
            }
        }
        // Unlinked inodes nobody has open: their content lives on in their (retired) history.
        for ino in &plan.dead_inodes {
            let dead = t.get_inode(*ino)?.is_some_and(|rec| rec.nlink == 0);
            if dead && !opts.open_inodes.contains(ino) {
                t.remove_inode(*ino)?;
                r.inodes_dropped += 1;
            }
        }
        Ok(())
    }

    fn delete_dead_chunks(
        &self,
        t: &mut Txn,
        r: &mut GcReport,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<()> {
        // Unreferenced but pinned by an uncommitted file state (a dedup hit): stays queued
        // (see `Txn::delete_dead_chunks`).
        let mut last = (0, 0);
        let (freed, bytes) = t.delete_dead_chunks(
            |h| self.store().is_pinned(h),
            |done, total| {
                last = (done, total);
                if done.is_multiple_of(4096) {
                    progress(GcProgress::Chunks { done, total });
                }
            },
        )?;
        r.chunks_freed += freed;
        r.bytes_freed += bytes;
        progress(GcProgress::Chunks {
            done: last.0,
            total: last.1,
        });
        Ok(())
    }

    /// The most live bytes a segment may hold to be compacted: without pressure less than
    /// `COMPACT_LIVE_FRACTION` of it; under pressure at most `copy_per_freed` times what
    /// emptying it frees. Never a whole segment: a segment without a dead byte frees nothing.
    fn max_live(&self, opts: &GcOptions) -> u64 {
        max_live_bytes(self.store().segment_bytes(), opts)
    }

    /// Segments worth compacting (at most `max_live` live), emptiest first, as many as fit
    /// in the free space.
    /// `need`: under pressure, stop choosing once the victims free this many bytes more than
    /// their copies take (0: no limit), so a gc that wants room copies no more than it must.
    fn victims(
        &self,
        u: &SegmentUsage,
        busy: &BTreeSet<SegmentId>,
        opts: &GcOptions,
        need: u64,
    ) -> Vec<(SegmentId, u64)> {
        let seg = self.store().segment_bytes();
        let range = self.segment_range();
        let limit = self.max_live(opts);
        let mut v: Vec<(SegmentId, u64)> = u
            .live
            .iter()
            .enumerate()
            .map(|(i, l)| (SegmentId(i as u64), *l))
            // Only this slot's chunk segments: below them lie other slots' shares and this
            // slot's manifest area, which hold no chunk record of this table and must never
            // be taken for empty segments.
            .filter(|(i, _)| range.contains(&i.0))
            .filter(|(i, l)| !u.free.contains(i) && !busy.contains(i) && *l <= limit)
            .collect();
        v.sort_by_key(|(i, l)| (*l, *i));
        // Copies may use every free byte, gc's reserve included: writers cannot take the
        // reserve, and every victim frees more than its copies take.
        let mut room = self.store().free_bytes();
        let mut gained = 0u64;
        v.retain(|(_, l)| {
            if (need > 0 && gained >= need) || *l > room {
                return false;
            }
            room -= l;
            gained += seg - l;
            true
        });
        v
    }

    /// Under pressure, short of `room_goal_bytes`: empties the trash (the kept revisions of
    /// removed files), oldest removal first, batch by batch, while what is free plus what
    /// compaction may free within its copy bound falls short of the goal. Emptying before
    /// compacting means gc frees the bytes removed files hold instead of copying live bytes
    /// to scrape together room a removal already gave.
    fn room_from_trash(
        &self,
        opts: &GcOptions,
        r: &mut GcReport,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<()> {
        let goal = opts.room_goal_bytes;
        let seg = self.store().segment_bytes();
        loop {
            let free = self.store().free_bytes();
            if free >= goal {
                return Ok(());
            }
            let usage = self.segment_usage_now()?;
            let busy = self.store().busy_segments();
            let cheap: u64 = self
                .victims(&usage, &busy, opts, 0)
                .iter()
                .map(|(_, live)| seg - live)
                .sum();
            if free + cheap >= goal {
                return Ok(());
            }
            if !self.drop_trash(opts, goal - free - cheap, r)? {
                return Ok(());
            }
            let txn = self.begin_write(true)?;
            let _excl = self.store().exclusive();
            self.delete_dead_chunks(&mut Txn::open(&txn)?, r, progress)?;
            self.commit(txn)?;
        }
    }

    /// Drops removed files' revisions (all but the pinned ones), oldest removal first, until
    /// the dropped revisions had stored `need` bytes when written (`new_stored_bytes`: an
    /// estimate, as dedup may share their chunks with what stays; the caller measures and
    /// comes back for more). Returns whether it dropped anything.
    fn drop_trash(&self, opts: &GcOptions, need: u64, r: &mut GcReport) -> Result<bool> {
        let oldest = self.trash_oldest(TRASH_BATCH)?;
        if oldest.is_empty() {
            return Ok(false);
        }
        let _gate = self.pins().gate_for_gc();
        let mut pinned = opts.pinned_revisions.clone();
        let mut open = opts.open_inodes.clone();
        self.sample_pins(&mut pinned, &mut open)?;
        let txn = self.begin_write(true)?;
        let mut dropped = 0u64;
        let mut freed_estimate = 0u64;
        {
            let mut t = Txn::open(&txn)?;
            for (_, hid) in oldest {
                if dropped > 0 && freed_estimate >= need {
                    break;
                }
                // Re-read under this transaction: a restore may have brought it back.
                let Some((id, h)) = t.history_from(hid)? else {
                    continue;
                };
                if id != hid || h.unlinked.is_none() {
                    continue;
                }
                let facts = history_facts(
                    &h,
                    |ino| t.get_inode(ino),
                    t.history_revisions(hid)?,
                    |x| t.revision(x),
                )?;
                let d = retention::empty(&pinned, &facts);
                for rev in &d.drop {
                    if let Some((_, rr)) = facts.revisions.iter().find(|(x, _)| x == rev) {
                        freed_estimate += rr.new_stored_bytes;
                    }
                    t.drop_revision(*rev)?;
                    dropped += 1;
                }
                if d.drop_history {
                    t.remove_history(hid)?;
                    r.histories_dropped += 1;
                }
            }
        }
        self.commit(txn)?;
        r.revisions_dropped += dropped;
        r.trash_revisions_dropped += dropped;
        if dropped > 0 {
            log::info!(
                "gc: space short: emptied {dropped} revisions of removed files from the trash \
                 (about {freed_estimate} bytes), oldest removal first"
            );
        }
        Ok(dropped > 0)
    }

    /// The trash: removed files' histories with revisions left, oldest removal first, at
    /// most `limit` of them (the oldest).
    fn trash_oldest(&self, limit: usize) -> Result<Vec<(Timestamp, HistoryId)>> {
        let snap = self.reader()?;
        // A max-heap of the oldest `limit` seen: the newest of them goes when it overflows.
        let mut heap: std::collections::BinaryHeap<((i64, u32), u64)> = Default::default();
        snap.for_each_history(|hid, h| {
            let Some(when) = h.unlinked else {
                return Ok(());
            };
            if snap.history_revisions(hid)?.is_empty() {
                return Ok(());
            }
            heap.push(((when.secs, when.nanos), hid.0));
            if heap.len() > limit {
                heap.pop();
            }
            Ok(())
        })?;
        let mut v: Vec<(Timestamp, HistoryId)> = heap
            .into_iter()
            .map(|((secs, nanos), h)| (Timestamp { secs, nanos }, HistoryId(h)))
            .collect();
        v.sort_by_key(|(t, h)| ((t.secs, t.nanos), h.0));
        Ok(v)
    }

    /// Compacts; under pressure pass after pass (each re-planned against the space as it
    /// is then, since every pass makes room for the next) until a pass frees nothing, at
    /// most `PRESSURE_PASSES`.
    fn compact(
        &self,
        opts: &GcOptions,
        r: &mut GcReport,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<()> {
        for _ in 0..if opts.pressure { PRESSURE_PASSES } else { 1 } {
            let before = r.segments_freed;
            self.compact_pass(opts, r, progress)?;
            if r.segments_freed == before
                || (opts.room_goal_bytes > 0 && self.store().free_bytes() >= opts.room_goal_bytes)
            {
                break;
            }
        }
        Ok(())
    }

    fn compact_pass(
        &self,
        opts: &GcOptions,
        r: &mut GcReport,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<()> {
        let usage = self.segment_usage_now()?;
        let busy = self.store().busy_segments();
        let need = if opts.pressure && opts.room_goal_bytes > 0 {
            let free = self.store().free_bytes();
            if free >= opts.room_goal_bytes {
                return Ok(());
            }
            opts.room_goal_bytes - free
        } else {
            0
        };
        let all = self.victims(&usage, &busy, opts, need);
        let total = all.len() as u64;
        log::debug!(
            "gc: compaction pass{}: {} segments free ({} bytes), {} busy, {} victims with {} live bytes",
            if opts.pressure { " under pressure" } else { "" },
            usage.free.len(),
            self.store().free_bytes(),
            busy.len(),
            total,
            all.iter().map(|(_, l)| l).sum::<u64>()
        );
        let mut done = 0u64;
        for round in all.chunks(ROUND_SEGMENTS) {
            let t0 = Instant::now();
            let segs: BTreeSet<SegmentId> = round.iter().map(|(s, _)| *s).collect();
            // Records of the chunks to move, from a consistent snapshot.
            let mut moving: Vec<(ChunkHash, ChunkRecord)> = Vec::new();
            self.reader()?.for_each_chunk(|h, rec| {
                if segs.contains(&self.store().segment_of(rec.offset)) {
                    moving.push((h, rec));
                }
                Ok(())
            })?;
            // Victim by victim, emptiest first: a round cut short by writers taking the room
            // it planned on still empties, and frees, its first victims.
            let order: std::collections::HashMap<SegmentId, usize> = round
                .iter()
                .enumerate()
                .map(|(k, (seg, _))| (*seg, k))
                .collect();
            moving.sort_by_key(|(_, rec)| {
                (order[&self.store().segment_of(rec.offset)], rec.offset.0)
            });
            let mut moves = Vec::with_capacity(moving.len());
            let mut unmovable = BTreeSet::new();
            let mut out_of_room = false;
            for (h, rec) in &moving {
                if out_of_room {
                    unmovable.insert(self.store().segment_of(rec.offset));
                    continue;
                }
                // Never copy damage forward: a chunk that fails its check stays where it is
                // (its segment is not freed), for `ckptfs check` to report.
                let checked = match self.store().reader().read_stored(h, rec)?.check() {
                    Ok(c) => c,
                    Err(e) => {
                        log::error!("gc: not moving damaged chunk: {e}");
                        unmovable.insert(self.store().segment_of(rec.offset));
                        continue;
                    }
                };
                let new = match self.store().append_stored(&checked) {
                    Ok(new) => new,
                    // Writers took the room this round planned on (they share the segment
                    // being filled, and may take free segments down to gc's reserve): keep
                    // what was copied, leave the rest where it is, commit, and let the next
                    // pass plan against the space as it is then.
                    Err(Error::NoSpace) => {
                        out_of_room = true;
                        unmovable.insert(self.store().segment_of(rec.offset));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                r.bytes_copied += checked.bytes().len() as u64;
                moves.push((*h, rec.offset, new));
            }
            self.store().flush_sync()?;
            let taken = self.store().taken_segments();
            let freed: Vec<SegmentId> = {
                let _excl = self.store().exclusive();
                // Pins taken since the round started keep their segments.
                let busy_now = self.store().busy_segments();
                let freed: Vec<SegmentId> = segs
                    .iter()
                    .copied()
                    .filter(|s| !busy_now.contains(s) && !unmovable.contains(s))
                    .collect();
                let txn = self.begin_write(true)?;
                {
                    let mut t = Txn::open(&txn)?;
                    for (h, old, new) in &moves {
                        t.move_chunk(h, *old, *new)?;
                    }
                    t.mark_taken(&taken)?;
                    t.mark_free(&freed)?;
                }
                self.commit(txn)?;
                self.store().recorded_taken(&taken);
                // Still under the barrier: open files' pins of moved chunks follow them.
                self.store().relocate_pinned(&moves);
                freed
            };
            if self.slots().union().is_some() {
                // Other nodes read this slot's chunks at their published places: the new
                // places are published before any old one may be written again, so a
                // reader that meets other bytes there (its blake3 check fails) finds the
                // chunk in the manifest it reads next. Without pressure the old places
                // also stay a while for reads already under way.
                self.slots().publish_snapshot()?;
                match opts.pressure {
                    false => self.store().defer_release(freed.clone(), REMOTE_READ_GRACE),
                    true => self.store().release_segments(&freed),
                }
            } else {
                self.store().release_segments(&freed);
            }
            r.segments_freed += freed.len() as u64;
            r.segments_compacted += round
                .iter()
                .filter(|(s, l)| *l > 0 && freed.contains(s))
                .count() as u64;
            done += round.len() as u64;
            progress(GcProgress::Compact {
                segments_done: done,
                segments: total,
            });
            if let Some(f) = opts.throttle {
                std::thread::sleep(Duration::from_secs_f64(t0.elapsed().as_secs_f64() * f));
            }
            if out_of_room {
                break;
            }
        }
        Ok(())
    }
}

/// One history's part of a gc plan.
#[derive(Clone, Debug)]
pub(crate) struct HistoryDrop {
    history: HistoryId,
    /// The revisions retention drops, newest first.
    revisions: Vec<RevisionId>,
    /// Of `revisions`: how many go only because the trash is emptied (`--empty-trash`).
    trash: u32,
    /// The history itself goes (a removed file's, nothing of it kept).
    drop_history: bool,
}

/// What one gc does, decided over one read snapshot of the catalog, without writing (so a
/// read-only space can be planned): `ckptfs gc --dry-run` prints its `report`, gc applies the
/// plan itself (`Space::run_gc`; see the module doc for what applying may veto).
/// Memory: one `RevisionId` per revision to drop and one `InodeId` per dead inode; a plan
/// made with figures (`gc_plan(.., true, ..)`) also counted, while planning, one counter per
/// distinct chunk the drops name and one u64 per segment.
#[derive(Clone, Debug)]
pub(crate) struct GcPlan {
    config: Config,
    /// Retention's "now": ages are measured from the plan, not from when it is applied.
    now: Timestamp,
    drops: Vec<HistoryDrop>,
    dead_inodes: Vec<InodeId>,
    /// What applying this plan to the snapshot does (chunk and compaction figures only in
    /// a plan made with figures).
    report: GcReport,
}

impl Space {
    /// Plans a gc over one read snapshot (see `GcPlan`). With `figures`, also what the plan
    /// frees: the chunks whose last reference its drops remove (or that are queued already)
    /// and no open file pins, and the compaction gc would then do (`victims`, the function
    /// gc's compaction uses, over the usage those frees leave).
    fn gc_plan(
        &self,
        opts: &GcOptions,
        figures: bool,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<GcPlan> {
        let start = Instant::now();
        let mut opts = opts.clone();
        {
            let _gate = self.pins().gate_for_gc();
            self.sample_pins(&mut opts.pinned_revisions, &mut opts.open_inodes)?;
        }
        let snap = self.reader()?;
        let config = snap.config()?;
        let now = Timestamp::now();
        let mut r = GcReport {
            dry_run: opts.dry_run,
            free_bytes_before: self.store().free_bytes(),
            ..GcReport::default()
        };
        let mut drops = Vec::new();
        let mut unref: std::collections::HashMap<ChunkHash, u64> = Default::default();
        let (total, mut done) = (snap.history_count()?, 0u64);
        snap.for_each_history(|hid, h| {
            done += 1;
            if done.is_multiple_of(256) {
                progress(GcProgress::Revisions {
                    histories_done: done,
                    histories: total,
                });
            }
            let facts = history_facts(
                &h,
                |i| snap.inode(i),
                snap.history_revisions(hid)?,
                |x| snap.revision(x),
            )?;
            let mut d = retention::decide(&config, now, &opts.pinned_revisions, &facts);
            let mut trash = 0;
            if opts.empty_trash && facts.unlinked.is_some() {
                let all = retention::empty(&opts.pinned_revisions, &facts);
                trash = all.drop.len() - d.drop.len();
                d = all;
            }
            if d.drop.is_empty() && !d.drop_history {
                return Ok(());
            }
            if figures {
                for rev in &d.drop {
                    for (_, e) in snap.extents(*rev)? {
                        *unref.entry(e.chunk).or_default() += 1;
                    }
                }
            }
            r.revisions_dropped += d.drop.len() as u64;
            r.trash_revisions_dropped += trash as u64;
            r.histories_dropped += d.drop_history as u64;
            drops.push(HistoryDrop {
                history: hid,
                revisions: d.drop,
                trash: trash as u32,
                drop_history: d.drop_history,
            });
            Ok(())
        })?;
        progress(GcProgress::Revisions {
            histories_done: done,
            histories: total,
        });
        let dead_inodes = snap.dead_inodes(|ino| opts.open_inodes.contains(&ino))?;
        r.inodes_dropped = dead_inodes.len() as u64;
        if figures {
            let mut freed = HashSet::new();
            let mut free_chunk = |h: ChunkHash, c: ChunkRecord, r: &mut GcReport| {
                if !self.store().is_pinned(&h) && freed.insert(h) {
                    r.chunks_freed += 1;
                    if !c.is_remote() {
                        r.bytes_freed += c.stored_len as u64;
                    }
                }
            };
            for h in snap.gc_candidates()? {
                if let Some(c) = snap.chunk(&h)?.filter(|c| c.refs == 0) {
                    free_chunk(h, c, &mut r);
                }
            }
            for (h, n) in unref {
                let c = snap.chunk(&h)?.ok_or(Corruption::UnknownChunk(h))?;
                match c.refs.checked_sub(n) {
                    Some(0) => free_chunk(h, c, &mut r),
                    Some(_) => {}
                    None => return Err(Corruption::RefUnderflow(h).into()),
                }
            }
            let usage = self.usage_of(
                |f| {
                    snap.for_each_chunk(|h, c| match freed.contains(&h) {
                        true => Ok(()),
                        false => f(h, c),
                    })
                },
                snap.free_segments()?,
            )?;
            let busy = self.store().busy_segments();
            for (_, live) in self.victims(&usage, &busy, &opts, 0) {
                r.segments_freed += 1;
                if live > 0 {
                    r.segments_compacted += 1;
                    r.bytes_copied += live;
                }
            }
            let seg = self.store().segment_bytes();
            r.free_bytes_after =
                (r.free_bytes_before + r.segments_freed * seg).saturating_sub(r.bytes_copied);
        }
        r.seconds = start.elapsed().as_secs_f64();
        Ok(GcPlan {
            config,
            now,
            drops,
            dead_inodes,
            report: r,
        })
    }

    /// Segment usage from a read snapshot of the committed catalog.
    fn segment_usage_now(&self) -> Result<SegmentUsage> {
        let r: Reader = self.reader()?;
        self.usage_of(|f| r.for_each_chunk(f), r.free_segments()?)
    }

    /// Live bytes per segment of the chunks `each_chunk` walks.
    fn usage_of(
        &self,
        each_chunk: impl FnOnce(&mut dyn FnMut(ChunkHash, ChunkRecord) -> Result<()>) -> Result<()>,
        free: BTreeSet<SegmentId>,
    ) -> Result<SegmentUsage> {
        // Indexed by absolute segment number: a slot's segments start at its range's start.
        let n = self.segment_range().end as usize;
        let mut live = vec![0u64; n];
        each_chunk(&mut |_, rec| {
            let seg = self.store().segment_of(rec.offset).0 as usize;
            if seg < n {
                live[seg] += rec.stored_len as u64;
            }
            Ok(())
        })?;
        Ok(SegmentUsage { live, free })
    }
}

/// `Space::max_live` for segments of `seg` bytes.
fn max_live_bytes(seg: u64, opts: &GcOptions) -> u64 {
    let most = if opts.pressure {
        let r = opts.copy_per_freed.unwrap_or(PRESSURE_COPY_PER_FREED);
        // live <= r * (seg - live)  <=>  live <= seg * r / (r + 1)
        (u128::from(seg) * u128::from(r) / (u128::from(r) + 1)) as u64
    } else {
        ((seg as f64 * COMPACT_LIVE_FRACTION).ceil() as u64).saturating_sub(1)
    };
    most.min(seg.saturating_sub(1))
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    /// What compaction may copy per byte it frees, by who asks: never more than the bound,
    /// never a segment without a dead byte.
    #[test]
    fn compaction_copies_at_most_the_bound_per_byte_freed() {
        let seg = 8u64 << 20;
        let pressure = |r: Option<u64>| GcOptions {
            pressure: true,
            copy_per_freed: r,
            ..GcOptions::default()
        };
        for (opts, ratio) in [
            (pressure(None), PRESSURE_COPY_PER_FREED as f64),
            (
                pressure(Some(AUTO_COPY_PER_FREED)),
                AUTO_COPY_PER_FREED as f64,
            ),
            (pressure(Some(1000)), 1000.0),
        ] {
            let live = max_live_bytes(seg, &opts);
            assert!(live < seg, "a full segment frees nothing");
            assert!(live as f64 <= ratio * (seg - live) as f64, "{live} copied");
            // One byte more would break the bound (or fill the segment).
            assert!((live + 1) as f64 > ratio * (seg - live - 1) as f64 || live + 1 == seg);
        }
        // Without pressure: less than half live.
        let live = max_live_bytes(seg, &GcOptions::default());
        assert!(live < seg / 2 && live + 1 == seg / 2);
        // 3 per byte freed: at most 6 MiB of 8 copied.
        assert_eq!(max_live_bytes(seg, &pressure(None)), 6 << 20);
    }

    /// The automatic gc's wait after a run that left free space short: 15 s, doubling to
    /// 10 min; a run that reached its goal ends it.
    #[test]
    fn the_automatic_gc_backs_off_and_comes_back() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(b.ready(t0));
        let mut waits = Vec::new();
        for _ in 0..8 {
            b.record(t0, false);
            waits.push(b.wait().as_secs());
            assert!(!b.ready(t0) && b.ready(t0 + b.wait()));
        }
        assert_eq!(waits, vec![15, 30, 60, 120, 240, 480, 600, 600]);
        b.record(t0, true);
        assert!(b.ready(t0) && b.wait().is_zero());
    }
}

/// The facts retention needs of history `h`, from whichever view of the catalog the
/// closures read (a write transaction in gc, a read snapshot in its plan).
fn history_facts(
    h: &HistoryRecord,
    inode: impl Fn(InodeId) -> Result<Option<InodeRecord>>,
    revs: Vec<RevisionId>,
    revision: impl Fn(RevisionId) -> Result<Option<RevisionRecord>>,
) -> Result<retention::HistoryFacts> {
    let current = match h.unlinked {
        None => inode(h.ino)?.map(|i| i.current_rev),
        Some(_) => None,
    };
    let mut revisions = Vec::with_capacity(revs.len());
    for rev in revs {
        let rr = revision(rev)?.ok_or(Corruption::Missing(Missing::Revision(rev)))?;
        revisions.push((rev, rr));
    }
    Ok(retention::HistoryFacts {
        unlinked: h.unlinked,
        current,
        revisions,
    })
}

struct SegmentUsage {
    /// Live bytes per segment, indexed by segment number.
    live: Vec<u64>,
    free: BTreeSet<SegmentId>,
}

/// The retention decision, as a pure function of one history's state and the policy: what
/// both a gc and its dry run use, so a dry run reports exactly what gc would drop.
pub mod retention {
    use crate::catalog::Config;
    use crate::format::{RevisionId, RevisionRecord, Timestamp};
    use std::collections::HashSet;

    /// What retention needs to know of one history.
    #[derive(Clone, Debug)]
    pub struct HistoryFacts {
        /// When its path was unlinked, if it was.
        pub unlinked: Option<Timestamp>,
        /// The revision its file reads now (none once unlinked).
        pub current: Option<RevisionId>,
        /// Its revisions, oldest first.
        pub revisions: Vec<(RevisionId, RevisionRecord)>,
    }

    /// What retention does to one history.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct HistoryDecision {
        /// Revisions to drop, newest first.
        pub drop: Vec<RevisionId>,
        /// The whole history goes (an unlinked path with nothing kept).
        pub drop_history: bool,
    }

    /// Emptying the trash: a removed file's history keeps only its pinned revisions, whatever
    /// `keep_unlinked` says; the history goes once nothing is left. (A live history is left
    /// alone.)
    pub fn empty(pinned: &HashSet<RevisionId>, h: &HistoryFacts) -> HistoryDecision {
        if h.unlinked.is_none() {
            return HistoryDecision::default();
        }
        let drop: Vec<RevisionId> = h
            .revisions
            .iter()
            .rev()
            .map(|(rev, _)| *rev)
            .filter(|rev| !pinned.contains(rev))
            .collect();
        let drop_history = drop.len() == h.revisions.len();
        HistoryDecision { drop, drop_history }
    }

    /// Keeps, newest first: the current revision, the pinned ones (open readers and
    /// writers), the newest `keep_revisions` listed ones (sealed, or current) and, with
    /// `keep_age_secs`, every listed one younger than that. An unlinked history keeps
    /// nothing but pins once `keep_unlinked_secs` have passed.
    pub fn decide(
        config: &Config,
        now: Timestamp,
        pinned: &HashSet<RevisionId>,
        h: &HistoryFacts,
    ) -> HistoryDecision {
        let age_limit = now.secs - config.keep_age_secs as i64;
        let expired = h
            .unlinked
            .is_some_and(|t| now.secs - t.secs > config.keep_unlinked_secs as i64);
        let mut kept_listed = 0u64;
        let mut drop = Vec::new();
        for (rev, rr) in h.revisions.iter().rev() {
            let is_current = h.current == Some(*rev);
            let listed = rr.sealed || is_current;
            let keep = pinned.contains(rev)
                || is_current
                || (!expired
                    && listed
                    && (kept_listed < config.keep_revisions
                        || (config.keep_age_secs > 0 && rr.committed.secs >= age_limit)));
            if keep {
                if listed {
                    kept_listed += 1;
                }
            } else {
                drop.push(*rev);
            }
        }
        let drop_history = h.unlinked.is_some() && drop.len() == h.revisions.len();
        HistoryDecision { drop, drop_history }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const DAY: i64 = 24 * 3600;
        const NOW: i64 = 100 * DAY;

        fn rev(id: u64, age_secs: i64, sealed: bool) -> (RevisionId, RevisionRecord) {
            (
                RevisionId(id),
                RevisionRecord {
                    size: 1,
                    committed: Timestamp {
                        secs: NOW - age_secs,
                        nanos: 0,
                    },
                    new_stored_bytes: 0,
                    sealed,
                    history: crate::format::HistoryId(1),
                    write_ms: 0,
                },
            )
        }

        struct Case {
            name: &'static str,
            keep: u64,
            keep_age: u64,
            unlinked_ago: Option<i64>,
            current: Option<u64>,
            revs: Vec<(RevisionId, RevisionRecord)>,
            pinned: Vec<u64>,
            want_drop: Vec<u64>,
            want_history_dropped: bool,
        }

        #[test]
        fn retention_table() {
            let cases = vec![
                Case {
                    name: "newest two of five kept, current among them",
                    keep: 2,
                    keep_age: 0,
                    unlinked_ago: None,
                    current: Some(5),
                    revs: (1..=5)
                        .map(|i| rev(i, (6 - i as i64) * DAY, true))
                        .collect(),
                    pinned: vec![],
                    want_drop: vec![3, 2, 1],
                    want_history_dropped: false,
                },
                Case {
                    name: "a pinned old revision survives and does not count",
                    keep: 2,
                    keep_age: 0,
                    unlinked_ago: None,
                    current: Some(5),
                    revs: (1..=5)
                        .map(|i| rev(i, (6 - i as i64) * DAY, true))
                        .collect(),
                    pinned: vec![1],
                    want_drop: vec![3, 2],
                    want_history_dropped: false,
                },
                Case {
                    name: "an unsealed fsync point is neither listed nor counted",
                    keep: 2,
                    keep_age: 0,
                    unlinked_ago: None,
                    current: Some(3),
                    revs: vec![
                        rev(1, 3 * DAY, true),
                        rev(2, 2 * DAY, false),
                        rev(3, DAY, true),
                    ],
                    pinned: vec![],
                    want_drop: vec![2],
                    want_history_dropped: false,
                },
                Case {
                    name: "the current revision is kept even beyond keep-revisions",
                    keep: 1,
                    keep_age: 0,
                    unlinked_ago: None,
                    current: Some(1),
                    revs: vec![
                        rev(1, 3 * DAY, true),
                        rev(2, 2 * DAY, true),
                        rev(3, DAY, true),
                    ],
                    pinned: vec![],
                    want_drop: vec![2],
                    want_history_dropped: false,
                },
                Case {
                    name: "keep-age keeps every young listed revision",
                    keep: 1,
                    keep_age: (3 * DAY / 2) as u64,
                    unlinked_ago: None,
                    current: Some(4),
                    revs: (1..=4)
                        .map(|i| rev(i, (5 - i as i64) * DAY / 2, true))
                        .collect(),
                    pinned: vec![],
                    want_drop: vec![1],
                    want_history_dropped: false,
                },
                Case {
                    name: "unlinked, not yet expired: the newest N stay",
                    keep: 2,
                    keep_age: 0,
                    unlinked_ago: Some(DAY),
                    current: None,
                    revs: (1..=3)
                        .map(|i| rev(i, (4 - i as i64) * DAY, true))
                        .collect(),
                    pinned: vec![],
                    want_drop: vec![1],
                    want_history_dropped: false,
                },
                Case {
                    name: "unlinked and expired: everything goes, and the history",
                    keep: 2,
                    keep_age: 0,
                    unlinked_ago: Some(8 * DAY),
                    current: None,
                    revs: (1..=3)
                        .map(|i| rev(i, (10 - i as i64) * DAY, true))
                        .collect(),
                    pinned: vec![],
                    want_drop: vec![3, 2, 1],
                    want_history_dropped: true,
                },
                Case {
                    name: "unlinked and expired but pinned: the history stays",
                    keep: 2,
                    keep_age: 0,
                    unlinked_ago: Some(8 * DAY),
                    current: None,
                    revs: (1..=2)
                        .map(|i| rev(i, (10 - i as i64) * DAY, true))
                        .collect(),
                    pinned: vec![2],
                    want_drop: vec![1],
                    want_history_dropped: false,
                },
            ];
            for c in cases {
                let config = Config {
                    keep_revisions: c.keep,
                    keep_age_secs: c.keep_age,
                    ..Config::default()
                };
                let facts = HistoryFacts {
                    unlinked: c.unlinked_ago.map(|a| Timestamp {
                        secs: NOW - a,
                        nanos: 0,
                    }),
                    current: c.current.map(RevisionId),
                    revisions: c.revs,
                };
                let pinned = c.pinned.into_iter().map(RevisionId).collect();
                let now = Timestamp {
                    secs: NOW,
                    nanos: 0,
                };
                let d = decide(&config, now, &pinned, &facts);
                let got: Vec<u64> = d.drop.iter().map(|r| r.0).collect();
                assert_eq!(got, c.want_drop, "{}", c.name);
                assert_eq!(d.drop_history, c.want_history_dropped, "{}", c.name);
            }
        }

        /// Emptying the trash: a removed file keeps only what open handles read, however
        /// recent its removal; a present file is never touched.
        #[test]
        fn emptying_the_trash_keeps_only_pins() {
            let revs: Vec<(RevisionId, RevisionRecord)> = (1..=3)
                .map(|i| rev(i, (4 - i as i64) * DAY, true))
                .collect();
            let removed = |ago: i64| HistoryFacts {
                unlinked: Some(Timestamp {
                    secs: NOW - ago,
                    nanos: 0,
                }),
                current: None,
                revisions: revs.clone(),
            };
            let none = HashSet::new();
            let d = empty(&none, &removed(1));
            assert_eq!(d.drop, vec![RevisionId(3), RevisionId(2), RevisionId(1)]);
            assert!(d.drop_history);
            let pinned: HashSet<RevisionId> = [RevisionId(2)].into();
            let d = empty(&pinned, &removed(1));
            assert_eq!(d.drop, vec![RevisionId(3), RevisionId(1)]);
            assert!(!d.drop_history, "a pinned revision keeps its history");
            let present = HistoryFacts {
                unlinked: None,
                current: Some(RevisionId(3)),
                revisions: revs.clone(),
            };
            assert_eq!(empty(&none, &present), HistoryDecision::default());
        }
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use crate::space::Seal;

    /// Writes `data` as a new complete revision of the file `rec` (inode 2).
    fn write_revision(space: &Space, rec: &mut InodeRecord, data: &[u8]) -> RevisionId {
        let mut f = space.files().load_file(rec).unwrap();
        f.truncate(0);
        f.write(space.data().chunks(), 0, data).unwrap();
        f.finish(space.data().chunks()).unwrap();
        space
            .commit_file(InodeId(2), &mut f, rec, Seal::Complete)
            .unwrap()
    }

    /// The plan is what gc applies: a revision the plan drops but that someone opened
    /// between the plan and its application stays (counted in `planned_kept`), the rest of
    /// the plan is applied, and nothing the plan did not name is dropped, although by then
    /// retention would drop it too.
    #[test]
    fn applying_a_plan_keeps_what_was_pinned_since_and_drops_nothing_unplanned() {
        let dir = std::env::temp_dir().join(format!("ckptfs-gc-plan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = Config {
            keep_revisions: 1,
            ..Config::default()
        };
        Space::format(&dir, 64 << 20, 65536, config, false).unwrap();
        let space = Space::open(&dir).unwrap();
        let hid = space
            .ns_write(false, |t| t.new_history(InodeId(2)))
            .unwrap();
        let mut rec = InodeRecord {
            history: hid,
            ..InodeRecord::new(NodeKind::File, 0o644, 0, 0)
        };
        let revs: Vec<RevisionId> = (0..4u8)
            .map(|i| write_revision(&space, &mut rec, &vec![i; 200_000]))
            .collect();
        let opts = GcOptions::default();
        let _one = space.gc_state().turn();
        let plan = space.gc_plan(&opts, true, &mut |_| {}).unwrap();
        assert_eq!(plan.report.revisions_dropped, 3, "{:?}", plan.report);
        // Between the plan and its application: revision 1 is opened, and a fifth revision
        // makes revision 3 droppable too.
        let (pin, ()) = space
            .pins()
            .pin::<(), Error>(None, || Ok((revs[1], ())))
            .unwrap();
        write_revision(&space, &mut rec, &[9u8; 200_000]);
        let r = space.run_gc(&plan, &opts, &mut |_| {}).unwrap();
        assert_eq!((r.revisions_dropped, r.planned_kept), (2, 1), "{r:?}");
        let left: Vec<RevisionId> = space
            .ns()
            .revisions(hid)
            .unwrap()
            .iter()
            .map(|x| x.id)
            .collect();
        assert!(
            left.contains(&revs[1]) && left.contains(&revs[3]),
            "{left:?}"
        );
        assert!(
            !left.contains(&revs[0]) && !left.contains(&revs[2]),
            "{left:?}"
        );
        drop(pin);
        drop(_one);
        drop(space);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
