//! One namespace over every slot of a multi-slot space: this slot's own tree (its metadata
//! table) merged with what the other slots published (their manifests, `engine::manifest`).
//!
//! - A name found in several slots: directories are merged (one directory listing the
//!   entries of all of them); otherwise the entry changed last (ctime) wins.
//! - Entries that exist only in other slots get inode numbers of their own (bits 62..63 =
//!   1), each naming a path (a merged directory) or one slot's node (a file, a symlink).
//! - Their files are read straight from the data file at the published locations and
//!   verified by blake3; a chunk that fails (the owner's gc moved it) makes the slot's
//!   manifest be read again, and the read retried once.
//! - Changes always go to this slot: creating in a directory that exists only elsewhere
//!   first makes it here (same path, mode and owner); writing, chmod, chown, utimes or
//!   truncate of another slot's file change this slot's version of it (a layer on top);
//!   a directory's attributes are each slot's own, and changing those of a directory only
//!   other slots have is EROFS;
//!   removing another slot's entry publishes a whiteout that hides it everywhere; renaming
//!   it is EXDEV (`mv` then copies and removes).
//! - This slot publishes what changed at every durable commit (a file's close or fsync, a
//!   directory fsync) before the call returns, and at most a second after any other change.
//!   Others see it when they next read the headers: every second, and before answering
//!   any lookup (one header read shared by the lookups that wait for it), so a path looked
//!   up after another node's close returned shows what that close wrote. The kernel caches
//!   nothing of a multi-slot mount (attribute and entry timeouts 0).

use super::{Attr, DirItem, Error, Fs, Result};
use ckptfs_engine::format::{
    HistoryId, InodeId, InodeRecord, NodeKind, RevisionId, SlotId, Timestamp,
};
use ckptfs_engine::manifest::PubNode;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REMOTE: u64 = 1;
/// readdir offsets of entries from other slots, after the local ones (whose offsets are
/// cookies, far below this).
const REMOTE_OFFSET: u64 = 1 << 62;
/// Times a read of another slot's chunk that fails its blake3 check reads that slot's
/// manifest again (50, 100, 200, 400 ms apart) before EIO.
const READ_RETRIES: u32 = 4;
/// Decoded chunks of other slots kept for reads (each up to the largest chunk size).
const CHUNK_CACHE_MAX: usize = 256;
/// Handles this module opens for itself (`copy_up`) have the top bit set: the mount numbers
/// the kernel's from 1 up, so the two never meet.
const INTERNAL_HANDLE: u64 = 1 << 63;
static NEXT_INTERNAL: AtomicU64 = AtomicU64::new(1);

pub fn is_remote(ino: InodeId) -> bool {
    ino.0 >> 62 == REMOTE
}

/// What an inode number of another slot's entry stands for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Remote {
    /// A directory found only in other slots, by its path (components).
    Dir(Vec<Vec<u8>>),
    /// A node of one slot: its inode number there.
    Node(SlotId, InodeId, Vec<Vec<u8>>),
    /// A regular file several slots have a version of (one written in parts by several
    /// nodes): read as their layers, newest on top.
    Merged(Vec<Vec<u8>>),
}

#[derive(Default)]
pub(crate) struct Remotes {
    by_ino: HashMap<InodeId, Remote>,
    by_ref: HashMap<Remote, InodeId>,
    next: u64,
    /// Touched since the last publication: directories and nodes of this slot.
    touched_dirs: std::collections::BTreeSet<InodeId>,
    touched_nodes: std::collections::BTreeSet<InodeId>,
    touched_whiteouts: std::collections::BTreeSet<Vec<u8>>,
    /// This slot's whiteouts (loaded from its table at first use).
    own_whiteouts: Option<HashMap<Vec<u8>, Timestamp>>,
    chunks: HashMap<ckptfs_engine::format::ChunkHash, Arc<[u8]>>,
}

impl Remotes {
    fn ino_of(&mut self, r: Remote) -> InodeId {
        if let Some(i) = self.by_ref.get(&r) {
            return *i;
        }
        self.next += 1;
        let ino = InodeId((REMOTE << 62) | self.next);
        self.by_ino.insert(ino, r.clone());
        self.by_ref.insert(r, ino);
        ino
    }
}

fn attr_of(ino: InodeId, n: &PubNode) -> Attr {
    let mut rec = InodeRecord::new(n.kind, n.perm, n.uid, n.gid);
    rec.nlink = if n.kind == NodeKind::Dir { 2 } else { 1 };
    rec.size = n.size;
    rec.mtime = n.mtime;
    rec.ctime = n.ctime;
    rec.atime = n.mtime;
    rec.crtime = n.ctime;
    rec.current_rev = RevisionId(n.rev);
    rec.history = HistoryId::NONE;
    rec.target = n.target.clone();
    Attr {
        ino,
        rec,
        data_bytes: Some(n.extents.iter().map(|e| e.len as u64).sum()),
    }
}

impl Fs {
    /// Whether this space shows other slots (a mounted slot of a multi-slot space).
    pub(crate) fn has_union(&self) -> bool {
        self.space.union().is_some()
    }

    /// Records that directory `dirs` and nodes `nodes` of this slot changed, for the next
    /// publication.
    pub(crate) fn touch(&self, dirs: &[InodeId], nodes: &[InodeId]) {
        if !self.has_union() {
            return;
        }
        let mut r = self.remotes.lock();
        r.touched_dirs.extend(dirs.iter().copied());
        r.touched_nodes.extend(nodes.iter().copied());
    }

    /// Publishes what changed since the last publication (see the module comment). Failed
    /// publications are put back and retried at the next one.
    pub fn publish_pending(&self) -> Result<()> {
        if !self.has_union() || self.space.is_read_only() {
            return Ok(());
        }
        // One publication at a time, and the touched set is taken inside it: a caller whose
        // change another caller's publication took returns only once that one is done
        // (close-to-open for every close).
        let _one = self.publishing.lock();
        let (dirs, nodes, wh) = {
            let mut r = self.remotes.lock();
            (
                std::mem::take(&mut r.touched_dirs),
                std::mem::take(&mut r.touched_nodes),
                std::mem::take(&mut r.touched_whiteouts),
            )
        };
        if dirs.is_empty() && nodes.is_empty() && wh.is_empty() {
            return Ok(());
        }
        let d: Vec<InodeId> = dirs.iter().copied().collect();
        let n: Vec<InodeId> = nodes.iter().copied().collect();
        let w: Vec<Vec<u8>> = wh.iter().cloned().collect();
        if let Err(e) = self.space.publish(&d, &n, &w) {
            let mut r = self.remotes.lock();
            r.touched_dirs.extend(dirs);
            r.touched_nodes.extend(nodes);
            r.touched_whiteouts.extend(wh);
            return Err(e.into());
        }
        Ok(())
    }

    /// Publishes this slot's whole namespace (at mount, and after gc moved chunks).
    pub fn publish_all(&self) -> Result<()> {
        if !self.has_union() || self.space.is_read_only() {
            return Ok(());
        }
        Ok(self.space.publish_snapshot()?)
    }

    /// Reads the other slots' headers and new manifest records.
    pub fn refresh_union(&self) -> Result<()> {
        match self.space.union() {
            Some(u) => Ok(u.refresh()?),
            None => Ok(()),
        }
    }

    /// A refresh that started at `t` or later (shared with concurrent callers); a failure
    /// is logged and the last views are used.
    pub(crate) fn refresh_since(&self, t: Instant) {
        if let Some(u) = self.space.union() {
            if let Err(e) = u.refresh_since(t) {
                log::warn!("reading the other slots' manifests: {e}");
            }
        }
    }

    /// The path (components) of directory `dir`, local or remote.
    pub(crate) fn dir_path(&self, dir: InodeId) -> Result<Vec<Vec<u8>>> {
        if is_remote(dir) {
            let r = self.remotes.lock().by_ino.get(&dir).cloned();
            return match r {
                Some(Remote::Dir(p)) => Ok(p),
                Some(Remote::Node(..)) | Some(Remote::Merged(_)) => Err(Error::NotDir),
                None => Err(Error::NotFound),
            };
        }
        let mut comps = Vec::new();
        let mut ino = dir;
        while ino != InodeId::ROOT {
            let rec = self.record(ino)?;
            if rec.kind != NodeKind::Dir {
                return Err(Error::NotDir);
            }
            comps.push(rec.target.clone());
            ino = rec.parent;
        }
        comps.reverse();
        Ok(comps)
    }

    /// This slot's directory at `path`, if it has one.
    pub(crate) fn local_dir(&self, path: &[Vec<u8>]) -> Result<Option<InodeId>> {
        let mut ino = InodeId::ROOT;
        for c in path {
            match self.space.lookup(ino, c)? {
                Some(i) => ino = i,
                None => return Ok(None),
            }
        }
        Ok(Some(ino))
    }

    /// The local directory a change in `dir` goes to: `dir` itself, or for a directory of
    /// other slots, this slot's directory at its path, made (with the same mode and owner
    /// as the newest of theirs) where missing.
    pub(crate) fn local_parent(&self, dir: InodeId) -> Result<InodeId> {
        if !is_remote(dir) {
            return Ok(dir);
        }
        let path = self.dir_path(dir)?;
        self.local_dir_made(&path)
    }

    /// This slot's directory at `path`, made where missing like the other slots' ones.
    fn local_dir_made(&self, path: &[Vec<u8>]) -> Result<InodeId> {
        let mut ino = InodeId::ROOT;
        for i in 0..path.len() {
            if let Some(c) = self.space.lookup(ino, &path[i])? {
                ino = c;
                continue;
            }
            let like = self
                .remote_nodes(&path[..=i])
                .into_iter()
                .filter(|(_, n)| n.kind == NodeKind::Dir)
                .max_by_key(|(_, n)| n.ctime)
                .ok_or(Error::NotFound)?
                .1;
            let c = super::Caller {
                uid: like.uid,
                gid: like.gid,
            };
            let rec = super::new_record(NodeKind::Dir, like.perm, c, ino, Vec::new());
            ino = match self.make_node_here(ino, &path[i], rec) {
                Ok(a) => a.ino,
                Err(Error::Exists) => self.space.lookup(ino, &path[i])?.ok_or(Error::NotFound)?,
                Err(e) => return Err(e),
            };
        }
        Ok(ino)
    }

    /// Every other slot's node at `path` that no whiteout hides.
    fn remote_nodes(&self, path: &[Vec<u8>]) -> Vec<(SlotId, PubNode)> {
        let Some(u) = self.space.union() else {
            return Vec::new();
        };
        let comps: Vec<&[u8]> = path.iter().map(|c| c.as_slice()).collect();
        let joined = join(path);
        u.views()
            .into_iter()
            .filter_map(|(s, v)| v.resolve(&comps).map(|n| (s, n.clone())))
            .filter(|(s, n)| !self.hidden(&joined, Some(*s), n.ctime))
            .collect()
    }

    /// Whether an entry at `path` of slot `slot` (None: this slot's own) changed at
    /// `ctime` is hidden by a later whiteout of another slot (or of this one).
    pub(crate) fn hidden(&self, path: &[u8], slot: Option<SlotId>, ctime: Timestamp) -> bool {
        let Some(u) = self.space.union() else {
            return false;
        };
        if slot.is_some() {
            let mut r = self.remotes.lock();
            if r.own_whiteouts.is_none() {
                match self.space.whiteouts() {
                    Ok(w) => r.own_whiteouts = Some(w.into_iter().collect()),
                    Err(e) => log::warn!("reading this slot's whiteouts: {e}"),
                }
            }
            if r.own_whiteouts
                .as_ref()
                .and_then(|w| w.get(path))
                .is_some_and(|t| *t > ctime)
            {
                return true;
            }
        }
        u.views()
            .iter()
            .any(|(s, v)| Some(*s) != slot && v.whiteouts.get(path).is_some_and(|t| *t > ctime))
    }

    /// Removes another slot's entry for everyone: a whiteout, later than the entry.
    pub(crate) fn write_whiteout(&self, path: &[Vec<u8>], newer_than: Timestamp) -> Result<()> {
        let joined = join(path);
        let mut when = Timestamp::now();
        if when <= newer_than {
            when = Timestamp {
                secs: newer_than.secs,
                nanos: newer_than.nanos + 1,
            };
        }
        self.space.put_whiteout(&joined, when)?;
        let mut r = self.remotes.lock();
        if let Some(w) = r.own_whiteouts.as_mut() {
            w.insert(joined.clone(), when);
        }
        r.touched_whiteouts.insert(joined);
        Ok(())
    }

    /// What a removal of `name` in `dir` must do in a shared namespace: `Ok(Some(d))`
    /// remove this slot's entry in its directory `d` (and, `wh`, also hide the other
    /// slots' entries there); `Ok(None)`: the name was only other slots', and is hidden now.
    pub(crate) fn union_remove(
        &self,
        dir: InodeId,
        name: &[u8],
        want_dir: bool,
    ) -> Result<Option<(InodeId, bool)>> {
        let mut path = self.dir_path(dir)?;
        path.push(name.to_vec());
        self.refresh_since(Instant::now());
        let local_dir = self.local_dir(&path[..path.len() - 1])?;
        let local = match local_dir {
            Some(d) => self.space.lookup(d, name)?,
            None => None,
        };
        let remote = self.remote_nodes(&path);
        match (local_dir, local) {
            (Some(d), Some(_)) => return Ok(Some((d, !remote.is_empty()))),
            (Some(d), None) if remote.is_empty() => return Ok(Some((d, false))),
            (None, None) if remote.is_empty() => return Err(Error::NotFound),
            _ => {}
        }
        let newest = remote
            .iter()
            .map(|(_, n)| n.ctime)
            .max()
            .expect("remote is not empty");
        let is_dir = remote.iter().any(|(_, n)| n.kind == NodeKind::Dir);
        match (want_dir, is_dir) {
            (true, false) => return Err(Error::NotDir),
            (false, true) => return Err(Error::IsDir),
            _ => {}
        }
        if is_dir && !self.remote_entries(&path).is_empty() {
            return Err(Error::NotEmpty);
        }
        self.write_whiteout(&path, newest)?;
        Ok(None)
    }

    /// Lookup over the union: `local` is this slot's answer (already found).
    pub(crate) fn union_lookup(
        &self,
        parent: InodeId,
        name: &[u8],
        local: Option<InodeId>,
        refresh: bool,
    ) -> Result<Attr> {
        let mut path = self.dir_path(parent)?;
        path.push(name.to_vec());
        if refresh {
            // Close-to-open: a name looked up after another node's close returned finds
            // what that close published.
            self.refresh_since(Instant::now());
        }
        let remote = self.remote_nodes(&path);
        let local_attr = match local {
            Some(i) => Some(self.getattr(i)?),
            None => None,
        }
        // Another node removed this slot's entry (a later whiteout).
        .filter(|a| !self.hidden(&join(&path), None, a.rec.ctime));
        // One rule, the same on every node: the entry changed last decides the kind; a
        // directory merges every slot's directory there; a regular file merges every
        // version changed after the last non-file entry there (its layers, N-1); anything
        // else is the newest one alone.
        let local_kind = local_attr.as_ref().map(|a| (a.rec.kind, a.rec.ctime));
        let newest = remote
            .iter()
            .map(|(_, n)| (n.kind, n.ctime))
            .chain(local_kind)
            .max_by_key(|(_, t)| *t)
            .ok_or(Error::NotFound)?;
        match newest.0 {
            NodeKind::Dir => match &local_attr {
                Some(a) if a.rec.kind == NodeKind::Dir => Ok(a.clone()),
                _ => {
                    let d = remote
                        .iter()
                        .filter(|(_, n)| n.kind == NodeKind::Dir)
                        .max_by_key(|(_, n)| n.ctime)
                        .map(|(_, n)| n.clone())
                        .ok_or(Error::NotFound)?;
                    let ino = self.remotes.lock().ino_of(Remote::Dir(path));
                    Ok(attr_of(ino, &d))
                }
            },
            NodeKind::File => {
                let floor = file_floor(&remote, local_kind);
                let remote_files: Vec<&(SlotId, PubNode)> = remote
                    .iter()
                    .filter(|(_, n)| n.kind == NodeKind::File && n.ctime > floor)
                    .collect();
                let local_file = local_attr
                    .as_ref()
                    .filter(|a| a.rec.kind == NodeKind::File && a.rec.ctime > floor);
                match (local_file, remote_files.as_slice()) {
                    (Some(a), []) => Ok(a.clone()),
                    (None, [(s, n)]) => Ok(self.remote_attr(*s, n, path)),
                    _ => {
                        // Several versions of one file: its layers.
                        let ino = self.remotes.lock().ino_of(Remote::Merged(path));
                        self.remote_getattr(ino)
                    }
                }
            }
            _ => match &local_attr {
                Some(a) if a.rec.ctime == newest.1 && a.rec.kind == newest.0 => Ok(a.clone()),
                _ => {
                    let (s, n) = remote
                        .iter()
                        .max_by_key(|(_, n)| n.ctime)
                        .ok_or(Error::NotFound)?;
                    Ok(self.remote_attr(*s, n, path))
                }
            },
        }
    }

    fn remote_attr(&self, slot: SlotId, n: &PubNode, path: Vec<Vec<u8>>) -> Attr {
        let ino = self.remotes.lock().ino_of(Remote::Node(slot, n.ino, path));
        attr_of(ino, n)
    }

    /// The node an inode number of another slot's entry names, as now published.
    fn remote_node(&self, ino: InodeId) -> Result<(Option<SlotId>, PubNode)> {
        let r = self.remotes.lock().by_ino.get(&ino).cloned();
        match r.ok_or(Error::NotFound)? {
            Remote::Dir(path) => {
                let d = self
                    .remote_nodes(&path)
                    .into_iter()
                    .filter(|(_, n)| n.kind == NodeKind::Dir)
                    .max_by_key(|(_, n)| n.ctime)
                    .map(|(_, n)| n);
                match d {
                    Some(d) => Ok((None, d)),
                    // Gone from the other slots: this slot may have it now.
                    None => match self.local_dir(&path)? {
                        Some(l) => {
                            let a = self.getattr(l)?;
                            Ok((
                                None,
                                PubNode {
                                    ino,
                                    kind: NodeKind::Dir,
                                    perm: a.rec.perm,
                                    uid: a.rec.uid,
                                    gid: a.rec.gid,
                                    mtime: a.rec.mtime,
                                    ctime: a.rec.ctime,
                                    size: 0,
                                    rev: 0,
                                    target: Vec::new(),
                                    extents: Vec::new(),
                                },
                            ))
                        }
                        None => Err(Error::NotFound),
                    },
                }
            }
            Remote::Node(slot, rino, _) => {
                let v = self
                    .space
                    .union()
                    .and_then(|u| u.view(slot))
                    .ok_or(Error::NotFound)?;
                let n = v.nodes.get(&rino).cloned().ok_or(Error::NotFound)?;
                Ok((Some(slot), n))
            }
            Remote::Merged(path) => Ok((None, self.merged_node(ino, &path)?)),
        }
    }

    /// What a file several slots have versions of looks like: the newest version's
    /// attributes, the largest size.
    fn merged_node(&self, ino: InodeId, path: &[Vec<u8>]) -> Result<PubNode> {
        let layers = self.layers(path)?;
        let top = layers.last().ok_or(Error::NotFound)?;
        let mut n = match top {
            Layer::Remote(n) => n.clone(),
            Layer::Local(a) => PubNode {
                ino,
                kind: NodeKind::File,
                perm: a.rec.perm,
                uid: a.rec.uid,
                gid: a.rec.gid,
                mtime: a.rec.mtime,
                ctime: a.rec.ctime,
                size: 0,
                rev: 0,
                target: Vec::new(),
                extents: Vec::new(),
            },
        };
        n.size = layers.iter().map(Layer::size).max().unwrap_or(0);
        n.extents = Vec::new();
        Ok(n)
    }

    /// The versions of the regular file at `path` every node sees (this slot's committed
    /// one and the other slots' that no whiteout hides), oldest change first.
    fn layers(&self, path: &[Vec<u8>]) -> Result<Vec<Layer>> {
        let remote = self.remote_nodes(path);
        let mut local = None;
        if let Some(d) = self.local_dir(&path[..path.len() - 1])? {
            if let Some(l) = self.space.lookup(d, &path[path.len() - 1])? {
                let a = self.getattr(l)?;
                if !self.hidden(&join(path), None, a.rec.ctime) {
                    local = Some(a);
                }
            }
        }
        let floor = file_floor(&remote, local.as_ref().map(|a| (a.rec.kind, a.rec.ctime)));
        let mut out: Vec<Layer> = remote
            .into_iter()
            .filter(|(_, n)| n.kind == NodeKind::File && n.ctime > floor)
            .map(|(_, n)| Layer::Remote(n))
            .collect();
        if let Some(a) = local.filter(|a| a.rec.kind == NodeKind::File && a.rec.ctime > floor) {
            out.push(Layer::Local(a));
        }
        out.sort_by_key(Layer::ctime);
        Ok(out)
    }

    /// The path of another slot's file (or a merged one), for writes that go to this slot.
    fn file_path(&self, ino: InodeId) -> Result<Vec<Vec<u8>>> {
        let r = self.remotes.lock().by_ino.get(&ino).cloned();
        match r {
            Some(Remote::Node(_, _, p)) | Some(Remote::Merged(p)) => Ok(p),
            Some(Remote::Dir(_)) => Err(Error::IsDir),
            None => Err(Error::NotFound),
        }
    }

    /// Opens for writing a file another slot has (alone, or with this one): the writes go to
    /// this slot's version of the path, made (empty, with the newest version's mode and
    /// owner) when missing. Without O_TRUNC it is one more layer of the file: a shared
    /// file written in parts by several nodes reads as all of them. With O_TRUNC, a
    /// whiteout hides the other slots' versions changed before now.
    pub(crate) fn open_layer(
        &self,
        ino: InodeId,
        fh: super::HandleId,
        truncate: bool,
    ) -> Result<()> {
        let path = self.file_path(ino)?;
        let (name, dir) = path.split_last().ok_or(Error::Invalid)?;
        let parent = self.local_dir_made(dir)?;
        let newest = self
            .remote_nodes(&path)
            .into_iter()
            .filter(|(_, n)| n.kind == NodeKind::File)
            .max_by_key(|(_, n)| n.ctime);
        let local = match self.space.lookup(parent, name)? {
            Some(l) => l,
            None => {
                let like = newest.as_ref().map(|(_, n)| n).ok_or(Error::NotFound)?;
                let c = super::Caller {
                    uid: like.uid,
                    gid: like.gid,
                };
                let rec = super::new_record(NodeKind::File, like.perm, c, parent, Vec::new());
                self.make_node_here(parent, name, rec)?.ino
            }
        };
        if truncate {
            if let Some((_, n)) = &newest {
                self.write_whiteout(&path, n.ctime)?;
            }
        }
        self.open_local(local, fh, truncate)
    }

    /// chmod, chown, utimes and truncate of an entry whose visible version is another
    /// slot's. The change is made to this slot's version of the path, which then is the
    /// newest, so every node takes the attributes from it:
    /// - a regular file: this slot's version is made (an empty layer with the newest
    ///   version's mode, owner and times) or reused, then changed. Growing the file, or
    ///   changing attributes only, copies nothing: the other versions' bytes fall through
    ///   the empty layer. Truncating to 0 hides the other versions (a whiteout).
    ///   Truncating to a smaller size copies the first `size` bytes into this slot's
    ///   version (1 MiB at a time) before the whiteout hides the others: their bytes past
    ///   the new end must not show through again, and layers cannot cut those off.
    /// - directories (see below) and other kinds (symlinks, fifos, devices): EROFS.
    ///
    /// Returns this slot's inode that was changed.
    pub(crate) fn remote_setattr(&self, ino: InodeId, s: &super::SetAttr) -> Result<InodeId> {
        self.refresh_since(Instant::now());
        let r = self.remotes.lock().by_ino.get(&ino).cloned();
        let path = match r.ok_or(Error::NotFound)? {
            // A directory's attributes are each slot's own (a merged directory shows this
            // slot's copy where it has one): a change here could not reach the copies of
            // the nodes that made it, so it is refused rather than seen on one node only.
            Remote::Dir(_) => return Err(Error::ReadOnly),
            Remote::Node(_, _, path) | Remote::Merged(path) => path,
        };
        let kind = self.remote_node(ino)?.1.kind;
        match kind {
            NodeKind::File => {}
            NodeKind::Dir => return Err(Error::IsDir),
            _ => return Err(Error::ReadOnly),
        }
        let (name, dir) = path.split_last().ok_or(Error::Invalid)?;
        let parent = self.local_dir_made(dir)?;
        let layers = self.layers(&path)?;
        let merged_size = layers.iter().map(Layer::size).max().unwrap_or(0);
        let newest_remote = layers
            .iter()
            .filter_map(|l| match l {
                Layer::Remote(n) => Some(n.clone()),
                Layer::Local(_) => None,
            })
            .max_by_key(|n| n.ctime);
        let local = match self.space.lookup(parent, name)? {
            Some(l) => {
                let is_layer = layers.iter().any(|l| matches!(l, Layer::Local(_)));
                if !is_layer {
                    // This slot's entry is older than what hides it (a whiteout, or a newer
                    // non-file): its bytes must not come back with the new ctime.
                    if self.getattr(l)?.rec.kind != NodeKind::File {
                        return Err(Error::ReadOnly);
                    }
                    self.setattr(
                        l,
                        &super::SetAttr {
                            size: Some(0),
                            ..Default::default()
                        },
                    )?;
                }
                l
            }
            None => {
                let like = newest_remote.as_ref().ok_or(Error::NotFound)?;
                let c = super::Caller {
                    uid: like.uid,
                    gid: like.gid,
                };
                let mut rec = super::new_record(NodeKind::File, like.perm, c, parent, Vec::new());
                rec.mtime = like.mtime;
                rec.atime = like.mtime;
                self.make_node_here(parent, name, rec)?.ino
            }
        };
        match s.size {
            Some(size) if size < merged_size => {
                if size > 0 {
                    let merged = self.remotes.lock().ino_of(Remote::Merged(path.clone()));
                    self.copy_up(merged, local, size)?;
                }
                if let Some(n) = &newest_remote {
                    self.write_whiteout(&path, n.ctime)?;
                }
            }
            _ => {}
        }
        self.setattr(local, s)?;
        Ok(local)
    }

    /// The attributes of the path of another slot's entry `ino` after this slot changed its
    /// own version of it (`remote_setattr`): what every node sees now, under `ino`.
    pub(crate) fn changed_attr(&self, ino: InodeId) -> Result<Attr> {
        let path = self.file_path(ino)?;
        Ok(attr_of(ino, &self.merged_node(ino, &path)?))
    }

    /// Copies bytes [0, len) of the merged file `merged` into this slot's version `local`
    /// through a handle of its own, 1 MiB at a time (the memory this takes).
    fn copy_up(&self, merged: InodeId, local: InodeId, len: u64) -> Result<()> {
        const PIECE: u64 = 1 << 20;
        let fh = super::HandleId(INTERNAL_HANDLE | NEXT_INTERNAL.fetch_add(1, Ordering::Relaxed));
        self.open_local(local, fh, false)?;
        let copied = (|| -> Result<()> {
            let mut off = 0;
            while off < len {
                let n = PIECE.min(len - off);
                let mut data = self.remote_read(merged, off, n as usize)?;
                // Past the end of every version: zeros (a hole of the merged file).
                data.resize(n as usize, 0);
                self.write(local, fh, 0, off, &data)?;
                off += n;
            }
            self.flush(local, fh, 0)
        })();
        let released = self.release(local, fh);
        copied.and(released)
    }

    pub(crate) fn remote_getattr(&self, ino: InodeId) -> Result<Attr> {
        let (_, n) = self.remote_node(ino)?;
        Ok(attr_of(ino, &n))
    }

    pub(crate) fn remote_readlink(&self, ino: InodeId) -> Result<Vec<u8>> {
        let (_, n) = self.remote_node(ino)?;
        match n.kind {
            NodeKind::Symlink => Ok(n.target),
            _ => Err(Error::Invalid),
        }
    }

    /// The parent of a remote directory (for ".."): local where this slot has it.
    pub(crate) fn remote_parent(&self, dir: InodeId) -> Result<InodeId> {
        let mut path = self.dir_path(dir)?;
        path.pop();
        if let Some(l) = self.local_dir(&path)? {
            return Ok(l);
        }
        Ok(self.remotes.lock().ino_of(Remote::Dir(path)))
    }

    /// The entries of other slots in directory `path` that `skip` (this slot's names) does
    /// not have: name -> (kind, winning slot, node).
    fn remote_entries(
        &self,
        path: &[Vec<u8>],
    ) -> BTreeMap<Vec<u8>, (NodeKind, SlotId, InodeId, ckptfs_engine::format::Timestamp)> {
        let mut out: BTreeMap<Vec<u8>, (NodeKind, SlotId, InodeId, _)> = BTreeMap::new();
        let Some(u) = self.space.union() else {
            return out;
        };
        let comps: Vec<&[u8]> = path.iter().map(|c| c.as_slice()).collect();
        for (slot, v) in u.views() {
            let Some(dir) = v.resolve(&comps).filter(|n| n.kind == NodeKind::Dir) else {
                continue;
            };
            let Some(d) = v.dirs.get(&dir.ino) else {
                continue;
            };
            for (name, ino, kind) in &d.entries {
                let ctime = v.nodes.get(ino).map(|n| n.ctime).unwrap_or_default();
                let mut p = join(path);
                if !p.is_empty() {
                    p.push(b'/');
                }
                p.extend_from_slice(name);
                if self.hidden(&p, Some(slot), ctime) {
                    continue;
                }
                // The entry changed last gives the name its kind (as in `union_lookup`).
                let keep = match out.get(name) {
                    None => true,
                    Some((_, _, _, t)) => ctime > *t,
                };
                if keep {
                    out.insert(name.clone(), (*kind, slot, *ino, ctime));
                }
            }
        }
        out
    }

    /// readdir's entries from other slots, after this slot's own (`local`: its names).
    pub(crate) fn remote_readdir(
        &self,
        dir: InodeId,
        offset: u64,
        limit: usize,
        local: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<DirItem>> {
        let path = self.dir_path(dir)?;
        let start = offset.saturating_sub(REMOTE_OFFSET) as usize;
        let mut out = Vec::new();
        for (i, (name, (kind, slot, rino, _))) in self
            .remote_entries(&path)
            .into_iter()
            .filter(|(n, _)| !local(n))
            .enumerate()
            .skip(start)
        {
            if out.len() >= limit {
                break;
            }
            let mut p = path.clone();
            p.push(name.clone());
            let r = match kind {
                NodeKind::Dir => Remote::Dir(p),
                _ => Remote::Node(slot, rino, p),
            };
            let ino = self.remotes.lock().ino_of(r);
            out.push(DirItem {
                offset: REMOTE_OFFSET + i as u64 + 1,
                ino,
                kind,
                name,
            });
        }
        Ok(out)
    }

    pub(crate) fn is_remote_offset(offset: u64) -> bool {
        offset >= REMOTE_OFFSET
    }

    /// Reads a file of another slot: chunk by chunk at its published locations, verified.
    pub(crate) fn remote_read(&self, ino: InodeId, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut tries = 0;
        loop {
            match self.remote_read_once(ino, off, len) {
                Err(Error::Engine(ckptfs_engine::Error::Corrupt(c))) if tries < READ_RETRIES => {
                    // The owner may have moved the chunk (gc) and be about to publish where
                    // to: read its manifest again, a little later each time.
                    log::info!("reading another slot's file: {c}; reading its manifest again");
                    self.remotes.lock().chunks.clear();
                    std::thread::sleep(Duration::from_millis(50 << tries));
                    self.refresh_union()?;
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn remote_read_once(&self, ino: InodeId, off: u64, len: usize) -> Result<Vec<u8>> {
        // Bound first: a lock guard in the condition would live through the block.
        let r = self.remotes.lock().by_ino.get(&ino).cloned();
        if let Some(Remote::Merged(path)) = r {
            return self.merged_read(&path, off, len);
        }
        let (_, n) = self.remote_node(ino)?;
        if n.kind != NodeKind::File {
            return Err(Error::IsDir);
        }
        let end = (off + len as u64).min(n.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        self.paint_remote(&n, off, end, &mut out)?;
        Ok(out)
    }

    /// A file of several versions: each version's extents painted over the older ones', so
    /// a byte comes from the newest version that wrote it (holes are no writes).
    fn merged_read(&self, path: &[Vec<u8>], off: u64, len: usize) -> Result<Vec<u8>> {
        let layers = self.layers(path)?;
        let size = layers.iter().map(Layer::size).max().unwrap_or(0);
        let end = (off + len as u64).min(size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        for l in &layers {
            match l {
                Layer::Remote(n) => self.paint_remote(n, off, end, &mut out)?,
                Layer::Local(a) => {
                    let map = self.space.load_map(a.rec.current_rev)?;
                    for (es, e) in map.iter() {
                        let ee = es + e.len as u64;
                        if ee <= off || es >= end {
                            continue;
                        }
                        let raw = self.space.store().get_many(&[e.chunk])?.remove(0);
                        let (s, t) = (es.max(off), ee.min(end));
                        let from = e.chunk_off as usize + (s - es) as usize;
                        out[(s - off) as usize..(t - off) as usize]
                            .copy_from_slice(&raw[from..from + (t - s) as usize]);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Copies the bytes of another slot's version `n` within `[off, end)` into `out`.
    fn paint_remote(&self, n: &PubNode, off: u64, end: u64, out: &mut [u8]) -> Result<()> {
        let u = self.space.union().ok_or(Error::NotFound)?;
        // Extents are sorted by offset: start at the last one beginning at or before `off`.
        let first = n
            .extents
            .partition_point(|e| e.off <= off)
            .saturating_sub(1);
        for e in &n.extents[first..] {
            let (es, ee) = (e.off, e.off + e.len as u64);
            if es >= end {
                break;
            }
            if ee <= off {
                continue;
            }
            let cached = self.remotes.lock().chunks.get(&e.hash).cloned();
            let raw = match cached {
                Some(c) => c,
                None => {
                    let v: Arc<[u8]> = u.read_chunk(e)?.into_bytes().into();
                    let mut r = self.remotes.lock();
                    if r.chunks.len() >= CHUNK_CACHE_MAX {
                        r.chunks.clear();
                    }
                    r.chunks.insert(e.hash, v.clone());
                    v
                }
            };
            let (s, t) = (es.max(off), ee.min(end));
            let from = e.chunk_off as usize + (s - es) as usize;
            out[(s - off) as usize..(t - off) as usize]
                .copy_from_slice(&raw[from..from + (t - s) as usize]);
        }
        Ok(())
    }
}

/// One version of a file that several slots have.
enum Layer {
    /// This slot's committed version: its attributes (its extents are read by revision).
    Local(Attr),
    /// Another slot's published version.
    Remote(PubNode),
}

impl Layer {
    fn ctime(&self) -> Timestamp {
        match self {
            Layer::Local(a) => a.rec.ctime,
            Layer::Remote(n) => n.ctime,
        }
    }
    fn size(&self) -> u64 {
        match self {
            Layer::Local(a) => a.rec.size,
            Layer::Remote(n) => n.size,
        }
    }
}

/// The lock of the remote-inode table (kept apart from the open-file table).
pub(crate) type RemoteTable = Mutex<Remotes>;

/// A path's components joined with '/', as whiteouts name paths.
pub(crate) fn join(path: &[Vec<u8>]) -> Vec<u8> {
    path.join(&b'/')
}

/// The ctime of the newest entry at a path that is not a regular file: file versions
/// older than it are not part of the file there.
fn file_floor(remote: &[(SlotId, PubNode)], local: Option<(NodeKind, Timestamp)>) -> Timestamp {
    remote
        .iter()
        .map(|(_, n)| (n.kind, n.ctime))
        .chain(local)
        .filter(|(k, _)| *k != NodeKind::File)
        .map(|(_, t)| t)
        .max()
        .unwrap_or(Timestamp {
            secs: i64::MIN,
            nanos: 0,
        })
}
