//! POSIX semantics through the mount that checkpoint writers rely on.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use ckptfs_tests::{
    assert_file_eq, check, close_checked, cpath, errno, first_difference, pattern, TestMount,
};

fn read_all(f: &mut File) -> Vec<u8> {
    f.seek(SeekFrom::Start(0)).expect("seek");
    let mut v = Vec::new();
    f.read_to_end(&mut v).expect("read");
    v
}

#[track_caller]
fn assert_errno<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32, what: &str) {
    match errno(r) {
        Err(e) if e == want => {}
        other => panic!(
            "{what}: want errno {want} ({}), got {other:?}",
            std::io::Error::from_raw_os_error(want)
        ),
    }
}

#[test]
fn o_excl_on_existing_file_is_eexist() {
    let m = TestMount::new();
    let p = m.path("ckpt");
    fs::write(&p, b"original").expect("write");
    let r = OpenOptions::new().write(true).create_new(true).open(&p);
    assert_errno(r, libc::EEXIST, "open(O_CREAT|O_EXCL) on an existing file");
    assert_file_eq(&p, b"original");
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.path("fresh"))
        .expect("O_EXCL on a new name succeeds");
    f.write_all(b"new").expect("write");
    drop(f);
    assert_file_eq(&m.path("fresh"), b"new");
    fs::create_dir(m.path("dir")).expect("mkdir");
    let r = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.path("dir"));
    assert_errno(
        r,
        libc::EEXIST,
        "open(O_CREAT|O_EXCL) on an existing directory",
    );
}

#[test]
fn o_append_appends() {
    let m = TestMount::new();
    let p = m.path("log");
    fs::write(&p, b"hello").expect("write");
    let mut a = OpenOptions::new()
        .append(true)
        .open(&p)
        .expect("open append");
    let mut b = OpenOptions::new()
        .append(true)
        .open(&p)
        .expect("open append 2");
    a.write_all(b" world").expect("append");
    b.write_all(b"|B").expect("append b");
    a.write_all(b"|A").expect("append a");
    // Seeking does not move O_APPEND writes away from the end.
    a.seek(SeekFrom::Start(0)).expect("seek");
    a.write_all(b"|end").expect("append after seek");
    drop((a, b));
    assert_file_eq(&p, b"hello world|B|A|end");
    let big = pattern(7, 300_000);
    let mut f = OpenOptions::new()
        .append(true)
        .open(&p)
        .expect("open append");
    f.write_all(&big).expect("append big");
    drop(f);
    let mut want = b"hello world|B|A|end".to_vec();
    want.extend_from_slice(&big);
    assert_file_eq(&p, &want);
}

#[test]
fn o_trunc_truncates() {
    let m = TestMount::new();
    let p = m.path("ckpt");
    fs::write(&p, pattern(1, 100_000)).expect("write");
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .expect("open O_TRUNC");
    assert_eq!(
        fs::metadata(&p).expect("stat").len(),
        0,
        "size right after open(O_TRUNC)"
    );
    f.write_all(b"x").expect("write");
    drop(f);
    assert_file_eq(&p, b"x");
    // O_TRUNC on an empty file and through File::create (O_CREAT|O_TRUNC) on an existing one.
    fs::write(&p, b"").expect("truncate to empty");
    assert_file_eq(&p, b"");
    fs::write(&p, b"second").expect("write");
    File::create(&p).expect("create over existing");
    assert_file_eq(&p, b"");
}

#[test]
fn truncate_and_ftruncate_grow_and_shrink() {
    let mut m = TestMount::new();
    let p = m.path("ckpt");
    let data = pattern(2, 200_000);
    fs::write(&p, &data).expect("write");

    // truncate(2) by path to shrink.
    check(unsafe { libc::truncate(cpath(&p).as_ptr(), 1000) }).expect("truncate shrink");
    assert_file_eq(&p, &data[..1000]);

    // ftruncate to grow: the new region reads as zeros, the old bytes as before.
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open");
    f.set_len(300_000).expect("ftruncate grow");
    let mut want = data[..1000].to_vec();
    want.resize(300_000, 0);
    assert_eq!(read_all(&mut f), want, "after ftruncate grow");

    // Shrink into the middle, then grow again: the regrown region must be zeros, not old data.
    f.set_len(500).expect("ftruncate shrink");
    f.set_len(150_000).expect("ftruncate regrow");
    let mut want = data[..500].to_vec();
    want.resize(150_000, 0);
    if let Some(d) = first_difference(&read_all(&mut f), &want) {
        panic!("shrink to 500 then grow to 150000 (fd): {d}");
    }
    drop(f);
    assert_file_eq(&p, &want);

    // Same after the data has been committed and reopened: shrink to 0 and regrow.
    let f = OpenOptions::new().write(true).open(&p).expect("open");
    f.set_len(0).expect("shrink to 0");
    f.set_len(5000).expect("grow to 5000");
    f.write_all_at(b"tail", 4996).expect("pwrite at end");
    drop(f);
    let mut want = vec![0u8; 4996];
    want.extend_from_slice(b"tail");
    assert_file_eq(&p, &want);

    m.remount();
    assert_file_eq(&m.path("ckpt"), &want);
}

#[test]
fn unlink_while_open_keeps_the_open_file_usable() {
    let m = TestMount::new();
    let p = m.path("victim");
    let data = pattern(3, 70_000);
    fs::write(&p, &data).expect("write");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open");
    fs::remove_file(&p).expect("unlink");

    assert_errno(fs::metadata(&p), libc::ENOENT, "stat after unlink");
    let names: Vec<_> = fs::read_dir(m.mnt())
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(names.is_empty(), "unlinked name still listed: {names:?}");

    assert_eq!(read_all(&mut f), data, "read through the fd after unlink");
    f.write_all_at(b"still writable", 10)
        .expect("pwrite after unlink");
    f.seek(SeekFrom::End(0)).expect("seek end");
    f.write_all(b"+grown").expect("append after unlink");
    let mut want = data.clone();
    want[10..24].copy_from_slice(b"still writable");
    want.extend_from_slice(b"+grown");
    assert_eq!(read_all(&mut f), want, "read back writes made after unlink");
    assert_eq!(
        f.metadata().expect("fstat").len(),
        want.len() as u64,
        "fstat size"
    );
    f.sync_all().expect("fsync of an unlinked file");

    // A new file under the same name is a different file.
    fs::write(&p, b"new").expect("recreate");
    assert_eq!(read_all(&mut f), want, "old fd after the name is reused");
    drop(f);
    assert_file_eq(&p, b"new");
}

#[test]
fn rename_replaces_atomically_and_old_readers_keep_old_data() {
    let mut m = TestMount::new();
    let target = m.path("model.ckpt");
    let tmp = m.path("model.ckpt.tmp");
    let old = pattern(10, 1 << 20);
    let new = pattern(11, (1 << 20) + 77);
    fs::write(&target, &old).expect("write old");
    let reader = File::open(&target).expect("open reader");
    let old_ino = fs::metadata(&target).expect("stat").ino();

    let mut w = File::create(&tmp).expect("create tmp");
    w.write_all(&new).expect("write tmp");
    w.sync_all().expect("fsync tmp");
    drop(w);
    fs::rename(&tmp, &target).expect("rename over target");

    assert_errno(
        fs::metadata(&tmp),
        libc::ENOENT,
        "stat of the renamed-away tmp",
    );
    assert_file_eq(&target, &new);
    assert_ne!(
        fs::metadata(&target).expect("stat").ino(),
        old_ino,
        "target is the new inode"
    );
    let mut got = vec![0u8; old.len()];
    reader.read_exact_at(&mut got, 0).expect("read old fd");
    assert!(
        got == old,
        "reader opened before the rename must still see the old bytes"
    );
    drop(reader);

    let names: Vec<_> = fs::read_dir(m.mnt())
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    assert_eq!(
        names,
        vec!["model.ckpt".to_string()],
        "listing after rename"
    );

    // Renaming onto itself is a no-op; renaming a missing file is ENOENT.
    fs::rename(&target, &target).expect("rename onto itself");
    assert_errno(
        fs::rename(&tmp, &target),
        libc::ENOENT,
        "rename of a missing file",
    );
    // Renaming into another directory.
    fs::create_dir(m.path("archive")).expect("mkdir");
    fs::rename(&target, m.path("archive/model.ckpt")).expect("rename across dirs");
    assert_file_eq(&m.path("archive/model.ckpt"), &new);

    m.remount();
    assert_file_eq(&m.path("archive/model.ckpt"), &new);
    assert_errno(
        fs::metadata(m.path("model.ckpt")),
        libc::ENOENT,
        "old name after remount",
    );
}

#[test]
fn mkdir_and_rmdir() {
    let m = TestMount::new();
    let d = m.path("run");
    fs::create_dir(&d).expect("mkdir");
    assert!(fs::metadata(&d).expect("stat").is_dir());
    assert_errno(fs::create_dir(&d), libc::EEXIST, "mkdir of an existing dir");
    assert_errno(
        fs::create_dir(m.path("no/such/parent")),
        libc::ENOENT,
        "mkdir with missing parent",
    );
    fs::write(d.join("f"), b"x").expect("write");
    assert_errno(
        fs::remove_dir(&d),
        libc::ENOTEMPTY,
        "rmdir of a non-empty dir",
    );
    fs::create_dir_all(d.join("a/b/c")).expect("mkdir -p");
    fs::remove_file(d.join("f")).expect("unlink");
    assert_errno(
        fs::remove_dir(&d),
        libc::ENOTEMPTY,
        "rmdir of a dir holding a dir",
    );
    fs::remove_dir(d.join("a/b/c")).expect("rmdir c");
    fs::remove_dir(d.join("a/b")).expect("rmdir b");
    fs::remove_dir(d.join("a")).expect("rmdir a");
    fs::remove_dir(&d).expect("rmdir of an emptied dir");
    assert_errno(fs::metadata(&d), libc::ENOENT, "stat after rmdir");
    fs::write(m.path("file"), b"x").expect("write");
    assert_errno(
        fs::remove_dir(m.path("file")),
        libc::ENOTDIR,
        "rmdir of a file",
    );
    assert_errno(
        fs::remove_file(m.path("nothing")),
        libc::ENOENT,
        "unlink of a missing file",
    );
    fs::create_dir(&d).expect("mkdir again");
    assert_errno(fs::remove_file(&d), libc::EISDIR, "unlink of a directory");
}

#[test]
fn readdir_of_a_large_directory_lists_every_entry_once() {
    const COUNT: usize = 10_000;
    let mut m = TestMount::new();
    let dir = m.path("shards");
    fs::create_dir(&dir).expect("mkdir");
    let mut want: Vec<String> = (0..COUNT).map(|i| format!("rank-{i:05}.pt")).collect();
    for name in &want {
        File::create(dir.join(name)).expect("create");
    }
    want.sort();
    let check_listing = |dir: &Path, when: &str| {
        let mut got: Vec<String> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .collect();
        let unique: HashSet<&String> = got.iter().collect();
        assert_eq!(
            got.len(),
            COUNT,
            "{when}: readdir returned {} entries",
            got.len()
        );
        assert_eq!(unique.len(), COUNT, "{when}: readdir returned duplicates");
        got.sort();
        assert!(
            got == want,
            "{when}: readdir names differ from the created names"
        );
    };
    check_listing(&dir, "before remount");
    m.remount();
    check_listing(&m.path("shards"), "after remount");
}

fn stat_times(p: &Path) -> ((i64, i64), (i64, i64)) {
    let md = fs::symlink_metadata(p).expect("stat");
    ((md.atime(), md.atime_nsec()), (md.mtime(), md.mtime_nsec()))
}

fn utimensat(p: &Path, atime: libc::timespec, mtime: libc::timespec, flags: libc::c_int) {
    let ts = [atime, mtime];
    // SAFETY: path is a valid C string and ts holds two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, cpath(p).as_ptr(), ts.as_ptr(), flags) })
        .unwrap_or_else(|e| panic!("utimensat {}: {e}", p.display()));
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec as _,
    }
}

#[test]
fn chmod_chown_and_utimensat_show_in_stat() {
    let m = TestMount::new();
    let p = m.path("ckpt");
    fs::write(&p, b"data").expect("write");
    for mode in [0o640, 0o755, 0o600, 0o444] {
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
        let got = fs::metadata(&p).expect("stat").mode() & 0o7777;
        assert_eq!(got, mode, "mode after chmod {mode:o}: got {got:o}");
    }
    let d = m.path("dir");
    fs::create_dir(&d).expect("mkdir");
    fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).expect("chmod dir");
    assert_eq!(
        fs::metadata(&d).expect("stat").mode() & 0o7777,
        0o700,
        "dir mode"
    );
    // fchmod through an open fd.
    let f = File::open(&p).expect("open");
    f.set_permissions(fs::Permissions::from_mode(0o604))
        .expect("fchmod");
    assert_eq!(
        f.metadata().expect("fstat").mode() & 0o7777,
        0o604,
        "mode after fchmod"
    );
    drop(f);

    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).expect("chown");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!((md.uid(), md.gid()), (1234, 5678), "owner after chown");
    std::os::unix::fs::chown(&p, None, Some(42)).expect("chgrp only");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!((md.uid(), md.gid()), (1234, 42), "owner after chgrp");

    let a = ts(1_600_000_000, 123_456_789);
    let mt = ts(1_650_000_000, 987_654_321);
    utimensat(&p, a, mt, 0);
    assert_eq!(
        stat_times(&p),
        ((1_600_000_000, 123_456_789), (1_650_000_000, 987_654_321)),
        "(atime, mtime) after utimensat"
    );
    // UTIME_OMIT leaves atime alone while mtime changes.
    utimensat(&p, ts(0, libc::UTIME_OMIT), ts(1_700_000_000, 5), 0);
    assert_eq!(
        stat_times(&p),
        ((1_600_000_000, 123_456_789), (1_700_000_000, 5)),
        "(atime, mtime) after utimensat(UTIME_OMIT, t)"
    );
    // UTIME_NOW sets the current time.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    utimensat(&p, ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_NOW), 0);
    let (_, (msec, _)) = stat_times(&p);
    assert!(
        (msec - now).abs() <= 5,
        "mtime after UTIME_NOW is {msec}, now is {now}"
    );
    // Times on a directory too.
    utimensat(&d, a, mt, 0);
    assert_eq!(
        stat_times(&d).1,
        (1_650_000_000, 987_654_321),
        "dir mtime after utimensat"
    );
}

#[test]
fn symlink_latest_points_at_the_newest_step() {
    let mut m = TestMount::new();
    fs::create_dir(m.path("step-1000")).expect("mkdir");
    let w1 = pattern(20, 123_457);
    fs::write(m.path("step-1000/model.bin"), &w1).expect("write");
    std::os::unix::fs::symlink("step-1000", m.path("latest")).expect("symlink");

    assert!(
        fs::symlink_metadata(m.path("latest"))
            .expect("lstat")
            .file_type()
            .is_symlink(),
        "lstat of latest is a symlink"
    );
    assert_eq!(
        fs::read_link(m.path("latest")).expect("readlink"),
        Path::new("step-1000")
    );
    assert!(
        fs::metadata(m.path("latest")).expect("stat").is_dir(),
        "stat follows to the dir"
    );
    assert_file_eq(&m.path("latest/model.bin"), &w1);
    let mut f = File::open(m.path("latest/model.bin")).expect("open through symlink");
    let mut got = Vec::new();
    f.read_to_end(&mut got).expect("read");
    assert!(got == w1, "read through the symlink");
    drop(f);

    // Move `latest` to the next step atomically: new link under a temp name, rename over.
    fs::create_dir(m.path("step-2000")).expect("mkdir");
    let w2 = pattern(21, 99_999);
    fs::write(m.path("step-2000/model.bin"), &w2).expect("write");
    std::os::unix::fs::symlink("step-2000", m.path("latest.tmp")).expect("symlink tmp");
    fs::rename(m.path("latest.tmp"), m.path("latest")).expect("rename symlink over symlink");
    assert_eq!(
        fs::read_link(m.path("latest")).expect("readlink"),
        Path::new("step-2000")
    );
    assert_file_eq(&m.path("latest/model.bin"), &w2);

    // A symlink to a file, and a dangling one.
    std::os::unix::fs::symlink("step-1000/model.bin", m.path("model-latest")).expect("symlink");
    assert_file_eq(&m.path("model-latest"), &w1);
    std::os::unix::fs::symlink("step-9999/model.bin", m.path("dangling")).expect("symlink");
    assert_errno(
        File::open(m.path("dangling")),
        libc::ENOENT,
        "open of a dangling symlink",
    );
    assert_errno(
        std::os::unix::fs::symlink("x", m.path("latest")),
        libc::EEXIST,
        "symlink onto an existing name",
    );
    // readlink of a regular file is EINVAL.
    assert_errno(
        fs::read_link(m.path("step-1000/model.bin")),
        libc::EINVAL,
        "readlink of a file",
    );

    m.remount();
    assert_eq!(
        fs::read_link(m.path("latest")).expect("readlink"),
        Path::new("step-2000")
    );
    assert_eq!(
        fs::read_link(m.path("dangling")).expect("readlink"),
        Path::new("step-9999/model.bin")
    );
    assert_file_eq(&m.path("latest/model.bin"), &w2);
    assert_file_eq(&m.path("model-latest"), &w1);
}

#[test]
fn hard_link_is_refused_with_eperm() {
    let m = TestMount::new();
    let p = m.path("ckpt");
    fs::write(&p, b"data").expect("write");
    assert_errno(
        fs::hard_link(&p, m.path("ckpt.link")),
        libc::EPERM,
        "link(2)",
    );
    assert_errno(
        fs::metadata(m.path("ckpt.link")),
        libc::ENOENT,
        "the refused link name",
    );
    assert_eq!(
        fs::metadata(&p).expect("stat").nlink(),
        1,
        "nlink of the source"
    );
    assert_file_eq(&p, b"data");
}

#[test]
fn special_files_are_stored_and_work() {
    use std::os::unix::fs::FileTypeExt;
    let mut m = TestMount::new();
    let fifo = m.path("fifo");
    // SAFETY: valid C string path.
    check(unsafe { libc::mkfifo(cpath(&fifo).as_ptr(), 0o644) }).expect("mkfifo");
    let chr = m.path("null");
    // SAFETY: valid C string path.
    check(unsafe {
        libc::mknod(
            cpath(&chr).as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    })
    .expect("mknod S_IFCHR");
    let sock = m.path("sock");
    // SAFETY: valid C string path.
    check(unsafe { libc::mknod(cpath(&sock).as_ptr(), libc::S_IFSOCK | 0o666, 0) })
        .expect("mknod S_IFSOCK");
    // The kernel implements the fifo: data passes from a writer thread to a reader.
    let writer_path = fifo.clone();
    let writer = std::thread::spawn(move || fs::write(writer_path, b"through the fifo"));
    assert_eq!(fs::read(&fifo).expect("read fifo"), b"through the fifo");
    writer.join().unwrap().expect("write fifo");
    m.remount();
    let md = fs::symlink_metadata(&fifo).expect("stat fifo");
    assert!(md.file_type().is_fifo(), "fifo kind survives remount");
    let md = fs::symlink_metadata(&chr).expect("stat chr");
    assert!(
        md.file_type().is_char_device(),
        "char device kind survives remount"
    );
    assert_eq!(
        md.rdev(),
        libc::makedev(1, 3),
        "device number survives remount"
    );
    let md = fs::symlink_metadata(&sock).expect("stat sock");
    assert!(md.file_type().is_socket(), "socket kind survives remount");
}

#[test]
fn mknod_of_a_regular_file_works() {
    let m = TestMount::new();
    let p = m.path("plain");
    // SAFETY: valid C string path.
    check(unsafe { libc::mknod(cpath(&p).as_ptr(), libc::S_IFREG | 0o640, 0) })
        .expect("mknod S_IFREG");
    let md = fs::metadata(&p).expect("stat");
    assert!(md.is_file(), "mknod S_IFREG makes a regular file");
    assert_eq!(md.len(), 0);
    assert_eq!(md.mode() & 0o777, 0o640 & !umask(), "mode");
    fs::write(&p, b"abc").expect("write");
    assert_file_eq(&p, b"abc");
}

fn umask() -> u32 {
    // SAFETY: umask has no preconditions; it is set back at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old as u32
    }
}

/// fsync, fdatasync and a directory fsync make what they cover durable before any close:
/// after each, the daemon is killed (SIGKILL, no unmount, nothing committed on the way out)
/// with the descriptor still open, and the space is mounted again. A clean remount would
/// commit everything anyway (and so passes with an fsync that does nothing); only a crash
/// right after fsync returned shows what fsync itself made durable (README, Durability
/// contract).
#[test]
fn fsync_and_fdatasync_survive_a_crash_before_close() {
    let mut m = TestMount::new();
    let p = m.path("ckpt");
    let data = pattern(30, 3 << 20);

    // fdatasync of a new file: its data and the name that reaches it.
    let mut f = File::create(&p).expect("create");
    f.write_all(&data[..1 << 20]).expect("write");
    f.sync_data().expect("fdatasync");
    m.kill_daemon();
    drop(f);
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data[..1 << 20]);

    // fsync of more data written to the existing file (and a second fsync with nothing new).
    let mut f = OpenOptions::new()
        .write(true)
        .open(m.path("ckpt"))
        .expect("open for append");
    f.seek(SeekFrom::Start(1 << 20)).expect("seek");
    f.write_all(&data[1 << 20..]).expect("write");
    f.sync_all().expect("fsync");
    f.sync_all().expect("fsync with nothing new");
    m.kill_daemon();
    drop(f);
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);

    // fsync on a read-only descriptor succeeds and changes nothing.
    let r = File::open(m.path("ckpt")).expect("open read-only");
    r.sync_all().expect("fsync on a read-only fd");
    drop(r);

    // A rename is a namespace change: durable with a directory fsync, with no close after it.
    fs::rename(m.path("ckpt"), m.path("renamed")).expect("rename");
    let dir = File::open(m.mnt()).expect("open dir");
    dir.sync_all().expect("fsync on a directory");
    m.kill_daemon();
    drop(dir);
    m.mount();
    assert_file_eq(&m.path("renamed"), &data);
    assert_errno(
        fs::metadata(m.path("ckpt")),
        libc::ENOENT,
        "the old name after a renamed and dir-fsynced file survived a crash",
    );

    // And the space still unmounts and mounts cleanly afterwards.
    m.remount();
    assert_file_eq(&m.path("renamed"), &data);
}

struct Map {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Map {
    fn new(f: &File, len: usize, prot: libc::c_int, flags: libc::c_int) -> Map {
        // SAFETY: a fresh mapping of a valid fd; the result is checked against MAP_FAILED.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, f.as_raw_fd(), 0) };
        assert!(
            ptr != libc::MAP_FAILED,
            "mmap(len {len}, prot {prot}, flags {flags}): {}",
            std::io::Error::last_os_error()
        );
        Map { ptr, len }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is live for self's lifetime and len bytes long.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and the mapping was made writable by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }

    fn msync(&self) {
        // SAFETY: ptr/len describe a live mapping.
        check(unsafe { libc::msync(self.ptr, self.len, libc::MS_SYNC) }).expect("msync");
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a live mapping, unmapped once.
        check(unsafe { libc::munmap(self.ptr, self.len) }).expect("munmap");
    }
}

#[test]
fn mmap_shared_writable_mapping_writes_the_file() {
    let mut m = TestMount::new();
    let p = m.path("mapped.bin");
    let len = (3 << 20) + 123;
    let data = pattern(40, len);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&p)
        .expect("create");
    f.set_len(len as u64).expect("ftruncate");
    let mut map = Map::new(
        &f,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED,
    );
    map.bytes_mut().copy_from_slice(&data);
    map.msync();
    drop(map);
    drop(f);
    assert_file_eq(&p, &data);

    // Modify an unaligned range of the existing file through a new mapping.
    let mut want = data.clone();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open");
    let mut map = Map::new(
        &f,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED,
    );
    assert!(
        map.bytes() == &data[..],
        "mapping of the committed file shows its bytes"
    );
    let patch = pattern(41, 10_000 - 4097);
    map.bytes_mut()[4097..10_000].copy_from_slice(&patch);
    want[4097..10_000].copy_from_slice(&patch);
    map.msync();
    drop(map);
    drop(f);
    assert_file_eq(&p, &want);

    m.remount();
    assert_file_eq(&m.path("mapped.bin"), &want);
}

#[test]
fn mmap_read_only_mapping_matches_the_file() {
    let m = TestMount::new();
    let p = m.path("weights.bin");
    let data = pattern(50, (5 << 20) + 17);
    fs::write(&p, &data).expect("write");
    let f = File::open(&p).expect("open");
    let map = Map::new(&f, data.len(), libc::PROT_READ, libc::MAP_SHARED);
    if let Some(d) = first_difference(map.bytes(), &data) {
        panic!("MAP_SHARED read-only mapping: {d}");
    }
    drop(map);
    let map = Map::new(&f, data.len(), libc::PROT_READ, libc::MAP_PRIVATE);
    if let Some(d) = first_difference(map.bytes(), &data) {
        panic!("MAP_PRIVATE read-only mapping: {d}");
    }
}

/// st_blocks counts the bytes that are not holes, as on ext4, so `du` and hole-detecting
/// tools see a sparse file as sparse; the same file in a plain directory is the reference.
#[test]
fn st_blocks_counts_data_not_holes() {
    let mut m = TestMount::new();
    let plain = ckptfs_tests::TempDir::new("blocks-plain");
    let data = vec![0xa5u8; 50 << 10];
    for dir in [m.mnt().to_path_buf(), plain.path().to_path_buf()] {
        let f = File::create(dir.join("sparse")).expect("create");
        f.write_all_at(&data, 1_600_000).expect("pwrite");
        close_checked(f).expect("close");
        fs::write(dir.join("dense"), vec![1u8; 3 << 20]).expect("write dense");
    }
    let blocks = |p: &Path| fs::metadata(p).expect("stat").blocks() * 512;
    let check = |m: &TestMount, when: &str| {
        let (ours, theirs) = (
            blocks(&m.path("sparse")),
            blocks(&plain.path().join("sparse")),
        );
        println!("{when}: sparse file: ckptfs {ours} bytes of blocks, plain directory {theirs}");
        assert!(
            ours >= 50 << 10 && ours <= theirs.max(56 << 10),
            "{when}: a 50 KiB write at 1.6 MB shows {ours} bytes of blocks (plain: {theirs})"
        );
        let dense = blocks(&m.path("dense"));
        assert!(
            dense >= 3 << 20,
            "{when}: a dense 3 MiB file shows {dense} bytes of blocks"
        );
    };
    check(&m, "after close");
    m.remount();
    check(&m, "after remount");
}

/// Write-temp-then-rename over a file (what `torch.save` to a temp name does) leaves a space
/// `ckptfs check` finds consistent, also while a reader still holds the replaced file, which
/// keeps reading its old content.
#[test]
fn rename_over_a_file_leaves_check_clean() {
    let mut m = TestMount::new();
    let old = pattern(61, 300_000);
    for seed in 62..65 {
        fs::write(m.path("t.tmp"), pattern(seed, 200_000)).expect("write temp");
        fs::rename(m.path("t.tmp"), m.path("t")).expect("rename over");
    }
    fs::write(m.path("t.tmp"), &old).expect("write temp");
    fs::rename(m.path("t.tmp"), m.path("t")).expect("rename over");
    let mut held = File::open(m.path("t")).expect("open the file about to be replaced");
    fs::write(m.path("t.tmp"), pattern(66, 1000)).expect("write temp");
    fs::rename(m.path("t.tmp"), m.path("t")).expect("rename over an open file");
    let mnt = m.mnt().to_path_buf();
    let out = m.ckptfs_ok(&[std::ffi::OsStr::new("check"), mnt.as_os_str()]);
    assert!(out.contains("clean"), "{out}");
    assert_eq!(read_all(&mut held), old, "the replaced file, still open");
    drop(held);
    m.unmount();
    let backing = m.backing().to_path_buf();
    let out = m.ckptfs_ok(&[std::ffi::OsStr::new("check"), backing.as_os_str()]);
    assert!(out.contains("clean"), "{out}");
}
