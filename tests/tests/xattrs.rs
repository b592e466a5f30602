//! Extended attributes (issue 19): the answers a plain directory on the same disk gives, for
//! root and for an unprivileged user; what revisions record and restore; the bounds.

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use ckptfs_tests::TestMount;

const NOBODY: u32 = 65534;

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn name(n: &str) -> CString {
    CString::new(n).unwrap()
}

fn last_errno() -> String {
    format!(
        "errno {}",
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    )
}

fn set(p: &Path, n: &str, v: &[u8], flags: i32) -> String {
    // SAFETY: valid C strings and a value slice of the length passed.
    let r = unsafe {
        libc::lsetxattr(
            c(p).as_ptr(),
            name(n).as_ptr(),
            v.as_ptr().cast(),
            v.len(),
            flags,
        )
    };
    if r < 0 {
        last_errno()
    } else {
        "ok".into()
    }
}

/// getxattr with a buffer of `size` bytes (0: the size probe).
fn get(p: &Path, n: &str, size: usize) -> String {
    let mut buf = vec![0u8; size];
    // SAFETY: the buffer is `size` bytes long (a null pointer is allowed with size 0).
    let r = unsafe {
        libc::lgetxattr(
            c(p).as_ptr(),
            name(n).as_ptr(),
            buf.as_mut_ptr().cast(),
            size,
        )
    };
    if r < 0 {
        last_errno()
    } else if size == 0 {
        format!("size {r}")
    } else {
        format!("ok {}", String::from_utf8_lossy(&buf[..r as usize]))
    }
}

fn list(p: &Path) -> String {
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: the buffer is as long as the size passed.
    let r = unsafe { libc::llistxattr(c(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return last_errno();
    }
    let mut names: Vec<String> = buf[..r as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    names.sort();
    format!("ok {}", names.join(","))
}

fn remove(p: &Path, n: &str) -> String {
    // SAFETY: valid C strings.
    if unsafe { libc::lremovexattr(c(p).as_ptr(), name(n).as_ptr()) } < 0 {
        last_errno()
    } else {
        "ok".into()
    }
}

/// `xattr-op` as the unprivileged user.
fn as_nobody(args: &[&str], path: &Path) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xattr-op"));
    cmd.arg(args[0])
        .arg(path)
        .args(&args[1..])
        .uid(NOBODY)
        .gid(NOBODY);
    let out = cmd.output().expect("run xattr-op");
    assert!(
        out.status.success(),
        "xattr-op: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every step on `dir`, with its answer.
fn script(dir: &Path) -> Vec<(String, String)> {
    let f = dir.join("f");
    let d = dir.join("d");
    let l = dir.join("l");
    fs::write(&f, b"content").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(&d).unwrap();
    std::os::unix::fs::symlink("f", &l).unwrap();
    let long_ok = format!("user.{}", "n".repeat(250));
    let long_bad = format!("user.{}", "n".repeat(251));
    let ctime_before =
        fs::metadata(&f).unwrap().ctime_nsec() + fs::metadata(&f).unwrap().ctime() * 1_000_000_000;
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut out = Vec::new();
    let mut step = |what: &str, r: String| out.push((what.to_string(), r));
    step("set user.a", set(&f, "user.a", b"1", 0));
    let m = fs::metadata(&f).unwrap();
    step(
        "ctime moved by setxattr",
        ((m.ctime() * 1_000_000_000 + m.ctime_nsec()) > ctime_before).to_string(),
    );
    step(
        "create existing",
        set(&f, "user.a", b"2", libc::XATTR_CREATE),
    );
    step(
        "replace missing",
        set(&f, "user.b", b"2", libc::XATTR_REPLACE),
    );
    step(
        "create and replace, missing",
        set(&f, "user.b", b"2", libc::XATTR_CREATE | libc::XATTR_REPLACE),
    );
    step(
        "create and replace, existing",
        set(&f, "user.a", b"2", libc::XATTR_CREATE | libc::XATTR_REPLACE),
    );
    step(
        "replace existing",
        set(&f, "user.a", b"hello", libc::XATTR_REPLACE),
    );
    step("get", get(&f, "user.a", 100));
    step("probe", get(&f, "user.a", 0));
    step("small buffer", get(&f, "user.a", 2));
    step("get missing", get(&f, "user.none", 100));
    step("empty value", set(&f, "user.empty", b"", 0));
    step("get empty", get(&f, "user.empty", 100));
    step("255-byte name", set(&f, &long_ok, b"v", 0));
    step("256-byte name", set(&f, &long_bad, b"v", 0));
    step("get 256-byte name", get(&f, &long_bad, 100));
    step(
        "value of 65537 bytes",
        set(&f, "user.huge", &vec![1u8; 65537], 0),
    );
    step("system namespace", set(&f, "system.foo", b"v", 0));
    step("unknown namespace", set(&f, "other.foo", b"v", 0));
    step("trusted as root", set(&f, "trusted.t", b"T", 0));
    step("security as root", set(&f, "security.s", b"S", 0));
    step("list as root", list(&f));
    step("remove", remove(&f, "user.empty"));
    step("remove again", remove(&f, "user.empty"));
    step("remove missing", remove(&f, "user.never"));
    step("dir set", set(&d, "user.dir", b"D", 0));
    step("dir list", list(&d));
    step("symlink user", set(&l, "user.x", b"1", 0));
    step("symlink trusted", set(&l, "trusted.x", b"1", 0));
    step("symlink list", list(&l));
    step("missing file", set(&dir.join("nope"), "user.x", b"1", 0));
    step("list after all", list(&f));
    // An unprivileged user: reads with read permission, writes need write permission,
    // trusted.* is neither listed nor readable.
    step("nobody list", as_nobody(&["list"], &f));
    step("nobody get", as_nobody(&["get", "user.a"], &f));
    step("nobody get trusted", as_nobody(&["get", "trusted.t"], &f));
    step("nobody set on 0644", as_nobody(&["set", "user.n", "v"], &f));
    step(
        "nobody remove on 0644",
        as_nobody(&["remove", "user.a"], &f),
    );
    step(
        "nobody set trusted",
        as_nobody(&["set", "trusted.n", "v"], &f),
    );
    fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
    step("nobody set on 0666", as_nobody(&["set", "user.n", "v"], &f));
    step(
        "nobody remove on 0666",
        as_nobody(&["remove", "user.n"], &f),
    );
    step(
        "nobody set trusted on 0666",
        as_nobody(&["set", "trusted.n", "v"], &f),
    );
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    step("nobody get on 0600", as_nobody(&["get", "user.a"], &f));
    step("nobody list on 0600", as_nobody(&["list"], &f));
    // File capabilities go with any write or truncate, by whichever path and user.
    let caps: Vec<u8> = [0x0200_0001u32, 1 << 10, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    type Op<'a> = &'a dyn Fn(&Path);
    let ops: [(&str, Op); 6] = [
        ("read-write handle", &|p| {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap()
                .write_all(b"z")
                .unwrap()
        }),
        ("write-only handle", &|p| {
            fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .write_all(b"z")
                .unwrap()
        }),
        ("append", &|p| {
            fs::OpenOptions::new()
                .append(true)
                .open(p)
                .unwrap()
                .write_all(b"z")
                .unwrap()
        }),
        ("O_TRUNC open", &|p| drop(fs::File::create(p).unwrap())),
        ("truncate", &|p| {
            fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(3)
                .unwrap()
        }),
        ("nobody's write", &|p| {
            let st = Command::new(env!("CARGO_BIN_EXE_setid-op"))
                .arg("wronly")
                .arg(p)
                .uid(NOBODY)
                .gid(NOBODY)
                .status()
                .unwrap();
            assert!(st.success());
        }),
    ];
    let g = dir.join("g");
    for (what, op) in ops {
        fs::write(&g, b"content").unwrap();
        fs::set_permissions(&g, fs::Permissions::from_mode(0o666)).unwrap();
        set(&g, "security.capability", &caps, 0);
        let before = list(&g);
        op(&g);
        step(
            &format!("caps after {what}"),
            format!("{before} -> {}", list(&g)),
        );
    }
    out
}

#[test]
fn xattr_answers_match_a_plain_directory() {
    let (mut m, plain) = ckptfs_tests::mount_beside_plain("xattr-plain");
    let theirs = script(plain.path());
    let ours = script(m.mnt());
    let mut diffs = Vec::new();
    for ((what, t), (_, o)) in theirs.iter().zip(&ours) {
        eprintln!("{what:<32} plain {t:<28} ckptfs {o}");
        if t != o {
            diffs.push(format!("{what}: plain {t}, ckptfs {o}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "answers differ from the plain directory:\n{}",
        diffs.join("\n")
    );
    // They stay after a remount, and the space checks clean.
    m.remount();
    let f = m.path("f");
    assert_eq!(get(&f, "user.a", 100), "ok hello");
    assert_eq!(list(&m.path("d")), "ok user.dir");
    let mnt = m.mnt().to_path_buf();
    let out = m.ckptfs_ok(&[std::ffi::OsStr::new("check"), mnt.as_os_str()]);
    assert!(out.contains("clean"), "check: {out}");
}

/// Each revision records its file's attributes; the revision view shows them; restore brings
/// them back with the bytes; a rename that replaces a file carries the source's; revisions
/// dropped by gc take theirs along (check finds no orphan).
#[test]
fn revisions_record_and_restore_xattrs() {
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "2"]);
    let p = m.path("ckpt");
    fs::write(&p, b"v1").unwrap();
    assert_eq!(set(&p, "user.step", b"1", 0), "ok");
    fs::write(&p, b"v2").unwrap();
    assert_eq!(set(&p, "user.step", b"2", 0), "ok");
    assert_eq!(set(&p, "user.only2", b"x", 0), "ok");
    fs::write(&p, b"v3").unwrap();
    let revs = m.revisions("ckpt");
    assert_eq!(revs.len(), 3, "{revs:?}");
    // v1's commit happened before any attribute; v2's saw step=1; v3's saw step=2 and only2.
    assert_eq!(list(&m.view_path("ckpt", revs[0].id)), "ok ");
    assert_eq!(
        get(&m.view_path("ckpt", revs[1].id), "user.step", 10),
        "ok 1"
    );
    assert_eq!(
        list(&m.view_path("ckpt", revs[2].id)),
        "ok user.only2,user.step"
    );
    assert_eq!(
        set(&m.view_path("ckpt", revs[1].id), "user.x", b"1", 0),
        format!("errno {}", libc::EROFS),
        "the view is read-only"
    );
    m.restore("ckpt", revs[1].id);
    assert_eq!(fs::read(&p).unwrap(), b"v2");
    assert_eq!(list(&p), "ok user.step");
    assert_eq!(get(&p, "user.step", 10), "ok 1");

    // Write-temp-then-rename: the new file's attributes are what the path has afterwards,
    // and the copied revision in the path's history records them.
    let tmp = m.path("ckpt.tmp");
    fs::write(&tmp, b"v4").unwrap();
    assert_eq!(set(&tmp, "user.step", b"4", 0), "ok");
    fs::rename(&tmp, &p).unwrap();
    assert_eq!(get(&p, "user.step", 10), "ok 4");
    let revs = m.revisions("ckpt");
    let newest = revs.last().unwrap().id;
    assert_eq!(fs::read(m.view_path("ckpt", newest)).unwrap(), b"v4");
    // The temp file's commit came before its setxattr: the revision has no step yet, as
    // any revision records the attributes at its commit.
    assert_eq!(list(&m.view_path("ckpt", newest)), "ok ");

    let before = m.revisions("ckpt").len();
    m.gc(false);
    assert!(m.revisions("ckpt").len() < before, "gc dropped no revision");
    let mnt = m.mnt().to_path_buf();
    let out = m.ckptfs_ok(&[std::ffi::OsStr::new("check"), mnt.as_os_str()]);
    assert!(out.contains("clean"), "check after gc: {out}");
}

/// An inode's attributes are bounded: names (with their NULs) fit listxattr's 64 KiB, values
/// together 256 KiB; past either, ENOSPC, and nothing already stored is lost.
#[test]
fn xattr_room_is_bounded() {
    let m = TestMount::new();
    let f = m.path("f");
    fs::write(&f, b"x").unwrap();
    let big = vec![7u8; 65536];
    for i in 0..4 {
        assert_eq!(set(&f, &format!("user.v{i}"), &big, 0), "ok", "value {i}");
    }
    assert_eq!(
        set(&f, "user.v4", &big, 0),
        format!("errno {}", libc::ENOSPC)
    );
    // Replacing one with a value of the same size still fits.
    assert_eq!(set(&f, "user.v3", &big, 0), "ok");
    for i in 0..4 {
        assert_eq!(remove(&f, &format!("user.v{i}")), "ok");
    }
    // 256 names of 255 bytes (256 with the NUL) fill 64 KiB exactly.
    let names: Vec<String> = (0..257)
        .map(|i| format!("user.{i:03}{}", "n".repeat(247)))
        .collect();
    for n in &names[..256] {
        assert_eq!(n.len(), 255);
        assert_eq!(set(&f, n, b"", 0), "ok");
    }
    assert_eq!(
        set(&f, &names[256], b"", 0),
        format!("errno {}", libc::ENOSPC)
    );
    let listed = list(&f);
    assert_eq!(listed.matches(',').count(), 255, "all 256 names listed");
}

/// `ls -l` asks every file for its SELinux label and its POSIX ACL; coreutils stops asking
/// on a device once one answer says "not supported", while ENODATA (which the kernel caches
/// for neither on FUSE) made each a round trip to the daemon per listed file (20,000 files:
/// `ls -l` 13x a plain directory). Both answers, and ls's resulting calls, counted by strace.
#[test]
fn ls_l_asks_for_labels_and_acls_once_per_mount() {
    let m = TestMount::new();
    let d = m.path("many");
    fs::create_dir(&d).unwrap();
    for i in 0..200 {
        fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    let f = d.join("f0");
    assert_eq!(get(&f, "security.selinux", 255), "errno 95");
    assert_eq!(get(&f, "system.posix_acl_access", 0), "errno 95");
    assert_eq!(get(&d, "system.posix_acl_default", 0), "errno 95");
    assert_eq!(set(&f, "security.selinux", b"x", 0), "errno 95");
    assert_eq!(remove(&f, "security.selinux"), "errno 95");
    // Other security names are still stored (file capabilities among them).
    assert_eq!(set(&f, "security.s", b"S", 0), "ok");
    assert_eq!(get(&f, "security.s", 10), "ok S");
    if Command::new("strace").arg("-V").output().is_err() {
        return ckptfs_tests::skip(
            "ls_l_asks_for_labels_and_acls_once_per_mount",
            "strace",
            "strace is not installed, so ls's extended-attribute calls cannot be counted",
        );
    }
    let log = m.root().join("ls.strace");
    let st = Command::new("strace")
        .args(["-f", "-e", "trace=getxattr,lgetxattr", "-o"])
        .arg(&log)
        .args(["ls", "-l"])
        .arg(&d)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "ls -l failed: {st}");
    let calls = fs::read_to_string(&log).unwrap();
    let n = calls.lines().filter(|l| l.contains("getxattr(")).count();
    assert!(
        n <= 4,
        "ls -l of 200 files made {n} extended-attribute calls (want at most 4):\n{calls}"
    );
}
