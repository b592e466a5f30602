//! What an application sees when the backing storage fails or the reserved space is full,
//! through a real mount. I/O faults are injected into the daemon's devices with
//! `CKPTFS_FAULTS` (engine `sim::parse_faults`); the crash/fault driver in fs/tests/crash.rs
//! covers the same paths exhaustively without FUSE.

use std::fs;
use std::io::{Read, Write};

use ckptfs_tests::{assert_file_eq, close_checked, pattern, write_file_checked, TestMount};

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// A failed fsync of the data file: the close that needed it fails with EIO, every later
/// write is refused (sticky), committed files keep reading, `ckptfs stats` and the log say
/// so, and after a remount everything committed before the failure is intact.
#[test]
fn failed_data_sync_is_reported_sticky_and_loses_nothing_committed() {
    let mut m = TestMount::with_format_args("1G", &[]);
    m.unmount();
    // Each close of a written file syncs the data file once: the third close fails.
    m.set_env("CKPTFS_FAULTS", "data:sync:2:EIO");
    m.mount();
    let a = pattern(1, 3 << 20);
    let b = pattern(2, 1 << 20);
    write_file_checked(&m.path("a"), &a).expect("first checkpoint");
    write_file_checked(&m.path("b"), &b).expect("second checkpoint");
    let err = write_file_checked(&m.path("c"), &pattern(3, 2 << 20))
        .expect_err("the close whose data sync failed must fail");
    assert_eq!(
        errno_of(&err),
        libc::EIO,
        "close after a failed sync: {err}"
    );

    // Sticky: nothing more is acknowledged, even though the device works again.
    let again = write_file_checked(&m.path("d"), b"after the failure");
    assert!(again.is_err(), "a write was accepted after a failed sync");
    let again = write_file_checked(&m.path("a"), b"overwrite after the failure");
    assert!(
        again.is_err(),
        "an overwrite was accepted after a failed sync"
    );
    // Reads of committed data keep working.
    assert_file_eq(&m.path("a"), &a);
    assert_file_eq(&m.path("b"), &b);
    let s = m.stats();
    assert!(s.stats.failed, "stats must report the failed state: {s}");
    let log = fs::read_to_string(m.backing().join("daemon.log")).unwrap_or_default();
    assert!(
        log.contains("refusing further writes"),
        "the daemon log does not report the failure:\n{log}"
    );
    let (_, out, _) = m.ckptfs(&[
        std::ffi::OsStr::new("stats"),
        m.mnt().as_os_str().to_owned().as_os_str(),
    ]);
    assert!(
        out.contains("FAILED"),
        "`ckptfs stats` does not say FAILED:\n{out}"
    );

    m.unmount();
    m.set_env("CKPTFS_FAULTS", "");
    m.mount();
    assert_file_eq(&m.path("a"), &a);
    assert_file_eq(&m.path("b"), &b);
    // c's data never became durable: if its name survived, it holds no bytes of the
    // failed save (never a mix).
    if let Ok(got) = fs::read(m.path("c")) {
        assert!(
            got.is_empty(),
            "c holds {} bytes of a failed save",
            got.len()
        );
    }
    write_file_checked(&m.path("e"), b"writes work after remount").expect("write after remount");
    assert!(!m.stats().stats.failed);
}

/// A failed write into the journal (a close's durable record) or, on a space without one,
/// into the metadata table fails that close and makes the space refuse writes, like a
/// failed data write.
#[test]
fn failed_metadata_write_fails_the_close_and_is_sticky() {
    // The journal of a single-slot space.
    failed_metadata_write_case(&[], "journal:write:0:EIO:sticky");
}

/// The metadata table written by a journal's checkpoint (at unmount): the space fails, and
/// the next mount applies the journal, so the close it acknowledged is there.
#[test]
fn failed_table_write_at_a_checkpoint_loses_no_close() {
    let mut m = TestMount::with_format_args("1G", &[]);
    let a = pattern(13, 1 << 20);
    write_file_checked(&m.path("a"), &a).expect("first checkpoint");
    m.unmount();
    m.set_env("CKPTFS_FAULTS", "meta:write:0:EIO:sticky");
    m.mount();
    // Durable through the journal: the table is first written by the unmount's checkpoint.
    let b = pattern(14, 1 << 20);
    write_file_checked(&m.path("b"), &b).expect("a close durable through the journal");
    // The checkpoint fails (and `ckptfs umount` says so); the journal still has `b`.
    m.unmount();
    m.set_env("CKPTFS_FAULTS", "");
    m.mount();
    assert_file_eq(&m.path("a"), &a);
    assert_file_eq(&m.path("b"), &b);
}

fn failed_metadata_write_case(format_args: &[&str], fault: &str) {
    let mut m = TestMount::with_format_args("1G", format_args);
    let a = pattern(11, 1 << 20);
    write_file_checked(&m.path("a"), &a).expect("first checkpoint");
    m.unmount();
    // Sticky from the first write after the space is open (fault counts start there).
    m.set_env("CKPTFS_FAULTS", fault);
    m.mount();
    let err = write_file_checked(&m.path("b"), &pattern(12, 1 << 20))
        .expect_err("a close whose metadata commit failed must fail");
    assert_eq!(errno_of(&err), libc::EIO, "{err}");
    assert!(write_file_checked(&m.path("c"), b"more").is_err());
    assert_file_eq(&m.path("a"), &a);
    assert!(m.stats().stats.failed);
    m.unmount();
    m.set_env("CKPTFS_FAULTS", "");
    m.mount();
    assert_file_eq(&m.path("a"), &a);
    write_file_checked(&m.path("d"), b"ok").expect("write after remount");
}

/// Failed reads of the data file are errors for those reads only: the reader gets EIO, never
/// other bytes; the space keeps taking writes and is not marked failed; once the device
/// reads again (remount without the fault), the data is all there. (A single failed read is
/// not visible to the application at all: the kernel retries a failed readahead with a read
/// of its own, which then succeeds; so this test fails every read of the data file.)
#[test]
fn failed_data_reads_are_errors_for_those_reads_only() {
    let mut m = TestMount::with_format_args("1G", &[]);
    let a = pattern(21, 4 << 20);
    write_file_checked(&m.path("a"), &a).expect("write");
    m.unmount();
    m.set_env("CKPTFS_FAULTS", "data:read:0:EIO:sticky");
    m.mount();
    let mut f = fs::File::open(m.path("a")).expect("open");
    let mut buf = vec![0u8; 1 << 20];
    let e = f
        .read(&mut buf)
        .expect_err("a read of a failing device must fail");
    assert_eq!(errno_of(&e), libc::EIO, "{e}");
    drop(f);
    write_file_checked(&m.path("b"), b"still writable").expect("write after read errors");
    assert!(
        !m.stats().stats.failed,
        "read errors must not fail the space"
    );
    m.unmount();
    m.set_env("CKPTFS_FAULTS", "");
    m.mount();
    assert_file_eq(&m.path("a"), &a);
    assert_file_eq(&m.path("b"), b"still writable");
}

/// A full reserved space: ENOSPC to the writer, the committed checkpoint intact, and the
/// space usable again once the failed file is removed.
#[test]
fn full_space_gives_enospc_keeps_committed_data_and_recovers() {
    let mut m = TestMount::with_format_args("64M", &["--keep-revisions", "1"]);
    let a = pattern(31, 24 << 20);
    write_file_checked(&m.path("a"), &a).expect("first checkpoint fits");
    // 64 MiB of new random data cannot fit next to a.
    let big = pattern(32, 64 << 20);
    let mut f = fs::File::create(m.path("big")).expect("create");
    let mut res = Ok(());
    for piece in big.chunks(1 << 20) {
        res = f.write_all(piece);
        if res.is_err() {
            break;
        }
    }
    let res = res.and_then(|_| close_checked(f));
    let err = res.expect_err("writing more than the space holds must fail");
    assert_eq!(errno_of(&err), libc::ENOSPC, "{err}");
    assert_file_eq(&m.path("a"), &a);
    assert!(!m.stats().stats.failed, "a full space is not a failed one");

    fs::remove_file(m.path("big")).expect("unlink the failed file");
    let g = m.gc(false);
    println!("gc after unlink: {g}");
    let c = pattern(33, 16 << 20);
    write_file_checked(&m.path("c"), &c).expect("the space takes writes again after unlink + gc");
    m.remount();
    assert_file_eq(&m.path("a"), &a);
    assert_file_eq(&m.path("c"), &c);
    let s = m.stats();
    assert!(s.stats.free_bytes > 0, "{s}");
}
