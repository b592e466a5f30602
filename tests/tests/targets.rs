//! Spaces over several storage targets (`format --target DIR ... --redundancy M+K`): every
//! committed byte survives the loss of any K targets, whether a target's file is gone,
//! fails with EIO in the middle of writes and reads, or holds damaged bytes. Beyond K, reads
//! of what the lost targets held fail with EIO, never with wrong bytes, and `check` names
//! exactly the files and revisions that are lost.

use ckptfs_tests::{assert_file_eq, pattern, test_seed, TestMount};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

const TARGET_FILE: &str = "ckptfs-target";
const HEADER: u64 = 4096;

/// Writes `files` checkpoint files of about `len` bytes (each its own pattern), some with a
/// second revision; returns (name, content) of the current versions.
fn write_checkpoints(m: &TestMount, seed: u64, files: usize, len: usize) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..files {
        let name = format!("ckpt-{i:02}");
        let mut data = pattern(seed ^ i as u64, len + i * 4099);
        fs::write(m.path(&name), &data).expect("write");
        if i % 3 == 0 {
            // A next revision: the same file with a part changed.
            data[1000..5000].copy_from_slice(&pattern(seed ^ 0xabc ^ i as u64, 4000));
            fs::write(m.path(&name), &data).expect("rewrite");
        }
        out.push((name, data));
    }
    out
}

fn targets_json(m: &mut TestMount) -> serde_json::Value {
    let mnt = m.mnt().to_path_buf();
    m.ckptfs_json(&[OsStr::new("targets"), mnt.as_os_str(), OsStr::new("--json")])
}

fn check_json(m: &mut TestMount) -> (i32, serde_json::Value) {
    let mnt = m.mnt().to_path_buf();
    let (st, out, err) = m.ckptfs(&[OsStr::new("check"), mnt.as_os_str(), OsStr::new("--json")]);
    let v = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("check printed non-JSON ({e}): {out}\n{err}"));
    (st.code().unwrap_or(-1), v)
}

/// Reads a file: Ok(bytes), or the errno of a failed read.
fn read(p: &Path) -> Result<Vec<u8>, i32> {
    fs::read(p).map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// Flips one byte in every `stride` bytes of `len` bytes of shard data of a target file.
fn damage_target(dir: &Path, len: u64, stride: u64) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(TARGET_FILE))
        .expect("open target file");
    let mut b = [0u8; 1];
    let mut off = HEADER + 7;
    while off < HEADER + len {
        f.read_exact_at(&mut b, off).unwrap();
        b[0] ^= 0x5a;
        f.write_all_at(&b, off).unwrap();
        off += stride;
    }
    f.sync_all().unwrap();
}

/// Where byte `at` of row `row` of shard `shard` of the first chunk segment placed lies,
/// from the space's `targets` table and `placement` records (FORMAT.md): (segment, target
/// index, offset in the target's file). On slots over targets, the mount's slot (0) places
/// its manifest area first, at the start of its share: chunk segments come after it.
fn shard_byte(backing: &Path, shard: usize, row: u64, at: u64) -> (u64, usize, u64) {
    let table = fs::read(backing.join("targets")).expect("targets table");
    let shard_bytes = u64::from_le_bytes(table[16..24].try_into().unwrap());
    let records = fs::read(backing.join("placement")).expect("placement records");
    let sb = ckptfs_engine::format::Superblock::decode(
        &fs::read(backing.join(ckptfs_engine::format::SUPERBLOCK_FILE)).expect("superblock"),
    )
    .expect("a superblock");
    let first = sb.slot_segments(ckptfs_engine::format::SlotId(0)).start as usize;
    let (seg, rec) = records
        .chunks(128)
        .enumerate()
        .skip(first)
        .find(|(_, r)| r.iter().any(|&b| b != 0))
        .expect("a placed segment");
    let e = 16 + shard * 6;
    let target = u16::from_le_bytes([rec[e], rec[e + 1]]);
    let slot = u32::from_le_bytes(rec[e + 2..e + 6].try_into().unwrap());
    assert_ne!(
        target,
        u16::MAX,
        "shard {shard} of segment {seg} is not placed"
    );
    (
        seg as u64,
        target as usize,
        HEADER + slot as u64 * shard_bytes + row * 4096 + at,
    )
}

fn flip_byte(file: &Path, off: u64) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .expect("open target file");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0xa5;
    f.write_all_at(&b, off).unwrap();
    f.sync_all().unwrap();
}

/// A damaged byte in a parity shard of a written row: reads never see it (they use the data
/// shards), so only the parity pass of `check` can. It names exactly that segment, row and
/// parity shard, says the data is intact and which target to replace, and the space stays
/// clean (less redundancy, nothing lost): through the mount, and offline.
#[test]
fn check_finds_parity_that_disagrees_with_its_row() {
    let seed = test_seed("check_finds_parity_that_disagrees", 0x7a_0006);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let data = pattern(seed, 3 << 20);
    fs::write(m.path("ckpt"), &data).unwrap();
    let (code, v) = check_json(&mut m);
    assert_eq!(code, 0, "{v}");
    assert!(v["parity"]["rows_checked"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(v["parity"]["rows_inconsistent"], 0, "{v}");
    assert_eq!(v["parity_segments"], serde_json::json!([]), "{v}");
    m.unmount();
    // Parity shard 3 (the first of K = 2), row 1.
    let (seg, target, off) = shard_byte(m.backing(), 3, 1, 1234);
    flip_byte(&m.target_dir(target).join(TARGET_FILE), off);
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);
    let expect = |v: &serde_json::Value, how: &str| {
        assert_eq!(v["clean"], true, "{how}: {v}");
        assert_eq!(v["redundancy_full"], false, "{how}: {v}");
        assert_eq!(v["parity"]["rows_inconsistent"], 1, "{how}: {v}");
        assert_eq!(v["parity"]["rows_unrecoverable"], 0, "{how}: {v}");
        assert_eq!(
            v["repaired_chunks"], 0,
            "{how}: reads never used parity: {v}"
        );
        let segs = v["parity_segments"].as_array().unwrap();
        assert_eq!(segs.len(), 1, "{how}: {v}");
        assert_eq!(segs[0]["segment"], seg, "{how}: {v}");
        assert_eq!(segs[0]["targets"][3], target, "{how}: {v}");
        assert_eq!(
            segs[0]["inconsistent"],
            serde_json::json!([{
                "row": 1,
                "parity_shards": [3],
                "damaged_shards": [3],
                "data_read": true
            }]),
            "{how}: {v}"
        );
        let w: Vec<&str> = v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|w| w.as_str())
            .filter(|w| w.starts_with(&format!("segment {seg} row 1: ")))
            .collect();
        assert_eq!(w.len(), 1, "{how}: {v}");
        assert!(
            w[0].contains("every live chunk in the row verified")
                && w[0].contains(&format!(
                    "shard 3 (target {target}) holds damaged or stale bytes"
                ))
                && w[0].contains("ckptfs scrub"),
            "{how}: {}",
            w[0]
        );
    };
    // Exit 1: data intact, but a shard holds wrong bytes (a monitor must hear of it).
    let (code, v) = check_json(&mut m);
    assert_eq!(code, 1, "{v}");
    expect(&v, "mounted");
    m.unmount();
    let b = m.backing().to_path_buf();
    let (st, out, err) = m.ckptfs(&[OsStr::new("check"), b.as_os_str(), OsStr::new("--json")]);
    assert_eq!(st.code(), Some(1), "offline check: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    // A backing directory of several slots is checked slot by slot: this mount's is 0.
    let v = match m.shared_targets() {
        true => v["slots"][0]["report"].clone(),
        false => v,
    };
    expect(&v, "offline");
    let (st, out, err) = m.ckptfs(&[OsStr::new("check"), b.as_os_str()]);
    assert_eq!(st.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("1 inconsistent, 0 degraded (missing shards), 0 unrecoverable")
            && out.contains("DEGRADED: every chunk reads back"),
        "{out}"
    );
}

/// 5 targets, 3+2: with any 2 of them gone every committed file reads back byte-exact,
/// `targets` and `stats` say the space is degraded, and writes go on (with fewer parity
/// shards). A third loss leaves fewer targets than a segment's data needs: mount refuses,
/// saying why.
#[test]
fn any_two_of_five_targets_may_be_lost() {
    let seed = test_seed("any_two_of_five_targets_may_be_lost", 0x7a_0001);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let files = write_checkpoints(&m, seed, 8, 1 << 20);
    let t = targets_json(&mut m);
    assert_eq!(t["redundancy"], "3+2");
    assert!(t["segments_full"].as_u64().unwrap() > 0, "{t}");
    // Every listed revision can lose 2 targets; none is short.
    let listed = |t: &serde_json::Value| -> Vec<(i64, u64)> {
        serde_json::from_value(t["revisions"]["listed"].clone()).expect("revisions.listed")
    };
    let revisions = listed(&t).iter().map(|x| x.1).sum::<u64>();
    assert!(revisions >= files.len() as u64, "{t}");
    assert_eq!(listed(&t), vec![(2, revisions)], "{t}");
    assert_eq!(t["revisions"]["short_total"], 0, "{t}");
    m.unmount();
    let mut all: Vec<usize> = (0..5).collect();
    all.shuffle(&mut rng);
    let lost = &all[..2];
    for &i in lost {
        fs::remove_file(m.target_dir(i).join(TARGET_FILE)).unwrap();
    }
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    let t = targets_json(&mut m);
    for &i in lost {
        let state = t["targets"][i]["state"].as_str().unwrap();
        assert!(state.starts_with("failed"), "target {i}: {state}");
        assert!(
            state.contains("No such file"),
            "target {i} says why: {state}"
        );
    }
    assert!(t["reconstructed_reads"].as_u64().unwrap() > 0, "{t}");
    // With 2 of 5 gone, every revision can lose no more, and each is named.
    assert_eq!(listed(&t), vec![(0, revisions)], "{t}");
    assert_eq!(
        t["revisions"]["short_total"].as_u64(),
        Some(revisions),
        "{t}"
    );
    let mnt = m.mnt().to_path_buf();
    let stats = m.stats_json_of(&mnt);
    assert_eq!(
        stats["revision_redundancy"]["listed"], t["revisions"]["listed"],
        "stats shows the same: {stats}"
    );
    assert!(
        stats["targets"]["segments_full"].as_u64() == Some(0),
        "every segment had a shard on a lost target: {stats}"
    );
    // Degraded writes: 3 healthy targets hold new segments' data shards.
    let after = pattern(seed ^ 77, 3 << 20);
    fs::write(m.path("after"), &after).unwrap();
    m.remount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    assert_file_eq(&m.path("after"), &after);
    m.unmount();
    fs::remove_file(m.target_dir(all[2]).join(TARGET_FILE)).unwrap();
    let (b, mnt) = (m.backing().to_path_buf(), m.mnt().to_path_buf());
    let (st, _, err) = m.ckptfs(&[OsStr::new("mount"), b.as_os_str(), mnt.as_os_str()]);
    assert!(!st.success(), "mount with 3 of 5 targets gone succeeded");
    assert!(
        err.contains("only 2 of the 5 targets") && err.contains("needs 3"),
        "mount's refusal says why: {err}"
    );
}

/// 6 targets, 3+2, 3 lost: segments with 3 shards on them are lost, the others are not.
/// Every file reads back exactly or fails with EIO, never wrong bytes; `check` names
/// exactly the files whose reads fail.
#[test]
fn three_lost_targets_lose_only_what_they_held_and_check_names_it() {
    let seed = test_seed("three_lost_targets_lose_only_what_they_held", 0x7a_0002);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("512M", 6, "3+2");
    let files = write_checkpoints(&m, seed, 16, 2 << 20);
    m.unmount();
    // Three targets that hold three shards of at least one segment (which segments sit on
    // which targets depends on the order the slot's segments were allocated in): lose one
    // target that holds shards, read the targets of a segment it held from `check`, and
    // lose two more of those.
    let mut all: Vec<usize> = (0..6).collect();
    all.shuffle(&mut rng);
    let mut lost = Vec::new();
    for &first in &all {
        let file = m.target_dir(first).join(TARGET_FILE);
        let saved = m.target_dir(first).join("saved-target");
        fs::rename(&file, &saved).unwrap();
        m.mount();
        let (_, v) = check_json(&mut m);
        m.unmount();
        let held: Vec<Vec<usize>> = v["parity_segments"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                s["targets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as usize)
                    .collect()
            })
            .filter(|t: &Vec<usize>| t.contains(&first))
            .collect();
        if held.is_empty() {
            fs::rename(&saved, &file).unwrap();
            continue;
        }
        fs::remove_file(&saved).unwrap();
        let mut others: Vec<usize> = held[rng.random_range(0..held.len())]
            .iter()
            .copied()
            .filter(|&t| t != first)
            .collect();
        others.shuffle(&mut rng);
        lost = vec![first, others[0], others[1]];
        break;
    }
    assert_eq!(lost.len(), 3, "no target holds a shard of any segment");
    for &i in &lost[1..] {
        fs::remove_file(m.target_dir(i).join(TARGET_FILE)).unwrap();
    }
    m.mount();
    let mut failed = BTreeSet::new();
    for (name, data) in &files {
        match read(&m.path(name)) {
            Ok(got) => assert!(got == *data, "{name}: wrong bytes (lost {lost:?})"),
            Err(e) => {
                assert_eq!(e, libc::EIO, "{name}");
                failed.insert(name.clone());
            }
        }
    }
    let (code, v) = check_json(&mut m);
    assert_ne!(code, 0, "check of a space with lost data: {v}");
    let named: BTreeSet<String> = v["damaged_revisions"]
        .as_array()
        .expect("damaged_revisions")
        .iter()
        .filter(|d| d["current"].as_bool() == Some(true))
        .map(|d| {
            d["path"]
                .as_str()
                .unwrap()
                .trim_start_matches('/')
                .to_string()
        })
        .collect();
    assert_eq!(
        named, failed,
        "check names exactly the files whose reads fail (lost targets {lost:?})"
    );
    assert!(
        !failed.is_empty(),
        "3 of 6 targets lost and nothing lost: the test lost its point (seed {seed})"
    );
    // The parity pass lists the rows that lost more shards than K.
    assert!(
        v["parity"]["rows_unrecoverable"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert_eq!(v["parity"]["rows_inconsistent"], 0, "{v}");
    let segs = v["parity_segments"].as_array().unwrap();
    assert!(
        segs.iter()
            .any(|s| s["unrecoverable_rows"].as_u64() > Some(0)
                && s["missing_shards"].as_array().unwrap().len() >= 3),
        "{v}"
    );
}

/// Damaged bytes in 2 of a row's 5 shards: reads return the right bytes and count the
/// repairs, `check` says what it repaired and finds nothing lost. In 3 shards: EIO, never
/// wrong bytes, and `check` names the damage.
#[test]
fn damaged_shards_are_repaired_and_three_never_read_wrong() {
    let seed = test_seed("damaged_shards_are_repaired", 0x7a_0003);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let files = write_checkpoints(&m, seed, 6, 1 << 20);
    // Which targets hold data shards: the ones a cold read reads from (damage to parity
    // shards alone changes no byte a read returns).
    m.remount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    let t = targets_json(&mut m);
    let mut all: Vec<usize> = (0..5)
        .filter(|&i| t["targets"][i]["bytes_read"].as_u64() > Some(0))
        .collect();
    assert!(all.len() >= 3, "reads came from fewer than M targets: {t}");
    m.unmount();
    all.shuffle(&mut rng);
    // Every shard slot in use lies in the first 8 MiB of each target file.
    for &i in &all[..2] {
        damage_target(&m.target_dir(i), 8 << 20, 1021 + rng.random_range(0..64));
    }
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    let t = targets_json(&mut m);
    assert!(t["repaired_reads"].as_u64().unwrap() > 0, "{t}");
    // Nothing is lost, but shards hold damaged bytes: exit 1, `clean` data.
    let (code, v) = check_json(&mut m);
    assert_eq!(code, 1, "nothing is lost, redundancy is: {v}");
    assert_eq!(
        (&v["clean"], &v["redundancy_full"]),
        (&true.into(), &false.into()),
        "{v}"
    );
    assert!(v["repaired_chunks"].as_u64().unwrap() > 0, "{v}");
    m.unmount();
    damage_target(&m.target_dir(all[2]), 8 << 20, 1021);
    m.mount();
    let mut failed = 0;
    for (name, data) in &files {
        match read(&m.path(name)) {
            Ok(got) => assert!(got == *data, "{name}: wrong bytes"),
            Err(e) => {
                assert_eq!(e, libc::EIO, "{name}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0, "3 damaged targets and every read passed");
    // Past K the status says lost, with counts, before and after `check` (before, it said
    // full redundancy: every target's file was there, so no state was short).
    let lost_said = |m: &mut TestMount, when: &str| {
        let t = targets_json(m);
        assert!(t["segments_lost"].as_u64() > Some(0), "{when}: {t:#}");
        assert!(t["chunks_lost_reads"].as_u64() > Some(0), "{when}: {t:#}");
        let mnt = m.mnt().to_path_buf();
        let text = m.ckptfs_ok(&[OsStr::new("targets"), mnt.as_os_str()]);
        assert!(
            text.contains("LOST") && !text.contains("(full)"),
            "{when}: `ckptfs targets` must say LOST:\n{text}"
        );
        let stats = m.ckptfs_ok(&[OsStr::new("stats"), mnt.as_os_str()]);
        assert!(
            stats.contains("LOST"),
            "{when}: `ckptfs stats` must say LOST:\n{stats}"
        );
        let prom = m.ckptfs_ok(&[
            OsStr::new("stats"),
            mnt.as_os_str(),
            OsStr::new("--prometheus"),
        ]);
        assert!(
            prom.lines()
                .any(|l| l.starts_with("ckptfs_segments_lost{") && !l.ends_with(" 0")),
            "{when}: Prometheus must count the lost segments:\n{prom}"
        );
    };
    lost_said(&mut m, "after the reads");
    let (code, v) = check_json(&mut m);
    assert_ne!(code, 0, "{v}");
    assert!(
        !v["damaged_revisions"].as_array().unwrap().is_empty(),
        "{v}"
    );
    assert!(
        v["parity"]["rows_unrecoverable"].as_u64() > Some(0),
        "the parity summary counts the unrecoverable rows: {:#}",
        v["parity"]
    );
    lost_said(&mut m, "after check");
}

/// Two targets fail (EIO, sticky) at seeded moments while checkpoints are written and
/// read: every close that returned is readable byte-exact, then and after a remount, and
/// the failed targets stay failed across the remount (their shards are stale).
#[test]
fn targets_failing_during_writes_and_reads_lose_nothing_acknowledged() {
    let seed = test_seed("targets_failing_during_writes", 0x7a_0004);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let mut all: Vec<usize> = (0..5).collect();
    all.shuffle(&mut rng);
    let faults = format!(
        "target{}:write:{}:EIO:sticky,target{}:read:{}:EIO:sticky",
        all[0],
        rng.random_range(0..12),
        all[1],
        rng.random_range(0..12)
    );
    m.set_env("CKPTFS_FAULTS", &faults);
    m.remount();
    let mut files = Vec::new();
    for i in 0..10 {
        let name = format!("step-{i}");
        let data = pattern(seed ^ i, (1 << 20) + i as usize * 777);
        fs::write(m.path(&name), &data).unwrap_or_else(|e| panic!("{name} ({faults}): {e}"));
        files.push((name, data));
        // Reads in between, so the read fault lands amid the writes.
        let (n, d) = &files[rng.random_range(0..files.len())];
        assert_file_eq(&m.path(n), d);
    }
    for (n, d) in &files {
        assert_file_eq(&m.path(n), d);
    }
    let t = targets_json(&mut m);
    let failed: Vec<usize> = (0..5)
        .filter(|&i| t["targets"][i]["state"].as_str() != Some("ok"))
        .collect();
    assert!(
        failed.contains(&all[0]),
        "the target that failed a write is failed ({faults}): {t}"
    );
    m.set_env("CKPTFS_FAULTS", "");
    m.remount();
    for (n, d) in &files {
        assert_file_eq(&m.path(n), d);
    }
    let t = targets_json(&mut m);
    assert!(
        t["targets"][all[0]]["state"]
            .as_str()
            .unwrap()
            .starts_with("failed"),
        "a target that failed stays failed after a remount ({faults}): {t}"
    );
}

/// `ckptfs rebuild MNT --replace DEAD=NEW --json`.
fn rebuild_replace(mnt: &Path, dead: usize, new: &Path) -> std::process::Output {
    std::process::Command::new(ckptfs_tests::ckptfs_bin())
        .arg("rebuild")
        .arg(mnt)
        .arg("--replace")
        .arg(format!("{dead}={}", new.display()))
        .arg("--json")
        .output()
        .expect("run ckptfs rebuild")
}

/// A target dies; `rebuild --replace` moves its shards to a new one while writers and
/// readers run. Afterwards the space has full redundancy again (`targets` says so, and
/// losing two more targets loses nothing), and every file reads back byte-exact.
#[test]
fn rebuild_onto_a_replacement_runs_online_and_restores_full_redundancy() {
    let seed = test_seed("rebuild_onto_a_replacement", 0x7a_0005);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("512M", 5, "3+2");
    let mut files = write_checkpoints(&m, seed, 8, 1 << 20);
    m.unmount();
    let dead = rng.random_range(0..5);
    fs::remove_file(m.target_dir(dead).join(TARGET_FILE)).unwrap();
    m.mount();
    let new = m.root().join("targets").join("replacement");
    if m.shared_targets() {
        // Slots over targets: every node would have to open the new target before any
        // shard lands on it, so `--replace` is refused, saying what to run instead.
        let st = rebuild_replace(m.mnt(), dead, &new);
        let err = String::from_utf8_lossy(&st.stderr);
        assert!(
            !st.status.success(),
            "rebuild --replace of a shared space ran"
        );
        assert!(
            err.contains("without --replace") && !new.exists(),
            "the refusal says what to do and touches nothing: {err}"
        );
        for (name, data) in &files {
            assert_file_eq(&m.path(name), data);
        }
        return;
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let written = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut out = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || i < 3 {
                let name = format!("during-{i}");
                let data = pattern(seed ^ 0xd0 ^ i, 700_000 + i as usize * 1000);
                fs::write(m.path(&name), &data).expect("write during rebuild");
                out.push((name, data));
                i += 1;
            }
            out
        });
        let reader = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || n < 3 {
                for (name, data) in &files {
                    assert_file_eq(&m.path(name), data);
                }
                n += 1;
            }
        });
        let st = rebuild_replace(m.mnt(), dead, &new);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(
            st.status.success(),
            "rebuild: {}{}",
            String::from_utf8_lossy(&st.stdout),
            String::from_utf8_lossy(&st.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        assert!(v["segments_rebuilt"].as_u64().unwrap() > 0, "{v}");
        reader.join().unwrap();
        writer.join().unwrap()
    });
    files.extend(written);
    // Segments placed while the rebuild ran (before the replacement was in) get their
    // missing shards from a second pass.
    let mnt = m.mnt().to_path_buf();
    m.ckptfs_ok(&[OsStr::new("rebuild"), mnt.as_os_str()]);
    let t = targets_json(&mut m);
    assert!(
        t["segments_degraded"].as_array().unwrap().is_empty()
            && t["segments_lost"].as_u64() == Some(0),
        "after rebuild: {t}"
    );
    assert!(
        t["targets"][dead]["state"]
            .as_str()
            .unwrap()
            .starts_with("retired"),
        "{t}"
    );
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    // Full redundancy, shown the hard way: two more targets go.
    m.unmount();
    let mut others: Vec<usize> = (0..5).filter(|&i| i != dead).collect();
    others.shuffle(&mut rng);
    for &i in &others[..2] {
        fs::remove_file(m.target_dir(i).join(TARGET_FILE)).unwrap();
    }
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
}

/// What `format --target` refuses, with the reason, before changing anything.
#[test]
fn target_formats_that_cannot_work_are_refused() {
    let root = ckptfs_tests::TempDir::new("targets-bad");
    let r = root.path();
    let t = |i: usize| r.join(format!("t{i}")).to_string_lossy().into_owned();
    fs::create_dir(r.join("busy")).unwrap();
    fs::write(r.join("busy/x"), b"x").unwrap();
    let backing = r.join("backing").to_string_lossy().into_owned();
    let busy = r.join("busy").to_string_lossy().into_owned();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![t(0), t(1), t(2), t(3)],
            "needs at least 5 targets; 4 given",
        ),
        (
            vec![
                format!("{}:domain=a", t(0)),
                format!("{}:domain=a", t(1)),
                t(2),
                t(3),
                t(4),
            ],
            "distinct failure domains",
        ),
        (vec![t(0), t(0), t(1), t(2), t(3)], "given twice"),
        (vec![busy, t(1), t(2), t(3), t(4)], "not empty"),
    ];
    for (targets, want) in cases {
        let mut args: Vec<String> = vec![
            "format".into(),
            backing.clone(),
            "--size".into(),
            "128M".into(),
            "--redundancy".into(),
            "3+2".into(),
        ];
        for x in &targets {
            args.push("--target".into());
            args.push(x.clone());
        }
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        let (st, _, err) = ckptfs_tests::run_ckptfs(r, "format", &args);
        assert!(!st.success(), "{targets:?} formatted");
        assert!(err.contains(want), "{targets:?}: {err}");
        assert!(
            !r.join("backing").join("superblock").exists(),
            "a refused format left a space"
        );
    }
    let args = [
        OsStr::new("format"),
        OsStr::new(&backing),
        OsStr::new("--size"),
        OsStr::new("128M"),
        OsStr::new("--redundancy"),
        OsStr::new("3+2"),
    ];
    let (st, _, err) = ckptfs_tests::run_ckptfs(r, "format", &args);
    assert!(!st.success() && err.contains("--target"), "{err}");
}

fn mirror_holders(m: &mut TestMount) -> Vec<usize> {
    let t = targets_json(m);
    t["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter(|x| x["metadata_mirror"] == true)
        .map(|x| x["index"].as_u64().unwrap() as usize)
        .collect()
}

/// Names and bytes of checkpoints written (`write_checkpoints`).
type Checkpoints = Vec<(String, Vec<u8>)>;

/// Five targets (3+2) with `files` checkpoints of 1 MiB, and the K+1 = 3 targets holding the
/// metadata mirror; None (said) where targets are shared by slots, which keep no mirrors.
fn mirrored_space(seed: u64, files: usize) -> Option<(TestMount, Checkpoints, Vec<usize>)> {
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let files = write_checkpoints(&m, seed, files, 1 << 20);
    let holders = mirror_holders(&mut m);
    if m.shared_targets() {
        println!("slots over targets keep no metadata mirrors: nothing to damage");
        assert!(holders.is_empty(), "{holders:?}");
        return None;
    }
    assert_eq!(holders.len(), 3, "K+1 = 3 holders");
    Some((m, files, holders))
}

fn recover(m: &mut TestMount, from: usize) -> (bool, serde_json::Value, String) {
    let (b, from) = (m.backing().to_path_buf(), m.target_dir(from));
    let (st, out, err) = m.ckptfs(&[
        OsStr::new("recover"),
        b.as_os_str(),
        OsStr::new("--from"),
        from.as_os_str(),
        OsStr::new("--json"),
    ]);
    let v = serde_json::from_str(out.trim()).unwrap_or(serde_json::Value::Null);
    (st.success(), v, err)
}

/// The backing directory's disk dies: the metadata lives on in the mirrors K+1 targets
/// hold, and `ckptfs recover` rebuilds the backing directory from them, also with one
/// holder lost along with it. A holder whose mirror failed while mounted is never copied
/// from: what was written after it failed is in the recovered space.
#[test]
fn a_lost_backing_directory_is_recovered_from_the_targets_metadata_mirrors() {
    let seed = test_seed("a_lost_backing_directory_is_recovered", 0x7a_0009);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let mut files = write_checkpoints(&m, seed, 6, 1 << 20);
    let holders = mirror_holders(&mut m);
    if m.shared_targets() {
        // Slots over targets keep no mirrors (each slot's table is its node's; FORMAT.md
        // "Slots over targets"): none is listed, and `recover` refuses, saying why.
        assert!(
            holders.is_empty(),
            "mirrors listed on a shared space: {holders:?}"
        );
        m.unmount();
        let gone = m.root().join("backing-gone");
        fs::rename(m.backing(), &gone).unwrap();
        let (ok, _, err) = recover(&mut m, 0);
        assert!(!ok && err.contains("metadata mirror"), "recover: {err}");
        fs::rename(&gone, m.backing()).unwrap();
        return;
    }
    assert_eq!(holders.len(), 3, "K+1 = 3 holders");
    for &h in &holders {
        for f in [
            "ckptfs-meta",
            "ckptfs-placement",
            "ckptfs-table",
            "ckptfs-superblock",
        ] {
            assert!(m.target_dir(h).join(f).is_file(), "target {h} lacks {f}");
        }
    }
    let plain = (0..5).find(|i| !holders.contains(i)).unwrap();
    m.unmount();

    // The backing directory and one holder's disk die together.
    let gone = holders[rng.random_range(0..holders.len())];
    fs::remove_dir_all(m.backing()).unwrap();
    for e in fs::read_dir(m.target_dir(gone)).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    let (ok, _, err) = recover(&mut m, plain);
    assert!(!ok && err.contains("holds no metadata mirror"), "{err}");
    let from = *holders.iter().find(|h| **h != gone).unwrap();
    let (ok, v, err) = recover(&mut m, from);
    assert!(ok, "recover: {err}");
    assert_ne!(v["holder"].as_u64(), Some(gone as u64), "{v}");
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    // Data intact; the lost holder's shards are missing, so less redundancy: exit 1.
    let (code, c) = check_json(&mut m);
    assert_eq!(code, 1, "check after recovery: {c}");
    assert_eq!(c["clean"], true, "check after recovery: {c}");
    assert_eq!(c["redundancy_full"], false, "check after recovery: {c}");
    // The lost target is failed; the mirror moved to healthy targets.
    let now = mirror_holders(&mut m);
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(!now.contains(&gone), "{now:?}");
    let (ok, _, err) = recover(&mut m, now[0]);
    assert!(
        !ok && err.contains("still holds a space's metadata"),
        "{err}"
    );

    // A holder's mirror fails mid-mount: dropped, its flag cleared on the others.
    let failing = now[1];
    m.unmount();
    m.set_env(
        "CKPTFS_FAULTS",
        &format!("mirror{failing}:write:3:EIO:sticky"),
    );
    m.mount();
    let late = pattern(seed ^ 0x1a7e, 2 << 20);
    fs::write(m.path("late"), &late).unwrap();
    files.push(("late".to_string(), late));
    let after = mirror_holders(&mut m);
    assert!(
        !after.contains(&failing),
        "the failed mirror is still listed: {after:?}"
    );
    m.unmount();
    m.set_env("CKPTFS_FAULTS", "");
    fs::remove_dir_all(m.backing()).unwrap();
    let (ok, v, err) = recover(&mut m, failing);
    assert!(ok, "recover: {err}");
    assert_ne!(
        v["holder"].as_u64(),
        Some(failing as u64),
        "recovered from the stale mirror: {v}"
    );
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
}

/// A holder's copy of the metadata table removed, and another's placement records replaced
/// by a copy, while the space is mounted (a cleanup of a target directory, a restore): both
/// are dropped as mirrors at once, so `targets` lists only the untouched holder and says
/// there are fewer than K+1, and `recover` copies from that one. Before, writes into the
/// open files kept succeeding, status listed all three, and `scrub` compared the open
/// files and found them whole, while the paths `recover` reads held no copy or a stale one.
#[test]
fn a_metadata_mirror_removed_or_replaced_while_mounted_is_no_longer_counted() {
    let seed = test_seed("a_metadata_mirror_removed_or_replaced", 0x7a_000c);
    let Some((mut m, mut files, holders)) = mirrored_space(seed, 4) else {
        return;
    };
    let (gone, replaced, kept) = (holders[0], holders[1], holders[2]);
    let mnt = m.mnt().to_path_buf();
    let text = m.ckptfs_ok(&[OsStr::new("stats"), mnt.as_os_str()]);
    assert!(!text.contains("FEWER THAN"), "{text}");
    fs::remove_file(m.target_dir(gone).join("ckptfs-meta")).unwrap();
    let placement = m.target_dir(replaced).join("ckptfs-placement");
    let copy = m.root().join("placement-copy");
    fs::copy(&placement, &copy).unwrap();
    fs::rename(&copy, &placement).unwrap();
    assert_eq!(mirror_holders(&mut m), [kept], "seen by the next status");
    for cmd in ["targets", "stats"] {
        let text = m.ckptfs_ok(&[OsStr::new(cmd), mnt.as_os_str()]);
        assert!(
            text.contains("FEWER THAN K+1 = 3 metadata mirrors (1)"),
            "{cmd}: {text}"
        );
    }
    let prom = m.ckptfs_ok(&[
        OsStr::new("stats"),
        mnt.as_os_str(),
        OsStr::new("--prometheus"),
    ]);
    assert!(
        prom.lines()
            .any(|l| l.starts_with("ckptfs_metadata_mirrors{") && l.ends_with(" 1")),
        "{prom}"
    );
    // Writes go on, committed to the primary and the remaining holder.
    let late = pattern(seed ^ 0x1a7e, 3 << 20);
    fs::write(m.path("late"), &late).unwrap();
    files.push(("late".to_string(), late));
    let s = m.ckptfs_json(&[OsStr::new("scrub"), mnt.as_os_str(), OsStr::new("--json")]);
    assert_eq!(s["mirror_copies_checked"], 2, "1 holder x 2 files: {s}");
    assert_eq!(s["chunks_lost"], 0, "{s}");
    m.unmount();
    fs::remove_dir_all(m.backing()).unwrap();
    let (ok, v, err) = recover(&mut m, gone);
    assert!(ok, "recover: {err}");
    assert_eq!(v["holder"].as_u64(), Some(kept as u64), "{v}");
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    let (code, c) = check_json(&mut m);
    assert_eq!(code, 0, "check after recovery: {c}");
    assert_eq!(mirror_holders(&mut m).len(), 3, "K+1 holders again");
}

/// Silent damage on a metadata mirror holder's disk (its copies of the metadata table, the
/// placement records and the targets table) is found by `ckptfs scrub` and mended from the
/// primary while the space stays mounted, so that the copy `ckptfs recover` rebuilds a lost
/// backing directory from is whole. Before, nothing looked at the copies while mounted.
#[test]
fn damage_on_a_metadata_mirror_is_found_and_mended_by_scrub() {
    let seed = test_seed("damage_on_a_metadata_mirror", 0x7a_000a);
    let Some((mut m, files, holders)) = mirrored_space(seed, 6) else {
        return;
    };
    let h = holders[(seed % 3) as usize];
    let dir = m.target_dir(h);
    let meta = dir.join("ckptfs-meta");
    let len = fs::metadata(&meta).unwrap().len();
    assert!(len > 3 * 4096, "a metadata table of {len} bytes");
    // Two blocks of the table, one of the placement records, and the table of targets
    // (through the page cache, as damage on the disk under files the daemon has open reads).
    flip_byte(&meta, len / 3);
    flip_byte(&meta, 2 * len / 3);
    flip_byte(&dir.join("ckptfs-placement"), 100);
    flip_byte(&dir.join("ckptfs-table"), 20);
    let mnt = m.mnt().to_path_buf();
    let scrub = |m: &mut TestMount| -> serde_json::Value {
        m.ckptfs_json(&[OsStr::new("scrub"), mnt.as_os_str(), OsStr::new("--json")])
    };
    let s = scrub(&mut m);
    println!("scrub: {s}");
    assert_eq!(s["mirror_copies_checked"], 6, "3 holders x 2 files: {s}");
    assert!(
        s["mirror_blocks_rewritten"].as_u64().unwrap_or(0) >= 3,
        "the three damaged blocks found and rewritten: {s}"
    );
    assert!(
        s["mirror_files_rewritten"].as_u64().unwrap_or(0) >= 1,
        "the damaged table of targets rewritten: {s}"
    );
    assert_eq!(s["chunks_lost"], 0, "{s}");
    assert!(
        s["mirror_failures"]
            .as_array()
            .is_some_and(|a| a.is_empty()),
        "{s}"
    );
    let again = scrub(&mut m);
    assert_eq!(
        again["mirror_blocks_rewritten"], 0,
        "mended for good: {again}"
    );
    assert_eq!(again["mirror_files_rewritten"], 0, "{again}");
    assert_eq!(mirror_holders(&mut m), holders, "still the mirrors");
    // The backing directory's disk dies: the mended copy is what comes back.
    m.unmount();
    fs::remove_dir_all(m.backing()).unwrap();
    let (ok, v, err) = recover(&mut m, h);
    assert!(ok, "recover: {err}");
    println!("recover: {v}");
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
    let (code, c) = check_json(&mut m);
    assert_eq!(code, 0, "check after recovery: {c}");
}

/// Damage on a holder's metadata mirror made while the space was not mounted: the next
/// read-write open (here an offline `ckptfs check`, which opens the space to run) rewrites
/// the copy from the primary, and says so, naming the target and the file, instead of
/// copying over it unseen as every open did before. A second open finds nothing, and the
/// mended copies equal the primary byte for byte.
#[test]
fn damage_on_a_metadata_mirror_while_unmounted_is_reported_when_the_space_is_opened() {
    let seed = test_seed("mirror_damage_while_unmounted", 0x7a_000b);
    let Some((mut m, files, holders)) = mirrored_space(seed, 4) else {
        return;
    };
    m.unmount();
    let (h, g) = (
        holders[(seed % 3) as usize],
        holders[(seed as usize + 1) % 3],
    );
    let meta = m.target_dir(h).join("ckptfs-meta");
    let len = fs::metadata(&meta).unwrap().len();
    flip_byte(&meta, len / 2);
    let placement = m.target_dir(g).join("ckptfs-placement");
    let plen = fs::metadata(&placement).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&placement)
        .unwrap()
        .set_len(plen / 2)
        .unwrap();
    let b = m.backing().to_path_buf();
    let check_offline = |m: &mut TestMount| -> Vec<String> {
        let (st, out, err) = m.ckptfs(&[OsStr::new("check"), b.as_os_str(), OsStr::new("--json")]);
        let v: serde_json::Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("check printed non-JSON ({e}): {out}\n{err}"));
        assert_eq!(st.code(), Some(0), "clean: the primary is intact: {v}");
        v["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .map(|w| w.as_str().unwrap_or_default().to_string())
            .filter(|w| w.contains("metadata mirror"))
            .collect()
    };
    let found = check_offline(&mut m);
    println!("{found:#?}");
    let named = |t: usize, file: &str, how: &str| {
        found
            .iter()
            .any(|w| w.contains(&format!("target {t} ")) && w.contains(file) && w.contains(how))
    };
    assert!(named(h, "ckptfs-meta", "1 4 KiB block"), "{found:?}");
    assert!(named(g, "ckptfs-placement", "in length"), "{found:?}");
    assert_eq!(found.len(), 2, "nothing else differed: {found:?}");
    assert_eq!(
        fs::read(&meta).unwrap(),
        fs::read(b.join("meta.redb")).unwrap()
    );
    assert_eq!(
        fs::read(&placement).unwrap(),
        fs::read(b.join("placement")).unwrap()
    );
    let again = check_offline(&mut m);
    assert!(again.is_empty(), "mended at the first open: {again:?}");
    m.mount();
    for (name, data) in &files {
        assert_file_eq(&m.path(name), data);
    }
}

/// `format --force` over a space whose targets hold what a mount leaves there (the metadata
/// mirrors) and a cut marker: the space is made afresh, and nothing of the old one stays
/// to be taken for the new one's (a stale marker would count a healthy target as cut).
/// Before, format refused such a target directory as "not a ckptfs target" after the first
/// mount. A directory holding anything else is still refused, with the name it holds.
#[test]
fn format_force_remakes_a_space_whose_targets_hold_mirrors_and_markers() {
    let seed = test_seed("format_force_remakes_a_targets_space", 0x7a_0010);
    let mut m = TestMount::with_targets("256M", 3, "2+1");
    fs::write(m.path("old"), pattern(seed, 1 << 20)).unwrap();
    m.unmount();
    fs::write(m.target_dir(0).join("ckptfs-target.cut-0"), "4096\n").unwrap();
    let mut args: Vec<std::ffi::OsString> = vec![
        "format".into(),
        m.backing().into(),
        "--size".into(),
        "256M".into(),
        "--redundancy".into(),
        "2+1".into(),
        "--force".into(),
    ];
    if let Some(n) = ckptfs_tests::targets_slots() {
        args.extend(["--slots".into(), n.to_string().into()]);
    }
    for i in 0..3 {
        args.extend(["--target".into(), m.target_dir(i).into()]);
    }
    let stray = m.target_dir(2).join("notes.txt");
    fs::write(&stray, "mine").unwrap();
    let a: Vec<&OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (st, out, err) = m.ckptfs(&a);
    assert!(
        !st.success() && err.contains("notes.txt") && err.contains("not a ckptfs target"),
        "{out}{err}"
    );
    fs::remove_file(&stray).unwrap();
    let (st, out, err) = m.ckptfs(&a);
    assert!(st.success(), "{out}{err}");
    for i in 0..3 {
        let names: Vec<String> = fs::read_dir(m.target_dir(i))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["ckptfs-target"],
            "target {i} holds only the new file"
        );
    }
    m.mount();
    assert!(!m.path("old").exists(), "a new space");
    let t = targets_json(&mut m);
    for i in 0..3 {
        assert_eq!(t["targets"][i]["state"], "ok", "{t}");
    }
}
