//! The chunk store: dedup lookup, compression, aggregation of new chunks into large writes to
//! the reserved data file, and verified reads.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::filemap::ChunkIo;
use crate::format::{ChunkHash, ChunkRecord, Codec, DataOffset};
use crate::meta::CHUNKS;
use parking_lot::Mutex;
use redb::{Database, ReadableDatabase};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// New chunks are gathered in memory and written to the data file in pieces of this size.
pub const SEGMENT_BYTES: usize = 8 << 20;
/// Decoded chunks kept for reads that come back for the same chunk (FUSE reads are smaller
/// than a chunk's neighbourhood); bounded by count, so at most this many max-size chunks.
pub const CACHE_CHUNKS: usize = 32;

struct Writer {
    /// Data-file offset of `buf[0]`; everything below it has been written (not yet synced).
    buf_start: u64,
    buf: Vec<u8>,
}

/// Where a stored-but-uncommitted chunk is, kept until a commit records it in CHUNKS.
pub struct ChunkStore {
    dev: Arc<dyn Device>,
    db: Arc<Database>,
    writer: Mutex<Writer>,
    /// Chunks written since the last commit that named them; lock order: writer, then pending.
    pending: Mutex<HashMap<ChunkHash, ChunkRecord>>,
    cache: Mutex<VecDeque<(ChunkHash, Arc<[u8]>)>>,
    failed: AtomicBool,
    pub dedup_hits: AtomicU64,
    pub chunks_stored: AtomicU64,
}

impl ChunkStore {
    pub fn new(dev: Arc<dyn Device>, db: Arc<Database>, head: u64) -> Self {
        ChunkStore {
            dev,
            db,
            writer: Mutex::new(Writer {
                buf_start: head,
                buf: Vec::with_capacity(SEGMENT_BYTES + (1 << 20)),
            }),
            pending: Mutex::new(HashMap::new()),
            cache: Mutex::new(VecDeque::with_capacity(CACHE_CHUNKS)),
            failed: AtomicBool::new(false),
            dedup_hits: AtomicU64::new(0),
            chunks_stored: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.dev.len()
    }

    /// Bytes of the data file in use, including chunks not yet committed.
    pub fn head(&self) -> u64 {
        let w = self.writer.lock();
        w.buf_start + w.buf.len() as u64
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
        // Sticky: after a failed write or sync the state of the disk is unknown, so no later
        // write or sync may report success.
        self.failed.store(true, Ordering::Relaxed);
        log::error!("backing I/O failed, refusing further writes: {e}");
        Err(e.into())
    }

    pub fn committed_record(&self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(CHUNKS)?;
        match t.get(h.0.as_slice())? {
            Some(v) => Ok(Some(ChunkRecord::decode(v.value())?)),
            None => Ok(None),
        }
    }

    pub fn pending_record(&self, h: &ChunkHash) -> Option<ChunkRecord> {
        self.pending.lock().get(h).copied()
    }

    /// Forgets pending chunks that a commit has just recorded in CHUNKS.
    pub fn forget_pending(&self, hashes: &[ChunkHash]) {
        let mut p = self.pending.lock();
        for h in hashes {
            p.remove(h);
        }
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

    /// Writes out buffered chunks and makes the data file durable; returns the durable head.
    pub fn flush_sync(&self) -> Result<u64> {
        self.check_failed()?;
        let mut w = self.writer.lock();
        self.write_out(&mut w)?;
        if let Err(e) = self.dev.sync() {
            return self.fail(e);
        }
        Ok(w.buf_start)
    }

    fn read_stored(&self, rec: &ChunkRecord) -> Result<Vec<u8>> {
        let mut stored = vec![0u8; rec.stored_len as usize];
        {
            let w = self.writer.lock();
            let off = rec.offset.0;
            if off >= w.buf_start {
                let at = (off - w.buf_start) as usize;
                let n = stored.len();
                stored.copy_from_slice(&w.buf[at..at + n]);
                return Ok(stored);
            }
        }
        self.dev.read_at(&mut stored, rec.offset.0)?;
        Ok(stored)
    }
}

impl ChunkIo for ChunkStore {
    fn put(&self, data: &[u8]) -> Result<ChunkHash> {
        self.check_failed()?;
        assert!(!data.is_empty() && data.len() <= u32::MAX as usize);
        let h = ChunkHash::of(data);
        if self.pending.lock().contains_key(&h) || self.committed_record(&h)?.is_some() {
            self.dedup_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(h);
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
            if pending.contains_key(&h) {
                return Ok(h);
            }
            let off = w.buf_start + w.buf.len() as u64;
            if off + bytes.len() as u64 > self.dev.len() {
                return Err(Error::NoSpace);
            }
            w.buf.extend_from_slice(bytes);
            pending.insert(
                h,
                ChunkRecord {
                    offset: DataOffset(off),
                    stored_len: bytes.len() as u32,
                    raw_len: data.len() as u32,
                    codec,
                    refs: 0,
                },
            );
        }
        self.chunks_stored.fetch_add(1, Ordering::Relaxed);
        if w.buf.len() >= SEGMENT_BYTES {
            self.write_out(&mut w)?;
        }
        Ok(h)
    }

    fn get(&self, h: &ChunkHash) -> Result<Arc<[u8]>> {
        if let Some((_, d)) = self.cache.lock().iter().find(|(k, _)| k == h) {
            return Ok(d.clone());
        }
        let rec = match self.pending_record(h) {
            Some(r) => r,
            None => self
                .committed_record(h)?
                .ok_or_else(|| Error::Corrupt(format!("chunk {h:?} is not in the chunk table")))?,
        };
        let stored = self.read_stored(&rec)?;
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
        let data: Arc<[u8]> = raw.into();
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_CHUNKS {
            cache.pop_front();
        }
        cache.push_back((*h, data.clone()));
        Ok(data)
    }
}
