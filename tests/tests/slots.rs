//! Multi-slot spaces (`format --slots N`): several daemons on one machine stand in for
//! several nodes sharing one backing directory. Each mount claims a slot and renews its
//! lease; a dead node's slot is taken over once its lease has run out, with its committed
//! checkpoints intact; a frozen owner that comes back is fenced and writes nothing visible.

use ckptfs_tests::cluster::Cluster;
use ckptfs_tests::{assert_file_eq, close_checked, pattern, run_ckptfs, TempDir, TestMount};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::process::Command;
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

    // A second mount on a live mount's mountpoint is refused, naming the holder.
    let (st, out, err) = c.try_mount(0, &[]);
    assert!(
        !st.success() && err.contains("already holds a ckptfs mount") && err.contains("pid"),
        "a mount stacked on a live one: {out}{err}"
    );
    assert_file_eq(&c.path(0, "own-0"), &pattern(0, 300_000));

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
    // stats: the mount's own slot, every slot's line and the whole space's totals; of the
    // backing directory, the latter only.
    let (st, out, err) = c.ckptfs(&[
        "stats".into(),
        c.nodes[0].mnt.clone().into(),
        "--json".into(),
    ]);
    assert!(st.success(), "stats of a mount: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stats json");
    assert_eq!(v["files"].as_u64(), Some(1), "node 0's own slot: {v:#}");
    assert_eq!(v["space"]["held"].as_u64(), Some(3), "{v:#}");
    assert_eq!(v["slots"].as_array().map(|a| a.len()), Some(4), "{v:#}");
    let (st, out, err) = c.ckptfs(&["stats".into(), c.backing.clone().into(), "--json".into()]);
    assert!(st.success(), "stats of the backing directory: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stats json");
    assert!(
        v["space"]["used_bytes"].as_u64().unwrap() >= 300_000,
        "the totals add up the slots (the released one's at least): {v:#}"
    );
    assert_eq!(c.mount(4, &[]), freed);
    assert_eq!(
        c.slots()[freed as usize]["epoch"].as_u64().unwrap(),
        epoch + 1,
        "every claim bumps the epoch"
    );
    assert_file_eq(&c.path(4, "own-1"), &pattern(1, 300_000));

    // Unmounted, check and gc of the backing directory cover every slot.
    for n in [0, 2, 3, 4] {
        c.unmount(n);
    }
    let (st, out, err) = c.ckptfs(&["check".into(), c.backing.clone().into(), "--json".into()]);
    assert!(st.success(), "offline check of every slot: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("check json");
    assert_eq!(v["clean"], true, "{v:#}");
    assert_eq!(v["slots"].as_array().map(|a| a.len()), Some(4), "{v:#}");
    let (st, out, err) = c.ckptfs(&["gc".into(), c.backing.clone().into(), "--json".into()]);
    assert!(st.success(), "offline gc of every slot: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("gc json");
    assert_eq!(v["slots"].as_array().map(|a| a.len()), Some(4), "{v:#}");
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
    let (st, _, err) = c.ckptfs(&["config".into(), c.backing.clone().into()]);
    assert!(
        !st.success() && err.contains("has 2 slots") && err.contains("ckptfs slots"),
        "config of a multi-slot backing dir: {err}"
    );
    // gc and check of the backing directory leave slots that live mounts hold to them.
    for cmd in ["gc", "check"] {
        let (st, out, err) = c.ckptfs(&[cmd.into(), c.backing.clone().into()]);
        assert!(
            !st.success() && out.contains(&format!("run `ckptfs {cmd}` through that mount")),
            "{cmd} of a multi-slot backing dir with live mounts: {out}{err}"
        );
    }

    let tmp = TempDir::new("slots-format");
    let dir = tmp.path().join("s");
    for (args, want) in [
        (vec!["--size", "256M", "--slots", "0"], "out of range"),
        (
            vec!["--size", "64M", "--slots", "8"],
            "need at least 4 each",
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
    c.wait_lease_out(slot);
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
    c.wait_lease_out(slot.parse().unwrap());
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
    let said = c.unmount_failing(0);
    assert!(said.contains("lost its slot"), "{said}");
}

/// Polls `cond` until it holds (an event: a process state, a log line, a header on disk),
/// failing after `limit`.
fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The epochs of a slot's two header copies (None: a copy never written).
fn header_epochs(pair: &[u8], slot: u32) -> [Option<u64>; 2] {
    use ckptfs_engine::format::{SlotHeader, SlotId};
    [0, 1].map(|c| {
        SlotHeader::decode(&pair[c * 4096..(c + 1) * 4096], SlotId(slot))
            .expect("a header copy that decodes")
            .map(|h| h.epoch)
    })
}

/// A daemon frozen inside a lease renewal, between reading its slot header and writing it
/// (the fault point `CKPTFS_FAULT_STOP_IN_RENEWAL`), writes no header once it resumes after
/// its lease ran out and a taker claimed the slot: it finds itself fenced first, both of
/// the slot's header copies stay the taker's, and `ckptfs umount` of the fenced mount
/// fails, saying what was not made durable.
#[test]
fn a_daemon_frozen_inside_its_renewal_never_writes_over_the_taker() {
    let mut c = Cluster::new(2, "512M", 2, LEASE);
    let arm = c.root().join("arm-the-fault-point");
    let (st, out, err) = c.try_mount_env(
        0,
        &["--slot", "0"],
        &[("CKPTFS_FAULT_STOP_IN_RENEWAL", arm.to_str().unwrap())],
    );
    assert!(st.success(), "mount node 0: {out}{err}");
    fs::write(c.path(0, "before"), pattern(1, 100_000)).unwrap();
    // The next renewal stops the daemon between its header read and its header write.
    fs::write(&arm, b"").unwrap();
    wait_until(
        "node 0 to stop inside a renewal",
        Duration::from_secs(30),
        || c.is_stopped(0),
    );
    c.stopped_by_fault(0);
    c.wait_lease_out(0);
    c.mount(1, &["--slot", "0"]);
    // The taker's claim writes one copy, its first renewal the other.
    wait_until(
        "both header copies to be the taker's",
        Duration::from_secs(30),
        || header_epochs(&c.header_pair(0), 0) == [Some(2), Some(2)],
    );
    c.resume(0);
    // Watched from the resume until the old owner says it is fenced: a header it wrote
    // would show in one copy only until the taker's next renewal writes that copy again.
    let log = c.backing.join("daemon.log");
    let start = std::time::Instant::now();
    let mut stale = Vec::new();
    loop {
        let epochs = header_epochs(&c.header_pair(0), 0);
        if epochs.contains(&Some(1)) && stale.len() < 3 {
            stale.push(format!("{:?} after {:?}", epochs, start.elapsed()));
        }
        if fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("writes nothing more")
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "node 0 never said it is fenced"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        stale.is_empty(),
        "the fenced owner wrote its header over the taker's: {stale:?}"
    );
    assert!(
        fs::write(c.path(0, "after"), b"x").is_err(),
        "a fenced owner's write must fail"
    );
    assert_eq!(
        header_epochs(&c.header_pair(0), 0),
        [Some(2), Some(2)],
        "the fenced owner wrote a header over the taker's"
    );
    assert_file_eq(&c.path(1, "before"), &pattern(1, 100_000));
    assert!(!c.path(1, "after").exists());
    let said = c.unmount_failing(0);
    assert!(
        said.contains("not everything is durable"),
        "umount of a fenced mount must say why: {said}"
    );
    let (st, out, err) = c.ckptfs(&["check".into(), c.nodes[1].mnt.clone().into()]);
    assert!(st.success(), "check: {out}{err}");
}

/// A mount of a multi-slot space probes that another live node sees its writes (it
/// echoes a nonce the mount writes): answered at once by a running node; refused, naming
/// the holder, while the only other live node is stopped (it could not answer, as a node
/// behind an incoherent client cache could not); `--no-probe` mounts anyway.
#[test]
fn a_mount_probes_that_the_other_nodes_see_its_writes() {
    let mut c = Cluster::new(3, "512M", 3, Duration::from_secs(30));
    c.mount(0, &[]);
    c.mount(1, &[]);
    assert!(
        fs::read_to_string(c.backing.join("daemon.log"))
            .unwrap_or_default()
            .contains("saw this node's write"),
        "the second mount's probe was answered: {}",
        c.log_tail()
    );
    c.unmount(1);
    c.freeze(0);
    let (st, out, err) = c.try_mount(1, &[]);
    assert!(
        !st.success() && err.contains("coherence probe") && err.contains(" pid "),
        "a mount whose probe nobody answers: {out}{err}"
    );
    c.mount(1, &["--no-probe"]);
    c.resume(0);
    fs::write(c.path(1, "f"), pattern(5, 1000)).unwrap();
    assert_file_eq(&c.path(0, "f"), &pattern(5, 1000));
}

/// N-N: 4 nodes, 8 writers each, 3 steps; every file of every step reads back byte-exact
/// from every node, and `latest`, switched from a different node each step, resolves to the
/// newest step everywhere.
#[test]
fn every_node_reads_every_ranks_checkpoint_and_the_newest_latest() {
    const NODES: usize = 4;
    const WRITERS: usize = 8;
    const STEPS: usize = 3;
    let mut c = Cluster::new(NODES as u32, "1G", NODES, Duration::from_secs(5));
    for n in 0..NODES {
        c.mount(n, &[]);
    }
    let len = |step: usize, rank: usize| 200_000 + (step * 37 + rank * 4099) % 150_000;
    for step in 1..=STEPS {
        std::thread::scope(|s| {
            for n in 0..NODES {
                let dir = c.path(n, &format!("step-{step}"));
                for w in 0..WRITERS {
                    let dir = dir.clone();
                    s.spawn(move || {
                        let rank = n * WRITERS + w;
                        // Every rank makes the step directory, as a job's ranks do.
                        fs::create_dir_all(&dir).expect("mkdir -p step");
                        let mut f = fs::File::create(dir.join(format!("rank-{rank:03}")))
                            .expect("create rank file");
                        f.write_all(&pattern((step * 1000 + rank) as u64, len(step, rank)))
                            .expect("write");
                        close_checked(f).expect("close");
                    });
                }
            }
        });
        // The step is complete: one node (a different one each step) switches `latest`.
        let n = step % NODES;
        let tmp = c.path(n, "latest.tmp");
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(format!("step-{step}"), &tmp).expect("symlink");
        fs::rename(&tmp, c.path(n, "latest")).expect("rename latest");
        fs::File::open(&c.nodes[n].mnt)
            .and_then(|d| d.sync_all())
            .expect("fsync the directory");
    }
    // Close-to-open: every file is readable by name at once from every node.
    for reader in 0..NODES {
        for step in 1..=STEPS {
            for rank in 0..NODES * WRITERS {
                assert_file_eq(
                    &c.path(reader, &format!("step-{step}/rank-{rank:03}")),
                    &pattern((step * 1000 + rank) as u64, len(step, rank)),
                );
            }
        }
    }
    // Listings and `latest` too, at once: a change of names is visible to every node's
    // next lookup when the call returns (README, "Several nodes").
    for reader in 0..NODES {
        for step in 1..=STEPS {
            let mut names: Vec<String> = fs::read_dir(c.path(reader, &format!("step-{step}")))
                .expect("list step")
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let want: Vec<String> = (0..NODES * WRITERS)
                .map(|r| format!("rank-{r:03}"))
                .collect();
            assert_eq!(names, want, "node {reader} lists step-{step}");
        }
        assert_eq!(
            fs::read_link(c.path(reader, "latest")).expect("readlink latest"),
            std::path::PathBuf::from(format!("step-{STEPS}")),
            "node {reader} resolves latest to the newest step"
        );
        assert_file_eq(
            &c.path(reader, "latest/rank-017"),
            &pattern((STEPS * 1000 + 17) as u64, len(STEPS, 17)),
        );
    }
}

/// Restart anywhere: a node dies mid-checkpoint, another node takes its slot over; every
/// checkpoint the dead node committed reads back from every node, and the one it was
/// writing is whole or absent.
#[test]
fn a_dead_nodes_checkpoints_read_back_everywhere_after_takeover() {
    let mut c = Cluster::new(3, "768M", 4, LEASE);
    for n in 0..3 {
        c.mount(n, &[]);
    }
    let dead = 1;
    let slot = c.slot_of(dead).to_string();
    fs::create_dir(c.path(dead, "ckpt-1")).unwrap();
    for r in 0..4u64 {
        let mut f = fs::File::create(c.path(dead, &format!("ckpt-1/part-{r}"))).unwrap();
        f.write_all(&pattern(100 + r, 1 << 20)).unwrap();
        close_checked(f).unwrap();
    }
    // Mid-checkpoint: part 0 of ckpt-2 committed, part 1 half written and never closed.
    fs::create_dir(c.path(dead, "ckpt-2")).unwrap();
    let mut f = fs::File::create(c.path(dead, "ckpt-2/part-0")).unwrap();
    f.write_all(&pattern(200, 1 << 20)).unwrap();
    close_checked(f).unwrap();
    let mut open = fs::File::create(c.path(dead, "ckpt-2/part-1")).unwrap();
    open.write_all(&pattern(201, 1 << 19)).unwrap();
    c.kill(dead);
    drop(open);
    let check_everywhere = |c: &Cluster, nodes: &[usize]| {
        for &n in nodes {
            for r in 0..4u64 {
                assert_file_eq(
                    &c.path(n, &format!("ckpt-1/part-{r}")),
                    &pattern(100 + r, 1 << 20),
                );
            }
            assert_file_eq(&c.path(n, "ckpt-2/part-0"), &pattern(200, 1 << 20));
            match fs::read(c.path(n, "ckpt-2/part-1")) {
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
                Ok(b) => assert!(
                    b.is_empty() || b == pattern(201, 1 << 19),
                    "node {n}: the interrupted file is mixed ({} bytes)",
                    b.len()
                ),
            }
        }
    };
    // The survivors read the dead node's committed checkpoints from its last manifest.
    check_everywhere(&c, &[0, 2]);
    c.wait_lease_out(slot.parse().unwrap());
    c.mount(3, &["--slot", &slot]);
    check_everywhere(&c, &[0, 2, 3]);
    // The new owner goes on writing in the slot; everyone sees it.
    let mut f = fs::File::create(c.path(3, "ckpt-2/part-2")).unwrap();
    f.write_all(&pattern(202, 1 << 20)).unwrap();
    close_checked(f).unwrap();
    for n in [0, 2, 3] {
        assert_file_eq(&c.path(n, "ckpt-2/part-2"), &pattern(202, 1 << 20));
    }
}

/// `read` and `read_ahead` stage bytes of `node`'s daemon (`ckptfs stats --json`).
fn read_bytes(c: &mut Cluster, node: usize) -> (u64, u64) {
    let (st, out, err) = c.ckptfs(&[
        "stats".into(),
        c.nodes[node].mnt.clone().into(),
        "--json".into(),
    ]);
    assert!(st.success(), "stats: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stats json");
    let stage = |name: &str| {
        v["stages"][name]["bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} stage in {v}"))
    };
    (stage("read"), stage("read_ahead"))
}

/// A restart on another node reads the checkpoint ahead of itself as a restart on the
/// writer's node does: node 1 reading node 0's file sequentially gets it read ahead
/// (the `read_ahead` stage of its daemon), and reads each byte from the backing space
/// about once. Before, another node's file got no read-ahead at all (0 bytes).
#[test]
fn another_nodes_file_is_read_ahead_for_a_sequential_reader() {
    const LEN: usize = 48 << 20;
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    c.mount(0, &[]);
    c.mount(1, &[]);
    let data = pattern(77, LEN);
    let mut f = fs::File::create(c.path(0, "ckpt")).unwrap();
    f.write_all(&data).unwrap();
    close_checked(f).unwrap();
    c.drop_caches(1);
    let (read0, ahead0) = read_bytes(&mut c, 1);
    let got = fs::read(c.path(1, "ckpt")).expect("read another node's file");
    assert!(got == data, "another node's file read back differs");
    let (read1, ahead1) = read_bytes(&mut c, 1);
    let (read, ahead) = (read1 - read0, ahead1 - ahead0);
    eprintln!("{read} bytes read from the backing space, {ahead} of them ahead, for {LEN}");
    assert!(
        ahead >= LEN as u64 / 2,
        "only {ahead} of {LEN} bytes were read ahead of a sequential reader"
    );
    assert!(
        read >= LEN as u64 && read <= LEN as u64 * 11 / 10,
        "{read} bytes read from the backing space for a {LEN}-byte file"
    );
}

/// An N-1 file (nodes 0 and 1 each write half of one file) read sequentially on node 2 is
/// read ahead too, in both nodes' layers, and reads back exact. Before, a file several nodes
/// wrote got no read-ahead at all (0 bytes ahead).
#[test]
fn a_file_several_nodes_wrote_is_read_ahead_for_a_sequential_reader() {
    const LEN: usize = 48 << 20;
    let mut c = Cluster::new(3, "512M", 3, Duration::from_secs(5));
    for n in 0..3 {
        c.mount(n, &[]);
    }
    let data = pattern(78, LEN);
    let half = LEN / 2;
    let mut f = fs::File::create(c.path(0, "n1")).unwrap();
    f.write_all(&data[..half]).unwrap();
    close_checked(f).unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(c.path(1, "n1"))
        .expect("node 1 opens node 0's file");
    use std::os::unix::fs::FileExt;
    f.write_all_at(&data[half..], half as u64).unwrap();
    close_checked(f).unwrap();
    c.drop_caches(2);
    let (read0, ahead0) = read_bytes(&mut c, 2);
    let got = fs::read(c.path(2, "n1")).expect("read the N-1 file on node 2");
    assert!(got == data, "the N-1 file read back differs on node 2");
    let (read1, ahead1) = read_bytes(&mut c, 2);
    let (read, ahead) = (read1 - read0, ahead1 - ahead0);
    eprintln!("{read} bytes read from the backing space, {ahead} of them ahead, for {LEN}");
    assert!(
        ahead >= LEN as u64 / 2,
        "only {ahead} of {LEN} bytes of an N-1 file were read ahead of a sequential reader"
    );
    assert_eq!(fs::read(c.path(0, "n1")).expect("node 0 reads"), data);
    assert_eq!(fs::read(c.path(1, "n1")).expect("node 1 reads"), data);
}

/// gc on one slot moves chunks while another node reads that slot's files, and the owner
/// then writes into the segments gc freed: never a wrong byte, never an EIO (the reader
/// finds moved chunks through the republished manifest). The reader's daemon forgets its
/// decoded chunks before every pass (the working set would fit its cache), and reads three
/// whole passes after the owner's new files went into the freed segments: those passes
/// read every moved chunk at its new place, and any stale place holds other bytes by then.
#[test]
fn gc_on_one_node_while_another_reads_its_files() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    c.mount(0, &[]);
    c.mount(1, &[]);
    // Rounds of rewritten files with a small file kept from each round in the same
    // segments: after retention drops the old rounds, those segments are mostly dead but
    // not empty, so gc copies the kept files elsewhere.
    let files = 4u64;
    let write = |p: std::path::PathBuf, data: Vec<u8>| {
        let mut f = fs::File::create(p).unwrap();
        f.write_all(&data).unwrap();
        close_checked(f).unwrap();
    };
    for round in 0..6u64 {
        for i in 0..files {
            write(
                c.path(0, &format!("f{i}")),
                pattern(round * 100 + i, 2 << 20),
            );
        }
        write(
            c.path(0, &format!("keep-{round}")),
            pattern(900 + round, 300_000),
        );
    }
    let expected = |name: &str| -> Vec<u8> {
        match name.strip_prefix("keep-") {
            Some(r) => pattern(900 + r.parse::<u64>().unwrap(), 300_000),
            None => pattern(500 + name[1..].parse::<u64>().unwrap(), 2 << 20),
        }
    };
    let names: Vec<String> = (0..files)
        .map(|i| format!("f{i}"))
        .chain((0..6).map(|r| format!("keep-{r}")))
        .collect();
    let stop = AtomicBool::new(false);
    // Stops the reader whatever happens below, so a failed assertion cannot hang the scope.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let node1 = c.nodes[1].mnt.clone();
    let node0 = c.nodes[0].mnt.clone();
    let reads = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = 0usize;
            // Passes begun after the stop (gc done, the owner's new files closed).
            let mut after = 0;
            while after < 3 || reads < 3 * names.len() {
                if reads.is_multiple_of(names.len()) {
                    ckptfs_tests::cluster::drop_daemon_caches(&node1);
                    after += stop.load(Ordering::Relaxed) as usize;
                }
                let name = &names[reads % names.len()];
                let got = fs::read(node1.join(name))
                    .unwrap_or_else(|e| panic!("{name}: read during gc: {e}"));
                assert!(got == expected(name), "{name}: wrong bytes read during gc");
                reads += 1;
            }
            reads
        });
        let _stop = Stop(&stop);
        let out = Command::new(ckptfs_tests::ckptfs_bin())
            .args(["gc".as_ref(), node0.as_os_str(), "--json".as_ref()])
            .output()
            .expect("run gc");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "gc: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_str(&text).expect("gc json");
        assert!(
            r["bytes_copied"].as_u64().unwrap() > 0,
            "gc moved no chunk, so this test shows nothing: {r}"
        );
        // New data into the segments gc freed, while the reader goes on.
        for i in 0..12u64 {
            write(node0.join(format!("new-{i}")), pattern(700 + i, 2 << 20));
        }
        drop(_stop);
        reader.join().expect("reader")
    });
    eprintln!("{reads} whole-file reads during gc and the writes after it");
    for name in &names {
        assert_file_eq(&c.path(1, name), &expected(name));
    }
}

/// gc compacting one slot under space pressure (a writer that needs the room only
/// compaction makes) while another node reads that slot's
/// files, with a working set larger than the reader's cache of other slots' chunks (256
/// chunks: 16 MiB at 64 KiB), so every pass really reads the data file at the published
/// places: no EIO, no wrong byte. The owner publishes where it moved each chunk before it
/// lets any old place be written again.
#[test]
fn gc_under_pressure_never_fails_a_reader_on_another_node() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(10));
    c.mount(0, &[]);
    c.mount(1, &[]);
    let (st, out, err) = c.ckptfs(&[
        "config".into(),
        c.nodes[0].mnt.clone().into(),
        "--keep-unlinked".into(),
        "off".into(),
        "--keep-revisions".into(),
        "1".into(),
        "--auto-gc-free-percent".into(),
        "0".into(),
    ]);
    assert!(st.success(), "config: {out}{err}");
    // The working set interleaved with bulk that is removed: its segments are mostly dead
    // but not empty, and gc copies the working set elsewhere.
    const FILES: u64 = 40;
    for i in 0..FILES {
        fs::write(c.path(0, &format!("w{i}")), pattern(i, 1 << 20)).unwrap();
        fs::write(c.path(0, &format!("bulk{i}")), pattern(1000 + i, 3 << 20)).unwrap();
    }
    let stop = AtomicBool::new(false);
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let node1 = c.nodes[1].mnt.clone();
    let node0 = c.nodes[0].mnt.clone();
    let passes = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut passes = 0usize;
            while !stop.load(Ordering::Relaxed) || passes < 2 {
                for i in 0..FILES {
                    let name = format!("w{i}");
                    let got = fs::read(node1.join(&name))
                        .unwrap_or_else(|e| panic!("{name}: read during gc: {e}"));
                    assert!(got == pattern(i, 1 << 20), "{name}: wrong bytes during gc");
                }
                passes += 1;
            }
            passes
        });
        let _stop = Stop(&stop);
        for i in 0..FILES {
            fs::remove_file(node0.join(format!("bulk{i}"))).unwrap();
        }
        // New data that needs the room only compaction makes (the bulk's segments hold
        // the working set too), written while the reader goes on; removed, and written
        // again, so the working set moves round after round.
        for round in 0..4u64 {
            for i in 0..50u64 {
                let p = node0.join(format!("new-{i}"));
                fs::write(&p, pattern(5000 + round * 100 + i, 3 << 20)).unwrap();
            }
            for i in 0..50u64 {
                fs::remove_file(node0.join(format!("new-{i}"))).unwrap();
            }
        }
        drop(_stop);
        reader.join().expect("reader")
    });
    let (st, out, _) = c.ckptfs(&["stats".into(), node0.into(), "--json".into()]);
    assert!(st.success());
    let v: serde_json::Value = serde_json::from_str(&out).expect("stats json");
    let copied = v["gc"]["bytes_copied"].as_u64().unwrap_or(0);
    assert!(
        copied > 16 << 20,
        "gc moved {copied} bytes: this test shows nothing: {v}"
    );
    eprintln!("{passes} passes over {FILES} MiB on node 1 while gc moved {copied} bytes");
}

/// PFS delegation's point: checkpoint files cost the backing filesystem no name-based
/// metadata operation. Every daemon runs under strace; calls naming a path in the backing
/// directory (open, stat, create, rename, unlink, mkdir, ...) are counted per phase: mount,
/// the checkpoints (files written on both nodes and read across), unmount. The one kind
/// allowed while writing is the backing-file watch's stat of the two files a slot keeps
/// open (`space::watch`: the data file, or over targets the placement records, and the
/// slot's table, at most once a second before a commit), bounded by the phase's seconds,
/// not by its files.
#[test]
fn checkpoint_files_cost_the_backing_filesystem_no_metadata_operations() {
    if Command::new("strace").arg("-V").output().is_err() {
        return ckptfs_tests::skip(
            "checkpoint_files_cost_the_backing_filesystem_no_metadata_operations",
            "strace",
            "strace is not installed, so the backing metadata operations cannot be counted",
        );
    }
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    let logs: Vec<std::path::PathBuf> = (0..2)
        .map(|n| c.root().join(format!("strace-{n}.log")))
        .collect();
    for (n, log) in logs.iter().enumerate() {
        let log = log.to_string_lossy().into_owned();
        c.mount_traced(
            n,
            &[
                "strace",
                "-f",
                "-qq",
                "-ttt",
                "-e",
                "trace=%file",
                "-o",
                &log,
            ],
        );
    }
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let mounted = now();
    let (steps, per_node) = (3, 8);
    for step in 0..steps {
        for n in 0..2 {
            let dir = c.path(n, &format!("step-{step}"));
            fs::create_dir_all(&dir).unwrap();
            for r in 0..per_node {
                let rank = n * per_node + r;
                let mut f = fs::File::create(dir.join(format!("rank-{rank}"))).unwrap();
                f.write_all(&pattern((step * 100 + rank) as u64, 256 << 10))
                    .unwrap();
                close_checked(f).unwrap();
            }
        }
        for n in 0..2 {
            for rank in 0..2 * per_node {
                assert_file_eq(
                    &c.path(n, &format!("step-{step}/rank-{rank}")),
                    &pattern((step * 100 + rank) as u64, 256 << 10),
                );
            }
        }
        let tmp = c.path(step % 2, "latest.tmp");
        std::os::unix::fs::symlink(format!("step-{step}"), &tmp).unwrap();
        fs::rename(&tmp, c.path(step % 2, "latest")).unwrap();
    }
    let written = now();
    for n in 0..2 {
        c.unmount(n);
    }
    let backing = c.backing.to_string_lossy().into_owned();
    let files = steps * 2 * per_node;
    let mut report = Vec::new();
    for (n, log) in logs.iter().enumerate() {
        let text = fs::read_to_string(log).expect("strace log");
        let mut phases: [Vec<&str>; 3] = Default::default();
        for line in text.lines().filter(|l| l.contains(backing.as_str())) {
            // "PID SECONDS.MICROS call(...)"
            let t: f64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("unparsed strace line: {line}"));
            let phase = if t < mounted {
                0
            } else if t < written {
                1
            } else {
                2
            };
            phases[phase].push(line);
        }
        // The data file, or over targets the placement records; and the slot's table.
        let watched = [
            format!("\"{backing}/data\""),
            format!("\"{backing}/placement\""),
            format!("\"{backing}/slots/{n:04}.redb\""),
        ];
        let (watch, other): (Vec<&str>, Vec<&str>) = phases[1].iter().partition(|l| {
            let call = l.split_whitespace().nth(2).unwrap_or("");
            ["statx(", "newfstatat(", "stat("]
                .iter()
                .any(|c| call.starts_with(c))
                && watched.iter().any(|w| l.contains(w.as_str()))
        });
        assert!(
            other.is_empty(),
            "node {n}: {} name-based calls on the backing directory while {files} \
             checkpoint files were written and read:\n{}",
            other.len(),
            other.join("\n")
        );
        let most = 2 * ((written - mounted).ceil() as usize + 1);
        assert!(
            watch.len() <= most,
            "node {n}: {} stats of the watched backing files in {:.1} s of writing, more \
             than {most} (one look a second):\n{}",
            watch.len(),
            written - mounted,
            watch.join("\n")
        );
        assert!(
            !phases[0].is_empty(),
            "node {n}: no call seen at mount: the trace does not see the daemon"
        );
        assert!(
            phases[0].len() <= 16 && phases[2].len() <= 4,
            "node {n}: more name-based calls at mount ({}) or unmount ({}) than a small \
             constant:\n{}\n{}",
            phases[0].len(),
            phases[2].len(),
            phases[0].join("\n"),
            phases[2].join("\n")
        );
        report.push(format!(
            "node {n}: mount {}, {files} checkpoint files 0, unmount {}",
            phases[0].len(),
            phases[2].len()
        ));
    }
    eprintln!(
        "name-based calls on the backing directory: {}",
        report.join("; ")
    );
}

/// An unlink, rmdir or mv on one node of another node's entry hides it everywhere (a
/// published whiteout), also after every node remounted; writing the name again later
/// brings it back, newest first.
#[test]
fn removing_another_nodes_entry_hides_it_everywhere() {
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    c.mount(0, &[]);
    c.mount(1, &[]);
    let write = |p: std::path::PathBuf, seed: u64| {
        let mut f = fs::File::create(p).unwrap();
        f.write_all(&pattern(seed, 100_000)).unwrap();
        close_checked(f).unwrap();
    };
    fs::create_dir_all(c.path(0, "old/step-1")).unwrap();
    write(c.path(0, "old/step-1/rank-0"), 1);
    write(c.path(0, "f"), 2);
    write(c.path(0, "moved"), 3);
    // Node 1 removes node 0's entries, as a cleanup script on any node would.
    fs::remove_file(c.path(1, "f")).expect("unlink another node's file");
    assert_eq!(
        fs::remove_dir(c.path(1, "old")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_dir_all(c.path(1, "old")).expect("rm -rf another node's directory");
    // A rename of another node's file is EXDEV; mv copies it and removes the original.
    let st = Command::new("mv")
        .arg(c.path(1, "moved"))
        .arg(c.path(1, "moved-here"))
        .status()
        .expect("run mv");
    assert!(st.success(), "mv of another node's file");
    let check = |c: &Cluster| {
        for n in 0..2 {
            for gone in ["f", "old", "old/step-1/rank-0", "moved"] {
                assert!(
                    fs::symlink_metadata(c.path(n, gone)).is_err(),
                    "node {n}: {gone} is still there"
                );
            }
            assert_file_eq(&c.path(n, "moved-here"), &pattern(3, 100_000));
        }
    };
    check(&c);
    for n in 0..2 {
        let names: Vec<String> = fs::read_dir(&c.nodes[n].mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["moved-here".to_string()],
            "node {n} lists the root"
        );
    }
    for n in 0..2 {
        c.unmount(n);
    }
    for n in 0..2 {
        c.mount(n, &[]);
    }
    check(&c);
    // Written again later (by the node that lost it): back, for everyone.
    write(c.path(0, "f"), 4);
    for n in 0..2 {
        assert_file_eq(&c.path(n, "f"), &pattern(4, 100_000));
    }
}

/// chmod, chown, utimes and truncate of another node's file or directory work on every node,
/// as on one: the change is this node's version of the object (attributes, and for a
/// truncate an empty layer that cuts the older ones), and every node, also after remounts,
/// sees the new attributes over the old bytes, never the cut-off ones.
#[test]
fn attributes_and_size_of_another_nodes_files_can_be_changed() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const LEN: usize = 300_000;
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    c.mount(0, &[]);
    c.mount(1, &[]);
    let write = |p: std::path::PathBuf, seed: u64| {
        let mut f = fs::File::create(p).unwrap();
        f.write_all(&pattern(seed, LEN)).unwrap();
        close_checked(f).unwrap();
    };
    fs::create_dir(c.path(0, "d")).unwrap();
    for (name, seed) in [("d/mode", 1), ("d/grow", 2), ("d/shrink", 3), ("d/zero", 4)] {
        write(c.path(0, name), seed);
    }
    // On node 1, every one of them is node 0's, the directory too.
    fs::set_permissions(c.path(1, "d"), fs::Permissions::from_mode(0o711)).unwrap();
    fs::set_permissions(c.path(1, "d/mode"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(c.path(1, "d/mode"), Some(1234), Some(5678)).unwrap();
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    fs::File::options()
        .write(true)
        .open(c.path(1, "d/grow"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    let st = Command::new("truncate")
        .args(["-s", &(LEN + 100_000).to_string()])
        .arg(c.path(1, "d/grow"))
        .status()
        .unwrap();
    assert!(st.success(), "truncate -s bigger");
    let st = Command::new("truncate")
        .args(["-s", "123457"])
        .arg(c.path(1, "d/shrink"))
        .status()
        .unwrap();
    assert!(st.success(), "truncate -s smaller");
    let st = Command::new("truncate")
        .args(["-s", "0"])
        .arg(c.path(1, "d/zero"))
        .status()
        .unwrap();
    assert!(st.success(), "truncate -s 0");

    let check = |c: &Cluster, when: &str| {
        for n in 0..2 {
            let d = fs::metadata(c.path(n, "d")).unwrap();
            assert_eq!(d.mode() & 0o7777, 0o711, "node {n} {when}: directory mode");
            let m = fs::metadata(c.path(n, "d/mode")).unwrap();
            assert_eq!(m.mode() & 0o7777, 0o600, "node {n} {when}: mode");
            assert_eq!((m.uid(), m.gid()), (1234, 5678), "node {n} {when}: owner");
            assert_file_eq(&c.path(n, "d/mode"), &pattern(1, LEN));
            let mut grown = pattern(2, LEN);
            grown.resize(LEN + 100_000, 0);
            assert_file_eq(&c.path(n, "d/grow"), &grown);
            let mut shrunk = pattern(3, LEN);
            shrunk.truncate(123_457);
            assert_file_eq(&c.path(n, "d/shrink"), &shrunk);
            assert_file_eq(&c.path(n, "d/zero"), &[]);
        }
    };
    check(&c, "at once");
    // A shrunk file grown again shows zeros past the cut, not the other version's bytes.
    let st = Command::new("truncate")
        .args(["-s", &LEN.to_string()])
        .arg(c.path(0, "d/shrink"))
        .status()
        .unwrap();
    assert!(st.success(), "truncate -s back on the owner");
    let mut regrown = pattern(3, LEN);
    regrown[123_457..].fill(0);
    for n in 0..2 {
        assert_file_eq(&c.path(n, "d/shrink"), &regrown);
    }
    for n in 0..2 {
        c.unmount(n);
    }
    for n in 0..2 {
        c.mount(n, &[]);
    }
    let st = Command::new("truncate")
        .args(["-s", "123457"])
        .arg(c.path(1, "d/shrink"))
        .status()
        .unwrap();
    assert!(st.success());
    check(&c, "after remounts");
}

/// A job's prolog mounts the space on every node at the same moment: every mount succeeds
/// (each claims its own slot and passes the coherence probe: the nodes probing at once
/// answer each other), with and without `--slot`, also with more slots than nodes.
#[test]
fn every_node_mounting_at_once_succeeds() {
    for (slots, nodes, pick) in [
        (2u32, 2usize, false),
        (3, 3, true),
        (4, 3, false),
        (4, 4, false),
    ] {
        let mut c = Cluster::new(
            slots,
            &format!("{}M", 128 * slots),
            nodes,
            Duration::from_secs(5),
        );
        let all: Vec<usize> = (0..nodes).collect();
        let results = c.mount_at_once(&all, |n| match pick {
            true => vec!["--slot".into(), n.to_string()],
            false => Vec::new(),
        });
        for (n, (st, out, err)) in results.iter().enumerate() {
            assert!(
                st.success(),
                "{slots} slots, {nodes} nodes mounting at once (--slot: {pick}): node {n}                  failed: {out}{err}\n{}",
                c.log_tail()
            );
        }
        let mut claimed: Vec<u32> = (0..nodes).map(|n| c.slot_of(n)).collect();
        claimed.sort();
        claimed.dedup();
        assert_eq!(claimed.len(), nodes, "each node its own slot");
        // And the nodes are one namespace.
        fs::write(c.path(0, "hello"), b"from node 0").unwrap();
        for n in 0..nodes {
            assert_eq!(fs::read(c.path(n, "hello")).unwrap(), b"from node 0");
        }
    }
}

/// Each slot is an equal, fixed share of the space: a node that writes more than its share
/// gets ENOSPC while the other slots' shares are empty (a job that saves on one rank only
/// meets this at 1/N of the space). The daemon's log must say so, not only "space full":
/// which slot's share filled, and how much room the other slots have that this node
/// cannot use.
#[test]
fn a_full_slot_share_is_explained() {
    let mut c = Cluster::new(2, "256M", 2, Duration::from_secs(5));
    let slot = c.mount(0, &[]);
    let mut f = fs::File::create(c.path(0, "big")).unwrap();
    // 40 x 8 MiB of incompressible bytes: more than the whole space.
    let wrote = (0..40).try_for_each(|i| f.write_all(&pattern(i, 8 << 20)));
    let e = wrote
        .err()
        .or_else(|| close_checked(f).err())
        .expect("more than the slot's share was written without an error");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let log = c.log_tail();
    for want in [
        format!("slot {slot}'s share of a 2-slot space"),
        "the other slots' shares have".to_string(),
        "fewer slots".to_string(),
    ] {
        assert!(log.contains(&want), "the log does not say {want:?}:\n{log}");
    }
}

/// Each node's `df` is its slot's share: the size `ckptfs slots` gives every slot, nearly all
/// of it free before anything is written, and a write's bytes taken from it. Over targets a
/// mount reported the whole space as its size and the other slots' shares as used (an
/// empty 2-slot space of 1 GiB: 1.0G, 528M used), which also set auto-gc's thresholds
/// against the whole space instead of the node's share.
#[test]
fn each_node_reports_its_slots_share_as_its_size() {
    let mut c = Cluster::new(2, "512M", 2, LEASE);
    for n in 0..2 {
        c.mount(n, &[]);
    }
    let (st, out, err) = c.ckptfs(&["slots".into(), c.backing.clone().into(), "--json".into()]);
    assert!(st.success(), "ckptfs slots: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("slots json");
    let share = v["slots"][0]["reserved_bytes"]
        .as_u64()
        .expect("reserved_bytes");
    let mut free = [0u64; 2];
    for (n, free) in free.iter_mut().enumerate() {
        let (avail, total) = ckptfs_tests::statvfs_bytes(&c.nodes[n].mnt);
        assert_eq!(total, share, "node {n}'s size is its slot's share");
        assert!(
            total - avail < share / 8,
            "node {n}: {} of {total} bytes in use before anything was written",
            total - avail
        );
        *free = avail;
    }
    let mut f = fs::File::create(c.path(0, "rank-0")).unwrap();
    f.write_all(&pattern(9, 16 << 20)).unwrap();
    close_checked(f).unwrap();
    let (avail, _) = ckptfs_tests::statvfs_bytes(&c.nodes[0].mnt);
    assert!(
        free[0] - avail >= 16 << 20,
        "16 MiB written took {} bytes of node 0's share",
        free[0] - avail
    );
}

/// A job's daemons are all killed (`kill -9`: the scheduler ended the job, the OOM killer),
/// and the next job mounts the space on the same nodes at once: every mount succeeds without
/// waiting for the dead holders' leases, over the dead mounts left at the mountpoints, each
/// node gets its own slot back, and what was closed before the kill is all there. Before,
/// each mount was refused ("Transport endpoint is not connected" at the mountpoint; then,
/// once detached by hand, "every one of the 2 slots ... is held by a live mount" naming
/// pids that were gone) until the leases ran out; and with a spare slot, a node took the
/// spare and then waited in vain for its dead holder's echo to its coherence probe.
#[test]
fn the_next_job_mounts_at_once_after_every_daemon_was_killed() {
    // A lease far longer than the test: only a takeover of holders known gone passes. One
    // slot more than nodes: each must still get its own back.
    let mut c = Cluster::new(3, "384M", 2, Duration::from_secs(120));
    let slots = [c.mount(0, &[]), c.mount(1, &[])];
    for n in 0..2 {
        let mut f = fs::File::create(c.path(n, &format!("rank{n}"))).unwrap();
        f.write_all(&pattern(n as u64, 3 << 20)).unwrap();
        close_checked(f).unwrap();
    }
    c.kill_leaving_mount(0);
    c.kill_leaving_mount(1);
    let results = c.mount_at_once(&[0, 1], |_| Vec::new());
    for (n, (st, out, err)) in results.iter().enumerate() {
        assert!(
            st.success(),
            "node {n} was refused after the job's daemons were killed: {out}{err}\n{}",
            c.log_tail()
        );
    }
    for (n, &slot) in slots.iter().enumerate() {
        assert_eq!(c.slot_of(n), slot, "node {n} got another slot");
        for r in 0..2 {
            assert_file_eq(&c.path(n, &format!("rank{r}")), &pattern(r as u64, 3 << 20));
        }
    }
}

/// One node removes files another node wrote (a rotation script deleting the oldest step):
/// the owner learns of it, its kernel is told to drop the names, and its gc reclaims the
/// space at once (before, the owner's kernel kept holding the inodes it created, and gc kept
/// them for it: `gc --empty-trash` dropped nothing). A file a process of the owner's node
/// still has open, or holds by `O_PATH`, keeps its bytes all the same.
#[test]
fn files_another_node_removed_are_reclaimed_unless_held_open() {
    use std::os::unix::fs::OpenOptionsExt;
    const LEN: usize = 8 << 20;
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    c.mount(0, &[]);
    c.mount(1, &[]);
    fs::create_dir(c.path(1, "step")).unwrap();
    for (i, name) in ["gone-a", "gone-b", "open", "by-path"].iter().enumerate() {
        let mut f = fs::File::create(c.path(1, &format!("step/{name}"))).unwrap();
        f.write_all(&pattern(i as u64, LEN)).unwrap();
        close_checked(f).unwrap();
        // Stat it as a job would: the kernel of the owner holds the name and the inode.
        fs::metadata(c.path(1, &format!("step/{name}"))).unwrap();
    }
    let open = fs::File::open(c.path(1, "step/open")).unwrap();
    let by_path = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(c.path(1, "step/by-path"))
        .unwrap();
    fs::remove_dir_all(c.path(0, "step")).unwrap();
    let mnt1 = c.mountpoint(1).to_path_buf();
    let (st, out, err) = c.ckptfs(&[
        "gc".into(),
        mnt1.into(),
        "--empty-trash".into(),
        "--json".into(),
    ]);
    assert!(st.success(), "gc on the owner: {out}{err}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("gc json");
    assert_eq!(
        r["revisions_dropped"].as_u64(),
        Some(2),
        "the owner's gc drops the two removed files no process holds: {r:#}\n{}",
        c.log_tail()
    );
    // The open one reads back exact (the O_PATH one kept its revision: 2 dropped of 4).
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut &open, &mut got).unwrap();
    assert!(got == pattern(2, LEN), "the open file's bytes");
    // Let go of, they go too.
    drop(open);
    drop(by_path);
    let mnt1 = c.mountpoint(1).to_path_buf();
    let mut dropped = 0;
    for _ in 0..50 {
        let (st, out, err) = c.ckptfs(&[
            "gc".into(),
            mnt1.clone().into(),
            "--empty-trash".into(),
            "--json".into(),
        ]);
        assert!(st.success(), "gc on the owner: {out}{err}");
        let r: serde_json::Value = serde_json::from_str(&out).expect("gc json");
        dropped += r["revisions_dropped"].as_u64().unwrap_or(0);
        if dropped >= 2 {
            break;
        }
        // The kernel forgets a released inode when its last reference goes (the descriptor
        // closes): each gc asks the daemon to learn and wait for that first.
    }
    assert_eq!(dropped, 2, "the two released files' revisions go too");
}

/// A slot whose header is damaged (both copies) fails that slot only: `ckptfs slots` lists
/// it as damaged, the healthy slot mounts (by choice and by `--slot`) and reads its files,
/// and a mount of the damaged slot is refused naming the damage.
#[test]
fn a_damaged_slot_header_fails_that_slot_only() {
    use std::os::unix::fs::FileExt;
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    c.mount(0, &["--slot", "0"]);
    c.mount(1, &["--slot", "1"]);
    fs::write(c.path(0, "zero"), pattern(1, 300_000)).unwrap();
    fs::write(c.path(1, "one"), pattern(2, 300_000)).unwrap();
    c.unmount(1);
    c.unmount(0);
    // Both copies of slot 1's header: a few bytes in the middle of each.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(c.backing.join("slots/headers"))
        .unwrap();
    for copy in 0..2u64 {
        let at = 4096 + 8192 + copy * 4096 + 64;
        let mut b = [0u8; 16];
        f.read_exact_at(&mut b, at).unwrap();
        for x in b.iter_mut() {
            *x ^= 0x5a;
        }
        f.write_all_at(&b, at).unwrap();
    }
    f.sync_all().unwrap();
    let backing = c.backing.clone();
    let (st, out, err) = c.ckptfs(&["slots".into(), backing.clone().into()]);
    assert!(st.success(), "ckptfs slots with a damaged slot: {out}{err}");
    assert!(out.contains("damaged"), "slot 1 listed as damaged: {out}");
    let rows = c.slots();
    assert_eq!(rows[1]["state"], "damaged", "{rows:#}");
    assert_eq!(rows[0]["state"], "released", "{rows:#}");
    c.mount(0, &[]);
    assert_file_eq(&c.path(0, "zero"), &pattern(1, 300_000));
    c.unmount(0);
    c.mount(0, &["--slot", "0"]);
    assert_file_eq(&c.path(0, "zero"), &pattern(1, 300_000));
    let (st, out, err) = c.try_mount(1, &["--slot", "1"]);
    assert!(
        !st.success(),
        "a mount of the damaged slot must be refused: {out}{err}"
    );
    assert!(
        err.contains("slot 1") && err.contains("checksum"),
        "the refusal names the slot and the damage: {err}"
    );
}

/// `ckptfs report` of a directory of steps whose rank files several nodes wrote draws every
/// rank's cost from either node (before, it failed on the first file another slot made),
/// and `revisions` of such a file says so in words, not with an internal request name.
#[test]
fn a_report_of_steps_written_by_several_nodes_counts_every_rank() {
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    c.mount(0, &[]);
    c.mount(1, &[]);
    for step in 0..2 {
        fs::create_dir_all(c.path(0, &format!("run/step-{step}"))).unwrap();
        for n in 0..2 {
            let p = c.path(n, &format!("run/step-{step}/rank-{n}"));
            fs::write(p, pattern(step * 2 + n as u64, 1 << 20)).unwrap();
        }
    }
    for n in 0..2 {
        let svg = c.root().join(format!("report-{n}.svg"));
        let run = c.path(n, "run");
        let (st, out, err) = c.ckptfs(&[
            "report".into(),
            run.into(),
            "--svg".into(),
            svg.clone().into(),
        ]);
        assert!(st.success(), "report from node {n}: {out}{err}");
        assert!(
            out.contains("2 checkpoint steps, 4.00 MiB logical"),
            "node {n}: every rank of both steps counted: {out}"
        );
        assert!(fs::metadata(&svg).unwrap().len() > 0);
    }
    let other = c.path(0, "run/step-0/rank-1");
    let (st, out, err) = c.ckptfs(&["revisions".into(), other.into()]);
    assert!(!st.success(), "another slot's revisions: {out}");
    assert!(
        err.contains("revisions: another node's slot holds this file") && !err.contains("after"),
        "{err}"
    );
}

/// N-1 across nodes: 4 nodes write disjoint parts of one file (segmented: a quarter each;
/// strided: every 4th 64 KiB block each), opening it without O_TRUNC as MPI-IO does; once
/// all closed, every node reads the same, whole file.
#[test]
fn one_file_written_in_parts_by_several_nodes_reads_whole_everywhere() {
    use std::os::unix::fs::FileExt;
    const NODES: usize = 4;
    const PART: usize = 768 << 10;
    const BLOCK: usize = 64 << 10;
    let mut c = Cluster::new(NODES as u32, "1G", NODES, Duration::from_secs(5));
    for n in 0..NODES {
        c.mount(n, &[]);
    }
    let whole = pattern(77, NODES * PART);
    std::thread::scope(|s| {
        for n in 0..NODES {
            let (seg, strided) = (c.path(n, "seg.bin"), c.path(n, "strided.bin"));
            let whole = &whole;
            s.spawn(move || {
                let open = |p: &std::path::Path| {
                    fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(p)
                        .expect("open the shared file")
                };
                let f = open(&seg);
                let at = n * PART;
                f.write_all_at(&whole[at..at + PART], at as u64)
                    .expect("write part");
                close_checked(f).expect("close");
                let f = open(&strided);
                for b in (n..whole.len() / BLOCK).step_by(NODES) {
                    let at = b * BLOCK;
                    f.write_all_at(&whole[at..at + BLOCK], at as u64)
                        .expect("write block");
                }
                close_checked(f).expect("close");
            });
        }
    });
    for n in 0..NODES {
        for name in ["seg.bin", "strided.bin"] {
            assert_file_eq(&c.path(n, name), &whole);
        }
    }
}

/// Seeded stress of the union's tables (other slots' inode numbers, published views,
/// whiteouts): threads on 3 nodes race creates, rewrites, partial writes, reads, unlinks,
/// renames and mkdirs on a few shared names. Nothing may fail but with the errors the
/// operation can mean (ENOENT, EEXIST, EXDEV, ENOTEMPTY, EISDIR, ENOTDIR, EROFS for changing
/// another node's entry), and once quiet, every node must see the same names and bytes.
/// CKPTFS_SLOTS_STRESS_OPS sets the operations per thread (default 60).
#[test]
fn racing_nodes_agree_once_quiet() {
    use rand::{Rng, SeedableRng};
    let seed = ckptfs_tests::test_seed("racing_nodes_agree_once_quiet", 7);
    let ops: usize = std::env::var("CKPTFS_SLOTS_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    const NODES: usize = 3;
    let mut c = Cluster::new(NODES as u32, "768M", NODES, Duration::from_secs(5));
    for n in 0..NODES {
        c.mount(n, &[]);
        fs::create_dir_all(c.path(n, "s")).unwrap();
    }
    let names = ["a", "b", "c", "d", "e", "sub"];
    let allowed = [
        libc::ENOENT,
        libc::EEXIST,
        libc::EXDEV,
        libc::ENOTEMPTY,
        libc::EISDIR,
        libc::ENOTDIR,
        libc::EROFS,
    ];
    std::thread::scope(|s| {
        for n in 0..NODES {
            for t in 0..2u64 {
                let root = c.path(n, "s");
                let allowed = &allowed;
                s.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ (n as u64 * 131 + t));
                    for i in 0..ops {
                        let name = names[rng.random_range(0..names.len())];
                        let p = root.join(name);
                        let r: std::io::Result<()> = match rng.random_range(0..12) {
                            0..=2 => fs::File::create(&p).and_then(|mut f| {
                                f.write_all(&pattern((n * 1000 + i) as u64, 50_000))?;
                                close_checked(f)
                            }),
                            3 => fs::OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(false)
                                .open(&p)
                                .and_then(|f| {
                                    use std::os::unix::fs::FileExt;
                                    f.write_all_at(
                                        &pattern(i as u64, 10_000),
                                        (n * 10_000) as u64,
                                    )?;
                                    close_checked(f)
                                }),
                            4..=5 => fs::read(&p).map(drop),
                            6 => fs::remove_file(&p),
                            7 => fs::rename(&p, root.join(names[rng.random_range(0..5)])),
                            8 => fs::create_dir(&p),
                            // truncate(2) and chmod, also of other nodes' files.
                            9 => fs::OpenOptions::new()
                                .write(true)
                                .open(&p)
                                .and_then(|f| f.set_len(rng.random_range(0..60_000))),
                            10 => {
                                use std::os::unix::fs::PermissionsExt;
                                let mode = [0o600, 0o640, 0o644][rng.random_range(0..3)];
                                fs::set_permissions(&p, fs::Permissions::from_mode(mode))
                            }
                            _ => fs::read_dir(&root).map(|d| {
                                for e in d {
                                    let _ = e.map(|e| e.file_name());
                                }
                            }),
                        };
                        if let Err(e) = r {
                            let code = e.raw_os_error().unwrap_or(0);
                            assert!(
                                allowed.contains(&code),
                                "node {n} thread {t} op {i} on {name}: {e}"
                            );
                        }
                    }
                });
            }
        }
    });
    // Quiet: every change was visible to every node when its call returned, so all
    // nodes agree now.
    type Entry = (String, Option<(Vec<u8>, u32)>);
    let view = |n: usize| -> Vec<Entry> {
        use std::os::unix::fs::MetadataExt;
        let mut v: Vec<Entry> = fs::read_dir(c.path(n, "s"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                // A file's bytes and mode (a directory's attributes are each node's own).
                let content = fs::read(e.path())
                    .ok()
                    .map(|b| (b, fs::metadata(e.path()).map_or(0, |m| m.mode())));
                (name, content)
            })
            .collect();
        v.sort();
        v
    };
    let first = view(0);
    for n in 1..NODES {
        let other = view(n);
        let names_of = |v: &[Entry]| {
            v.iter()
                .map(|(k, b)| (k.clone(), b.as_ref().map(|(b, m)| (b.len(), *m))))
                .collect::<Vec<_>>()
        };
        assert!(
            other == first,
            "seed {seed}: node {n} sees {:?}, node 0 sees {:?}",
            names_of(&other),
            names_of(&first)
        );
    }
}

/// A node that remounts right after a plain `fusermount3 -u` (which returns before the daemon
/// has released its slot and exited) gets its own slot back: the mount waits for that
/// exiting daemon, saying so, instead of claiming another slot, which would split the node's
/// data over two shares and take a slot another node may be about to claim. The daemon is
/// kept alive by a descriptor open in its lazily detached mount, and let go once the mount
/// says it is waiting (an event, not a sleep). Before, the remount took slot 1 at once.
#[test]
fn a_remount_right_after_an_unmount_waits_for_its_own_slot() {
    let mut c = Cluster::new(2, "512M", 1, LEASE);
    let first = c.mount(0, &[]);
    fs::write(c.path(0, "kept"), b"still here").expect("write");
    let held = fs::File::open(c.path(0, "kept")).expect("open");
    let mnt = c.mountpoint(0).to_path_buf();
    let st = Command::new("fusermount3")
        .args(["-u".as_ref(), "-z".as_ref(), mnt.as_os_str()])
        .status()
        .expect("fusermount3 -u -z");
    assert!(st.success(), "lazy unmount");
    let (child, said) = ckptfs_tests::spawn_until_said(
        Command::new(ckptfs_tests::ckptfs_bin()).args(c.mount_args(0)),
        "waiting for the daemon",
    );
    drop(held);
    let (status, rest) = ckptfs_tests::finish_said(child);
    assert!(status.success(), "remount failed: {said}{rest}");
    // Asserted before the unmount: the cluster's drop unmounts whatever is left.
    assert!(
        said.contains("waiting for the daemon"),
        "the remount did not wait for the exiting daemon: {said}{rest}"
    );
    assert_eq!(c.slot_of(0), first, "the remount took another slot");
    assert_file_eq(&c.path(0, "kept"), b"still here");
    c.unmount(0);
}

/// `--coherence close-to-open`: each node's kernel keeps names and attributes for a second,
/// so a stat there may show another node's change late, but an open never does. Two nodes
/// take turns changing what the other has just looked up (so its kernel holds the old
/// names): a rotation that keeps the previous `latest` under another name (the old inode
/// lives on), a directory moved aside and made again, a file grown, a file removed, and
/// appends from both nodes. The reader's open finds the new bytes every time, and the
/// appends land in order. Without the open's check (`told` in the mount) every run failed
/// with 33 stale reads of 36 (the old `latest`, the moved directory's file, the old size)
/// and appends written over each other.
#[test]
fn close_to_open_opens_see_other_nodes_changes_the_kernel_kept_old_names_of() {
    const ROUNDS: usize = 12;
    let mut c = Cluster::new(2, "512M", 2, Duration::from_secs(5));
    for n in 0..2 {
        c.mount(n, &["--coherence", "close-to-open"]);
    }
    let (st, out, err) = c.ckptfs(&["stats".into(), c.mountpoint(1).into(), "--json".into()]);
    assert!(st.success(), "stats: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stats json");
    assert_eq!(v["commits"]["coherence"], "close-to-open", "{out}");
    fs::create_dir(c.path(0, "run")).unwrap();
    let read = |c: &Cluster, n: usize, p: &str| {
        fs::read_to_string(c.path(n, p)).unwrap_or_else(|e| format!("<{e}>"))
    };
    let append = |c: &Cluster, n: usize, s: &str| {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(c.path(n, "run/log"))
            .unwrap();
        f.write_all(s.as_bytes()).unwrap();
        close_checked(f).unwrap();
    };
    let mut wrong = Vec::new();
    let mut log = String::new();
    for i in 0..ROUNDS {
        let (w, r) = (i % 2, 1 - i % 2);
        // The reader looks everything up first, as a job polling the directory does.
        for p in ["run/latest", "run/cur/x", "run/grows"] {
            let _ = fs::metadata(c.path(r, p));
        }
        fs::write(c.path(w, "run/latest.tmp"), format!("v{i}")).unwrap();
        if c.path(w, "run/latest").exists() {
            fs::rename(c.path(w, "run/latest"), c.path(w, &format!("run/prev{i}"))).unwrap();
        }
        fs::rename(c.path(w, "run/latest.tmp"), c.path(w, "run/latest")).unwrap();
        if c.path(w, "run/cur").exists() {
            fs::rename(c.path(w, "run/cur"), c.path(w, &format!("run/old{i}"))).unwrap();
        }
        fs::create_dir(c.path(w, "run/cur")).unwrap();
        fs::write(c.path(w, "run/cur/x"), format!("c{i}")).unwrap();
        let grown = "g".repeat(100 * (i + 1));
        fs::write(c.path(w, "run/grows"), &grown).unwrap();
        for (p, want) in [
            ("run/latest", format!("v{i}")),
            ("run/cur/x", format!("c{i}")),
            ("run/grows", grown),
        ] {
            let got = read(&c, r, p);
            if got != want {
                wrong.push(format!(
                    "round {i}: node {r} read {p} as {got:?}, not {want:?}"
                ));
            }
        }
        if i > 0 {
            // The previous one, which the reader just looked up, removed.
            let prev = format!("run/prev{i}");
            let _ = fs::metadata(c.path(r, &prev));
            fs::remove_file(c.path(w, &prev)).unwrap();
            if fs::File::open(c.path(r, &prev)).is_ok() {
                wrong.push(format!(
                    "round {i}: node {r} opened {prev}, removed by node {w}"
                ));
            }
        }
        let (a, b) = (format!("{i}a{w};"), format!("{i}b{r};"));
        append(&c, w, &a);
        append(&c, r, &b);
        log.push_str(&a);
        log.push_str(&b);
    }
    for n in 0..2 {
        if read(&c, n, "run/log") != log {
            wrong.push(format!(
                "node {n} reads the appends as {:?}",
                read(&c, n, "run/log")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} stale opens:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
