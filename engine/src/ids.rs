//! The identifiers of the space: content hashes, inode, revision, history and segment
//! numbers, data-file offsets. Newtypes, so that two ids cannot be swapped in a call; they
//! depend on nothing else in the engine, so every layer (errors included) may name them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// blake3 of a chunk's uncompressed bytes: the chunk's name everywhere.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkHash(pub [u8; 32]);

impl ChunkHash {
    pub fn of(data: &[u8]) -> Self {
        ChunkHash(*blake3::hash(data).as_bytes())
    }
}

/// The first 8 bytes in hex: enough to tell chunks apart in a message or a log.
impl fmt::Debug for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct InodeId(pub u64);

impl InodeId {
    pub const ROOT: InodeId = InodeId(1);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RevisionId(pub u64);

/// A revision history: the lineage of one path's revisions, kept across unlink and rename.
/// 0 means none (a record that is not a regular file).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct HistoryId(pub u64);

impl HistoryId {
    pub const NONE: HistoryId = HistoryId(0);
}

impl fmt::Display for HistoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A segment of the data space: the unit of allocation, compaction and (next) placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SegmentId(pub u64);

impl fmt::Display for SegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A slot of a multi-slot space: one node's writable partition (its segment range and
/// metadata table). A single-slot space has only slot 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SlotId(pub u32);

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Byte offset inside the reserved data file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DataOffset(pub u64);

impl DataOffset {
    /// The offset of a chunk record whose bytes are held only by the space's object-store
    /// tier (FORMAT.md "Object-store tier", chunks fetched on demand): no byte of the data
    /// file is its. Never a real offset: the data file is far smaller than 2^64 bytes.
    pub const REMOTE: DataOffset = DataOffset(u64::MAX);
}
