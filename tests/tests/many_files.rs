//! Many files written at once: the daemon's memory must not grow with the number of files
//! open for writing. Before the memory sweep and the shared stream budget, each open file
//! kept its last request's bytes (and its stream buffer) until its own next write, so 1024
//! files written 1 MiB at a time in turn took the daemon to 3 GiB. Written 64 KiB at a time,
//! each file's stream is handed to its cutter in small segments and every file carries an
//! unfinished chunk, so the write path's shared budgets fill at once; that case has a test of
//! its own.
//!
//! Every file being written also carries its unfinished last chunk (up to 256 KiB, about
//! 60 KiB on average) from one write to the next; past 64 MiB of those, they spill to a
//! file (`engine::spill`), which the third test checks with 8192 files.
//!
//! `CKPTFS_MANY_FILES` sets the number of files (default 512 with 1 MiB requests, 1024 with
//! 64 KiB ones: the smaller case passed before the fix; 8192 for the carries).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};

use ckptfs_tests::{pattern, test_seed, TestMount};

const MIB: usize = 1 << 20;
const THREADS: usize = 4;
/// Distinct 1 MiB blocks the files are made of (so the space stays small: dedup).
const BLOCKS: usize = 8;

fn block_of(file: usize, round: usize) -> usize {
    (file * 3 + round) % BLOCKS
}

fn vm_hwm_kib(pid: u32) -> u64 {
    ckptfs_tests::proc_status_kib(pid, "VmHWM")
}

#[test]
fn memory_does_not_grow_with_files_written_at_once() {
    // Without the bound this workload holds about 2 MiB per file (1 GiB at 512 files); with
    // it, the pipeline's budgets and caches (a few hundred MiB whatever the file count).
    many_files(512, MIB, 2 * MIB, 768);
}

/// 64 KiB requests: before the stream and cut budgets went from 64 to 32 MiB each, 1024
/// files written this way peaked at 568 and 598 MiB here (390 and 396 after), over the
/// 512 MiB the write path is meant to stay under; 512 files stayed under it either way.
#[test]
fn memory_stays_bounded_with_small_requests_to_many_files() {
    many_files(1024, 64 << 10, 2 * MIB, 512);
}

/// 8192 files of 128 KiB, each written in two 64 KiB requests in turn: between its two
/// writes every file carries an unfinished chunk. Before the carries spilled past
/// `spill::CARRY_BYTES`, this peaked at 820 MiB here (4096 files written 2 MiB each: 678
/// MiB, 8192: 1080); with the spill, 404 MiB (2048 files: 231, 16384: 471).
///
/// The bound is 640 MiB, not 512: the peak varies with timing (how full the pipeline's
/// budgets are at the moment the carries peak), 336-498 MiB over 18 runs on the 2-core VM
/// alone, beside the other many_files tests or beside two busy loops, and 533 MiB once in
/// a CI run (2026-11-29, the tests' debug build among the other integration tests). 640
/// still fails the unspilled 820.
#[test]
fn carried_chunks_spill_instead_of_growing_memory() {
    many_files(8192, 64 << 10, 128 << 10, 640);
}

/// Raises the open-file limit to `want` descriptors (as far as the hard limit allows);
/// returns the soft limit now.
fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    r.rlim_cur
}

/// Writes `CKPTFS_MANY_FILES` (else `default_files`) files of `per_file` bytes, every file
/// open at once, in requests of `request` bytes taken in turn; checks every byte and that
/// the daemon's peak RSS stayed under `limit_mib`.
fn many_files(default_files: usize, request: usize, per_file: usize, limit_mib: u64) {
    let files: usize = std::env::var("CKPTFS_MANY_FILES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_files);
    let limit = raise_nofile(files as u64 + 256);
    if limit < files as u64 + 256 {
        let why = format!(
            "{files} files open at once need {} descriptors; the hard limit here is {limit}",
            files + 256
        );
        return ckptfs_tests::skip("many_files", "descriptors", &why);
    }
    let seed = test_seed("many-files", 0x5eed_0017);
    let m = TestMount::new();
    let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|b| pattern(seed ^ b as u64, MIB)).collect();
    let pid = m.daemon_pid();
    let before = vm_hwm_kib(pid);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (m, blocks) = (&m, &blocks);
            s.spawn(move || {
                let mine: Vec<usize> = (t..files).step_by(THREADS).collect();
                let mut fds: Vec<File> = mine
                    .iter()
                    .map(|f| {
                        OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(m.path(format!("f{f:04}")))
                            .expect("create")
                    })
                    .collect();
                // Every file open at once, each written one request in turn.
                for at in (0..per_file).step_by(request) {
                    let (round, part) = (at / MIB, at % MIB);
                    for (fd, &f) in fds.iter_mut().zip(&mine) {
                        fd.write_all(&blocks[block_of(f, round)][part..part + request])
                            .expect("write");
                    }
                }
                // close() commits; dropping the files closes them.
            });
        }
    });
    let peak = vm_hwm_kib(pid);
    println!(
        "{files} files x {} KiB written in turn by {THREADS} threads, {} KiB per request: \
         daemon peak RSS {} MiB (at mount {} MiB)",
        per_file >> 10,
        request >> 10,
        peak / 1024,
        before / 1024
    );
    // Every file, every byte.
    let mut got = vec![0u8; per_file];
    for f in 0..files {
        let mut fd = File::open(m.path(format!("f{f:04}"))).expect("open");
        fd.read_exact(&mut got).expect("read");
        for (round, got) in got.chunks(MIB).enumerate() {
            assert!(
                got[..] == blocks[block_of(f, round)][..got.len()],
                "file f{f:04}, MiB {round}: wrong bytes"
            );
        }
        assert_eq!(
            fd.read(&mut [0u8; 1]).expect("read at end"),
            0,
            "f{f:04} too long"
        );
    }
    assert!(
        peak < limit_mib * 1024,
        "daemon peak RSS {} MiB with {files} files open for writing, {} KiB per request \
         (limit {limit_mib} MiB)",
        peak / 1024,
        request >> 10
    );
}
