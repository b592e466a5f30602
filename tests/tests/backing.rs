//! The backing space is a fixed set of files made at format time: writing many checkpoint files
//! through the mount creates no files in the backing directory.

use std::fs;

use std::path::PathBuf;

use ckptfs_tests::{list_tree, pattern, TestMount};

/// Fails with the (first few) added and removed names when the listings differ.
fn assert_listing_unchanged(before: &[PathBuf], now: &[PathBuf], when: &str) {
    if before == now {
        return;
    }
    let added: Vec<_> = now.iter().filter(|p| !before.contains(p)).collect();
    let removed: Vec<_> = before.iter().filter(|p| !now.contains(p)).collect();
    panic!(
        "backing directory listing changed {when}: {} entries added (first: {:?}), {} removed ({:?})",
        added.len(),
        &added[..added.len().min(10)],
        removed.len(),
        &removed[..removed.len().min(10)]
    );
}

#[test]
fn writing_1000_files_creates_nothing_in_the_backing_dir() {
    let mut m = TestMount::new();
    let before = list_tree(m.backing());
    println!(
        "backing dir after format+mount ({} entries): {before:?}",
        before.len()
    );

    for d in 0..4 {
        fs::create_dir(m.path(format!("step-{d}"))).expect("mkdir");
    }
    for i in 0..1000u64 {
        let data = pattern(i, 64 * 1024);
        fs::write(m.path(format!("step-{}/rank-{i:04}.ckpt", i % 4)), data).expect("write");
    }
    let after = list_tree(m.backing());
    println!("backing dir after 1000 files: {} entries", after.len());
    assert_listing_unchanged(
        &before,
        &after,
        "while writing 1000 files through the mount",
    );

    m.remount();
    let remounted = list_tree(m.backing());
    assert_listing_unchanged(&before, &remounted, "across a remount");
    let n: usize = (0..4)
        .map(|d| {
            fs::read_dir(m.path(format!("step-{d}")))
                .expect("read_dir")
                .count()
        })
        .sum();
    assert_eq!(n, 1000, "files visible after remount");
}
