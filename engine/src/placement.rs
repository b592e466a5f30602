//! Placement: where the bytes of each segment live. The store addresses stored chunks as a
//! location within a segment and asks the placement to read, write and sync; it never
//! knows the files behind them. Today a space has one target, the preallocated data file,
//! and segment `s` is bytes `s * segment_bytes ..` of it (`SingleFile`). A space over
//! several storage targets (erasure-coded rows of shards) is another `Placement`.
//!
//! The on-disk chunk record keeps the single-file form of a location (`DataOffset`:
//! `segment * segment_bytes + offset`), so this layer changes no format.

use crate::device::Device;
use crate::error::DevResult;
use crate::format::{DataOffset, SegmentId};
use std::sync::Arc;

/// A place in the space: a segment and a byte offset within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    pub segment: SegmentId,
    pub offset: u64,
}

impl Location {
    /// The location a chunk record's offset names, for segments of `segment_bytes`.
    pub fn of(at: DataOffset, segment_bytes: u64) -> Location {
        Location {
            segment: SegmentId(at.0 / segment_bytes),
            offset: at.0 % segment_bytes,
        }
    }

    /// The record form (see the module comment).
    pub(crate) fn to_offset(self, segment_bytes: u64) -> DataOffset {
        DataOffset(self.segment.0 * segment_bytes + self.offset)
    }
}

/// Where segments' bytes live. Reads and writes may span segment boundaries (a run of
/// chunks stored back to back); an implementation splits them where its layout needs.
pub trait Placement: Send + Sync {
    fn segment_bytes(&self) -> u64;
    fn read(&self, at: Location, buf: &mut [u8]) -> DevResult<()>;
    /// `read` of the bytes exactly as stored, for a verifier (`ckptfs check`): where
    /// `read` goes around parts already found damaged (erasure-coded targets rebuild them
    /// from the others), this reads them, so the check sees and reports the damage.
    fn read_as_stored(&self, at: Location, buf: &mut [u8]) -> DevResult<()> {
        self.read(at, buf)
    }
    /// Writes whole blocks (`device::DIRECT_ALIGN`) at block-aligned locations.
    fn write(&self, at: Location, buf: &[u8]) -> DevResult<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> DevResult<()>;
    /// Bytes every write is a whole multiple of, at locations aligned to it: a commit pads
    /// the store's buffer to it, and segments are a whole multiple of it. One block for a
    /// single file; a row of M blocks for erasure-coded targets, whose parity must never
    /// be rewritten.
    fn write_align(&self) -> usize {
        crate::device::DIRECT_ALIGN
    }
    /// The store starts filling segment `seg`, which holds nothing live: a placement that
    /// chooses where each segment lives does it now, durably, before any byte is written.
    fn prepare(&self, _seg: SegmentId) -> DevResult<()> {
        Ok(())
    }
    /// The bytes `read` returned at `at` failed their check (blake3): tries other ways to
    /// get them (rebuilding from redundancy), writing into `buf` a version that `check`
    /// accepts. Ok(false): there is no other way, the bytes are damaged.
    fn read_repair(
        &self,
        _at: Location,
        _buf: &mut [u8],
        _check: &mut dyn FnMut(&[u8]) -> bool,
    ) -> DevResult<bool> {
        Ok(false)
    }
}

/// One target: the data file, segment after segment.
pub(crate) struct SingleFile {
    dev: Arc<dyn Device>,
    segment_bytes: u64,
}

impl SingleFile {
    pub fn new(dev: Arc<dyn Device>, segment_bytes: u64) -> SingleFile {
        SingleFile { dev, segment_bytes }
    }
}

impl SingleFile {
    /// The data file itself.
    pub fn device(&self) -> Arc<dyn Device> {
        self.dev.clone()
    }
}

impl Placement for SingleFile {
    fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    fn read(&self, at: Location, buf: &mut [u8]) -> DevResult<()> {
        self.dev.read_at(buf, at.to_offset(self.segment_bytes).0)
    }

    fn write(&self, at: Location, buf: &[u8]) -> DevResult<()> {
        self.dev.write_at(buf, at.to_offset(self.segment_bytes).0)
    }

    fn sync(&self) -> DevResult<()> {
        self.dev.sync()
    }
}

/// The whole space as one device at data-file offsets (`Location::to_offset`), over a
/// placement: what a slot's manifest is written to and other slots' manifests are read
/// from, wherever segments live (the data file, or erasure-coded targets). Writes must
/// meet the placement's `write_align`.
pub(crate) struct PlacedDevice {
    pub place: Arc<dyn Placement>,
    /// Bytes of the whole space (`Superblock::data_size_bytes`).
    pub len: u64,
}

impl Device for PlacedDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> DevResult<()> {
        let seg = self.place.segment_bytes();
        self.place.read(Location::of(DataOffset(off), seg), buf)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> DevResult<()> {
        let seg = self.place.segment_bytes();
        self.place.write(Location::of(DataOffset(off), seg), buf)
    }

    fn sync(&self) -> DevResult<()> {
        self.place.sync()
    }

    fn len(&self) -> u64 {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_round_trip_through_the_record_form() {
        let seg = 8 << 20;
        for off in [0u64, 1, seg - 1, seg, 3 * seg + 4096] {
            let l = Location::of(DataOffset(off), seg);
            assert!(l.offset < seg);
            assert_eq!(l.to_offset(seg), DataOffset(off));
        }
        assert_eq!(
            Location::of(DataOffset(3 * seg + 5), seg),
            Location {
                segment: SegmentId(3),
                offset: 5
            }
        );
    }
}
