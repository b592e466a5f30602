//! `ckptfs mount` and `ckptfs umount`: the daemon a mount runs (the space opened for it,
//! the FUSE session, the maintenance scheduler, signals), its spawning and readiness, and
//! the checks that refuse a bad mount before anything is opened.

use super::*;

/// Where `ckptfs mount MOUNTPOINT` keeps its space: $CKPTFS_DEFAULT_SPACE, else
/// /var/lib/ckptfs/default for root, else $XDG_DATA_HOME (or ~/.local/share)/ckptfs/default.
pub(crate) fn default_space_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("CKPTFS_DEFAULT_SPACE") {
        return PathBuf::from(p);
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/ckptfs/default");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("ckptfs/default")
}

pub(crate) fn ensure_default_space(dir: &Path) -> Result<(), CliError> {
    if dir.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // 8 GiB, or half the free space of that disk if that is less.
    let free = free_disk_bytes(dir).map_err(CliError::from)?;
    let size = DEFAULT_SPACE_BYTES.min(free / 2) & !0xfffff;
    if size < MIN_SPACE_BYTES {
        return Err(format!(
            "not enough free disk at {} for a default space",
            dir.display()
        )
        .into());
    }
    let chunk = parse_size(DEFAULT_CHUNK)? as u32;
    Space::format(dir, size, chunk, Config::default(), false).map_err(CliError::from)?;
    eprintln!(
        "ckptfs: formatted the default backing space at {} ({} MiB)",
        dir.display(),
        size >> 20
    );
    Ok(())
}

/// Detaches a ckptfs mount at `m` whose daemon is gone (the kernel answers ENOTCONN, or
/// ECONNABORTED while the connection is being torn down: the daemon was killed, `kill -9`
/// or the OOM killer, with no unmount), saying so. Such a mountpoint refused the next
/// `ckptfs mount` ("Transport endpoint is not connected") until someone ran
/// `fusermount3 -u`: a job requeued on the nodes of a killed one failed in its prolog.
/// Nothing can be read or written through the dead mount; only ckptfs mounts
/// (`/proc/self/mountinfo` source `ckptfs:...`) are touched, never another filesystem's.
fn detach_dead_mount(m: &Path) {
    // ECONNABORTED: a request that met the connection while it was being aborted (seen
    // right after the daemon's death, the next one says ENOTCONN).
    let dead = matches!(std::fs::metadata(m), Err(e)
        if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)));
    let Some(backing) = dead.then(|| backing_of(m)).flatten() else {
        return;
    };
    let detached = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(m)
        .status()
        .is_ok_and(|s| s.success())
        // SAFETY: a NUL-terminated path; MNT_DETACH has no other preconditions.
        || std::ffi::CString::new(m.as_os_str().as_encoded_bytes())
            .is_ok_and(|c| unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0);
    if detached {
        eprintln!(
            "ckptfs: detached the dead ckptfs mount of {} at {} (its daemon is gone)",
            backing.display(),
            m.display()
        );
    }
}

pub(crate) fn check_mountpoint(m: &Path) -> Result<(), CliError> {
    detach_dead_mount(m);
    match std::fs::metadata(m) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(format!("mountpoint {} is not a directory", m.display()).into()),
        Err(e) => Err(format!("mountpoint {}: {e}", m.display()).into()),
    }
}

/// A backing directory that is missing or not a directory is named as such, before anything
/// looks for a superblock in it.
pub(crate) fn check_backing_dir(b: &Path) -> Result<(), CliError> {
    // Not a space, for the exit status (`error::exit::NOT_A_SPACE`), as an unformatted one.
    let not_a_space = |m: String| CliError::Engine(ckptfs_engine::Error::NotASpace(m));
    match std::fs::metadata(b) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(not_a_space(format!(
            "backing directory {} is not a directory",
            b.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_a_space(format!(
            "backing directory {} does not exist (create a space with `ckptfs format {} \
             --size SIZE`)",
            b.display(),
            b.display()
        ))),
        Err(e) => Err(format!("backing directory {}: {e}", b.display()).into()),
    }
}

/// FUSE threads of a mount unless `--threads` says otherwise. Each request holds its thread
/// until answered, and a close waits on its thread for the journal's sync, so this many
/// closes at most can share one commit: with 4, eight writers closing small files at once
/// left the other four waiting for a thread even to create their next file, and shared a
/// sync by about 1.4 closes. With 8: 1 KiB files by eight writers 3637-4234 -> 4928-5357
/// files/s new and 5007-5262 -> 6587-7256 overwritten, 0.71 -> 0.41 syncs per close
/// (`ckptfs-bench closes`, 2-core VM); 16 gave no more (4280-4507). Large files are not
/// served faster or slower by more threads (eight writers of 64 MiB: 820-1110 MiB/s with 4,
/// 887-1094 with 8, the same daemon CPU per GiB), and each thread keeps a request buffer
/// and a read reply buffer (README, memory bounds): 20-30 MiB more peak RSS there.
pub(crate) const DEFAULT_THREADS: u32 = 8;

/// Daemon settings that do not change what is stored, only how fast.
pub(crate) struct Tuning {
    pub(crate) threads: u32,
    pub(crate) workers: Option<u32>,
    /// `--codec`; `None`: the space's default (see the flag).
    pub(crate) codec: Option<String>,
    pub(crate) gpu: String,
    /// `--confirm`: predicted chunks confirmed by fingerprint (`true`) or by blake3.
    pub(crate) confirm_by_fingerprint: bool,
    /// `--cuts`: changes in place cut at the old boundaries (`true`) or by content.
    pub(crate) follow_changes: bool,
    /// `--durability`: closes durable when they return (`true`), or at fsync/unmount.
    pub(crate) close_durable: bool,
    /// `--coherence close-to-open` (`true`) or `strict`; of multi-slot spaces only.
    pub(crate) close_to_open: bool,
    pub(crate) cuda_lib_dir: Option<PathBuf>,
    /// Not tuning, but carried to the daemon alike: `--read-only`.
    pub(crate) read_only: bool,
    /// Kernel mount flags from `-o`: `suid` (ckptfs mounts nosuid unless told), `noexec`.
    /// ckptfs always mounts `nodev`.
    pub(crate) suid: bool,
    pub(crate) noexec: bool,
    /// Of a multi-slot space: `--slot`, `--lease`, `--take-over`.
    pub(crate) slot: Option<u32>,
    pub(crate) lease: Duration,
    pub(crate) take_over: bool,
    pub(crate) no_probe: bool,
    /// `--remote-take-over`: take the object-store tier's lease even while it runs.
    pub(crate) remote_take_over: bool,
}

/// The batch codec `--gpu` asks for, if any (see the flag's help).
pub(crate) fn choose_gpu(
    tuning: &Tuning,
    codec: &str,
) -> Result<Option<Arc<dyn ckptfs_engine::kernels::BatchCodec>>, String> {
    use ckptfs_engine::kernels::{gpu, BatchCodec, Emu};
    let mode = tuning.gpu.as_str();
    if codec != "lz4" && mode != "off" {
        if mode == "on" || mode == "emulate" {
            return Err(format!(
                "--gpu on and --gpu emulate compress with plain LZ4; codec {codec} runs on the CPU (choose \
                 one: --codec lz4 or --gpu off)"
            ));
        }
        log::info!("GPU: not used: codec {codec} runs on the CPU");
        return Ok(None);
    }
    match mode {
        "off" => {
            log::info!("GPU: not used (--gpu off, the default); compressing on the CPU");
            return Ok(None);
        }
        "emulate" => {
            log::warn!("--gpu emulate: the GPU kernels run in a slow CPU emulation (for tests)");
            return Ok(Some(Arc::new(Emu)));
        }
        _ => {}
    }
    if tuning.workers == Some(0) {
        if mode == "on" {
            return Err(
                "--gpu on needs store workers; --workers 0 compresses inline on the \
                        FUSE threads"
                    .into(),
            );
        }
        log::info!("GPU: not used: --workers 0 compresses inline on the FUSE threads");
        return Ok(None);
    }
    let opts = gpu::GpuOptions {
        lib_dir: tuning.cuda_lib_dir.clone(),
        sub_batch_bytes: Some(ckptfs_engine::store::GPU_SUB_BATCH_BYTES),
        ..Default::default()
    };
    match gpu::Gpu::open(&opts) {
        Ok(g) => {
            log::info!("GPU: compressing new chunks on {}", g.describe());
            Ok(Some(Arc::new(g)))
        }
        Err(e) if mode == "auto" => {
            log::info!("GPU: not used, compressing on the CPU: {e}");
            Ok(None)
        }
        Err(e) => Err(format!("--gpu on: {e}")),
    }
}

pub(crate) fn mount(
    paths: Vec<PathBuf>,
    foreground: bool,
    allow_other: bool,
    tuning: Tuning,
    notify: bool,
) -> Result<(), CliError> {
    let (backing, mnt) = match paths.as_slice() {
        [m] => {
            let d = default_space_dir();
            // A read-only mount formats nothing: no space there is an error below.
            if !tuning.read_only {
                ensure_default_space(&d)?;
            }
            (d, m.clone())
        }
        [b, m] => (b.clone(), m.clone()),
        _ => return Err("usage: ckptfs mount [BACKING_DIR] MOUNTPOINT".into()),
    };
    let (backing, mnt) = (absolute(&backing), absolute(&mnt));
    check_backing_dir(&backing)?;
    check_mountpoint(&mnt)?;
    check_apart(&backing, &mnt)?;
    if let Some(other) = backing_of(&mnt) {
        // A second mount on top of a live one would hide it (its files still open) and
        // leave two daemons the kernel routes requests to by whichever is on top.
        let holder = control::send(&mnt, &control::Request::Pid)
            .ok()
            .and_then(|v| v.as_i64())
            .map(|p| format!(" (daemon pid {p})"))
            .unwrap_or_default();
        return Err(format!(
            "{} already holds a ckptfs mount of {}{holder}; unmount it first (`ckptfs umount {}`)",
            mnt.display(),
            other.display(),
            mnt.display()
        )
        .into());
    }
    if !foreground {
        return spawn_daemon(&backing, &mnt, allow_other, &tuning);
    }
    // Before any thread starts: see `ckptfs_engine::heap`.
    ckptfs_engine::heap::tune();
    let (mut space, slots) = open_for_mount(&backing, &mnt, &tuning)?;
    configure_space(&mut space, &tuning)?;
    if let Some(hint) = fuse::request_cap_hint(fuse::request_cap_pages()) {
        log::info!("{hint}");
    }
    if !tuning.read_only {
        if slots == 1 {
            space
                .set_lock_note(&format!(
                    "pid {} mounted at {}",
                    std::process::id(),
                    mnt.display()
                ))
                .map_err(CliError::from)?;
        }
    } else {
        log::info!(
            "read-only: nothing will be written to {}",
            backing.display()
        );
    }
    let fs = Arc::new(Fs::new(space));
    // A slot of a multi-slot space: publish the slot's namespace for the other nodes (a
    // new manifest generation: a takeover publishes what the dead owner committed) and
    // read theirs before the mount is ready.
    match fs.publish_all() {
        Ok(()) => {}
        // More targets lost than the redundancy allows: what survived is still read here,
        // as on a space of one slot; the other nodes see this slot's files as of its last
        // publication until the targets are back (every later publication retries).
        Err(ckptfs_fs::Error::Engine(ckptfs_engine::Error::Targets(t))) => log::error!(
            "this slot's manifest cannot be published now ({t}): the other nodes see its \
             files as they were at its last publication until enough targets are back"
        ),
        Err(e) => return Err(format!("cannot publish this slot's manifest: {e}").into()),
    }
    fs.refresh_union()
        .map_err(|e| format!("cannot read the other slots' manifests: {e}"))?;
    let (uploader, fetcher) = match tuning.read_only {
        true => (None, attach_remote_reader(&backing, &fs)?),
        false => (start_remote(&backing, &fs, tuning.remote_take_over)?, None),
    };
    let fs_for_names = fs.clone();
    let mut adapter = fuse::CkptFs::new(fs.clone());
    adapter.allow_idmap = allow_other;
    if tuning.close_to_open && fs.shares_namespace() {
        adapter.told = Some(Default::default());
        fs.set_lookup_window(crate::told::LOOKUP_WINDOW);
        log::info!(
            "close-to-open coherence: names and attributes kept by the kernel for 1 s, \
             lookups answered from a read of the other slots' records up to 0.1 s old"
        );
    }
    if let Some(u) = uploader {
        let _ = adapter.remote.set(u);
    }
    if let Some(f) = fetcher {
        let _ = adapter.fetcher.set(f);
    }
    let notifier = adapter.notifier.clone();
    let invalidator = adapter.invalidator.clone();
    let maintenance = start_maintenance(fs);
    let _ = adapter.stop.set(maintenance.wake());
    let config = fuse_config(&backing, &tuning, allow_other);
    let mut session = fuser::Session::new(adapter, &mnt, &config)
        .map_err(|e| format!("cannot mount at {}: {e}", mnt.display()))?;
    let _ = invalidator.set(fuse::Invalidator::start(session.notifier()));
    let _ = notifier.set(session.notifier());
    fs_for_names.set_entry_invalidator(fuse::entry_dropper(session.notifier()));
    log::info!("mounted {} at {}", backing.display(), mnt.display());
    let mut unmounter = session.unmount_callable();
    std::thread::spawn(move || {
        wait_for_termination();
        log::info!("signal received; unmounting");
        if let Err(e) = unmounter.unmount() {
            log::error!("unmount failed: {e}");
        }
    });
    let mnt_ra = mnt.clone();
    std::thread::spawn(move || set_readahead(&mnt_ra));
    if notify {
        println!("ready");
        let _ = std::io::stdout().flush();
        // SAFETY: replacing our stdout with /dev/null so the waiting parent sees EOF.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            if null >= 0 {
                libc::dup2(null, 1);
                libc::close(null);
            }
        }
    }
    let result = session
        .run()
        .map_err(|e| format!("FUSE session ended with an error: {e}"));
    // destroy() stopped the scheduler; the space closes when this last holder of it ends.
    maintenance.join();
    Ok(result?)
}

/// The object-store tier's uploader of a space that has one (`remote` in its backing
/// directory): refused while another node holds the bucket prefix's lease.
fn start_remote(
    backing: &Path,
    fs: &Arc<Fs>,
    take_over: bool,
) -> Result<Option<Arc<ckptfs_remote::Uploader>>, CliError> {
    // A multi-slot space never has a tier (`format` and `ckptfs remote --remote` refuse
    // it), and is not even looked for: a slot's mount makes a fixed, small number of
    // name-based calls on the shared backing directory (tests/tests/slots.rs counts them).
    if fs.shares_namespace() {
        return Ok(None);
    }
    let Some(cfg) = ckptfs_remote::RemoteConfig::load(backing).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let url = cfg.url.clone();
    let u = ckptfs_remote::Uploader::start(fs.clone(), cfg, take_over)
        .map_err(|e| format!("cannot start the object-store tier {url}: {e}"))?;
    log::info!("object-store tier: {url} ({} durability)", u.durability());
    Ok(Some(u))
}

/// A read-only mount of a space whose chunks are partly held only by its bucket (mounted
/// from it, `Features::INCOMPAT_REMOTE_CHUNKS`) reads them from there; it uploads nothing
/// and takes no lease.
fn attach_remote_reader(
    backing: &Path,
    fs: &Arc<Fs>,
) -> Result<Option<Arc<ckptfs_remote::fetch::Fetcher>>, CliError> {
    use ckptfs_engine::format::Features;
    if fs.shares_namespace()
        || !fs
            .space()
            .superblock()
            .features
            .contains(Features::INCOMPAT_REMOTE_CHUNKS)
    {
        return Ok(None);
    }
    let Some(cfg) = ckptfs_remote::RemoteConfig::load(backing).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let f = ckptfs_remote::fetch::attach_reader(fs, &cfg)
        .map_err(|e| format!("cannot reach the object-store tier {}: {e}", cfg.url))?;
    Ok(Some(f))
}

/// Opens the space a foreground mount serves, as `tuning` says: a single-slot space once
/// no other process holds it (waiting for an exiting daemon), a slot by claiming it and
/// probing that the other nodes see its writes. Returns it and the space's slot count.
pub(crate) fn open_for_mount(
    backing: &Path,
    mnt: &Path,
    tuning: &Tuning,
) -> Result<(Space, u32), CliError> {
    // A foreground mount started by hand (or by a service manager) right after an unmount
    // waits for the exiting daemon too; started by `spawn_daemon`, this returns at once.
    let slots = read_backing_dir(backing, !tuning.read_only)
        .map_err(CliError::from)?
        .slots;
    if slots == 1 {
        check_not_locked(backing, tuning.read_only)?;
    } else if !tuning.read_only {
        slots::wait_for_own_exiting_daemon(backing, mnt)?;
    }
    let mode = match tuning.read_only {
        true => Mode::ReadOnly,
        false => Mode::Mount(SlotRequest {
            slot: tuning.slot.map(SlotId),
            lease: tuning.lease,
            mountpoint: mnt.display().to_string(),
            take_over: tuning.take_over,
        }),
    };
    let space = Space::open_as(backing, &mode).map_err(CliError::from)?;
    if let Some(l) = space.slots().lease() {
        log::info!(
            "claimed slot {} of {slots} (epoch {}, lease {:?})",
            l.slot(),
            l.epoch(),
            tuning.lease
        );
        if !tuning.read_only {
            answer_probes_while_held(l);
        }
        if !tuning.no_probe {
            match l.probe_coherence(PROBE_WAIT) {
                Ok(None) => log::info!("coherence probe: no other node is live"),
                Ok(Some((s, t))) => log::info!(
                    "coherence probe: slot {s} saw this node's write, and this node its \
                     answer, in {} ms",
                    t.as_millis()
                ),
                Err(e) => return Err(format!("{e}").into()),
            }
        }
    }
    Ok((space, slots))
}

/// The daemon's periodic work, as the engine's scheduler runs it (one thread, `TICK` =
/// 250 ms): automatic gc checks free space every tick (a check is one metadata read), so a
/// fast writer does not outrun it; repeated target warnings come out once per tick; once a
/// second, idle request buffers and heap go back, this slot's pending namespace changes are
/// published and the other slots' manifests read (a multi-slot space; nothing otherwise).
/// A writer of a full space asks for the learning of other nodes' removals at once.
pub(crate) fn start_maintenance(fs: Arc<Fs>) -> ckptfs_engine::maintenance::schedule::Running {
    use ckptfs_engine::maintenance::schedule::Scheduler;
    let (gc, warn, publish, learn) = (fs.clone(), fs.clone(), fs.clone(), fs.clone());
    let s = Scheduler::default()
        .every("auto gc", 1, move || gc.auto_gc_tick())
        .every("target warnings", 1, move || {
            if let Some(e) = warn.space().report().erasure() {
                e.flush_warnings();
            }
        })
        .every("trims", 4, || {
            // Request buffers that waited in fuser's pool for a whole second (up to 64 MiB
            // after a burst of large writes) give their pages back.
            fuser::trim_idle_request_buffers();
            trim_heap();
        })
        .every("publish", 4, move || {
            if let Err(e) = publish.publish_pending() {
                log::warn!("publishing this slot's changes: {e}");
            }
        })
        .every_or_asked("learn removals", 4, move || learn.learn_removals());
    log::debug!("maintenance jobs: {:?}", s.names());
    fs.set_maintenance(s.wake());
    s.start()
}

/// The FUSE session's options for a mount of `backing` as `tuning` says.
pub(crate) fn fuse_config(backing: &Path, tuning: &Tuning, allow_other: bool) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("ckptfs:{}", backing.display())),
        fuser::MountOption::Subtype("ckptfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        // fuser mounts nosuid unless it sees Suid: set-user-ID files written by any user
        // of a checkpoint space do not gain privileges by exec unless the admin says so.
        if tuning.suid {
            fuser::MountOption::Suid
        } else {
            fuser::MountOption::NoSuid
        },
        if tuning.noexec {
            fuser::MountOption::NoExec
        } else {
            fuser::MountOption::Exec
        },
        if tuning.read_only {
            fuser::MountOption::RO
        } else {
            fuser::MountOption::RW
        },
    ];
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(tuning.threads as usize);
    config
}

/// Applies the mount's tuning to `space`: workers, the codec (recorded in the superblock),
/// the GPU stage, the cutter's confirmations; logs what the mount runs with.
pub(crate) fn configure_space(space: &mut Space, tuning: &Tuning) -> Result<(), CliError> {
    if let Some(w) = tuning.workers {
        space.tuning().set_workers(w as usize);
    }
    let codec = match &tuning.codec {
        Some(c) => c.clone(),
        // The GPU kernels the mount runs compress LZ4: asked for a GPU, a space whose
        // default is the float codec gets LZ4 (mixing codecs is fine: each chunk records
        // its own).
        None if matches!(tuning.gpu.as_str(), "on" | "emulate") => {
            log::info!(
                "--gpu {}: codec lz4 (the GPU stage compresses LZ4)",
                tuning.gpu
            );
            "lz4".to_string()
        }
        None if space
            .superblock()
            .features
            .contains(ckptfs_engine::format::Features::INCOMPAT_FLOAT_CODEC) =>
        {
            "float".to_string()
        }
        None => "lz4".to_string(),
    };
    let policy = ckptfs_engine::codec::Policy::parse(&codec)
        .ok_or_else(|| format!("unknown codec {codec:?}"))?;
    space
        .set_codec_policy(policy)
        .map_err(|e| format!("cannot record the codec in the superblock: {e}"))?;
    let gpu = choose_gpu(tuning, &codec)?;
    let compressor = gpu.as_ref().map_or("the CPU".to_string(), |g| g.describe());
    space.tuning().set_batch_codec(gpu);
    // A read-only mount writes no revision to predict, so it keeps no fingerprints.
    space
        .tuning()
        .confirm_by_fingerprint(tuning.confirm_by_fingerprint && !tuning.read_only);
    space.tuning().follow_changes(tuning.follow_changes);
    space.set_close_durable(tuning.close_durable);
    // The cutter's search is chosen by measuring the candidates once (a few ms): here, at
    // mount, rather than inside the first write, and said, since it differs by CPU.
    let search = ckptfs_engine::write::gear_search();
    log::info!(
        "{} FUSE threads, {} store workers, codec {}, new chunks compressed on {compressor}, \
         closes durable {}, cutter search {} ({})",
        tuning.threads,
        space.tuning().workers(),
        codec,
        match tuning.close_durable {
            true => "when they return",
            false => "at fsync and unmount",
        },
        search.name,
        search.measured
    );
    Ok(())
}

/// Raises the kernel's readahead for this mount to the request size we negotiated. The
/// kernel caps a FUSE mount's readahead at its block-device default (128 KiB), so without
/// this a sequential reader (a restart) gets its data in 128 KiB requests, each a round
/// trip through the daemon. The setting lives in sysfs (root only) and only sticks once the
/// kernel has processed the mount's INIT reply; a stat of the mountpoint waits for that.
pub(crate) fn set_readahead(mnt: &Path) {
    use std::os::unix::fs::MetadataExt;
    let dev = match std::fs::metadata(mnt) {
        Ok(m) => m.dev(),
        Err(e) => {
            log::warn!("cannot stat {} to set readahead: {e}", mnt.display());
            return;
        }
    };
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    let kb = fuse::MAX_WRITE_BYTES / 1024;
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => log::info!("readahead set to {kb} KiB ({path})"),
        Err(e) => log::info!("readahead left at the kernel default: cannot write {path}: {e}"),
    }
}

/// The signals that ask the daemon to unmount and exit.
pub(crate) fn termination_signals() -> libc::sigset_t {
    // SAFETY: plain sigset manipulation on a local, zero-initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks until a termination signal arrives. The signals are blocked in every thread (the
/// mask is set before the session's threads start), so only this wait receives them.
pub(crate) fn wait_for_termination() {
    let set = termination_signals();
    let mut sig = 0;
    // SAFETY: sigwait reads the set and writes the signal number into `sig`.
    unsafe { libc::sigwait(&set, &mut sig) };
}

/// Applies to this thread and the threads it spawns later.
pub(crate) fn block_termination_signals() {
    let set = termination_signals();
    // SAFETY: pthread_sigmask reads the set; the old mask is not requested.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Starts the daemon in its own session, logging to the space's log file, and waits until
/// it reports the mount ready (or fails, in which case its log is shown).
pub(crate) fn spawn_daemon(
    backing: &Path,
    mnt: &Path,
    allow_other: bool,
    tuning: &Tuning,
) -> Result<(), CliError> {
    // Refused here, before the daemon appends to the space's log.
    let sb = read_backing_dir(backing, !tuning.read_only).map_err(CliError::from)?;
    if sb.slots == 1 {
        check_not_locked(backing, tuning.read_only)?;
    } else if !tuning.read_only {
        slots::wait_for_own_exiting_daemon(backing, mnt)?;
    }
    // A read-only mount logs to the temporary directory, one file per space, so that
    // nothing in the backing directory changes.
    let log_path = if tuning.read_only {
        let uuid: String = sb.uuid[..8].iter().map(|b| format!("{b:02x}")).collect();
        std::env::temp_dir().join(format!("ckptfs-{uuid}-read-only.log"))
    } else {
        backing.join(ckptfs_engine::format::LOG_FILE)
    };
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(tuning.read_only)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(CliError::from)?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("--foreground").arg("--notify-ready");
    cmd.arg("--threads").arg(tuning.threads.to_string());
    if let Some(w) = tuning.workers {
        cmd.arg("--workers").arg(w.to_string());
    }
    if let Some(c) = &tuning.codec {
        cmd.arg("--codec").arg(c);
    }
    cmd.arg("--gpu").arg(&tuning.gpu);
    if !tuning.confirm_by_fingerprint {
        cmd.arg("--confirm").arg("blake3");
    }
    if !tuning.follow_changes {
        cmd.arg("--cuts").arg("content");
    }
    if !tuning.close_durable {
        cmd.arg("--durability").arg("fsync");
    }
    if tuning.close_to_open {
        cmd.arg("--coherence").arg("close-to-open");
    }
    if let Some(d) = &tuning.cuda_lib_dir {
        cmd.arg("--cuda-lib-dir").arg(d);
    }
    if allow_other {
        cmd.arg("--allow-other");
    }
    if tuning.read_only {
        cmd.arg("--read-only");
    }
    if let Some(n) = tuning.slot {
        cmd.arg("--slot").arg(n.to_string());
    }
    if tuning.take_over {
        cmd.arg("--take-over");
    }
    if tuning.no_probe {
        cmd.arg("--no-probe");
    }
    if tuning.remote_take_over {
        cmd.arg("--remote-take-over");
    }
    cmd.arg("--lease")
        .arg(format!("{}ms", tuning.lease.as_millis()));
    let kernel: Vec<&str> = [(tuning.suid, "suid"), (tuning.noexec, "noexec")]
        .into_iter()
        .filter_map(|(on, o)| on.then_some(o))
        .collect();
    if !kernel.is_empty() {
        cmd.arg("-o").arg(kernel.join(","));
    }
    cmd.arg(backing).arg(mnt);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "ckptfs=info,ckptfs_fs=info,ckptfs_engine=info");
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // SAFETY: setsid in the child between fork and exec only detaches it from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(MOUNT_TIMEOUT).unwrap_or_default();
    if line.trim() == "ready" {
        if tuning.read_only {
            println!(
                "ckptfs: mounted {} at {} read-only (log: {})",
                backing.display(),
                mnt.display(),
                log_path.display()
            );
        } else {
            println!("ckptfs: mounted {} at {}", backing.display(), mnt.display());
        }
        return Ok(());
    }
    let _ = child.kill();
    let _ = child.wait();
    let log_text = std::fs::read(&log_path).unwrap_or_default();
    let tail = String::from_utf8_lossy(&log_text[(log_start as usize).min(log_text.len())..]);
    Err(format!("mount failed:\n{}", tail.trim_end()).into())
}

/// Refuses a space another process holds before a daemon is started for it, so the refusal
/// leaves even the space's log untouched. The daemon's own lock is what really excludes a
/// second mount; this only makes the common case quiet and clear. A holder that is a
/// daemon whose mount is already gone (an unmount just returned, or `umount -l`) is exiting:
/// waited for, up to `EXITING_HOLDER_WAIT`, saying so, instead of refused.
pub(crate) fn check_not_locked(backing: &Path, read_only: bool) -> Result<(), CliError> {
    use std::os::unix::io::AsRawFd;
    // A read-only mount shares the space with other read-only ones: it probes for a
    // read-write holder only. A read-write mount probes for any holder.
    let want = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    let path = backing.join(ckptfs_engine::format::LOCK_FILE);
    let started = Instant::now();
    let deadline = started + EXITING_HOLDER_WAIT;
    let mut said = false;
    loop {
        let f = std::fs::File::open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: flock on an open descriptor; the probe's lock is released when `f` closes.
        if unsafe { libc::flock(f.as_raw_fd(), want | libc::LOCK_NB) } == 0 {
            if said {
                eprintln!("ckptfs: the previous daemon has exited");
            }
            return Ok(());
        }
        // SAFETY: as above.
        if !read_only && unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return Err(CliError::Engine(ckptfs_engine::Error::Locked(format!(
                "backing space {} is mounted read-only by another ckptfs process; unmount \
                 that first",
                backing.display()
            ))));
        }
        let holder = lock_holder(backing).unwrap_or_default();
        let holder = holder.trim();
        // "pid N mounted at MOUNTPOINT": exiting when MOUNTPOINT no longer mounts this space.
        let exiting = holder
            .split_once(" mounted at ")
            .is_some_and(|(_, m)| !mounts_space(Path::new(m), backing));
        if !exiting || Instant::now() >= deadline {
            return Err(CliError::Engine(ckptfs_engine::Error::Locked(format!(
                "backing space {} is in use by another ckptfs process ({holder}){}",
                backing.display(),
                if exiting {
                    format!("; it was unmounted but has not exited after {EXITING_HOLDER_WAIT:?}")
                } else {
                    String::new()
                }
            ))));
        }
        // A mount right after an unmount usually waits a few milliseconds: said only when
        // the wait is long enough to notice (a successful mount is otherwise quiet).
        if !said && started.elapsed() >= EXITING_HOLDER_NOTICE {
            eprintln!(
                "ckptfs: waiting for the daemon that held {} to exit ({holder}, unmounted)",
                backing.display()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long a mount waits for another live node to echo its coherence probe (each node
/// answers within `PROBE_ANSWER_INTERVAL` of the probe's write, for each probe in turn).
pub(crate) const PROBE_WAIT: Duration = Duration::from_secs(5);

/// How often a node reads the other slots' hints to echo their coherence probes: from its
/// claim on, so nodes that mount at the same moment answer each other while they set up
/// (before, answering began only once the mount was ready, and nodes started within a
/// second or so of each other all failed their probes). One 128-byte read a slot: at 1,024
/// slots 128 KiB, ten times a second on every node, so only while probes are about
/// (`PROBE_BUSY_FOR`); `PROBE_IDLE_INTERVAL` otherwise.
pub(crate) const PROBE_ANSWER_INTERVAL: Duration = Duration::from_millis(100);

/// How long after its claim, and after it last saw another slot's probe, a node reads the
/// hints every `PROBE_ANSWER_INTERVAL` (probers clear their probe when answered or given
/// up, so a probe in a hint is a node mounting now).
pub(crate) const PROBE_BUSY_FOR: Duration = Duration::from_secs(10);

/// How often a node reads the hints otherwise: a new probe is answered within about this,
/// well inside `PROBE_WAIT`, and a thousand idle nodes of a 1,024-slot space read 128 MiB/s
/// of hints instead of 1.3 GB/s.
pub(crate) const PROBE_IDLE_INTERVAL: Duration = Duration::from_secs(1);

/// Echoes the other nodes' coherence probes for as long as this mount holds `lease` (the
/// thread ends when the space drops it, or the lease is released or lost).
pub(crate) fn answer_probes_while_held(lease: &Arc<ckptfs_engine::slots::Lease>) {
    let held = Arc::downgrade(lease);
    std::thread::spawn(move || {
        let mut busy_until = Instant::now() + PROBE_BUSY_FOR;
        while let Some(l) = held.upgrade() {
            let r = l
                .table()
                .hints()
                .and_then(|h| l.answer_probes(&h).map_err(Into::into));
            match r {
                Ok(true) => busy_until = Instant::now() + PROBE_BUSY_FOR,
                Ok(false) => {}
                Err(e) => {
                    if l.fenced().is_some() {
                        return;
                    }
                    log::debug!("answering the other nodes' coherence probes: {e}");
                }
            }
            drop(l);
            std::thread::sleep(match Instant::now() < busy_until {
                true => PROBE_ANSWER_INTERVAL,
                false => PROBE_IDLE_INTERVAL,
            });
        }
    });
}

/// Refuses a mountpoint that is the backing directory, inside it or above it: the daemon
/// reads and writes its backing files by path, and with the mount over them each such call
/// would come back into the daemon itself (the first create hung for good while the kernel
/// held the directory's lock), or hide them from the daemon.
pub(crate) fn check_apart(backing: &Path, mnt: &Path) -> Result<(), CliError> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (b, m) = (real(backing), real(mnt));
    let why = if b == m {
        "is the backing directory itself"
    } else if m.starts_with(&b) {
        "is inside the backing directory"
    } else if b.starts_with(&m) {
        "is above the backing directory (the mount would hide it from the daemon)"
    } else {
        return Ok(());
    };
    Err(format!(
        "the mountpoint {} {why} ({}): mount the space somewhere outside it, e.g. \
         `ckptfs mount {} /ckpt`",
        mnt.display(),
        backing.display(),
        backing.display()
    )
    .into())
}

pub(crate) fn mounted_at(mnt: &Path) -> bool {
    backing_of(mnt).is_some()
}

pub(crate) fn umount(mnt: &Path) -> Result<(), CliError> {
    let mnt = absolute(mnt);
    if !mounted_at(&mnt) {
        return Err(format!("{} is not a ckptfs mount", mnt.display()).into());
    }
    // Asked of the daemon itself; else from the space's lock file, found through the
    // mount's fsname (a daemon from before the "pid" control request).
    let pid = control::send(&mnt, &control::Request::Pid)
        .ok()
        .and_then(|v| v.as_i64())
        .map(|p| p as i32)
        .or_else(|| daemon_pid(&mnt));
    // Everything committed, durable and published before the unmount, or said why not
    // (the daemon's own exit status does not reach this process). A daemon from before
    // this request answers nothing: its unmount logs what it could not do.
    let mut not_durable = match control::send(&mnt, &control::Request::Sync) {
        Ok(v) if v["ok"] == false => Some(v["error"].as_str().unwrap_or("unknown").to_string()),
        _ => None,
    };
    // The object-store tier: wait (with progress) until the bucket holds it all, or say what
    // it lacks (the daemon's own last try at exit is bounded and only logged).
    if not_durable.is_none() {
        if let Err(e) = crate::remote::wait_uploaded(&mnt, UMOUNT_TIMEOUT) {
            not_durable = Some(format!(
                "{e} (the local space holds it: mount it again to \
                                        finish the upload)"
            ));
        }
    }
    let status = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .or_else(|_| Command::new("umount").arg(&mnt).status())
        .map_err(|e| format!("cannot run fusermount3 or umount: {e}"))?;
    if !status.success() {
        return Err(format!("unmounting {} failed (files still open?)", mnt.display()).into());
    }
    if let Some(pid) = pid {
        let start = Instant::now();
        while ckptfs_engine::slots::process_runs(pid as u32) {
            if start.elapsed() > UMOUNT_TIMEOUT {
                return Err(format!("daemon {pid} did not exit after unmount").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    match not_durable {
        Some(why) => Err(format!(
            "unmounted {}, but not everything is durable: {why}; what was closed before \
             the failure is (`ckptfs check` tells what the space holds)",
            mnt.display()
        )
        .into()),
        None => Ok(()),
    }
}

pub(crate) fn daemon_pid(mnt: &Path) -> Option<i32> {
    let holder = lock_holder(&backing_of(mnt)?)?;
    holder.split_whitespace().nth(1)?.parse().ok()
}

/// Whether the mount at `mnt` is read-only (its `ro` mount flag, from mountinfo).
pub(crate) fn is_read_only_mount(mnt: &Path) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.to_string_lossy();
    s.lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 5 && f[4] == want)
        .is_some_and(|f| f[5].split(',').any(|o| o == "ro"))
}

/// Applies `-o` mount options (see the flag's help) over the flags' values.
pub(crate) fn apply_mount_options(
    options: &str,
    tuning: &mut Tuning,
    allow_other: &mut bool,
) -> Result<(), CliError> {
    const KNOWN: &str = "ro, rw, allow_other, threads=N, workers=N, codec=lz4|shuffle|float, \
                         gpu=auto|on|off|emulate, confirm=fingerprint|blake3, cuts=follow|content, durability=close|fsync, coherence=strict|close-to-open, cuda_lib_dir=DIR, slot=N, lease=DURATION, nosuid, \
                         noexec, suid, exec";
    for o in options.split(',').filter(|o| !o.is_empty()) {
        let (key, val) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o, None),
        };
        let number = |max: u32, min: u32| -> Result<u32, CliError> {
            Ok(val
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| format!("mount option {o:?}: {key} takes a number {min}..={max}"))?)
        };
        let one_of = |allowed: &[&str]| -> Result<String, CliError> {
            Ok(val
                .filter(|v| allowed.contains(v))
                .map(str::to_string)
                .ok_or_else(|| {
                    format!("mount option {o:?}: {key} is one of {}", allowed.join(", "))
                })?)
        };
        match (key, val) {
            ("ro", None) => tuning.read_only = true,
            ("rw", None) => tuning.read_only = false,
            ("allow_other", None) => *allow_other = true,
            ("nosuid", None) => tuning.suid = false,
            ("suid", None) => tuning.suid = true,
            ("noexec", None) => tuning.noexec = true,
            ("exec", None) => tuning.noexec = false,
            ("threads", _) => tuning.threads = number(64, 1)?,
            ("workers", _) => tuning.workers = Some(number(64, 0)?),
            ("codec", _) => tuning.codec = Some(one_of(&["lz4", "shuffle", "float"])?),
            ("gpu", _) => tuning.gpu = one_of(&["auto", "on", "off", "emulate"])?,
            ("confirm", _) => {
                tuning.confirm_by_fingerprint = one_of(&["fingerprint", "blake3"])? == "fingerprint"
            }
            ("cuts", _) => tuning.follow_changes = one_of(&["follow", "content"])? == "follow",
            ("durability", _) => tuning.close_durable = one_of(&["close", "fsync"])? == "close",
            ("coherence", _) => {
                tuning.close_to_open = one_of(&["strict", "close-to-open"])? == "close-to-open"
            }
            ("cuda_lib_dir", Some(d)) if !d.is_empty() => tuning.cuda_lib_dir = Some(d.into()),
            ("slot", _) => tuning.slot = Some(number(u32::MAX, 0)?),
            ("lease", Some(d)) => {
                tuning.lease = parse_lease(d).map_err(|e| format!("mount option {o:?}: {e}"))?
            }
            // Consumed by mount(8), fstab or the kernel's VFS, or meaningless for a FUSE
            // daemon (nodev: ckptfs always mounts nodev; atime: ckptfs keeps its own).
            (
                "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "owner" | "group"
                | "nofail" | "_netdev" | "dev" | "nodev" | "atime" | "noatime" | "relatime"
                | "norelatime" | "strictatime" | "nostrictatime" | "diratime" | "nodiratime"
                | "lazytime" | "nolazytime" | "async",
                None,
            ) => {}
            ("comment", Some(_)) => {}
            (k, _) if k.starts_with("x-") => {}
            _ => return Err(format!("unknown mount option {o:?} (known: {KNOWN})").into()),
        }
    }
    Ok(())
}

/// mount(8) runs `mount.fuse3 SOURCE MOUNTPOINT -o OPTS` for `-t fuse.ckptfs` (and fstab
/// lines of that type), which runs `ckptfs SOURCE MOUNTPOINT -o OPTS`: the mount command
/// without its name. Such a command line (a first argument that is neither a flag nor a
/// subcommand, and is a path or comes with `-o`) is read as `ckptfs mount ...`. A mistyped
/// subcommand (`ckptfs stat /ckpt x`) is left to clap, which names the right one.
pub(crate) fn helper_args(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    let Some(first) = args.get(1).and_then(|a| a.to_str().map(str::to_string)) else {
        return args;
    };
    let cmd = Cli::command();
    let known = first.starts_with('-')
        || first == "help"
        || cmd
            .get_subcommands()
            .any(|c| c.get_name() == first || c.get_all_aliases().any(|a| a == first));
    let helper_like = first.contains('/') || args.iter().any(|a| a == "-o");
    if known || !helper_like || args.len() < 3 {
        return args;
    }
    let mut out = Vec::with_capacity(args.len() + 1);
    out.push(args[0].clone());
    out.push("mount".into());
    out.extend(args[1..].iter().cloned());
    out
}

/// A lease: a duration as `parse_duration` reads it, or milliseconds (`500ms`).
pub(crate) fn parse_lease(s: &str) -> Result<Duration, CliError> {
    let d = match s.trim().strip_suffix("ms") {
        Some(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("not a duration: {s:?} (use 30s, 2m, 500ms)"))?,
        ),
        None => Duration::from_secs(parse_duration(s)?),
    };
    if d < ckptfs_engine::slots::MIN_LEASE {
        return Err(format!(
            "a lease of {d:?} is below the minimum of {:?}",
            ckptfs_engine::slots::MIN_LEASE
        )
        .into());
    }
    Ok(d)
}

/// Gives the pages of freed memory back to the kernel, once a second. glibc keeps what its
/// arenas freed (many threads allocate and free buffers of 64 KiB to 4 MiB), so the
/// daemon's resident memory only grew: the N-1 strided benchmark's peak went 228, 451, 632
/// MiB over three checkpoints in one mount, against 141 MiB live under jemalloc. A trim
/// walks the arenas' free lists (milliseconds at these sizes).
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
