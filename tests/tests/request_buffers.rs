//! Writes kept in the FUSE request buffers they arrived in (the daemon cuts and stores a
//! large write from fuser's buffer without copying it, `vendor/fuser/PATCH.md`): a buffer
//! must never be read into again while any of its bytes are still on their way to the
//! store, whatever the other writers do.
//!
//! Writer threads and a writer process (`dd`) write files at once in requests of mixed
//! sizes (4 KiB to the 4 MiB maximum, so buffers are kept, reused, returned to the pool
//! and trimmed after large requests), through write-only handles (direct I/O, one request
//! per write) and read-write ones (the page cache's writeback requests); half the files are
//! next revisions of an earlier one with a few blocks changed (predicted, deduplicated
//! chunks). Every file is read back after its close and again after a remount.
//! `CKPTFS_SEED` replays the sizes and contents; `CKPTFS_BUFFER_ROUNDS` (default 3) sets
//! the files per writer.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use ckptfs_tests::{close_checked, fill_pattern, first_difference, mix, test_seed, TestMount};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// Request sizes the writers pick from.
const SIZES: [usize; 7] = [
    4 * KIB,
    64 * KIB,
    MIB - 4 * KIB,
    MIB,
    MIB + 17,
    2 * MIB,
    4 * MIB,
];
const WRITERS: usize = 4;

/// The content of file `n` of writer `w`: every other file is the one before it with some
/// 64 KiB blocks changed (a next revision).
fn content(seed: u64, w: usize, n: usize, len: usize) -> Vec<u8> {
    let base = n / 2 * 2;
    let mut v = vec![0u8; len];
    fill_pattern(mix(seed, (w * 1000 + base) as u64), 0, &mut v);
    if n % 2 == 1 {
        for b in 0..len / (64 * KIB) {
            if mix(seed, (w * 1_000_000 + n * 1000 + b) as u64).is_multiple_of(20) {
                let at = b * 64 * KIB;
                fill_pattern(mix(seed, 77 + at as u64), 0, &mut v[at..at + 64 * KIB]);
            }
        }
    }
    v
}

fn write_file(path: &Path, data: &[u8], direct: bool, seed: u64) -> Result<(), String> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(!direct)
        .write(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut at = 0;
    let mut r = seed;
    while at < data.len() {
        r = mix(r, at as u64);
        let n = SIZES[(r % SIZES.len() as u64) as usize].min(data.len() - at);
        f.write_all(&data[at..at + n])
            .map_err(|e| format!("write {} at {at}: {e}", path.display()))?;
        at += n;
    }
    close_checked(f).map_err(|e| format!("close {}: {e}", path.display()))
}

fn check_file(path: &Path, want: &[u8], when: &str) -> Result<(), String> {
    let mut got = Vec::new();
    fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut got))
        .map_err(|e| format!("{when}: read {}: {e}", path.display()))?;
    match first_difference(&got, want) {
        None => Ok(()),
        Some(d) => Err(format!("{when}: {}: {d}", path.display())),
    }
}

#[test]
fn kept_request_buffers_are_never_overwritten_while_in_flight() {
    let seed = test_seed("request_buffers", 4611);
    let rounds: usize = std::env::var("CKPTFS_BUFFER_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(2);
    let mut m = TestMount::with_options("2G", None);
    let dir = m.path("w");
    fs::create_dir(&dir).unwrap();
    // The writer process: `dd` in 4 MiB and 1 MiB requests from a file outside the mount.
    let src = m.root().join("dd-source");
    let dd_data = content(seed, 99, 0, 24 * MIB + 123);
    fs::write(&src, &dd_data).unwrap();
    let mut dds: Vec<_> = ["4M", "1M"]
        .iter()
        .enumerate()
        .map(|(i, bs)| {
            Command::new("dd")
                .arg(format!("if={}", src.display()))
                .arg(format!("of={}", dir.join(format!("dd-{i}")).display()))
                .arg(format!("bs={bs}"))
                .arg("status=none")
                .spawn()
                .expect("dd runs")
        })
        .collect();
    let len_of =
        |w: usize, n: usize| 6 * MIB + (mix(seed, (w * 31 + n) as u64) % (5 * MIB as u64)) as usize;
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let dir = &dir;
                s.spawn(move || -> Result<(), String> {
                    for n in 0..rounds * 2 {
                        let data = content(seed, w, n, len_of(w, n));
                        let path = dir.join(format!("w{w}-{n}"));
                        write_file(
                            &path,
                            &data,
                            (w + n) % 3 != 0,
                            mix(seed, (w * 7 + n) as u64),
                        )?;
                        check_file(&path, &data, "after close")?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().expect("writer thread").err())
            .collect()
    });
    for (i, dd) in dds.iter_mut().enumerate() {
        assert!(dd.wait().unwrap().success(), "dd {i}");
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    m.remount();
    for w in 0..WRITERS {
        for n in 0..rounds * 2 {
            let data = content(seed, w, n, len_of(w, n));
            check_file(&dir.join(format!("w{w}-{n}")), &data, "after remount").unwrap();
        }
    }
    for i in 0..2 {
        check_file(&dir.join(format!("dd-{i}")), &dd_data, "after remount").unwrap();
    }
}

fn vm_rss_kib(pid: u32) -> u64 {
    ckptfs_tests::proc_status_kib(pid, "VmRSS")
}

/// A burst of 4 MiB writes fills fuser's request-buffer pool (up to 64 MiB resident); once
/// writing stops, the daemon's once-a-second trim gives those pages back, so an idle daemon
/// between checkpoints holds little memory. Waits for the daemon's RSS to fall (its tick is
/// the event), at most 30 s; before the trim it stayed at about 90 MiB after this burst.
#[test]
fn an_idle_daemon_gives_back_the_request_buffers_of_a_burst() {
    let seed = test_seed("request_buffers_idle", 4612);
    let m = TestMount::new();
    let pid = m.daemon_pid();
    let at_mount = vm_rss_kib(pid);
    const LEN: usize = 64 * MIB;
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let m = &m;
            s.spawn(move || {
                let data = content(seed, w, 0, LEN);
                let path = m.path(format!("burst{w}"));
                let mut f = fs::File::create(&path).expect("create");
                for part in data.chunks(4 * MIB) {
                    f.write_all(part).expect("write");
                }
                close_checked(f).expect("close");
            });
        }
    });
    let after = vm_rss_kib(pid);
    let limit = at_mount + 64 * 1024;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut now = after;
    while now > limit {
        assert!(
            std::time::Instant::now() < deadline,
            "daemon RSS {} MiB 30 s after a burst of 4 MiB writes (at mount {} MiB, right \
             after the burst {} MiB): the request buffers' pool was not given back",
            now >> 10,
            at_mount >> 10,
            after >> 10
        );
        // A poll interval, not a guess at when the trim runs: the loop ends on the event.
        std::thread::sleep(std::time::Duration::from_millis(50));
        now = vm_rss_kib(pid);
    }
    println!(
        "daemon RSS at mount {} MiB, after the burst {} MiB, idle {} MiB",
        at_mount >> 10,
        after >> 10,
        now >> 10
    );
    for w in 0..WRITERS {
        let got = fs::read(m.path(format!("burst{w}"))).expect("read back");
        assert!(
            first_difference(&got, &content(seed, w, 0, LEN)).is_none(),
            "burst{w}: wrong bytes"
        );
    }
}
