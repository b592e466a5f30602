//! Read-only mounts (issue 19): a space is read back, inspected and restarted from without a
//! single byte, length or timestamp of its backing directory changing, even a space a crash
//! left; every change is refused with EROFS; read-only mounts share a space with each other
//! but not with a read-write one.

use std::collections::BTreeMap;
use std::fs;
use std::hash::Hasher;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use ckptfs_tests::{errno, pattern, test_seed, TestMount};

/// Every file of the backing directory: length, mtime, ctime and a digest of the bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, (u64, i64, i64, i64, i64, u64)> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        let mut h = std::hash::DefaultHasher::new();
        let mut f = fs::File::open(e.path()).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            h.write(&buf[..n]);
        }
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            (
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
                h.finish(),
            ),
        );
    }
    out
}

fn o(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

fn erofs<T>(what: &str, r: std::io::Result<T>) {
    assert_eq!(errno(r).err(), Some(libc::EROFS), "{what}");
}

fn set_xattr(p: &Path, name: &str) -> std::io::Result<()> {
    let (p, n) = (
        ckptfs_tests::cpath(p),
        std::ffi::CString::new(name).unwrap(),
    );
    // SAFETY: valid C strings and a one-byte value.
    ckptfs_tests::check(unsafe {
        libc::setxattr(p.as_ptr(), n.as_ptr(), c"v".as_ptr().cast(), 1, 0)
    })
    .map(drop)
}

#[test]
fn read_only_mount_writes_nothing_and_refuses_every_change() {
    let mut m = TestMount::with_options("64M", None);
    let seed = test_seed("read_only_mount_writes_nothing_and_refuses_every_change", 3);
    let (v1, v2) = (pattern(seed, 700_000), pattern(seed + 1, 700_000));
    fs::create_dir(m.path("step-1")).unwrap();
    fs::write(m.path("step-1/rank-0"), &v1).unwrap();
    fs::write(m.path("step-1/rank-0"), &v2).unwrap();
    set_xattr(&m.path("step-1/rank-0"), "user.step").unwrap();
    std::os::unix::fs::symlink("step-1", m.path("latest")).unwrap();
    m.unmount();
    let before = snapshot(m.backing());

    m.mount_with(&["--read-only"]);
    // Everything reads back: files, the symlink, revisions, the revision view, stats.
    assert!(fs::read(m.path("latest/rank-0")).unwrap() == v2);
    let revs = m.revisions("step-1/rank-0");
    assert_eq!(revs.len(), 2);
    assert!(fs::read(m.view_path("step-1/rank-0", revs[0].id)).unwrap() == v1);
    assert!(m.stats().stats.logical_bytes > 0);
    // Every change is refused with EROFS.
    let p = m.path("step-1/rank-0");
    erofs("create", fs::write(m.path("new"), b"x"));
    erofs(
        "open for writing",
        fs::OpenOptions::new().write(true).open(&p),
    );
    erofs("mkdir", fs::create_dir(m.path("d")));
    erofs("unlink", fs::remove_file(&p));
    erofs("rename", fs::rename(&p, m.path("moved")));
    erofs("symlink", std::os::unix::fs::symlink("x", m.path("s")));
    erofs(
        "chmod",
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)),
    );
    erofs("setxattr", set_xattr(&p, "user.other"));
    let mnt = m.mnt().to_path_buf();
    let (st, _, err) = m.ckptfs(&[o("gc"), mnt.as_os_str()]);
    assert!(
        !st.success() && err.contains("mounted read-only") && err.contains("--dry-run"),
        "gc: {err}"
    );
    // A dry run is a plan that writes nothing, so it works here (and the snapshot at the
    // end shows the directory unchanged).
    let plan = m.ckptfs_json(&[o("gc"), o("--dry-run"), o("--json"), mnt.as_os_str()]);
    assert_eq!(plan["dry_run"], true, "{plan}");
    assert!(plan["revisions_dropped"].as_u64().is_some(), "{plan}");
    let (st, _, err) = m.ckptfs(&[
        o("restore"),
        p.as_os_str(),
        o("--revision"),
        o(&revs[0].id.to_string()),
    ]);
    assert!(
        !st.success(),
        "restore on a read-only mount succeeded: {err}"
    );

    // A second read-only mount (through `-o ro`) shares the space; a read-write one is refused.
    let second = m.backing().parent().unwrap().join("mnt2");
    fs::create_dir(&second).unwrap();
    let backing = m.backing().to_path_buf();
    let (st, _, err) = m.ckptfs(&[o("mount"), backing.as_os_str(), second.as_os_str()]);
    assert!(
        !st.success(),
        "a read-write mount beside a read-only one succeeded"
    );
    assert!(err.contains("mounted read-only"), "{err}");
    let (st, _, err) = m.ckptfs(&[
        o("mount"),
        o("-o"),
        o("ro"),
        backing.as_os_str(),
        second.as_os_str(),
    ]);
    assert!(st.success(), "second read-only mount: {err}");
    assert!(fs::read(second.join("step-1/rank-0")).unwrap() == v2);
    assert!(m.ckptfs(&[o("umount"), second.as_os_str()]).0.success());
    let (st, _, err) = m.ckptfs(&[
        o("mount"),
        o("-o"),
        o("ro,bogus"),
        backing.as_os_str(),
        second.as_os_str(),
    ]);
    assert!(
        !st.success() && err.contains("unknown mount option"),
        "{err}"
    );

    // The kernel lets root remount read-write; the daemon still refuses changes.
    let remount = Command::new("mount")
        .args(["-i", "-o", "remount,rw"])
        .arg(m.mnt())
        .status();
    match remount {
        Ok(s) if s.success() => erofs("write after remount,rw", fs::write(m.path("new"), b"x")),
        other => ckptfs_tests::skip(
            "remount,rw check",
            "remount",
            &format!("`mount -i -o remount,rw` gave {other:?}"),
        ),
    }
    m.unmount();
    assert_eq!(
        snapshot(m.backing()),
        before,
        "a read-only mount changed the backing directory"
    );

    // A read-write mount afterwards works as before.
    m.mount();
    fs::write(m.path("new"), b"x").unwrap();
    assert!(fs::read(m.path("step-1/rank-0")).unwrap() == v2);
}

/// A space whose daemon was killed mid-life is read read-only without repairing anything on
/// disk: redb's recovery runs in memory. A read-write mount later recovers it for real.
#[test]
fn read_only_mount_reads_a_space_a_crash_left() {
    let mut m = TestMount::with_options("64M", None);
    let seed = test_seed("read_only_mount_reads_a_space_a_crash_left", 4);
    let v = pattern(seed, 3 << 20);
    fs::write(m.path("ckpt"), &v).unwrap();
    // Acknowledged (closed), then a namespace change that no fsync made durable.
    fs::create_dir(m.path("later")).unwrap();
    m.kill_daemon();
    let before = snapshot(m.backing());
    m.mount_with(&["--read-only"]);
    assert!(
        fs::read(m.path("ckpt")).unwrap() == v,
        "the closed checkpoint"
    );
    m.unmount();
    assert_eq!(
        snapshot(m.backing()),
        before,
        "a read-only mount of a crashed space changed the backing directory"
    );
    m.mount();
    assert!(fs::read(m.path("ckpt")).unwrap() == v);
    let mnt = m.mnt().to_path_buf();
    let out = m.ckptfs_ok(&[o("check"), mnt.as_os_str()]);
    assert!(out.contains("clean"), "{out}");
}

/// `mount -o remount,ro` of a read-write mount stops writes at the kernel; `remount,rw`
/// lets them through again (the daemon was read-write all along).
#[test]
fn remount_read_only_and_back() {
    let m = TestMount::with_options("64M", None);
    fs::write(m.path("a"), b"1").unwrap();
    let remount = |how: &str| {
        Command::new("mount")
            .args(["-i", "-o", how])
            .arg(m.mnt())
            .status()
    };
    match remount("remount,ro") {
        Ok(s) if s.success() => {}
        other => {
            return ckptfs_tests::skip(
                "remount,ro check",
                "remount",
                &format!(
                    "`mount -i -o remount,ro` gave {other:?} (needs root and util-linux mount)"
                ),
            );
        }
    }
    erofs("write after remount,ro", fs::write(m.path("b"), b"2"));
    assert_eq!(fs::read(m.path("a")).unwrap(), b"1");
    assert!(remount("remount,rw").unwrap().success());
    fs::write(m.path("b"), b"2").unwrap();
    assert_eq!(fs::read(m.path("b")).unwrap(), b"2");
}
