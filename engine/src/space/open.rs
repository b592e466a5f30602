//! Opening a backing space: its layout (one data file, a slot of a multi-slot space, targets,
//! slots over targets) composed into one `Space` (placement, lease, publisher, union).

use super::*;
use crate::device::PathWatched;

/// The slot headers of multi-slot space `sb` in `dir`, checked against its superblock.
pub fn slot_table(
    dir: &Path,
    sb: &Superblock,
    writable: bool,
) -> Result<(SlotTable, SlotTableHead)> {
    let path = dir.join(SLOTS_DIR).join(SLOT_HEADERS_FILE);
    let f = match writable {
        true => open_private(&path, false),
        false => Ok(File::open(&path)?),
    }
    .map_err(|e| match e {
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
            Error::from(Corruption::Layout(format!("{} is missing", path.display())))
        }
        other => other,
    })?;
    table_on(
        Arc::new(crate::device::SharedFile::new(f)?),
        sb,
        &path.display().to_string(),
    )
}

/// The slot table on device `dev`, checked against superblock `sb` (`what` names the
/// device in errors).
pub(super) fn table_on(
    dev: Arc<dyn Device>,
    sb: &Superblock,
    what: &str,
) -> Result<(SlotTable, SlotTableHead)> {
    let mut b = vec![0u8; SLOT_TABLE_HEAD_LEN as usize];
    dev.read_at(&mut b, 0)?;
    let head = SlotTableHead::decode(&b)?;
    if head.uuid != sb.uuid || head.slots != sb.slots {
        return Err(Corruption::Layout(format!(
            "{what} belongs to another space or says {} slots (the superblock says {})",
            head.slots, sb.slots
        ))
        .into());
    }
    let need = slot_table_len(sb.slots);
    if dev.len() < need {
        return Err(
            Corruption::Layout(format!("{what} is {} bytes, {need} expected", dev.len())).into(),
        );
    }
    Ok((SlotTable::new(dev, sb.slots), head))
}

/// Where a claimed slot's chunks and manifest live.
pub(super) enum SlotData {
    /// The space's data file: the slot's writable device, and the same file read around
    /// this node's page cache for other slots' manifests (`SharedFile`).
    File {
        data: Arc<dyn Device>,
        shared: Arc<dyn Device>,
    },
    /// Erasure-coded targets, opened with this slot's share (`targets::Share`) and every
    /// write fenced by the lease.
    Targets(Arc<crate::targets::Erasure>),
}

/// Slot `slot`'s segments of the data file `data`, checked against the superblock.
pub(super) fn slot_data_file(
    sb: &Superblock,
    data: Arc<dyn Device>,
    slot: SlotId,
) -> Result<Arc<crate::placement::SingleFile>> {
    if data.len() != sb.data_size_bytes {
        return Err(Corruption::Layout(format!(
            "the data file is {} bytes, the superblock says {}",
            data.len(),
            sb.data_size_bytes
        ))
        .into());
    }
    let range = sb.slot_segments(slot);
    Ok(Arc::new(crate::placement::SingleFile::new(
        data,
        sb.segment_bytes as u64,
        range.end - range.start,
    )))
}

/// Opens the slot `lease` holds of multi-slot space `sb`: its metadata table on `meta`,
/// its chunks and manifest on `data`, every write fenced by the lease, the slot's table
/// made at its first claim (from the policy in the slot table's head), and the slot's
/// publisher and view of the other slots attached. Slots over a data file and slots over
/// targets differ only in the placement under the store and the publisher.
pub(super) fn open_claimed(
    sb: Superblock,
    meta: Arc<dyn Device>,
    data: SlotData,
    lease: Arc<Lease>,
    table: SlotTable,
    head: &SlotTableHead,
) -> Result<Space> {
    let slot = lease.slot();
    if !sb.features.contains(Features::INCOMPAT_SHARED_NAMESPACE) {
        return Err(Error::OldSlotNamespace);
    }
    let fence = |inner| -> Arc<dyn Device> {
        Arc::new(FencedDevice {
            inner,
            lease: lease.clone(),
        })
    };
    let meta = fence(meta);
    if meta.is_empty() {
        // The slot's first claim: its table starts from the policy given at format.
        let [keep_revisions, keep_age_secs, keep_unlinked_secs, auto_gc_free_percent] = head.config;
        let config = Config {
            keep_revisions,
            keep_age_secs,
            keep_unlinked_secs,
            auto_gc_free_percent,
        };
        init_meta(&meta, &config, sb.slot_segments(slot), Some(slot))?;
        log::info!("slot {slot}: first claim, metadata table created");
    }
    // The store's placement; the device the manifest is written to (in batches of `align`
    // bytes) and other slots' manifests are read from.
    let (place, manifests, align, erasure): (Arc<dyn crate::placement::Placement>, _, _, _) =
        match data {
            SlotData::File { data, shared } => {
                let place = slot_data_file(&sb, fence(data), slot)?;
                let written = place.device();
                (place, (written, shared), crate::device::DIRECT_ALIGN, None)
            }
            SlotData::Targets(er) => {
                // The manifest area is written outside the store's allocation: placed once,
                // and never re-placed (that would drop the published manifest).
                for seg in sb.slot_share(slot).start..sb.slot_segments(slot).start {
                    er.place_if_unplaced(seg)?;
                }
                let dev: Arc<dyn Device> = Arc::new(crate::placement::PlacedDevice {
                    place: er.clone(),
                    len: sb.data_size_bytes,
                });
                let align = crate::placement::Placement::write_align(&*er);
                (er.clone() as _, (dev.clone(), dev), align, Some(er))
            }
        };
    let mut space = Space::open_placed(sb.clone(), meta, place, slot)?;
    space.publisher = Some(Publisher::new(&sb, manifests.0, align, lease.clone()));
    let repair = erasure
        .clone()
        .map(|e| e as Arc<dyn crate::placement::Placement>);
    let union = Arc::new(Union::new(table, manifests.1, repair, sb, slot));
    let floor = space.reader()?.ns_stamp()?;
    space.clock = Some(Arc::new(crate::stamp::Clock::new(floor)));
    space.union = Some(union);
    space.targets = erasure;
    let store = Arc::downgrade(&space.store);
    lease.set_usage(Box::new(move || {
        let s = store.upgrade()?;
        Some(s.capacity().saturating_sub(s.free_bytes()))
    }));
    Ok(space)
}

impl Space {
    /// Claims a slot of multi-slot space `sb` on devices (`devs.meta`: that slot's table,
    /// `headers`: the slot table) and opens it as a mount does, without files or locks:
    /// for the crash and fault tests. The caller names the slot whose table it passes.
    pub fn open_slot_devices(
        sb: Superblock,
        devs: Devices,
        headers: Arc<dyn Device>,
        req: &SlotRequest,
        settle: Duration,
    ) -> Result<Space> {
        let (table, head) = table_on(headers, &sb, "the slot table")?;
        let lease = Lease::claim(table.clone(), req, settle)?;
        let data = SlotData::File {
            shared: devs.data.clone(),
            data: devs.data,
        };
        let mut space = open_claimed(sb, devs.meta, data, lease.clone(), table, &head)?;
        space.lease = Some(crate::slots::LeaseGuard(lease));
        Ok(space)
    }

    /// Opens a space for exclusive use; fails if another process holds it. Of a multi-slot
    /// space, claims the first free slot.
    pub fn open(dir: &Path) -> Result<Space> {
        Self::open_with(dir, &SlotRequest::default())
    }

    /// Opens a single-slot space for an offline command (gc, check, config of a backing
    /// directory). A multi-slot space is refused: each of its slots is some node's, reached
    /// through that node's mount.
    pub fn open_offline(dir: &Path) -> Result<Space> {
        let sb = read_backing_dir(dir, true)?;
        if sb.slots > 1 {
            return Err(multi_slot_refusal(dir, &sb));
        }
        Self::open(dir)
    }

    /// Opens a space for writing: a single-slot space exclusively (its lock), a multi-slot
    /// space by claiming the slot `req` asks for (see `slots`).
    pub fn open_with(dir: &Path, req: &SlotRequest) -> Result<Space> {
        let sb = read_backing_dir(dir, true)?;
        if sb.slots == 1 {
            if let Some(s) = req.slot.filter(|s| s.0 != 0) {
                return Err(Error::Invalid(format!(
                    "slot {s} does not exist: {} has one slot (format it with --slots N for \
                     several nodes)",
                    dir.display()
                )));
            }
        }
        let (lock, lease, meta_file) = if sb.slots == 1 {
            let mut lock = take_lock(dir)?;
            lock.set_len(0)?;
            lock.write_all(format!("pid {}", std::process::id()).as_bytes())?;
            (lock, None, PathBuf::from(META_FILE))
        } else {
            // Shared: `format --force` on this node waits for every mount of it; other
            // nodes see the leases.
            let lock = File::open(dir.join(LOCK_FILE)).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => no_lock_file(dir),
                _ => Error::from(e),
            })?;
            // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
            unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
            let (table, _) = slot_table(dir, &sb, true)?;
            let settle = (req.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
            let lease = Lease::claim(table, req, settle)?;
            let meta = PathBuf::from(slot_meta_file(lease.slot()));
            (lock, Some(lease), meta)
        };
        if sb.features.contains(Features::INCOMPAT_TARGETS) {
            return Self::open_targeted(dir, sb, lock, lease, &meta_file);
        }
        let data = Arc::new(PathWatched::new(
            Arc::new(FileDevice::new_direct(open_space_file(
                dir,
                Path::new(DATA_FILE),
                "data file",
                false,
            )?)?),
            "data file",
            dir.join(DATA_FILE),
        ));
        let meta = Arc::new(PathWatched::new(
            Arc::new(FileDevice::growable(open_space_file(
                dir,
                &meta_file,
                "metadata table",
                false,
            )?)?),
            "metadata table",
            dir.join(&meta_file),
        ));
        let watched = vec![data.clone(), meta.clone()];
        let mut devs = Devices { data, meta };
        let mut injected = None;
        // Fault injection for tests of what applications see on a mounted space; off unless
        // the variable is set (and then logged loudly).
        if let Some(spec) = std::env::var_os(FAULTS_ENV) {
            let faults = crate::sim::parse_faults(&spec.to_string_lossy())
                .map_err(|e| Error::Invalid(format!("{FAULTS_ENV}: {e}")))?;
            log::warn!("{FAULTS_ENV} is set: injecting I/O faults {faults:?}");
            let disk = crate::sim::SimDisk::new();
            injected = Some((disk.clone(), faults));
            let wrap = |name, inner| -> Arc<dyn Device> {
                Arc::new(crate::sim::FaultyDevice {
                    name,
                    disk: disk.clone(),
                    inner,
                })
            };
            devs = Devices {
                data: wrap("data", devs.data),
                meta: wrap("meta", devs.meta),
            };
        }
        let mut space = match &lease {
            None => Space::open_devices_slot(sb, devs, SlotId(0))?,
            Some(lease) => {
                let (table, head) = slot_table(dir, &sb, false)?;
                let shared: Arc<dyn Device> = Arc::new(crate::device::SharedFile::new(
                    File::open(dir.join(DATA_FILE))?,
                )?);
                let data = SlotData::File {
                    data: devs.data,
                    shared,
                };
                open_claimed(sb, devs.meta, data, lease.clone(), table, &head)?
            }
        };
        space.watch.lock_path = lease.is_none().then(|| dir.join(LOCK_FILE));
        space.watch.files = watched;
        space.lease = lease.map(crate::slots::LeaseGuard);
        // Armed once the space is open: operation counts start after the open's own I/O
        // (the integrity check), so a test can name "the first commit's write".
        if let Some((disk, faults)) = injected {
            for f in faults {
                disk.inject(f);
            }
        }
        space.attach_writable(dir, lock);
        // Spaces formatted before the feature flags have the attribute tables now (the open
        // added them if they were missing): say so.
        space.add_features(Features::COMPAT_XATTRS)?;
        Ok(space)
    }

    /// `open_with` of a space over several targets (single slot, lock held): the
    /// metadata table in `dir`, the data on the targets. `CKPTFS_FAULTS` may name a target
    /// (`target0`, `target1`, ...) to fail its I/O.
    pub(super) fn open_targeted(
        dir: &Path,
        sb: Superblock,
        lock: File,
        lease: Option<Arc<Lease>>,
        meta_file: &Path,
    ) -> Result<Space> {
        let mut injected = None;
        let faults = match std::env::var_os(FAULTS_ENV) {
            Some(spec) => {
                let f = crate::sim::parse_faults(&spec.to_string_lossy())
                    .map_err(|e| Error::Invalid(format!("{FAULTS_ENV}: {e}")))?;
                log::warn!("{FAULTS_ENV} is set: injecting I/O faults {f:?}");
                Some((crate::sim::SimDisk::new(), f))
            }
            None => None,
        };
        let wrap = |name: &'static str, dev: Arc<dyn Device>| -> Arc<dyn Device> {
            let dev: Arc<dyn Device> = match &faults {
                Some((disk, _)) => Arc::new(crate::sim::FaultyDevice {
                    name,
                    disk: disk.clone(),
                    inner: dev,
                }),
                None => dev,
            };
            match &lease {
                // A slot of a multi-slot space writes to the targets only while it holds
                // its lease.
                Some(l) => Arc::new(FencedDevice {
                    inner: dev,
                    lease: l.clone(),
                }),
                None => dev,
            }
        };
        let mut watched = Vec::new();
        let (erasure, table, mirrors) =
            open_targets(dir, &sb, false, &wrap, lease.as_ref(), &mut watched)?;
        let primary = Arc::new(PathWatched::new(
            Arc::new(FileDevice::growable(open_space_file(
                dir,
                meta_file,
                "metadata table",
                lease.is_none(),
            )?)?),
            "metadata table",
            dir.join(meta_file),
        ));
        watched.push(primary.clone());
        let mut meta: Arc<dyn Device> = primary;
        if let Some((disk, _)) = &faults {
            meta = Arc::new(crate::sim::FaultyDevice {
                name: "meta",
                disk: disk.clone(),
                inner: meta,
            });
        }
        let mut mirrored = Vec::new();
        let mut mirror_findings = Vec::new();
        if let Some(m) = mirrors {
            mirror_findings = m.findings;
            let mut devs = Vec::new();
            for (i, p) in &m.holders {
                let f = open_private(&p.join(crate::mirror::MIRROR_META), false)?;
                let d: Arc<dyn Device> = Arc::new(FileDevice::growable(f)?);
                devs.push((*i, wrap(crate::sim::mirror_device_name(*i), d)));
            }
            let paths = m
                .holders
                .iter()
                .map(|(_, p)| p.join(crate::mirror::MIRROR_META));
            let md = Arc::new(
                crate::mirror::MirrorDevice::new(meta, devs, m.set).with_paths(paths.collect()),
            );
            meta = md.clone();
            mirrored = vec![
                (crate::mirror::MIRROR_META, md),
                (crate::mirror::MIRROR_PLACEMENT, m.placement),
            ];
        }
        if let Some((disk, f)) = faults {
            injected = Some((disk, f));
        }
        let mut space = match lease {
            None => Space::open_placed(sb, meta, erasure.clone(), SlotId(0))?,
            Some(lease) => {
                let (slots, head) = slot_table(dir, &sb, false)?;
                let data = SlotData::Targets(erasure.clone());
                let mut space = open_claimed(sb, meta, data, lease.clone(), slots, &head)?;
                space.lease = Some(crate::slots::LeaseGuard(lease));
                space
            }
        };
        if let Some((disk, faults)) = injected {
            for f in faults {
                disk.inject(f);
            }
        }
        space.targets = Some(erasure);
        space.targets_table = Some(table);
        space.mirrored = mirrored;
        space.mirror_findings = mirror_findings;
        space.watch.lock_path = space.lease.is_none().then(|| dir.join(LOCK_FILE));
        space.watch.files = watched;
        space.attach_writable(dir, lock);
        if space.is_shared() {
            space.add_features(Features::COMPAT_XATTRS)?;
        }
        Ok(space)
    }

    /// Opens the space in `dir` for reading only, writing nothing to the directory: the data
    /// file and the table are opened read-only, the table's own bookkeeping writes (and the
    /// repair of a table a crash left) stay in memory (`OverlayDevice`), the lock is shared
    /// (other read-only opens may share it; a read-write mount may not) and records no pid.
    /// Every change is refused with `Error::ReadOnly`.
    pub fn open_read_only(dir: &Path) -> Result<Space> {
        let sb = read_backing_dir(dir, false)?;
        if sb.slots > 1 {
            return Err(multi_slot_refusal(dir, &sb));
        }
        let lock = take_shared_lock(dir)?;
        let ro = |name: &str| -> Result<File> {
            let what = match name {
                DATA_FILE => "data file",
                _ => "metadata table",
            };
            let r = File::open(dir.join(name)).map_err(Error::from);
            missing_space_file(dir, Path::new(name), what, false, r)
        };
        if sb.features.contains(Features::INCOMPAT_TARGETS) {
            let (erasure, table, _) =
                open_targets(dir, &sb, true, &|_, d| d, None, &mut Vec::new())?;
            let meta = Arc::new(crate::device::OverlayDevice::new(Arc::new(
                FileDevice::growable(ro(META_FILE)?)?,
            )));
            let mut space = Space::open_placed(sb, meta, erasure.clone(), SlotId(0))?;
            space.targets = Some(erasure);
            space.targets_table = Some(table);
            space.read_only = true;
            space.dir = dir.to_path_buf();
            *space.lock.get_mut() = Some(lock);
            return Ok(space);
        }
        let devs = Devices {
            data: Arc::new(crate::device::ReadOnlyDevice(Arc::new(FileDevice::new(
                ro(DATA_FILE)?,
            )?))),
            meta: Arc::new(crate::device::OverlayDevice::new(Arc::new(
                FileDevice::growable(ro(META_FILE)?)?,
            ))),
        };
        let mut space = Space::open_devices(sb, devs)?;
        space.read_only = true;
        space.dir = dir.to_path_buf();
        *space.lock.get_mut() = Some(lock);
        Ok(space)
    }

    /// Ties a space opened for writing to its backing directory: its lock, and the spill
    /// file for carried chunks beyond their memory budget (`spill`), next to the space.
    pub(super) fn attach_writable(&mut self, dir: &Path, lock: File) {
        self.dir = dir.to_path_buf();
        *self.lock.get_mut() = Some(lock);
        self.store.pipeline().carries.spill_to(
            dir,
            crate::filemap::longest_carry(self.sb.chunk.max_bytes),
            self.meta.clone(),
        );
    }

    /// Opens the space that `sb` describes on the given devices (the caller holds whatever
    /// makes it the only user). The metadata table's page checksums are all verified here,
    /// so a damaged table is reported at open instead of trusted.
    pub fn open_devices(sb: Superblock, devs: Devices) -> Result<Space> {
        Self::open_devices_slot(sb, devs, SlotId(0))
    }

    /// For simulations: opens a space over an erasure-coded placement already built on
    /// simulated devices.
    pub fn open_targets_devices(
        sb: Superblock,
        meta: Arc<dyn Device>,
        erasure: Arc<crate::targets::Erasure>,
    ) -> Result<Space> {
        let mut space = Self::open_placed(sb, meta, erasure.clone(), SlotId(0))?;
        space.targets = Some(erasure);
        Ok(space)
    }

    /// `open_devices` for slot `slot` of the space: the table is that slot's, and only the
    /// slot's share of the data file is allocated from.
    pub(crate) fn open_devices_slot(sb: Superblock, devs: Devices, slot: SlotId) -> Result<Space> {
        let place = slot_data_file(&sb, devs.data, slot)?;
        Self::open_placed(sb, devs.meta, place, slot)
    }

    /// Opens slot `slot` of the space `sb` describes, with its metadata table on `meta` and
    /// its segments where `place` puts them.
    pub(super) fn open_placed(
        sb: Superblock,
        meta: Arc<dyn Device>,
        place: Arc<dyn crate::placement::Placement>,
        slot: SlotId,
    ) -> Result<Space> {
        let range = sb.slot_segments(slot);
        let failed = Arc::new(crate::device::Failure::default());
        let db = Arc::new(open_db(&meta, false, failed.clone())?);
        if catalog::add_missing_tables(&db)? {
            log::info!(
                "added the extended-attribute tables to a space formatted by an earlier build"
            );
        }
        let catalog = catalog::Catalog::new(db);
        let free = catalog.reader()?.free_segments()?;
        if let Some(seg) = free.iter().find(|s| !range.contains(&s.0)) {
            return Err(Corruption::Layout(format!(
                "the catalog lists segment {seg} as free, outside this slot's segments \
                 {}..{} of the data file",
                range.start, range.end
            ))
            .into());
        }
        if failed.is_set() {
            return Err(Error::Io(std::io::Error::other(
                "writing the metadata table failed while opening it",
            )));
        }
        let store = ChunkStore::new(
            place,
            crate::pipeline::Pipeline::new(),
            Arc::new(catalog.chunk_index()),
            free,
            failed,
        );
        Ok(Space {
            dir: PathBuf::new(),
            sb,
            catalog,
            meta,
            store,
            lock: parking_lot::Mutex::new(None),
            watch: Default::default(),
            gc_lock: parking_lot::Mutex::new(()),
            commits: group::CommitGroup::new(),
            gc_epoch: std::sync::atomic::AtomicU64::new(0),
            gc_totals: parking_lot::Mutex::new(GcTotals::default()),
            pin_gate: parking_lot::RwLock::new(()),
            pins: Arc::default(),
            read_only: false,
            slot,
            segment_range: range,
            publisher: None,
            union: None,
            clock: None,
            lease: None,
            targets: None,
            targets_table: None,
            mirrored: Vec::new(),
            mirror_findings: Vec::new(),
        })
    }
}

/// Opens one of the files a space cannot be opened without, for writing: where it is
/// missing (removed, or a directory copied in part), an error that says which, instead of
/// a bare "No such file or directory". `recover`: the space keeps metadata mirrors on its
/// targets, from which `ckptfs recover` rebuilds the backing directory.
fn open_space_file(dir: &Path, name: &Path, what: &str, recover: bool) -> Result<File> {
    missing_space_file(
        dir,
        name,
        what,
        recover,
        open_private(&dir.join(name), false),
    )
}

/// `open_space_file`'s error for a file opened otherwise (read-only).
fn missing_space_file(
    dir: &Path,
    name: &Path,
    what: &str,
    recover: bool,
    r: Result<File>,
) -> Result<File> {
    let path = dir.join(name);
    r.map_err(|e| match e {
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => Error::NotASpace(format!(
            "{} is a ckptfs space missing its {what} {} (removed, or the directory is \
                 incomplete): it cannot be opened without it{}",
            dir.display(),
            path.display(),
            match recover {
                true => format!(
                    "; `ckptfs recover {} --from TARGET_DIR --force` rebuilds the \
                         directory from the metadata mirror on the targets",
                    dir.display()
                ),
                false => String::new(),
            }
        )),
        other => other,
    })
}
