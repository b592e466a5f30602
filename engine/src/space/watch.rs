//! The backing directory's own files, looked at while mounted: the data file, the metadata
//! table and the placement records (`device::PathWatched`), and the lock. What is done to
//! them from outside while a space is mounted (a cleanup that deletes them, a restore that
//! renames a copy over them, a stray `rm` of the lock) shows in no I/O: writes into a
//! removed file succeed, and a second mount can take a new lock file. So the space looks:
//! at every status report (`stats`, `targets`), and before a commit at most once per
//! `device::WATCH_INTERVAL`. Not on a timer while idle: a job's mount sits idle between
//! checkpoints most of the time, and a look is a stat per file on what is often a parallel
//! filesystem's metadata server; an idle mount acknowledges nothing, and its next commit
//! looks first. The cost is time-bound, never per checkpoint file: three stats and fstats
//! a second at most while committing.

use super::Space;
use crate::device::{FileNow, PathNow, PathWatched, WatchClock};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a space opened for writing watches in its backing directory.
#[derive(Default)]
pub(crate) struct BackingWatch {
    pub(crate) files: Vec<Arc<PathWatched>>,
    /// The lock file of a single-slot space (a multi-slot space's slots are held by leases).
    pub(crate) lock_path: Option<PathBuf>,
    /// The commits' rate limit (`Space::watch_backing_due`).
    clock: WatchClock,
    /// A lock file problem that is only logged was logged (once per mount: a look runs
    /// up to once a second).
    lock_warned: AtomicBool,
}

impl Space {
    /// Looks at the backing directory's files now. A lost data file, table or placement
    /// file fails the space (every change refused until remount, the status says why): what
    /// it would acknowledge from now on would not be there after the unmount. A lock file
    /// removed or replaced is taken again where nobody else holds it; where another process
    /// holds the new one (a second mount got in), the space fails too, so the two never
    /// both change it.
    pub(crate) fn watch_backing(&self) {
        for f in &self.watch.files {
            if let Some(why) = f.look() {
                self.store.fail_because(why);
            }
        }
        self.watch_lock();
    }

    /// `watch_backing` at most once per `device::WATCH_INTERVAL`: before commits.
    pub(crate) fn watch_backing_due(&self) {
        if !self.read_only && self.watch.clock.due() {
            self.watch_backing();
        }
    }

    fn watch_lock(&self) {
        let Some(path) = &self.watch.lock_path else {
            return;
        };
        let mut lock = self.lock.lock();
        let Some(held) = lock.as_ref() else {
            return;
        };
        let now = match held.metadata() {
            Ok(m) => FileNow::of(&m),
            Err(e) => {
                log::warn!("lock file {}: fstat: {e}", path.display());
                return;
            }
        };
        let what = match now.at(path) {
            Ok(PathNow::Replaced) => "replaced by another file",
            _ if now.links == 0 => "removed",
            Ok(PathNow::Same) => return,
            // Still linked, elsewhere: it moved with its directory (the data file's watch
            // logs that), and this mount still holds its lock, which a second mount at the
            // new path finds held; at the old path a mount finds no lock file and refuses.
            Ok(PathNow::Removed) => return,
            Err(e) => {
                if !self.watch.lock_warned.swap(true, Ordering::Relaxed) {
                    log::warn!("lock file {}: stat: {e}", path.display());
                }
                return;
            }
        };
        // The note the mount left there ("pid N mounted at M": what `umount` and the
        // refusal of a second mount tell from it), carried over.
        // Through /proc: the open file, even unlinked, from its start.
        let note =
            std::fs::read(format!("/proc/self/fd/{}", held.as_raw_fd())).unwrap_or_else(|e| {
                log::warn!("lock file {}: reading its note: {e}", path.display());
                format!("pid {}", std::process::id()).into_bytes()
            });
        match retake(path, &note) {
            Ok(f) => {
                log::warn!(
                    "lock file {} was {what} while mounted: a second mount could have \
                     taken the space; this mount holds the lock at that path again",
                    path.display()
                );
                *lock = Some(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The directory itself is gone: the data file's and the table's watch fail
                // the space; a lock cannot be made there, and no mount can open it.
                if !self.watch.lock_warned.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "lock file {} was {what} while mounted, and cannot be made again: {e}",
                        path.display()
                    );
                }
            }
            Err(e) => self.store.fail_because(&format!(
                "the lock file {} was {what} while mounted, and this mount cannot hold the \
                 lock there again ({e}): another process (a second mount?) holds it, so this \
                 mount refuses every change from now on; unmount it",
                path.display()
            )),
        }
    }
}

/// Opens (or makes) the lock file at `path`, takes its exclusive lock and writes `note`
/// there. Err(WouldBlock): another process holds it.
fn retake(path: &std::path::Path, note: &[u8]) -> std::io::Result<File> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    f.set_len(0)?;
    f.write_all(note)?;
    Ok(f)
}
