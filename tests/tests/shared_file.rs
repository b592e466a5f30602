//! Several processes writing one shared file (MPI-IO style N-1 checkpoints) through
//! write-only descriptors, which ckptfs serves with FUSE direct I/O and parallel direct
//! writes: segmented (one contiguous part each) and strided (stripes round-robin), with each
//! writer's stripes in shuffled order, so the daemon sees sequential runs, holes skipped over
//! and writes behind the end, from several threads at once. Read back byte-exact, before and
//! after a remount.
//!
//! The writers are threads with their own descriptors: to the kernel and the daemon that is
//! the same as processes (each write is one request; nothing is shared but the file).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::Barrier;

use ckptfs_tests::{assert_file_eq, pattern, test_seed, TestMount};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

const MIB: usize = 1024 * 1024;
const WRITERS: usize = 8;

fn write_shared(m: &TestMount, name: &str, content: &[u8], stripe: usize, seed: u64) {
    let path = m.path(name);
    File::create(&path).expect("create the shared file");
    let stripes: Vec<usize> = (0..content.len().div_ceil(stripe)).collect();
    let barrier = Barrier::new(WRITERS);
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (path, barrier, stripes) = (&path, &barrier, &stripes);
            s.spawn(move || {
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .expect("open O_WRONLY");
                let mut mine: Vec<usize> = stripes
                    .iter()
                    .copied()
                    .filter(|i| i % WRITERS == w)
                    .collect();
                // Half the writers go front to back (the daemon sees streams), the others in
                // shuffled order (writes past the end and behind it).
                if w % 2 == 1 {
                    mine.shuffle(&mut SmallRng::seed_from_u64(seed + w as u64));
                }
                barrier.wait();
                for i in mine {
                    let from = i * stripe;
                    let to = (from + stripe).min(content.len());
                    f.write_all_at(&content[from..to], from as u64)
                        .expect("write a stripe");
                }
                drop(f);
            });
        }
    });
}

#[test]
fn eight_writers_strided_and_segmented_into_one_file() {
    let seed = test_seed("shared_file", 7);
    let mut m = TestMount::new();
    let size = 48 * MIB + 12_345;
    let content = pattern(seed, size);
    // Strided with 1 MiB and with odd-sized stripes, and segmented (one part per writer).
    let cases = [
        ("strided-1m", MIB),
        ("strided-odd", 300_007),
        ("segmented", size.div_ceil(WRITERS)),
    ];
    for (name, stripe) in cases {
        write_shared(&m, name, &content, stripe, seed);
        assert_file_eq(&m.path(name), &content);
    }
    m.remount();
    for (name, _) in cases {
        assert_file_eq(&m.path(name), &content);
    }
}
