//! The records of a published manifest (FORMAT.md "Manifests"): bindings, versions with
//! their file's extents and each chunk's stored location, drops and snapshots, each framed
//! as `len u32 | kind u8 | 0 (3) | payload | check u64`. The manifest's areas, its
//! publisher and its readers are `crate::manifest`; only the bytes are here.

use super::cursor::Cur;
use super::{
    Binding, ChunkHash, ChunkRecord, Codec, DataOffset, InodeId, NodeKind, Timestamp, VersionMeta,
};
use crate::error::{Error, Result};

/// Manifest batches are padded to whole blocks of this size (a zero length where a record
/// would start is padding: the next record is at the next block).
pub(crate) const BLOCK: usize = 4096;
const KIND_SNAPSHOT: u8 = 1;
const KIND_BIND: u8 = 5;
const KIND_UNBIND: u8 = 6;
const KIND_VERSION: u8 = 7;
const KIND_DROP: u8 = 8;
const EXTENT_BYTES: usize = 68;

/// One extent of a published file, with where its chunk is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubExtent {
    pub off: u64,
    pub len: u32,
    pub chunk_off: u32,
    pub hash: ChunkHash,
    pub at: DataOffset,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: Codec,
}

impl PubExtent {
    /// The chunk record a read of this extent's chunk needs.
    pub fn chunk_record(&self) -> ChunkRecord {
        ChunkRecord {
            offset: self.at,
            stored_len: self.stored_len,
            raw_len: self.raw_len,
            codec: self.codec,
            refs: 0,
        }
    }
}

/// One published node (a version's local inode): its attributes, a symlink's target, a
/// file's current content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubNode {
    pub ino: InodeId,
    pub kind: NodeKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub size: u64,
    /// The revision a file's extents are (0 for other kinds).
    pub rev: u64,
    pub target: Vec<u8>,
    /// Shared: every read of another node's file takes its node from the views, and a
    /// 1 GiB file has about 16,000 extents (a deep copy per read request cost more than
    /// the request's bytes).
    pub extents: std::sync::Arc<[PubExtent]>,
}

/// A slot's version of an object: which object, its order among the other versions, and
/// its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubVersion {
    pub meta: VersionMeta,
    pub node: PubNode,
}

impl PubVersion {
    /// The version's own inode number (in its slot's range).
    pub fn id(&self) -> InodeId {
        self.node.ino
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A snapshot starts: forget everything known of the slot.
    Snapshot,
    /// This slot's record of the entry `(parent, name)`.
    Bind(InodeId, Vec<u8>, Binding),
    /// This slot no longer has a record of `(parent, name)` (it was superseded).
    Unbind(InodeId, Vec<u8>),
    /// This slot's version of an object, as now committed.
    Version(PubVersion),
    /// This slot no longer has the version (its local inode) named.
    Drop(InodeId),
}

fn put_node(b: &mut Vec<u8>, n: &PubNode) {
    b.extend_from_slice(&n.ino.0.to_le_bytes());
    b.push(n.kind as u8);
    b.extend_from_slice(&[0; 3]);
    for v in [n.perm, n.uid, n.gid] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for t in [n.mtime, n.ctime] {
        b.extend_from_slice(&t.secs.to_le_bytes());
        b.extend_from_slice(&t.nanos.to_le_bytes());
    }
    b.extend_from_slice(&n.size.to_le_bytes());
    b.extend_from_slice(&n.rev.to_le_bytes());
    b.extend_from_slice(&(n.target.len() as u32).to_le_bytes());
    b.extend_from_slice(&(n.extents.len() as u32).to_le_bytes());
    b.extend_from_slice(&n.target);
    for e in n.extents.iter() {
        b.extend_from_slice(&e.off.to_le_bytes());
        b.extend_from_slice(&e.len.to_le_bytes());
        b.extend_from_slice(&e.chunk_off.to_le_bytes());
        b.extend_from_slice(&e.hash.0);
        b.extend_from_slice(&e.at.0.to_le_bytes());
        b.extend_from_slice(&e.stored_len.to_le_bytes());
        b.extend_from_slice(&e.raw_len.to_le_bytes());
        b.push(e.codec.id());
        b.extend_from_slice(&[0; 3]);
    }
}

fn bad(why: &str) -> Error {
    crate::error::Corruption::Record {
        record: "manifest",
        why: why.into(),
    }
    .into()
}

fn kind_of(k: u8) -> Result<NodeKind> {
    NodeKind::from_u8(k).ok_or_else(|| bad("unknown node kind"))
}

fn get_node(c: &mut Cur) -> Result<PubNode> {
    let ino = InodeId(c.u64()?);
    let kind = kind_of(c.u8()?)?;
    c.take(3)?;
    let (perm, uid, gid) = (c.u32()?, c.u32()?, c.u32()?);
    let (mtime, ctime) = (c.time()?, c.time()?);
    let (size, rev) = (c.u64()?, c.u64()?);
    let tlen = c.u32()? as usize;
    let n_ext = c.u32()? as usize;
    let target = c.take(tlen)?.to_vec();
    if n_ext > c.left() / EXTENT_BYTES {
        return Err(bad("more extents than bytes"));
    }
    let mut extents = Vec::with_capacity(n_ext);
    for _ in 0..n_ext {
        let off = c.u64()?;
        let len = c.u32()?;
        let chunk_off = c.u32()?;
        let hash = ChunkHash(c.take(32)?.try_into().expect("32"));
        let at = DataOffset(c.u64()?);
        let (stored_len, raw_len) = (c.u32()?, c.u32()?);
        let codec = Codec::from_u8(c.u8()?).ok_or_else(|| bad("unknown codec"))?;
        c.take(3)?;
        extents.push(PubExtent {
            off,
            len,
            chunk_off,
            hash,
            at,
            stored_len,
            raw_len,
            codec,
        });
    }
    Ok(PubNode {
        ino,
        kind,
        perm,
        uid,
        gid,
        mtime,
        ctime,
        size,
        rev,
        target,
        extents: extents.into(),
    })
}

impl Record {
    /// `len u32 | kind u8 | 0 (3) | payload | check u64` where check is the first 8 bytes
    /// of blake3 of everything before it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 8]);
        let put_name = |out: &mut Vec<u8>, parent: InodeId, name: &[u8]| {
            out.extend_from_slice(&parent.0.to_le_bytes());
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name);
        };
        let kind = match self {
            Record::Snapshot => KIND_SNAPSHOT,
            Record::Bind(parent, name, b) => {
                put_name(out, *parent, name);
                out.extend_from_slice(&b.encode());
                KIND_BIND
            }
            Record::Unbind(parent, name) => {
                put_name(out, *parent, name);
                KIND_UNBIND
            }
            Record::Version(v) => {
                out.extend_from_slice(&v.meta.encode());
                put_node(out, &v.node);
                KIND_VERSION
            }
            Record::Drop(id) => {
                out.extend_from_slice(&id.0.to_le_bytes());
                KIND_DROP
            }
        };
        let len = (out.len() - start + 8) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4] = kind;
        let check = blake3::hash(&out[start..]);
        out.extend_from_slice(&check.as_bytes()[..8]);
    }

    /// Every record in `b` (a manifest half up to its published length). Zero bytes where a
    /// record would start are a batch's padding: reading goes on at the next block.
    pub(crate) fn decode_all(b: &[u8]) -> Result<Vec<Record>> {
        let mut out = Vec::new();
        let mut at = 0usize;
        while at + 8 <= b.len() {
            let len = u32::from_le_bytes(b[at..at + 4].try_into().expect("4")) as usize;
            if len == 0 {
                at = (at / BLOCK + 1) * BLOCK;
                continue;
            }
            if len < 16 || at + len > b.len() {
                return Err(bad("a record's length runs past the published manifest"));
            }
            let rec = &b[at..at + len];
            if blake3::hash(&rec[..len - 8]).as_bytes()[..8] != rec[len - 8..] {
                return Err(bad("a record fails its checksum"));
            }
            let mut c = Cur::new(&rec[..len - 8], 8, "manifest");
            let name = |c: &mut Cur| -> Result<(InodeId, Vec<u8>)> {
                let parent = InodeId(c.u64()?);
                let n = c.u16()? as usize;
                Ok((parent, c.take(n)?.to_vec()))
            };
            out.push(match rec[4] {
                KIND_SNAPSHOT => Record::Snapshot,
                KIND_BIND => {
                    let (parent, n) = name(&mut c)?;
                    let b = Binding::decode(c.take(super::BINDING_LEN)?)?;
                    Record::Bind(parent, n, b)
                }
                KIND_UNBIND => {
                    let (parent, n) = name(&mut c)?;
                    Record::Unbind(parent, n)
                }
                KIND_VERSION => {
                    let meta = VersionMeta::decode(c.take(super::VERSION_META_LEN)?)?;
                    Record::Version(PubVersion {
                        meta,
                        node: get_node(&mut c)?,
                    })
                }
                KIND_DROP => Record::Drop(InodeId(c.u64()?)),
                _ => return Err(bad("unknown record kind")),
            });
            at += len;
        }
        Ok(out)
    }
}
