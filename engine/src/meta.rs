//! The metadata table (redb): table definitions and the namespace operations on them.
//! Values are the byte encodings from `format`; redb provides atomic, crash-safe commits.

use crate::error::{Error, Result};
use crate::format::{
    decode_xattrs, encode_xattrs, ChunkHash, ChunkRecord, Extent, HistoryRecord, InodeId,
    InodeRecord, NodeKind, RevisionId, RevisionRecord, Timestamp, Xattrs,
};
use redb::{ReadableTable, Table, TableDefinition};

/// inode number -> InodeRecord
pub const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (parent inode, name) -> (child inode, readdir cookie)
pub const DIRENTS: TableDefinition<(u64, &[u8]), (u64, u64)> = TableDefinition::new("dirents");
/// (parent inode, readdir cookie) -> name; gives readdir a stable order and resume point.
pub const DIRLIST: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("dirlist");
/// revision -> RevisionRecord
pub const REVISIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("revisions");
/// (history, revision) -> (): the revisions of each history, oldest first
pub const HISTORY_REVS: TableDefinition<(u64, u64), ()> = TableDefinition::new("history_revs");
/// history -> HistoryRecord
pub const HISTORIES: TableDefinition<u64, &[u8]> = TableDefinition::new("histories");
/// segment index -> (): data-file segments holding no committed chunk
pub const FREE: TableDefinition<u64, ()> = TableDefinition::new("free_segments");
/// chunk hash -> (): chunks whose reference count reached zero, for gc to delete
pub const GC_CANDIDATES: TableDefinition<&[u8], ()> = TableDefinition::new("gc_candidates");
/// retention policy and gc settings (see `Config`)
pub const CONFIG: TableDefinition<&str, u64> = TableDefinition::new("config");
/// (revision, file offset) -> Extent
pub const EXTENTS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("extents");
/// chunk hash -> ChunkRecord
pub const CHUNKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunks");
/// named counters: next_ino, next_rev, next_cookie, next_history
pub const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
/// (inode, name) -> value: the extended attributes of live inodes
pub const XATTRS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("xattrs");
/// revision -> its file's extended attributes when it was committed (`format::encode_xattrs`);
/// no row when the file had none
pub const REV_XATTRS: TableDefinition<u64, &[u8]> = TableDefinition::new("revision_xattrs");

pub const NEXT_INO: &str = "next_ino";
pub const NEXT_REV: &str = "next_rev";
pub const NEXT_COOKIE: &str = "next_cookie";
pub const NEXT_HISTORY: &str = "next_history";
/// readdir cookies 1 and 2 are "." and ".."; entries start after them.
pub const FIRST_COOKIE: u64 = 3;

pub fn get_inode(
    t: &impl ReadableTable<u64, &'static [u8]>,
    ino: InodeId,
) -> Result<Option<InodeRecord>> {
    match t.get(ino.0)? {
        Some(v) => Ok(Some(InodeRecord::decode(v.value())?)),
        None => Ok(None),
    }
}

pub fn lookup(
    t: &impl ReadableTable<(u64, &'static [u8]), (u64, u64)>,
    parent: InodeId,
    name: &[u8],
) -> Result<Option<InodeId>> {
    Ok(t.get((parent.0, name))?.map(|v| InodeId(v.value().0)))
}

pub fn counter(t: &impl ReadableTable<&'static str, u64>, name: &str) -> Result<u64> {
    t.get(name)?
        .map(|v| v.value())
        .ok_or_else(|| Error::Corrupt(format!("counter {name} missing from the metadata table")))
}

/// The extended attributes of `ino`.
pub fn xattrs_of(
    t: &impl ReadableTable<(u64, &'static [u8]), &'static [u8]>,
    ino: InodeId,
) -> Result<Xattrs> {
    let mut x = Xattrs::new();
    for item in t.range((ino.0, &b""[..])..(ino.0 + 1, &b""[..]))? {
        let (k, v) = item?;
        x.insert(k.value().1.to_vec(), v.value().to_vec());
    }
    Ok(x)
}

/// What revision `rev` recorded of its file's extended attributes.
pub fn revision_xattrs(
    t: &impl ReadableTable<u64, &'static [u8]>,
    rev: RevisionId,
) -> Result<Xattrs> {
    match t.get(rev.0)? {
        Some(v) => decode_xattrs(v.value()),
        None => Ok(Xattrs::new()),
    }
}

/// Records the extended attributes of `ino` as those of revision `rev` (no row if none).
pub fn record_revision_xattrs(
    xattrs: &impl ReadableTable<(u64, &'static [u8]), &'static [u8]>,
    rev_xattrs: &mut Table<'_, u64, &'static [u8]>,
    ino: InodeId,
    rev: RevisionId,
) -> Result<()> {
    let x = xattrs_of(xattrs, ino)?;
    if !x.is_empty() {
        rev_xattrs.insert(rev.0, encode_xattrs(&x).as_slice())?;
    }
    Ok(())
}

/// Removes every extended attribute of `ino` (an inode being deleted).
pub fn clear_xattrs(
    xattrs: &mut Table<'_, (u64, &'static [u8]), &'static [u8]>,
    ino: InodeId,
) -> Result<()> {
    let names: Vec<Vec<u8>> = xattrs_of(xattrs, ino)?.into_keys().collect();
    for n in names {
        xattrs.remove((ino.0, n.as_slice()))?;
    }
    Ok(())
}

/// One directory entry as listed by readdir.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub cookie: u64,
    pub name: Vec<u8>,
    pub ino: InodeId,
}

/// Entries of `dir` with cookies greater than `after`, at most `limit` of them.
pub fn list_dir(
    dirlist: &impl ReadableTable<(u64, u64), &'static [u8]>,
    dirents: &impl ReadableTable<(u64, &'static [u8]), (u64, u64)>,
    dir: InodeId,
    after: u64,
    limit: usize,
) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    for item in dirlist.range((dir.0, after + 1)..(dir.0, u64::MAX))? {
        let (k, v) = item?;
        let name = v.value().to_vec();
        let ino = lookup(dirents, dir, &name)?
            .ok_or_else(|| Error::Corrupt(format!("dirlist names a missing entry in {}", dir.0)))?;
        out.push(DirEntry {
            cookie: k.value().1,
            name,
            ino,
        });
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// The tables a namespace operation changes, opened in one write transaction.
pub struct NsTxn<'t> {
    pub inodes: Table<'t, u64, &'static [u8]>,
    pub dirents: Table<'t, (u64, &'static [u8]), (u64, u64)>,
    pub dirlist: Table<'t, (u64, u64), &'static [u8]>,
    pub counters: Table<'t, &'static str, u64>,
    pub histories: Table<'t, u64, &'static [u8]>,
    pub revisions: Table<'t, u64, &'static [u8]>,
    pub history_revs: Table<'t, (u64, u64), ()>,
    pub extents: Table<'t, (u64, u64), &'static [u8]>,
    pub chunks: Table<'t, &'static [u8], &'static [u8]>,
    pub xattrs: Table<'t, (u64, &'static [u8]), &'static [u8]>,
    pub rev_xattrs: Table<'t, u64, &'static [u8]>,
}

impl NsTxn<'_> {
    pub fn get_inode(&self, ino: InodeId) -> Result<Option<InodeRecord>> {
        get_inode(&self.inodes, ino)
    }

    /// The inode, or a corruption error: callers use it for inodes that must exist.
    pub fn inode(&self, ino: InodeId) -> Result<InodeRecord> {
        self.get_inode(ino)?
            .ok_or_else(|| Error::Corrupt(format!("inode {} missing", ino.0)))
    }

    pub fn put_inode(&mut self, ino: InodeId, rec: &InodeRecord) -> Result<()> {
        self.inodes.insert(ino.0, rec.encode().as_slice())?;
        Ok(())
    }

    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        lookup(&self.dirents, parent, name)
    }

    pub fn alloc_ino(&mut self) -> Result<InodeId> {
        let n = counter(&self.counters, NEXT_INO)?;
        self.counters.insert(NEXT_INO, n + 1)?;
        Ok(InodeId(n))
    }

    /// Adds the entry `name` -> `child` to `parent`, which must not have it yet.
    pub fn add_entry(&mut self, parent: InodeId, name: &[u8], child: InodeId) -> Result<()> {
        let cookie = counter(&self.counters, NEXT_COOKIE)?;
        self.counters.insert(NEXT_COOKIE, cookie + 1)?;
        let old = self.dirents.insert((parent.0, name), (child.0, cookie))?;
        assert!(old.is_none(), "add_entry over an existing name");
        self.dirlist.insert((parent.0, cookie), name)?;
        Ok(())
    }

    /// Points the existing entry `name` of `parent` at `child`, keeping its readdir cookie:
    /// an exchange changes what a name refers to, not where the name sits in a listing.
    pub fn repoint_entry(&mut self, parent: InodeId, name: &[u8], child: InodeId) -> Result<()> {
        let (_, cookie) = self
            .dirents
            .get((parent.0, name))?
            .map(|v| v.value())
            .ok_or_else(|| Error::Corrupt(format!("entry to repoint missing in {}", parent.0)))?;
        self.dirents.insert((parent.0, name), (child.0, cookie))?;
        Ok(())
    }

    /// Moves the entry `name` of `parent` to `new_name` of `new_parent` (which must not
    /// exist). Within one directory the entry keeps its cookie, so a readdir pass running
    /// while files are renamed in place returns each entry once: a new cookie would put the
    /// renamed entry after the pass's position and list it a second time.
    pub fn move_entry(
        &mut self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
    ) -> Result<()> {
        if parent != new_parent {
            let child = self
                .remove_entry(parent, name)?
                .ok_or_else(|| Error::Corrupt(format!("entry to move missing in {}", parent.0)))?;
            return self.add_entry(new_parent, new_name, child);
        }
        let (child, cookie) = self
            .dirents
            .remove((parent.0, name))?
            .map(|v| v.value())
            .ok_or_else(|| Error::Corrupt(format!("entry to move missing in {}", parent.0)))?;
        let old = self.dirents.insert((parent.0, new_name), (child, cookie))?;
        assert!(old.is_none(), "move_entry over an existing name");
        self.dirlist.insert((parent.0, cookie), new_name)?;
        Ok(())
    }

    pub fn remove_entry(&mut self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        let Some((child, cookie)) = self.dirents.remove((parent.0, name))?.map(|v| v.value())
        else {
            return Ok(None);
        };
        self.dirlist.remove((parent.0, cookie))?;
        Ok(Some(InodeId(child)))
    }

    pub fn dir_is_empty(&self, dir: InodeId) -> Result<bool> {
        Ok(self
            .dirlist
            .range((dir.0, 0)..(dir.0, u64::MAX))?
            .next()
            .is_none())
    }

    /// Starts a new history owned by `ino`.
    pub fn new_history(&mut self, ino: InodeId) -> Result<u64> {
        let hid = counter(&self.counters, NEXT_HISTORY)?;
        self.counters.insert(NEXT_HISTORY, hid + 1)?;
        let h = HistoryRecord {
            ino,
            unlinked: None,
            path: Vec::new(),
        };
        self.histories.insert(hid, h.encode().as_slice())?;
        Ok(hid)
    }

    /// Marks a history as belonging to a path that no longer exists.
    pub fn retire_history(&mut self, hid: u64, path: Vec<u8>, when: Timestamp) -> Result<()> {
        let mut h = get_history(&self.histories, hid)?;
        h.unlinked = Some(when);
        h.path = path;
        self.histories.insert(hid, h.encode().as_slice())?;
        Ok(())
    }

    pub fn set_history_owner(&mut self, hid: u64, ino: InodeId) -> Result<()> {
        let mut h = get_history(&self.histories, hid)?;
        h.ino = ino;
        h.unlinked = None;
        h.path.clear();
        self.histories.insert(hid, h.encode().as_slice())?;
        Ok(())
    }

    /// The full path of the entry `name` in directory `parent`, from the root.
    pub fn path_of(&self, parent: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        let mut parts = vec![name.to_vec()];
        let mut dir = parent;
        while dir != InodeId::ROOT {
            let rec = self.inode(dir)?;
            parts.push(rec.target.clone());
            dir = rec.parent;
        }
        parts.reverse();
        Ok(parts.join(&b'/'))
    }

    /// The revisions of a history, oldest first (sealed or not).
    pub fn history_revisions(&self, hid: u64) -> Result<Vec<RevisionId>> {
        Ok(self
            .history_revs
            .range((hid, 0)..=(hid, u64::MAX))?
            .map(|r| r.map(|(k, _)| RevisionId(k.value().1)))
            .collect::<std::result::Result<_, _>>()?)
    }

    pub fn xattrs(&self, ino: InodeId) -> Result<Xattrs> {
        xattrs_of(&self.xattrs, ino)
    }

    pub fn put_xattr(&mut self, ino: InodeId, name: &[u8], value: &[u8]) -> Result<()> {
        self.xattrs.insert((ino.0, name), value)?;
        Ok(())
    }

    /// Whether `ino` had the attribute.
    pub fn remove_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<bool> {
        Ok(self.xattrs.remove((ino.0, name))?.is_some())
    }

    /// Makes `x` the whole set of `ino`'s extended attributes.
    pub fn replace_xattrs(&mut self, ino: InodeId, x: &Xattrs) -> Result<()> {
        clear_xattrs(&mut self.xattrs, ino)?;
        for (n, v) in x {
            self.put_xattr(ino, n, v)?;
        }
        Ok(())
    }

    pub fn revision_xattrs(&self, rev: RevisionId) -> Result<Xattrs> {
        revision_xattrs(&self.rev_xattrs, rev)
    }

    /// Adds a sealed revision to history `hid` with the content of revision `from`, taking a
    /// reference on each of its chunks. Used when a rename replaces a path's file.
    pub fn copy_revision(&mut self, from: RevisionId, hid: u64) -> Result<RevisionId> {
        let src = get_revision(&self.revisions, from)?
            .ok_or_else(|| Error::Corrupt(format!("revision {} missing", from.0)))?;
        let rev = counter(&self.counters, NEXT_REV)?;
        self.counters.insert(NEXT_REV, rev + 1)?;
        let rows: Vec<(u64, Vec<u8>)> = self
            .extents
            .range((from.0, 0)..=(from.0, u64::MAX))?
            .map(|r| r.map(|(k, v)| (k.value().1, v.value().to_vec())))
            .collect::<std::result::Result<_, _>>()?;
        for (off, v) in rows {
            let e = Extent::decode(&v)?;
            add_chunk_ref(&mut self.chunks, &e.chunk)?;
            self.extents.insert((rev, off), v.as_slice())?;
        }
        let rr = RevisionRecord {
            committed: Timestamp::now(),
            new_stored_bytes: 0,
            sealed: true,
            history: hid,
            ..src
        };
        self.revisions.insert(rev, rr.encode().as_slice())?;
        self.history_revs.insert((hid, rev), ())?;
        let x = self.rev_xattrs.get(from.0)?.map(|v| v.value().to_vec());
        if let Some(x) = x {
            self.rev_xattrs.insert(rev, x.as_slice())?;
        }
        Ok(RevisionId(rev))
    }
}

pub fn get_history(t: &impl ReadableTable<u64, &'static [u8]>, hid: u64) -> Result<HistoryRecord> {
    match t.get(hid)? {
        Some(v) => HistoryRecord::decode(v.value()),
        None => Err(Error::Corrupt(format!("history {hid} missing"))),
    }
}

pub fn get_revision(
    t: &impl ReadableTable<u64, &'static [u8]>,
    rev: RevisionId,
) -> Result<Option<RevisionRecord>> {
    match t.get(rev.0)? {
        Some(v) => Ok(Some(RevisionRecord::decode(v.value())?)),
        None => Ok(None),
    }
}

/// Takes one reference on a committed chunk.
pub fn add_chunk_ref(
    chunks: &mut Table<'_, &'static [u8], &'static [u8]>,
    h: &ChunkHash,
) -> Result<()> {
    let rec = chunks
        .get(h.0.as_slice())?
        .map(|v| ChunkRecord::decode(v.value()))
        .transpose()?
        .ok_or_else(|| Error::Corrupt(format!("extent names unknown chunk {h:?}")))?;
    let rec = ChunkRecord {
        refs: rec.refs + 1,
        ..rec
    };
    chunks.insert(h.0.as_slice(), rec.encode().as_slice())?;
    Ok(())
}

/// Deletes a revision: its extents (dropping one chunk reference each), its record and its
/// place in its history. Chunks left with no reference stay until gc removes them.
pub fn drop_revision(
    revisions: &mut Table<'_, u64, &'static [u8]>,
    history_revs: &mut Table<'_, (u64, u64), ()>,
    extents: &mut Table<'_, (u64, u64), &'static [u8]>,
    chunks: &mut Table<'_, &'static [u8], &'static [u8]>,
    candidates: &mut Table<'_, &'static [u8], ()>,
    rev_xattrs: &mut Table<'_, u64, &'static [u8]>,
    rev: RevisionId,
) -> Result<()> {
    let Some(rr) = get_revision(revisions, rev)? else {
        return Ok(());
    };
    let rows: Vec<(u64, Vec<u8>)> = extents
        .range((rev.0, 0)..=(rev.0, u64::MAX))?
        .map(|r| r.map(|(k, v)| (k.value().1, v.value().to_vec())))
        .collect::<std::result::Result<_, _>>()?;
    for (off, v) in rows {
        let e = Extent::decode(&v)?;
        let existing = chunks
            .get(e.chunk.0.as_slice())?
            .map(|v| ChunkRecord::decode(v.value()))
            .transpose()?;
        if let Some(c) = existing {
            let c = ChunkRecord {
                refs: c.refs.saturating_sub(1),
                ..c
            };
            chunks.insert(e.chunk.0.as_slice(), c.encode().as_slice())?;
            if c.refs == 0 {
                candidates.insert(e.chunk.0.as_slice(), ())?;
            }
        }
        extents.remove((rev.0, off))?;
    }
    revisions.remove(rev.0)?;
    history_revs.remove((rr.history, rev.0))?;
    rev_xattrs.remove(rev.0)?;
    Ok(())
}

pub fn is_dir(rec: &InodeRecord) -> bool {
    rec.kind == NodeKind::Dir
}
