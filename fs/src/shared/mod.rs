//! One POSIX namespace over every slot of a multi-slot space (FORMAT.md "Shared
//! namespace"), as the mounted slot serves it.
//!
//! - Objects (files, directories, symlinks, special nodes) have one inode number on every
//!   node: the creating slot's local inode number, which is in that slot's range.
//! - An entry is a *binding* `(parent object, name) -> object` that any slot may record;
//!   of every slot's records of one name the newest decides (`merge`). Directories hold
//!   no entries themselves, so a directory renamed by one node takes every node's entries
//!   in it along, files still open elsewhere included: their later close commits the same
//!   object, wherever it is now.
//! - Every change of names is serialised with the other nodes' changes of the same names
//!   by intents (`ckptfs_engine::nslock`), checked against what every node published
//!   (a refresh after the intent is held), committed durably and published before the
//!   call returns: what one node did, every node's next lookup sees.
//! - An object's attributes and a regular file's bytes come from its *versions*: the
//!   creating slot's inode, and an inode of any other slot that changed it (chmod, a
//!   write: a layer of the file's bytes on top of the older ones, so a file written in
//!   parts by several nodes reads whole). Writes always go to this slot's own version.
//! - Another slot's chunks are read at their published places by the store's one chunk
//!   reader (`Space::read_published`: the same cache, coalescing, blake3 verification and
//!   placement repair as this slot's own); a chunk that fails (its owner's gc moved it, and
//!   published where to before reusing the place) is looked for again in a fresh copy of
//!   that slot's manifest.

pub mod merge;

use super::{Attr, DirItem, Error, Fs, HandleId, Result, SetAttr};
use ckptfs_engine::face::{dir_key, name_key, RENAME_DIRS};
use ckptfs_engine::face::{
    owner_slot, Binding, ChunkHash, HistoryId, InodeId, InodeRecord, NodeKind, SlotId, Timestamp,
    VersionMeta,
};
use ckptfs_engine::face::{PubExtent, Record, SlotView};
use merge::Views;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// Times a read of another slot's chunk that fails its blake3 check reads that slot's
/// manifest again (the owner publishes a moved chunk's new place before reusing the old
/// one, so one fresh read normally finds it) before EIO.
const READ_RETRIES: u32 = 4;

/// This slot's side of the shared namespace.
pub(crate) struct Shared {
    pub(crate) me: SlotId,
    /// This slot's records as committed (the same view other nodes build from its
    /// manifest): applied after each change, rebuilt from the catalog at mount.
    own: RwLock<SlotView>,
    /// Versions (local inodes) committed since the last publication.
    touched: Mutex<BTreeSet<InodeId>>,
    /// A publication failed: the next one is a whole snapshot.
    republish: std::sync::atomic::AtomicBool,
    /// One publication at a time.
    publishing: Mutex<()>,
    /// Read handles of objects read through the merge (not this slot's file alone), with
    /// their read-ahead (at most one entry per open handle).
    merged_handles: Mutex<HashMap<HandleId, (InodeId, ckptfs_engine::face::ReadAhead)>>,
    /// The union's view generations at the last reconcile (`reconcile`).
    reconciled: Mutex<Vec<(SlotId, u64, u64)>>,
    /// Tells the kernel to drop a name (parent, name) another node removed: set by the
    /// mount (`Fs::set_entry_invalidator`); until then, and in tests without a kernel,
    /// nothing is told.
    pub(crate) invalidate_entry: std::sync::OnceLock<EntryInvalidator>,
    /// How old a refresh a lookup or getattr that finds its object may use
    /// (`set_lookup_window`): none (every one reads the hints) unless the mount is
    /// close-to-open.
    pub(crate) lookup_window: std::sync::OnceLock<std::time::Duration>,
    /// Changes of `own` (`own_write`), for the listing cache's key.
    own_gen: std::sync::atomic::AtomicU64,
    /// The last directory listed, sorted by offset, with the views it was listed from
    /// (`sorted_listing`): a listing's batches (a few dozen entries each) sorted the whole
    /// directory every time, 800 sorts of 20,000 names for one `ls -l`. One directory.
    listing: Mutex<Option<Listing>>,
    /// Extent maps of this slot's committed layers of files other nodes wrote too, by
    /// (layer, revision): a read of such a file paints this slot's layer from its map, which
    /// was loaded from the catalog (one row per extent) on every read request before. At
    /// most `LAYER_MAPS` (a 1 GiB layer's map is about 16,000 extents, under 1 MiB).
    layer_maps: Mutex<
        Vec<(
            InodeId,
            ckptfs_engine::face::RevisionId,
            Arc<ckptfs_engine::face::ExtentMap>,
        )>,
    >,
}

/// Extent maps of this slot's layers kept for reads through the merge (`Shared::
/// layer_maps`): a job's N-1 files read at once, each with this node's part.
const LAYER_MAPS: usize = 16;

/// How long a learning of other nodes' removals waits for the kernel to forget the inodes
/// whose names it was told to drop (it does so as soon as it processed the notification;
/// an inode a process holds is never forgotten, and costs this wait once).
const FORGET_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a writer that found the space full waits for the maintenance scheduler to learn
/// other nodes' removals (a refresh of the union, the retirement of this slot's removed
/// files, and the kernel's forgets, bounded by `FORGET_WAIT`) before gc.
const LEARN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Drops the kernel's cached name `(parent, name)` (FUSE_NOTIFY_INVAL_ENTRY), so the inode
/// it names is forgotten unless a process holds it.
pub type EntryInvalidator = Box<dyn Fn(InodeId, &[u8]) + Send + Sync>;

impl Shared {
    pub(crate) fn new(me: SlotId) -> Shared {
        Shared {
            me,
            own: RwLock::new(SlotView::default()),
            touched: Mutex::default(),
            republish: Default::default(),
            publishing: Mutex::new(()),
            merged_handles: Mutex::default(),
            reconciled: Mutex::default(),
            invalidate_entry: std::sync::OnceLock::new(),
            lookup_window: std::sync::OnceLock::new(),
            own_gen: Default::default(),
            listing: Mutex::default(),
            layer_maps: Mutex::default(),
        }
    }
}

impl Shared {
    /// `own` for a change, counted first (`listing`'s key): a listing that read the count
    /// before the change is keyed by the old count, which no later listing asks for.
    fn own_write(&self) -> parking_lot::RwLockWriteGuard<'_, SlotView> {
        self.own_gen
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.own.write()
    }
}

/// A directory's entries as `(offset, name, binding)`, sorted by offset.
type Entries = Arc<Vec<(u64, Vec<u8>, Binding)>>;

/// One directory's sorted entries and the views they came from: every other slot's view
/// (as the union holds it; a refresh that changes one replaces it) and this slot's count of
/// changes.
/// The views are held, not only named: a freed one's address could be a new one's.
struct Listing {
    dir: InodeId,
    others: Vec<(SlotId, Arc<SlotView>)>,
    own_gen: u64,
    entries: Entries,
}

/// What getattr and reads need of one version, copied out of the views.
#[derive(Clone)]
struct V {
    slot: SlotId,
    id: InodeId,
    meta: VersionMeta,
    node: ckptfs_engine::face::PubNode,
}

impl V {
    /// The version as the merge takes it: its slot and published version.
    fn into_pub(self) -> (SlotId, ckptfs_engine::face::PubVersion) {
        let V {
            slot, meta, node, ..
        } = self;
        (slot, ckptfs_engine::face::PubVersion { meta, node })
    }
}

fn attr_base(kind: NodeKind, perm: u32, uid: u32, gid: u32) -> InodeRecord {
    let mut rec = InodeRecord::new(kind, perm, uid, gid);
    rec.nlink = 1;
    rec.history = HistoryId::NONE;
    rec
}

impl Fs {
    fn sh(&self) -> &Shared {
        self.shared.as_ref().expect("a slot of a shared namespace")
    }

    /// Runs `f` over every slot's view (this one's own included).
    fn with_views<R>(&self, f: impl FnOnce(&Views) -> R) -> R {
        let sh = self.sh();
        let others = self
            .space
            .slots()
            .union()
            .map(|u| u.views())
            .unwrap_or_default();
        let own = sh.own.read();
        let mut list: Vec<(SlotId, &SlotView)> = others
            .iter()
            .filter(|(s, _)| *s != sh.me)
            .map(|(s, v)| (*s, &**v))
            .collect();
        list.push((sh.me, &own));
        f(&Views { list })
    }

    fn versions_of(&self, obj: InodeId) -> Vec<V> {
        self.with_views(|v| {
            v.versions(obj)
                .into_iter()
                .map(|(slot, pv)| V {
                    slot,
                    id: pv.id(),
                    meta: pv.meta,
                    node: pv.node.clone(),
                })
                .collect()
        })
    }

    /// Whether `obj` is this slot's regular file with no other version anywhere: then the
    /// local file is all of it, and the single-slot paths serve it.
    pub(crate) fn local_only(&self, obj: InodeId) -> bool {
        let me = self.sh().me;
        if obj == InodeId::ROOT || owner_slot(obj) != me {
            return false;
        }
        // Regular files only: a directory's times follow every node's entries in it, which
        // its local record does not see.
        self.with_views(|v| {
            v.list.iter().all(|(s, view)| match view.of.get(&obj) {
                None => true,
                Some(ids) => {
                    *s == me
                        && ids.len() == 1
                        && ids.contains(&obj)
                        && view
                            .versions
                            .get(&obj)
                            .is_some_and(|pv| pv.node.kind == NodeKind::File)
                }
            })
        })
    }

    /// Applies `recs` (just committed) to this slot's view and publishes them. The change
    /// that made them was committed non-durably: the publication makes it durable first
    /// (`Space::publish`), in the commit group, so a create or rename that arrives while
    /// closes are committing shares their transaction instead of syncing the table alone.
    fn apply_and_publish(&self, recs: Vec<Record>) -> Result<()> {
        let sh = self.sh();
        let _one = sh.publishing.lock();
        sh.own_write().apply(recs.clone());
        if sh.republish.load(std::sync::atomic::Ordering::Acquire) {
            self.space.slots().publish_snapshot()?;
            sh.republish
                .store(false, std::sync::atomic::Ordering::Release);
            return Ok(());
        }
        if let Err(e) = self.space.slots().publish(&recs) {
            sh.republish
                .store(true, std::sync::atomic::Ordering::Release);
            return Err(e.into());
        }
        Ok(())
    }

    /// Reloads this slot's view from its catalog and publishes all of it as a new manifest
    /// generation (at mount: a takeover publishes what the dead owner committed).
    pub(crate) fn sh_publish_all(&self) -> Result<()> {
        let sh = self.sh();
        let _one = sh.publishing.lock();
        let recs = self.space.slots().own_records()?;
        let mut v = SlotView::default();
        v.apply(recs);
        *sh.own_write() = v;
        if !self.space.is_read_only() {
            if let Err(e) = self.space.slots().publish_snapshot() {
                // The next publication tries the whole snapshot again.
                sh.republish
                    .store(true, std::sync::atomic::Ordering::Release);
                return Err(e.into());
            }
        }
        sh.republish
            .store(false, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Publishes the versions committed since the last publication.
    pub(crate) fn sh_publish_pending(&self) -> Result<()> {
        let sh = self.sh();
        if self.space.is_read_only() {
            return Ok(());
        }
        // The touched set is taken inside the publication lock: a caller whose version
        // another caller's publication took returns only once that one is done.
        let _one = sh.publishing.lock();
        let touched: Vec<InodeId> = std::mem::take(&mut *sh.touched.lock())
            .into_iter()
            .collect();
        if sh.republish.load(std::sync::atomic::Ordering::Acquire) {
            let recs = self.space.slots().own_records()?;
            let mut v = SlotView::default();
            v.apply(recs);
            *sh.own_write() = v;
            self.space.slots().publish_snapshot()?;
            sh.republish
                .store(false, std::sync::atomic::Ordering::Release);
            return Ok(());
        }
        if touched.is_empty() {
            return Ok(());
        }
        let recs = self.space.slots().version_records(&touched)?;
        sh.own_write().apply(recs.clone());
        if let Err(e) = self.space.slots().publish(&recs) {
            sh.republish
                .store(true, std::sync::atomic::Ordering::Release);
            return Err(e.into());
        }
        Ok(())
    }

    pub(crate) fn sh_touch(&self, versions: &[InodeId]) {
        self.sh().touched.lock().extend(versions.iter().copied());
    }

    /// The attributes every node sees of object `obj`.
    pub(crate) fn sh_getattr(&self, obj: InodeId) -> Result<Attr> {
        self.sh_getattr_at(obj, Instant::now())
    }

    /// `sh_getattr` as of a refresh that started at `t` or later: a request that already
    /// refreshed (a lookup, each entry of a listing with attributes, a change checked after
    /// its intent) passes the time it refreshed at, and reads no hint again.
    pub(crate) fn sh_getattr_at(&self, obj: InodeId, t: Instant) -> Result<Attr> {
        // fstat of a descriptor opened before another node's close must see that close (a
        // writer with O_APPEND appends at the size the kernel learns here): the hints say
        // whether any slot published since, one read shared by concurrent requests.
        self.refresh_since(t);
        if self.local_only(obj) {
            return self.local_getattr(obj);
        }
        let vs = self.versions_of(obj);
        let Some(first) = vs.first() else {
            if obj == InodeId::ROOT {
                return self.local_getattr(obj);
            }
            return Err(Error::NotFound);
        };
        let kind = first.node.kind;
        let pvs: Vec<(SlotId, ckptfs_engine::face::PubVersion)> = vs
            .iter()
            .map(|v| {
                let mut node = v.node.clone();
                // A version this node has open for writing: its live size and times.
                if v.slot == self.sh().me {
                    if let Some(n) = self.open_node(v.id) {
                        let n = n.lock();
                        node.size = n.file.size();
                        node.mtime = n.rec.mtime;
                        node.ctime = n.rec.ctime;
                    }
                }
                // A write's commit sets the times as much as utimens does: the effective
                // stamp of a version's times is the later of the two.
                let mut meta = v.meta;
                meta.times_stamp = meta.times_stamp.max(stamp_of(node.mtime));
                (v.slot, ckptfs_engine::face::PubVersion { meta, node })
            })
            .collect();
        let refs: Vec<(SlotId, &ckptfs_engine::face::PubVersion)> =
            pvs.iter().map(|(s, v)| (*s, v)).collect();
        let m = merge::attributes(&refs).ok_or(Error::NotFound)?;
        let mut rec = attr_base(kind, m.perm, m.uid, m.gid);
        rec.mtime = m.mtime;
        rec.ctime = m.ctime;
        rec.atime = m.mtime;
        rec.crtime = vs.iter().map(|v| v.node.ctime).min().unwrap_or(m.ctime);
        let mut data_bytes = None;
        match kind {
            NodeKind::File => {
                let layers = merge::layers(&refs);
                rec.size = merge::size(&layers);
                data_bytes = Some(
                    layers
                        .iter()
                        .flat_map(|l| {
                            l.version
                                .node
                                .extents
                                .iter()
                                .filter(move |e| e.off < l.cut)
                                .map(move |e| (e.len as u64).min(l.cut - e.off))
                        })
                        .sum::<u64>()
                        .min(rec.size),
                );
            }
            NodeKind::Symlink => {
                rec.target = first.node.target.clone();
                rec.size = rec.target.len() as u64;
            }
            NodeKind::Dir => {
                // A directory changes when any node changes an entry in it.
                let t = stamp_to_time(self.with_views(|v| v.dir_stamp(obj)));
                rec.mtime = rec.mtime.max(t);
                rec.ctime = rec.ctime.max(t);
                rec.atime = rec.mtime;
            }
            NodeKind::CharDevice | NodeKind::BlockDevice => rec.rdev = first.node.rev as u32,
            _ => {}
        }
        Ok(Attr {
            ino: obj,
            rec,
            data_bytes,
        })
    }

    /// The object `name` in `parent` names in the views as they are (no refresh).
    pub(crate) fn sh_binding(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        self.with_views(|v| v.entry(parent, name))
            .map(|(_, b)| b.child)
    }

    /// The object `name` in `parent` names, as of a refresh that started at `t` or later.
    pub(crate) fn sh_lookup(&self, parent: InodeId, name: &[u8], t: Instant) -> Result<Attr> {
        // Close-to-open: a name looked up after another node's change returned finds it.
        self.refresh_since(t);
        let (_, b) = self
            .with_views(|v| v.entry(parent, name))
            .ok_or(Error::NotFound)?;
        self.sh_getattr_at(b.child, t)
    }

    /// The parent of directory `dir` (`..`).
    pub(crate) fn sh_parent(&self, dir: InodeId) -> Result<InodeId> {
        if dir == InodeId::ROOT {
            return Ok(dir);
        }
        let kind = self.versions_of(dir).first().map(|v| v.node.kind);
        if kind != Some(NodeKind::Dir) {
            return Err(if kind.is_none() {
                Error::NotFound
            } else {
                Error::NotDir
            });
        }
        self.with_views(|v| v.location(dir))
            .map(|(p, _)| p)
            .ok_or(Error::NotFound)
    }

    /// The kind of object `obj` as the tree has it now (None: not in the tree).
    fn kind_in_tree(&self, v: &Views, obj: InodeId) -> Option<NodeKind> {
        if !v.exists(obj) {
            return None;
        }
        v.versions(obj).first().map(|(_, pv)| pv.node.kind)
    }

    /// The path of object `obj` from the root (for histories of removed files).
    fn path_in_tree(&self, v: &Views, mut obj: InodeId) -> Vec<u8> {
        let mut parts = Vec::new();
        for _ in 0..4096 {
            match v.location(obj) {
                Some((p, n)) => {
                    parts.push(n);
                    obj = p;
                }
                None => break,
            }
        }
        parts.reverse();
        parts.join(&b'/')
    }

    /// Makes a node `rec` named `name` in directory `parent` for every node. With
    /// `open_existing`, an existing regular file there is returned instead (O_CREAT without
    /// O_EXCL: another node made it since this one looked). Returns (attributes, made).
    pub(crate) fn sh_make(
        &self,
        parent: InodeId,
        name: &[u8],
        mut rec: InodeRecord,
        open_existing: bool,
    ) -> Result<(Attr, bool)> {
        super::check_name(name)?;
        if self.space.is_read_only() {
            return Err(ckptfs_engine::Error::ReadOnly.into());
        }
        self.refuse_if_failed()?;
        if parent == InodeId::ROOT && name == super::view::CTL_NAME {
            return Err(Error::Exists);
        }
        let prio = self.space.slots().stamp();
        let _intent = self.space.slots().ns_lock(
            &[name_key(parent, name, true), dir_key(parent, false)],
            prio,
        )?;
        let t = Instant::now();
        self.refresh_since(t);
        let (pkind, existing) =
            self.with_views(|v| (self.kind_in_tree(v, parent), v.entry(parent, name)));
        match pkind {
            None => return Err(Error::NotFound),
            Some(NodeKind::Dir) => {}
            Some(_) => return Err(Error::NotDir),
        }
        if let Some((_, b)) = existing {
            if open_existing && b.kind == NodeKind::File {
                return Ok((self.sh_getattr_at(b.child, t)?, false));
            }
            return Err(Error::Exists);
        }
        // BSD group semantics of a setgid directory, as on one node.
        let p = self.sh_getattr_at(parent, t)?;
        if p.rec.perm & libc::S_ISGID != 0 {
            rec.gid = p.rec.gid;
            if rec.kind == NodeKind::Dir {
                rec.perm |= libc::S_ISGID;
            }
        }
        let kind = rec.kind;
        let stamp = self.space.slots().stamp();
        let ino =
            self.space
                .ns()
                .create_object(parent, name, rec, (stamp, stamp_to_time(stamp)))?;
        let mut recs = vec![Record::Bind(
            parent,
            name.to_vec(),
            Binding {
                child: ino,
                stamp,
                kind,
            },
        )];
        recs.extend(self.space.slots().version_records(&[ino])?);
        self.apply_and_publish(recs)?;
        // Its own change is in this slot's view already: no other node's is needed.
        Ok((self.sh_getattr_at(ino, t)?, true))
    }

    /// unlink (`dir` false) or rmdir of `name` in `parent`, for every node.
    pub(crate) fn sh_remove(&self, parent: InodeId, name: &[u8], dir: bool) -> Result<()> {
        if name.len() > super::NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if self.space.is_read_only() {
            return Err(ckptfs_engine::Error::ReadOnly.into());
        }
        if parent == InodeId::ROOT && name == super::view::CTL_NAME {
            return Err(Error::ReadOnly);
        }
        let me = self.sh().me;
        let prio = self.space.slots().stamp();
        loop {
            self.refresh_since(Instant::now());
            let (_, cur) = self
                .with_views(|v| v.entry(parent, name))
                .ok_or(Error::NotFound)?;
            let mut keys = vec![name_key(parent, name, true), dir_key(parent, false)];
            if cur.kind == NodeKind::Dir {
                keys.push(dir_key(cur.child, true));
            }
            let intent = self.space.slots().ns_lock(&keys, prio)?;
            self.refresh_since(Instant::now());
            let now_entry = self.with_views(|v| v.entry(parent, name));
            let Some((_, b)) = now_entry else {
                return Err(Error::NotFound);
            };
            if b.child != cur.child {
                // Another node replaced the name between the look and the intent.
                drop(intent);
                continue;
            }
            let is_dir = b.kind == NodeKind::Dir;
            if dir && !is_dir {
                return Err(Error::NotDir);
            }
            if !dir && is_dir {
                return Err(Error::IsDir);
            }
            let (tomb, path, not_empty) = self.with_views(|v| {
                (
                    v.others_have(me, parent, name),
                    self.path_in_tree(v, b.child),
                    is_dir && !v.list(b.child).is_empty(),
                )
            });
            if not_empty {
                return Err(Error::NotEmpty);
            }
            let stamp = self.space.slots().stamp();
            let now = stamp_to_time(stamp);
            let tombstone = Binding {
                child: InodeId(0),
                stamp,
                kind: NodeKind::File,
            };
            let own = (owner_slot(b.child) == me).then_some((b.child, path));
            let retired = self.space.ns().unbind(
                (parent, name),
                tomb.then_some(&tombstone),
                stamp,
                own,
                now,
            )?;
            let rec = match tomb {
                true => Record::Bind(parent, name.to_vec(), tombstone),
                false => Record::Unbind(parent, name.to_vec()),
            };
            self.apply_and_publish(vec![rec])?;
            if let Some(rec) = retired {
                self.unlinked(b.child, &rec);
            }
            return Ok(());
        }
    }

    /// rename(2) for every node (RENAME_NOREPLACE, RENAME_EXCHANGE as asked).
    pub(crate) fn sh_rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        super::check_name(new_name)?;
        if name.len() > super::NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if self.space.is_read_only() {
            return Err(ckptfs_engine::Error::ReadOnly.into());
        }
        let reserved = |d: InodeId, n: &[u8]| d == InodeId::ROOT && n == super::view::CTL_NAME;
        if reserved(parent, name) || reserved(new_parent, new_name) {
            return Err(Error::ReadOnly);
        }
        let me = self.sh().me;
        let prio = self.space.slots().stamp();
        loop {
            self.refresh_since(Instant::now());
            let (src, dst) =
                self.with_views(|v| (v.entry(parent, name), v.entry(new_parent, new_name)));
            let (_, src) = src.ok_or(Error::NotFound)?;
            let dst = dst.map(|(_, b)| b);
            let mut keys = vec![
                name_key(parent, name, true),
                name_key(new_parent, new_name, true),
                dir_key(parent, false),
                dir_key(new_parent, false),
            ];
            if src.kind == NodeKind::Dir || dst.is_some_and(|d| d.kind == NodeKind::Dir) {
                keys.push(RENAME_DIRS | 1);
            }
            if let Some(d) = dst.filter(|d| d.kind == NodeKind::Dir && !exchange) {
                // Replacing an empty directory: nothing may be made in it meanwhile.
                keys.push(dir_key(d.child, true));
            }
            let intent = self.space.slots().ns_lock(&keys, prio)?;
            self.refresh_since(Instant::now());
            let (src2, dst2, pkind) = self.with_views(|v| {
                (
                    v.entry(parent, name).map(|(_, b)| b),
                    v.entry(new_parent, new_name).map(|(_, b)| b),
                    self.kind_in_tree(v, new_parent),
                )
            });
            let Some(src2) = src2 else {
                return Err(Error::NotFound);
            };
            if src2.child != src.child || dst2.map(|d| d.child) != dst.map(|d| d.child) {
                drop(intent);
                continue;
            }
            match pkind {
                None => return Err(Error::NotFound),
                Some(NodeKind::Dir) => {}
                Some(_) => return Err(Error::NotDir),
            }
            if dst.is_some_and(|d| d.child == src.child) {
                return Ok(());
            }
            self.check_rename(&src, dst.as_ref(), parent, new_parent, noreplace, exchange)?;
            let stamp = self.space.slots().stamp();
            let now = stamp_to_time(stamp);
            let (old_tomb, dst_path, src_path) = self.with_views(|v| {
                (
                    v.others_have(me, parent, name),
                    dst.map(|d| self.path_in_tree(v, d.child)),
                    self.path_in_tree(v, src.child),
                )
            });
            let recs = rename_records(
                (parent, name),
                (new_parent, new_name),
                &src,
                dst,
                exchange,
                old_tomb,
                stamp,
            );
            let replaced = dst.filter(|_| !exchange).map(|d| d.child);
            let own_file = |o: InodeId| owner_slot(o) == me;
            // The target path's history goes on with the file renamed over it, as on one
            // node, when both are this slot's files (write-temp-then-rename).
            let replaced =
                replaced
                    .filter(|d| own_file(*d))
                    .map(|d| ckptfs_engine::face::Replaced {
                        dst: d,
                        src: src.child,
                        src_own_file: own_file(src.child) && src.kind == NodeKind::File,
                        src_path: src_path.clone(),
                        dst_path: dst_path.clone().unwrap_or_default(),
                    });
            let retired = self.space.ns().rebind(&recs, stamp, replaced, now)?;
            self.apply_and_publish(recs)?;
            if let Some((d, rec, src_rec)) = retired {
                self.unlinked(d, &rec);
                if let Some((s, srec)) = src_rec {
                    self.refresh_open(s, |r| {
                        r.adopt_namespace(&srec);
                        r.ctime = srec.ctime;
                    });
                    // The source's version record changed (its history): publish it.
                    self.sh_touch(&[s]);
                    self.sh_publish_pending()?;
                }
            }
            return Ok(());
        }
    }

    /// The POSIX refusals of a rename of `src` over `dst` (or exchanging them): a directory
    /// into itself, a replace without permission, a kind mismatch, a non-empty directory.
    fn check_rename(
        &self,
        src: &Binding,
        dst: Option<&Binding>,
        parent: InodeId,
        new_parent: InodeId,
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        let src_dir = src.kind == NodeKind::Dir;
        if src_dir && self.with_views(|v| v.is_ancestor(src.child, new_parent)) {
            return Err(Error::Invalid);
        }
        if exchange {
            let d = dst.ok_or(Error::NotFound)?;
            if d.kind == NodeKind::Dir && self.with_views(|v| v.is_ancestor(d.child, parent)) {
                return Err(Error::Invalid);
            }
        } else if let Some(d) = dst {
            if noreplace {
                return Err(Error::Exists);
            }
            let dst_dir = d.kind == NodeKind::Dir;
            if src_dir && !dst_dir {
                return Err(Error::NotDir);
            }
            if !src_dir && dst_dir {
                return Err(Error::IsDir);
            }
            if dst_dir && !self.with_views(|v| v.list(d.child).is_empty()) {
                return Err(Error::NotEmpty);
            }
        }
        Ok(())
    }

    /// This slot's version of `obj` to write into: its newest one if that is the top layer
    /// (no other slot's layer started, and no other slot truncated, after it), else a new
    /// layer. With `reuse_newest` (O_TRUNC and truncates to 0, which empty it), the newest
    /// one serves even below other layers: its commit dates it after them. (Every file state
    /// of a shared namespace keeps its holes and zeros as written: `Space::load_file`.)
    /// Returns the local inode and whether it was the top.
    fn my_layer(&self, obj: InodeId, stamp: u64, reuse_newest: bool) -> Result<(InodeId, bool)> {
        let me = self.sh().me;
        let vs = self.versions_of(obj);
        let kind = vs.first().map(|v| v.node.kind).ok_or(Error::NotFound)?;
        if kind != NodeKind::File {
            return Err(Error::IsDir);
        }
        let mine = vs
            .iter()
            .filter(|v| v.slot == me)
            .max_by_key(|v| v.meta.created);
        let others_top = vs
            .iter()
            .filter(|v| v.slot != me)
            .map(|v| v.meta.created.max(v.meta.clip_stamp))
            .max()
            .unwrap_or(0);
        if let Some(m) = mine {
            if m.meta.created >= others_top {
                return Ok((m.id, true));
            }
            if reuse_newest {
                return Ok((m.id, false));
            }
        }
        // A new layer: an empty file of this slot's, on top of the others.
        let a = self.sh_getattr(obj)?;
        let mut rec = attr_base(NodeKind::File, a.rec.perm, a.rec.uid, a.rec.gid);
        rec.mtime = a.rec.mtime;
        rec.ctime = a.rec.ctime;
        rec.atime = a.rec.mtime;
        rec.crtime = stamp_to_time(stamp);
        let meta = VersionMeta {
            of: obj,
            created: stamp,
            ..VersionMeta::default()
        };
        let ino = self
            .space
            .ns()
            .create_version(rec, meta, Some(stamp), false)?;
        let recs = self.space.slots().version_records(&[ino])?;
        self.apply_and_publish(recs)?;
        Ok((ino, true))
    }

    /// Changes the version record of this slot's version `ino` and publishes it.
    fn set_version(&self, ino: InodeId, f: impl FnOnce(&mut VersionMeta)) -> Result<()> {
        let stamp =
            |m: Option<&VersionMeta>| m.map(|m| m.created.max(m.attr_stamp).max(m.clip_stamp));
        self.space
            .ns()
            .update_version(ino, false, f, stamp)?
            .ok_or(Error::NotFound)?;
        let recs = self.space.slots().version_records(&[ino])?;
        self.apply_and_publish(recs)
    }

    /// Opens object `obj` under handle `fh`: this slot's file alone through the local
    /// paths; a merged file for reading through the merge; for writing, this slot's layer.
    pub(crate) fn sh_open(
        &self,
        obj: InodeId,
        fh: HandleId,
        write: bool,
        truncate: bool,
    ) -> Result<()> {
        self.refresh_since(Instant::now());
        let (exists, kind) = self.with_views(|v| {
            (
                v.exists(obj),
                v.versions(obj).first().map(|(_, pv)| pv.node.kind),
            )
        });
        let kind = kind.ok_or(Error::NotFound)?;
        if !exists {
            // Removed by another node since this one looked the name up: ESTALE makes the
            // kernel look the path up again (and create it, for O_CREAT).
            return Err(Error::Stale);
        }
        match kind {
            NodeKind::File => {}
            NodeKind::Dir => return Err(Error::IsDir),
            _ => return Err(Error::Invalid),
        }
        if self.local_only(obj) {
            // This slot's file alone: the single-slot paths, O_TRUNC committed at close.
            return self.open_ref(obj, Some(fh), write, truncate).map(drop);
        }
        if !write && !truncate {
            self.sh()
                .merged_handles
                .lock()
                .insert(fh, (obj, ckptfs_engine::face::ReadAhead::default()));
            return Ok(());
        }
        let stamp = self.space.slots().stamp();
        let (layer, _) = self.my_layer(obj, stamp, truncate)?;
        let node = self.open_ref(layer, Some(fh), true, truncate)?;
        if truncate {
            // O_TRUNC cuts the other layers when this one's next commit (the close) is
            // published, as it empties this one: other nodes see the file emptied and
            // rewritten at the close, as a close-to-open reader does.
            node.lock().clip = Some((stamp, 0));
        }
        Ok(())
    }

    /// `ckptfs check` of a mount of a multi-slot space: the engine names the files of
    /// damaged chunks from this slot's directory table, which a shared namespace leaves
    /// empty; this names them where every node sees them (the object's place in the
    /// merged tree; none for a file no entry names any more).
    pub(crate) fn sh_name_damage(&self, r: &mut ckptfs_engine::face::CheckReport) {
        let mut names: HashMap<ckptfs_engine::face::HistoryId, Option<Vec<u8>>> = HashMap::new();
        for d in &mut r.damaged {
            for u in d
                .uses
                .iter_mut()
                .filter(|u| u.path.is_none() && !u.unlinked)
            {
                u.path = names
                    .entry(u.history)
                    .or_insert_with(|| self.sh_path_of_history(u.history))
                    .clone();
            }
        }
    }

    /// The path (components joined by '/') of the object a history of this slot is a
    /// version of.
    fn sh_path_of_history(&self, h: ckptfs_engine::face::HistoryId) -> Option<Vec<u8>> {
        let ino = self.space.ns().history(h).ok()?.ino;
        let obj = self.sh().own.read().versions.get(&ino)?.meta.of;
        self.with_views(|v| {
            let mut parts = Vec::new();
            let mut o = obj;
            // Bounded by the depth of a tree without cycles (as `is_ancestor`).
            for _ in 0..4096 {
                if o == InodeId::ROOT {
                    parts.reverse();
                    return Some(parts.join(&b'/'));
                }
                let (p, n) = v.location(o)?;
                parts.push(n);
                o = p;
            }
            None
        })
    }

    /// Whether handle `fh` reads through the merge (and which object).
    pub(crate) fn merged_handle(&self, fh: HandleId) -> Option<InodeId> {
        self.shared
            .as_ref()?
            .merged_handles
            .lock()
            .get(&fh)
            .map(|(obj, _)| *obj)
    }

    /// After a read of `off..end` through read handle `fh` of `obj`: the read-ahead this
    /// slot's files get (`ReadAhead`), for a file other nodes wrote (a restart on another
    /// node, alone or N-1): the chunks ahead in every other slot's layer, as cut by the
    /// layers above it, go to the store's read threads at the places their owners
    /// published. (This slot's own layer is read from its chunk store as it is asked for.)
    pub(crate) fn sh_read_ahead(&self, fh: HandleId, obj: InodeId, off: u64, end: u64) {
        let range = {
            let mut handles = self.sh().merged_handles.lock();
            let Some((_, ahead)) = handles.get_mut(&fh) else {
                return;
            };
            // The size is clamped below, once the versions are at hand (most reads get
            // no range and never look them up).
            ahead.next(&self.prefetch_streams, off, end, u64::MAX)
        };
        let Some((from, to)) = range else {
            return;
        };
        let me = self.sh().me;
        let vs = self.versions_of(obj);
        if vs.first().is_none_or(|v| v.node.kind != NodeKind::File) {
            return;
        }
        let pvs: Vec<(SlotId, ckptfs_engine::face::PubVersion)> =
            vs.into_iter().map(V::into_pub).collect();
        let refs: Vec<(SlotId, &ckptfs_engine::face::PubVersion)> =
            pvs.iter().map(|(s, v)| (*s, v)).collect();
        let mut ahead = Vec::new();
        for l in merge::layers(&refs).iter().filter(|l| l.slot != me) {
            let node = &l.version.node;
            ahead.extend(extents_in(
                &node.extents,
                from,
                to.min(l.cut).min(node.size),
            ));
        }
        if !ahead.is_empty() {
            self.space.slots().prefetch_published(&ahead);
        }
    }

    pub(crate) fn sh_release_merged(&self, fh: HandleId) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| s.merged_handles.lock().remove(&fh).is_some())
    }

    /// Reads `len` bytes at `off` of object `obj` as every node sees it: its layers painted
    /// oldest first. `live`: this slot's layer open for writing, read from its open state.
    pub(crate) fn sh_read(
        &self,
        obj: InodeId,
        off: u64,
        len: usize,
        live: Option<InodeId>,
    ) -> Result<Vec<u8>> {
        let mut tries = 0;
        loop {
            match self.sh_read_once(obj, off, len, live) {
                Err(Error::Engine(ckptfs_engine::Error::Corrupt(c))) if tries < READ_RETRIES => {
                    // The owner may have moved the chunk (gc) and published where to.
                    // Its owner publishes a chunk's new place before it frees the old one,
                    // so a manifest read after this failure has it: no waiting.
                    log::info!("reading another slot's chunk: {c}; reading its manifest again");
                    self.refresh_union()?;
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn sh_read_once(
        &self,
        obj: InodeId,
        off: u64,
        len: usize,
        live: Option<InodeId>,
    ) -> Result<Vec<u8>> {
        let me = self.sh().me;
        let vs = self.versions_of(obj);
        if vs.is_empty() {
            return Err(Error::NotFound);
        }
        let mut pvs: Vec<(SlotId, ckptfs_engine::face::PubVersion)> =
            vs.into_iter().map(V::into_pub).collect();
        // The live layer's size is its open state's.
        let live_node = live.and_then(|l| self.open_node(l).map(|n| (l, n)));
        if let Some((l, n)) = &live_node {
            let mut n = n.lock();
            self.settle_node(&mut n)?;
            for (_, pv) in pvs.iter_mut() {
                if pv.id() == *l {
                    pv.node.size = n.file.size();
                }
            }
        }
        let refs: Vec<(SlotId, &ckptfs_engine::face::PubVersion)> =
            pvs.iter().map(|(s, v)| (*s, v)).collect();
        let layers = merge::layers(&refs);
        let size = merge::size(&layers);
        let end = off.saturating_add(len as u64).min(size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        for l in &layers {
            let stop = end.min(l.cut);
            if off >= stop {
                continue;
            }
            let id = l.version.id();
            if l.slot == me {
                // This slot's version: its open state (the live layer) or its committed
                // revision.
                let pieces = match live_node.as_ref().filter(|(li, _)| *li == id) {
                    Some((_, n)) => n.lock().file.map().pieces(off, stop),
                    None => self.layer_map(id)?.pieces(off, stop),
                };
                // Holes are no writes: only the layer's pieces are painted.
                ckptfs_engine::face::ExtentMap::read_pieces(
                    self.space.data().chunks(),
                    pieces,
                    off,
                    &mut out,
                )?;
            } else {
                self.paint_remote(&l.version.node.extents, off, stop, &mut out)?;
            }
        }
        Ok(out)
    }

    /// The extent map of this slot's committed layer `id` (its current revision), from
    /// `Shared::layer_maps` or loaded into it.
    fn layer_map(&self, id: InodeId) -> Result<Arc<ckptfs_engine::face::ExtentMap>> {
        let rev = self
            .space
            .ns()
            .get_inode(id)?
            .ok_or(Error::NotFound)?
            .current_rev;
        let maps = &self.sh().layer_maps;
        if let Some((_, _, m)) = maps.lock().iter().find(|(i, r, _)| *i == id && *r == rev) {
            return Ok(m.clone());
        }
        let m = Arc::new(self.space.files().load_map(rev)?);
        let mut maps = maps.lock();
        maps.retain(|(i, _, _)| *i != id);
        if maps.len() >= LAYER_MAPS {
            maps.remove(0);
        }
        maps.push((id, rev, m.clone()));
        Ok(m)
    }

    /// Copies the bytes of another slot's extents within `[off, end)` into `out` (which
    /// starts at `off`). A published extent that does not fit its chunk is corruption.
    fn paint_remote(
        &self,
        extents: &[PubExtent],
        off: u64,
        end: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let wanted = extents_in(extents, off, end);
        Ok(self
            .space
            .slots()
            .read_published(&wanted, off, &mut out[..(end - off) as usize])?)
    }

    /// chmod, chown, utimens and truncate of object `obj`, for every node: this slot's
    /// version of it takes the change (a new attribute-only version where it has none).
    pub(crate) fn sh_setattr(&self, obj: InodeId, s: &SetAttr) -> Result<Attr> {
        if self.space.is_read_only() {
            return Err(ckptfs_engine::Error::ReadOnly.into());
        }
        self.refuse_if_failed()?;
        self.refresh_since(Instant::now());
        let me = self.sh().me;
        let vs = self.versions_of(obj);
        let kind = vs.first().map(|v| v.node.kind).ok_or(Error::NotFound)?;
        let stamp = self.space.slots().stamp();
        let attrs = s.perm.is_some() || s.uid.is_some() || s.gid.is_some();
        let times = s.atime.is_some() || s.mtime.is_some();
        if let Some(size) = s.size {
            if size > super::MAX_FILE_BYTES {
                return Err(Error::FileTooBig);
            }
            match kind {
                NodeKind::File => {
                    // A truncate cuts every layer that started before it at `size`. Which
                    // layer takes it: this node's top one (its bytes below `size` stay where
                    // they were); else a new one on top, empty up to `size`, so this node's
                    // older layer keeps its place under the layers that came after it
                    // (dating that one after them would put its bytes over theirs), and this
                    // node's descriptors that write go on in the new one (what they wrote
                    // before is committed in the old one first). A truncate to 0 empties
                    // this node's newest layer instead and dates it after the others
                    // (nothing of it to put over anything).
                    let mine = |fs: &Self| -> Vec<InodeId> {
                        let mut v: Vec<V> = fs
                            .versions_of(obj)
                            .into_iter()
                            .filter(|v| v.slot == me)
                            .collect();
                        v.sort_by_key(|v| v.meta.created);
                        v.into_iter().map(|v| v.id).collect()
                    };
                    // An O_TRUNC of this node's that its close has yet to record goes first:
                    // a layer records its last truncate only, so truncates are recorded in
                    // the order they were made.
                    for v in mine(self) {
                        self.commit_open_layer(v, true)?;
                    }
                    let before = mine(self);
                    let (layer, top) = self.my_layer(obj, stamp, size == 0)?;
                    let made = !before.contains(&layer);
                    if made {
                        for v in &before {
                            self.move_writers(*v, layer)?;
                        }
                    }
                    self.set_version(layer, |m| {
                        // Cut twice by the top layer: every other layer started before both
                        // truncates, so the shorter cut holds for them.
                        m.clip_len = match top && !made && m.clip_stamp != 0 {
                            true => m.clip_len.min(size),
                            false => size,
                        };
                        m.created = m.created.max(stamp);
                        m.clip_stamp = stamp;
                    })?;
                    self.setattr(
                        layer,
                        &SetAttr {
                            size: Some(size),
                            ..SetAttr::default()
                        },
                    )?;
                    if !top {
                        // Dated after the other layers now: its emptied content must be
                        // what they see there, not its last commit's until the close.
                        self.commit_open_layer(layer, false)?;
                    }
                    self.sh_touch(&[layer]);
                    self.sh_publish_pending()?;
                }
                NodeKind::Dir => return Err(Error::IsDir),
                _ => {}
            }
        }
        if attrs || times || s.ctime.is_some() {
            let mine = vs
                .iter()
                .filter(|v| v.slot == me)
                .max_by_key(|v| v.meta.created)
                .map(|v| v.id);
            let target = match mine {
                Some(m) => m,
                None => {
                    // An attribute-only version: no bytes (a file's is an empty layer that
                    // started before every truncate, so it shows nothing).
                    let a = self.sh_getattr(obj)?;
                    let mut rec = attr_base(kind, a.rec.perm, a.rec.uid, a.rec.gid);
                    rec.target = a.rec.target.clone();
                    rec.mtime = a.rec.mtime;
                    rec.ctime = a.rec.ctime;
                    rec.rdev = a.rec.rdev;
                    let meta = VersionMeta {
                        of: obj,
                        created: 0,
                        ..VersionMeta::default()
                    };
                    self.space.ns().create_version(rec, meta, None, true)?
                }
            };
            self.setattr(
                target,
                &SetAttr {
                    size: None,
                    ..s.clone()
                },
            )?;
            self.set_version(target, |m| {
                if attrs {
                    m.attr_stamp = stamp;
                }
                if times {
                    m.times_stamp = stamp;
                }
            })?;
        }
        self.sh_getattr(obj)
    }

    /// The entries of directory `dir` after `offset`: offsets are a hash of the name (so a
    /// listing that runs while entries come and go lists each entry that stays once).
    pub(crate) fn sh_readdir(
        &self,
        dir: InodeId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DirItem>> {
        self.refresh_since(Instant::now());
        let items = self.sorted_listing(dir);
        let from = items.partition_point(|(o, _, _)| *o <= after);
        Ok(items[from..]
            .iter()
            .take(limit)
            .map(|(offset, name, b)| DirItem {
                offset: *offset,
                ino: b.child,
                kind: b.kind,
                name: name.clone(),
            })
            .collect())
    }

    /// `dir`'s entries sorted by offset, from the views as they are (`Shared::listing`).
    fn sorted_listing(&self, dir: InodeId) -> Entries {
        let sh = self.sh();
        let own_gen = sh.own_gen.load(std::sync::atomic::Ordering::Acquire);
        let others = (self.space.slots().union())
            .map(|u| u.views())
            .unwrap_or_default();
        if let Some(l) = sh.listing.lock().as_ref() {
            let same = |a: &[(SlotId, Arc<SlotView>)], b: &[(SlotId, Arc<SlotView>)]| {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(x, y)| x.0 == y.0 && Arc::ptr_eq(&x.1, &y.1))
            };
            if l.dir == dir && l.own_gen == own_gen && same(&l.others, &others) {
                return l.entries.clone();
            }
        }
        let mut items: Vec<(u64, Vec<u8>, Binding)> = self.with_views(|v| {
            v.list(dir)
                .into_iter()
                .map(|(n, b)| (name_offset(&n), n, b))
                .collect()
        });
        items.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let entries = Arc::new(items);
        *sh.listing.lock() = Some(Listing {
            dir,
            others,
            own_gen,
            entries: entries.clone(),
        });
        entries
    }

    pub(crate) fn sh_readlink(&self, obj: InodeId) -> Result<Vec<u8>> {
        let vs = self.versions_of(obj);
        let v = vs.first().ok_or(Error::NotFound)?;
        match v.node.kind {
            NodeKind::Symlink => Ok(v.node.target.clone()),
            _ => Err(Error::Invalid),
        }
    }

    /// What the file at `path` costs as every node sees it, for `ckptfs report` of a file
    /// another slot made (whose revisions that slot keeps): its size, its newest commit
    /// (unix seconds), and the stored bytes of the distinct chunks its layers name (what its
    /// revision stored, where none of them was in the space before). None for a path that
    /// is not a regular file. Single-slot spaces report revisions instead.
    pub fn published_cost(&self, path: &[u8]) -> Result<Option<(u64, f64, u64)>> {
        if self.shared.is_none() {
            return Ok(None);
        }
        let Some(obj) = self.resolve(path)? else {
            return Err(Error::NotFound);
        };
        let vs = self.versions_of(obj);
        if vs.first().is_none_or(|v| v.node.kind != NodeKind::File) {
            return Ok(None);
        }
        let pvs: Vec<(SlotId, ckptfs_engine::face::PubVersion)> = vs
            .iter()
            .map(|v| {
                (
                    v.slot,
                    ckptfs_engine::face::PubVersion {
                        meta: v.meta,
                        node: v.node.clone(),
                    },
                )
            })
            .collect();
        let refs: Vec<(SlotId, &ckptfs_engine::face::PubVersion)> =
            pvs.iter().map(|(s, v)| (*s, v)).collect();
        let size = merge::size(&merge::layers(&refs));
        let mut seen = std::collections::HashSet::new();
        let mut stored = 0u64;
        let mut newest = 0f64;
        for v in &vs {
            newest = newest.max(v.node.mtime.secs as f64 + v.node.mtime.nanos as f64 * 1e-9);
            for e in v.node.extents.iter() {
                if seen.insert(e.hash) {
                    stored += e.stored_len as u64;
                }
            }
        }
        Ok(Some((size, newest, stored)))
    }

    /// Sets how the kernel is told to drop a name another node removed (the mount's FUSE
    /// notifier). Nothing on a single-slot space, whose names only this node changes.
    /// Of a close-to-open mount (`ckptfs mount --coherence close-to-open`), whose kernel
    /// keeps names and attributes for a second anyway: a lookup or getattr that finds its
    /// object may use a refresh of the other slots' records up to `d` old, so the lookups
    /// of an `ls -l` (one per file) share one hint read per `d` instead of one each. A
    /// lookup that finds nothing, a listing, an open and every change still refresh first.
    pub fn set_lookup_window(&self, d: std::time::Duration) {
        if let Some(sh) = &self.shared {
            let _ = sh.lookup_window.set(d);
        }
    }

    /// Whether lookups may use an older refresh (`set_lookup_window`).
    pub(crate) fn has_lookup_window(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|sh| sh.lookup_window.get().is_some())
    }

    /// The time a lookup or getattr asks a refresh from (`set_lookup_window`).
    pub(crate) fn lookup_since(&self) -> Instant {
        let now = Instant::now();
        match self.shared.as_ref().and_then(|sh| sh.lookup_window.get()) {
            Some(d) => now.checked_sub(*d).unwrap_or(now),
            None => now,
        }
    }

    pub fn set_entry_invalidator(&self, f: EntryInvalidator) {
        if let Some(sh) = &self.shared {
            let _ = sh.invalidate_entry.set(f);
        }
    }

    /// Reads the other slots' manifests, retires this slot's files they removed, tells the
    /// kernel to drop their names and waits (at most `FORGET_WAIT`) until it forgot them,
    /// so gc may reclaim their space. The maintenance scheduler's job, every second and
    /// when a writer asks (`ask_removals`); it holds no file's lock (`reconcile` takes
    /// those of open files).
    pub fn learn_removals(&self) {
        if self.shared.is_none() {
            return;
        }
        if let Err(e) = self.refresh_union() {
            log::warn!("reading the other slots' manifests: {e}");
        }
        match self.reconcile() {
            Ok(inos) if !inos.is_empty() => {
                if !self.space.pins().wait_forgotten(&inos, FORGET_WAIT) {
                    log::debug!(
                        "the kernel still holds some of {} inodes other nodes removed (a \
                         process has them open, or their names are in use)",
                        inos.len()
                    );
                }
            }
            Ok(_) => {}
            Err(e) => log::warn!("retiring this slot's files other nodes removed: {e}"),
        }
    }

    /// A writer found the space full (or `ckptfs gc` runs): has the maintenance scheduler
    /// learn other nodes' removals now (their files' space is this slot's to reclaim) and
    /// waits for it, at most `LEARN_WAIT`. Not on this thread: a writer holds its file's
    /// lock, which the retirement of that file would need.
    pub fn ask_removals(&self) {
        if self.shared.is_none() {
            return;
        }
        if let Some(w) = self.maintenance.get() {
            if !w.ask(LEARN_WAIT) {
                log::debug!("learning other nodes' removals took over {LEARN_WAIT:?}");
            }
        }
    }

    /// Retires this slot's objects that no entry names any more (another node removed or
    /// replaced them): unlinked here too, so their space comes back by the retention
    /// policy. Runs when another slot's view changed since the last time.
    pub fn reconcile(&self) -> Result<Vec<InodeId>> {
        let Some(sh) = &self.shared else {
            return Ok(Vec::new());
        };
        if self.space.is_read_only() {
            return Ok(Vec::new());
        }
        let gens: Vec<(SlotId, u64, u64)> = self
            .space
            .slots()
            .union()
            .map(|u| u.views().iter().map(|(s, v)| (*s, v.gen, v.len)).collect())
            .unwrap_or_default();
        {
            let mut last = sh.reconciled.lock();
            if *last == gens {
                return Ok(Vec::new());
            }
            *last = gens;
        }
        let me = sh.me;
        // (version, its path for the trash, the object and the name the kernel knows it by)
        type Gone = (
            InodeId,
            Vec<u8>,
            InodeId,
            Option<(InodeId, Vec<u8>)>,
            NodeKind,
        );
        let gone: Vec<Gone> = self.with_views(|v| {
            let own = v.list.iter().find(|(s, _)| *s == me).map(|(_, o)| *o);
            let Some(own) = own else {
                return Vec::new();
            };
            own.versions
                .values()
                .filter(|pv| pv.meta.of != InodeId::ROOT && !v.exists(pv.meta.of))
                .map(|pv| {
                    let place = v.list.iter().find_map(|(_, view)| {
                        view.by_child.get(&pv.meta.of)?.iter().next().cloned()
                    });
                    let path = place
                        .as_ref()
                        .map(|(p, n)| {
                            let mut d = self.path_in_tree(v, *p);
                            if !d.is_empty() {
                                d.push(b'/');
                            }
                            d.extend_from_slice(n);
                            d
                        })
                        .unwrap_or_default();
                    (pv.id(), path, pv.meta.of, place, pv.node.kind)
                })
                .collect()
        });
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        let now = Timestamp::now();
        let objs: Vec<(InodeId, Vec<u8>)> = gone
            .iter()
            .map(|(ino, path, _, _, _)| (*ino, path.clone()))
            .collect();
        let retired = self.space.ns().retire_own(&objs, now)?;
        let mut out = Vec::with_capacity(retired.len());
        let mut newly = std::collections::HashSet::new();
        for (ino, rec) in retired {
            log::debug!("inode {}: removed by another node; retired here", ino.0);
            self.unlinked(ino, &rec);
            newly.insert(ino);
        }
        // The kernel still holds the names this node looked up (or created) of what another
        // node removed, and with them the inodes, which gc keeps for it (a process may use
        // one by number). Told to drop the names, it forgets every inode no process holds
        // (open or O_PATH), and gc can reclaim their space; otherwise only memory pressure
        // or this node's own next lookup of the name would.
        // Names inside a directory before the directory's: once a directory's name is
        // dropped the kernel no longer finds the names in it to drop.
        let mut order: Vec<&Gone> = gone.iter().filter(|g| newly.contains(&g.0)).collect();
        order.sort_by_key(|g| g.4 == NodeKind::Dir);
        for (version, _, obj, place, kind) in order {
            if let (Some(tell), Some((parent, name))) = (sh.invalidate_entry.get(), place) {
                log::debug!("object {}: asking the kernel to drop its name", obj.0);
                tell(*parent, name);
            }
            // The kernel holds objects by their number, which a file of this slot alone
            // shares with its only version. Files only: a directory's record holds no
            // space, and the kernel keeps a directory it walked through for longer.
            if *kind == NodeKind::File {
                out.push(*version);
                out.push(*obj);
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// A stamp (ns since the epoch) as a time.
pub(crate) fn stamp_to_time(stamp: u64) -> Timestamp {
    ckptfs_engine::face::to_time(stamp)
}

fn stamp_of(t: Timestamp) -> u64 {
    (t.secs.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.nanos as u64)
}

/// A readdir offset for an entry name: its hash, above the offsets of "." and "..".
fn name_offset(name: &[u8]) -> u64 {
    let h = ChunkHash::of(name);
    (u64::from_le_bytes(h.0[..8].try_into().expect("8")) >> 2) + 3
}

/// The extents of `extents` (a published file's, in offset order) that overlap
/// `[from, to)`.
fn extents_in(extents: &[PubExtent], from: u64, to: u64) -> Vec<&PubExtent> {
    let first = extents.partition_point(|e| e.off <= from).saturating_sub(1);
    extents[first..]
        .iter()
        .take_while(|e| e.off < to)
        .filter(|e| e.off + e.len as u64 > from)
        .collect()
}

/// The name records of a rename at `stamp`: `to` binds `src` (and, exchanging, `from` binds
/// `dst`); else `from` is unbound, or bound to a tombstone where other slots have the name
/// (`old_tomb`), so their older binding does not show through.
fn rename_records(
    (parent, name): (InodeId, &[u8]),
    (new_parent, new_name): (InodeId, &[u8]),
    src: &Binding,
    dst: Option<Binding>,
    exchange: bool,
    old_tomb: bool,
    stamp: u64,
) -> Vec<Record> {
    let at = |b: &Binding| Binding { stamp, ..*b };
    let mut recs = Vec::new();
    if exchange {
        let d = dst.expect("checked");
        recs.push(Record::Bind(parent, name.to_vec(), at(&d)));
        recs.push(Record::Bind(new_parent, new_name.to_vec(), at(src)));
    } else {
        recs.push(match old_tomb {
            true => Record::Bind(
                parent,
                name.to_vec(),
                Binding {
                    child: InodeId(0),
                    stamp,
                    kind: NodeKind::File,
                },
            ),
            false => Record::Unbind(parent, name.to_vec()),
        });
        recs.push(Record::Bind(new_parent, new_name.to_vec(), at(src)));
    }
    recs
}
