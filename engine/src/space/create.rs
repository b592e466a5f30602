//! Formatting a backing space: one data file, slots, targets, or slots over targets
//! (geometry, superblock, metadata tables, slot files, target files).

use super::*;

/// Validates a space's size, chunk size and policy; returns the chunk bounds and the segment
/// size they imply.
pub(super) fn geometry(
    size_bytes: u64,
    chunk_avg_bytes: u32,
    config: &Config,
) -> Result<(ChunkParams, u32)> {
    let chunk = ChunkParams::from_avg(chunk_avg_bytes)?;
    config.validate()?;
    let segment_bytes = Superblock::segment_bytes_for(chunk);
    let min = MIN_SPACE_BYTES.max(2 * segment_bytes as u64);
    if size_bytes < min {
        return Err(Error::Invalid(format!(
            "size {size_bytes} bytes is below the minimum of {} MiB for this chunk size",
            min >> 20
        )));
    }
    Ok((chunk, segment_bytes))
}

/// The most slots a space may have (its headers file is 8 KiB per slot).
pub(crate) const MAX_SLOTS: u32 = 16384;

pub(super) fn new_superblock(
    size_bytes: u64,
    chunk: ChunkParams,
    segment_bytes: u32,
    slots: u32,
) -> Superblock {
    let now = Timestamp::now();
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(
        &blake3::hash(format!("{:?}{}{}", now, std::process::id(), size_bytes).as_bytes())
            .as_bytes()[..16],
    );
    let features = match slots > 1 {
        true => Features::AT_FORMAT
            .union(Features::INCOMPAT_SLOTS)
            .union(Features::INCOMPAT_SHARED_NAMESPACE),
        false => Features::AT_FORMAT,
    };
    Superblock {
        version: features.format_version(),
        features,
        uuid,
        data_size_bytes: size_bytes,
        chunk,
        segment_bytes,
        created_unix_s: now.secs as u64,
        slots,
    }
}

/// Writes an empty table onto `meta` (which must be empty): the root directory, the
/// counters, `config`, and `segments` free.
pub(super) fn init_meta(
    meta: &Arc<dyn Device>,
    config: &Config,
    segments: std::ops::Range<u64>,
    shared_slot: Option<SlotId>,
) -> Result<()> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let root = InodeRecord {
        parent: InodeId::ROOT,
        ..InodeRecord::new(NodeKind::Dir, 0o755, uid, gid)
    };
    catalog::init(meta, &root, config, segments, shared_slot)
}

/// The `slots/` directory of a new multi-slot space: the headers file (its head, then two
/// zeroed header copies per slot: sparse until written) and one empty table file per slot,
/// filled at the slot's first claim. Nothing is created in it afterwards.
pub(super) fn format_slot_files(dir: &Path, sb: &Superblock, config: &Config) -> Result<()> {
    let sdir = dir.join(SLOTS_DIR);
    fs::DirBuilder::new().mode(0o700).create(&sdir)?;
    let headers = open_private(&sdir.join(SLOT_HEADERS_FILE), true)?;
    let head = SlotTableHead {
        uuid: sb.uuid,
        slots: sb.slots,
        config: [
            config.keep_revisions,
            config.keep_age_secs,
            config.keep_unlinked_secs,
            config.auto_gc_free_percent,
        ],
    };
    {
        use std::os::unix::fs::FileExt;
        headers.write_all_at(&head.encode(), 0)?;
    }
    headers.set_len(slot_table_len(sb.slots))?;
    headers.sync_all()?;
    for i in 0..sb.slots {
        drop(open_private(&dir.join(slot_meta_file(SlotId(i))), true)?);
    }
    sync_dir(&sdir)
}

/// Checks a target set for `format --target` and works out its layout: at least M+K
/// targets in M+K failure domains, each a directory that is empty or holds only an old
/// target file (with `force`), none the backing directory, each disk with room for its
/// targets' files. Changes nothing.
pub(super) fn target_table(
    dir: &Path,
    size_bytes: u64,
    segment_bytes: u32,
    specs: &[TargetSpec],
    r: Redundancy,
    force: bool,
    nslots: u32,
) -> Result<TargetsTable> {
    if specs.len() < r.shards() {
        return Err(Error::Invalid(format!(
            "--redundancy {r} needs at least {} targets; {} given",
            r.shards(),
            specs.len()
        )));
    }
    if specs.len() > u16::MAX as usize - 1 {
        return Err(Error::Invalid("too many targets".into()));
    }
    let specs: Vec<TargetSpec> = specs
        .iter()
        .enumerate()
        .map(|(i, t)| TargetSpec {
            path: t.path.clone(),
            domain: match t.domain.is_empty() {
                true => format!("target{i}"),
                false => t.domain.clone(),
            },
        })
        .collect();
    let specs = &specs[..];
    let domains: std::collections::BTreeSet<&str> =
        specs.iter().map(|t| t.domain.as_str()).collect();
    if domains.len() < r.shards() {
        return Err(Error::Invalid(format!(
            "--redundancy {r} puts each segment's {} shards in distinct failure domains; the \
             targets name only {} ({}): add targets or domains, or lower the redundancy",
            r.shards(),
            domains.len(),
            domains.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    let (segments, shard_bytes, slots) =
        target_geometry(size_bytes, segment_bytes, r, specs.len(), nslots);
    let table = TargetsTable {
        redundancy: r,
        shard_bytes,
        slots,
        segments,
        targets: specs.to_vec(),
        failed: vec![false; specs.len()],
        mirror: vec![false; specs.len()],
        generation: 1,
    };
    let backing = fs::canonicalize(dir).ok();
    let mut seen = std::collections::BTreeSet::new();
    let mut need_by_dev: std::collections::BTreeMap<u64, (u64, PathBuf)> = Default::default();
    for t in specs {
        if t.path.exists() && !t.path.is_dir() {
            return Err(Error::Invalid(format!(
                "target {} is not a directory",
                t.path.display()
            )));
        }
        if t.path.is_dir() {
            let canon = fs::canonicalize(&t.path)?;
            if Some(&canon) == backing.as_ref() {
                return Err(Error::Invalid(format!(
                    "target {} is the backing directory itself; give each target its own \
                     directory",
                    t.path.display()
                )));
            }
            if !seen.insert(canon) {
                return Err(Error::Invalid(format!(
                    "target {} is given twice",
                    t.path.display()
                )));
            }
            let names: Vec<String> = fs::read_dir(&t.path)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<_>>()?;
            if let Some(n) = names.iter().find(|n| !is_target_dir_file(n)) {
                return Err(Error::Invalid(format!(
                    "target {} is not empty and is not a ckptfs target (it holds {n:?}); \
                     refusing to format it",
                    t.path.display()
                )));
            }
            if !names.is_empty() && !force {
                return Err(Error::Invalid(format!(
                    "target {} already holds a ckptfs target file; use --force to erase it",
                    t.path.display()
                )));
            }
        } else if !seen.insert(t.path.clone()) {
            return Err(Error::Invalid(format!(
                "target {} is given twice",
                t.path.display()
            )));
        }
        let existing = existing_ancestor(&t.path);
        let dev = fs::metadata(existing)?.dev();
        let old =
            fs::metadata(t.path.join(crate::targets::TARGET_FILE)).map_or(0, |m| m.blocks() * 512);
        let e = need_by_dev
            .entry(dev)
            .or_insert((0, existing.to_path_buf()));
        e.0 = (e.0 + table.target_file_bytes()).saturating_sub(old);
    }
    for (need, at) in need_by_dev.values() {
        let free = free_disk_bytes(at)?;
        if *need > free {
            return Err(Error::Invalid(format!(
                "the targets on the disk of {} need {need} bytes; it has {free} free",
                at.display()
            )));
        }
    }
    Ok(table)
}

/// The layout of a space over `targets` targets shared by `nslots` slots: (segments,
/// shard bytes, shard slots per target). Segments are whole rows of M blocks (see
/// `targets`); each slot gets an equal part of every target's shard slots
/// (`targets::Share`), enough for an even share of its segments' shards plus a quarter,
/// so placement can prefer the better targets (and avoid failing ones) without running any
/// out, and never more than one slot per segment (a target holds at most one shard of a
/// segment).
pub(super) fn target_geometry(
    size_bytes: u64,
    segment_bytes: u32,
    r: Redundancy,
    targets: usize,
    nslots: u32,
) -> (u64, u64, u64) {
    let row = (r.data * crate::targets::BLOCK) as u32;
    let segment_bytes = segment_bytes / row * row;
    let segments = size_bytes / segment_bytes as u64;
    let shard_bytes = segment_bytes as u64 / r.data as u64;
    let n = nslots.max(1) as u64;
    // The largest slot share (`Superblock::slot_share` rounds down and up).
    let share = segments.div_ceil(n);
    let even = (share * r.shards() as u64).div_ceil(targets as u64);
    let per_slot = (even + even / 4 + 1).min(share).max(1);
    (segments, shard_bytes, per_slot * n)
}

/// Writes a targeted space's files: each target's file (header, preallocated), the
/// `placement` file (a zero record per segment), the `targets` table and an empty
/// metadata table. Returns the superblock to write last.
pub(super) fn format_target_files(
    dir: &Path,
    table: &TargetsTable,
    chunk_avg_bytes: u32,
    config: &Config,
    nslots: u32,
) -> Result<Superblock> {
    let segment_bytes = (table.shard_bytes * table.redundancy.data as u64) as u32;
    let size_bytes = table.segments * segment_bytes as u64;
    let chunk = ChunkParams::from_avg(chunk_avg_bytes)?;
    let mut sb = new_superblock(size_bytes, chunk, segment_bytes, nslots);
    sb = sb.with_features(Features::INCOMPAT_TARGETS);
    for (i, t) in table.targets.iter().enumerate() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&t.path)?;
        let path = t.path.join(crate::targets::TARGET_FILE);
        let _ = fs::remove_file(&path);
        // A mirror or a cut marker of an earlier space here must not be taken for this
        // one's (with --force; without it the directory held at most the target file).
        for e in fs::read_dir(&t.path)? {
            let name = e?.file_name();
            let name = name.to_string_lossy();
            if is_target_dir_file(&name) && name != crate::targets::TARGET_FILE {
                fs::remove_file(t.path.join(&*name))?;
            }
        }
        let f = open_private(&path, true)?;
        preallocate(&f, table.target_file_bytes())?;
        let h = crate::targets::TargetHeader {
            space_uuid: sb.uuid,
            index: i as u16,
            shard_bytes: table.shard_bytes,
            slots: table.slots,
        };
        use std::os::unix::fs::FileExt;
        f.write_all_at(&h.encode(), 0)?;
        f.sync_all()?;
        sync_dir(&t.path)?;
    }
    let placement = open_private(&dir.join(crate::targets::PLACEMENT_FILE), true)?;
    preallocate(
        &placement,
        table.segments * crate::targets::RECORD_BYTES as u64,
    )?;
    store_table(dir, &mut table.clone())?;
    if nslots > 1 {
        // Each slot's table is made at its first claim, as in a multi-slot data file.
        format_slot_files(dir, &sb, config)?;
        return Ok(sb);
    }
    let meta = open_private(&dir.join(META_FILE), true)?;
    meta.set_len(0)?;
    let meta: Arc<dyn Device> = Arc::new(FileDevice::growable(meta)?);
    init_meta(&meta, config, 0..table.segments, None)?;
    Ok(sb)
}

impl Space {
    /// `format_slots` on devices: checks the geometry, writes the slot table's head onto
    /// `headers` (empty) and returns the superblock. Slot tables are made at first claim.
    pub fn format_slots_devices(
        data: &Arc<dyn Device>,
        headers: &Arc<dyn Device>,
        chunk_avg_bytes: u32,
        config: Config,
        slots: u32,
    ) -> Result<Superblock> {
        let size_bytes = data.len();
        let (chunk, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        if slots < 2 || (size_bytes / segment_bytes as u64) / (slots as u64) < MIN_SLOT_SEGMENTS {
            return Err(Error::Invalid(format!(
                "{slots} slots do not fit this space"
            )));
        }
        let sb = new_superblock(size_bytes, chunk, segment_bytes, slots);
        let head = SlotTableHead {
            uuid: sb.uuid,
            slots,
            config: [
                config.keep_revisions,
                config.keep_age_secs,
                config.keep_unlinked_secs,
                config.auto_gc_free_percent,
            ],
        };
        headers.set_len(slot_table_len(slots))?;
        headers.write_at(&head.encode(), 0)?;
        headers.sync()?;
        Ok(sb)
    }

    /// Creates a backing space in `dir`. Refuses a directory holding anything that is not a
    /// ckptfs space, and an existing space unless `force` (and never one that is mounted).
    pub fn format(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
    ) -> Result<()> {
        Self::format_slots(dir, size_bytes, chunk_avg_bytes, config, force, 1)
    }

    /// `format` with `slots` slots: each a node's writable partition of the space (its own
    /// share of the data file's segments and its own metadata table, made at its first
    /// claim). One slot is the plain single-node layout.
    pub fn format_slots(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
        slots: u32,
    ) -> Result<()> {
        Self::format_layout(dir, size_bytes, chunk_avg_bytes, config, force, slots, None)
    }

    /// `format` of a space whose data lies on several storage targets, erasure-coded as
    /// `r` (see `targets`): `dir` holds the superblock, the metadata table (with `slots`
    /// above 1: each slot's, made at its first claim) and the placement records; each
    /// target directory gets one preallocated `ckptfs-target` file. With several slots,
    /// several nodes share the space as with `format_slots`, each placing its own
    /// segments in its own part of every target (`targets::Share`).
    #[allow(clippy::too_many_arguments)]
    pub fn format_targets(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
        targets: &[TargetSpec],
        r: Redundancy,
        slots: u32,
    ) -> Result<()> {
        Self::format_layout(
            dir,
            size_bytes,
            chunk_avg_bytes,
            config,
            force,
            slots,
            Some((targets, r)),
        )
    }

    pub(super) fn format_layout(
        dir: &Path,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        force: bool,
        slots: u32,
        targets: Option<(&[TargetSpec], Redundancy)>,
    ) -> Result<()> {
        // Every refusal comes before the first change to `dir`.
        let (_, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        let table = match targets {
            Some((specs, r)) => Some(target_table(
                dir,
                size_bytes,
                segment_bytes,
                specs,
                r,
                force,
                slots,
            )?),
            None => None,
        };
        if slots == 0 || slots > MAX_SLOTS {
            return Err(Error::Invalid(format!(
                "--slots {slots} is out of range (1 to {MAX_SLOTS})"
            )));
        }
        let segments = size_bytes / segment_bytes as u64;
        if slots > 1 && segments / (slots as u64) < MIN_SLOT_SEGMENTS {
            return Err(Error::Invalid(format!(
                "size {size_bytes} bytes holds {segments} segments of {} MiB; {slots} slots \
                 need at least {MIN_SLOT_SEGMENTS} each (two for chunks, two for the slot's \
                 manifest), so at least {} MiB",
                segment_bytes >> 20,
                (MIN_SLOT_SEGMENTS * slots as u64 * segment_bytes as u64) >> 20
            )));
        }
        let names = old_space_files(dir, force)?;
        let old_space = !names.is_empty();
        // Every refusal comes before the first change: a refused format leaves DIR (and an old
        // space in it) as it was. Erasing the old space gives its data file's blocks back.
        let existing = existing_ancestor(dir);
        let reclaimed = if old_space {
            fs::metadata(dir.join(DATA_FILE)).map_or(0, |m| m.blocks() * 512)
        } else {
            0
        };
        let free = free_disk_bytes(existing)?.saturating_add(reclaimed);
        if table.is_none() && size_bytes > free {
            return Err(Error::Invalid(format!(
                "size {size_bytes} bytes is larger than the free space on that disk ({free} bytes)"
            )));
        }
        // Only the owner may change a space's files: a new backing dir is 0700 (whatever the
        // umask), and format takes group/other write away from an existing one.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let perm = fs::metadata(dir)?.permissions();
        if perm.mode() & 0o022 != 0 {
            fs::set_permissions(
                dir,
                fs::Permissions::from_mode(perm.mode() & 0o7777 & !0o022),
            )?;
        }
        // Hold the old space's lock while erasing it, so a mounted space is never erased.
        let _guard = if names.iter().any(|n| n == LOCK_FILE) {
            Some(take_lock(dir)?)
        } else {
            None
        };
        // Other nodes do not share this node's flock: a slot with a live lease is a mount.
        refuse_if_mounted_elsewhere(dir, &names)?;
        for n in &names {
            if n == SLOTS_DIR {
                fs::remove_dir_all(dir.join(n))?;
            } else if n != LOCK_FILE {
                fs::remove_file(dir.join(n))?;
            }
        }

        if let Some(table) = &table {
            let sb = format_target_files(dir, table, chunk_avg_bytes, &config, slots)?;
            drop(open_private(&dir.join(LOCK_FILE), true)?);
            drop(open_private(&dir.join(LOG_FILE), true)?);
            return write_superblock(dir, &sb);
        }
        let data = open_private(&dir.join(DATA_FILE), true)?;
        preallocate(&data, size_bytes).inspect_err(|_| {
            let _ = fs::remove_file(dir.join(DATA_FILE));
        })?;

        let sb = if slots == 1 {
            let meta = open_private(&dir.join(META_FILE), true)?;
            meta.set_len(0)?;
            let devs = Devices {
                data: Arc::new(FileDevice::new(data)?),
                meta: Arc::new(FileDevice::growable(meta)?),
            };
            let sb = Self::format_devices(&devs, chunk_avg_bytes, config)?;
            crate::layout::create_journal(dir)?;
            sb.with_features(Features::INCOMPAT_JOURNAL)
        } else {
            let (chunk, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
            let sb = new_superblock(size_bytes, chunk, segment_bytes, slots);
            format_slot_files(dir, &sb, &config)?;
            sb
        };
        drop(open_private(&dir.join(LOCK_FILE), true)?);
        drop(open_private(&dir.join(LOG_FILE), true)?);

        // The superblock goes last: a directory without one is never mistaken for a space.
        write_superblock(dir, &sb)
    }

    /// Writes an empty space's metadata table onto `devs.meta` (which must be empty) for a
    /// data device of `devs.data.len()` bytes; returns the superblock describing it. The
    /// caller stores the superblock (`format` writes it to its own file, last).
    pub fn format_devices(
        devs: &Devices,
        chunk_avg_bytes: u32,
        config: Config,
    ) -> Result<Superblock> {
        let size_bytes = devs.data.len();
        let (chunk, segment_bytes) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        if !devs.meta.is_empty() {
            return Err(Error::Invalid(
                "the metadata device is not empty; refusing to format over it".into(),
            ));
        }
        init_meta(
            &devs.meta,
            &config,
            0..size_bytes / segment_bytes as u64,
            None,
        )?;
        Ok(new_superblock(size_bytes, chunk, segment_bytes, 1))
    }

    /// For simulations: writes the metadata table of a space over `targets` erasure-coded
    /// targets onto `meta` (empty) and returns its superblock and targets table (paths
    /// `simN`), whose geometry says how large each target device must be.
    pub fn format_targets_devices(
        meta: &Arc<dyn Device>,
        size_bytes: u64,
        chunk_avg_bytes: u32,
        config: Config,
        r: Redundancy,
        targets: usize,
    ) -> Result<(Superblock, TargetsTable)> {
        let (chunk, seg) = geometry(size_bytes, chunk_avg_bytes, &config)?;
        let (segments, shard_bytes, slots) = target_geometry(size_bytes, seg, r, targets, 1);
        init_meta(meta, &config, 0..segments, None)?;
        let segment_bytes = (shard_bytes * r.data as u64) as u32;
        let sb = new_superblock(segments * segment_bytes as u64, chunk, segment_bytes, 1)
            .with_features(Features::INCOMPAT_TARGETS);
        let table = TargetsTable {
            redundancy: r,
            shard_bytes,
            slots,
            segments,
            targets: (0..targets)
                .map(|i| TargetSpec {
                    path: PathBuf::from(format!("sim{i}")),
                    domain: format!("target{i}"),
                })
                .collect(),
            failed: vec![false; targets],
            mirror: vec![false; targets],
            generation: 1,
        };
        Ok((sb, table))
    }
}

/// A name ckptfs puts in a target directory: the target file, a metadata mirror's files, a
/// cut marker (`targets::cut_marker`), or the temporary file of one of them left by a crash.
/// `format --force` takes a directory holding only such names.
fn is_target_dir_file(name: &str) -> bool {
    let base = name.split_once(".tmp").map_or(name, |(b, _)| b);
    base == crate::targets::TARGET_FILE
        || crate::mirror::MIRROR_FILES.contains(&base)
        || base
            .strip_prefix(crate::targets::TARGET_FILE)
            .and_then(|r| r.strip_prefix(".cut-"))
            .is_some_and(|slot| slot.parse::<u32>().is_ok())
}

/// The files of the old space in `dir` (none: `dir` is missing or empty), or the refusal
/// to format it: not a directory, something other than a space in it, or a space without
/// `force`.
fn old_space_files(dir: &Path, force: bool) -> Result<Vec<String>> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let names: Vec<String> = if dir.is_dir() {
        fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?
    } else {
        Vec::new()
    };
    if !names.is_empty()
        && !names.iter().all(|n| {
            // A crash while a small file was replaced leaves its `.tmp` beside it
            // (`NAME.tmp`, or `NAME.SLOT.tmp` of a slot's `store_table_shared`).
            let n = n.as_str();
            let n = n
                .strip_suffix(".tmp")
                .map_or(n, |b| b.split('.').next().unwrap_or(b));
            SPACE_FILES.contains(&n)
                || n == crate::format::REMOTE_FILE
                || SLOTTED_SPACE_FILES.contains(&n)
                || TARGETED_SPACE_FILES.contains(&n)
        })
    {
        return Err(Error::Invalid(format!(
            "{} is not empty and is not a ckptfs space; refusing to format it",
            dir.display()
        )));
    }
    if !names.is_empty() && !force {
        return Err(Error::Invalid(format!(
            "{} already holds a ckptfs space; use --force to erase it and format anew",
            dir.display()
        )));
    }
    Ok(names)
}

/// Refuses to erase a space of several slots that a node (other nodes do not share this
/// node's flock) still holds a live lease on.
fn refuse_if_mounted_elsewhere(dir: &Path, names: &[String]) -> Result<()> {
    if names.iter().any(|n| n == SLOTS_DIR) {
        if let Ok(sb) = read_superblock(dir) {
            let (table, _) = slot_table(dir, &sb, false)?;
            let now = crate::slots::now_unix_ns();
            let live: Vec<String> = table
                .all()?
                .iter()
                .filter(|h| crate::slots::is_live(h, now))
                .map(|h| crate::slots::describe_holder(h, now))
                .collect();
            if !live.is_empty() {
                return Err(Error::Locked(format!(
                    "{} is mounted: {}; unmount it everywhere first",
                    dir.display(),
                    live.join("; ")
                )));
            }
        }
    }
    Ok(())
}
