//! One POSIX namespace from every node: random namespace and data operations, each issued on
//! a random node of a multi-slot space (2 to 4 nodes), compared call by call with a
//! reference model of one local filesystem (`ckptfs_tests::nsmodel`), then every node's
//! whole tree compared with the model, `ckptfs check` of every slot, a remount of every
//! node (each may get another slot) and the comparison again, and an offline check.
//!
//! The operations include what jobs do across nodes: `mkdir -p` of the same directories,
//! ranks writing into a staging directory that one node renames when all are done, files
//! held open on one node while another renames their directory (the later close lands under
//! the new name), renames and removals of other nodes' entries, truncates and chmods of
//! them, and writes into other nodes' files.
//!
//! The same operations on one mount of a single-slot space whose daemon is killed with
//! SIGKILL every few operations, with no close or fsync before the kill: after each kill and
//! a mount the tree equals the model's, so every change that returned survived the daemon's
//! death (a rename after a checkpoint's last close among them).
//!
//! Knobs: `CKPTFS_SEED` replays one seed; `CKPTFS_MODEL_OPS` operations per seed (default
//! 160); `CKPTFS_MODEL_SEEDS` how many seeds from the first (default 2);
//! `CKPTFS_KILL_EVERY` operations between kills (default 12).

use ckptfs_tests::nsmodel::{env_usize, run, run_close_to_open, run_killing};

/// Seeds per test from the first: one with `CKPTFS_SEED`, else `CKPTFS_MODEL_SEEDS`.
fn seeds() -> u64 {
    match std::env::var_os("CKPTFS_SEED") {
        Some(_) => 1,
        None => env_usize("CKPTFS_MODEL_SEEDS", 2) as u64,
    }
}

#[test]
fn every_node_sees_one_posix_tree() {
    let first = ckptfs_tests::test_seed("every_node_sees_one_posix_tree", 1);
    let ops = env_usize("CKPTFS_MODEL_OPS", 160);
    for s in 0..seeds() {
        run(first + s, ops, &[]);
    }
}

#[test]
fn every_returned_change_survives_kill_9_of_the_daemon() {
    let first = ckptfs_tests::test_seed("every_returned_change_survives_kill_9_of_the_daemon", 1);
    let ops = env_usize("CKPTFS_MODEL_OPS", 160);
    let every = env_usize("CKPTFS_KILL_EVERY", 12);
    for s in 0..seeds() {
        run_killing(first + s, ops, every);
    }
}

#[test]
fn every_node_sees_one_posix_tree_close_to_open() {
    let first = ckptfs_tests::test_seed("every_node_sees_one_posix_tree_close_to_open", 1);
    let ops = env_usize("CKPTFS_MODEL_OPS", 160);
    for s in 0..seeds() {
        run_close_to_open(first + s, ops);
    }
}
