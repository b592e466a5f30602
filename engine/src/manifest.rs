//! Published manifests of a multi-slot space (FORMAT.md "Manifests"): what a slot's owner
//! writes so that other nodes can see its part of the shared namespace and read its files
//! without opening its live metadata table.
//!
//! Each slot has a manifest area of two halves at the start of its share of the data file.
//! The owner appends batches of records to the half of the current generation, each batch
//! padded to whole 4 KiB blocks (a written block is never written again), makes them durable,
//! then publishes the new length in its slot header. When a half is full, the owner writes a
//! complete snapshot of its records into the other half and publishes it as the next
//! generation; readers that see a new generation read that half from its start.
//!
//! Records are the slot's part of the shared namespace (FORMAT.md "Shared namespace"):
//! bindings (`(parent object, name) -> object` or a tombstone, with a stamp) and versions
//! (the slot's version of an object: its attributes and, for a regular file, one layer of
//! its bytes with each chunk's stored location). Objects are named by global inode
//! numbers, the same on every node.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::manifest::BLOCK;
pub use crate::format::manifest::{PubExtent, PubNode, PubVersion, Record};
use crate::format::{Binding, DataOffset, InodeId, Intent, SlotHint, SlotId, Superblock};
use crate::slots::{Lease, SlotTable};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Encodes `recs` as one batch: whole multiples of `align` (a block, or a row of an
/// erasure-coded segment), zero-padded.
fn batch(recs: &[Record], align: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for r in recs {
        r.encode(&mut b);
    }
    let padded = b.len().div_ceil(align) * align;
    b.resize(padded, 0);
    b
}

/// The owner's side: appends batches to its manifest and publishes them.
pub(crate) struct Publisher {
    dev: Arc<dyn Device>,
    lease: Arc<Lease>,
    halves: [(u64, u64); 2],
    /// What every batch is padded to: the device's write unit (a multiple of `BLOCK`).
    align: usize,
    /// Serialises publications; holds (generation, length) as published.
    state: Mutex<(u64, u64)>,
    /// Manifest writes made (appends and snapshots): `Stats::commits.publications`.
    written: std::sync::atomic::AtomicU64,
}

impl Publisher {
    /// A publisher writing to `dev` (the data file, or the placement as a device) in
    /// batches of whole `align` bytes.
    pub fn new(
        sb: &Superblock,
        dev: Arc<dyn Device>,
        align: usize,
        lease: Arc<Lease>,
    ) -> Publisher {
        let slot = lease.slot();
        let state = lease.manifest();
        assert!(align.is_multiple_of(BLOCK) && align > 0);
        Publisher {
            dev,
            align,
            halves: [sb.manifest_half(slot, 0), sb.manifest_half(slot, 1)],
            lease,
            state: Mutex::new(state),
            written: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Manifest writes made so far (appends and snapshots).
    pub fn written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Appends `recs` to the current generation and publishes it. `Ok(false)`: they do not
    /// fit in what is left of the half; the caller publishes a snapshot instead.
    pub fn append(&self, recs: &[Record]) -> Result<bool> {
        let b = batch(recs, self.align);
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
        self.written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    /// Publishes `recs` (the whole namespace) as the next generation, in the other half.
    pub fn snapshot(&self, recs: &[Record]) -> Result<()> {
        let mut st = self.state.lock();
        self.snapshot_locked(&mut st, recs)
    }

    fn snapshot_locked(&self, st: &mut (u64, u64), recs: &[Record]) -> Result<()> {
        let mut all = vec![Record::Snapshot];
        all.extend_from_slice(recs);
        let b = batch(&all, self.align);
        let gen = st.0 + 1;
        let (base, cap) = self.halves[(gen % 2) as usize];
        if b.len() as u64 > cap {
            return Err(Error::NoSpace);
        }
        self.dev.write_at(&b, base)?;
        self.dev.sync()?;
        self.lease.publish(gen, b.len() as u64)?;
        *st = (gen, b.len() as u64);
        self.written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        log::debug!("manifest generation {gen}: snapshot of {} bytes", b.len());
        Ok(())
    }

    /// Restores the redundancy of the manifest area (`ckptfs rebuild` and `scrub` of a
    /// slot over targets): a half that `whole(half)` finds short is re-placed by
    /// `replace(half)` while it holds nothing published, so the published half is never
    /// touched in place: if it is the short one, `recs` are published as a snapshot into
    /// the other half first. `rewrite` (a scrub, which cannot verify parity of records
    /// the way it verifies chunks) publishes the snapshot anyway, so every shard of the
    /// published bytes is written afresh. Returns whether anything was re-placed or
    /// rewritten.
    pub fn renew(
        &self,
        recs: &[Record],
        rewrite: bool,
        whole: &dyn Fn(u64) -> bool,
        replace: &dyn Fn(u64) -> Result<()>,
    ) -> Result<bool> {
        let mut st = self.state.lock();
        let mut renewed = false;
        let other = (st.0 + 1) % 2;
        if !whole(other) {
            replace(other)?;
            renewed = true;
        }
        let current = st.0 % 2;
        if st.0 > 0 && rewrite && whole(current) {
            self.snapshot_locked(&mut st, recs)?;
            return Ok(true);
        }
        if st.0 > 0 && !whole(current) {
            self.snapshot_locked(&mut st, recs)?;
            replace(current)?;
            renewed = true;
        }
        Ok(renewed)
    }
}

/// What one slot has published (or, for this node's own slot, committed), as this node
/// last read it: its bindings and its versions, indexed for lookups, listings and the
/// parent of an object.
#[derive(Default, Clone)]
pub struct SlotView {
    pub gen: u64,
    pub len: u64,
    pub bindings: HashMap<(InodeId, Vec<u8>), Binding>,
    /// The names this slot has a record of, by directory (readdir).
    pub by_parent: HashMap<InodeId, BTreeSet<Vec<u8>>>,
    /// The records naming an object, by object (its parent, `..`).
    pub by_child: HashMap<InodeId, BTreeSet<(InodeId, Vec<u8>)>>,
    pub versions: HashMap<InodeId, PubVersion>,
    /// This slot's versions of each object.
    pub of: HashMap<InodeId, BTreeSet<InodeId>>,
    /// The newest stamp of this slot's records in each directory (its change time).
    pub parent_stamp: HashMap<InodeId, u64>,
    /// The highest stamp in the records applied (every node's clock runs past it).
    pub max_stamp: u64,
}

impl SlotView {
    pub fn apply(&mut self, recs: Vec<Record>) {
        for r in recs {
            self.apply_one(r);
        }
    }

    pub(crate) fn apply_one(&mut self, r: Record) {
        match r {
            Record::Snapshot => {
                let (gen, len) = (self.gen, self.len);
                *self = SlotView {
                    gen,
                    len,
                    ..SlotView::default()
                };
            }
            Record::Bind(parent, name, b) => {
                self.max_stamp = self.max_stamp.max(b.stamp);
                let ps = self.parent_stamp.entry(parent).or_default();
                *ps = (*ps).max(b.stamp);
                self.unbind(parent, &name);
                if !b.is_tombstone() {
                    self.by_child
                        .entry(b.child)
                        .or_default()
                        .insert((parent, name.clone()));
                }
                self.by_parent
                    .entry(parent)
                    .or_default()
                    .insert(name.clone());
                self.bindings.insert((parent, name), b);
            }
            Record::Unbind(parent, name) => self.unbind(parent, &name),
            Record::Version(v) => {
                let m = v.meta;
                self.max_stamp = self
                    .max_stamp
                    .max(m.created)
                    .max(m.attr_stamp)
                    .max(m.times_stamp)
                    .max(m.clip_stamp);
                self.of.entry(m.of).or_default().insert(v.id());
                self.versions.insert(v.id(), v);
            }
            Record::Drop(id) => {
                if let Some(v) = self.versions.remove(&id) {
                    if let Some(s) = self.of.get_mut(&v.meta.of) {
                        s.remove(&id);
                        if s.is_empty() {
                            self.of.remove(&v.meta.of);
                        }
                    }
                }
            }
        }
    }

    fn unbind(&mut self, parent: InodeId, name: &[u8]) {
        let key = (parent, name.to_vec());
        let Some(old) = self.bindings.remove(&key) else {
            return;
        };
        if !old.is_tombstone() {
            if let Some(s) = self.by_child.get_mut(&old.child) {
                s.remove(&key);
                if s.is_empty() {
                    self.by_child.remove(&old.child);
                }
            }
        }
        if let Some(s) = self.by_parent.get_mut(&parent) {
            s.remove(name);
            if s.is_empty() {
                self.by_parent.remove(&parent);
            }
        }
    }

    pub fn binding(&self, parent: InodeId, name: &[u8]) -> Option<&Binding> {
        self.bindings.get(&(parent, name.to_vec()))
    }

    /// Every record this view holds, as a snapshot would publish them.
    pub fn records(&self) -> Vec<Record> {
        let mut out = Vec::with_capacity(self.bindings.len() + self.versions.len());
        for ((p, n), b) in &self.bindings {
            out.push(Record::Bind(*p, n.clone(), *b));
        }
        for v in self.versions.values() {
            out.push(Record::Version(v.clone()));
        }
        out
    }
}

/// Another slot's intent as last read from the hints: which slot, and what.
#[derive(Clone, Copy, Debug)]
pub struct SeenIntent {
    pub slot: SlotId,
    pub epoch: u64,
    pub intent: Intent,
}

/// This node's view of every other slot's published manifest.
pub struct Union {
    table: SlotTable,
    /// The data file, read around this node's page cache (`SharedFile`): the manifests and
    /// the chunks of other slots are written by other nodes.
    dev: Arc<dyn Device>,
    /// Of slots over erasure-coded targets: where a manifest read that fails its record
    /// checksums is rebuilt from the other shards (`Placement::read_repair`).
    place: Option<Arc<dyn crate::placement::Placement>>,
    sb: Superblock,
    me: SlotId,
    views: RwLock<HashMap<SlotId, Arc<SlotView>>>,
    /// Held while refreshing: when the last refresh started.
    refreshing: Mutex<Option<std::time::Instant>>,
    refreshes: std::sync::atomic::AtomicU64,
    /// The highest stamp any view holds.
    max_stamp: std::sync::atomic::AtomicU64,
}

/// Every this many refreshes, every slot's header is read whatever its hint says.
const FULL_REFRESH_EVERY: u64 = 16;

impl Union {
    pub fn new(
        table: SlotTable,
        dev: Arc<dyn Device>,
        place: Option<Arc<dyn crate::placement::Placement>>,
        sb: Superblock,
        me: SlotId,
    ) -> Union {
        Union {
            table,
            dev,
            place,
            sb,
            me,
            views: RwLock::new(HashMap::new()),
            refreshing: Mutex::new(None),
            refreshes: std::sync::atomic::AtomicU64::new(0),
            max_stamp: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn me(&self) -> SlotId {
        self.me
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    /// The highest stamp of every record read so far.
    pub(crate) fn max_stamp(&self) -> u64 {
        self.max_stamp.load(std::sync::atomic::Ordering::Acquire)
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

    /// Every other slot's intent that is announced now (read from the hints just now), for
    /// the namespace lock (`Space::ns_lock`).
    pub fn intents(&self) -> Result<Vec<SeenIntent>> {
        Ok(self
            .table
            .hints()?
            .into_iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let h: SlotHint = h?;
                (SlotId(i as u32) != self.me && !h.intent.is_empty()).then_some(SeenIntent {
                    slot: SlotId(i as u32),
                    epoch: h.epoch,
                    intent: h.intent,
                })
            })
            .collect())
    }

    fn refresh_locked(&self) -> Result<()> {
        // The hints first (128 bytes a slot); whole headers only of slots whose hint moved,
        // or is not intact, and of every slot once every `FULL_REFRESH_EVERY` refreshes.
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
                match self.table.read(slot) {
                    Ok(h) => headers.push(h),
                    // That slot's files stay as last read (none if never): the other
                    // slots' go on. `ckptfs slots` lists it as damaged.
                    Err(Error::Corrupt(c)) => {
                        if full {
                            log::warn!("slot {slot}: its header is damaged, not read: {c}");
                        }
                    }
                    Err(e) => return Err(e),
                }
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
            let mut recs = self
                .dev
                .read_at(&mut b, base + from)
                .map_err(Error::from)
                .and_then(|_| Record::decode_all(&b));
            if let (Err(Error::Corrupt(_)), Some(place)) = (&recs, &self.place) {
                // A damaged shard under the manifest: the records' checksums say which
                // version of the bytes is right.
                let seg = place.segment_bytes();
                let at = crate::placement::Location::of(DataOffset(base + from), seg);
                let mut good = None;
                let mut check = |x: &[u8]| match Record::decode_all(x) {
                    Ok(r) => {
                        good = Some(r);
                        true
                    }
                    Err(_) => false,
                };
                if let Ok(true) = place.read_repair(at, &mut b, &mut check) {
                    if let Some(r) = good {
                        log::warn!(
                            "slot {}: its manifest was read from the other shards (a shard \
                             under it is damaged; its owner's `ckptfs rebuild` re-places it)",
                            h.slot
                        );
                        recs = Ok(r);
                    }
                }
            }
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
                (Some(o), f) if f > 0 => SlotView::clone(o),
                _ => SlotView::default(),
            };
            v.gen = gen;
            v.len = len;
            v.apply(recs);
            self.max_stamp
                .fetch_max(v.max_stamp, std::sync::atomic::Ordering::AcqRel);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{ChunkHash, Codec, NodeKind, Timestamp, VersionMeta};

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
            extents: extents.into(),
        }
    }

    fn bind(child: u64, stamp: u64) -> Binding {
        Binding {
            child: InodeId(child),
            stamp,
            kind: NodeKind::File,
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
        let meta = VersionMeta {
            of: InodeId(2),
            created: 10,
            attr_stamp: 11,
            times_stamp: 12,
            clip_stamp: 13,
            clip_len: 14,
        };
        let recs = vec![
            Record::Snapshot,
            Record::Bind(InodeId(1), b"f".to_vec(), bind(2, 9)),
            Record::Version(PubVersion {
                meta,
                node: node(2, NodeKind::File, vec![e]),
            }),
            Record::Bind(InodeId(1), b"g".to_vec(), bind(0, 15)),
        ];
        let b = batch(&recs, BLOCK);
        assert_eq!(b.len() % BLOCK, 0);
        let mut two = b.clone();
        two.extend_from_slice(&batch(
            &[
                Record::Unbind(InodeId(1), b"g".to_vec()),
                Record::Drop(InodeId(2)),
            ],
            BLOCK,
        ));
        let back = Record::decode_all(&two).unwrap();
        assert_eq!(back.len(), 6);
        assert_eq!(back[..4], recs[..]);
        let mut v = SlotView::default();
        v.apply(back[..4].to_vec());
        assert_eq!(v.binding(InodeId(1), b"f").unwrap().child, InodeId(2));
        assert!(v.binding(InodeId(1), b"g").unwrap().is_tombstone());
        assert_eq!(v.versions[&InodeId(2)].node.extents.len(), 1);
        assert_eq!(v.max_stamp, 15);
        assert_eq!(v.by_parent[&InodeId(1)].len(), 2);
        v.apply(back[4..].to_vec());
        assert!(v.binding(InodeId(1), b"g").is_none());
        assert!(v.versions.is_empty() && v.of.is_empty());
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert!(Record::decode_all(&bad).is_err());
    }

    #[test]
    fn a_rebinding_moves_the_indexes() {
        let mut v = SlotView::default();
        v.apply_one(Record::Bind(InodeId(1), b"a".to_vec(), bind(7, 1)));
        v.apply_one(Record::Bind(InodeId(1), b"a".to_vec(), bind(8, 2)));
        assert!(!v.by_child.contains_key(&InodeId(7)));
        assert_eq!(v.by_child[&InodeId(8)].len(), 1);
        v.apply_one(Record::Bind(InodeId(1), b"a".to_vec(), bind(0, 3)));
        assert!(v.by_child.is_empty());
        assert_eq!(v.by_parent[&InodeId(1)].len(), 1);
        let snap = v.records();
        let mut w = SlotView::default();
        w.apply(snap);
        assert_eq!(w.bindings, v.bindings);
    }
}
