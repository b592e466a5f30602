//! The chunk store: dedup lookup, compression, aggregation of new chunks into large writes to
//! the reserved data file, segment allocation, and verified reads.
//!
//! Space is handed out in segments (`Superblock::segment_bytes`). New chunks are appended to
//! the current segment; a full segment is followed by the lowest free one. gc frees segments
//! whose chunks are all dead or have been copied elsewhere.
//!
//! Pins: a chunk that an uncommitted file state refers to (stored by it, or found by dedup)
//! is held in `pending` until that file commits or discards its state. gc never deletes a
//! pinned chunk and never frees a segment holding one. The reuse barrier orders segment reuse
//! after every chunk lookup that might still see the old location.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::filemap::ChunkIo;
use crate::format::{ChunkHash, ChunkRecord, Codec, DataOffset};
use crate::meta::CHUNKS;
use parking_lot::{Mutex, RwLock};
use redb::{Database, ReadableDatabase};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Decoded chunks kept for reads that come back for the same chunk; bounded by count, so at
/// most this many maximal chunks.
pub const CACHE_CHUNKS: usize = 32;

struct Writer {
    /// The segment being filled, and how many of its bytes are used (written or buffered).
    cur: Option<u64>,
    fill: u64,
    /// Data-file offset of `buf[0]`; `buf` never crosses a segment boundary.
    buf_start: u64,
    buf: Vec<u8>,
    /// Segments free for allocation (authoritative in memory; persisted in the FREE table).
    free: BTreeSet<u64>,
    /// Segments taken from the free list since the last commit that recorded them.
    taken: BTreeSet<u64>,
}

struct Pending {
    rec: ChunkRecord,
    holders: u32,
}

pub struct ChunkStore {
    dev: Arc<dyn Device>,
    db: Arc<Database>,
    segment_bytes: u64,
    segments: u64,
    writer: Mutex<Writer>,
    /// Pinned chunks; lock order: barrier, writer, pending.
    pending: Mutex<HashMap<ChunkHash, Pending>>,
    /// Shared by chunk lookups and pinning; exclusive while gc deletes chunks or frees
    /// segments, so no lookup can straddle a reuse.
    barrier: RwLock<()>,
    cache: Mutex<VecDeque<(ChunkHash, Arc<[u8]>)>>,
    /// Sticky failure, shared with the metadata table's backend (`MetaBackend`), which sets
    /// it on any failed write, length change or sync of the table's file.
    failed: Arc<AtomicBool>,
    pub dedup_hits: AtomicU64,
    pub chunks_stored: AtomicU64,
}

impl ChunkStore {
    pub fn new(
        dev: Arc<dyn Device>,
        db: Arc<Database>,
        segment_bytes: u64,
        free: BTreeSet<u64>,
        failed: Arc<AtomicBool>,
    ) -> Self {
        let segments = dev.len() / segment_bytes;
        ChunkStore {
            dev,
            db,
            segment_bytes,
            segments,
            writer: Mutex::new(Writer {
                cur: None,
                fill: 0,
                buf_start: 0,
                buf: Vec::new(),
                free,
                taken: BTreeSet::new(),
            }),
            pending: Mutex::new(HashMap::new()),
            barrier: RwLock::new(()),
            cache: Mutex::new(VecDeque::with_capacity(CACHE_CHUNKS)),
            failed,
            dedup_hits: AtomicU64::new(0),
            chunks_stored: AtomicU64::new(0),
        }
    }

    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    pub fn segment_of(&self, off: DataOffset) -> u64 {
        off.0 / self.segment_bytes
    }

    /// Usable bytes: whole segments of the data file.
    pub fn capacity(&self) -> u64 {
        self.segments * self.segment_bytes
    }

    /// Bytes that new chunks can still use: free segments plus the rest of the current one.
    pub fn free_bytes(&self) -> u64 {
        let w = self.writer.lock();
        let rest = w.cur.map_or(0, |_| self.segment_bytes - w.fill);
        w.free.len() as u64 * self.segment_bytes + rest
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
        let txn = self.db.begin_read()?;
        let t = txn.open_table(CHUNKS)?;
        match t.get(h.0.as_slice())? {
            Some(v) => Ok(Some(ChunkRecord::decode(v.value())?)),
            None => Ok(None),
        }
    }

    /// The record of a pinned chunk (stored or found by an uncommitted file state).
    pub fn pending_record(&self, h: &ChunkHash) -> Option<ChunkRecord> {
        self.pending.lock().get(h).map(|p| p.rec)
    }

    pub fn is_pinned(&self, h: &ChunkHash) -> bool {
        self.pending.lock().contains_key(h)
    }

    /// Drops one pin per hash: a file state committed or discarded what it had put.
    pub fn unpin(&self, hashes: &[ChunkHash]) {
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
    /// by a commit, and any holding a pinned chunk.
    pub fn busy_segments(&self) -> BTreeSet<u64> {
        let w = self.writer.lock();
        let p = self.pending.lock();
        let mut s: BTreeSet<u64> = w.taken.clone();
        s.extend(w.cur);
        s.extend(p.values().map(|e| e.rec.offset.0 / self.segment_bytes));
        s
    }

    /// Segments taken since the last recorded commit; a commit removes them from FREE and
    /// then calls `recorded_taken`.
    pub fn taken_segments(&self) -> Vec<u64> {
        self.writer.lock().taken.iter().copied().collect()
    }

    pub fn recorded_taken(&self, segs: &[u64]) {
        let mut w = self.writer.lock();
        for s in segs {
            w.taken.remove(s);
        }
    }

    /// Makes segments reusable once gc's commit freeing them is durable. Waits for every
    /// chunk lookup in flight, which might still read the old location.
    pub fn release_segments(&self, segs: &[u64]) {
        let _excl = self.barrier.write();
        let mut w = self.writer.lock();
        w.free.extend(segs.iter().copied());
    }

    /// Returns to the free set the segments taken since the last commit whose chunks no file
    /// state holds any more: a save that failed (a full space) or was discarded before any
    /// commit recorded its segments leaves only garbage there, and the table still lists
    /// those segments free. Without this they would stay out of use until some later commit
    /// recorded them, which a full space may never get to. Only gc calls this, under its
    /// lock: gc's own copies are the only other unpinned chunks in taken segments.
    pub fn reclaim_unrecorded(&self) -> Vec<u64> {
        let _excl = self.barrier.write();
        let mut w = self.writer.lock();
        let p = self.pending.lock();
        let held: BTreeSet<u64> = p
            .values()
            .map(|e| e.rec.offset.0 / self.segment_bytes)
            .collect();
        let back: Vec<u64> = w
            .taken
            .iter()
            .copied()
            .filter(|s| Some(*s) != w.cur && !held.contains(s))
            .collect();
        for s in &back {
            w.taken.remove(s);
            w.free.insert(*s);
        }
        back
    }

    /// Holds off chunk lookups and pinning while gc deletes chunk records.
    pub fn exclusive(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.barrier.write()
    }

    /// Finds room for `len` bytes, moving to the next free segment when the current one is
    /// full. Returns the data-file offset.
    fn alloc(&self, w: &mut Writer, len: u64) -> Result<u64> {
        assert!(len <= self.segment_bytes);
        if let Some(c) = w.cur {
            if w.fill + len <= self.segment_bytes {
                return Ok(c * self.segment_bytes + w.fill);
            }
        }
        self.write_out(w)?;
        let next = w.free.pop_first().ok_or(Error::NoSpace)?;
        w.taken.insert(next);
        w.cur = Some(next);
        w.fill = 0;
        w.buf_start = next * self.segment_bytes;
        Ok(w.buf_start)
    }

    fn write_out(&self, w: &mut Writer) -> Result<()> {
        if w.buf.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.dev.write_at(&w.buf, w.buf_start) {
            return self.fail(e);
        }
        w.buf_start += w.buf.len() as u64;
        w.buf.clear();
        Ok(())
    }

    /// Writes out buffered chunks and makes the data file durable.
    pub fn flush_sync(&self) -> Result<()> {
        self.check_failed()?;
        let mut w = self.writer.lock();
        self.write_out(&mut w)?;
        if let Err(e) = self.dev.sync() {
            return self.fail(e);
        }
        Ok(())
    }

    /// Appends already-encoded chunk bytes (gc's copies); returns where they went.
    pub fn append_stored(&self, stored: &[u8]) -> Result<DataOffset> {
        self.check_failed()?;
        let mut w = self.writer.lock();
        let off = self.alloc(&mut w, stored.len() as u64)?;
        w.buf.extend_from_slice(stored);
        w.fill += stored.len() as u64;
        if w.buf.len() as u64 >= self.segment_bytes / 2 {
            self.write_out(&mut w)?;
        }
        Ok(DataOffset(off))
    }

    /// Reads a chunk's stored bytes (from the write buffer if not yet written out).
    pub fn read_stored(&self, rec: &ChunkRecord) -> Result<Vec<u8>> {
        let mut stored = vec![0u8; rec.stored_len as usize];
        {
            let w = self.writer.lock();
            let off = rec.offset.0;
            let buf_end = w.buf_start + w.buf.len() as u64;
            if off >= w.buf_start && off < buf_end {
                let at = (off - w.buf_start) as usize;
                let n = stored.len();
                stored.copy_from_slice(&w.buf[at..at + n]);
                return Ok(stored);
            }
        }
        self.dev.read_at(&mut stored, rec.offset.0)?;
        Ok(stored)
    }

    /// Decodes stored bytes and checks them against the hash that names them.
    pub fn decode_verified(h: &ChunkHash, rec: &ChunkRecord, stored: Vec<u8>) -> Result<Vec<u8>> {
        let raw = match rec.codec {
            Codec::Raw => stored,
            Codec::Lz4 => {
                lz4_flex::block::decompress(&stored, rec.raw_len as usize).map_err(|e| {
                    Error::Corrupt(format!(
                        "chunk {h:?} at data offset {} does not decode: {e}",
                        rec.offset.0
                    ))
                })?
            }
        };
        // The hash lives in the metadata, not next to the data: a torn, misdirected or rotted
        // write is caught here, and the reader gets an error instead of wrong bytes.
        if raw.len() != rec.raw_len as usize || ChunkHash::of(&raw) != *h {
            return Err(Error::Corrupt(format!(
                "chunk {h:?} at data offset {} fails its blake3 check",
                rec.offset.0
            )));
        }
        Ok(raw)
    }
}

impl ChunkIo for ChunkStore {
    fn put(&self, data: &[u8]) -> Result<ChunkHash> {
        self.check_failed()?;
        assert!(!data.is_empty() && data.len() <= u32::MAX as usize);
        let h = ChunkHash::of(data);
        {
            let _shared = self.barrier.read();
            if let Some(e) = self.pending.lock().get_mut(&h) {
                e.holders += 1;
                self.dedup_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(h);
            }
            if let Some(rec) = self.committed_record(&h)? {
                self.pending
                    .lock()
                    .entry(h)
                    .or_insert(Pending { rec, holders: 0 })
                    .holders += 1;
                self.dedup_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(h);
            }
        }
        let compressed = lz4_flex::block::compress(data);
        // Store raw when compression does not pay, so incompressible data costs nothing extra.
        let (codec, bytes): (Codec, &[u8]) = if compressed.len() < data.len() {
            (Codec::Lz4, &compressed)
        } else {
            (Codec::Raw, data)
        };
        let mut w = self.writer.lock();
        {
            let mut pending = self.pending.lock();
            if let Some(e) = pending.get_mut(&h) {
                e.holders += 1;
                return Ok(h);
            }
            let off = self.alloc(&mut w, bytes.len() as u64)?;
            w.buf.extend_from_slice(bytes);
            w.fill += bytes.len() as u64;
            pending.insert(
                h,
                Pending {
                    rec: ChunkRecord {
                        offset: DataOffset(off),
                        stored_len: bytes.len() as u32,
                        raw_len: data.len() as u32,
                        codec,
                        refs: 0,
                    },
                    holders: 1,
                },
            );
        }
        self.chunks_stored.fetch_add(1, Ordering::Relaxed);
        if w.buf.len() as u64 >= self.segment_bytes.min(8 << 20) {
            self.write_out(&mut w)?;
        }
        Ok(h)
    }

    fn get(&self, h: &ChunkHash) -> Result<Arc<[u8]>> {
        if let Some((_, d)) = self.cache.lock().iter().find(|(k, _)| k == h) {
            return Ok(d.clone());
        }
        let (rec, stored) = {
            let _shared = self.barrier.read();
            let rec = match self.pending_record(h) {
                Some(r) => r,
                None => self.committed_record(h)?.ok_or_else(|| {
                    Error::Corrupt(format!("chunk {h:?} is not in the chunk table"))
                })?,
            };
            (rec, self.read_stored(&rec)?)
        };
        let data: Arc<[u8]> = Self::decode_verified(h, &rec, stored)?.into();
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_CHUNKS {
            cache.pop_front();
        }
        cache.push_back((*h, data.clone()));
        Ok(data)
    }
}
