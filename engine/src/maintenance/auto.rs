//! gc without a person: under space pressure (a writer found the space full), below the
//! automatic gc's free-space watermark, and the retention pass that applies the policy
//! while there is room. The decisions (when, how hard, what to say) live here; the caller
//! passes how to run one gc (`GcRun`: the filesystem's, which pins what open files use and
//! publishes moved chunks on a multi-slot space).

use super::gc::{Backoff, GcOptions, GcReport, AUTO_COPY_PER_FREED};
use crate::error::Result;
use crate::space::Space;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A writer that found the space full waits for gc to free this fraction (1/N) of the
/// space, or for all it can get if less.
pub const PRESSURE_ROOM_FRACTION: u64 = 8;

/// How one gc runs (the filesystem's `gc_with`).
pub type GcRun<'a> = &'a dyn Fn(GcOptions) -> Result<GcReport>;

/// How often at most the daemon applies the retention policy by itself (`tick`): a minute,
/// so a job saving every few seconds costs one gc pass a minute.
/// `CKPTFS_RETENTION_EVERY_MS` sets it (the tests' knob).
pub fn retention_every() -> Duration {
    let ms = std::env::var("CKPTFS_RETENTION_EVERY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000);
    Duration::from_millis(ms)
}

/// The automatic gc's state: three small fields, one per mount.
pub struct AutoGc {
    /// "Space full, nothing to reclaim" was logged, and nothing was reclaimed since.
    full_said: AtomicBool,
    /// When automatic gc may next run after one that left free space below the watermark.
    quiet_until: Mutex<Backoff>,
    /// The retention pass: the commit count it last saw, and when it may run next (real
    /// time: it paces work, it decides no age).
    retention: Mutex<(u64, Instant)>,
}

impl Default for AutoGc {
    fn default() -> Self {
        AutoGc {
            full_said: AtomicBool::new(false),
            quiet_until: Mutex::new(Backoff::default()),
            retention: Mutex::new((0, Instant::now() + retention_every())),
        }
    }
}

fn pressure_opts(throttle: Option<f64>, room_goal_bytes: u64) -> GcOptions {
    GcOptions {
        throttle,
        pressure: true,
        room_goal_bytes,
        ..GcOptions::default()
    }
}

/// On a multi-slot space, what a full space means there: this node fills its own slot's
/// share only, while the other slots' shares may have room it cannot use (each slot is an
/// equal, fixed share of the data file). A job whose one node writes most of the bytes
/// (a `Trainer` saving on rank 0 only) meets this at 1/N of the space, and the bare ENOSPC
/// and "space full" said nothing of why. Empty for a single-slot space.
fn slot_share_note(space: &Space) -> String {
    let Some(lease) = space.slots().lease() else {
        return String::new();
    };
    let sb = space.superblock();
    let seg = u64::from(sb.segment_bytes);
    let share = |slot| {
        let r = sb.slot_segments(slot);
        (r.end - r.start) * seg
    };
    let me = lease.slot();
    // The others' room as their headers last said (a live node's renewals keep it fresh).
    let others_free: u64 = match lease.table().all() {
        Ok(headers) => headers
            .iter()
            .filter(|h| h.slot != me)
            .map(|h| share(h.slot).saturating_sub(h.used_bytes))
            .sum(),
        Err(_) => return String::new(),
    };
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    format!(
        ". This node writes into slot {me}'s share of a {}-slot space ({} of the data file's \
         {}); the other slots' shares have {} free, which only their own nodes can use (each \
         slot is an equal share of the space). Where one node writes most of the bytes, \
         format the space with fewer slots, or larger",
        sb.slots,
        mib(share(me)),
        mib(sb.data_size_bytes),
        mib(others_free)
    )
}

impl AutoGc {
    /// Under space pressure: retention, then compaction of every segment with dead bytes,
    /// until `PRESSURE_ROOM_FRACTION` of the space is free or nothing more can be had.
    /// True when the writer should try again (room was made, or there is room now: with
    /// many writers, the chunk that failed may have failed before another writer's gc made
    /// room; 8 writers rotating checkpoints got ENOSPC with 200 MiB free). Each true freed
    /// space or found it, and what is freed is bounded, so a writer's retry loop ends. Says
    /// so in the log once per episode of a full space, not once per waiting write.
    pub fn for_space(&self, space: &Space, gc: GcRun) -> bool {
        // The room wanted: 1/8 of the space beyond what is free now. Taken before waiting
        // for another writer's gc, whose room counts for this one too.
        let before = space.data().free_bytes();
        let goal = before + space.data().capacity() / PRESSURE_ROOM_FRACTION;
        match gc(pressure_opts(None, goal)) {
            Ok(r) => {
                let gained = r.free_bytes_after.saturating_sub(before);
                let reserve = crate::alloc::GC_RESERVE_SEGMENTS + 1;
                let room = r.free_bytes_after >= reserve * space.data().segment_bytes();
                if gained > 0 {
                    self.full_said.store(false, Ordering::Relaxed);
                    log::info!(
                        "space full: gc dropped {} revisions and reclaimed {gained} bytes",
                        r.revisions_dropped
                    );
                } else if !room && !self.full_said.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "space full: gc found nothing to reclaim ({} bytes free); writers get \
                         ENOSPC until files are removed or retention allows more (said once){}",
                        r.free_bytes_after,
                        slot_share_note(space)
                    );
                }
                gained > 0 || room
            }
            Err(e) => {
                log::error!("space full and gc failed: {e:?}");
                false
            }
        }
    }

    /// One check of the automatic gc (the scheduler's every tick): a throttled gc when free
    /// space is below the configured watermark; after one that left it below, a back-off
    /// (15 s, doubling up to 10 min: `Backoff`, on the engine's clock). Above the
    /// watermark, the retention pass. Also the store's idle work (spare read buffers, the
    /// grace of segments a gc emptied in a multi-slot space).
    pub fn tick(&self, space: &Space, gc: GcRun) {
        space.data().idle_tick();
        let Ok(config) = space.settings().config() else {
            return;
        };
        if config.auto_gc_free_percent == 0 || space.is_read_only() || space.data().is_failed() {
            return;
        }
        if space.data().free_bytes() * 100 >= space.data().capacity() * config.auto_gc_free_percent
        {
            self.retention_tick(space, gc);
            return;
        }
        if !self.quiet_until.lock().ready(crate::clock::instant()) {
            return;
        }
        // Below the watermark counts as pressure (the trash may be emptied and segments
        // compacted, up to the watermark), but copying at most a byte per byte freed
        // (`AUTO_COPY_PER_FREED`); throttle 1.0: gc sleeps as long as it works, so writers
        // keep most of the disk.
        let goal = space.data().capacity() * config.auto_gc_free_percent / 100;
        let opts = GcOptions {
            copy_per_freed: Some(AUTO_COPY_PER_FREED),
            ..pressure_opts(Some(1.0), goal)
        };
        let reached = match gc(opts) {
            Ok(r) => r.free_bytes_after >= goal,
            Err(e) => {
                log::error!("automatic gc failed: {e:?}");
                false
            }
        };
        let mut b = self.quiet_until.lock();
        b.record(crate::clock::instant(), reached);
        if !reached {
            log::debug!(
                "automatic gc: below the watermark; next try in {:?}",
                b.wait()
            );
        }
    }

    /// Retention without waiting for a full space or a person: where files were committed
    /// since the last pass, at most once every `retention_every()`, a gc drops what the
    /// policy no longer keeps (five saves of one `latest.pt` with `keep-revisions 2` kept
    /// five revisions until someone ran `ckptfs gc`). Throttled as automatic gc is, and
    /// only compacting mostly-dead segments, as a gc by hand: bounded work, and none while
    /// nothing is committed. Off with automatic gc (`--auto-gc-free-percent 0`).
    fn retention_tick(&self, space: &Space, gc: GcRun) {
        let commits = space.commit_count();
        let now = Instant::now();
        {
            let mut r = self.retention.lock();
            if r.0 == commits || now < r.1 {
                return;
            }
            *r = (commits, now + retention_every());
        }
        let opts = GcOptions {
            throttle: Some(1.0),
            ..GcOptions::default()
        };
        match gc(opts) {
            Ok(r) if r.revisions_dropped > 0 => log::info!(
                "retention: dropped {} revisions outside the policy, freed {} bytes",
                r.revisions_dropped,
                r.bytes_freed
            ),
            Ok(_) => {}
            Err(e) => log::warn!("retention pass failed: {e:?}"),
        }
    }
}
