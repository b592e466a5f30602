//! The command line around the mount: chunk size at format time, format/mount refusing to
//! clobber or double-mount a space, and a mount waiting for a daemon that is still exiting.

use std::ffi::OsStr;
use std::fs;

use ckptfs_tests::{assert_file_eq, pattern, TempDir, TestMount};

#[test]
fn chunk_size_option_changes_chunking_and_data_roundtrips() {
    let data = pattern(0xc5, 8 << 20);
    let mut chunks = Vec::new();
    for cs in ["16K", "1M"] {
        let mut m = TestMount::with_options("1G", Some(cs));
        fs::write(m.path("ckpt"), &data).expect("write");
        let s = m.stats();
        println!("--chunk-size {cs}: {s}");
        chunks.push(s.stats.chunks);
        m.remount();
        assert_file_eq(&m.path("ckpt"), &data);
    }
    assert!(
        chunks[0] > chunks[1],
        "8 MiB stored as {} chunks with --chunk-size 16K but {} with 1M",
        chunks[0],
        chunks[1]
    );
}

#[test]
fn format_and_mount_refuse_to_clobber_or_double_mount() {
    let mut m = TestMount::new();
    fs::write(m.path("precious"), b"keep me").expect("write");
    let backing = m.backing().as_os_str().to_os_string();
    let other = TempDir::new("other-mnt");

    let (st, _, _) = m.ckptfs(&[OsStr::new("mount"), &backing, other.path().as_os_str()]);
    if st.success() {
        m.ckptfs(&[OsStr::new("umount"), other.path().as_os_str()]);
        panic!("a second mount of a mounted space must fail, but it succeeded");
    }
    let (st, _, _) = m.ckptfs(&[
        OsStr::new("format"),
        &backing,
        OsStr::new("--size"),
        OsStr::new("1G"),
        OsStr::new("--force"),
    ]);
    assert!(!st.success(), "format --force of a mounted space must fail");
    assert_file_eq(&m.path("precious"), b"keep me");

    m.unmount();
    let (st, _, _) = m.ckptfs(&[
        OsStr::new("format"),
        &backing,
        OsStr::new("--size"),
        OsStr::new("1G"),
    ]);
    assert!(
        !st.success(),
        "format of an existing space without --force must fail"
    );
    m.mount();
    assert_file_eq(&m.path("precious"), b"keep me");

    m.unmount();
    let (st, out, err) = m.ckptfs(&[
        OsStr::new("format"),
        &backing,
        OsStr::new("--size"),
        OsStr::new("1G"),
        OsStr::new("--force"),
    ]);
    assert!(
        st.success(),
        "format --force of an unmounted space: {st}\n{out}\n{err}"
    );
    m.mount();
    let names: Vec<_> = fs::read_dir(m.mnt()).expect("read_dir").collect();
    assert!(
        names.is_empty(),
        "a re-formatted space is empty, found {} entries",
        names.len()
    );
}

/// A mount started while the previous daemon of the space is unmounted but still exiting
/// (here: kept alive by a descriptor open in its lazily detached mount) waits for it, saying
/// so, instead of refusing the space as "in use".
#[test]
fn mount_waits_for_a_daemon_that_is_still_exiting() {
    let mut m = TestMount::new();
    fs::write(m.path("kept"), b"still here").expect("write");
    let held = fs::File::open(m.path("kept")).expect("open");
    m.lazy_unmount();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        drop(held);
    });
    m.mount();
    releaser.join().unwrap();
    assert_file_eq(&m.path("kept"), b"still here");
}
