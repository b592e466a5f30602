//! Namespace changes as typed operations on one transaction: what a create, a remove, a
//! rename, an attribute change or a multi-slot binding does to the tables, with the rules
//! (link counts, parent times, histories that go on or retire, setgid inheritance) in one
//! place. The filesystem asks for them through `space::Namespace`, which runs each in one
//! transaction; none of them commits.
//!
//! Refusals are `NsFault`s (the filesystem answers each with its errno); a row that must
//! exist and does not is corruption, as everywhere in the catalog.

use super::Txn;
use crate::error::{NsFault, Result};
use crate::format::{
    Binding, HistoryId, InodeId, InodeRecord, NodeKind, RevisionId, Timestamp, VersionMeta,
    XATTR_NAMES_ROOM, XATTR_VALUES_ROOM,
};
use crate::manifest::Record;

/// How a rename treats an existing target (renameat2's flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameHow {
    /// RENAME_NOREPLACE: refuse (EEXIST) if the target exists.
    pub noreplace: bool,
    /// RENAME_EXCHANGE: swap the two entries; the target must exist.
    pub exchange: bool,
}

/// How setxattr treats an existing attribute (XATTR_CREATE, XATTR_REPLACE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XattrHow {
    pub create: bool,
    pub replace: bool,
}

/// What a multi-slot rename's bindings replace: the object the target name named, if this
/// slot's, with the paths its history and the source's go on under.
pub struct Replaced {
    pub dst: InodeId,
    pub src: InodeId,
    /// The source is this slot's file.
    pub src_own_file: bool,
    pub src_path: Vec<u8>,
    pub dst_path: Vec<u8>,
}

impl Txn<'_> {
    /// Creates `name` in directory `parent` as `rec` (a new inode; a file gets a new
    /// history, a directory keeps its own name for path rebuilding). BSD group semantics of
    /// a setgid directory: new nodes take its group, and new directories inherit the bit.
    /// The parent's times move (and its link count, for a directory). A directory's `rec`
    /// names `parent` already (`..`, path rebuilding).
    pub fn create_node(
        &mut self,
        parent: InodeId,
        name: &[u8],
        mut rec: InodeRecord,
        now: Timestamp,
    ) -> Result<(InodeId, InodeRecord)> {
        let mut p = self.get_inode(parent)?.ok_or(NsFault::NotFound)?;
        if p.kind != NodeKind::Dir {
            return Err(NsFault::NotDir.into());
        }
        if self.lookup(parent, name)?.is_some() {
            return Err(NsFault::Exists.into());
        }
        let is_dir = rec.kind == NodeKind::Dir;
        if p.perm & libc::S_ISGID != 0 {
            rec.gid = p.gid;
            if is_dir {
                rec.perm |= libc::S_ISGID;
            }
        }
        let ino = self.alloc_ino()?;
        match rec.kind {
            NodeKind::File => rec.history = self.new_history(ino)?,
            NodeKind::Dir => rec.target = name.to_vec(),
            _ => {}
        }
        self.put_inode(ino, &rec)?;
        self.add_entry(parent, name, ino)?;
        p.mtime = now;
        p.ctime = now;
        if is_dir {
            p.nlink += 1;
        }
        self.put_inode(parent, &p)?;
        Ok((ino, rec))
    }

    /// Writes a create that was held (`space::deferred`): the checks `create_node` makes
    /// were made when it was held, and nothing has changed them since (`Space::ns_gate`);
    /// its ids were reserved (`reserve_ids`). A create found applied already (its inode
    /// exists) is left alone.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_create(
        &mut self,
        parent: InodeId,
        name: &[u8],
        ino: InodeId,
        cookie: u64,
        rec: &InodeRecord,
        at: Timestamp,
    ) -> Result<()> {
        if self.get_inode(ino)?.is_some() {
            return Ok(());
        }
        let mut p = self.inode(parent)?;
        if p.kind != NodeKind::Dir || self.lookup(parent, name)?.is_some() {
            // The checks made when it was held no longer hold: a bug, not a refusal.
            return Err(crate::error::Corruption::Record {
                record: "held create",
                why: format!(
                    "the create of inode {} in directory {} no longer applies",
                    ino.0, parent.0
                ),
            }
            .into());
        }
        self.new_history_at(rec.history, ino)?;
        self.put_inode(ino, rec)?;
        self.add_entry_at(parent, name, ino, cookie)?;
        p.mtime = p.mtime.max(at);
        p.ctime = p.ctime.max(at);
        self.put_inode(parent, &p)
    }

    /// unlink (`dir` false) or rmdir of `name` in `parent`. The inode stays with nlink 0
    /// (open handles keep reading it; gc reclaims it); a file's history is retired under
    /// its path, restorable until retention drops it. Returns the inode and its record.
    pub fn remove_node(
        &mut self,
        parent: InodeId,
        name: &[u8],
        dir: bool,
        now: Timestamp,
    ) -> Result<(InodeId, InodeRecord)> {
        let child = self.lookup(parent, name)?.ok_or(NsFault::NotFound)?;
        let mut rec = self.inode(child)?;
        let is_dir = rec.kind == NodeKind::Dir;
        if dir && !is_dir {
            return Err(NsFault::NotDir.into());
        }
        if !dir && is_dir {
            return Err(NsFault::IsDir.into());
        }
        if is_dir && !self.dir_is_empty(child)? {
            return Err(NsFault::NotEmpty.into());
        }
        self.remove_entry(parent, name)?;
        let mut p = self.inode(parent)?;
        p.mtime = now;
        p.ctime = now;
        if is_dir {
            p.nlink -= 1;
        }
        self.put_inode(parent, &p)?;
        rec.nlink = 0;
        rec.ctime = now;
        if rec.kind == NodeKind::File {
            let path = self.path_of(parent, name)?;
            self.retire_history(rec.history, path, now)?;
        }
        self.put_inode(child, &rec)?;
        Ok((child, rec))
    }

    /// rename(2) of `name` in `parent` to `new_name` in `new_parent`, as `how` says.
    /// Returns the inodes whose records changed, with their new records (for the open
    /// copies). A file renamed over a file continues the target path's history
    /// (`continue_history`).
    pub fn rename_node(
        &mut self,
        (parent, name): (InodeId, &[u8]),
        (new_parent, new_name): (InodeId, &[u8]),
        how: RenameHow,
        now: Timestamp,
    ) -> Result<Vec<(InodeId, InodeRecord)>> {
        let src = self.lookup(parent, name)?.ok_or(NsFault::NotFound)?;
        let dst = self.lookup(new_parent, new_name)?;
        if self.inode(new_parent)?.kind != NodeKind::Dir {
            return Err(NsFault::NotDir.into());
        }
        if dst == Some(src) {
            return Ok(Vec::new());
        }
        let mut touched = Vec::new();
        let mut src_rec = self.inode(src)?;
        let src_dir = src_rec.kind == NodeKind::Dir;
        if how.exchange {
            let dst = dst.ok_or(NsFault::NotFound)?;
            let mut dst_rec = self.inode(dst)?;
            let dst_dir = dst_rec.kind == NodeKind::Dir;
            self.repoint_entry(parent, name, dst)?;
            self.repoint_entry(new_parent, new_name, src)?;
            if parent != new_parent && src_dir != dst_dir {
                let (gain, lose) = match src_dir {
                    true => (new_parent, parent),
                    false => (parent, new_parent),
                };
                self.add_links(gain, 1)?;
                self.add_links(lose, -1)?;
            }
            if src_dir {
                src_rec.parent = new_parent;
                src_rec.target = new_name.to_vec();
            }
            if dst_dir {
                dst_rec.parent = parent;
                dst_rec.target = name.to_vec();
            }
            src_rec.ctime = now;
            dst_rec.ctime = now;
            self.put_inode(src, &src_rec)?;
            self.put_inode(dst, &dst_rec)?;
            touched.push((src, src_rec));
            touched.push((dst, dst_rec));
        } else {
            if let Some(dst) = dst {
                if how.noreplace {
                    return Err(NsFault::Exists.into());
                }
                let rec = self.replace_target(
                    (parent, name, src, &mut src_rec),
                    (new_parent, new_name, dst),
                    now,
                )?;
                touched.push((dst, rec));
            }
            self.move_entry(parent, name, new_parent, new_name)?;
            if src_dir {
                src_rec.target = new_name.to_vec();
            }
            if src_dir && parent != new_parent {
                self.add_links(parent, -1)?;
                self.add_links(new_parent, 1)?;
                src_rec.parent = new_parent;
            }
            src_rec.ctime = now;
            self.put_inode(src, &src_rec)?;
            touched.push((src, src_rec));
        }
        for p in [parent, new_parent] {
            let mut r = self.inode(p)?;
            r.mtime = now;
            r.ctime = now;
            self.put_inode(p, &r)?;
        }
        Ok(touched)
    }

    /// A rename's existing target `dst` (at `new_name` in `new_parent`) goes: refused if the
    /// kinds disagree or a directory is not empty; a file's history goes on with the source
    /// file or retires. Returns its new record (nlink 0).
    fn replace_target(
        &mut self,
        (parent, name, src, src_rec): (InodeId, &[u8], InodeId, &mut InodeRecord),
        (new_parent, new_name, dst): (InodeId, &[u8], InodeId),
        now: Timestamp,
    ) -> Result<InodeRecord> {
        let src_dir = src_rec.kind == NodeKind::Dir;
        let mut dst_rec = self.inode(dst)?;
        let dst_dir = dst_rec.kind == NodeKind::Dir;
        if src_dir && !dst_dir {
            return Err(NsFault::NotDir.into());
        }
        if !src_dir && dst_dir {
            return Err(NsFault::IsDir.into());
        }
        if dst_dir && !self.dir_is_empty(dst)? {
            return Err(NsFault::NotEmpty.into());
        }
        self.remove_entry(new_parent, new_name)?;
        if dst_dir {
            self.add_links(new_parent, -1)?;
        }
        if dst_rec.kind == NodeKind::File && src_rec.kind == NodeKind::File {
            let old_path = self.path_of(parent, name)?;
            let dst_path = self.path_of(new_parent, new_name)?;
            self.continue_history((src, src_rec), (dst, &mut dst_rec), old_path, dst_path, now)?;
        } else if dst_rec.kind == NodeKind::File {
            let dst_path = self.path_of(new_parent, new_name)?;
            self.retire_history(dst_rec.history, dst_path, now)?;
        }
        dst_rec.nlink = 0;
        dst_rec.ctime = now;
        self.put_inode(dst, &dst_rec)?;
        Ok(dst_rec)
    }

    fn add_links(&mut self, ino: InodeId, n: i32) -> Result<()> {
        let mut r = self.inode(ino)?;
        r.nlink = r.nlink.wrapping_add_signed(n);
        self.put_inode(ino, &r)
    }

    /// A rename of file `src` over file `dst`: the target path's history goes on. The file
    /// renamed over it becomes its next revision, and the source's own history is retired
    /// under the source's old path `src_path`. When that history held only the revision
    /// just copied (a temporary file saved once: the write-temp-then-rename of torch.save),
    /// nothing of it is worth keeping for keep_unlinked: it is retired as removed long ago,
    /// so the next gc drops it and the target's keep-N alone decides. The caller stores
    /// both records.
    pub fn continue_history(
        &mut self,
        (src, src_rec): (InodeId, &mut InodeRecord),
        (dst, dst_rec): (InodeId, &mut InodeRecord),
        src_path: Vec<u8>,
        dst_path: Vec<u8>,
        now: Timestamp,
    ) -> Result<()> {
        let target_history = dst_rec.history;
        let only_current = self.history_revisions(src_rec.history)? == [src_rec.current_rev];
        let when = if only_current { Timestamp::EPOCH } else { now };
        self.retire_history(src_rec.history, src_path, when)?;
        if src_rec.current_rev.0 != 0 {
            src_rec.current_rev = self.copy_revision(src_rec.current_rev, target_history)?;
        }
        src_rec.history = target_history;
        self.set_history_owner(target_history, src)?;
        // The replaced file (maybe still open) commits into a history of its own from now on.
        let orphan = self.new_history(dst)?;
        self.retire_history(orphan, dst_path, now)?;
        dst_rec.history = orphan;
        // Its current revision stays where it is, in the target's history, which the renamed
        // file continues: a process that looked the name up before the rename and opens the
        // inode after it still reads the content it found (`ckptfs check` allows this for
        // unlinked inodes).
        Ok(())
    }

    /// Changes the stored record of `ino` (attributes: its namespace fields, history and
    /// revision belong to the operations above and to commits). Returns the new record.
    pub fn update_inode(
        &mut self,
        ino: InodeId,
        f: impl FnOnce(&mut InodeRecord),
    ) -> Result<InodeRecord> {
        let mut rec = self.inode(ino)?;
        f(&mut rec);
        self.put_inode(ino, &rec)?;
        Ok(rec)
    }

    /// `update_inode` of an inode that may be gone (a held attribute change of a file gc
    /// removed since): nothing then.
    pub fn set_attrs(&mut self, ino: InodeId, f: impl FnOnce(&mut InodeRecord)) -> Result<()> {
        if let Some(mut rec) = self.get_inode(ino)? {
            f(&mut rec);
            self.put_inode(ino, &rec)?;
        }
        Ok(())
    }

    /// Sets extended attribute `name` of `ino` as `how` says, within the room a record
    /// keeps for names and values (ENOSPC past it), and moves its ctime.
    pub fn set_xattr(
        &mut self,
        ino: InodeId,
        (name, value): (&[u8], &[u8]),
        how: XattrHow,
        now: Timestamp,
    ) -> Result<()> {
        let mut rec = self.inode(ino)?;
        let mut x = self.xattrs(ino)?;
        let exists = x.contains_key(name);
        if how.create && exists {
            return Err(NsFault::Exists.into());
        }
        if how.replace && !exists {
            return Err(NsFault::NoAttr.into());
        }
        x.insert(name.to_vec(), value.to_vec());
        let names: usize = x.keys().map(|n| n.len() + 1).sum();
        let values: usize = x.values().map(Vec::len).sum();
        if names > XATTR_NAMES_ROOM || values > XATTR_VALUES_ROOM {
            return Err(crate::error::Error::NoSpace);
        }
        self.put_xattr(ino, name, value)?;
        rec.ctime = now;
        self.put_inode(ino, &rec)
    }

    /// Removes extended attribute `name` of `ino` (ENODATA if it has none) and moves its
    /// ctime.
    pub fn drop_xattr(&mut self, ino: InodeId, name: &[u8], now: Timestamp) -> Result<()> {
        let mut rec = self.inode(ino)?;
        if !self.remove_xattr(ino, name)? {
            return Err(NsFault::NoAttr.into());
        }
        rec.ctime = now;
        self.put_inode(ino, &rec)
    }

    /// A restore of an unlinked path re-created file `ino`: it continues history `hid`,
    /// and the fresh history its create made retires.
    pub fn adopt_history(&mut self, ino: InodeId, hid: HistoryId, now: Timestamp) -> Result<()> {
        let mut r = self.inode(ino)?;
        let fresh = r.history;
        r.history = hid;
        self.put_inode(ino, &r)?;
        self.set_history_owner(hid, ino)?;
        self.retire_history(fresh, Vec::new(), now)
    }

    /// A restore brings back revision `rev`'s extended attributes with its bytes.
    pub fn restore_xattrs(&mut self, ino: InodeId, rev: RevisionId) -> Result<()> {
        let x = self.revision_xattrs(rev)?;
        self.replace_xattrs(ino, &x)
    }

    /// Changes this slot's version record of `ino` if it has one (None if not), then
    /// raises the slot's namespace stamp to what `ns_stamp` says of the record (if
    /// anything; also when there is no record).
    pub fn update_version(
        &mut self,
        ino: InodeId,
        f: impl FnOnce(&mut VersionMeta),
        ns_stamp: impl FnOnce(Option<&VersionMeta>) -> Option<u64>,
    ) -> Result<Option<VersionMeta>> {
        let m = match self.version(ino)? {
            Some(mut m) => {
                f(&mut m);
                self.put_version(ino, &m)?;
                Some(m)
            }
            None => None,
        };
        if let Some(s) = ns_stamp(m.as_ref()) {
            self.set_ns_stamp(s)?;
        }
        Ok(m)
    }

    /// A new object of this slot (multi-slot namespace): `rec` under `name` in `parent`,
    /// bound at `stamp` (its times are the stamp's), with its first version record.
    pub fn create_object(
        &mut self,
        parent: InodeId,
        name: &[u8],
        mut rec: InodeRecord,
        (stamp, at): (u64, Timestamp),
    ) -> Result<InodeId> {
        let kind = rec.kind;
        let ino = self.alloc_ino()?;
        match kind {
            NodeKind::File => rec.history = self.new_history(ino)?,
            NodeKind::Dir => {
                rec.target = name.to_vec();
                rec.parent = parent;
            }
            _ => {}
        }
        rec.ctime = at;
        rec.mtime = at;
        rec.atime = at;
        rec.crtime = at;
        self.put_inode(ino, &rec)?;
        self.put_version(
            ino,
            &VersionMeta {
                of: ino,
                created: stamp,
                attr_stamp: stamp,
                times_stamp: stamp,
                clip_stamp: 0,
                clip_len: 0,
            },
        )?;
        let b = Binding {
            child: ino,
            stamp,
            kind,
        };
        self.put_binding(parent, name, &b)?;
        self.set_ns_stamp(stamp)?;
        Ok(ino)
    }

    /// A new version of object `obj` in this slot (multi-slot namespace): an inode of its
    /// own made of `rec` (a file's gets a history), with the version record `meta`.
    /// `ns_stamp`: raise the slot's namespace stamp to it.
    pub fn create_version(
        &mut self,
        mut rec: InodeRecord,
        meta: VersionMeta,
        ns_stamp: Option<u64>,
    ) -> Result<InodeId> {
        let ino = self.alloc_ino()?;
        if rec.kind == NodeKind::File {
            rec.history = self.new_history(ino)?;
        }
        self.put_inode(ino, &rec)?;
        self.put_version(ino, &meta)?;
        if let Some(s) = ns_stamp {
            self.set_ns_stamp(s)?;
        }
        Ok(ino)
    }

    /// Retires this slot's object `obj` (it is in the tree no more): unlinked, its history
    /// kept under `path` for the retention policy. None if it is gone or retired already.
    pub fn retire_own(
        &mut self,
        obj: InodeId,
        path: Vec<u8>,
        now: Timestamp,
    ) -> Result<Option<InodeRecord>> {
        let Some(mut rec) = self.get_inode(obj)? else {
            return Ok(None);
        };
        if rec.nlink == 0 {
            return Ok(None);
        }
        rec.nlink = 0;
        rec.ctime = now;
        if rec.kind == NodeKind::File && rec.history != HistoryId::NONE {
            self.retire_history(rec.history, path, now)?;
        }
        self.put_inode(obj, &rec)?;
        Ok(Some(rec))
    }

    /// Writes a multi-slot namespace change's binding records (`Record::Bind`, `Unbind`)
    /// at `stamp`. `replaced`: the name a rename took named this slot's object, which goes
    /// (its history continued by this slot's file renamed over it, or retired). Returns
    /// the replaced object's new record and, when its history went on, the source's.
    #[allow(clippy::type_complexity)]
    pub fn rebind(
        &mut self,
        recs: &[Record],
        stamp: u64,
        replaced: Option<Replaced>,
        now: Timestamp,
    ) -> Result<Option<(InodeId, InodeRecord, Option<(InodeId, InodeRecord)>)>> {
        for r in recs {
            match r {
                Record::Bind(p, n, b) => self.put_binding(*p, n, b)?,
                Record::Unbind(p, n) => self.remove_binding(*p, n)?,
                _ => {}
            }
        }
        self.set_ns_stamp(stamp)?;
        let Some(r) = replaced else {
            return Ok(None);
        };
        if r.src_own_file {
            if let (Some(mut s), Some(mut dr)) = (self.get_inode(r.src)?, self.get_inode(r.dst)?) {
                if s.kind == NodeKind::File && dr.kind == NodeKind::File {
                    self.continue_history(
                        (r.src, &mut s),
                        (r.dst, &mut dr),
                        r.src_path,
                        r.dst_path,
                        now,
                    )?;
                    s.ctime = now;
                    self.put_inode(r.src, &s)?;
                    dr.nlink = 0;
                    dr.ctime = now;
                    self.put_inode(r.dst, &dr)?;
                    return Ok(Some((r.dst, dr, Some((r.src, s)))));
                }
            }
        }
        Ok(self
            .retire_own(r.dst, r.dst_path, now)?
            .map(|rec| (r.dst, rec, None)))
    }

    /// A multi-slot remove: the binding of `name` in `parent` goes (or becomes `tombstone`,
    /// which hides other slots' bindings of the name), and this slot's object it named
    /// (`own`, with its path) retires.
    pub fn unbind(
        &mut self,
        (parent, name): (InodeId, &[u8]),
        tombstone: Option<&Binding>,
        stamp: u64,
        own: Option<(InodeId, Vec<u8>)>,
        now: Timestamp,
    ) -> Result<Option<InodeRecord>> {
        match tombstone {
            Some(t) => self.put_binding(parent, name, t)?,
            None => self.remove_binding(parent, name)?,
        }
        self.set_ns_stamp(stamp)?;
        match own {
            Some((obj, path)) => self.retire_own(obj, path, now),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn file() -> InodeRecord {
        InodeRecord::new(NodeKind::File, 0o644, 1, 1)
    }

    /// A directory's record names its parent (the caller's part of a create).
    fn dir(parent: InodeId) -> InodeRecord {
        InodeRecord {
            parent,
            ..InodeRecord::new(NodeKind::Dir, 0o755, 1, 1)
        }
    }

    fn fault(r: Result<impl std::fmt::Debug>) -> NsFault {
        match r {
            Err(Error::Namespace(f)) => f,
            other => panic!("expected a namespace refusal, got {other:?}"),
        }
    }

    /// The refusals are typed, link counts and setgid follow POSIX/BSD, and a file renamed
    /// over a file continues the target path's history while the source's retires.
    #[test]
    fn namespace_operations_keep_the_rules_in_one_place() {
        let db = super::super::tests::db();
        let w = db.begin_write().unwrap();
        let mut t = Txn::on(&w, None).unwrap();
        let now = Timestamp::EPOCH;
        let root = InodeId::ROOT;
        let (d, _) = t.create_node(root, b"d", dir(root), now).unwrap();
        assert_eq!(
            t.inode(root).unwrap().nlink,
            3,
            "a subdirectory links its parent"
        );
        assert_eq!(
            fault(t.create_node(root, b"d", file(), now)),
            NsFault::Exists
        );
        let (a, _) = t.create_node(d, b"a", file(), now).unwrap();
        assert_eq!(fault(t.create_node(a, b"x", file(), now)), NsFault::NotDir);
        assert_eq!(
            fault(t.remove_node(root, b"d", true, now)),
            NsFault::NotEmpty
        );
        assert_eq!(fault(t.remove_node(d, b"a", true, now)), NsFault::NotDir);
        assert_eq!(fault(t.remove_node(root, b"d", false, now)), NsFault::IsDir);
        assert_eq!(
            fault(t.remove_node(root, b"zz", false, now)),
            NsFault::NotFound
        );
        // A setgid directory passes its group on, and the bit to new directories.
        let mut sg = dir(root);
        sg.perm |= libc::S_ISGID;
        sg.gid = 77;
        let (g, _) = t.create_node(root, b"g", sg, now).unwrap();
        let (_, f_in_g) = t.create_node(g, b"f", file(), now).unwrap();
        let (_, d_in_g) = t.create_node(g, b"sub", dir(g), now).unwrap();
        assert_eq!((f_in_g.gid, f_in_g.perm & libc::S_ISGID), (77, 0));
        assert_eq!(
            (d_in_g.gid, d_in_g.perm & libc::S_ISGID),
            (77, libc::S_ISGID)
        );
        // Write-temp-then-rename: the target's history goes on with the renamed file.
        let (b, b_rec) = t.create_node(d, b"b", file(), now).unwrap();
        let noreplace = RenameHow {
            noreplace: true,
            exchange: false,
        };
        assert_eq!(
            fault(t.rename_node((d, b"a"), (d, b"b"), noreplace, now)),
            NsFault::Exists
        );
        let touched = t
            .rename_node((d, b"a"), (d, b"b"), RenameHow::default(), now)
            .unwrap();
        let of = |i: InodeId| touched.iter().find(|(x, _)| *x == i).unwrap().1.clone();
        assert_eq!(of(a).history, b_rec.history, "the path's history goes on");
        assert_eq!(of(b).nlink, 0);
        assert_eq!(t.lookup(d, b"b").unwrap(), Some(a));
        assert_eq!(t.lookup(d, b"a").unwrap(), None);
        // Exchange across directories moves link counts with the directory.
        let root_links = t.inode(root).unwrap().nlink;
        let exchange = RenameHow {
            noreplace: false,
            exchange: true,
        };
        t.rename_node((root, b"g"), (d, b"b"), exchange, now)
            .unwrap();
        assert_eq!(t.lookup(d, b"b").unwrap(), Some(g));
        assert_eq!(t.lookup(root, b"g").unwrap(), Some(a));
        assert_eq!(t.inode(root).unwrap().nlink, root_links - 1);
        assert_eq!(t.inode(d).unwrap().nlink, 3);
        // Attributes: create and replace refusals, removal of what is not there.
        let x = XattrHow {
            create: true,
            replace: false,
        };
        t.set_xattr(a, (b"user.k", b"v"), x, now).unwrap();
        assert_eq!(
            fault(t.set_xattr(a, (b"user.k", b"w"), x, now)),
            NsFault::Exists
        );
        t.drop_xattr(a, b"user.k", now).unwrap();
        assert_eq!(fault(t.drop_xattr(a, b"user.k", now)), NsFault::NoAttr);
    }
}
