//! The committed state of a single-slot space as one consistent picture, for a copy that
//! lives elsewhere (the object-store tier, `ckptfs-remote`): every node's path and
//! attributes, each regular file's current revision as extents, and the record of every
//! chunk those extents name; and the stored bytes of chunks, checked against their blake3
//! before they leave (a damaged chunk is never copied).

use super::Space;
use crate::catalog::Reader;
use crate::error::{Error, Result};
use crate::format::{ChunkHash, ChunkRecord, Extent, InodeId, InodeRecord, NodeKind, Xattrs};
use crate::read::ChunkSource;
use std::collections::HashMap;

/// One node of the tree (the root itself is not listed).
pub struct TreeNode {
    /// Slash-separated path from the root, without a leading slash.
    pub path: Vec<u8>,
    pub rec: InodeRecord,
    /// A regular file's current revision: `(file offset, extent)`, in file order.
    pub extents: Vec<(u64, Extent)>,
    pub xattrs: Xattrs,
}

/// The space as one read snapshot saw it.
pub struct Tree {
    /// The root directory (its path empty): its mode, owner, times and attributes.
    pub root: TreeNode,
    /// Parents before their children.
    pub nodes: Vec<TreeNode>,
    /// The committed record of every chunk an extent names, and of every chunk held only
    /// by the object-store tier (`ChunkRecord::is_remote`), which kept revisions and the
    /// trash may name too: the bucket must keep those, having the only copy.
    pub chunks: HashMap<ChunkHash, ChunkRecord>,
}

/// A chunk's record and its stored bytes, checked (`Data::read_checked`).
pub type CheckedChunk = (ChunkRecord, Vec<u8>);

/// Entries listed per table read while walking.
const LIST_BATCH: usize = 1024;

impl Space {
    /// The committed tree (see the module doc), from one read snapshot. Refused on a
    /// multi-slot space, whose namespace is the union of every slot's.
    pub fn export_tree(&self) -> Result<Tree> {
        if self.slots().is_shared() {
            return Err(Error::Invalid(
                "a multi-slot space's namespace cannot be exported (the object-store tier \
                 takes spaces of one slot)"
                    .into(),
            ));
        }
        let r: Reader = self.reader()?;
        let mut nodes = Vec::new();
        let mut chunks = HashMap::new();
        let mut dirs: Vec<(InodeId, Vec<u8>)> = vec![(InodeId::ROOT, Vec::new())];
        while let Some((dir, prefix)) = dirs.pop() {
            let mut after = 0;
            loop {
                let batch = r.list_dir(dir, after, LIST_BATCH)?;
                let Some(last) = batch.last() else { break };
                after = last.cookie;
                let inos: Vec<InodeId> = batch.iter().map(|e| e.ino).collect();
                for (e, rec) in batch.iter().zip(r.inodes(&inos)?) {
                    let Some(rec) = rec else { continue };
                    let mut path = prefix.clone();
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(&e.name);
                    let mut extents = Vec::new();
                    if rec.kind == NodeKind::File && rec.current_rev.0 != 0 {
                        extents = r.extents(rec.current_rev)?;
                        for (_, x) in &extents {
                            if let std::collections::hash_map::Entry::Vacant(v) =
                                chunks.entry(x.chunk)
                            {
                                v.insert(r.chunk(&x.chunk)?.ok_or(Error::from(
                                    crate::error::Corruption::UnknownChunk(x.chunk),
                                ))?);
                            }
                        }
                    }
                    if rec.kind == NodeKind::Dir {
                        dirs.push((e.ino, path.clone()));
                    }
                    let xattrs = r.xattrs(e.ino)?;
                    nodes.push(TreeNode {
                        path,
                        rec,
                        extents,
                        xattrs,
                    });
                }
            }
        }
        // Only a space marked for them has such chunks: the others skip the table scan
        // (an upload exports the tree after every change).
        if self
            .superblock()
            .features
            .contains(crate::format::Features::INCOMPAT_REMOTE_CHUNKS)
        {
            r.for_each_chunk_record(|h, c| {
                if c.is_remote() {
                    chunks.entry(h).or_insert(c);
                }
                Ok(())
            })?;
        }
        let root =
            TreeNode {
                path: Vec::new(),
                rec: r.inode(InodeId::ROOT)?.ok_or(Error::from(
                    crate::error::Corruption::Missing(crate::error::Missing::Inode(InodeId::ROOT)),
                ))?,
                extents: Vec::new(),
                xattrs: r.xattrs(InodeId::ROOT)?,
            };
        Ok(Tree {
            root,
            nodes,
            chunks,
        })
    }
}

impl super::faces::Data<'_> {
    /// The stored (encoded) bytes of each committed chunk of `hashes`, each checked against
    /// its blake3 (decoded and hashed) before it is returned, with the record it was read
    /// at; `None` for a chunk no longer committed (gc dropped it since it was named). Reads
    /// in data-file order under the store's reuse barrier, so gc cannot move a chunk
    /// between its lookup and its read. A damaged chunk is an error (`Corruption`), never
    /// bytes.
    pub fn read_checked(self, hashes: &[ChunkHash]) -> Result<Vec<Option<CheckedChunk>>> {
        let store = &self.0.store;
        let _held = store.hold_reuse();
        let mut order: Vec<(usize, ChunkRecord)> = Vec::with_capacity(hashes.len());
        let mut out: Vec<Option<CheckedChunk>> = vec![None; hashes.len()];
        for (i, h) in hashes.iter().enumerate() {
            if let Some(rec) = store.committed_record(h)? {
                order.push((i, rec));
            }
        }
        order.sort_by_key(|(_, r)| r.offset.0);
        for (i, rec) in order {
            let h = hashes[i];
            let checked = store.reader().read_stored(&h, &rec)?.check()?;
            out[i] = Some((rec, checked.bytes().to_vec()));
        }
        Ok(out)
    }
}
