//! Writeback: what happens to written bytes until a close commits them.
//!
//! - `file`: `FileState`, a file's content while it is open (the committed extent map, the
//!   content-defined stream of sequential writers, fixed-offset dirty blocks for the rest)
//!   and its memory bounds;
//! - `cut_jobs` and `cutter`: the stream cut into chunks by a worker (FastCDC, or a predicted
//!   cut of a next revision confirmed by blake3: `predict`; the gear scan: `gearscan`);
//! - `pipeline`: the worker pool, the byte budget that bounds what is in flight, and the
//!   tickets through which a file state learns what became of a chunk; the store behind
//!   it has one way to store a batch of chunks (`ChunkStore::store_batch`, CPU or GPU);
//! - `spill`: where a stream's carried bytes wait on disk when memory is short;
//! - `extents`: the extent map and the one painter (the read side uses them too).
//!
//! - `sweep`: the bounds over all open files together (memory sweeps, through the
//!   filesystem's open-file table lent as `OpenFiles`) and the ENOSPC -> gc retry of a
//!   write or a close (`with_room`).

mod cut_jobs;
mod cutter;
mod extents;
mod file;
pub(crate) mod gearscan;
pub mod pipeline;
pub(crate) mod predict;
pub(crate) mod spill;
pub mod sweep;
#[cfg(test)]
pub(crate) mod tests;

use cut_jobs::*;
pub(crate) use cutter::longest_carry;
use cutter::*;
pub use cutter::{gear_cut_lengths, gear_search, Search};
pub use extents::*;
pub use file::*;
pub use pipeline::ChunkIo;
