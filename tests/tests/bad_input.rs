//! Bad input. Every refused command says why on stderr (the tests look for key words), exits
//! non-zero and changes nothing on disk: the backing directory's names, sizes, modes and the
//! contents of all its files (superblock, meta.redb, data, lock, daemon.log) are the same
//! afterwards. Through a mount, names, paths and sizes past the limits fail with the right
//! errno and leave the files that are there intact.

use std::collections::hash_map::DefaultHasher;
use std::ffi::OsStr;
use std::fs;
use std::hash::Hasher;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use ckptfs_engine::format::{Features, Superblock, SUPERBLOCK_FILE};
use ckptfs_tests::{
    assert_file_eq, check, cpath, errno, pattern, run_ckptfs, write_file_checked, TempDir,
    TestMount,
};

/// Small spaces: the snapshots hash the whole data file.
const SMALL: &str = "64M";
/// fs::MAX_FILE_BYTES (1 PiB), the documented largest file.
const MAX_FILE_BYTES: u64 = 1 << 50;

/// One file or directory as a refusal must leave it.
#[derive(Debug, PartialEq)]
struct Entry {
    name: PathBuf,
    kind: &'static str,
    size: u64,
    mode: u32,
    hash: u64,
}

fn hash_file(p: &Path) -> u64 {
    let mut f = fs::File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let mut h = DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        if n == 0 {
            return h.finish();
        }
        h.write(&buf[..n]);
    }
}

/// Everything at `path` (missing, a file, or a directory tree): names, kinds, sizes, modes and
/// content hashes of regular files. No file is excluded: refusals happen before the daemon
/// starts, so not even `daemon.log` or `lock` may change.
fn snapshot(path: &Path) -> Vec<Entry> {
    fn add(base: &Path, p: &Path, out: &mut Vec<Entry>) {
        let Ok(md) = fs::symlink_metadata(p) else {
            return;
        };
        let name = p.strip_prefix(base).expect("under base").to_path_buf();
        let (kind, hash) = if md.is_dir() {
            ("dir", 0)
        } else if md.is_file() {
            ("file", hash_file(p))
        } else {
            ("other", 0)
        };
        out.push(Entry {
            name,
            kind,
            size: if md.is_dir() { 0 } else { md.len() },
            mode: md.mode(),
            hash,
        });
        if md.is_dir() {
            let mut names: Vec<PathBuf> = fs::read_dir(p)
                .expect("read_dir")
                .map(|e| e.expect("dir entry").path())
                .collect();
            names.sort();
            for n in names {
                add(base, &n, out);
            }
        }
    }
    let mut out = Vec::new();
    add(path, path, &mut out);
    out
}

/// Runs `ckptfs ARGS` and checks that it is refused: non-zero exit (not a crash), stderr naming
/// the problem (every word in `words`, case-insensitive), and every path in `watch` unchanged.
#[track_caller]
fn assert_refused(log: &Path, args: &[&OsStr], words: &[&str], watch: &[&Path]) -> String {
    let before: Vec<Vec<Entry>> = watch.iter().map(|p| snapshot(p)).collect();
    let shown = args
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let (st, out, err) = run_ckptfs(log, "refused", args);
    assert!(
        !st.success(),
        "`ckptfs {shown}` must be refused but succeeded:\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        st.code().is_some() && !err.contains("panicked"),
        "`ckptfs {shown}` crashed instead of refusing ({st}):\n{err}"
    );
    let lower = err.to_lowercase();
    for w in words {
        assert!(
            lower.contains(&w.to_lowercase()),
            "`ckptfs {shown}`: stderr does not mention {w:?}:\n{err}"
        );
    }
    for (p, b) in watch.iter().zip(&before) {
        let now = snapshot(p);
        let gone: Vec<_> = b.iter().filter(|e| !now.contains(e)).collect();
        let new: Vec<_> = now.iter().filter(|e| !b.contains(e)).collect();
        assert!(
            gone.is_empty() && new.is_empty(),
            "`ckptfs {shown}` was refused but changed {}:\nbefore: {gone:#?}\nafter: {new:#?}",
            p.display()
        );
    }
    println!("`ckptfs {shown}` -> {st}: {}", err.trim());
    err
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn not_mounted(p: &Path) {
    let parent = p.parent().expect("parent");
    assert_eq!(
        fs::metadata(p).expect("stat mountpoint").dev(),
        fs::metadata(parent).expect("stat parent").dev(),
        "{} was mounted by a refused command",
        p.display()
    );
}

#[test]
fn mount_refuses_what_is_not_a_space() {
    let t = TempDir::new("bad-mount");
    let mnt = t.path().join("mnt");
    let empty = t.path().join("empty");
    let other = t.path().join("other");
    let file = t.path().join("file");
    let missing = t.path().join("missing");
    fs::create_dir(&mnt).unwrap();
    fs::create_dir(&empty).unwrap();
    fs::create_dir_all(other.join("sub")).unwrap();
    fs::write(other.join("notes.txt"), b"not a space").unwrap();
    fs::write(&file, b"a regular file").unwrap();

    let m = mnt.as_os_str();
    for dir in [&empty, &other] {
        assert_refused(
            t.path(),
            &[os("mount"), dir.as_os_str(), m],
            &["not a ckptfs backing space"],
            &[dir, &mnt],
        );
        not_mounted(&mnt);
    }
    assert_refused(
        t.path(),
        &[os("mount"), file.as_os_str(), m],
        &["not a directory", "file"],
        &[&file, &mnt],
    );
    assert_refused(
        t.path(),
        &[os("mount"), missing.as_os_str(), m],
        &["does not exist", "missing"],
        &[&missing, &mnt],
    );
    assert!(
        !missing.exists(),
        "a refused mount created {}",
        missing.display()
    );
    not_mounted(&mnt);

    // The other commands that take a backing directory say the same.
    for cmd in ["stats", "gc", "config"] {
        assert_refused(
            t.path(),
            &[os(cmd), empty.as_os_str()],
            &["neither a ckptfs mountpoint nor a backing directory"],
            &[&empty],
        );
    }
}

/// Refusals exit with a status a script can act on (README, "Exit statuses"): 3 for a path
/// that is not a ckptfs space (missing, a file, unformatted), 4 for a space another process
/// holds; other failures 1.
#[test]
fn refusals_exit_with_a_status_that_says_their_kind() {
    let t = TempDir::new("exit-codes");
    let mnt = t.path().join("mnt");
    let empty = t.path().join("empty");
    fs::create_dir(&mnt).unwrap();
    fs::create_dir(&empty).unwrap();
    let code = |args: &[&OsStr]| run_ckptfs(t.path(), "exit-code", args).0.code();
    let (e, m) = (empty.as_os_str(), mnt.as_os_str());
    assert_eq!(
        code(&[os("mount"), e, m]),
        Some(3),
        "mount of a directory that is no space"
    );
    for cmd in ["stats", "gc", "config"] {
        assert_eq!(
            code(&[os(cmd), e]),
            Some(3),
            "{cmd} of a directory that is no space"
        );
    }
    let held = TestMount::with_options(SMALL, None);
    let backing = held.backing().to_path_buf();
    assert_eq!(
        code(&[os("mount"), backing.as_os_str(), m]),
        Some(4),
        "a second mount of a space in use"
    );
    not_mounted(&mnt);
    let missing = t.path().join("missing");
    assert_eq!(
        code(&[os("mount"), missing.as_os_str(), m]),
        Some(3),
        "mount of a backing directory that does not exist"
    );
    let file = t.path().join("file");
    fs::write(&file, b"x").unwrap();
    assert_eq!(
        code(&[os("mount"), file.as_os_str(), m]),
        Some(3),
        "mount of a file as the backing directory"
    );
    assert_eq!(
        code(&[os("mount"), e, file.as_os_str()]),
        Some(1),
        "a mountpoint that is a file: said in words, status 1"
    );
}

/// Rewrites the superblock in place (same length, same mode).
fn write_superblock(backing: &Path, bytes: &[u8]) {
    let f = fs::OpenOptions::new()
        .write(true)
        .open(backing.join(SUPERBLOCK_FILE))
        .expect("open superblock");
    f.write_all_at(bytes, 0).expect("write superblock");
    f.sync_all().expect("sync superblock");
}

#[test]
fn mount_refuses_unknown_versions_and_damaged_superblocks() {
    let mut m = TestMount::with_options(SMALL, None);
    write_file_checked(&m.path("keep"), b"kept across refusals").expect("write");
    m.unmount();
    let backing = m.backing().to_path_buf();
    let good = fs::read(backing.join(SUPERBLOCK_FILE)).expect("read superblock");
    let sb = Superblock::decode(&good).expect("a freshly formatted superblock decodes");
    let other = TempDir::new("bad-sb-mnt");
    let mnt = other.path().join("mnt");
    fs::create_dir(&mnt).unwrap();

    // Version 99 with a valid checksum: refused naming both versions.
    let v99 = Superblock { version: 99, ..sb }.encode();
    write_superblock(&backing, &v99);
    for args in [
        vec![os("mount"), backing.as_os_str(), mnt.as_os_str()],
        vec![os("stats"), backing.as_os_str()],
        vec![os("gc"), backing.as_os_str()],
    ] {
        assert_refused(
            other.path(),
            &args,
            &["version 99", "versions 1 and 2"],
            &[&backing, &mnt],
        );
    }
    assert_refused(
        other.path(),
        &[os("format"), backing.as_os_str(), os("--size"), os(SMALL)],
        &["already holds a ckptfs space", "--force"],
        &[&backing],
    );
    not_mounted(&mnt);

    // One flipped byte the checksum covers.
    let mut bad = good.clone();
    bad[40] ^= 0x01;
    write_superblock(&backing, &bad);
    for args in [
        vec![os("mount"), backing.as_os_str(), mnt.as_os_str()],
        vec![os("stats"), backing.as_os_str()],
    ] {
        assert_refused(
            other.path(),
            &args,
            &["the superblock is damaged: its checksum does not match"],
            &[&backing, &mnt],
        );
    }
    not_mounted(&mnt);

    // A truncated superblock.
    fs::write(backing.join(SUPERBLOCK_FILE), &good[..10]).expect("truncate superblock");
    assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), mnt.as_os_str()],
        &["not a ckptfs backing space"],
        &[&backing, &mnt],
    );

    fs::write(backing.join(SUPERBLOCK_FILE), &good).expect("restore superblock");
    m.mount();
    assert_file_eq(&m.path("keep"), b"kept across refusals");
}

/// Feature flags (FORMAT.md): an unknown incompatible flag refuses every open, an unknown
/// read-only-compatible flag refuses writing but allows `--read-only`, an unknown compatible
/// flag changes nothing. The data stays readable throughout.
#[test]
fn unknown_feature_flags_are_refused_by_kind() {
    let mut m = TestMount::with_options(SMALL, None);
    write_file_checked(&m.path("keep"), b"kept across feature refusals").expect("write");
    m.unmount();
    let backing = m.backing().to_path_buf();
    let good = fs::read(backing.join(SUPERBLOCK_FILE)).expect("read superblock");
    let sb = Superblock::decode(&good).expect("decodes");
    assert!(
        sb.features.contains(Features::COMPAT_XATTRS),
        "format records the xattr tables: {:?}",
        sb.features
    );
    let other = TempDir::new("feature-mnt");
    let mnt = other.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let unknown = |compat, ro_compat, incompat| {
        sb.with_features(Features {
            compat,
            ro_compat,
            incompat,
        })
        .encode()
    };

    write_superblock(&backing, &unknown(0, 0, 1 << 40));
    for args in [
        vec![os("mount"), backing.as_os_str(), mnt.as_os_str()],
        vec![
            os("mount"),
            os("--read-only"),
            backing.as_os_str(),
            mnt.as_os_str(),
        ],
        vec![os("stats"), backing.as_os_str()],
        vec![os("gc"), backing.as_os_str()],
    ] {
        assert_refused(
            other.path(),
            &args,
            &["features this ckptfs does not know", "0x10000000000"],
            &[&backing, &mnt],
        );
    }
    not_mounted(&mnt);

    write_superblock(&backing, &unknown(0, 1 << 41, 0));
    assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), mnt.as_os_str()],
        &["can read but not write", "--read-only"],
        &[&backing, &mnt],
    );
    not_mounted(&mnt);
    m.mount_with(&["--read-only"]);
    assert_file_eq(&m.path("keep"), b"kept across feature refusals");
    m.unmount();

    write_superblock(&backing, &unknown(1 << 42, 0, 0));
    m.mount();
    assert_file_eq(&m.path("keep"), b"kept across feature refusals");
    write_file_checked(&m.path("more"), b"written with an unknown compat flag").expect("write");
    m.unmount();
    let kept = Superblock::decode(&fs::read(backing.join(SUPERBLOCK_FILE)).unwrap()).unwrap();
    assert!(
        kept.features.contains(Features {
            compat: 1 << 42,
            ro_compat: 0,
            incompat: 0
        }),
        "an unknown compat flag must survive a read-write mount: {:?}",
        kept.features
    );
}

#[test]
fn second_mount_and_bad_mountpoints_are_refused() {
    let mut m = TestMount::with_options(SMALL, None);
    write_file_checked(&m.path("keep"), b"one mount at a time").expect("write");
    // Let the daemon settle (commits are synchronous with close; nothing runs in the
    // background while no file is open and free space is ample).
    let backing = m.backing().to_path_buf();
    let other = TempDir::new("bad-mnt");
    let mnt2 = other.path().join("mnt2");
    fs::create_dir(&mnt2).unwrap();

    let err = assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), mnt2.as_os_str()],
        &["in use by another ckptfs process", "mounted at"],
        &[&backing, &mnt2],
    );
    assert!(
        err.contains(&m.mnt().display().to_string()),
        "the refusal should name the mount holding the space:\n{err}"
    );
    not_mounted(&mnt2);

    // Mountpoints that do not exist or are not directories; the space is not touched.
    let file = other.path().join("file");
    fs::write(&file, b"x").unwrap();
    let missing = other.path().join("missing");
    m.unmount();
    assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), missing.as_os_str()],
        &["mountpoint", "no such file"],
        &[&backing, &missing],
    );
    assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), file.as_os_str()],
        &["mountpoint", "not a directory"],
        &[&backing, &file],
    );
    // A mountpoint that is the backing directory, inside it or above it (the first create
    // through such a mount hung for good: the daemon's own backing-file calls came back
    // into it).
    assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), backing.as_os_str()],
        &["mountpoint", "is the backing directory itself"],
        &[&backing],
    );
    let inside = backing.join("inside");
    fs::create_dir(&inside).unwrap();
    assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), inside.as_os_str()],
        &["mountpoint", "inside the backing directory"],
        &[&backing],
    );
    fs::remove_dir(&inside).unwrap();
    let above = backing.parent().expect("the backing directory's parent");
    assert_refused(
        other.path(),
        &[os("mount"), backing.as_os_str(), above.as_os_str()],
        &["mountpoint", "above the backing directory"],
        &[&backing],
    );
    // Bad option values never reach the space either.
    for (args, words) in [
        (vec!["--threads", "0"], &["invalid value", "--threads"][..]),
        (
            vec!["--threads", "many"],
            &["invalid value", "--threads"][..],
        ),
        (
            vec!["--allow-others"],
            &["unexpected argument", "--allow-others"][..],
        ),
    ] {
        let mut a = vec![os("mount")];
        a.extend(args.iter().map(|s| os(s)));
        a.push(backing.as_os_str());
        a.push(mnt2.as_os_str());
        assert_refused(other.path(), &a, words, &[&backing, &mnt2]);
    }
    m.mount();
    assert_file_eq(&m.path("keep"), b"one mount at a time");
}

#[test]
fn format_refuses_bad_sizes_options_and_places() {
    let t = TempDir::new("bad-format");
    let new = t.path().join("new");
    let other = t.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("data.csv"), b"1,2,3").unwrap();
    let file = t.path().join("file");
    fs::write(&file, b"a regular file").unwrap();
    let base = |dir: &Path| -> Vec<std::ffi::OsString> {
        vec!["format".into(), dir.as_os_str().to_os_string()]
    };
    let cases: &[(&[&str], &[&str])] = &[
        (&["--size", "1M"], &["below the minimum", "16 MiB"]),
        (&["--size", "0"], &["below the minimum"]),
        (&["--size", "100000T"], &["larger than the free space"]),
        (&["--size", "12Q"], &["invalid value '12Q'", "suffix"]),
        (&["--size", "1.5G"], &["invalid value", "not a size"]),
        (&["--size", ""], &["invalid value", "not a size"]),
        (&["--size=-5G"], &["invalid value", "not a size"]),
        (&["--size", "99999999999T"], &["size too large"]),
        (&[], &["--size"]),
        (
            &["--size", SMALL, "--chunk-size", "3"],
            &["chunk size", "power of two"],
        ),
        (
            &["--size", SMALL, "--chunk-size", "0"],
            &["chunk size", "power of two"],
        ),
        (
            &["--size", SMALL, "--chunk-size", "48K"],
            &["chunk size", "power of two"],
        ),
        (
            &["--size", SMALL, "--chunk-size", "8M"],
            &["chunk size", "4 MiB"],
        ),
        (
            &["--size", SMALL, "--chunk-size", "16G"],
            &["chunk size", "4 MiB"],
        ),
        (
            &["--size", SMALL, "--bogus"],
            &["unexpected argument '--bogus'"],
        ),
        (
            &["--size", SMALL, "--keep-revisions", "0"],
            &["keep-revisions", "at least 1"],
        ),
        (
            &["--size", SMALL, "--keep-revisions", "-1"],
            &["unexpected argument '-1'"],
        ),
        (
            &["--size", SMALL, "--keep-revisions=-1"],
            &["invalid value", "--keep-revisions"],
        ),
        (&["--size", SMALL, "--keep-age=-5m"], &["not a duration"]),
        (&["--size", SMALL, "--keep-age", "5y"], &["not a duration"]),
        (
            &["--size", SMALL, "--keep-unlinked", "forever"],
            &["not a duration"],
        ),
        (
            &["--size", SMALL, "--auto-gc-free-percent", "101"],
            &["auto-gc-free-percent", "0 to 90"],
        ),
        (
            &["--size", SMALL, "--auto-gc-free-percent=-1"],
            &["invalid value"],
        ),
    ];
    // Slots over too few targets for the redundancy (refused before anything is made), and
    // an option that would otherwise be dropped without a word: redundancy without
    // targets to spread over.
    let (t1, t2) = (t.path().join("t1"), t.path().join("t2"));
    fs::create_dir(&t1).unwrap();
    fs::create_dir(&t2).unwrap();
    let (t1, t2) = (t1.to_str().unwrap(), t2.to_str().unwrap());
    let slots_and_targets = [
        "--size",
        SMALL,
        "--slots",
        "2",
        "--target",
        t1,
        "--target",
        t2,
        "--redundancy",
        "2+1",
    ];
    let with_targets: &[(&[&str], &[&str])] = &[
        (&slots_and_targets, &["needs at least 3 targets", "2 given"]),
        (
            &["--size", SMALL, "--redundancy", "2+1"],
            &["required arguments", "--target"],
        ),
    ];
    for (extra, words) in cases.iter().chain(with_targets) {
        let mut args = base(&new);
        args.extend(extra.iter().map(|s| s.into()));
        let a: Vec<&OsStr> = args.iter().map(|s| s.as_os_str()).collect();
        assert_refused(t.path(), &a, words, &[&new]);
        assert!(
            !new.exists(),
            "refused `format {extra:?}` created {}",
            new.display()
        );
    }
    assert_refused(
        t.path(),
        &[os("format"), other.as_os_str(), os("--size"), os(SMALL)],
        &["not empty and is not a ckptfs space"],
        &[&other],
    );
    assert_refused(
        t.path(),
        &[
            os("format"),
            other.as_os_str(),
            os("--size"),
            os(SMALL),
            os("--force"),
        ],
        &["not empty and is not a ckptfs space"],
        &[&other],
    );
    assert_refused(
        t.path(),
        &[os("format"), file.as_os_str(), os("--size"), os(SMALL)],
        &["not a directory"],
        &[&file],
    );
}

#[test]
fn format_force_refused_keeps_the_old_space() {
    let mut m = TestMount::with_options(SMALL, None);
    let data = pattern(0xbad, 3 << 20);
    write_file_checked(&m.path("ckpt"), &data).expect("write");
    m.unmount();
    let backing = m.backing().to_path_buf();
    let log = TempDir::new("bad-force");
    // Each of these is refused before the old space is erased.
    let cases: &[(&[&str], &[&str])] = &[
        (&["--size", "100000T"], &["larger than the free space"]),
        (&["--size", "1M"], &["below the minimum"]),
        (&["--size", SMALL, "--chunk-size", "3"], &["chunk size"]),
        (
            &["--size", SMALL, "--keep-revisions", "0"],
            &["keep-revisions"],
        ),
    ];
    for (extra, words) in cases {
        let mut a = vec![os("format"), backing.as_os_str()];
        a.extend(extra.iter().map(|s| os(s)));
        a.push(os("--force"));
        assert_refused(log.path(), &a, words, &[&backing]);
    }
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);
}

#[test]
fn config_refuses_bad_values_offline_and_mounted() {
    let mut m = TestMount::with_options(SMALL, None);
    let before = m.config(&[]);
    let log = TempDir::new("bad-config");
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--keep-revisions", "0"],
            &["keep-revisions", "at least 1"],
        ),
        (
            &["--auto-gc-free-percent", "95"],
            &["auto-gc-free-percent", "0 to 90"],
        ),
        (&["--keep-age", "soon"], &["not a duration"]),
        (&["--keep-unlinked=-1d"], &["not a duration"]),
        (&["--keep-revisions", "two"], &["invalid value"]),
    ];
    for mounted in [true, false] {
        if !mounted {
            m.unmount();
        }
        let backing = m.backing().to_path_buf();
        for (extra, words) in cases {
            let mut a = vec![os("config"), backing.as_os_str()];
            a.extend(extra.iter().map(|s| os(s)));
            // Mounted, the backing dir changes under the daemon's own commits only, which a
            // refused config must not cause; offline the snapshot covers everything.
            assert_refused(log.path(), &a, words, &[&backing]);
        }
        assert_eq!(m.config(&[]), before, "a refused config changed the policy");
    }
}

fn name(len: usize) -> String {
    "n".repeat(len)
}

/// ENAMETOOLONG for a name component over 255 bytes, through every call that takes a name,
/// and for paths over PATH_MAX; nothing is created and the files there read back intact.
#[test]
fn long_names_and_paths_are_refused() {
    let m = TestMount::with_options(SMALL, None);
    let keep = pattern(7, 300_000);
    write_file_checked(&m.path("keep"), &keep).expect("write keep");
    fs::create_dir(m.path("d")).expect("mkdir d");
    let ok = name(255);
    write_file_checked(&m.path(&ok), b"255 bytes is allowed").expect("create 255-byte name");
    fs::create_dir(m.path("d").join(&ok)).expect("mkdir 255-byte name");

    // 256 reaches the daemon; the kernel itself stops FUSE names over 1024.
    for len in [256, 300, 1025, 5000] {
        let long = m.path(name(len));
        let long_in_d = m.path("d").join(name(len));
        let want = Err(libc::ENAMETOOLONG);
        assert_eq!(
            errno(fs::File::create(&long)).map(|_| ()),
            want,
            "create {len}"
        );
        assert_eq!(
            errno(
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&long_in_d)
            )
            .map(|_| ()),
            want,
            "create_new {len}"
        );
        assert_eq!(errno(fs::create_dir(&long)), want, "mkdir {len}");
        assert_eq!(errno(fs::metadata(&long)).map(|_| ()), want, "lookup {len}");
        assert_eq!(
            errno(fs::rename(m.path("keep"), &long)),
            want,
            "rename to {len}"
        );
        assert_eq!(
            errno(fs::rename(&long, m.path("x"))),
            want,
            "rename from {len}"
        );
        assert_eq!(
            errno(std::os::unix::fs::symlink("keep", &long)),
            want,
            "symlink named {len}"
        );
        assert_eq!(errno(fs::remove_file(&long)), want, "unlink {len}");
        assert_eq!(errno(fs::remove_dir(&long)), want, "rmdir {len}");
        let c = cpath(&long);
        // SAFETY: c is a valid C string; mknod of a fifo has no memory preconditions.
        let r = check(unsafe { libc::mknod(c.as_ptr(), libc::S_IFIFO | 0o644, 0) });
        assert_eq!(errno(r).map(|_| ()), want, "mknod {len}");
    }
    // A symlink whose target is longer than PATH_MAX.
    assert_eq!(
        errno(std::os::unix::fs::symlink("t".repeat(4096), m.path("s"))),
        Err(libc::ENAMETOOLONG),
        "symlink target of 4096 bytes"
    );

    // Paths over PATH_MAX (4096) made of short components.
    let mut deep = m.path("d");
    while deep.as_os_str().len() <= 4200 {
        deep.push("abcdefghij");
    }
    assert_eq!(errno(fs::create_dir_all(&deep)), Err(libc::ENAMETOOLONG));
    assert_eq!(
        errno(fs::File::create(deep.join("f"))).map(|_| ()),
        Err(libc::ENAMETOOLONG)
    );
    assert_eq!(
        errno(fs::metadata(&deep)).map(|_| ()),
        Err(libc::ENAMETOOLONG)
    );

    let mut names: Vec<String> = fs::read_dir(m.mnt())
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want = vec!["d".to_string(), "keep".to_string(), ok.clone()];
    want.sort();
    assert_eq!(names, want, "refused calls created or removed names");
    let in_d: Vec<_> = fs::read_dir(m.path("d")).expect("read_dir d").collect();
    assert_eq!(in_d.len(), 1, "d holds only the 255-byte dir");
    assert_file_eq(&m.path("keep"), &keep);
    assert_file_eq(&m.path(&ok), b"255 bytes is allowed");
}

/// Writes, truncates and fallocates past the largest file size fail with EFBIG, and the file
/// keeps its size and bytes (also after a remount).
#[test]
fn writes_and_truncates_past_the_maximum_file_size_are_refused() {
    let mut m = TestMount::with_options(SMALL, None);
    let data = pattern(11, 200_000);
    let p = m.path("f");
    write_file_checked(&p, &data).expect("write");
    {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .expect("open rw");
        let efbig = Err(libc::EFBIG);
        assert_eq!(
            errno(f.write_at(b"x", MAX_FILE_BYTES)).map(|_| ()),
            efbig,
            "write at the max"
        );
        assert_eq!(
            errno(f.write_at(b"x", (1 << 62) + 5)).map(|_| ()),
            efbig,
            "write far past the max"
        );
        assert_eq!(
            errno(f.set_len(MAX_FILE_BYTES + 1)),
            efbig,
            "ftruncate past the max"
        );
        assert_eq!(
            errno(f.set_len(u64::MAX >> 1)),
            efbig,
            "ftruncate to 2^63-1"
        );
        use std::os::unix::io::AsRawFd;
        for (off, len) in [
            (MAX_FILE_BYTES, 4096),
            (MAX_FILE_BYTES - 10, 20),
            (0, MAX_FILE_BYTES + 1),
        ] {
            // SAFETY: fallocate on an open descriptor with plain integer arguments.
            let r = check(unsafe {
                libc::fallocate(f.as_raw_fd(), 0, off as libc::off_t, len as libc::off_t)
            });
            assert_eq!(errno(r).map(|_| ()), efbig, "fallocate {off}+{len}");
        }
        assert_eq!(f.metadata().expect("fstat").len(), data.len() as u64);
        f.sync_all().expect("fsync after refusals");
    }
    assert_eq!(
        errno(
            fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .and_then(|f| f.set_len(MAX_FILE_BYTES + 4096))
        ),
        Err(libc::EFBIG),
        "truncate by path past the max"
    );
    assert_file_eq(&p, &data);

    // A write that crosses the limit writes what fits and returns the short count, as POSIX
    // asks (the kernel splits it at the page boundary, which is the limit); the next write
    // then gets EFBIG. Truncating back leaves the file as it was.
    let edge = m.path("edge");
    write_file_checked(&edge, &data).expect("write edge");
    {
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&edge)
            .expect("open edge");
        match errno(f.write_at(b"xyz", MAX_FILE_BYTES - 1)) {
            Ok(n) => assert_eq!(n, 1, "a write crossing the max writes up to the max only"),
            Err(e) => assert_eq!(e, libc::EFBIG, "write across the max"),
        }
        assert!(f.metadata().expect("fstat").len() <= MAX_FILE_BYTES);
        assert_eq!(
            errno(f.write_at(b"yz", MAX_FILE_BYTES)).map(|_| ()),
            Err(libc::EFBIG)
        );
        f.set_len(data.len() as u64).expect("truncate back");
    }
    assert_file_eq(&edge, &data);
    m.remount();
    assert_file_eq(&p, &data);
    assert_file_eq(&edge, &data);
}
