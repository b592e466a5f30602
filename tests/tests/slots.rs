//! Multi-slot spaces (`format --slots N`): several daemons on one machine stand in for
//! several nodes sharing one backing directory. Each mount claims a slot and renews its
//! lease; a dead node's slot is taken over once its lease has run out, with its committed
//! checkpoints intact; a frozen owner that comes back is fenced and writes nothing visible.

use ckptfs_tests::cluster::Cluster;
use ckptfs_tests::{assert_file_eq, close_checked, pattern, run_ckptfs, TempDir, TestMount};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::time::Duration;

/// Long enough that a loaded CI machine never misses a renewal (every quarter lease; a
/// mount fences itself only after a whole lease without one).
const LEASE: Duration = Duration::from_secs(2);

#[test]
fn nodes_claim_distinct_slots_and_a_released_slot_is_claimed_again() {
    let mut c = Cluster::new(4, "512M", 5, LEASE);
    let mut slots = Vec::new();
    for n in 0..4 {
        slots.push(c.mount(n, &[]));
        fs::write(c.path(n, &format!("own-{n}")), pattern(n as u64, 300_000)).expect("write");
    }
    slots.sort();
    assert_eq!(slots, vec![0, 1, 2, 3], "each mount claims its own slot");
    for n in 0..4 {
        assert_file_eq(&c.path(n, &format!("own-{n}")), &pattern(n as u64, 300_000));
    }
    let rows = c.slots();
    let held: Vec<_> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "held")
        .collect();
    assert_eq!(held.len(), 4, "{rows:#}");
    let pids: std::collections::BTreeSet<_> = held.iter().map(|r| r["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 4, "four daemons: {rows:#}");

    // A fifth node finds every slot held, and is told by whom.
    let (st, out, err) = c.try_mount(4, &[]);
    assert!(!st.success(), "a fifth mount of a 4-slot space: {out}{err}");
    assert!(
        err.contains("every one of the 4 slots") && err.contains(" pid "),
        "the refusal names the holders: {err}"
    );

    // A released slot goes to the next mount, with what it held.
    let freed = c.slot_of(1);
    c.unmount(1);
    let row = &c.slots()[freed as usize];
    assert_eq!(row["state"], "released", "{row:#}");
    assert!(
        row["used_bytes"].as_u64().unwrap() >= 300_000,
        "the released header says what the slot holds: {row:#}"
    );
    let epoch = row["epoch"].as_u64().unwrap();
    assert_eq!(c.mount(4, &[]), freed);
    assert_eq!(
        c.slots()[freed as usize]["epoch"].as_u64().unwrap(),
        epoch + 1,
        "every claim bumps the epoch"
    );
    assert_file_eq(&c.path(4, "own-1"), &pattern(1, 300_000));
}

#[test]
fn slot_requests_that_cannot_be_met_are_refused_clearly() {
    let mut c = Cluster::new(2, "256M", 3, LEASE);
    let (st, _, err) = c.try_mount(0, &["--slot", "2"]);
    assert!(!st.success());
    assert!(
        err.contains("slot 2 does not exist") && err.contains("2 slots (0 to 1)"),
        "{err}"
    );
    c.mount(0, &["--slot", "1"]);
    let pid = c.nodes[0].pid.unwrap();
    let (st, _, err) = c.try_mount(1, &["--slot", "1"]);
    assert!(!st.success(), "a slot held by a live mount");
    assert!(
        err.contains("slot 1 is held by a live mount") && err.contains(&format!("pid {pid}")),
        "the refusal names the holder: {err}"
    );
    // The other slot is still there for a mount that does not name one.
    assert_eq!(c.mount(1, &[]), 0);
    let (st, _, err) = c.try_mount(2, &["--lease", "100ms"]);
    assert!(!st.success() && err.contains("below the minimum"), "{err}");
    // Offline commands on the backing directory would act on some node's slot: refused,
    // pointing to the mounts.
    for cmd in ["stats", "gc", "check", "config"] {
        let (st, _, err) = c.ckptfs(&[cmd.into(), c.backing.clone().into()]);
        assert!(
            !st.success() && err.contains("has 2 slots") && err.contains("ckptfs slots"),
            "{cmd} of a multi-slot backing dir: {err}"
        );
    }

    let tmp = TempDir::new("slots-format");
    let dir = tmp.path().join("s");
    for (args, want) in [
        (vec!["--size", "256M", "--slots", "0"], "out of range"),
        (
            vec!["--size", "64M", "--slots", "8"],
            "need at least 2 each",
        ),
    ] {
        let mut a = vec![OsStr::new("format"), dir.as_os_str()];
        a.extend(args.iter().map(OsStr::new));
        let (st, _, err) = run_ckptfs(tmp.path(), "format", &a);
        assert!(!st.success() && err.contains(want), "{args:?}: {err}");
        assert!(
            !dir.join("superblock").exists(),
            "a refused format makes no space"
        );
    }

    // A single-slot space: one mount at a time, and no slots to list or name.
    let mut m = TestMount::new();
    let (st, _, err) = m.ckptfs(&[OsStr::new("slots"), m.backing().to_path_buf().as_os_str()]);
    assert!(!st.success() && err.contains("single slot"), "{err}");
    let other = m.root().join("second");
    fs::create_dir(&other).unwrap();
    let backing = m.backing().to_path_buf();
    let (st, _, err) = m.ckptfs(&[OsStr::new("mount"), backing.as_os_str(), other.as_os_str()]);
    assert!(!st.success() && err.contains("in use"), "{err}");
    m.unmount();
    let mnt = m.mnt().to_path_buf();
    let (st, _, err) = m.ckptfs(&[
        OsStr::new("mount"),
        OsStr::new("--slot"),
        OsStr::new("1"),
        backing.as_os_str(),
        mnt.as_os_str(),
    ]);
    assert!(!st.success() && err.contains("has one slot"), "{err}");
}

/// kill -9 of a node mid-checkpoint: its slot is refused while the lease runs, then taken
/// over; every checkpoint the slot committed reads back, and the interrupted one is whole
/// or absent.
#[test]
fn a_dead_nodes_slot_is_taken_over_with_its_committed_checkpoints() {
    let mut c = Cluster::new(2, "512M", 2, LEASE);
    let slot = c.mount(0, &[]);
    fs::create_dir(c.path(0, "step-1")).unwrap();
    for r in 0..4u64 {
        fs::write(c.path(0, &format!("step-1/rank-{r}")), pattern(r, 1 << 20)).unwrap();
    }
    // Step 2 is being written when the node dies: one file closed, one half written.
    fs::create_dir(c.path(0, "step-2")).unwrap();
    fs::write(c.path(0, "step-2/rank-0"), pattern(20, 1 << 20)).unwrap();
    let mut open = fs::File::create(c.path(0, "step-2/rank-1")).unwrap();
    open.write_all(&pattern(21, 1 << 19)).unwrap();
    c.kill(0);
    drop(open);

    let (st, _, err) = c.try_mount(1, &["--slot", &slot.to_string()]);
    assert!(
        !st.success() && err.contains("can be taken over once that lease has run out"),
        "the dead node's lease still runs: {err}"
    );
    c.wait_lease_out();
    assert_eq!(c.mount(1, &["--slot", &slot.to_string()]), slot);
    assert!(
        c.log_tail().contains(&format!("took over slot {slot}")),
        "the takeover is logged"
    );
    for r in 0..4u64 {
        assert_file_eq(
            &c.path(1, &format!("step-1/rank-{r}")),
            &pattern(r, 1 << 20),
        );
    }
    assert_file_eq(&c.path(1, "step-2/rank-0"), &pattern(20, 1 << 20));
    // Never mixed: the unclosed file is absent, empty (its create committed) or whole.
    match fs::read(c.path(1, "step-2/rank-1")) {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        Ok(b) => assert!(
            b.is_empty() || b == pattern(21, 1 << 19),
            "the interrupted file is neither absent nor whole: {} bytes",
            b.len()
        ),
    }
    let (st, out, err) = c.ckptfs(&["check".into(), c.nodes[1].mnt.clone().into()]);
    assert!(st.success(), "check after takeover: {out}{err}");
}

/// A frozen owner (SIGSTOP) loses its slot to a takeover; when it comes back its commits
/// fail, nothing it writes becomes visible, and the new owner's data is intact.
#[test]
fn a_frozen_owner_that_lost_its_slot_is_fenced() {
    let mut c = Cluster::new(2, "512M", 3, LEASE);
    let slot = c.mount(0, &[]).to_string();
    fs::write(c.path(0, "before"), pattern(1, 1 << 20)).unwrap();
    c.freeze(0);
    c.wait_lease_out();
    c.mount(1, &["--slot", &slot]);
    assert_file_eq(&c.path(1, "before"), &pattern(1, 1 << 20));
    fs::write(c.path(1, "by-new-owner"), pattern(2, 3 << 20)).unwrap();
    c.resume(0);

    // The old owner's writes: a new file, a rewrite, an unlink. Each fails at its commit
    // (or earlier); none may reach the slot.
    let write_close = |p: std::path::PathBuf, data: Vec<u8>| -> std::io::Result<()> {
        let mut f = fs::File::create(p)?;
        f.write_all(&data)?;
        close_checked(f)
    };
    let new = write_close(c.path(0, "by-old-owner"), pattern(3, 2 << 20));
    assert!(new.is_err(), "a fenced owner's close must fail");
    let _ = write_close(c.path(0, "before"), pattern(4, 1 << 20));
    let _ = fs::remove_file(c.path(0, "before"));
    let rows = c.slots();
    assert_eq!(
        rows[slot.parse::<usize>().unwrap()]["pid"].as_u64(),
        c.nodes[1].pid.map(u64::from)
    );
    assert!(
        c.log_tail()
            .contains("writes nothing more and fails every write"),
        "the fenced owner says why: {}",
        c.log_tail()
    );

    for node in [1, 2] {
        if node == 2 {
            // From the slot as stored: a fresh claim after the new owner's unmount.
            c.unmount(1);
            c.mount(2, &["--slot", &slot]);
        }
        assert_file_eq(&c.path(node, "before"), &pattern(1, 1 << 20));
        assert_file_eq(&c.path(node, "by-new-owner"), &pattern(2, 3 << 20));
        assert!(
            !c.path(node, "by-old-owner").exists(),
            "the fenced owner's file became visible"
        );
    }
    let (st, out, err) = c.ckptfs(&["check".into(), c.nodes[2].mnt.clone().into()]);
    assert!(st.success(), "check: {out}{err}");
    c.unmount(0);
}
