//! Acknowledged writes under concurrent open/close (issue 20): a checkpoint whose close()
//! returned 0 must be there, whatever other threads and processes do with the same file.
//!
//! Writers (two files per way of saving) rewrite their own files again and again; after
//! every successful close it re-reads the file through a fresh O_DIRECT descriptor (no page
//! cache) and compares. Meanwhile bystander threads open/close/read/stat its file in a
//! loop, and a bystander process (`race-opener`, tests/src/bin) does the same. At the end every file must hold its last acknowledged content, before and after a
//! remount.
//!
//! The ways of saving: O_WRONLY|O_TRUNC (`open(path, "wb")`), O_RDWR|O_TRUNC, O_RDWR
//! overwrite, O_RDWR|O_DIRECT overwrite, O_WRONLY overwrite, O_APPEND growth (truncated now
//! and then), and write-temp-then-rename over the file.
//!
//! The ways of saving take turns (so the bystanders' rate on the files being saved is
//! high), each for `CKPTFS_RACE_SECS` seconds (default 4); `CKPTFS_SEED` replays the writers' lengths
//! and contents (the interleaving is up to the scheduler).

use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ckptfs_tests::{close_checked, fill_pattern, first_difference, mix, test_seed, TestMount};

const KIB: usize = 1024;
/// Bystander threads on the file being saved, besides one bystander process. One: more
/// bystanders keep the file open nearly all the time, and the lost-write race needed the
/// open count to drop to zero between a writer's close and its next open.
const BYSTANDERS: usize = 1;
/// Files saved at once in each phase, each by its own writer thread.
const FILES_PER_MODE: usize = 2;

#[derive(Clone, Copy, Debug)]
enum Mode {
    TruncWrOnly,
    TruncRdWr,
    RdWr,
    RdWrDirect,
    WrOnly,
    Append,
    RenameOver,
}

const MODES: [Mode; 7] = [
    Mode::TruncWrOnly,
    Mode::TruncRdWr,
    Mode::RdWr,
    Mode::RdWrDirect,
    Mode::WrOnly,
    Mode::Append,
    Mode::RenameOver,
];

/// A page-aligned buffer, for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(4096), 4096).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation failed");
        Aligned { ptr, len, layout }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() >= len bytes, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// The whole content of `path`, read through a new O_DIRECT descriptor.
fn read_direct(path: &Path) -> io::Result<Vec<u8>> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let len = f.metadata()?.len() as usize;
    let mut buf = Aligned::new(len.next_multiple_of(4096) + 4096);
    let mut got = 0;
    loop {
        let n = f.read_at(&mut buf.as_mut()[got..], got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(buf.as_mut()[..got].to_vec())
}

/// One version's bytes: `len` bytes of the pattern `key`.
fn version(key: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(key, 0, &mut v);
    v
}

struct Writer {
    mode: Mode,
    path: PathBuf,
    seed: u64,
    /// The content of the last successful close.
    acked: Vec<u8>,
    saves: u64,
}

impl Writer {
    /// One save; returns Err on any failed call or miscompare after a successful close.
    fn save(&mut self, n: u64) -> Result<(), String> {
        let key = mix(self.seed, n);
        // 4 KiB to 1 MiB, page multiples so O_DIRECT writes need no bounce.
        let len = ((key % 256) as usize + 1) * 4 * KIB;
        let err = |what: &str, e: io::Error| format!("save {n}: {what}: {e}");
        let expected = match self.mode {
            Mode::Append => {
                let piece = version(key, len.min(64 * KIB));
                let trunc = n.is_multiple_of(16);
                // std refuses append with truncate; O_TRUNC goes in as a raw flag.
                let f = fs::OpenOptions::new()
                    .append(true)
                    .custom_flags(if trunc { libc::O_TRUNC } else { 0 })
                    .open(&self.path)
                    .map_err(|e| err("open O_APPEND", e))?;
                let mut exp = if trunc {
                    Vec::new()
                } else {
                    self.acked.clone()
                };
                use std::io::Write;
                (&f).write_all(&piece).map_err(|e| err("append", e))?;
                close_checked(f).map_err(|e| err("close", e))?;
                exp.extend_from_slice(&piece);
                exp
            }
            Mode::RenameOver => {
                let data = version(key, len);
                let tmp = self.path.with_extension("tmp");
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&tmp)
                    .map_err(|e| err("open tmp", e))?;
                f.write_all_at(&data, 0).map_err(|e| err("pwrite tmp", e))?;
                close_checked(f).map_err(|e| err("close tmp", e))?;
                fs::rename(&tmp, &self.path).map_err(|e| err("rename", e))?;
                data
            }
            _ => {
                let mut o = fs::OpenOptions::new();
                let direct = matches!(self.mode, Mode::RdWrDirect);
                match self.mode {
                    Mode::TruncWrOnly => o.write(true).truncate(true),
                    Mode::TruncRdWr => o.read(true).write(true).truncate(true),
                    Mode::RdWr | Mode::RdWrDirect => o.read(true).write(true),
                    Mode::WrOnly => o.write(true),
                    Mode::Append | Mode::RenameOver => unreachable!(),
                };
                if direct {
                    o.custom_flags(libc::O_DIRECT);
                }
                let f = o.open(&self.path).map_err(|e| err("open", e))?;
                let mut data = version(key, len);
                let truncating = matches!(self.mode, Mode::TruncWrOnly | Mode::TruncRdWr);
                if direct {
                    let mut buf = Aligned::new(len);
                    buf.as_mut().copy_from_slice(&data);
                    f.write_all_at(buf.as_mut(), 0)
                        .map_err(|e| err("pwrite O_DIRECT", e))?;
                } else {
                    f.write_all_at(&data, 0).map_err(|e| err("pwrite", e))?;
                }
                close_checked(f).map_err(|e| err("close", e))?;
                if !truncating && self.acked.len() > len {
                    // An overwrite keeps the old tail.
                    data.extend_from_slice(&self.acked[len..]);
                }
                data
            }
        };
        let got = read_direct(&self.path).map_err(|e| err("re-read O_DIRECT", e))?;
        if let Some(d) = first_difference(&got, &expected) {
            return Err(format!(
                "save {n}: close returned 0 but the file differs: {d} \
                 (previous acknowledged length {})",
                self.acked.len()
            ));
        }
        self.acked = expected;
        self.saves += 1;
        Ok(())
    }
}

/// Opens, reads, stats and closes `path` until `stop`.
fn bystander(path: &Path, seed: u64, stop: &AtomicBool, ops: &AtomicU64) -> Result<(), String> {
    let mut r = seed;
    let mut buf = vec![0u8; 16 * KIB];
    while !stop.load(Ordering::Relaxed) {
        r = mix(r, 7);
        // Mostly a bare open and close: the pattern whose RELEASE raced the writer's.
        let res: io::Result<()> = match r % 16 {
            0..=11 => fs::File::open(path).map(drop),
            12 => fs::metadata(path).map(drop),
            13 | 14 => fs::File::open(path).and_then(|f| f.read_at(&mut buf, 0).map(drop)),
            _ => fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map(drop),
        };
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("bystander on {}: {e}", path.display())),
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// One phase: each writer of `ws` (one way of saving, a file each) saves again and again for
/// `secs` while a bystander thread per file and a bystander process over the files open,
/// read, stat and close them. Returns the failures.
fn phase(ws: &mut [Writer], secs: u64, seed: u64) -> Vec<String> {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let bystanders: Vec<_> = (0..ws.len() * BYSTANDERS)
        .map(|i| {
            let (p, stop, ops) = (ws[i % ws.len()].path.clone(), stop.clone(), ops.clone());
            let s = mix(seed, 100 + i as u64);
            std::thread::spawn(move || bystander(&p, s, &stop, &ops))
        })
        .collect();
    let opener = Command::new(env!("CARGO_BIN_EXE_race-opener"))
        .arg(mix(seed, 200).to_string())
        .arg(secs.to_string())
        .args(ws.iter().map(|w| &w.path))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start race-opener");
    let end = Instant::now() + Duration::from_secs(secs);
    let mut failures: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = ws
            .iter_mut()
            .map(|w| {
                sc.spawn(move || {
                    let mut n = w.saves + 1;
                    while Instant::now() < end {
                        if let Err(e) = w.save(n) {
                            return Some(format!("{:?} ({}): {e}", w.mode, w.path.display()));
                        }
                        n += 1;
                    }
                    None
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().unwrap()).collect()
    });
    stop.store(true, Ordering::Relaxed);
    for b in bystanders {
        if let Err(e) = b.join().unwrap() {
            failures.push(e);
        }
    }
    let out = opener.wait_with_output().expect("race-opener");
    if !out.status.success() {
        failures.push(format!(
            "race-opener: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    println!(
        "{:?}: {} saves checked; bystander threads {} ops; {}",
        ws[0].mode,
        ws.iter().map(|w| w.saves).sum::<u64>(),
        ops.load(Ordering::Relaxed),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    failures
}

#[test]
fn acknowledged_writes_survive_concurrent_open_close() {
    let seed = test_seed(
        "acknowledged_writes_survive_concurrent_open_close",
        0x0a2c_0020,
    );
    let secs: u64 = std::env::var("CKPTFS_RACE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let mut m = TestMount::new();
    let mut writers: Vec<Writer> = MODES
        .iter()
        .flat_map(|&mode| (0..FILES_PER_MODE).map(move |f| (mode, f)))
        .enumerate()
        .map(|(i, (mode, f))| {
            let path = m.path(format!("{mode:?}-{f}.ckpt"));
            fs::write(&path, b"").expect("create");
            Writer {
                mode,
                path,
                seed: mix(seed, i as u64),
                acked: Vec::new(),
                saves: 0,
            }
        })
        .collect();
    // One way of saving at a time, so the bystanders' open/close rate on its files is high.
    let mut failures = Vec::new();
    for (i, ws) in writers.chunks_mut(FILES_PER_MODE).enumerate() {
        failures.extend(phase(ws, secs, mix(seed, 1000 + i as u64)));
    }
    assert!(
        failures.is_empty(),
        "acknowledged writes lost or calls failed:\n{}\ndaemon log tail:\n{}",
        failures.join("\n"),
        m.log_tail()
    );

    // What close acknowledged is durable: the same after a remount.
    m.remount();
    for w in &writers {
        let got = fs::read(&w.path).unwrap_or_else(|e| panic!("{}: {e}", w.path.display()));
        if let Some(d) = first_difference(&got, &w.acked) {
            panic!(
                "{:?}: after remount the file differs from its last close: {d}",
                w.mode
            );
        }
    }
}
