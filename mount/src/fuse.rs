//! The FUSE adapter: the only place fuser types appear. Every request is translated to an
//! `fs::Fs` call, and every error to an errno in `errno()`.

use crate::control;
use ckptfs_engine::format::{InodeId, NodeKind, Timestamp};
use ckptfs_engine::write::ReadPart;
use ckptfs_fs::xattr::XattrSet;
use ckptfs_fs::{creds, Attr, Caller, Error, Fs, HandleId, ReadReply, Requester, SetAttr};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the kernel may cache attributes and names. Only this daemon changes the
/// filesystem, and it tells the kernel about changes it makes through replies.
const TTL: Duration = Duration::from_secs(1);
/// Largest write request the kernel may send; checkpoints are written in large pieces.
pub const MAX_WRITE_BYTES: u32 = 4 << 20;

/// Background requests (the kernel's readahead READs) a mount lets the kernel have in flight;
/// fuser's default, 16, makes it count as congested from 12 on (three quarters). A congested
/// FUSE mount drops the asynchronous part of every readahead, so sequential readers wait for
/// each read in turn and the kernel falls back to small reads: 8 cold readers of 128 MiB
/// (1 MiB reads, 4 MiB readahead each) took 885-1580 MiB/s at 0.74-1.34 daemon CPU-s/GiB
/// with 16, 1084-1258 with 32, and 1770-1914 at 0.72-0.80 with 64 or 128 (2-core VM,
/// `max_background` set through fusectl, runs alternated). Each reader keeps up to two
/// readahead windows of 4 MiB in 1 MiB requests, 8 in flight, so 256 leaves 24 readers
/// uncongested (the kernel counts from three quarters). It bounds no memory of the daemon's: a request in flight holds the reader's
/// page-cache pages its window already allocated, and the daemon serves requests on its
/// fixed FUSE threads. For a mount without CAP_SYS_ADMIN the kernel lowers it to the fuse
/// module's `max_user_bgreq` (/sys/module/fuse/parameters; 7866 on the 24 GiB VM) where
/// that is less.
pub const MAX_BACKGROUND: u16 = 256;

/// What the kernel's cap on a FUSE request costs, where it is under `MAX_WRITE_BYTES`:
/// `limit_pages` is `/proc/sys/fs/fuse/max_pages_limit` (None: this kernel has no such
/// setting, or it could not be read). At the default 256 pages (1 MiB), a 1 MiB write from
/// a buffer that is not page-aligned (malloc's large buffers start 16 bytes into a page)
/// spans 257 pages and reaches the daemon as two requests, one of a few bytes: on the
/// project's 2-core VM a next checkpoint revision took 0.71-0.77 daemon CPU-s/GiB so, and
/// 0.60-0.67 with the cap at 1024 pages (`ckptfs-bench steps`, the FUSE threads woken half
/// as often). Logged once at mount; the setting is the machine's, not the daemon's.
pub fn request_cap_hint(limit_pages: Option<u64>) -> Option<String> {
    let pages = limit_pages?;
    let want = u64::from(MAX_WRITE_BYTES) / 4096;
    (pages < want).then(|| {
        format!(
            "the kernel caps a FUSE request at {pages} pages ({} KiB; fs.fuse.max_pages_limit), \
             under the {} KiB this daemon asks for: a larger write, or one of that size \
             from a buffer that is not page-aligned (most applications'), arrives as several \
             requests (about 0.1 daemon CPU-s/GiB more on a next checkpoint revision, \
             measured on 2 cores). As root, `sysctl -w fs.fuse.max_pages_limit={want}` \
             before mounting lifts the cap",
            pages * 4,
            MAX_WRITE_BYTES / 1024
        )
    })
}

/// `/proc/sys/fs/fuse/max_pages_limit`, where this kernel has it.
pub fn request_cap_pages() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Largest read reply buffer a FUSE thread keeps (`REPLY_BUF`): the kernel's largest read
/// request.
const REPLY_BUF_MAX: usize = MAX_WRITE_BYTES as usize;

thread_local! {
    /// Each FUSE thread's read reply buffer, reused: a fresh one per reply cost its page
    /// faults again for every megabyte read (in the daemon, and again where the kernel pins
    /// its pages to copy the reply).
    static REPLY_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
/// Block size reported to statfs and in stat's st_blksize.
const BLOCK_BYTES: u32 = 4096;
/// Directory entries fetched from the metadata table per readdir request.
const READDIR_BATCH: usize = 512;
/// Bytes a readdirplus entry with a name of up to 8 bytes takes in the reply: fuse_entry_out
/// (128), fuse_dirent (24), the name padded to 8.
const DIRENTPLUS_MIN: usize = 160;

/// The one map from errors to errno. No catch-all arm: a new error variant must be decided.
fn errno(e: &Error) -> Errno {
    use ckptfs_engine::Error as E;
    use ckptfs_engine::TargetFault;
    let code = match e {
        Error::NotFound => libc::ENOENT,
        Error::Exists => libc::EEXIST,
        Error::NotDir => libc::ENOTDIR,
        Error::IsDir => libc::EISDIR,
        Error::NotEmpty => libc::ENOTEMPTY,
        Error::NameTooLong => libc::ENAMETOOLONG,
        Error::NotPermitted => libc::EPERM,
        Error::Invalid => libc::EINVAL,
        Error::FileTooBig => libc::EFBIG,
        Error::ReadOnly => libc::EROFS,
        Error::CrossDevice => libc::EXDEV,
        Error::Busy => libc::EBUSY,
        Error::NotSupported => libc::EOPNOTSUPP,
        Error::BadHandle => libc::EIO,
        Error::Stale => libc::ESTALE,
        Error::NoData => libc::ENODATA,
        Error::OutOfRange => libc::ERANGE,
        Error::ValueTooBig => libc::E2BIG,
        Error::Engine(inner) => match inner {
            E::Io(_) => libc::EIO,
            E::NoSpace => libc::ENOSPC,
            E::Corrupt(_) => libc::EIO,
            E::NotASpace(_) => libc::EIO,
            E::Locked(_) => libc::EBUSY,
            E::Invalid(_) => libc::EINVAL,
            E::Meta(ckptfs_engine::MetaFault::TooLarge(_)) => libc::EFBIG,
            E::Meta(ckptfs_engine::MetaFault::Other(_)) => libc::EIO,
            E::Failed => libc::EIO,
            E::ReadOnly => libc::EROFS,
            E::BackingFull => libc::ENOSPC,
            // Only at mount; a space this build does not serve.
            E::OldSlotNamespace => libc::EIO,
            E::Fenced(_) => libc::EIO,
            E::NamespaceBusy(_) => libc::EBUSY,
            // Only at mount.
            E::Incoherent(_) => libc::EIO,
            E::OneTarget => libc::EOPNOTSUPP,
            // `fs` turns these into its own variants above; the same answers if one slips by.
            E::Namespace(n) => match n {
                ckptfs_engine::face::NsFault::NotFound => libc::ENOENT,
                ckptfs_engine::face::NsFault::Exists => libc::EEXIST,
                ckptfs_engine::face::NsFault::NotDir => libc::ENOTDIR,
                ckptfs_engine::face::NsFault::IsDir => libc::EISDIR,
                ckptfs_engine::face::NsFault::NotEmpty => libc::ENOTEMPTY,
                ckptfs_engine::face::NsFault::NoAttr => libc::ENODATA,
            },
            E::Targets(t) => match t {
                // Data too few targets hold: lost until they return, as a bad disk's.
                TargetFault::Unreadable { .. } => libc::EIO,
                TargetFault::Unwritable { .. } => libc::EIO,
                // No room to place a segment: the writer gets ENOSPC, old data stays.
                TargetFault::TooFewTargets { .. } => libc::ENOSPC,
                TargetFault::TargetFailed { .. } => libc::EIO,
                // Only at mount.
                TargetFault::TooFewOpen { .. } => libc::EIO,
                TargetFault::Unplaced { .. } => libc::EIO,
                TargetFault::BadPlacement { .. } => libc::EIO,
                // Bugs if ever seen; the log has the sentence.
                TargetFault::Foreign { .. } => libc::EIO,
                TargetFault::Misaligned { .. } => libc::EIO,
                TargetFault::Codec(_) => libc::EIO,
            },
        },
    };
    Errno::from_i32(code)
}

/// Logs errors the application cannot explain by itself (I/O, corruption) and converts.
fn fail(op: &str, ino: u64, e: Error) -> Errno {
    match &e {
        // A change refused on a read-only mount (after `remount,rw`, or through the control
        // interface): the caller's doing, said once per request.
        Error::Engine(ckptfs_engine::Error::ReadOnly) => log::warn!("{op} on inode {ino}: {e}"),
        // A full backing filesystem: said once where the table lost its room, not per write.
        Error::Engine(ckptfs_engine::Error::BackingFull) => {
            log::debug!("{op} on inode {ino}: {e}")
        }
        Error::Engine(inner) => log::error!("{op} on inode {ino}: {inner}"),
        _ => log::debug!("{op} on inode {ino}: {e}"),
    }
    errno(&e)
}

fn kind(k: NodeKind) -> FileType {
    match k {
        NodeKind::File => FileType::RegularFile,
        NodeKind::Dir => FileType::Directory,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::Fifo => FileType::NamedPipe,
        NodeKind::Socket => FileType::Socket,
        NodeKind::CharDevice => FileType::CharDevice,
        NodeKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    let r = &a.rec;
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: r.size,
        // Blocks for the bytes that are not holes, in 4 KiB units as ext4 allocates them, so
        // `du` and hole-detecting tools (cp --sparse, tar -S) see a sparse file as sparse.
        blocks: match r.kind {
            NodeKind::File => a.data_bytes.unwrap_or(r.size).next_multiple_of(4096) / 512,
            // ext4 keeps a target under 60 bytes inside the inode (no block), longer ones
            // in blocks; `du` and suites comparing with ext4 see the same.
            NodeKind::Symlink if r.size < 60 => 0,
            NodeKind::Symlink => r.size.next_multiple_of(4096) / 512,
            // Entries live in the metadata table, not in blocks of the directory.
            _ => 0,
        },
        atime: r.atime.into(),
        mtime: r.mtime.into(),
        ctime: r.ctime.into(),
        crtime: r.crtime.into(),
        kind: kind(r.kind),
        perm: r.perm as u16,
        nlink: r.nlink,
        uid: r.uid,
        gid: r.gid,
        rdev: r.rdev,
        blksize: BLOCK_BYTES,
        flags: 0,
    }
}

fn time(t: TimeOrNow) -> Timestamp {
    match t {
        TimeOrNow::SpecificTime(t) => t.into(),
        TimeOrNow::Now => Timestamp::now(),
    }
}

/// The owner of a node a request creates. With idmapped mounts allowed, the kernel sends
/// the ids (mapped through the mount's idmap) only with such requests.
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// The sender of `req`, for decisions that need its groups or capabilities (see
/// `ckptfs_fs::creds`).
fn requester(req: &Request) -> Requester {
    Requester::new(req.pid(), req.uid(), req.gid())
}

/// The owner of a file `restore` has to create: the caller of the control request, whose
/// ids FUSE does not send once idmapped mounts are allowed (not a creation request).
fn owner_of_restored(req: &Request) -> Caller {
    let c = requester(req).credentials().clone();
    Caller {
        uid: c.uid,
        gid: c.gid,
    }
}

fn writes(flags: OpenFlags) -> bool {
    !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY)
}

/// How the kernel should treat a handle. Write-only handles (how checkpoints are written:
/// `open(..., "wb")`, `dd of=`, `cp`) bypass the kernel's page cache: each write() goes to
/// the daemon as one request of up to `MAX_WRITE_BYTES`, straight from the writer's pages,
/// instead of being copied into the cache and sent from there in page-cache-sized requests.
/// That removes a copy and the cache's bookkeeping from the writer's hot path, which on a
/// checkpoint is most of what the kernel spends. Writers to one file from several
/// processes (N-1) may send requests in parallel. A write-only handle cannot be mmapped,
/// so mmap users keep the cache; handles that can read keep it too (reads benefit from
/// readahead and repeated reads from the cache).
fn open_flags(flags: OpenFlags) -> FopenFlags {
    if matches!(flags.acc_mode(), OpenAccMode::O_WRONLY) {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::empty()
    }
}

/// Drops the pages the kernel cached for a range whose bytes changed behind its page cache:
/// a write through a direct-I/O handle, a restore. The kernel drops a direct write's range
/// before it sends the write, but a buffered read running at the same time can cache the old
/// bytes again before the write lands; the daemon drops them once more after storing the
/// write and before answering it, so a read that starts after the write returned sees it.
///
/// The kernel carries out an invalidation inside the daemon's write to /dev/fuse, and may
/// wait there for a page that an in-flight READ holds locked; that READ needs a free FUSE
/// thread. So invalidations run on a thread of their own, and a request waits for its own
/// at most `INVAL_WAIT`: even with every FUSE thread waiting, none waits for ever (past the
/// bound the request is answered and the invalidation still completes, a moment later).
/// The queue holds at most `INVAL_QUEUE` invalidations.
pub struct Invalidator {
    tx: std::sync::mpsc::SyncSender<(INodeNo, i64, i64, std::sync::mpsc::SyncSender<()>)>,
}

const INVAL_QUEUE: usize = 256;
const INVAL_WAIT: Duration = Duration::from_secs(1);

impl Invalidator {
    pub fn start(notifier: fuser::Notifier) -> Invalidator {
        let (tx, rx) =
            std::sync::mpsc::sync_channel::<(INodeNo, i64, i64, std::sync::mpsc::SyncSender<()>)>(
                INVAL_QUEUE,
            );
        std::thread::Builder::new()
            .name("ckptfs-inval".into())
            .spawn(move || {
                for (ino, off, len, done) in rx {
                    if let Err(e) = notifier.inval_inode(ino, off, len) {
                        log::warn!("invalidating cached pages of inode {}: {e}", ino.0);
                    }
                    let _ = done.try_send(());
                }
            })
            .expect("spawn the invalidation thread");
        Invalidator { tx }
    }

    /// Drops cached pages of `len` bytes from `off` (`len` 0: to the end of the file) and
    /// waits for it, at most `INVAL_WAIT`.
    fn pages(&self, ino: INodeNo, off: u64, len: u64) {
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
        let deadline = std::time::Instant::now() + INVAL_WAIT;
        let mut job = (ino, off as i64, len as i64, done_tx);
        loop {
            match self.tx.try_send(job) {
                Ok(()) => break,
                Err(std::sync::mpsc::TrySendError::Full(j)) => {
                    if std::time::Instant::now() >= deadline {
                        log::warn!("invalidation queue full; inode {} not invalidated", ino.0);
                        return;
                    }
                    job = j;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return,
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            log::warn!(
                "invalidating cached pages of inode {} took over {INVAL_WAIT:?}; answering \
                 the request, the invalidation completes in the background",
                ino.0
            );
        }
    }
}

/// Names other nodes removed, to be dropped from the kernel's cache
/// (FUSE_NOTIFY_INVAL_ENTRY) on a thread of their own: the kernel takes the parent
/// directory's lock for it, which a request in that directory may hold. At most
/// `DROP_QUEUE` names wait; past that a name is left to the kernel (it forgets under memory
/// pressure, and a lookup of the name finds it gone).
const DROP_QUEUE: usize = 4096;

pub fn entry_dropper(notifier: fuser::Notifier) -> ckptfs_fs::EntryInvalidator {
    let (tx, rx) = std::sync::mpsc::sync_channel::<(INodeNo, Vec<u8>)>(DROP_QUEUE);
    std::thread::Builder::new()
        .name("ckptfs-drop-names".into())
        .spawn(move || {
            for (parent, name) in rx {
                // ENOENT (not cached) is no error for fuser.
                if let Err(e) = notifier.inval_entry(parent, OsStr::from_bytes(&name)) {
                    log::debug!("dropping a removed name in directory {}: {e}", parent.0);
                }
            }
        })
        .expect("spawn the name-dropping thread");
    Box::new(move |parent: InodeId, name: &[u8]| {
        if tx.try_send((INodeNo(parent.0), name.to_vec())).is_err() {
            log::debug!(
                "name-dropping queue full; directory {} left as cached",
                parent.0
            );
        }
    })
}

/// The open handles that read through the kernel's page cache (all but write-only ones, see
/// `open_flags`), by inode: only while one is open can the cache hold pages a direct write
/// makes stale. With none open, nothing is cached that the next open would not drop (an
/// open without FOPEN_KEEP_CACHE drops the file's pages, and a mapping keeps its handle
/// open until munmap), so a direct write skips its invalidation: a hand-off to the
/// invalidation thread and back for every request, which on this kind of 2-core machine
/// cost a single writer of 1 MiB requests about 15% of its throughput.
#[derive(Default)]
struct CachedHandles {
    by_handle: HashMap<u64, u64>,
    by_inode: HashMap<u64, u32>,
}

impl CachedHandles {
    fn opened(&mut self, fh: FileHandle, ino: INodeNo) {
        if self.by_handle.insert(fh.0, ino.0).is_none() {
            *self.by_inode.entry(ino.0).or_default() += 1;
        }
    }

    fn released(&mut self, fh: FileHandle) {
        if let Some(ino) = self.by_handle.remove(&fh.0) {
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.by_inode.entry(ino) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    fn any(&self, ino: INodeNo) -> bool {
        self.by_inode.contains_key(&ino.0)
    }
}

pub struct CkptFs {
    fs: Arc<Fs>,
    /// Handles open on the page cache; a handle enters before its open is answered (the
    /// kernel drops the file's cached pages after that answer) and leaves at release.
    cached: Mutex<CachedHandles>,
    next_fh: AtomicU64,
    /// Answers of control xattrs per process: the kernel asks for the size first and then
    /// for the bytes, and both must see the same answer. At most `ANSWERS_MAX` kept.
    answers: Mutex<VecDeque<(u32, Vec<u8>)>>,
    /// The maintenance scheduler, stopped at unmount before the last sync (no gc or
    /// publication runs beside it).
    pub stop: std::sync::OnceLock<Arc<ckptfs_engine::maintenance::schedule::Wake>>,
    /// Tells the kernel to drop what it cached; set once the session exists.
    pub notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// Drops cached pages when data changes behind the page cache; set once the session
    /// exists.
    pub invalidator: Arc<std::sync::OnceLock<Invalidator>>,
    /// Whether to offer idmapped mounts to the kernel (the mount has allow_other; see `init`).
    pub allow_idmap: bool,
    /// A close-to-open mount of a multi-slot space (`--coherence close-to-open`): the
    /// kernel keeps names and attributes for `told::C2O_TTL`, and what it was told is kept
    /// here for opens to check (`stale_at_open`). None: strict (the kernel keeps nothing
    /// of a multi-slot space), or a single-slot space.
    pub told: Option<Mutex<crate::told::Told>>,
    /// The object-store tier's uploader, on a space that has one (set before the session
    /// starts): a close or fsync in `close` mode returns once the bucket holds it.
    pub remote: Arc<std::sync::OnceLock<Arc<ckptfs_remote::Uploader>>>,
    /// A read-only mount's reader of chunks held only by the bucket (no uploader): what
    /// `ckptfs remote` shows of it.
    pub fetcher: Arc<std::sync::OnceLock<Arc<ckptfs_remote::fetch::Fetcher>>>,
}

const ANSWERS_MAX: usize = 64;
/// Control op prefix for one page of a revision listing: `revisions-after-<id>`.
/// Revisions per page: about 120 bytes of JSON each, so a page stays far below the 64 KiB
/// an xattr value may have.
const REVISIONS_PAGE: usize = 256;
pub const CONTROL_PREFIX: &str = control::PREFIX;

impl CkptFs {
    pub fn new(fs: Arc<Fs>) -> Self {
        CkptFs {
            fs,
            cached: Mutex::new(CachedHandles::default()),
            next_fh: AtomicU64::new(1),
            answers: Mutex::new(VecDeque::new()),
            stop: Default::default(),
            notifier: Arc::new(std::sync::OnceLock::new()),
            allow_idmap: false,
            remote: Arc::default(),
            fetcher: Arc::default(),
            invalidator: Arc::new(std::sync::OnceLock::new()),
            told: None,
        }
    }

    fn answer(&self, pid: u32, v: Vec<u8>) {
        let mut a = self.answers.lock();
        a.retain(|(p, _)| *p != pid);
        if a.len() >= ANSWERS_MAX {
            a.pop_front();
        }
        a.push_back((pid, v));
    }

    fn take_answer(&self, pid: u32) -> Option<Vec<u8>> {
        self.answers
            .lock()
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, v)| v.clone())
    }

    /// gc, restore and config changes are for root and the user who owns the mount's root.
    fn may_control(&self, req: &Request) -> bool {
        let uid = requester(req).credentials().uid;
        uid == 0
            || self
                .fs
                .getattr(InodeId::ROOT)
                .is_ok_and(|a| a.rec.uid == uid)
    }

    /// Runs one control request (`control::Request`); returns the JSON answer. Requests
    /// that change the space or run its costly jobs are for root and the owner of the
    /// mount's root (`control::owner_only`), checked before the value is read.
    fn control(&self, req: &Request, name: &str, value: Option<&[u8]>) -> Result<Vec<u8>, Errno> {
        if control::owner_only(name, value.is_some()) && !self.may_control(req) {
            return Err(Errno::from_i32(libc::EPERM));
        }
        let r = control::Request::parse(name, value).map_err(|e| match e {
            control::Refused::Unknown => Errno::from_i32(libc::ENODATA),
            control::Refused::Invalid => Errno::from_i32(libc::EINVAL),
        })?;
        use control::Request as R;
        let to_json = |v: serde_json::Value| Ok(v.to_string().into_bytes());
        let fail_json = |op: &str, e: Error| fail(op, 1, e);
        match r {
            // The daemon's pid, for `ckptfs umount` to wait on (a read-only mount leaves no
            // note in the lock file).
            R::Pid => to_json(serde_json::json!(std::process::id())),
            // `ckptfs umount` first: commit every open file and make everything durable and
            // published, and say what could not be (a fenced slot, a failed disk), so the
            // unmount can report it rather than exit as if all were committed.
            R::Sync => to_json(match self.sync_all() {
                Ok(()) => serde_json::json!({"ok": true}),
                Err(e) => serde_json::json!({"ok": false, "error": e}),
            }),
            // Tests move the daemon's clock instead of sleeping (`engine::clock`): only a
            // daemon started with CKPTFS_TEST_CLOCK=1 takes it.
            R::Clock(secs) => {
                if !ckptfs_engine::face::clock::movable() {
                    return Err(Errno::from_i32(libc::EPERM));
                }
                ckptfs_engine::face::clock::advance(Duration::from_secs_f64(secs));
                to_json(serde_json::json!(
                    ckptfs_engine::face::clock::advanced().as_secs_f64()
                ))
            }
            R::Stats => {
                let mut s = self.fs.stats().map_err(|e| fail_json("stats", e))?;
                if self.fs.shares_namespace() {
                    s.commits.coherence = match self.told {
                        Some(_) => "close-to-open",
                        None => "strict",
                    }
                    .into();
                }
                let mut v = crate::stats_json(&s);
                if let Some(u) = self.remote.get() {
                    v["remote"] = serde_json::to_value(u.status()).unwrap_or_default();
                }
                to_json(v)
            }
            R::Remote | R::RemoteNudge => match self.remote.get() {
                Some(u) => {
                    if matches!(r, R::RemoteNudge) {
                        u.nudge();
                    }
                    to_json(serde_json::to_value(u.status()).unwrap_or_default())
                }
                // Read-only: nothing to upload (so `idle`, which ends an unmount's wait),
                // chunks fetched from the bucket.
                None => to_json(match self.fetcher.get() {
                    Some(f) => serde_json::json!({
                        "url": f.url(),
                        "read_only": true,
                        "state": "idle",
                        "fetch": f.stats(),
                    }),
                    None => serde_json::json!({"tier": false}),
                }),
            },
            R::RemoteCheck => match self.remote.get() {
                Some(u) => to_json(match u.check_and_heal() {
                    Ok(r) => serde_json::to_value(r).unwrap_or_default(),
                    Err(e) => serde_json::json!({"error": e.to_string()}),
                }),
                None => to_json(serde_json::json!({"tier": false})),
            },
            R::RemoteGc { dry_run } => match self.remote.get() {
                Some(u) => to_json(match u.gc(dry_run) {
                    Ok(r) => serde_json::to_value(r).unwrap_or_default(),
                    Err(e) => serde_json::json!({"error": e.to_string()}),
                }),
                None => to_json(serde_json::json!({"tier": false})),
            },
            R::Select(_)
            | R::SelectPiece { .. }
            | R::RevisionsAfter(_)
            | R::Cost
            | R::History
            | R::Restore(_) => self.control_revisions(req, r),
            r => self.control_maintenance(r),
        }
    }

    /// The control requests of maintenance and configuration (rebuild, scrub, caches,
    /// advice, redundancy, targets, config, gc, check).
    fn control_maintenance(&self, r: control::Request) -> Result<Vec<u8>, Errno> {
        use control::Request as R;
        let einval = || Errno::from_i32(libc::EINVAL);
        let to_json = |v: serde_json::Value| Ok(v.to_string().into_bytes());
        let fail_json = |op: &str, e: Error| fail(op, 1, e);
        let space = self.fs.space();
        let value =
            |v: Result<serde_json::Value, serde_json::Error>| to_json(v.unwrap_or_default());
        match r {
            R::Rebuild { replace, throttle } => {
                let replace = match replace {
                    Some((old, new)) => Some((
                        old,
                        ckptfs_engine::targets::TargetSpec::parse(&new).map_err(|_| einval())?,
                    )),
                    None => None,
                };
                let r = space
                    .rebuild(
                        replace.as_ref().map(|(o, n)| (o.as_str(), n)),
                        throttle,
                        &mut |_, _| {},
                    )
                    .map_err(|e| fail_json("rebuild", e.into()))?;
                value(serde_json::to_value(r))
            }
            R::Scrub { throttle } => {
                let r = space
                    .scrub(throttle, &mut |_, _| {})
                    .map_err(|e| fail_json("scrub", e.into()))?;
                value(serde_json::to_value(r))
            }
            // Forget the decoded chunks this daemon keeps, as /proc/sys/vm/drop_caches does
            // for the kernel's (the kernel drops a file's pages at each open): the next
            // reads go to the backing space. For cold-read measurements and tests.
            R::DropCaches => {
                space.data().drop_caches();
                // And what it knows of the other slots: read again now (a close-to-open
                // mount's lookups may use a read up to `told::LOOKUP_WINDOW` old).
                self.fs
                    .refresh_union()
                    .map_err(|e| fail_json("drop_caches", e))?;
                to_json(serde_json::json!({"ok": true}))
            }
            R::Advice => {
                let i = space
                    .report()
                    .advice_inputs()
                    .map_err(|e| fail_json("advice", e.into()))?;
                value(serde_json::to_value(i))
            }
            R::SetAdvice(c) => {
                space
                    .settings()
                    .set_advice_config(&c)
                    .map_err(|e| fail_json("advice", e.into()))?;
                value(serde_json::to_value(c))
            }
            R::Redundancy => {
                let r = space
                    .report()
                    .revision_redundancy()
                    .map_err(|e| fail_json("redundancy", e.into()))?;
                value(serde_json::to_value(r))
            }
            R::Targets => value(serde_json::to_value(space.report().targets_report())),
            R::Config => {
                let c = space
                    .settings()
                    .config()
                    .map_err(|e| fail_json("config", e.into()))?;
                to_json(crate::config_json(&c))
            }
            R::SetConfig(pairs) => {
                let mut c = space
                    .settings()
                    .config()
                    .map_err(|e| fail_json("config", e.into()))?;
                crate::apply_config(&mut c, &pairs).map_err(|_| einval())?;
                space
                    .settings()
                    .set_config(&c)
                    .map_err(|e| fail_json("config", e.into()))?;
                to_json(crate::config_json(&c))
            }
            R::Gc {
                dry_run,
                empty_trash,
            } => {
                let opts = ckptfs_engine::maintenance::gc::GcOptions {
                    dry_run,
                    empty_trash,
                    ..Default::default()
                };
                // What other nodes removed of this slot's files is reclaimable now.
                self.fs.ask_removals();
                let r = self
                    .fs
                    .gc_with(opts, &mut |_| {})
                    .map_err(|e| fail_json("gc", e))?;
                to_json(crate::gc_json(&r))
            }
            // Reads every chunk: as costly as gc, so for the same users.
            R::Check => {
                let r = self.fs.check().map_err(|e| fail_json("check", e))?;
                to_json(crate::check::check_json(
                    &r,
                    Some(crate::check::ANSWER_MAX_BYTES),
                ))
            }
            _ => Err(Errno::from_i32(libc::ENODATA)),
        }
    }

    /// A piece of a selection by gets (`control::Request::SelectPiece`), asked of file `ino`:
    /// the kernel passed it only because the caller may read that file. Pieces are kept
    /// per process; the last one selects the whole path if it names `ino` (else EACCES: the
    /// access proven is to another file).
    fn select_piece(&self, req: &Request, ino: INodeNo, name: &str) -> Result<(), Errno> {
        use control::Request as R;
        let Ok(R::SelectPiece { last, piece }) = control::Request::parse(name, None) else {
            return Err(Errno::from_i32(libc::EINVAL));
        };
        let pid = req.pid();
        let Some(path) = self.fs.select_piece(pid, &piece, last) else {
            return match last {
                true => Err(Errno::from_i32(libc::EINVAL)),
                false => Ok(()),
            };
        };
        match self.fs.names(&path, InodeId(ino.0)) {
            true => {
                self.fs.select(pid, path);
                Ok(())
            }
            false => Err(Errno::from_i32(libc::EACCES)),
        }
    }

    /// The control requests about one selected path's revisions (select, the revision
    /// listing's pages, cost, history, restore).
    fn control_revisions(&self, req: &Request, r: control::Request) -> Result<Vec<u8>, Errno> {
        use control::Request as R;
        let pid = req.pid();
        let einval = || Errno::from_i32(libc::EINVAL);
        let to_json = |v: serde_json::Value| Ok(v.to_string().into_bytes());
        let fail_json = |op: &str, e: Error| fail(op, 1, e);
        match r {
            R::Select(path) => {
                self.fs.select(pid, path);
                return Ok(Vec::new());
            }
            // Asked of the root, where everyone may get attributes: no proof of access to
            // any file (`getxattr` routes the ones asked of a file to `select_piece`).
            R::SelectPiece { .. } => return Err(Errno::from_i32(libc::EACCES)),
            _ => {}
        }
        let path = self.fs.selection(pid).ok_or_else(einval)?;
        match r {
            R::RevisionsAfter(after) => {
                // One page of the listing: revisions with ids above the one named, so a file
                // with any number of revisions is listed in answers that fit an xattr.
                let l = self
                    .fs
                    .revisions_of(&path)
                    .map_err(|e| fail_json("revisions", e))?;
                let page: Vec<_> = l
                    .into_iter()
                    .filter(|r| r.id > after)
                    .take(REVISIONS_PAGE + 1)
                    .collect();
                let more = page.len() > REVISIONS_PAGE;
                let page = &page[..page.len().min(REVISIONS_PAGE)];
                to_json(serde_json::json!({
                    "revisions": crate::revisions_json(page),
                    "more": more,
                }))
            }
            // `ckptfs report` of another slot's file (its revisions are that slot's).
            R::Cost => {
                let c = self
                    .fs
                    .published_cost(&path)
                    .map_err(|e| fail_json("report", e))?;
                to_json(match c {
                    Some((size, committed_unix, stored)) => serde_json::json!({
                        "size": size,
                        "committed_unix": committed_unix,
                        "stored": stored,
                    }),
                    None => serde_json::Value::Null,
                })
            }
            R::History => {
                let hid = self
                    .fs
                    .history_of(&path)
                    .map_err(|e| fail_json("history", e))?;
                to_json(serde_json::json!({ "history": hid }))
            }
            R::Restore(rev) => {
                let ino = self
                    .fs
                    .restore(&path, rev, owner_of_restored(req))
                    .map_err(|e| fail_json("restore", e))?;
                // The file's bytes changed behind the page cache of anyone reading it, and
                // a removed file restored changed its directory's listing, which the kernel
                // may keep (FOPEN_CACHE_DIR, `opendir`): both are dropped.
                if let Some(inv) = self.invalidator.get() {
                    inv.pages(INodeNo(ino.0), 0, 0);
                    if let Ok(Some(dir)) = self.fs.parent_dir(&path) {
                        inv.pages(INodeNo(dir.0), 0, 0);
                    }
                }
                Ok(Vec::new())
            }
            _ => Err(Errno::from_i32(libc::ENODATA)),
        }
    }

    /// The mode of `ino` changed behind a request (setid bits dropped by a write or an
    /// O_TRUNC open): no reply of this request carries the new mode, and until the cache
    /// expires stat and exec would see the old one, so the kernel drops its cached
    /// attributes.
    fn attrs_changed(&self, ino: INodeNo) {
        if let Some(n) = self.notifier.get() {
            // Offset -1: attributes only, no page-cache work (safe inside a request).
            if let Err(e) = n.inval_inode(ino, -1, 0) {
                log::warn!("invalidating inode {} attributes: {e}", ino.0);
            }
        }
    }

    /// How long the kernel may cache names and attributes: not at all when other nodes
    /// change the namespace too (a multi-slot space), unless the mount is close-to-open
    /// (`told`), else `TTL`.
    fn ttl(&self) -> Duration {
        match (self.fs.shares_namespace(), &self.told) {
            (true, None) => Duration::ZERO,
            (true, Some(_)) => crate::told::C2O_TTL,
            (false, _) => TTL,
        }
    }

    /// On a close-to-open mount: the kernel was told `a` as `name` in `parent`.
    fn tell_named(&self, parent: u64, name: &[u8], a: &FileAttr) {
        if let Some(t) = &self.told {
            t.lock().named(parent, name, a);
        }
    }

    /// On a close-to-open mount: the kernel was told attributes `a`.
    fn tell_attrs(&self, a: &FileAttr) {
        if let Some(t) = &self.told {
            t.lock().attrs(a);
        }
    }

    /// On a close-to-open mount: whether the open of `ino` must be answered ESTALE, so the
    /// kernel walks its path again asking for every name (the module doc of `told`). Reads
    /// what every node published first. Drops the kernel's attributes of `ino` where
    /// another node changed them since they were told.
    fn stale_at_open(&self, ino: INodeNo, append: bool) -> bool {
        let Some(told) = &self.told else {
            return false;
        };
        if ino == INodeNo::ROOT || ckptfs_fs::view::is_virtual(InodeId(ino.0)) {
            return false;
        }
        let chain = told.lock().chain(ino.0);
        let links: Vec<(InodeId, &[u8], InodeId)> = (chain.links.iter())
            .map(|(p, n, c)| (InodeId(*p), n.as_slice(), InodeId(*c)))
            .collect();
        let stale = match self.fs.open_check(InodeId(ino.0), &links) {
            Ok((bound, a)) => {
                let moved = chain.print != Some(crate::told::Print::of(&file_attr(&a)));
                if moved {
                    self.attrs_changed(ino);
                }
                // Never told (or forgotten): nothing says the kernel's name is current.
                !bound || chain.print.is_none() || (moved && append)
            }
            // Gone: the retry's lookup answers ENOENT.
            Err(Error::NotFound) => true,
            Err(_) => false,
        };
        told.lock().refuse(ino.0, stale)
    }

    /// A new file handle; fs tracks what each one may do and has done.
    fn fh(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    fn reply_entry(
        &self,
        r: Result<Attr, Error>,
        op: &str,
        (parent, name): (INodeNo, &OsStr),
        reply: ReplyEntry,
    ) {
        match r {
            Ok(a) => {
                let fa = file_attr(&a);
                self.tell_named(parent.0, name.as_bytes(), &fa);
                reply.entry(&self.ttl(), &fa, Generation(0))
            }
            Err(e) => reply.error(fail(op, parent.0, e)),
        }
    }

    /// Counts the kernel's new reference to a node this request made or linked (lookups
    /// count theirs in `Fs::lookup_entry`). A count that fails to be taken is logged and
    /// the entry still answered: the node exists, and the worst outcome is that gc removes
    /// it after an unlink while the kernel still holds it (ENOENT on a later open by
    /// number, as before references were counted).
    fn remember(&self, r: &Result<Attr, Error>, op: &str) {
        if let Ok(a) = r {
            self.remember_ino(a.ino, op);
        }
    }

    fn remember_ino(&self, ino: InodeId, op: &str) {
        if let Err(e) = self.fs.remember(ino) {
            log::warn!("{op}: inode {}: kernel reference not counted: {e}", ino.0);
        }
    }

    /// Answers getxattr/listxattr: the size for a probe (size 0), ERANGE when the caller's
    /// buffer is too small, else the bytes.
    fn reply_xattr(v: &[u8], size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(v.len() as u32);
        } else if (size as usize) < v.len() {
            reply.error(Errno::from_i32(libc::ERANGE));
        } else {
            reply.data(v);
        }
    }

    /// Commits every open file, makes the namespace durable and publishes what is left;
    /// the failures, said as one sentence.
    fn sync_all(&self) -> Result<(), String> {
        let mut failed = Vec::new();
        if let Err(e) = self.fs.commit_all() {
            failed.push(format!("committing open files failed: {e}"));
        }
        // Namespace changes are committed without an fsync of their own; make them durable
        // before the daemon goes away.
        if let Err(e) = self.fs.fsync_dir() {
            failed.push(format!("making metadata durable failed: {e}"));
        }
        if let Err(e) = self.fs.publish_pending() {
            failed.push(format!("publishing this slot's last changes failed: {e}"));
        }
        if let Some(why) = self.fs.space().slots().lease().and_then(|l| l.fenced()) {
            failed.push(format!("this mount lost its slot: {why}"));
        }
        match failed.is_empty() {
            true => Ok(()),
            false => Err(failed.join("; ")),
        }
    }

    /// In the tier's `close` mode, waits (at most `CLOSE_WAIT`) until the bucket holds what
    /// was just committed; else EIO (the bytes are durable locally; the upload goes on).
    fn remote_durable(&self, op: &str, ino: u64) -> Result<(), Error> {
        let Some(u) = self.remote.get() else {
            return Ok(());
        };
        if u.durability() != ckptfs_remote::Durability::Close {
            u.poke();
            return Ok(());
        }
        u.sync(ckptfs_remote::upload::CLOSE_WAIT).map_err(|e| {
            log::error!("{op} of inode {ino}: durable here, but not in the bucket: {e}");
            Error::Engine(ckptfs_engine::Error::Io(std::io::Error::other(
                e.to_string(),
            )))
        })
    }

    fn reply_empty(r: Result<(), Error>, op: &str, ino: INodeNo, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail(op, ino.0, e)),
        }
    }
}

impl Filesystem for CkptFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        let _ = config.set_max_readahead(MAX_WRITE_BYTES);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        // Listings carry each entry's attributes (`readdirplus`), so `ls -l` or a stat of
        // every file after a listing costs no lookup round trip per file (20,000 files: the
        // stats took 13x a plain directory's, one round trip each). Always, not the
        // kernel's AUTO mode, which uses them for a listing's first batch only unless
        // lookups came between batches: a program that lists a directory whole and then
        // stats it (`ls -l`, Python's os.listdir) got them for the first few hundred
        // entries. Not on a strict shared namespace, whose entries the kernel may not
        // cache; on a close-to-open one it keeps them as a single node's.
        if !self.fs.shares_namespace() || self.told.is_some() {
            let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        }
        // File handles (name_to_handle_at, NFS export) carry the inode number; `lookup` of
        // "." and ".." finds an inode again from it after the kernel forgot it.
        if config
            .add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT)
            .is_err()
        {
            log::info!("the kernel does not offer FUSE_EXPORT_SUPPORT: no open_by_handle_at");
        }
        // Idmapped mounts (mount_setattr MOUNT_ATTR_IDMAP, as container runtimes make them)
        // only with allow_other: once this is on, the kernel sends -1 as the caller's ids of
        // every request but a creation, and fuser's own access check of a mount without
        // allow_other would refuse those. The daemon reads what it needs from /proc instead
        // (`ckptfs_fs::creds`).
        if self.allow_idmap
            && config
                .add_capabilities(InitFlags::FUSE_ALLOW_IDMAP)
                .is_err()
        {
            log::info!("the kernel does not offer FUSE_ALLOW_IDMAP: no idmapped mounts");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(w) = self.stop.get() {
            w.stop();
        }
        match self.sync_all() {
            Ok(()) => log::info!("unmounted; everything closed is committed"),
            Err(e) => log::error!("unmounted, but NOT everything is committed: {e}"),
        }
        if let Some(u) = self.remote.get() {
            // `ckptfs umount` waited for the upload already (with progress); an unmount by a
            // signal or by fusermount gets a bounded last try.
            match u.sync(ckptfs_remote::upload::EXIT_WAIT) {
                Ok(()) => log::info!("the bucket holds everything committed here"),
                Err(e) => log::error!(
                    "unmounted, but the bucket does NOT hold everything committed here ({e}); \
                     the local space does: mount it again to finish the upload"
                ),
            }
            u.stop();
        }
    }

    /// The FUSE transport's CPU, as the `transport` stage (vendored fuser's hook): without
    /// it the stages left out about a sixth of the daemon's CPU (`ckptfs-bench steps`).
    fn received(&self, bytes: usize, cpu_ns: Option<u64>) {
        self.fs.space().stages().count_transport(bytes, cpu_ns);
        if cpu_ns.is_some() {
            // A sampled request: its dispatch is timed too (`dispatched`), so every stage
            // timing in it is measured, to tell the dispatch's own CPU from theirs.
            ckptfs_engine::write::pipeline::exact_span_begin();
        }
    }

    /// The `dispatch` stage: the FUSE threads' CPU outside `transport` and the stages timed
    /// in their requests. Without it the FUSE threads' CPU outside their stages (0.03-0.12
    /// CPU-s/GiB of a next step on a 16-core node, 10-16% of a cold read's on the 2-core VM)
    /// was in no stage.
    fn dispatched(&self, cpu_ns: Option<u64>) {
        // The span's stages counted at weight 1; the sample stands for `RECEIVE_SAMPLE`.
        let own = cpu_ns.map(|c| {
            c.saturating_sub(
                ckptfs_engine::write::pipeline::exact_span_end() * fuser::RECEIVE_SAMPLE,
            )
        });
        self.fs.space().stages().count_dispatch(own);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.fs.lookup_entry(InodeId(parent.0), name.as_bytes());
        match r {
            Err(Error::NotFound) => reply.error(Errno::ENOENT),
            r => self.reply_entry(r, "lookup", (parent, name), reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(InodeId(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(InodeId(ino.0)) {
            Ok(a) => {
                let fa = file_attr(&a);
                self.tell_attrs(&fa);
                reply.attr(&self.ttl(), &fa)
            }
            Err(e) => reply.error(fail("getattr", ino.0, e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
            ctime: ctime.map(Timestamp::from),
            fh: fh.map_or(HandleId::NONE, |h| HandleId(h.0)),
        };
        match self.fs.setattr_by(InodeId(ino.0), &s, &requester(req)) {
            Ok(a) => {
                let fa = file_attr(&a);
                self.tell_attrs(&fa);
                reply.attr(&self.ttl(), &fa)
            }
            Err(e) => reply.error(fail("setattr", ino.0, e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(InodeId(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(fail("readlink", ino.0, e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self
            .fs
            .mknod(InodeId(parent.0), name.as_bytes(), mode, rdev, caller(req));
        self.remember(&r, "mknod");
        self.reply_entry(r, "mknod", (parent, name), reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self
            .fs
            .mkdir(InodeId(parent.0), name.as_bytes(), mode, caller(req));
        self.remember(&r, "mkdir");
        self.reply_entry(r, "mkdir", (parent, name), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.fs.unlink(InodeId(parent.0), name.as_bytes());
        Self::reply_empty(r, "unlink", parent, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.fs.rmdir(InodeId(parent.0), name.as_bytes());
        Self::reply_empty(r, "rmdir", parent, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.fs.symlink(
            InodeId(parent.0),
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
            caller(req),
        );
        self.remember(&r, "symlink");
        self.reply_entry(r, "symlink", (parent, link_name), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let r = self.fs.rename(
            InodeId(parent.0),
            name.as_bytes(),
            InodeId(newparent.0),
            newname.as_bytes(),
            flags.contains(RenameFlags::RENAME_NOREPLACE),
            flags.contains(RenameFlags::RENAME_EXCHANGE),
        );
        Self::reply_empty(r, "rename", parent, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // Hard links are refused on purpose: a revision belongs to one path.
        let r = self.fs.link();
        self.remember(&r, "link");
        self.reply_entry(r, "link", (ino, newname), reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let w = writes(flags);
        if self.stale_at_open(ino, w && flags.0 & libc::O_APPEND != 0) {
            return reply.error(Errno::ESTALE);
        }
        let trunc = flags.0 & libc::O_TRUNC != 0 && w;
        let fh = self.fh();
        // O_TRUNC is done here (atomic_o_trunc), so the kernel's truncate, which would drop
        // the setid bits, never runs: `open_by` drops them (FUSE says nothing of the
        // opener's CAP_FSETID at open; fs looks it up).
        let r = self
            .fs
            .open_by(InodeId(ino.0), HandleId(fh.0), (w, trunc), &requester(req))
            .map(|changed| {
                if changed {
                    self.attrs_changed(ino);
                }
            });
        match r {
            // The advice file's text is made at open and may differ from the size the
            // kernel cached: read it with direct I/O, as /proc files are.
            Ok(()) if InodeId(ino.0) == ckptfs_fs::view::ADVICE => {
                reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO)
            }
            Ok(()) => {
                let how = open_flags(flags);
                if !how.contains(FopenFlags::FOPEN_DIRECT_IO) {
                    self.cached.lock().opened(fh, ino);
                }
                reply.opened(fh, how)
            }
            Err(e) => reply.error(fail("open", ino.0, e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        REPLY_BUF.with_borrow_mut(|buf| {
            let r = self.fs.read_reply(
                InodeId(ino.0),
                HandleId(fh.0),
                offset,
                size as usize,
                buf,
                true,
            );
            match r {
                Ok(ReadReply::Bytes) => {
                    let n = buf.len();
                    self.fs
                        .space()
                        .stages()
                        .reply_stage()
                        .time(n, || reply.data(buf))
                }
                Ok(ReadReply::Parts(parts)) => send_parts(self.fs.space(), &parts, buf, reply),
                Err(e) => reply.error(fail("read", ino.0, e)),
            }
            // Kept for the next reply up to the largest request the kernel sends, so a
            // FUSE thread holds at most one such buffer (`--threads` of them in all).
            if buf.capacity() > REPLY_BUF_MAX {
                *buf = Vec::new();
            }
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // Direct-I/O writes (write-only handles) carry the kernel's "writer lacks
        // CAP_FSETID" flag, and drop no file capabilities themselves: fs does both.
        let direct = matches!(flags.acc_mode(), OpenAccMode::O_WRONLY);
        let how = (
            write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID),
            direct,
        );
        let r = self.fs.write_by(
            (InodeId(ino.0), HandleId(fh.0)),
            &requester(req),
            how,
            offset,
            data,
            request_window(data),
        );
        match r.map(|(n, changed)| {
            if changed {
                self.attrs_changed(ino);
            }
            n
        }) {
            Ok(n) => {
                // A write-only handle is served with direct I/O (`open_flags`): its bytes
                // went past the page cache that other handles of the file read through, if
                // any is open (`CachedHandles`).
                if direct && self.cached.lock().any(ino) {
                    if let Some(inv) = self.invalidator.get() {
                        inv.pages(ino, offset, n as u64);
                    }
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(fail("write", ino.0, e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let r = self
            .fs
            .flush(InodeId(ino.0), HandleId(fh.0), req.pid())
            .and_then(|()| self.remote_durable("flush", ino.0));
        Self::reply_empty(r, "flush", ino, reply);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.cached.lock().released(fh);
        let r = self.fs.release(InodeId(ino.0), HandleId(fh.0));
        Self::reply_empty(r, "release", ino, reply);
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        let r = self
            .fs
            .fsync(InodeId(ino.0), HandleId(fh.0))
            .and_then(|()| self.remote_durable("fsync", ino.0));
        Self::reply_empty(r, "fsync", ino, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The kernel may keep a directory's listing (FOPEN_CACHE_DIR) where only this
        // daemon changes the namespace and every change comes through the kernel, which
        // drops the kept listing when it changes the directory or sees its mtime move.
        // Not for the revision view, whose listings change with commits, nor on a shared
        // namespace, whose other nodes change directories behind the kernel's back.
        let cache = !self.fs.shares_namespace() && !ckptfs_fs::view::is_virtual(InodeId(ino.0));
        let flags = match cache {
            true => FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            false => FopenFlags::empty(),
        };
        match self.fs.opendir(InodeId(ino.0)) {
            Ok(()) => reply.opened(FileHandle(0), flags),
            Err(e) => reply.error(fail("opendir", ino.0, e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut after = offset;
        loop {
            let items = match self.fs.readdir(InodeId(ino.0), after, READDIR_BATCH) {
                Ok(i) => i,
                Err(e) => return reply.error(fail("readdir", ino.0, e)),
            };
            if items.is_empty() {
                return reply.ok();
            }
            for it in &items {
                let name = OsStr::from_bytes(&it.name);
                if reply.add(INodeNo(it.ino.0), it.offset, kind(it.kind), name) {
                    return reply.ok();
                }
                after = it.offset;
            }
        }
    }

    /// `readdir` with each entry's attributes. The kernel links every entry but "." and
    /// "..", counting a lookup of it (later forgotten as a lookup's): counted here before
    /// the entry is added, and given back for the one that did not fit. An entry removed
    /// since the listing was read is left out.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let dir = InodeId(ino.0);
        let mut after = offset;
        // Entries added to this reply that the kernel will count as looked up: given back
        // if the reply turns into an error, as are a batch's entries not sent.
        let mut sent: Vec<InodeId> = Vec::new();
        let give_back =
            |rest: &mut dyn Iterator<Item = (ckptfs_fs::DirItem, Result<Attr, Error>)>| {
                for (it, found) in rest {
                    if let (false, Ok(a)) = (it.is_dots(), found) {
                        self.fs.forget(a.ino, 1);
                    }
                }
            };
        // About as many entries as fit (each at least a 152-byte header and a name padded
        // to 8): the batch reads each entry's record and holds it, so reading the full
        // READDIR_BATCH when 200 fit (a 32 KiB getdents) was 2.5x the work.
        let fit = (reply.max_size() / DIRENTPLUS_MIN + 1).clamp(8, READDIR_BATCH);
        loop {
            let items = match self.fs.readdir_plus(dir, after, fit) {
                Ok(i) => i,
                Err(e) => {
                    sent.iter().for_each(|i| self.fs.forget(*i, 1));
                    return reply.error(fail("readdirplus", ino.0, e));
                }
            };
            if items.is_empty() {
                return reply.ok();
            }
            let mut items = items.into_iter();
            while let Some((it, found)) = items.next() {
                let dots = it.is_dots();
                let a = match found {
                    Ok(a) => a,
                    Err(Error::NotFound | Error::Stale) => {
                        after = it.offset;
                        continue;
                    }
                    Err(e) => {
                        sent.iter().for_each(|i| self.fs.forget(*i, 1));
                        give_back(&mut items);
                        return reply.error(fail("readdirplus", ino.0, e));
                    }
                };
                let name = OsStr::from_bytes(&it.name);
                let attr = file_attr(&a);
                if !dots {
                    self.tell_named(ino.0, &it.name, &attr);
                }
                if reply.add(
                    INodeNo(a.ino.0),
                    it.offset,
                    name,
                    &self.ttl(),
                    &attr,
                    Generation(0),
                ) {
                    // Full: this entry is not sent either.
                    if !dots {
                        self.fs.forget(a.ino, 1);
                    }
                    give_back(&mut items);
                    return reply.ok();
                }
                if !dots {
                    sent.push(a.ino);
                }
                after = it.offset;
            }
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        Self::reply_empty(self.fs.fsync_dir(), "fsyncdir", ino, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let u = self.fs.usage();
        let blocks = |bytes: u64| bytes / BLOCK_BYTES as u64;
        // Inodes cost only metadata-table space, so report a large, fixed inode budget.
        let files = 1u64 << 32;
        reply.statfs(
            blocks(u.capacity),
            blocks(u.free),
            blocks(u.free),
            files,
            files,
            BLOCK_BYTES,
            ckptfs_fs::NAME_MAX as u32,
            BLOCK_BYTES,
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if ino != INodeNo::ROOT {
            if let Some(r) = name
                .to_str()
                .and_then(|n| n.strip_prefix(CONTROL_PREFIX))
                .filter(|n| {
                    n.starts_with(control::SELECT_PART) || n.starts_with(control::SELECT_LAST)
                })
            {
                return match self.select_piece(req, ino, r) {
                    Ok(()) => Self::reply_xattr(&[], size, reply),
                    Err(e) => reply.error(e),
                };
            }
        }
        let Some(op) = name
            .to_str()
            .and_then(|n| n.strip_prefix(CONTROL_PREFIX))
            .filter(|_| ino == INodeNo::ROOT)
        else {
            return match self.fs.getxattr(InodeId(ino.0), name.as_bytes()) {
                Ok(v) => Self::reply_xattr(&v, size, reply),
                Err(e) => reply.error(fail("getxattr", ino.0, e)),
            };
        };
        // A size probe computes the answer; the read that follows returns the same bytes.
        let answer = if size == 0 || op == "stats" || op == "config" {
            match self.control(req, op, None) {
                Ok(a) => a,
                Err(e) => return reply.error(e),
            }
        } else {
            match self.take_answer(req.pid()) {
                Some(a) => a,
                None => match self.control(req, op, None) {
                    Ok(a) => a,
                    Err(e) => return reply.error(e),
                },
            }
        };
        if size == 0 {
            self.answer(req.pid(), answer.clone());
        }
        Self::reply_xattr(&answer, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        // ext4 lists `trusted.` names only to a caller with CAP_SYS_ADMIN.
        let privileged = requester(req).credentials().has(creds::CAP_SYS_ADMIN);
        match self.fs.listxattr(InodeId(ino.0), privileged) {
            Ok(v) => Self::reply_xattr(&v, size, reply),
            Err(e) => reply.error(fail("listxattr", ino.0, e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let Some(op) = name
            .to_str()
            .and_then(|n| n.strip_prefix(CONTROL_PREFIX))
            .filter(|_| ino == INodeNo::ROOT)
        else {
            if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
                return reply.error(Errno::from_i32(libc::EINVAL));
            }
            let how = XattrSet {
                create: flags & libc::XATTR_CREATE != 0,
                replace: flags & libc::XATTR_REPLACE != 0,
            };
            let r = self
                .fs
                .setxattr(InodeId(ino.0), name.as_bytes(), value, how);
            return Self::reply_empty(r, "setxattr", ino, reply);
        };
        match self.control(req, op, Some(value)) {
            Ok(a) => {
                // The result of gc (and the others) is read back with getxattr of the same name.
                self.answer(req.pid(), a);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self.fs.fallocate(
            InodeId(ino.0),
            HandleId(fh.0),
            req.pid(),
            offset,
            length,
            mode,
        );
        Self::reply_empty(r, "fallocate", ino, reply);
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel passes at most a size_t and answers with a u32 count: larger requests
        // are copied in pieces by the caller's loop (cp, copy_file_range users retry).
        let len = len.min(u32::MAX as u64 & !0xfff);
        match self.fs.copy_range(
            InodeId(ino_in.0),
            HandleId(fh_in.0),
            offset_in,
            InodeId(ino_out.0),
            HandleId(fh_out.0),
            offset_out,
            len,
            req.pid(),
        ) {
            Ok(n) => {
                // The destination's bytes changed without passing its page cache.
                if let Some(inv) = self.invalidator.get() {
                    inv.pages(ino_out, offset_out, n);
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(fail("copy_file_range", ino_out.0, e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.fs.removexattr(InodeId(ino.0), name.as_bytes());
        Self::reply_empty(r, "removexattr", ino, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let w = writes(OpenFlags(flags));
        let fh = self.fh();
        match self.fs.create(
            InodeId(parent.0),
            name.as_bytes(),
            mode,
            caller(req),
            HandleId(fh.0),
            w,
            flags & libc::O_EXCL != 0,
            flags & libc::O_TRUNC != 0,
        ) {
            Ok(a) => {
                self.remember_ino(a.ino, "create");
                let how = open_flags(OpenFlags(flags));
                if !how.contains(FopenFlags::FOPEN_DIRECT_IO) {
                    self.cached.lock().opened(fh, INodeNo(a.ino.0));
                }
                let fa = file_attr(&a);
                self.tell_named(parent.0, name.as_bytes(), &fa);
                reply.created(&self.ttl(), &fa, Generation(0), fh, how)
            }
            Err(e) => reply.error(fail("create", parent.0, e)),
        }
    }
}

/// Writes below this size are copied rather than kept in their request buffer.
const KEEP_MIN_BYTES: usize = 512 << 10;

/// The bytes of a write as a window of the FUSE request buffer they arrived in, for the
/// engine to keep without copying them (`Fs::write_shared`): `None` where fuser has no
/// such buffer, or where the buffer may keep more than twice the write's bytes resident (a
/// small write read into a buffer that once held a large one), so that memory counted by
/// the bytes in flight stays within twice what it counts.
fn request_window(data: &[u8]) -> Option<ckptfs_engine::write::pipeline::SharedBytes> {
    // Small writes are copied: a kept buffer is a mapping of its own, and thousands of
    // files written 64 KiB at a time each holding one cost more memory (the 8192-file
    // test peaked past its 512 MiB bound) than their copies cost CPU.
    if data.len() < KEEP_MIN_BYTES {
        return None;
    }
    let buf = fuser::current_request_buffer()?;
    let (start, len) = buf.window_of(data)?;
    let resident = buf.resident();
    if len * 2 < resident {
        return None;
    }
    Some(ckptfs_engine::write::pipeline::SharedBytes::window(
        buf, start, len, resident,
    ))
}

/// Zeros for the holes of a vectored read reply, referenced as often as a hole needs.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Sends a read's bytes as they lie in the verified chunks (`ReadReply::Parts`): the kernel
/// gathers them in its copy of the reply, so they are not first copied into one buffer
/// (that copy was 8% of the daemon's CPU on a cold restart here, perf). A reply of more
/// pieces than one writev takes is assembled in `buf` instead. Timed as the `reply` stage.
fn send_parts(
    space: &ckptfs_engine::Space,
    parts: &[ReadPart],
    buf: &mut Vec<u8>,
    reply: ReplyData,
) {
    let n: usize = parts.iter().map(ReadPart::len).sum();
    space.stages().reply_stage().time(n, || {
        let mut iov: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
        for p in parts {
            match p {
                ReadPart::Chunk(c, r) => iov.push(std::io::IoSlice::new(&c[r.clone()])),
                ReadPart::Zeros(z) => {
                    let mut z = *z;
                    while z > 0 {
                        let k = z.min(ZEROS.len());
                        iov.push(std::io::IoSlice::new(&ZEROS[..k]));
                        z -= k;
                    }
                }
            }
        }
        if iov.len() <= fuser::MAX_REPLY_SLICES {
            return reply.data_vectored(&iov);
        }
        buf.clear();
        for s in &iov {
            buf.extend_from_slice(s);
        }
        reply.data(buf)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the daemon asks of the kernel for sequential readers (how the kernel then
    /// splits reads depends on load, so that is a figure of `tests/tests/read_ahead.rs`,
    /// not an assertion): background requests enough that 24 readers, each with two
    /// readahead windows of `MAX_WRITE_BYTES` in 1 MiB requests in flight, stay at or under
    /// the kernel's congestion mark (three quarters of `max_background`).
    #[test]
    fn the_mount_asks_for_enough_background_requests_for_24_readers() {
        let per_reader = 2 * (MAX_WRITE_BYTES as u64 >> 20);
        assert!(
            24 * per_reader <= MAX_BACKGROUND as u64 * 3 / 4,
            "{MAX_BACKGROUND}"
        );
    }

    /// The hint names the cap and the setting that lifts it, and says nothing where the
    /// cap is already at the daemon's request size or the kernel has no such setting.
    #[test]
    fn the_request_cap_hint_only_where_the_kernel_caps_under_the_request_size() {
        let hint = request_cap_hint(Some(256)).expect("256 pages is under 4 MiB");
        assert!(hint.contains("256 pages (1024 KiB"), "{hint}");
        assert!(hint.contains("fs.fuse.max_pages_limit=1024"), "{hint}");
        assert_eq!(request_cap_hint(Some(1024)), None);
        assert_eq!(request_cap_hint(Some(65535)), None);
        assert_eq!(request_cap_hint(None), None);
    }

    /// An inode counts as cached while any of its cached handles is open, whichever closes
    /// first; a second release of a handle, or one of a handle never entered (a write-only
    /// one), changes nothing.
    #[test]
    fn cached_handles_count_every_open_handle() {
        let mut c = CachedHandles::default();
        let (a, b) = (INodeNo(10), INodeNo(11));
        c.opened(FileHandle(1), a);
        c.opened(FileHandle(2), a);
        c.opened(FileHandle(3), b);
        c.opened(FileHandle(3), b);
        c.released(FileHandle(1));
        assert!(c.any(a), "one of two handles left");
        c.released(FileHandle(1));
        c.released(FileHandle(9));
        assert!(c.any(a), "a repeated or unknown release must not count");
        c.released(FileHandle(2));
        assert!(!c.any(a));
        assert!(c.any(b));
        c.released(FileHandle(3));
        assert!(!c.any(b), "a handle entered twice leaves once");
        assert!(c.by_handle.is_empty() && c.by_inode.is_empty());
    }
}
