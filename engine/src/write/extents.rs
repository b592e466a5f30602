//! A file's committed content as an extent map over chunks, and the one painter that lays
//! chunks' bytes into a read's reply.

use crate::chunk::ChunkBytes;
use crate::error::{Corruption, Result};
use crate::format::{ChunkHash, Extent};
use crate::write::pipeline::ChunkIo;
use std::collections::BTreeMap;

/// Non-overlapping extents keyed by file offset; gaps are holes that read as zeros.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtentMap {
    pub(super) extents: BTreeMap<u64, Extent>,
}

/// A piece of a read's bytes (`ExtentMap::read_pieces_parts`).
pub enum ReadPart {
    /// Bytes of a verified chunk.
    Chunk(ChunkBytes, std::ops::Range<usize>),
    /// So many zero bytes (a hole).
    Zeros(usize),
}

impl ReadPart {
    pub fn len(&self) -> usize {
        match self {
            ReadPart::Chunk(_, r) => r.len(),
            ReadPart::Zeros(n) => *n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ExtentMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.extents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, &Extent)> {
        self.extents.iter().map(|(o, e)| (*o, e))
    }

    /// Appends an extent read back from the metadata table, checking it does not overlap.
    pub(crate) fn push_loaded(&mut self, off: u64, e: Extent) -> Result<()> {
        if let Some((last_off, last)) = self.extents.iter().next_back() {
            if last_off + last.len as u64 > off {
                return Err(Corruption::Record {
                    record: "extent record",
                    why: format!("it overlaps the extent before it at file offset {off}"),
                }
                .into());
            }
        }
        self.extents.insert(off, e);
        Ok(())
    }

    /// Removes all coverage of [start, end), splitting extents that straddle either edge.
    pub fn punch(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        if let Some((&o, &e)) = self.extents.range(..start).next_back() {
            let e_end = o + e.len as u64;
            if e_end > start {
                self.extents.insert(
                    o,
                    Extent {
                        len: (start - o) as u32,
                        ..e
                    },
                );
                if e_end > end {
                    self.insert_tail(o, e, end);
                }
            }
        }
        let inside: Vec<u64> = self.extents.range(start..end).map(|(o, _)| *o).collect();
        for o in inside {
            let e = self.extents.remove(&o).expect("key just listed");
            if o + e.len as u64 > end {
                self.insert_tail(o, e, end);
            }
        }
    }

    /// Re-inserts the part of extent `e` (at `o`) that lies at or after `from`.
    pub(super) fn insert_tail(&mut self, o: u64, e: Extent, from: u64) {
        let cut = (from - o) as u32;
        self.extents.insert(
            from,
            Extent {
                chunk: e.chunk,
                chunk_off: e.chunk_off + cut,
                len: e.len - cut,
            },
        );
    }

    pub fn insert(&mut self, off: u64, e: Extent) {
        self.punch(off, off + e.len as u64);
        self.extents.insert(off, e);
    }

    /// The extents overlapping [start, end), clipped to it.
    pub fn pieces(&self, start: u64, end: u64) -> Vec<(u64, Extent)> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let first = self
            .extents
            .range(..=start)
            .next_back()
            .map(|(o, _)| *o)
            .unwrap_or(start);
        for (&o, &e) in self.extents.range(first..end) {
            let e_end = o + e.len as u64;
            if e_end <= start {
                continue;
            }
            let s = o.max(start);
            let t = e_end.min(end);
            out.push((
                s,
                Extent {
                    chunk: e.chunk,
                    chunk_off: e.chunk_off + (s - o) as u32,
                    len: (t - s) as u32,
                },
            ));
        }
        out
    }

    /// Copies the bytes of [off, off + buf.len()) into `buf`; holes are left untouched.
    pub fn read_into(&self, c: &dyn ChunkIo, off: u64, buf: &mut [u8]) -> Result<()> {
        Self::read_pieces(c, self.pieces(off, off + buf.len() as u64), off, buf)
    }

    /// The `len` bytes at `off` given `pieces` (the map's pieces of that range, in order),
    /// appended to `out` (emptied first; a reader reuses it, so its pages are not faulted in
    /// again for every reply). Built by appending, so only holes are zeroed (a read reply's
    /// bytes are otherwise written twice). Needs no access to the map itself, so a reader
    /// can take the pieces under the file's lock and read without it.
    pub fn read_pieces_to(
        c: &dyn ChunkIo,
        pieces: Vec<(u64, Extent)>,
        off: u64,
        len: usize,
        out: &mut Vec<u8>,
        copy: &crate::write::pipeline::Stage,
    ) -> Result<()> {
        let hashes: Vec<ChunkHash> = pieces.iter().map(|(_, e)| e.chunk).collect();
        let chunks = c.get_many(&hashes)?;
        // Timed apart from the chunk reads above (their own stages): the copy into the
        // reply is the `reply` stage's, with the bytes counted where the reply goes out.
        copy.time(0, || {
            out.clear();
            out.reserve(len);
            Self::paint(&pieces, &chunks, off, |at, bytes| {
                debug_assert!(at >= out.len(), "pieces are in order and do not overlap");
                out.resize(at, 0);
                out.extend_from_slice(bytes);
            })?;
            out.resize(len, 0);
            Ok(())
        })
    }

    /// `read_pieces_to` without the copy: the read's bytes as the verified chunks' ranges
    /// and runs of zeros (holes) in file order, `len` bytes in all, for a reply that the
    /// kernel gathers from them (`fuser::ReplyData::data_vectored`).
    pub fn read_pieces_parts(
        c: &dyn ChunkIo,
        pieces: Vec<(u64, Extent)>,
        off: u64,
        len: usize,
    ) -> Result<Vec<ReadPart>> {
        let hashes: Vec<ChunkHash> = pieces.iter().map(|(_, e)| e.chunk).collect();
        let chunks = c.get_many(&hashes)?;
        let mut parts = Vec::with_capacity(pieces.len() + 1);
        let mut pos = 0;
        Self::paint_ranges(&pieces, &chunks, off, |at, chunk, range| {
            debug_assert!(at >= pos, "pieces are in order and do not overlap");
            // Clipped to the read, as `read_pieces_to`'s final resize does.
            let n = range.len().min(len.saturating_sub(at));
            if n == 0 {
                return;
            }
            if at > pos {
                parts.push(ReadPart::Zeros(at - pos));
            }
            parts.push(ReadPart::Chunk(chunk.clone(), range.start..range.start + n));
            pos = at + n;
        })?;
        if len > pos {
            parts.push(ReadPart::Zeros(len - pos));
        }
        Ok(parts)
    }

    /// The one place extents become bytes (this slot's file maps and other slots'
    /// published extents alike): hands each piece's bytes in its chunk (`chunks`, in the
    /// pieces' order) to `put`, with where they go relative to file offset `off`. A piece
    /// that does not fit its chunk (a malformed record) is corruption, reported: never a
    /// panic, never wrong bytes.
    pub(crate) fn paint(
        pieces: &[(u64, Extent)],
        chunks: &[ChunkBytes],
        off: u64,
        mut put: impl FnMut(usize, &[u8]),
    ) -> Result<()> {
        Self::paint_ranges(pieces, chunks, off, |at, chunk, range| {
            put(at, &chunk[range])
        })
    }

    /// `paint`, handing over each piece's chunk and the range of it the piece takes.
    pub(super) fn paint_ranges(
        pieces: &[(u64, Extent)],
        chunks: &[ChunkBytes],
        off: u64,
        mut put: impl FnMut(usize, &ChunkBytes, std::ops::Range<usize>),
    ) -> Result<()> {
        for ((s, e), data) in pieces.iter().zip(chunks) {
            let from = e.chunk_off as usize;
            let to = from + e.len as usize;
            if to > data.len() {
                return Err(Corruption::Record {
                    record: "extent record",
                    why: format!(
                        "the extent at file offset {s} reaches past the end of chunk {}",
                        e.chunk
                    ),
                }
                .into());
            }
            put((s - off) as usize, data, from..to);
        }
        Ok(())
    }

    /// Copies the bytes of `pieces` (from `pieces()`) into `buf`, which starts at file
    /// offset `off`; holes are left untouched.
    pub fn read_pieces(
        c: &dyn ChunkIo,
        pieces: Vec<(u64, Extent)>,
        off: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let hashes: Vec<ChunkHash> = pieces.iter().map(|(_, e)| e.chunk).collect();
        let chunks = c.get_many(&hashes)?;
        Self::paint(&pieces, &chunks, off, |at, bytes| {
            buf[at..at + bytes.len()].copy_from_slice(bytes)
        })
    }
}
