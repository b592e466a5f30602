//! Several nodes on one space over a real shared filesystem: a GlusterFS volume mounted
//! twice (two clients with their own caches, `scripts/gluster.sh`), each node reaching the
//! space through its own client. What one machine's page cache hides, two clients show:
//! a client that caches reads never sees the other's writes unless ckptfs reads around
//! its cache and makes its own writes visible.
//!
//! Without a volume (`CKPTFS_GLUSTER_CLIENTS` unset, as outside `.ci/run`) every test here
//! prints SKIPPED with the reason; `CKPTFS_REQUIRE=gluster` makes that a failure.
//! `CKPTFS_GLUSTER_MODEL_OPS` sets the model run's operations (default 80).

use ckptfs_tests::cluster::Cluster;
use ckptfs_tests::nsmodel::env_usize;
use ckptfs_tests::{assert_file_eq, gluster_clients, pattern, skip};
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

fn clients(test: &str) -> Option<Vec<PathBuf>> {
    match gluster_clients() {
        Ok(c) => Some(c),
        Err(why) => {
            skip(test, "gluster", &why);
            None
        }
    }
}

/// The namespace model (tests/tests/namespace_model.rs) with its nodes on two clients.
#[test]
fn one_posix_tree_on_glusterfs() {
    let Some(c) = clients("one_posix_tree_on_glusterfs") else {
        return;
    };
    let seed = ckptfs_tests::test_seed("one_posix_tree_on_glusterfs", 7);
    ckptfs_tests::nsmodel::run(seed, env_usize("CKPTFS_GLUSTER_MODEL_OPS", 80), &c);
}

/// Each node sees the other's closed files at once (close-to-open), lists them, and sees
/// the other's slot as held and its lease fresh through its own client.
#[test]
fn closed_files_and_live_leases_are_seen_through_the_other_client() {
    let Some(cl) = clients("closed_files_and_live_leases_are_seen_through_the_other_client") else {
        return;
    };
    let lease = Duration::from_secs(4);
    let mut c = Cluster::on_clients(2, "512M", 2, lease, &cl);
    c.mount(0, &[]);
    c.mount(1, &[]);
    for i in 0..20u64 {
        let (w, r) = ((i % 2) as usize, ((i + 1) % 2) as usize);
        let name = format!("f{i}");
        fs::write(c.path(w, &name), pattern(i, 100_000 + i as usize * 1000)).unwrap();
        assert_file_eq(&c.path(r, &name), &pattern(i, 100_000 + i as usize * 1000));
        let listed: Vec<String> = fs::read_dir(c.path(r, ""))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            listed.contains(&name),
            "node {r} lists {listed:?}, not {name}"
        );
    }
    // Through client 1 (node 1's way to the space), node 0's slot is live.
    let backing1 = cl[1]
        .join(c.backing.parent().unwrap().file_name().unwrap())
        .join("backing");
    let (st, out, err) = c.ckptfs(&["slots".into(), backing1.into(), "--json".into()]);
    assert!(st.success(), "slots through client 1: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("slots json");
    for row in v["slots"].as_array().expect("slot rows") {
        assert_eq!(row["state"], "held", "{row:#}");
        let age = row["lease_age_ms"].as_u64().unwrap_or(u64::MAX) as f64 / 1000.0;
        assert!(
            age < lease.as_secs_f64(),
            "a live slot seen through the other client as renewed {age} s ago: {row:#}"
        );
    }
}

/// A node's cleanup deletes the space's data file (over targets: its placement records)
/// through the other client while both nodes have it open. Each client still resolves the
/// name to the open file from its cache, so a watch that trusted the path saw nothing; the
/// open file has no link left, which each node's next look finds (once the client's
/// attribute cache, about a second, let the link count through): both nodes refuse writes
/// with EIO and `stats` says which file, instead of acknowledging writes into a file gone
/// at unmount. Before the link count was looked at, node 0 went on acknowledging (seen
/// by hand: its write after the removal returned 0 and its `stats` said nothing).
#[test]
fn a_backing_file_deleted_through_the_other_client_fails_both_nodes() {
    let Some(cl) = clients("a_backing_file_deleted_through_the_other_client_fails_both_nodes")
    else {
        return;
    };
    let mut c = Cluster::on_clients(2, "512M", 2, Duration::from_secs(4), &cl);
    c.mount(0, &[]);
    c.mount(1, &[]);
    for node in 0..2 {
        let name = format!("before-{node}");
        fs::write(c.path(node, &name), pattern(node as u64, 1 << 20)).unwrap();
    }
    let (file, what) = match ckptfs_tests::cluster::on_targets() {
        true => ("placement", "placement file"),
        false => ("data", "data file"),
    };
    let rel = c
        .backing
        .strip_prefix(&cl[0])
        .expect("the backing dir on client 0");
    fs::remove_file(cl[1].join(rel).join(file)).unwrap();
    for node in 0..2 {
        // Waits on the event (the client's cached link count expiring), bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mnt = c.mountpoint(node).to_path_buf();
        loop {
            let (_, out, err) = c.ckptfs(&["stats".into(), mnt.clone().into()]);
            if out.contains("FAILED (writes refused until remount): the backing") {
                assert!(
                    out.contains(&format!("{what} "))
                        && out.contains(&format!("/{file} was removed while mounted")),
                    "node {node}: {out}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {node} never noticed {file} removed through the other client: {out}{err}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let r = ckptfs_tests::write_file_checked(&c.path(node, "after"), &pattern(9, 1 << 20));
        assert_eq!(
            ckptfs_tests::errno(r),
            Err(libc::EIO),
            "node {node}: a write after"
        );
        let name = format!("before-{node}");
        assert_file_eq(&c.path(node, &name), &pattern(node as u64, 1 << 20));
    }
    for node in 0..2 {
        c.unmount_failing(node);
    }
}

/// Rotation across nodes (tests/tests/rotation.rs) with the nodes on two clients: node 0
/// removes the oldest step, files of the nodes on the other client included, and every slot
/// gets its space back. `CKPTFS_GLUSTER_ROTATION_STEPS` (default 10).
#[test]
fn rotating_steps_across_nodes_on_glusterfs() {
    let Some(c) = clients("rotating_steps_across_nodes_on_glusterfs") else {
        return;
    };
    let seed = ckptfs_tests::test_seed("rotating_steps_across_nodes_on_glusterfs", 5);
    let steps = env_usize("CKPTFS_GLUSTER_ROTATION_STEPS", 10);
    ckptfs_tests::rotation::rotate_across_nodes(&c, 3, steps, 44, 5, 3, seed);
}

/// N-1 writes from several nodes (tests/tests/n1_model.rs) with the nodes on two clients.
/// `CKPTFS_GLUSTER_N1_OPS` (default 80).
#[test]
fn n1_writes_on_glusterfs_read_back_as_the_model() {
    let Some(c) = clients("n1_writes_on_glusterfs_read_back_as_the_model") else {
        return;
    };
    let seed = ckptfs_tests::test_seed("n1_writes_on_glusterfs_read_back_as_the_model", 9);
    ckptfs_tests::n1model::run(seed, env_usize("CKPTFS_GLUSTER_N1_OPS", 80), None, &c);
}
