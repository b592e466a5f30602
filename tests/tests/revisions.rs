//! Revisions: every close after a change (and every rename over a path) adds a listed revision
//! to the path's history; `ckptfs revisions` lists them, `MNT/.ckptfs/revisions/<path>/<id>`
//! and `ckptfs restore --to` read them back byte-exact (mounted, after remount, and offline with
//! `--space`); fsync adds none; `restore` without `--to` makes an old one current again; an
//! unlinked path keeps its history and can be restored; the view is read-only.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use ckptfs_tests::{
    assert_file_eq, close_checked, errno, first_difference, pattern, test_seed, write_file_checked,
    Revision, TempDir, TestMount,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Content of the `i`th version written by a test: incompressible and distinct per (seed, i).
fn version(seed: u64, i: u64, len: usize) -> Vec<u8> {
    pattern(mix(seed, i + 1), len)
}

#[track_caller]
fn write(m: &TestMount, rel: &str, data: &[u8]) {
    write_file_checked(&m.path(rel), data).unwrap_or_else(|e| panic!("write+close {rel}: {e}"));
}

/// The listing has one entry per expected content, oldest first, the last one current, sizes
/// matching, ids distinct and commit times not decreasing.
#[track_caller]
fn check_listing(revs: &[Revision], contents: &[Vec<u8>], what: &str) {
    let sizes: Vec<u64> = revs.iter().map(|r| r.size).collect();
    let want: Vec<u64> = contents.iter().map(|c| c.len() as u64).collect();
    assert_eq!(
        revs.len(),
        contents.len(),
        "{what}: `ckptfs revisions` lists {} revisions (sizes {sizes:?}), expected {} (sizes \
         {want:?}): {revs:#?}",
        revs.len(),
        contents.len()
    );
    assert_eq!(sizes, want, "{what}: revision sizes (oldest first)");
    let ids: BTreeSet<u64> = revs.iter().map(|r| r.id).collect();
    assert_eq!(
        ids.len(),
        revs.len(),
        "{what}: revision ids not distinct: {revs:?}"
    );
    for (i, r) in revs.iter().enumerate() {
        assert_eq!(
            r.current,
            i + 1 == revs.len(),
            "{what}: only the newest (last) revision is current: {revs:#?}"
        );
    }
    for w in revs.windows(2) {
        assert!(
            w[0].committed_unix <= w[1].committed_unix,
            "{what}: listing is not oldest first by committed_unix: {revs:#?}"
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    for r in revs {
        assert!(
            r.committed_unix > now - 3600.0 && r.committed_unix < now + 60.0,
            "{what}: committed_unix {} is not about now ({now})",
            r.committed_unix
        );
    }
}

/// While a writer has the file open with fsynced changes, the listing holds only the revisions
/// committed by closes (whether the newest is flagged `current` then is not checked).
#[track_caller]
fn check_listing_while_open(revs: &[Revision], contents: &[Vec<u8>], what: &str) {
    let sizes: Vec<u64> = revs.iter().map(|r| r.size).collect();
    let want: Vec<u64> = contents.iter().map(|c| c.len() as u64).collect();
    assert_eq!(
        sizes, want,
        "{what}: fsync must not add a listed revision; listing {revs:#?}"
    );
}

/// Same ids, sizes, current flags and commit times (to the millisecond).
#[track_caller]
fn assert_same_listing(a: &[Revision], b: &[Revision], what: &str) {
    let key = |r: &Revision| {
        (
            r.id,
            r.size,
            r.current,
            (r.committed_unix * 1000.0).round() as i64,
        )
    };
    let ka: Vec<_> = a.iter().map(key).collect();
    let kb: Vec<_> = b.iter().map(key).collect();
    assert_eq!(ka, kb, "{what}: listings differ:\n{a:#?}\nvs\n{b:#?}");
}

/// Every revision reads back through `MNT/.ckptfs/revisions/<rel>/<id>`, which is a read-only
/// regular file of the revision's size; the path's view directory lists exactly the ids.
#[track_caller]
fn check_view(m: &TestMount, rel: &str, revs: &[Revision], contents: &[Vec<u8>], what: &str) {
    let dir = m.view_dir(rel);
    let md = fs::metadata(&dir).unwrap_or_else(|e| panic!("{what}: stat {}: {e}", dir.display()));
    assert!(md.is_dir(), "{what}: {} is not a directory", dir.display());
    let names: BTreeSet<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{what}: read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let ids: BTreeSet<String> = revs.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(names, ids, "{what}: entries of {}", dir.display());
    for (r, c) in revs.iter().zip(contents) {
        let p = m.view_path(rel, r.id);
        let md = fs::metadata(&p).unwrap_or_else(|e| panic!("{what}: stat {}: {e}", p.display()));
        assert!(
            md.is_file(),
            "{what}: {} is not a regular file",
            p.display()
        );
        assert_eq!(md.len(), c.len() as u64, "{what}: size of {}", p.display());
        assert_file_eq(&p, c);
    }
}

/// Every revision copied out with `ckptfs restore ... --to FILE` is byte-exact.
#[track_caller]
fn check_restore_to(
    m: &mut TestMount,
    rel: &str,
    revs: &[Revision],
    contents: &[Vec<u8>],
    dir: &Path,
    what: &str,
) {
    for (i, (r, c)) in revs.iter().zip(contents).enumerate() {
        let to = dir.join(format!("{what}-{i}-{}", r.id));
        m.restore_to(rel, r.id, &to);
        let got = fs::read(&to).unwrap_or_else(|e| panic!("{what}: read {}: {e}", to.display()));
        if let Some(d) = first_difference(&got, c) {
            panic!(
                "{what}: `restore --revision {} --to` of revision #{i} differs: {d}",
                r.id
            );
        }
    }
}

#[test]
fn ten_revisions_listed_and_read_back_mounted_remounted_and_offline() {
    let seed = test_seed("revisions_ten", 0x5eed_1001);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_format_args("512M", &["--keep-revisions", "20"]);
    fs::create_dir(m.path("run")).expect("mkdir run");
    let rel = "run/model.pt";
    let mut contents = Vec::new();
    for i in 0..10u64 {
        let len = match i % 3 {
            0 => MIB,
            1 => rng.random_range(MIB..3 * MIB),
            _ => rng.random_range(1..200 * KIB),
        };
        let data = version(seed, i, len);
        write(&m, rel, &data);
        contents.push(data);
    }
    assert_file_eq(&m.path(rel), &contents[9]);

    let revs = m.revisions(rel);
    check_listing(&revs, &contents, "after 10 closes");
    for r in &revs {
        assert!(r.new_bytes > 0, "each revision was new random data: {r:?}");
    }
    // The view mirrors the live tree: directories are directories, files are directories of
    // their revisions.
    let run_dir = m.view_dir("run");
    assert!(
        fs::metadata(&run_dir)
            .map(|md| md.is_dir())
            .unwrap_or(false),
        "{} is not a directory",
        run_dir.display()
    );
    let in_run: Vec<String> = fs::read_dir(&run_dir)
        .expect("read_dir view/run")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        in_run.iter().any(|n| n == "model.pt"),
        "{} lists {in_run:?}, not model.pt",
        run_dir.display()
    );
    check_view(&m, rel, &revs, &contents, "mounted");
    let scratch = TempDir::new("rev-to");
    check_restore_to(&mut m, rel, &revs, &contents, scratch.path(), "mounted");
    // --to a file inside the mount: a new file with that revision's bytes, the history intact.
    let copy = m.path("run/copy-of-3");
    m.restore_to(rel, revs[3].id, &copy);
    assert_file_eq(&copy, &contents[3]);
    assert_same_listing(&m.revisions(rel), &revs, "after restore --to");
    assert_file_eq(&m.path(rel), &contents[9]);

    m.remount();
    let after = m.revisions(rel);
    assert_same_listing(&after, &revs, "after remount");
    check_view(&m, rel, &after, &contents, "remounted");
    check_restore_to(&mut m, rel, &after, &contents, scratch.path(), "remounted");
    assert_file_eq(&m.path(rel), &contents[9]);

    m.unmount();
    let offline = m.revisions(rel);
    assert_same_listing(&offline, &revs, "offline (--space)");
    check_restore_to(&mut m, rel, &offline, &contents, scratch.path(), "offline");
}

#[test]
fn fsync_without_close_adds_no_listed_revision() {
    let seed = test_seed("revisions_fsync", 0x5eed_1002);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "20"]);
    let rel = "ckpt.bin";
    let a = version(seed, 0, 300 * KIB);
    write(&m, rel, &a);
    let mut contents = vec![a.clone()];
    check_listing(&m.revisions(rel), &contents, "after the first close");

    // Overwrite in place with fsyncs in between: still one listed revision while open.
    let b = version(seed, 1, 300 * KIB);
    let f = OpenOptions::new()
        .write(true)
        .open(m.path(rel))
        .expect("open for write");
    f.write_all_at(&b, 0).expect("write b");
    f.sync_all().expect("fsync");
    let revs = m.revisions(rel);
    check_listing_while_open(&revs, &contents, "after write + fsync, still open");
    assert_file_eq(&m.view_path(rel, revs[0].id), &a);
    let mut c = b.clone();
    let patch = version(seed, 2, 50 * KIB);
    c[100 * KIB..150 * KIB].copy_from_slice(&patch);
    f.write_all_at(&patch, 100 * KIB as u64)
        .expect("write patch");
    f.sync_data().expect("fdatasync");
    check_listing_while_open(
        &m.revisions(rel),
        &contents,
        "after a second write + fdatasync, still open",
    );
    // The open file already shows the fsynced bytes to readers.
    assert_file_eq(&m.path(rel), &c);
    close_checked(f).expect("close");
    contents.push(c.clone());
    let revs = m.revisions(rel);
    check_listing(&revs, &contents, "after close");
    assert_file_eq(&m.view_path(rel, revs[1].id), &c);

    // Truncate + write + fsync + close (the torch.save-then-fsync pattern): one more revision.
    let d = version(seed, 3, 123 * KIB);
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path(rel))
        .expect("open O_TRUNC");
    f.write_all(&d).expect("write d");
    f.sync_all().expect("fsync");
    check_listing_while_open(
        &m.revisions(rel),
        &contents,
        "after O_TRUNC + write + fsync, still open",
    );
    close_checked(f).expect("close");
    contents.push(d.clone());
    check_listing(&m.revisions(rel), &contents, "after fsync then close");

    // Opening for write (no change) or read, and fsync without a change, add nothing.
    let f = OpenOptions::new()
        .write(true)
        .open(m.path(rel))
        .expect("open for write");
    f.sync_all().expect("fsync unchanged");
    close_checked(f).expect("close unchanged");
    drop(fs::read(m.path(rel)).expect("read"));
    let revs = m.revisions(rel);
    check_listing(&revs, &contents, "after opening without a change");
    check_view(&m, rel, &revs, &contents, "fsync test");

    m.remount();
    let after = m.revisions(rel);
    assert_same_listing(&after, &revs, "fsync test after remount");
    check_view(&m, rel, &after, &contents, "fsync test remounted");
    assert_file_eq(&m.path(rel), &d);
}

#[test]
fn rename_over_target_adds_a_revision_to_the_target() {
    let seed = test_seed("revisions_rename", 0x5eed_1003);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "20"]);
    fs::create_dir(m.path("ckpt")).expect("mkdir");
    let rel = "ckpt/latest.pt";
    let tmp = "ckpt/latest.pt.tmp";
    let v0 = version(seed, 0, 200 * KIB);
    write(&m, rel, &v0);
    let mut contents = vec![v0];
    for i in 1..4u64 {
        let v = version(seed, i, 150 * KIB + i as usize * 30 * KIB);
        // Write the temporary file, fsync it, close it, rename it over the target.
        let mut f = fs::File::create(m.path(tmp)).expect("create tmp");
        f.write_all(&v).expect("write tmp");
        f.sync_all().expect("fsync tmp");
        close_checked(f).expect("close tmp");
        fs::rename(m.path(tmp), m.path(rel)).expect("rename tmp over target");
        contents.push(v);
        let revs = m.revisions(rel);
        check_listing(&revs, &contents, &format!("after rename #{i}"));
        assert_file_eq(&m.path(rel), contents.last().expect("last"));
    }
    assert!(!m.path(tmp).exists(), "the temporary name is gone");
    let revs = m.revisions(rel);
    check_view(&m, rel, &revs, &contents, "rename test");
    m.remount();
    let after = m.revisions(rel);
    assert_same_listing(&after, &revs, "rename test after remount");
    check_view(&m, rel, &after, &contents, "rename test remounted");
}

#[test]
fn restore_without_to_makes_an_old_revision_current_again() {
    let seed = test_seed("revisions_restore", 0x5eed_1004);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "20"]);
    let rel = "weights.bin";
    let mut contents = Vec::new();
    for i in 0..3u64 {
        let v = version(seed, i, 100 * KIB + i as usize * 77 * KIB);
        write(&m, rel, &v);
        contents.push(v);
    }
    let before = m.revisions(rel);
    check_listing(&before, &contents, "before restore");

    m.restore(rel, before[0].id);
    assert_file_eq(&m.path(rel), &contents[0]);
    contents.push(contents[0].clone());
    let after = m.revisions(rel);
    check_listing(&after, &contents, "after restore of the oldest");
    assert_same_listing(
        &after[..3]
            .iter()
            .map(|r| Revision {
                current: false,
                ..r.clone()
            })
            .collect::<Vec<_>>(),
        &before
            .iter()
            .map(|r| Revision {
                current: false,
                ..r.clone()
            })
            .collect::<Vec<_>>(),
        "the older revisions keep their ids after a restore",
    );
    check_view(&m, rel, &after, &contents, "after restore");

    // The restored file is an ordinary file again: a write adds a revision after it.
    let v = version(seed, 9, 64 * KIB);
    write(&m, rel, &v);
    contents.push(v.clone());
    check_listing(&m.revisions(rel), &contents, "write after restore");

    m.remount();
    assert_file_eq(&m.path(rel), &v);
    let revs = m.revisions(rel);
    check_listing(&revs, &contents, "restore test after remount");
    check_view(&m, rel, &revs, &contents, "restore test remounted");
}

#[test]
fn unlinked_path_keeps_its_history_and_can_be_restored() {
    let seed = test_seed("revisions_unlinked", 0x5eed_1005);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "20"]);
    fs::create_dir(m.path("sub")).expect("mkdir");
    // One path restored while mounted, one offline with `restore --space`; both from the
    // middle revision of three.
    for (k, rel) in ["sub/gone.bin", "sub/gone-offline.bin"].iter().enumerate() {
        let mut contents = Vec::new();
        for i in 0..3u64 {
            let v = version(seed, 10 * k as u64 + i, 90 * KIB + i as usize * 10 * KIB);
            write(&m, rel, &v);
            contents.push(v);
        }
        let before = m.revisions(rel);
        check_listing(&before, &contents, "before rm");
        fs::remove_file(m.path(rel)).expect("rm");
        assert!(!m.path(rel).exists());
        let listed = m.revisions(rel);
        let key = |r: &Revision| (r.id, r.size);
        assert_eq!(
            listed.iter().map(key).collect::<Vec<_>>(),
            before.iter().map(key).collect::<Vec<_>>(),
            "{rel}: `ckptfs revisions` of the rm'd path lists its history: {listed:#?}"
        );
        if k == 1 {
            m.unmount();
            let off = m.revisions(rel);
            assert_eq!(
                off.iter().map(key).collect::<Vec<_>>(),
                before.iter().map(key).collect::<Vec<_>>(),
                "{rel}: `revisions --space` of the rm'd path"
            );
            m.restore(rel, listed[1].id);
            m.mount();
        } else {
            m.restore(rel, listed[1].id);
        }
        assert_file_eq(&m.path(rel), &contents[1]);
        contents.push(contents[1].clone());
        let revs = m.revisions(rel);
        check_listing(
            &revs,
            &contents,
            &format!("{rel} after restore of the rm'd path"),
        );
        check_view(&m, rel, &revs, &contents, "restored rm'd path");
    }
    m.remount();
    assert_file_eq(&m.path("sub/gone.bin"), &version(seed, 1, 100 * KIB));
    assert_file_eq(
        &m.path("sub/gone-offline.bin"),
        &version(seed, 11, 100 * KIB),
    );
}

/// `restore --to` copies out a revision of a rm'd path without re-creating it (the contract's
/// `--to` has no exception for unlinked paths), mounted and offline.
#[test]
fn restore_to_copies_a_revision_of_an_unlinked_path() {
    let seed = test_seed("revisions_unlinked_to", 0x5eed_1007);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "20"]);
    let rel = "gone.bin";
    let contents: Vec<Vec<u8>> = (0..3u64)
        .map(|i| version(seed, i, 50 * KIB + i as usize * 7 * KIB))
        .collect();
    for c in &contents {
        write(&m, rel, c);
    }
    fs::remove_file(m.path(rel)).expect("rm");
    let listed = m.revisions(rel);
    assert_eq!(listed.len(), 3, "{listed:#?}");
    let scratch = TempDir::new("rev-unlinked-to");
    check_restore_to(
        &mut m,
        rel,
        &listed,
        &contents,
        scratch.path(),
        "rm'd, mounted",
    );
    assert!(
        !m.path(rel).exists(),
        "restore --to must not re-create the path"
    );
    m.unmount();
    check_restore_to(
        &mut m,
        rel,
        &listed,
        &contents,
        scratch.path(),
        "rm'd, offline",
    );
    m.mount();
    assert!(
        !m.path(rel).exists(),
        "restore --to must not re-create the path"
    );
}

/// Asserts `r` failed with one of `allowed` (any errno when `allowed` is empty).
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(r: std::io::Result<T>, allowed: &[i32], what: &str) {
    match errno(r) {
        Ok(v) => panic!("{what} succeeded ({v:?}); the revisions view must be read-only"),
        Err(e) => {
            println!("{what}: refused with errno {e}");
            assert!(
                allowed.is_empty() || allowed.contains(&e),
                "{what} failed with errno {e}, expected one of {allowed:?}"
            );
        }
    }
}

#[test]
fn revisions_view_is_read_only() {
    let seed = test_seed("revisions_view_ro", 0x5eed_1006);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "20"]);
    fs::create_dir(m.path("ro")).expect("mkdir");
    let rel = "ro/file.bin";
    let contents = vec![version(seed, 0, 70 * KIB), version(seed, 1, 80 * KIB)];
    for c in &contents {
        write(&m, rel, c);
    }
    let revs = m.revisions(rel);
    check_listing(&revs, &contents, "view test");
    let deny = [libc::EROFS, libc::EACCES, libc::EPERM];
    let p0 = m.view_path(rel, revs[0].id);
    let dir = m.view_dir(rel);
    let top = m.path(".ckptfs");

    assert_refused(
        OpenOptions::new().write(true).open(&p0),
        &deny,
        "open(view file, O_WRONLY)",
    );
    assert_refused(
        OpenOptions::new().read(true).write(true).open(&p0),
        &deny,
        "open(view file, O_RDWR)",
    );
    assert_refused(
        OpenOptions::new().write(true).truncate(true).open(&p0),
        &deny,
        "open(view file, O_WRONLY|O_TRUNC)",
    );
    assert_refused(
        OpenOptions::new().append(true).open(&p0),
        &deny,
        "open(view file, O_APPEND)",
    );
    let f = fs::File::open(&p0).expect("open view file read-only");
    // SAFETY: ftruncate on an owned open fd.
    let r = ckptfs_tests::check(unsafe {
        libc::ftruncate(std::os::unix::io::AsRawFd::as_raw_fd(&f), 0)
    });
    assert!(r.is_err(), "ftruncate of a read-only fd succeeded");
    drop(f);
    let c0 = ckptfs_tests::cpath(&p0);
    // SAFETY: valid C string.
    assert_refused(
        ckptfs_tests::check(unsafe { libc::truncate(c0.as_ptr(), 0) }),
        &deny,
        "truncate(view file)",
    );
    assert_refused(
        fs::set_permissions(&p0, fs::Permissions::from_mode(0o666)),
        &deny,
        "chmod(view file)",
    );
    assert_refused(fs::remove_file(&p0), &deny, "unlink(view file)");
    assert_refused(
        fs::rename(&p0, dir.join("renamed")),
        &deny,
        "rename(view file)",
    );
    assert_refused(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join("new")),
        &deny,
        "create in a path's view directory",
    );
    assert_refused(
        fs::create_dir(dir.join("newdir")),
        &deny,
        "mkdir in a path's view directory",
    );
    assert_refused(
        fs::create_dir(m.view_dir("newdir")),
        &deny,
        "mkdir in .ckptfs/revisions",
    );
    assert_refused(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(m.view_dir("ro/another")),
        &deny,
        "create in a live directory's view",
    );
    assert_refused(fs::create_dir(top.join("mine")), &deny, "mkdir in .ckptfs");
    assert_refused(
        std::os::unix::fs::symlink("x", dir.join("link")),
        &deny,
        "symlink in the view",
    );
    // (ENOTEMPTY is as good a refusal as EROFS here.)
    assert_refused(fs::remove_dir(&dir), &[], "rmdir of a view directory");
    // Moving a live file into the view is refused (EXDEV also acceptable).
    assert_refused(
        fs::rename(m.path(rel), dir.join("moved")),
        &[libc::EROFS, libc::EACCES, libc::EPERM, libc::EXDEV],
        "rename(live file into the view)",
    );

    // `.ckptfs` at the root cannot be created, replaced or removed (any errno).
    assert_refused(fs::create_dir(&top), &[], "mkdir /.ckptfs");
    assert_refused(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&top),
        &[],
        "creat /.ckptfs",
    );
    assert_refused(
        std::os::unix::fs::symlink("x", &top),
        &[],
        "symlink /.ckptfs",
    );
    write(&m, "other", b"other");
    assert_refused(
        fs::rename(m.path("other"), &top),
        &[],
        "rename a file over /.ckptfs",
    );
    assert_refused(fs::remove_dir(&top), &[], "rmdir /.ckptfs");
    assert_file_eq(&m.path("other"), b"other");

    // Nothing changed: the live file, the listing and every revision's bytes.
    assert_file_eq(&m.path(rel), &contents[1]);
    let after = m.revisions(rel);
    assert_same_listing(&after, &revs, "after refused writes to the view");
    check_view(&m, rel, &after, &contents, "after refused writes");
    // And a reader can seek around in a view file.
    let mut f = fs::File::open(&p0).expect("open");
    f.seek(SeekFrom::Start(1000)).expect("seek");
    let mut buf = vec![0u8; 500];
    std::io::Read::read_exact(&mut f, &mut buf).expect("read");
    assert_eq!(&buf[..], &contents[0][1000..1500]);
}

/// The revision is listed as soon as close() returns (not some time later): 40 rounds of
/// write + close, each immediately followed by a readdir of the view and `ckptfs revisions`.
#[test]
fn revision_is_listed_as_soon_as_close_returns() {
    let seed = test_seed("revisions_at_close", 0x5eed_1008);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "100"]);
    let rel = "quick.bin";
    let mut late = Vec::new();
    let mut contents = Vec::new();
    for i in 0..40u64 {
        let v = version(seed, i, 20 * KIB + i as usize * 101);
        write(&m, rel, &v);
        contents.push(v);
        // The view first (no process to start), then the command.
        let in_view = fs::read_dir(m.view_dir(rel))
            .map(|d| d.count())
            .unwrap_or(0);
        if in_view != contents.len() {
            late.push(format!(
                "round {i}: right after close the view lists {in_view} revisions, not {}",
                contents.len()
            ));
        }
        let revs = m.revisions(rel);
        let ok = revs.len() == contents.len()
            && revs
                .last()
                .is_some_and(|r| r.current && r.size == contents[i as usize].len() as u64);
        if !ok {
            late.push(format!(
                "round {i}: right after close {} listed, newest {:?}",
                revs.len(),
                revs.last()
            ));
        }
    }
    let revs = m.revisions(rel);
    check_listing(&revs, &contents, "after 40 rounds");
    assert!(
        late.is_empty(),
        "{} times a revision was not listed (as the current one) when close() had returned; \
         all were listed later:\n{}",
        late.len(),
        late.join("\n")
    );
}

/// Back-to-back write + close cycles (the next open follows the previous close at once, as a
/// training loop saving every step would do) each add a revision: none is merged into the
/// next, also once every late RELEASE (sent by the kernel after close returned) has been
/// answered.
#[test]
fn back_to_back_closes_each_add_a_revision() {
    let seed = test_seed("revisions_back_to_back", 0x5eed_1009);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "100"]);
    let rel = "step.bin";
    let contents: Vec<Vec<u8>> = (0..20u64)
        .map(|i| version(seed, i, 30 * KIB + i as usize * 1000))
        .collect();
    for c in &contents {
        write(&m, rel, c);
    }
    m.wait_requests_answered();
    let revs = m.revisions(rel);
    check_listing(
        &revs,
        &contents,
        "20 back-to-back closes, listed after the releases",
    );
    check_view(&m, rel, &revs, &contents, "back-to-back");
}

/// A child process spawned while a writer is half way through a checkpoint closes its
/// inherited copy of the descriptor at exec, and the kernel sends FLUSH for the writer's
/// handle. That must make nothing listed: only the writer's own close completes a revision.
#[test]
fn subprocess_spawned_mid_write_does_not_list_a_partial_revision() {
    let seed = test_seed("revisions_fork_mid_write", 0x5eed_100a);
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "10"]);
    let rel = "ckpt.bin";
    let first = version(seed, 0, 300 * KIB);
    write(&m, rel, &first);
    let second = version(seed, 1, 600 * KIB);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path(rel))
        .expect("open");
    f.write_all(&second[..200 * KIB]).expect("write first part");
    // fork + exec: the child's copy of the descriptor (O_CLOEXEC) is closed at exec.
    let status = std::process::Command::new("true")
        .status()
        .expect("spawn true");
    assert!(status.success());
    let mid = m.revisions(rel);
    assert_eq!(
        mid.iter().map(|r| r.size).collect::<Vec<_>>(),
        vec![first.len() as u64],
        "a partial write was listed after a subprocess exec: {mid:#?}"
    );
    f.write_all(&second[200 * KIB..]).expect("write rest");
    drop(f);
    let done = m.revisions(rel);
    check_listing(&done, &[first, second], "after the writer's own close");
}

/// A long history is listed whole over the mount: the listing is read in pages, because one
/// control answer (an xattr value) holds at most 64 KiB, about 750 revisions.
#[test]
fn a_long_history_is_listed_whole() {
    const REVISIONS: u64 = 1500;
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "2000"]);
    let rel = "many.bin";
    for i in 0..REVISIONS {
        write(&m, rel, &i.to_le_bytes());
    }
    let revs = m.revisions(rel);
    assert_eq!(
        revs.len() as u64,
        REVISIONS,
        "revisions listed over the mount"
    );
    assert!(
        revs.windows(2).all(|w| w[0].id < w[1].id),
        "listed in order, each once"
    );
    assert!(revs.last().is_some_and(|r| r.current));
    m.unmount();
    assert_eq!(
        m.revisions(rel).len() as u64,
        REVISIONS,
        "revisions listed offline"
    );
}

/// `ckptfs revisions` prints commit times in the reader's local zone with their age, and
/// `--json` adds them in RFC 3339 with the zone's offset (checked against `committed_unix`
/// by `parse_revisions`). A zone with a half-hour offset catches an offset printed in whole
/// hours or taken from UTC.
#[test]
fn revisions_show_local_time_with_age_and_rfc3339() {
    let mut m = TestMount::new();
    write(&m, "t.bin", b"a revision");
    write(&m, "t.bin", b"another revision");
    // POSIX TZ: "XST-05:30" is 5 h 30 min east of UTC.
    m.set_env("TZ", "XST-05:30");
    let revs = m.revisions("t.bin");
    assert_eq!(revs.len(), 2, "{revs:#?}");
    for r in &revs {
        assert!(r.committed.ends_with("+05:30"), "{r:?}");
    }
    let path = m.path("t.bin");
    let out = m.ckptfs_ok(&["revisions".as_ref(), path.as_os_str()]);
    println!("{out}");
    for r in &revs {
        // The local date and time is the RFC 3339 one with a space for the T, to the second.
        let local = r.committed[..19].replacen('T', " ", 1);
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&r.id.to_string()))
            .unwrap_or_else(|| panic!("no line for revision {}:\n{out}", r.id));
        assert!(line.contains(&local), "{line:?} lacks {local:?}");
        assert!(
            line.contains(" ago)") || line.contains("(just now)"),
            "{line:?} has no age"
        );
    }
    assert!(
        !out.contains("unix"),
        "no raw unix seconds for people:\n{out}"
    );
}

/// The kernel keeps directory listings on a single-slot space (`FOPEN_CACHE_DIR`); a
/// restore that re-creates a removed file is the one change to a directory the daemon makes
/// without the kernel, so it drops the kept listing: a listing right after the restore
/// names the file (before, it was missing until the directory's attributes expired).
#[test]
fn a_restored_file_is_listed_at_once() {
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "5"]);
    fs::create_dir(m.path("d")).expect("mkdir");
    write(&m, "d/kept", b"kept");
    write(&m, "d/back", b"back");
    let id = m.revisions("d/back")[0].id;
    fs::remove_file(m.path("d/back")).expect("rm");
    let dir = m.path("d");
    let names = || -> BTreeSet<String> {
        fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .collect()
    };
    // Listed twice: the second listing is the kept one.
    assert_eq!(names(), BTreeSet::from(["kept".to_string()]));
    assert_eq!(names(), BTreeSet::from(["kept".to_string()]));
    m.restore("d/back", id);
    assert_eq!(
        names(),
        BTreeSet::from(["back".to_string(), "kept".to_string()]),
        "listed right after the restore"
    );
    assert_file_eq(&m.path("d/back"), b"back");
}
