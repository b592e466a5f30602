//! A space written by an earlier build still mounts, reads, checks and takes new revisions.
//! `tests/fixtures/golden-v1.tar.gz` is a backing directory made by
//! `tests/fixtures/make-golden-space.sh` with the format as it was before the engine
//! restructuring; `golden-slots-v1.tar.gz` one of two slots (two nodes' tables, published
//! manifests, a revision over the other node's file) made by the same script (`slots`)
//! during the layers redesign, before the object-store tier; `golden-targets-v1.tar.gz` the
//! same two nodes on two slots over three storage targets erasure-coded 2+1, made by the
//! same script (`targets`) at the end of the layers redesign. The targets table records
//! absolute paths, so that one is unpacked where it was made
//! (`/tmp/ckptfs-golden-targets-v1`). Each `.manifest` says what its space holds. A change that breaks reading the existing format fails here, whatever the
//! unit tests of the new code say.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ckptfs_tests::TestMount;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn sha256(p: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {}", p.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

fn getxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let cp = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    let cn = std::ffi::CString::new(name).expect("name");
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the length passed.
    let n = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// Checks every row of the manifest `name` against the mount; returns the number of rows
/// checked.
fn check_manifest(m: &mut TestMount, name: &str) -> usize {
    let manifest = fs::read_to_string(fixture(name)).expect("read manifest");
    let mut revs: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let mut rows = 0;
    for line in manifest.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split(' ').collect();
        let p = m.path(f[1]);
        let meta = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{line}: {e}"));
        match f[0] {
            "dir" => {
                assert!(meta.is_dir(), "{line}: not a directory");
                let mode = u32::from_str_radix(f[2], 8).expect("octal mode");
                assert_eq!(meta.permissions().mode() & 0o7777, mode, "{line}");
            }
            "file" => {
                assert!(meta.is_file(), "{line}: not a regular file");
                assert_eq!(meta.len().to_string(), f[3], "{line}: size");
                assert_eq!(sha256(&p), f[2], "{line}: bytes differ");
            }
            "link" => {
                assert_eq!(
                    fs::read_link(&p).expect("readlink"),
                    Path::new(f[2]),
                    "{line}"
                );
            }
            "fifo" => assert!(meta.file_type().is_fifo(), "{line}: not a fifo"),
            "xattr" => {
                assert_eq!(
                    getxattr(&p, f[2]).as_deref(),
                    Some(f[3].as_bytes()),
                    "{line}"
                );
            }
            "rev" => {
                let (id, size) = (f[2].parse().expect("id"), f[4].parse().expect("size"));
                let v = m.view_path(f[1], id);
                assert_eq!(sha256(&v), f[3], "{line}: revision bytes differ");
                revs.entry(f[1].to_string()).or_default().push((id, size));
            }
            other => panic!("unknown manifest row kind {other:?}"),
        }
        rows += 1;
    }
    // Each listing holds exactly the revisions the old build listed.
    for (rel, want) in &revs {
        let got: Vec<(u64, u64)> = m.revisions(rel).iter().map(|r| (r.id, r.size)).collect();
        assert_eq!(&got, want, "revisions of {rel}");
    }
    rows
}

fn check_clean(m: &mut TestMount) {
    let mnt = m.mnt().to_path_buf();
    let out = m.ckptfs_ok(&[OsStr::new("check"), mnt.as_os_str()]);
    assert!(
        out.contains("clean") || out.contains("no problems"),
        "check: {out}"
    );
}

#[test]
fn a_space_of_the_first_format_mounts_reads_and_takes_new_revisions() {
    let mut m = TestMount::from_archive(&fixture("golden-v1.tar.gz"));
    let rows = check_manifest(&mut m, "golden-v1.manifest");
    assert!(rows >= 18, "the manifest lost rows: {rows}");
    // Sparse stays sparse: 64 KiB of data in a 2 MiB file.
    let sparse = fs::metadata(m.path("ckpt/sparse.bin")).expect("stat");
    assert!(
        sparse.blocks() * 512 < 256 * 1024,
        "sparse.bin has {} blocks",
        sparse.blocks()
    );
    check_clean(&mut m);

    // The old space takes a new revision, gc and a remount; everything else is as it was.
    let before: Vec<u64> = m
        .revisions("ckpt/optimizer.pt")
        .iter()
        .map(|r| r.id)
        .collect();
    // A space of two segments (16 MiB) after a remount: one holds the live data, the other
    // is gc's reserve. Writers must still get room once gc compacted (they were refused
    // with ENOSPC and 15 MiB free before the allocator fix that came with this test).
    fs::write(m.path("ckpt/optimizer.pt"), vec![7u8; 50_000]).expect("write new revision");
    m.gc(false);
    m.remount();
    assert!(
        fs::read(m.path("ckpt/optimizer.pt")).expect("read") == vec![7u8; 50_000],
        "the new revision of optimizer.pt did not read back after gc and a remount"
    );
    let after: Vec<u64> = m
        .revisions("ckpt/optimizer.pt")
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        after.len(),
        before.len(),
        "keep-revisions 3 still holds: {after:?}"
    );
    assert_eq!(
        &after[..2],
        &before[1..],
        "the oldest revision went, the others stayed"
    );
    for rel in [
        "ckpt/step-1/model.bin",
        "ckpt/step-2/model.bin",
        "logs/train.log",
    ] {
        assert!(!m.revisions(rel).is_empty(), "{rel} lost its revisions");
    }
    check_clean(&mut m);
}

#[test]
fn a_space_of_two_slots_mounts_reads_and_takes_new_revisions() {
    let mut m = TestMount::from_archive(&fixture("golden-slots-v1.tar.gz"));
    let rows = check_manifest(&mut m, "golden-slots-v1.manifest");
    assert!(rows >= 18, "the manifest lost rows: {rows}");
    check_clean(&mut m);
    // A revision over the file the other node wrote last, read back after a remount, beside
    // everything else as it was.
    let data = ckptfs_tests::pattern(77, 100_000);
    fs::write(m.path("ckpt/optimizer.pt"), &data).expect("write new revision");
    m.remount();
    assert!(
        fs::read(m.path("ckpt/optimizer.pt")).expect("read") == data,
        "the new revision of optimizer.pt did not read back after a remount"
    );
    let manifest = fs::read_to_string(fixture("golden-slots-v1.manifest")).expect("manifest");
    for line in manifest.lines().filter(|l| l.starts_with("file ")) {
        let f: Vec<&str> = line.split(' ').collect();
        if f[1] != "ckpt/optimizer.pt" {
            assert_eq!(sha256(&m.path(f[1])), f[2], "{line}");
        }
    }
    check_clean(&mut m);
}

/// Where `golden-targets-v1` was made and must be unpacked: its targets table names the
/// targets by these absolute paths (`tests/fixtures/make-golden-space.sh targets`).
const GOLDEN_TARGETS_ROOT: &str = "/tmp/ckptfs-golden-targets-v1";

#[test]
fn a_space_of_two_slots_over_erasure_coded_targets_mounts_reads_and_takes_new_revisions() {
    let mut m = TestMount::from_archive_at(
        &fixture("golden-targets-v1.tar.gz"),
        Path::new(GOLDEN_TARGETS_ROOT),
    );
    let rows = check_manifest(&mut m, "golden-targets-v1.manifest");
    assert!(rows >= 18, "the manifest lost rows: {rows}");
    check_clean(&mut m);
    // The targets as the space recorded them: all three, none failed.
    let mnt = m.mnt().to_path_buf();
    let targets = m.ckptfs_json(&[OsStr::new("targets"), mnt.as_os_str(), OsStr::new("--json")]);
    let list = targets["targets"].as_array().expect("a list of targets");
    assert_eq!(list.len(), 3, "{targets}");
    // A revision over the file the other node wrote last, and a new file: erasure-coded on
    // the same targets, read back after a remount.
    let data = ckptfs_tests::pattern(78, 300_000);
    fs::write(m.path("ckpt/optimizer.pt"), &data).expect("write new revision");
    fs::write(m.path("ckpt/step-3.bin"), &data[..123_456]).expect("write new file");
    m.remount();
    assert!(
        fs::read(m.path("ckpt/optimizer.pt")).expect("read") == data,
        "the new revision of optimizer.pt did not read back after a remount"
    );
    assert!(
        fs::read(m.path("ckpt/step-3.bin")).expect("read") == data[..123_456],
        "the new file did not read back after a remount"
    );
    check_clean(&mut m);
}
