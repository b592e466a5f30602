//! The uploader: one thread per read-write mount of a space with a tier. After changes (a
//! commit or a namespace change, at most every `DEBOUNCE`), or at once when asked
//! (`sync`: a close in `close` mode, `ckptfs umount`), it takes one read snapshot of the
//! space (`Space::export_tree`), uploads the chunks the bucket does not hold yet (read and
//! checked against their blake3 first, `Data::read_checked`) as packs, then the manifest,
//! then the head. Only then does the status say the bucket holds that state.
//!
//! Bounds: a pack holds at most `PACK_BYTES` of stored chunks (one is built while at most
//! `PACKS_IN_FLIGHT` upload), so the uploader holds at most `(PACKS_IN_FLIGHT + 1) *
//! PACK_BYTES` (128 MiB) of chunk bytes; it writes nothing to the local disk. The chunk
//! index (which chunks the bucket holds, and where) is in memory: 80-odd bytes per chunk.
//!
//! Failures: the client retries requests (backoff, 5xx, timeouts); a cycle that still
//! fails is retried after `RETRY_MIN` doubling to `RETRY_MAX`, keeping the packs that
//! made it (they are content-named and found again). A head or lease that changed behind
//! this mount's back (another node took the prefix over) fences it: it uploads nothing more,
//! and says so.

use crate::bucket::{Bucket, Put};
use crate::config::{Durability, RemoteConfig};
use crate::fetch::{locations_of, Fetcher, Loc, Locations};
use crate::manifest::{
    hex, kind_name, manifest_key, name_to_str, now_unix, pack_key, ChunkAt, Head, LeaseRecord,
    Manifest, Node, HEAD, LEASE, MANIFEST_FORMAT,
};
use crate::{Error, Result};
use bytes::Bytes;
use ckptfs_engine::format::{ChunkHash, NodeKind};
use ckptfs_engine::read::RemoteChunks;
use ckptfs_fs::Fs;
use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stored bytes per pack object.
pub const PACK_BYTES: usize = 32 << 20;
/// Packs uploading at once while the next is read.
pub const PACKS_IN_FLIGHT: usize = 3;
/// Quiet time after a change before an `async` upload starts (changes that come together
/// go together).
const DEBOUNCE: Duration = Duration::from_millis(500);
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// How often the uploader collects the bucket (after an upload).
const GC_EVERY: Duration = Duration::from_secs(600);
/// How long the lease runs; renewed every third of it.
pub const LEASE_SECS: i64 = 60;
/// The longest a close in `close` mode waits for the bucket before it fails with EIO (the
/// bytes are durable locally then; the upload goes on).
pub const CLOSE_WAIT: Duration = Duration::from_secs(120);
/// The longest an unmount the CLI did not wait for (a signal, `fusermount -u`) waits for
/// the upload of what is left.
pub const EXIT_WAIT: Duration = Duration::from_secs(60);

/// A pack being uploaded: the put, the chunks it holds, its bytes.
type InFlight = (
    tokio::task::JoinHandle<Result<Option<String>>>,
    Vec<(ChunkHash, Loc)>,
    u64,
);

/// What the status says (`ckptfs remote`, `stats`, Prometheus).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RemoteStatus {
    pub url: String,
    pub durability: String,
    pub owner: String,
    /// `idle` (the bucket holds everything), `behind`, `uploading`, `retrying`, `fenced`.
    pub state: String,
    /// The newest manifest the bucket holds (0: none yet), and when its snapshot was taken.
    pub head_seq: u64,
    pub head_taken_unix: i64,
    /// File commits and namespace changes made here that the bucket does not hold yet.
    pub behind_commits: u64,
    pub behind_changes: u64,
    /// Seconds since the oldest change the bucket does not hold (0 when it holds all).
    pub behind_seconds: f64,
    /// Stored bytes the current upload still has to send (known once it has started).
    pub pending_bytes: u64,
    /// Since the mount: bytes and objects sent, and uploads finished.
    pub sent_bytes: u64,
    pub sent_objects: u64,
    pub uploads: u64,
    pub last_error: Option<String>,
    pub fenced: Option<String>,
    /// Chunks held only by the bucket, fetched on demand since the mount (`fetch`).
    pub fetch: crate::fetch::FetchStats,
}

struct State {
    head_seq: u64,
    head_etag: Option<String>,
    head_taken_unix: i64,
    /// Digest of the newest manifest's tree, to skip uploading the same tree again.
    head_digest: Option<blake3::Hash>,
    /// The space's change marks the head covers.
    covered: (u64, u64),
    /// When the first change the head does not cover was seen.
    dirty_since: Option<Instant>,
    lease_etag: Option<String>,
    lease_expires: i64,
    /// The lease is held and the head read.
    ready: bool,
    /// `sync` asks for the marks it took to be covered.
    wanted: (u64, u64),
    stop: bool,
    busy: bool,
    retrying: bool,
    pending_bytes: u64,
    sent_bytes: u64,
    sent_objects: u64,
    uploads: u64,
    last_error: Option<String>,
    fenced: Option<String>,
}

struct Inner {
    fs: Arc<Fs>,
    /// The backing directory (its `remote` file keeps `head_seq`).
    dir: std::path::PathBuf,
    token: u64,
    /// `--remote-take-over`: the lease is taken even while it runs.
    take_over: bool,
    bucket: Bucket,
    cfg: RemoteConfig,
    owner: String,
    state: Mutex<State>,
    /// Where the chunks the bucket holds lie (shared with the fetcher; lock order: `state`
    /// before this).
    known: Locations,
    /// Reads chunks held only by the bucket (`fetch`), for the engine's reader.
    fetcher: Arc<Fetcher>,
    /// Wakes the uploader (a change, a sync, stop) and the waiters (an upload finished).
    cv: Condvar,
}

/// The uploader of one mount (see the module doc).
pub struct Uploader {
    inner: Arc<Inner>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn marks(fs: &Fs) -> (u64, u64) {
    let s = fs.space();
    (s.commit_count(), s.meta_mark())
}

fn covers(have: (u64, u64), want: (u64, u64)) -> bool {
    have.0 >= want.0 && have.1 >= want.1
}

impl Uploader {
    /// Takes the prefix's lease (refused while another node holds it), reads what the
    /// bucket holds, and starts the thread.
    /// With `take_over`, a running lease is taken anyway (its holder is known to be dead).
    pub fn start(fs: Arc<Fs>, cfg: RemoteConfig, take_over: bool) -> Result<Arc<Uploader>> {
        let bucket = Bucket::open(&cfg)?;
        let token = rand_token();
        let owner = format!(
            "{} pid {} token {token:016x}",
            hostname(),
            std::process::id()
        );
        let dir = fs.space().dir().to_path_buf();
        let known: Locations = Arc::default();
        let fetcher = Arc::new(Fetcher::new(&dir, &cfg, known.clone(), false)?);
        fs.space()
            .data()
            .set_remote_chunks(Some(fetcher.clone() as Arc<dyn RemoteChunks>));
        let inner = Arc::new(Inner {
            known,
            fetcher,
            fs,
            dir,
            token,
            take_over,
            bucket,
            cfg,
            owner,
            state: Mutex::new(State {
                head_seq: 0,
                head_etag: None,
                head_taken_unix: 0,
                head_digest: None,
                covered: (0, 0),
                dirty_since: None,
                lease_etag: None,
                lease_expires: 0,
                ready: false,
                wanted: (0, 0),
                stop: false,
                busy: false,
                retrying: false,
                pending_bytes: 0,
                sent_bytes: 0,
                sent_objects: 0,
                uploads: 0,
                last_error: None,
                fenced: None,
            }),
            cv: Condvar::new(),
        });
        // Another node's running lease refuses the mount; a store that cannot be reached
        // does not (writes keep their local durability; the lease is taken before the
        // first upload).
        match inner.take_lease().and_then(|()| match inner.read_head() {
            // A mount refused after the lease was taken gives it back at once.
            Err(e @ Error::Owned(_)) => {
                inner.release_lease();
                Err(e)
            }
            r => r,
        }) {
            Ok(()) => inner.state.lock().ready = true,
            Err(e @ Error::Owned(_)) => return Err(e),
            Err(e) => {
                log::warn!(
                    "the object store of {} cannot be used now ({e}); uploads start once it \
                     can",
                    inner.cfg.url
                );
                inner.state.lock().last_error = Some(e.to_string());
            }
        }
        let me = Arc::new(Uploader {
            inner: inner.clone(),
            thread: Mutex::new(None),
        });
        let t = std::thread::Builder::new()
            .name("ckptfs-upload".into())
            .spawn(move || inner.run())
            .map_err(|e| Error::Other(format!("cannot start the uploader: {e}")))?;
        *me.thread.lock() = Some(t);
        Ok(me)
    }

    pub fn durability(&self) -> Durability {
        self.inner.cfg.durability
    }

    /// Tells the uploader the space changed (it also notices on its own within a second).
    pub fn poke(&self) {
        self.inner.cv.notify_all();
    }

    /// Asks for everything changed before now to be uploaded, without waiting.
    pub fn nudge(&self) {
        let want = marks(&self.inner.fs);
        let mut st = self.inner.state.lock();
        st.wanted = (st.wanted.0.max(want.0), st.wanted.1.max(want.1));
        self.inner.cv.notify_all();
    }

    /// Waits until the bucket holds every change made before this call, at most `limit`.
    pub fn sync(&self, limit: Duration) -> Result<()> {
        let want = marks(&self.inner.fs);
        let deadline = Instant::now() + limit;
        let mut st = self.inner.state.lock();
        st.wanted = (st.wanted.0.max(want.0), st.wanted.1.max(want.1));
        self.inner.cv.notify_all();
        loop {
            if covers(st.covered, want) {
                return Ok(());
            }
            if let Some(f) = &st.fenced {
                return Err(Error::Fenced(f.clone()));
            }
            if st.stop {
                return Err(Error::Other("the uploader stopped".into()));
            }
            if self.inner.cv.wait_until(&mut st, deadline).timed_out() {
                return Err(Error::Other(format!(
                    "the bucket does not hold this state after {}s{}",
                    limit.as_secs(),
                    st.last_error
                        .as_ref()
                        .map(|e| format!(" (last error: {e})"))
                        .unwrap_or_default()
                )));
            }
        }
    }

    pub fn status(&self) -> RemoteStatus {
        let now = marks(&self.inner.fs);
        let st = self.inner.state.lock();
        let behind = !covers(st.covered, now);
        RemoteStatus {
            url: self.inner.cfg.url.clone(),
            durability: self.inner.cfg.durability.to_string(),
            owner: self.inner.owner.clone(),
            state: if st.fenced.is_some() {
                "fenced"
            } else if st.retrying {
                "retrying"
            } else if st.busy {
                "uploading"
            } else if behind {
                "behind"
            } else {
                "idle"
            }
            .into(),
            head_seq: st.head_seq,
            head_taken_unix: st.head_taken_unix,
            behind_commits: now.0.saturating_sub(st.covered.0),
            behind_changes: now.1.saturating_sub(st.covered.1),
            behind_seconds: match (behind, st.dirty_since) {
                (true, Some(t)) => t.elapsed().as_secs_f64(),
                _ => 0.0,
            },
            pending_bytes: st.pending_bytes,
            sent_bytes: st.sent_bytes,
            sent_objects: st.sent_objects,
            uploads: st.uploads,
            last_error: st.last_error.clone(),
            fenced: st.fenced.clone(),
            fetch: self.inner.fetcher.stats(),
        }
    }

    /// `ckptfs check --remote` on a mount: verifies every chunk the bucket's newest manifest
    /// names, and uploads again, from the local space's verified bytes, every chunk that
    /// failed (the next manifest names the new copies; `sync` waits for it).
    pub fn check_and_heal(&self) -> Result<crate::restore::BucketCheck> {
        let mut r = crate::restore::check(&self.inner.cfg, |_, _| {})?;
        if r.damaged_chunks.is_empty() {
            return Ok(r);
        }
        let bad: Vec<ChunkHash> = r
            .damaged_chunks
            .iter()
            .filter_map(|h| crate::manifest::unhex(h).ok())
            .filter_map(|b| b.try_into().ok().map(ChunkHash))
            .collect();
        let data = self.inner.fs.space().data();
        let mut st = self.inner.state.lock();
        let mut known = self.inner.known.lock();
        for h in &bad {
            // A chunk held only by the bucket has no local copy to upload again.
            if let Ok(Some(rec)) = data.committed_record(h) {
                if rec.is_remote() {
                    r.unrepairable.push(crate::manifest::hex(&h.0));
                    continue;
                }
            }
            if known.remove(h).is_some() {
                r.reuploaded += 1;
            }
        }
        drop(known);
        // The tree may be unchanged: the next upload must write a manifest anyway.
        st.head_digest = None;
        st.covered = (0, 0);
        drop(st);
        self.nudge();
        Ok(r)
    }

    /// gc of the bucket (`gc::collect`), now.
    pub fn gc(&self, dry_run: bool) -> Result<crate::gc::BucketGc> {
        self.inner.gc(dry_run)
    }

    /// Stops the thread after its current upload and gives the lease back (so the next
    /// mount, here or elsewhere, takes it at once). Call `sync` first to upload the rest.
    pub fn stop(&self) {
        self.inner.state.lock().stop = true;
        self.inner.cv.notify_all();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        self.inner.release_lease();
    }
}

impl Inner {
    fn run(self: Arc<Self>) {
        let mut backoff = RETRY_MIN;
        let mut last_gc: Option<std::time::Instant> = None;
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    let now = marks(&self.fs);
                    let changed = !covers(st.covered, now);
                    if changed && st.dirty_since.is_none() {
                        st.dirty_since = Some(Instant::now());
                    }
                    let asked = !covers(st.covered, st.wanted);
                    let quiet = st.dirty_since.is_some_and(|t| t.elapsed() >= DEBOUNCE);
                    if st.fenced.is_none() && (asked || (changed && quiet)) {
                        break;
                    }
                    // Renew the lease on time even when nothing changes.
                    if st.fenced.is_none() && st.lease_expires - now_unix() < LEASE_SECS * 2 / 3 {
                        break;
                    }
                    let wait = if changed {
                        DEBOUNCE / 2
                    } else {
                        Duration::from_secs(1)
                    };
                    self.cv.wait_for(&mut st, wait);
                }
                st.busy = true;
            }
            let r = self
                .ensure_ready()
                .and_then(|()| self.renew_lease())
                .and_then(|_| {
                    let (now, covered) = (marks(&self.fs), self.state.lock().covered);
                    match covers(covered, now) {
                        true => Ok(()),
                        false => self.upload_once(),
                    }
                });
            let mut st = self.state.lock();
            st.busy = false;
            match r {
                Ok(()) => {
                    st.retrying = false;
                    st.last_error = None;
                    backoff = RETRY_MIN;
                    drop(st);
                    self.cv.notify_all();
                    let due =
                        last_gc.is_none_or(|t| ckptfs_engine::face::clock::since(t) >= GC_EVERY);
                    if due {
                        last_gc = Some(ckptfs_engine::face::clock::instant());
                        if let Err(e) = self.gc(false) {
                            log::warn!("bucket gc of {} failed: {e}", self.cfg.url);
                        }
                    }
                }
                Err(Error::Fenced(why)) => {
                    log::error!("the object-store tier is fenced: {why}; nothing more is uploaded");
                    st.fenced = Some(why);
                    drop(st);
                    self.cv.notify_all();
                }
                Err(e) => {
                    log::warn!(
                        "uploading to {} failed: {e}; retrying in {backoff:?}",
                        self.cfg.url
                    );
                    st.retrying = true;
                    st.last_error = Some(e.to_string());
                    drop(st);
                    self.cv.notify_all();
                    let mut st = self.state.lock();
                    if !st.stop {
                        self.cv.wait_for(&mut st, backoff);
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Reads the head and its manifest: what the bucket holds, and where each chunk lies.
    fn read_head(&self) -> Result<()> {
        let Some((b, etag)) = self.bucket.get(HEAD)? else {
            return Ok(());
        };
        let head: Head = serde_json::from_slice(&b)
            .map_err(|e| Error::Damaged(format!("the head object does not parse: {e}")))?;
        if head.seq > self.cfg.head_seq {
            return Err(Error::Owned(format!(
                "{} holds newer checkpoints (manifest {}, written by {}) than this space \
                 (manifest {}): another node wrote there since, and mounting this space as \
                 the owner would roll the bucket back; recover into an empty directory \
                 (`ckptfs recover DIR --remote {}`)",
                self.cfg.url, head.seq, head.owner, self.cfg.head_seq, self.cfg.url
            )));
        }
        let m = fetch_manifest(&self.bucket, &head)?;
        let mut st = self.state.lock();
        st.head_seq = head.seq;
        st.head_etag = etag;
        st.head_taken_unix = m.taken_unix;
        st.head_digest = Some(tree_digest(&m.nodes, m.root.as_ref(), &m.chunks, &m.packs));
        drop(st);
        let mut known = self.known.lock();
        for (h, l) in locations_of(&m)? {
            known.insert(h, l);
        }
        Ok(())
    }

    fn gc(&self, dry_run: bool) -> Result<crate::gc::BucketGc> {
        let head = {
            let st = self.state.lock();
            if let Some(f) = &st.fenced {
                return Err(Error::Fenced(f.clone()));
            }
            st.head_seq
        };
        let now = ckptfs_engine::face::clock::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let r = crate::gc::collect(&self.bucket, head, now, dry_run)?;
        if !dry_run && !r.packs_deleted.is_empty() {
            let gone: std::collections::HashSet<&str> =
                r.packs_deleted.iter().map(String::as_str).collect();
            self.known.lock().retain(|_, l| !gone.contains(&*l.pack));
            log::info!(
                "bucket gc: deleted {} manifests and {} packs ({} MiB)",
                r.manifests_deleted.len(),
                r.packs_deleted.len(),
                r.bytes_deleted >> 20
            );
        }
        Ok(r)
    }

    fn ensure_ready(&self) -> Result<()> {
        if self.state.lock().ready {
            return Ok(());
        }
        self.take_lease()?;
        self.read_head()?;
        self.state.lock().ready = true;
        Ok(())
    }

    fn take_lease(&self) -> Result<()> {
        let rec = LeaseRecord {
            owner: self.owner.clone(),
            expires_unix: now_unix() + LEASE_SECS,
        };
        let body = Bytes::from(serde_json::to_vec(&rec).expect("serializable"));
        let put = match self.bucket.put(LEASE, body.clone(), Put::Create) {
            Ok(e) => Ok(e),
            Err(Error::Precondition(_)) => {
                let (b, etag) = self.bucket.get(LEASE)?.ok_or_else(|| {
                    Error::Other("the lease object vanished while being taken; retry".into())
                })?;
                let old: LeaseRecord = serde_json::from_slice(&b)
                    .map_err(|e| Error::Damaged(format!("the lease object does not parse: {e}")))?;
                if old.expires_unix > now_unix() && !self.take_over {
                    return Err(Error::Owned(format!(
                        "{} is owned by {} for {} s more (its lease); unmount it there, or \
                         if that node is dead wait until the lease runs out or mount with \
                         --remote-take-over",
                        self.cfg.url,
                        old.owner,
                        old.expires_unix - now_unix()
                    )));
                }
                let etag = etag.ok_or_else(|| {
                    Error::Other("the object store gave the lease no ETag".into())
                })?;
                match self.bucket.put(LEASE, body, Put::IfMatch(etag)) {
                    Err(Error::Precondition(_)) => Err(Error::Owned(format!(
                        "another node took {} over at the same moment",
                        self.cfg.url
                    ))),
                    r => r,
                }
            }
            Err(e) => Err(e),
        }?;
        let mut st = self.state.lock();
        st.lease_etag = put;
        st.lease_expires = rec.expires_unix;
        Ok(())
    }

    fn renew_lease(&self) -> Result<()> {
        let (etag, expires) = {
            let st = self.state.lock();
            (st.lease_etag.clone(), st.lease_expires)
        };
        if expires - now_unix() > LEASE_SECS * 2 / 3 {
            return Ok(());
        }
        let rec = LeaseRecord {
            owner: self.owner.clone(),
            expires_unix: now_unix() + LEASE_SECS,
        };
        let body = Bytes::from(serde_json::to_vec(&rec).expect("serializable"));
        let how = match etag {
            Some(e) => Put::IfMatch(e),
            None => Put::Create,
        };
        match self.bucket.put(LEASE, body, how) {
            Ok(e) => {
                let mut st = self.state.lock();
                st.lease_etag = e;
                st.lease_expires = rec.expires_unix;
                Ok(())
            }
            // A renewal applied whose answer was lost leaves this mount a stale ETag: the
            // lease the bucket has is still this mount's then, and is renewed over it.
            Err(Error::Precondition(_)) => {
                let taken = || {
                    Error::Fenced(format!(
                        "the lease of {} was taken by another node",
                        self.cfg.url
                    ))
                };
                let (b, etag) = self.bucket.get(LEASE)?.ok_or_else(taken)?;
                let now: LeaseRecord = serde_json::from_slice(&b).map_err(|_| taken())?;
                let etag = etag.filter(|_| now.owner == self.owner).ok_or_else(taken)?;
                let body = Bytes::from(serde_json::to_vec(&rec).expect("serializable"));
                match self.bucket.put(LEASE, body, Put::IfMatch(etag)) {
                    Ok(e) => {
                        let mut st = self.state.lock();
                        st.lease_etag = e;
                        st.lease_expires = rec.expires_unix;
                        Ok(())
                    }
                    Err(Error::Precondition(_)) => Err(taken()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Writes a lease that has run out, if it is still this mount's.
    fn release_lease(&self) {
        let etag = self.state.lock().lease_etag.clone();
        let (Some(etag), None) = (etag, self.state.lock().fenced.clone()) else {
            return;
        };
        let rec = LeaseRecord {
            owner: format!("{} (released)", self.owner),
            expires_unix: 0,
        };
        let body = Bytes::from(serde_json::to_vec(&rec).expect("serializable"));
        if let Err(e) = self.bucket.put(LEASE, body, Put::IfMatch(etag)) {
            log::warn!(
                "could not give the lease of {} back ({e}); another node can take it in {} s",
                self.cfg.url,
                LEASE_SECS
            );
        }
    }

    /// One upload: snapshot, packs, manifest, head.
    fn upload_once(&self) -> Result<()> {
        let space = self.fs.space();
        let taken = now_unix();
        let at = marks(&self.fs);
        let tree = space.export_tree()?;
        // The chunks the bucket lacks, in data-file order (sequential reads).
        let mut missing: Vec<(ChunkHash, u64, u32)> = {
            let known = self.known.lock();
            // A chunk held only by the bucket is there already (or lost with it: there is
            // no copy here to send).
            tree.chunks
                .iter()
                .filter(|(h, r)| !known.contains_key(h) && !r.is_remote())
                .map(|(h, r)| (*h, r.offset.0, r.stored_len))
                .collect()
        };
        missing.sort_by_key(|m| m.1);
        self.state.lock().pending_bytes = missing.iter().map(|m| m.2 as u64).sum();
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        let mut i = 0;
        while i < missing.len() {
            let mut batch = Vec::new();
            let mut bytes = 0usize;
            while i < missing.len()
                && (batch.is_empty() || bytes + missing[i].2 as usize <= PACK_BYTES)
            {
                bytes += missing[i].2 as usize;
                batch.push(missing[i].0);
                i += 1;
            }
            let read = space.data().read_checked(&batch)?;
            let mut buf = Vec::with_capacity(bytes);
            let mut entries = Vec::with_capacity(batch.len());
            for (h, r) in batch.iter().zip(read) {
                let Some((rec, stored)) = r else {
                    // gc dropped it since the snapshot: the snapshot is stale.
                    return Err(Error::Other(
                        "the space changed under the upload (gc); starting again".into(),
                    ));
                };
                entries.push((
                    *h,
                    Loc {
                        pack: Arc::from(""),
                        off: buf.len() as u64,
                        stored: stored.len() as u32,
                        raw: rec.raw_len,
                        codec: rec.codec.id(),
                    },
                ));
                buf.extend_from_slice(&stored);
            }
            let key: Arc<str> = pack_key(&blake3::hash(&buf)).into();
            for e in &mut entries {
                e.1.pack = key.clone();
            }
            let n = buf.len() as u64;
            in_flight.push_back((self.bucket.spawn_put(&key, Bytes::from(buf)), entries, n));
            if in_flight.len() >= PACKS_IN_FLIGHT {
                let (h, entries, n) = in_flight.pop_front().expect("non-empty");
                self.finish_pack(h, entries, n)?;
            }
        }
        while let Some((h, entries, n)) = in_flight.pop_front() {
            self.finish_pack(h, entries, n)?;
        }
        // The manifest: every node, and where each chunk it names lies.
        let st = self.state.lock();
        let known = self.known.lock();
        let mut named = Named::default();
        let mut nodes = Vec::with_capacity(tree.nodes.len());
        let mut logical = 0u64;
        for n in &tree.nodes {
            let mut extents = Vec::with_capacity(n.extents.len());
            for (off, x) in &n.extents {
                let ci = named
                    .index(&known, &x.chunk)
                    .ok_or_else(|| Error::Other(format!("chunk {} was not uploaded", x.chunk)))?;
                extents.push([*off, x.len as u64, ci, x.chunk_off as u64]);
            }
            if n.rec.kind == NodeKind::File {
                logical += n.rec.size;
            }
            nodes.push(node_of(n, extents));
        }
        let root = node_of(&tree.root, Vec::new());
        // Chunks held only by the bucket that no current file names (kept revisions, the
        // trash) are named too, so that bucket gc keeps the packs holding the only copy.
        let mut extra: Vec<&ChunkHash> = tree
            .chunks
            .iter()
            .filter(|(h, r)| r.is_remote() && !named.chunk_ix.contains_key(*h))
            .map(|(h, _)| h)
            .collect();
        extra.sort_unstable();
        for h in extra {
            if named.index(&known, h).is_none() {
                log::warn!("chunk {h} is held only by the bucket, and the bucket lacks it");
            }
        }
        let Named {
            packs,
            chunks,
            stored_total,
            ..
        } = named;
        let (seq, head_etag, same) = {
            let digest = tree_digest(&nodes, Some(&root), &chunks, &packs);
            (
                st.head_seq + 1,
                st.head_etag.clone(),
                (st.head_digest == Some(digest), digest),
            )
        };
        drop(known);
        drop(st);
        if same.0 {
            // The bucket holds this very tree already (a change undone, a change of times
            // only read back the same): nothing to write.
            self.covered(at);
            return Ok(());
        }
        let m = Manifest {
            format: MANIFEST_FORMAT,
            seq,
            taken_unix: taken,
            owner: self.owner.clone(),
            logical_bytes: logical,
            stored_bytes: stored_total,
            packs,
            chunks,
            nodes,
            root: Some(root),
        };
        let body = m.encode();
        let sum = blake3::hash(&body).to_hex().to_string();
        let key = manifest_key(seq, self.token);
        let n = body.len() as u64;
        // The key carries this mount's token, so no other writer names it; a retry after a
        // head that failed writes it again (no head names it yet). The head's `If-Match` is
        // what orders writers.
        self.bucket.put(&key, Bytes::from(body), Put::Overwrite)?;
        let head = Head {
            seq,
            manifest: key,
            blake3: sum,
            owner: self.owner.clone(),
            written_unix: now_unix(),
        };
        let hb = Bytes::from(serde_json::to_vec(&head).expect("serializable"));
        // Said here before the bucket says it: a crash between the two leaves this space
        // claiming a head the bucket may not have (harmless), never the other way round
        // (which would refuse this space's next mount).
        let mut cfg = self.cfg.clone();
        cfg.head_seq = seq;
        cfg.save(&self.dir)?;
        let how = match head_etag {
            Some(e) => Put::IfMatch(e),
            None => Put::Create,
        };
        let etag = match self.bucket.put(HEAD, hb.clone(), how) {
            Err(Error::Precondition(_)) => self.head_was_ours(&head)?,
            r => r?,
        };
        let mut st = self.state.lock();
        st.head_seq = seq;
        st.head_etag = etag;
        st.head_taken_unix = taken;
        st.head_digest = Some(same.1);
        st.sent_bytes += n + hb.len() as u64;
        st.sent_objects += 2;
        st.uploads += 1;
        drop(st);
        self.covered(at);
        log::info!(
            "uploaded manifest {seq} to {} ({} nodes, {} MiB stored)",
            self.cfg.url,
            m.nodes.len(),
            m.stored_bytes >> 20
        );
        Ok(())
    }

    /// A head put refused by its condition: another node replaced the head (this mount is
    /// fenced), or an earlier put of this mount's was applied although its answer was lost
    /// (a timeout, a connection cut after the store wrote it), so the ETag this mount holds
    /// is stale. The head the bucket has says which: one this mount wrote is adopted and
    /// `head` put again over it.
    fn head_was_ours(&self, head: &Head) -> Result<Option<String>> {
        let fenced = || {
            Error::Fenced(format!(
                "the head of {} was replaced by another node",
                self.cfg.url
            ))
        };
        let (b, etag) = self.bucket.get(HEAD)?.ok_or_else(fenced)?;
        let now: Head = serde_json::from_slice(&b).map_err(|_| fenced())?;
        if now.owner != self.owner {
            return Err(fenced());
        }
        let etag = etag.ok_or_else(fenced)?;
        let hb = Bytes::from(serde_json::to_vec(head).expect("serializable"));
        match self.bucket.put(HEAD, hb, Put::IfMatch(etag)) {
            Err(Error::Precondition(_)) => Err(fenced()),
            r => r,
        }
    }

    fn finish_pack(
        &self,
        h: tokio::task::JoinHandle<Result<Option<String>>>,
        entries: Vec<(ChunkHash, Loc)>,
        n: u64,
    ) -> Result<()> {
        self.bucket.join(h)?;
        let mut known = self.known.lock();
        for (h, l) in entries {
            known.insert(h, l);
        }
        drop(known);
        let mut st = self.state.lock();
        st.sent_bytes += n;
        st.sent_objects += 1;
        st.pending_bytes = st.pending_bytes.saturating_sub(n);
        Ok(())
    }

    /// The head now covers the changes marked `at`.
    fn covered(&self, at: (u64, u64)) {
        let mut st = self.state.lock();
        st.covered = (st.covered.0.max(at.0), st.covered.1.max(at.1));
        st.pending_bytes = 0;
        if covers(st.covered, marks(&self.fs)) {
            st.dirty_since = None;
        }
    }
}

/// A node of the snapshot as the manifest gives it, with its extents as `extents`.
fn node_of(n: &ckptfs_engine::space::TreeNode, extents: Vec<[u64; 4]>) -> Node {
    let r = &n.rec;
    Node {
        path: name_to_str(&n.path),
        kind: kind_name(r.kind).into(),
        perm: r.perm,
        uid: r.uid,
        gid: r.gid,
        size: r.size,
        mtime: r.mtime.secs,
        mtime_ns: r.mtime.nanos,
        rdev: r.rdev,
        target: (r.kind == NodeKind::Symlink).then(|| name_to_str(&r.target)),
        xattrs: n.xattrs.iter().map(|(k, v)| [hex(k), hex(v)]).collect(),
        extents,
    }
}

/// The chunks a manifest names, in the order first named, and their packs.
#[derive(Default)]
struct Named {
    packs: Vec<String>,
    pack_ix: HashMap<Arc<str>, u32>,
    chunk_ix: HashMap<ChunkHash, u64>,
    chunks: Vec<ChunkAt>,
    stored_total: u64,
}

impl Named {
    /// The index of chunk `h` in `chunks`, named now if it was not; None: the bucket does
    /// not hold it (`known`).
    fn index(&mut self, known: &HashMap<ChunkHash, Loc>, h: &ChunkHash) -> Option<u64> {
        if let Some(i) = self.chunk_ix.get(h) {
            return Some(*i);
        }
        let loc = known.get(h)?;
        let packs = &mut self.packs;
        let pi = *self.pack_ix.entry(loc.pack.clone()).or_insert_with(|| {
            packs.push(loc.pack.to_string());
            (packs.len() - 1) as u32
        });
        self.chunks.push(ChunkAt {
            hash: hex(&h.0),
            pack: pi,
            off: loc.off,
            stored: loc.stored,
            raw: loc.raw,
            codec: loc.codec,
        });
        self.stored_total += loc.stored as u64;
        let i = (self.chunks.len() - 1) as u64;
        self.chunk_ix.insert(*h, i);
        Some(i)
    }
}

/// What a manifest says, without who wrote it or when: equal digests mean an upload would
/// write the same tree again (a remount, a space just recovered).
fn tree_digest(
    nodes: &[Node],
    root: Option<&Node>,
    chunks: &[ChunkAt],
    packs: &[String],
) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    h.update(&serde_json::to_vec(nodes).expect("serializable"));
    h.update(&serde_json::to_vec(&root).expect("serializable"));
    h.update(&serde_json::to_vec(chunks).expect("serializable"));
    h.update(&serde_json::to_vec(packs).expect("serializable"));
    h.finalize()
}

/// Fetches and checks the manifest a head names.
pub fn fetch_manifest(bucket: &Bucket, head: &Head) -> Result<Manifest> {
    let (b, _) = bucket.get(&head.manifest)?.ok_or_else(|| {
        Error::Damaged(format!(
            "the head names {}, which the bucket does not hold",
            head.manifest
        ))
    })?;
    Manifest::decode(&b, &head.blake3)
}

fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: gethostname writes at most `b.len()` bytes into the buffer.
    let r = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    if r != 0 {
        return "unknown-host".into();
    }
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

fn rand_token() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let h = blake3::hash(&[t.to_le_bytes(), (std::process::id() as u64).to_le_bytes()].concat());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}
