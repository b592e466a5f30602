//! Simulated disks for crash and fault tests: devices that remember which writes have been
//! made durable, can "lose power" at a chosen operation, and can fail chosen operations with
//! an errno. They live in the engine (not in a test file) so the engine's own tests, the `fs`
//! crate's tests and anyone else can drive the real commit and gc code over them.
//!
//! The model of a disk (the one crash-consistency studies use): a write is visible to later
//! reads at once but durable only after a `sync` of *its* device. At a crash, every write not
//! yet synced independently survives whole, is lost, or is torn (each 512-byte sector of it
//! survives or not), and a length change not yet synced survives or not. Syncing one device
//! (the data file) says nothing about another (the metadata table).

use crate::device::Device;
use crate::error::DevResult;
use parking_lot::Mutex;
use rand::Rng;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The unit a torn write is made of.
pub(crate) const SECTOR: usize = 512;
const PAGE: usize = 4096;

/// The bytes of a device, stored sparsely: untouched pages read as zero, so a nominally
/// large data file costs only what was written to it.
#[derive(Clone, Default)]
pub struct Image {
    len: u64,
    pages: HashMap<u64, Box<[u8; PAGE]>>,
}

impl Image {
    pub fn new(len: u64) -> Image {
        Image {
            len,
            pages: HashMap::new(),
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn read(&self, mut off: u64, mut buf: &mut [u8]) {
        while !buf.is_empty() {
            let (p, at) = (off / PAGE as u64, (off % PAGE as u64) as usize);
            let n = buf.len().min(PAGE - at);
            match self.pages.get(&p) {
                Some(page) => buf[..n].copy_from_slice(&page[at..at + n]),
                None => buf[..n].fill(0),
            }
            off += n as u64;
            buf = &mut buf[n..];
        }
    }

    fn write(&mut self, mut off: u64, mut data: &[u8]) {
        self.len = self.len.max(off + data.len() as u64);
        while !data.is_empty() {
            let (p, at) = (off / PAGE as u64, (off % PAGE as u64) as usize);
            let n = data.len().min(PAGE - at);
            let page = self.pages.entry(p).or_insert_with(|| Box::new([0u8; PAGE]));
            page[at..at + n].copy_from_slice(&data[..n]);
            off += n as u64;
            data = &data[n..];
        }
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            // Bytes past the new end must read as zero if the device grows again.
            self.pages.retain(|p, _| p * (PAGE as u64) < len);
            let at = (len % PAGE as u64) as usize;
            if at != 0 {
                if let Some(page) = self.pages.get_mut(&(len / PAGE as u64)) {
                    page[at..].fill(0);
                }
            }
        }
        self.len = len;
    }

    /// Flips every bit of the byte at `off` (a damaged disk).
    pub fn corrupt(&mut self, off: u64) {
        let mut b = [0u8];
        self.read(off, &mut b);
        b[0] ^= 0xff;
        self.write(off, &b);
    }
}

/// Which operation a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Write,
    Sync,
    SetLen,
    Read,
}

/// Fails one operation: the `nth` (from 0) operation of `kind` on the devices of one disk, or
/// on one named device, returns `errno` and has no effect. With `sticky`, every later
/// operation of that kind fails too (a device that has died).
#[derive(Clone, Debug)]
pub struct Fault {
    pub device: Option<&'static str>,
    pub kind: OpKind,
    pub nth: u64,
    pub errno: i32,
    pub sticky: bool,
}

/// One simulated machine: a counter over the mutating operations (writes, syncs, length
/// changes) of all its devices, the operation at which power is lost, and injected faults.
pub struct SimDisk {
    ops: AtomicU64,
    crash_at: AtomicU64,
    crashed: AtomicBool,
    faults: Mutex<Vec<Fault>>,
    counts: Mutex<HashMap<(Option<&'static str>, u8), u64>>,
    /// Faults that fired, for tests to assert on.
    pub fired: AtomicU64,
}

impl Default for SimDisk {
    fn default() -> Self {
        SimDisk {
            ops: AtomicU64::new(0),
            crash_at: AtomicU64::new(u64::MAX),
            crashed: AtomicBool::new(false),
            faults: Mutex::new(Vec::new()),
            counts: Mutex::new(HashMap::new()),
            fired: AtomicU64::new(0),
        }
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl SimDisk {
    pub fn new() -> Arc<SimDisk> {
        Arc::new(SimDisk::default())
    }

    /// Loses power just before mutating operation `n` (counted from 0 over all devices):
    /// that operation and everything after it fail with EIO, as seen by a process that is
    /// about to die; the durable state is what `SimDevice::crash_image` then returns.
    pub fn crash_at(&self, n: u64) {
        self.crash_at.store(n, Ordering::SeqCst);
    }

    pub(crate) fn crash_now(&self) {
        self.crashed.store(true, Ordering::SeqCst);
    }

    pub fn has_crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Mutating operations so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// Adds a fault; its `nth` counts from now (operations before it do not count).
    pub fn inject(&self, mut f: Fault) {
        let counts = self.counts.lock();
        f.nth += counts.get(&(f.device, f.kind as u8)).copied().unwrap_or(0);
        self.faults.lock().push(f);
    }

    /// Counts an operation and decides its fate: Ok to go ahead, or the error it returns.
    fn admit(&self, device: &'static str, kind: OpKind) -> io::Result<()> {
        if self.has_crashed() {
            return Err(eio());
        }
        if kind != OpKind::Read {
            let n = self.ops.fetch_add(1, Ordering::SeqCst);
            if n >= self.crash_at.load(Ordering::SeqCst) {
                self.crash_now();
                return Err(eio());
            }
        }
        let mut counts = self.counts.lock();
        let mut hit = None;
        for (i, f) in self.faults.lock().iter().enumerate() {
            if f.kind != kind || f.device.is_some_and(|d| d != device) {
                continue;
            }
            let c = counts.entry((f.device, kind as u8)).or_insert(0);
            if *c == f.nth || (f.sticky && *c > f.nth) {
                hit = Some((i, f.errno));
            }
        }
        // Count every operation once per scope a fault may name (disk-wide and this device).
        for key in [(None, kind as u8), (Some(device), kind as u8)] {
            *counts.entry(key).or_insert(0) += 1;
        }
        match hit {
            Some((_, errno)) => {
                self.fired.fetch_add(1, Ordering::SeqCst);
                Err(io::Error::from_raw_os_error(errno))
            }
            None => Ok(()),
        }
    }
}

enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

struct State {
    /// What reads see: every completed write.
    current: Image,
    /// What survives a crash for certain: the state at the last successful sync.
    durable: Image,
    /// Completed writes and length changes since that sync, in order.
    pending: Vec<Pending>,
}

/// A device of a `SimDisk`.
pub struct SimDevice {
    name: &'static str,
    disk: Arc<SimDisk>,
    st: Mutex<State>,
    /// A torn write leaves one of its sectors garbage (`tear_into_garbage`).
    garbage: AtomicBool,
}

impl SimDevice {
    /// A device holding `image`, all of it durable (a disk after a reboot).
    pub fn new(name: &'static str, disk: &Arc<SimDisk>, image: Image) -> Arc<SimDevice> {
        Arc::new(SimDevice {
            name,
            disk: disk.clone(),
            st: Mutex::new(State {
                current: image.clone(),
                durable: image,
                pending: Vec::new(),
            }),
            garbage: AtomicBool::new(false),
        })
    }

    /// From now on a write that a crash tears also leaves one of its sectors neither old
    /// nor new but garbage, as a disk that loses power while writing a sector may: a write
    /// over a synced block is then a risk even where it rewrites the same bytes. For a
    /// device whose format promises never to write over a block a sync covered (the
    /// journal), so that a test catches a write that does.
    pub fn tear_into_garbage(&self) {
        self.garbage.store(true, Ordering::SeqCst);
    }

    /// The durable bytes after a power loss now: the synced state plus a random selection of
    /// the writes since, each surviving whole, lost, or torn at sector granularity.
    pub fn crash_image(&self, rng: &mut impl Rng) -> Image {
        let st = self.st.lock();
        let mut img = st.durable.clone();
        for p in &st.pending {
            match p {
                Pending::SetLen(len) => {
                    if rng.random_bool(0.5) {
                        img.set_len(*len);
                    }
                }
                Pending::Write(off, data) => match rng.random_range(0..4) {
                    0 => {}
                    1 => {
                        for (i, sector) in data.chunks(SECTOR).enumerate() {
                            if rng.random_bool(0.5) {
                                img.write(off + (i * SECTOR) as u64, sector);
                            }
                        }
                        if self.garbage.load(Ordering::SeqCst) {
                            let i = rng.random_range(0..data.len().div_ceil(SECTOR));
                            let mut g = vec![0u8; SECTOR.min(data.len() - i * SECTOR)];
                            rng.fill_bytes(&mut g);
                            img.write(off + (i * SECTOR) as u64, &g);
                        }
                    }
                    _ => img.write(*off, data),
                },
            }
        }
        img
    }

    /// The bytes after the death of the process using the device, not of the machine: every
    /// completed write (the kernel's page cache keeps them, and the next open reads them).
    pub fn death_image(&self) -> Image {
        self.st.lock().current.clone()
    }

    /// Synced and not-yet-synced writes so far, for tests that want to know a crash had
    /// something to lose.
    pub fn pending_writes(&self) -> usize {
        self.st.lock().pending.len()
    }
}

impl Device for SimDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> DevResult<()> {
        self.disk.admit(self.name, OpKind::Read)?;
        let st = self.st.lock();
        if off + buf.len() as u64 > st.current.len {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        st.current.read(off, buf);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> DevResult<()> {
        let mut st = self.st.lock();
        self.disk.admit(self.name, OpKind::Write)?;
        st.current.write(off, buf);
        st.pending.push(Pending::Write(off, buf.to_vec()));
        Ok(())
    }

    fn sync(&self) -> DevResult<()> {
        let mut st = self.st.lock();
        self.disk.admit(self.name, OpKind::Sync)?;
        let State {
            durable, pending, ..
        } = &mut *st;
        for p in pending.drain(..) {
            match p {
                Pending::Write(off, data) => durable.write(off, &data),
                Pending::SetLen(len) => durable.set_len(len),
            }
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        self.st.lock().current.len
    }

    fn set_len(&self, len: u64) -> DevResult<()> {
        let mut st = self.st.lock();
        self.disk.admit(self.name, OpKind::SetLen)?;
        st.current.set_len(len);
        st.pending.push(Pending::SetLen(len));
        Ok(())
    }
}

/// A real device behind a `SimDisk`'s faults: every operation is admitted by the disk (and
/// may fail as a fault says) before it reaches `inner`. This is how a mounted space gets
/// injected I/O errors (`CKPTFS_FAULTS`, see `parse_faults`) for the tests that check what an
/// application sees.
pub(crate) struct FaultyDevice {
    pub name: &'static str,
    pub disk: Arc<SimDisk>,
    pub inner: Arc<dyn Device>,
}

impl Device for FaultyDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> DevResult<()> {
        self.disk.admit(self.name, OpKind::Read)?;
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> DevResult<()> {
        self.disk.admit(self.name, OpKind::Write)?;
        self.inner.write_at(buf, off)
    }
    fn sync(&self) -> DevResult<()> {
        self.disk.admit(self.name, OpKind::Sync)?;
        self.inner.sync()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn file_now(&self) -> Option<DevResult<crate::device::FileNow>> {
        self.inner.file_now()
    }
    fn set_len(&self, len: u64) -> DevResult<()> {
        self.disk.admit(self.name, OpKind::SetLen)?;
        self.inner.set_len(len)
    }
    fn room_low(&self) -> bool {
        self.inner.room_low()
    }
}

/// Targets a fault may name (`target0` ..).
pub(crate) const MAX_TARGET_NAMES: usize = 64;

/// The device name of target `i` of a space over several targets (faults name it).
pub fn target_device_name(i: usize) -> &'static str {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..MAX_TARGET_NAMES)
            .map(|i| &*Box::leak(format!("target{i}").into_boxed_str()))
            .collect()
    });
    names.get(i).copied().unwrap_or("target")
}

/// The fault-injection name of the metadata mirror on target `i` (its copies of the
/// metadata table and of the placement records count as one device).
pub(crate) fn mirror_device_name(i: usize) -> &'static str {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..MAX_TARGET_NAMES)
            .map(|i| &*Box::leak(format!("mirror{i}").into_boxed_str()))
            .collect()
    });
    names.get(i).copied().unwrap_or("mirror")
}

/// Parses a fault list: comma-separated `DEVICE:OP:N:ERRNO[:sticky]`, DEVICE `data`,
/// `meta`, `targetN` or `mirrorN`, OP `write|sync|setlen|read`, N counting that device's operations of that kind from
/// 0, ERRNO `EIO` or `ENOSPC`. Example: `data:sync:2:EIO` fails the third sync of the data file.
pub fn parse_faults(spec: &str) -> Result<Vec<Fault>, String> {
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|f| {
            let p: Vec<&str> = f.trim().split(':').collect();
            if p.len() < 4 || p.len() > 5 || (p.len() == 5 && p[4] != "sticky") {
                return Err(format!("fault `{f}`: expected DEVICE:OP:N:ERRNO[:sticky]"));
            }
            let device = match p[0] {
                "data" => "data",
                "meta" => "meta",
                "journal" => "journal",
                d => {
                    let n = |prefix: &str| {
                        d.strip_prefix(prefix)
                            .and_then(|n| n.parse::<usize>().ok())
                            .filter(|n| *n < MAX_TARGET_NAMES)
                    };
                    match (n("target"), n("mirror")) {
                        (Some(n), _) => target_device_name(n),
                        (_, Some(n)) => mirror_device_name(n),
                        _ => {
                            return Err(format!(
                                "fault `{f}`: unknown device `{d}` (data, meta, journal, \
                             target0 .. target{m}, mirror0 .. mirror{m})",
                                m = MAX_TARGET_NAMES - 1
                            ))
                        }
                    }
                }
            };
            let kind = match p[1] {
                "write" => OpKind::Write,
                "sync" => OpKind::Sync,
                "setlen" => OpKind::SetLen,
                "read" => OpKind::Read,
                o => return Err(format!("fault `{f}`: unknown operation `{o}`")),
            };
            let nth = p[2]
                .parse()
                .map_err(|_| format!("fault `{f}`: `{}` is not a number", p[2]))?;
            let errno = match p[3] {
                "EIO" => libc::EIO,
                "ENOSPC" => libc::ENOSPC,
                e => return Err(format!("fault `{f}`: unknown errno `{e}` (EIO or ENOSPC)")),
            };
            Ok(Fault {
                device: Some(device),
                kind,
                nth,
                errno,
                sticky: p.len() == 5,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn synced_writes_survive_and_unsynced_ones_may_not() {
        let disk = SimDisk::new();
        let d = SimDevice::new("d", &disk, Image::new(1 << 20));
        d.write_at(&[1u8; 4096], 0).unwrap();
        d.sync().unwrap();
        d.write_at(&[2u8; 4096], 8192).unwrap();
        let mut seen_lost = false;
        let mut seen_torn = false;
        for seed in 0..64 {
            let img = d.crash_image(&mut SmallRng::seed_from_u64(seed));
            let mut a = [0u8; 4096];
            img.read(0, &mut a);
            assert_eq!(a, [1u8; 4096], "a synced write was lost");
            let mut b = [0u8; 4096];
            img.read(8192, &mut b);
            let written = b.chunks(SECTOR).filter(|s| s[0] == 2).count();
            seen_lost |= written == 0;
            seen_torn |= written > 0 && written < 4096 / SECTOR;
        }
        assert!(
            seen_lost && seen_torn,
            "crash images never lost or tore a write"
        );
    }

    #[test]
    fn crash_point_and_faults_fail_the_chosen_operations() {
        let disk = SimDisk::new();
        let d = SimDevice::new("d", &disk, Image::new(1 << 20));
        disk.inject(Fault {
            device: Some("d"),
            kind: OpKind::Sync,
            nth: 1,
            errno: libc::EIO,
            sticky: false,
        });
        d.sync().unwrap();
        assert_eq!(d.sync().unwrap_err().raw_os_error(), Some(libc::EIO));
        d.sync().unwrap();
        disk.crash_at(disk.ops() + 1);
        d.write_at(b"x", 0).unwrap();
        assert!(d.write_at(b"y", 1).is_err());
        assert!(disk.has_crashed());
        let mut b = [0u8; 1];
        assert!(d.read_at(&mut b, 0).is_err(), "a crashed disk still reads");
    }
}
