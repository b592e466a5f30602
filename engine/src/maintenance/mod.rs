//! Maintenance: what runs beside the writers and readers to keep a space right and small.
//!
//! - `gc`: retention and compaction, as a plan (`GcPlan`, over one read snapshot) that
//!   `ckptfs gc --dry-run` prints and gc applies;
//! - `check`: `ckptfs check`, every reference count, extent and record against the others,
//!   and every stored chunk against its blake3 hash;
//! - `scrub`: the chunks read back and verified in the background, repaired from verified
//!   bytes where a layout has redundancy (`targets/repair.rs` rebuilds lost targets).
//!
//! - `auto`: gc without a person: under space pressure, below the automatic gc's watermark,
//!   and the retention pass while there is room (`AutoGc`);
//! - `schedule`: the daemon's periodic work as one scheduler (`Scheduler`): the mount
//!   registers its jobs (automatic gc, publication, learning other nodes' removals, trims)
//!   and starts it; writers that need a job now ask through its `Wake`.

pub mod auto;
pub mod check;
pub mod gc;
pub mod schedule;
pub mod scrub;
