//! The backing space is a fixed set of files made at format time: writing many checkpoint files
//! through the mount creates no files in the backing directory.

use std::ffi::OsStr;
use std::fs;

use std::path::PathBuf;

use ckptfs_tests::{assert_file_eq, errno, list_tree, pattern, write_file_checked, TestMount};

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

/// Unmounts a mount the test made by hand when the test ends, also when it fails: a leaked
/// FUSE mount outlives the test run (nothing happens where it was unmounted already).
struct LazyUnmount(PathBuf);

impl Drop for LazyUnmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// `ckptfs stats MNT`'s text.
fn stats_text(m: &mut TestMount) -> String {
    let mnt = m.mnt().to_path_buf();
    m.ckptfs_ok(&[OsStr::new("stats"), mnt.as_os_str()])
}

/// The data file, the metadata table or (of a space over targets) the placement records
/// removed (a cleanup) or replaced by a copy (a restore) while mounted: writes into the
/// open file would succeed and be gone at unmount (or not be what the next mount opens).
/// The next status, the housekeeping tick or a sync finds it, and from then on the mount
/// refuses every change with EIO and `stats` says why, instead of acknowledging what will
/// not be there. What was written before still reads back from the open file. Before this
/// watch, the write after the removal succeeded (6 of 6 cases) and `stats` said nothing.
#[test]
fn a_backing_file_removed_or_replaced_while_mounted_fails_writes_instead_of_losing_them() {
    for (file, what, how) in [
        ("data", "data file", "removed"),
        ("meta.redb", "metadata table", "removed"),
        ("data", "data file", "replaced"),
        ("meta.redb", "metadata table", "replaced"),
        ("placement", "placement file", "removed"),
        ("placement", "placement file", "replaced"),
    ] {
        let mut m = match file {
            "placement" => TestMount::with_targets("256M", 3, "2+1"),
            _ => TestMount::new(),
        };
        let before = pattern(1, 3 << 20);
        write_file_checked(&m.path("before"), &before).expect("write before");
        let path = m.backing().join(file);
        match how {
            "removed" => fs::remove_file(&path).unwrap(),
            _ => {
                let copy = path.with_extension("copy");
                fs::copy(&path, &copy).unwrap();
                fs::rename(&copy, &path).unwrap();
            }
        }
        let text = stats_text(&mut m);
        let want = format!(
            "the backing {what} {} was {how} while mounted",
            path.display()
        );
        assert!(
            text.contains(&format!("FAILED (writes refused until remount): {want}")),
            "{file} {how}: {text}"
        );
        let r = write_file_checked(&m.path("after"), &pattern(2, 1 << 20));
        assert_eq!(errno(r), Err(libc::EIO), "{file} {how}: a write after");
        assert_file_eq(&m.path("before"), &before);
        m.unmount();
        let log = fs::read_to_string(m.backing().join("daemon.log")).unwrap_or_default();
        assert!(
            log.contains(&want),
            "{file} {how}: the log says why:\n{log}"
        );
    }
}

/// The whole backing directory renamed while mounted loses nothing: the files open are
/// the same files, so writes go on (a warning is logged), and the space mounts from its
/// new name with everything in it.
#[test]
fn a_backing_directory_moved_while_mounted_loses_nothing() {
    let mut m = TestMount::new();
    let before = pattern(3, 2 << 20);
    write_file_checked(&m.path("before"), &before).expect("write before");
    let backing = m.backing().to_path_buf();
    let away = backing.with_extension("moved");
    fs::rename(&backing, &away).unwrap();
    let text = stats_text(&mut m);
    assert!(!text.contains("FAILED"), "{text}");
    let after = pattern(4, 2 << 20);
    write_file_checked(&m.path("after"), &after).expect("a write after the move");
    fs::rename(&away, &backing).unwrap();
    m.unmount();
    let log = fs::read_to_string(backing.join("daemon.log")).unwrap_or_default();
    assert!(log.contains("was moved or renamed while mounted"), "{log}");
    m.mount();
    assert_file_eq(&m.path("before"), &before);
    assert_file_eq(&m.path("after"), &after);
}

/// The lock file removed while mounted and made again (by hand, or a tool's cleanup):
/// before, a second mount then took the new file's lock and both daemons changed the same
/// space. Now the mount takes the lock at that path again at its next look (here: the
/// status), so the second mount is refused, naming the first; and where the second mount
/// got in first, the first mount refuses every change from then on, so the two never both
/// change the space. Either way every file written reads back after both are unmounted.
#[test]
fn a_lock_file_removed_while_mounted_is_taken_again_and_never_shared() {
    let mut m = TestMount::new();
    let one = pattern(5, 1 << 20);
    write_file_checked(&m.path("one"), &one).expect("write");
    let backing = m.backing().to_path_buf();
    let lock = backing.join("lock");
    let other = ckptfs_tests::TempDir::new("lock-mnt");
    let mnt2 = other.path().join("mnt2");
    fs::create_dir(&mnt2).unwrap();
    let _unmount = LazyUnmount(mnt2.clone());
    let mount2 =
        |m: &mut TestMount| m.ckptfs(&[OsStr::new("mount"), backing.as_os_str(), mnt2.as_os_str()]);

    fs::remove_file(&lock).unwrap();
    fs::write(&lock, b"").unwrap();
    let text = stats_text(&mut m);
    assert!(!text.contains("FAILED"), "{text}");
    let (st, _, err) = mount2(&mut m);
    assert!(
        !st.success(),
        "a second mount got in after the lock was taken again"
    );
    assert!(err.contains("in use by another ckptfs process"), "{err}");
    assert!(
        err.contains(&m.mnt().display().to_string()),
        "names the mount: {err}"
    );
    let two = pattern(6, 1 << 20);
    write_file_checked(&m.path("two"), &two).expect("the mount goes on writing");

    // The second mount first: whichever takes the new file's lock, only one changes.
    fs::remove_file(&lock).unwrap();
    fs::write(&lock, b"").unwrap();
    let (st, _, err) = mount2(&mut m);
    let text = stats_text(&mut m);
    let mut files = vec![("one", one), ("two", two)];
    if st.success() {
        println!("the second mount took the lock first");
        assert!(
            text.contains("FAILED (writes refused until remount): the lock file")
                && text.contains("another process"),
            "{text}"
        );
        let r = write_file_checked(&m.path("three"), &pattern(7, 1 << 20));
        assert_eq!(errno(r), Err(libc::EIO), "the first mount refuses changes");
        let four = pattern(8, 1 << 20);
        write_file_checked(&mnt2.join("four"), &four).expect("the second mount writes");
        files.push(("four", four));
        m.unmount();
        m.ckptfs_ok(&[OsStr::new("umount"), mnt2.as_os_str()]);
    } else {
        println!("the first mount took the lock again first: {err}");
        assert!(err.contains("in use by another ckptfs process"), "{err}");
        assert!(!text.contains("FAILED"), "{text}");
        m.unmount();
    }
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    let mnt = m.mnt().to_path_buf();
    let (st, out, err) = m.ckptfs(&[OsStr::new("check"), mnt.as_os_str()]);
    assert!(st.success(), "check: {out}{err}");
}
