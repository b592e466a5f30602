//! The backing directory's own files: the superblock, the lock, and the helpers every
//! layout opens its files with.

use super::*;

/// The nearest directory at or above `p` that exists (where a directory not made yet would
/// take its disk space from).
pub(crate) fn existing_ancestor(p: &Path) -> &Path {
    p.ancestors().find(|a| a.is_dir()).unwrap_or(Path::new("."))
}

pub(crate) fn open_private(path: &Path, create: bool) -> Result<File> {
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(path)?)
}

/// The superblock of backing directory `dir`, with a clear error when `dir` is missing.
/// The superblock of backing directory `dir`, refused with a clear error when `dir` is not a
/// space, or has feature flags this build cannot honour for the use (`writable`).
pub fn read_backing_dir(dir: &Path, writable: bool) -> Result<Superblock> {
    if !dir.is_dir() {
        return Err(Error::NotASpace(format!(
            "backing directory {} does not exist or is not a directory",
            dir.display()
        )));
    }
    let sb = read_superblock(dir)?;
    let unknown = sb.features.unknown();
    if unknown.incompat != 0 {
        return Err(Error::NotASpace(format!(
            "{} uses features this ckptfs does not know (incompatible feature flags {:#x}); \
             use the ckptfs that made it, or a newer one",
            dir.display(),
            unknown.incompat
        )));
    }
    if writable && unknown.ro_compat != 0 {
        return Err(Error::Invalid(format!(
            "{} uses features this ckptfs can read but not write (read-only compatible \
             feature flags {:#x}); mount it with --read-only, or use a newer ckptfs",
            dir.display(),
            unknown.ro_compat
        )));
    }
    Ok(sb)
}

/// Writes superblock `sb` into `dir` so that a crash leaves the old one or the new one:
/// a temporary file, fsynced, renamed over the old, and the directory fsynced.
pub(crate) fn write_superblock(dir: &Path, sb: &Superblock) -> Result<()> {
    let tmp = dir.join("superblock.tmp");
    let mut f = open_private(&tmp, true)?;
    f.write_all(&sb.encode())?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(SUPERBLOCK_FILE))?;
    sync_dir(dir)
}

/// Makes the journal file of a single-slot space (`catalog::journal`): written with zeros
/// (so a sync of a record is the disk's flush, with no block to allocate), synced, and
/// renamed into place; the caller flags the superblock after.
pub(crate) fn create_journal(dir: &Path) -> Result<()> {
    let tmp = dir.join("journal.tmp");
    let mut f = open_private(&tmp, true)?;
    f.set_len(0)?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = crate::catalog::journal::JOURNAL_BYTES;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    fs::rename(&tmp, dir.join(JOURNAL_FILE))?;
    sync_dir(dir)
}

/// The journal of the single-slot space `sb` in `dir`, made first if the space was
/// formatted before journals (its superblock flagged then, `sb` updated). A flagged space
/// without the file is refused: its closes since the last checkpoint are there.
pub(crate) fn journal_file(
    dir: &Path,
    sb: &mut Superblock,
    writable: bool,
) -> Result<Option<File>> {
    let path = dir.join(JOURNAL_FILE);
    let flagged = sb.features.contains(Features::INCOMPAT_JOURNAL);
    if !path.exists() {
        if flagged {
            return Err(Error::NotASpace(format!(
                "{} is a ckptfs space missing its journal {} (removed, or the directory is \
                 incomplete): the closes made durable since its last checkpoint are there, \
                 so it is not opened without it",
                dir.display(),
                path.display()
            )));
        }
        if !writable {
            return Ok(None);
        }
        create_journal(dir)?;
        let flagged = sb.with_features(Features::INCOMPAT_JOURNAL);
        write_superblock(dir, &flagged)?;
        log::info!(
            "made the journal {} (closes now cost one sync)",
            path.display()
        );
        *sb = flagged;
    }
    let f = match writable {
        true => open_private(&path, false)?,
        false => File::open(&path)?,
    };
    Ok(Some(f))
}

/// The error for a directory without a lock file.
pub(crate) fn no_lock_file(dir: &Path) -> Error {
    Error::NotASpace(format!(
        "{} is not a ckptfs backing space (no lock file); run `ckptfs format {}`",
        dir.display(),
        dir.display()
    ))
}

/// Takes the space's lock without blocking; the lock file says who holds it.
pub(crate) fn take_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let mut f = open_private(&path, false).map_err(|e| match e {
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => no_lock_file(dir),
        other => other,
    })?;
    // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        // Held shared: read-only mounts, which leave no note in the file (the note there is
        // an earlier holder's).
        let probe = File::open(&path)?;
        // SAFETY: as above; the probe's lock goes with `probe`.
        if unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return Err(Error::Locked(format!(
                "backing space {} is mounted read-only by another ckptfs process; unmount \
                 that first",
                dir.display()
            )));
        }
        let mut who = String::new();
        let _ = f.read_to_string(&mut who);
        return Err(Error::Locked(format!(
            "backing space {} is in use by another ckptfs process ({})",
            dir.display(),
            who.trim()
        )));
    }
    Ok(f)
}

/// The lock of a read-only open: shared with other read-only opens, refused while a
/// read-write holder has the space. Opens the lock file read-only and writes nothing.
pub(crate) fn take_shared_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let f = File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => no_lock_file(dir),
        _ => Error::from(e),
    })?;
    // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        return Err(Error::Locked(format!(
            "backing space {} is in use by another ckptfs process ({}); a read-only mount \
             needs it unmounted",
            dir.display(),
            lock_holder(dir).unwrap_or_default().trim()
        )));
    }
    Ok(f)
}

/// Reads the lock file of a space, which names the process and mountpoint holding it.
pub fn lock_holder(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join(LOCK_FILE))
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// Adds `features` to the superblock of the unmounted space in `dir` (`format --codec
/// float` marks a space it has just made).
pub fn mark_features(dir: &Path, features: Features) -> Result<()> {
    let sb = read_superblock(dir)?;
    if !sb.features.contains(features) {
        write_superblock(dir, &sb.with_features(features))?;
    }
    Ok(())
}

pub fn read_superblock(dir: &Path) -> Result<Superblock> {
    let path = dir.join(SUPERBLOCK_FILE);
    match fs::read(&path) {
        Ok(b) => Superblock::decode(&b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotASpace(format!(
            "{} is not a ckptfs backing space (no superblock); run `ckptfs format {}`",
            dir.display(),
            dir.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Bytes available to unprivileged users on the filesystem holding `dir`.
pub fn free_disk_bytes(dir: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Invalid("path contains a NUL byte".into()))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

pub(crate) fn multi_slot_refusal(dir: &Path, sb: &Superblock) -> Error {
    Error::Invalid(format!(
        "{} has {} slots, each mounted by its own node: run this through a mountpoint \
         (it acts on that mount's slot); `ckptfs slots {}` lists them",
        dir.display(),
        sb.slots,
        dir.display()
    ))
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Reserves `len` bytes for `f` (fallocate; a sparse file where the filesystem cannot) and
/// makes the size durable.
pub(crate) fn preallocate(f: &File, len: u64) -> Result<()> {
    // SAFETY: fallocate on a valid descriptor; arguments are plain integers.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            log::warn!("fallocate is not supported here; the file is sparse");
            f.set_len(len)?;
        } else {
            return Err(e.into());
        }
    }
    f.sync_all()?;
    Ok(())
}
