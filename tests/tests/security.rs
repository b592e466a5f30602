//! Security: the backing files are private; other users reach the mount only with
//! `--allow-other`, and then only as file modes and owners allow; the revision view is
//! read-only, names nothing outside itself and shows no revision to a user who may not read
//! its file; the control attributes that change the space are for root and the mount's owner.
//!
//! The tests run as root and act as `nobody` (65534) in forked children.

use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ckptfs_engine::format::SPACE_FILES;
use ckptfs_tests::{assert_file_eq, cpath, list_tree, write_file_checked, TempDir, TestMount};

const SMALL: &str = "64M";
const NOBODY: u32 = 65534;

/// A syscall to make as another user. Everything it needs is built before the fork, so the
/// child only makes raw syscalls (no allocation, no locks).
enum Op {
    Stat(CString),
    /// open(O_RDONLY) and read one byte.
    Read(CString),
    /// open(O_DIRECTORY) and getdents64.
    List(CString),
    Open(CString, libc::c_int),
    Create(CString),
    Mkdir(CString),
    Unlink(CString),
    Rmdir(CString),
    Rename(CString, CString),
    Chmod(CString, libc::mode_t),
    Chown(CString, u32, u32),
    Truncate(CString, i64),
    SetXattr(CString, CString, Vec<u8>),
    Symlink(CString, CString),
    Link(CString, CString),
    Mknod(CString),
    Utimes(CString),
}

fn c(p: &Path) -> CString {
    cpath(p)
}

fn cs(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

/// Runs the op; -1 with errno set on failure.
fn run_op(op: &Op) -> libc::c_int {
    // SAFETY: every pointer is to a C string or a buffer that outlives the call.
    unsafe {
        match op {
            Op::Stat(p) => {
                let mut st: libc::stat = std::mem::zeroed();
                libc::stat(p.as_ptr(), &mut st)
            }
            Op::Read(p) => {
                let fd = libc::open(p.as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    return -1;
                }
                let mut b = [0u8; 1];
                let r = libc::read(fd, b.as_mut_ptr().cast(), 1);
                libc::close(fd);
                if r < 0 {
                    -1
                } else {
                    0
                }
            }
            Op::List(p) => {
                let fd = libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
                if fd < 0 {
                    return -1;
                }
                let mut b = [0u8; 4096];
                let r = libc::syscall(libc::SYS_getdents64, fd, b.as_mut_ptr(), b.len());
                libc::close(fd);
                if r < 0 {
                    -1
                } else {
                    0
                }
            }
            Op::Open(p, flags) => {
                let fd = libc::open(p.as_ptr(), *flags, 0o644);
                if fd < 0 {
                    return -1;
                }
                libc::close(fd)
            }
            Op::Create(p) => {
                let fd = libc::open(
                    p.as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    0o644,
                );
                if fd < 0 {
                    return -1;
                }
                libc::close(fd)
            }
            Op::Mkdir(p) => libc::mkdir(p.as_ptr(), 0o755),
            Op::Unlink(p) => libc::unlink(p.as_ptr()),
            Op::Rmdir(p) => libc::rmdir(p.as_ptr()),
            Op::Rename(a, b) => libc::rename(a.as_ptr(), b.as_ptr()),
            Op::Chmod(p, m) => libc::chmod(p.as_ptr(), *m),
            Op::Chown(p, u, g) => libc::chown(p.as_ptr(), *u, *g),
            Op::Truncate(p, l) => libc::truncate(p.as_ptr(), *l),
            Op::SetXattr(p, n, v) => {
                libc::setxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0)
            }
            Op::Symlink(t, l) => libc::symlink(t.as_ptr(), l.as_ptr()),
            Op::Link(a, b) => libc::link(a.as_ptr(), b.as_ptr()),
            Op::Mknod(p) => libc::mknod(p.as_ptr(), libc::S_IFIFO | 0o644, 0),
            Op::Utimes(p) => libc::utimes(p.as_ptr(), std::ptr::null()),
        }
    }
}

fn errno_now() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
}

/// The op as this process (root): 0 or the errno.
fn as_root(op: &Op) -> i32 {
    if run_op(op) < 0 {
        errno_now()
    } else {
        0
    }
}

/// The op in a child that has become `uid`/`gid` (no supplementary groups): 0 or the errno.
fn as_user(uid: u32, op: &Op) -> i32 {
    // SAFETY: the child makes only async-signal-safe syscalls and leaves with _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                255
            } else if run_op(op) < 0 {
                *libc::__errno_location()
            } else {
                0
            };
            libc::_exit(code);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid, "waitpid");
        assert!(libc::WIFEXITED(status), "child died: status {status}");
        let code = libc::WEXITSTATUS(status);
        assert_ne!(
            code, 255,
            "could not switch to uid {uid} (tests run as root)"
        );
        code
    }
}

fn nobody(op: &Op) -> i32 {
    as_user(NOBODY, op)
}

fn name(e: i32) -> String {
    if e == 0 {
        "success".into()
    } else {
        std::io::Error::from_raw_os_error(e).to_string()
    }
}

#[track_caller]
fn expect(what: &str, got: i32, want: &[i32]) {
    assert!(
        want.contains(&got),
        "{what}: got {} ({got}), want one of {:?}",
        name(got),
        want.iter().map(|e| name(*e)).collect::<Vec<_>>()
    );
}

const OK: &[i32] = &[0];
const EACCES: &[i32] = &[libc::EACCES];
const EPERM: &[i32] = &[libc::EPERM];
const DENIED: &[i32] = &[libc::EACCES, libc::EPERM];
const READ_ONLY: &[i32] = &[libc::EROFS, libc::EACCES, libc::EPERM];
const NOT_THERE: &[i32] = &[libc::ENOENT, libc::ENAMETOOLONG];

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// Runs `ckptfs format` with umask 0 and returns its stderr (panics on failure).
fn format_with_umask_0(dir: &Path) {
    let out = Command::new(ckptfs_tests::ckptfs_bin())
        .args([OsStr::new("format"), dir.as_os_str(), OsStr::new("--size")])
        .arg(SMALL)
        .process_group(0)
        .pre_exec_umask0()
        .output()
        .expect("run ckptfs format");
    assert!(
        out.status.success(),
        "format {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

trait Umask0 {
    fn pre_exec_umask0(&mut self) -> &mut Self;
}

impl Umask0 for Command {
    fn pre_exec_umask0(&mut self) -> &mut Self {
        // SAFETY: umask is async-signal-safe and cannot fail.
        unsafe {
            self.pre_exec(|| {
                libc::umask(0);
                Ok(())
            })
        }
    }
}

#[track_caller]
fn assert_private_space(dir: &Path) {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read_dir backing")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = SPACE_FILES.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names, want, "{}: backing files", dir.display());
    for n in &names {
        let m = mode_of(&dir.join(n));
        assert_eq!(m, 0o600, "{}/{n} has mode {m:o}, want 600", dir.display());
    }
    let d = mode_of(dir);
    assert_eq!(
        d & 0o022,
        0,
        "backing dir {} has mode {d:o}: writable by group or others",
        dir.display()
    );
}

#[test]
fn backing_files_are_private_whatever_the_umask() {
    let t = TempDir::new("sec-umask");
    // A directory format creates.
    let new = t.path().join("a/new");
    format_with_umask_0(&new);
    assert_private_space(&new);
    // An existing, world-writable one.
    let open = t.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    format_with_umask_0(&open);
    assert_private_space(&open);

    // After use (mount, writes, remount) nothing has widened.
    let mut m = TestMount::with_options(SMALL, None);
    write_file_checked(&m.path("f"), b"private").expect("write");
    m.remount();
    m.unmount();
    assert_private_space(m.backing());
}

#[test]
fn without_allow_other_other_users_get_eacces() {
    let m = TestMount::with_options(SMALL, None);
    let p = m.path("pub");
    write_file_checked(&p, b"public").expect("write");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(m.path("d")).unwrap();
    expect("root reads pub", as_root(&Op::Read(c(&p))), OK);
    expect("nobody stat mount", nobody(&Op::Stat(c(m.mnt()))), EACCES);
    expect("nobody list mount", nobody(&Op::List(c(m.mnt()))), EACCES);
    expect("nobody stat pub", nobody(&Op::Stat(c(&p))), EACCES);
    expect("nobody read pub", nobody(&Op::Read(c(&p))), EACCES);
    expect("nobody list d", nobody(&Op::List(c(&m.path("d")))), EACCES);
    expect(
        "nobody create",
        nobody(&Op::Create(c(&m.path("new")))),
        EACCES,
    );
    expect(
        "nobody stat view",
        nobody(&Op::Stat(c(&m.path(".ckptfs/revisions/pub")))),
        EACCES,
    );
    expect(
        "nobody control gc",
        nobody(&Op::SetXattr(
            c(m.mnt()),
            cs("user.ckptfs.gc"),
            b"run".to_vec(),
        )),
        EACCES,
    );
    assert!(!m.path("new").exists());
    assert_file_eq(&p, b"public");
}

/// A mount with `--allow-other`.
fn allow_other_mount() -> TestMount {
    let mut m = TestMount::with_options(SMALL, None);
    m.unmount();
    m.mount_with(&["--allow-other"]);
    m
}

fn put(p: &Path, data: &[u8], mode: u32) {
    write_file_checked(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn mkdir(p: &Path, mode: u32) {
    fs::create_dir(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).expect("chown");
}

#[test]
fn allow_other_enforces_modes_and_owners() {
    let m = allow_other_mount();
    let p = |s: &str| m.path(s);
    put(&p("pub"), b"public", 0o644);
    put(&p("secret"), b"secret", 0o600);
    mkdir(&p("rootdir"), 0o755);
    mkdir(&p("privdir"), 0o700);
    put(&p("privdir/inner"), b"inner", 0o644);
    mkdir(&p("listonly"), 0o744);
    put(&p("listonly/inner"), b"inner2", 0o644);
    mkdir(&p("nobodydir"), 0o755);
    chown(&p("nobodydir"), NOBODY);
    let before = list_tree(m.mnt());

    expect("read 0644", nobody(&Op::Read(c(&p("pub")))), OK);
    expect("list root", nobody(&Op::List(c(m.mnt()))), OK);
    expect("read 0600", nobody(&Op::Read(c(&p("secret")))), EACCES);
    expect(
        "write 0644",
        nobody(&Op::Open(c(&p("pub")), libc::O_WRONLY)),
        EACCES,
    );
    expect(
        "truncate 0644",
        nobody(&Op::Truncate(c(&p("pub")), 0)),
        EACCES,
    );
    expect(
        "create in 0755 root dir",
        nobody(&Op::Create(c(&p("rootdir/new")))),
        EACCES,
    );
    expect(
        "create in the mount root",
        nobody(&Op::Create(c(&p("new")))),
        EACCES,
    );
    expect(
        "mkdir in 0755 root dir",
        nobody(&Op::Mkdir(c(&p("rootdir/x")))),
        EACCES,
    );
    expect("unlink", nobody(&Op::Unlink(c(&p("pub")))), EACCES);
    expect(
        "rename",
        nobody(&Op::Rename(c(&p("pub")), c(&p("rootdir/pub")))),
        EACCES,
    );
    expect("rmdir", nobody(&Op::Rmdir(c(&p("rootdir")))), EACCES);
    expect(
        "chmod other's",
        nobody(&Op::Chmod(c(&p("pub")), 0o666)),
        EPERM,
    );
    expect(
        "chown other's",
        nobody(&Op::Chown(c(&p("pub")), NOBODY, NOBODY)),
        EPERM,
    );
    expect("utimes other's", nobody(&Op::Utimes(c(&p("pub")))), DENIED);
    expect(
        "setxattr other's",
        nobody(&Op::SetXattr(c(&p("pub")), cs("user.x"), b"1".to_vec())),
        &[libc::EACCES, libc::EPERM, libc::EOPNOTSUPP],
    );
    expect(
        "stat in 0700 dir",
        nobody(&Op::Stat(c(&p("privdir/inner")))),
        EACCES,
    );
    expect("list 0700 dir", nobody(&Op::List(c(&p("privdir")))), EACCES);
    expect("list 0744 dir", nobody(&Op::List(c(&p("listonly")))), OK);
    expect(
        "stat in 0744 dir",
        nobody(&Op::Stat(c(&p("listonly/inner")))),
        EACCES,
    );

    // In its own directory nobody creates, changes its own file's mode, and cannot give it
    // away.
    let mine = p("nobodydir/mine");
    expect("create in own dir", nobody(&Op::Create(c(&mine))), OK);
    expect("chmod own", nobody(&Op::Chmod(c(&mine), 0o640)), OK);
    expect(
        "chown own to root",
        nobody(&Op::Chown(c(&mine), 0, 0)),
        EPERM,
    );
    let md = fs::metadata(&mine).expect("stat mine");
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (NOBODY, NOBODY, 0o640)
    );
    fs::remove_file(&mine).unwrap();

    assert_eq!(list_tree(m.mnt()), before, "refused calls changed the tree");
    assert_file_eq(&p("pub"), b"public");
    assert_file_eq(&p("secret"), b"secret");
    assert_eq!(mode_of(&p("pub")), 0o644);
    assert_eq!(fs::metadata(p("pub")).unwrap().uid(), 0);
}

/// Writes `rel` twice so it has two revisions; returns their ids.
fn two_revisions(m: &mut TestMount, rel: &str, mode: u32) -> Vec<u64> {
    put(&m.path(rel), format!("{rel} v1").as_bytes(), mode);
    put(&m.path(rel), format!("{rel} v2").as_bytes(), mode);
    let ids: Vec<u64> = m.revisions(rel).iter().map(|r| r.id).collect();
    assert!(ids.len() >= 2, "{rel}: revisions {ids:?}");
    ids
}

/// The history id whose directory in `.ckptfs/histories` holds revision `rev`.
fn history_holding(m: &TestMount, rev: u64) -> u64 {
    let h = m.path(".ckptfs/histories");
    for e in fs::read_dir(&h).expect("list histories") {
        let e = e.expect("entry");
        if e.path().join(rev.to_string()).exists() {
            return e.file_name().to_string_lossy().parse().expect("numeric id");
        }
    }
    panic!("no history holds revision {rev}");
}

#[test]
fn revision_view_is_as_protected_as_the_files() {
    let mut m = allow_other_mount();
    mkdir(&m.path("privdir"), 0o700);
    mkdir(&m.path("listonly"), 0o744);
    mkdir(&m.path("nobodydir"), 0o755);
    chown(&m.path("nobodydir"), NOBODY);
    let pub_ids = two_revisions(&mut m, "pub", 0o644);
    let sec_ids = two_revisions(&mut m, "secret", 0o600);
    let priv_ids = two_revisions(&mut m, "privdir/inner", 0o644);
    let list_ids = two_revisions(&mut m, "listonly/inner", 0o644);
    let mine_ids = two_revisions(&mut m, "nobodydir/mine", 0o640);
    chown(&m.path("nobodydir/mine"), NOBODY);
    let v = |rel: &str| m.path(format!(".ckptfs/revisions/{rel}"));
    let sec_hid = history_holding(&m, sec_ids[0]);
    let priv_hid = history_holding(&m, priv_ids[0]);
    let hist = |hid: u64, rev: u64| m.path(format!(".ckptfs/histories/{hid}/{rev}"));

    // Each revision file carries its file's owner and read bits.
    for (rel, id, uid, mode) in [
        ("pub", pub_ids[0], 0, 0o444),
        ("secret", sec_ids[0], 0, 0o400),
        ("nobodydir/mine", mine_ids[0], NOBODY, 0o440),
    ] {
        let md = fs::metadata(v(&format!("{rel}/{id}"))).expect("stat revision");
        assert_eq!(
            (md.uid(), md.mode() & 0o7777),
            (uid, mode),
            "{rel}/{id}: owner and mode"
        );
    }
    let md = fs::metadata(v("nobodydir")).expect("stat view dir");
    assert_eq!((md.uid(), md.mode() & 0o7777), (NOBODY, 0o555));
    assert_eq!(
        mode_of(&v("listonly")),
        0o544,
        "a live dir's r/x bits, no more"
    );

    expect(
        "read revision of 0644",
        nobody(&Op::Read(c(&v(&format!("pub/{}", pub_ids[0]))))),
        OK,
    );
    expect(
        "list revisions of 0644",
        nobody(&Op::List(c(&v("pub")))),
        OK,
    );
    for id in &sec_ids {
        let r = v(&format!("secret/{id}"));
        expect("read revision of 0600", nobody(&Op::Read(c(&r))), EACCES);
        expect("stat revision of 0600", nobody(&Op::Stat(c(&r))), EACCES);
        expect(
            "read 0600 through histories",
            nobody(&Op::Read(c(&hist(sec_hid, *id)))),
            EACCES,
        );
    }
    expect(
        "list revisions of 0600",
        nobody(&Op::List(c(&v("secret")))),
        EACCES,
    );
    for id in &priv_ids {
        expect(
            "revision in a 0700 dir",
            nobody(&Op::Read(c(&v(&format!("privdir/inner/{id}"))))),
            EACCES,
        );
        expect(
            "revision in a 0700 dir through histories",
            nobody(&Op::Read(c(&hist(priv_hid, *id)))),
            EACCES,
        );
    }
    expect(
        "list 0700 dir view",
        nobody(&Op::List(c(&v("privdir")))),
        EACCES,
    );
    expect(
        "list 0744 dir view",
        nobody(&Op::List(c(&v("listonly")))),
        OK,
    );
    expect(
        "revision in a 0744 dir",
        nobody(&Op::Read(c(&v(&format!("listonly/inner/{}", list_ids[0]))))),
        EACCES,
    );
    expect(
        "list histories",
        nobody(&Op::List(c(&m.path(".ckptfs/histories")))),
        EACCES,
    );
    // The owner of a file reads its revisions.
    expect(
        "owner reads own 0640 revision",
        nobody(&Op::Read(c(&v(&format!("nobodydir/mine/{}", mine_ids[0]))))),
        OK,
    );
    // Root reads everything.
    assert_file_eq(&v(&format!("secret/{}", sec_ids[0])), b"secret v1");
    assert_file_eq(&hist(priv_hid, priv_ids[1]), b"privdir/inner v2");
}

#[test]
fn revision_view_is_read_only_and_names_nothing_outside_itself() {
    let mut m = TestMount::with_options(SMALL, None);
    fs::create_dir(m.path("d")).unwrap();
    let f_ids = two_revisions(&mut m, "f", 0o644);
    let g_ids = two_revisions(&mut m, "d/g", 0o644);
    std::os::unix::fs::symlink("f", m.path("link")).unwrap();
    let view = m.path(".ckptfs");
    let rev = |rel: &str| m.path(format!(".ckptfs/revisions/{rel}"));
    let f1 = rev(&format!("f/{}", f_ids[0]));
    let f_hid = history_holding(&m, f_ids[0]);
    let hists = m.path(".ckptfs/histories");
    let snapshot = |m: &TestMount| -> Vec<(PathBuf, u32, Vec<u8>)> {
        let mut out = Vec::new();
        for base in [m.mnt().to_path_buf(), m.path(".ckptfs")] {
            for r in list_tree(&base) {
                let p = base.join(&r);
                let md = fs::symlink_metadata(&p).expect("stat");
                let data = if md.is_file() {
                    fs::read(&p).expect("read")
                } else {
                    Vec::new()
                };
                out.push((p, md.mode(), data));
            }
        }
        out
    };
    let before = snapshot(&m);

    // Root passes every permission check, so these reach the daemon, which must refuse.
    let ops: Vec<(&str, Op)> = vec![
        ("create in view root", Op::Create(c(&rev("new")))),
        ("create in view dir", Op::Create(c(&rev("d/new")))),
        ("create in revision dir", Op::Create(c(&rev("f/new")))),
        ("create in histories", Op::Create(c(&hists.join("new")))),
        ("create in .ckptfs", Op::Create(c(&view.join("new")))),
        ("open revision O_WRONLY", Op::Open(c(&f1), libc::O_WRONLY)),
        ("open revision O_RDWR", Op::Open(c(&f1), libc::O_RDWR)),
        ("truncate revision", Op::Truncate(c(&f1), 0)),
        ("unlink revision", Op::Unlink(c(&f1))),
        ("rmdir view dir", Op::Rmdir(c(&rev("d")))),
        ("rmdir revisions", Op::Rmdir(c(&rev("")))),
        ("mkdir in view", Op::Mkdir(c(&rev("x")))),
        ("mkdir in view dir", Op::Mkdir(c(&rev("d/x")))),
        ("mkdir in histories", Op::Mkdir(c(&hists.join("12345")))),
        ("rename revision", Op::Rename(c(&f1), c(&rev("f/999")))),
        (
            "rename revision out",
            Op::Rename(c(&f1), c(&m.path("stolen"))),
        ),
        ("rename file in", Op::Rename(c(&m.path("f")), c(&rev("f2")))),
        ("rename view dir", Op::Rename(c(&rev("d")), c(&rev("e")))),
        ("chmod revision", Op::Chmod(c(&f1), 0o666)),
        ("chmod view dir", Op::Chmod(c(&rev("d")), 0o777)),
        ("chown revision", Op::Chown(c(&f1), NOBODY, NOBODY)),
        ("utimes revision", Op::Utimes(c(&f1))),
        (
            "symlink in view",
            Op::Symlink(cs("/etc/passwd"), c(&rev("evil"))),
        ),
        ("mknod in view", Op::Mknod(c(&rev("d/fifo")))),
        (
            "hard link of revision",
            Op::Link(c(&f1), c(&m.path("hard"))),
        ),
    ];
    for (what, op) in &ops {
        expect(what, as_root(op), READ_ONLY);
    }
    // O_RDONLY|O_TRUNC is unspecified by POSIX; whatever open says, nothing may be cut
    // (the snapshot below checks).
    expect(
        "open revision O_RDONLY|O_TRUNC",
        as_root(&Op::Open(c(&f1), libc::O_RDONLY | libc::O_TRUNC)),
        &[0, libc::EROFS, libc::EACCES, libc::EPERM],
    );
    expect(
        "setxattr revision",
        as_root(&Op::SetXattr(c(&f1), cs("user.x"), b"1".to_vec())),
        &[libc::EROFS, libc::EACCES, libc::EPERM, libc::EOPNOTSUPP],
    );
    // The reserved name at the root.
    let reserved: &[i32] = &[
        libc::EEXIST,
        libc::EROFS,
        libc::EACCES,
        libc::EPERM,
        libc::EISDIR,
        libc::ENOTEMPTY,
        libc::EBUSY,
    ];
    expect("mkdir .ckptfs", as_root(&Op::Mkdir(c(&view))), reserved);
    expect("create .ckptfs", as_root(&Op::Create(c(&view))), reserved);
    expect("rmdir .ckptfs", as_root(&Op::Rmdir(c(&view))), reserved);
    expect("unlink .ckptfs", as_root(&Op::Unlink(c(&view))), reserved);
    expect(
        "rename onto .ckptfs",
        as_root(&Op::Rename(c(&m.path("d")), c(&view))),
        reserved,
    );
    expect(
        "rename .ckptfs away",
        as_root(&Op::Rename(c(&view), c(&m.path("moved")))),
        reserved,
    );
    assert!(
        snapshot(&m) == before,
        "refused changes to the view changed something"
    );

    // Lookups: ".." stays in the mount, odd spellings and ids that are not there name
    // nothing, and a revision is found only under its own file.
    let root_ino = fs::metadata(m.mnt()).unwrap().ino();
    let view_ino = fs::metadata(&view).unwrap().ino();
    for (up, want) in [
        (".ckptfs/..", root_ino),
        (".ckptfs/revisions/..", view_ino),
        (".ckptfs/revisions/f/../..", view_ino),
        (".ckptfs/revisions/d/g/../../../..", root_ino),
        (".ckptfs/histories/..", view_ino),
    ] {
        let md = fs::metadata(m.path(up)).unwrap_or_else(|e| panic!("stat {up}: {e}"));
        assert_eq!(md.ino(), want, "{up}");
    }
    let id = f_ids[0];
    let odd: Vec<Vec<u8>> = vec![
        format!("0{id}").into_bytes(),
        format!("+{id}").into_bytes(),
        format!(" {id}").into_bytes(),
        format!("{id} ").into_bytes(),
        format!("{id}\n").into_bytes(),
        format!("-{id}").into_bytes(),
        format!("{id}.0").into_bytes(),
        b"0".to_vec(),
        b"999999999".to_vec(),
        b"18446744073709551616".to_vec(),
        b"\xff\xfe".to_vec(),
        b"..f".to_vec(),
        vec![b'1'; 255],
        vec![b'1'; 300],
    ];
    for n in &odd {
        for dir in [rev("f"), hists.join(f_hid.to_string())] {
            let p = dir.join(OsStr::from_bytes(n));
            expect(
                &format!(
                    "lookup {:?} in {}",
                    String::from_utf8_lossy(n),
                    dir.display()
                ),
                as_root(&Op::Stat(c(&p))),
                NOT_THERE,
            );
        }
        let p = hists.join(OsStr::from_bytes(n));
        if n.as_slice() != f_hid.to_string().as_bytes() {
            expect(
                &format!("lookup {:?} in histories", String::from_utf8_lossy(n)),
                as_root(&Op::Stat(c(&p))),
                NOT_THERE,
            );
        }
    }
    for n in [
        format!("0{f_hid}"),
        format!("+{f_hid}"),
        format!("{}", f_hid + (1 << 61)),
        format!("{}", f_hid + (1 << 62)),
        "0".into(),
    ] {
        expect(
            &format!("histories/{n}"),
            as_root(&Op::Stat(c(&hists.join(&n)))),
            NOT_THERE,
        );
    }
    // Another file's revision, through this file's directories.
    for g in &g_ids {
        expect(
            "other file's revision",
            as_root(&Op::Stat(c(&rev(&format!("f/{g}"))))),
            NOT_THERE,
        );
        expect(
            "other file's revision via histories",
            as_root(&Op::Stat(c(&hists.join(format!("{f_hid}/{g}"))))),
            NOT_THERE,
        );
    }
    // Symlinks are not in the view: nothing there can point outside it.
    expect(
        "symlink in view",
        as_root(&Op::Stat(c(&rev("link")))),
        NOT_THERE,
    );
    let names: Vec<String> = fs::read_dir(rev("f"))
        .expect("list f")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut want: Vec<String> = m.revisions("f").iter().map(|r| r.id.to_string()).collect();
    let mut got = names.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "the revision dir lists exactly the revisions");
    assert_file_eq(&m.path("f"), b"f v2");
}

/// `ckptfs ARGS` as uid `uid`: (success, stderr).
fn ckptfs_as(uid: u32, args: &[&OsStr]) -> (bool, String) {
    let out = Command::new(ckptfs_tests::ckptfs_bin())
        .args(args)
        .uid(uid)
        .gid(uid)
        .env("HOME", "/")
        .output()
        .expect("run ckptfs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn control_attributes_refuse_other_users() {
    let mut m = allow_other_mount();
    let ids = two_revisions(&mut m, "f", 0o644);
    let config_before = m.config(&[]);
    let mnt = m.mnt().to_path_buf();
    let set =
        |n: &str, v: &[u8]| Op::SetXattr(c(&mnt), cs(&format!("user.ckptfs.{n}")), v.to_vec());

    // The root is 0755 root: the kernel refuses user.* writes before the daemon sees them.
    expect("gc, 0755 root", nobody(&set("gc", b"run")), DENIED);
    // Writable by all: the daemon itself must refuse (may_control).
    fs::set_permissions(m.mnt(), fs::Permissions::from_mode(0o777)).unwrap();
    expect("gc", nobody(&set("gc", b"run")), EPERM);
    expect("gc dry run", nobody(&set("gc", b"dry-run")), EPERM);
    expect("config", nobody(&set("config", b"keep_revisions=1")), EPERM);
    // select is per process and harmless; restore must still be refused.
    expect("select", nobody(&set("select", b"f")), OK);
    expect(
        "restore",
        nobody(&set("restore", ids[0].to_string().as_bytes())),
        EPERM,
    );
    // Reading stats and the policy is allowed.
    let (ok, err) = ckptfs_as(NOBODY, &[OsStr::new("stats"), m.mnt().as_os_str()]);
    assert!(ok, "nobody may read stats: {err}");
    for args in [vec!["gc"], vec!["config", "--keep-revisions", "1"]] {
        let mut a = vec![OsStr::new(args[0]), m.mnt().as_os_str()];
        a.extend(args[1..].iter().map(OsStr::new));
        let (ok, err) = ckptfs_as(NOBODY, &a);
        assert!(!ok, "`ckptfs {args:?}` as nobody must be refused");
        assert!(
            err.contains("only root and the owner"),
            "`ckptfs {args:?}` as nobody: unclear refusal: {err}"
        );
    }
    let (ok, err) = ckptfs_as(
        NOBODY,
        &[
            OsStr::new("restore"),
            m.path("f").as_os_str(),
            OsStr::new("--revision"),
            OsStr::new(&ids[0].to_string()),
        ],
    );
    assert!(
        !ok && err.contains("only root and the owner"),
        "restore as nobody: {err}"
    );

    assert_eq!(
        m.config(&[]),
        config_before,
        "refused config changed the policy"
    );
    assert_eq!(
        m.revisions("f").iter().map(|r| r.id).collect::<Vec<_>>(),
        ids,
        "refused gc/restore changed the revisions"
    );
    assert_file_eq(&m.path("f"), b"f v2");

    // The owner of the mount's root may.
    fs::set_permissions(m.mnt(), fs::Permissions::from_mode(0o755)).unwrap();
    chown(m.mnt(), NOBODY);
    expect(
        "config by the root's owner",
        nobody(&set("config", b"keep_revisions=3")),
        OK,
    );
    assert_eq!(m.config(&[])["keep_revisions"], 3);
    chown(m.mnt(), 0);
}

/// `ckptfs revisions`, `report` and `restore --to` for a user who does not own the mount's
/// root (a job's user on a mount root made with --allow-other): the CLI cannot set the
/// root's `select` attribute, so it selects by gets asked of the file itself, which the
/// kernel lets through only to whoever may read the file. Their own files list; a file
/// they may not read does not, and naming another file's path in a get of their own
/// file's attribute selects nothing. Before, every such command failed for them with
/// "select: Permission denied".
#[test]
fn a_user_lists_revisions_of_files_they_may_read_and_no_others() {
    let mut m = allow_other_mount();
    mkdir(&m.path("nobodydir"), 0o755);
    chown(&m.path("nobodydir"), NOBODY);
    let deep = format!("nobodydir/{}", vec!["d".repeat(90); 3].join("/"));
    fs::create_dir_all(m.path(&deep)).expect("mkdir deep");
    let mine = two_revisions(&mut m, "nobodydir/mine", 0o644);
    let long_rel = format!("{deep}/{}", "f".repeat(40));
    let long = two_revisions(&mut m, &long_rel, 0o644);
    two_revisions(&mut m, "secret", 0o600);

    let dir = TempDir::new("user-revisions");
    let bin = dir.path().join("ckptfs");
    fs::copy(ckptfs_tests::ckptfs_bin(), &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    chown(dir.path(), NOBODY);
    let run = |args: &[&OsStr]| {
        let out = Command::new(&bin)
            .args(args)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        println!(
            "$ ckptfs {args:?}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    for (rel, ids) in [("nobodydir/mine", &mine), (long_rel.as_str(), &long)] {
        let p = m.path(rel);
        let out = run(&["revisions".as_ref(), "--json".as_ref(), p.as_os_str()]);
        assert!(
            out.status.success(),
            "revisions of {rel} as nobody: {out:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let got: Vec<u64> = v
            .as_array()
            .expect("array")
            .iter()
            .map(|r| r["id"].as_u64().expect("id"))
            .collect();
        assert_eq!(&got, ids, "{rel}: the revisions root lists");
    }
    let to = dir.path().join("copy");
    let out = run(&[
        "restore".as_ref(),
        m.path("nobodydir/mine").as_os_str(),
        "--revision".as_ref(),
        mine[0].to_string().as_ref(),
        "--to".as_ref(),
        to.as_os_str(),
    ]);
    assert!(out.status.success(), "restore --to as nobody: {out:?}");
    assert_file_eq(&to, b"nobodydir/mine v1");
    let out = run(&["revisions".as_ref(), m.path("secret").as_os_str()]);
    assert!(
        !out.status.success(),
        "nobody listed a 0600 file's revisions"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not readable by this user"),
        "{out:?}"
    );

    // A forged selection: a get of nobody's own file's attribute naming the secret's path.
    let own = cpath(&m.path("nobodydir/mine"));
    let root = cpath(m.mnt());
    let forged = CString::new(format!(
        "user.ckptfs.select-end-hex-{}",
        b"secret"
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
    .unwrap();
    let listing = CString::new("user.ckptfs.revisions-after-0").unwrap();
    // SAFETY: the child makes only async-signal-safe syscalls and leaves with _exit.
    let code = unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            let code = if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                255
            } else if libc::getxattr(own.as_ptr(), forged.as_ptr(), std::ptr::null_mut(), 0) >= 0
                || *libc::__errno_location() != libc::EACCES
            {
                1
            } else if libc::getxattr(root.as_ptr(), listing.as_ptr(), std::ptr::null_mut(), 0) >= 0
            {
                2
            } else {
                0
            };
            libc::_exit(code);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        libc::WEXITSTATUS(status)
    };
    assert_eq!(
        code, 0,
        "1: the forged selection was not refused with EACCES; 2: it selected the secret"
    );
}
