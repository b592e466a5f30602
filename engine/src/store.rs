//! The chunk store: dedup lookup, compression, aggregation of new chunks into large writes to
//! the reserved data file, segment allocation, and verified reads.
//!
//! Space is handed out in segments (`Superblock::segment_bytes`). New chunks are appended to
//! the current segment; a full segment is followed by the lowest free one. gc frees segments
//! whose chunks are all dead or have been copied elsewhere.
//!
//! Pins: a chunk that an uncommitted file state refers to (stored by it, or found by dedup)
//! is held in `pending` until that file commits or discards its state (the state owns its
//! pins as a `ChunkPins` guard). gc never deletes a
//! pinned chunk and never frees a segment holding one. The reuse barrier orders segment reuse
//! after every chunk lookup that might still see the old location.

use crate::alloc::Segments;
use crate::chunk::{Checked, ChunkBytes, Stored, StoredRef, Verified};
use crate::device::{IoBuf, DIRECT_ALIGN};
use crate::error::{Corruption, Error, Result};
use crate::format::{ChunkHash, ChunkRecord, Codec, DataOffset, SegmentId};
use crate::pins::{ChunkPins, ReleasePins};
use crate::pipeline::{ChunkIo, Piece, Pipeline, Pool, Ticket};
use crate::placement::{Location, Placement};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

mod gpu;
pub use gpu::{GPU_BATCH_BYTES, GPU_SUB_BATCH_BYTES};

/// New chunks are gathered in memory and written to the data file in pieces of this size:
/// large writes are what a parallel filesystem and a direct write want.
pub const WRITE_BYTES: u64 = 8 << 20;
pub use crate::alloc::GC_RESERVE_SEGMENTS;

/// Pieces handed to one worker job at most (see `submit_all`).
pub const BATCH_BYTES: usize = 512 << 10;

/// Bytes of decoded chunks kept for reads (see `ChunkCache`), counting the device-read
/// buffers that raw chunks are kept in (a chunk in the cache keeps its whole read alive).
pub const CACHE_BYTES: usize = 64 << 20;

/// Chunks per prefetch job (see `prefetch`): 2 MiB at the default chunk size.
const PREFETCH_JOB_CHUNKS: usize = 32;

/// Threads that run prefetch jobs. A job blocks on its device read and then verifies, so
/// the store workers (one per core) would keep only that many reads in flight; a disk or
/// a parallel filesystem wants more. Bound on memory: each job holds at most one run of
/// `READ_BYTES` while it reads, on top of the decoded-chunk cache it fills.
pub const READ_THREADS: usize = 8;

/// Device-read buffers kept for reuse, at most, and the largest one kept: a fresh buffer
/// for every read costs its zero-fill and page faults again (about a tenth of the daemon's
/// CPU on a cold sequential read). A read's buffer comes back here when the last chunk
/// verified in it leaves the cache (`ReadBuf`), and the cache lets them go in bursts: with
/// 8 spares a cold 1 GiB read allocated 274 of its 1040 buffers afresh, with 16 about 146.
/// So up to 64 MiB (typically about 32: reads are about 2 MiB) stay allocated while reads
/// go on, freed once reads stop (`release_idle_read_buffers`).
pub const SPARE_READ_BUFS: usize = 16;
pub const SPARE_READ_BUF_BYTES: usize = 4 << 20;

/// Read buffers are allocated in multiples of this: close to the read's size, since the
/// cache charges a buffer's whole capacity to the chunks it keeps alive (a power-of-two
/// buffer would halve what the cache holds and evict read-ahead before it is read), but
/// coarse enough that a spare one fits the next read of about the same size.
const READ_BUF_GRAIN: usize = 256 << 10;

/// A chunk some thread is reading; others wait for it instead of reading it again.
#[derive(Default)]
struct Loading {
    done: Mutex<bool>,
    cv: parking_lot::Condvar,
}

/// Largest single device read when chunks stored back to back are read together.
pub const READ_BYTES: u64 = 8 << 20;

struct Writer {
    /// The segment being filled, and how many of its bytes are used (written or buffered).
    cur: Option<SegmentId>,
    /// `cur` is gc's reserve segment (gc took it when no other was free): only gc's copies
    /// may go into it, or writers sharing it would eat the room compaction counts on.
    cur_reserved: bool,
    fill: u64,
    /// Data-file offset of `buf[0]`; `buf` never crosses a segment boundary.
    buf_start: u64,
    buf: IoBuf,
    /// Buffers taken out of `buf` for writing, oldest first. They stay readable here until
    /// written (`read_stored`).
    writing: Vec<OutBuf>,
    /// Written buffers kept for reuse (at most two), so the daemon does not fault in fresh
    /// pages for every 8 MiB.
    spare: Vec<IoBuf>,
    /// Which segments are free or taken (see `alloc`).
    segs: Segments,
}

/// A buffer on its way to the data file.
struct OutBuf {
    start: u64,
    buf: Arc<IoBuf>,
    /// Bytes to write (whole blocks; the buffer may hold a partial block after them).
    n: usize,
    /// A thread is writing it (`write_queued`).
    started: bool,
}

struct Pending {
    rec: ChunkRecord,
    holders: u32,
    /// Stored by `append_new`: the chunk table may not name it yet (its file has not
    /// committed), so gc cannot see it and must not touch its segment. False for a dedup hit
    /// on a committed chunk, which gc may move (see `relocate_pinned`).
    new: bool,
}

pub struct ChunkStore {
    /// Itself, for the jobs it gives its workers.
    me: Weak<ChunkStore>,
    /// Workers, budgets and stage timers; hash, dedup lookup, compression and append of
    /// submitted pieces run there.
    pipeline: Arc<Pipeline>,
    /// Where segments' bytes live (today: the data file).
    place: Arc<dyn Placement>,
    /// The catalog's answer to where committed chunks lie.
    db: Arc<dyn CommittedChunks>,
    segment_bytes: u64,
    segments: u64,
    /// What every write is a whole multiple of (`Placement::write_align`): a block, or a
    /// row of an erasure-coded segment.
    align: usize,
    writer: Mutex<Writer>,
    /// Signalled when a buffer in `Writer::writing` has been written.
    written: parking_lot::Condvar,
    /// Pinned chunks; lock order: barrier, writer, pending.
    pending: Mutex<HashMap<ChunkHash, Pending>>,
    /// Shared by chunk lookups and pinning; exclusive while gc deletes chunks or frees
    /// segments, so no lookup can straddle a reuse.
    barrier: RwLock<()>,
    cache: Mutex<ChunkCache>,
    /// Segments gc emptied whose reuse waits until the given time (`defer_release`).
    deferred: Mutex<Vec<(std::time::Instant, Vec<SegmentId>)>>,
    /// Chunks being read by some thread (lock order: cache, then this).
    loading: Mutex<HashMap<ChunkHash, Arc<Loading>>>,
    /// Sticky failure, shared with the metadata table's backend (`MetaBackend`), which sets
    /// it on any failed write, length change or sync of the table's file.
    failed: Arc<AtomicBool>,
    pub dedup_hits: AtomicU64,
    pub chunks_stored: AtomicU64,
    /// Which encodings new chunks may get.
    codec: Mutex<crate::codec::Policy>,
    /// Compresses new chunks in batches on a GPU instead of on the workers, when set.
    gpu: Mutex<Option<Arc<gpu::GpuStage>>>,
    /// Chunk sequences of files committed or opened here, for the cutters' predictions
    /// (bounded: `predict::GENERATION_ENTRIES`).
    successors: Arc<crate::predict::Successors>,
    /// Runs prefetch jobs (`READ_THREADS`), started by the first prefetch.
    readers: std::sync::OnceLock<Pool>,
    /// Read buffers for reuse (`SPARE_READ_BUFS` of up to `SPARE_READ_BUF_BYTES`).
    read_bufs: Arc<Mutex<Vec<IoBuf>>>,
    /// Set by every device read for chunks; `release_idle_read_buffers` clears it.
    read_lately: AtomicBool,
}

/// Where committed chunks lie. The catalog answers; the store sits below it and opens no
/// table itself.
pub trait CommittedChunks: Send + Sync {
    /// The committed records of `hashes`, in order (`None`: not in the chunk table), from
    /// one consistent snapshot.
    fn committed(&self, hashes: &[ChunkHash]) -> Result<Vec<Option<ChunkRecord>>>;
}

impl ChunkStore {
    pub fn new(
        place: Arc<dyn Placement>,
        pipeline: Arc<Pipeline>,
        db: Arc<dyn CommittedChunks>,
        free: BTreeSet<SegmentId>,
        failed: Arc<AtomicBool>,
    ) -> Arc<Self> {
        let segments = place.segments();
        let segment_bytes = place.segment_bytes();
        let align = place.write_align();
        assert!(
            align.is_multiple_of(DIRECT_ALIGN) && segment_bytes.is_multiple_of(align as u64),
            "segments of {segment_bytes} bytes are not whole writes of {align}"
        );
        Arc::new_cyclic(|me| ChunkStore {
            me: me.clone(),
            pipeline,
            place,
            db,
            segment_bytes,
            segments,
            align,
            writer: Mutex::new(Writer {
                cur: None,
                cur_reserved: false,
                fill: 0,
                buf_start: 0,
                buf: IoBuf::new(),
                writing: Vec::new(),
                spare: Vec::new(),
                segs: Segments::new(free),
            }),
            written: parking_lot::Condvar::new(),
            pending: Mutex::new(HashMap::new()),
            barrier: RwLock::new(()),
            cache: Mutex::new(ChunkCache::default()),
            deferred: Mutex::new(Vec::new()),
            loading: Mutex::new(HashMap::new()),
            failed,
            dedup_hits: AtomicU64::new(0),
            chunks_stored: AtomicU64::new(0),
            codec: Mutex::new(crate::codec::Policy::Lz4),
            gpu: Mutex::new(None),
            successors: Arc::default(),
            readers: std::sync::OnceLock::new(),
            read_bufs: Arc::default(),
            read_lately: AtomicBool::new(false),
        })
    }

    /// The pipeline the store runs its jobs on.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// Teaches the cutters' predictor a file's chunk sequence (a map committed or loaded).
    pub fn learn<'a>(
        &self,
        extents: impl IntoIterator<Item = (u64, &'a crate::format::Extent)>,
        max_chunk: u32,
    ) {
        self.successors.learn(extents, max_chunk);
    }

    /// Where the data path's time goes (the pipeline's timers).
    pub fn stages(&self) -> &crate::pipeline::Stages {
        &self.pipeline.stages
    }

    /// Sets the number of worker threads for submitted pieces; 0 stores them on the
    /// submitting thread, in order (the crash tests use that to replay a run exactly).
    pub fn set_workers(&self, n: usize) {
        self.pipeline.set_workers(n);
    }

    /// Chooses the encodings for new chunks (readers decode every codec regardless).
    pub fn set_codec_policy(&self, p: crate::codec::Policy) {
        *self.codec.lock() = p;
    }

    pub fn workers(&self) -> usize {
        self.pipeline.workers()
    }

    /// Compresses new chunks with `codec` (the GPU) from now on, in batches gathered from
    /// every file being written; `None` goes back to LZ4 on the workers. The batch codec
    /// writes plain LZ4 blocks (codec id 1), so the CPU decodes everything it stored. Only
    /// for the `Lz4` policy: the shuffle codec runs on the CPU.
    pub fn set_batch_codec(&self, codec: Option<Arc<dyn ckptfs_kernels::BatchCodec>>) {
        *self.gpu.lock() = codec.map(|c| gpu::GpuStage::start(c, self.me.clone()));
    }

    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Where data-file offset `off` lies (see `placement`).
    fn location(&self, off: u64) -> Location {
        Location::of(DataOffset(off), self.segment_bytes)
    }

    pub fn segment_of(&self, off: DataOffset) -> SegmentId {
        self.location(off.0).segment
    }

    /// The data-file offset where segment `s` starts.
    fn start_of(&self, s: SegmentId) -> u64 {
        Location {
            segment: s,
            offset: 0,
        }
        .to_offset(self.segment_bytes)
        .0
    }

    /// Usable bytes: whole segments of the data file.
    pub fn capacity(&self) -> u64 {
        self.segments * self.segment_bytes
    }

    /// Free bytes: free segments (gc's reserve included, see `GC_RESERVE_SEGMENTS`) plus the
    /// rest of the current one.
    pub fn free_bytes(&self) -> u64 {
        let w = self.writer.lock();
        let rest = w.cur.map_or(0, |_| self.segment_bytes - w.fill);
        w.segs.free_count() * self.segment_bytes + rest
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn check_failed(&self) -> Result<()> {
        if self.is_failed() {
            Err(Error::Failed)
        } else {
            Ok(())
        }
    }

    fn fail<T>(&self, e: std::io::Error) -> Result<T> {
        Err(self.fail_with(e.into()))
    }

    /// Makes the store refuse writes from now on, and returns `e`. Sticky: after a failed
    /// write, sync or metadata commit the state of the disk is unknown, so no later write
    /// or commit may report success (a second fsync "succeeding" after a lost write is how
    /// data is silently lost).
    pub fn fail_with(&self, e: Error) -> Error {
        if !self.failed.swap(true, Ordering::Relaxed) {
            log::error!("backing I/O failed, refusing further writes until remount: {e}");
        }
        e
    }

    pub fn committed_record(&self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        Ok(self.db.committed(std::slice::from_ref(h))?.pop().flatten())
    }

    /// The record of a pinned chunk (stored or found by an uncommitted file state).
    pub fn pending_record(&self, h: &ChunkHash) -> Option<ChunkRecord> {
        self.pending.lock().get(h).map(|p| p.rec)
    }

    pub fn is_pinned(&self, h: &ChunkHash) -> bool {
        self.pending.lock().contains_key(h)
    }

    /// An empty pin set counted by this store, for a new file state.
    pub fn new_pins(&self) -> ChunkPins {
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
            if let Some(e) = self.pending.lock().get_mut(h) {
                e.holders += 1;
                pins.adopt(*h);
                continue;
            }
            let rec = self
                .committed_record(h)?
                .ok_or(Corruption::UnknownChunk(*h))?;
            self.pending
                .lock()
                .entry(*h)
                .or_insert(Pending {
                    rec,
                    holders: 0,
                    new: false,
                })
                .holders += 1;
            pins.adopt(*h);
        }
        Ok(pins)
    }

    /// Drops one pin per hash: a file state committed or discarded what it had put.
    fn unpin(&self, hashes: &[ChunkHash]) {
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

    /// Segments gc must leave alone: the one being filled, those taken but not yet recorded
    /// by a commit, and those holding new chunks not yet committed. Segments holding pinned
    /// committed chunks (an open file's dedup hits) are not busy: gc moves such a chunk like
    /// any other and points its pin at the copy (`relocate_pinned`). Were they busy, a file
    /// being rewritten would pin nearly every segment of its previous revision, and a full
    /// space could never be compacted while that file is open.
    /// Segments that may hold chunks not committed yet: taken since the last commit that
    /// recorded them, or holding a new chunk of a save not committed. Unlike
    /// `busy_segments`, not the segment being filled as such: its rows on disk hold only
    /// committed chunks then (a commit pads its row, and new chunks start on the next), so
    /// a repair may rewrite them (`scrub`).
    pub fn uncommitted_segments(&self) -> BTreeSet<SegmentId> {
        let w = self.writer.lock();
        let p = self.pending.lock();
        let mut s: BTreeSet<SegmentId> = w.segs.taken().into_iter().collect();
        s.extend(
            p.values()
                .filter(|e| e.new)
                .map(|e| self.segment_of(e.rec.offset)),
        );
        s
    }

    pub fn busy_segments(&self) -> BTreeSet<SegmentId> {
        let w = self.writer.lock();
        let p = self.pending.lock();
        let mut s: BTreeSet<SegmentId> = w.segs.taken().into_iter().collect();
        s.extend(w.cur);
        // A new chunk of a file not yet committed may lie in a segment another file's commit
        // already recorded (segments are shared): that segment is busy until it commits.
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
    pub fn relocate_pinned(&self, moves: &[(ChunkHash, DataOffset, DataOffset)]) {
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
    pub fn taken_segments(&self) -> Vec<SegmentId> {
        self.writer.lock().segs.taken()
    }

    pub fn recorded_taken(&self, segs: &[SegmentId]) {
        self.writer.lock().segs.recorded(segs);
    }

    /// Makes segments reusable once gc's commit freeing them is durable. Waits for every
    /// chunk lookup in flight, which might still read the old location.
    pub fn release_segments(&self, segs: &[SegmentId]) {
        let _excl = self.barrier.write();
        self.writer.lock().segs.release(segs);
    }

    /// `release_segments` after `grace`: the segments are free in the table already, but no
    /// new chunk goes into them before then, so another node reading a chunk gc moved at its
    /// old place (its view of this slot not refreshed yet) still finds the old bytes. At
    /// most a few gc rounds' worth are held (each round frees at most 16 segments).
    pub fn defer_release(&self, segs: Vec<SegmentId>, grace: std::time::Duration) {
        if !segs.is_empty() {
            self.deferred
                .lock()
                .push((std::time::Instant::now() + grace, segs));
        }
    }

    /// Releases deferred segments whose grace is over, or all of them with `all` (a writer
    /// waits for room: a remote reader's retry is cheaper than its ENOSPC).
    pub fn release_due(&self, all: bool) {
        let now = std::time::Instant::now();
        let due: Vec<SegmentId> = {
            let mut d = self.deferred.lock();
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
    pub fn reclaim_unrecorded(&self) -> Vec<SegmentId> {
        let _excl = self.barrier.write();
        let mut w = self.writer.lock();
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
    fn alloc(&self, w: &mut Writer, len: u64, for_gc: bool) -> Result<u64> {
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
    fn write_out(&self, w: &mut Writer, all: bool) {
        if all && w.cur.is_some() {
            w.fill += w.buf.pad_to(self.align) as u64;
        }
        let n = w.buf.len() / self.align * self.align;
        if n == 0 {
            return;
        }
        let mut next = w.spare.pop().unwrap_or_default();
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

    /// Writes the queued buffers (see `write_out`). Call without the writer lock.
    fn write_queued(&self) -> Result<()> {
        let mut result = Ok(());
        loop {
            let (start, buf, n) = {
                let mut w = self.writer.lock();
                match w.writing.iter_mut().find(|o| !o.started) {
                    Some(o) => {
                        o.started = true;
                        (o.start, o.buf.clone(), o.n)
                    }
                    None => break,
                }
            };
            let r = self.stages().write.time(n, || {
                self.place.write(self.location(start), &buf.as_slice()[..n])
            });
            let mut w = self.writer.lock();
            w.writing.retain(|o| o.start != start);
            self.written.notify_all();
            if let Err(e) = r {
                result = result.and(self.fail(e));
                continue;
            }
            if let Ok(mut b) = Arc::try_unwrap(buf) {
                if w.spare.len() < 2 {
                    b.consume(b.len());
                    w.spare.push(b);
                }
            }
        }
        result
    }

    /// Writes out buffered chunks and makes the data file durable.
    pub fn flush_sync(&self) -> Result<()> {
        self.check_failed()?;
        self.write_out(&mut self.writer.lock(), true);
        self.write_queued()?;
        {
            // Buffers other threads took for writing before this commit must be on disk
            // before the sync that makes this commit's chunks durable.
            let mut w = self.writer.lock();
            while !w.writing.is_empty() {
                self.written.wait(&mut w);
            }
        }
        self.check_failed()?;
        // Not under the writer lock: workers keep appending other files' chunks while this
        // commit waits for the disk. The sync covers every write issued before it.
        if let Err(e) = self.stages().sync.time(0, || self.place.sync()) {
            return self.fail(e);
        }
        Ok(())
    }

    /// Appends already-encoded chunk bytes (gc's copies); returns where they went.
    pub fn append_stored(&self, chunk: &Checked) -> Result<DataOffset> {
        let stored = chunk.bytes();
        self.check_failed()?;
        let off = {
            let mut w = self.writer.lock();
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

    /// Reads a chunk's stored bytes. Parts not yet written out come from the buffers being
    /// written or the write buffer (a chunk may straddle them: head on disk, tail buffered).
    pub fn read_stored(&self, h: &ChunkHash, rec: &ChunkRecord) -> Result<Stored> {
        let bytes = self.read_range(rec.offset.0, rec.stored_len as usize)?;
        Ok(Stored::new(*h, *rec, bytes))
    }

    /// `read_stored` of the bytes exactly as stored (`Placement::read_as_stored`), for
    /// `ckptfs check`, which must see damage that reads already go around.
    pub fn read_as_stored(&self, h: &ChunkHash, rec: &ChunkRecord) -> Result<Stored> {
        let mut bytes = vec![0u8; rec.stored_len as usize];
        self.read_into_as(rec.offset.0, &mut bytes, true)?;
        Ok(Stored::new(*h, *rec, bytes))
    }

    /// A chunk whose stored bytes failed their check: asks the placement for a version
    /// that passes (erasure-coded targets rebuild it from the other shards). None: damaged
    /// beyond repair (the caller reports the corruption).
    pub fn repair(&self, h: ChunkHash, rec: ChunkRecord) -> Option<Verified> {
        let mut buf = vec![0u8; rec.stored_len as usize];
        let mut good = None;
        let mut check = |b: &[u8]| match Stored::new(h, rec, b.to_vec()).verify() {
            Ok(v) => {
                good = Some(v);
                true
            }
            Err(_) => false,
        };
        match self
            .place
            .read_repair(self.location(rec.offset.0), &mut buf, &mut check)
        {
            Ok(true) => good,
            Ok(false) => None,
            Err(e) => {
                log::warn!("repairing chunk {h}: {e}");
                None
            }
        }
    }

    /// Bytes the read path holds now: the buffers the cache keeps alive (each counted once,
    /// however many of its chunks are cached) and the spare read buffers' capacity. For the
    /// tests of their bounds.
    pub fn read_memory(&self) -> (usize, usize) {
        let cache = self.cache.lock();
        let mut owners = HashMap::new();
        for e in cache.map.values() {
            owners.insert(e.data.owner_key(), e.data.owner_len());
        }
        let spare = self.read_bufs.lock().iter().map(IoBuf::capacity).sum();
        (owners.values().sum(), spare)
    }

    /// Forgets every decoded chunk and spare read buffer (`ckptfs` control `drop_caches`,
    /// as `/proc/sys/vm/drop_caches` is for the kernel's): the next read of any chunk goes
    /// to the device, at the place this node knows now. Reads under way keep what they hold.
    pub fn drop_cache(&self) {
        *self.cache.lock() = ChunkCache::default();
        self.read_bufs.lock().clear();
    }

    /// Frees the spare read buffers if no chunk was read from the device since the last
    /// call (the daemon calls it four times a second), so a restart's read-ahead does not
    /// leave them allocated in an idle daemon.
    pub fn release_idle_read_buffers(&self) {
        if !self.read_lately.swap(false, Ordering::Relaxed) {
            self.read_bufs.lock().clear();
        }
    }

    /// `len` bytes of the data file at `off`, seeing writes not yet on disk.
    fn read_range(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut stored = vec![0u8; len];
        self.read_into(off, &mut stored)?;
        Ok(stored)
    }

    /// The bytes of the data file from `off` for `len`, read as the whole blocks that cover
    /// them into a reused buffer: the buffer and where in it `off` lies. The aligned span
    /// stays in `off`'s segment (segments are whole blocks).
    fn read_span(&self, off: u64, len: usize) -> Result<(IoBuf, usize)> {
        let a = DIRECT_ALIGN as u64;
        let start = off / a * a;
        let end = (off + len as u64).next_multiple_of(a);
        let need = (end - start) as usize;
        self.read_lately.store(true, Ordering::Relaxed);
        let mut buf = take_spare(&self.read_bufs, need);
        buf.reserve_exact_total(need.next_multiple_of(READ_BUF_GRAIN));
        buf.resize_for_overwrite(need);
        if let Err(e) = self.read_into(start, buf.as_mut_slice()) {
            keep_spare(&self.read_bufs, buf);
            return Err(e);
        }
        Ok((buf, (off - start) as usize))
    }

    /// Fills `stored` with the data file's bytes at `off`, seeing writes not yet on disk.
    fn read_into(&self, off: u64, stored: &mut [u8]) -> Result<()> {
        self.read_into_as(off, stored, false)
    }

    /// `read_into`; `as_stored`: through `Placement::read_as_stored`.
    fn read_into_as(&self, off: u64, stored: &mut [u8], as_stored: bool) -> Result<()> {
        let len = stored.len();
        let end = off + len as u64;
        let overlaps = |s: u64, n: usize| s < end && s + n as u64 > off;
        // Buffers are taken (cheap clones) under the lock and copied from after it; the
        // device is read only if they leave a gap.
        let (taken, covered) = {
            let w = self.writer.lock();
            let mut taken: Vec<(u64, Arc<IoBuf>, usize)> = w
                .writing
                .iter()
                .filter(|o| overlaps(o.start, o.n))
                .map(|o| (o.start, o.buf.clone(), o.n))
                .collect();
            if overlaps(w.buf_start, w.buf.len()) {
                // Only the overlapping bytes: the buffer may hold megabytes.
                let from = off.max(w.buf_start);
                let to = end.min(w.buf_start + w.buf.len() as u64);
                let mut copy = IoBuf::new();
                copy.extend_from_slice(
                    &w.buf.as_slice()[(from - w.buf_start) as usize..(to - w.buf_start) as usize],
                );
                taken.push((from, Arc::new(copy), (to - from) as usize));
            }
            let covered: u64 = taken
                .iter()
                .map(|(s, _, n)| (s + *n as u64).min(end) - (*s).max(off))
                .sum();
            (taken, covered)
        };
        if covered < end - off {
            match as_stored {
                true => self.place.read_as_stored(self.location(off), stored)?,
                false => self.place.read(self.location(off), stored)?,
            }
        }
        for (s, b, n) in taken {
            let from = s.max(off);
            let to = (s + n as u64).min(end);
            stored[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&b.as_slice()[(from - s) as usize..(to - s) as usize]);
        }
        Ok(())
    }
}

impl ReleasePins for ChunkStore {
    fn release(&self, hashes: &[ChunkHash]) {
        self.unpin(hashes)
    }
}

impl ChunkIo for ChunkStore {
    fn submit(&self, piece: Piece) -> Ticket {
        self.submit_all(vec![piece])
            .pop()
            .expect("one piece, one ticket")
    }

    /// One job per batch of pieces (a stream cut, a flush of dirty blocks): a worker wakes
    /// once per batch, not once per chunk, which at 64 KiB chunks was a large share of the
    /// daemon's CPU time. Batches larger than `BATCH_BYTES` are split so both workers get
    /// a share of one large cut.
    fn submit_all(&self, pieces: Vec<Piece>) -> Vec<Ticket> {
        let pool = self.pipeline.pool();
        if pool.workers() == 0 {
            return pieces
                .iter()
                .map(|p| Ticket::ready(self.put_piece(p)))
                .collect();
        }
        let mut tickets = Vec::with_capacity(pieces.len());
        let mut batch: Vec<(Piece, crate::pipeline::Completion)> = Vec::new();
        let mut batch_bytes = 0;
        let n = pieces.len();
        for (i, piece) in pieces.into_iter().enumerate() {
            let t = Ticket::pending();
            batch_bytes += piece.len();
            batch.push((piece, t.completion()));
            tickets.push(t);
            if batch_bytes >= BATCH_BYTES || i + 1 == n {
                // The permit lives until the job is done, so the budget bounds queued and
                // running work. It does not wait for the file state to retire the pieces:
                // that happens at the file's next write or commit, and a state stuck behind
                // a failed piece (a full space) must not keep every other writer waiting.
                let permit = self.pipeline.admit(batch_bytes);
                let me = self.me.upgrade().expect("a store in use is alive");
                let job = std::mem::take(&mut batch);
                let gpu = self.gpu.lock().clone();
                pool.run(move || match gpu {
                    // Hash and dedup here; chunks not found go to the GPU's batches, with
                    // the permit, which is released once they are appended.
                    Some(gpu) => {
                        let mut new = Vec::new();
                        for (piece, done) in job {
                            match me.lookup(piece.bytes(), piece.known_hash()) {
                                Ok(Lookup::Miss(hash)) => {
                                    new.push(gpu::NewChunk { hash, piece, done })
                                }
                                Ok(Lookup::Hit(h)) => done.complete(Ok(h)),
                                Err(e) => done.complete(Err(e)),
                            }
                        }
                        gpu.push(new, permit);
                    }
                    None => {
                        for (piece, done) in job {
                            done.complete(me.put_piece(&piece));
                        }
                        drop(permit);
                    }
                });
                batch_bytes = 0;
            }
        }
        tickets
    }

    fn cutters(&self) -> Option<&dyn crate::pipeline::Cutters> {
        Some(&*self.pipeline)
    }

    fn successors(&self) -> Option<crate::pipeline::Predictor> {
        Some(crate::pipeline::Predictor {
            table: self.successors.clone(),
            pipeline: Some(self.pipeline.clone()),
        })
    }

    fn put(&self, data: &[u8]) -> Result<ChunkHash> {
        self.put_hashed(data, None)
    }

    fn get(&self, h: &ChunkHash) -> Result<ChunkBytes> {
        Ok(self.get_many(std::slice::from_ref(h))?.remove(0))
    }

    fn get_many(&self, hashes: &[ChunkHash]) -> Result<Vec<ChunkBytes>> {
        ChunkStore::get_many(self, hashes)
    }
}

/// What the dedup lookup found for a piece.
enum Lookup {
    /// Stored already (committed, or pinned by a file state); now pinned once more.
    Hit(ChunkHash),
    /// New: to be encoded and stored.
    Miss(ChunkHash),
}

impl ChunkStore {
    /// Hashes a piece and pins the chunk if it is stored already.
    /// `put` of a piece, taking its hash where the cutter already computed it.
    fn put_piece(&self, piece: &Piece) -> Result<ChunkHash> {
        self.put_hashed(piece.bytes(), piece.known_hash())
    }

    fn put_hashed(&self, data: &[u8], known: Option<ChunkHash>) -> Result<ChunkHash> {
        let h = match self.lookup(data, known)? {
            Lookup::Hit(h) => return Ok(h),
            Lookup::Miss(h) => h,
        };
        let policy = *self.codec.lock();
        let (codec, encoded) = self
            .stages()
            .compress
            .time(data.len(), || crate::codec::encode(data, policy));
        // Stored raw when compression does not pay, so incompressible data costs nothing extra.
        self.store_new(h, data.len(), codec, encoded.as_deref().unwrap_or(data))
    }

    /// Hashes `data` (unless `known`: its hash, computed by the caller over exactly these
    /// bytes) and looks it up among pinned and committed chunks.
    fn lookup(&self, data: &[u8], known: Option<ChunkHash>) -> Result<Lookup> {
        self.check_failed()?;
        assert!(!data.is_empty() && data.len() <= u32::MAX as usize);
        let h = match known {
            Some(h) => h,
            None => self.stages().hash.time(data.len(), || ChunkHash::of(data)),
        };
        let _shared = self.barrier.read();
        if let Some(e) = self.pending.lock().get_mut(&h) {
            e.holders += 1;
            self.dedup_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Lookup::Hit(h));
        }
        let found = self.stages().lookup.time(0, || self.committed_record(&h))?;
        if let Some(rec) = found {
            self.pending
                .lock()
                .entry(h)
                .or_insert(Pending {
                    rec,
                    holders: 0,
                    new: false,
                })
                .holders += 1;
            self.dedup_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Lookup::Hit(h));
        }
        Ok(Lookup::Miss(h))
    }

    /// Stores a new chunk's encoded bytes: appends them and writes out full buffers.
    fn store_new(
        &self,
        h: ChunkHash,
        raw_len: usize,
        codec: Codec,
        bytes: &[u8],
    ) -> Result<ChunkHash> {
        let t_append = std::time::Instant::now();
        let r = self.append_new(h, raw_len, codec, bytes);
        self.stages().append.add(t_append.elapsed(), bytes.len());
        // Also after a failure (a full space): buffers queued for writing go out.
        self.write_queued()?;
        r
    }

    /// Appends a new chunk's stored bytes to the write buffer and pins it.
    fn append_new(
        &self,
        h: ChunkHash,
        raw_len: usize,
        codec: Codec,
        bytes: &[u8],
    ) -> Result<ChunkHash> {
        let mut w = self.writer.lock();
        {
            let mut pending = self.pending.lock();
            if let Some(e) = pending.get_mut(&h) {
                e.holders += 1;
                return Ok(h);
            }
            let off = self.alloc(&mut w, bytes.len() as u64, false)?;
            w.buf.extend_from_slice(bytes);
            w.fill += bytes.len() as u64;
            pending.insert(
                h,
                Pending {
                    rec: ChunkRecord {
                        offset: DataOffset(off),
                        stored_len: bytes.len() as u32,
                        raw_len: raw_len as u32,
                        codec,
                        refs: 0,
                    },
                    holders: 1,
                    new: true,
                },
            );
        }
        self.chunks_stored.fetch_add(1, Ordering::Relaxed);
        if w.buf.len() as u64 >= WRITE_BYTES.min(self.segment_bytes) {
            self.write_out(&mut w, false);
        }
        Ok(h)
    }
}

/// Decoded chunks kept for reads that come back for them (a read request that ends inside
/// a chunk, and the next one that starts there), and where a sequential reader's
/// read-ahead goes. Bounded by bytes, `CACHE_BYTES`, each chunk charged its share of the
/// buffer it keeps alive (see `load_many`).
///
/// Chunks a reader has asked for go first, oldest first, and only then chunks read ahead
/// that no reader has asked for yet: a sequential reader rarely comes back to a chunk
/// (only the next request, right after, for one it ended inside), while a chunk read ahead
/// is about to be asked for. Plain first-in first-out evicted the read-ahead of the slower
/// of 8 readers before they got to it: 8 cold readers of 128 MiB each read 1202-1232 MiB
/// from the disk, now 1035-1072.
#[derive(Default)]
struct ChunkCache {
    map: HashMap<ChunkHash, CacheEntry>,
    /// Chunks no reader has asked for yet, oldest first, with the generation they were put
    /// in as (an older entry of a chunk put again, or one asked for since, is skipped).
    unread: VecDeque<(ChunkHash, u64)>,
    /// Chunks readers have asked for, oldest first; evicted before `unread`.
    read: VecDeque<(ChunkHash, u64)>,
    bytes: usize,
    next_gen: u64,
}

struct CacheEntry {
    data: ChunkBytes,
    cost: usize,
    gen: u64,
    asked: bool,
}

impl ChunkCache {
    fn contains(&self, h: &ChunkHash) -> bool {
        self.map.contains_key(h)
    }

    /// The chunk, for a reader (`asked`) or for read-ahead.
    fn get(&mut self, h: &ChunkHash, asked: bool) -> Option<ChunkBytes> {
        let e = self.map.get_mut(h)?;
        if asked && !e.asked {
            e.asked = true;
            self.read.push_back((*h, e.gen));
        }
        Some(e.data.clone())
    }

    fn put(&mut self, h: ChunkHash, data: ChunkBytes, cost: usize) {
        if self.map.contains_key(&h) {
            return;
        }
        let gen = self.next_gen;
        self.next_gen += 1;
        self.bytes += cost;
        self.map.insert(
            h,
            CacheEntry {
                data,
                cost,
                gen,
                asked: false,
            },
        );
        self.unread.push_back((h, gen));
        while self.bytes > CACHE_BYTES {
            let Some(old) = self.oldest() else {
                break;
            };
            if let Some(e) = self.map.remove(&old) {
                self.bytes -= e.cost;
            }
        }
        // `unread` keeps a stale entry for each chunk asked for since; drop them before
        // they outnumber the live ones (the queues stay within twice the map).
        if self.unread.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.unread
                .retain(|(h, g)| map.get(h).is_some_and(|e| e.gen == *g && !e.asked));
        }
    }

    /// The next chunk to evict: the oldest asked for, else the oldest read ahead.
    fn oldest(&mut self) -> Option<ChunkHash> {
        let live = |map: &HashMap<ChunkHash, CacheEntry>, h: &ChunkHash, g: u64, asked: bool| {
            map.get(h).is_some_and(|e| e.gen == g && e.asked == asked)
        };
        while let Some((h, g)) = self.read.pop_front() {
            if live(&self.map, &h, g, true) {
                return Some(h);
            }
        }
        while let Some((h, g)) = self.unread.pop_front() {
            if live(&self.map, &h, g, false) {
                return Some(h);
            }
        }
        None
    }
}

/// A device read's buffer, shared by the raw chunks verified in it (`ChunkBytes` ranges of
/// it, no copy); back to the store's spare buffers when the last of them is dropped.
struct ReadBuf {
    buf: IoBuf,
    spare: Weak<Mutex<Vec<IoBuf>>>,
}

impl AsRef<[u8]> for ReadBuf {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        if let Some(spare) = self.spare.upgrade() {
            keep_spare(&spare, std::mem::take(&mut self.buf));
        }
    }
}

/// The smallest spare read buffer that holds `need` bytes, else the largest one (to grow),
/// else a new one.
fn take_spare(spare: &Mutex<Vec<IoBuf>>, need: usize) -> IoBuf {
    let mut spare = spare.lock();
    let fits = (0..spare.len())
        .filter(|&i| spare[i].capacity() >= need)
        .min_by_key(|&i| spare[i].capacity());
    let pick = fits.or_else(|| (0..spare.len()).max_by_key(|&i| spare[i].capacity()));
    pick.map(|i| spare.swap_remove(i)).unwrap_or_default()
}

/// Keeps a read buffer for the next read, within the bounds (`SPARE_READ_BUFS`).
fn keep_spare(spare: &Mutex<Vec<IoBuf>>, mut buf: IoBuf) {
    if buf.capacity() > SPARE_READ_BUF_BYTES {
        return;
    }
    buf.clear();
    let mut spare = spare.lock();
    if spare.len() < SPARE_READ_BUFS {
        spare.push(buf);
    }
}

impl ChunkStore {
    /// Verified bytes of several chunks, in the order asked. Chunks not cached are looked up
    /// in one table transaction and read in as few device reads as possible: chunks written
    /// one after the other (a sequentially written file) come back in reads of up to
    /// `READ_BYTES`, not one small read each.
    pub fn get_many(&self, hashes: &[ChunkHash]) -> Result<Vec<ChunkBytes>> {
        self.fetch(hashes, true, &HashMap::new())
    }

    /// `get_many` of chunks whose records the caller knows (another slot's published
    /// extents): read through the same cache, coalescing, verification and repair as this
    /// slot's own chunks. A chunk pending here, or in this slot's catalog, is read from
    /// where this slot has it; the rest from the record given. A record gone stale (its
    /// owner moved the chunk) fails verification: `Corrupt`, for the caller to read the
    /// owner's newer records.
    pub fn get_many_at(&self, chunks: &[(ChunkHash, ChunkRecord)]) -> Result<Vec<ChunkBytes>> {
        let known: HashMap<ChunkHash, ChunkRecord> = chunks.iter().copied().collect();
        let hashes: Vec<ChunkHash> = chunks.iter().map(|(h, _)| *h).collect();
        self.fetch(&hashes, true, &known)
    }

    /// `get_many` for a reader (`asked`: the cache may let these chunks go first now), or
    /// for read-ahead.
    fn fetch(
        &self,
        hashes: &[ChunkHash],
        asked: bool,
        known: &HashMap<ChunkHash, ChunkRecord>,
    ) -> Result<Vec<ChunkBytes>> {
        // Chunks another thread is reading right now (a prefetch, a parallel request) are
        // waited for, not read twice; the rest are claimed and read here.
        let (claimed, others) = {
            let cache = self.cache.lock();
            let mut loading = self.loading.lock();
            let mut claimed = Vec::new();
            let mut others = Vec::new();
            for h in hashes {
                if cache.contains(h) || claimed.contains(h) {
                    continue;
                }
                match loading.get(h) {
                    Some(l) => others.push(l.clone()),
                    None => {
                        loading.insert(*h, Arc::new(Loading::default()));
                        claimed.push(*h);
                    }
                }
            }
            (claimed, others)
        };
        if !claimed.is_empty() {
            let r = self.load_many(&claimed, false, known);
            let mut loading = self.loading.lock();
            for h in &claimed {
                if let Some(l) = loading.remove(h) {
                    *l.done.lock() = true;
                    l.cv.notify_all();
                }
            }
            drop(loading);
            r?;
        }
        for l in others {
            let mut done = l.done.lock();
            while !*done {
                l.cv.wait(&mut done);
            }
        }
        // Everything is cached now, unless a load failed or the cache let a chunk go: those
        // are read (and their errors reported) here.
        self.load_many(hashes, asked, known)
    }

    /// Reads, verifies and caches chunks on the read threads, for a sequential reader that
    /// will ask for them soon; jobs of `PREFETCH_JOB_CHUNKS` so up to `READ_THREADS` device
    /// reads are in flight. Errors are left for the reader to meet and report. Bounded by the
    /// decoded-chunk cache, which is where the chunks go.
    pub fn prefetch(&self, hashes: Vec<ChunkHash>) {
        self.prefetch_known(hashes, Arc::new(HashMap::new()))
    }

    /// `prefetch` of chunks at records the caller gives (another slot's published
    /// extents, as `get_many_at` reads them): the same read threads, jobs and cache.
    pub fn prefetch_at(&self, chunks: Vec<(ChunkHash, ChunkRecord)>) {
        let hashes = chunks.iter().map(|(h, _)| *h).collect();
        self.prefetch_known(hashes, Arc::new(chunks.into_iter().collect()))
    }

    fn prefetch_known(&self, hashes: Vec<ChunkHash>, known: Arc<HashMap<ChunkHash, ChunkRecord>>) {
        // No workers: everything runs on the caller's thread in order (the crash tests'
        // replays), where a read ahead would only be a wasted read.
        if self.pipeline.workers() == 0 || hashes.is_empty() {
            return;
        }
        let pool = self
            .readers
            .get_or_init(|| Pool::new(READ_THREADS, "ckptfs-read"));
        let missing: Vec<ChunkHash> = {
            let cache = self.cache.lock();
            let loading = self.loading.lock();
            hashes
                .into_iter()
                .filter(|h| !cache.contains(h) && !loading.contains_key(h))
                .collect()
        };
        for part in missing.chunks(PREFETCH_JOB_CHUNKS) {
            let me = self.me.upgrade().expect("a store in use is alive");
            let part = part.to_vec();
            let known = known.clone();
            pool.run(move || {
                if let Ok(got) = me.fetch(&part, false, &known) {
                    let bytes = got.iter().map(|c| c.len()).sum();
                    me.stages().read_ahead.add(std::time::Duration::ZERO, bytes);
                }
            });
        }
    }

    /// The chunks, from the cache or read, verified and cached; `asked`: for a reader.
    fn load_many(
        &self,
        hashes: &[ChunkHash],
        asked: bool,
        known: &HashMap<ChunkHash, ChunkRecord>,
    ) -> Result<Vec<ChunkBytes>> {
        let mut found: HashMap<ChunkHash, ChunkBytes> = HashMap::with_capacity(hashes.len());
        {
            let mut cache = self.cache.lock();
            for h in hashes {
                if let Some(d) = cache.get(h, asked) {
                    found.insert(*h, d);
                }
            }
        }
        let mut missing: Vec<(ChunkHash, ChunkRecord)> = Vec::new();
        // Runs of chunks read in one device read: the buffer, where the run starts in it,
        // the run's first data offset, and its chunks (indices into `missing`).
        let mut runs: Vec<(IoBuf, usize, u64, std::ops::Range<usize>)> = Vec::new();
        {
            let _shared = self.barrier.read();
            let mut unpinned = Vec::new();
            for h in hashes {
                if found.contains_key(h)
                    || missing.iter().any(|(m, _)| m == h)
                    || unpinned.contains(h)
                {
                    continue;
                }
                match self.pending_record(h) {
                    Some(r) => missing.push((*h, r)),
                    None => unpinned.push(*h),
                }
            }
            for (h, rec) in unpinned.iter().zip(self.db.committed(&unpinned)?) {
                let rec = rec
                    .or_else(|| known.get(h).copied())
                    .ok_or(Corruption::UnknownChunk(*h))?;
                missing.push((*h, rec));
            }
            missing.sort_by_key(|(_, r)| r.offset.0);
            let mut k = 0;
            while k < missing.len() {
                // A run of chunks that lie back to back (small gaps, such as the padding
                // after a commit, are read along) is one device read.
                let start = missing[k].1.offset.0;
                let mut end = start + missing[k].1.stored_len as u64;
                let mut m = k + 1;
                while let Some((_, r)) = missing.get(m) {
                    let r_end = r.offset.0 + r.stored_len as u64;
                    if r.offset.0 < end
                        || r.offset.0 > end + 64 * 1024
                        || r_end - start > READ_BYTES
                    {
                        break;
                    }
                    end = r_end;
                    m += 1;
                }
                let len = (end - start) as usize;
                let (buf, at) = self
                    .stages()
                    .read
                    .time(len, || self.read_span(start, len))?;
                runs.push((buf, at, start, k..m));
                k = m;
            }
        }
        // Each chunk is checked where it lies in its run's buffer. A raw chunk stays there
        // (the cache and readers share the buffer); a compressed one is decoded into its own.
        for (buf, at, start, chunks) in runs {
            let cap = buf.capacity();
            let buf: Arc<ReadBuf> = Arc::new(ReadBuf {
                buf,
                spare: Arc::downgrade(&self.read_bufs),
            });
            let mut verified: Vec<(ChunkHash, ChunkBytes, bool)> = Vec::new();
            for (h, rec) in &missing[chunks] {
                let from = at + (rec.offset.0 - start) as usize;
                let bytes = &buf.buf.as_slice()[from..from + rec.stored_len as usize];
                let raw = self.stages().decode.time(rec.raw_len as usize, || {
                    StoredRef::new(*h, *rec, bytes).verify_raw()
                });
                let data = match raw {
                    Ok(std::borrow::Cow::Borrowed(_)) => (
                        ChunkBytes::new(buf.clone(), from..from + rec.raw_len as usize),
                        true,
                    ),
                    Ok(std::borrow::Cow::Owned(v)) => (ChunkBytes::owned(v), false),
                    Err(Error::Corrupt(c)) => {
                        let v = self.repair(*h, *rec).ok_or(Error::Corrupt(c))?;
                        (ChunkBytes::owned(v.into_bytes()), false)
                    }
                    Err(e) => return Err(e),
                };
                verified.push((*h, data.0, data.1));
            }
            // The chunks left in the buffer share its whole allocation's cost, so the cache
            // bounds the memory it keeps alive, not just the chunks' bytes. Where they fill
            // less than half of it (a single chunk of a random read, a run with gaps read
            // along), they are copied out instead, so the cache does not hold mostly unused
            // buffer, and the buffer goes back for the next read.
            let shared: usize = verified.iter().filter(|v| v.2).map(|v| v.1.len()).sum();
            if shared * 2 < cap {
                for v in verified.iter_mut().filter(|v| v.2) {
                    v.1 = ChunkBytes::owned(v.1.to_vec());
                    v.2 = false;
                }
            }
            drop(buf);
            let mut cache = self.cache.lock();
            for (h, data, in_buf) in verified {
                let cost = if in_buf {
                    (data.len() as u128 * cap as u128).div_ceil(shared as u128) as usize
                } else {
                    data.len()
                };
                cache.put(h, data.clone(), cost);
                if asked {
                    cache.get(&h, true);
                }
                found.insert(h, data);
            }
        }
        Ok(hashes.iter().map(|h| found[h].clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(i: u64) -> (ChunkHash, ChunkBytes) {
        let data = i.to_le_bytes().to_vec();
        (ChunkHash::of(&data), ChunkBytes::owned(data))
    }

    /// A quarter of the cache: the fifth chunk put evicts one.
    const COST: usize = CACHE_BYTES / 4;

    #[test]
    fn chunks_a_reader_asked_for_go_before_read_ahead() {
        let mut c = ChunkCache::default();
        let ks: Vec<_> = (0..8).map(chunk).collect();
        for (h, d) in &ks[..4] {
            c.put(*h, d.clone(), COST);
        }
        // The reader has taken the newest two; the oldest two are still ahead of it.
        assert!(c.get(&ks[2].0, true).is_some());
        assert!(c.get(&ks[3].0, true).is_some());
        // Read-ahead looking does not count as asking.
        assert!(c.get(&ks[0].0, false).is_some());
        c.put(ks[4].0, ks[4].1.clone(), COST);
        c.put(ks[5].0, ks[5].1.clone(), COST);
        assert!(!c.contains(&ks[2].0) && !c.contains(&ks[3].0));
        assert!(c.contains(&ks[0].0) && c.contains(&ks[1].0));
        // None asked for: the oldest read ahead goes.
        c.put(ks[6].0, ks[6].1.clone(), COST);
        assert!(!c.contains(&ks[0].0));
        assert!(c.contains(&ks[1].0) && c.contains(&ks[4].0) && c.contains(&ks[5].0));
        assert!(c.bytes <= CACHE_BYTES);
    }

    #[test]
    fn a_chunk_put_again_is_not_evicted_by_its_old_queue_entries() {
        let mut c = ChunkCache::default();
        let ks: Vec<_> = (0..16).map(chunk).collect();
        c.put(ks[0].0, ks[0].1.clone(), COST);
        c.get(&ks[0].0, true);
        for (h, d) in &ks[1..5] {
            c.put(*h, d.clone(), COST);
        }
        assert!(!c.contains(&ks[0].0), "asked for, so evicted first");
        // Put again: its stale entries in both queues must not evict the new one early.
        c.put(ks[0].0, ks[0].1.clone(), COST);
        c.put(ks[5].0, ks[5].1.clone(), COST);
        assert!(c.contains(&ks[0].0), "the new entry outlived an older one");
        assert!(!c.contains(&ks[1].0));
    }

    #[test]
    fn the_queues_stay_bounded_by_the_cache() {
        let mut c = ChunkCache::default();
        for i in 0..10_000u64 {
            let (h, d) = chunk(i);
            c.put(h, d, COST);
            c.get(&h, true);
            assert!(c.unread.len() <= 2 * c.map.len() + 64);
            assert!(c.read.len() <= c.map.len() + 4 * 64);
        }
        assert!(c.map.len() <= 4);
    }
}
