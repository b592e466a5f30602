//! Composing a `Space` from an opened layout (`layout::open`): the metadata table, the
//! store over the layout's placement, and the layout's parts (publisher, union, lease,
//! targets) attached.

use super::*;
use crate::layout::{Layout, Mode, Opened};

impl Space {
    /// Opens the space in `dir` as `mode` says (`layout::Mode`): the one way a backing
    /// directory becomes a `Space`.
    pub fn open_as(dir: &Path, mode: &Mode) -> Result<Space> {
        Self::compose(crate::layout::open(dir, mode)?)
    }

    /// Opens a space for exclusive use; fails if another process holds it. Of a multi-slot
    /// space, claims the first free slot.
    pub fn open(dir: &Path) -> Result<Space> {
        Self::open_as(dir, &Mode::Mount(SlotRequest::default()))
    }

    /// Composes the space of an opened layout.
    pub fn compose(o: Opened) -> Result<Space> {
        let Opened {
            sb,
            dir,
            meta,
            place,
            slot,
            lock,
            read_only,
            layout,
            first_claim,
            watched,
            watch_lock,
            faults,
            journal,
        } = o;
        let shared = layout.union.is_some();
        let journal = journal.map(|j| (j, !read_only));
        let mut space = Self::compose_on(sb, meta, place, slot, layout, first_claim, journal)?;
        space.read_only = read_only;
        space.watch.lock_path = watch_lock.then(|| dir.join(LOCK_FILE));
        space.watch.files = watched;
        // Armed once the space is open: operation counts start after the open's own I/O
        // (the integrity check), so a test can name "the first commit's write".
        if let Some(f) = faults {
            f.arm();
        }
        match read_only {
            true => {
                space.dir = dir;
                *space.lock.get_mut() = lock;
            }
            false => {
                if let Some(lock) = lock {
                    space.attach_writable(&dir, lock);
                }
                // Spaces formatted before the feature flags have the attribute tables now
                // (the open added them if they were missing): say so. (A single-slot space
                // over targets records it when formatted.)
                if space.layout.targets.is_none() || shared {
                    space.add_features(Features::COMPAT_XATTRS)?;
                }
            }
        }
        Ok(space)
    }

    /// `compose` of the parts without a backing directory: a slot's first claim makes its
    /// table (from the slot table's policy), the table and the store are opened over the
    /// placement, and a slot of a shared namespace gets its clock and reports its usage to
    /// its lease.
    /// `journal`: the journal's device, and whether the space writes through it (a
    /// read-only open only applies its records, in memory).
    fn compose_on(
        sb: Superblock,
        meta: Arc<dyn Device>,
        place: Arc<dyn crate::placement::Placement>,
        slot: SlotId,
        layout: Layout,
        first_claim: Option<[u64; 4]>,
        journal: Option<(Arc<dyn Device>, bool)>,
    ) -> Result<Space> {
        if let Some([keep_revisions, keep_age_secs, keep_unlinked_secs, auto_gc_free_percent]) =
            first_claim
        {
            let config = Config {
                keep_revisions,
                keep_age_secs,
                keep_unlinked_secs,
                auto_gc_free_percent,
            };
            create::init_meta(&meta, &config, sb.slot_segments(slot), Some(slot))?;
            log::info!("slot {slot}: first claim, metadata table created");
        }
        let mut space = Space::open_placed(sb, meta, place, slot, layout, journal)?;
        if space.layout.union.is_some() {
            let floor = space.reader()?.ns_stamp()?;
            space.layout.clock = Some(Arc::new(crate::stamp::Clock::new(floor)));
        }
        if let Some(lease) = space.slots().lease() {
            let store = Arc::downgrade(&space.store);
            lease.set_usage(Box::new(move || {
                let s = store.upgrade()?;
                Some(s.capacity().saturating_sub(s.free_bytes()))
            }));
        }
        Ok(space)
    }

    /// Tests: opens a space on devices as a mount would, without files or locks (the caller
    /// guarantees exclusive use): `OnDevices` says which layout.
    pub fn open_devices_as(sb: Superblock, on: OnDevices) -> Result<Space> {
        match on {
            OnDevices::Single(devs) => {
                let place = crate::layout::slot_data_file(&sb, devs.data)?;
                Self::compose_on(
                    sb,
                    devs.meta,
                    place,
                    SlotId(0),
                    Layout::default(),
                    None,
                    None,
                )
            }
            OnDevices::Journaled { devs, journal } => {
                let place = crate::layout::slot_data_file(&sb, devs.data)?;
                let j = Some((journal, true));
                Self::compose_on(sb, devs.meta, place, SlotId(0), Layout::default(), None, j)
            }
            OnDevices::Slot {
                devs,
                headers,
                req,
                settle,
            } => {
                let (table, head) = crate::layout::table_on(headers, &sb, "the slot table")?;
                let lease = Lease::claim(table.clone(), &req, settle)?;
                let slot = lease.slot();
                let data = crate::layout::SlotData::File {
                    shared: devs.data.clone(),
                    data: devs.data,
                };
                let c = crate::layout::claimed(&sb, devs.meta, data, lease, table, &head)?;
                Self::compose_on(sb, c.meta, c.place, slot, c.layout, c.first_claim, None)
            }
            OnDevices::Targets { meta, erasure } => {
                let layout = Layout {
                    targets: Some(erasure.clone()),
                    ..Layout::default()
                };
                Self::compose_on(sb, meta, erasure, SlotId(0), layout, None, None)
            }
        }
    }

    /// Ties a space opened for writing to its backing directory: its lock, and the spill
    /// file for carried chunks beyond their memory budget (`spill`), next to the space.
    fn attach_writable(&mut self, dir: &Path, lock: File) {
        self.dir = dir.to_path_buf();
        *self.lock.get_mut() = Some(lock);
        self.store.pipeline().carries.spill_to(
            dir,
            crate::write::longest_carry(self.sb.chunk.max_bytes),
            self.meta.clone(),
        );
    }

    /// Opens slot `slot` of the space `sb` describes, with its metadata table on `meta`, its
    /// segments where `place` puts them, and the layout's parts.
    /// With a journal, its records after the table's last checkpoint are applied first
    /// (`journal::replay`), before anything reads the table.
    fn open_placed(
        sb: Superblock,
        meta: Arc<dyn Device>,
        place: Arc<dyn crate::placement::Placement>,
        slot: SlotId,
        layout: Layout,
        journal: Option<(Arc<dyn Device>, bool)>,
    ) -> Result<Space> {
        let range = sb.slot_segments(slot);
        let failed = Arc::new(crate::device::Failure::default());
        let db = Arc::new(catalog::open_db(&meta, false, failed.clone())?);
        if catalog::add_missing_tables(&db)? {
            log::info!(
                "added the extended-attribute tables to a space formatted by an earlier build"
            );
        }
        let mut attached = None;
        if let Some((dev, writes)) = journal {
            let r = catalog::journal::replay(&db, &*dev, &*place)?;
            if r.records > 0 {
                log::info!(
                    "applied {} journal record(s) ({} bytes of chunks) the metadata table did \
                     not hold yet: closes made durable before the space was last closed \
                     without a checkpoint",
                    r.records,
                    r.chunk_bytes
                );
            }
            if writes {
                attached = Some(Arc::new(catalog::journal::Journal::new(
                    dev,
                    r.id,
                    r.last,
                    failed.clone(),
                )));
            }
        }
        let catalog = match &attached {
            Some(j) => catalog::Catalog::with_journal(db, j.clone()),
            None => catalog::Catalog::new(db),
        };
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
        // The store's capacity is the slot's share, whatever the placement spans: a slot
        // over targets places in the whole space's segment numbers, and its capacity as
        // the whole space's made `df` show the other slots' shares as used.
        let store = ChunkStore::new(
            place,
            range.end - range.start,
            crate::write::pipeline::Pipeline::new(),
            Arc::new(catalog.chunk_index()),
            free,
            failed,
        );
        if let Some(j) = attached {
            let store = Arc::downgrade(&store);
            j.set_data_sync(Box::new(move || match store.upgrade() {
                Some(s) => s.flush_sync(),
                None => Ok(()),
            }));
        }
        Ok(Space {
            dir: PathBuf::new(),
            sb,
            catalog,
            meta,
            store,
            lock: parking_lot::Mutex::new(None),
            watch: Default::default(),
            gc: Default::default(),
            commits: group::CommitGroup::new(),
            checkpoint_turn: parking_lot::Mutex::new(()),
            close_durable: std::sync::atomic::AtomicBool::new(true),
            deferred: Default::default(),
            ns_gate: Default::default(),
            commit_gate: Default::default(),
            pin_gate: parking_lot::RwLock::new(()),
            pins: Arc::default(),
            read_only: false,
            slot,
            segment_range: range,
            layout,
        })
    }
}

/// Which layout `Space::open_devices_as` opens on devices (the crash and fault tests).
pub enum OnDevices {
    /// One data file and its table.
    Single(Devices),
    /// One data file, its table and its journal (`catalog::journal`).
    Journaled {
        devs: Devices,
        journal: Arc<dyn Device>,
    },
    /// Claims a slot of a multi-slot space (`devs.meta`: that slot's table, `headers`: the
    /// slot table) as a mount does; the caller names the slot whose table it passes.
    Slot {
        devs: Devices,
        headers: Arc<dyn Device>,
        req: SlotRequest,
        settle: Duration,
    },
    /// A single-slot space over an erasure-coded placement already built on devices.
    Targets {
        meta: Arc<dyn Device>,
        erasure: Arc<crate::targets::Erasure>,
    },
}
