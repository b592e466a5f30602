//! Rotating checkpoints, the most common way jobs manage space (issue 36): keep the last
//! few step directories, delete older ones. In a space sized for three steps, write step N,
//! `rm -rf` step N-3, write the next: removing a step must make room for the next at once,
//! although `keep-unlinked` (7 days by default) keeps removed files' revisions. The trash
//! they form empties, oldest removal first, when a writer needs the room.
//!
//! One writer and eight writers at once (ranks of a step), each step saved one of the ways
//! jobs save (fsync or not before close, write-temp-then-rename or straight), chosen by the
//! seed (`CKPTFS_SEED`); `CKPTFS_ROTATION_STEPS` sets the steps per run (default 8). Every
//! close must succeed, and every kept step read back byte-exact.

use std::fs;
use std::io::Write;
use std::path::Path;

use ckptfs_tests::{close_checked, fill_pattern, first_difference, mix, test_seed, TestMount};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
/// Space and step: three steps are 216 of 256 MiB (84%), as in the 840 of 1024.
const SPACE: &str = "256M";
const STEP_BYTES: u64 = 72 * MIB;

fn steps() -> usize {
    std::env::var("CKPTFS_ROTATION_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

#[derive(Clone, Copy, Debug)]
struct Way {
    fsync: bool,
    rename: bool,
}

fn key(seed: u64, step: usize, rank: usize) -> u64 {
    mix(seed, ((step as u64) << 16) | rank as u64)
}

/// Writes rank `rank`'s file of `step` (`len` bytes) the way `how` says; returns the error
/// of any call that failed.
fn write_rank(
    dir: &Path,
    seed: u64,
    step: usize,
    rank: usize,
    len: u64,
    how: Way,
) -> std::io::Result<()> {
    let name = dir.join(format!("rank-{rank}"));
    let path = match how.rename {
        true => dir.join(format!(".rank-{rank}.tmp")),
        false => name.clone(),
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let mut buf = vec![0u8; MIB as usize];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(MIB) as usize;
        fill_pattern(key(seed, step, rank), off, &mut buf[..n]);
        f.write_all(&buf[..n])?;
        off += n as u64;
    }
    if how.fsync {
        f.sync_all()?;
    }
    close_checked(f)?;
    if how.rename {
        fs::rename(&path, &name)?;
    }
    Ok(())
}

fn check_step(m: &TestMount, seed: u64, step: usize, writers: usize) {
    let len = STEP_BYTES / writers as u64;
    for rank in 0..writers {
        let p = m.path(format!("step-{step}/rank-{rank}"));
        let got = fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
        let mut want = vec![0u8; len as usize];
        fill_pattern(key(seed, step, rank), 0, &mut want);
        if let Some(d) = first_difference(&got, &want) {
            panic!("{} differs: {d}", p.display());
        }
    }
}

fn rotate(writers: usize, seed: u64) {
    let mut m = TestMount::with_options(SPACE, None);
    let mut rng = SmallRng::seed_from_u64(seed);
    let len = STEP_BYTES / writers as u64;
    for step in 0..steps() {
        if step >= 3 {
            fs::remove_dir_all(m.path(format!("step-{}", step - 3))).expect("rm -rf old step");
        }
        let how = Way {
            fsync: rng.random_bool(0.5),
            rename: rng.random_bool(0.5),
        };
        let dir = m.path(format!("step-{step}"));
        fs::create_dir(&dir).expect("mkdir step");
        let (free_before, _) = ckptfs_tests::statvfs_bytes(m.mnt());
        let results: Vec<(usize, std::io::Result<()>)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..writers)
                .map(|rank| {
                    let dir = dir.clone();
                    s.spawn(move || (rank, write_rank(&dir, seed, step, rank, len, how)))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("writer thread"))
                .collect()
        });
        let st = m.stats();
        println!(
            "step {step} ({how:?}): free {} -> {} MiB, trash {} MiB in {} revisions, gc copied {} MiB",
            free_before / MIB,
            st.stats.free_bytes / MIB,
            st.stats.split.trash_bytes / MIB,
            st.stats.split.trash_revisions,
            st.stats.gc.bytes_copied / MIB
        );
        for (rank, r) in results {
            if let Err(e) = r {
                panic!(
                    "step {step} rank {rank} ({how:?}, {writers} writers): {e}\nlog:\n{}",
                    m.log_tail()
                );
            }
        }
        // The steps kept read back exactly: what made room took nothing they hold.
        for kept in step.saturating_sub(2)..=step {
            check_step(&m, seed, kept, writers);
        }
    }
    let st = m.stats();
    assert!(
        st.stats.split.trash_bytes <= STEP_BYTES + 16 * MIB,
        "the trash keeps at most what there was room for: {:?}",
        st.stats.split
    );
    m.unmount();
}

#[test]
fn rotating_steps_with_one_writer_never_run_out_of_space() {
    rotate(1, test_seed("rotation_one_writer", 0x0036_0001));
}

#[test]
fn rotating_steps_with_eight_writers_never_run_out_of_space() {
    rotate(8, test_seed("rotation_eight_writers", 0x0036_0008));
}

/// Rotation across nodes (issue 69): 3 nodes each write a 44 MiB rank file a step into
/// slots sized for about 5 steps, node 0 removes the oldest step directory (the other
/// nodes' files in it included) and keeps 3. The owners learn of the removal and get their
/// space back: 15 steps, every close succeeds. `CKPTFS_NODE_ROTATION_STEPS` (default 15).
#[test]
fn rotating_steps_across_nodes_gives_every_slot_its_space_back() {
    let steps = std::env::var("CKPTFS_NODE_ROTATION_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let seed = test_seed(
        "rotating_steps_across_nodes_gives_every_slot_its_space_back",
        3,
    );
    ckptfs_tests::rotation::rotate_across_nodes(&[], 3, steps, 44, 5, 3, seed);
}
