//! The namespace as the filesystem reads and changes it. Reads take a snapshot each. Changes: each typed operation of `catalog::ns` in one
//! transaction of its own, through the space's commit path (refused on a read-only or
//! failed space; a failed commit is sticky). Not durable unless said (`durable`): a
//! namespace change becomes durable with the next durable commit (a close, an fsync), as
//! the durability contract says.

use super::deferred::{merge_listing, HeldCreate, RESERVE};
use super::{RevisionInfo, Space};
use crate::catalog::ns::{RenameHow, Replaced, XattrHow};
use crate::catalog::{self, Txn};
use crate::error::{Corruption, Missing, NsFault, Result};
use crate::format::{
    Binding, HistoryId, HistoryRecord, InodeId, InodeRecord, NodeKind, RevisionId, RevisionRecord,
    Timestamp, VersionMeta, Xattrs,
};
use crate::manifest::Record;

/// `Space::ns`: the namespace's reads and typed changes.
pub struct Namespace<'a> {
    space: &'a Space,
}

impl Space {
    /// The namespace's typed changes (`Namespace`).
    pub fn ns(&self) -> Namespace<'_> {
        Namespace { space: self }
    }
}

impl Namespace<'_> {
    fn run<R>(&self, durable: bool, f: impl FnOnce(&mut Txn) -> Result<R>) -> Result<R> {
        self.space.ns_write(durable, f)
    }

    /// Creates `name` in `parent` as `rec` (`Txn::create_node`).
    pub fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        rec: InodeRecord,
    ) -> Result<(InodeId, InodeRecord)> {
        self.run(false, |t| {
            t.create_node(parent, name, rec, Timestamp::now())
        })
    }

    /// unlink or rmdir (`Txn::remove_node`).
    pub fn remove(
        &self,
        parent: InodeId,
        name: &[u8],
        dir: bool,
        now: Timestamp,
    ) -> Result<(InodeId, InodeRecord)> {
        self.run(false, |t| t.remove_node(parent, name, dir, now))
    }

    /// rename(2) (`Txn::rename_node`): the changed inodes and their records.
    pub fn rename(
        &self,
        from: (InodeId, &[u8]),
        to: (InodeId, &[u8]),
        how: RenameHow,
        now: Timestamp,
    ) -> Result<Vec<(InodeId, InodeRecord)>> {
        self.run(false, |t| t.rename_node(from, to, how, now))
    }

    /// Holds attribute changes of a file open for writing until the next transaction of
    /// any kind, usually its own close's commit (`deferred`): `rec` is the file's record
    /// as the caller holds it, with the changes made. Only its attributes are taken (mode,
    /// owner, times). Where too many are held already, commits them now instead.
    pub fn hold_attrs(&self, ino: InodeId, rec: &InodeRecord) -> Result<()> {
        self.space.refuse_changes()?;
        if self.space.deferred.hold(ino, rec) {
            return Ok(());
        }
        let attrs = super::deferred::Attrs::of(rec);
        self.run(false, |t| t.set_attrs(ino, |r| attrs.set(r)))
    }

    /// Changes `ino`'s stored attributes (`Txn::update_inode`).
    pub fn update_inode(
        &self,
        ino: InodeId,
        f: impl FnOnce(&mut InodeRecord),
    ) -> Result<InodeRecord> {
        self.run(false, |t| t.update_inode(ino, f))
    }

    pub fn set_xattr(
        &self,
        ino: InodeId,
        attr: (&[u8], &[u8]),
        how: XattrHow,
        now: Timestamp,
    ) -> Result<()> {
        self.run(false, |t| t.set_xattr(ino, attr, how, now))
    }

    pub fn drop_xattr(&self, ino: InodeId, name: &[u8], now: Timestamp) -> Result<()> {
        self.run(false, |t| t.drop_xattr(ino, name, now))
    }

    /// A re-created file continues history `hid` (`Txn::adopt_history`).
    pub fn adopt_history(&self, ino: InodeId, hid: HistoryId) -> Result<()> {
        self.run(false, |t| t.adopt_history(ino, hid, Timestamp::now()))
    }

    /// `ino` takes revision `rev`'s extended attributes (a restore).
    pub fn restore_xattrs(&self, ino: InodeId, rev: RevisionId) -> Result<()> {
        self.run(false, |t| t.restore_xattrs(ino, rev))
    }

    /// Changes this slot's version record of `ino`, if any (`Txn::update_version`).
    pub fn update_version(
        &self,
        ino: InodeId,
        durable: bool,
        f: impl FnOnce(&mut VersionMeta),
        ns_stamp: impl FnOnce(Option<&VersionMeta>) -> Option<u64>,
    ) -> Result<Option<VersionMeta>> {
        self.run(durable, |t| t.update_version(ino, f, ns_stamp))
    }

    /// A new object bound in `parent` (`Txn::create_object`).
    pub fn create_object(
        &self,
        parent: InodeId,
        name: &[u8],
        rec: InodeRecord,
        stamped: (u64, Timestamp),
    ) -> Result<InodeId> {
        self.run(false, |t| t.create_object(parent, name, rec, stamped))
    }

    /// A new version of an object in this slot (`Txn::create_version`).
    pub fn create_version(
        &self,
        rec: InodeRecord,
        meta: VersionMeta,
        ns_stamp: Option<u64>,
        durable: bool,
    ) -> Result<InodeId> {
        self.run(durable, |t| t.create_version(rec, meta, ns_stamp))
    }

    /// A multi-slot change's bindings, and the object a rename replaced (`Txn::rebind`).
    #[allow(clippy::type_complexity)]
    pub fn rebind(
        &self,
        recs: &[Record],
        stamp: u64,
        replaced: Option<Replaced>,
        now: Timestamp,
    ) -> Result<Option<(InodeId, InodeRecord, Option<(InodeId, InodeRecord)>)>> {
        self.run(false, |t| t.rebind(recs, stamp, replaced, now))
    }

    /// A multi-slot remove (`Txn::unbind`).
    pub fn unbind(
        &self,
        entry: (InodeId, &[u8]),
        tombstone: Option<&Binding>,
        stamp: u64,
        own: Option<(InodeId, Vec<u8>)>,
        now: Timestamp,
    ) -> Result<Option<InodeRecord>> {
        self.run(false, |t| t.unbind(entry, tombstone, stamp, own, now))
    }

    /// Retires these objects of this slot that other nodes removed, durably, in one
    /// transaction (`Txn::retire_own`): those retired now, with their records.
    pub fn retire_own(
        &self,
        objs: &[(InodeId, Vec<u8>)],
        now: Timestamp,
    ) -> Result<Vec<(InodeId, InodeRecord)>> {
        self.run(true, |t| {
            let mut out = Vec::new();
            for (ino, path) in objs {
                if let Some(r) = t.retire_own(*ino, path.clone(), now)? {
                    out.push((*ino, r));
                }
            }
            Ok(out)
        })
    }

    // Reads: each from a snapshot of its own.

    /// `ino`'s record, with what is held (`deferred`).
    pub fn get_inode(&self, ino: InodeId) -> Result<Option<InodeRecord>> {
        Ok(self.space.inodes_held(&[ino])?.pop().flatten())
    }

    /// `get_inode` of each of `inos`, from one snapshot.
    pub fn get_inodes(&self, inos: &[InodeId]) -> Result<Vec<Option<InodeRecord>>> {
        self.space.inodes_held(inos)
    }

    /// The extended attributes of `ino`.
    pub fn xattrs(&self, ino: InodeId) -> Result<Xattrs> {
        self.space.reader()?.xattrs(ino)
    }

    /// One extended attribute of `ino`.
    pub fn xattr(&self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.space.reader()?.xattr(ino, name)
    }

    /// What revision `rev` recorded of its file's extended attributes.
    pub fn revision_xattrs(&self, rev: RevisionId) -> Result<Xattrs> {
        self.space.reader()?.revision_xattrs(rev)
    }

    /// The inode `name` in `parent` names, held creates included (looked at before the
    /// table: one settled in between is in the table by then).
    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        if let Some(ino) = self.space.deferred.created_named(parent, name) {
            return Ok(Some(ino));
        }
        self.space.reader()?.lookup(parent, name)
    }

    /// Entries of `dir` with cookies greater than `after`, at most `limit`, held creates
    /// included.
    pub fn list_dir(
        &self,
        dir: InodeId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<catalog::DirEntry>> {
        // What is held first, then the table (see `lookup`).
        let held = self.space.deferred.created_in(dir, after);
        let mut listed = self.space.reader()?.list_dir(dir, after, limit)?;
        merge_listing(&mut listed, held, limit);
        Ok(listed)
    }

    /// Creates the regular file `name` in `parent` as `rec`, like `create`, but on a
    /// single-slot space without a transaction of its own: the create is held for the
    /// next transaction, usually the file's close's commit (`deferred`). The fs layer asks
    /// for this only for a file it opens at once (O_CREAT). Where no ids are reserved or
    /// too many creates are held, creates in a transaction that reserves ids for the next.
    pub fn create_file(
        &self,
        parent: InodeId,
        name: &[u8],
        mut rec: InodeRecord,
    ) -> Result<(InodeId, InodeRecord)> {
        debug_assert_eq!(rec.kind, NodeKind::File);
        if self.space.slots().is_shared() {
            return self.create(parent, name, rec);
        }
        self.space.refuse_changes()?;
        {
            let _gate = self.space.ns_gate.lock();
            // The checks `Txn::create_node` makes, against the table and what is held
            // (repeated by the transaction below when no ids are left to hold it with).
            let p = self.get_inode(parent)?.ok_or(NsFault::NotFound)?;
            if p.kind != NodeKind::Dir {
                return Err(NsFault::NotDir.into());
            }
            if self.lookup(parent, name)?.is_some() {
                return Err(NsFault::Exists.into());
            }
            if p.perm & libc::S_ISGID != 0 {
                rec.gid = p.gid;
            }
            let at = Timestamp::now();
            let held = self.space.deferred.hold_create(|ino, hid, cookie| {
                rec.history = hid;
                HeldCreate {
                    parent,
                    name: name.to_vec(),
                    ino,
                    cookie,
                    rec: rec.clone(),
                    at,
                    gen: 0,
                }
            });
            if let Some(h) = held {
                return Ok((h.ino, h.rec));
            }
        }
        let (made, first) = self.run(false, |t| {
            let made = t.create_node(parent, name, rec, Timestamp::now())?;
            Ok((made, t.reserve_ids(RESERVE)?))
        })?;
        self.space.deferred.add_ids(first, RESERVE);
        Ok(made)
    }

    /// Walks `path` (relative to the root, `/`-separated) through the namespace.
    pub fn resolve(&self, path: &[u8]) -> Result<Option<InodeId>> {
        let mut ino = InodeId::ROOT;
        for part in path.split(|b| *b == b'/').filter(|p| !p.is_empty()) {
            match self.lookup(ino, part)? {
                Some(i) => ino = i,
                None => return Ok(None),
            }
        }
        Ok(Some(ino))
    }

    /// The history of `path`: that of the file there now, else that of the most recently
    /// unlinked file that lived there and is still retained.
    pub fn history_of_path(&self, path: &[u8]) -> Result<Option<HistoryId>> {
        if let Some(ino) = self.resolve(path)? {
            if let Some(rec) = self.get_inode(ino)? {
                if rec.kind == NodeKind::File {
                    return Ok(Some(rec.history));
                }
            }
        }
        let want: Vec<u8> = path
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join(&b'/');
        self.space.reader()?.unlinked_history_at(&want)
    }

    /// The history of the most recently unlinked file that lived at `path` (components
    /// joined by '/'), if it is still retained.
    pub fn unlinked_history_at(&self, path: &[u8]) -> Result<Option<HistoryId>> {
        self.space.reader()?.unlinked_history_at(path)
    }

    /// History ids greater than `after`, at most `limit`.
    pub fn history_ids(&self, after: HistoryId, limit: usize) -> Result<Vec<HistoryId>> {
        self.space.reader()?.history_ids(after, limit)
    }

    pub fn history(&self, hid: HistoryId) -> Result<HistoryRecord> {
        // A held create's new history (see `lookup` for the order).
        if let Some(h) = self.space.deferred.created_history(hid) {
            return Ok(h);
        }
        self.space.reader()?.history(hid)
    }

    /// The listed revisions of a history, oldest first: the complete ones. An fsync point
    /// (the content of a file still being written) is durable but not listed.
    pub fn revisions(&self, hid: HistoryId) -> Result<Vec<RevisionInfo>> {
        let h = self.history(hid)?;
        let current = if h.unlinked.is_none() {
            self.get_inode(h.ino)?.map(|r| r.current_rev)
        } else {
            None
        };
        let r = self.space.reader()?;
        let mut out = Vec::new();
        for rev in r.history_revisions(hid)? {
            let rec = r
                .revision(rev)?
                .ok_or(Corruption::Missing(Missing::Revision(rev)))?;
            let is_current = current == Some(rev);
            if rec.sealed {
                out.push(RevisionInfo {
                    id: rev,
                    rec,
                    current: is_current,
                });
            }
        }
        Ok(out)
    }

    pub fn revision(&self, rev: RevisionId) -> Result<Option<RevisionRecord>> {
        self.space.reader()?.revision(rev)
    }
}
