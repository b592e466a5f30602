//! One writer process of the concurrency soak (tests/tests/soak.rs), which starts 16 of them.
//!
//! Usage: `soak-writer DIR SEED SECONDS`. Until SECONDS have passed it writes new versions of
//! its files in DIR (created), closes them, reads them back and compares:
//!
//! - `own-<j>`: rewritten in place (`O_TRUNC`, random pieces, sometimes an fsync mid-way);
//! - `pub-<j>`: published by writing `pub.tmp`, closing it and renaming it over `pub-<j>`;
//! - `scratch`: overwritten in random ranges (sometimes past the end), checked against an
//!   in-memory model.
//!
//! `own-*` and `pub-*` hold [`tagged`] content, which the soak's readers can check
//! without knowing who wrote it. Prints one line of op counts, then one line
//! `last FILE KEY LEN` for each `own-*`/`pub-*` file it wrote: the version that must be there
//! after a remount. On the first error or miscompare prints it to stderr and exits 1.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ckptfs_tests::{close_checked, first_difference, tagged};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const OWN_FILES: u64 = 3;
const PUB_FILES: u64 = 2;
/// The scratch file's model lives in memory; this bounds it.
const SCRATCH_MAX_BYTES: u64 = 4 * MIB;

/// splitmix64 stream: the tests crate's rand is a dev-dependency, which a bin cannot use.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in lo..=hi.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}

#[derive(Default)]
struct Counts {
    rewrites: u64,
    publishes: u64,
    overwrites: u64,
    fsyncs: u64,
    verifies: u64,
    bytes_written: u64,
    bytes_read: u64,
    /// The newest version (tagged key, length) of each file, by name.
    last: std::collections::BTreeMap<String, (u64, u64)>,
}

fn version_len(rng: &mut Rng) -> u64 {
    match rng.range(0, 99) {
        0..25 => rng.range(tagged::HEADER_BYTES, 256),
        25..60 => rng.range(257, 64 * KIB),
        60..90 => rng.range(64 * KIB + 1, 512 * KIB),
        _ => rng.range(512 * KIB + 1, 2 * MIB),
    }
}

/// Writes `data` to `path` (create + truncate) in random pieces, maybe fsyncing mid-way, and
/// checks close.
fn write_whole(path: &Path, data: &[u8], rng: &mut Rng, c: &mut Counts) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let sync_at = rng.percent(20).then(|| rng.range(0, data.len() as u64));
    let mut off = 0usize;
    while off < data.len() {
        let n = (rng.range(1, MIB) as usize).min(data.len() - off);
        f.write_all(&data[off..off + n])?;
        off += n;
        if sync_at.is_some_and(|s| (off as u64) >= s && (off - n) as u64 <= s) {
            f.sync_all()?;
            c.fsyncs += 1;
        }
    }
    c.bytes_written += data.len() as u64;
    close_checked(f)
}

fn verify(path: &Path, want: &[u8], what: &str, c: &mut Counts) -> Result<(), String> {
    let got = fs::read(path).map_err(|e| format!("{what}: read back {}: {e}", path.display()))?;
    c.verifies += 1;
    c.bytes_read += got.len() as u64;
    match first_difference(&got, want) {
        None => Ok(()),
        Some(d) => Err(format!("{what}: {} reads back wrong: {d}", path.display())),
    }
}

fn run(dir: &Path, seed: u64, secs: u64) -> Result<Counts, String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    fs::create_dir_all(dir).map_err(io(format!("mkdir {}", dir.display())))?;
    let mut rng = Rng(seed);
    let mut c = Counts::default();
    let mut scratch: Vec<u8> = Vec::new();
    let scratch_path = dir.join("scratch");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let op = rng.range(0, 99);
        if op < 55 {
            let name = format!("own-{}", rng.range(0, OWN_FILES - 1));
            let path: PathBuf = dir.join(&name);
            let key = rng.next();
            let data = tagged::bytes(key, version_len(&mut rng));
            let what = format!("rewrite #{n} ({} bytes)", data.len());
            write_whole(&path, &data, &mut rng, &mut c).map_err(io(what.clone()))?;
            verify(&path, &data, &what, &mut c)?;
            c.last.insert(name, (key, data.len() as u64));
            c.rewrites += 1;
        } else if op < 80 {
            let name = format!("pub-{}", rng.range(0, PUB_FILES - 1));
            let path = dir.join(&name);
            let tmp = dir.join("pub.tmp");
            let key = rng.next();
            let data = tagged::bytes(key, version_len(&mut rng));
            let what = format!("publish #{n} ({} bytes)", data.len());
            write_whole(&tmp, &data, &mut rng, &mut c).map_err(io(what.clone()))?;
            fs::rename(&tmp, &path).map_err(io(format!("{what}: rename")))?;
            verify(&path, &data, &what, &mut c)?;
            c.last.insert(name, (key, data.len() as u64));
            c.publishes += 1;
        } else {
            let end = scratch.len() as u64 + 64 * KIB;
            let off = rng.range(0, end.min(SCRATCH_MAX_BYTES - 1));
            let len = rng.range(1, 256 * KIB).min(SCRATCH_MAX_BYTES - off);
            let what = format!("overwrite #{n} ({len} bytes at {off})");
            let mut piece = vec![0u8; len as usize];
            ckptfs_tests::fill_pattern(rng.next(), 0, &mut piece);
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&scratch_path)
                .map_err(io(format!("{what}: open")))?;
            f.write_all_at(&piece, off)
                .map_err(io(format!("{what}: pwrite")))?;
            close_checked(f).map_err(io(format!("{what}: close")))?;
            let end = (off + len) as usize;
            if scratch.len() < end {
                scratch.resize(end, 0);
            }
            scratch[off as usize..end].copy_from_slice(&piece);
            c.bytes_written += len;
            verify(&scratch_path, &scratch, &what, &mut c)?;
            c.overwrites += 1;
        }
    }
    Ok(c)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let parsed = match args.as_slice() {
        [_, dir, seed, secs] => seed
            .parse::<u64>()
            .ok()
            .zip(secs.parse::<u64>().ok())
            .map(|(s, t)| (PathBuf::from(dir), s, t)),
        _ => None,
    };
    let Some((dir, seed, secs)) = parsed else {
        eprintln!("usage: soak-writer DIR SEED SECONDS");
        std::process::exit(2);
    };
    match run(&dir, seed, secs) {
        Ok(c) => {
            println!(
                "{}: rewrites {} publishes {} overwrites {} fsyncs {} verifies {} written {} \
                 MiB read {} MiB",
                dir.file_name().unwrap_or_default().to_string_lossy(),
                c.rewrites,
                c.publishes,
                c.overwrites,
                c.fsyncs,
                c.verifies,
                c.bytes_written / MIB,
                c.bytes_read / MIB
            );
            for (name, (key, len)) in &c.last {
                println!("last {name} {key} {len}");
            }
        }
        Err(e) => {
            eprintln!("{} (seed {seed}): {e}", dir.display());
            std::process::exit(1);
        }
    }
}
