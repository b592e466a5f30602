//! What a close costs in durable operations, counted by the engine (`Stats::commits`:
//! `durable` metadata transactions, `publications` of a multi-slot space's manifest).
//!
//! A durable close is one durable commit: the revision, the name record and (on a multi-slot
//! space) the truncate an O_TRUNC open made ride in one grouped transaction, followed on a
//! multi-slot space by one manifest write; a namespace sync that arrives while a commit is
//! gathering rides in its transaction. Counted, not timed: these hold on a busy machine.

use ckptfs_engine::format::{InodeId, SlotId};
use ckptfs_engine::layout::Mode;
use ckptfs_engine::slots::SlotRequest;
use ckptfs_engine::space::{CommitTotals, Config};
use ckptfs_engine::Space;
use ckptfs_fs::{Caller, Fs, HandleId};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const ROOT: InodeId = InodeId::ROOT;
const ME: Caller = Caller { uid: 0, gid: 0 };
const PID: u32 = 4242;

static NEXT_FH: AtomicU64 = AtomicU64::new(1);
fn fh() -> HandleId {
    HandleId(NEXT_FH.fetch_add(1, Ordering::Relaxed))
}

fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ckptfs-close-cost-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn commits(fs: &Fs) -> CommitTotals {
    fs.space().report().stats().expect("stats").commits
}

/// Creates (or, existing, opens with O_TRUNC) `name`, writes `data`, closes, releases.
fn save(fs: &Fs, name: &str, data: &[u8]) {
    let h = fh();
    let ino = match fs.lookup(ROOT, name.as_bytes()) {
        Ok(a) => {
            fs.open(a.ino, h, true, true).expect("open O_TRUNC");
            a.ino
        }
        Err(_) => {
            fs.create(ROOT, name.as_bytes(), 0o644, ME, h, true, false, true)
                .expect("create")
                .ino
        }
    };
    assert_eq!(fs.write(ino, h, PID, 0, data).expect("write"), data.len());
    fs.flush(ino, h, PID).expect("close");
    fs.release(ino, h).expect("release");
}

fn read(fs: &Fs, name: &str) -> Vec<u8> {
    let a = fs.lookup(ROOT, name.as_bytes()).expect("lookup");
    let h = fh();
    fs.open(a.ino, h, false, false).expect("open to read");
    let b = fs.read(a.ino, h, 0, a.rec.size as usize + 1).expect("read");
    fs.release(a.ino, h).expect("release");
    b
}

fn slot(dir: &Path, n: u32) -> Fs {
    let req = SlotRequest {
        slot: Some(SlotId(n)),
        lease: Duration::from_secs(600),
        mountpoint: format!("/test-slot-{n}"),
        take_over: false,
    };
    let fs = Fs::new(Space::open_as(dir, &Mode::Mount(req)).expect("claim a slot"));
    fs.publish_all().expect("first publication");
    fs
}

/// One slot: every close of a new file, and every O_TRUNC rewrite of one, is exactly one
/// durable transaction (the create's name record rides in the close's commit).
#[test]
fn a_close_is_one_durable_commit() {
    let dir = fresh("one");
    Space::format(&dir, 256 << 20, 4096, Config::default(), false).expect("format");
    let fs = Fs::new(Space::open(&dir).expect("open"));
    let data = vec![7u8; 4096];
    for round in 0..2 {
        let before = commits(&fs);
        for i in 0..20 {
            save(&fs, &format!("f{i}"), &data);
        }
        let after = commits(&fs);
        assert_eq!(
            (after.durable - before.durable, after.files - before.files),
            (20, 20),
            "round {round} ({}): 20 closes, 20 durable commits",
            ["new files", "O_TRUNC rewrites"][round]
        );
    }
    drop(fs);
    let fs = Fs::new(Space::open(&dir).expect("reopen"));
    for i in 0..20 {
        assert_eq!(read(&fs, &format!("f{i}")), data, "f{i} after reopening");
    }
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two slots: slot 1 wrote a file; slot 0 opens it with O_TRUNC (a truncate of slot 1's
/// layer, recorded in slot 0's version record), rewrites and closes it, three times. Before,
/// the truncate was a durable transaction of its own ahead of the commit: two per close.
/// Now one, and one publication; and slot 1 reads exactly slot 0's new bytes.
#[test]
fn a_truncating_close_of_another_slots_file_is_one_commit_and_one_publication() {
    let dir = fresh("slots");
    Space::format_slots(&dir, 256 << 20, 4096, Config::default(), false, 2).expect("format");
    let s1 = slot(&dir, 1);
    let s0 = slot(&dir, 0);
    save(&s1, "shared", &vec![1u8; 3 * 4096]);
    s0.refresh_union().expect("slot 0 reads slot 1's manifest");
    for round in 0..3u8 {
        let data = vec![10 + round; 4096 + round as usize];
        let before = commits(&s0);
        save(&s0, "shared", &data);
        let after = commits(&s0);
        // The first open makes slot 0's layer of the file (a version record, published at
        // once like a create): one more of each, at the open.
        let layer = u64::from(round == 0);
        assert_eq!(
            (
                after.durable - before.durable,
                after.publications - before.publications
            ),
            (1 + layer, 1 + layer),
            "round {round}: one durable commit and one publication for the close"
        );
        s1.refresh_union().expect("slot 1 reads slot 0's manifest");
        assert_eq!(read(&s1, "shared"), data, "round {round}: slot 1 reads");
        assert_eq!(read(&s0, "shared"), data, "round {round}: slot 0 reads");
    }
    drop((s0, s1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// With the journal, a close makes every namespace change before it durable in its one
/// sync (they are records queued before its own), so a directory fsync right after it
/// costs nothing: two durable requests, one sync. (Without a journal, a multi-slot space's
/// slot, the directory fsync rides in a gathering commit's transaction instead:
/// `engine/tests/group_commit.rs` holds commits together.)
#[test]
fn a_namespace_sync_rides_in_a_gathering_commit() {
    let dir = fresh("ride");
    Space::format(&dir, 256 << 20, 4096, Config::default(), false).expect("format");
    let fs = Arc::new(Fs::new(Space::open(&dir).expect("open")));
    let h = fh();
    let a = fs
        .create(ROOT, b"f", 0o644, ME, h, true, false, true)
        .expect("create");
    fs.write(a.ino, h, PID, 0, &[3u8; 5000]).expect("write");
    // A second name, made after the file's create: not durable until a sync.
    fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    let before = commits(&fs);
    fs.flush(a.ino, h, PID).expect("close");
    fs.fsync_dir().expect("fsync of the directory");
    fs.release(a.ino, h).expect("release");
    let after = commits(&fs);
    assert!(after.journal, "a single-slot space has a journal");
    assert_eq!(
        (after.durable - before.durable, after.files - before.files),
        (1, 1),
        "a close and a directory fsync after it: one sync of the journal"
    );
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An untar's file: create, write, then `futimens`, `fchown` and `fchmod` on the open
/// descriptor, close. The three attribute changes are held for the close's commit
/// (`space::deferred`), and so is the create: one metadata transaction per file (the
/// close's commit), where each change, and the create, was one of its own before. The changes read back at once (open copy),
/// after the release (the engine's overlay, then the table) and after reopening. A file
/// opened for writing, changed and closed without a write commits its held changes at the
/// close (a durability point): one transaction.
#[test]
fn attribute_changes_of_a_file_being_written_ride_in_its_close() {
    let dir = fresh("untar");
    Space::format(&dir, 256 << 20, 4096, Config::default(), false).expect("format");
    let fs = Fs::new(Space::open(&dir).expect("open"));
    let stamp = ckptfs_engine::format::Timestamp {
        secs: 1_700_000_000,
        nanos: 5,
    };
    let set = |perm, uid| ckptfs_fs::SetAttr {
        perm: Some(perm),
        uid: Some(uid),
        mtime: Some(stamp),
        ..ckptfs_fs::SetAttr::default()
    };
    let txns = |fs: &Fs| fs.space().meta_mark();
    for i in 0..10u32 {
        let name = format!("u{i}");
        let before = txns(&fs);
        let h = fh();
        let ino = fs
            .create(ROOT, name.as_bytes(), 0o600, ME, h, true, true, false)
            .expect("create")
            .ino;
        fs.write(ino, h, PID, 0, &vec![i as u8; 5000])
            .expect("write");
        for s in [
            ckptfs_fs::SetAttr {
                mtime: Some(stamp),
                ..Default::default()
            },
            ckptfs_fs::SetAttr {
                uid: Some(1000 + i),
                gid: Some(1000),
                ..Default::default()
            },
            ckptfs_fs::SetAttr {
                perm: Some(0o640),
                ..Default::default()
            },
        ] {
            let a = fs.setattr(ino, &s).expect("setattr");
            assert_eq!(a.rec.perm & 0o7777, s.perm.unwrap_or(a.rec.perm & 0o7777));
        }
        let a = fs.getattr(ino).expect("getattr while open");
        assert_eq!(
            (a.rec.perm, a.rec.uid, a.rec.mtime),
            (0o640, 1000 + i, stamp)
        );
        fs.flush(ino, h, PID).expect("close");
        fs.release(ino, h).expect("release");
        // The first create of a mount is a transaction of its own, which reserves ids
        // for the next creates: each of those rides in its file's close.
        assert_eq!(
            txns(&fs) - before,
            if i == 0 { 2 } else { 1 },
            "{name}: the close's commit, nothing for the create and the three changes"
        );
        let a = fs.lookup(ROOT, name.as_bytes()).expect("lookup");
        assert_eq!((a.rec.perm, a.rec.uid, a.rec.gid), (0o640, 1000 + i, 1000));
    }
    // Opened for writing, changed, closed without a write: the close commits the change.
    let a = fs.lookup(ROOT, b"u0").expect("lookup");
    let h = fh();
    fs.open(a.ino, h, true, false).expect("open for writing");
    let before = txns(&fs);
    fs.setattr(a.ino, &set(0o604, 7)).expect("setattr");
    assert_eq!(txns(&fs), before, "held");
    fs.flush(a.ino, h, PID).expect("close");
    assert_eq!(txns(&fs) - before, 1, "the close commits what was held");
    fs.release(a.ino, h).expect("release");
    drop(fs);
    let fs = Fs::new(Space::open(&dir).expect("reopen"));
    for i in 0..10u32 {
        let a = fs.lookup(ROOT, format!("u{i}").as_bytes()).expect("lookup");
        let want = match i {
            0 => (0o604, 7),
            _ => (0o640, 1000 + i),
        };
        assert_eq!((a.rec.perm, a.rec.uid), want, "u{i} after reopening");
        assert_eq!(a.rec.mtime, stamp, "u{i} after reopening");
        assert_eq!(read(&fs, &format!("u{i}")), vec![i as u8; 5000]);
    }
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With another file's create and chmod held (it is still being written), a new file's
/// close is still one transaction and one durable commit: its transaction applies what is
/// held first (so the table keeps a prefix of the changes), and no second one is made for
/// them. The other file's close is one durable commit too, and both read back after
/// reopening with the held mode.
#[test]
fn a_close_takes_what_another_writer_holds_into_its_own_transaction() {
    let dir = fresh("others");
    Space::format(&dir, 256 << 20, 4096, Config::default(), false).expect("format");
    let fs = Fs::new(Space::open(&dir).expect("open"));
    // The mount's first create reserves ids for the next ones.
    save(&fs, "first", b"1");
    let h = fh();
    let other = fs
        .create(ROOT, b"other", 0o600, ME, h, true, true, false)
        .expect("create")
        .ino;
    fs.write(other, h, PID, 0, b"still writing").expect("write");
    let chmod = ckptfs_fs::SetAttr {
        perm: Some(0o640),
        ..Default::default()
    };
    fs.setattr(other, &chmod).expect("chmod");
    let mark = fs.space().meta_mark();
    let before = commits(&fs);
    save(&fs, "mine", &[5u8; 3000]);
    let after = commits(&fs);
    assert_eq!(
        (
            after.durable - before.durable,
            fs.space().meta_mark() - mark
        ),
        (1, 1),
        "one durable commit, one transaction"
    );
    assert_eq!(read(&fs, "mine"), vec![5u8; 3000]);
    fs.flush(other, h, PID).expect("close");
    fs.release(other, h).expect("release");
    assert_eq!(commits(&fs).durable - after.durable, 1, "its own close");
    drop(fs);
    let fs = Fs::new(Space::open(&dir).expect("reopen"));
    assert_eq!(read(&fs, "other"), b"still writing");
    let a = fs.lookup(ROOT, b"other").expect("lookup");
    assert_eq!(a.rec.perm & 0o7777, 0o640);
    assert_eq!(read(&fs, "mine"), vec![5u8; 3000]);
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}
