//! The read layer: the chunk reader (`chunks`: the decoded-chunk cache, coalescing of reads
//! in flight, merged device reads, blake3 verification and repair, read threads) and the
//! read-ahead policy (`ahead`).
//!
//! The reader asks the store two things through small traits, `ChunkSource` (where chunks
//! lie, under a hold on segment reuse) and `InFlight` (the writer's bytes not yet on the
//! device); it does not see the store's fields. Chunks another slot published are read at
//! the records the caller gives (`get_many_at`, `prefetch_at`): one cache for both.
//!
//! The extent map and painter stay with the file state in `write::extents`: a file's map
//! is the writer's state, and the painter fills a read from it through `ChunkIo`, which
//! the store answers with this reader. Putting them here would make `write` import `read`
//! while the reader uses the pipeline's stage timers and the predictor (`read` -> `write`).

mod ahead;
mod chunks;

pub use ahead::{ReadAhead, PREFETCH_BYTES, PREFETCH_FIRST_BYTES, PREFETCH_MIN_BYTES};
pub use chunks::{
    Buffered, ChunkReader, ChunkSource, InFlight, RemoteChunks, CACHE_BYTES, READ_THREADS,
    SPARE_READ_BUFS, SPARE_READ_BUF_BYTES,
};
