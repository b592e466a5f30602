//! The metadata table (redb): table definitions and the namespace operations on them.
//! Values are the byte encodings from `format`; redb provides atomic, crash-safe commits.

use crate::error::{Error, Result};
use crate::format::{InodeId, InodeRecord, NodeKind};
use redb::{ReadableTable, Table, TableDefinition};

/// inode number -> InodeRecord
pub const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (parent inode, name) -> (child inode, readdir cookie)
pub const DIRENTS: TableDefinition<(u64, &[u8]), (u64, u64)> = TableDefinition::new("dirents");
/// (parent inode, readdir cookie) -> name; gives readdir a stable order and resume point.
pub const DIRLIST: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("dirlist");
/// (inode, revision) -> RevisionRecord
pub const REVISIONS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("revisions");
/// (revision, file offset) -> Extent
pub const EXTENTS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("extents");
/// chunk hash -> ChunkRecord
pub const CHUNKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunks");
/// named counters: next_ino, next_rev, next_cookie, alloc_head
pub const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");

pub const NEXT_INO: &str = "next_ino";
pub const NEXT_REV: &str = "next_rev";
pub const NEXT_COOKIE: &str = "next_cookie";
/// Every byte of the data file below this offset may hold committed chunks.
pub const ALLOC_HEAD: &str = "alloc_head";
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
}

pub fn is_dir(rec: &InodeRecord) -> bool {
    rec.kind == NodeKind::Dir
}
