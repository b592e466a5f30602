//! The chunk reader: verified reads of chunks, this slot's and (at the records their
//! owners published) other slots', through one decoded-chunk cache, loads coalesced into
//! large device reads, read-ahead on its own threads, reused read buffers, and repair of a
//! chunk that fails its check.
//!
//! It sits beside the store's write side, not inside it, and asks the layer that places
//! chunks two small questions: where chunks lie (`ChunkSource`: pinned chunks of
//! uncommitted file states, then the catalog's committed records, under a hold on segment
//! reuse), and which bytes are still on their way to the device (`InFlight`: the writer's
//! buffers, so a chunk stored a moment ago reads back before its segment write lands).
//! Every chunk it verifies is shown to the cutters' predictor (`Successors::remember`), so
//! a restart's reads make the next revision's predictions cheap to confirm.

use crate::chunk::{ChunkBytes, Stored, StoredRef, Verified};
use crate::device::{IoBuf, DIRECT_ALIGN};
use crate::error::{Corruption, Error, Result};
use crate::format::{ChunkHash, ChunkRecord, DataOffset};
use crate::placement::{Location, Placement};
use crate::write::pipeline::{Pipeline, Pool, Stages};
use crate::write::predict::Successors;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

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
pub(crate) const READ_BYTES: u64 = 8 << 20;

/// Where chunks lie, as the layer that places them (the store) answers it.
pub trait ChunkSource: Send + Sync {
    /// Holds segment reuse off while the guard lives: a chunk `locate` found stays at the
    /// place it was found (gc takes the other side of this lock to delete chunks and free
    /// segments), so the device read that follows reads the chunk, not a newer tenant.
    fn hold_reuse(&self) -> parking_lot::RwLockReadGuard<'_, ()>;
    /// The records of `hashes`, in order: a chunk pinned by an uncommitted file state where
    /// that state stored or found it, else the catalog's committed record, else `None`.
    /// Called under `hold_reuse`.
    fn locate(&self, hashes: &[ChunkHash]) -> Result<Vec<Option<ChunkRecord>>>;
}

/// Where the chunks held only by the object-store tier come from (records at
/// `DataOffset::REMOTE`, a space mounted from a bucket): the tier's fetcher, set by the
/// mount (`Data::set_remote_chunks`). What it returns is checked here like a device read
/// (decoded, blake3), so it never has to be trusted.
pub trait RemoteChunks: Send + Sync {
    /// The stored bytes of `chunks`, in order. `fresh`: from the object store itself, not
    /// from a local copy (a copy it gave failed its check).
    fn fetch(&self, chunks: &[(ChunkHash, ChunkRecord)], fresh: bool) -> Result<Vec<Vec<u8>>>;
}

/// Bytes of the data file that the writer holds and the device may not have yet.
pub struct Buffered {
    /// Data-file offset of `buf[0]`.
    pub start: u64,
    pub buf: Arc<IoBuf>,
    /// Bytes of `buf` that are the data file's from `start`.
    pub n: usize,
}

/// The writer's bytes on their way to the device: a chunk stored a moment ago is read from
/// here until its segment write lands (a chunk may straddle: head on disk, tail buffered).
pub trait InFlight: Send + Sync {
    /// The buffers overlapping `[off, off + len)`; a buffer still being filled is given as
    /// a copy of just the overlapping bytes (it may hold megabytes).
    fn in_flight(&self, off: u64, len: usize) -> Vec<Buffered>;
}

/// The chunk reader (see the module doc). One per open space; its bounds are the
/// decoded-chunk cache (`CACHE_BYTES`), the read threads (`READ_THREADS`) and the spare
/// read buffers (`SPARE_READ_BUFS` of up to `SPARE_READ_BUF_BYTES`).
pub struct ChunkReader {
    /// Itself, for the jobs it gives its read threads.
    me: Weak<ChunkReader>,
    /// Where segments' bytes live.
    place: Arc<dyn Placement>,
    segment_bytes: u64,
    /// Where chunks lie and the writer's unwritten bytes (both the store, which owns this
    /// reader: weak, so neither keeps the other alive).
    source: Weak<dyn ChunkSource>,
    in_flight: Weak<dyn InFlight>,
    /// The stage timers (read, decode, read-ahead) and whether there are workers at all.
    pipeline: Arc<Pipeline>,
    /// Learns every chunk verified here (see the module doc).
    successors: Arc<Successors>,
    cache: Mutex<ChunkCache>,
    /// Chunks being read by some thread (lock order: cache, then this).
    loading: Mutex<HashMap<ChunkHash, Arc<Loading>>>,
    /// Runs prefetch jobs (`READ_THREADS`), started by the first prefetch.
    readers: std::sync::OnceLock<Pool>,
    /// Read buffers for reuse (`SPARE_READ_BUFS` of up to `SPARE_READ_BUF_BYTES`).
    read_bufs: Arc<Mutex<Vec<IoBuf>>>,
    /// Set by every device read for chunks; `release_idle_read_buffers` clears it.
    read_lately: AtomicBool,
    /// Chunks held only by the object-store tier are read through this (none: such a
    /// chunk cannot be read, an I/O error).
    remote: parking_lot::RwLock<Option<Arc<dyn RemoteChunks>>>,
}

impl ChunkReader {
    pub(crate) fn new(
        place: Arc<dyn Placement>,
        source: Weak<dyn ChunkSource>,
        in_flight: Weak<dyn InFlight>,
        pipeline: Arc<Pipeline>,
        successors: Arc<Successors>,
    ) -> Arc<ChunkReader> {
        Arc::new_cyclic(|me| ChunkReader {
            me: me.clone(),
            segment_bytes: place.segment_bytes(),
            place,
            source,
            in_flight,
            pipeline,
            successors,
            cache: Mutex::default(),
            loading: Mutex::default(),
            readers: std::sync::OnceLock::new(),
            read_bufs: Arc::default(),
            read_lately: AtomicBool::new(false),
            remote: parking_lot::RwLock::new(None),
        })
    }

    /// Where chunks held only by the object-store tier are fetched from from now on (None:
    /// nowhere; the tier is stopping).
    pub fn set_remote(&self, r: Option<Arc<dyn RemoteChunks>>) {
        *self.remote.write() = r;
    }

    /// Chunks held only by the object-store tier, checked, in order: each one's stored
    /// bytes, and its decoded bytes where they differ (a compressed chunk). A chunk whose
    /// bytes fail their check is fetched again from the store itself (the tier's local copy
    /// may be what was damaged); failing again, it is reported and an error.
    #[allow(clippy::type_complexity)]
    fn fetch_remote(
        &self,
        chunks: &[(ChunkHash, ChunkRecord)],
    ) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>> {
        let hook = self.remote.read().clone().ok_or_else(|| {
            Error::Io(std::io::Error::other(format!(
                "chunk {} is held only by the space's object store, which this mount does \
                 not reach",
                chunks[0].0
            )))
        })?;
        let fetch = |asked: &[(ChunkHash, ChunkRecord)], fresh: bool| {
            let bytes: usize = asked.iter().map(|(_, r)| r.stored_len as usize).sum();
            let got = self
                .stages()
                .read
                .time(bytes, || hook.fetch(asked, fresh))?;
            match got.len() == asked.len() {
                true => Ok(got),
                false => Err(Error::Io(std::io::Error::other(
                    "the object-store tier answered for other chunks than asked",
                ))),
            }
        };
        let check = |(h, rec): &(ChunkHash, ChunkRecord), b: &[u8]| {
            self.stages().decode.time(rec.raw_len as usize, || {
                let raw = StoredRef::new(*h, *rec, b).verify_raw()?;
                self.successors.remember(h, &raw);
                Ok(match raw {
                    std::borrow::Cow::Borrowed(_) => None,
                    std::borrow::Cow::Owned(v) => Some(v),
                })
            })
        };
        let mut out: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(chunks.len());
        let mut again: Vec<usize> = Vec::new();
        for (i, (c, b)) in chunks.iter().zip(fetch(chunks, false)?).enumerate() {
            match check(c, &b) {
                Ok(raw) => out.push((b, raw)),
                Err(Error::Corrupt(_)) => {
                    out.push((Vec::new(), None));
                    again.push(i);
                }
                Err(e) => return Err(e),
            }
        }
        if !again.is_empty() {
            let asked: Vec<_> = again.iter().map(|&i| chunks[i]).collect();
            for ((i, c), b) in again.iter().zip(&asked).zip(fetch(&asked, true)?) {
                match check(c, &b) {
                    Ok(raw) => out[*i] = (b, raw),
                    Err(e) => {
                        log::error!(
                            "chunk {} fetched from the object store fails its check ({e}): \
                             the bucket's copy was damaged or replaced (`ckptfs check \
                             --remote` lists every such chunk)",
                            c.0
                        );
                        return Err(e);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Where data-file offset `off` lies (see `placement`).
    fn location(&self, off: u64) -> Location {
        Location::of(DataOffset(off), self.segment_bytes)
    }

    fn stages(&self) -> &Stages {
        &self.pipeline.stages
    }

    /// The store this reader reads for; gone only while the space is being dropped.
    fn source(&self) -> Result<Arc<dyn ChunkSource>> {
        self.source.upgrade().ok_or(Error::Failed)
    }

    /// Reads a chunk's stored bytes. Parts not yet written out come from the buffers being
    /// written or the write buffer (a chunk may straddle them: head on disk, tail buffered).
    pub fn read_stored(&self, h: &ChunkHash, rec: &ChunkRecord) -> Result<Stored> {
        if rec.is_remote() {
            // Checked on the way (a damaged local copy of the tier's is fetched again).
            let (stored, _) = self.fetch_remote(&[(*h, *rec)])?.pop().expect("one chunk");
            return Ok(Stored::new(*h, *rec, stored));
        }
        let bytes = self.read_range(rec.offset.0, rec.stored_len as usize)?;
        Ok(Stored::new(*h, *rec, bytes))
    }

    /// `read_stored` of the bytes exactly as stored (`Placement::read_as_stored`), for
    /// `ckptfs check`, which must see damage that reads already go around.
    pub(crate) fn read_as_stored(&self, h: &ChunkHash, rec: &ChunkRecord) -> Result<Stored> {
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
    pub(crate) fn drop_cache(&self) {
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
        let taken = match self.in_flight.upgrade() {
            Some(w) => w.in_flight(off, len),
            None => Vec::new(),
        };
        let covered: u64 = taken
            .iter()
            .filter(|b| overlaps(b.start, b.n))
            .map(|b| (b.start + b.n as u64).min(end) - b.start.max(off))
            .sum();
        if covered < end - off {
            match as_stored {
                true => self.place.read_as_stored(self.location(off), stored)?,
                false => self.place.read(self.location(off), stored)?,
            }
        }
        for Buffered {
            start: s,
            buf: b,
            n,
        } in taken
        {
            if !overlaps(s, n) {
                continue;
            }
            let from = s.max(off);
            let to = (s + n as u64).min(end);
            stored[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&b.as_slice()[(from - s) as usize..(to - s) as usize]);
        }
        Ok(())
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
/// it, no copy); back to the reader's spare buffers when the last of them is dropped.
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

impl ChunkReader {
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
    pub(crate) fn get_many_at(
        &self,
        chunks: &[(ChunkHash, ChunkRecord)],
    ) -> Result<Vec<ChunkBytes>> {
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
    pub(crate) fn prefetch_at(&self, chunks: Vec<(ChunkHash, ChunkRecord)>) {
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
            let me = self.me.upgrade().expect("a reader in use is alive");
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
        // Chunks held only by the object-store tier: fetched after the device's runs, off
        // the reuse hold (no segment is theirs, and a fetch may wait on the network).
        let mut remote: Vec<(ChunkHash, ChunkRecord)> = Vec::new();
        // Runs of chunks read in one device read: the buffer, where the run starts in it,
        // the run's first data offset, and its chunks (indices into `missing`).
        let mut runs: Vec<(IoBuf, usize, u64, std::ops::Range<usize>)> = Vec::new();
        {
            let source = self.source()?;
            let _shared = source.hold_reuse();
            let mut wanted: Vec<ChunkHash> = Vec::new();
            for h in hashes {
                if !found.contains_key(h) && !wanted.contains(h) {
                    wanted.push(*h);
                }
            }
            for (h, rec) in wanted.iter().zip(source.locate(&wanted)?) {
                let rec = rec
                    .or_else(|| known.get(h).copied())
                    .ok_or(Corruption::UnknownChunk(*h))?;
                match rec.is_remote() {
                    true => remote.push((*h, rec)),
                    false => missing.push((*h, rec)),
                }
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
                // A chunk read (a restart reads the checkpoint the next one will repeat) is
                // fingerprinted as it is verified, while in cache, so the next revision's
                // predictions of it are confirmed without blake3 (`predict`).
                let raw = self.stages().decode.time(rec.raw_len as usize, || {
                    let raw = StoredRef::new(*h, *rec, bytes).verify_raw()?;
                    self.successors.remember(h, &raw);
                    Ok(raw)
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
        if !remote.is_empty() {
            let got = self.fetch_remote(&remote)?;
            let mut cache = self.cache.lock();
            for ((h, _), (stored, raw)) in remote.iter().zip(got) {
                let data = ChunkBytes::owned(raw.unwrap_or(stored));
                cache.put(*h, data.clone(), data.len());
                if asked {
                    cache.get(h, true);
                }
                found.insert(*h, data);
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
