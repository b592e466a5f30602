//! The metadata of a space over targets kept beside its data: the targets table, its
//! copies and the metadata mirrors on the targets, `recover` from them, and opening the
//! targets.

use super::*;

/// Writes `name` in `dir` so a crash leaves the old file or the new one (temporary file,
/// fsync, rename, directory fsync).
pub fn write_file_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    write_file_durably_via(dir, name, &format!("{name}.tmp"), bytes)
}

/// `write_file_durably` through the temporary file `tmp` (a slot's own, where several
/// nodes may replace the same file).
pub(crate) fn write_file_durably_via(
    dir: &Path,
    name: &str,
    tmp: &str,
    bytes: &[u8],
) -> Result<()> {
    let tmp = dir.join(tmp);
    let mut f = open_private(&tmp, true)?;
    f.set_len(0)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Writes the targets table with a new generation: to the backing directory, and to every
/// target flagged as holding a metadata mirror (`mirror.rs`). A holder's copy that cannot
/// be written is logged; its older generation keeps `recover` from using it.
pub(crate) fn store_table(dir: &Path, table: &mut TargetsTable) -> Result<()> {
    table.generation += 1;
    let bytes = table.encode();
    write_file_durably(dir, crate::targets::TARGETS_FILE, &bytes)?;
    for (i, t) in table.targets.iter().enumerate() {
        if table.mirror[i] {
            if let Err(e) = write_file_durably(&t.path, crate::mirror::MIRROR_TABLE, &bytes) {
                log::error!(
                    "writing the targets table's copy on target {i} ({}): {e}",
                    t.path.display()
                );
            }
        }
    }
    Ok(())
}

/// `store_table` by one slot of a multi-slot space, whose nodes each record the target
/// failures they meet: the failures already in the file are kept (merged into `table`),
/// and the temporary file is this slot's own. Two nodes recording at the same moment can
/// still lose one flag: its target then counts as healthy at the next mount, where its
/// stale shards fail their checks and are rebuilt.
pub(crate) fn store_table_shared(dir: &Path, table: &mut TargetsTable, slot: SlotId) -> Result<()> {
    if let Ok(on_disk) = fs::read(dir.join(crate::targets::TARGETS_FILE))
        .map_err(Error::from)
        .and_then(|b| {
            TargetsTable::decode(&b).map_err(|e| {
                Corruption::Layout(format!("{}: {e}", crate::targets::TARGETS_FILE)).into()
            })
        })
    {
        if on_disk.targets.len() == table.targets.len() {
            for (f, d) in table.failed.iter_mut().zip(&on_disk.failed) {
                *f |= *d;
            }
        }
        table.generation = table.generation.max(on_disk.generation);
    }
    table.generation += 1;
    let name = crate::targets::TARGETS_FILE;
    write_file_durably_via(dir, name, &format!("{name}.{slot}.tmp"), &table.encode())
}

/// Copies `src` to `name` in `dir` so a crash leaves the old file or the new one.
pub(crate) fn copy_durably(src: &Path, dir: &Path, name: &str) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    fs::copy(src, &tmp)?;
    File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Makes the holder's copy `copy` equal to `src` in place, rewriting only the 4 KiB blocks
/// that differ, and says what differed. Used on a holder whose flag is already cleared
/// (`refresh_mirrors`), so a crash part way leaves a copy no one trusts, as a crash inside
/// `copy_durably` does. Memory: two windows of `mirror::VERIFY_WINDOW`.
fn refresh_copy(src: &Path, copy: &Path) -> Result<crate::mirror::CopyCheck> {
    use std::os::unix::fs::FileExt;
    let src = File::open(src)?;
    let dst = OpenOptions::new().read(true).write(true).open(copy)?;
    let len = src.metadata()?.len();
    let mut found = crate::mirror::CopyCheck::default();
    if dst.metadata()?.len() != len {
        dst.set_len(len)?;
        found.length_fixed = true;
    }
    let mut want = vec![0u8; crate::mirror::VERIFY_WINDOW];
    let mut got = vec![0u8; crate::mirror::VERIFY_WINDOW];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(want.len() as u64) as usize;
        src.read_exact_at(&mut want[..n], off)?;
        dst.read_exact_at(&mut got[..n], off)?;
        found.blocks_rewritten += crate::mirror::mend(&want[..n], &got[..n], off, |b, at| {
            Ok(dst.write_all_at(b, at)?)
        })?;
        off += n as u64;
    }
    if found != crate::mirror::CopyCheck::default() {
        dst.sync_all()?;
    }
    Ok(found)
}

/// Makes K+1 usable targets in distinct failure domains (lowest index first) the holders
/// of the metadata mirror for this mount: clears every flag, copies the backing
/// directory's metadata to each, then flags those copied (see `mirror.rs` for why in this
/// order). A holder of the last mount keeps its copies, compared with the primary and
/// rewritten where they differ (`refresh_copy`). Returns the holders, and what differed on
/// the old holders' copies (also logged).
pub(crate) fn refresh_mirrors(
    dir: &Path,
    table: &mut TargetsTable,
    usable: &[bool],
) -> Result<(Vec<usize>, Vec<String>)> {
    let want = table.redundancy.parity + 1;
    let mut domains = std::collections::BTreeSet::new();
    let mut chosen = Vec::new();
    for (i, t) in table.targets.iter().enumerate() {
        if chosen.len() < want && usable[i] && !table.failed[i] && domains.insert(&t.domain) {
            chosen.push(i);
        }
    }
    let old = table.mirror.clone();
    if old.iter().any(|m| *m) {
        // The old holders' copies of the table say so too.
        table.mirror.iter_mut().for_each(|m| *m = false);
        table.generation += 1;
        let bytes = table.encode();
        write_file_durably(dir, crate::targets::TARGETS_FILE, &bytes)?;
        for (i, t) in table.targets.iter().enumerate() {
            if old[i] {
                let _ = write_file_durably(&t.path, crate::mirror::MIRROR_TABLE, &bytes);
            }
        }
    }
    let mut holders = Vec::new();
    let mut findings = Vec::new();
    for i in chosen {
        let to = &table.targets[i].path;
        let copied = [
            (SUPERBLOCK_FILE, crate::mirror::MIRROR_SUPERBLOCK),
            (META_FILE, crate::mirror::MIRROR_META),
            (
                crate::targets::PLACEMENT_FILE,
                crate::mirror::MIRROR_PLACEMENT,
            ),
        ]
        .iter()
        .try_for_each(|(from, name)| {
            let (from, copy) = (dir.join(from), to.join(name));
            if !(old[i] && copy.is_file()) {
                return copy_durably(&from, to, name);
            }
            // A holder of the last mount: its copy should equal the primary, so compare
            // before replacing, and say what differed (scrub does the same while mounted).
            // Copying over it unseen would hide damage on that target's disk.
            let found = refresh_copy(&from, &copy)?;
            if found != crate::mirror::CopyCheck::default() {
                let what = match (found.blocks_rewritten, found.length_fixed) {
                    (0, _) => "in length".to_string(),
                    (n, false) => format!("in {n} 4 KiB block(s)"),
                    (n, true) => format!("in {n} 4 KiB block(s) and in length"),
                };
                let f = format!(
                    "target {i} ({}): its metadata mirror {name} differed from the backing \
                     directory's {} {what}: damage on that target's disk, or a crash while it \
                     was being written; rewritten from the primary",
                    to.display(),
                    from.display(),
                );
                log::warn!("{f}");
                findings.push(f);
            }
            Ok(())
        });
        match copied {
            Ok(()) => holders.push(i),
            Err(e) => log::error!(
                "copying the metadata to target {i} ({}) failed: {e}; it holds no mirror",
                to.display()
            ),
        }
    }
    for &i in &holders {
        table.mirror[i] = true;
    }
    store_table(dir, table)?;
    if holders.len() < want {
        log::warn!(
            "the metadata is mirrored on {} target(s), fewer than K+1 = {want}: losing the \
             backing directory and {} of those targets would lose the space",
            holders.len(),
            holders.len()
        );
    }
    Ok((holders, findings))
}

/// What `recover` did.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recovered {
    /// The target whose mirror was copied, and its directory.
    pub holder: usize,
    pub holder_dir: PathBuf,
    /// The targets table generation recovered.
    pub generation: u64,
    pub targets: usize,
}

/// Rebuilds the backing directory `backing` of a space over several targets from the
/// metadata mirror its targets hold (`mirror.rs`), starting from the target directory
/// `from`: of the holders' copies of the targets table, the newest generation names the
/// current holders, and the first of them whose own copy has that generation is copied.
/// Refuses a `backing` that holds a space (unless `force`) or anything else.
pub fn recover(backing: &Path, from: &Path, force: bool) -> Result<Recovered> {
    let read_table = |dir: &Path| -> Option<TargetsTable> {
        TargetsTable::decode(&fs::read(dir.join(crate::mirror::MIRROR_TABLE)).ok()?).ok()
    };
    let first = read_table(from).ok_or_else(|| {
        Error::Invalid(format!(
            "{} holds no metadata mirror of a ckptfs space (no readable {}): give the \
             directory of a target that held one (`ckptfs targets` says which do)",
            from.display(),
            crate::mirror::MIRROR_TABLE
        ))
    })?;
    // Every copy of the table the targets it names hold, and the newest of them.
    let mut copies: Vec<(usize, PathBuf, TargetsTable)> = Vec::new();
    for (i, t) in first.targets.iter().enumerate() {
        if let Some(tab) = read_table(&t.path) {
            copies.push((i, t.path.clone(), tab));
        }
    }
    let newest = copies
        .iter()
        .map(|(_, _, t)| t)
        .chain(std::iter::once(&first))
        .max_by_key(|t| t.generation)
        .expect("at least the first copy")
        .clone();
    let holder = copies
        .iter()
        .filter(|(i, _, t)| newest.mirror[*i] && t.generation == newest.generation)
        .find(|(_, p, _)| {
            crate::mirror::MIRROR_FILES
                .iter()
                .all(|n| p.join(n).is_file())
        })
        .ok_or_else(|| {
            Error::Invalid(format!(
                "no target holds a current metadata mirror (the newest targets table, \
                 generation {}, names {:?}; none of them has all its files at that \
                 generation)",
                newest.generation,
                (0..newest.targets.len())
                    .filter(|i| newest.mirror[*i])
                    .collect::<Vec<_>>()
            ))
        })?;
    let (holder, holder_dir) = (holder.0, holder.1.clone());
    // The superblock copy must be this space's: its uuid is in every target's header.
    let sb_bytes = fs::read(holder_dir.join(crate::mirror::MIRROR_SUPERBLOCK))?;
    let sb = Superblock::decode(&sb_bytes)?;
    if !sb.features.contains(Features::INCOMPAT_TARGETS) {
        return Err(Error::Invalid(format!(
            "the superblock copy in {} is not a targeted space's",
            holder_dir.display()
        )));
    }
    if backing.exists() {
        let names: Vec<String> = fs::read_dir(backing)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        let ours = names.iter().all(|n| {
            let n = n.strip_suffix(".tmp").unwrap_or(n);
            TARGETED_SPACE_FILES.contains(&n) || n == crate::format::REMOTE_FILE
        });
        if !ours {
            return Err(Error::Invalid(format!(
                "{} holds files that are not a ckptfs space's; recover into an empty directory",
                backing.display()
            )));
        }
        if names.iter().any(|n| n == SUPERBLOCK_FILE || n == META_FILE) && !force {
            return Err(Error::Invalid(format!(
                "{} still holds a space's metadata; recover is for a backing directory \
                 that was lost (--force replaces what is there)",
                backing.display()
            )));
        }
    } else {
        fs::create_dir_all(backing)?;
    }
    // Held while the files are replaced: refuses a space that is mounted.
    drop(open_private(&backing.join(LOCK_FILE), true)?);
    drop(open_private(&backing.join(LOG_FILE), true)?);
    let _lock = take_lock(backing)?;
    for (from_name, to_name) in [
        (crate::mirror::MIRROR_META, META_FILE),
        (
            crate::mirror::MIRROR_PLACEMENT,
            crate::targets::PLACEMENT_FILE,
        ),
        (crate::mirror::MIRROR_SUPERBLOCK, SUPERBLOCK_FILE),
    ] {
        copy_durably(&holder_dir.join(from_name), backing, to_name)?;
    }
    write_file_durably(backing, crate::targets::TARGETS_FILE, &newest.encode())?;
    log::info!(
        "recovered the metadata of {} from target {holder} ({}), table generation {}",
        backing.display(),
        holder_dir.display(),
        newest.generation
    );
    Ok(Recovered {
        holder,
        holder_dir,
        generation: newest.generation,
        targets: newest.targets.len(),
    })
}

use crate::targets::read_cut_marker;

/// Records in target directory `dir` that its file was cut short at byte `have`: a marker
/// per slot of the space (`targets::cut_marker`, `slots` 0 or 1 for a single slot), each
/// keeping the smaller of its offset and `have`, written by way of a temporary file named
/// for this node's slot, renamed, the directory fsynced. Returns this node's marker.
fn write_cut_markers(
    dir: &Path,
    slots: u32,
    my_slot: u32,
    have: u64,
) -> std::result::Result<PathBuf, String> {
    for s in 0..slots.max(1) {
        let m = crate::targets::cut_marker(dir, s);
        let at = read_cut_marker(&m).map_or(have, |x| x.min(have));
        let name = m.file_name().unwrap_or_default().to_string_lossy();
        write_file_durably_via(
            dir,
            &name,
            &format!("{name}.tmp-{my_slot}"),
            format!("{at}\n").as_bytes(),
        )
        .map_err(|e| {
            format!(
                "recording that it was cut short ({}) failed: {e}",
                m.display()
            )
        })?;
    }
    Ok(crate::targets::cut_marker(dir, my_slot))
}

/// Opens target `i`'s file as a device, checked to be this space's target `i` with the
/// table's layout, and the cut it was found short by (`CutShort`), if any; or why it is not
/// usable (the target is then failed).
fn open_target_file(
    table: &TargetsTable,
    i: usize,
    sb: &Superblock,
    read_only: bool,
    my_slot: u32,
    wrap: &dyn Fn(&'static str, Arc<dyn Device>) -> Arc<dyn Device>,
) -> std::result::Result<(Arc<dyn Device>, Option<crate::targets::CutShort>), String> {
    let t = &table.targets[i];
    let path = t.path.join(crate::targets::TARGET_FILE);
    if table.failed[i] {
        return Err(
            "it failed while mounted earlier (see daemon.log), so its shards may be \
             stale; `ckptfs rebuild` replaces it"
                .into(),
        );
    }
    let f = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut head = vec![0u8; crate::targets::TARGET_HEADER_BYTES as usize];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut head, 0)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let h = crate::targets::TargetHeader::decode(&head)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if h.space_uuid != sb.uuid || h.index as usize != i {
        return Err(format!(
            "{} belongs to another space or is another target (index {})",
            path.display(),
            h.index
        ));
    }
    if h.shard_bytes != table.shard_bytes || h.slots != table.slots {
        return Err(format!("{} has another layout", path.display()));
    }
    // A file cut short outside ckptfs (a copy that ran out of room, a truncate by
    // mistake) lost the shards past its end. Its device takes writes only within its
    // length, so it is extended to its reserved size again (else every repair of
    // those shards would fail with ENOSPC and fail the whole target). Extended, its
    // length no longer tells what it lost, so first a marker per slot records the
    // cut (`targets::cut_marker`): each node's shards past it are counted missing,
    // read around and rebuilt in place by `ckptfs rebuild` (or `scrub`), whose pass
    // removes that node's marker once none is left, at this mount or a later one.
    let want = table.target_file_bytes();
    let have = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    let mine = crate::targets::cut_marker(&t.path, my_slot);
    let marked = read_cut_marker(&mine);
    if have < want {
        log::error!(
            "target {i}: {} is {have} bytes, {want} reserved: it was cut short outside \
             ckptfs; the shards past its end are read from the other targets{}",
            path.display(),
            match read_only {
                true => ", and a read-write mount's `ckptfs rebuild` puts them back",
                false => "; extended to its size again, `ckptfs rebuild` rewrites them",
            }
        );
        if !read_only {
            write_cut_markers(&t.path, sb.slots, my_slot, have).map_err(|e| {
                format!(
                    "{} is {have} bytes, {want} reserved, and {e}",
                    path.display()
                )
            })?;
            super::preallocate(&f, want).map_err(|e| {
                format!(
                    "{} is {have} bytes, {want} reserved, and extending it failed: {e}",
                    path.display()
                )
            })?;
        }
    }
    let at = match (have < want, marked) {
        (true, m) => Some(m.map_or(have, |m| m.min(have))),
        (false, m) => m,
    };
    let cut = at.map(|at| crate::targets::CutShort {
        at,
        marker: (!read_only).then(|| mine.clone()),
    });
    let dev: Arc<dyn Device> = match read_only {
        true => Arc::new(crate::device::ReadOnlyDevice(Arc::new(
            FileDevice::new(f).map_err(|e| e.to_string())?,
        ))),
        false => Arc::new(FileDevice::new_direct(f).map_err(|e| e.to_string())?),
    };
    Ok((wrap(crate::sim::target_device_name(i), dev), cut))
}

/// Opens the targets of the targeted space in `dir` as its placement. A target whose
/// file is missing, unreadable or not this space's is failed (the reason kept for
/// `ckptfs targets`); fewer than M usable targets refuse the open.
pub(crate) fn open_targets(
    dir: &Path,
    sb: &Superblock,
    read_only: bool,
    wrap: &dyn Fn(&'static str, Arc<dyn Device>) -> Arc<dyn Device>,
    lease: Option<&Arc<Lease>>,
    watched: &mut Vec<Arc<crate::device::PathWatched>>,
) -> Result<(Arc<crate::targets::Erasure>, SharedTable, Option<Mirrors>)> {
    let bytes = fs::read(dir.join(crate::targets::TARGETS_FILE)).map_err(|e| {
        Error::NotASpace(format!(
            "{}: its targets table {} cannot be read: {e}",
            dir.display(),
            crate::targets::TARGETS_FILE
        ))
    })?;
    let mut table = TargetsTable::decode(&bytes)
        .map_err(|e| Corruption::Layout(format!("{}: {e}", crate::targets::TARGETS_FILE)))?;
    // The slot whose cut markers this node reads and clears (`targets::cut_marker`).
    let my_slot = lease.map_or(0, |l| l.slot().0);
    let opened = open_target_files(&table, sb, read_only, my_slot, wrap);
    let (targets, opened_ok, cuts, usable) =
        (opened.targets, opened.ok, opened.cuts, opened.usable);
    let r = table.redundancy;
    if usable < r.data {
        return Err(Error::Targets(crate::error::TargetFault::TooFewOpen {
            usable,
            total: table.targets.len(),
            needed: r.data,
        }));
    }
    // The metadata of a multi-slot space is each slot's own table, written by its node
    // while it runs: it is not mirrored on the targets (see FORMAT.md "Slots over
    // targets").
    let mirrored = !read_only && lease.is_none();
    let (holders, findings) = match mirrored {
        false => (Vec::new(), Vec::new()),
        true => refresh_mirrors(dir, &mut table, &opened_ok)?,
    };
    let mut map = open_placement_map(dir, read_only, lease, watched)?;
    let table = Arc::new(parking_lot::Mutex::new(table));
    let mirrors = match mirrored {
        false => None,
        true => {
            let (m, placement) = open_mirrors(dir, &table, &holders, findings, map, wrap)?;
            map = placement;
            Some(m)
        }
    };
    let (shard_bytes, segments) = {
        let t = table.lock();
        (t.shard_bytes, t.segments)
    };
    let share = lease.map(|l| {
        crate::targets::Share::of(
            l.slot().0,
            sb.slots,
            table.lock().slots,
            sb.slot_share(l.slot()),
        )
    });
    let erasure = Arc::new(crate::targets::Erasure::open_share(
        r,
        shard_bytes,
        segments,
        targets,
        map,
        share,
    )?);
    report_cuts_and_failures(&erasure, cuts, &table);
    if !read_only {
        set_hooks(
            &erasure,
            dir,
            &table,
            sb.slots,
            lease.map(|l| l.slot()),
            my_slot,
        );
    }
    Ok((erasure, table, mirrors))
}

/// The targets of a table as opened: failed ones carry why (`Target::new`).
struct OpenedTargets {
    targets: Vec<crate::targets::Target>,
    /// Which opened.
    ok: Vec<bool>,
    /// The cut markers this node found, by target.
    cuts: Vec<(u16, crate::targets::CutShort)>,
    usable: usize,
}

/// Opens every target file of `table` (`open_target_file`); one that cannot be opened is
/// named in the log (unless the table already says it failed) and kept as failed.
fn open_target_files(
    table: &TargetsTable,
    sb: &Superblock,
    read_only: bool,
    my_slot: u32,
    wrap: &dyn Fn(&'static str, Arc<dyn Device>) -> Arc<dyn Device>,
) -> OpenedTargets {
    let mut targets = Vec::new();
    let mut opened_ok = Vec::new();
    let mut cuts: Vec<(u16, crate::targets::CutShort)> = Vec::new();
    let mut usable = 0;
    for (i, t) in table.targets.iter().enumerate() {
        let (opened, cut) = match open_target_file(table, i, sb, read_only, my_slot, wrap) {
            Ok((dev, cut)) => (Ok(dev), cut),
            Err(e) => (Err(e), None),
        };
        if let Err(e) = &opened {
            // A failed target is named below, once it is known whether anything of the
            // space is still on it (after `rebuild --replace` nothing is: retired).
            if !table.failed[i] {
                log::error!("target {i} ({}) is not usable: {e}", t.path.display());
            }
        } else {
            usable += 1;
        }
        if let (Ok(_), Some(c)) = (&opened, cut) {
            cuts.push((i as u16, c));
        }
        opened_ok.push(opened.is_ok());
        targets.push(crate::targets::Target::new(
            t.path.clone(),
            t.domain.clone(),
            table.slots,
            opened,
        ));
    }
    OpenedTargets {
        targets,
        ok: opened_ok,
        cuts,
        usable,
    }
}

/// The placement file as a device: read around this node's page cache and fenced by the
/// lease on a multi-slot space, watched for replacement on a read-write mount.
fn open_placement_map(
    dir: &Path,
    read_only: bool,
    lease: Option<&Arc<Lease>>,
    watched: &mut Vec<Arc<crate::device::PathWatched>>,
) -> Result<Arc<dyn Device>> {
    let map = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(dir.join(crate::targets::PLACEMENT_FILE))?;
    let map: Arc<dyn Device> = match lease {
        // Other nodes write their segments' records: read around this node's page cache,
        // and write only while this node holds its slot.
        Some(l) => Arc::new(FencedDevice {
            inner: Arc::new(crate::device::SharedFile::new(map)?),
            lease: l.clone(),
        }),
        None => Arc::new(FileDevice::new(map)?),
    };
    Ok(match read_only {
        true => map,
        false => {
            let w = Arc::new(crate::device::PathWatched::new(
                map,
                "placement file",
                dir.join(crate::targets::PLACEMENT_FILE),
            ));
            watched.push(w.clone());
            w
        }
    })
}

/// The metadata mirror holders' placement files, opened beside the placement file (`map`)
/// as one mirrored device, which the placement then uses.
fn open_mirrors(
    dir: &Path,
    table: &SharedTable,
    holders: &[usize],
    findings: Vec<String>,
    map: Arc<dyn Device>,
    wrap: &dyn Fn(&'static str, Arc<dyn Device>) -> Arc<dyn Device>,
) -> Result<(Mirrors, Arc<dyn Device>)> {
    let (dir, t) = (dir.to_path_buf(), table.clone());
    let set = crate::mirror::MirrorSet::new(Box::new(move |i| {
        let mut t = t.lock();
        t.mirror[i] = false;
        if let Err(e) = store_table(&dir, &mut t) {
            log::error!("recording that the mirror on target {i} was dropped: {e}");
        }
    }));
    let paths: Vec<(usize, PathBuf)> = {
        let t = table.lock();
        holders
            .iter()
            .map(|&i| (i, t.targets[i].path.clone()))
            .collect()
    };
    let mut devs = Vec::new();
    for (i, p) in &paths {
        let f = open_private(&p.join(crate::mirror::MIRROR_PLACEMENT), false)?;
        let d: Arc<dyn Device> = Arc::new(FileDevice::new(f)?);
        devs.push((*i, wrap(crate::sim::mirror_device_name(*i), d)));
    }
    let placement = Arc::new(
        crate::mirror::MirrorDevice::new(map, devs, set.clone()).with_paths(
            paths
                .iter()
                .map(|(_, p)| p.join(crate::mirror::MIRROR_PLACEMENT))
                .collect(),
        ),
    );
    let map: Arc<dyn Device> = placement.clone();
    let mirrors = Mirrors {
        set,
        holders: paths,
        placement,
        findings,
    };
    Ok((mirrors, map))
}

/// Applies the cut markers found at open and names the failed targets that still hold
/// shards of the space (and those retired).
fn report_cuts_and_failures(
    erasure: &crate::targets::Erasure,
    cuts: Vec<(u16, crate::targets::CutShort)>,
    table: &SharedTable,
) {
    for (i, c) in cuts {
        let at = c.at;
        match erasure.cut_short(i, c) {
            0 => {}
            n => log::error!(
                "target {i}: {n} shard(s) of this node's segments reach past byte {at}, where \
                 its file was cut short: counted missing and read from the other targets \
                 until `ckptfs rebuild` rewrites them"
            ),
        }
    }
    // Cuts that took nothing of this node's segments are forgotten at once.
    erasure.forget_repaired_cuts();
    {
        let t = table.lock();
        for (i, spec) in t.targets.iter().enumerate().filter(|(i, _)| t.failed[*i]) {
            match erasure.shards_on(i as u16) {
                0 => log::info!(
                    "target {i} ({}) is retired: it failed while mounted earlier and nothing of \
                     the space is on it any more",
                    spec.path.display()
                ),
                n => log::error!(
                    "target {i} ({}) is not usable: it failed while mounted earlier (see \
                     daemon.log), so its {n} shard(s) may be stale; `ckptfs rebuild` rebuilds \
                     them on healthy targets",
                    spec.path.display()
                ),
            }
        }
    }
}

/// A read-write mount's hooks: a failed target is recorded in the targets table, and a
/// target file cut short while mounted is marked and extended again.
fn set_hooks(
    erasure: &crate::targets::Erasure,
    dir: &Path,
    table: &SharedTable,
    slots: u32,
    slot: Option<SlotId>,
    my_slot: u32,
) {
    let want = table.lock().target_file_bytes();
    let dir = dir.to_path_buf();
    let table = table.clone();
    erasure.set_fail_hook(Box::new(move |t| {
        let mut table = table.lock();
        table.failed[t as usize] = true;
        let stored = match slot {
            None => store_table(&dir, &mut table),
            Some(s) => store_table_shared(&dir, &mut table, s),
        };
        if let Err(e) = stored {
            log::error!(
                "recording that target {t} failed in {}: {e}; it will be used again at \
                 the next mount, where its stale shards fail their checks and are rebuilt",
                crate::targets::TARGETS_FILE
            );
        }
    }));
    // A target file cut short while mounted (`Erasure::watch_files`) is recorded as a
    // read-write open records one cut while unmounted, then extended to its reserved
    // size again, so repairs and new shards past the cut have their room
    // (`watch_files` has just checked that the path still names the file open here).
    erasure.set_cut_hook(
        my_slot,
        Box::new(move |dir, at| {
            let marker = write_cut_markers(dir, slots, my_slot, at)?;
            let path = dir.join(crate::targets::TARGET_FILE);
            let grown = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(Error::from)
                .and_then(|f| super::preallocate(&f, want));
            if let Err(e) = grown {
                // Writes past its end still extend it (sparsely); the next open tries again.
                log::error!("extending {} to {want} bytes again: {e}", path.display());
            }
            Ok(marker)
        }),
    );
}

/// A targeted space's `targets` table, shared by the fail hook and `rebuild`.
pub(crate) type SharedTable = Arc<parking_lot::Mutex<TargetsTable>>;

/// The metadata mirror holders of a read-write mount: the metadata table's device is
/// wrapped once it is opened.
pub(crate) struct Mirrors {
    pub(crate) set: Arc<crate::mirror::MirrorSet>,
    pub(crate) holders: Vec<(usize, PathBuf)>,
    /// The placement records' device, written to the holders' copies too.
    pub(crate) placement: Arc<crate::mirror::MirrorDevice>,
    /// What differed on the old holders' copies when this mount refreshed them.
    pub(crate) findings: Vec<String>,
}

/// A read-write mount's mirrored devices, for `ckptfs scrub` to compare the holders' copies
/// with the primary (`MirrorDevice::verify`): (the copy's file name, its device).
pub(crate) type MirroredDevices = Vec<(&'static str, Arc<crate::mirror::MirrorDevice>)>;
