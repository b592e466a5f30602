//! Maintenance: what runs beside the writers and readers to keep a space right and small.
//!
//! - `gc`: retention and compaction, as a plan (`GcPlan`, over one read snapshot) that
//!   `ckptfs gc --dry-run` prints and gc applies;
//! - `check`: `ckptfs check`, every reference count, extent and record against the others,
//!   and every stored chunk against its blake3 hash;
//! - `scrub`: the chunks read back and verified in the background, repaired from verified
//!   bytes where a layout has redundancy (`targets/repair.rs` rebuilds lost targets).
//!
//! The daemon's periodic work (automatic gc, retention passes, publication, learning other
//! nodes' removals) is still paced by a thread the mount starts over `fs`
//! (`mount::start_maintenance`).

pub mod check;
pub mod gc;
pub mod scrub;
