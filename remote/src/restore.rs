//! Restart anywhere: a new local space rebuilt from the bucket alone (`ckptfs recover
//! --remote`, and `ckptfs mount s3://...` on an empty cache directory). The head names the
//! newest manifest; the manifest, checked against the head's blake3, names every node and
//! where each chunk lies; chunks are fetched with ranged reads (neighbours in a pack
//! coalesced into one request of up to `RANGE_BYTES`), decoded and checked against their
//! blake3 before a byte is written, and written through the filesystem as a job would
//! (so the new space's chunks, dedup and revisions are its own). The new space gets the
//! same tier settings: mounted, it continues the bucket's sequence as its new owner.

use crate::bucket::Bucket;
use crate::config::RemoteConfig;
use crate::manifest::{name_from_str, unhex, Head, Manifest, HEAD};
use crate::upload::fetch_manifest;
use crate::{Error, Result};
use ckptfs_engine::chunk::Stored;
use ckptfs_engine::format::{
    ChunkHash, ChunkRecord, Codec, DataOffset, Extent, Features, InodeId, Timestamp,
};
use ckptfs_engine::Space;
use ckptfs_fs::{Caller, Fs, HandleId, SetAttr};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use crate::fetch::{coalesce, RANGE_BYTES};
/// Decoded chunks kept for files that share them (deduplicated ones), oldest dropped first.
pub const CACHE_BYTES: usize = 256 << 20;

/// What a recovery did.
#[derive(Debug, Default, serde::Serialize)]
pub struct Restored {
    pub seq: u64,
    pub taken_unix: i64,
    pub files: u64,
    pub dirs: u64,
    pub others: u64,
    pub logical_bytes: u64,
    pub fetched_bytes: u64,
    pub requests: u64,
    pub seconds: f64,
}

/// The head and the manifest it names, checked; `None`: the bucket holds no checkpoint.
pub fn newest(bucket: &Bucket) -> Result<Option<(Head, Manifest)>> {
    let Some((b, _)) = bucket.get(HEAD)? else {
        return Ok(None);
    };
    let head: Head = serde_json::from_slice(&b)
        .map_err(|e| Error::Damaged(format!("the head object does not parse: {e}")))?;
    let m = fetch_manifest(bucket, &head)?;
    Ok(Some((head, m)))
}

/// Rebuilds the newest state the bucket holds into `dir` (new or empty), formatted with
/// `size` bytes (default: twice the manifest's stored bytes plus 1 GiB) and average chunk
/// size `chunk`.
///
/// `on_demand`: no chunk is fetched now; the space records where each lies in the bucket
/// (`DataOffset::REMOTE`) and its mount fetches them as they are read (`fetch`). Otherwise
/// every chunk is fetched, checked and written into the space before this returns.
pub fn recover(
    cfg: &RemoteConfig,
    dir: &Path,
    size: Option<u64>,
    chunk: u32,
    on_demand: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<Restored> {
    let start = std::time::Instant::now();
    let bucket = Bucket::open(cfg)?;
    let (head, m) = newest(&bucket)?.ok_or_else(|| {
        Error::Config(format!(
            "{} holds no checkpoint (no head object): nothing to recover",
            cfg.url
        ))
    })?;
    let size = size.unwrap_or(2 * m.stored_bytes + (1 << 30)) & !0xfffff;
    let existed = dir.exists();
    Space::format(dir, size, chunk, Default::default(), false)?;
    // `format` took only a new or empty directory: a recovery that fails leaves it so,
    // never a space that looks whole and is not.
    let undo = || {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        if !existed {
            let _ = std::fs::remove_dir(dir);
        }
    };
    let filled = match on_demand {
        true => attach(cfg, dir, &head, &m, &mut progress),
        false => fill(cfg, dir, &bucket, &head, &m, &mut progress),
    };
    match filled {
        Ok(mut out) => {
            out.seconds = start.elapsed().as_secs_f64();
            Ok(out)
        }
        Err(e) => {
            undo();
            Err(e)
        }
    }
}

/// `recover` on demand into the space just formatted in `dir`: the chunks recorded as
/// held by the bucket, the tree made with files naming them.
fn attach(
    cfg: &RemoteConfig,
    dir: &Path,
    head: &Head,
    m: &Manifest,
    progress: &mut impl FnMut(u64, u64),
) -> Result<Restored> {
    let mut recs = Vec::with_capacity(m.chunks.len());
    let mut features = Features::INCOMPAT_REMOTE_CHUNKS;
    for c in &m.chunks {
        let codec = c.codec()?;
        if c.raw == 0 || c.stored == 0 || (codec == Codec::Raw && c.raw != c.stored) {
            return Err(Error::Damaged(format!(
                "the manifest gives chunk {} impossible lengths ({} stored, {} raw)",
                c.hash, c.stored, c.raw
            )));
        }
        features = features.union(codec.features());
        recs.push((
            c.chunk_hash()?,
            ChunkRecord {
                offset: DataOffset::REMOTE,
                stored_len: c.stored,
                raw_len: c.raw,
                codec,
                refs: 0,
            },
        ));
    }
    // Marked before the first such record is written: a build without remote chunks
    // refuses the space instead of reading their records as offsets.
    ckptfs_engine::space::mark_features(dir, features)?;
    let space = Space::open(dir)?;
    space.data().add_remote_chunks(&recs)?;
    drop(recs);
    write_tree(cfg, space, head, m, &mut Content::OnDemand(m), progress)
}

/// `recover` into the space just formatted in `dir`.
fn fill(
    cfg: &RemoteConfig,
    dir: &Path,
    bucket: &Bucket,
    head: &Head,
    m: &Manifest,
    progress: &mut impl FnMut(u64, u64),
) -> Result<Restored> {
    let (tx, rx) = std::sync::mpsc::sync_channel(FETCHES_IN_FLIGHT);
    let jobs = plan(m);
    std::thread::scope(|s| {
        s.spawn(move || fetcher(bucket, m, jobs, tx));
        let mut chunks = Incoming {
            m,
            bucket,
            rx,
            cache: Cache::default(),
            fetched_bytes: 0,
            requests: 0,
        };
        let r = Space::open(dir).map_err(Error::from).and_then(|space| {
            write_tree(
                cfg,
                space,
                head,
                m,
                &mut Content::Fetched(&mut chunks),
                progress,
            )
        });
        // The fetcher stops at its next send once this is gone.
        drop(chunks.rx);
        r.map(|mut out| {
            out.fetched_bytes = chunks.fetched_bytes;
            out.requests = chunks.requests;
            out
        })
    })
}

/// Where a rebuilt file's bytes come from.
enum Content<'a, 'b> {
    /// Fetched, checked chunks, written into the space.
    Fetched(&'b mut Incoming<'a>),
    /// Nowhere now: the file names the chunks the bucket holds (recorded already).
    OnDemand(&'a Manifest),
}

/// Creates every node of `m` in the space just formatted (`space`), files' bytes from
/// `content`.
fn write_tree(
    cfg: &RemoteConfig,
    space: Space,
    head: &Head,
    m: &Manifest,
    content: &mut Content,
    progress: &mut impl FnMut(u64, u64),
) -> Result<Restored> {
    let dir = space.dir().to_path_buf();
    let fs = Arc::new(Fs::new(space));
    let mut out = Restored {
        seq: head.seq,
        taken_unix: m.taken_unix,
        ..Default::default()
    };
    let mut inos: HashMap<Vec<u8>, InodeId> = HashMap::new();
    inos.insert(Vec::new(), InodeId::ROOT);
    let mut fh = 1u64;
    let total = m.logical_bytes;
    let mut done = 0u64;
    let mut dir_times: Vec<(InodeId, Timestamp)> = Vec::new();
    for n in &m.nodes {
        let path = name_from_str(&n.path)?;
        let (parent_path, name) = match path.iter().rposition(|&c| c == b'/') {
            Some(i) => (path[..i].to_vec(), path[i + 1..].to_vec()),
            None => (Vec::new(), path.clone()),
        };
        let parent = *inos
            .get(&parent_path)
            .ok_or_else(|| Error::Damaged(format!("{} comes before its directory", n.path)))?;
        let c = Caller {
            uid: n.uid,
            gid: n.gid,
        };
        let mtime = Timestamp {
            secs: n.mtime,
            nanos: n.mtime_ns,
        };
        let ino = match n.kind.as_str() {
            "dir" => {
                let a = fs.mkdir(parent, &name, n.perm, c)?;
                dir_times.push((a.ino, mtime));
                out.dirs += 1;
                a.ino
            }
            "symlink" => {
                let t = name_from_str(n.target.as_deref().unwrap_or(""))?;
                out.others += 1;
                fs.symlink(parent, &name, &t, c)?.ino
            }
            "file" => {
                let h = HandleId(fh);
                fh += 1;
                let a = fs.create(parent, &name, n.perm, c, h, true, true, false)?;
                match content {
                    Content::Fetched(chunks) => write_file(&fs, a.ino, h, &n.extents, chunks)?,
                    Content::OnDemand(m) => paste_file(&fs, a.ino, h, &n.extents, m, n.size)?,
                }
                if n.size > 0 {
                    fs.setattr(
                        a.ino,
                        &SetAttr {
                            size: Some(n.size),
                            fh: h,
                            ..Default::default()
                        },
                    )?;
                }
                fs.flush(a.ino, h, 0)?;
                fs.release(a.ino, h)?;
                out.files += 1;
                out.logical_bytes += n.size;
                done += n.size;
                progress(done, total);
                a.ino
            }
            other => {
                let mode = match other {
                    "fifo" => libc::S_IFIFO,
                    "socket" => libc::S_IFSOCK,
                    "char" => libc::S_IFCHR,
                    "block" => libc::S_IFBLK,
                    _ => return Err(Error::Damaged(format!("{}: kind `{other}`", n.path))),
                };
                out.others += 1;
                fs.mknod(parent, &name, mode | n.perm, n.rdev, c)?.ino
            }
        };
        for [k, v] in &n.xattrs {
            fs.setxattr(ino, &unhex(k)?, &unhex(v)?, Default::default())?;
        }
        if n.kind != "dir" && n.kind != "symlink" {
            fs.setattr(
                ino,
                &SetAttr {
                    mtime: Some(mtime),
                    perm: Some(n.perm),
                    ..Default::default()
                },
            )?;
        }
        if n.kind == "dir" {
            inos.insert(path, ino);
        }
    }
    // Directories' times last: creating their entries changed them.
    for (ino, t) in dir_times {
        fs.setattr(
            ino,
            &SetAttr {
                mtime: Some(t),
                ..Default::default()
            },
        )?;
    }
    // The root as it was (a manifest of a build before it does not say).
    if let Some(root) = &m.root {
        for [k, v] in &root.xattrs {
            fs.setxattr(InodeId::ROOT, &unhex(k)?, &unhex(v)?, Default::default())?;
        }
        fs.setattr(
            InodeId::ROOT,
            &SetAttr {
                perm: Some(root.perm),
                uid: Some(root.uid),
                gid: Some(root.gid),
                mtime: Some(Timestamp {
                    secs: root.mtime,
                    nanos: root.mtime_ns,
                }),
                ..Default::default()
            },
        )?;
    }
    fs.commit_all()?;
    drop(fs);
    let mut cfg = cfg.clone();
    cfg.head_seq = head.seq;
    cfg.save(&dir)?;
    Ok(out)
}

/// Decoded chunks by hash, at most `CACHE_BYTES`.
#[derive(Default)]
struct Cache {
    map: HashMap<ChunkHash, Arc<Vec<u8>>>,
    order: VecDeque<ChunkHash>,
    bytes: usize,
}

impl Cache {
    fn put(&mut self, h: ChunkHash, v: Arc<Vec<u8>>) {
        if self.map.contains_key(&h) {
            return;
        }
        self.bytes += v.len();
        self.map.insert(h, v);
        self.order.push_back(h);
        while self.bytes > CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(v) = self.map.remove(&old) {
                self.bytes -= v.len();
            }
        }
    }
}

/// Makes one file name the chunks of its extents where the bucket holds them.
fn paste_file(
    fs: &Fs,
    ino: InodeId,
    fh: HandleId,
    extents: &[[u64; 4]],
    m: &Manifest,
    size: u64,
) -> Result<()> {
    let mut pieces = Vec::with_capacity(extents.len());
    for x in extents {
        let c = m
            .chunks
            .get(x[2] as usize)
            .ok_or_else(|| Error::Damaged("an extent names a chunk the manifest lacks".into()))?;
        let (off, len, coff) = (x[0], x[1], x[3]);
        if len == 0 || coff + len > c.raw as u64 || off.checked_add(len).is_none_or(|e| e > size) {
            return Err(Error::Damaged(format!(
                "an extent of {len} bytes at {off} does not fit its chunk or its file"
            )));
        }
        pieces.push((
            off,
            Extent {
                chunk: c.chunk_hash()?,
                chunk_off: coff as u32,
                len: len as u32,
            },
        ));
    }
    fs.paste_chunks(ino, fh, &pieces, size, 0)?;
    Ok(())
}

/// Writes one file's extents, each chunk taken from the fetcher's verified results.
fn write_file(
    fs: &Fs,
    ino: InodeId,
    fh: HandleId,
    extents: &[[u64; 4]],
    chunks: &mut Incoming,
) -> Result<()> {
    for x in extents {
        let raw = chunks.get(x[2] as usize)?;
        let (off, len, coff) = (x[0], x[1] as usize, x[3] as usize);
        let piece = raw
            .get(coff..coff + len)
            .ok_or_else(|| Error::Damaged("an extent runs past the end of its chunk".into()))?;
        fs.write(ino, fh, 0, off, piece)?;
    }
    Ok(())
}

/// Ranged reads of the chunks a restore needs, run ahead of the writer: at most
/// `FETCHES_IN_FLIGHT` requests at once, their chunks verified on the fetcher's thread, and
/// as many results waiting for the writer.
pub const FETCHES_IN_FLIGHT: usize = 4;

/// One ranged read: bytes `[start, end)` of a pack, holding chunks `chunks`.
struct Job {
    pack: u32,
    start: u64,
    end: u64,
    chunks: Vec<usize>,
}

/// Verified chunks of one job, and the bytes fetched for it.
type Fetched = Result<(Vec<(usize, Arc<Vec<u8>>)>, u64)>;

/// The ranged reads of a whole restore, in the order the writer needs their chunks: each
/// chunk once (where it is first named), windows of up to `RANGE_BYTES` of a file's new
/// chunks grouped per pack.
fn plan(m: &Manifest) -> Vec<Job> {
    let mut seen = vec![false; m.chunks.len()];
    let mut jobs = Vec::new();
    for n in &m.nodes {
        let mut want = Vec::new();
        let mut bytes = 0u64;
        for x in &n.extents {
            let ci = x[2] as usize;
            if ci >= seen.len() || seen[ci] {
                continue;
            }
            seen[ci] = true;
            want.push(ci);
            bytes += m.chunks[ci].stored as u64;
            if bytes >= RANGE_BYTES {
                jobs.extend(group(m, &want));
                want.clear();
                bytes = 0;
            }
        }
        jobs.extend(group(m, &want));
    }
    jobs
}

/// Chunks `want` as ranged reads: neighbours in a pack in one read of up to `RANGE_BYTES`,
/// gaps of up to `GAP_BYTES` read through (`fetch::coalesce`).
fn group(m: &Manifest, want: &[usize]) -> Vec<Job> {
    let mut by_pack: Vec<usize> = want.to_vec();
    by_pack.sort_by_key(|&ci| (m.chunks[ci].pack, m.chunks[ci].off));
    let spans: Vec<(u32, u64, u32)> = by_pack
        .iter()
        .map(|&ci| (m.chunks[ci].pack, m.chunks[ci].off, m.chunks[ci].stored))
        .collect();
    coalesce(&spans)
        .into_iter()
        .map(|(r, start, end)| Job {
            pack: spans[r.start].0,
            start,
            end,
            chunks: by_pack[r].to_vec(),
        })
        .collect()
}

/// Checks a job's bytes: each chunk decoded and compared with its blake3.
fn verify_job(m: &Manifest, job: &Job, bytes: &[u8]) -> Fetched {
    let pack = m
        .packs
        .get(job.pack as usize)
        .ok_or_else(|| Error::Damaged("a chunk names a pack the manifest lacks".into()))?;
    if (bytes.len() as u64) != job.end - job.start {
        return Err(Error::Damaged(format!(
            "{pack}: asked for {} bytes, got {}",
            job.end - job.start,
            bytes.len()
        )));
    }
    let mut out = Vec::with_capacity(job.chunks.len());
    for &ci in &job.chunks {
        let c = &m.chunks[ci];
        let h = c.chunk_hash()?;
        let s = (c.off - job.start) as usize;
        let rec = ChunkRecord {
            offset: DataOffset(0),
            stored_len: c.stored,
            raw_len: c.raw,
            codec: c.codec()?,
            refs: 0,
        };
        let v = Stored::new(h, rec, bytes[s..s + c.stored as usize].to_vec())
            .verify()
            .map_err(|e| {
                Error::Damaged(format!(
                    "chunk {h} in {pack} does not match its blake3 ({e}): the object was \
                     changed or damaged in the bucket"
                ))
            })?;
        out.push((ci, Arc::new(v.into_bytes())));
    }
    Ok((out, bytes.len() as u64))
}

/// Runs `jobs` in order on `bucket`, `FETCHES_IN_FLIGHT` at a time, sending each job's
/// verified chunks to `tx` (stops at the first error, sent too, or when the writer is gone).
fn fetcher(
    bucket: &Bucket,
    m: &Manifest,
    jobs: Vec<Job>,
    tx: std::sync::mpsc::SyncSender<Fetched>,
) {
    let mut flying = VecDeque::new();
    let mut jobs = jobs.into_iter();
    loop {
        while flying.len() < FETCHES_IN_FLIGHT {
            let Some(job) = jobs.next() else { break };
            let Some(pack) = m.packs.get(job.pack as usize) else {
                let _ = tx.send(Err(Error::Damaged(
                    "a chunk names a pack the manifest lacks".into(),
                )));
                return;
            };
            let h = bucket.spawn_get_range(pack, job.start, job.end);
            flying.push_back((job, h));
        }
        let Some((job, h)) = flying.pop_front() else {
            return;
        };
        let r = bucket.join_get(h).and_then(|b| verify_job(m, &job, &b));
        let failed = r.is_err();
        if tx.send(r).is_err() || failed {
            return;
        }
    }
}

/// The writer's side of the fetcher: chunks by index, as the fetcher delivers them.
struct Incoming<'a> {
    m: &'a Manifest,
    bucket: &'a Bucket,
    rx: std::sync::mpsc::Receiver<Fetched>,
    cache: Cache,
    fetched_bytes: u64,
    requests: u64,
}

impl Incoming<'_> {
    fn get(&mut self, ci: usize) -> Result<Arc<Vec<u8>>> {
        let c = self
            .m
            .chunks
            .get(ci)
            .ok_or_else(|| Error::Damaged("an extent names no chunk".into()))?;
        let h = c.chunk_hash()?;
        loop {
            if let Some(v) = self.cache.map.get(&h) {
                return Ok(v.clone());
            }
            match self.rx.recv() {
                Ok(r) => {
                    let (chunks, n) = r?;
                    self.fetched_bytes += n;
                    self.requests += 1;
                    for (i, v) in chunks {
                        self.cache.put(self.m.chunks[i].chunk_hash()?, v);
                    }
                }
                // Everything planned has come: a chunk dropped from the cache since (the
                // cache is bounded) is read again on its own.
                Err(_) => {
                    for job in group(self.m, &[ci]) {
                        let pack = self.m.packs.get(job.pack as usize).ok_or_else(|| {
                            Error::Damaged("a chunk names a pack the manifest lacks".into())
                        })?;
                        let b = self.bucket.get_range(pack, job.start, job.end)?;
                        let (chunks, n) = verify_job(self.m, &job, &b)?;
                        self.fetched_bytes += n;
                        self.requests += 1;
                        for (i, v) in chunks {
                            self.cache.put(self.m.chunks[i].chunk_hash()?, v);
                        }
                    }
                    return self
                        .cache
                        .map
                        .get(&h)
                        .cloned()
                        .ok_or_else(|| Error::Other("a fetched chunk was dropped".into()));
                }
            }
        }
    }
}

/// Fetches chunks `want` (indices into the manifest's chunks) and checks each against its
/// blake3 (`ckptfs check --remote`).
fn fetch(bucket: &Bucket, m: &Manifest, want: &[usize], out: &mut Restored) -> Result<()> {
    for job in group(m, want) {
        let pack = m
            .packs
            .get(job.pack as usize)
            .ok_or_else(|| Error::Damaged("a chunk names a pack the manifest lacks".into()))?;
        let b = bucket.get_range(pack, job.start, job.end)?;
        let (_, n) = verify_job(m, &job, &b)?;
        out.fetched_bytes += n;
        out.requests += 1;
    }
    Ok(())
}

/// What `ckptfs check --remote` found in the bucket.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct BucketCheck {
    pub url: String,
    /// The head's manifest (0: the bucket holds nothing).
    pub seq: u64,
    pub files: u64,
    pub chunks: u64,
    pub stored_bytes: u64,
    /// What is wrong, one line each (damaged chunks with the files that name them, missing
    /// packs, a manifest that does not match its head).
    pub problems: Vec<String>,
    /// The chunks (blake3 hex) that failed: missing, short or not matching their hash.
    #[serde(default)]
    pub damaged_chunks: Vec<String>,
    /// On a mount: damaged chunks uploaded again from the local space's verified bytes
    /// (a new manifest then names the new copies).
    #[serde(default)]
    pub reuploaded: u64,
    /// On a mount: damaged chunks this space holds no copy of either (fetched on demand,
    /// never read here): lost with the bucket's copy.
    #[serde(default)]
    pub unrepairable: Vec<String>,
}

/// Reads every chunk the newest manifest names, as a restore would, and checks each
/// against its blake3; a pack that is missing or short, or a chunk that does not verify, is
/// reported with the files it belongs to.
pub fn check(cfg: &RemoteConfig, mut progress: impl FnMut(u64, u64)) -> Result<BucketCheck> {
    let bucket = Bucket::open(cfg)?;
    let mut r = BucketCheck {
        url: cfg.url.clone(),
        ..Default::default()
    };
    let (head, m) = match newest(&bucket) {
        Ok(Some(x)) => x,
        Ok(None) => return Ok(r),
        Err(e @ Error::Damaged(_)) => {
            r.problems.push(e.to_string());
            return Ok(r);
        }
        Err(e) => return Err(e),
    };
    r.seq = head.seq;
    r.files = m.nodes.iter().filter(|n| n.kind == "file").count() as u64;
    r.chunks = m.chunks.len() as u64;
    r.stored_bytes = m.stored_bytes;
    // Which files name each chunk, for the report.
    let mut users: HashMap<usize, Vec<&str>> = HashMap::new();
    for n in &m.nodes {
        for x in &n.extents {
            let u = users.entry(x[2] as usize).or_default();
            if u.last() != Some(&n.path.as_str()) {
                u.push(&n.path);
            }
        }
    }
    let mut order: Vec<usize> = (0..m.chunks.len()).collect();
    order.sort_by_key(|&ci| (m.chunks[ci].pack, m.chunks[ci].off));
    let mut done = 0u64;
    let mut stats = Restored::default();
    for group in order.chunk_by(|&a, &b| m.chunks[a].pack == m.chunks[b].pack) {
        // A pack in ranged reads as a restore makes them; only where one fails is it read
        // again chunk by chunk, to name each bad chunk.
        if fetch(&bucket, &m, group, &mut stats).is_err() {
            for ci in group {
                if let Err(e) = fetch(&bucket, &m, &[*ci], &mut stats) {
                    let names = users.get(ci).map(|u| u.join(", ")).unwrap_or_default();
                    r.problems.push(format!("{e} (named by: {names})"));
                    r.damaged_chunks.push(m.chunks[*ci].hash.clone());
                }
            }
        }
        done += group
            .iter()
            .map(|&ci| m.chunks[ci].stored as u64)
            .sum::<u64>();
        progress(done, m.stored_bytes);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::GAP_BYTES;
    use crate::manifest::{ChunkAt, Node, MANIFEST_FORMAT};

    fn chunk(pack: u32, off: u64, stored: u32) -> ChunkAt {
        ChunkAt {
            hash: "00".repeat(32),
            pack,
            off,
            stored,
            raw: stored,
            codec: 0,
        }
    }

    fn file(path: &str, chunks: &[usize]) -> Node {
        Node {
            path: path.into(),
            kind: "file".into(),
            perm: 0o644,
            uid: 0,
            gid: 0,
            size: 0,
            mtime: 0,
            mtime_ns: 0,
            rdev: 0,
            target: None,
            xattrs: vec![],
            extents: chunks.iter().map(|&c| [0, 1, c as u64, 0]).collect(),
        }
    }

    #[test]
    fn reads_coalesce_neighbours_and_fetch_each_chunk_once() {
        let k = 64 << 10;
        let m = Manifest {
            format: MANIFEST_FORMAT,
            seq: 1,
            taken_unix: 0,
            owner: String::new(),
            logical_bytes: 0,
            stored_bytes: 0,
            packs: vec!["a".into(), "b".into()],
            chunks: vec![
                chunk(0, 0, k),
                chunk(0, k as u64, k),
                // past the gap a read goes through: a read of its own
                chunk(0, 4 * k as u64 + GAP_BYTES, k),
                chunk(1, 0, k),
            ],
            nodes: vec![file("x", &[0, 1, 2, 3]), file("y", &[1, 3, 0])],
            root: None,
        };
        let jobs = plan(&m);
        let got: Vec<(u32, u64, u64, Vec<usize>)> = jobs
            .iter()
            .map(|j| (j.pack, j.start, j.end, j.chunks.clone()))
            .collect();
        let k = k as u64;
        assert_eq!(
            got,
            vec![
                (0, 0, 2 * k, vec![0, 1]),
                (0, 4 * k + GAP_BYTES, 5 * k + GAP_BYTES, vec![2]),
                (1, 0, k, vec![3]),
            ],
            "y's chunks were all fetched for x"
        );
    }
}
