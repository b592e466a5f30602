//! Chunks fetched on demand: a space mounted from a bucket (`ckptfs mount s3://... --cache
//! DIR` on an empty directory) starts with its tree and chunk records only; a chunk's record
//! says it is held by the bucket alone (`DataOffset::REMOTE`), and the engine's reader asks
//! this fetcher for its bytes (`RemoteChunks`) when a file is read. The engine checks every
//! byte it gets (decoded, blake3) and asks again with `fresh` when a copy fails, so nothing
//! here has to be trusted.
//!
//! - **Ranged reads, coalesced**: the chunks of one request that lie in the same pack are
//!   fetched together, neighbours (gaps up to `GAP_BYTES`) in one ranged GET of up to
//!   `RANGE_BYTES`, all of a request's GETs at once.
//! - **Read-ahead** is the engine's: a sequential reader's prefetch jobs (`READ_THREADS` of
//!   them, 32 chunks each) reach this fetcher from the read threads, so that many ranged
//!   GETs are in flight ahead of the reader.
//! - **The local cache**: fetched chunks are kept in `remote-cache` in the backing
//!   directory, a file of at most `cache_bytes` (the `remote` file's setting, `mount
//!   --cache-size`) used as a ring: new chunks are written at the ring's head over the
//!   oldest. Its index is in memory (about 60 bytes a chunk), so the cache starts empty at
//!   each mount (the file is truncated) and never needs a consistency check: a stale or
//!   damaged copy fails the engine's check and is fetched again.
//! - **Where chunks lie**: the chunk locations of the newest manifest (shared with the
//!   uploader, which adds those it uploads); a chunk none names is looked for in the head
//!   the bucket has now, at most once per `RELOAD_EVERY`.

use crate::bucket::Bucket;
use crate::config::RemoteConfig;
use crate::manifest::Manifest;
use crate::{Error, Result};
use ckptfs_engine::format::{ChunkHash, ChunkRecord};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The file the fetched chunks are kept in, in the backing directory.
pub const CACHE_FILE: &str = "remote-cache";
/// The cache's size when the `remote` file does not say (`mount --cache-size`).
pub const DEFAULT_CACHE_BYTES: u64 = 4 << 30;
/// Largest ranged read: neighbouring chunks of a pack fetched together up to this.
pub const RANGE_BYTES: u64 = 16 << 20;
/// A gap between wanted chunks of a pack read through rather than split into two requests.
pub const GAP_BYTES: u64 = 128 << 10;
/// Ranged reads for chunks at `spans` (pack, offset, stored length), sorted by pack and
/// offset: each read's span indices, start and end. Neighbours in a pack share a read of up
/// to `RANGE_BYTES`, gaps of up to `GAP_BYTES` read through (the restore and the fetcher
/// both read this way).
pub(crate) fn coalesce<P: PartialEq>(
    spans: &[(P, u64, u32)],
) -> Vec<(std::ops::Range<usize>, u64, u64)> {
    let mut reads = Vec::new();
    let mut k = 0;
    while k < spans.len() {
        let (pack, start, len) = &spans[k];
        let mut end = start + *len as u64;
        let mut l = k + 1;
        while let Some((p, off, n)) = spans.get(l) {
            let c_end = off + *n as u64;
            if p != pack || *off > end + GAP_BYTES || c_end - start > RANGE_BYTES {
                break;
            }
            end = end.max(c_end);
            l += 1;
        }
        reads.push((k..l, *start, end));
        k = l;
    }
    reads
}

/// How often, at most, a chunk no known manifest names sends the fetcher to the head.
const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// Where a chunk lies in the bucket.
#[derive(Clone, Debug)]
pub(crate) struct Loc {
    pub pack: Arc<str>,
    pub off: u64,
    pub stored: u32,
    pub raw: u32,
    pub codec: u8,
}

/// Chunk locations the bucket holds, shared by the uploader (which learns them from the
/// head and from its own uploads) and the fetcher.
pub(crate) type Locations = Arc<Mutex<HashMap<ChunkHash, Loc>>>;

/// Every chunk location `m` names.
pub(crate) fn locations_of(m: &Manifest) -> Result<Vec<(ChunkHash, Loc)>> {
    let packs: Vec<Arc<str>> = m.packs.iter().map(|p| Arc::from(p.as_str())).collect();
    m.chunks
        .iter()
        .map(|c| {
            let pack = packs
                .get(c.pack as usize)
                .ok_or_else(|| Error::Damaged("a chunk names a pack the manifest lacks".into()))?
                .clone();
            Ok((
                c.chunk_hash()?,
                Loc {
                    pack,
                    off: c.off,
                    stored: c.stored,
                    raw: c.raw,
                    codec: c.codec,
                },
            ))
        })
        .collect()
}

/// What the fetcher did since the mount (`ckptfs remote`, `stats`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FetchStats {
    /// Chunks asked for, and how many of them the local cache had.
    pub chunks: u64,
    pub cache_hits: u64,
    /// Ranged reads, and the bytes they fetched.
    pub requests: u64,
    pub fetched_bytes: u64,
    /// Chunks fetched again from the store because the copy given first failed the
    /// reader's check (a cache entry overwritten while read, or damaged).
    pub refetched: u64,
    /// The cache's bound and what it holds now.
    pub cache_bytes: u64,
    pub cached_bytes: u64,
}

/// The on-demand reader of one mount (see the module doc).
pub struct Fetcher {
    url: String,
    bucket: Bucket,
    locs: Locations,
    cache: Mutex<Ring>,
    path: std::path::PathBuf,
    file: std::sync::OnceLock<Option<std::fs::File>>,
    last_reload: Mutex<Option<Instant>>,
    chunks: AtomicU64,
    hits: AtomicU64,
    requests: AtomicU64,
    fetched: AtomicU64,
    refetched: AtomicU64,
}

impl Fetcher {
    /// The fetcher of the space in `dir` (its cache file made empty), reading `cfg`'s bucket.
    /// `read_only`: keep nothing on disk (a read-only mount writes nothing to the backing
    /// directory); fetched chunks live only in the engine's decoded-chunk cache.
    pub(crate) fn new(
        dir: &Path,
        cfg: &RemoteConfig,
        locs: Locations,
        read_only: bool,
    ) -> Result<Fetcher> {
        let cap = match read_only {
            true => 0,
            false => cfg.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES),
        };
        let path = dir.join(CACHE_FILE);
        // The last mount's copies are not indexed any more: their room is given back now.
        let emptied = match read_only {
            true => Ok(()),
            false => std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(0)),
        };
        if let Err(e) = emptied {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!(
                    "cannot empty the fetched-chunk cache {}: {e}",
                    path.display()
                );
            }
        }
        Ok(Fetcher {
            url: cfg.url.clone(),
            bucket: Bucket::open(cfg)?,
            locs,
            cache: Mutex::new(Ring::new(cap)),
            path,
            file: std::sync::OnceLock::new(),
            last_reload: Mutex::new(None),
            chunks: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            refetched: AtomicU64::new(0),
        })
    }

    /// The cache file, made (empty) at the first chunk kept. A cache that cannot be made
    /// is no reason to fail a read: chunks are fetched every time, and the log says why.
    fn file(&self) -> Option<&std::fs::File> {
        self.file
            .get_or_init(|| {
                use std::os::unix::fs::OpenOptionsExt;
                match std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&self.path)
                {
                    Ok(f) => Some(f),
                    Err(e) => {
                        log::warn!(
                            "cannot make the fetched-chunk cache {}: {e}; chunks held only by \
                             the bucket are fetched at every read",
                            self.path.display()
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// The bucket prefix it reads (`s3://BUCKET/PREFIX`).
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn stats(&self) -> FetchStats {
        let c = self.cache.lock();
        FetchStats {
            chunks: self.chunks.load(Ordering::Relaxed),
            cache_hits: self.hits.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            fetched_bytes: self.fetched.load(Ordering::Relaxed),
            refetched: self.refetched.load(Ordering::Relaxed),
            cache_bytes: c.cap,
            cached_bytes: c.used,
        }
    }

    /// The locations of `hashes` (`None` for one no manifest read so far names), reading
    /// the bucket's head again if one is unknown and it was not read lately.
    fn locate(&self, hashes: &[ChunkHash]) -> Result<Vec<Option<Loc>>> {
        let look = |locs: &HashMap<ChunkHash, Loc>| -> Vec<Option<Loc>> {
            hashes.iter().map(|h| locs.get(h).cloned()).collect()
        };
        let found = look(&self.locs.lock());
        if found.iter().all(Option::is_some) {
            return Ok(found);
        }
        {
            let mut last = self.last_reload.lock();
            if last.is_some_and(|t| t.elapsed() < RELOAD_EVERY) {
                return Ok(found);
            }
            *last = Some(Instant::now());
        }
        if let Some((_, m)) = crate::restore::newest(&self.bucket)? {
            let add = locations_of(&m)?;
            let mut locs = self.locs.lock();
            for (h, l) in add {
                locs.entry(h).or_insert(l);
            }
        }
        Ok(look(&self.locs.lock()))
    }

    /// Fetches `want` (indices into `asked`) from the bucket: grouped by pack, neighbours in
    /// one ranged read, all reads at once. Fills `out`.
    fn fetch_from_bucket(
        &self,
        asked: &[(ChunkHash, ChunkRecord)],
        want: &[usize],
        out: &mut [Vec<u8>],
    ) -> Result<()> {
        let hashes: Vec<ChunkHash> = want.iter().map(|&i| asked[i].0).collect();
        let locs = self.locate(&hashes)?;
        let mut items: Vec<(usize, Loc)> = Vec::with_capacity(want.len());
        for (&i, l) in want.iter().zip(locs) {
            let l = l.ok_or_else(|| {
                Error::Damaged(format!(
                    "chunk {} is held only by the bucket, and no manifest there names it",
                    asked[i].0
                ))
            })?;
            if l.stored != asked[i].1.stored_len {
                return Err(Error::Damaged(format!(
                    "chunk {}: the bucket's manifest says {} stored bytes, this space {}",
                    asked[i].0, l.stored, asked[i].1.stored_len
                )));
            }
            items.push((i, l));
        }
        items.sort_by(|a, b| (&a.1.pack, a.1.off).cmp(&(&b.1.pack, b.1.off)));
        let spans: Vec<(&str, u64, u32)> = items
            .iter()
            .map(|(_, l)| (&*l.pack, l.off, l.stored))
            .collect();
        let reads: Vec<(Arc<str>, u64, u64, std::ops::Range<usize>)> = coalesce(&spans)
            .into_iter()
            .map(|(r, s, e)| (items[r.start].1.pack.clone(), s, e, r))
            .collect();
        let started: Vec<_> = reads
            .iter()
            .map(|(pack, s, e, _)| self.bucket.spawn_get_range(pack, *s, *e))
            .collect();
        let mut first_err = None;
        for ((pack, s, e, range), h) in reads.iter().zip(started) {
            let bytes = match self.bucket.join_get(h) {
                Ok(b) => b,
                Err(err) => {
                    first_err.get_or_insert(err);
                    continue;
                }
            };
            self.requests.fetch_add(1, Ordering::Relaxed);
            self.fetched
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if bytes.len() as u64 != e - s {
                first_err.get_or_insert(Error::Damaged(format!(
                    "{pack}: asked for {} bytes at {s}, got {}",
                    e - s,
                    bytes.len()
                )));
                continue;
            }
            for (i, l) in &items[range.clone()] {
                let at = (l.off - s) as usize;
                out[*i] = bytes[at..at + l.stored as usize].to_vec();
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A copy of chunk `h` from the local cache.
    fn cached(&self, h: &ChunkHash, len: u32) -> Option<Vec<u8>> {
        let (off, n) = self.cache.lock().get(h)?;
        let f = self.file()?;
        if n != len {
            return None;
        }
        let mut b = vec![0u8; n as usize];
        // Read outside the lock: a copy overwritten meanwhile fails the engine's check and
        // is fetched again (`fresh`).
        f.read_exact_at(&mut b, off).ok()?;
        Some(b)
    }

    /// Keeps chunks just fetched in the local cache (one write per run of them).
    fn keep(&self, chunks: &[(ChunkHash, &[u8])]) {
        if self.cache.lock().cap == 0 {
            return;
        }
        let Some(f) = self.file() else {
            return;
        };
        let mut ring = self.cache.lock();
        for (h, b) in chunks {
            let Some(off) = ring.put(*h, b.len() as u32) else {
                continue;
            };
            // Written under the lock, so no later put reuses the place before it lands.
            if let Err(e) = f.write_all_at(b, off) {
                log::warn!("the fetched-chunk cache cannot be written ({e}); not kept");
                ring.forget(h);
            }
        }
    }
}

/// Reads chunks held only by the bucket for a mount that uploads nothing (`--read-only`):
/// the fetcher, set as the engine's `RemoteChunks`, its locations read from the head at
/// the first read that needs one, and no cache file (nothing is written to the backing
/// directory).
pub fn attach_reader(fs: &ckptfs_fs::Fs, cfg: &RemoteConfig) -> Result<Arc<Fetcher>> {
    let f = Arc::new(Fetcher::new(
        fs.space().dir(),
        cfg,
        Locations::default(),
        true,
    )?);
    fs.space()
        .data()
        .set_remote_chunks(Some(f.clone() as Arc<dyn ckptfs_engine::read::RemoteChunks>));
    Ok(f)
}

impl ckptfs_engine::read::RemoteChunks for Fetcher {
    fn fetch(
        &self,
        chunks: &[(ChunkHash, ChunkRecord)],
        fresh: bool,
    ) -> ckptfs_engine::Result<Vec<Vec<u8>>> {
        self.chunks
            .fetch_add(chunks.len() as u64, Ordering::Relaxed);
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); chunks.len()];
        let mut want = Vec::new();
        for (i, (h, rec)) in chunks.iter().enumerate() {
            if fresh {
                self.refetched.fetch_add(1, Ordering::Relaxed);
                self.cache.lock().forget(h);
            } else if let Some(b) = self.cached(h, rec.stored_len) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                out[i] = b;
                continue;
            }
            want.push(i);
        }
        if !want.is_empty() {
            self.fetch_from_bucket(chunks, &want, &mut out)
                .map_err(|e| {
                    ckptfs_engine::Error::Io(std::io::Error::other(format!(
                        "fetching from the object store: {e}"
                    )))
                })?;
            let kept: Vec<(ChunkHash, &[u8])> = want
                .iter()
                .map(|&i| (chunks[i].0, out[i].as_slice()))
                .collect();
            self.keep(&kept);
        }
        Ok(out)
    }
}

/// The cache file's index: a ring of chunks in the order they were written, the oldest at
/// the write position, so the next put overwrites the oldest (see the module doc).
struct Ring {
    cap: u64,
    /// Where the next chunk goes.
    head: u64,
    used: u64,
    map: HashMap<ChunkHash, (u64, u32)>,
    /// Chunks in the order written: (hash, offset, length).
    order: VecDeque<(ChunkHash, u64, u32)>,
}

impl Ring {
    fn new(cap: u64) -> Ring {
        Ring {
            cap,
            head: 0,
            used: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn get(&self, h: &ChunkHash) -> Option<(u64, u32)> {
        self.map.get(h).copied()
    }

    fn forget(&mut self, h: &ChunkHash) {
        if let Some((_, n)) = self.map.remove(h) {
            self.used -= n as u64;
        }
    }

    /// Room for chunk `h` of `n` bytes: the offset to write it at, the chunks it overwrites
    /// dropped. `None`: kept already, or larger than a quarter of the cache.
    ///
    /// The ring's chunks are those written since the last wrap, in `[0, head)`, and older
    /// ones not overwritten yet, in `[head, cap)`; `order` holds the older ones first, so
    /// the chunks the next write overwrites are always at its front.
    fn put(&mut self, h: ChunkHash, n: u32) -> Option<u64> {
        let n64 = n as u64;
        if self.map.contains_key(&h) || n64 > self.cap / 4 {
            return None;
        }
        if self.head + n64 > self.cap {
            // Wrap: the older chunks past the head are dropped (the tail is left unused),
            // and the oldest are now those from offset 0.
            let old_head = self.head;
            while self.order.front().is_some_and(|c| c.1 >= old_head) {
                self.pop_oldest();
            }
            self.head = 0;
        }
        let (start, end) = (self.head, self.head + n64);
        while self
            .order
            .front()
            .is_some_and(|c| c.1 >= start && c.1 < end)
        {
            self.pop_oldest();
        }
        self.head = end;
        self.map.insert(h, (start, n));
        self.order.push_back((h, start, n));
        self.used += n64;
        Some(start)
    }

    fn pop_oldest(&mut self) {
        if let Some((h, off, n)) = self.order.pop_front() {
            // A chunk forgotten (or put again elsewhere) is no longer this entry's.
            if self.map.get(&h) == Some(&(off, n)) {
                self.map.remove(&h);
                self.used -= n as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random puts and forgets: live chunks never overlap, stay inside the file, and the
    /// bytes counted are the live chunks' bytes, at most the bound.
    #[test]
    fn the_ring_keeps_live_chunks_apart_and_within_its_bound() {
        for seed in 0..20u64 {
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let cap = 1 << 20;
            let mut r = Ring::new(cap);
            for i in 0..5000u64 {
                let h = ChunkHash::of(&(next() % 400).to_le_bytes());
                match next() % 10 {
                    0 => r.forget(&h),
                    _ => {
                        let n = 1 + (next() % (cap / 3)) as u32;
                        let _ = r.put(h, n);
                    }
                }
                let mut live: Vec<(u64, u32)> = r.map.values().copied().collect();
                live.sort();
                for w in live.windows(2) {
                    assert!(
                        w[0].0 + w[0].1 as u64 <= w[1].0,
                        "seed {seed} step {i}: overlap"
                    );
                }
                assert!(live.iter().all(|(o, n)| o + *n as u64 <= cap));
                let sum: u64 = live.iter().map(|(_, n)| *n as u64).sum();
                assert_eq!(sum, r.used, "seed {seed} step {i}");
                assert!(r.used <= cap);
            }
        }
    }

    #[test]
    fn the_newest_chunk_is_always_kept() {
        let mut r = Ring::new(1000);
        for i in 0..100u64 {
            let h = ChunkHash::of(&i.to_le_bytes());
            let at = r.put(h, 100 + (i % 150) as u32).expect("fits");
            assert_eq!(r.get(&h).map(|g| g.0), Some(at));
        }
    }
}
