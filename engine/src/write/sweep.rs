//! Bounds over all open files together, and the retry of a write the space had no room for.
//!
//! A file state bounds its own memory, but its pieces are retired only by its own next write
//! or close: with a thousand files written in turn each held its last requests, and the
//! daemon's memory grew with the number of files (3 GiB for 1024 files written 1 MiB at a
//! time). `Sweeper` makes the open files let go of what they need not hold, as bytes are
//! written. The open-file table is the filesystem's; it lends the files through `OpenFiles`.

use super::{ChunkIo, FileState};
use crate::error::{Error, Result};
use crate::format::InodeId;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The open files' memory is swept after this many bytes were written (by anyone).
pub const SWEEP_EVERY_BYTES: u64 = 32 << 20;

/// What the files open for writing may hold in stream buffers, dirty blocks and pieces not
/// yet retired, all together, before a sweep also hands their stream buffers and dirty
/// blocks to the workers (`FileState::release`).
pub const HELD_BYTES: usize = 128 << 20;

/// Light sweeps per full sweep: one every 4 MiB written.
const LIGHT_SWEEPS: u64 = 8;

/// Times one write or commit asks gc for room before its ENOSPC stands: each time gc did
/// free space, which other writers may have taken first.
pub const ROOM_RETRIES: u32 = 32;

/// The open files, as the filesystem's table lends them to a sweep.
pub trait OpenFiles {
    /// Calls `f` with each open file (`None`: every one; else those of `inos` still open)
    /// and its state if it can be had without waiting (`None`: busy, being written right
    /// now, and letting go of its own bytes). Not under the table's lock: the writers
    /// take that lock to find their file.
    fn each_open(
        &self,
        inos: Option<&[InodeId]>,
        f: &mut dyn FnMut(InodeId, Option<&mut FileState>),
    );
}

/// The memory sweeps' state (one per mount).
pub struct Sweeper {
    /// Bytes written since the last sweep.
    written: AtomicU64,
    /// Held by the thread sweeping (one at a time; the others go on writing).
    sweeping: Mutex<()>,
    /// Files written since a sweep last found them holding nothing in flight: what the
    /// light sweep visits. At most the open files.
    pending: Mutex<HashSet<InodeId>>,
    /// Light sweeps since the last full one.
    light: AtomicU64,
    /// `SWEEP_EVERY_BYTES` and `HELD_BYTES` unless a test sets them (`set_limits`).
    every: AtomicU64,
    held_limit: AtomicUsize,
}

impl Default for Sweeper {
    fn default() -> Self {
        Sweeper {
            written: AtomicU64::new(0),
            sweeping: Mutex::new(()),
            pending: Mutex::default(),
            light: AtomicU64::new(0),
            every: AtomicU64::new(SWEEP_EVERY_BYTES),
            held_limit: AtomicUsize::new(HELD_BYTES),
        }
    }
}

impl Sweeper {
    /// Sweeps every `every` bytes written, handing over streams and dirty blocks past `held`
    /// bytes (the open-table stress test sweeps on every write, racing the other threads).
    pub fn set_limits(&self, every: u64, held: usize) {
        self.every.store(every, Relaxed);
        self.held_limit.store(held, Relaxed);
    }

    /// File `ino` took `written` bytes. Every `SWEEP_EVERY_BYTES` written, a full sweep has
    /// the other open files let go of what they need not hold (`FileState::release`); past
    /// `HELD_BYTES` in all, their stream buffers and dirty blocks go to the workers too.
    ///
    /// In between, every `SWEEP_EVERY_BYTES / LIGHT_SWEEPS` written, a light sweep visits
    /// only the files written since they last held nothing in flight and retires what their
    /// pieces finished. A file's pieces otherwise waited for the next full sweep: with
    /// thousands of files written a little each, a full sweep's worth of writes (and the
    /// writes during a sweep of every open file) kept their buffers, 200 MiB at 16384 files.
    pub fn wrote(&self, ino: InodeId, written: usize, files: &dyn OpenFiles, c: &dyn ChunkIo) {
        self.pending.lock().insert(ino);
        let before = self.written.fetch_add(written as u64, Relaxed);
        let every = (self.every.load(Relaxed) / LIGHT_SWEEPS).max(1);
        if before + (written as u64) < every {
            return;
        }
        let Some(_one) = self.sweeping.try_lock() else {
            return;
        };
        self.written.store(0, Relaxed);
        if self.light.fetch_add(1, Relaxed) + 1 < LIGHT_SWEEPS {
            self.light_sweep(files, c);
            return;
        }
        self.light.store(0, Relaxed);
        let (mut n, mut held) = (0, 0);
        files.each_open(None, &mut |_, s| {
            n += 1;
            // An error (a piece the space had no room for) stays with the file, whose own
            // next write or close hands the piece over again and reports it.
            if let Some(s) = s {
                let _ = s.release(c, false);
                held += s.held_bytes();
            }
        });
        log::debug!("memory sweep: {n} open files hold {} MiB", held >> 20);
        if n >= 2 && held > self.held_limit.load(Relaxed) {
            files.each_open(None, &mut |_, s| {
                if let Some(s) = s {
                    let _ = s.release(c, true);
                }
            });
        }
    }

    /// Retires the finished pieces of the files written lately; files that still hold pieces
    /// in flight (or are busy) stay for the next sweep.
    fn light_sweep(&self, files: &dyn OpenFiles, c: &dyn ChunkIo) {
        let inos: Vec<InodeId> = self.pending.lock().drain().collect();
        let mut again = Vec::new();
        files.each_open(Some(&inos), &mut |ino, s| match s {
            Some(s) => {
                // An error stays with the file (see the full sweep).
                let _ = s.release(c, false);
                if s.has_pieces_in_flight() {
                    again.push(ino);
                }
            }
            None => again.push(ino),
        });
        self.pending.lock().extend(again);
    }
}

/// Runs `op` on `file`; when it fails for want of space, asks `room` (a gc under pressure)
/// and, as long as that made room, lets the file's failed pieces be stored again and runs
/// `op` again, at most `ROOM_RETRIES` times. `op` must be safe to repeat: writing the same
/// bytes at the same offset is idempotent, and so is settling a file. Each `room` that
/// returns true freed or found space, and what is freed is bounded, so the loop ends.
pub fn with_room<T>(
    file: &mut FileState,
    mut op: impl FnMut(&mut FileState) -> Result<T>,
    room: impl Fn() -> bool,
) -> Result<T> {
    let mut tries = 0;
    loop {
        match op(file) {
            Err(Error::NoSpace) if tries < ROOM_RETRIES && room() => {
                tries += 1;
                file.retry_failed();
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pins::ChunkPins;
    use crate::write::tests::MemChunks;
    use crate::write::ExtentMap;
    use std::cell::Cell;

    fn file() -> FileState {
        FileState::new(
            crate::write::tests::params(),
            ExtentMap::new(),
            0,
            ChunkPins::detached(),
        )
    }

    /// The retry ends: on success, on another error, when gc made no room, and after
    /// `ROOM_RETRIES` rooms that did not help (other writers took them).
    #[test]
    fn a_write_without_room_is_retried_while_gc_makes_room_and_no_longer() {
        let (calls, rooms) = (Cell::new(0u32), Cell::new(0u32));
        let fail_until = |n: u32| {
            let calls = &calls;
            move |_: &mut FileState| -> Result<u32> {
                calls.set(calls.get() + 1);
                if calls.get() <= n {
                    Err(Error::NoSpace)
                } else {
                    Ok(calls.get())
                }
            }
        };
        let room = |made: bool| {
            let rooms = &rooms;
            move || {
                rooms.set(rooms.get() + 1);
                made
            }
        };
        let mut f = file();
        assert_eq!(with_room(&mut f, fail_until(3), room(true)).unwrap(), 4);
        assert_eq!(rooms.get(), 3);
        calls.set(0);
        rooms.set(0);
        assert!(matches!(
            with_room(&mut f, fail_until(3), room(false)),
            Err(Error::NoSpace)
        ));
        assert_eq!(
            (calls.get(), rooms.get()),
            (1, 1),
            "no room: ENOSPC at once"
        );
        calls.set(0);
        rooms.set(0);
        assert!(matches!(
            with_room(&mut f, fail_until(1000), room(true)),
            Err(Error::NoSpace)
        ));
        assert_eq!((calls.get(), rooms.get()), (ROOM_RETRIES + 1, ROOM_RETRIES));
        let other = |_: &mut FileState| -> Result<()> { Err(Error::ReadOnly) };
        rooms.set(0);
        assert!(matches!(
            with_room(&mut f, other, room(true)),
            Err(Error::ReadOnly)
        ));
        assert_eq!(rooms.get(), 0, "only ENOSPC asks gc");
    }

    /// A table of open files, some busy.
    struct Table(Vec<(InodeId, Mutex<FileState>)>);

    impl OpenFiles for Table {
        fn each_open(
            &self,
            inos: Option<&[InodeId]>,
            f: &mut dyn FnMut(InodeId, Option<&mut FileState>),
        ) {
            for (ino, s) in &self.0 {
                if inos.is_none_or(|l| l.contains(ino)) {
                    match s.try_lock() {
                        Some(mut s) => f(*ino, Some(&mut s)),
                        None => f(*ino, None),
                    }
                }
            }
        }
    }

    /// Sweeps come after the bytes they are set for, light ones visit the files written
    /// since, and a busy file is kept for the next light sweep rather than waited for.
    #[test]
    fn sweeps_come_by_bytes_written_and_skip_busy_files() {
        let c = MemChunks::default();
        let t = Table((1..=3).map(|i| (InodeId(i), Mutex::new(file()))).collect());
        let s = Sweeper::default();
        s.set_limits(LIGHT_SWEEPS * 10, 0);
        s.wrote(InodeId(1), 9, &t, &c);
        assert_eq!(
            s.light.load(Relaxed),
            0,
            "under a light sweep's bytes: nothing"
        );
        let busy = t.0[1].1.lock();
        s.wrote(InodeId(2), 1, &t, &c);
        assert_eq!(s.light.load(Relaxed), 1);
        assert_eq!(
            s.pending.lock().iter().copied().collect::<Vec<_>>(),
            vec![InodeId(2)],
            "the busy file waits for the next sweep; the free one is done"
        );
        drop(busy);
        for _ in 0..LIGHT_SWEEPS {
            s.wrote(InodeId(3), 10, &t, &c);
        }
        assert_eq!(
            s.light.load(Relaxed),
            1,
            "a full sweep came and the count began again"
        );
        assert!(s.pending.lock().is_empty());
    }
}
