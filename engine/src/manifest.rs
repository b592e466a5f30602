//! Published manifests of a multi-slot space (FORMAT.md "Manifests"): what a slot's owner
//! writes so that other nodes can list and read its files without opening its live
//! metadata table.
//!
//! Each slot has a manifest area of two halves at the start of its share of the data file.
//! The owner appends batches of records to the half of the current generation, each batch
//! padded to whole 4 KiB blocks (a written block is never written again), makes them durable,
//! then publishes the new length in its slot header. When a half is full, the owner writes a
//! complete snapshot of its namespace into the other half and publishes it as the next
//! generation; readers that see a new generation read that half from its start.
//!
//! Records describe the namespace by the slot's own inode numbers: a directory record lists
//! a directory's entries (replacing what was known of it), a node record gives one node's
//! attributes and, for a regular file, its current revision's extents with each chunk's
//! stored location. Paths are resolved by readers from the slot's root (inode 1).

use crate::chunk::Verified;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::{
    ChunkHash, ChunkRecord, Codec, DataOffset, InodeId, NodeKind, SlotId, Superblock, Timestamp,
};
use crate::slots::{Lease, SlotTable};
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

const BLOCK: usize = 4096;
const KIND_SNAPSHOT: u8 = 1;
const KIND_DIR: u8 = 2;
const KIND_NODE: u8 = 3;
const KIND_WHITEOUT: u8 = 4;
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

/// One published node: its attributes, a symlink's target, a file's current content.
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
    pub extents: Vec<PubExtent>,
}

/// One published directory: its own attributes and its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubDir {
    pub node: PubNode,
    pub entries: Vec<(Vec<u8>, InodeId, NodeKind)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A snapshot starts: forget everything known of the slot.
    Snapshot,
    Dir(PubDir),
    Node(PubNode),
    /// This slot removed `path` at `when`: other slots' entries there changed before
    /// `when` are hidden.
    Whiteout(Vec<u8>, Timestamp),
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
    for e in &n.extents {
        b.extend_from_slice(&e.off.to_le_bytes());
        b.extend_from_slice(&e.len.to_le_bytes());
        b.extend_from_slice(&e.chunk_off.to_le_bytes());
        b.extend_from_slice(&e.hash.0);
        b.extend_from_slice(&e.at.0.to_le_bytes());
        b.extend_from_slice(&e.stored_len.to_le_bytes());
        b.extend_from_slice(&e.raw_len.to_le_bytes());
        b.push(e.codec as u8);
        b.extend_from_slice(&[0; 3]);
    }
}

/// A cursor over a record's payload; every read is bounds-checked.
struct Cur<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cur<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| bad("a record runs past its end"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn time(&mut self) -> Result<Timestamp> {
        let secs = self.u64()? as i64;
        Ok(Timestamp {
            secs,
            nanos: self.u32()?,
        })
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
    if n_ext > (c.b.len() - c.at) / EXTENT_BYTES {
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
        extents,
    })
}

impl Record {
    /// `len u32 | kind u8 | 0 (3) | payload | check u64` where check is the first 8 bytes
    /// of blake3 of everything before it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 8]);
        let kind = match self {
            Record::Snapshot => KIND_SNAPSHOT,
            Record::Dir(d) => {
                put_node(out, &d.node);
                out.extend_from_slice(&(d.entries.len() as u32).to_le_bytes());
                for (name, ino, kind) in &d.entries {
                    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                    out.push(*kind as u8);
                    out.push(0);
                    out.extend_from_slice(&ino.0.to_le_bytes());
                    out.extend_from_slice(name);
                }
                KIND_DIR
            }
            Record::Node(n) => {
                put_node(out, n);
                KIND_NODE
            }
            Record::Whiteout(path, when) => {
                out.extend_from_slice(&when.secs.to_le_bytes());
                out.extend_from_slice(&when.nanos.to_le_bytes());
                out.extend_from_slice(&(path.len() as u32).to_le_bytes());
                out.extend_from_slice(path);
                KIND_WHITEOUT
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
    pub fn decode_all(b: &[u8]) -> Result<Vec<Record>> {
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
            let mut c = Cur {
                b: &rec[..len - 8],
                at: 8,
            };
            out.push(match rec[4] {
                KIND_SNAPSHOT => Record::Snapshot,
                KIND_NODE => Record::Node(get_node(&mut c)?),
                KIND_WHITEOUT => {
                    let when = c.time()?;
                    let n = c.u32()? as usize;
                    Record::Whiteout(c.take(n)?.to_vec(), when)
                }
                KIND_DIR => {
                    let node = get_node(&mut c)?;
                    let n = c.u32()? as usize;
                    let mut entries = Vec::with_capacity(n.min(1 << 16));
                    for _ in 0..n {
                        let nl = c.u16()? as usize;
                        let kind = kind_of(c.u8()?)?;
                        c.u8()?;
                        let ino = InodeId(c.u64()?);
                        entries.push((c.take(nl)?.to_vec(), ino, kind));
                    }
                    Record::Dir(PubDir { node, entries })
                }
                _ => return Err(bad("unknown record kind")),
            });
            at += len;
        }
        Ok(out)
    }
}

/// Encodes `recs` as one batch: whole blocks, zero-padded.
fn batch(recs: &[Record]) -> Vec<u8> {
    let mut b = Vec::new();
    for r in recs {
        r.encode(&mut b);
    }
    let padded = b.len().div_ceil(BLOCK) * BLOCK;
    b.resize(padded, 0);
    b
}

/// The owner's side: appends batches to its manifest and publishes them.
pub struct Publisher {
    dev: Arc<dyn Device>,
    lease: Arc<Lease>,
    halves: [(u64, u64); 2],
    /// Serialises publications; holds (generation, length) as published.
    state: Mutex<(u64, u64)>,
}

impl Publisher {
    pub fn new(sb: &Superblock, dev: Arc<dyn Device>, lease: Arc<Lease>) -> Publisher {
        let slot = lease.slot();
        let state = lease.manifest();
        Publisher {
            dev,
            halves: [sb.manifest_half(slot, 0), sb.manifest_half(slot, 1)],
            lease,
            state: Mutex::new(state),
        }
    }

    /// Appends `recs` to the current generation and publishes it. `Ok(false)`: they do not
    /// fit in what is left of the half; the caller publishes a snapshot instead.
    pub fn append(&self, recs: &[Record]) -> Result<bool> {
        let b = batch(recs);
        let mut st = self.state.lock();
        let (gen, len) = *st;
        let (base, cap) = self.halves[(gen % 2) as usize];
        if gen == 0 || len + b.len() as u64 > cap {
            return Ok(false);
        }
        self.dev.write_at(&b, base + len)?;
        self.dev.sync()?;
        self.lease.publish(gen, len + b.len() as u64)?;
        *st = (gen, len + b.len() as u64);
        Ok(true)
    }

    /// Publishes `recs` (the whole namespace) as the next generation, in the other half.
    pub fn snapshot(&self, recs: &[Record]) -> Result<()> {
        let mut all = vec![Record::Snapshot];
        all.extend_from_slice(recs);
        let b = batch(&all);
        let mut st = self.state.lock();
        let gen = st.0 + 1;
        let (base, cap) = self.halves[(gen % 2) as usize];
        if b.len() as u64 > cap {
            return Err(Error::NoSpace);
        }
        self.dev.write_at(&b, base)?;
        self.dev.sync()?;
        self.lease.publish(gen, b.len() as u64)?;
        *st = (gen, b.len() as u64);
        log::debug!("manifest generation {gen}: snapshot of {} bytes", b.len());
        Ok(())
    }
}

/// What one other slot has published, as this node last read it.
#[derive(Default)]
pub struct SlotView {
    pub gen: u64,
    pub len: u64,
    pub dirs: HashMap<InodeId, PubDir>,
    pub nodes: HashMap<InodeId, PubNode>,
    /// Paths (from the root, '/'-separated) this slot removed, and when.
    pub whiteouts: HashMap<Vec<u8>, Timestamp>,
}

impl SlotView {
    fn apply(&mut self, recs: Vec<Record>) {
        for r in recs {
            match r {
                Record::Snapshot => {
                    self.dirs.clear();
                    self.nodes.clear();
                    self.whiteouts.clear();
                }
                Record::Whiteout(path, when) => {
                    self.whiteouts.insert(path, when);
                }
                Record::Dir(d) => {
                    self.nodes.insert(d.node.ino, d.node.clone());
                    self.dirs.insert(d.node.ino, d);
                }
                Record::Node(n) => {
                    self.nodes.insert(n.ino, n);
                }
            }
        }
        // Forget what no directory names any more (removed, or a rename's old place).
        let mut live: HashSet<InodeId> = HashSet::new();
        let mut stack = vec![InodeId::ROOT];
        while let Some(d) = stack.pop() {
            if !live.insert(d) {
                continue;
            }
            if let Some(dir) = self.dirs.get(&d) {
                for (_, ino, kind) in &dir.entries {
                    if *kind == NodeKind::Dir {
                        stack.push(*ino);
                    } else {
                        live.insert(*ino);
                    }
                }
            }
        }
        self.dirs.retain(|k, _| live.contains(k));
        self.nodes.retain(|k, _| live.contains(k));
    }

    /// The node at `path` (components from the slot's root).
    pub fn resolve(&self, path: &[&[u8]]) -> Option<&PubNode> {
        let mut ino = InodeId::ROOT;
        for comp in path {
            let dir = self.dirs.get(&ino)?;
            ino = dir.entries.iter().find(|(n, _, _)| n == comp)?.1;
        }
        self.nodes.get(&ino)
    }
}

/// This node's view of every other slot's published manifest.
pub struct Union {
    table: SlotTable,
    dev: Arc<dyn Device>,
    sb: Superblock,
    me: SlotId,
    views: RwLock<HashMap<SlotId, Arc<SlotView>>>,
    /// Held while refreshing: when the last refresh started.
    refreshing: Mutex<Option<std::time::Instant>>,
    refreshes: std::sync::atomic::AtomicU64,
}

/// Every this many refreshes, every slot's header is read whatever its hint says.
const FULL_REFRESH_EVERY: u64 = 16;

impl Union {
    pub fn new(table: SlotTable, dev: Arc<dyn Device>, sb: Superblock, me: SlotId) -> Union {
        Union {
            table,
            dev,
            sb,
            me,
            views: RwLock::new(HashMap::new()),
            refreshing: Mutex::new(None),
            refreshes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Reads every slot header and whatever each other slot published since the last
    /// refresh. A slot whose manifest cannot be read keeps its last view (logged).
    pub fn refresh(&self) -> Result<()> {
        self.refresh_since(std::time::Instant::now())
    }

    /// Makes sure a refresh that started at or after `t` has completed: what every slot
    /// published before `t` is in the views then. Concurrent callers share one refresh
    /// (close-to-open for every lookup without a header read each).
    pub fn refresh_since(&self, t: std::time::Instant) -> Result<()> {
        let mut last = self.refreshing.lock();
        if last.is_some_and(|l| l >= t) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        self.refresh_locked()?;
        *last = Some(started);
        Ok(())
    }

    fn refresh_locked(&self) -> Result<()> {
        // The hints first (64 bytes a slot); whole headers only of slots whose hint moved,
        // or is not intact, and of every slot once every `FULL_REFRESH_EVERY` refreshes (a
        // hint lost on a filesystem without byte-range coherence).
        let n = self
            .refreshes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hints = self.table.hints()?;
        let full = n.is_multiple_of(FULL_REFRESH_EVERY);
        let mut headers = Vec::new();
        for (i, hint) in hints.iter().enumerate() {
            let slot = SlotId(i as u32);
            if slot == self.me {
                continue;
            }
            let known = self.views.read().get(&slot).map(|v| (v.gen, v.len));
            let moved = match hint {
                Some(h) => known != Some((h.manifest_gen, h.manifest_len)) && h.manifest_gen != 0,
                None => true,
            };
            if full || moved {
                headers.push(self.table.read(slot)?);
            }
        }
        for h in headers {
            if h.slot == self.me || h.manifest_gen == 0 {
                continue;
            }
            let old = self.views.read().get(&h.slot).cloned();
            let (gen, len) = (h.manifest_gen, h.manifest_len);
            if let Some(v) = &old {
                if v.gen == gen && v.len == len {
                    continue;
                }
            }
            let (base, cap) = self.sb.manifest_half(h.slot, gen % 2);
            let from = match &old {
                Some(v) if v.gen == gen && v.len <= len => v.len,
                _ => 0,
            };
            if len > cap {
                log::warn!(
                    "slot {}: its manifest length {len} exceeds its area",
                    h.slot
                );
                continue;
            }
            let mut b = vec![0u8; (len - from) as usize];
            let recs = self
                .dev
                .read_at(&mut b, base + from)
                .map_err(Error::from)
                .and_then(|_| Record::decode_all(&b));
            let recs = match recs {
                Ok(r) => r,
                Err(e) => {
                    // A generation may have been replaced while it was read: the next
                    // refresh reads the newer one.
                    log::info!("slot {}: manifest not read this time: {e}", h.slot);
                    continue;
                }
            };
            let mut v = match (&old, from) {
                (Some(o), f) if f > 0 => SlotView {
                    gen,
                    len,
                    dirs: o.dirs.clone(),
                    nodes: o.nodes.clone(),
                    whiteouts: o.whiteouts.clone(),
                },
                _ => SlotView {
                    gen,
                    len,
                    ..SlotView::default()
                },
            };
            v.apply(recs);
            self.views.write().insert(h.slot, Arc::new(v));
        }
        Ok(())
    }

    /// The views of the other slots, in slot order.
    pub fn views(&self) -> Vec<(SlotId, Arc<SlotView>)> {
        let mut v: Vec<_> = self
            .views
            .read()
            .iter()
            .map(|(s, v)| (*s, v.clone()))
            .collect();
        v.sort_by_key(|(s, _)| *s);
        v
    }

    pub fn view(&self, slot: SlotId) -> Option<Arc<SlotView>> {
        self.views.read().get(&slot).cloned()
    }

    /// Reads and verifies one chunk of another slot at its published location.
    pub fn read_chunk(&self, e: &PubExtent) -> Result<Verified> {
        let mut b = vec![0u8; e.stored_len as usize];
        self.dev.read_at(&mut b, e.at.0)?;
        crate::chunk::Stored::new(e.hash, e.chunk_record(), b).verify()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ino: u64, kind: NodeKind, extents: Vec<PubExtent>) -> PubNode {
        PubNode {
            ino: InodeId(ino),
            kind,
            perm: 0o644,
            uid: 1,
            gid: 2,
            mtime: Timestamp { secs: 5, nanos: 6 },
            ctime: Timestamp { secs: 7, nanos: 8 },
            size: 100,
            rev: 3,
            target: b"t".to_vec(),
            extents,
        }
    }

    #[test]
    fn records_round_trip_and_damage_is_caught() {
        let e = PubExtent {
            off: 0,
            len: 100,
            chunk_off: 0,
            hash: ChunkHash::of(b"x"),
            at: DataOffset(4096),
            stored_len: 50,
            raw_len: 100,
            codec: Codec::Lz4,
        };
        let recs = vec![
            Record::Snapshot,
            Record::Dir(PubDir {
                node: node(1, NodeKind::Dir, vec![]),
                entries: vec![(b"f".to_vec(), InodeId(2), NodeKind::File)],
            }),
            Record::Node(node(2, NodeKind::File, vec![e])),
            Record::Whiteout(b"step-1/rank-3".to_vec(), Timestamp { secs: 9, nanos: 1 }),
        ];
        let b = batch(&recs);
        assert_eq!(b.len() % BLOCK, 0);
        let mut two = b.clone();
        two.extend_from_slice(&batch(&recs[2..]));
        let back = Record::decode_all(&two).unwrap();
        assert_eq!(back.len(), 6);
        assert_eq!(back[..4], recs[..]);
        let mut v = SlotView::default();
        v.apply(back);
        assert_eq!(v.resolve(&[b"f"]).unwrap().extents.len(), 1);
        assert_eq!(v.whiteouts.len(), 1);
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert!(Record::decode_all(&bad).is_err());
        // A directory that no longer names the file: it is forgotten.
        v.apply(vec![Record::Dir(PubDir {
            node: node(1, NodeKind::Dir, vec![]),
            entries: vec![],
        })]);
        assert!(v.resolve(&[b"f"]).is_none() && v.nodes.len() == 1);
    }
}
