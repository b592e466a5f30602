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
