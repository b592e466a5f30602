//! `Space`'s parts as faces: each a borrowed view of the space with the calls of one
//! concern, so `Space` itself keeps composition and commit (`engine/ARCHITECTURE.md`).

use super::*;

/// The multi-slot part of a space (its slot's lease, the other slots' views, publication and
/// intents); each answers sensibly on a space of one slot (no lease, nothing to publish).
#[derive(Clone, Copy)]
pub struct Slots<'a>(&'a Space);

impl Space {
    /// See `Slots`.
    pub fn slots(&self) -> Slots<'_> {
        Slots(self)
    }
}

impl<'a> Slots<'a> {
    /// The lease of a slot of a multi-slot space.
    pub fn lease(self) -> Option<&'a Arc<Lease>> {
        self.0.layout.lease.as_ref().map(|g| &g.0)
    }

    /// The other slots' published namespaces (a multi-slot space).
    pub fn union(self) -> Option<&'a Arc<Union>> {
        self.0.layout.union.as_ref()
    }

    /// Whether this is a slot of a shared namespace (a mounted slot of a multi-slot space).
    pub fn is_shared(self) -> bool {
        self.0.layout.union.is_some()
    }

    /// A new stamp of the shared namespace's clock (`stamp`), past every stamp this node has
    /// seen in the other slots' records.
    pub fn stamp(self) -> u64 {
        match (&self.0.layout.clock, &self.0.layout.union) {
            (Some(c), Some(u)) => {
                c.observe(u.max_stamp());
                c.tick()
            }
            _ => crate::slots::now_unix_ns(),
        }
    }

    /// Announces a change of the shared namespace touching `keys` and waits until it may
    /// go on (`nslock`); the intent is withdrawn when the guard drops. `prio`: the
    /// change's first stamp.
    pub fn ns_lock(self, keys: &[u64], prio: u64) -> Result<crate::nslock::NsGuard<'a>> {
        let (Some(lease), Some(u)) = (self.0.slots().lease(), &self.0.layout.union) else {
            return Err(Error::Invalid("not a slot of a shared namespace".into()));
        };
        crate::nslock::lock(lease, u, keys, prio)
    }

    /// The committed version records of local inodes `inos` (those that are versions).
    pub fn version_records(self, inos: &[InodeId]) -> Result<Vec<Record>> {
        let r = self.0.reader()?;
        let mut out = Vec::with_capacity(inos.len());
        for &i in inos {
            match self.0.pub_version(&r, i)? {
                Some(v) => out.push(Record::Version(v)),
                None => out.push(Record::Drop(i)),
            }
        }
        Ok(out)
    }

    /// Every record of this slot's part of the shared namespace, as committed: its
    /// bindings and the versions of its inodes.
    pub fn own_records(self) -> Result<Vec<Record>> {
        let r = self.0.reader()?;
        let mut out: Vec<Record> = r
            .bindings()?
            .into_iter()
            .map(|(p, n, b)| Record::Bind(p, n, b))
            .collect();
        for (ino, _) in r.versions()? {
            if let Some(v) = self.0.pub_version(&r, ino)? {
                out.push(Record::Version(v));
            }
        }
        Ok(out)
    }

    /// Publishes `recs` (records of what this slot committed) to the other nodes: appended
    /// to the manifest, or a snapshot of everything when the half is full. Makes pending
    /// namespace changes durable first: nothing is published that a crash could take back.
    pub fn publish(self, recs: &[Record]) -> Result<()> {
        let Some(p) = &self.0.layout.publisher else {
            return Ok(());
        };
        if recs.is_empty() {
            return Ok(());
        }
        self.0.sync_meta_if_dirty()?;
        if p.append(recs)? {
            return Ok(());
        }
        self.0.slots().publish_snapshot()
    }

    /// Publishes this slot's whole part of the shared namespace as a new manifest
    /// generation (at mount, when a half fills up, after gc moved chunks).
    pub fn publish_snapshot(self) -> Result<()> {
        let Some(p) = &self.0.layout.publisher else {
            return Ok(());
        };
        self.0.sync_meta_if_dirty()?;
        let recs = self.0.slots().own_records()?;
        p.snapshot(&recs)
    }

    /// Copies the bytes of another slot's published extents within `[off, off +
    /// out.len())` into `out` (which starts at file offset `off`; holes left untouched).
    /// The chunks are read by the one chunk reader this slot's own files use (its cache,
    /// coalescing of adjacent chunks into one device read, verification, and the
    /// placement's repair), at the locations the owner published, and painted by the one
    /// painter (`ExtentMap::paint`). `Corrupt` when a location is stale (the owner moved
    /// the chunk): the caller reads the owner's manifest again.
    pub fn read_published(
        self,
        extents: &[&crate::manifest::PubExtent],
        off: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let end = off + out.len() as u64;
        let mut pieces = Vec::with_capacity(extents.len());
        let mut chunks = Vec::with_capacity(extents.len());
        for e in extents {
            let (s, t) = (e.off.max(off), e.off.saturating_add(e.len as u64).min(end));
            if s < t {
                // A malformed offset saturates, and `ExtentMap::paint` reports it.
                let chunk_off = u32::try_from(s - e.off)
                    .ok()
                    .and_then(|d| e.chunk_off.checked_add(d))
                    .unwrap_or(u32::MAX);
                let ext = crate::format::Extent {
                    chunk: e.hash,
                    chunk_off,
                    len: (t - s) as u32,
                };
                pieces.push((s, ext));
                chunks.push((e.hash, e.chunk_record()));
            }
        }
        let chunks = self.0.store.reader().get_many_at(&chunks)?;
        crate::write::ExtentMap::paint(&pieces, &chunks, off, |at, bytes| {
            out[at..at + bytes.len()].copy_from_slice(bytes)
        })
    }

    /// Starts reading another slot's published extents' chunks ahead of a sequential
    /// reader (`ChunkReader::prefetch_at`: the read-ahead this slot's files get).
    pub fn prefetch_published(self, extents: &[&crate::manifest::PubExtent]) {
        self.0
            .store
            .reader()
            .prefetch_at(extents.iter().map(|e| (e.hash, e.chunk_record())).collect())
    }
}

/// What readers, open files and the kernel hold, which gc keeps (`pins`).
#[derive(Clone, Copy)]
pub struct Pins<'a>(&'a Space);

impl Space {
    /// See `Pins`.
    pub fn pins(&self) -> Pins<'_> {
        Pins(self)
    }
}

impl<'a> Pins<'a> {
    /// Runs `load` under the pin gate and pins the revision it returns before the gate
    /// opens again (see `pins`): gc keeps that revision until the pin is dropped. `ino`:
    /// the open inode the pin belongs to, which gc then keeps too even when unlinked.
    pub fn pin<T, E: From<Error>>(
        &self,
        ino: Option<InodeId>,
        load: impl FnOnce() -> std::result::Result<(RevisionId, T), E>,
    ) -> std::result::Result<(crate::pins::RevisionPin, T), E> {
        let _gate = self.0.pin_gate.read();
        let (rev, t) = load()?;
        Ok((self.0.pins.pin(rev, ino), t))
    }

    /// Counts one kernel reference to `ino` (a lookup or a create the kernel is answered
    /// with) if its record exists; false if it does not (gc removed it since the caller
    /// read its name: look the name up again). Under the pin gate, so gc either samples the
    /// reference or has committed the removal this check sees; gc keeps a held inode's
    /// record, unlinked or not, until `forget_inode` (see `pins`).
    pub fn hold_inode(self, ino: InodeId) -> Result<bool> {
        let _gate = self.0.pin_gate.read();
        // A held create has no row yet (`deferred`).
        if self.0.inodes_held(&[ino])?[0].is_none() {
            return Ok(false);
        }
        self.0.pins.hold(ino);
        Ok(true)
    }

    /// `hold_inode` of each of `inos` in one snapshot of the table (a listing's entries):
    /// the records of those that exist, each now held; None for one gc removed.
    pub fn hold_inodes(self, inos: &[InodeId]) -> Result<Vec<Option<InodeRecord>>> {
        let _gate = self.0.pin_gate.read();
        let recs = self.0.inodes_held(inos)?;
        for (ino, r) in inos.iter().zip(&recs) {
            if r.is_some() {
                self.0.pins.hold(*ino);
            }
        }
        Ok(recs)
    }

    /// Holds every new pin off (the gate's other side) while gc samples the pins and
    /// commits what retention drops, so no revision is dropped under a reader that pinned it
    /// after gc began.
    pub(crate) fn gate_for_gc(self) -> parking_lot::RwLockWriteGuard<'a, ()> {
        self.0.pin_gate.write()
    }

    /// The pinned revisions and the open or held inodes, added to `revs` and `inos`; under
    /// `gate_for_gc`.
    pub(crate) fn sample(
        self,
        revs: &mut std::collections::HashSet<RevisionId>,
        inos: &mut std::collections::HashSet<InodeId>,
    ) {
        self.0.pins.sample(revs, inos)
    }

    /// The kernel forgot `n` references to `ino` (FUSE FORGET).
    pub fn forget_inode(self, ino: InodeId, n: u64) {
        self.0.pins.forget(ino, n);
    }

    /// Waits until the kernel has forgotten every one of `inos` (after it was told to drop
    /// their names), at most `limit`; whether it has.
    pub fn wait_forgotten(self, inos: &[InodeId], limit: std::time::Duration) -> bool {
        self.0.pins.wait_forgotten(inos, limit)
    }

    /// Pins chunks another file's extents name, for a metadata-only copy
    /// (`ChunkStore::pin_stored`).
    pub fn pin_stored(self, chunks: &[ChunkHash]) -> Result<crate::pins::ChunkPins> {
        self.0.store.pin_stored(chunks)
    }
}

/// How fast the data path runs, set by the mount: workers, the GPU stage, the cutter.
#[derive(Clone, Copy)]
pub struct Tuning<'a>(&'a Space);

impl Space {
    /// See `Tuning`.
    pub fn tuning(&self) -> Tuning<'_> {
        Tuning(self)
    }
}

impl<'a> Tuning<'a> {
    /// Store threads for submitted pieces (0: on the submitting thread).
    pub fn set_workers(self, n: usize) {
        self.0.store.set_workers(n)
    }

    pub fn workers(self) -> usize {
        self.0.store.workers()
    }

    /// Compresses new chunks in batches with `codec` (the GPU) from now on; `None`: LZ4
    /// on the store threads (`ChunkStore::set_batch_codec`).
    pub fn set_batch_codec(self, codec: Option<Arc<dyn ckptfs_kernels::BatchCodec>>) {
        self.0.store.set_batch_codec(codec)
    }

    /// How predicted chunks are confirmed: by fingerprint where one is known, or by blake3
    /// (`--confirm`; `predict`'s module doc).
    pub fn confirm_by_fingerprint(self, on: bool) {
        self.0.store.confirm_by_fingerprint(on)
    }

    /// Where bytes changed in place are cut: at the previous revision's boundaries, or by
    /// content (`--cuts`; `predict`'s module doc).
    pub fn follow_changes(self, on: bool) {
        self.0.store.follow_changes(on)
    }
}

/// The data path's stage timers the FUSE adapter feeds (`write::pipeline`).
#[derive(Clone, Copy)]
pub struct Stages<'a>(&'a Space);

impl Space {
    /// See `Stages`.
    pub fn stages(&self) -> Stages<'_> {
        Stages(self)
    }
}

impl<'a> Stages<'a> {
    /// Counts a FUSE request read from the kernel in the `transport` stage (`cpu_ns`: the
    /// FUSE layer's weighted sample, when it took one).
    pub fn count_transport(self, bytes: usize, cpu_ns: Option<u64>) {
        self.0.store.stages().transport.add_cpu(bytes, cpu_ns);
    }

    /// Counts a dispatched FUSE request in the `dispatch` stage (`cpu_ns`: the FUSE layer's
    /// weighted sample of the dispatch's CPU less its stages', when it took one).
    pub fn count_dispatch(self, cpu_ns: Option<u64>) {
        self.0.store.stages().dispatch.add_cpu(0, cpu_ns);
    }

    /// The `reply` stage: the copy of a read's bytes into its reply
    /// (`ExtentMap::read_pieces_to`) and the kernel's copy of the reply (timed in the mount).
    pub fn reply_stage(self) -> &'a crate::write::pipeline::Stage {
        &self.0.store.stages().reply
    }
}

/// What a space reports of itself: stats, the advice's inputs, the redundancy of its
/// revisions and the state of its targets.
#[derive(Clone, Copy)]
pub struct Report<'a>(&'a Space);

impl Space {
    /// See `Report`.
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }
}

impl<'a> Report<'a> {
    /// What the mirrors' check at open found and mended (`ckptfs check` reports it).
    pub(crate) fn mirror_findings(self) -> &'a [String] {
        &self.0.layout.mirror_findings
    }

    pub fn stats(self) -> Result<Stats> {
        let r = self.0.reader()?;
        let mut s = Stats {
            reserved_bytes: self.0.store.capacity(),
            free_bytes: self.0.store.free_bytes(),
            chunk_avg_bytes: self.0.sb.chunk.avg_bytes,
            failed: {
                self.0.watch_backing();
                self.0.store.is_failed()
            },
            failure: self.0.store.failure(),
            backing_full: self.0.meta.room_low(),
            stages: self.0.store.stages().snapshot(),
            gc: self.0.gc.totals().clone(),
            carries: self.0.store.pipeline().carries.totals(),
            commits: {
                let (files, transactions) = self.0.commits.counts();
                CommitTotals {
                    files,
                    transactions,
                    durable: self.0.catalog.durable_commits(),
                    publications: self.0.layout.publisher.as_ref().map_or(0, |p| p.written()),
                    durability: match self.0.close_durable() {
                        true => "close".into(),
                        false => "fsync".into(),
                    },
                    journal: self.0.catalog.journal().is_some(),
                    coherence: String::new(),
                }
            },
            ..Stats::default()
        };
        s.used_bytes = s.reserved_bytes - s.free_bytes;
        r.for_each_inode(|_, rec| {
            if rec.nlink == 0 {
                return;
            }
            match rec.kind {
                NodeKind::Dir => s.dirs += 1,
                NodeKind::Symlink => s.symlinks += 1,
                NodeKind::Fifo
                | NodeKind::Socket
                | NodeKind::CharDevice
                | NodeKind::BlockDevice => s.special += 1,
                NodeKind::File => {
                    s.files += 1;
                    s.logical_bytes += rec.size;
                }
            }
        })?;
        s.dirs = s.dirs.saturating_sub(1); // the root is not counted
        r.for_each_extent(|e| s.referenced_bytes += e.len as u64)?;
        s.revisions = r.revision_count()?;
        r.for_each_chunk_record(|_, c| {
            if c.is_remote() {
                s.remote_chunks += 1;
                s.remote_bytes += c.stored_len as u64;
                return Ok(());
            }
            s.chunks += 1;
            s.stored_bytes += c.stored_len as u64;
            s.raw_chunk_bytes += c.raw_len as u64;
            Ok(())
        })?;
        s.named_chunk_bytes = crate::usage::named_bytes(&r, s.chunks)?;
        s.split = crate::usage::split(&r, s.stored_bytes)?;
        Ok(s)
    }

    /// What `ckptfs advise` needs from this space (this slot's revisions on a multi-slot
    /// space): recent checkpoints measured from the revisions' write times, the failure
    /// model kept in its config, and failed targets since format. Reads at most
    /// `advice::REVISIONS_SCANNED` revisions.
    pub fn advice_inputs(self) -> Result<crate::advice::AdviceInputs> {
        let r = self.0.reader()?;
        let writes = r.recent_write_times(crate::advice::REVISIONS_SCANNED)?;
        let config = r.advice_config()?;
        let failures = self.0.report().targets_report().map_or(0, |t| {
            t.targets.iter().filter(|t| t.state != "ok").count() as u64
        });
        let now = Timestamp::now();
        let now = now.secs as f64 + now.nanos as f64 / 1e9;
        Ok(crate::advice::AdviceInputs::new(
            now,
            &writes,
            config,
            failures,
            now - self.0.sb.created_unix_s as f64,
        ))
    }

    /// What redundancy each revision has right now, on a space over several targets: the
    /// worst segment its chunks are in decides how many more targets it can lose. One pass
    /// over the extent table (no data is read). None for a one-target space.
    pub fn revision_redundancy(self) -> Result<Option<RevisionRedundancy>> {
        let Some(t) = self.0.layout.targets.as_ref() else {
            return Ok(None);
        };
        let full = t.redundancy().parity as i64;
        let seg = u64::from(self.0.sb.segment_bytes);
        let revs = self
            .0
            .reader()?
            .revisions_by_segments(seg, |s| t.tolerance(s).unwrap_or(i64::MAX))?;
        let mut by: std::collections::BTreeMap<i64, u64> = Default::default();
        let mut short = Vec::new();
        for (rev, rr, tol) in revs {
            if !rr.sealed {
                continue;
            }
            let tol = tol.unwrap_or(full).min(full);
            *by.entry(tol).or_default() += 1;
            if tol < full {
                short.push(ShortRevision {
                    revision: rev.0,
                    history: rr.history,
                    can_lose: tol,
                });
            }
        }
        short.sort_by_key(|s| (s.can_lose, s.revision));
        let short_total = short.len() as u64;
        short.truncate(RevisionRedundancy::LISTED_MAX);
        Ok(Some(RevisionRedundancy {
            full_tolerance: full,
            listed: by.into_iter().rev().collect(),
            short,
            short_total,
        }))
    }

    /// The targets of a space over several (None for a one-target space).
    pub fn targets_report(self) -> Option<crate::targets::TargetsReport> {
        self.0.watch_backing();
        let mut r = self.0.layout.targets.as_ref()?.report();
        // Before the flags are read: a copy removed or replaced while mounted is no mirror.
        self.0.watch_mirrors();
        if let Some(t) = &self.0.layout.targets_table {
            let t = t.lock();
            for (i, rep) in r.targets.iter_mut().enumerate() {
                rep.metadata_mirror = t.mirror.get(i).copied().unwrap_or(false);
            }
        }
        if self.0.slots().is_shared() {
            r.slot = Some(self.0.slot.0);
        }
        Some(r)
    }

    /// The erasure-coded placement of a space over several targets.
    pub fn erasure(self) -> Option<&'a Arc<crate::targets::Erasure>> {
        self.0.layout.targets.as_ref()
    }
}
/// The space's data as the filesystem sizes and schedules its work by: room, failure,
/// prefetching and the store's idle work; the chunk I/O file states write through.
#[derive(Clone, Copy)]
pub struct Data<'a>(pub(super) &'a Space);

impl Space {
    /// See `Data`.
    pub fn data(&self) -> Data<'_> {
        Data(self)
    }
}

impl<'a> Data<'a> {
    pub fn chunks(self) -> &'a dyn ChunkIo {
        &*self.0.store
    }

    /// Usable bytes of the space (this slot's share of a multi-slot space).
    pub fn capacity(self) -> u64 {
        self.0.store.capacity()
    }

    /// Bytes of a segment, the unit the space is allocated and freed in.
    pub fn segment_bytes(self) -> u64 {
        self.0.store.segment_bytes()
    }

    /// Bytes free for new chunks now (see `ChunkStore::free_bytes`).
    pub fn free_bytes(self) -> u64 {
        self.0.store.free_bytes()
    }

    /// An earlier write or sync to the backing space failed: the space refuses changes
    /// until it is opened again (sticky failure).
    pub fn is_failed(self) -> bool {
        self.0.store.is_failed()
    }

    /// Starts reading chunks a sequential reader will ask for soon (`ChunkStore::prefetch`).
    pub fn prefetch(self, chunks: Vec<ChunkHash>) {
        self.0.store.reader().prefetch(chunks)
    }

    /// Housekeeping the daemon runs a few times a second: frees the spare read buffers
    /// when reads stopped, and returns segments a gc emptied whose grace is over.
    pub fn idle_tick(self) {
        self.0.store.reader().release_idle_read_buffers();
        self.0.store.release_due(false);
    }

    /// Where chunks held only by the object-store tier are fetched from (`RemoteChunks`);
    /// None when the tier stops.
    pub fn set_remote_chunks(self, r: Option<Arc<dyn crate::read::RemoteChunks>>) {
        self.0.store.reader().set_remote(r)
    }

    /// Records chunks held only by the object-store tier (`Txn::add_remote_chunks`), in one
    /// durable commit, marking the superblock first (`Features::INCOMPAT_REMOTE_CHUNKS`,
    /// set by the caller on the unmounted space). Returns how many were new.
    pub fn add_remote_chunks(self, chunks: &[(ChunkHash, ChunkRecord)]) -> Result<u64> {
        if !self
            .0
            .superblock()
            .features
            .contains(crate::format::Features::INCOMPAT_REMOTE_CHUNKS)
        {
            return Err(Error::Invalid(
                "chunks held only by the object store need the space marked for them \
                 (Features::INCOMPAT_REMOTE_CHUNKS)"
                    .into(),
            ));
        }
        let txn = self.0.begin_write(true)?;
        let n = Txn::open(&txn)?.add_remote_chunks(chunks)?;
        self.0.commit(txn)?;
        Ok(n)
    }

    /// Forgets the decoded chunks this mount keeps (`ChunkStore::drop_cache`).
    pub fn drop_caches(self) {
        self.0.store.reader().drop_cache()
    }

    /// The committed record of a chunk, if it is committed.
    pub fn committed_record(self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        self.0.store.committed_record(h)
    }
}

/// What a space keeps as its settings: the retention config and the advice's failure model.
#[derive(Clone, Copy)]
pub struct Settings<'a>(&'a Space);

impl Space {
    /// See `Settings`.
    pub fn settings(&self) -> Settings<'_> {
        Settings(self)
    }
}

impl<'a> Settings<'a> {
    pub fn config(self) -> Result<Config> {
        self.0.reader()?.config()
    }

    pub fn set_config(self, c: &Config) -> Result<()> {
        let txn = self.0.begin_write(true)?;
        Txn::open(&txn)?.set_config(c)?;
        self.0.commit(txn)?;
        Ok(())
    }

    pub fn set_advice_config(self, c: &crate::advice::AdviceConfig) -> Result<()> {
        let txn = self.0.begin_write(true)?;
        Txn::open(&txn)?.set_advice_config(c)?;
        self.0.commit(txn)?;
        Ok(())
    }
}

/// Files' content: a committed revision loaded as a file state, and written bytes taken in.
#[derive(Clone, Copy)]
pub struct Files<'a>(&'a Space);

impl Space {
    /// See `Files`.
    pub fn files(&self) -> Files<'_> {
        Files(self)
    }
}

impl<'a> Files<'a> {
    /// The extent map of a committed revision.
    pub fn load_map(self, rev: RevisionId) -> Result<ExtentMap> {
        if rev.0 == 0 {
            return Ok(ExtentMap::new());
        }
        load_map_from(&self.0.reader()?, rev)
    }

    /// The bytes of each of `revs` that are not holes (the sum of its extents' lengths),
    /// from one snapshot with the extent table opened once.
    pub fn data_bytes_many(self, revs: &[RevisionId]) -> Result<Vec<u64>> {
        let r = self.0.reader()?;
        let some: Vec<RevisionId> = revs.iter().copied().filter(|r| r.0 != 0).collect();
        let mut rows = r.extents_many(&some)?.into_iter();
        revs.iter()
            .map(|rev| {
                if rev.0 == 0 {
                    return Ok(0);
                }
                let map = map_of(rows.next().expect("one row set per revision"))?;
                Ok(map.iter().map(|(_, e)| e.len as u64).sum())
            })
            .collect()
    }

    /// Opens a file's committed content for reading and writing.
    pub fn load_file(self, rec: &InodeRecord) -> Result<FileState> {
        let rev = rec.current_rev;
        // A revision without its record has no extent rows either, and would load as a
        // file of holes (zeros, not its bytes): a current revision that is gone is a
        // damaged catalog, answered EIO, never read as zeros.
        let map = if rev.0 == 0 {
            ExtentMap::new()
        } else {
            // One snapshot for both reads.
            let r = self.0.reader()?;
            if r.revision(rev)?.is_none() {
                return Err(Corruption::Missing(Missing::Revision(rev)).into());
            }
            load_map_from(&r, rev)?
        };
        if let Some((o, e)) = map.iter().next_back() {
            if o + e.len as u64 > rec.size {
                return Err(Corruption::Record {
                    record: "extent map",
                    why: format!("it reaches past the size of its file ({} bytes)", rec.size),
                }
                .into());
            }
        }
        // A file opened here is often rewritten next (O_TRUNC with a fixed checkpoint name) or
        // read by a restarted job whose next checkpoint resembles it: predict its chunks.
        self.0.store.learn(map.iter(), self.0.sb.chunk.max_bytes);
        let state = FileState::new(self.0.sb.chunk, map, rec.size, self.0.store.new_pins());
        // Of a shared namespace, any file may be a layer under or over other nodes' (it
        // becomes one when another node writes it, also while it is open here): its holes
        // and zeros are kept as written from the start.
        Ok(match self.0.layout.union.is_some() {
            true => state.into_layered(),
            false => state,
        })
    }

    /// A read-only file state holding the content of a revision.
    pub fn load_revision(self, rev: RevisionId) -> Result<FileState> {
        let rr = self
            .0
            .reader()?
            .revision(rev)?
            // Dropped by gc since the caller listed it: gone, as a removed name is.
            .ok_or(Error::Namespace(crate::error::NsFault::NotFound))?;
        Ok(FileState::new(
            self.0.sb.chunk,
            self.0.files().load_map(rev)?,
            rr.size,
            self.0.store.new_pins(),
        ))
    }

    /// Takes a write request's bytes into `file`, timed as the `ingest` stage.
    pub fn ingest(self, file: &mut FileState, off: u64, data: &[u8]) -> Result<()> {
        // The backing filesystem filled up: no new data, so the commits under way keep the
        // table's room (a table write the filesystem refused would fail the whole space).
        if self.0.meta.room_low() {
            return Err(Error::BackingFull);
        }
        self.0
            .store
            .stages()
            .ingest
            .time(data.len(), || file.write(&*self.0.store, off, data))
    }

    /// `ingest` of bytes shared with the caller (`FileState::write_shared`): a sequential
    /// write of half a stream segment or more is cut and stored from the caller's buffer,
    /// uncopied.
    pub fn ingest_shared(
        self,
        file: &mut FileState,
        off: u64,
        data: crate::write::pipeline::SharedBytes,
    ) -> Result<()> {
        if self.0.meta.room_low() {
            return Err(Error::BackingFull);
        }
        let n = data.len();
        self.0
            .store
            .stages()
            .ingest
            .time(n, || file.write_shared(&*self.0.store, off, data))
    }
}
