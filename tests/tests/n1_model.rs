//! N-1 across nodes against a model of the documented rule (`ckptfs_tests::n1model`): seeded
//! random writes, appends, truncates, fsyncs and closes from 2 to 4 nodes into one file,
//! with remounts, every node's reads compared byte for byte with the model whenever nothing
//! is open.
//!
//! Knobs: `CKPTFS_SEED` replays one seed; `CKPTFS_N1_MODEL_OPS` operations per seed (default
//! 150); `CKPTFS_N1_MODEL_SEEDS` how many seeds from the first (default 3).

use ckptfs_tests::n1model::{env_usize, run};

#[test]
fn n1_writes_from_several_nodes_read_back_as_the_model() {
    let first = ckptfs_tests::test_seed("n1_writes_from_several_nodes_read_back_as_the_model", 1);
    let ops = env_usize("CKPTFS_N1_MODEL_OPS", 150);
    let seeds = match std::env::var_os("CKPTFS_SEED") {
        Some(_) => 1,
        None => env_usize("CKPTFS_N1_MODEL_SEEDS", 3),
    };
    for s in 0..seeds as u64 {
        run(first + s, ops, None, &[]);
    }
}

/// The reproduction, exactly: n0 writes 1 MiB, n1 writes 100 bytes past the end,
/// n0 appends, then n0 writes into the hole 10,000 bytes before n1's bytes. n1's bytes
/// must stay (a hole in n0's layer is no write).
#[test]
fn a_write_into_a_hole_keeps_the_other_nodes_bytes_beside_it() {
    use ckptfs_tests::{assert_file_eq, close_checked, pattern};
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let mut c =
        ckptfs_tests::cluster::Cluster::new(2, "512M", 2, std::time::Duration::from_secs(5));
    c.mount(0, &[]);
    c.mount(1, &[]);
    let mut want = pattern(1, 1 << 20);
    std::fs::write(c.path(0, "f"), &want).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(c.path(1, "f"))
        .unwrap();
    f.write_all_at(&[b'B'; 100], 1_200_000).unwrap();
    close_checked(f).unwrap();
    want.resize(1_200_000, 0);
    want.extend_from_slice(&[b'B'; 100]);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(c.path(0, "f"))
        .unwrap();
    f.write_all(&[b'O'; 5000]).unwrap();
    close_checked(f).unwrap();
    want.extend_from_slice(&[b'O'; 5000]);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(c.path(0, "f"))
        .unwrap();
    f.write_all_at(&[b'H'; 100], 1_190_000).unwrap();
    close_checked(f).unwrap();
    want[1_190_000..1_190_100].fill(b'H');
    for n in 0..2 {
        assert_file_eq(&c.path(n, "f"), &want);
    }
    c.unmount(0);
    c.unmount(1);
    c.mount(0, &[]);
    c.mount(1, &[]);
    for n in 0..2 {
        assert_file_eq(&c.path(n, "f"), &want);
    }
}
