//! The store's write side: dedup lookup of new pieces, encoding, aggregation of new chunks
//! into large aligned writes, segment allocation (and gc's reserve), the pins that keep an
//! uncommitted file state's chunks alive, and segment release after gc.

use super::{gpu, ChunkStore, GC_RESERVE_SEGMENTS, WRITE_BYTES};

use crate::alloc::Segments;
use crate::chunk::Checked;
use crate::device::IoBuf;
use crate::error::{Corruption, Error, Result};
use crate::format::{ChunkHash, ChunkRecord, Codec, DataOffset, SegmentId};
use crate::pins::{ChunkPins, ReleasePins};
use crate::write::pipeline::{Completion, Permit, Piece};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Written segment buffers kept for reuse. Four of `fresh_write_buf`'s size (about 9 MiB)
/// hold what two buffers grown to 16 MiB by appending held before, and cover more workers
/// writing buffers at once before a fresh one must be allocated and faulted in.
const SPARE_WRITE_BUFS: usize = 4;

/// Room past the write threshold in a fresh segment buffer: the chunk that crosses it (256
/// KiB at most at the default 64 KiB chunks). A larger one grows the buffer, as before.
const WRITE_BUF_SLACK: usize = 1 << 20;

pub(super) struct Writer {
    /// The segment being filled, and how many of its bytes are used (written or buffered).
    pub(super) cur: Option<SegmentId>,
    /// `cur` is gc's reserve segment (gc took it when no other was free): only gc's copies
    /// may go into it, or writers sharing it would eat the room compaction counts on.
    pub(super) cur_reserved: bool,
    pub(super) fill: u64,
    /// Data-file offset of `buf[0]`; `buf` never crosses a segment boundary.
    pub(super) buf_start: u64,
    pub(super) buf: IoBuf,
    /// Buffers whose write failed (the space has failed): still read from here
    /// (`InFlight`).
    pub(super) unwritten: Vec<OutBuf>,
    /// Buffers taken out of `buf` for writing, oldest first. They stay readable here until
    /// written (`read_stored`).
    pub(super) writing: Vec<OutBuf>,
    /// Written buffers kept for reuse (at most `SPARE_WRITE_BUFS`), so the daemon does not
    /// fault in fresh pages for every 8 MiB.
    pub(super) spare: Vec<IoBuf>,
    /// Which segments are free or taken (see `alloc`).
    pub(super) segs: Segments,
}

/// A buffer on its way to the data file.
pub(super) struct OutBuf {
    pub(super) start: u64,
    pub(super) buf: Arc<IoBuf>,
    /// Bytes to write (whole blocks; the buffer may hold a partial block after them).
    pub(super) n: usize,
    /// A thread is writing it (`write_queued`).
    pub(super) started: bool,
}

pub(super) struct Pending {
    pub(super) rec: ChunkRecord,
    pub(super) holders: u32,
    /// Stored by `append_new`: the chunk table may not name it yet (its file has not
    /// committed), so gc cannot see it and must not touch its segment. False for a dedup hit
    /// on a committed chunk, which gc may move (see `relocate_pinned`).
    pub(super) new: bool,
}

/// The write side's state (see `ChunkStore::w`).
pub(super) struct WriteSide {
    pub(super) writer: Mutex<Writer>,
    /// Signalled when a buffer in `Writer::writing` has been written.
    pub(super) written: parking_lot::Condvar,
    /// Segments gc emptied whose reuse waits until the given time (`defer_release`).
    pub(super) deferred: Mutex<Vec<(std::time::Instant, Vec<SegmentId>)>>,
    /// Which encodings new chunks may get.
    pub(super) codec: Mutex<crate::codec::Policy>,
    /// Compresses new chunks in batches on a GPU instead of on the workers, when set.
    pub(super) gpu: Mutex<Option<Arc<gpu::GpuStage>>>,
    /// Chunk sequences of files committed or opened here, for the cutters' predictions
    /// (bounded: `predict::GENERATION_ENTRIES`).
    pub(super) successors: Arc<crate::write::predict::Successors>,
    /// Writes to the placement completed (and segments prepared), counted; and the count
    /// the last successful sync started after. A `flush_sync` with nothing new since then
    /// skips the device sync: a group of namespace syncs alone, or of commits whose chunks
    /// were all found stored, costs no sync of the data file.
    pub(super) writes_done: std::sync::atomic::AtomicU64,
    pub(super) writes_synced: std::sync::atomic::AtomicU64,
}

impl WriteSide {
    pub(super) fn new(free: BTreeSet<SegmentId>) -> WriteSide {
        WriteSide {
            writer: Mutex::new(Writer {
                cur: None,
                cur_reserved: false,
                fill: 0,
                buf_start: 0,
                buf: IoBuf::new(),
                writing: Vec::new(),
                unwritten: Vec::new(),
                spare: Vec::new(),
                segs: Segments::new(free),
            }),
            written: parking_lot::Condvar::new(),
            deferred: Mutex::new(Vec::new()),
            // A space is marked for the shuffle codecs by the mount that asks for `Lz4`.
            codec: Mutex::new(crate::codec::Policy::Lz4Plain),
            gpu: Mutex::new(None),
            successors: Arc::default(),
            writes_done: std::sync::atomic::AtomicU64::new(0),
            writes_synced: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl ChunkStore {
    pub(crate) fn is_pinned(&self, h: &ChunkHash) -> bool {
        self.pending.lock().contains_key(h)
    }

    /// An empty pin set counted by this store, for a new file state.
    pub(crate) fn new_pins(&self) -> ChunkPins {
        let me: Weak<dyn ReleasePins> = self.me.clone();
        ChunkPins::new(me)
    }

    /// Pins chunks that are stored already (committed, or pinned by some file state), as a
    /// dedup hit does: for a metadata-only copy, whose extents name the chunks of another
    /// file. The caller must hold what keeps the chunks alive until this returns (the source
    /// file's lock, whose state or base revision references them). Errors with corruption if
    /// a chunk is unknown, and then holds none of them.
    pub fn pin_stored(&self, hashes: &[ChunkHash]) -> Result<ChunkPins> {
        let mut pins = self.new_pins();
        let _shared = self.barrier.read();
        for h in hashes {
            if !self.pin_if_committed(h)? {
                // `pins` lets go of those pinned so far as it drops.
                return Err(Corruption::UnknownChunk(*h).into());
            }
            pins.adopt(*h);
        }
        Ok(pins)
    }

    /// Drops one pin per hash: a file state committed or discarded what it had put.
    pub(super) fn unpin(&self, hashes: &[ChunkHash]) {
        let mut p = self.pending.lock();
        for h in hashes {
            if let Some(e) = p.get_mut(h) {
                e.holders -= 1;
                if e.holders == 0 {
                    p.remove(h);
                }
            }
        }
    }

    /// Segments that may hold chunks not committed yet: taken since the last commit that
    /// recorded them, or holding a new chunk of a save not committed (a new chunk of a file
    /// not yet committed may lie in a segment another file's commit already recorded:
    /// segments are shared). Unlike `busy_segments`, not the segment being filled as such:
    /// its rows on disk hold only committed chunks then (a commit pads its row, and new
    /// chunks start on the next), so a repair may rewrite them (`scrub`).
    pub(crate) fn uncommitted_segments(&self) -> BTreeSet<SegmentId> {
        self.segments_in_use(false)
    }

    /// Segments gc must leave alone: the one being filled, those taken but not yet recorded
    /// by a commit, and those holding new chunks not yet committed. Segments holding pinned
    /// committed chunks (an open file's dedup hits) are not busy: gc moves such a chunk like
    /// any other and points its pin at the copy (`relocate_pinned`). Were they busy, a file
    /// being rewritten would pin nearly every segment of its previous revision, and a full
    /// space could never be compacted while that file is open.
    pub(crate) fn busy_segments(&self) -> BTreeSet<SegmentId> {
        self.segments_in_use(true)
    }

    /// `uncommitted_segments`, and the segment being filled with `filling`.
    fn segments_in_use(&self, filling: bool) -> BTreeSet<SegmentId> {
        let w = self.w.writer.lock();
        let p = self.pending.lock();
        let mut s: BTreeSet<SegmentId> = w.segs.taken().into_iter().collect();
        if filling {
            s.extend(w.cur);
        }
        s.extend(
            p.values()
                .filter(|e| e.new)
                .map(|e| self.segment_of(e.rec.offset)),
        );
        s
    }

    /// gc moved chunks (hash, old offset, new offset): pins of them read the copies from now
    /// on. Called under `exclusive()`, in the same critical section that commits the moves,
    /// so no lookup or read sees one location in the table and another in its pin.
    pub(crate) fn relocate_pinned(&self, moves: &[(ChunkHash, DataOffset, DataOffset)]) {
        let mut p = self.pending.lock();
        for (h, old, new) in moves {
            if let Some(e) = p.get_mut(h) {
                if e.rec.offset == *old {
                    e.rec.offset = *new;
                }
            }
        }
    }

    /// Segments taken since the last recorded commit; a commit removes them from FREE and
    /// then calls `recorded_taken`.
    pub(crate) fn taken_segments(&self) -> Vec<SegmentId> {
        self.w.writer.lock().segs.taken()
    }

    pub(crate) fn recorded_taken(&self, segs: &[SegmentId]) {
        self.w.writer.lock().segs.recorded(segs);
    }

    /// Makes segments reusable once gc's commit freeing them is durable. Waits for every
    /// chunk lookup in flight, which might still read the old location.
    pub(crate) fn release_segments(&self, segs: &[SegmentId]) {
        let _excl = self.barrier.write();
        self.w.writer.lock().segs.release(segs);
    }

    /// `release_segments` after `grace`: the segments are free in the table already, but no
    /// new chunk goes into them before then, so another node reading a chunk gc moved at its
    /// old place (its view of this slot not refreshed yet) still finds the old bytes. At
    /// most a few gc rounds' worth are held (each round frees at most 16 segments).
    pub(crate) fn defer_release(&self, segs: Vec<SegmentId>, grace: std::time::Duration) {
        if !segs.is_empty() {
            self.w
                .deferred
                .lock()
                .push((crate::clock::instant() + grace, segs));
        }
    }

    /// Releases deferred segments whose grace is over, or all of them with `all` (a writer
    /// waits for room: a remote reader's retry is cheaper than its ENOSPC).
    pub(crate) fn release_due(&self, all: bool) {
        let now = crate::clock::instant();
        let due: Vec<SegmentId> = {
            let mut d = self.w.deferred.lock();
            let (ready, wait): (Vec<_>, Vec<_>) = d.drain(..).partition(|(t, _)| all || *t <= now);
            *d = wait;
            ready.into_iter().flat_map(|(_, s)| s).collect()
        };
        if !due.is_empty() {
            self.release_segments(&due);
        }
    }

    /// Returns to the free set the segments taken since the last commit whose chunks no file
    /// state holds any more: a save that failed (a full space) or was discarded before any
    /// commit recorded its segments leaves only garbage there, and the table still lists
    /// those segments free. Without this they would stay out of use until some later commit
    /// recorded them, which a full space may never get to. Only gc calls this, under its
    /// lock: gc's own copies are the only other unpinned chunks in taken segments.
    pub(crate) fn reclaim_unrecorded(&self) -> Vec<SegmentId> {
        let _excl = self.barrier.write();
        let mut w = self.w.writer.lock();
        let p = self.pending.lock();
        let held: BTreeSet<SegmentId> = p.values().map(|e| self.segment_of(e.rec.offset)).collect();
        let cur = w.cur;
        w.segs.reclaim(|s| Some(s) != cur && !held.contains(&s))
    }

    /// Holds off chunk lookups and pinning while gc deletes chunk records.
    pub fn exclusive(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.barrier.write()
    }

    /// Finds room for `len` bytes, moving to the next free segment when the current one is
    /// full. Returns the data-file offset. New chunks (`for_gc` false) may not take the
    /// last `GC_RESERVE_SEGMENTS` free segments: gc's copies may, so compaction can always
    /// make progress on a full space (copying a segment's live bytes into the reserve frees
    /// the whole segment).
    pub(super) fn alloc(&self, w: &mut Writer, len: u64, for_gc: bool) -> Result<u64> {
        assert!(len <= self.segment_bytes);
        // Once gc freed what it emptied into the reserve segment, that segment is ordinary
        // (`Segments::reserve_whole`). Without this a space of two segments refused every
        // write after a remount (one segment live, the other the reserve).
        if w.cur_reserved && w.segs.reserve_whole() {
            w.cur_reserved = false;
        }
        if let Some(c) = w.cur {
            if w.fill + len <= self.segment_bytes && (for_gc || !w.cur_reserved) {
                return Ok(self.start_of(c) + w.fill);
            }
        }
        // Refused before the current segment is closed, so a writer that finds no room
        // leaves the writer as it was.
        if !for_gc && w.segs.free_count() <= GC_RESERVE_SEGMENTS {
            return Err(Error::NoSpace);
        }
        self.write_out(w, true);
        let t = w.segs.take(for_gc)?;
        let next = t.segment;
        if let Err(e) = self.place.prepare(next) {
            w.segs.untake(next);
            return Err(e.into());
        }
        self.w.writes_done.fetch_add(1, Ordering::SeqCst);
        w.cur = Some(next);
        w.cur_reserved = t.reserved;
        w.fill = 0;
        w.buf_start = self.start_of(next);
        Ok(w.buf_start)
    }

    /// Queues buffered chunks for writing to the data file in whole blocks (`DIRECT_ALIGN`,
    /// or whole rows of an erasure-coded placement: `align`),
    /// so the write can bypass the page cache; `write_queued` writes them once the caller
    /// has let go of the writer lock, so workers keep appending while the disk works.
    /// Unless `all`, a last partial block stays buffered for the chunks that will fill it.
    /// With `all` (a commit, or the segment is done) it is padded with zeros and written,
    /// and the next chunk starts at the next block: blocks once written are never written
    /// again, so no write can tear committed bytes. The padding costs less than one block
    /// per commit.
    pub(super) fn write_out(&self, w: &mut Writer, all: bool) {
        if all && w.cur.is_some() {
            w.fill += w.buf.pad_to(self.align) as u64;
        }
        let n = w.buf.len() / self.align * self.align;
        if n == 0 {
            return;
        }
        let mut next = w.spare.pop().unwrap_or_else(|| self.fresh_write_buf());
        next.extend_from_slice(&w.buf.as_slice()[n..]);
        let full = Arc::new(std::mem::replace(&mut w.buf, next));
        w.writing.push(OutBuf {
            start: w.buf_start,
            buf: full,
            n,
            started: false,
        });
        w.buf_start += n as u64;
    }

    /// A new segment buffer, allocated at the size it fills to. Grown by appending, it
    /// went 1, 2, 4, 8 and 16 MiB: 15 MiB copied and twice the memory faulted in for every
    /// 8 MiB of new chunks, which happened whenever the spares ran out (many workers
    /// writing buffers at once on a many-core node).
    fn fresh_write_buf(&self) -> IoBuf {
        let mut b = IoBuf::new();
        b.reserve_exact_total(
            WRITE_BYTES.min(self.segment_bytes) as usize + self.align + WRITE_BUF_SLACK,
        );
        b
    }

    /// Writes the queued buffers (see `write_out`). Call without the writer lock.
    pub(super) fn write_queued(&self) -> Result<()> {
        let mut result = Ok(());
        loop {
            let (start, buf, n) = {
                let mut w = self.w.writer.lock();
                match w.writing.iter_mut().find(|o| !o.started) {
                    Some(o) => {
                        o.started = true;
                        (o.start, o.buf.clone(), o.n)
                    }
                    None => break,
                }
            };
            let r = self.stages().write.time_nested(n, || {
                self.place.write(self.location(start), &buf.as_slice()[..n])
            });
            let mut w = self.w.writer.lock();
            w.writing.retain(|o| o.start != start);
            if r.is_ok() {
                self.w.writes_done.fetch_add(1, Ordering::SeqCst);
            } else {
                // Its chunks may belong to commits already made (their bytes only in the
                // journal until the next open applies it): readable from here until then.
                // Bounded: the failure is sticky, so only the buffers in flight at the time
                // come here.
                w.unwritten.push(OutBuf {
                    start,
                    buf: buf.clone(),
                    n,
                    started: true,
                });
            }
            self.w.written.notify_all();
            if let Err(e) = r {
                result = result.and(self.fail(e));
                continue;
            }
            if let Ok(mut b) = Arc::try_unwrap(buf) {
                if w.spare.len() < SPARE_WRITE_BUFS {
                    b.consume(b.len());
                    w.spare.push(b);
                }
            }
        }
        result
    }

    /// Writes out buffered chunks and makes the data file durable.
    pub(crate) fn flush_sync(&self) -> Result<()> {
        self.check_failed()?;
        self.write_out(&mut self.w.writer.lock(), true);
        self.write_queued()?;
        {
            // Buffers other threads took for writing before this commit must be on disk
            // before the sync that makes this commit's chunks durable.
            let mut w = self.w.writer.lock();
            while !w.writing.is_empty() {
                self.w.written.wait(&mut w);
            }
        }
        self.check_failed()?;
        // Every write this commit needs has completed (above): a sync that started after
        // they had covers them.
        let done = self.w.writes_done.load(Ordering::SeqCst);
        if self.w.writes_synced.load(Ordering::SeqCst) >= done {
            return Ok(());
        }
        // Not under the writer lock: workers keep appending other files' chunks while this
        // commit waits for the disk. The sync covers every write issued before it. Nested:
        // a grouped commit syncs inside its `commit` timing (`space::group`).
        if let Err(e) = self.stages().sync.time_nested(0, || self.place.sync()) {
            return self.fail(e);
        }
        self.w.writes_synced.fetch_max(done, Ordering::SeqCst);
        Ok(())
    }

    /// Appends already-encoded chunk bytes (gc's copies); returns where they went.
    pub(crate) fn append_stored(&self, chunk: &Checked) -> Result<DataOffset> {
        let stored = chunk.bytes();
        self.check_failed()?;
        let off = {
            let mut w = self.w.writer.lock();
            let off = self.alloc(&mut w, stored.len() as u64, true);
            if off.is_ok() {
                w.buf.extend_from_slice(stored);
                w.fill += stored.len() as u64;
                if w.buf.len() as u64 >= WRITE_BYTES.min(self.segment_bytes / 2) {
                    self.write_out(&mut w, false);
                }
            }
            off
        };
        self.write_queued()?;
        Ok(DataOffset(off?))
    }
}

/// What the dedup lookup found for a piece.
pub(super) enum Lookup {
    /// Stored already (committed, or pinned by a file state); now pinned once more.
    Hit(ChunkHash),
    /// New: to be encoded and stored.
    Miss(ChunkHash),
}

impl ChunkStore {
    /// The one way chunks are stored: a batch of pieces (a worker's share of a stream cut
    /// or a flush of dirty blocks, or one piece of `put`), each with the completion its
    /// writer waits on. Their dedup lookups go together (`lookup_each`: a found chunk is
    /// pinned once more and never encoded); the new ones go to the GPU stage when the mount
    /// runs one (it compresses them in batches across files and appends them, completing
    /// each; `store/gpu.rs`), or are encoded here on the CPU and appended together
    /// (`store_new_many`: one hold of the writer lock for the batch). `permit` covers the
    /// batch's bytes until its chunks are appended.
    pub(super) fn store_batch(&self, job: Vec<(Piece, Completion)>, permit: Permit) {
        let refs: Vec<&Piece> = job.iter().map(|(p, _)| p).collect();
        let found = self.lookup_each(&refs);
        let mut misses = Vec::new();
        for ((piece, done), f) in job.into_iter().zip(found) {
            match f {
                Ok(Lookup::Miss(hash)) => misses.push(gpu::NewChunk { hash, piece, done }),
                Ok(Lookup::Hit(h)) => done.complete(Ok(h)),
                Err(e) => done.complete(Err(e)),
            }
        }
        if misses.is_empty() {
            return;
        }
        let gpu = self.w.gpu.lock().clone();
        match gpu {
            Some(gpu) => gpu.push(misses, permit),
            None => {
                self.encode_and_store(misses);
                drop(permit);
            }
        }
    }

    /// Encodes new chunks on the CPU by the store's codec policy and appends them, completing
    /// each. The batch's pieces are mostly consecutive chunks of one file: a storm array's
    /// chunks after the first skip the codec's probes (`codec::Streak`).
    fn encode_and_store(&self, misses: Vec<gpu::NewChunk>) {
        let policy = *self.w.codec.lock();
        let mut streak = crate::codec::Streak::default();
        let encoded: Vec<(Codec, Option<Vec<u8>>)> = misses
            .iter()
            .map(|m| {
                self.stages().compress.time(m.piece.len(), || {
                    crate::codec::encode_after(m.piece.bytes(), policy, &mut streak)
                })
            })
            .collect();
        let new: Vec<NewChunk> = misses
            .iter()
            .zip(&encoded)
            .map(|(m, (codec, enc))| NewChunk {
                hash: m.hash,
                raw_len: m.piece.len(),
                codec: *codec,
                // Stored raw when compression does not pay: incompressible data costs
                // nothing extra.
                bytes: enc.as_deref().unwrap_or(m.piece.bytes()),
            })
            .collect();
        let results = self.store_new_many(&new);
        for (m, r) in misses.into_iter().zip(results) {
            m.done.complete(r);
        }
    }

    /// The lookups of a batch of pieces, in order: together (`lookup_many`), or where that
    /// fails, each alone, so each piece gets its own answer or error.
    pub(super) fn lookup_each(&self, pieces: &[&Piece]) -> Vec<Result<Lookup>> {
        match self.lookup_many(pieces.iter().map(|p| (p.bytes(), p.known_hash()))) {
            Ok(found) => found.into_iter().map(Ok).collect(),
            Err(_) => pieces
                .iter()
                .map(|p| self.lookup(p.bytes(), p.known_hash()))
                .collect(),
        }
    }

    /// Hashes `data` (unless `known`: its hash, computed by the caller over exactly these
    /// bytes) and looks it up among pinned and committed chunks; pins it if found.
    pub(super) fn lookup(&self, data: &[u8], known: Option<ChunkHash>) -> Result<Lookup> {
        Ok(self
            .lookup_many(std::iter::once((data, known)))?
            .pop()
            .expect("one piece, one answer"))
    }

    /// `lookup` of several pieces, in order, with one catalog read for those not pinned
    /// already. A read transaction per chunk (a reader registered with the database, the
    /// table opened) was most of the `lookup` stage's cost on a next revision, where nearly
    /// every chunk is a committed one found again; a worker's batch (`BATCH_BYTES`, about
    /// eight chunks) shares one. A piece that repeats an earlier one of the batch finds it
    /// pinned by then.
    pub(super) fn lookup_many<'a>(
        &self,
        pieces: impl Iterator<Item = (&'a [u8], Option<ChunkHash>)>,
    ) -> Result<Vec<Lookup>> {
        self.check_failed()?;
        let hashes: Vec<ChunkHash> = pieces
            .map(|(data, known)| {
                assert!(!data.is_empty() && data.len() <= u32::MAX as usize);
                match known {
                    Some(h) => h,
                    // Fingerprinted too, so a prediction of this chunk in the next revision
                    // is confirmed without blake3 (`predict`); timed with the hash.
                    None => self.stages().hash.time(data.len(), || {
                        let h = ChunkHash::of(data);
                        self.w.successors.remember(&h, data);
                        h
                    }),
                }
            })
            .collect();
        // Held until every found chunk is pinned: no segment is reused under a lookup.
        let _shared = self.barrier.read();
        let unpinned: Vec<ChunkHash> = {
            let pending = self.pending.lock();
            hashes
                .iter()
                .filter(|h| !pending.contains_key(*h))
                .copied()
                .collect()
        };
        let mut committed = if unpinned.is_empty() {
            Vec::new()
        } else {
            self.stages()
                .lookup
                .time(0, || self.db.committed(&unpinned))?
        }
        .into_iter();
        let mut unpinned = unpinned.into_iter().peekable();
        // Per piece: found (and pinned once more), or not; `None` where the chunk was pinned
        // when looked for but its last holder let go of it since (looked up alone below).
        let found: Vec<Option<bool>> = {
            let mut pending = self.pending.lock();
            hashes
                .iter()
                .map(|h| {
                    // This hash's committed record, if it was looked up (not pinned then).
                    let looked = unpinned.peek() == Some(h);
                    let rec = if looked {
                        unpinned.next();
                        committed.next().flatten()
                    } else {
                        None
                    };
                    if let Some(e) = pending.get_mut(h) {
                        e.holders += 1;
                        return Some(true);
                    }
                    match rec {
                        Some(rec) => {
                            let e = Pending {
                                rec,
                                holders: 1,
                                new: false,
                            };
                            pending.insert(*h, e);
                            Some(true)
                        }
                        None if looked => Some(false),
                        None => None,
                    }
                })
                .collect()
        };
        let mut out = Vec::with_capacity(hashes.len());
        for (h, found) in hashes.into_iter().zip(found) {
            let found = match found {
                Some(f) => f,
                None => self.pin_if_committed(&h)?,
            };
            out.push(if found {
                self.dedup_hits.fetch_add(1, Ordering::Relaxed);
                Lookup::Hit(h)
            } else {
                Lookup::Miss(h)
            });
        }
        Ok(out)
    }

    /// Pins `h` if it is pinned or committed; whether it was. The caller holds the barrier
    /// (no segment is reused between the lookup and the pin).
    fn pin_if_committed(&self, h: &ChunkHash) -> Result<bool> {
        if let Some(e) = self.pending.lock().get_mut(h) {
            e.holders += 1;
            return Ok(true);
        }
        let Some(rec) = self.stages().lookup.time(0, || self.committed_record(h))? else {
            return Ok(false);
        };
        self.pending
            .lock()
            .entry(*h)
            .or_insert(Pending {
                rec,
                holders: 0,
                new: false,
            })
            .holders += 1;
        Ok(true)
    }

    /// Stores a new chunk's encoded bytes: appends them and writes out full buffers.
    pub(super) fn store_new(
        &self,
        h: ChunkHash,
        raw_len: usize,
        codec: Codec,
        bytes: &[u8],
    ) -> Result<ChunkHash> {
        let chunk = NewChunk {
            hash: h,
            raw_len,
            codec,
            bytes,
        };
        self.store_new_many(std::slice::from_ref(&chunk))
            .pop()
            .expect("one chunk, one answer")
    }

    /// `store_new` of several chunks, in order, appended under one hold of the writer lock.
    /// Taken once per new chunk, that lock was a handoff per chunk between the workers: on
    /// a 16-core node (16 workers, 4-16 writers) the `append` stage cost 0.13-0.16 CPU-s/GiB
    /// of a full checkpoint, twice the 2-core figure. A worker's batch (`BATCH_BYTES`, about
    /// eight chunks) now takes it once: there, `append` 0.11-0.14 and the store threads put on
    /// a CPU 11-19 thousand times per GiB against 18-22 (one lease, the build before in the
    /// same call).
    pub(super) fn store_new_many(&self, chunks: &[NewChunk]) -> Vec<Result<ChunkHash>> {
        let bytes = chunks.iter().map(|c| c.bytes.len()).sum();
        let mut out: Vec<Result<ChunkHash>> = self.stages().append.time(bytes, || {
            let mut w = self.w.writer.lock();
            chunks.iter().map(|c| self.append_new(&mut w, c)).collect()
        });
        // Also after a failure (a full space): buffers queued for writing go out. A failed
        // write fails the store (sticky), so no chunk of the batch may report success: the
        // first that did gets the write's error, the others `Failed`.
        if let Err(e) = self.write_queued() {
            let mut e = Some(e);
            for r in out.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(e.take().unwrap_or(Error::Failed));
            }
        }
        out
    }

    /// Appends a new chunk's stored bytes to the write buffer and pins it.
    fn append_new(&self, w: &mut Writer, c: &NewChunk) -> Result<ChunkHash> {
        {
            let mut pending = self.pending.lock();
            if let Some(e) = pending.get_mut(&c.hash) {
                e.holders += 1;
                return Ok(c.hash);
            }
            let off = self.alloc(w, c.bytes.len() as u64, false)?;
            w.buf.extend_from_slice(c.bytes);
            w.fill += c.bytes.len() as u64;
            pending.insert(
                c.hash,
                Pending {
                    rec: ChunkRecord {
                        offset: DataOffset(off),
                        stored_len: c.bytes.len() as u32,
                        raw_len: c.raw_len as u32,
                        codec: c.codec,
                        refs: 0,
                    },
                    holders: 1,
                    new: true,
                },
            );
        }
        self.chunks_stored.fetch_add(1, Ordering::Relaxed);
        if w.buf.len() as u64 >= WRITE_BYTES.min(self.segment_bytes) {
            self.write_out(w, false);
        }
        Ok(c.hash)
    }
}

/// A new chunk to append (`store_new_many`).
pub(super) struct NewChunk<'a> {
    pub(super) hash: ChunkHash,
    pub(super) raw_len: usize,
    pub(super) codec: Codec,
    /// Its stored bytes (encoded, or raw where encoding did not pay).
    pub(super) bytes: &'a [u8],
}
