//! Checkpoint rotation across nodes, as a job's rotation script (or PyTorch DCP's, or the
//! Hugging Face Trainer's `save_total_limit`) does it: every node's rank writes its file
//! into `step-N/`, then one node removes the oldest step directory with everything in it,
//! the files the other nodes wrote included. Each node's slot must get the space of its
//! removed files back, or the nodes that did not remove anything run out of space.

use crate::cluster::Cluster;
use crate::{close_checked, fill_pattern, first_difference, mix};
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Rotates `steps` steps over `nodes` nodes of one space (on `clients`, or a local
/// directory), each rank writing `rank_mib` MiB a step into a slot sized for about
/// `room` steps, keeping the newest `keep` steps (node 0 removes the rest). Every write
/// and close must succeed and every kept step read back exact on every node.
pub fn rotate_across_nodes(
    clients: &[PathBuf],
    nodes: usize,
    steps: usize,
    rank_mib: usize,
    room: usize,
    keep: usize,
    seed: u64,
) {
    // A slot's share is the space divided by the slots, less a little for its table.
    let slot_mib = rank_mib * room;
    let mut c = Cluster::on_clients(
        nodes as u32,
        &format!("{}M", slot_mib * nodes + 16),
        nodes,
        Duration::from_secs(5),
        clients,
    );
    for n in 0..nodes {
        c.mount(n, &[]);
    }
    let content = |step: usize, rank: usize, off: usize, buf: &mut [u8]| {
        fill_pattern(
            mix(seed, ((step as u64) << 8) | rank as u64),
            off as u64,
            buf,
        )
    };
    for step in 0..steps {
        let dir = format!("step-{step}");
        for n in 0..nodes {
            // Every rank's `mkdir -p` of the step, as ranks do.
            fs::create_dir_all(c.path(n, &dir)).unwrap();
        }
        std::thread::scope(|s| {
            for n in 0..nodes {
                let path = c.path(n, &format!("{dir}/rank-{n}"));
                let content = &content;
                s.spawn(move || {
                    let mut f = fs::File::create(&path).unwrap_or_else(|e| {
                        panic!("step {step}: node {n} creates {}: {e}", path.display())
                    });
                    let mut buf = vec![0u8; MIB];
                    for i in 0..rank_mib {
                        content(step, n, i * MIB, &mut buf);
                        f.write_all(&buf).unwrap_or_else(|e| {
                            panic!("step {step}: node {n} writes MiB {i} of its rank file: {e}")
                        });
                    }
                    close_checked(f)
                        .unwrap_or_else(|e| panic!("step {step}: node {n} closes its rank: {e}"));
                });
            }
        });
        if step >= keep {
            let old = format!("step-{}", step - keep);
            fs::remove_dir_all(c.path(0, &old))
                .unwrap_or_else(|e| panic!("step {step}: node 0 removes {old}: {e}"));
        }
    }
    for step in steps.saturating_sub(keep)..steps {
        for rank in 0..nodes {
            let mut want = vec![0u8; rank_mib * MIB];
            content(step, rank, 0, &mut want);
            for n in 0..nodes {
                let p = c.path(n, &format!("step-{step}/rank-{rank}"));
                let got = fs::read(&p).unwrap_or_else(|e| panic!("node {n} reads {p:?}: {e}"));
                if let Some(d) = first_difference(&got, &want) {
                    panic!("node {n} reads step {step} rank {rank}: {d}");
                }
            }
        }
    }
    let listed: Vec<String> = fs::read_dir(c.path(1, ""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed.len(), keep, "node 1 lists {listed:?}");
}
