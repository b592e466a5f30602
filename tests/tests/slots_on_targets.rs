//! Slots over erasure-coded targets (`format --slots N --target ... --redundancy M+K`):
//! the whole slot suite (`slots.rs`) again on that layout (`cluster::on_targets` is true in
//! this binary), and what only the combined layout has: every node reads every other
//! node's files with K targets lost or damaged, and each node's rebuild restores full
//! redundancy while the nodes go on reading and writing. `gluster.rs` runs here too.

#[path = "slots.rs"]
mod slots;

/// The GlusterFS tests too (two clients of one volume; they skip loudly without one), with
/// the targets on the volume beside the backing directory.
#[path = "gluster.rs"]
mod gluster;

use ckptfs_tests::cluster::{on_targets, Cluster, TARGETS};
use ckptfs_tests::{assert_file_eq, close_checked, pattern};
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(2);

fn write_file(p: &Path, seed: u64, len: usize) {
    fs::create_dir_all(p.parent().expect("parent")).expect("mkdir -p");
    let mut f = fs::File::create(p).expect("create");
    f.write_all(&pattern(seed, len)).expect("write");
    close_checked(f).expect("close");
}

fn targets_json(c: &mut Cluster, node: usize) -> serde_json::Value {
    let (st, out, err) = c.ckptfs(&[
        "targets".into(),
        c.nodes[node].mnt.clone().into(),
        "--json".into(),
    ]);
    assert!(st.success(), "ckptfs targets: {out}{err}");
    serde_json::from_str(&out).expect("targets json")
}

/// Overwrites `len` bytes in the middle of every shard slot of target `t`'s file that
/// holds anything: silent damage, as a bad disk or a stray write would leave.
fn damage_target(path: &Path) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open target file");
    let len = f.metadata().expect("stat").len();
    let mut off = 4096 + 8192;
    while off + 4096 < len {
        f.write_all_at(&[0xA5; 4096], off).expect("damage");
        off += 1 << 20;
    }
    f.sync_all().expect("sync");
}

const NODES: usize = 3;

fn len(n: usize, i: usize) -> usize {
    3_000_000 + n * 70_001 + i * 13_337
}

/// The step-1 files of every node as node `reader` sees them: (path, seed, length).
fn step1(c: &Cluster, reader: usize) -> Vec<(std::path::PathBuf, u64, usize)> {
    (0..NODES)
        .flat_map(|n| (0..4).map(move |i| (n, i)))
        .map(|(n, i)| {
            let p = c.path(reader, &format!("step-1/rank-{n}-{i}"));
            (p, (n * 100 + i) as u64, len(n, i))
        })
        .collect()
}

fn lose_target(c: &Cluster, t: usize) {
    fs::rename(c.target(t).join("ckptfs-target"), c.target(t).join("gone")).expect("lose a target");
}

/// A target file cut short while two nodes have the space mounted. The node that looks
/// first records the cut in every slot's marker and extends the file again, so its length
/// tells the other node nothing: that one sees its own marker appear. Before any read both
/// say DEGRADED, each node's `rebuild` removes only its own marker, both then say full
/// redundancy, and every file reads back on both nodes. Before the nodes watched their
/// target files, both said full redundancy until a read reached the cut.
#[test]
fn a_target_cut_short_while_nodes_are_mounted_is_seen_by_every_node() {
    let mut c = Cluster::new(2, "512M", 2, LEASE);
    for n in 0..2 {
        c.mount(n, &[]);
    }
    for n in 0..2 {
        write_file(&c.path(n, &format!("rank-{n}")), 500 + n as u64, 6_000_000);
    }
    let dir = c.target(2);
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join("ckptfs-target"))
        .expect("open target file")
        .set_len(4096)
        .expect("cut it short");
    let state = |c: &mut Cluster, n: usize| -> String {
        let t = targets_json(c, n);
        t["targets"][2]["state"]
            .as_str()
            .expect("state")
            .to_string()
    };
    let markers = || -> Vec<String> {
        let mut m: Vec<String> = fs::read_dir(&dir)
            .expect("read target dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".cut-"))
            .collect();
        m.sort();
        m
    };
    for n in 0..2 {
        let s = state(&mut c, n);
        assert!(s.contains("cut short"), "node {n}: {s}");
    }
    let slots = [c.slot_of(0), c.slot_of(1)];
    let name = |s: u32| format!("ckptfs-target.cut-{s}");
    assert!(markers().contains(&name(slots[0])), "{:?}", markers());
    assert!(markers().contains(&name(slots[1])), "{:?}", markers());
    for (n, slot) in slots.into_iter().enumerate() {
        let (st, out, err) = c.ckptfs(&["rebuild".into(), c.nodes[n].mnt.clone().into()]);
        assert!(st.success() && out.contains("nothing lost"), "{out}{err}");
        assert!(
            !markers().contains(&name(slot)),
            "node {n}'s rebuild removes its marker: {:?}",
            markers()
        );
        assert_eq!(state(&mut c, n), "ok");
    }
    for reader in 0..2 {
        for n in 0..2 {
            let p = c.path(reader, &format!("rank-{n}"));
            assert_file_eq(&p, &pattern(500 + n as u64, 6_000_000));
        }
    }
}

#[test]
fn every_node_reads_every_file_with_k_targets_lost_or_damaged_and_rebuild_runs_online() {
    assert!(
        on_targets(),
        "this binary formats its clusters over targets"
    );
    let mut c = Cluster::new(NODES as u32, "768M", NODES, LEASE);
    for n in 0..NODES {
        c.mount(n, &[]);
    }
    for n in 0..NODES {
        for i in 0..4 {
            write_file(
                &c.path(n, &format!("step-1/rank-{n}-{i}")),
                (n * 100 + i) as u64,
                len(n, i),
            );
        }
    }
    for n in 0..NODES {
        c.unmount(n);
    }
    // K = 2: one target gone, another silently damaged.
    lose_target(&c, 1);
    damage_target(&c.target(4).join("ckptfs-target"));
    for n in 0..NODES {
        c.mount(n, &[]);
    }
    for reader in 0..NODES {
        for (p, seed, n) in step1(&c, reader) {
            assert_file_eq(&p, &pattern(seed, n));
        }
    }
    let t = targets_json(&mut c, 0);
    assert_eq!(t["slot"].as_u64(), Some(c.slot_of(0) as u64), "{t:#}");
    // The reads above really went around the lost and the damaged shards.
    let (mut rebuilt, mut repaired) = (0, 0);
    for n in 0..NODES {
        let t = targets_json(&mut c, n);
        rebuilt += t["reconstructed_reads"]
            .as_u64()
            .expect("reconstructed_reads");
        repaired += t["repaired_reads"].as_u64().expect("repaired_reads");
    }
    assert!(
        rebuilt > 0 && repaired > 0,
        "rebuilt {rebuilt}, repaired {repaired}"
    );
    // Every node rebuilds its own segments while the others read and write.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let files: Vec<_> = (0..NODES).map(|r| step1(&c, r)).collect();
    let news: Vec<std::path::PathBuf> = (0..NODES)
        .map(|n| c.path(n, &format!("step-2/rank-{n}")))
        .collect();
    let mnts: Vec<std::path::PathBuf> = (0..NODES).map(|n| c.nodes[n].mnt.clone()).collect();
    std::thread::scope(|s| {
        for (r, fs) in files.iter().enumerate() {
            let stop = &stop;
            s.spawn(move || {
                let mut rounds = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) || rounds == 0 {
                    for (p, seed, n) in fs {
                        assert_file_eq(p, &pattern(*seed, *n));
                    }
                    rounds += 1;
                }
                eprintln!("reader on node {r}: {rounds} rounds during the rebuilds");
            });
        }
        for (n, p) in news.iter().enumerate() {
            s.spawn(move || write_file(p, 7000 + n as u64, 5_000_000));
        }
        for m in &mnts {
            let out = std::process::Command::new(ckptfs_tests::ckptfs_bin())
                .arg("rebuild")
                .arg(m)
                .output()
                .expect("run rebuild");
            assert!(
                out.status.success(),
                "rebuild on {}: {}{}",
                m.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("nothing lost"),
                "rebuild on {}: {text}",
                m.display()
            );
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    // Whatever was written during the rebuilds is on healthy targets too, and a scrub
    // (which reads parity as well) rewrites the damage no read met: every node's report
    // says full redundancy.
    for n in 0..NODES {
        let (st, out, err) = c.ckptfs(&["rebuild".into(), c.nodes[n].mnt.clone().into()]);
        assert!(st.success(), "{out}{err}");
        let (st, out, err) = c.ckptfs(&["scrub".into(), c.nodes[n].mnt.clone().into()]);
        assert!(
            st.success() && out.contains("nothing lost"),
            "scrub: {out}{err}"
        );
        let t = targets_json(&mut c, n);
        assert_eq!(
            t["segments_degraded"].as_array().map(Vec::len),
            Some(0),
            "node {n} after its rebuild: {t:#}"
        );
        assert_eq!(t["segments_lost"].as_u64(), Some(0), "{t:#}");
    }
    // Full redundancy again: two more targets may be lost (target 1 stays lost; its
    // shards were moved by the rebuilds), and everything reads back everywhere.
    for n in 0..NODES {
        c.unmount(n);
    }
    lose_target(&c, 2);
    lose_target(&c, 3);
    for n in 0..NODES {
        c.mount(n, &[]);
    }
    for reader in 0..NODES {
        for (p, seed, n) in step1(&c, reader) {
            assert_file_eq(&p, &pattern(seed, n));
        }
        for n in 0..NODES {
            assert_file_eq(
                &c.path(reader, &format!("step-2/rank-{n}")),
                &pattern(7000 + n as u64, 5_000_000),
            );
        }
    }
    assert_eq!(TARGETS, 6, "the losses above assume six targets");
}
