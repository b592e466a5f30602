//! A file's content as an extent map over chunks, plus the in-memory state of a file that is
//! being written: a content-defined stream for sequential writers and fixed-offset dirty blocks
//! for everything else.
//!
//! Invariants (checked by the model test in `write/tests.rs`):
//! - extents in `map` never overlap and lie below `size`;
//! - dirty blocks are newer than the map where they overlap it; bytes of a dirty block past
//!   `size` are zero;
//! - the stream's bytes are newer than the map, and no dirty block intersects a block the
//!   stream covers, so the three sources never disagree about which byte is newest.

use super::*;
use crate::error::Result;
use crate::format::{ChunkHash, ChunkParams, Extent};
use crate::pins::ChunkPins;
use crate::write::pipeline::ChunkIo;
use crate::write::pipeline::{Piece, SharedBytes};
use crate::write::spill::SpillSlot;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// A file's content while it is open: committed map plus uncommitted changes.
///
/// Memory bound: the stream buffer holds at most `stream_cut_bytes()` plus one write request;
/// dirty blocks at most `DIRTY_LIMIT_BYTES` plus one write request; pieces in flight are
/// bounded by the store's pipeline budget (shared by all files).
pub struct FileState {
    pub(super) params: ChunkParams,
    pub(super) map: ExtentMap,
    pub(super) size: u64,
    /// Pieces handed to the store, oldest first; they retire into `map` in this order.
    pub(super) inflight: VecDeque<InFlight>,
    pub(super) stream: Option<Stream>,
    /// Block index -> a block of `params.avg_bytes` bytes.
    pub(super) dirty: BTreeMap<u64, Box<[u8]>>,
    /// A layer of a file several nodes write (`into_layered`): its holes are no writes and
    /// zeros written are writes, since an older layer shows through a hole. Then a dirty
    /// block is not filled from the map, and `written` says which of its bytes were
    /// written; only those become chunks.
    pub(super) layered: bool,
    /// Of a layered state: block index -> the written byte ranges of that dirty block,
    /// sorted, disjoint and not touching (at most one range per write request).
    pub(super) written: BTreeMap<u64, Vec<(u32, u32)>>,
    pub(super) modified: bool,
    /// When the first change since the last commit came (`modified` turning true): a
    /// revision's write time runs from here to its commit.
    pub(super) first_change: Option<std::time::Instant>,
    /// One entry per `put` (and pasted extent) since the last commit: the pins this state
    /// holds in the store, released when it commits or is dropped.
    pub(super) held: ChunkPins,
}

/// A discarded state (an unlink, a failed save given up, a restore replacing it) releases
/// its pins, including those of pieces the workers are still storing: it waits for them.
impl Drop for FileState {
    fn drop(&mut self) {
        self.forget_inflight();
    }
}

impl FileState {
    /// `pins`: an empty set from the store the state's chunks go to
    /// (`ChunkStore::new_pins`), which takes the pins of the chunks it puts.
    pub fn new(params: ChunkParams, map: ExtentMap, size: u64, pins: ChunkPins) -> Self {
        FileState {
            params,
            map,
            size,
            inflight: VecDeque::new(),
            stream: None,
            dirty: BTreeMap::new(),
            layered: false,
            written: BTreeMap::new(),
            modified: false,
            first_change: None,
            held: pins,
        }
    }

    /// Makes a new state the state of one layer of a file that several nodes write (N-1
    /// across slots), before anything was written to it: bytes it is not given stay holes,
    /// also inside a block written in part (an older layer shows through them), and all-zero
    /// pieces are stored as chunks (a written zero hides the older layers' bytes).
    pub fn into_layered(mut self) -> Self {
        debug_assert!(self.dirty.is_empty() && self.stream.is_none());
        self.layered = true;
        self
    }

    /// Hands over the pins taken since the last call; dropping them releases them, which
    /// the caller does once the commit naming these chunks is durable. Waits for pieces still
    /// in flight and forgets them: call it only after `finish`.
    pub(crate) fn take_pins(&mut self) -> ChunkPins {
        self.forget_inflight();
        self.held.split_off()
    }

    /// Waits for the pieces handed to the store and keeps their pins in `held`; forgets the
    /// rest of what is in flight.
    pub(super) fn forget_inflight(&mut self) {
        // Cut entries hold no pins (their pieces have not been handed to the store).
        for f in self.inflight.drain(..) {
            if let Work::Chunk {
                ticket: Some(t), ..
            } = f.work
            {
                if let Ok(h) = t.wait() {
                    self.held.adopt(h);
                }
            }
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Nothing uncommitted: the content is exactly `map()` and `size()`.
    pub fn is_clean(&self) -> bool {
        !self.modified && self.stream.is_none() && self.dirty.is_empty() && self.inflight.is_empty()
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
    /// Not a write: its revision's write time stays unmeasured (0), so `ckptfs advise`
    /// does not take a restore for a checkpoint.
    pub fn mark_replaced(&mut self) {
        self.modified = true;
    }

    pub fn mark_committed(&mut self) {
        debug_assert!(self.stream.is_none() && self.dirty.is_empty() && self.inflight.is_empty());
        self.modified = false;
        self.first_change = None;
    }

    pub(super) fn touch(&mut self) {
        if !self.modified {
            self.modified = true;
            self.first_change = Some(crate::clock::instant());
        }
    }

    /// Milliseconds since the first change not yet committed (0: none), saturating.
    pub(crate) fn write_ms(&self) -> u32 {
        self.first_change.map_or(0, |t| {
            crate::clock::since(t).as_millis().min(u32::MAX as u128) as u32
        })
    }

    pub(super) fn block_bytes(&self) -> u64 {
        self.params.avg_bytes as u64
    }

    /// The stream is chunked when its buffer reaches this size; every chunk but the last is
    /// final, since a FastCDC cut depends only on bytes from the chunk's start to the cut.
    /// With many files written at once, each gets its share of `STREAM_BYTES` (cut sooner,
    /// in more segments: the same chunks).
    pub(super) fn stream_cut_bytes(&self, c: &dyn ChunkIo) -> usize {
        use crate::write::pipeline::{STREAM_BYTES, STREAM_MIN_BYTES};
        let full = (4 * self.params.max_bytes as usize).max(1 << 20);
        match c.cutters().and_then(|p| p.live_streams()) {
            Some(n) => {
                let share = STREAM_BYTES / n.load(std::sync::atomic::Ordering::Relaxed).max(1);
                full.min(share.max(STREAM_MIN_BYTES))
            }
            None => full,
        }
    }

    pub(super) fn dirty_intersects(&self, start: u64, end: u64) -> bool {
        let bs = self.block_bytes();
        self.dirty
            .range(start / bs..end.div_ceil(bs))
            .next()
            .is_some()
    }

    pub fn write(&mut self, c: &dyn ChunkIo, off: u64, data: &[u8]) -> Result<()> {
        self.write_from(c, off, data, None)
    }

    /// `write` of bytes the caller shares (`SharedBytes::window` of the request they came
    /// in): a sequential write of half a segment or more becomes a segment as it is, without
    /// being copied into a stream buffer first (what was buffered before it goes as the
    /// segment before). Everything else is as `write` (the bytes are copied where they join
    /// a buffer).
    pub fn write_shared(&mut self, c: &dyn ChunkIo, off: u64, data: SharedBytes) -> Result<()> {
        self.write_from(c, off, &data, Some(&data))
    }

    pub(super) fn write_from(
        &mut self,
        c: &dyn ChunkIo,
        off: u64,
        data: &[u8],
        shared: Option<&SharedBytes>,
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = off + data.len() as u64;
        self.touch();
        // A request in its own buffer of half a segment or more becomes a segment as it is
        // where it goes on a sequential stream: not only a whole segment, since a writer
        // whose buffer is not page-aligned (malloc's are not) has each write split by the
        // kernel at a page boundary, into a request a few bytes short of the segment and one
        // of those few bytes. Copying the short one in was every byte of such a writer
        // (0.1 CPU-s/GiB).
        let segment = shared.filter(|_| data.len() >= self.stream_cut_bytes(c) / 2);
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
                if segment.is_some() && off >= self.size {
                    // After a small request (the few bytes of the last split write): what
                    // is buffered goes as a segment of its own, these bytes as the next one.
                    self.cut_stream(c, false)?;
                } else {
                    let s = self.stream.as_mut().expect("stream checked above");
                    s.buf.extend_from_slice(data);
                    self.size = self.size.max(end);
                    if s.buf.len() >= self.stream_cut_bytes(c) {
                        self.cut_stream(c, false)?;
                    }
                    return Ok(());
                }
            } else {
                self.cut_stream(c, true)?;
            }
        }
        if off >= self.size {
            // Writing at or past the end: a sequential writer. Chunk by content.
            if self.dirty_intersects(off, end) {
                self.flush_dirty(c)?;
            }
            if let Some(sh) = segment {
                self.size = end;
                self.hand_over(c, off, sh.clone(), false);
                return self.retire(c, false);
            }
            let cut = self.stream_cut_bytes(c);
            // A request that nearly fills the stream (the head of a large write the kernel
            // split at a page boundary, copied where the caller does not share its buffer)
            // gets room for the rest, so the tail does not double a 1 MiB buffer into 2 MiB.
            let live = c
                .cutters()
                .and_then(|p| p.live_streams())
                .map(LiveStream::new);
            let mut buf = Vec::with_capacity(if data.len() >= cut / 2 {
                cut.max(data.len())
            } else {
                data.len()
            });
            buf.extend_from_slice(data);
            self.stream = Some(Stream {
                start: off,
                buf,
                _live: live,
            });
            self.size = end;
            if data.len() >= cut {
                self.cut_stream(c, false)?;
            }
            return Ok(());
        }
        self.write_blocks(c, off, data)
    }

    /// Out-of-order writes land in fixed-offset blocks, filled from the map where partial.
    pub(super) fn write_blocks(&mut self, c: &dyn ChunkIo, off: u64, data: &[u8]) -> Result<()> {
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
                // A layer's block is not filled: what it was not given stays the map's (or
                // a hole), and only its written ranges become chunks (`flush_dirty`).
                if !covers_all && !self.layered && b_start < self.size {
                    let fill_end = b_end.min(self.size);
                    self.read_base(c, b_start, &mut blk[..(fill_end - b_start) as usize])?;
                }
                self.dirty.insert(b, blk);
            }
            let blk = self.dirty.get_mut(&b).expect("inserted above");
            blk[(pos - b_start) as usize..(piece_end - b_start) as usize]
                .copy_from_slice(&data[(pos - off) as usize..(piece_end - off) as usize]);
            if self.layered {
                let w = self.written.entry(b).or_default();
                add_range(w, (pos - b_start) as u32, (piece_end - b_start) as u32);
            }
            pos = piece_end;
        }
        self.size = self.size.max(end);
        if self.dirty.len() * bs as usize > DIRTY_LIMIT_BYTES {
            self.flush_dirty(c)?;
        }
        Ok(())
    }

    /// Hands pieces of content (file offset, bytes) to the store, in order: a hole where a
    /// piece is all zeros, else a chunk. They reach the map when they retire (`retire`).
    pub(super) fn emit(&mut self, c: &dyn ChunkIo, pieces: Vec<(u64, Piece)>) -> Result<()> {
        // Whatever comes after a stream being cut ends it: its pieces take its place, and
        // it must not take bytes newer than these.
        self.end_cut(c);
        for (off, piece) in pieces {
            let work = if !self.layered && all_zero(piece.bytes()) {
                Work::Hole(piece.len() as u64)
            } else {
                Work::Chunk {
                    piece,
                    ticket: None,
                }
            };
            self.inflight.push_back(InFlight { off, work });
        }
        self.retire(c, false)
    }

    /// The cut in progress, if it is the newest entry and still takes bytes.
    pub(super) fn open_cut(&self) -> Option<Arc<CutState>> {
        match self.inflight.back() {
            Some(InFlight {
                work: Work::Cut(st),
                ..
            }) if !st.m.lock().finish => Some(st.clone()),
            _ => None,
        }
    }

    /// Hands stream bytes at `start` to the cutter (a new cut if none takes bytes); with
    /// `finish` the stream ends there. Waits while the cutter is `CUT_QUEUE_BYTES` behind.
    pub(super) fn hand_over(
        &mut self,
        c: &dyn ChunkIo,
        start: u64,
        buf: SharedBytes,
        finish: bool,
    ) {
        // A stream that starts elsewhere than where the open cut ends (a writer that skipped
        // ahead after its whole buffer was handed over) is a new stream: the open one ends.
        let open = self.open_cut();
        // A whole small stream ending now (a small file's close): its cut is a few
        // microseconds, far less than waking a worker for it and waiting (`SMALL_STREAM`).
        let whole_small = finish && open.is_none() && buf.len() <= SMALL_STREAM;
        if open.as_ref().is_some_and(|st| st.m.lock().end != start) {
            self.end_cut(c);
        }
        let st = match open.filter(|st| st.m.lock().end == start) {
            Some(st) => st,
            None => {
                let st = CutState::new(
                    Cutter::new(self.params, c.successors()),
                    start,
                    c.cutters().and_then(|p| p.carries()),
                );
                self.inflight.push_back(InFlight {
                    off: start,
                    work: Work::Cut(st.clone()),
                });
                st
            }
        };
        // Not under the cut's lock: the cutter needs it to make room.
        let permit = c.cutters().and_then(|p| p.reserve_cut(buf.len()));
        // (a cutter to start, and whether to run it on this thread)
        let spawn = {
            let mut g = st.m.lock();
            while g.queued > CUT_QUEUE_BYTES {
                st.cv.wait(&mut g);
            }
            if g.failed.is_some() {
                // The stream's carry was lost while this writer waited: the file's writes
                // fail from here on (`take_cuts`), and these bytes cannot join the stream.
                return;
            }
            g.permits.push_back(permit);
            assert_eq!(g.end, start, "stream segments are back to back");
            g.end = start + buf.len() as u64;
            g.queued += buf.len();
            g.segs.push_back((start, buf));
            g.finish |= finish;
            let spawn = !std::mem::replace(&mut g.running, true);
            (spawn, spawn && (g.here || whole_small))
        };
        match spawn {
            // No cutter runs, so this segment is the only one queued: cut it here.
            (true, true) => match c.cutters() {
                Some(p) => p.cut_here(&mut || st.run()),
                None => st.run(),
            },
            (true, false) => {
                let st = st.clone();
                run_cutter(c, Box::new(move || st.run()));
            }
            (false, _) => {}
        }
    }

    /// Ends the cut in progress (its last chunk is cut to the end of what it has).
    pub(super) fn end_cut(&mut self, c: &dyn ChunkIo) {
        if let Some(st) = self.open_cut() {
            let spawn = {
                let mut g = st.m.lock();
                g.finish = true;
                !std::mem::replace(&mut g.running, true)
            };
            if spawn {
                run_cutter(c, Box::new(move || st.run()));
            }
        }
    }

    /// Puts the pieces cut so far in place of their cut entries (in order), and drops the
    /// cut entries that are done. Returns whether any cut entry is left; fails if a cut
    /// lost its carry (the entry stays, so every later call fails too).
    pub(super) fn take_cuts(&mut self) -> Result<bool> {
        let mut left = false;
        let mut i = 0;
        while i < self.inflight.len() {
            let Work::Cut(st) = &self.inflight[i].work else {
                i += 1;
                continue;
            };
            let st = st.clone();
            let (pieces, done, failed) = {
                let mut g = st.m.lock();
                let pieces = std::mem::take(&mut g.out);
                if let Some((o, p, _)) = pieces.last() {
                    g.taken_to = o + p.len() as u64;
                }
                // Cut segments are no longer needed for reads: their bytes are in pieces and
                // the carry. (Keeping each file's last segment until its next write held a
                // request's bytes per open file, a GiB for a thousand files.)
                while g.next > usize::from(g.in_cut) {
                    g.segs.pop_front();
                    g.next -= 1;
                }
                (pieces, g.done(), g.failed.clone())
            };
            for (off, piece, zero) in pieces {
                let work = if zero && !self.layered {
                    Work::Hole(piece.len() as u64)
                } else {
                    Work::Chunk {
                        piece,
                        ticket: None,
                    }
                };
                self.inflight.insert(i, InFlight { off, work });
                i += 1;
            }
            if let Some(msg) = failed {
                return Err(std::io::Error::other(msg).into());
            }
            if done {
                self.inflight.remove(i);
            } else {
                left = true;
                i += 1;
            }
        }
        Ok(left)
    }

    /// Waits until every cut entry is done and its pieces are in its place. Cuts must be
    /// ended first (`end_cut`).
    pub(super) fn wait_cuts(&mut self) -> Result<()> {
        while self.take_cuts()? {
            let st = self.inflight.iter().find_map(|f| match &f.work {
                Work::Cut(st) => Some(st.clone()),
                _ => None,
            });
            if let Some(st) = st {
                st.finish_and_wait();
            }
        }
        Ok(())
    }

    /// Moves finished pieces into the map, oldest first, stopping at the first unfinished
    /// one unless `wait`. Pieces not yet handed to the store (new, or failed before) are
    /// handed over first, in one batch. With `wait`, every piece is waited for (cuts must
    /// have been ended); the first failure is returned and the failed pieces (and those
    /// after them) stay, to be handed over again by the next call.
    pub(super) fn retire(&mut self, c: &dyn ChunkIo, wait: bool) -> Result<()> {
        if wait {
            self.wait_cuts()?;
        } else {
            self.take_cuts()?;
        }
        let unsent: Vec<Piece> = self
            .inflight
            .iter()
            .filter_map(|f| match &f.work {
                Work::Chunk {
                    piece,
                    ticket: None,
                } => Some(piece.clone()),
                _ => None,
            })
            .collect();
        if !unsent.is_empty() {
            let mut tickets = c.submit_all(unsent).into_iter();
            for f in self.inflight.iter_mut() {
                if let Work::Chunk {
                    ticket: t @ None, ..
                } = &mut f.work
                {
                    *t = Some(tickets.next().expect("one ticket per piece"));
                }
            }
        }
        self.drain(wait)
    }

    /// Retires pieces into the map, oldest first, stopping at the first unfinished one
    /// unless `wait` (then every piece handed over is waited for). A failed piece, and one
    /// not handed over, stays with everything after it; the first failure is returned.
    pub(super) fn drain(&mut self, wait: bool) -> Result<()> {
        let mut first_err = None;
        let mut i = 0;
        while i < self.inflight.len() {
            let f = &mut self.inflight[i];
            let outcome = match &mut f.work {
                Work::Hole(_) => None,
                // Only without `wait`: a stream still being cut.
                Work::Cut(_) => break,
                Work::Chunk { ticket, .. } => {
                    let Some(t) = ticket.as_ref() else {
                        // Not handed over (a state settled without a store).
                        if !wait {
                            break;
                        }
                        i += 1;
                        continue;
                    };
                    if !wait && !t.is_done() {
                        break;
                    }
                    match t.wait() {
                        Ok(h) => Some(h),
                        Err(e) => {
                            *ticket = None;
                            if first_err.is_none() {
                                first_err = Some(e);
                            }
                            if !wait {
                                break;
                            }
                            i += 1;
                            continue;
                        }
                    }
                }
            };
            if i > 0 {
                // Behind a failed piece: must not overtake it into the map.
                i += 1;
                continue;
            }
            let f = self.inflight.pop_front().expect("index 0 exists");
            self.apply(f.off, f.len(), outcome);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Puts a retired piece into the map: a chunk, or a hole (None).
    pub(super) fn apply(&mut self, off: u64, len: u64, chunk: Option<ChunkHash>) {
        match chunk {
            None => self.map.punch(off, off + len),
            Some(chunk) => {
                self.held.adopt(chunk);
                self.map.insert(
                    off,
                    Extent {
                        chunk,
                        chunk_off: 0,
                        len: len as u32,
                    },
                );
            }
        }
    }

    /// Ends and waits for every cut, then waits for every piece in flight and retires what
    /// succeeded, without handing anything over; what stays behind a failed or unsent piece
    /// is left in order.
    pub(super) fn settle(&mut self) {
        if let Some(st) = self.open_cut() {
            st.finish_and_wait();
        }
        // A lost carry is reported by the next `retire`.
        let _ = self.wait_cuts();
        // Failures stay in flight, to be handed over again by the next `retire`.
        let _ = self.drain(true);
    }

    /// Waits for the pieces handed over and marks every failed one to be handed over
    /// again. After gc has made room, failures that happened before it are stale: a write
    /// retried then must not report the next of them (the pipeline may have had many
    /// pieces fail at once when the space ran full).
    pub fn retry_failed(&mut self) {
        for f in self.inflight.iter_mut() {
            if let Work::Chunk { ticket, .. } = &mut f.work {
                if ticket.as_ref().is_some_and(|t| t.wait().is_err()) {
                    *ticket = None;
                }
            }
        }
    }

    /// The committed map with the pieces in flight laid over it: the content below the
    /// dirty blocks and the stream.
    pub(super) fn read_base(&self, c: &dyn ChunkIo, off: u64, buf: &mut [u8]) -> Result<()> {
        self.map.read_into(c, off, buf)?;
        for f in &self.inflight {
            match &f.work {
                Work::Hole(n) => zero_range(buf, off, f.off, *n),
                Work::Chunk { piece, .. } => overlay(buf, off, f.off, piece.bytes()),
                Work::Cut(st) => {
                    // Pieces already taken lie before this entry; the rest is in the
                    // segments not yet cut, the pieces not yet taken and the carry (where
                    // they overlap, they hold the same stream bytes).
                    let g = st.m.lock();
                    for (o, seg) in &g.segs {
                        overlay(buf, off, *o, seg);
                    }
                    for (o, piece, _) in &g.out {
                        overlay(buf, off, *o, piece.bytes());
                    }
                    match &g.spilled {
                        Some(slot) => overlay_spilled(buf, off, g.carry_start, slot)?,
                        None => overlay(buf, off, g.carry_start, &g.carry),
                    }
                }
            }
        }
        Ok(())
    }

    /// Hands the stream buffer to the cutter (a worker cuts it into content-defined chunks
    /// and carries the last, unfinished chunk into the next buffer). With `all` the stream
    /// ends: its last chunk is cut at its end.
    pub(super) fn cut_stream(&mut self, c: &dyn ChunkIo, all: bool) -> Result<()> {
        match self.stream.take() {
            Some(s) => self.hand_over(c, s.start, s.buf.into(), all),
            None if all => self.end_cut(c),
            None => {}
        }
        self.retire(c, false)
    }

    /// Bytes this state holds in memory: its stream buffer, dirty blocks, and the stream
    /// segments and pieces it handed over that have not retired into the map. What the fs
    /// layer bounds over all open files (`release`).
    pub fn held_bytes(&self) -> usize {
        let stream = self.stream.as_ref().map_or(0, |s| s.buf.capacity());
        let dirty = self.dirty.len() * self.block_bytes() as usize;
        let inflight: u64 = self
            .inflight
            .iter()
            .map(|f| match &f.work {
                Work::Hole(_) => 0,
                // A spilled carry is not in memory.
                Work::Cut(st) => {
                    f.len() - st.m.lock().spilled.as_ref().map_or(0, |s| s.len() as u64)
                }
                Work::Chunk { .. } => f.len(),
            })
            .sum();
        stream + dirty + inflight as usize
    }

    /// Whether pieces are on their way into the map: handed to the store and not retired,
    /// or cut (or being cut) and not yet taken. A cut that only carries its unfinished chunk
    /// is not.
    pub fn has_pieces_in_flight(&self) -> bool {
        self.inflight.iter().any(|f| match &f.work {
            Work::Hole(_) => false,
            Work::Chunk { .. } => true,
            Work::Cut(st) => {
                let g = st.m.lock();
                g.running || !g.out.is_empty() || g.next < g.segs.len()
            }
        })
    }

    /// Lets go of what this state need not hold: retires the pieces the workers finished
    /// (their bytes are freed once in the map) and hands over the pieces its cutter cut;
    /// with `all`, also hands its stream buffer to the cutter and its dirty blocks to the
    /// store. A file's own writes and commit do this for it; this is for files that are
    /// open but not being written this moment, which would otherwise hold their last
    /// request's bytes (and with `all`, up to a stream buffer and 32 MiB of dirty blocks)
    /// until their next write, so the daemon's memory would grow with the number of files
    /// open for writing. Nothing here changes content or chunk boundaries: a stream cut in
    /// more segments gives the same chunks.
    pub fn release(&mut self, c: &dyn ChunkIo, all: bool) -> Result<()> {
        if all {
            if let Some(s) = self.stream.take() {
                self.hand_over(c, s.start, s.buf.into(), false);
            }
            // Not when there are none: handing over pieces ends the cut in progress.
            if !self.dirty.is_empty() {
                self.flush_dirty(c)?;
            }
        }
        self.retire(c, false)
    }

    pub(super) fn flush_dirty(&mut self, c: &dyn ChunkIo) -> Result<()> {
        let bs = self.block_bytes();
        let mut pieces = Vec::with_capacity(self.dirty.len());
        while let Some((b, blk)) = self.dirty.pop_first() {
            let b_start = b * bs;
            if b_start >= self.size {
                continue;
            }
            let len = bs.min(self.size - b_start) as usize;
            if self.layered {
                let written = self.written.remove(&b).unwrap_or_default();
                let all: SharedBytes = blk.into_vec().into();
                for (lo, hi) in written {
                    let hi = (hi as usize).min(len);
                    if (lo as usize) < hi {
                        let piece = Piece::new(all.clone(), lo as usize, hi - lo as usize);
                        pieces.push((b_start + lo as u64, piece));
                    }
                }
            } else {
                pieces.push((b_start, Piece::new(blk.into_vec().into(), 0, len)));
            }
        }
        self.written.clear();
        self.emit(c, pieces)
    }

    /// Turns every uncommitted byte into chunks and waits until they are stored, so `map()`
    /// is the whole content. On error nothing is lost: the pieces that failed stay in flight
    /// and the next call hands them over again.
    pub fn finish(&mut self, c: &dyn ChunkIo) -> Result<()> {
        self.cut_stream(c, true)?;
        self.flush_dirty(c)?;
        self.retire(c, true)
    }

    pub fn truncate(&mut self, new_size: u64) {
        self.touch();
        // Pieces in flight retire in order into the map, so what lies past the new end must
        // not be among them: wait, retire what is stored, and cut what is left.
        self.settle();
        let mut kept = VecDeque::with_capacity(self.inflight.len());
        for mut f in self.inflight.drain(..) {
            if f.off >= new_size {
                if let Work::Chunk {
                    ticket: Some(t), ..
                } = &f.work
                {
                    // Stored behind a failed piece: its pin is held until the next commit.
                    if let Ok(h) = t.wait() {
                        self.held.adopt(h);
                    }
                }
                continue;
            }
            let keep = (new_size - f.off).min(f.len());
            match &mut f.work {
                Work::Cut(_) => unreachable!("settle waited for every cut"),
                Work::Hole(n) => *n = keep,
                Work::Chunk { piece, ticket } => {
                    if keep < piece.len() as u64 {
                        if let Some(Ok(h)) = ticket.take().map(|t| t.wait()) {
                            self.held.adopt(h);
                        }
                        *piece = piece.truncated(keep as usize);
                    }
                }
            }
            kept.push_back(f);
        }
        self.inflight = kept;
        if let Some(s) = &mut self.stream {
            if new_size <= s.start {
                self.stream = None;
            } else if new_size < s.end() {
                s.buf.truncate((new_size - s.start) as usize);
            }
        }
        let bs = self.block_bytes();
        self.dirty.split_off(&new_size.div_ceil(bs));
        self.written.split_off(&new_size.div_ceil(bs));
        if !new_size.is_multiple_of(bs) {
            if let Some(blk) = self.dirty.get_mut(&(new_size / bs)) {
                blk[(new_size % bs) as usize..].fill(0);
            }
            if let Some(w) = self.written.get_mut(&(new_size / bs)) {
                let cut = (new_size % bs) as u32;
                w.retain(|r| r.0 < cut);
                if let Some(last) = w.last_mut() {
                    last.1 = last.1.min(cut);
                }
            }
        }
        self.map.punch(new_size, u64::MAX);
        self.size = new_size;
    }

    /// Makes [start, end) a hole (reads return zeros) without changing the size: fallocate's
    /// PUNCH_HOLE and ZERO_RANGE. Settles the state first (`finish`), so nothing in flight
    /// retires into the range afterwards.
    pub fn punch_hole(&mut self, c: &dyn ChunkIo, start: u64, end: u64) -> Result<()> {
        let end = end.min(self.size);
        if start >= end {
            return Ok(());
        }
        self.finish(c)?;
        if self.layered {
            // A hole in a layer is no write (the older layers show through it): what reads
            // as zeros here must be written zeros.
            const STEP: u64 = 1 << 20;
            let zeros = vec![0u8; STEP.min(end - start) as usize];
            let mut at = start;
            while at < end {
                let n = STEP.min(end - at) as usize;
                self.write(c, at, &zeros[..n])?;
                at += n as u64;
            }
            return self.finish(c);
        }
        self.map.punch(start, end);
        self.touch();
        Ok(())
    }

    /// The extents of [start, end) of a settled state (after `finish`), clipped to it, with
    /// offsets relative to `start`; ranges without an extent are holes.
    pub fn copy_source(&self, start: u64, end: u64) -> Vec<(u64, Extent)> {
        debug_assert!(self.stream.is_none() && self.dirty.is_empty() && self.inflight.is_empty());
        let end = end.min(self.size);
        self.map
            .pieces(start, end)
            .into_iter()
            .map(|(o, e)| (o - start, e))
            .collect()
    }

    /// Places `pieces` (from `copy_source`) at `off` as the content of [off, off + len):
    /// a metadata-only copy. The chunks must be pinned for this state already (`pinned`, one
    /// pin per entry, released at the next commit like the pins of written chunks). Settles
    /// the state first, so nothing in flight retires over the copied range afterwards.
    pub fn paste(
        &mut self,
        c: &dyn ChunkIo,
        off: u64,
        len: u64,
        pieces: &[(u64, Extent)],
        pinned: ChunkPins,
    ) -> Result<()> {
        // Dropped with the error if the state cannot settle: the copy did not happen.
        self.finish(c)?;
        self.held.absorb(pinned);
        if len == 0 {
            return Ok(());
        }
        self.map.punch(off, off + len);
        for (rel, e) in pieces {
            self.map.insert(off + rel, *e);
        }
        self.size = self.size.max(off + len);
        self.touch();
        Ok(())
    }

    /// Reads up to `len` bytes at `off`, seeing uncommitted writes.
    pub fn read(&self, c: &dyn ChunkIo, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = (off + len as u64).min(self.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        self.read_base(c, off, &mut out)?;
        let bs = self.block_bytes();
        for (&b, blk) in self.dirty.range(off / bs..end.div_ceil(bs)) {
            match self.written.get(&b).filter(|_| self.layered) {
                // A layer's block holds only what was written; the rest is the map's.
                Some(w) => {
                    for &(lo, hi) in w {
                        let at = b * bs + lo as u64;
                        overlay(&mut out, off, at, &blk[lo as usize..hi as usize]);
                    }
                }
                None => overlay(&mut out, off, b * bs, blk),
            }
        }
        if let Some(s) = &self.stream {
            overlay(&mut out, off, s.start, &s.buf);
        }
        Ok(out)
    }
}

/// Whether every byte of `b` is zero: every chunk cut is tested, to store an all-zero one as
/// a hole. Per-byte `iter().all` stops at the first non-zero byte but cannot be vectorized,
/// and ran at 2.9 GiB/s per core over zeros (AMD Zen 4): a whole pass more than the cutter
/// itself over zero-filled regions, and over the zero run at the start of each chunk of
/// sparse field data. OR-folding fixed 256-byte blocks vectorizes (about 80 GiB/s over zeros
/// in cache on the same core) and still stops within a block of the first non-zero byte.
/// Adds `[lo, hi)` to sorted, disjoint, non-touching ranges, merging what it meets.
pub(super) fn add_range(w: &mut Vec<(u32, u32)>, lo: u32, hi: u32) {
    let (mut lo, mut hi) = (lo, hi);
    // The ranges that end before `lo` stay, and so do those that start after `hi`.
    let first = w.partition_point(|r| r.1 < lo);
    let last = w.partition_point(|r| r.0 <= hi);
    if first < last {
        lo = lo.min(w[first].0);
        hi = hi.max(w[last - 1].1);
    }
    w.splice(first..last, [(lo, hi)]);
}

pub(super) fn all_zero(b: &[u8]) -> bool {
    // The last block first: a content-defined cut falls where the bytes vary, so a chunk
    // of data other than zeros nearly always ends in a block that is not all zeros, which
    // answers at once where scanning from the front would first pass its leading zeros
    // (half of every chunk of a sparse field). A chunk of zeros is read once either way.
    let tail = &b[b.len().saturating_sub(256)..];
    if tail.iter().fold(0u8, |a, &x| a | x) != 0 {
        return false;
    }
    let mut blocks = b.chunks_exact(256);
    for block in &mut blocks {
        if block.iter().fold(0u8, |a, &x| a | x) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&x| x == 0)
}

/// Zeroes the part of [src_off, src_off + len) that falls in `out` (which starts at `out_off`).
pub(super) fn zero_range(out: &mut [u8], out_off: u64, src_off: u64, len: u64) {
    let s = out_off.max(src_off);
    let t = (out_off + out.len() as u64).min(src_off + len);
    if s < t {
        out[(s - out_off) as usize..(t - out_off) as usize].fill(0);
    }
}

/// `overlay` of a spilled carry.
pub(super) fn overlay_spilled(
    out: &mut [u8],
    out_off: u64,
    src_off: u64,
    src: &SpillSlot,
) -> Result<()> {
    let s = out_off.max(src_off);
    let t = (out_off + out.len() as u64).min(src_off + src.len() as u64);
    if s < t {
        src.read(
            (s - src_off) as usize,
            &mut out[(s - out_off) as usize..(t - out_off) as usize],
        )?;
    }
    Ok(())
}

/// Copies the part of `src` (which starts at file offset `src_off`) that falls in `out`
/// (which starts at `out_off`).
pub(super) fn overlay(out: &mut [u8], out_off: u64, src_off: u64, src: &[u8]) {
    let s = out_off.max(src_off);
    let t = (out_off + out.len() as u64).min(src_off + src.len() as u64);
    if s < t {
        out[(s - out_off) as usize..(t - out_off) as usize]
            .copy_from_slice(&src[(s - src_off) as usize..(t - src_off) as usize]);
    }
}
