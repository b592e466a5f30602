//! What was written survives umount + remount: files, directories, symlinks, modes, owners,
//! mtimes; and `ckptfs stats` reports consistent figures on the mountpoint and backing dir.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ckptfs_tests::{check, cpath, list_tree, pattern, StatsReport, TestMount};

#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: Option<u64>,
    mtime: (i64, i64),
    target: Option<PathBuf>,
    content: Option<Vec<u8>>,
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    list_tree(root)
        .into_iter()
        .map(|rel| {
            let p = root.join(&rel);
            let md = fs::symlink_metadata(&p).expect("lstat");
            let ft = md.file_type();
            let kind = if ft.is_file() {
                "file"
            } else if ft.is_dir() {
                "dir"
            } else if ft.is_symlink() {
                "symlink"
            } else {
                "other"
            };
            let e = Entry {
                kind,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                size: ft.is_file().then_some(md.len()),
                mtime: (md.mtime(), md.mtime_nsec()),
                target: ft
                    .is_symlink()
                    .then(|| fs::read_link(&p).expect("readlink")),
                content: ft.is_file().then(|| fs::read(&p).expect("read")),
            };
            (rel, e)
        })
        .collect()
}

fn set_times(p: &Path, mtime: (i64, i64), flags: libc::c_int) {
    let ts = [
        libc::timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: mtime.0 as libc::time_t,
            tv_nsec: mtime.1 as _,
        },
    ];
    // SAFETY: valid C string path and two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, cpath(p).as_ptr(), ts.as_ptr(), flags) })
        .unwrap_or_else(|e| panic!("utimensat {}: {e}", p.display()));
}

fn assert_same(before: &BTreeMap<PathBuf, Entry>, after: &BTreeMap<PathBuf, Entry>, when: &str) {
    let keys_b: Vec<_> = before.keys().collect();
    let keys_a: Vec<_> = after.keys().collect();
    assert_eq!(keys_a, keys_b, "{when}: the set of paths differs");
    for (k, b) in before {
        let a = &after[k];
        if a != b {
            let strip = |e: &Entry| Entry {
                content: None,
                target: e.target.clone(),
                ..*e
            };
            assert_eq!(
                strip(a),
                strip(b),
                "{when}: {} metadata differs",
                k.display()
            );
            panic!("{when}: {} content differs", k.display());
        }
    }
}

#[test]
fn tree_with_modes_owners_mtimes_and_symlinks_survives_remount() {
    let mut m = TestMount::new();
    let files: [(&str, usize, u32); 5] = [
        ("top.txt", 1234, 0o640),
        ("a/f1.bin", 100 * 1024, 0o644),
        ("a/b/empty", 0, 0o600),
        ("a/b/c/big.bin", (3 << 20) + 1, 0o755),
        ("ro/frozen.bin", 65537, 0o444),
    ];
    for d in ["a", "a/b", "a/b/c", "ro", "empty-dir", "private"] {
        fs::create_dir(m.path(d)).expect("mkdir");
    }
    for (i, (name, len, mode)) in files.iter().enumerate() {
        let p = m.path(name);
        fs::write(&p, pattern(i as u64, *len)).expect("write");
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).expect("chmod");
        set_times(&p, (1_600_000_000 + i as i64, 100_000_007 * i as i64), 0);
    }
    std::os::unix::fs::chown(m.path("a/f1.bin"), Some(1000), Some(1001)).expect("chown");
    std::os::unix::fs::chown(m.path("private"), Some(4242), Some(4343)).expect("chown dir");
    std::os::unix::fs::symlink("b/empty", m.path("a/link-rel")).expect("symlink");
    std::os::unix::fs::symlink("/etc/hostname", m.path("abs-link")).expect("symlink");
    std::os::unix::fs::symlink("nope/nothing", m.path("dangling")).expect("symlink");
    std::os::unix::fs::symlink("a/b", m.path("latest")).expect("symlink");
    fs::set_permissions(m.path("private"), fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::set_permissions(m.path("ro"), fs::Permissions::from_mode(0o555)).expect("chmod");
    // Directory times last: creating children changes them.
    for (i, d) in ["a", "a/b", "empty-dir", "ro"].iter().enumerate() {
        set_times(
            &m.path(d),
            (1_400_000_000 + i as i64, 999_999_999 - i as i64),
            0,
        );
    }

    let before = snapshot(m.mnt());
    assert_eq!(
        before.len(),
        15,
        "entries created: {:?}",
        before.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        before[Path::new("a/f1.bin")].mtime,
        (1_600_000_001, 100_000_007)
    );
    assert_eq!(before[Path::new("a/b")].mtime, (1_400_000_001, 999_999_998));
    assert_eq!(before[Path::new("ro/frozen.bin")].mode, 0o444);
    assert_eq!(
        (
            before[Path::new("private")].uid,
            before[Path::new("private")].gid
        ),
        (4242, 4343)
    );

    m.remount();
    assert_same(&before, &snapshot(m.mnt()), "after the first remount");
    m.remount();
    assert_same(&before, &snapshot(m.mnt()), "after the second remount");
}

#[test]
fn stats_are_consistent_on_mountpoint_and_backing_dir() {
    let mut m = TestMount::new();
    let s0 = m.stats();
    // Every key is there: `stats()` reads the JSON into the engine's StatsReport, which
    // fails on a missing one.
    println!("empty: {s0}");
    assert!(
        s0.stats.reserved_bytes >= 512 << 20,
        "reserved_bytes after --size {}: {s0}",
        ckptfs_tests::DEFAULT_SPACE_SIZE
    );

    fs::create_dir(m.path("d1")).expect("mkdir");
    fs::create_dir(m.path("d1/d2")).expect("mkdir");
    let sizes = [0usize, 10, 70_000, 1 << 20];
    for (i, len) in sizes.iter().enumerate() {
        fs::write(m.path(format!("d1/f{i}")), pattern(100 + i as u64, *len)).expect("write");
    }
    let logical: u64 = sizes.iter().map(|&s| s as u64).sum();
    let s1 = m.stats();
    println!("after 4 files: {s1}");
    let grew = |k: fn(&StatsReport) -> u64| k(&s1) - k(&s0);
    assert_eq!(
        grew(|s| s.stats.logical_bytes),
        logical,
        "logical_bytes growth"
    );
    assert_eq!(grew(|s| s.stats.files), sizes.len() as u64, "files growth");
    assert_eq!(grew(|s| s.stats.dirs), 2, "dirs growth");
    assert!(s1.stats.chunks > s0.stats.chunks, "chunks grew");
    let stored = s1.stats.stored_bytes;
    let used = s1.stats.used_bytes;
    let reserved = s1.stats.reserved_bytes;
    assert!(stored <= used, "stored_bytes {stored} > used_bytes {used}");
    assert!(
        used <= reserved,
        "used_bytes {used} > reserved_bytes {reserved}"
    );
    assert!(
        s1.stats.free_bytes <= reserved,
        "free_bytes > reserved_bytes"
    );
    assert_eq!(
        grew(|s| s.stats.raw_chunk_bytes),
        logical,
        "raw_chunk_bytes growth for distinct random data"
    );

    fs::remove_file(m.path("d1/f3")).expect("unlink");
    let s2 = m.stats();
    println!("after unlinking the 1 MiB file: {s2}");
    assert_eq!(
        s2.stats.logical_bytes,
        s1.stats.logical_bytes - (1 << 20),
        "logical_bytes after unlink"
    );
    assert_eq!(s2.stats.files, s1.stats.files - 1, "files after unlink");

    let backing = m.backing().to_path_buf();
    let via_backing_mounted = m.stats_of(&backing);
    println!("backing dir while mounted: {via_backing_mounted}");
    m.unmount();
    let via_backing = m.stats();
    println!("backing dir after umount: {via_backing}");
    // (logical_bytes, stored_bytes, files, dirs, chunks)
    let core = |s: &StatsReport| {
        let s = &s.stats;
        (s.logical_bytes, s.stored_bytes, s.files, s.dirs, s.chunks)
    };
    assert_eq!(
        core(&via_backing),
        core(&s2),
        "via backing dir after umount"
    );
    assert_eq!(
        core(&via_backing_mounted),
        core(&s2),
        "via backing dir while mounted"
    );
    m.mount();
}
