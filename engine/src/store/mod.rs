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
//!
//! Two parts and a reader: this module holds what both sides share (where chunks lie: the
//! pins of uncommitted file states and the catalog's committed records; the reuse barrier;
//! the sticky failure flag) and the store's face to the pipeline (`ChunkIo`); `write.rs`
//! owns new chunks (dedup lookup, encoding, aggregation into segment writes, segment
//! allocation and release, pins); verified reads are the read layer's `ChunkReader`
//! (`read::chunks`), which asks this store where chunks lie (`ChunkSource`) and for the
//! writer's bytes not yet on the device (`InFlight`), and nothing else.

use crate::chunk::ChunkBytes;
use crate::device::DIRECT_ALIGN;
use crate::error::{Error, Result};
use crate::format::{ChunkHash, ChunkRecord, DataOffset, SegmentId};
use crate::pins::ReleasePins;
use crate::placement::{Location, Placement};
use crate::read::{Buffered, ChunkReader, ChunkSource, InFlight};
use crate::write::pipeline::{ChunkIo, Piece, Pipeline, Ticket};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};

mod gpu;
mod write;
pub use crate::read::{CACHE_BYTES, READ_THREADS, SPARE_READ_BUFS, SPARE_READ_BUF_BYTES};
pub use gpu::GPU_SUB_BATCH_BYTES;
use write::{Pending, WriteSide};

/// New chunks are gathered in memory and written to the data file in pieces of this size:
/// large writes are what a parallel filesystem and a direct write want.
pub(crate) const WRITE_BYTES: u64 = 8 << 20;
pub use crate::alloc::GC_RESERVE_SEGMENTS;

/// Pieces handed to one worker job at most (see `submit_all`); also the run of chunks a
/// storm streak may span (`codec::Streak`, `ckptfs-bench codec`).
pub const BATCH_BYTES: usize = 512 << 10;
/// A submission of at most this many bytes is stored on the submitting thread (see
/// `submit_all`): as much as a small file's close hands over at once (`SMALL_STREAM`).
const SMALL_BATCH_BYTES: usize = 256 << 10;

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
    /// Pinned chunks, and where they lie (the writer stores new ones here; readers find
    /// uncommitted chunks here); lock order: barrier, writer, pending.
    pending: Mutex<HashMap<ChunkHash, Pending>>,
    /// Shared by chunk lookups and pinning; exclusive while gc deletes chunks or frees
    /// segments, so no lookup can straddle a reuse.
    barrier: RwLock<()>,
    /// Sticky failure, shared with the metadata table's backend (`MetaBackend`), which sets
    /// it on any failed write, length change or sync of the table's file.
    failed: Arc<crate::device::Failure>,
    /// New chunks: aggregation, segments, the GPU stage, the codec policy (`write.rs`).
    w: WriteSide,
    /// Verified reads: cache, coalescing, read-ahead, buffers (`read::chunks`).
    reader: Arc<ChunkReader>,
    pub dedup_hits: AtomicU64,
    pub chunks_stored: AtomicU64,
}

/// Where committed chunks lie. The catalog answers; the store sits below it and opens no
/// table itself.
pub trait CommittedChunks: Send + Sync {
    /// The committed records of `hashes`, in order (`None`: not in the chunk table), from
    /// one consistent snapshot.
    fn committed(&self, hashes: &[ChunkHash]) -> Result<Vec<Option<ChunkRecord>>>;
}

/// The stored bytes of a chunk the store wrote at a data offset, for a journal record to
/// carry (`catalog::journal::INLINE_BYTES`); None where the store cannot give them (a
/// placement whose writes are rows of shards, where a replay could not patch a block).
pub(crate) trait StoredBytes {
    fn stored_bytes(&self, offset: u64, len: u32) -> Option<Vec<u8>>;
}

impl ChunkStore {
    /// `segments`: how many segments the space (a slot: its share after its manifest area)
    /// allocates from, its capacity; `free` the free ones among them.
    pub(crate) fn new(
        place: Arc<dyn Placement>,
        segments: u64,
        pipeline: Arc<Pipeline>,
        db: Arc<dyn CommittedChunks>,
        free: BTreeSet<SegmentId>,
        failed: Arc<crate::device::Failure>,
    ) -> Arc<Self> {
        let segment_bytes = place.segment_bytes();
        let align = place.write_align();
        assert!(
            align.is_multiple_of(DIRECT_ALIGN) && segment_bytes.is_multiple_of(align as u64),
            "segments of {segment_bytes} bytes are not whole writes of {align}"
        );
        let w = WriteSide::new(free);
        Arc::new_cyclic(|me: &Weak<ChunkStore>| ChunkStore {
            me: me.clone(),
            reader: ChunkReader::new(
                place.clone(),
                me.clone(),
                me.clone(),
                pipeline.clone(),
                w.successors.clone(),
            ),
            pipeline,
            place,
            db,
            segment_bytes,
            segments,
            align,
            pending: Mutex::new(HashMap::new()),
            barrier: RwLock::new(()),
            failed,
            w,
            dedup_hits: AtomicU64::new(0),
            chunks_stored: AtomicU64::new(0),
        })
    }

    /// The chunk reader (verified reads, the cache, read-ahead, repair).
    pub fn reader(&self) -> &Arc<ChunkReader> {
        &self.reader
    }

    /// Verified bytes of several chunks, in the order asked (`ChunkReader::get_many`).
    pub fn get_many(&self, hashes: &[ChunkHash]) -> Result<Vec<ChunkBytes>> {
        self.reader.get_many(hashes)
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
        self.w.successors.learn(extents, max_chunk);
    }

    /// How the cutters confirm predicted chunks: by fingerprint where this mount has one
    /// (the default), or always by blake3 (`predict`'s module doc).
    pub fn confirm_by_fingerprint(&self, on: bool) {
        self.w.successors.confirm_by_fingerprint(on);
    }

    /// Whether the cutters cut bytes changed in place at the previous revision's
    /// boundaries (the default) or always by content (`predict`'s module doc).
    pub fn follow_changes(&self, on: bool) {
        self.w.successors.follow_changes(on);
    }

    /// Where the data path's time goes (the pipeline's timers).
    pub fn stages(&self) -> &crate::write::pipeline::Stages {
        &self.pipeline.stages
    }

    /// Sets the number of worker threads for submitted pieces; 0 stores them on the
    /// submitting thread, in order (the crash tests use that to replay a run exactly).
    pub fn set_workers(&self, n: usize) {
        self.pipeline.set_workers(n);
    }

    /// Chooses the encodings for new chunks (readers decode every codec regardless).
    pub fn set_codec_policy(&self, p: crate::codec::Policy) {
        *self.w.codec.lock() = p;
    }

    pub fn workers(&self) -> usize {
        self.pipeline.workers()
    }

    /// Compresses new chunks with `codec` (the GPU) from now on, in batches gathered from
    /// every file being written; `None` goes back to LZ4 on the workers. The batch codec
    /// writes plain LZ4 blocks (codec id 1), so the CPU decodes everything it stored. Only
    /// for the `Lz4` policy: the shuffle codec runs on the CPU.
    pub fn set_batch_codec(&self, codec: Option<Arc<dyn ckptfs_kernels::BatchCodec>>) {
        *self.w.gpu.lock() = codec.map(|c| gpu::GpuStage::start(c, self.me.clone()));
    }

    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Where data-file offset `off` lies (see `placement`).
    fn location(&self, off: u64) -> Location {
        Location::of(DataOffset(off), self.segment_bytes)
    }

    pub(crate) fn segment_of(&self, off: DataOffset) -> SegmentId {
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
        let w = self.w.writer.lock();
        let rest = w.cur.map_or(0, |_| self.segment_bytes - w.fill);
        w.segs.free_count() * self.segment_bytes + rest
    }

    pub fn is_failed(&self) -> bool {
        self.failed.is_set()
    }

    /// Why the space failed (`is_failed`): the first failure's reason.
    pub fn failure(&self) -> Option<String> {
        self.failed.why()
    }

    fn check_failed(&self) -> Result<()> {
        if self.is_failed() {
            Err(Error::Failed)
        } else {
            Ok(())
        }
    }

    fn fail<T>(&self, e: crate::error::Fault) -> Result<T> {
        Err(self.fail_with(e.into()))
    }

    /// Makes the store refuse writes from now on, and returns `e`. Sticky: after a failed
    /// write, sync or metadata commit the state of the disk is unknown, so no later write
    /// or commit may report success (a second fsync "succeeding" after a lost write is how
    /// data is silently lost).
    pub(crate) fn fail_with(&self, e: Error) -> Error {
        if self
            .failed
            .raise(format!("a backing write or sync failed: {e}"))
        {
            log::error!("backing I/O failed, refusing further writes until remount: {e}");
        }
        e
    }

    /// Makes the store refuse writes from now on for `why` (a backing file lost while
    /// mounted, `space::watch`), logged once.
    pub(crate) fn fail_because(&self, why: &str) {
        if self.failed.raise(why) {
            log::error!("refusing further writes until remount: {why}");
        }
    }

    pub fn committed_record(&self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        Ok(self.db.committed(std::slice::from_ref(h))?.pop().flatten())
    }

    /// The record of a pinned chunk (stored or found by an uncommitted file state).
    pub(crate) fn pending_record(&self, h: &ChunkHash) -> Option<ChunkRecord> {
        self.pending.lock().get(h).map(|p| p.rec)
    }
}

impl ChunkSource for ChunkStore {
    fn hold_reuse(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.barrier.read()
    }

    fn locate(&self, hashes: &[ChunkHash]) -> Result<Vec<Option<ChunkRecord>>> {
        let mut out: Vec<Option<ChunkRecord>> =
            hashes.iter().map(|h| self.pending_record(h)).collect();
        let unpinned: Vec<ChunkHash> = hashes
            .iter()
            .zip(&out)
            .filter(|(_, r)| r.is_none())
            .map(|(h, _)| *h)
            .collect();
        let mut committed = self.db.committed(&unpinned)?.into_iter();
        for r in out.iter_mut().filter(|r| r.is_none()) {
            *r = committed.next().flatten();
        }
        Ok(out)
    }
}

impl InFlight for ChunkStore {
    fn in_flight(&self, off: u64, len: usize) -> Vec<Buffered> {
        let end = off + len as u64;
        let overlaps = |s: u64, n: usize| s < end && s + n as u64 > off;
        let w = self.w.writer.lock();
        let mut out: Vec<Buffered> = w
            .unwritten
            .iter()
            .chain(&w.writing)
            .filter(|o| overlaps(o.start, o.n))
            .map(|o| Buffered {
                start: o.start,
                buf: o.buf.clone(),
                n: o.n,
            })
            .collect();
        if overlaps(w.buf_start, w.buf.len()) {
            // Only the overlapping bytes: the buffer may hold megabytes.
            let from = off.max(w.buf_start);
            let to = end.min(w.buf_start + w.buf.len() as u64);
            let mut copy = crate::device::IoBuf::new();
            // Exactly what is copied: an appending buffer starts at 1 MiB, which malloc
            // maps and unmaps for each small close's journal record.
            copy.reserve_exact_total((to - from) as usize);
            copy.extend_from_slice(
                &w.buf.as_slice()[(from - w.buf_start) as usize..(to - w.buf_start) as usize],
            );
            out.push(Buffered {
                start: from,
                buf: Arc::new(copy),
                n: (to - from) as usize,
            });
        }
        out
    }
}

impl StoredBytes for ChunkStore {
    /// From the write buffers when they hold them (a commit's chunks usually are: nothing
    /// wrote them out yet), else read back from the placement. Only a placement of whole
    /// blocks (the data file): a replay patches blocks, which rows of shards forbid.
    fn stored_bytes(&self, offset: u64, len: u32) -> Option<Vec<u8>> {
        if self.align != DIRECT_ALIGN {
            return None;
        }
        let len = len as usize;
        let mut out = vec![0u8; len];
        let pieces = self.in_flight(offset, len);
        // Bytes the buffers cover, as ranges relative to `offset`, to see whether the
        // placement must be read at all.
        let mut covered: Vec<(usize, usize)> = pieces
            .iter()
            .map(|b| {
                let from = b.start.max(offset);
                let to = (b.start + b.n as u64).min(offset + len as u64);
                ((from - offset) as usize, (to - offset) as usize)
            })
            .collect();
        covered.sort_unstable();
        let mut reach = 0;
        for (a, b) in &covered {
            if *a > reach {
                break;
            }
            reach = reach.max(*b);
        }
        if reach < len {
            let at = crate::placement::Location::of(DataOffset(offset), self.segment_bytes);
            self.place.read(at, &mut out).ok()?;
        }
        // Newer than what the placement has: laid over it.
        for b in &pieces {
            let from = b.start.max(offset);
            let to = (b.start + b.n as u64).min(offset + len as u64);
            let src = &b.buf.as_slice()[(from - b.start) as usize..(to - b.start) as usize];
            out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
        }
        Some(out)
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
        let mut tickets = Vec::with_capacity(pieces.len());
        let mut batch: Vec<(Piece, crate::write::pipeline::Completion)> = Vec::new();
        let mut batch_bytes = 0;
        let n = pieces.len();
        let small = pieces.iter().map(|p| p.len()).sum::<usize>() <= SMALL_BATCH_BYTES;
        for (i, piece) in pieces.into_iter().enumerate() {
            let t = Ticket::pending();
            batch_bytes += piece.len();
            batch.push((piece, t.completion()));
            tickets.push(t);
            if batch_bytes >= BATCH_BYTES || i + 1 == n {
                // The permit lives until the batch's chunks are appended, so the budget
                // bounds queued and running work. It does not wait for the file state to
                // retire the pieces: that happens at the file's next write or commit, and a
                // state stuck behind a failed piece (a full space) must not keep every
                // other writer waiting.
                let permit = self.pipeline.admit(batch_bytes);
                let job = std::mem::take(&mut batch);
                match pool.workers() {
                    // No workers (tests, a store opened for maintenance): in this thread.
                    0 => self.store_batch(job, permit),
                    // A small submission (a small file's close, a stream's last chunks):
                    // storing it here costs less than waking a worker and waiting for it.
                    _ if small => self.store_batch(job, permit),
                    _ => {
                        let me = self.me.upgrade().expect("a store in use is alive");
                        pool.run(move || me.store_batch(job, permit));
                    }
                }
                batch_bytes = 0;
            }
        }
        tickets
    }

    fn cutters(&self) -> Option<&dyn crate::write::pipeline::Cutters> {
        Some(&*self.pipeline)
    }

    fn successors(&self) -> Option<crate::write::pipeline::Predictor> {
        Some(crate::write::pipeline::Predictor {
            table: self.w.successors.clone(),
            pipeline: Some(self.pipeline.clone()),
        })
    }

    /// One chunk of bytes the caller owns: copied into a piece and stored the one way
    /// (`store_batch`). The write path submits pieces; this is for tests and tools.
    fn put(&self, data: &[u8]) -> Result<ChunkHash> {
        let piece = Piece::new(data.to_vec().into(), 0, data.len());
        self.submit(piece).wait()
    }

    fn get(&self, h: &ChunkHash) -> Result<ChunkBytes> {
        Ok(self.get_many(std::slice::from_ref(h))?.remove(0))
    }

    fn get_many(&self, hashes: &[ChunkHash]) -> Result<Vec<ChunkBytes>> {
        self.reader.get_many(hashes)
    }
}
