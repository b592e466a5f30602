//! The object-store tier against a real S3 server (SeaweedFS's `weed mini`, one per test, on
//! loopback; `ckptfs_tests::s3`): a space restarts on another node from the bucket alone,
//! `close` mode survives the node, a next revision uploads about what it newly stores, a
//! stopped or killed store loses nothing and the status says what is pending, damage in the
//! bucket is found and never restored, bucket gc keeps a rotation bounded, refused
//! credentials are said, and a space mounted from the bucket fetches chunks as they are read
//! (within its cache bound, EIO for damage or a failing store, never wrong bytes). Without `weed` each test prints SKIPPED (`CKPTFS_REQUIRE=s3`
//! fails instead; `.ci/run` installs it).

use ckptfs_tests::s3::Weed;
use ckptfs_tests::{pattern, TestMount};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One node of a tree as the comparison sees it.
#[derive(Debug, PartialEq)]
enum Item {
    Dir {
        mode: u32,
        mtime: i64,
    },
    File {
        mode: u32,
        mtime: i64,
        bytes: Vec<u8>,
        xattrs: Vec<(String, Vec<u8>)>,
    },
    Link(PathBuf),
}

fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    let mut names = vec![0u8; 4096];
    // SAFETY: the buffer is as long as said.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "listxattr {}", p.display());
    let mut out = Vec::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = std::ffi::CString::new(name).expect("name");
        let mut v = vec![0u8; 65536];
        // SAFETY: the buffer is as long as said.
        let m = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(m >= 0, "getxattr {}", p.display());
        v.truncate(m as usize);
        out.push((String::from_utf8_lossy(name).into_owned(), v));
    }
    out.sort();
    out
}

/// Every node under `root` (relative path -> item).
fn tree(root: &Path) -> BTreeMap<PathBuf, Item> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            let m = fs::symlink_metadata(&p).expect("lstat");
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            let item = if m.file_type().is_symlink() {
                Item::Link(fs::read_link(&p).expect("readlink"))
            } else if m.is_dir() {
                stack.push(p.clone());
                Item::Dir {
                    mode: m.permissions().mode(),
                    mtime: m.mtime(),
                }
            } else {
                Item::File {
                    mode: m.permissions().mode(),
                    mtime: m.mtime(),
                    bytes: fs::read(&p).expect("read"),
                    xattrs: xattrs(&p),
                }
            };
            out.insert(rel, item);
        }
    }
    out
}

#[track_caller]
fn assert_same_tree(a: &Path, b: &Path) {
    let (ta, tb) = (tree(a), tree(b));
    let ka: Vec<_> = ta.keys().collect();
    let kb: Vec<_> = tb.keys().collect();
    assert_eq!(ka, kb, "the trees name different nodes");
    for (k, va) in &ta {
        let vb = &tb[k];
        if va != vb {
            let short = |i: &Item| match i {
                Item::File {
                    mode,
                    mtime,
                    bytes,
                    xattrs,
                } => format!(
                    "file mode {mode:o} mtime {mtime} {} bytes (blake3 {}) xattrs {xattrs:?}",
                    bytes.len(),
                    blake3_hex(bytes)
                ),
                other => format!("{other:?}"),
            };
            panic!("{}: {} != {}", k.display(), short(va), short(vb));
        }
    }
}

fn blake3_hex(b: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for x in b {
        h = (h ^ *x as u64).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

/// A checkpoint-shaped tree: a step directory with a large incompressible file, a
/// compressible one, small JSON files, an empty file, a symlink, an attribute and odd modes.
fn write_tree(root: &Path, step: u64) {
    let d = root.join(format!("step-{step}"));
    fs::create_dir_all(d.join("shards")).expect("mkdir");
    fs::write(d.join("model.bin"), pattern(step, 3 << 20)).expect("write");
    fs::write(d.join("optimizer.bin"), vec![step as u8; 2 << 20]).expect("write");
    for r in 0..4 {
        fs::write(
            d.join(format!("shards/rank{r}.bin")),
            pattern(step * 10 + r, 200_000),
        )
        .expect("write");
    }
    fs::write(d.join("config.json"), format!("{{\"step\": {step}}}\n")).expect("write");
    fs::write(d.join("empty"), b"").expect("write");
    fs::set_permissions(d.join("config.json"), fs::Permissions::from_mode(0o640)).expect("chmod");
    set_xattr(
        &d.join("model.bin"),
        "user.ckpt.step",
        step.to_string().as_bytes(),
    );
    let link = root.join("latest");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(format!("step-{step}"), &link).expect("symlink");
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr {name} on {}", p.display());
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A space with a tier at `weed`'s prefix `prefix`, mounted.
fn space_with_tier(weed: &Weed, prefix: &str, extra: &[&str]) -> TestMount {
    let url = weed.url(prefix);
    let mut args = vec!["--remote", url.as_str()];
    args.extend_from_slice(extra);
    TestMount::with_env_format_args("1G", &args, &weed.env())
}

/// `status` once it reports an error (the client gives up on a request after its 30 s of
/// retries; at most 90 s).
fn status_with_error(m: &mut TestMount) -> serde_json::Value {
    let mut s = status(m);
    for _ in 0..900 {
        if s["last_error"].is_string() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        s = status(m);
    }
    s
}

/// A space with a tier at `prefix` reaching `weed` through a fault proxy.
fn space_behind_proxy(weed: &Weed, prefix: &str) -> (ckptfs_tests::s3::FaultProxy, TestMount) {
    let (proxy, env) = behind_proxy(weed);
    let url = weed.url(prefix);
    let m = TestMount::with_env_format_args("1G", &["--remote", &url], &env);
    (proxy, m)
}

/// A fault proxy in front of `weed`, and the environment that reaches the store through it.
fn behind_proxy(weed: &Weed) -> (ckptfs_tests::s3::FaultProxy, Vec<(&'static str, String)>) {
    let proxy = ckptfs_tests::s3::FaultProxy::start(weed.s3_port());
    let mut env = weed.env();
    for (k, v) in &mut env {
        if *k == "AWS_ENDPOINT_URL" {
            *v = proxy.endpoint();
        }
    }
    (proxy, env)
}

/// `ckptfs remote MNT --json`.
fn status(m: &mut TestMount) -> serde_json::Value {
    let mnt = m.mnt().to_path_buf();
    m.ckptfs_json(&[os("remote"), mnt.as_os_str(), os("--json")])
}

/// A new node: recovers `prefix` into a fresh backing directory and mounts it.
fn recover_elsewhere(weed: &Weed, prefix: &str) -> TestMount {
    recover_elsewhere_with(weed, prefix, &[])
}

/// `recover_elsewhere` mounted with `options`.
fn recover_elsewhere_with(weed: &Weed, prefix: &str, options: &[&str]) -> TestMount {
    let mut n = TestMount::empty_with_env(&weed.env());
    let backing = n.backing().to_path_buf();
    let url = weed.url(prefix);
    n.ckptfs_ok(&[os("recover"), backing.as_os_str(), os("--remote"), os(&url)]);
    n.mount_with(options);
    n
}

#[test]
fn a_space_restarts_on_another_node_from_the_bucket_alone() {
    let Some(weed) = Weed::start("a_space_restarts_on_another_node_from_the_bucket_alone") else {
        return;
    };
    let mut a = space_with_tier(&weed, "job1", &[]);
    write_tree(a.mnt(), 1);
    write_tree(a.mnt(), 2);
    // The root's own mode, times and attributes travel too.
    fs::set_permissions(a.mnt(), fs::Permissions::from_mode(0o750)).expect("chmod root");
    set_xattr(a.mnt(), "user.ckpt.job", b"job1");
    let root = |p: &Path| {
        let m = fs::metadata(p).expect("stat root");
        (m.mode() & 0o7777, m.mtime(), m.mtime_nsec(), xattrs(p))
    };
    let root_a = root(a.mnt());
    // `ckptfs umount` waits until the bucket holds everything.
    let keep = tempfile_copy(a.mnt());
    a.unmount();
    let mut b = recover_elsewhere(&weed, "job1");
    assert_same_tree(keep.path(), b.mnt());
    assert_eq!(
        root(b.mnt()),
        root_a,
        "the root's mode, mtime or attributes"
    );
    // The new node owns the prefix now: while it is mounted, the old space cannot be.
    let backing_a = a.backing().to_path_buf();
    let mnt_a = a.mnt().to_path_buf();
    let (st, _, err) = a.ckptfs(&[os("mount"), backing_a.as_os_str(), mnt_a.as_os_str()]);
    assert!(!st.success(), "a second owner of the prefix was mounted");
    assert!(err.contains("owned by"), "{err}");
    // It writes on, as the bucket's owner; a third node sees its step.
    write_tree(b.mnt(), 3);
    fs::remove_dir_all(b.mnt().join("step-1")).expect("rm step-1");
    let keep_b = tempfile_copy(b.mnt());
    b.unmount();
    // The old space is now behind the bucket: mounting it as the owner would roll it back.
    let (st, _, err) = a.ckptfs(&[os("mount"), backing_a.as_os_str(), mnt_a.as_os_str()]);
    assert!(
        !st.success(),
        "a space behind the bucket was mounted as its owner"
    );
    assert!(err.contains("holds newer checkpoints"), "{err}");
    let c = recover_elsewhere(&weed, "job1");
    assert_same_tree(keep_b.path(), c.mnt());
}

/// A plain-directory copy of a tree (times, modes, attributes kept), to compare with later.
fn tempfile_copy(from: &Path) -> ckptfs_tests::TempDir {
    let t = ckptfs_tests::TempDir::new("remote-copy");
    let st = std::process::Command::new("cp")
        .args(["-a", "--preserve=all"])
        .arg(format!("{}/.", from.display()))
        .arg(t.path())
        .status()
        .expect("cp");
    assert!(st.success(), "cp -a");
    t
}

#[test]
fn in_close_mode_a_closed_file_survives_the_node() {
    let Some(weed) = Weed::start("in_close_mode_a_closed_file_survives_the_node") else {
        return;
    };
    let mut a = space_with_tier(&weed, "close", &["--remote-durability", "close"]);
    write_tree(a.mnt(), 7);
    let keep = tempfile_copy(a.mnt());
    // Every close returned: the node dies now, before any unmount. Its lease still runs,
    // so the new node takes it over (it knows the old one is dead).
    a.kill_daemon();
    let b = recover_elsewhere_with(&weed, "close", &["--remote-take-over"]);
    assert_same_tree(keep.path(), b.mnt());
}

#[test]
fn a_next_revision_uploads_about_what_it_newly_stores() {
    let Some(weed) = Weed::start("a_next_revision_uploads_about_what_it_newly_stores") else {
        return;
    };
    let mut a = space_with_tier(&weed, "next", &[]);
    let mut data = pattern(5, 32 << 20);
    fs::write(a.path("ckpt.bin"), &data).expect("write");
    let mnt = a.mnt().to_path_buf();
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    let sent0 = status(&mut a)["sent_bytes"].as_u64().unwrap();
    let stored0 = a.stats().json()["stored_bytes"].as_u64().unwrap();
    // 5% of the 64 KiB blocks changed.
    let blocks = data.len() / 65536;
    for i in (0..blocks).step_by(20) {
        let fresh = pattern(1000 + i as u64, 65536);
        data[i * 65536..(i + 1) * 65536].copy_from_slice(&fresh);
    }
    fs::write(a.path("ckpt.bin"), &data).expect("write next");
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    let sent = status(&mut a)["sent_bytes"].as_u64().unwrap() - sent0;
    let stored = a.stats().json()["stored_bytes"].as_u64().unwrap() - stored0;
    eprintln!("next revision: {stored} bytes newly stored, {sent} bytes sent");
    assert!(stored > 0, "the next revision stored nothing new");
    assert!(
        sent as f64 <= 1.3 * stored as f64,
        "sent {sent} bytes for {stored} newly stored"
    );
}

#[test]
fn a_stopped_store_delays_uploads_and_loses_nothing() {
    let Some(weed) = Weed::start("a_stopped_store_delays_uploads_and_loses_nothing") else {
        return;
    };
    let mut a = space_with_tier(&weed, "stopped", &[]);
    write_tree(a.mnt(), 1);
    let mnt = a.mnt().to_path_buf();
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    weed.pause();
    // Closes return at local durability while the store answers nothing.
    write_tree(a.mnt(), 2);
    let s = status(&mut a);
    assert!(s["behind_commits"].as_u64().unwrap() > 0, "{s}");
    assert_ne!(s["state"], "idle", "{s}");
    let keep = tempfile_copy(a.mnt());
    weed.resume();
    a.unmount();
    let b = recover_elsewhere(&weed, "stopped");
    assert_same_tree(keep.path(), b.mnt());
}

#[test]
fn a_killed_store_restarted_gets_everything_and_the_status_says_what_is_pending() {
    let Some(mut weed) =
        Weed::start("a_killed_store_restarted_gets_everything_and_the_status_says_what_is_pending")
    else {
        return;
    };
    let mut a = space_with_tier(&weed, "killed", &[]);
    write_tree(a.mnt(), 1);
    weed.kill();
    write_tree(a.mnt(), 2);
    // The uploader tries, fails (connection refused) and says so, with the commits pending.
    let s = status_with_error(&mut a);
    assert!(s["last_error"].is_string(), "no error reported: {s}");
    assert!(s["behind_commits"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["state"], "retrying", "{s}");
    let keep = tempfile_copy(a.mnt());
    weed.restart();
    a.unmount();
    let b = recover_elsewhere(&weed, "killed");
    assert_same_tree(keep.path(), b.mnt());
}

#[test]
fn damage_in_the_bucket_is_found_never_restored_and_repaired_from_the_space() {
    let Some(weed) =
        Weed::start("damage_in_the_bucket_is_found_never_restored_and_repaired_from_the_space")
    else {
        return;
    };
    let mut a = space_with_tier(&weed, "damaged", &[]);
    write_tree(a.mnt(), 1);
    a.unmount();
    let bucket = weed.bucket("damaged");
    let packs: Vec<String> = bucket
        .list("packs/")
        .expect("list")
        .into_iter()
        .map(|o| o.rel)
        .collect();
    assert!(!packs.is_empty());
    // One byte of the largest pack changed behind ckptfs's back.
    let victim = packs
        .iter()
        .max_by_key(|p| bucket.get(p).unwrap().unwrap().0.len())
        .unwrap()
        .clone();
    let (b, _) = bucket.get(&victim).unwrap().unwrap();
    let mut b = b.to_vec();
    let at = b.len() / 2;
    b[at] ^= 0x40;
    bucket
        .put(&victim, b.into(), ckptfs_remote::bucket::Put::Overwrite)
        .expect("put damaged");
    let backing = a.backing().to_path_buf();
    let (st, out, err) = a.ckptfs(&[os("check"), os("--remote"), backing.as_os_str()]);
    assert_eq!(st.code(), Some(1), "check --remote: {out}{err}");
    assert!(out.contains("does not match its blake3"), "{out}");
    assert!(
        out.contains("step-1/"),
        "the damaged file is not named: {out}"
    );
    // A restore refuses to write what does not verify.
    let mut n = TestMount::empty_with_env(&weed.env());
    let nb = n.backing().to_path_buf();
    let url = weed.url("damaged");
    let (st, _, err) = n.ckptfs(&[os("recover"), nb.as_os_str(), os("--remote"), os(&url)]);
    assert!(!st.success(), "a damaged bucket was recovered from");
    assert!(err.contains("damaged in the bucket"), "{err}");
    assert!(
        fs::read_dir(&nb)
            .map(|mut d| d.next().is_none())
            .unwrap_or(true),
        "a failed recovery left files in {}",
        nb.display()
    );
    // Checked through the mount, the damaged chunks are uploaded again from the space's
    // own verified bytes; then the bucket checks clean and restores exactly.
    let keep = tempfile_copy_after_mount(&mut a);
    let mnt = a.mnt().to_path_buf();
    let (st, out, err) = a.ckptfs(&[os("check"), os("--remote"), mnt.as_os_str()]);
    assert_eq!(
        st.code(),
        Some(1),
        "check --remote on the mount: {out}{err}"
    );
    assert!(out.contains("uploaded again"), "{out}");
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    let (st, out, err) = a.ckptfs(&[os("check"), os("--remote"), mnt.as_os_str()]);
    assert_eq!(st.code(), Some(0), "after the repair: {out}{err}");
    a.unmount();
    let b = recover_elsewhere(&weed, "damaged");
    assert_same_tree(keep.path(), b.mnt());
}

/// Mounts `m` and copies its tree to a plain directory.
fn tempfile_copy_after_mount(m: &mut TestMount) -> ckptfs_tests::TempDir {
    m.mount();
    tempfile_copy(m.mnt())
}

#[test]
fn bucket_gc_keeps_a_rotation_bounded() {
    let Some(weed) = Weed::start("bucket_gc_keeps_a_rotation_bounded") else {
        return;
    };
    let mut a = TestMount::empty_with_env(&weed.env());
    a.set_env(ckptfs_engine::face::clock::TEST_CLOCK_ENV, "1");
    let backing = a.backing().to_path_buf();
    let url = weed.url("rotation");
    a.ckptfs_ok(&[
        os("format"),
        backing.as_os_str(),
        os("--size"),
        os("1G"),
        os("--remote"),
        os(&url),
    ]);
    a.mount();
    let mnt = a.mnt().to_path_buf();
    let bucket = weed.bucket("rotation");
    let packs_bytes = |b: &ckptfs_remote::Bucket| -> u64 {
        b.list("packs/").unwrap().iter().map(|o| o.size).sum()
    };
    let mut most = 0;
    for step in 1..=8u64 {
        write_tree(a.mnt(), step);
        if step > 2 {
            fs::remove_dir_all(a.path(format!("step-{}", step - 2))).expect("rotate");
        }
        a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
        // Past the grace period, then gc (the space's and the bucket's).
        a.ckptfs_ok(&[os("gc"), mnt.as_os_str()]);
        advance_clock(&mut a, 700.0);
        let out = a.ckptfs_ok(&[os("gc"), mnt.as_os_str()]);
        assert!(out.contains("bucket: deleted"), "{out}");
        most = most.max(packs_bytes(&bucket));
    }
    // Two steps are live (about 6 MiB stored each: 3 MiB incompressible, the rest
    // compressible or small); what the last three manifests name is kept.
    let live: u64 = a.stats().json()["stored_bytes"].as_u64().unwrap();
    eprintln!("bucket packs peaked at {most} bytes; live stored {live}");
    assert!(
        most <= 4 * live,
        "the bucket grew to {most} bytes for {live} live bytes"
    );
    let keep = tempfile_copy(a.mnt());
    a.unmount();
    let b = recover_elsewhere(&weed, "rotation");
    assert_same_tree(keep.path(), b.mnt());
}

/// Moves the daemon's clock (`CKPTFS_TEST_CLOCK=1`) forward by `secs`.
fn advance_clock(m: &mut TestMount, secs: f64) {
    let c = std::ffi::CString::new(m.mnt().as_os_str().as_encoded_bytes()).unwrap();
    let v = secs.to_string();
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.ckptfs.clock".as_ptr(),
            v.as_ptr().cast(),
            v.len(),
            0,
        )
    };
    assert_eq!(r, 0, "clock control: {}", std::io::Error::last_os_error());
}

#[test]
fn refused_credentials_are_said_and_local_writes_go_on() {
    let Some(weed) = Weed::start("refused_credentials_are_said_and_local_writes_go_on") else {
        return;
    };
    // A format checks the prefix, so wrong credentials are refused before anything is made.
    let mut bad = weed.env();
    for (k, v) in &mut bad {
        if *k == "AWS_SECRET_ACCESS_KEY" {
            *v = "wrong".into();
        }
    }
    let mut n = TestMount::empty_with_env(&bad);
    let nb = n.backing().to_path_buf();
    let url = weed.url("creds");
    let (st, _, err) = n.ckptfs(&[
        os("format"),
        nb.as_os_str(),
        os("--size"),
        os("1G"),
        os("--remote"),
        os(&url),
    ]);
    assert!(!st.success(), "format with refused credentials");
    assert!(err.contains("cannot use"), "{err}");
    assert!(
        fs::read_dir(&nb).unwrap().next().is_none(),
        "the refused format left files"
    );
    // A mount whose credentials stop working: writes keep their local durability, the
    // status says why nothing is uploaded, and an unmount says what the bucket lacks.
    let mut a = space_with_tier(&weed, "creds", &[]);
    a.unmount();
    a.set_env("AWS_SECRET_ACCESS_KEY", "wrong");
    // `--sync` and `umount` give up after this long without progress (30 s by default).
    a.set_env("CKPTFS_REMOTE_STALL_SECS", "3");
    a.mount();
    write_tree(a.mnt(), 1);
    let s = status_with_error(&mut a);
    assert!(s["last_error"].is_string(), "{s}");
    assert!(s["behind_commits"].as_u64().unwrap() > 0, "{s}");
    // The wait for the upload gives up once nothing moves for a while, saying why.
    let mnt = a.mnt().to_path_buf();
    let (st, _, err) = a.ckptfs(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    assert!(!st.success(), "--sync with refused credentials succeeded");
    assert!(err.contains("still lacks"), "{err}");
}

#[test]
fn a_store_answering_503_gets_everything_once_it_recovers() {
    let Some(weed) = Weed::start("a_store_answering_503_gets_everything_once_it_recovers") else {
        return;
    };
    let (proxy, mut a) = space_behind_proxy(&weed, "busy");
    write_tree(a.mnt(), 1);
    let mnt = a.mnt().to_path_buf();
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    proxy.fail_with(503);
    write_tree(a.mnt(), 2);
    // The client retries 503 with backoff; past its limit the status says so.
    let s = status_with_error(&mut a);
    assert!(
        s["last_error"].as_str().is_some_and(|e| e.contains("503")),
        "{s}"
    );
    assert!(s["behind_commits"].as_u64().unwrap() > 0, "{s}");
    let keep = tempfile_copy(a.mnt());
    proxy.fail_with(0);
    a.unmount();
    let b = recover_elsewhere(&weed, "busy");
    assert_same_tree(keep.path(), b.mnt());
}

#[test]
fn a_head_put_whose_answer_is_lost_does_not_fence_the_mount() {
    let Some(weed) = Weed::start("a_head_put_whose_answer_is_lost_does_not_fence_the_mount") else {
        return;
    };
    let (proxy, mut a) = space_behind_proxy(&weed, "lost");
    write_tree(a.mnt(), 1);
    let mnt = a.mnt().to_path_buf();
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    // The store applies the next head but its answer never arrives: the client retries the
    // put with the ETag it had, which the store refuses (412); the head there is this
    // mount's own, so it goes on.
    proxy.cut_answer("PUT /ckpt/lost/head");
    write_tree(a.mnt(), 2);
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    assert!(proxy.cut_done(), "no head put was cut");
    let s = status(&mut a);
    assert!(s["fenced"].is_null(), "{s}");
    write_tree(a.mnt(), 3);
    a.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    let s = status(&mut a);
    assert!(s["fenced"].is_null(), "{s}");
    let keep = tempfile_copy(a.mnt());
    a.unmount();
    let b = recover_elsewhere(&weed, "lost");
    assert_same_tree(keep.path(), b.mnt());
}

/// A new node mounting `prefix` from the bucket into an empty cache directory (`ckptfs mount
/// s3://... MNT --cache DIR`), with `options`.
fn mount_from_bucket(weed: &Weed, prefix: &str, options: &[&str]) -> TestMount {
    mount_from_bucket_with_env(weed, &weed.env(), prefix, options)
}

/// `mount_from_bucket` with the environment `env` (another endpoint: a fault proxy).
fn mount_from_bucket_with_env(
    weed: &Weed,
    env: &[(&str, String)],
    prefix: &str,
    options: &[&str],
) -> TestMount {
    let mut n = TestMount::empty_with_env(env);
    let (backing, mnt) = (n.backing().to_path_buf(), n.mnt().to_path_buf());
    let url = weed.url(prefix);
    let mut args = vec![
        os("mount"),
        os(&url),
        mnt.as_os_str(),
        os("--cache"),
        backing.as_os_str(),
    ];
    args.extend(options.iter().map(|o| os(o)));
    n.ckptfs_ok(&args);
    n.mounted_elsewhere();
    n
}

#[test]
fn a_space_mounted_from_the_bucket_fetches_chunks_as_they_are_read() {
    let Some(weed) = Weed::start("a_space_mounted_from_the_bucket_fetches_chunks_as_they_are_read")
    else {
        return;
    };
    let mut a = space_with_tier(&weed, "lazy", &[]);
    write_tree(a.mnt(), 1);
    write_tree(a.mnt(), 2);
    let keep = tempfile_copy(a.mnt());
    a.unmount();
    // A cache smaller than what is read: chunks are evicted and fetched again, never more
    // than the bound is kept.
    let cache = 4u64 << 20;
    let mut b = mount_from_bucket(&weed, "lazy", &["--cache-size", "4M"]);
    // Ready before any chunk was fetched: the tree is there, the bytes are in the bucket.
    let s = status(&mut b);
    assert_eq!(
        s["fetch"]["requests"], 0,
        "fetched before the mount was ready: {s}"
    );
    let mnt = b.mnt().to_path_buf();
    let st = b.ckptfs_json(&[os("stats"), mnt.as_os_str(), os("--json")]);
    let remote_chunks = st["remote_chunks"].as_u64().unwrap();
    assert!(
        remote_chunks > 0,
        "no chunk is held by the bucket alone: {st}"
    );
    assert_eq!(
        st["chunks"], 0,
        "chunks were stored locally at the mount: {st}"
    );
    // Read through: every byte as written, fetched with coalesced ranged reads.
    assert_same_tree(keep.path(), b.mnt());
    let s = status(&mut b);
    let f = &s["fetch"];
    let (requests, fetched) = (
        f["requests"].as_u64().unwrap(),
        f["fetched_bytes"].as_u64().unwrap(),
    );
    assert!(requests > 0 && fetched > 0, "{s}");
    assert!(
        requests < f["chunks"].as_u64().unwrap(),
        "one request per chunk, nothing coalesced: {s}"
    );
    assert!(f["cached_bytes"].as_u64().unwrap() <= cache, "{s}");
    assert_eq!(f["cache_bytes"].as_u64().unwrap(), cache, "{s}");
    let on_disk = fs::metadata(b.backing().join("remote-cache"))
        .unwrap()
        .len();
    assert!(on_disk <= cache, "remote-cache is {on_disk} bytes");
    // The new owner writes on: a step of its own, the oldest removed (its chunks held by
    // the bucket alone go at gc), and a step rewritten in place (read, changed, written).
    write_tree(b.mnt(), 3);
    fs::remove_dir_all(b.mnt().join("step-1")).expect("rm step-1");
    let m2 = b.mnt().join("step-2/model.bin");
    let mut bytes = fs::read(&m2).unwrap();
    bytes[1000..2000].fill(7);
    fs::write(&m2, &bytes).unwrap();
    // step-1's revisions are kept (the trash) and the bucket holds their only copy: the
    // manifest names those chunks though no file does, so bucket gc keeps their packs.
    b.ckptfs_ok(&[os("remote"), mnt.as_os_str(), os("--sync")]);
    let (_, m) = ckptfs_remote::restore::newest(&weed.bucket("lazy"))
        .unwrap()
        .unwrap();
    let by_files: std::collections::HashSet<u64> = m
        .nodes
        .iter()
        .flat_map(|n| n.extents.iter().map(|x| x[2]))
        .collect();
    assert!(
        m.chunks.len() > by_files.len(),
        "the manifest names only the current files' chunks; the trash's live only there"
    );
    b.ckptfs_ok(&[os("gc"), mnt.as_os_str(), os("--empty-trash")]);
    let keep_b = tempfile_copy(b.mnt());
    b.unmount();
    let backing = b.backing().to_path_buf();
    let (st, out, err) = b.ckptfs(&[os("check"), backing.as_os_str(), os("--json")]);
    assert!(
        st.success(),
        "check of the space mounted from the bucket: {out}{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["problem_count"], 0, "{out}");
    assert!(
        v["remote_chunks"].as_u64().unwrap() < remote_chunks,
        "gc dropped none of step-1's chunks: {out}"
    );
    // Mounted again (its cache file emptied), it reads what it still holds only in the
    // bucket.
    b.mount();
    assert_same_tree(keep_b.path(), b.mnt());
    b.unmount();
    // A read-only mount fetches the same way and writes nothing to the backing directory.
    let listing = |d: &Path| -> Vec<(OsString, u64, i64, i64)> {
        let mut v: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                (e.file_name(), m.len(), m.mtime(), m.mtime_nsec())
            })
            .collect();
        v.sort();
        v
    };
    let before = listing(b.backing());
    b.mount_with(&["--read-only"]);
    let rel = "step-2/optimizer.bin";
    assert_eq!(
        fs::read(b.mnt().join(rel)).unwrap(),
        fs::read(keep_b.path().join(rel)).unwrap()
    );
    let s = status(&mut b);
    assert_eq!(s["read_only"], true, "{s}");
    assert!(s["fetch"]["chunks"].as_u64().unwrap() > 0, "{s}");
    b.unmount();
    assert_eq!(
        listing(b.backing()),
        before,
        "a read-only mount wrote there"
    );
    // Its uploads name the chunks it never fetched: a third node gets the whole tree.
    let c = recover_elsewhere(&weed, "lazy");
    assert_same_tree(keep_b.path(), c.mnt());
}

#[test]
fn a_chunk_damaged_in_the_bucket_reads_as_eio_never_wrong_bytes() {
    let Some(weed) = Weed::start("a_chunk_damaged_in_the_bucket_reads_as_eio_never_wrong_bytes")
    else {
        return;
    };
    let mut a = space_with_tier(&weed, "lazybad", &[]);
    write_tree(a.mnt(), 1);
    let good = fs::read(a.mnt().join("step-1/model.bin")).unwrap();
    a.unmount();
    let bucket = weed.bucket("lazybad");
    let mut b = mount_from_bucket(&weed, "lazybad", &[]);
    // Every pack damaged after the mount read the manifest: no read may return a byte of it.
    for o in bucket.list("packs/").expect("list") {
        let (bytes, _) = bucket.get(&o.rel).unwrap().unwrap();
        let mut bytes = bytes.to_vec();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x40;
        bucket
            .put(&o.rel, bytes.into(), ckptfs_remote::bucket::Put::Overwrite)
            .expect("put damaged");
    }
    let mut damaged = 0;
    for f in [
        "model.bin",
        "optimizer.bin",
        "shards/rank0.bin",
        "shards/rank3.bin",
    ] {
        match fs::read(b.mnt().join("step-1").join(f)) {
            Ok(bytes) => {
                if f == "model.bin" {
                    assert_eq!(bytes, good, "wrong bytes read for {f}");
                }
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{f}: {e}");
                damaged += 1;
            }
        }
    }
    assert!(damaged > 0, "no read met the damage");
    // The damage is reported, and `check --remote` names it.
    let mnt = b.mnt().to_path_buf();
    let (st, out, err) = b.ckptfs(&[os("check"), os("--remote"), mnt.as_os_str()]);
    assert_eq!(st.code(), Some(1), "check --remote: {out}{err}");
    assert!(out.contains("cannot be repaired"), "{out}");
}

#[test]
fn a_read_while_the_store_fails_is_eio_and_reads_once_it_answers() {
    let Some(weed) = Weed::start("a_read_while_the_store_fails_is_eio_and_reads_once_it_answers")
    else {
        return;
    };
    let mut a = space_with_tier(&weed, "lazydown", &[]);
    write_tree(a.mnt(), 1);
    let good = fs::read(a.mnt().join("step-1/model.bin")).unwrap();
    a.unmount();
    let (proxy, env) = behind_proxy(&weed);
    let b = mount_from_bucket_with_env(&weed, &env, "lazydown", &[]);
    // The store answers 503 to everything: the client retries, then the read fails, EIO.
    proxy.fail_with(503);
    let p = b.mnt().join("step-1/model.bin");
    let e = fs::read(&p).expect_err("a chunk the store could not give was read");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Nothing is remembered as bad: once the store answers, the same read gets every byte.
    proxy.fail_with(0);
    assert_eq!(fs::read(&p).unwrap(), good);
}

#[test]
fn readers_racing_over_a_small_cache_get_exact_bytes() {
    use rand::{Rng, SeedableRng};
    use std::os::unix::fs::FileExt;
    let Some(weed) = Weed::start("readers_racing_over_a_small_cache_get_exact_bytes") else {
        return;
    };
    let mut a = space_with_tier(&weed, "lazyrace", &[]);
    write_tree(a.mnt(), 1);
    write_tree(a.mnt(), 2);
    let keep = tempfile_copy(a.mnt());
    a.unmount();
    // A cache of 1 MiB over 11 MiB of files: the ring is overwritten all the time, also
    // under readers of copies it just handed out (those fail their check and are fetched
    // again from the store).
    let b = mount_from_bucket(&weed, "lazyrace", &["--cache-size", "1M"]);
    let files: Vec<(PathBuf, Vec<u8>)> = tree(keep.path())
        .into_iter()
        .filter_map(|(rel, item)| match item {
            Item::File { bytes, .. } if !bytes.is_empty() => Some((rel, bytes)),
            _ => None,
        })
        .collect();
    let seed = ckptfs_tests::test_seed("readers_racing_over_a_small_cache", 67);
    let mnt = b.mnt().to_path_buf();
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let (files, mnt) = (&files, &mnt);
            s.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(seed + t);
                for i in 0..50 {
                    let (rel, want) = &files[rng.random_range(0..files.len())];
                    let off = rng.random_range(0..want.len());
                    let len = rng.random_range(1..=(want.len() - off).min(300_000));
                    // Each open drops the kernel's pages of the file; the daemon's decoded
                    // chunks are dropped now and then, so reads keep reaching the fetcher.
                    if t == 0 && i % 5 == 0 {
                        ckptfs_tests::cluster::drop_daemon_caches(mnt);
                    }
                    let f = fs::File::open(mnt.join(rel)).expect("open");
                    let mut got = vec![0u8; len];
                    f.read_exact_at(&mut got, off as u64).unwrap_or_else(|e| {
                        panic!("seed {seed}: {} at {off}+{len}: {e}", rel.display())
                    });
                    assert!(
                        got == want[off..off + len],
                        "seed {seed}: thread {t} read wrong bytes of {} at {off}+{len}",
                        rel.display()
                    );
                }
            });
        }
    });
    let mut b = b;
    let s = status(&mut b);
    // How often a copy was overwritten under its reader depends on the interleaving: said,
    // not asserted.
    println!("fetch: {}", s["fetch"]);
    assert!(
        s["fetch"]["cached_bytes"].as_u64().unwrap() <= 1 << 20,
        "{s}"
    );
}

/// Float tensors through the bucket: a float space's chunks (fp32 weights, rotated by three
/// bits: codecs 12 to 15) uploaded, a new node mounting from the bucket reads them back
/// exact, and its space is marked for those codecs (`incompat` bits 4 and 7), so a build
/// that knows neither refuses it instead of failing on every read.
#[test]
fn float_chunks_come_back_from_the_bucket_with_the_flags_they_need() {
    use ckptfs_engine::format::{Features, Superblock, SUPERBLOCK_FILE};
    use rand::{Rng, SeedableRng};
    let Some(weed) = Weed::start("float_chunks_come_back_from_the_bucket_with_the_flags_they_need")
    else {
        return;
    };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed_0064);
    let weights: Vec<u8> = (0..1 << 20)
        .flat_map(|_| {
            let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-12), rng.random());
            (0.02 * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()).to_le_bytes()
        })
        .collect();
    let mut a = space_with_tier(&weed, "float", &["--codec", "float"]);
    fs::write(a.mnt().join("w.f32"), &weights).expect("write");
    a.unmount();
    // Mounted with `--codec lz4`, so the flags must come from the restore (a float mount
    // would set them for its own writes).
    let b = mount_from_bucket(&weed, "float", &["--codec", "lz4"]);
    assert!(
        fs::read(b.mnt().join("w.f32")).expect("read") == weights,
        "the weights read back differ"
    );
    let sb = Superblock::decode(&fs::read(b.backing().join(SUPERBLOCK_FILE)).expect("read"))
        .expect("decode");
    for (flag, what) in [
        (Features::INCOMPAT_FLOAT_CODEC, "the float codec"),
        (Features::INCOMPAT_FLOAT_ROTATE3, "codecs 12 to 15"),
    ] {
        assert!(
            sb.features.contains(flag),
            "the space mounted from the bucket is not marked for {what}"
        );
    }
}
