//! Garbage collection and retention: a 256 MiB space absorbs 50 revisions of a 64 MiB
//! checkpoint (automatic gc), `ckptfs gc` runs while writers and readers are busy and keeps
//! exactly what the policy says, `--dry-run` changes nothing, offline gc works, the policy can
//! be read and changed with `ckptfs config`, and a seeded model of writes, unlinks, renames, gc
//! and remounts agrees with what `ckptfs revisions` and the revisions view show.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckptfs_engine::format::{ChunkParams, Superblock};
use ckptfs_engine::space::Stats;
use ckptfs_tests::{
    assert_file_eq, assert_file_matches, fill_pattern, first_difference, mix, statvfs_bytes,
    test_seed, unix_secs_now, wait_for_clock_past, write_file_checked, write_file_with, Revision,
    TempDir, TestMount,
};
use ckptfs_tests::{Report, StatsReport};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// The policy must be what the test formatted (and keep-age off, so only keep-N decides).
#[track_caller]
fn expect_policy(m: &mut TestMount, keep: u64, auto_gc: u64) {
    let c = m.config(&[]);
    println!("policy: {c}");
    assert_eq!(c["keep_revisions"].as_u64(), Some(keep), "config: {c}");
    assert_eq!(
        c["keep_age_secs"].as_u64(),
        Some(0),
        "keep-age defaults to off: {c}"
    );
    assert_eq!(
        c["auto_gc_free_percent"].as_u64(),
        Some(auto_gc),
        "config: {c}"
    );
    assert_eq!(
        c["keep_unlinked_secs"].as_u64(),
        Some(7 * 24 * 3600),
        "keep-unlinked defaults to 7d: {c}"
    );
}

fn show_stats(stage: &str, s: &Report<StatsReport>) {
    println!(
        "{stage:<34} free={} stored={} used={} revisions={} reserved={} chunks={}",
        s.stats.free_bytes,
        s.stats.stored_bytes,
        s.stats.used_bytes,
        s.stats.revisions,
        s.stats.reserved_bytes,
        s.stats.chunks,
    );
}

// ---------------------------------------------------------------------------------------------
// (a) 50 revisions of a 64 MiB checkpoint, 30% changed each time, in a 256 MiB space.

const TENSOR: u64 = MIB;
const TENSORS: usize = 64;
const GROUP: usize = 4;
const CHANGED_GROUPS: usize = 5; // 5 x 4 MiB = 20 MiB of 64 MiB: 31%
const CKPT: u64 = TENSOR * TENSORS as u64;

/// Bytes of a checkpoint whose tensor `t` is at version `versions[t]`.
fn ckpt_fill(seed: u64, versions: &[u32], off: u64, buf: &mut [u8]) {
    let mut pos = off;
    let mut i = 0;
    while i < buf.len() {
        let t = (pos / TENSOR) as usize;
        let n = ((TENSOR - pos % TENSOR) as usize).min(buf.len() - i);
        let key = mix(mix(seed, t as u64), versions[t] as u64);
        fill_pattern(key, pos, &mut buf[i..i + n]);
        i += n;
        pos += n as u64;
    }
}

#[test]
fn fifty_revisions_of_a_64mib_checkpoint_fit_in_256mib_with_keep_2() {
    let seed = test_seed("gc_256m", 0x5eed_2001);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "2"]);
    let c = m.config(&[]);
    println!("policy: {c}");
    assert_eq!(c["keep_revisions"].as_u64(), Some(2), "config: {c}");
    assert_eq!(
        c["auto_gc_free_percent"].as_u64(),
        Some(20),
        "default auto gc: {c}"
    );
    let rel = "model.ckpt";
    let path = m.path(rel);
    let mut history: Vec<Vec<u32>> = Vec::new();
    let mut versions = vec![0u32; TENSORS];
    let start = Instant::now();
    show_stats("empty", &m.stats());
    let mut min_free = (u64::MAX, 0u32);
    for rev in 0..50u32 {
        if rev > 0 {
            let mut groups: Vec<usize> = (0..TENSORS / GROUP).collect();
            for k in 0..CHANGED_GROUPS {
                let j = rng.random_range(k..groups.len());
                groups.swap(k, j);
                for v in &mut versions[groups[k] * GROUP..(groups[k] + 1) * GROUP] {
                    *v = rev;
                }
            }
        }
        let t0 = Instant::now();
        let r = write_file_with(&path, CKPT, MIB as usize, |off, buf| {
            ckpt_fill(seed, &versions, off, buf)
        });
        if let Err(e) = r {
            let s = m.stats();
            panic!(
                "revision {rev} of the 64 MiB checkpoint failed ({e}) after {:.1}s; stats: {s}",
                start.elapsed().as_secs_f64()
            );
        }
        history.push(versions.clone());
        let s = m.stats();
        let free = s.stats.free_bytes;
        if free < min_free.0 {
            min_free = (free, rev);
        }
        if rev % 10 == 9 || rev < 4 {
            show_stats(
                &format!("after revision {rev} ({:.1}s)", t0.elapsed().as_secs_f64()),
                &s,
            );
        }
    }
    println!(
        "50 revisions of 64 MiB written in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    println!(
        "lowest free space after a revision: {} bytes (after revision {})",
        min_free.0, min_free.1
    );
    let s = m.stats();
    show_stats("after 50 revisions", &s);
    println!("stats: {s}");

    let check_last_two = |m: &mut TestMount, what: &str| {
        let revs = m.revisions(rel);
        println!("{what}: {} revisions listed", revs.len());
        assert!(revs.len() >= 2, "{what}: keep-2 keeps two: {revs:#?}");
        let n = revs.len();
        assert!(
            revs[n - 1].current && !revs[n - 2].current,
            "{what}: {revs:#?}"
        );
        for (r, v) in revs[n - 2..].iter().zip(&history[48..]) {
            assert_eq!(r.size, CKPT, "{what}: {r:?}");
            assert_file_matches(&m.view_path(rel, r.id), CKPT, |off, buf| {
                ckpt_fill(seed, v, off, buf)
            });
        }
        assert_file_matches(&m.path(rel), CKPT, |off, buf| {
            ckpt_fill(seed, &history[49], off, buf)
        });
    };
    check_last_two(&mut m, "after 50 revisions");

    let g = m.gc(false);
    println!("explicit gc: {g}");
    let revs = m.revisions(rel);
    assert_eq!(revs.len(), 2, "after gc, keep-2 lists two: {revs:#?}");
    m.remount();
    check_last_two(&mut m, "after remount");
    show_stats("after remount", &m.stats());
}

// ---------------------------------------------------------------------------------------------
// Self-describing file contents for the concurrency test: a 32-byte header names (file,
// round); 64 KiB blocks change every 1-4 rounds so revisions share chunks.

const HDR_MAGIC: &[u8; 8] = b"CKGCTST1";
const BLOCK: u64 = 64 * KIB;

fn base_len(seed: u64, file: u32) -> u64 {
    64 * KIB + mix(seed, 0xf11e ^ file as u64) % (960 * KIB)
}

fn round_len(seed: u64, file: u32, round: u32) -> u64 {
    let b = base_len(seed, file);
    b + mix(mix(seed, file as u64), round as u64) % (b / 4)
}

fn header(seed: u64, file: u32, round: u32, len: u64) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(HDR_MAGIC);
    h[8..12].copy_from_slice(&file.to_le_bytes());
    h[12..16].copy_from_slice(&round.to_le_bytes());
    h[16..24].copy_from_slice(&len.to_le_bytes());
    h[24..32].copy_from_slice(&mix(seed, len ^ ((file as u64) << 32 | round as u64)).to_le_bytes());
    h
}

fn file_fill(seed: u64, file: u32, round: u32, len: u64, off: u64, buf: &mut [u8]) {
    let mut pos = off;
    let mut i = 0;
    while i < buf.len() {
        let b = pos / BLOCK;
        let n = ((BLOCK - pos % BLOCK) as usize).min(buf.len() - i);
        let period = 1 + mix(file as u64, b) % 4;
        let key = mix(
            mix(seed, file as u64 + 1000),
            (b << 32) | (round as u64 / period),
        );
        fill_pattern(key, pos, &mut buf[i..i + n]);
        i += n;
        pos += n as u64;
    }
    let h = header(seed, file, round, len);
    if off < 32 {
        let end = (32usize).min(off as usize + buf.len());
        buf[..end - off as usize].copy_from_slice(&h[off as usize..end]);
    }
}

fn file_content(seed: u64, file: u32, round: u32) -> Vec<u8> {
    let len = round_len(seed, file, round);
    let mut v = vec![0u8; len as usize];
    file_fill(seed, file, round, len, 0, &mut v);
    v
}

/// Checks that `data` is exactly one complete version of `file`; returns its round.
fn check_complete(seed: u64, file: u32, data: &[u8]) -> Result<u32, String> {
    if data.len() < 32 || &data[..8] != HDR_MAGIC {
        return Err(format!(
            "not a complete version (len {}, head {:02x?})",
            data.len(),
            &data[..data.len().min(16)]
        ));
    }
    let f = u32::from_le_bytes(data[8..12].try_into().expect("4"));
    let round = u32::from_le_bytes(data[12..16].try_into().expect("4"));
    if f != file {
        return Err(format!("header names file {f}, expected {file}"));
    }
    let want = file_content(seed, file, round);
    match first_difference(data, &want) {
        None => Ok(round),
        Some(d) => Err(format!("round {round}: {d}")),
    }
}

struct GcFile {
    id: u32,
    rel: String,
    /// Written as tmp + rename over the target (readers may check the live file); otherwise
    /// O_TRUNC + write + close in place.
    atomic: bool,
    writer: usize,
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn gc_while_writers_and_readers_are_busy_keeps_exactly_the_policy() {
    const WRITERS: usize = 2;
    const READERS: usize = 2;
    const KEEP: usize = 3;
    const GCS: usize = 12;
    const MAX_ROUNDS_PER_WRITER: u64 = 150;
    let seed = test_seed("gc_concurrent", 0x5eed_2002);
    let mut m = TestMount::with_format_args(
        "1G",
        &["--keep-revisions", "3", "--auto-gc-free-percent", "0"],
    );
    expect_policy(&mut m, KEEP as u64, 0);
    let mut files = Vec::new();
    for w in 0..WRITERS {
        fs::create_dir(m.path(format!("w{w}"))).expect("mkdir");
        for i in 0..4u32 {
            let atomic = i % 2 == 0;
            files.push(GcFile {
                id: files.len() as u32,
                rel: format!("w{w}/{}{i}.pt", if atomic { "a" } else { "d" }),
                atomic,
                writer: w,
            });
        }
    }
    // Round 0 of every file, written in place before the threads start.
    for f in &files {
        write_file_checked(&m.path(&f.rel), &file_content(seed, f.id, 0)).expect("round 0");
    }
    let files = Arc::new(files);
    let stop = Arc::new(AtomicBool::new(false));
    let rounds_done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mnt = m.mnt().to_path_buf();

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (files, stop, rounds_done, failures, mnt) = (
            files.clone(),
            stop.clone(),
            rounds_done.clone(),
            failures.clone(),
            mnt.clone(),
        );
        writers.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(mix(seed, 100 + w as u64));
            let mine: Vec<&GcFile> = files.iter().filter(|f| f.writer == w).collect();
            let mut rounds: BTreeMap<u32, Vec<u32>> =
                mine.iter().map(|f| (f.id, vec![0u32])).collect();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && n < MAX_ROUNDS_PER_WRITER {
                let f = mine[rng.random_range(0..mine.len())];
                let round = *rounds[&f.id].last().expect("round") + 1;
                let len = round_len(seed, f.id, round);
                let target = mnt.join(&f.rel);
                let dest = if f.atomic {
                    mnt.join(format!("{}.tmp", f.rel))
                } else {
                    target.clone()
                };
                let r = write_file_with(&dest, len, 256 * KIB as usize, |off, buf| {
                    file_fill(seed, f.id, round, len, off, buf)
                })
                .and_then(|()| {
                    if f.atomic {
                        fs::rename(&dest, &target)
                    } else {
                        Ok(())
                    }
                });
                if let Err(e) = r {
                    failures
                        .lock()
                        .expect("lock")
                        .push(format!("writer {w}: {} round {round}: {e}", f.rel));
                    break;
                }
                rounds.get_mut(&f.id).expect("mine").push(round);
                n += 1;
                rounds_done.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
            rounds
        }));
    }

    let view_stats = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut readers = Vec::new();
    for rd in 0..READERS {
        let (files, stop, failures, mnt, view_stats) = (
            files.clone(),
            stop.clone(),
            failures.clone(),
            mnt.clone(),
            view_stats.clone(),
        );
        readers.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(mix(seed, 200 + rd as u64));
            let fail = |msg: String| failures.lock().expect("lock").push(msg);
            while !stop.load(Ordering::Relaxed) {
                let f = &files[rng.random_range(0..files.len())];
                // The live file: always a complete version when replaced by rename.
                match fs::read(mnt.join(&f.rel)) {
                    Ok(data) if f.atomic => {
                        if let Err(e) = check_complete(seed, f.id, &data) {
                            fail(format!("reader {rd}: live {}: {e}", f.rel));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => fail(format!("reader {rd}: read live {}: {e}", f.rel)),
                }
                // A random listed revision through the view: gc may drop it between readdir
                // and read (ENOENT/ESTALE), but bytes that are returned must be exact.
                let dir = mnt.join(".ckptfs/revisions").join(&f.rel);
                let names: Vec<PathBuf> = match fs::read_dir(&dir) {
                    Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
                    Err(e) => {
                        fail(format!("reader {rd}: read_dir {}: {e}", dir.display()));
                        Vec::new()
                    }
                };
                if !names.is_empty() {
                    let p = &names[rng.random_range(0..names.len())];
                    let r = fs::File::open(p).and_then(|mut fh| {
                        let mut v = Vec::new();
                        fh.read_to_end(&mut v).map(|_| v)
                    });
                    match r {
                        Ok(data) => {
                            view_stats[0].fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = check_complete(seed, f.id, &data) {
                                fail(format!("reader {rd}: view {}: {e}", p.display()));
                            }
                        }
                        Err(e) if [libc::ENOENT, libc::ESTALE].contains(&errno_of(&e)) => {
                            view_stats[1].fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            view_stats[2].fetch_add(1, Ordering::Relaxed);
                            fail(format!("reader {rd}: view {}: {e}", p.display()));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
    }

    let mut last = 0;
    for g in 0..GCS {
        // Let the writers make progress between runs (unless they reached their cap).
        let deadline = Instant::now() + Duration::from_secs(120);
        while rounds_done.load(Ordering::Relaxed) < last + 4
            && rounds_done.load(Ordering::Relaxed) < WRITERS as u64 * MAX_ROUNDS_PER_WRITER
            && failures.lock().expect("lock").is_empty()
        {
            assert!(
                Instant::now() < deadline,
                "writers made no progress in 120s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        last = rounds_done.load(Ordering::Relaxed);
        let t = Instant::now();
        let rep = m.gc(false);
        println!(
            "gc #{g} (after {last} rounds, {:.2}s): {rep}",
            t.elapsed().as_secs_f64()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let written: Vec<BTreeMap<u32, Vec<u32>>> = writers
        .into_iter()
        .map(|h| h.join().expect("writer panicked"))
        .collect();
    for h in readers {
        h.join().expect("reader panicked");
    }
    println!(
        "{} rounds written; view reads: {} exact, {} vanished under gc, {} failed",
        rounds_done.load(Ordering::Relaxed),
        view_stats[0].load(Ordering::Relaxed),
        view_stats[1].load(Ordering::Relaxed),
        view_stats[2].load(Ordering::Relaxed)
    );
    let failures = failures.lock().expect("lock").clone();
    let writer_failures: Vec<&String> = failures
        .iter()
        .filter(|f| f.starts_with("writer"))
        .collect();
    assert!(
        writer_failures.is_empty(),
        "writes failed while gc ran:\n{writer_failures:#?}\nall failures:\n{}",
        failures.join("\n")
    );
    // Reader failures are reported at the end, after the final checks have run too.
    if !failures.is_empty() {
        println!(
            "{} reader failures while gc ran (reported at the end):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    let mut rounds: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for w in written {
        rounds.extend(w);
    }

    // A final gc with nothing in flight: exactly the newest KEEP revisions of every path remain.
    let rep = m.gc(false);
    println!("final gc: {rep}");
    let verify = |m: &mut TestMount, what: &str| -> BTreeMap<u32, Vec<Revision>> {
        let mut out = BTreeMap::new();
        for f in files.iter() {
            let all = &rounds[&f.id];
            let kept = &all[all.len().saturating_sub(KEEP)..];
            let revs = m.revisions(&f.rel);
            let sizes: Vec<u64> = revs.iter().map(|r| r.size).collect();
            let want: Vec<u64> = kept.iter().map(|&r| round_len(seed, f.id, r)).collect();
            assert_eq!(
                sizes,
                want,
                "{what}: {} ({} rounds written) must list exactly its newest {KEEP} \
                 revisions (rounds {kept:?}): {revs:#?}",
                f.rel,
                all.len()
            );
            for (i, (r, &round)) in revs.iter().zip(kept).enumerate() {
                assert_eq!(r.current, i + 1 == revs.len(), "{what}: {revs:#?}");
                let p = m.view_path(&f.rel, r.id);
                let data = fs::read(&p).unwrap_or_else(|e| panic!("{what}: {}: {e}", p.display()));
                match check_complete(seed, f.id, &data) {
                    Ok(got) if got == round => {}
                    Ok(got) => panic!(
                        "{what}: {} is round {got}, expected round {round}",
                        p.display()
                    ),
                    Err(e) => panic!("{what}: {}: {e}", p.display()),
                }
            }
            let names: BTreeSet<String> = fs::read_dir(m.view_dir(&f.rel))
                .expect("read_dir view")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            let ids: BTreeSet<String> = revs.iter().map(|r| r.id.to_string()).collect();
            assert_eq!(names, ids, "{what}: view entries of {}", f.rel);
            assert_file_eq(
                &m.path(&f.rel),
                &file_content(seed, f.id, *all.last().expect("round")),
            );
            out.insert(f.id, revs);
        }
        out
    };
    let listed = verify(&mut m, "after the final gc");

    let s = m.stats();
    show_stats("after the final gc", &s);
    let (bavail, blocks) = statvfs_bytes(m.mnt());
    let chunk = ChunkParams::from_avg(s.stats.chunk_avg_bytes).expect("chunk size");
    let seg = Superblock::segment_bytes_for(chunk) as u64;
    let free = s.stats.free_bytes;
    println!("statvfs: f_bavail*f_frsize={bavail} f_blocks*f_frsize={blocks}; stats free_bytes={free}; segment {seg}");
    assert!(
        free.abs_diff(bavail) <= seg,
        "stats free_bytes {free} and statvfs f_bavail*f_frsize {bavail} differ by more than one \
         segment ({seg})"
    );

    m.remount();
    let again = verify(&mut m, "after remount");
    for (id, revs) in &listed {
        let ids = |v: &[Revision]| v.iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(revs), ids(&again[id]), "revision ids survive a remount");
    }
    assert!(
        failures.is_empty(),
        "the final checks passed, but readers failed while gc ran ({}):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// An inode the kernel holds without an open handle (an `O_PATH` descriptor here; a path
/// walk between its lookup and its open in general) keeps its record and its bytes through
/// a rename over its name, an unlink and gc, however short retention is: reopened through
/// `/proc/self/fd` it reads what it held, as on a local filesystem. Once the descriptor is
/// closed and the kernel forgets the inode, gc removes it.
#[test]
fn an_inode_the_kernel_holds_keeps_its_bytes_through_rename_unlink_and_gc() {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let seed = test_seed("held_inode", 0x5eed_2004);
    let mut m = TestMount::with_format_args(
        "1G",
        &[
            "--keep-revisions",
            "1",
            "--keep-unlinked",
            "0",
            "--auto-gc-free-percent",
            "0",
        ],
    );
    let (a, b) = (file_content(seed, 0, 0), file_content(seed, 0, 1));
    let (target, tmp, gone) = (m.path("held.pt"), m.path("held.pt.tmp"), m.path("gone.pt"));
    fs::write(&target, &a).expect("write a");
    fs::write(&gone, &b).expect("write gone");
    let o_path = |p: &PathBuf| {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(p)
            .unwrap_or_else(|e| panic!("O_PATH {}: {e}", p.display()))
    };
    let held = o_path(&target);
    let held_gone = o_path(&gone);
    fs::write(&tmp, &b).expect("write b");
    fs::rename(&tmp, &target).expect("rename over");
    fs::remove_file(&gone).expect("unlink");
    for i in 0..2 {
        let r = m.gc(false);
        println!("gc {i} with the inodes held: {r}");
        assert_eq!(
            r.inodes_dropped, 0,
            "gc removed an inode the kernel holds: {r}"
        );
    }
    for (f, want, what) in [
        (&held, &a, "replaced by rename"),
        (&held_gone, &b, "unlinked"),
    ] {
        let proc = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        let md = fs::metadata(&proc).unwrap_or_else(|e| panic!("stat the {what} inode: {e}"));
        assert_eq!(md.nlink(), 0, "the {what} inode has no name left");
        let got = fs::read(&proc).unwrap_or_else(|e| panic!("reopen the {what} inode: {e}"));
        assert!(
            first_difference(&got, want).is_none(),
            "the {what} inode reads other bytes than it held"
        );
    }
    assert_file_eq(&target, &b);
    drop(held);
    drop(held_gone);
    // The kernel forgets an inode whose last name is gone when its last reference goes,
    // in a FORGET it sends on its own: gc removes both once it has arrived.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut dropped = 0;
    while dropped < 2 {
        assert!(
            Instant::now() < deadline,
            "the kernel's forget never let gc remove the inodes ({dropped} of 2)"
        );
        dropped += m.gc(false).inodes_dropped;
    }
    assert_eq!(dropped, 2, "exactly the two inodes that lost their names");
    assert_file_eq(&target, &b);
}

/// A name replaced by rename stays openable while gc drops the inode it replaced. The kernel
/// looks a name up and then opens the inode it found, in two requests: a rename between them
/// makes that inode unlinked, and a gc between them removes its record (nobody had it open).
/// The open must then not fail with ENOENT, as no local filesystem's would: the daemon answers
/// ESTALE, and the kernel looks the name up again and opens the file that replaced it.
/// Readers are threads and `cat` processes; every read must be one complete version.
/// `CKPTFS_RENAME_GC_ROUNDS` (default 400) sets how many renames run under gc.
#[test]
fn a_name_replaced_by_rename_stays_openable_while_gc_drops_the_old_inode() {
    const READERS: usize = 2;
    let rounds: u32 = std::env::var("CKPTFS_RENAME_GC_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let seed = test_seed("rename_under_gc", 0x5eed_2003);
    let mut m = TestMount::with_format_args(
        "1G",
        &["--keep-revisions", "1", "--auto-gc-free-percent", "0"],
    );
    // Small versions (one file id, many rounds): the renames, not the writes, should
    // dominate, so the lookup-to-open window is hit often.
    let rel = "live.pt";
    let target = m.path(rel);
    let tmp = m.path("live.pt.tmp");
    fs::write(&target, file_content(seed, 0, 0)).expect("round 0");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let reads = Arc::new(AtomicU64::new(0));
    let gc_runs = Arc::new(AtomicU64::new(0));

    let renamer = {
        let (stop, done, failures) = (stop.clone(), done.clone(), failures.clone());
        let (target, tmp) = (target.clone(), tmp.clone());
        std::thread::spawn(move || {
            for round in 1..=rounds {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = fs::write(&tmp, file_content(seed, 0, round))
                    .and_then(|()| fs::rename(&tmp, &target));
                if let Err(e) = r {
                    failures
                        .lock()
                        .expect("lock")
                        .push(format!("renamer round {round}: {e}"));
                    break;
                }
                done.store(round as u64, Ordering::Relaxed);
            }
            done.store(u64::MAX, Ordering::Relaxed);
        })
    };
    let mut readers = Vec::new();
    for rd in 0..READERS {
        let (stop, failures, target, reads, done, gcs) = (
            stop.clone(),
            failures.clone(),
            target.clone(),
            reads.clone(),
            done.clone(),
            gc_runs.clone(),
        );
        readers.push(std::thread::spawn(move || {
            use std::os::unix::fs::OpenOptionsExt;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                // Every other read holds the inode first (`O_PATH`) and reopens it by
                // number after a rename replaced it and a gc ran: the lookup-to-open
                // window, held open until both happened.
                let r = if n.is_multiple_of(2) {
                    fs::read(&target)
                } else {
                    fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_PATH)
                        .open(&target)
                        .and_then(|f| {
                            let (r0, g0) =
                                (done.load(Ordering::SeqCst), gcs.load(Ordering::SeqCst));
                            let replaced_and_collected = || {
                                done.load(Ordering::SeqCst) > r0
                                    && gcs.load(Ordering::SeqCst) >= g0 + 2
                            };
                            while !stop.load(Ordering::Relaxed) && !replaced_and_collected() {
                                std::thread::yield_now();
                            }
                            fs::read(format!("/proc/self/fd/{}", f.as_raw_fd()))
                        })
                };
                match r {
                    Ok(data) => {
                        if let Err(e) = check_complete(seed, 0, &data) {
                            failures
                                .lock()
                                .expect("lock")
                                .push(format!("reader {rd}: {e}"));
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures
                        .lock()
                        .expect("lock")
                        .push(format!("reader {rd}: open/read: {e}")),
                }
            }
        }));
    }
    // Two shell loops of `cat`: the same lookup-then-open from other processes.
    let stop_file = TempDir::new("rename-gc-stop");
    let stop_path = stop_file.path().join("stop");
    let cats: Vec<std::process::Child> = (0..2)
        .map(|_| {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(
                    "n=0; while [ ! -e \"$2\" ]; do cat \"$1\" > /dev/null || \
                     { echo \"cat failed after $n reads\" >&2; exit 1; }; n=$((n+1)); done",
                )
                .arg("sh")
                .arg(&target)
                .arg(&stop_path)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn sh")
        })
        .collect();

    let mut gcs = 0u64;
    let mut inodes_dropped = 0u64;
    let deadline = Instant::now() + Duration::from_secs(600);
    while done.load(Ordering::Relaxed) != u64::MAX {
        assert!(Instant::now() < deadline, "renames made no progress");
        inodes_dropped += m.gc(false).inodes_dropped;
        gcs += 1;
        gc_runs.store(gcs, Ordering::SeqCst);
    }
    let during = inodes_dropped;
    stop.store(true, Ordering::Relaxed);
    fs::write(&stop_path, b"").expect("stop file");
    renamer.join().expect("renamer panicked");
    for h in readers {
        h.join().expect("reader panicked");
    }
    let mut failures = failures.lock().expect("lock").clone();
    for c in cats {
        let out = c.wait_with_output().expect("wait sh");
        if !out.status.success() {
            failures.push(format!(
                "cat loop: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    println!(
        "{rounds} renames, {gcs} gc runs dropped {during} replaced inodes while readers ran, \
         {} reads by threads",
        reads.load(Ordering::Relaxed)
    );
    assert!(
        during > 0,
        "gc never dropped a replaced inode: the race was not exercised"
    );
    // Every rename replaced one inode. With the readers gone the kernel forgets the last
    // of them (FORGET arrives on its own), and gc removes them all: no kernel reference
    // was counted more often than the kernel forgot it.
    while inodes_dropped < rounds as u64 {
        assert!(
            Instant::now() < deadline,
            "gc removed {inodes_dropped} of the {rounds} replaced inodes: kernel references \
             were counted and never forgotten"
        );
        inodes_dropped += m.gc(false).inodes_dropped;
    }
    assert_eq!(
        inodes_dropped, rounds as u64,
        "one replaced inode per rename"
    );
    assert!(
        failures.is_empty(),
        "opens of a name replaced by rename failed while gc ran ({}):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_file_eq(&target, &file_content(seed, 0, rounds));
}

// ---------------------------------------------------------------------------------------------
// (c) --dry-run changes nothing; offline gc drops exactly what the policy says.

fn version(seed: u64, i: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    fill_pattern(mix(seed, i + 1), 0, &mut v);
    v
}

/// The stats figures gc could change (all but the stage timings).
fn stats_core(s: &StatsReport) -> Stats {
    Stats {
        stages: Vec::new(),
        ..s.stats.clone()
    }
}

fn listing_key(revs: &[Revision]) -> Vec<(u64, u64, bool, i64)> {
    revs.iter()
        .map(|r| {
            (
                r.id,
                r.size,
                r.current,
                (r.committed_unix * 1000.0).round() as i64,
            )
        })
        .collect()
}

#[test]
fn dry_run_changes_nothing_and_offline_gc_keeps_the_newest_n() {
    let seed = test_seed("gc_dry_run", 0x5eed_2003);
    let mut m = TestMount::with_format_args(
        "512M",
        &["--keep-revisions", "2", "--auto-gc-free-percent", "0"],
    );
    expect_policy(&mut m, 2, 0);
    let live = ["a.bin", "b.bin", "c.bin"];
    let mut contents: BTreeMap<&str, Vec<Vec<u8>>> = BTreeMap::new();
    for (k, rel) in live.iter().enumerate() {
        for i in 0..5u64 {
            let v = version(seed, 10 * k as u64 + i, 4 * MIB);
            write_file_checked(&m.path(rel), &v).expect("write");
            contents.entry(rel).or_default().push(v);
        }
    }
    let gone = "u.bin";
    for i in 0..2u64 {
        let v = version(seed, 100 + i, MIB + 17);
        write_file_checked(&m.path(gone), &v).expect("write");
        contents.entry(gone).or_default().push(v);
    }
    fs::remove_file(m.path(gone)).expect("rm");
    let all: Vec<&str> = live.iter().copied().chain([gone]).collect();

    let lists0: BTreeMap<&str, Vec<Revision>> =
        all.iter().map(|rel| (*rel, m.revisions(rel))).collect();
    for rel in &all {
        assert_eq!(
            lists0[rel].len(),
            contents[rel].len(),
            "{rel}: {:#?}",
            lists0[rel]
        );
    }
    let raw0: BTreeMap<&str, serde_json::Value> = all
        .iter()
        .map(|rel| (*rel, m.try_revisions_json(rel).expect("revisions")))
        .collect();
    let s0 = m.stats();
    show_stats("before", &s0);

    let dry = m.gc(true);
    println!("gc --dry-run (mounted): {dry}");
    assert_eq!(
        dry.revisions_dropped, 9,
        "3 paths x (5 - keep 2) would be dropped: {dry}"
    );
    let s1 = m.stats();
    assert_eq!(
        stats_core(&s1),
        stats_core(&s0),
        "stats changed by gc --dry-run"
    );
    for rel in &all {
        let raw = m.try_revisions_json(rel).expect("revisions");
        assert_eq!(raw, raw0[rel], "{rel}: `revisions` changed by gc --dry-run");
    }
    for rel in &live {
        for (r, c) in lists0[rel].iter().zip(&contents[rel]) {
            assert_file_eq(&m.view_path(rel, r.id), c);
        }
    }

    m.unmount();
    let s2 = m.stats();
    show_stats("offline", &s2);
    assert_eq!(
        s2.stats.files, s0.stats.files,
        "files mounted {s0} vs offline {s2}: the rm of {gone} just before umount was lost"
    );
    let dry2 = m.gc(true);
    println!("gc --dry-run (offline): {dry2}");
    assert_eq!(dry2.revisions_dropped, 9, "{dry2}");
    assert_eq!(
        stats_core(&m.stats()),
        stats_core(&s2),
        "stats changed by offline gc --dry-run"
    );
    for rel in &all {
        assert_eq!(
            listing_key(&m.revisions(rel)),
            listing_key(&lists0[rel]),
            "{rel}: `revisions --space` after offline gc --dry-run"
        );
    }

    let real = m.gc(false);
    println!("gc (offline): {real}");
    assert_eq!(real.revisions_dropped, 9, "{real}");
    assert!(real.chunks_freed > 0, "{real}");
    assert!(real.bytes_freed > 0, "{real}");
    assert!(
        real.free_bytes_after > real.free_bytes_before,
        "36 MiB of unique data dropped: {real}"
    );
    let s3 = m.stats();
    show_stats("after offline gc", &s3);
    assert_eq!(
        s3.stats.revisions,
        s2.stats.revisions - 9,
        "stats revisions before {s2} after {s3}"
    );
    assert!(s3.stats.free_bytes > s2.stats.free_bytes, "{s2} -> {s3}");
    assert!(
        s3.stats.stored_bytes < s2.stats.stored_bytes,
        "{s2} -> {s3}"
    );
    for rel in &all {
        let l = m.revisions(rel);
        let want = &lists0[rel][lists0[rel].len() - 2..];
        assert_eq!(
            l.iter().map(|r| (r.id, r.size)).collect::<Vec<_>>(),
            want.iter().map(|r| (r.id, r.size)).collect::<Vec<_>>(),
            "{rel}: offline gc keeps the newest 2: {l:#?}"
        );
    }

    m.mount();
    let scratch = TempDir::new("gc-dry");
    for rel in &all {
        let l = m.revisions(rel);
        let n = contents[rel].len();
        assert_eq!(l.len(), 2, "{rel} after remount: {l:#?}");
        for (r, c) in l.iter().zip(&contents[rel][n - 2..]) {
            if live.contains(rel) {
                assert_file_eq(&m.view_path(rel, r.id), c);
                let to = scratch.path().join(format!("{rel}-{}", r.id));
                m.restore_to(rel, r.id, &to);
                assert_file_eq(&to, c);
            }
        }
        if live.contains(rel) {
            assert!(l[1].current, "{rel}: {l:#?}");
            assert_file_eq(&m.path(rel), &contents[rel][n - 1]);
            for r in &lists0[rel][..n - 2] {
                let p = m.view_path(rel, r.id);
                let e = fs::metadata(&p).err().and_then(|e| e.raw_os_error());
                assert_eq!(e, Some(libc::ENOENT), "dropped {} is gone", p.display());
            }
        }
    }
    let again = m.gc(false);
    println!("gc again (mounted): {again}");
    assert_eq!(again.revisions_dropped, 0, "{again}");
    // The rm'd path's two kept revisions: restore the older in place, then copy out the newer.
    let l = m.revisions(gone);
    m.restore(gone, l[0].id);
    assert_file_eq(&m.path(gone), &contents[gone][0]);
    let to = scratch.path().join("u-newest");
    m.restore_to(gone, l[1].id, &to);
    assert_file_eq(&to, &contents[gone][1]);
}

// ---------------------------------------------------------------------------------------------
// Policy: keep-age protects young revisions, keep-unlinked expires rm'd paths, `ckptfs config`
// changes the policy mounted and offline.

#[test]
fn config_changes_policy_keep_age_and_keep_unlinked_apply() {
    let seed = test_seed("gc_policy", 0x5eed_2004);
    let mut m = TestMount::with_format_args(
        "256M",
        &[
            "--keep-revisions",
            "3",
            "--keep-age",
            "1h",
            "--auto-gc-free-percent",
            "0",
        ],
    );
    let c = m.config(&[]);
    println!("policy at format: {c}");
    assert_eq!(c["keep_revisions"].as_u64(), Some(3), "{c}");
    assert_eq!(c["keep_age_secs"].as_u64(), Some(3600), "{c}");
    assert_eq!(c["keep_unlinked_secs"].as_u64(), Some(7 * 24 * 3600), "{c}");
    assert_eq!(c["auto_gc_free_percent"].as_u64(), Some(0), "{c}");

    let mut fv = Vec::new();
    for i in 0..5u64 {
        let v = version(seed, i, 300 * KIB);
        write_file_checked(&m.path("f"), &v).expect("write f");
        fv.push(v);
    }
    for i in 0..2u64 {
        write_file_checked(&m.path("g"), &version(seed, 10 + i, 200 * KIB)).expect("write g");
    }
    fs::remove_file(m.path("g")).expect("rm g");
    // The daemon stamped g's removal with its clock, at the latest now.
    let removed_by = unix_secs_now();
    let r = m.gc(false);
    println!("gc under keep-age 1h: {r}");
    assert_eq!(
        r.revisions_dropped, 0,
        "all revisions are younger than 1h: {r}"
    );
    assert_eq!(m.revisions("f").len(), 5);
    let before = m.revisions("f");

    let c = m.config(&[
        "--keep-age",
        "off",
        "--keep-revisions",
        "1",
        "--keep-unlinked",
        "1s",
    ]);
    println!("policy after config (mounted): {c}");
    let c = m.config(&[]);
    assert_eq!(c["keep_revisions"].as_u64(), Some(1), "{c}");
    assert_eq!(c["keep_age_secs"].as_u64(), Some(0), "{c}");
    assert_eq!(c["keep_unlinked_secs"].as_u64(), Some(1), "{c}");
    // gc expires a removed path once `now - removed > keep_unlinked` in whole seconds: wait
    // until the clock reads two whole seconds past the removal (polling it, not a fixed
    // sleep that a slow or stepped clock could make too short).
    wait_for_clock_past(removed_by + 1);
    let r = m.gc(false);
    println!("gc under keep 1, keep-age off, keep-unlinked 1s: {r}");
    assert!(
        r.revisions_dropped >= 4,
        "4 old revisions of f (and g's 2 expired) are dropped: {r}"
    );
    let after = m.revisions("f");
    assert_eq!(after.len(), 1, "keep 1: {after:#?}");
    assert_eq!(after[0].id, before[4].id, "the newest is kept");
    assert_file_eq(&m.view_path("f", after[0].id), &fv[4]);
    for r in &before[..4] {
        assert!(
            !m.view_path("f", r.id).exists(),
            "dropped revision {} in the view",
            r.id
        );
    }
    match m.try_revisions_json("g") {
        Ok(v) => assert_eq!(
            v.as_array().map(Vec::len),
            Some(0),
            "g was rm'd longer ago than keep-unlinked 1s, and gc ran: {v}"
        ),
        Err(e) => println!("revisions of the expired rm'd path fail, as allowed: {e}"),
    }

    m.unmount();
    let c = m.config(&["--auto-gc-free-percent", "25", "--keep-revisions", "4"]);
    println!("policy after config (offline): {c}");
    m.mount();
    let c = m.config(&[]);
    assert_eq!(c["auto_gc_free_percent"].as_u64(), Some(25), "{c}");
    assert_eq!(c["keep_revisions"].as_u64(), Some(4), "{c}");
    assert_eq!(c["keep_unlinked_secs"].as_u64(), Some(1), "{c}");
    assert_file_eq(&m.path("f"), &fv[4]);
}

// ---------------------------------------------------------------------------------------------
// (d) Model test: seeded writes, unlinks, renames (over existing and to new names), gc (mounted
// and offline), remounts and checks of old revisions against a model of what keep-N keeps.

const MODEL_KEEP: usize = 2;
const MODEL_OPS: usize = 300;
const POOL_BLOCKS: u64 = 24;

fn model_len(seed: u64, key: u64) -> u64 {
    32 + mix(seed, key) % (200 * KIB)
}

/// Content of model revision `key`: 64 KiB blocks, half from a shared pool (so revisions share
/// chunks), half unique, and a header naming the key.
fn model_content(seed: u64, key: u64) -> Vec<u8> {
    let len = model_len(seed, key);
    let mut v = vec![0u8; len as usize];
    for (b, block) in v.chunks_mut(BLOCK as usize).enumerate() {
        let h = mix(mix(seed, key), b as u64);
        if h & 1 == 0 {
            fill_pattern(mix(seed, 5000 + (h >> 8) % POOL_BLOCKS), 0, block);
        } else {
            fill_pattern(h, 0, block);
        }
    }
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(b"CKMODEL1");
    h[8..16].copy_from_slice(&key.to_le_bytes());
    h[16..24].copy_from_slice(&len.to_le_bytes());
    v[..32].copy_from_slice(&h);
    v
}

/// What the model knows of one path's history.
#[derive(Debug, Default)]
struct PathModel {
    /// Content keys, oldest first: the longest history the filesystem may still list.
    revs: Vec<u64>,
    /// The newest `min_keep` of `revs` must be listed. (Less than `revs.len()` only where the
    /// contract leaves room: a rename to a new name may or may not carry the source's history,
    /// and keep-N may or may not apply inside an unlinked path's history.)
    min_keep: usize,
    live: bool,
    /// Revision ids seen listed, with the content key they had.
    seen: BTreeMap<u64, u64>,
    /// Ids once listed and later dropped: never listed again.
    dropped: BTreeSet<u64>,
}

impl PathModel {
    fn gc(&mut self, keep: usize) {
        if self.live {
            let n = self.revs.len().min(keep);
            self.revs.drain(..self.revs.len() - n);
        }
        self.min_keep = self.min_keep.min(keep);
    }
}

/// Whether a listing has as many revisions as the model allows, with the model's sizes.
fn listing_fits(seed: u64, pm: &PathModel, listed: &[Revision]) -> bool {
    let k = listed.len();
    k >= pm.min_keep
        && k <= pm.revs.len()
        && listed
            .iter()
            .zip(&pm.revs[pm.revs.len() - k..])
            .all(|(r, &key)| r.size == model_len(seed, key))
}

struct Model {
    seed: u64,
    paths: BTreeMap<String, PathModel>,
    next_name: u64,
    next_key: u64,
    checks: u64,
}

impl Model {
    fn fresh_name(&mut self, rng: &mut SmallRng) -> String {
        self.next_name += 1;
        match rng.random_range(0..3) {
            0 => format!("f{}", self.next_name),
            d => format!("d{d}/f{}", self.next_name),
        }
    }

    /// Compares what `ckptfs revisions` lists for `rel` (and the view / restore --to bytes)
    /// with the model, then tightens the model to what was observed.
    fn check(&mut self, m: &mut TestMount, rel: &str, what: &str) {
        self.checks += 1;
        let seed = self.seed;
        let pm = self.paths.get_mut(rel).expect("tracked");
        let listed = m.revisions(rel);
        let k = listed.len();
        let fits = listing_fits(seed, pm, &listed);
        if !fits {
            // Only a diagnosis before the assertions below fail: tell a revision that shows
            // up late (sealed after close() returned) from one that is wrong or missing for
            // good, by listing again until the listing fits or 10 s have passed.
            let start = Instant::now();
            let mut later = m.revisions(rel);
            while !listing_fits(seed, pm, &later) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
                later = m.revisions(rel);
            }
            let when = if listing_fits(seed, pm, &later) {
                format!("fits {:.2}s later", start.elapsed().as_secs_f64())
            } else {
                "still does not fit 10s later".to_string()
            };
            println!(
                "{what}: {rel} listing does not fit the model {pm:?}; \
                 listed right after the op: {listed:?}; {when}: {later:?}"
            );
        }
        let ctx = || format!("{what}: {rel} (model {pm:?}), listed {listed:#?}");
        assert!(
            k >= pm.min_keep && k <= pm.revs.len(),
            "{what}: {rel} lists {k} revisions; the model says between {} and {}: {}",
            pm.min_keep,
            pm.revs.len(),
            ctx()
        );
        let keys: Vec<u64> = pm.revs[pm.revs.len() - k..].to_vec();
        for (i, (r, &key)) in listed.iter().zip(&keys).enumerate() {
            assert_eq!(
                r.size,
                model_len(seed, key),
                "{what}: size of entry {i}: {}",
                ctx()
            );
            if let Some(&old) = pm.seen.get(&r.id) {
                assert_eq!(
                    old,
                    key,
                    "{what}: revision id {} changed content: {}",
                    r.id,
                    ctx()
                );
            }
            assert!(
                !pm.dropped.contains(&r.id),
                "{what}: dropped id {} is back: {}",
                r.id,
                ctx()
            );
            if pm.live {
                assert_eq!(r.current, i + 1 == k, "{what}: current flags: {}", ctx());
            }
        }
        let ids: BTreeSet<u64> = listed.iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), k, "{what}: ids distinct: {}", ctx());
        let newly_dropped: Vec<u64> = pm
            .seen
            .keys()
            .filter(|id| !ids.contains(id))
            .copied()
            .collect();
        if pm.live {
            let names: BTreeSet<u64> = fs::read_dir(m.view_dir(rel))
                .unwrap_or_else(|e| panic!("{what}: read_dir view of {rel}: {e}"))
                .map(|e| {
                    let n = e.expect("entry").file_name();
                    n.to_string_lossy()
                        .parse()
                        .unwrap_or_else(|_| panic!("{what}: view entry {n:?} is not an id"))
                })
                .collect();
            assert_eq!(names, ids, "{what}: view entries of {rel}");
            for (r, &key) in listed.iter().zip(&keys) {
                assert_file_eq(&m.view_path(rel, r.id), &model_content(seed, key));
            }
            for id in pm.dropped.iter().chain(&newly_dropped) {
                let e = fs::metadata(m.view_path(rel, *id))
                    .err()
                    .and_then(|e| e.raw_os_error());
                assert_eq!(
                    e,
                    Some(libc::ENOENT),
                    "{what}: dropped revision {id} of {rel} in the view"
                );
            }
            assert_file_eq(
                &m.path(rel),
                &model_content(seed, *keys.last().expect("live")),
            );
        }
        pm.dropped.extend(newly_dropped);
        for id in pm.dropped.iter() {
            pm.seen.remove(id);
        }
        for (r, &key) in listed.iter().zip(&keys) {
            pm.seen.insert(r.id, key);
        }
        pm.revs = keys;
        pm.min_keep = k;
    }

    fn check_all(&mut self, m: &mut TestMount, what: &str) {
        let rels: Vec<String> = self.paths.keys().cloned().collect();
        for rel in rels {
            self.check(m, &rel, what);
        }
    }
}

#[test]
fn model_of_writes_unlinks_renames_gc_and_remounts() {
    let seed = test_seed("gc_model", 0x5eed_2005);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_format_args(
        "512M",
        &["--keep-revisions", "2", "--auto-gc-free-percent", "0"],
    );
    expect_policy(&mut m, MODEL_KEEP as u64, 0);
    for d in 1..3 {
        fs::create_dir(m.path(format!("d{d}"))).expect("mkdir");
    }
    let mut model = Model {
        seed,
        paths: BTreeMap::new(),
        next_name: 0,
        next_key: 0,
        checks: 0,
    };
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for op in 0..MODEL_OPS {
        let live: Vec<String> = model
            .paths
            .iter()
            .filter(|(_, p)| p.live)
            .map(|(r, _)| r.clone())
            .collect();
        let dice = rng.random_range(0..100);
        let what = format!("op {op}");
        let name = match dice {
            0..40 => {
                let rel = if live.is_empty() || (live.len() < 10 && rng.random_bool(0.3)) {
                    let rel = model.fresh_name(&mut rng);
                    model.paths.insert(
                        rel.clone(),
                        PathModel {
                            live: true,
                            ..Default::default()
                        },
                    );
                    rel
                } else {
                    live[rng.random_range(0..live.len())].clone()
                };
                model.next_key += 1;
                let key = model.next_key;
                write_file_checked(&m.path(&rel), &model_content(seed, key))
                    .unwrap_or_else(|e| panic!("{what}: write {rel}: {e}"));
                let pm = model.paths.get_mut(&rel).expect("path");
                pm.revs.push(key);
                pm.min_keep += 1;
                println!("{what}: write {rel} key {key}");
                "write"
            }
            40..48 if !live.is_empty() => {
                let rel = &live[rng.random_range(0..live.len())];
                fs::remove_file(m.path(rel)).unwrap_or_else(|e| panic!("{what}: rm {rel}: {e}"));
                model.paths.get_mut(rel).expect("path").live = false;
                println!("{what}: rm {rel}");
                "unlink"
            }
            48..58 if live.len() >= 2 => {
                let i = rng.random_range(0..live.len());
                let j = (i + rng.random_range(1..live.len())) % live.len();
                let (src, dst) = (&live[i], &live[j]);
                fs::rename(m.path(src), m.path(dst))
                    .unwrap_or_else(|e| panic!("{what}: rename {src} over {dst}: {e}"));
                // The target's history gains the source's content; the source name is no
                // longer used (what becomes of its history is not checked).
                let key = *model.paths[src].revs.last().expect("live has a revision");
                model.paths.remove(src);
                let pm = model.paths.get_mut(dst).expect("dst");
                pm.revs.push(key);
                pm.min_keep += 1;
                println!("{what}: rename {src} over {dst} (key {key})");
                "rename-over"
            }
            58..63 if !live.is_empty() => {
                let src = &live[rng.random_range(0..live.len())];
                let dst = model.fresh_name(&mut rng);
                fs::rename(m.path(src), m.path(&dst))
                    .unwrap_or_else(|e| panic!("{what}: rename {src} to new {dst}: {e}"));
                // The new name lists at least the moved content, at most the source's history
                // with it.
                let old = model.paths.remove(src).expect("src");
                println!("{what}: rename {src} to new {dst} (keys {:?})", old.revs);
                model.paths.insert(
                    dst,
                    PathModel {
                        revs: old.revs,
                        min_keep: 1,
                        live: true,
                        ..Default::default()
                    },
                );
                "rename-new"
            }
            72..77 if !model.paths.is_empty() => {
                // Restore (in place) a listed revision of a live or rm'd path: it becomes the
                // current content again, as a new revision; a rm'd path is re-created.
                let rels: Vec<&String> = model.paths.keys().collect();
                let rel = rels[rng.random_range(0..rels.len())].clone();
                model.check(&mut m, &rel, &what);
                let listed = m.revisions(&rel);
                // Not the current revision of a live path (restoring it changes nothing).
                let live = model.paths[&rel].live;
                let choices = if live {
                    listed.len().saturating_sub(1)
                } else {
                    listed.len()
                };
                if choices == 0 {
                    "restore-none"
                } else {
                    let i = rng.random_range(0..choices);
                    m.restore(&rel, listed[i].id);
                    let pm = model.paths.get_mut(&rel).expect("path");
                    let key = pm.revs[i];
                    pm.revs.push(key);
                    pm.min_keep += 1;
                    pm.live = true;
                    println!(
                        "{what}: restore {rel} revision {} (key {key})",
                        listed[i].id
                    );
                    assert_file_eq(&m.path(&rel), &model_content(seed, key));
                    "restore"
                }
            }
            63..68 => {
                let r = m.gc(false);
                for pm in model.paths.values_mut() {
                    pm.gc(MODEL_KEEP);
                }
                println!("{what}: gc {r}");
                "gc"
            }
            68..70 => {
                m.remount();
                println!("{what}: remount");
                "remount"
            }
            70..72 => {
                m.unmount();
                let r = m.gc(false);
                for pm in model.paths.values_mut() {
                    pm.gc(MODEL_KEEP);
                }
                m.mount();
                println!("{what}: offline gc {r}");
                "offline-gc"
            }
            _ if !model.paths.is_empty() => {
                let rels: Vec<&String> = model.paths.keys().collect();
                let rel = rels[rng.random_range(0..rels.len())].clone();
                println!("{what}: check {rel}");
                model.check(&mut m, &rel, &what);
                "check"
            }
            _ => "skip",
        };
        *counts.entry(name).or_default() += 1;
    }
    println!("ops: {counts:?}; {} paths tracked", model.paths.len());
    model.check_all(&mut m, "end");
    let r = m.gc(false);
    println!("final gc: {r}");
    for pm in model.paths.values_mut() {
        pm.gc(MODEL_KEEP);
    }
    model.check_all(&mut m, "after the final gc");
    for (rel, pm) in &model.paths {
        if pm.live {
            assert!(
                pm.revs.len() <= MODEL_KEEP,
                "{rel}: at most keep-N after gc: {pm:?}"
            );
        }
    }
    m.remount();
    model.check_all(&mut m, "after the final remount");
    show_stats("model end", &m.stats());
    let unmounted: Vec<(String, usize)> = model
        .paths
        .iter()
        .map(|(r, p)| (r.clone(), p.revs.len()))
        .collect();
    m.unmount();
    for (rel, n) in unmounted {
        assert_eq!(
            m.revisions(&rel).len(),
            n,
            "{rel}: `revisions --space` offline"
        );
    }
}

/// The content generators above regenerate any range consistently (no mount needed).
#[test]
fn content_generators_are_self_consistent() {
    let seed = 0x5eed_2006;
    for (file, round) in [(0u32, 0u32), (3, 1), (7, 42)] {
        let whole = file_content(seed, file, round);
        assert_eq!(whole.len() as u64, round_len(seed, file, round));
        let mut pieces = vec![0u8; whole.len()];
        let len = whole.len() as u64;
        let mut off = 0usize;
        for step in [7usize, 25, 1000, 65536, 100_000].iter().cycle() {
            if off >= pieces.len() {
                break;
            }
            let end = (off + step).min(pieces.len());
            file_fill(seed, file, round, len, off as u64, &mut pieces[off..end]);
            off = end;
        }
        assert!(first_difference(&pieces, &whole).is_none());
        assert_eq!(check_complete(seed, file, &whole), Ok(round));
        assert!(check_complete(seed, file + 1, &whole).is_err());
        let mut torn = whole.clone();
        let n = torn.len();
        torn[n - 1] ^= 1;
        assert!(check_complete(seed, file, &torn).is_err());
    }
    let a = file_content(seed, 1, 4);
    let b = file_content(seed, 1, 5);
    let same = a
        .chunks(BLOCK as usize)
        .zip(b.chunks(BLOCK as usize))
        .skip(1)
        .filter(|(x, y)| x == y)
        .count();
    assert!(same > 0, "successive rounds share blocks");
    let v: Vec<u32> = (0..TENSORS as u32).collect();
    let mut whole = vec![0u8; 3 * MIB as usize];
    ckpt_fill(seed, &v, MIB / 2, &mut whole);
    let mut part = vec![0u8; MIB as usize];
    ckpt_fill(seed, &v, MIB / 2 + MIB, &mut part);
    assert_eq!(&whole[MIB as usize..2 * MIB as usize], &part[..]);
    let c = model_content(seed, 9);
    assert_eq!(c.len() as u64, model_len(seed, 9));
    assert_eq!(&c[..8], b"CKMODEL1");
}

/// The retention policy applies without a manual gc and without a full space: five saves of
/// one `latest.pt` with `keep-revisions 2` come down to two by the daemon's own pass (once a
/// minute by default; `CKPTFS_RETENTION_EVERY_MS` shortens it here). Before, all five
/// stayed until someone ran `ckptfs gc`.
#[test]
fn retention_applies_by_itself_after_saves() {
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "2"]);
    m.unmount();
    m.set_env("CKPTFS_RETENTION_EVERY_MS", "200");
    m.mount();
    for i in 0..5u64 {
        ckptfs_tests::write_file_checked(&m.path("latest.pt"), &ckptfs_tests::pattern(i, 4 << 20))
            .expect("save");
    }
    // Waits for what the daemon shows, bounded (its pass comes within a tick of 250 ms
    // after the interval).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = m.revisions("latest.pt").len();
        if n <= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} revisions of latest.pt 30 s after five saves with keep-revisions 2\n{}",
            m.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ckptfs_tests::assert_file_eq(&m.path("latest.pt"), &ckptfs_tests::pattern(4, 4 << 20));
}
