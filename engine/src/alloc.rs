//! Segment allocation: which segments of the space are free, which the writer took since the
//! last commit that recorded them, and gc's reserve. The only owner of the free list in
//! memory. The catalog's `free_segments` table is its durable copy, changed only by commits
//! (`Txn::mark_taken`, `Txn::mark_free`), which report back here (`recorded`, `release`).
//!
//! Bound: two sets of segment numbers, at most the segment count of the space.

use crate::error::{Error, Result};
use crate::format::SegmentId;
use std::collections::BTreeSet;

/// Free segments new chunks may not take, kept for gc's copies: with one segment of room, a
/// compaction of any partly dead segment frees more than it uses, so a full space always
/// comes back once retention has dropped something (see FORMAT.md, "Space pressure").
pub const GC_RESERVE_SEGMENTS: u64 = 1;

pub struct Segments {
    /// Segments free for allocation.
    free: BTreeSet<SegmentId>,
    /// Segments taken from the free list since the last commit that recorded them.
    taken: BTreeSet<SegmentId>,
}

/// A segment handed out by `take`.
pub struct Taken {
    pub segment: SegmentId,
    /// It came out of gc's reserve: only gc's copies may fill it (until the reserve is
    /// whole again, see `reserve_whole`).
    pub reserved: bool,
}

impl Segments {
    /// `free`: the free segments the catalog lists.
    pub fn new(free: BTreeSet<SegmentId>) -> Segments {
        Segments {
            free,
            taken: BTreeSet::new(),
        }
    }

    pub(crate) fn free_count(&self) -> u64 {
        self.free.len() as u64
    }

    /// Whether gc's reserve is whole: a segment taken from it may be filled by anyone.
    /// The reserve is a count of free segments, not a particular one, so once gc freed the
    /// segments it emptied into a reserve segment, that segment is an ordinary one.
    pub(crate) fn reserve_whole(&self) -> bool {
        self.free_count() >= GC_RESERVE_SEGMENTS
    }

    /// The lowest free segment. Writers (`for_gc` false) may not take the last
    /// `GC_RESERVE_SEGMENTS`; gc's copies may, so compaction can always make progress.
    pub fn take(&mut self, for_gc: bool) -> Result<Taken> {
        let reserved = self.free_count() <= GC_RESERVE_SEGMENTS;
        if reserved && !for_gc {
            return Err(Error::NoSpace);
        }
        let segment = self.free.pop_first().ok_or(Error::NoSpace)?;
        self.taken.insert(segment);
        Ok(Taken { segment, reserved })
    }

    /// Gives back a segment just taken that could not be used (its placement failed).
    pub(crate) fn untake(&mut self, segment: SegmentId) {
        if self.taken.remove(&segment) {
            self.free.insert(segment);
        }
    }

    /// Segments taken since the last commit that recorded them.
    pub fn taken(&self) -> Vec<SegmentId> {
        self.taken.iter().copied().collect()
    }

    /// A commit recorded these taken segments as used.
    pub fn recorded(&mut self, segs: &[SegmentId]) {
        for s in segs {
            self.taken.remove(s);
        }
    }

    /// gc's durable commit freed these segments: they may be taken again.
    pub fn release(&mut self, segs: &[SegmentId]) {
        self.free.extend(segs.iter().copied());
    }

    /// Returns taken, unrecorded segments for which `garbage` holds (nothing live in them)
    /// to the free set; returns them.
    pub fn reclaim(&mut self, garbage: impl Fn(SegmentId) -> bool) -> Vec<SegmentId> {
        let back: Vec<SegmentId> = self.taken.iter().copied().filter(|s| garbage(*s)).collect();
        for s in &back {
            self.taken.remove(s);
            self.free.insert(*s);
        }
        back
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u64]) -> Vec<SegmentId> {
        v.iter().map(|s| SegmentId(*s)).collect()
    }

    #[test]
    fn writers_never_take_the_reserve_and_gc_may() {
        let mut s = Segments::new((0..3).map(SegmentId).collect());
        assert_eq!(s.take(false).unwrap().segment, SegmentId(0));
        assert_eq!(s.take(false).unwrap().segment, SegmentId(1));
        assert!(
            matches!(s.take(false), Err(Error::NoSpace)),
            "the last one is gc's"
        );
        let t = s.take(true).unwrap();
        assert!(t.reserved && t.segment == SegmentId(2));
        assert!(!s.reserve_whole());
        assert_eq!(s.taken(), ids(&[0, 1, 2]));
        s.recorded(&ids(&[0, 1, 2]));
        s.release(&ids(&[0]));
        assert!(
            s.reserve_whole(),
            "gc freed a segment: the reserve is whole again"
        );
        assert!(matches!(s.take(false), Err(Error::NoSpace)));
    }

    #[test]
    fn reclaim_returns_only_garbage_segments() {
        let mut s = Segments::new((0..4).map(SegmentId).collect());
        for _ in 0..3 {
            s.take(false).unwrap();
        }
        assert_eq!(s.reclaim(|seg| seg != SegmentId(1)), ids(&[0, 2]));
        assert_eq!(s.taken(), ids(&[1]));
        assert_eq!(s.free_count(), 3);
    }
}
