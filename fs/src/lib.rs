//! Filesystem semantics over the engine: inodes, directories, open files, POSIX rules.
//! No FUSE types here; the `ckptfs` binary's adapter translates requests and errors.

use ckptfs_engine::face::RevisionPin;
use ckptfs_engine::face::{ExtentMap, FileState, ReadAhead};
use ckptfs_engine::face::{GcOptions, GcProgress, GcReport};
use ckptfs_engine::face::{HistoryId, InodeId, InodeRecord, NodeKind, RevisionId, Timestamp};
use ckptfs_engine::face::{Previous, Seal};
use ckptfs_engine::{Space, Stats};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Longest name in a directory, as reported by statfs.
pub const NAME_MAX: usize = 255;
/// Largest file size; writes or truncates beyond it fail with EFBIG.
pub const MAX_FILE_BYTES: u64 = 1 << 50;
/// Extended attribute on the root directory that returns `ckptfs stats` as JSON.
pub const STATS_XATTR: &str = "user.ckptfs.stats";
/// Control selections kept for processes that set one and have not read its answer.
const SELECTIONS_MAX: usize = 64;

pub mod creds;
pub mod shared;
pub use shared::EntryInvalidator;
pub mod view;
pub mod xattr;

pub use creds::{Credentials, Requester};

#[derive(Debug)]
pub enum Error {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    NameTooLong,
    /// The operation is refused on purpose (hard links, device and fifo nodes).
    NotPermitted,
    Invalid,
    FileTooBig,
    /// A change inside the read-only revision view.
    ReadOnly,
    /// The file is open for writing, so it cannot be restored under the writer.
    Busy,
    /// An operation ckptfs does not offer (fallocate's COLLAPSE_RANGE, INSERT_RANGE).
    NotSupported,
    /// A rename of another slot's entry (EXDEV: copy, then remove).
    CrossDevice,
    /// No such extended attribute (ENODATA).
    NoData,
    /// An extended-attribute name longer than 255 bytes (ERANGE).
    OutOfRange,
    /// An extended-attribute value larger than 64 KiB (E2BIG).
    ValueTooBig,
    /// A request names a file handle this daemon did not hand out or already released:
    /// a kernel/daemon disagreement that must never be answered as if nothing happened.
    BadHandle,
    /// The object was removed by another node after the kernel looked its name up
    /// (ESTALE: the kernel looks the path up again, and an O_CREAT open creates it).
    Stale,
    Engine(ckptfs_engine::Error),
}

impl From<ckptfs_engine::Error> for Error {
    fn from(e: ckptfs_engine::Error) -> Self {
        use ckptfs_engine::face::NsFault;
        match e {
            // A namespace operation's refusal is this layer's errno, not an engine failure.
            ckptfs_engine::Error::Namespace(f) => match f {
                NsFault::NotFound => Error::NotFound,
                NsFault::Exists => Error::Exists,
                NsFault::NotDir => Error::NotDir,
                NsFault::IsDir => Error::IsDir,
                NsFault::NotEmpty => Error::NotEmpty,
                NsFault::NoAttr => Error::NoData,
            },
            e => Error::Engine(e),
        }
    }
}

/// What the CLI prints and the daemon logs: a sentence, never a Rust debug dump.
impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Error::NotFound => "no such file or directory",
            Error::Exists => "the name exists already",
            Error::NotDir => "not a directory",
            Error::IsDir => "is a directory",
            Error::NotEmpty => "the directory is not empty",
            Error::NameTooLong => "the name is longer than 255 bytes",
            Error::NotPermitted => "ckptfs refuses this on purpose (hard links, for example)",
            Error::Invalid => "invalid argument",
            Error::FileTooBig => "the file would grow past the largest size ckptfs stores",
            Error::ReadOnly => "the revision view is read-only; use `ckptfs restore` instead",
            Error::Busy => "the file is open for writing; close it before restoring it",
            Error::NotSupported => "ckptfs does not offer this operation",
            Error::CrossDevice => {
                "another node's slot holds it (its chunks and revisions are kept there): copy \
                 it, or run this on that node"
            }
            Error::NoData => "no such extended attribute",
            Error::OutOfRange => "the extended attribute name is longer than 255 bytes",
            Error::ValueTooBig => "the extended attribute value is larger than 64 KiB",
            Error::BadHandle => "the kernel named a file handle this daemon does not know",
            Error::Stale => "another node removed the file after its name was looked up",
            Error::Engine(e) => return write!(f, "{e}"),
        })
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Attributes as the kernel sees them: the inode record with the live size of open files.
#[derive(Clone, Debug)]
pub struct Attr {
    pub ino: InodeId,
    pub rec: InodeRecord,
    /// Bytes of a regular file that are not holes (what st_blocks counts), when known;
    /// `None`: count the whole size (files being written, special nodes).
    pub data_bytes: Option<u64>,
}

impl Attr {
    fn new(ino: InodeId, rec: InodeRecord) -> Attr {
        Attr {
            ino,
            rec,
            data_bytes: None,
        }
    }
}

/// Entries kept in the data-bytes cache (see `Fs::data_bytes`); cleared whole when full.
const DATA_BYTES_CACHE_MAX: usize = 1 << 16;

/// The parts of setattr that are present in a request.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    pub ctime: Option<Timestamp>,
    /// The handle the request came through (ftruncate, futimens), or `HandleId::NONE`.
    pub fh: HandleId,
}

/// An open file handle, as the kernel names it in every request on it (chosen by the mount,
/// unique while open). `NONE` (0): an operation not made through a handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HandleId(pub u64);

impl HandleId {
    pub const NONE: HandleId = HandleId(0);
}

impl std::fmt::Display for HandleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The caller of an operation, for the owner of new nodes.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// A regular file with at least one open handle (or uncommitted writes), or an open
/// revision in the view.
struct OpenNode {
    rec: InodeRecord,
    file: FileState,
    /// The committed revision `file`'s unchanged extents come from, pinned: gc keeps it
    /// while the node lives.
    base: RevisionPin,
    opens: u32,
    writers: u32,
    /// The open handles of this file, by file handle.
    handles: HashMap<HandleId, Handle>,
    /// Its sequential readers' read-ahead (see `ReadAhead`).
    ahead: ReadAhead,
    /// A layer of a shared namespace's file opened with O_TRUNC: the truncate (stamp,
    /// length) that cuts the other layers, recorded with the next commit.
    clip: Option<(u64, u64)>,
    /// Counts the changes of this inode's extended attributes while it is open (`xattrs_changed`).
    xattr_epoch: u64,
    /// The `xattr_epoch` at which the file was seen to have no file capabilities: until
    /// the attributes change, a write has none to drop and reads nothing (`drop_file_caps`,
    /// one table read per write before: three per file of an untar).
    no_caps_at: Option<u64>,
}

/// What ckptfs tracks of one open file handle (one open file description).
#[derive(Default)]
struct Handle {
    writer: bool,
    /// Data was written through this handle since its last flush.
    wrote: bool,
    /// The process (thread) that wrote through it last.
    writer_pid: u32,
    /// Closed at least once (a FLUSH came): a handle that is done unless it writes again.
    flushed: bool,
    /// A revision this handle's close committed but could not seal (the close came from
    /// another process than the writer, e.g. a forked child's exec); sealed at release.
    pending: Option<RevisionId>,
}

impl OpenNode {
    fn attr(&self, ino: InodeId) -> Attr {
        let mut rec = self.rec.clone();
        rec.size = self.file.size();
        Attr::new(ino, rec)
    }
}

/// The open-file table: open nodes by inode and live handles by file handle, under one
/// lock (lock order: this table, then one node).
///
/// Invariants, relied on by every request that carries a handle:
/// - each live handle names the node it opened, and that node is `nodes[ino]` for as long
///   as the handle lives (a node counts its handles and internal references in `opens`, and
///   is only removed from `nodes` at `opens == 0`);
/// - a node is removed only after checking, under this lock, that `nodes[ino]` is that very
///   node (`Arc::ptr_eq`): a check made on an earlier lookup says nothing about a node an
///   OPEN made since.
#[derive(Default)]
struct OpenTable {
    nodes: HashMap<InodeId, Arc<Mutex<OpenNode>>>,
    handles: HashMap<HandleId, (InodeId, Arc<Mutex<OpenNode>>)>,
}

/// The open files, lent to the engine's memory sweeps (`Sweeper`).
impl ckptfs_engine::face::OpenFiles for Fs {
    fn each_open(
        &self,
        inos: Option<&[InodeId]>,
        f: &mut dyn FnMut(InodeId, Option<&mut FileState>),
    ) {
        let nodes: Vec<(InodeId, Arc<Mutex<OpenNode>>)> = {
            let open = self.open.lock();
            match inos {
                None => open.nodes.iter().map(|(i, n)| (*i, n.clone())).collect(),
                Some(inos) => inos
                    .iter()
                    .filter_map(|i| open.nodes.get(i).map(|n| (*i, n.clone())))
                    .collect(),
            }
        };
        for (ino, node) in nodes {
            match node.try_lock() {
                Some(mut n) => f(ino, Some(&mut n.file)),
                None => f(ino, None),
            }
        }
    }
}

impl OpenTable {
    /// Enters handle `fh` of `node` (the inode's node in `nodes`).
    fn add_handle(&mut self, fh: HandleId, ino: InodeId, node: &Arc<Mutex<OpenNode>>) {
        if self.handles.insert(fh, (ino, node.clone())).is_some() {
            // The adapter hands out each handle once; a reuse would misroute requests.
            panic!("file handle {fh} opened twice");
        }
    }
}

pub struct Fs {
    space: Space,
    /// Per-process selections for the control xattrs (see `select`), at most
    /// `SELECTIONS_MAX`, oldest dropped first.
    selections: Mutex<std::collections::VecDeque<(u32, Vec<u8>)>>,
    /// Per-process pieces of paths being selected in pieces (`select_piece`), bounded
    /// the same way.
    selection_parts: Mutex<std::collections::VecDeque<(u32, Vec<u8>)>>,
    /// Open regular files and revision files, and their handles (see `OpenTable`).
    open: Mutex<OpenTable>,
    /// Non-hole bytes by (inode, revision), at most `DATA_BYTES_CACHE_MAX` entries.
    data_bytes_cache: Mutex<HashMap<(InodeId, RevisionId), u64>>,
    /// gc without a person: under pressure, below the watermark, retention passes.
    auto_gc: ckptfs_engine::face::AutoGc,
    /// The maintenance scheduler's wake, once the mount started one (`set_maintenance`):
    /// a writer of a full space asks it to learn other nodes' removals now.
    maintenance: std::sync::OnceLock<Arc<ckptfs_engine::face::Wake>>,
    /// Of a slot of a multi-slot space: the shared namespace (`shared`).
    shared: Option<shared::Shared>,
    /// The text each open handle of `/.ckptfs/advice` read at open, so its reads agree with
    /// each other; one entry per open handle (bounded by the kernel's open files).
    advice_opens: Mutex<HashMap<HandleId, Arc<Vec<u8>>>>,
    /// Open files being read ahead now (`PrefetchStream`s alive).
    prefetch_streams: Arc<std::sync::atomic::AtomicUsize>,
    /// The memory sweeps over all open files (the engine's; this table lends the files).
    sweeper: ckptfs_engine::face::Sweeper,
}

/// One directory entry as readdir returns it.
#[derive(Clone, Debug)]
pub struct DirItem {
    /// The offset to resume after this entry.
    pub offset: u64,
    pub ino: InodeId,
    pub kind: NodeKind,
    pub name: Vec<u8>,
}

impl DirItem {
    /// `.` or `..`: entries the kernel does not count as looked up.
    pub fn is_dots(&self) -> bool {
        self.name == b"." || self.name == b".."
    }
}

/// What statfs reports, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct SpaceUsage {
    /// Whole segments of the data file.
    pub capacity: u64,
    /// Free segments and the rest of the current one, gc's reserve included: writers get
    /// the reserve's worth back as soon as gc compacts (which a full writer triggers), so
    /// this is both `df`'s free and its available.
    pub free: u64,
}

/// One revision of a path, as `ckptfs revisions` lists it.
#[derive(Clone, Debug)]
pub struct RevisionListing {
    pub id: u64,
    pub committed_unix: f64,
    pub size: u64,
    pub new_bytes: u64,
    pub current: bool,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(Error::Invalid);
    }
    Ok(())
}

pub(crate) fn new_record(
    kind: NodeKind,
    perm: u32,
    c: Caller,
    parent: InodeId,
    target: Vec<u8>,
) -> InodeRecord {
    let mut rec = InodeRecord::new(kind, perm, c.uid, c.gid);
    if kind == NodeKind::Dir {
        rec.parent = parent;
    }
    rec.size = target.len() as u64;
    rec.target = target;
    rec
}

impl Fs {
    pub fn new(space: Space) -> Self {
        let shared = space
            .slots()
            .is_shared()
            .then(|| shared::Shared::new(space.slot()));
        Fs {
            space,
            selections: Mutex::new(std::collections::VecDeque::new()),
            selection_parts: Mutex::new(std::collections::VecDeque::new()),
            open: Mutex::new(OpenTable::default()),
            auto_gc: Default::default(),
            maintenance: Default::default(),
            data_bytes_cache: Mutex::new(HashMap::new()),
            shared,
            advice_opens: Mutex::new(HashMap::new()),
            prefetch_streams: Arc::default(),
            sweeper: Default::default(),
        }
    }

    /// Sweeps the open files' memory every `every` bytes written, handing over their streams
    /// and dirty blocks past `held` bytes (`Sweeper::set_limits`). The open-table stress
    /// test sweeps on every write with it, racing the other threads.
    pub fn set_memory_sweep(&self, every: u64, held: usize) {
        self.sweeper.set_limits(every, held);
    }

    /// The mount's maintenance scheduler: writers of a full space ask it to learn other
    /// nodes' removals now (`ask_removals`). Without one (tests of `Fs` alone) nobody is
    /// asked and the retry goes on with what this node knows.
    pub fn set_maintenance(&self, wake: Arc<ckptfs_engine::face::Wake>) {
        let _ = self.maintenance.set(wake);
    }

    /// Whether other nodes change this namespace too (a slot of a multi-slot space): then
    /// the kernel must not cache names or attributes.
    pub fn shares_namespace(&self) -> bool {
        self.shared.is_some()
    }

    /// Sizes for statfs.
    pub fn usage(&self) -> SpaceUsage {
        SpaceUsage {
            capacity: self.space.data().capacity(),
            free: self.space.data().free_bytes(),
        }
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    /// (open nodes, live handles) in the open-file table: what tests and diagnostics check
    /// the table's bookkeeping with.
    pub fn open_counts(&self) -> (usize, usize) {
        let t = self.open.lock();
        (t.nodes.len(), t.handles.len())
    }

    fn open_node(&self, ino: InodeId) -> Option<Arc<Mutex<OpenNode>>> {
        self.open.lock().nodes.get(&ino).cloned()
    }

    /// The node handle `fh` opened. An unknown handle (or one of another inode) is an error
    /// the kernel and daemon must not paper over: logged, and EIO to the caller.
    fn handle_node(&self, ino: InodeId, fh: HandleId, op: &str) -> Result<Arc<Mutex<OpenNode>>> {
        match self.open.lock().handles.get(&fh) {
            Some((i, n)) if *i == ino => Ok(n.clone()),
            Some((i, _)) => {
                log::error!(
                    "{op} of inode {} names handle {fh}, which is open on inode {}",
                    ino.0,
                    i.0
                );
                Err(Error::BadHandle)
            }
            None => {
                log::error!(
                    "{op} of inode {} names handle {fh}, which is not open",
                    ino.0
                );
                Err(Error::BadHandle)
            }
        }
    }

    /// Drops one open reference to `node` (a handle's release or an internal reference) and
    /// forgets the node when nothing references it and nothing of it is left to commit.
    fn unref(&self, ino: InodeId, node: &Arc<Mutex<OpenNode>>, writer: bool) {
        {
            let mut n = node.lock();
            n.opens = n.opens.checked_sub(1).expect("open count underflow");
            if writer {
                n.writers = n.writers.checked_sub(1).expect("writer count underflow");
            }
        }
        self.forget_if_unused(ino, node);
    }

    /// Removes `node` from the table if it is still the inode's node and no handle or
    /// internal reference holds it. Its last release tried to commit it: what is still
    /// uncommitted then is a save whose close (or fsync) reported the failure (ENOSPC, EIO),
    /// so it was never acknowledged; it is discarded, and its pins with it, rather than kept
    /// in memory holding space that a full space needs back.
    fn forget_if_unused(&self, ino: InodeId, node: &Arc<Mutex<OpenNode>>) {
        let mut t = self.open.lock();
        if !t.nodes.get(&ino).is_some_and(|cur| Arc::ptr_eq(cur, node)) {
            return;
        }
        let n = node.lock();
        if n.opens == 0 {
            if n.file.is_modified() && n.rec.nlink > 0 {
                log::warn!(
                    "inode {}: discarding uncommitted changes whose commit failed and was \
                     reported; the file stays at its last committed revision",
                    ino.0
                );
            }
            // The node's file state goes with it, and with the state its chunk pins.
            drop(n);
            t.nodes.remove(&ino);
        }
    }

    fn record(&self, ino: InodeId) -> Result<InodeRecord> {
        self.space.ns().get_inode(ino)?.ok_or(Error::NotFound)
    }

    pub fn getattr(&self, ino: InodeId) -> Result<Attr> {
        self.getattr_at(ino, self.lookup_since())
    }

    /// `getattr` for a request that started at `t`: on a multi-slot space, as of a refresh
    /// of the other slots' records that started at `t` or later (one per request).
    fn getattr_at(&self, ino: InodeId, t: std::time::Instant) -> Result<Attr> {
        if view::is_virtual(ino) {
            return self.view_getattr(ino);
        }
        if self.shared.is_some() {
            return self.sh_getattr_at(ino, t);
        }
        self.local_getattr(ino)
    }

    /// getattr of this slot's inode `ino` (the only one of a single-slot space).
    fn local_getattr(&self, ino: InodeId) -> Result<Attr> {
        if let Some(n) = self.open_node(ino) {
            let n = n.lock();
            let mut a = n.attr(ino);
            // Unchanged since its base revision: the same extents, so the same answer.
            let base = n.base.revision();
            if n.file.is_clean() && base == n.rec.current_rev {
                a.data_bytes = Some(self.data_bytes(ino, base, || {
                    Ok(n.file.map().iter().map(|(_, e)| e.len as u64).sum())
                })?);
            }
            return Ok(a);
        }
        let rec = self.record(ino)?;
        let mut a = Attr::new(ino, rec);
        if a.rec.kind == NodeKind::File {
            let rev = a.rec.current_rev;
            a.data_bytes = Some(self.data_bytes(ino, rev, || {
                Ok(self
                    .space
                    .files()
                    .load_map(rev)?
                    .iter()
                    .map(|(_, e)| e.len as u64)
                    .sum())
            })?);
        }
        Ok(a)
    }

    /// Bytes of revision `rev` of `ino` that are not holes, computed once per revision (an
    /// extent-map read) and cached: `du` and hole-detecting tools read st_blocks.
    fn data_bytes(
        &self,
        ino: InodeId,
        rev: RevisionId,
        compute: impl FnOnce() -> Result<u64>,
    ) -> Result<u64> {
        if let Some(b) = self.data_bytes_cache.lock().get(&(ino, rev)) {
            return Ok(*b);
        }
        let b = compute()?;
        cache_data_bytes(&mut self.data_bytes_cache.lock(), (ino, rev), b);
        Ok(b)
    }

    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Attr> {
        match self.lookup_at(parent, name, self.lookup_since()) {
            Err(Error::NotFound) if self.has_lookup_window() => {
                self.lookup_at(parent, name, std::time::Instant::now())
            }
            r => r,
        }
    }

    /// `lookup` for a request that started at `t` (`getattr_at`).
    fn lookup_at(&self, parent: InodeId, name: &[u8], t: std::time::Instant) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        // The kernel looks up "." and ".." only to find an inode again by its number
        // (open_by_handle_at, an NFS export of the mount): inode numbers are never reused,
        // so the number alone names the inode, and a removed one answers ENOENT (ESTALE to
        // the caller).
        if name == b"." {
            // A removed file keeps its record for its revisions, but is gone as a file.
            return self.getattr_at(parent, t).and_then(|a| {
                if a.rec.nlink == 0 {
                    Err(Error::NotFound)
                } else {
                    Ok(a)
                }
            });
        }
        if name == b".." {
            return self.getattr_at(self.dir_parent(parent)?, t);
        }
        if view::is_virtual(parent) {
            return self.view_lookup(parent, name);
        }
        if parent == InodeId::ROOT && name == view::CTL_NAME {
            return self.view_getattr(view::CTL);
        }
        if self.shared.is_some() {
            return self.sh_lookup(parent, name, t);
        }
        let child = self
            .space
            .ns()
            .lookup(parent, name)?
            .ok_or(Error::NotFound)?;
        self.getattr(child)
    }

    /// `lookup` for the kernel: the inode found is counted as held by the kernel until it
    /// forgets it (`forget`), so gc keeps its record when a rename or unlink removes its
    /// last name while the kernel may still open or stat it by number.
    pub fn lookup_entry(&self, parent: InodeId, name: &[u8]) -> Result<Attr> {
        match self.lookup_entry_at(parent, name, self.lookup_since()) {
            // A name another node made just now is found at once (`set_lookup_window`).
            Err(Error::NotFound) if self.has_lookup_window() => {
                self.lookup_entry_at(parent, name, std::time::Instant::now())
            }
            r => r,
        }
    }

    /// `lookup_entry` for a request that started at `t` (`getattr_at`).
    fn lookup_entry_at(&self, parent: InodeId, name: &[u8], t: std::time::Instant) -> Result<Attr> {
        // A retry is needed only when gc removed the inode between this lookup's read of
        // the name and its count (the name was replaced or removed meanwhile); the next
        // read sees the change, so a second race needs another gc within the same window.
        for _ in 0..8 {
            let a = self.lookup_at(parent, name, t)?;
            if self.remember(a.ino)? {
                return Ok(a);
            }
            if self.shared.is_some() {
                // Another slot's object: its owner keeps or removes it; a removed one
                // answers ESTALE on use (`sh_open`), and the kernel looks the name up again.
                return Ok(a);
            }
        }
        Err(Error::Stale)
    }

    /// What an open of `ino` on a close-to-open mount checks (`ckptfs mount --coherence`):
    /// after reading what every node published, whether each `(parent, name, child)` the
    /// kernel walked still binds that child, and `ino`'s attributes now. A single-slot
    /// space changes only through this mount: nothing can have moved.
    pub fn open_check(
        &self,
        ino: InodeId,
        links: &[(InodeId, &[u8], InodeId)],
    ) -> Result<(bool, Attr)> {
        if self.shared.is_none() {
            return Ok((true, self.getattr(ino)?));
        }
        let t = std::time::Instant::now();
        self.refresh_since(t);
        let bound = links
            .iter()
            .all(|(p, n, c)| self.sh_binding(*p, n) == Some(*c));
        Ok((bound, self.getattr_at(ino, t)?))
    }

    /// Counts one kernel reference to `ino`, which the caller answers the kernel with (a
    /// lookup, create, mkdir, mknod, symlink or link). False when this slot has no record
    /// of it (removed by gc since it was found, or another slot's object).
    pub fn remember(&self, ino: InodeId) -> Result<bool> {
        if view::is_virtual(ino) || ino == InodeId::ROOT {
            return Ok(true);
        }
        Ok(self.space.pins().hold_inode(ino)?)
    }

    /// The kernel forgot `n` lookups of `ino` (FUSE FORGET, BATCH_FORGET).
    pub fn forget(&self, ino: InodeId, n: u64) {
        if !view::is_virtual(ino) {
            self.space.pins().forget_inode(ino, n);
        }
    }

    /// Updates the in-memory copy of an open inode after a namespace change to its record.
    fn refresh_open(&self, ino: InodeId, f: impl FnOnce(&mut InodeRecord)) {
        if let Some(n) = self.open_node(ino) {
            f(&mut n.lock().rec);
        }
    }

    fn make_node(&self, parent: InodeId, name: &[u8], rec: InodeRecord) -> Result<Attr> {
        self.make_node_as(parent, name, rec, false)
    }

    /// `make_node`; `opened`: a regular file the caller opens at once (O_CREAT), whose
    /// create rides in the next transaction, usually its close's commit, instead of one
    /// of its own (`Namespace::create_file`).
    fn make_node_as(
        &self,
        parent: InodeId,
        name: &[u8],
        rec: InodeRecord,
        opened: bool,
    ) -> Result<Attr> {
        check_name(name)?;
        if self.shared.is_some() {
            return self.sh_make(parent, name, rec, false).map(|(a, _)| a);
        }
        self.writable(parent)?;
        if parent == InodeId::ROOT && name == view::CTL_NAME {
            return Err(Error::Exists);
        }
        // The parent's group and setgid bit pass on as BSD semantics say (`create_node`).
        let (ino, rec) = match opened {
            true => self.space.ns().create_file(parent, name, rec)?,
            false => self.space.ns().create(parent, name, rec)?,
        };
        Ok(Attr::new(ino, rec))
    }

    pub fn mkdir(&self, parent: InodeId, name: &[u8], perm: u32, c: Caller) -> Result<Attr> {
        self.make_node(
            parent,
            name,
            new_record(NodeKind::Dir, perm, c, parent, Vec::new()),
        )
    }

    pub fn symlink(&self, parent: InodeId, name: &[u8], target: &[u8], c: Caller) -> Result<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(if target.is_empty() {
                Error::NotFound
            } else {
                Error::NameTooLong
            });
        }
        self.make_node(
            parent,
            name,
            new_record(NodeKind::Symlink, 0o777, c, parent, target.to_vec()),
        )
    }

    pub fn readlink(&self, ino: InodeId) -> Result<Vec<u8>> {
        if view::is_virtual(ino) {
            return Err(Error::Invalid);
        }
        if self.shared.is_some() {
            return self.sh_readlink(ino);
        }
        let rec = self.record(ino)?;
        if rec.kind != NodeKind::Symlink {
            return Err(Error::Invalid);
        }
        Ok(rec.target)
    }

    /// Creates a regular file and opens it; `write` says whether the handle may write,
    /// `exclusive` is O_EXCL: without it, a file another node made since this one looked
    /// the name up is opened instead (O_CREAT opens an existing file), truncated with
    /// `truncate`.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        c: Caller,
        fh: HandleId,
        write: bool,
        exclusive: bool,
        truncate: bool,
    ) -> Result<Attr> {
        let rec = new_record(NodeKind::File, perm, c, parent, Vec::new());
        if self.shared.is_some() {
            check_name(name)?;
            let (attr, made) = self.sh_make(parent, name, rec, !exclusive)?;
            self.open(attr.ino, fh, write, truncate && !made)?;
            return match made {
                true => Ok(attr),
                false => self.getattr(attr.ino),
            };
        }
        let attr = self.make_node_as(parent, name, rec, true)?;
        self.open(attr.ino, fh, write, false)?;
        Ok(attr)
    }

    /// mknod: regular files and special nodes (fifo, socket, device); for special nodes only
    /// the inode is stored, the kernel implements what they do.
    pub fn mknod(
        &self,
        parent: InodeId,
        name: &[u8],
        mode: u32,
        rdev: u32,
        c: Caller,
    ) -> Result<Attr> {
        let kind = match mode & libc::S_IFMT {
            0 | libc::S_IFREG => NodeKind::File,
            libc::S_IFIFO => NodeKind::Fifo,
            libc::S_IFSOCK => NodeKind::Socket,
            libc::S_IFCHR => NodeKind::CharDevice,
            libc::S_IFBLK => NodeKind::BlockDevice,
            _ => return Err(Error::Invalid),
        };
        let mut rec = new_record(kind, mode, c, parent, Vec::new());
        if matches!(kind, NodeKind::CharDevice | NodeKind::BlockDevice) {
            rec.rdev = rdev;
        }
        self.make_node(parent, name, rec)
    }

    pub fn unlink(&self, parent: InodeId, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: InodeId, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: InodeId, name: &[u8], dir: bool) -> Result<()> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if self.shared.is_some() {
            return self.sh_remove(parent, name, dir);
        }
        self.writable(parent)?;
        // The view is not in the directory table; without this its name would be ENOENT.
        if parent == InodeId::ROOT && name == view::CTL_NAME {
            return Err(Error::ReadOnly);
        }
        let now = Timestamp::now();
        // Unlinked inodes stay in the table with nlink 0: open handles keep reading them,
        // and a file's revisions stay restorable until gc's retention drops them.
        let (child, rec) = self.space.ns().remove(parent, name, dir, now)?;
        self.unlinked(child, &rec);
        Ok(())
    }

    /// After `ino` was unlinked (its record now `rec`): the open copy of its record follows,
    /// and a file nobody has open is forgotten (`drop_if_unused`).
    pub(crate) fn unlinked(&self, ino: InodeId, rec: &InodeRecord) {
        self.refresh_open(ino, |r| {
            r.adopt_namespace(rec);
            r.ctime = rec.ctime;
        });
        if rec.kind == NodeKind::File {
            self.drop_if_unused(ino);
        }
    }

    /// Forgets the in-memory state of an unlinked file no handle has open: writes a failed
    /// commit left behind (a full space) can never be read again, and their pinned chunks
    /// must not keep gc from reclaiming the space they took.
    fn drop_if_unused(&self, ino: InodeId) {
        if let Some(node) = self.open_node(ino) {
            self.forget_if_unused(ino, &node);
        }
    }

    pub fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        if self.shared.is_some() {
            return self.sh_rename(parent, name, new_parent, new_name, noreplace, exchange);
        }
        check_name(new_name)?;
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        self.writable(parent)?;
        self.writable(new_parent)?;
        let reserved = |dir: InodeId, n: &[u8]| dir == InodeId::ROOT && n == view::CTL_NAME;
        if reserved(parent, name) || reserved(new_parent, new_name) {
            return Err(Error::ReadOnly);
        }
        let now = Timestamp::now();
        let how = ckptfs_engine::face::RenameHow {
            noreplace,
            exchange,
        };
        let touched = self
            .space
            .ns()
            .rename((parent, name), (new_parent, new_name), how, now)?;
        for (ino, rec) in touched {
            self.refresh_open(ino, |r| {
                r.adopt_namespace(&rec);
                r.ctime = rec.ctime;
            });
        }
        Ok(())
    }

    /// Sticky failure: after a failed backing write or sync nothing may change a file.
    fn refuse_if_failed(&self) -> Result<()> {
        if self.space.data().is_failed() {
            return Err(Error::Engine(ckptfs_engine::Error::Failed));
        }
        Ok(())
    }

    pub fn link(&self) -> Result<Attr> {
        Err(Error::NotPermitted)
    }

    pub fn setattr(&self, ino: InodeId, s: &SetAttr) -> Result<Attr> {
        self.writable(ino)?;
        self.refuse_if_failed()?;
        if let Some(size) = s.size {
            if size > MAX_FILE_BYTES {
                return Err(Error::FileTooBig);
            }
        }
        let now = Timestamp::now();
        let apply = |r: &mut InodeRecord| {
            if let Some(p) = s.perm {
                r.perm = p & 0o7777;
            }
            if let Some(u) = s.uid {
                r.uid = u;
            }
            if let Some(g) = s.gid {
                r.gid = g;
            }
            if let Some(t) = s.atime {
                r.atime = t;
            }
            if let Some(t) = s.mtime {
                r.mtime = t;
            }
            r.ctime = s.ctime.unwrap_or(now);
        };
        if let Some(size) = s.size {
            let rec = self.record(ino)?;
            match rec.kind {
                NodeKind::File => return self.truncate(ino, size, s.mtime.is_none(), &apply),
                NodeKind::Dir => return Err(Error::IsDir),
                // truncate(2) of a fifo or device node is accepted and does nothing.
                _ => {}
            }
        }
        // Attributes only, of a file open for writing on a space no other node reads: the
        // open copy changes now and the engine holds the change for the next transaction,
        // usually this file's own close (an untar's chown, chmod and utimens of each file
        // were three transactions before its close's). Reads go to the open copy while the
        // file is open, and through the engine's overlay after.
        if self.shared.is_none() {
            if let Some(node) = self.open_node(ino) {
                let mut n = node.lock();
                if n.writers > 0 {
                    let mut rec = n.rec.clone();
                    apply(&mut rec);
                    self.space.ns().hold_attrs(ino, &rec)?;
                    n.rec = rec;
                    return Ok(n.attr(ino));
                }
            }
        }
        // Otherwise change the stored record in place (its namespace fields, history and
        // revision belong to other transactions), and the open copy alike.
        let rec = self.space.ns().update_inode(ino, |r| apply(r))?;
        self.refresh_open(ino, |r| apply(r));
        if let Some(n) = self.open_node(ino) {
            return Ok(n.lock().attr(ino));
        }
        Ok(Attr::new(ino, rec))
    }

    /// truncate(2)/ftruncate(2) of a regular file, through its open node (made for the call
    /// if no handle has the file open), so it is ordered with every open, write and commit
    /// of the file. With no other writer the new size is committed at once, as a complete
    /// revision: no close will follow a truncate(2).
    fn truncate(
        &self,
        ino: InodeId,
        size: u64,
        touch_mtime: bool,
        apply: &dyn Fn(&mut InodeRecord),
    ) -> Result<Attr> {
        let node = self.open_ref(ino, None, true, false)?;
        let result = (|| {
            let mut n = node.lock();
            n.file.truncate(size);
            if touch_mtime {
                n.rec.mtime = Timestamp::now();
            }
            apply(&mut n.rec);
            if n.writers == 1 {
                self.commit_node(ino, &mut n, Seal::Complete, HandleId::NONE)?;
            } else {
                // A writer's close commits the size; the attributes are stored now.
                let mtime = n.rec.mtime;
                self.space.ns().update_inode(ino, |stored| {
                    apply(stored);
                    stored.mtime = mtime;
                })?;
            }
            Ok(n.attr(ino))
        })();
        self.unref(ino, &node, true);
        result
    }

    /// A write or truncate by `who`: clears the setid bits as ext4 does, unless `who` holds
    /// CAP_FSETID. S_ISUID always; S_ISGID when group-execute is set, or when the
    /// writer is not in the file's group (without group-execute the bit marks mandatory
    /// locking, which a group member's write keeps). A world-writable setuid file must not
    /// stay setuid after someone else wrote it.
    /// Returns whether the mode changed: the caller must then drop the kernel's cached
    /// attributes, which still show the bits (and exec would honour them).
    pub(crate) fn kill_setid(&self, ino: InodeId, who: &Requester) -> Result<bool> {
        // The revision view is read-only: its open refuses the write that brought us here.
        if view::is_virtual(ino) {
            return Ok(false);
        }
        let merged = self.shared.is_some() && !self.local_only(ino);
        let (perm, _, gid) = match merged {
            // An object other slots have versions of: its attributes as every node sees them.
            true => {
                let a = self.getattr(ino)?;
                (a.rec.perm, a.rec.uid, a.rec.gid)
            }
            false => self.mode_and_owner(ino)?,
        };
        if perm & (libc::S_ISUID | libc::S_ISGID) == 0 {
            return Ok(false);
        }
        let who = who.credentials();
        if who.has(creds::CAP_FSETID) {
            return Ok(false);
        }
        let mut cleared = perm & !libc::S_ISUID;
        if perm & libc::S_ISGID != 0 && (perm & libc::S_IXGRP != 0 || !who.in_group(gid)) {
            cleared &= !libc::S_ISGID;
        }
        if cleared == perm {
            return Ok(false);
        }
        log::debug!(
            "inode {}: mode {perm:o} -> {cleared:o} (written by uid {} without CAP_FSETID)",
            ino.0,
            who.uid
        );
        let s = SetAttr {
            perm: Some(cleared),
            ..SetAttr::default()
        };
        match merged {
            true => self.sh_setattr(ino, &s)?,
            false => self.setattr(ino, &s)?,
        };
        Ok(true)
    }

    /// (mode, uid, gid) as they are now: the open copy's if the file is open. Cheaper than
    /// `getattr`, which may read the extent map for st_blocks.
    fn mode_and_owner(&self, ino: InodeId) -> Result<(u32, u32, u32)> {
        Ok(match self.open_node(ino) {
            Some(n) => {
                let n = n.lock();
                (n.rec.perm, n.rec.uid, n.rec.gid)
            }
            None => {
                let r = self.record(ino)?;
                (r.perm, r.uid, r.gid)
            }
        })
    }

    /// setattr as requested by `who`. Two cases carry the setid rule of `kill_setid`: a size
    /// change by a caller without CAP_FSETID, and the kernel dropping the bits for a write
    /// through the page cache or an mmap. The kernel sends that drop as a mode-only change
    /// with FUSE's narrower S_ISGID rule; ext4's rule is applied instead. It is told from a
    /// chmod by its shape (the current mode less S_ISUID, and less S_ISGID when
    /// group-execute is set) together with a caller that could not have chmodded: neither
    /// the owner nor holding CAP_FOWNER, as default_permissions checks. The shape matters
    /// under an idmapped mount, where the owner as the kernel compared it is not visible
    /// here: a real chmod by such an owner goes through unchanged.
    pub fn setattr_by(&self, ino: InodeId, s: &SetAttr, who: &Requester) -> Result<Attr> {
        if self.shared.is_some() && !view::is_virtual(ino) {
            // Whether other nodes have versions of it now: a truncate of a file another
            // node wrote since this one last looked must cut that node's layer too.
            self.refresh_since(std::time::Instant::now());
        }
        if self.shared.is_some() && !view::is_virtual(ino) && !self.local_only(ino) {
            // An object other slots have versions of: this slot's version takes the change.
            return self.sh_setattr(ino, s);
        }
        let mode_only = s.perm.is_some()
            && s.uid.is_none()
            && s.gid.is_none()
            && s.size.is_none()
            && s.atime.is_none()
            && s.mtime.is_none();
        if mode_only && !view::is_virtual(ino) {
            let (perm, uid, _) = self.mode_and_owner(ino)?;
            let mut dropped = perm & !libc::S_ISUID;
            if perm & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
                dropped &= !libc::S_ISGID;
            }
            if dropped != perm && s.perm == Some(dropped) {
                let c = who.credentials();
                if uid != c.uid && !c.has(creds::CAP_FOWNER) {
                    self.kill_setid(ino, who)?;
                    return self.getattr(ino);
                }
            }
        }
        let a = self.setattr(ino, s)?;
        if self.shared.is_some() {
            // This slot's object alone: its version record says when its attributes or
            // times changed, for the merge on every node.
            let stamp = self.space.slots().stamp();
            let attrs = s.perm.is_some() || s.uid.is_some() || s.gid.is_some();
            let times = s.atime.is_some() || s.mtime.is_some();
            // The namespace stamp moves even when the object has no version record here.
            self.space.ns().update_version(
                ino,
                true,
                |m| {
                    if attrs {
                        m.attr_stamp = stamp;
                    }
                    if times {
                        m.times_stamp = stamp;
                    }
                    if let Some(size) = s.size {
                        m.clip_stamp = stamp;
                        m.clip_len = size;
                    }
                },
                |_| Some(stamp),
            )?;
            self.sh_touch(&[ino]);
            self.publish_pending()?;
        }
        if s.size.is_some() && a.rec.kind == NodeKind::File {
            self.kill_setid(ino, who)?;
            return self.getattr(ino);
        }
        Ok(a)
    }

    /// open(2) by `who`. An O_TRUNC open (`truncate`) is a truncate, which POSIX says drops
    /// the setid bits (unless `who` holds CAP_FSETID: see `kill_setid`) and the kernel
    /// drops file capabilities on: done here, first, since the daemon truncates at open
    /// (`atomic_o_trunc`) and the kernel's own truncate never runs. Returns whether the
    /// file's mode changed (the kernel's cached attributes are stale then).
    pub fn open_by(
        &self,
        ino: InodeId,
        fh: HandleId,
        (write, truncate): (bool, bool),
        who: &Requester,
    ) -> Result<bool> {
        let mut changed = false;
        if truncate {
            changed = self.kill_setid(ino, who)?;
            self.drop_file_caps(ino)?;
        }
        self.open(ino, fh, write, truncate)?;
        Ok(changed)
    }

    /// A write by `who` (`write_shared`), with what POSIX says a write drops first: the
    /// setid bits when the kernel says the writer lacks CAP_FSETID and did not drop them
    /// itself (`kill_setid`: direct-I/O writes; page-cache writes had them dropped by the
    /// kernel), and file capabilities, which any write removes, when the write bypassed
    /// the page cache (`direct`). Returns the bytes written and whether the mode changed.
    pub fn write_by(
        &self,
        (ino, fh): (InodeId, HandleId),
        who: &Requester,
        (kill_setid, direct): (bool, bool),
        off: u64,
        data: &[u8],
        shared: Option<ckptfs_engine::face::SharedBytes>,
    ) -> Result<(usize, bool)> {
        let changed = match kill_setid {
            true => self.kill_setid(ino, who)?,
            false => false,
        };
        if direct {
            self.drop_file_caps(ino)?;
        }
        let n = self.write_shared(ino, fh, who.pid(), off, data, shared)?;
        Ok((n, changed))
    }

    /// Opens a regular file (or a revision file of the view) under handle `fh`, which the
    /// caller chose and must not reuse until its release; `truncate` for O_TRUNC.
    pub fn open(&self, ino: InodeId, fh: HandleId, write: bool, truncate: bool) -> Result<()> {
        if fh == HandleId::NONE {
            // 0 is no handle at all (FUSE's opendir answer); a release could not name it.
            return Err(Error::Invalid);
        }
        if view::is_virtual(ino) {
            return self.open_view(ino, fh, write);
        }
        if self.shared.is_some() {
            return self.sh_open(ino, fh, write, truncate);
        }
        self.open_ref(ino, Some(fh), write, truncate).map(drop)
    }

    /// The inode a request on handle `fh` acts on: for a handle `sh_open` opened on this
    /// slot's layer of a file (the kernel names the object it looked up), that layer.
    fn via_handle(&self, ino: InodeId, fh: HandleId) -> InodeId {
        if self.shared.is_some() {
            if let Some((i, _)) = self.open.lock().handles.get(&fh) {
                return *i;
            }
        }
        ino
    }

    /// Finds or makes the open node of `ino` and takes one reference to it: handle `fh`'s,
    /// or an internal one (`None`: truncate(2), restore) dropped with `unref`.
    fn open_ref(
        &self,
        ino: InodeId,
        fh: Option<HandleId>,
        write: bool,
        truncate: bool,
    ) -> Result<Arc<Mutex<OpenNode>>> {
        // Sticky failure: refuse to open for writing at all, so an O_TRUNC cannot empty the
        // in-memory view of a committed file that nothing can be saved over any more.
        if write {
            // Read-only space: EROFS at open, as a read-only filesystem answers, also after
            // a `mount -o remount,rw` the kernel allows but this daemon cannot honour.
            if self.space.is_read_only() {
                return Err(ckptfs_engine::Error::ReadOnly.into());
            }
            self.refuse_if_failed()?;
        }
        // The node is found or made, its count raised and the handle entered, all under the
        // table lock: a release removes a node only under the same lock, at `opens == 0`.
        let mut t = self.open.lock();
        let node = match t.nodes.get(&ino) {
            Some(n) => n.clone(),
            None => {
                let rec = self.record(ino)?;
                match rec.kind {
                    NodeKind::File => {}
                    NodeKind::Dir => return Err(Error::IsDir),
                    NodeKind::Symlink
                    | NodeKind::Fifo
                    | NodeKind::Socket
                    | NodeKind::CharDevice
                    | NodeKind::BlockDevice => return Err(Error::Invalid),
                }
                // Pin the base revision under the gate, re-reading the record there, so the
                // pinned revision is the one loaded.
                let (base, (rec, file)) = self.space.pins().pin(Some(ino), || {
                    let rec = self.record(ino)?;
                    let file = self.space.files().load_file(&rec)?;
                    Ok::<_, Error>((rec.current_rev, (rec, file)))
                })?;
                let n = Arc::new(Mutex::new(OpenNode {
                    base,
                    rec,
                    file,
                    opens: 0,
                    writers: 0,
                    handles: HashMap::new(),
                    ahead: ReadAhead::default(),
                    clip: None,
                    xattr_epoch: 0,
                    no_caps_at: None,
                }));
                t.nodes.insert(ino, n.clone());
                n
            }
        };
        if let Some(fh) = fh {
            t.add_handle(fh, ino, &node);
        }
        let mut n = node.lock();
        drop(t);
        n.opens += 1;
        if write {
            n.writers += 1;
        }
        if let Some(fh) = fh {
            n.handles.insert(
                fh,
                Handle {
                    writer: write,
                    ..Handle::default()
                },
            );
        }
        if truncate && n.file.size() != 0 {
            n.file.truncate(0);
            let now = Timestamp::now();
            n.rec.mtime = now;
            n.rec.ctime = now;
        }
        drop(n);
        Ok(node)
    }

    /// Up to `len` bytes of the file at `off`.
    pub fn read(&self, ino: InodeId, fh: HandleId, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_to(ino, fh, off, len, &mut out)?;
        Ok(out)
    }

    /// `read` into `out`, replacing what it held (the FUSE threads reuse one buffer each
    /// for their replies).
    pub fn read_to(
        &self,
        ino: InodeId,
        fh: HandleId,
        off: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        self.read_reply(ino, fh, off, len, out, false).map(|_| ())
    }

    /// `read_to`, except that where the bytes come whole from stored chunks (a file nobody
    /// is writing: what a restart reads) and `vectored`, they are handed back as the
    /// chunks' pieces (`ReadReply::Parts`) instead of copied into `out`, for a reply the
    /// kernel gathers from them.
    pub fn read_reply(
        &self,
        ino: InodeId,
        fh: HandleId,
        off: u64,
        len: usize,
        out: &mut Vec<u8>,
        vectored: bool,
    ) -> Result<ReadReply> {
        if let Some(obj) = self.merged_handle(fh) {
            *out = self.sh_read(obj, off, len, None)?;
            self.sh_read_ahead(fh, obj, off, off + out.len() as u64);
            return Ok(ReadReply::Bytes);
        }
        let layer = self.via_handle(ino, fh);
        if layer != ino && !self.local_only(layer) {
            // Read through a handle writing this slot's layer of a file other layers
            // make up too: all of them, this one's open state on top.
            *out = self.sh_read(ino, off, len, Some(layer))?;
            return Ok(ReadReply::Bytes);
        }
        let ino = layer;
        if ino == view::ADVICE {
            *out = self.advice_read(fh, off, len)?;
            return Ok(ReadReply::Bytes);
        }
        let node = self.handle_node(ino, fh, "read")?;
        let (pieces, end) = {
            let mut n = node.lock();
            // A file nobody writes: take the extents and read without the file's lock, so
            // the kernel's parallel readahead requests for one file are served in parallel
            // (their device reads and blake3 checks overlap). With a writer, read under the
            // lock: the content includes uncommitted writes, and a commit may drop the
            // revision these extents come from.
            if n.writers != 0 || !n.file.is_clean() {
                *out = n.file.read(self.space.data().chunks(), off, len)?;
                return Ok(ReadReply::Bytes);
            }
            let end = off.saturating_add(len as u64).min(n.file.size());
            if off >= end {
                out.clear();
                return Ok(ReadReply::Bytes);
            }
            self.read_ahead(&mut n, off, end);
            (n.file.map().pieces(off, end), end)
        };
        let len = (end - off) as usize;
        if vectored {
            let parts = ExtentMap::read_pieces_parts(self.space.data().chunks(), pieces, off, len)?;
            return Ok(ReadReply::Parts(parts));
        }
        ExtentMap::read_pieces_to(
            self.space.data().chunks(),
            pieces,
            off,
            len,
            out,
            self.space.stages().reply_stage(),
        )?;
        Ok(ReadReply::Bytes)
    }

    /// Hands the chunks ahead of a sequential reader of a clean file to the store's
    /// read-ahead (`read`, after the read of `off..end`; see `ReadAhead`).
    fn read_ahead(&self, n: &mut OpenNode, off: u64, end: u64) {
        let size = n.file.size();
        if let Some((from, to)) = n.ahead.next(&self.prefetch_streams, off, end, size) {
            let ahead = n.file.map().pieces(from, to);
            self.space
                .data()
                .prefetch(ahead.into_iter().map(|(_, e)| e.chunk).collect());
        }
    }

    pub fn write(
        &self,
        ino: InodeId,
        fh: HandleId,
        pid: u32,
        off: u64,
        data: &[u8],
    ) -> Result<usize> {
        self.write_shared(ino, fh, pid, off, data, None)
    }

    /// `write`, where `shared` (if any) holds the same bytes as `data` in a buffer the
    /// caller lets the engine keep (the FUSE request's): a sequential write of half a
    /// stream segment or more is then not copied (`Space::ingest_shared`).
    pub fn write_shared(
        &self,
        ino: InodeId,
        fh: HandleId,
        pid: u32,
        off: u64,
        data: &[u8],
        shared: Option<ckptfs_engine::face::SharedBytes>,
    ) -> Result<usize> {
        debug_assert!(shared.as_deref().is_none_or(|s| s == data));
        let ino = self.via_handle(ino, fh);
        self.writable(ino)?;
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_BYTES)
        {
            return Err(Error::FileTooBig);
        }
        self.refuse_if_failed()?;
        // The kernel sends a handle's writes (mmap writeback included) before its RELEASE,
        // so an unknown handle should not happen. If it does, the bytes still go to the
        // inode's open state, under a reference held across the write, and are committed by
        // the next close of the file or at unmount, rather than refused after the
        // application let go of them.
        let (node, internal) = match self.handle_node(ino, fh, "write") {
            Ok(n) => (n, false),
            Err(_) => {
                log::warn!(
                    "write of inode {} goes to its open state without a handle",
                    ino.0
                );
                (self.open_ref(ino, None, false, false)?, true)
            }
        };
        let mut r = self.write_node(ino, &node, fh, pid, off, (data, shared.as_ref()));
        if internal {
            // No close will follow for these bytes: commit them now, before the reference
            // goes (a node nothing references is forgotten, uncommitted changes and all).
            if r.is_ok() {
                r = self
                    .commit_node(ino, &mut node.lock(), Seal::FsyncPoint, HandleId::NONE)
                    .map(|()| data.len());
            }
            self.unref(ino, &node, false);
        }
        r
    }

    fn write_node(
        &self,
        ino: InodeId,
        node: &Mutex<OpenNode>,
        fh: HandleId,
        pid: u32,
        off: u64,
        (data, shared): (&[u8], Option<&ckptfs_engine::face::SharedBytes>),
    ) -> Result<usize> {
        let mut n = node.lock();
        let ingest = |file: &mut ckptfs_engine::face::FileState| match shared {
            Some(sh) => self.space.files().ingest_shared(file, off, sh.clone()),
            None => self.space.files().ingest(file, off, data),
        };
        // Rewriting the same bytes at the same offset is idempotent, so a write that stopped
        // half way is simply done again after gc made room.
        ckptfs_engine::face::with_room(&mut n.file, ingest, || self.gc_for_space())?;
        Self::touched_by(&mut n, fh, pid);
        drop(n);
        self.sweeper
            .wrote(ino, data.len(), self, self.space.data().chunks());
        Ok(data.len())
    }

    /// Settles a file's uncommitted bytes into chunks (`FileState::finish`). Full: reclaims
    /// what the retention policy allows and tries again, as long as gc finds room (gc needs
    /// no file lock, only the pins, which this file's state holds).
    fn settle_node(&self, n: &mut OpenNode) -> Result<()> {
        let c = self.space.data().chunks();
        ckptfs_engine::face::with_room(&mut n.file, |f| f.finish(c), || self.gc_for_space())?;
        Ok(())
    }

    /// Records that handle `fh` of process `pid` changed the file now (its close seals).
    fn touched_by(n: &mut OpenNode, fh: HandleId, pid: u32) {
        let now = Timestamp::now();
        n.rec.mtime = now;
        n.rec.ctime = now;
        if let Some(h) = n.handles.get_mut(&fh) {
            h.wrote = true;
            h.writer_pid = pid;
        }
    }

    /// fallocate(2) through handle `fh`. Mode 0 and KEEP_SIZE allocate: holes cost nothing
    /// here, so allocating extends the size (unless KEEP_SIZE) after checking that the space
    /// has room for the new bytes now; it reserves nothing (see the README: a later write
    /// can still meet ENOSPC when other writers fill the space first). PUNCH_HOLE (with
    /// KEEP_SIZE) and ZERO_RANGE make the range a hole; ZERO_RANGE without KEEP_SIZE also
    /// extends the size. COLLAPSE_RANGE, INSERT_RANGE and the rest: not supported.
    pub fn fallocate(
        &self,
        ino: InodeId,
        fh: HandleId,
        pid: u32,
        off: u64,
        len: u64,
        mode: i32,
    ) -> Result<()> {
        const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
        if mode & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) != 0 {
            return Err(Error::NotSupported);
        }
        if len == 0 {
            return Err(Error::Invalid);
        }
        let end = off
            .checked_add(len)
            .filter(|e| *e <= MAX_FILE_BYTES)
            .ok_or(Error::FileTooBig)?;
        let punch = mode & PUNCH_HOLE != 0;
        let zero = mode & ZERO_RANGE != 0;
        // PUNCH_HOLE must keep the size and cannot be combined with ZERO_RANGE.
        if punch && (zero || mode & KEEP_SIZE == 0) {
            return Err(Error::NotSupported);
        }
        self.refuse_if_failed()?;
        let node = self.handle_node(ino, fh, "fallocate")?;
        let mut n = node.lock();
        let size = n.file.size();
        let grow = mode & KEEP_SIZE == 0 && end > size;
        if punch || zero {
            // Settled first, with gc making room if needed; the punch then only edits the map.
            self.settle_node(&mut n)?;
            n.file.punch_hole(self.space.data().chunks(), off, end)?;
        } else if grow {
            let new_bytes = end - off.max(size);
            if new_bytes > self.space.data().free_bytes() {
                return Err(Error::Engine(ckptfs_engine::Error::NoSpace));
            }
        }
        if grow {
            n.file.truncate(end);
        }
        if punch || zero || grow {
            Self::touched_by(&mut n, fh, pid);
        }
        Ok(())
    }

    /// copy_file_range(2) within the mount as a metadata-only copy: the destination range
    /// gets extents naming the source's chunks, pinned until the destination's next commit,
    /// and no data bytes are read or written. The copy becomes durable and listed like any
    /// write through `dst_fh`: at its close (or fsync). The kernel has checked the handles'
    /// modes, the file types, overlap within one file and the size limits; the source range
    /// is clipped at the source's end. Returns the bytes copied.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_range(
        &self,
        src: InodeId,
        src_fh: HandleId,
        src_off: u64,
        dst: InodeId,
        dst_fh: HandleId,
        dst_off: u64,
        len: u64,
        pid: u32,
    ) -> Result<u64> {
        if self.shared.is_some() && (!self.local_only(src) || !self.local_only(dst)) {
            // Another slot's chunks cannot be referenced from this one: EXDEV makes the
            // caller (cp, mv) fall back to reading and writing.
            return Err(Error::CrossDevice);
        }
        self.refuse_if_failed()?;
        let src_node = self.handle_node(src, src_fh, "copy_file_range")?;
        let dst_node = self.handle_node(dst, dst_fh, "copy_file_range")?;
        if dst_off.checked_add(len).is_none_or(|e| e > MAX_FILE_BYTES) {
            return Err(Error::FileTooBig);
        }
        let (pieces, n, pinned) = {
            let mut s = src_node.lock();
            let n = len.min(s.file.size().saturating_sub(src_off));
            if n == 0 {
                return Ok(0);
            }
            // The source's uncommitted bytes become chunks (pinned by its state), so the
            // copy names chunks like every committed extent does.
            self.settle_node(&mut s)?;
            let pieces = s.file.copy_source(src_off, src_off + n);
            // Pinned while the source's lock keeps them referenced.
            let chunks: Vec<_> = pieces.iter().map(|(_, e)| e.chunk).collect();
            let pinned = self.space.pins().pin_stored(&chunks)?;
            (pieces, n, pinned)
        };
        let mut d = dst_node.lock();
        d.file
            .paste(self.space.data().chunks(), dst_off, n, &pieces, pinned)?;
        Self::touched_by(&mut d, dst_fh, pid);
        Ok(n)
    }

    /// Sets `[0, len)` of the file open as `fh` to `pieces` (offsets from 0, extents of
    /// chunks the space has records of: a space rebuilt from its object-store tier names
    /// chunks the bucket holds this way), metadata only, as `copy_range` does; durable and
    /// listed at the handle's close. A chunk the space has no record of is an error, and
    /// then nothing changed.
    pub fn paste_chunks(
        &self,
        ino: InodeId,
        fh: HandleId,
        pieces: &[(u64, ckptfs_engine::face::Extent)],
        len: u64,
        pid: u32,
    ) -> Result<()> {
        self.refuse_if_failed()?;
        if len > MAX_FILE_BYTES {
            return Err(Error::FileTooBig);
        }
        let node = self.handle_node(ino, fh, "write")?;
        let chunks: Vec<_> = pieces.iter().map(|(_, e)| e.chunk).collect();
        let pinned = self.space.pins().pin_stored(&chunks)?;
        let mut n = node.lock();
        n.file
            .paste(self.space.data().chunks(), 0, len, pieces, pinned)?;
        Self::touched_by(&mut n, fh, pid);
        Ok(())
    }

    /// Commits a modified file as handle `fh` (0: none). An unsealed current revision is
    /// replaced, unless another handle still has to seal it.
    fn commit_node(&self, ino: InodeId, n: &mut OpenNode, seal: Seal, fh: HandleId) -> Result<()> {
        if !n.file.is_modified() {
            // An O_TRUNC of a layer that was empty already changes no byte of it, but cuts
            // the other layers all the same.
            return self.record_clip(ino, n);
        }
        let prev = n.rec.current_rev;
        let previous = match n
            .handles
            .iter()
            .any(|(f, h)| *f != fh && h.pending == Some(prev))
        {
            true => Previous::Keep,
            false => Previous::Replace,
        };
        self.settle_node(n)?;
        // The engine takes nlink, history and current revision from the stored record
        // inside the commit's transaction (a rename or unlink may have changed them). The
        // O_TRUNC's truncate of the other layers rides in the same transaction: one durable
        // commit, and the truncate is never recorded without the bytes that go with it.
        let mut rec = n.rec.clone();
        let rev =
            self.space
                .commit_file_keeping(ino, &mut n.file, &mut rec, seal, previous, n.clip)?;
        if n.clip.take().is_some() && self.shared.is_some() {
            self.sh_touch(&[ino]);
        }
        log::debug!(
            "commit inode {} history {} -> revision {} ({} bytes, {seal:?}, writers {})",
            ino.0,
            rec.history,
            rev.0,
            rec.size,
            n.writers
        );
        n.rec = rec;
        n.base.set(rev);
        n.file.mark_committed();
        if self.shared.is_some() {
            self.sh_touch(&[ino]);
        }
        Ok(())
    }

    /// The writer's own close of a save that did not fit (ENOSPC, reported to it): the file
    /// is its last committed revision again at once, for `stat` too (before, the discarded
    /// size showed until the release, a second or more later, whose commit retried the
    /// save and its gc first). Its chunk pins go with the dropped state.
    fn discard_failed_save(&self, ino: InodeId, n: &mut OpenNode) {
        let stored = match self.record(ino) {
            Ok(r) => r,
            Err(e) => {
                log::warn!(
                    "inode {}: rereading its record after a failed save: {e}",
                    ino.0
                );
                return;
            }
        };
        match self.space.files().load_file(&stored) {
            Ok(state) => {
                log::info!(
                    "inode {}: the save that did not fit was discarded; the file is its last \
                     committed revision ({} bytes)",
                    ino.0,
                    stored.size
                );
                n.file = state;
                n.rec = stored;
                n.clip = None;
            }
            Err(e) => log::warn!("inode {}: reloading its last revision: {e}", ino.0),
        }
    }

    /// Commits this slot's layer `ino` now if it is open with an O_TRUNC its close has yet
    /// to record, or (unless `clip_only`) with any change: a truncate of a shared
    /// namespace's file orders its layers by these commits (see `sh_setattr`).
    pub(crate) fn commit_open_layer(&self, ino: InodeId, clip_only: bool) -> Result<()> {
        let Some(node) = self.open_node(ino) else {
            return Ok(());
        };
        let mut n = node.lock();
        if n.clip.is_none() && (clip_only || !n.file.is_modified()) {
            return Ok(());
        }
        self.commit_node(ino, &mut n, Seal::FsyncPoint, HandleId::NONE)
    }

    /// Moves this node's descriptors that write into layer `from` over to layer `to` (a
    /// truncate made `to` this node's top layer, `sh_setattr`): what they wrote before is
    /// committed in `from` first, as the layer it was written into; their later writes go to
    /// `to`. Each handle leaves `from` and enters `to` under the open table's lock, so a
    /// request on it finds one or the other.
    pub(crate) fn move_writers(&self, from: InodeId, to: InodeId) -> Result<()> {
        let Some(old) = self.open_node(from) else {
            return Ok(());
        };
        let fhs: Vec<HandleId> = {
            let n = old.lock();
            n.handles
                .iter()
                .filter(|(_, h)| h.writer)
                .map(|(f, _)| *f)
                .collect()
        };
        if fhs.is_empty() {
            return Ok(());
        }
        self.commit_open_layer(from, false)?;
        for fh in fhs {
            // One more writer reference of `to` for the handle (its table entry follows).
            let new = self.open_ref(to, None, true, false)?;
            let h = {
                let mut t = self.open.lock();
                t.handles.insert(fh, (to, new.clone()));
                let h = old.lock().handles.remove(&fh).unwrap_or_default();
                new.lock().handles.insert(
                    fh,
                    Handle {
                        writer: true,
                        wrote: false,
                        writer_pid: h.writer_pid,
                        flushed: h.flushed,
                        pending: None,
                    },
                );
                h
            };
            log::debug!(
                "handle {fh} (pid {}) moves from layer {} to layer {} after a truncate",
                h.writer_pid,
                from.0,
                to.0
            );
            self.unref(from, &old, true);
        }
        Ok(())
    }

    /// Records the truncate an O_TRUNC open of a shared namespace's layer made (`OpenNode::
    /// clip`) in the layer's version record, for publication with this commit, when there are
    /// no bytes to commit with it (a file committed carries it in its commit). Not durable by
    /// itself: the caller's close, fsync or publication makes it durable (`sync_meta_since`,
    /// `Space::publish`), in the one durable commit it makes anyway.
    fn record_clip(&self, ino: InodeId, n: &mut OpenNode) -> Result<()> {
        let Some((stamp, len)) = n.clip else {
            return Ok(());
        };
        self.space.ns().update_version(
            ino,
            false,
            |m| {
                m.created = m.created.max(stamp);
                m.clip_stamp = stamp;
                m.clip_len = len;
            },
            |_| None,
        )?;
        n.clip = None;
        if self.shared.is_some() {
            self.sh_touch(&[ino]);
        }
        Ok(())
    }

    /// close() of a descriptor of handle `fh` by process `pid`: commit, so the application's
    /// close returns with its data durable.
    ///
    /// The revision is complete, and listed at once, when the process that wrote through the
    /// handle closes it and no other writer handle is open. A FLUSH from another process (a
    /// child forked while a writer thread was mid-checkpoint closes its copy at exec) or of a
    /// handle that only truncated (a shell redirect before dup2) makes the state durable but
    /// lists nothing; if the handle wrote and was the only writer, its release seals that
    /// commit later, unless the writer's own close sealed a newer one first.
    pub fn flush(&self, ino: InodeId, fh: HandleId, pid: u32) -> Result<()> {
        if self.merged_handle(fh).is_some() {
            return Ok(());
        }
        let ino = self.via_handle(ino, fh);
        if ino == view::ADVICE {
            return Ok(());
        }
        let r = self.flush_local(ino, fh, pid);
        // Close-to-open: what this close committed is published before it returns.
        if r.is_ok() {
            self.publish_pending()?;
        }
        r
    }

    fn flush_local(&self, ino: InodeId, fh: HandleId, pid: u32) -> Result<()> {
        // The namespace changes before this close (its file's create, an unlink) are what
        // it owes durability to; not those other threads make while it commits.
        let mut mark = self.space.sync_mark();
        let node = self.handle_node(ino, fh, "flush")?;
        let mut n = node.lock();
        let n = &mut *n;
        // Other writers still at work: writer handles that wrote since their last close, or
        // never closed. (Not the open count: a handle's release arrives some time after its
        // close, often after the next open of a back-to-back save loop.)
        let only_writer = !n
            .handles
            .iter()
            .any(|(f, h)| *f != fh && h.writer && (h.wrote || !h.flushed));
        let (wrote, seal_now) = match n.handles.get(&fh) {
            Some(h) => (
                h.wrote,
                h.writer && h.wrote && h.writer_pid == pid && only_writer,
            ),
            None => (false, false),
        };
        log::debug!(
            "flush inode {} handle {fh} pid {pid}: wrote {wrote} only_writer {only_writer} \
             writer_pid {:?} seal_now {seal_now}",
            ino.0,
            n.handles.get(&fh).map(|h| h.writer_pid)
        );
        if n.file.is_modified() {
            let seal = if seal_now {
                Seal::Complete
            } else {
                Seal::FsyncPoint
            };
            if let Err(e) = self.commit_node(ino, n, seal, fh) {
                if seal_now && matches!(e, Error::Engine(ckptfs_engine::Error::NoSpace)) {
                    self.discard_failed_save(ino, n);
                }
                return Err(e);
            }
        } else if n.clip.is_some() {
            self.record_clip(ino, n)?;
            mark = self.space.sync_mark();
        } else if seal_now && n.base.revision().0 != 0 {
            // Another handle's close (a reader's) already committed what this writer wrote.
            self.space.seal(n.base.revision(), &n.file)?;
        }
        if let Some(h) = n.handles.get_mut(&fh) {
            if seal_now {
                h.pending = None;
            } else if wrote && only_writer {
                h.pending = Some(n.base.revision());
            }
            // Only the writer's own close ends its "wrote since close": a FLUSH from a child
            // that inherited the descriptor (closing it at exec) must not make the writer's
            // later close look like a close without writes, which would leave the revision
            // unlisted until the release that follows close.
            if h.writer_pid == pid {
                h.wrote = false;
            }
            h.flushed = true;
        }
        // Namespace changes before this close (this file's create, an unlink) are durable
        // once close returns, even when there was no data to commit: usually the commit
        // above made them so. (Not on a mount that defers durability to fsync.)
        if self.space.close_durable() {
            self.space.sync_meta_since(mark)?;
        }
        Ok(())
    }

    pub fn fsync(&self, ino: InodeId, fh: HandleId) -> Result<()> {
        if self.merged_handle(fh).is_some() {
            return Ok(());
        }
        let ino = self.via_handle(ino, fh);
        if ino == view::ADVICE {
            return Ok(());
        }
        let node = self.handle_node(ino, fh, "fsync")?;
        let mut n = node.lock();
        self.commit_node(ino, &mut n, Seal::FsyncPoint, fh)?;
        drop(n);
        // What came before this fsync, including a truncate `commit_node` just recorded.
        self.space.sync_meta_since(self.space.sync_mark())?;
        self.publish_pending()
    }

    /// fsync of a directory: namespace changes so far become durable. Nothing to do on a
    /// read-only space.
    pub fn fsync_dir(&self) -> Result<()> {
        if self.space.is_read_only() {
            return Ok(());
        }
        self.space.sync_meta()?;
        self.publish_pending()
    }

    /// Last reference to a handle: commit anything left (e.g. from mmap writeback after
    /// close) and drop the in-memory state when no handle remains.
    pub fn release(&self, ino: InodeId, fh: HandleId) -> Result<()> {
        if self.sh_release_merged(fh) {
            return Ok(());
        }
        let ino = self.via_handle(ino, fh);
        if ino == view::ADVICE {
            self.advice_opens.lock().remove(&fh);
            return Ok(());
        }
        // The handle leaves the table first: the node it opened is the one this release
        // works on, whatever the table holds for the inode by now.
        let node = {
            let mut t = self.open.lock();
            match t.handles.get(&fh) {
                Some((i, n)) if *i == ino => {
                    let n = n.clone();
                    t.handles.remove(&fh);
                    n
                }
                _ => {
                    drop(t);
                    // Logs and answers EIO.
                    return self.handle_node(ino, fh, "release").map(drop);
                }
            }
        };
        // Commit without holding the table, so other files' requests are not stalled
        // behind this file's fsync.
        let (result, writer) = {
            let mut n = node.lock();
            let h = n.handles.remove(&fh).unwrap_or_default();
            // Writes that arrive after close (mmap writeback) are committed here.
            let last_writer = h.writer && n.writers == 1;
            let sealed = last_writer && h.wrote;
            let seal = if sealed {
                Seal::Complete
            } else {
                Seal::FsyncPoint
            };
            let mut result = self.commit_node(ino, &mut n, seal, fh);
            if let (Ok(()), Some(rev)) = (&result, h.pending) {
                log::debug!(
                    "release of handle {fh} seals inode {} revision {}",
                    ino.0,
                    rev.0
                );
                result = self.space.seal(rev, &n.file).map_err(Error::from);
            }
            (result, h.writer)
        };
        self.unref(ino, &node, writer);
        result
    }

    /// Commits every open file (unmount).
    pub fn commit_all(&self) -> Result<()> {
        let nodes: Vec<_> = self
            .open
            .lock()
            .nodes
            .iter()
            .map(|(i, n)| (*i, n.clone()))
            .collect();
        let mut first_err = None;
        for (ino, node) in nodes {
            let mut n = node.lock();
            if let Err(e) = self.commit_node(ino, &mut n, Seal::Complete, HandleId::NONE) {
                log::error!("commit of inode {} at unmount failed: {e:?}", ino.0);
                first_err.get_or_insert(e);
            }
        }
        // Everything committed is durable at unmount, whatever closes promised, and the
        // journal's records are in the table (the next mount has nothing to apply).
        if !self.space.is_read_only() {
            if let Err(e) = self.space.sync_all() {
                log::error!("making the space durable at unmount failed: {e:?}");
                first_err.get_or_insert(e.into());
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The parent of directory `dir` (its own parent for the root); NotDir for other kinds.
    fn dir_parent(&self, dir: InodeId) -> Result<InodeId> {
        if view::is_virtual(dir) {
            return self.view_parent(dir);
        }
        if self.shared.is_some() {
            return self.sh_parent(dir);
        }
        let rec = self.record(dir)?;
        if rec.kind != NodeKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(rec.parent)
    }

    /// Entries of `dir` after `offset` (0 = from the start): ".", "..", then the entries.
    pub fn readdir(&self, dir: InodeId, offset: u64, limit: usize) -> Result<Vec<DirItem>> {
        let mut out = self.dot_items(dir, offset)?;
        let after = offset.max(2);
        if view::is_virtual(dir) {
            out.extend(self.view_readdir(dir, after, limit)?);
            return Ok(out);
        }
        if self.shared.is_some() {
            out.extend(self.sh_readdir(dir, after, limit)?);
            return Ok(out);
        }
        let entries = self.space.ns().list_dir(dir, after, limit)?;
        let inos: Vec<InodeId> = entries.iter().map(|e| e.ino).collect();
        // The kinds from one snapshot (a getattr per entry was most of a listing's cost).
        let recs = self.space.ns().get_inodes(&inos)?;
        for (e, rec) in entries.into_iter().zip(recs) {
            out.push(DirItem {
                offset: e.cookie,
                ino: e.ino,
                kind: rec.ok_or(Error::NotFound)?.kind,
                name: e.name,
            });
        }
        Ok(out)
    }

    /// The `.` and `..` entries of `dir` a listing from `offset` starts with (offsets 1, 2).
    fn dot_items(&self, dir: InodeId, offset: u64) -> Result<Vec<DirItem>> {
        let parent = self.dir_parent(dir)?;
        Ok([(1, dir, b".".as_slice()), (2, parent, b"..")]
            .into_iter()
            .filter(|(at, _, _)| offset < *at)
            .map(|(at, ino, name)| DirItem {
                offset: at,
                ino,
                kind: NodeKind::Dir,
                name: name.to_vec(),
            })
            .collect())
    }

    /// `readdir` with each entry's attributes as `lookup_entry` gives them (every entry but
    /// `.` and `..` counted as looked up by the kernel; one gc removed meanwhile answers
    /// NotFound), for READDIRPLUS. A local listing reads its entries' records and holds
    /// them in one snapshot, and the sizes of their revisions in another, where a lookup
    /// per entry took four read transactions, each opening its table (20,000 files: a
    /// listing with attributes took 6x a plain directory's stats). The kernel holds the
    /// directory against renames while it lists, so the snapshot's names are the live ones.
    pub fn readdir_plus(
        &self,
        dir: InodeId,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<(DirItem, Result<Attr>)>> {
        // On a multi-slot space one refresh serves the whole batch: a hint read per entry
        // (two, with the lookup's getattr) was nearly all of an `ls -l`'s time.
        let t = std::time::Instant::now();
        let entry = |it: &DirItem| match it.is_dots() {
            true => self.getattr_at(it.ino, t),
            false => self.lookup_entry_at(dir, &it.name, t),
        };
        if view::is_virtual(dir) {
            let items = self.readdir(dir, offset, limit)?;
            return Ok(items
                .into_iter()
                .map(|it| {
                    let a = entry(&it);
                    (it, a)
                })
                .collect());
        }
        if self.shared.is_some() {
            // This slot's files no other slot has a version of are answered as on one slot,
            // from one snapshot (a lookup each read the table once per entry: most of a
            // close-to-open `ls -l`'s daemon time); the others through the merge.
            let items = self.readdir(dir, offset, limit)?;
            let local: Vec<bool> = items
                .iter()
                .map(|it| !it.is_dots() && self.local_only(it.ino))
                .collect();
            let inos: Vec<InodeId> = (items.iter().zip(&local))
                .filter(|(_, l)| **l)
                .map(|(it, _)| it.ino)
                .collect();
            let mut held = self.local_attrs_held(&inos)?.into_iter();
            return Ok(items
                .into_iter()
                .zip(local)
                .map(|(it, l)| {
                    let a = match l {
                        true => held.next().unwrap_or(Err(Error::NotFound)),
                        false => entry(&it),
                    };
                    (it, a)
                })
                .collect());
        }
        let mut out: Vec<(DirItem, Result<Attr>)> = (self.dot_items(dir, offset)?.into_iter())
            .map(|it| {
                let a = entry(&it);
                (it, a)
            })
            .collect();
        let entries = self.space.ns().list_dir(dir, offset.max(2), limit)?;
        let inos: Vec<InodeId> = entries.iter().map(|e| e.ino).collect();
        let attrs = self.local_attrs_held(&inos)?;
        for (e, a) in entries.into_iter().zip(attrs) {
            let kind = a.as_ref().map_or(NodeKind::File, |a| a.rec.kind);
            let it = DirItem {
                offset: e.cookie,
                ino: e.ino,
                kind,
                name: e.name,
            };
            out.push((it, a));
        }
        Ok(out)
    }

    /// The attributes of this slot's inodes `inos`, each held as looked up by the kernel
    /// (`remember`; one gc removed meanwhile answers NotFound and is not held), their
    /// records from one snapshot and the sizes of their revisions from another. On an
    /// error nothing is held.
    fn local_attrs_held(&self, inos: &[InodeId]) -> Result<Vec<Result<Attr>>> {
        let recs = self.space.pins().hold_inodes(inos)?;
        let mut attrs: Vec<Result<Attr>> = Vec::with_capacity(recs.len());
        // (index, revision) of the files whose non-hole bytes are not cached.
        let mut to_size: Vec<(usize, RevisionId)> = Vec::new();
        for (&ino, rec) in inos.iter().zip(recs) {
            let a = match rec {
                None => Err(Error::NotFound),
                Some(_) if self.open_node(ino).is_some() => {
                    let a = self.local_getattr(ino);
                    if a.is_err() {
                        // Not answered: its hold is given back here.
                        self.forget(ino, 1);
                    }
                    a
                }
                Some(rec) => {
                    let mut a = Attr::new(ino, rec);
                    if a.rec.kind == NodeKind::File {
                        let rev = a.rec.current_rev;
                        match self.data_bytes_cache.lock().get(&(ino, rev)) {
                            Some(b) => a.data_bytes = Some(*b),
                            None => to_size.push((attrs.len(), rev)),
                        }
                    }
                    Ok(a)
                }
            };
            attrs.push(a);
        }
        if !to_size.is_empty() {
            let revs: Vec<RevisionId> = to_size.iter().map(|(_, r)| *r).collect();
            let bytes = match self.space.files().data_bytes_many(&revs) {
                Ok(b) => b,
                Err(e) => {
                    // Nothing is answered: give back what was held.
                    for a in attrs.iter().flatten() {
                        self.forget(a.ino, 1);
                    }
                    return Err(e.into());
                }
            };
            let mut c = self.data_bytes_cache.lock();
            for ((i, rev), b) in to_size.into_iter().zip(bytes) {
                if let Ok(a) = &mut attrs[i] {
                    a.data_bytes = Some(b);
                    cache_data_bytes(&mut c, (a.ino, rev), b);
                }
            }
        }
        Ok(attrs)
    }

    /// Publishes what this slot committed since the last publication (a multi-slot space;
    /// nothing otherwise). Failed publications are retried at the next one.
    pub fn publish_pending(&self) -> Result<()> {
        match self.shared {
            Some(_) => self.sh_publish_pending(),
            None => Ok(()),
        }
    }

    /// Publishes this slot's whole part of the shared namespace (at mount).
    pub fn publish_all(&self) -> Result<()> {
        match self.shared {
            Some(_) => self.sh_publish_all(),
            None => Ok(()),
        }
    }

    /// Reads the other slots' headers and new manifest records.
    pub fn refresh_union(&self) -> Result<()> {
        match self.space.slots().union() {
            Some(u) => Ok(u.refresh()?),
            None => Ok(()),
        }
    }

    /// A refresh that started at `t` or later (shared with concurrent callers); a failure
    /// is logged and the last views are used.
    pub(crate) fn refresh_since(&self, t: std::time::Instant) {
        if let Some(u) = self.space.slots().union() {
            if let Err(e) = u.refresh_since(t) {
                log::warn!("reading the other slots' manifests: {e}");
            }
        }
    }

    /// Refuses changes inside the revision view.
    fn writable(&self, ino: InodeId) -> Result<()> {
        if view::is_virtual(ino) || self.space.is_read_only() {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// opendir(2): directories only (ENOTDIR for anything else).
    pub fn opendir(&self, ino: InodeId) -> Result<()> {
        match self.getattr(ino)?.rec.kind {
            NodeKind::Dir => Ok(()),
            _ => Err(Error::NotDir),
        }
    }

    /// `ckptfs check` of the mounted space: every chunk read back and verified.
    pub fn check(&self) -> Result<ckptfs_engine::face::CheckReport> {
        let mut r = ckptfs_engine::face::check_space(&self.space, &mut |_, _| {})?;
        if self.shared.is_some() {
            self.sh_name_damage(&mut r);
        }
        Ok(r)
    }

    /// Runs gc with the revisions open files use pinned.
    pub fn gc(
        &self,
        dry_run: bool,
        throttle: Option<f64>,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<GcReport> {
        self.gc_with(
            GcOptions {
                dry_run,
                throttle,
                ..GcOptions::default()
            },
            progress,
        )
    }

    /// gc; the engine keeps what open files and restores have pinned.
    pub fn gc_with(
        &self,
        opts: GcOptions,
        progress: &mut dyn FnMut(GcProgress),
    ) -> Result<GcReport> {
        let r = self.space.gc(&opts, progress)?;
        if r.bytes_copied > 0 {
            // Chunks moved: other nodes must learn their new places (they find stale ones
            // by blake3 and read this slot's manifest again).
            if let Err(e) = self.publish_all() {
                log::warn!("publishing chunk locations after gc: {e}");
            }
        }
        Ok(r)
    }

    /// A writer found the space full: gc under pressure (`AutoGc::for_space`), after this
    /// node learnt which of this slot's files other nodes removed (one rank deleting the
    /// oldest step: their space is this slot's to reclaim). True: try again.
    fn gc_for_space(&self) -> bool {
        self.ask_removals();
        self.auto_gc
            .for_space(&self.space, &|opts| self.engine_gc(opts))
    }

    /// One check of the automatic gc (`AutoGc::tick`): below the watermark, a throttled
    /// gc with back-off; above it, the retention pass.
    pub fn auto_gc_tick(&self) {
        self.auto_gc.tick(&self.space, &|opts| self.engine_gc(opts));
    }

    /// `gc_with` for the engine's automatic gc, whose errors are the engine's.
    fn engine_gc(&self, opts: GcOptions) -> ckptfs_engine::Result<GcReport> {
        self.gc_with(opts, &mut |_| {}).map_err(|e| match e {
            Error::Engine(e) => e,
            other => ckptfs_engine::Error::Invalid(other.to_string()),
        })
    }

    /// The listed revisions of `path` (relative to the root), live or unlinked.
    pub fn revisions_of(&self, path: &[u8]) -> Result<Vec<RevisionListing>> {
        let hid = self.history_of_path(path)?;
        Ok(self
            .space
            .ns()
            .revisions(hid)?
            .into_iter()
            .map(|r| RevisionListing {
                id: r.id.0,
                committed_unix: view::unix_seconds(r.rec.committed),
                size: r.rec.size,
                new_bytes: r.rec.new_stored_bytes,
                current: r.current,
            })
            .collect())
    }

    /// The history id of `path` (live, or the most recently unlinked file there).
    pub fn history_of(&self, path: &[u8]) -> Result<HistoryId> {
        self.history_of_path(path)
    }

    /// The object at `path` (components separated by '/'), as every node sees it.
    /// The directory holding `path` (relative to the root), if it exists: the one whose
    /// listing a restore of `path` may change.
    pub fn parent_dir(&self, path: &[u8]) -> Result<Option<InodeId>> {
        let dir = match path.iter().rposition(|b| *b == b'/') {
            Some(i) => &path[..i],
            None => &b""[..],
        };
        self.resolve(dir)
    }

    fn resolve(&self, path: &[u8]) -> Result<Option<InodeId>> {
        if self.shared.is_none() {
            return Ok(self.space.ns().resolve(path)?);
        }
        self.refresh_since(std::time::Instant::now());
        let mut ino = InodeId::ROOT;
        for part in path.split(|b| *b == b'/').filter(|p| !p.is_empty()) {
            match self.lookup(ino, part) {
                Ok(a) => ino = a.ino,
                Err(Error::NotFound) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(ino))
    }

    /// The history of `path`: that of the file there now, else that of the most recently
    /// unlinked file that lived there and is still retained. In a shared namespace the
    /// histories are kept by the slot that made the file: another slot's file is refused
    /// (EXDEV), not reported missing.
    fn history_of_path(&self, path: &[u8]) -> Result<HistoryId> {
        let Some(sh) = &self.shared else {
            return self
                .space
                .ns()
                .history_of_path(path)?
                .ok_or(Error::NotFound);
        };
        if let Some(ino) = self.resolve(path)? {
            if ckptfs_engine::face::owner_slot(ino) != sh.me {
                return Err(Error::CrossDevice);
            }
            if let Some(rec) = self.space.ns().get_inode(ino)? {
                if rec.kind == NodeKind::File {
                    return Ok(rec.history);
                }
            }
        }
        let want: Vec<u8> = path
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join(&b'/');
        self.space
            .ns()
            .unlinked_history_at(&want)?
            .ok_or(Error::NotFound)
    }

    /// The content of a revision of `path`.
    pub fn read_revision(&self, path: &[u8], rev: u64) -> Result<FileState> {
        let hid = self.history_of_path(path)?;
        let listed = self.space.ns().revisions(hid)?;
        if !listed.iter().any(|r| r.id.0 == rev) {
            return Err(Error::NotFound);
        }
        Ok(self.space.files().load_revision(RevisionId(rev))?)
    }

    /// Makes revision `rev` of `path` its current content again, as a new revision; returns
    /// the file's inode. An unlinked path is re-created (its directory must exist) and
    /// continues its history.
    pub fn restore(&self, path: &[u8], rev: u64, c: Caller) -> Result<InodeId> {
        let hid = self.history_of_path(path)?;
        // The revision is looked for once, under the pin gate: gc cannot drop it between
        // the look and the pin.
        // Pin the revision against gc until the new revision references its chunks. (Not
        // the gc lock: a writer holding its file's lock may be waiting in gc.)
        let (_pin, ()) = self.space.pins().pin(None, || {
            if !self
                .space
                .ns()
                .revisions(hid)?
                .iter()
                .any(|r| r.id.0 == rev)
            {
                return Err(Error::NotFound);
            }
            Ok((RevisionId(rev), ()))
        })?;
        let ino = self.restore_pinned(path, hid, rev, c)?;
        // Other nodes see the restored content when this returns.
        self.publish_pending()?;
        Ok(ino)
    }

    fn restore_pinned(&self, path: &[u8], hid: HistoryId, rev: u64, c: Caller) -> Result<InodeId> {
        let content = self.space.files().load_revision(RevisionId(rev))?;
        let ino = match self.resolve(path)? {
            Some(ino) => ino,
            None => {
                let (dir, name) = match path.iter().rposition(|b| *b == b'/') {
                    Some(i) => (&path[..i], &path[i + 1..]),
                    None => (&b""[..], path),
                };
                let parent = self.resolve(dir)?.ok_or(Error::NotFound)?;
                let owner = self.space.ns().history(hid)?.ino;
                let perm = self.space.ns().get_inode(owner)?.map_or(0o644, |r| r.perm);
                let attr = self.make_node(
                    parent,
                    name,
                    new_record(NodeKind::File, perm, c, parent, Vec::new()),
                )?;
                // The re-created file continues the unlinked path's history.
                self.space.ns().adopt_history(attr.ino, hid)?;
                attr.ino
            }
        };
        if self.record(ino)?.kind != NodeKind::File {
            return Err(Error::IsDir);
        }
        // Through the open node, like truncate: ordered with every open and commit of it.
        let node = self.open_ref(ino, None, true, false)?;
        let result = (|| {
            let mut n = node.lock();
            if n.writers > 1 {
                return Err(Error::Busy);
            }
            // Replacing the state releases the pins an uncommitted one (a failed save) held.
            n.file = content;
            n.file.mark_replaced();
            // The revision's extended attributes come back with its bytes (first, so the
            // commit below records them in the new revision).
            // Under the node's lock: no write checks for file capabilities meanwhile, and
            // the next one reads them again.
            n.xattr_epoch += 1;
            n.no_caps_at = None;
            self.space.ns().restore_xattrs(ino, RevisionId(rev))?;
            let now = Timestamp::now();
            n.rec.mtime = now;
            n.rec.ctime = now;
            self.commit_node(ino, &mut n, Seal::Complete, HandleId::NONE)
        })();
        self.unref(ino, &node, true);
        result.map(|()| ino)
    }

    /// Remembers `value` for process `pid`, for a control request that needs more than an
    /// xattr name can carry (a path); answered by the next `selection(pid)`.
    pub fn select(&self, pid: u32, value: Vec<u8>) {
        let mut s = self.selections.lock();
        s.retain(|(p, _)| *p != pid);
        keep_for(&mut s, pid, value);
    }

    /// A piece of a path selected in pieces: kept for `pid` (at most `SELECTIONS_MAX`
    /// processes' pieces, each path below PATH_MAX), or, with `last`, taken with the ones
    /// before it and returned whole. None: a piece kept, or a path too long (its pieces
    /// are dropped).
    pub fn select_piece(&self, pid: u32, piece: &[u8], last: bool) -> Option<Vec<u8>> {
        let mut s = self.selection_parts.lock();
        let at = s.iter().position(|(p, _)| *p == pid);
        let mut path = match at {
            Some(i) => s.remove(i).map(|(_, v)| v).unwrap_or_default(),
            None => Vec::new(),
        };
        path.extend_from_slice(piece);
        if path.len() >= libc::PATH_MAX as usize {
            return None;
        }
        if last {
            return Some(path);
        }
        keep_for(&mut s, pid, path);
        None
    }

    /// Whether `path` (relative to the root) names inode `ino` now.
    pub fn names(&self, path: &[u8], ino: InodeId) -> bool {
        matches!(self.resolve(path), Ok(Some(i)) if i == ino)
    }

    pub fn selection(&self, pid: u32) -> Option<Vec<u8>> {
        self.selections
            .lock()
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, v)| v.clone())
    }

    pub fn stats(&self) -> Result<Stats> {
        Ok(self.space.report().stats()?)
    }
}

/// Remembers `b` non-hole bytes of `key` in `c` (the locked `Fs::data_bytes_cache`), which
/// is emptied when full.
fn cache_data_bytes(
    c: &mut HashMap<(InodeId, RevisionId), u64>,
    key: (InodeId, RevisionId),
    b: u64,
) {
    if c.len() >= DATA_BYTES_CACHE_MAX {
        c.clear();
    }
    c.insert(key, b);
}

/// Keeps `value` for process `pid` in `q` (no entry of `pid` there), dropping the oldest
/// entry when `q` holds `SELECTIONS_MAX`.
fn keep_for(q: &mut std::collections::VecDeque<(u32, Vec<u8>)>, pid: u32, value: Vec<u8>) {
    if q.len() >= SELECTIONS_MAX {
        q.pop_front();
    }
    q.push_back((pid, value));
}

/// What `Fs::read_reply` produced.
pub enum ReadReply {
    /// The bytes are in the caller's buffer.
    Bytes,
    /// The bytes are these pieces of verified chunks and holes, in order.
    Parts(Vec<ckptfs_engine::face::ReadPart>),
}
