//! Concurrency soak: 16 writer processes (`soak-writer`, tests/src/bin) each rewrite, publish
//! by rename and overwrite their own files and read every one back after close; reader threads
//! meanwhile read the published files, the revisions of every file through the read-only view,
//! and the files being rewritten; `ckptfs gc` runs through the mount every 2 s. Nothing may
//! fail and nothing may miscompare: a published file or a revision is always one whole
//! version (tests/src/tagged.rs). Afterwards, after a remount, every file a writer wrote holds
//! exactly the last version it wrote (a file missing then is a failure), and the run must have
//! done enough of each kind of read and enough gc runs to have tested anything.
//!
//! Runs 20 s; `CKPTFS_SOAK_SECS` runs longer. `CKPTFS_SEED` replays the writers' choices.

use std::fs;
use std::io::{self, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ckptfs_tests::{first_difference, tagged, test_seed, TestMount};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const WRITERS: u64 = 16;
const READERS: u64 = 4;
const GC_EVERY: Duration = Duration::from_secs(2);
/// Beyond the run time, how long writers may take to finish their last op and exit.
const EXIT_GRACE: Duration = Duration::from_secs(120);

/// Floors, per run second where they scale: far below what a slow 2-core machine does
/// (measured there, debug build, 20 s: about 1700-1900 published files, 1900-2000
/// revisions and 870-910 live files read, 9-10 gc runs), so only a run where the readers or
/// gc were starved or shut out (every read ENOENT, gc blocked for the run) trips them.
const MIN_PUBLISHED_READS_PER_SEC: u64 = 1;
const MIN_REVISION_READS_PER_SEC: u64 = 1;
const MIN_LIVE_READS_PER_SEC: u64 = 1;
/// gc runs every 2 s: at least a third of the possible runs, and at least 3.
const MIN_GC_RUNS_FRACTION: u64 = 3;

#[derive(Default)]
struct ReadCounts {
    published: AtomicU64,
    revisions: AtomicU64,
    live: AtomicU64,
    vanished: AtomicU64,
    bytes: AtomicU64,
}

/// Reads `path` whole; Ok(None) when it is gone (replaced, unlinked, or dropped by gc) before
/// it could be opened. Any error after open is a failure: an open reader pins what it reads.
fn read_if_there(path: &std::path::Path) -> Result<Option<Vec<u8>>, String> {
    let mut f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("open {}: {e}", path.display())),
    };
    let mut data = Vec::new();
    f.read_to_end(&mut data)
        .map_err(|e| format!("read {} (open): {e}", path.display()))?;
    Ok(Some(data))
}

fn reader(
    mnt: &std::path::Path,
    seed: u64,
    stop: &AtomicBool,
    c: &ReadCounts,
) -> Result<(), String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let w = rng.random_range(0..WRITERS);
        let op = rng.random_range(0..10);
        if op < 4 {
            let rel = format!("w{w:02}/pub-{}", rng.random_range(0..2));
            if let Some(d) = read_if_there(&mnt.join(&rel))? {
                tagged::check(&d).map_err(|e| format!("published {rel}: {e}"))?;
                c.published.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(d.len() as u64, Ordering::Relaxed);
            } else {
                c.vanished.fetch_add(1, Ordering::Relaxed);
            }
        } else if op < 8 {
            let rel = if rng.random_bool(0.5) {
                format!("w{w:02}/pub-{}", rng.random_range(0..2))
            } else {
                format!("w{w:02}/own-{}", rng.random_range(0..3))
            };
            let dir = mnt.join(".ckptfs/revisions").join(&rel);
            let ids: Vec<_> = match fs::read_dir(&dir) {
                Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    c.vanished.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(e) => return Err(format!("readdir {}: {e}", dir.display())),
            };
            if ids.is_empty() {
                continue;
            }
            let p = &ids[rng.random_range(0..ids.len())];
            match read_if_there(p)? {
                Some(d) => {
                    tagged::check(&d).map_err(|e| format!("revision {}: {e}", p.display()))?;
                    c.revisions.fetch_add(1, Ordering::Relaxed);
                    c.bytes.fetch_add(d.len() as u64, Ordering::Relaxed);
                }
                None => {
                    c.vanished.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else {
            // A file its writer is rewriting right now: any content, but no error.
            let rel = format!("w{w:02}/own-{}", rng.random_range(0..3));
            if let Some(d) = read_if_there(&mnt.join(&rel))? {
                c.live.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// What a writer reported it wrote last: file name -> (tagged key, length).
type LastVersions = std::collections::BTreeMap<String, (u64, u64)>;

/// The `last FILE KEY LEN` lines of a writer's report.
fn parse_last(out: &str) -> Result<LastVersions, String> {
    let mut last = LastVersions::new();
    for line in out.lines().filter(|l| l.starts_with("last ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            [_, name, key, len] => key.parse().ok().zip(len.parse().ok()).map(|kl| (name, kl)),
            _ => None,
        };
        let (name, kl) = parsed.ok_or_else(|| format!("bad report line {line:?}"))?;
        last.insert(name.to_string(), kl);
    }
    Ok(last)
}

fn wait_all(
    children: Vec<(u64, Child)>,
    deadline: Instant,
) -> (Vec<String>, Vec<(u64, LastVersions)>) {
    let mut failures = Vec::new();
    let mut lasts = Vec::new();
    for (w, mut child) in children {
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => panic!("wait for writer {w}: {e}"),
            }
        };
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        match status {
            Some(st) if st.success() => {
                print!("  {}", out.lines().next().unwrap_or_default());
                println!();
                match parse_last(&out) {
                    Ok(l) => lasts.push((w, l)),
                    Err(e) => failures.push(format!("writer {w}: {e}")),
                }
            }
            Some(st) => failures.push(format!("writer {w} failed ({st}): {err}{out}")),
            None => failures.push(format!("writer {w} hung past the deadline; killed")),
        }
    }
    (failures, lasts)
}

#[test]
fn sixteen_writers_readers_and_gc_soak() {
    let seed = test_seed("sixteen_writers_readers_and_gc_soak", 0x50a4_0001);
    let secs: u64 = std::env::var("CKPTFS_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut m = TestMount::with_format_args("1G", &[]);
    let start = Instant::now();
    let mut children = Vec::new();
    for w in 0..WRITERS {
        let child = Command::new(env!("CARGO_BIN_EXE_soak-writer"))
            .arg(m.path(format!("w{w:02}")))
            .arg(seed.wrapping_mul(1000).wrapping_add(w).to_string())
            .arg(secs.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start soak-writer");
        children.push((w, child));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(ReadCounts::default());
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (mnt, stop, c) = (m.mnt().to_path_buf(), stop.clone(), counts.clone());
            std::thread::spawn(move || reader(&mnt, seed ^ ((r + 1) << 32), &stop, &c))
        })
        .collect();

    let (mut gcs, mut dropped, mut freed) = (0u64, 0u64, 0u64);
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(GC_EVERY);
        let r = m.gc(false);
        gcs += 1;
        dropped += r.revisions_dropped;
        freed += r.bytes_freed;
    }
    println!("writers:");
    let (mut failures, lasts) = wait_all(children, start + Duration::from_secs(secs) + EXIT_GRACE);
    stop.store(true, Ordering::Relaxed);
    for (i, h) in readers.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("reader {i}: {e}")),
            Err(_) => failures.push(format!("reader {i} panicked")),
        }
    }
    let c = &counts;
    println!(
        "readers: {} published files, {} revisions, {} live files read ({} MiB), {} gone \
         before open",
        c.published.load(Ordering::Relaxed),
        c.revisions.load(Ordering::Relaxed),
        c.live.load(Ordering::Relaxed),
        c.bytes.load(Ordering::Relaxed) >> 20,
        c.vanished.load(Ordering::Relaxed)
    );
    println!(
        "gc: {gcs} runs through the mount, {dropped} revisions dropped, {} MiB freed; {:.1} s",
        freed >> 20,
        start.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "soak failures:\n{}",
        failures.join("\n")
    );
    // Enough of everything happened for the run to mean something.
    let floor = |what: &str, got: u64, min: u64| {
        assert!(
            got >= min,
            "only {got} {what} in a {secs} s soak (floor {min}): readers or gc were starved \
             or shut out"
        );
    };
    floor(
        "published files read",
        c.published.load(Ordering::Relaxed),
        MIN_PUBLISHED_READS_PER_SEC * secs,
    );
    floor(
        "revisions read through the view",
        c.revisions.load(Ordering::Relaxed),
        MIN_REVISION_READS_PER_SEC * secs,
    );
    floor(
        "files being rewritten read",
        c.live.load(Ordering::Relaxed),
        MIN_LIVE_READS_PER_SEC * secs,
    );
    let possible_gcs = secs / GC_EVERY.as_secs();
    floor("gc runs", gcs, (possible_gcs / MIN_GC_RUNS_FRACTION).max(3));
    floor("revisions dropped by gc", dropped, 1);
    assert_eq!(lasts.len() as u64, WRITERS, "every writer reported");
    let published: usize = lasts
        .iter()
        .map(|(_, l)| l.keys().filter(|n| n.starts_with("pub-")).count())
        .sum();
    floor("files published", published as u64, WRITERS);

    // After a remount every file holds exactly the last version its writer wrote, and a
    // published name no writer published does not exist.
    m.remount();
    for (w, last) in &lasts {
        for name in ["pub-0", "pub-1", "own-0", "own-1", "own-2"] {
            let p = m.path(format!("w{w:02}/{name}"));
            let got = read_if_there(&p).expect("read after remount");
            match (last.get(name), got) {
                (Some(&(key, len)), Some(d)) => {
                    if let Some(diff) = first_difference(&d, &tagged::bytes(key, len)) {
                        panic!(
                            "{} after remount is not the last version written (key {key:#x}, \
                             {len} bytes): {diff}",
                            p.display()
                        );
                    }
                }
                (Some(&(key, len)), None) => panic!(
                    "{} is missing after remount; its writer last wrote key {key:#x}, {len} \
                     bytes",
                    p.display()
                ),
                (None, Some(d)) if name.starts_with("pub-") => panic!(
                    "{} exists after remount ({} bytes) but was never published",
                    p.display(),
                    d.len()
                ),
                (None, _) => {}
            }
        }
    }
}
