//! Carried chunks beyond a memory budget: each file being written sequentially has a cutter
//! that carries its stream's unfinished last chunk from one write to the next (the chunk's
//! end is not known until more bytes come; `write::CutState`). That is up to a maximum
//! chunk per file (about 60 KiB on average with 64 KiB chunks), so without a bound the
//! daemon's memory grew with the number of files written at once: 4096 files peaked at
//! 636 MiB. Cutting the carries early instead would change chunk boundaries and lose dedup
//! (15-26% measured), so past `CARRY_BYTES` the carries of files not being cut that moment
//! go to a spill file, least recently cut first, and come back at their file's next cut (or
//! read). Nothing about chunk boundaries changes.
//!
//! The spill file is an unlinked file in the backing directory (gone with the process, so a
//! crash leaves nothing to clean up), written and read through the page cache: the kernel
//! can write it out and drop it under memory pressure, which it cannot do with the daemon's
//! own memory. Its slots are as long as the longest carry (`write::longest_carry`: four
//! maximum chunks, what a cutter looking past a changed chunk may carry), reused most
//! recently freed first (their pages are likely cached); the file is emptied whenever no
//! carry is in it, so it takes disk space for at most the most carries spilled at once
//! (written only as far as each carry goes: mostly less than a maximum chunk). Every carry is checked against its blake3 hash when it
//! comes back: a carry that cannot be read back whole fails its file's writes with EIO,
//! never wrong bytes.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// What the carries of all files may hold in memory together (their buffers' capacity).
/// 64 MiB: about a thousand files written at once keep their carries in memory (at about
/// 60 KiB each), so only wider jobs pay for spilling, and those pay at most a carry's write
/// and read through the page cache per request.
pub const CARRY_BYTES: usize = 64 << 20;

/// Free space the spill file leaves on the backing filesystem beside a metadata table of
/// `table_len` bytes: no carry is spilled when less would be left. The table grows on that
/// filesystem too and keeps its next growth allocated there (`device::TableRoom`); when it
/// grows into that room it allocates the growth after it, and a spill file that had taken
/// those blocks would make the space refuse new data (ENOSPC) for its own temporary bytes.
/// So the spill leaves two of the table's growths free (the one after next too), and never
/// less than `SPILL_KEEP_FREE_MIN`. Before the table kept room, a spill file that took the
/// last free blocks failed the whole space in a test (a 700 MiB tmpfs, 8192 files written
/// at once). A fixed 1 GiB was left before this followed the table: on a CI machine whose
/// disk had 1 GiB free, a 512 MiB space with a 2 MiB table kept every carry in memory
/// and its daemon peaked at 779 MiB. Below the reserve, carries stay in memory.
pub(crate) fn spill_keep_free(table_len: u64) -> u64 {
    (2 * crate::device::table_growth(table_len)).max(SPILL_KEEP_FREE_MIN)
}

/// The least free space the spill file leaves (`spill_keep_free`): room for the table's
/// growths of a small space and for whatever else writes to the backing filesystem (the
/// space's lock and superblock updates, logs).
pub(crate) const SPILL_KEEP_FREE_MIN: u64 = 128 << 20;

/// How much free space the spill file leaves, asked before every spill (the table grows).
pub(crate) type KeepFree = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A carry that can be spilled: the cutter state holding it.
pub trait Spill: Send + Sync {
    /// Moves the carry registered under `gen` to the spill file, if it is still the
    /// state's carry and no cutter is running on it; returns the bytes it spilled.
    fn spill(&self, gen: u64, to: &Arc<SpillFile>) -> Option<usize>;
    /// Whether the carry registered under `gen` is still the state's carry, in memory.
    fn current(&self, gen: u64) -> bool;
}

/// The carries of all cutters of one pipeline: what they hold in memory, the order to
/// spill them in, and the spill file.
pub struct Carries {
    budget: usize,
    /// Bytes charged by carries in memory (`Charge`), and how many carries that is.
    resident: AtomicUsize,
    count: AtomicUsize,
    /// Carries in memory, least recently cut first, as (state, generation) entries: an
    /// entry whose generation is no longer its state's is stale and skipped. Compacted once
    /// it is more than twice the carries in memory (plus a slack), so it stays bounded.
    order: Mutex<VecDeque<(Weak<dyn Spill>, u64)>>,
    /// Where to create the spill file (the backing directory), its slot size and the free
    /// space it leaves; none: carries stay in memory.
    dir: Mutex<Option<(PathBuf, usize, KeepFree)>>,
    file: Mutex<Option<Arc<SpillFile>>>,
    /// The spill file could not be created: carries stay in memory (logged once).
    no_file: std::sync::atomic::AtomicBool,
    pub spilled: AtomicU64,
    pub spilled_bytes: AtomicU64,
    pub loaded: AtomicU64,
}

impl Carries {
    pub fn new(budget: usize) -> Arc<Carries> {
        Arc::new(Carries {
            budget,
            resident: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            order: Mutex::new(VecDeque::new()),
            dir: Mutex::new(None),
            file: Mutex::new(None),
            no_file: Default::default(),
            spilled: AtomicU64::new(0),
            spilled_bytes: AtomicU64::new(0),
            loaded: AtomicU64::new(0),
        })
    }

    /// Lets carries spill to an unlinked file in `dir`, in slots of `slot_bytes` (the
    /// longest carry: one that is longer stays in memory), leaving the free
    /// space that the metadata table on `table` needs for its growth (`spill_keep_free`).
    pub(crate) fn spill_to(
        &self,
        dir: &Path,
        slot_bytes: usize,
        table: Arc<dyn crate::device::Device>,
    ) {
        self.spill_to_keeping(
            dir,
            slot_bytes,
            Arc::new(move || spill_keep_free(table.len())),
        );
    }

    /// `spill_to`, leaving what `keep_free` says free on the filesystem (tests).
    pub(crate) fn spill_to_keeping(&self, dir: &Path, slot_bytes: usize, keep_free: KeepFree) {
        *self.dir.lock() = Some((
            dir.to_path_buf(),
            slot_bytes.next_multiple_of(4096),
            keep_free,
        ));
    }

    /// Bytes the carries hold in memory now.
    pub fn resident_bytes(&self) -> usize {
        self.resident.load(Ordering::Relaxed)
    }

    /// What `ckptfs stats` reports of the carries.
    pub fn totals(&self) -> CarryTotals {
        CarryTotals {
            resident_bytes: self.resident_bytes() as u64,
            resident: self.count.load(Ordering::Relaxed) as u64,
            spilled_now_bytes: self
                .file
                .lock()
                .as_ref()
                .map_or(0, |f| f.in_use.load(Ordering::Relaxed) as u64),
            spills: self.spilled.load(Ordering::Relaxed),
            spilled_bytes: self.spilled_bytes.load(Ordering::Relaxed),
            loads: self.loaded.load(Ordering::Relaxed),
        }
    }

    /// Charges `bytes` of a carry in memory until the charge is dropped.
    pub(crate) fn charge(self: &Arc<Self>, bytes: usize) -> Charge {
        self.resident.fetch_add(bytes, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        Charge {
            carries: self.clone(),
            bytes,
        }
    }

    /// Notes that `state` was just cut and holds a carry under `gen`: it is spilled last.
    pub fn touch(&self, state: Weak<dyn Spill>, gen: u64) {
        let mut order = self.order.lock();
        order.push_back((state, gen));
        let live = self.count.load(Ordering::Relaxed);
        if order.len() > 2 * live + 1024 {
            order.retain(|(w, g)| w.upgrade().is_some_and(|s| s.current(*g)));
        }
    }

    /// Spills carries, least recently cut first, until those in memory are within the
    /// budget (or none is left to spill).
    pub fn trim(&self) {
        if self.resident.load(Ordering::Relaxed) <= self.budget {
            return;
        }
        let Some(file) = self.file() else { return };
        while self.resident.load(Ordering::Relaxed) > self.budget {
            let Some((w, gen)) = self.order.lock().pop_front() else {
                return;
            };
            // Stale entries (the state was cut again, or is gone) and states being cut
            // now (they are touched again when that cut ends) are skipped.
            if let Some(bytes) = w.upgrade().and_then(|s| s.spill(gen, &file)) {
                self.spilled.fetch_add(1, Ordering::Relaxed);
                self.spilled_bytes
                    .fetch_add(bytes as u64, Ordering::Relaxed);
            }
        }
    }

    /// Overwrites every slot of the spill file (tests: a disk that lost its pages).
    #[cfg(test)]
    pub(crate) fn damage_spill_file(&self) {
        let f = self.file.lock().clone().expect("a spill file");
        let next = f.free.lock().1;
        let junk = vec![0xa5u8; f.slot_bytes];
        for slot in 0..next {
            f.file
                .write_all_at(&junk, slot * f.slot_bytes as u64)
                .unwrap();
        }
    }

    /// The spill file, created at the first spill.
    fn file(&self) -> Option<Arc<SpillFile>> {
        if self.no_file.load(Ordering::Relaxed) {
            return None;
        }
        let mut file = self.file.lock();
        if let Some(f) = &*file {
            return Some(f.clone());
        }
        let (dir, slot_bytes, keep_free) = self.dir.lock().clone()?;
        match SpillFile::create(&dir, slot_bytes, keep_free) {
            Ok(f) => {
                log::info!(
                    "more than {} MiB of carried chunks (many files written at once): the \
                     carries of files not being written now go to an unlinked spill file in {}",
                    self.budget >> 20,
                    dir.display()
                );
                let f = Arc::new(f);
                *file = Some(f.clone());
                Some(f)
            }
            Err(e) => {
                log::warn!(
                    "cannot create a spill file in {} ({e}): carried chunks stay in memory, \
                     so memory grows with the number of files written at once",
                    dir.display()
                );
                self.no_file.store(true, Ordering::Relaxed);
                None
            }
        }
    }
}

/// The carries as `ckptfs stats` reports them: in memory now, in the spill file now, and
/// spills and loads since the space was opened.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CarryTotals {
    pub resident_bytes: u64,
    pub resident: u64,
    pub spilled_now_bytes: u64,
    pub spills: u64,
    pub spilled_bytes: u64,
    pub loads: u64,
}

/// A carry's bytes in memory, charged to `Carries` until dropped.
pub(crate) struct Charge {
    carries: Arc<Carries>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.carries
            .resident
            .fetch_sub(self.bytes, Ordering::Relaxed);
        self.carries.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The spill file: slots of `slot_bytes`, each free or holding one carry.
pub struct SpillFile {
    file: File,
    slot_bytes: usize,
    /// Free space to leave on the filesystem (`spill_keep_free`).
    keep_free: KeepFree,
    /// Free slots below `next` (most recently freed last: reused first, while their pages
    /// may still be cached), and the first slot never used.
    free: Mutex<(Vec<u64>, u64)>,
    /// Bytes of the carries in the file now.
    in_use: AtomicUsize,
    /// A failed write was logged (once: a full disk fails every spill).
    warned: std::sync::atomic::AtomicBool,
    /// Spills refused for want of free space were logged (once).
    low_space_warned: std::sync::atomic::AtomicBool,
}

impl SpillFile {
    fn create(dir: &Path, slot_bytes: usize, keep_free: KeepFree) -> std::io::Result<SpillFile> {
        use std::os::unix::fs::OpenOptionsExt;
        // O_TMPFILE: the file never has a name, so the backing directory's listing does not
        // change (FORMAT.md) and a crash leaves nothing behind. Filesystems without it
        // (NFS, some parallel filesystems) keep carries in memory instead (logged).
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)?;
        Ok(SpillFile {
            file,
            slot_bytes,
            keep_free,
            free: Mutex::new((Vec::new(), 0)),
            in_use: AtomicUsize::new(0),
            warned: Default::default(),
            low_space_warned: Default::default(),
        })
    }

    /// Writes `bytes` to a free slot; `None` if they do not fit a slot or the write fails
    /// (a full disk: the carry stays in memory).
    pub fn store(self: &Arc<Self>, bytes: &[u8]) -> Option<SpillSlot> {
        if bytes.is_empty() || bytes.len() > self.slot_bytes || !self.room() {
            return None;
        }
        let slot = {
            let mut free = self.free.lock();
            match free.0.pop() {
                Some(s) => s,
                None => {
                    free.1 += 1;
                    free.1 - 1
                }
            }
        };
        let slot = SpillSlot {
            file: self.clone(),
            slot,
            len: bytes.len(),
            hash: blake3::hash(bytes),
        };
        // Counted here: a failed write drops (and uncounts) the slot.
        self.in_use.fetch_add(bytes.len(), Ordering::Relaxed);
        match self.file.write_all_at(bytes, slot.offset()) {
            Ok(()) => Some(slot),
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "spilling a carried chunk failed ({e}): carries that cannot be spilled \
                         stay in memory (logged once)"
                    );
                }
                None
            }
        }
    }

    /// Whether the backing filesystem keeps `keep_free` bytes free after one more slot
    /// (asked before every spill: one statfs, next to a write of the carry).
    fn room(&self) -> bool {
        // SAFETY: fstatvfs fills the struct it is given for a descriptor this file owns.
        let free = unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            if libc::fstatvfs(std::os::fd::AsRawFd::as_raw_fd(&self.file), &mut st) != 0 {
                return false;
            }
            st.f_bavail as u64 * st.f_frsize as u64
        };
        let keep_free = (self.keep_free)();
        let ok = free >= keep_free.saturating_add(self.slot_bytes as u64);
        if !ok && !self.low_space_warned.swap(true, Ordering::Relaxed) {
            log::warn!(
                "the backing filesystem has {} MiB free, less than the {} MiB the spill file \
                 leaves for the metadata table's growth: carried chunks stay in memory while \
                 it is so (logged once)",
                free >> 20,
                keep_free >> 20
            );
        }
        ok
    }
}

/// One carry in the spill file; its slot is freed on drop.
pub struct SpillSlot {
    file: Arc<SpillFile>,
    slot: u64,
    len: usize,
    hash: blake3::Hash,
}

impl SpillSlot {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn offset(&self) -> u64 {
        self.slot * self.file.slot_bytes as u64
    }

    /// The carry's bytes, checked against the hash they were spilled with.
    pub fn load(&self) -> std::io::Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.file.file.read_exact_at(&mut v, self.offset())?;
        if blake3::hash(&v) != self.hash {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a carried chunk read back from the spill file does not match its hash",
            ));
        }
        Ok(v)
    }

    /// Copies the carry's bytes `[at, at + out.len())` into `out` (a read of the file
    /// while its carry is spilled; the whole carry is checked).
    pub fn read(&self, at: usize, out: &mut [u8]) -> std::io::Result<()> {
        let v = self.load()?;
        out.copy_from_slice(&v[at..at + out.len()]);
        Ok(())
    }
}

impl Drop for SpillSlot {
    fn drop(&mut self) {
        // The slot is reused as it is: its pages are most likely still cached, and the next
        // carry overwrites them in place. Punching each freed slot out instead took 7% of
        // the daemon's time with 4096 files written in turn (the page cache freed and filled
        // again for every carry). The file is emptied once no carry is in it.
        let mut free = self.file.free.lock();
        free.0.push(self.slot);
        if free.0.len() as u64 == free.1 {
            free.0.clear();
            free.1 = 0;
            let _ = self.file.file.set_len(0);
        }
        self.file.in_use.fetch_sub(self.len, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spill file never takes the filesystem's free space below what it must leave (the
    /// metadata table's room): short of it, nothing is spilled and the carry stays where it
    /// is; with room, a spilled carry comes back whole, and a slot freed is reused.
    #[test]
    fn spills_only_with_room_left_and_carries_come_back() {
        let c = Carries::new(0);
        c.spill_to_keeping(&std::env::temp_dir(), 4096, Arc::new(|| u64::MAX / 4));
        let f = c.file().expect("a spill file in the temporary directory");
        assert!(
            f.store(b"a carried chunk").is_none(),
            "spilled without room"
        );

        let c = Carries::new(0);
        c.spill_to_keeping(&std::env::temp_dir(), 4096, Arc::new(|| 0));
        let f = c.file().expect("a spill file");
        let a = f.store(&[7u8; 3000]).expect("spilled");
        let b = f.store(&[9u8; 4096]).expect("spilled");
        assert!(
            f.store(&[1u8; 4097]).is_none(),
            "a carry longer than a slot"
        );
        assert_eq!(a.load().unwrap(), vec![7u8; 3000]);
        let mut part = [0u8; 10];
        b.read(4000, &mut part).unwrap();
        assert_eq!(part, [9u8; 10]);
        assert_eq!(f.in_use.load(Ordering::Relaxed), 3000 + 4096);
        let slot_a = a.slot;
        drop(a);
        let again = f.store(&[5u8; 100]).expect("spilled");
        assert_eq!(again.slot, slot_a, "the freed slot is reused");
        assert_eq!(again.load().unwrap(), vec![5u8; 100]);
        drop((b, again));
        assert_eq!(f.in_use.load(Ordering::Relaxed), 0);
        assert_eq!(
            f.file.metadata().unwrap().len(),
            0,
            "emptied with no carry in it"
        );
    }

    /// The reserve follows the metadata table: a small space's table leaves the minimum
    /// (not the fixed 1 GiB that kept a CI machine with 1 GiB free from spilling), a big
    /// table two of its growths; and the table's length is asked at every spill, since it
    /// grows while the space is mounted.
    #[test]
    fn the_room_left_follows_the_metadata_table() {
        assert_eq!(spill_keep_free(0), SPILL_KEEP_FREE_MIN);
        assert_eq!(spill_keep_free(2 << 20), SPILL_KEEP_FREE_MIN);
        assert_eq!(spill_keep_free(1 << 30), 2 << 30);
        assert_eq!(spill_keep_free(10 << 30), 16 << 30);

        /// A table device that only has a length, and counts how often it was asked.
        struct Table(AtomicU64, AtomicUsize);
        impl crate::device::Device for Table {
            fn read_at(&self, _: &mut [u8], _: u64) -> crate::error::DevResult<()> {
                unreachable!("the spill only asks the table's length")
            }
            fn write_at(&self, _: &[u8], _: u64) -> crate::error::DevResult<()> {
                unreachable!("the spill only asks the table's length")
            }
            fn sync(&self) -> crate::error::DevResult<()> {
                Ok(())
            }
            fn len(&self) -> u64 {
                self.1.fetch_add(1, Ordering::Relaxed);
                self.0.load(Ordering::Relaxed)
            }
        }
        let table = Arc::new(Table(AtomicU64::new(1 << 20), AtomicUsize::new(0)));
        let c = Carries::new(0);
        c.spill_to(&std::env::temp_dir(), 4096, table.clone());
        let f = c.file().expect("a spill file in the temporary directory");
        let free = |f: &SpillFile| {
            // SAFETY: as in `room`.
            unsafe {
                let mut st: libc::statvfs = std::mem::zeroed();
                assert_eq!(
                    libc::fstatvfs(std::os::fd::AsRawFd::as_raw_fd(&f.file), &mut st),
                    0
                );
                st.f_bavail as u64 * st.f_frsize as u64
            }
        };
        let kept = f.store(b"one");
        if kept.is_some() {
            assert!(free(&f) >= SPILL_KEEP_FREE_MIN, "spilled into the reserve");
        }
        let asked = table.1.load(Ordering::Relaxed);
        assert!(asked >= 1, "the table's length was not asked");
        let again = f.store(b"two");
        assert!(
            table.1.load(Ordering::Relaxed) > asked,
            "the table's length was asked once, not at every spill"
        );
        drop((kept, again));
    }
}
