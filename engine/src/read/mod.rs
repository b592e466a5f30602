//! The read layer's policy: read-ahead (`ahead`).
//!
//! The chunk reader itself (the decoded-chunk cache, coalescing of reads in flight, merged
//! device reads, blake3 verification and repair) is still `store/read.rs`, an `impl
//! ChunkStore` block: it shares the store's core (the pins, the segment-reuse barrier, the
//! failure flag, the placement) with the write side, and moving it here needs that core to
//! be a type of its own first (the extent map and painter it feeds are `write::extents`).

mod ahead;

pub use ahead::{ReadAhead, PREFETCH_BYTES, PREFETCH_FIRST_BYTES, PREFETCH_MIN_BYTES};
