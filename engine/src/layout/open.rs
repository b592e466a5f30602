//! `layout::open`: a backing directory's layout (one data file, a slot of a multi-slot space,
//! targets, slots over targets; read-write, offline or read-only) opened into the pieces a
//! `Space` is composed of. Fault injection (`CKPTFS_FAULTS`) wraps every device here, once.

use super::*;
use crate::device::PathWatched;

/// How a space is opened.
#[derive(Clone, Debug)]
pub enum Mode {
    /// For writing, as a mount does: a single-slot space exclusively (its lock), a slot of
    /// a multi-slot space by claiming the slot the request asks for (see `slots`).
    Mount(SlotRequest),
    /// A single-slot space for an offline command (gc, check, config of a backing
    /// directory). A multi-slot space is refused: each of its slots is some node's, reached
    /// through that node's mount.
    Offline,
    /// For reading only, writing nothing to the directory: the data and the table opened
    /// read-only, the table's own bookkeeping writes kept in memory (`OverlayDevice`), the
    /// lock shared (other read-only opens may share it; a read-write mount may not).
    ReadOnly,
}

/// A layout opened: what `Space` composes (`Space::compose`).
pub struct Opened {
    pub(crate) sb: Superblock,
    pub(crate) dir: PathBuf,
    /// The metadata table's device (fenced, mirrored, overlaid, fault-injected as the
    /// layout and mode need).
    pub(crate) meta: Arc<dyn Device>,
    /// Where the slot's segments live.
    pub(crate) place: Arc<dyn Placement>,
    pub(crate) slot: SlotId,
    pub(crate) lock: Option<File>,
    pub(crate) read_only: bool,
    /// The layout's own parts (publisher, union, lease, targets, mirrors).
    pub(crate) layout: Layout,
    /// A slot claimed for the first time: its metadata table is to be made, from the policy
    /// the slot table's head keeps (`[keep_revisions, keep_age_secs, keep_unlinked_secs,
    /// auto_gc_free_percent]`).
    pub(crate) first_claim: Option<[u64; 4]>,
    /// The backing directory's files the open watches (`Space::watch_backing`), and whether
    /// its lock file is one of them (a single-slot read-write open).
    pub(crate) watched: Vec<Arc<PathWatched>>,
    pub(crate) watch_lock: bool,
    /// Faults to arm once the space is open, so their operation counts start after the
    /// open's own I/O (a test can name "the first commit's write").
    pub(crate) faults: Option<Faults>,
    /// The journal (`catalog::journal`) of a single-slot space on a data file.
    pub(crate) journal: Option<Arc<dyn Device>>,
}

/// Injected I/O faults (`CKPTFS_FAULTS`, tests of what applications see on a mounted
/// space): every device of the layout is wrapped by `wrap`, all on one simulated disk.
pub(crate) struct Faults {
    disk: Arc<crate::sim::SimDisk>,
    list: Vec<crate::sim::Fault>,
}

impl Faults {
    /// From the environment; None unless the variable is set (and then logged loudly).
    fn from_env() -> Result<Option<Faults>> {
        let Some(spec) = std::env::var_os(FAULTS_ENV) else {
            return Ok(None);
        };
        let list = crate::sim::parse_faults(&spec.to_string_lossy())
            .map_err(|e| Error::Invalid(format!("{FAULTS_ENV}: {e}")))?;
        log::warn!("{FAULTS_ENV} is set: injecting I/O faults {list:?}");
        Ok(Some(Faults {
            disk: crate::sim::SimDisk::new(),
            list,
        }))
    }

    fn wrap(faults: &Option<Faults>, name: &'static str, dev: Arc<dyn Device>) -> Arc<dyn Device> {
        match faults {
            Some(f) => Arc::new(crate::sim::FaultyDevice {
                name,
                disk: f.disk.clone(),
                inner: dev,
            }),
            None => dev,
        }
    }

    /// Arms the faults: from now on the device operations count.
    pub(crate) fn arm(self) {
        for f in self.list {
            self.disk.inject(f);
        }
    }
}

/// Opens the layout of the space in `dir` as `mode` says. The one way a backing directory
/// is opened; `Space::open` composes the result.
pub fn open(dir: &Path, mode: &Mode) -> Result<Opened> {
    match mode {
        Mode::ReadOnly => open_read_only(dir),
        Mode::Offline => {
            let sb = read_backing_dir(dir, true)?;
            if sb.slots > 1 {
                return Err(multi_slot_refusal(dir, &sb));
            }
            open_writable(dir, sb, &SlotRequest::default())
        }
        Mode::Mount(req) => {
            let sb = read_backing_dir(dir, true)?;
            open_writable(dir, sb, req)
        }
    }
}

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
pub(crate) fn table_on(
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
pub(crate) enum SlotData {
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

/// The data file `data` as a placement (a slot allocates from its share of it: the store's
/// segments), checked against the superblock.
pub(crate) fn slot_data_file(
    sb: &Superblock,
    data: Arc<dyn Device>,
) -> Result<Arc<crate::placement::SingleFile>> {
    if data.len() != sb.data_size_bytes {
        return Err(Corruption::Layout(format!(
            "the data file is {} bytes, the superblock says {}",
            data.len(),
            sb.data_size_bytes
        ))
        .into());
    }
    Ok(Arc::new(crate::placement::SingleFile::new(
        data,
        sb.segment_bytes as u64,
    )))
}

/// A claimed slot's parts (`claimed`).
pub(crate) struct Claimed {
    /// The slot's table device, fenced by its lease.
    pub(crate) meta: Arc<dyn Device>,
    pub(crate) place: Arc<dyn Placement>,
    pub(crate) layout: Layout,
    /// The first claim's policy, when the slot has no table yet (`Opened::first_claim`).
    pub(crate) first_claim: Option<[u64; 4]>,
}

/// The layout of slot `lease` holds of multi-slot space `sb`: its metadata table on `meta`,
/// its chunks and manifest on `data`, every write fenced by the lease, and the slot's
/// publisher and view of the other slots. Slots over a data file and slots over targets
/// differ only in the placement under the store and the publisher.
pub(crate) fn claimed(
    sb: &Superblock,
    meta: Arc<dyn Device>,
    data: SlotData,
    lease: Arc<Lease>,
    table: SlotTable,
    head: &SlotTableHead,
) -> Result<Claimed> {
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
    let first_claim = meta.is_empty().then_some(head.config);
    // The store's placement; the device the manifest is written to (in batches of `align`
    // bytes) and other slots' manifests are read from.
    let (place, manifests, align, erasure): (Arc<dyn Placement>, _, _, _) = match data {
        SlotData::File { data, shared } => {
            let place = slot_data_file(sb, fence(data))?;
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
            let align = Placement::write_align(&*er);
            (er.clone() as _, (dev.clone(), dev), align, Some(er))
        }
    };
    let repair = erasure.clone().map(|e| e as Arc<dyn Placement>);
    let layout = Layout {
        publisher: Some(Publisher::new(sb, manifests.0, align, lease.clone())),
        union: Some(Arc::new(Union::new(
            table,
            manifests.1,
            repair,
            sb.clone(),
            slot,
        ))),
        targets: erasure,
        lease: Some(crate::slots::LeaseGuard(lease)),
        ..Layout::default()
    };
    Ok(Claimed {
        meta,
        place,
        layout,
        first_claim,
    })
}

/// `open` for writing (`Mode::Mount`, `Mode::Offline`).
fn open_writable(dir: &Path, mut sb: Superblock, req: &SlotRequest) -> Result<Opened> {
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
    let faults = Faults::from_env()?;
    if sb.features.contains(Features::INCOMPAT_TARGETS) {
        return open_targeted(dir, sb, lock, lease, &meta_file, faults);
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
    let mut watched = vec![data.clone(), meta.clone()];
    let data = Faults::wrap(&faults, "data", data);
    let meta = Faults::wrap(&faults, "meta", meta);
    let journal = match lease {
        Some(_) => None,
        None => {
            let f = journal_file(dir, &mut sb, true)?.expect("made if missing");
            let j = Arc::new(PathWatched::new(
                Arc::new(FileDevice::new(f)?),
                "journal",
                dir.join(JOURNAL_FILE),
            ));
            watched.push(j.clone());
            Some(Faults::wrap(&faults, "journal", j))
        }
    };
    let watch_lock = lease.is_none();
    let (slot, meta, place, layout, first_claim) = match lease {
        None => {
            let place = slot_data_file(&sb, data)?;
            (SlotId(0), meta, place as _, Layout::default(), None)
        }
        Some(lease) => {
            let (table, head) = slot_table(dir, &sb, false)?;
            let shared: Arc<dyn Device> = Arc::new(crate::device::SharedFile::new(File::open(
                dir.join(DATA_FILE),
            )?)?);
            let slot = lease.slot();
            let data = SlotData::File { data, shared };
            let c = claimed(&sb, meta, data, lease, table, &head)?;
            (slot, c.meta, c.place, c.layout, c.first_claim)
        }
    };
    Ok(Opened {
        sb,
        dir: dir.to_path_buf(),
        meta,
        place,
        slot,
        lock: Some(lock),
        read_only: false,
        layout,
        first_claim,
        watched,
        watch_lock,
        faults,
        journal,
    })
}

/// `open_writable` of a space over several targets: the metadata table in `dir`, the data
/// on the targets. `CKPTFS_FAULTS` may name a target (`target0`, `target1`, ...) to fail
/// its I/O.
fn open_targeted(
    dir: &Path,
    sb: Superblock,
    lock: File,
    lease: Option<Arc<Lease>>,
    meta_file: &Path,
    faults: Option<Faults>,
) -> Result<Opened> {
    let wrap = |name: &'static str, dev: Arc<dyn Device>| -> Arc<dyn Device> {
        let dev = Faults::wrap(&faults, name, dev);
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
    let mut meta = Faults::wrap(&faults, "meta", primary);
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
    let watch_lock = lease.is_none();
    let (slot, meta, place, mut layout, first_claim) = match lease {
        None => (
            SlotId(0),
            meta,
            erasure.clone() as _,
            Layout::default(),
            None,
        ),
        Some(lease) => {
            let (slots, head) = slot_table(dir, &sb, false)?;
            let slot = lease.slot();
            let data = SlotData::Targets(erasure.clone());
            let c = claimed(&sb, meta, data, lease, slots, &head)?;
            (slot, c.meta, c.place, c.layout, c.first_claim)
        }
    };
    layout.targets = Some(erasure);
    layout.targets_table = Some(table);
    layout.mirrored = mirrored;
    layout.mirror_findings = mirror_findings;
    Ok(Opened {
        sb,
        dir: dir.to_path_buf(),
        meta,
        place,
        slot,
        lock: Some(lock),
        read_only: false,
        layout,
        first_claim,
        watched,
        watch_lock,
        faults,
        journal: None,
    })
}

/// `open` of `Mode::ReadOnly`.
fn open_read_only(dir: &Path) -> Result<Opened> {
    let mut sb = read_backing_dir(dir, false)?;
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
    let meta: Arc<dyn Device> = Arc::new(crate::device::OverlayDevice::new(Arc::new(
        FileDevice::growable(ro(META_FILE)?)?,
    )));
    let (place, layout): (Arc<dyn Placement>, _) =
        if sb.features.contains(Features::INCOMPAT_TARGETS) {
            let (erasure, table, _) =
                open_targets(dir, &sb, true, &|_, d| d, None, &mut Vec::new())?;
            let layout = Layout {
                targets: Some(erasure.clone()),
                targets_table: Some(table),
                ..Layout::default()
            };
            (erasure, layout)
        } else {
            let mut data: Arc<dyn Device> = Arc::new(crate::device::ReadOnlyDevice(Arc::new(
                FileDevice::new(ro(DATA_FILE)?)?,
            )));
            if sb.features.contains(Features::INCOMPAT_JOURNAL) {
                // The journal's records are applied in memory: the chunk bytes they carry
                // land in this overlay, as the table's rows land in the table's.
                data = Arc::new(crate::device::OverlayDevice::new(data));
            }
            (slot_data_file(&sb, data)?, Layout::default())
        };
    let journal = match sb.features.contains(Features::INCOMPAT_TARGETS) {
        true => None,
        false => journal_file(dir, &mut sb, false)?.map(|f| -> Result<Arc<dyn Device>> {
            Ok(Arc::new(crate::device::ReadOnlyDevice(Arc::new(
                FileDevice::new(f)?,
            ))))
        }),
    }
    .transpose()?;
    Ok(Opened {
        sb,
        dir: dir.to_path_buf(),
        meta,
        place,
        slot: SlotId(0),
        lock: Some(lock),
        read_only: true,
        layout,
        first_claim: None,
        watched: Vec::new(),
        watch_lock: false,
        faults: None,
        journal,
    })
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
