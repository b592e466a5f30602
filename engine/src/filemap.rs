//! A file's content as an extent map over chunks, plus the in-memory state of a file that is
//! being written: a content-defined stream for sequential writers and fixed-offset dirty blocks
//! for everything else.
//!
//! Invariants (checked by the model test at the bottom):
//! - extents in `map` never overlap and lie below `size`;
//! - dirty blocks are newer than the map where they overlap it; bytes of a dirty block past
//!   `size` are zero;
//! - the stream's bytes are newer than the map, and no dirty block intersects a block the
//!   stream covers, so the three sources never disagree about which byte is newest.

use crate::error::{Error, Result};
use crate::format::{ChunkHash, ChunkParams, Extent};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Access to chunk bytes by content hash; the chunk store in production, a map in tests.
pub trait ChunkIo {
    /// Stores `data` (or finds it already stored) and returns its hash.
    fn put(&self, data: &[u8]) -> Result<ChunkHash>;
    /// Returns the verified bytes of a chunk.
    fn get(&self, hash: &ChunkHash) -> Result<Arc<[u8]>>;
}

/// Non-overlapping extents keyed by file offset; gaps are holes that read as zeros.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtentMap {
    extents: BTreeMap<u64, Extent>,
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
    pub fn push_loaded(&mut self, off: u64, e: Extent) -> Result<()> {
        if let Some((last_off, last)) = self.extents.iter().next_back() {
            if last_off + last.len as u64 > off {
                return Err(Error::Corrupt(format!(
                    "overlapping extents at file offset {off}"
                )));
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
    fn insert_tail(&mut self, o: u64, e: Extent, from: u64) {
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
        for (s, e) in self.pieces(off, off + buf.len() as u64) {
            let data = c.get(&e.chunk)?;
            let from = e.chunk_off as usize;
            let to = from + e.len as usize;
            if to > data.len() {
                return Err(Error::Corrupt(format!(
                    "extent at file offset {s} reaches past the end of chunk {:?}",
                    e.chunk
                )));
            }
            let at = (s - off) as usize;
            buf[at..at + e.len as usize].copy_from_slice(&data[from..to]);
        }
        Ok(())
    }
}

/// Bytes a file's dirty blocks may hold before they are flushed into chunks.
pub const DIRTY_LIMIT_BYTES: usize = 32 << 20;

struct Stream {
    start: u64,
    buf: Vec<u8>,
}

impl Stream {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
}

/// A file's content while it is open: committed map plus uncommitted changes.
///
/// Memory bound: the stream buffer holds at most `stream_cut_bytes()` plus one write request;
/// dirty blocks at most `DIRTY_LIMIT_BYTES` plus one write request.
pub struct FileState {
    params: ChunkParams,
    map: ExtentMap,
    size: u64,
    stream: Option<Stream>,
    /// Block index -> a block of `params.avg_bytes` bytes.
    dirty: BTreeMap<u64, Box<[u8]>>,
    modified: bool,
    /// One entry per `put` since the last commit: the pins this state holds in the store.
    held: Vec<ChunkHash>,
}

impl FileState {
    pub fn new(params: ChunkParams, map: ExtentMap, size: u64) -> Self {
        FileState {
            params,
            map,
            size,
            stream: None,
            dirty: BTreeMap::new(),
            modified: false,
            held: Vec::new(),
        }
    }

    /// Hands over the pins taken since the last call; the caller releases them once the
    /// commit naming these chunks is durable (or the state is discarded).
    pub fn take_held(&mut self) -> Vec<ChunkHash> {
        std::mem::take(&mut self.held)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// True if there are changes since the last `finish`.
    pub fn is_modified(&self) -> bool {
        self.modified
    }

    /// The committed form of the content; only complete after `finish`.
    pub fn map(&self) -> &ExtentMap {
        &self.map
    }

    /// Marks a state built from a committed map as a change to commit (a restore).
    pub fn mark_replaced(&mut self) {
        self.modified = true;
    }

    pub fn mark_committed(&mut self) {
        debug_assert!(self.stream.is_none() && self.dirty.is_empty());
        self.modified = false;
    }

    fn block_bytes(&self) -> u64 {
        self.params.avg_bytes as u64
    }

    /// The stream is chunked when its buffer reaches this size; every chunk but the last is
    /// final, since a FastCDC cut depends only on bytes from the chunk's start to the cut.
    fn stream_cut_bytes(&self) -> usize {
        (4 * self.params.max_bytes as usize).max(1 << 20)
    }

    fn dirty_intersects(&self, start: u64, end: u64) -> bool {
        let bs = self.block_bytes();
        self.dirty
            .range(start / bs..end.div_ceil(bs))
            .next()
            .is_some()
    }

    pub fn write(&mut self, c: &dyn ChunkIo, off: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = off + data.len() as u64;
        self.modified = true;
        if let Some(s) = &mut self.stream {
            let s_end = s.end();
            if off >= s.start && end <= s_end {
                let at = (off - s.start) as usize;
                s.buf[at..at + data.len()].copy_from_slice(data);
                return Ok(());
            }
            if off == s_end {
                if self.dirty_intersects(off, end) {
                    self.flush_dirty(c)?;
                }
                let s = self.stream.as_mut().expect("stream checked above");
                s.buf.extend_from_slice(data);
                self.size = self.size.max(end);
                if s.buf.len() >= self.stream_cut_bytes() {
                    self.cut_stream(c, false)?;
                }
                return Ok(());
            }
            self.cut_stream(c, true)?;
        }
        if off >= self.size {
            // Writing at or past the end: a sequential writer. Chunk by content.
            if self.dirty_intersects(off, end) {
                self.flush_dirty(c)?;
            }
            self.stream = Some(Stream {
                start: off,
                buf: data.to_vec(),
            });
            self.size = end;
            if data.len() >= self.stream_cut_bytes() {
                self.cut_stream(c, false)?;
            }
            return Ok(());
        }
        self.write_blocks(c, off, data)
    }

    /// Out-of-order writes land in fixed-offset blocks, filled from the map where partial.
    fn write_blocks(&mut self, c: &dyn ChunkIo, off: u64, data: &[u8]) -> Result<()> {
        debug_assert!(self.stream.is_none());
        let bs = self.block_bytes();
        let end = off + data.len() as u64;
        let mut pos = off;
        while pos < end {
            let b = pos / bs;
            let (b_start, b_end) = (b * bs, b * bs + bs);
            let piece_end = end.min(b_end);
            if !self.dirty.contains_key(&b) {
                let mut blk = vec![0u8; bs as usize].into_boxed_slice();
                let covers_all = pos == b_start && piece_end == b_end;
                if !covers_all && b_start < self.size {
                    let fill_end = b_end.min(self.size);
                    self.map
                        .read_into(c, b_start, &mut blk[..(fill_end - b_start) as usize])?;
                }
                self.dirty.insert(b, blk);
            }
            let blk = self.dirty.get_mut(&b).expect("inserted above");
            blk[(pos - b_start) as usize..(piece_end - b_start) as usize]
                .copy_from_slice(&data[(pos - off) as usize..(piece_end - off) as usize]);
            pos = piece_end;
        }
        self.size = self.size.max(end);
        if self.dirty.len() * bs as usize > DIRTY_LIMIT_BYTES {
            self.flush_dirty(c)?;
        }
        Ok(())
    }

    /// Stores one piece of content at `off`: a hole if it is all zeros, else a chunk.
    fn emit(&mut self, c: &dyn ChunkIo, off: u64, bytes: &[u8]) -> Result<()> {
        if bytes.iter().all(|&b| b == 0) {
            self.map.punch(off, off + bytes.len() as u64);
            return Ok(());
        }
        let chunk = c.put(bytes)?;
        self.held.push(chunk);
        self.map.insert(
            off,
            Extent {
                chunk,
                chunk_off: 0,
                len: bytes.len() as u32,
            },
        );
        Ok(())
    }

    /// Cuts the stream buffer into content-defined chunks. Unless `all`, the last chunk stays
    /// buffered because more data may move its end. On error nothing is lost: bytes leave the
    /// buffer only once their chunk is in the map.
    fn cut_stream(&mut self, c: &dyn ChunkIo, all: bool) -> Result<()> {
        let Some(mut s) = self.stream.take() else {
            return Ok(());
        };
        let p = self.params;
        let cuts: Vec<(usize, usize)> = fastcdc::v2020::FastCDC::new(
            &s.buf,
            p.min_bytes as usize,
            p.avg_bytes as usize,
            p.max_bytes as usize,
        )
        .map(|ch| (ch.offset, ch.length))
        .collect();
        let keep_last = usize::from(!all);
        let mut consumed = 0;
        let mut result = Ok(());
        for &(o, l) in &cuts[..cuts.len().saturating_sub(keep_last)] {
            if let Err(e) = self.emit(c, s.start + o as u64, &s.buf[o..o + l]) {
                result = Err(e);
                break;
            }
            consumed = o + l;
        }
        s.buf.drain(..consumed);
        s.start += consumed as u64;
        if !s.buf.is_empty() {
            self.stream = Some(s);
        }
        result
    }

    fn flush_dirty(&mut self, c: &dyn ChunkIo) -> Result<()> {
        let bs = self.block_bytes();
        while let Some((&b, _)) = self.dirty.first_key_value() {
            let b_start = b * bs;
            if b_start < self.size {
                let len = bs.min(self.size - b_start) as usize;
                let blk = self.dirty[&b].clone();
                self.emit(c, b_start, &blk[..len])?;
            }
            self.dirty.remove(&b);
        }
        Ok(())
    }

    /// Turns every uncommitted byte into chunks, so `map()` is the whole content.
    pub fn finish(&mut self, c: &dyn ChunkIo) -> Result<()> {
        self.cut_stream(c, true)?;
        self.flush_dirty(c)
    }

    pub fn truncate(&mut self, new_size: u64) {
        self.modified = true;
        if let Some(s) = &mut self.stream {
            if new_size <= s.start {
                self.stream = None;
            } else if new_size < s.end() {
                s.buf.truncate((new_size - s.start) as usize);
            }
        }
        let bs = self.block_bytes();
        self.dirty.split_off(&new_size.div_ceil(bs));
        if !new_size.is_multiple_of(bs) {
            if let Some(blk) = self.dirty.get_mut(&(new_size / bs)) {
                blk[(new_size % bs) as usize..].fill(0);
            }
        }
        self.map.punch(new_size, u64::MAX);
        self.size = new_size;
    }

    /// Reads up to `len` bytes at `off`, seeing uncommitted writes.
    pub fn read(&self, c: &dyn ChunkIo, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = (off + len as u64).min(self.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        self.map.read_into(c, off, &mut out)?;
        let bs = self.block_bytes();
        for (&b, blk) in self.dirty.range(off / bs..end.div_ceil(bs)) {
            overlay(&mut out, off, b * bs, blk);
        }
        if let Some(s) = &self.stream {
            overlay(&mut out, off, s.start, &s.buf);
        }
        Ok(out)
    }
}

/// Copies the part of `src` (which starts at file offset `src_off`) that falls in `out`
/// (which starts at `out_off`).
fn overlay(out: &mut [u8], out_off: u64, src_off: u64, src: &[u8]) {
    let s = out_off.max(src_off);
    let t = (out_off + out.len() as u64).min(src_off + src.len() as u64);
    if s < t {
        out[(s - out_off) as usize..(t - out_off) as usize]
            .copy_from_slice(&src[(s - src_off) as usize..(t - src_off) as usize]);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use parking_lot::Mutex;
    use rand::rngs::SmallRng;
    use rand::{Rng, RngCore, SeedableRng};
    use std::collections::HashMap;

    #[derive(Default)]
    pub(crate) struct MemChunks {
        pub chunks: Mutex<HashMap<ChunkHash, Arc<[u8]>>>,
    }

    impl ChunkIo for MemChunks {
        fn put(&self, data: &[u8]) -> Result<ChunkHash> {
            let h = ChunkHash::of(data);
            self.chunks.lock().entry(h).or_insert_with(|| data.into());
            Ok(h)
        }
        fn get(&self, hash: &ChunkHash) -> Result<Arc<[u8]>> {
            self.chunks
                .lock()
                .get(hash)
                .cloned()
                .ok_or_else(|| Error::Corrupt("missing chunk".into()))
        }
    }

    fn params() -> ChunkParams {
        ChunkParams::from_avg(4096).unwrap()
    }

    fn check_invariants(f: &FileState) {
        let mut prev_end = 0;
        for (o, e) in f.map.iter() {
            assert!(o >= prev_end, "overlapping extents");
            prev_end = o + e.len as u64;
        }
        assert!(prev_end <= f.size, "extent past size");
    }

    /// Random writes (sequential, overlapping, sparse), truncates, reads and commits against
    /// a plain byte vector. A failure prints the seed; rerun with CKPTFS_SEED=<seed>.
    #[test]
    fn file_state_matches_model() {
        let seeds: Vec<u64> = match std::env::var("CKPTFS_SEED") {
            Ok(s) => vec![s.parse().unwrap()],
            Err(_) => (0..150).collect(),
        };
        for seed in seeds {
            let result = std::panic::catch_unwind(|| run_model(seed));
            if result.is_err() {
                panic!("model test failed with seed {seed} (rerun: CKPTFS_SEED={seed})");
            }
        }
    }

    fn run_model(seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let chunks = MemChunks::default();
        let mut model: Vec<u8> = Vec::new();
        let mut f = FileState::new(params(), ExtentMap::new(), 0);
        for _ in 0..300 {
            match rng.random_range(0..100) {
                0..=34 => {
                    // sequential append, sometimes large enough to cut the stream
                    let len = rng.random_range(1..200_000);
                    let mut data = vec![0u8; len];
                    fill(&mut rng, &mut data);
                    let off = model.len() as u64;
                    f.write(&chunks, off, &data).unwrap();
                    model.extend_from_slice(&data);
                }
                35..=64 => {
                    let off = rng.random_range(0..model.len() as u64 + 20_000);
                    let len = rng.random_range(1..40_000);
                    let mut data = vec![0u8; len];
                    fill(&mut rng, &mut data);
                    f.write(&chunks, off, &data).unwrap();
                    let end = off as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                }
                65..=72 => {
                    let n = rng.random_range(0..model.len() as u64 + 10_000);
                    f.truncate(n);
                    model.resize(n as usize, 0);
                }
                73..=80 => {
                    f.finish(&chunks).unwrap();
                    f.mark_committed();
                    // Reload from the committed map, as a remount would.
                    let map = f.map.clone();
                    f = FileState::new(params(), map, model.len() as u64);
                }
                _ => {
                    let off = rng.random_range(0..model.len() as u64 + 100);
                    let len = rng.random_range(0..100_000);
                    let got = f.read(&chunks, off, len).unwrap();
                    let s = (off as usize).min(model.len());
                    let t = (off as usize + len).min(model.len());
                    assert_eq!(got, &model[s..t], "read at {off} len {len}");
                }
            }
            assert_eq!(f.size(), model.len() as u64);
            check_invariants(&f);
        }
        f.finish(&chunks).unwrap();
        check_invariants(&f);
        assert_eq!(f.read(&chunks, 0, model.len()).unwrap(), model);
    }

    /// Data with runs of zeros and repeated blocks, so holes and dedup paths are exercised.
    fn fill(rng: &mut SmallRng, data: &mut [u8]) {
        match rng.random_range(0..4) {
            0 => data.fill(0),
            1 => data.fill(rng.random()),
            _ => rng.fill_bytes(data),
        }
    }

    #[test]
    fn sequential_stream_is_content_defined() {
        // The same bytes written with an 8-byte insertion near the start share most chunks.
        let chunks = MemChunks::default();
        let mut data = vec![0u8; 4 << 20];
        SmallRng::seed_from_u64(1).fill_bytes(&mut data);
        let mut a = FileState::new(params(), ExtentMap::new(), 0);
        for piece in data.chunks(128 << 10) {
            let off = a.size();
            a.write(&chunks, off, piece).unwrap();
        }
        a.finish(&chunks).unwrap();
        let mut shifted = data[..100].to_vec();
        shifted.extend_from_slice(b"12345678");
        shifted.extend_from_slice(&data[100..]);
        let mut b = FileState::new(params(), ExtentMap::new(), 0);
        for piece in shifted.chunks(100_000) {
            let off = b.size();
            b.write(&chunks, off, piece).unwrap();
        }
        b.finish(&chunks).unwrap();
        let set_a: std::collections::HashSet<_> = a.map.iter().map(|(_, e)| e.chunk).collect();
        let shared = b
            .map
            .iter()
            .filter(|(_, e)| set_a.contains(&e.chunk))
            .count();
        assert!(
            shared * 100 >= b.map.len() * 95,
            "only {shared} of {} chunks shared",
            b.map.len()
        );
    }
}
