//! Repair over erasure-coded targets uses only verified data (issue 36). A rebuild used to
//! reconstruct from whatever the shards held and encode it into the new targets: silent
//! damage on one target, within the budget of a 3+2 space, became permanent loss after two
//! rebuilds that both reported "0 lost". Now every chunk is checked against its blake3
//! before anything is encoded from it, and what is found damaged on the way is rewritten.
//!
//! - damage on one target, then two healthy targets replaced: every byte survives, and
//!   afterwards any two targets may be lost;
//! - damage on one target, then a target lost and rebuilt: likewise;
//! - `check --json` names the damaged data shard, not the healthy parity shards;
//! - status tells the truth: a target whose shards fail to read is shown degraded, and the
//!   revisions' redundancy drops, while the mount lasts; `ckptfs scrub` repairs it;
//! - a target file cut short while unmounted is extended again at mount, and `ckptfs scrub`
//!   repairs it in place; it counts as short of shards (status, `check`) from the mount on
//!   and across remounts, and `ckptfs rebuild` repairs it too;
//! - seeded: damage on up to K targets (a lost target counting as one), round after round of
//!   rebuilds and scrubs, with new checkpoints in between: nothing committed is lost.
//!   `CKPTFS_DAMAGE_ROUNDS` sets the rounds (default 3), `CKPTFS_SEED` replays.

use ckptfs_tests::{assert_file_eq, pattern, test_seed, TestMount};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const TARGET_FILE: &str = "ckptfs-target";
const HEADER: u64 = 4096;
const MIB: u64 = 1 << 20;

/// Flips `n` random bytes among the first `span` bytes of shard slots of a target file.
fn damage(dir: &Path, rng: &mut SmallRng, n: usize, span: u64) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(TARGET_FILE))
        .expect("open target file");
    let mut b = [0u8; 1];
    for _ in 0..n {
        let off = HEADER + rng.random_range(0..span);
        f.read_exact_at(&mut b, off).unwrap();
        b[0] ^= 0x5a;
        f.write_all_at(&b, off).unwrap();
    }
    f.sync_all().unwrap();
}

/// Drops the page cache, so reads of the target files really come from the disk (they go
/// through the page cache, where the bytes before a repair could still be).
fn drop_caches() {
    if let Err(e) = fs::write("/proc/sys/vm/drop_caches", b"3") {
        println!("cannot drop the page cache ({e}): reads may come from it");
    }
}

fn json(m: &mut TestMount, args: &[&str]) -> serde_json::Value {
    let mnt = m.mnt().to_path_buf();
    let mut a: Vec<&OsStr> = vec![OsStr::new(args[0]), mnt.as_os_str()];
    a.extend(args[1..].iter().map(OsStr::new));
    a.push(OsStr::new("--json"));
    m.ckptfs_json(&a)
}

/// `ckptfs rebuild MNT --replace OLD=NEW --json`: must succeed, lose nothing and verify.
fn replace(m: &mut TestMount, old: &str, new: &Path) -> serde_json::Value {
    let arg = format!("{old}={}", new.display());
    let v = json(m, &["rebuild", "--replace", &arg]);
    println!("rebuild --replace {arg}: {v}");
    assert_eq!(v["chunks_lost"], 0, "{v}");
    assert_eq!(v["segments_lost"], 0, "{v}");
    assert!(v["chunks_verified"].as_u64().unwrap() > 0, "{v}");
    v
}

/// The directories of the targets in use (state not failed or retired).
fn live_targets(m: &mut TestMount) -> Vec<(usize, PathBuf)> {
    let t = json(m, &["targets"]);
    t["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| {
            let s = x["state"].as_str().unwrap();
            !s.starts_with("failed") && !s.starts_with("retired")
        })
        .map(|x| {
            (
                x["index"].as_u64().unwrap() as usize,
                PathBuf::from(x["path"].as_str().unwrap()),
            )
        })
        .collect()
}

/// `ckptfs check MNT --json`: its exit status and report (which need not be clean).
fn check_json(m: &mut TestMount) -> (Option<i32>, serde_json::Value) {
    let mnt = m.mnt().to_path_buf();
    let (st, out, err) = m.ckptfs(&[OsStr::new("check"), mnt.as_os_str(), OsStr::new("--json")]);
    let v = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("check printed non-JSON ({e}): {out}\n{err}"));
    (st.code(), v)
}

fn check_clean(m: &mut TestMount, how: &str) {
    let (code, v) = check_json(m);
    assert!(code == Some(0) && v["clean"] == true, "{how}: {v}");
    assert_eq!(
        v["parity"]["rows_inconsistent"], 0,
        "{how}: every row repaired: {v}"
    );
}

/// Damage on target 0, then `order` of replacements; afterwards two more targets go and
/// every byte must still read back.
fn damage_then_rebuild(name: &str, lose_first: bool) {
    let seed = test_seed(name, 0x36_0100 + lose_first as u64);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("512M", 5, "3+2");
    let data = pattern(seed, 48 * MIB as usize);
    fs::write(m.path("ckpt"), &data).unwrap();
    m.unmount();
    // 2000 flipped bytes over target 0's shards: silent damage, within the budget.
    damage(&m.target_dir(0), &mut rng, 2000, 16 * MIB);
    if lose_first {
        fs::remove_file(m.target_dir(4).join(TARGET_FILE)).unwrap();
    }
    drop_caches();
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);
    let root = m.root().join("targets");
    let new = |i: usize| root.join(format!("new{i}"));
    let v = if lose_first {
        replace(&mut m, "4", &new(1))
    } else {
        let v = replace(&mut m, "3", &new(1));
        replace(&mut m, "4", &new(2));
        v
    };
    assert!(
        v["chunks_repaired"].as_u64().unwrap() > 0 && v["blocks_rewritten"].as_u64().unwrap() > 0,
        "the damage on target 0 was found and rewritten: {v}"
    );
    let t = json(&mut m, &["targets"]);
    assert!(
        t["segments_degraded"].as_array().unwrap().is_empty() && t["segments_lost"] == 0,
        "{t}"
    );
    m.unmount();
    drop_caches();
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);
    // The replaced targets are named retired at the mount, not as failed ones that
    // `rebuild` has still to replace.
    let log = m.log_tail();
    assert!(
        log.contains("is retired") && !log.contains("may be stale"),
        "{log}"
    );
    check_clean(&mut m, "after the rebuild");
    // Full redundancy, the hard way: two more of the targets holding the data go.
    let mut live = live_targets(&mut m);
    live.shuffle(&mut rng);
    m.unmount();
    for (i, dir) in &live[..2] {
        println!("losing target {i} ({})", dir.display());
        fs::remove_file(dir.join(TARGET_FILE)).unwrap();
    }
    drop_caches();
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);
}

/// The first order: damage, then two healthy targets replaced one after the other.
#[test]
fn damage_then_two_healthy_targets_replaced_loses_nothing() {
    damage_then_rebuild("damage_then_two_healthy_targets_replaced", false);
}

/// The routine case: damage, a target lost for real and rebuilt onto a new one.
#[test]
fn damage_then_a_lost_target_rebuilt_loses_nothing() {
    damage_then_rebuild("damage_then_a_lost_target_rebuilt", true);
}

/// A damaged byte in data shard 1 makes both parity shards disagree with the data as
/// stored; `check --json` must name shard 1 as the damaged one, not the healthy parity.
#[test]
fn check_names_the_damaged_data_shard_not_the_healthy_parity() {
    let seed = test_seed("check_names_the_damaged_data_shard", 0x36_0200);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let data = pattern(seed, 3 * MIB as usize);
    fs::write(m.path("ckpt"), &data).unwrap();
    m.unmount();
    // Data shard 1, row 1 (the first segment placed; FORMAT.md's placement record).
    let table = fs::read(m.backing().join("targets")).unwrap();
    let shard_bytes = u64::from_le_bytes(table[16..24].try_into().unwrap());
    let records = fs::read(m.backing().join("placement")).unwrap();
    let rec = records
        .chunks(128)
        .find(|r| r.iter().any(|&b| b != 0))
        .unwrap();
    let e = 16 + 6;
    let target = u16::from_le_bytes([rec[e], rec[e + 1]]) as usize;
    let slot = u32::from_le_bytes(rec[e + 2..e + 6].try_into().unwrap()) as u64;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.target_dir(target).join(TARGET_FILE))
        .unwrap();
    let off = HEADER + slot * shard_bytes + 4096 + 321;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[b[0] ^ 0xa5], off).unwrap();
    f.sync_all().unwrap();
    drop(f);
    drop_caches();
    m.mount();
    let (code, v) = check_json(&mut m);
    assert_eq!(code, Some(1), "a damaged shard is damage: {v}");
    let segs = v["parity_segments"].as_array().unwrap();
    let rows: Vec<&serde_json::Value> = segs
        .iter()
        .flat_map(|s| s["inconsistent"].as_array().unwrap().iter())
        .collect();
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(rows[0]["parity_shards"], serde_json::json!([3, 4]), "{v}");
    assert_eq!(rows[0]["damaged_shards"], serde_json::json!([1]), "{v}");
    let w: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains("holds damaged or stale bytes"))
        .collect();
    assert_eq!(w.len(), 1, "{v}");
    assert!(
        w[0].contains(&format!("shard 1 (target {target}) holds damaged")),
        "{}",
        w[0]
    );
    // `scrub` rewrites it; the row is consistent again.
    let s = json(&mut m, &["scrub"]);
    assert_eq!(
        (s["chunks_lost"].as_u64(), s["blocks_rewritten"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
    check_clean(&mut m, "after scrub");
}

/// A target's file cut short while mounted: reads of its shards fail. `targets` and `stats`
/// (text, JSON, Prometheus) show it degraded with its read errors counted, the revisions'
/// redundancy drops, the log says so once rather than once per read, and `scrub` rewrites
/// what was lost so the state is whole again.
#[test]
fn status_shows_a_target_whose_reads_fail_until_scrub_repairs_it() {
    let seed = test_seed("status_shows_a_target_whose_reads_fail", 0x36_0300);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let data = pattern(seed, 24 * MIB as usize);
    fs::write(m.path("ckpt"), &data).unwrap();
    let before = json(&mut m, &["targets"]);
    assert_eq!(
        before["revisions"]["listed"],
        serde_json::json!([[2, 1]]),
        "{before}"
    );
    // Every target holds some of the data shards; cut target 1's file to its header.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.target_dir(1).join(TARGET_FILE))
        .unwrap();
    f.set_len(HEADER).unwrap();
    drop(f);
    for _ in 0..3 {
        drop_caches();
        assert_file_eq(&m.path("ckpt"), &data);
    }
    let t = json(&mut m, &["targets"]);
    let t1 = &t["targets"][1];
    assert!(t1["state"].as_str().unwrap().starts_with("degraded"), "{t}");
    assert!(t1["read_errors"].as_u64().unwrap() > 0, "{t}");
    assert!(t1["suspect_shards"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(
        t["revisions"]["listed"],
        serde_json::json!([[1, 1]]),
        "the revision can lose one target less: {t}"
    );
    let mnt = m.mnt().to_path_buf();
    let text = m.ckptfs_ok(&[OsStr::new("stats"), mnt.as_os_str()]);
    assert!(
        text.contains("DEGRADED") && text.contains("failed shard reads"),
        "{text}"
    );
    let prom = m.ckptfs_ok(&[
        OsStr::new("stats"),
        mnt.as_os_str(),
        OsStr::new("--prometheus"),
    ]);
    let degraded = prom.lines().find(|l| l.starts_with("ckptfs_degraded{"));
    assert!(degraded.is_some_and(|l| l.ends_with(" 1")), "{prom}");
    let line = prom
        .lines()
        .find(|l| l.starts_with("ckptfs_target_read_errors_total{") && l.contains("target=\"1\""))
        .unwrap_or_else(|| panic!("{prom}"));
    assert!(!line.ends_with(" 0"), "{line}");
    let warned = m.log_tail().matches("reading shard").count();
    assert!(
        warned <= 2,
        "one line per target per interval, not one per failed read ({} errors): {warned} lines",
        t1["read_errors"]
    );
    // scrub writes back what the cut file lost; the state is whole again.
    scrub_repairs_in_place(&mut m, 1);
}

/// `ckptfs scrub` loses nothing and rewrites blocks; afterwards target `t` is `ok`, the
/// revision at full redundancy (3+2), and `check` clean after a remount.
fn scrub_repairs_in_place(m: &mut TestMount, t: usize) {
    let s = json(m, &["scrub"]);
    assert_eq!(s["chunks_lost"], 0, "{s}");
    assert!(s["blocks_rewritten"].as_u64().unwrap() > 0, "{s}");
    let v = json(m, &["targets"]);
    assert_eq!(v["targets"][t]["state"], "ok", "repaired in place: {v}");
    assert_eq!(v["revisions"]["listed"], serde_json::json!([[2, 1]]), "{v}");
    m.unmount();
    drop_caches();
    m.mount();
    check_clean(m, "after scrub");
}

/// A target file cut short while the space was not mounted (a copy that ran out of room, a
/// truncate by mistake): the mount extends it to its reserved size again and says so, reads
/// rebuild what it lost, and `ckptfs scrub` puts every lost shard back in place. Its repairs
/// used to fail with ENOSPC (the file's device took no writes past its end) and fail the whole
/// target, which only a `rebuild --replace` onto another directory could undo. Afterwards two
/// other targets may go: the shards on the cut one are whole again.
#[test]
fn a_target_cut_short_while_unmounted_is_repaired_in_place() {
    let seed = test_seed("a_target_cut_short_while_unmounted", 0x36_0400);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let data = pattern(seed, 24 * MIB as usize);
    fs::write(m.path("ckpt"), &data).unwrap();
    m.unmount();
    let file = m.target_dir(1).join(TARGET_FILE);
    let reserved = fs::metadata(&file).unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(HEADER + MIB).unwrap();
    drop(f);
    drop_caches();
    m.mount();
    assert!(
        m.log_tail().contains("cut short"),
        "the mount says what it found: {}",
        m.log_tail()
    );
    assert_eq!(
        fs::metadata(&file).unwrap().len(),
        reserved,
        "extended again"
    );
    assert_file_eq(&m.path("ckpt"), &data);
    scrub_repairs_in_place(&mut m, 1);
    m.unmount();
    for i in [3, 4] {
        fs::remove_file(m.target_dir(i).join(TARGET_FILE)).unwrap();
    }
    drop_caches();
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);
}

/// `targets` of the mount shows target `i` degraded by a cut with suspect shards; its report.
fn assert_cut_seen(m: &mut TestMount, i: usize, when: &str) -> serde_json::Value {
    let t = json(m, &["targets"]);
    let state = t["targets"][i]["state"].as_str().unwrap();
    assert!(
        state.starts_with("degraded") && state.contains("cut short"),
        "{when}: {t}"
    );
    assert!(
        t["targets"][i]["suspect_shards"].as_u64().unwrap() > 0,
        "{when}: {t}"
    );
    t
}

/// A target file cut short while unmounted is known to be short of shards from the mount on,
/// before any read finds it, and still after a remount (which finds the file at its full
/// size again): `targets`, `stats` and `check` say so, and `ckptfs rebuild` (not only
/// `scrub`) rewrites what it lost. Before, the mount extended the file and forgot: status
/// said "full redundancy", `rebuild` visited nothing and said "nothing lost", and `check`
/// exited 0 over thousands of rows whose parity was zeros.
#[test]
fn a_target_cut_short_is_degraded_across_remounts_until_rebuild() {
    let seed = test_seed("a_target_cut_short_is_degraded", 0x36_0500);
    let mut m = TestMount::with_targets("256M", 5, "3+2");
    let data = pattern(seed, 24 * MIB as usize);
    fs::write(m.path("ckpt"), &data).unwrap();
    m.unmount();
    let dir = m.target_dir(1);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(dir.join(TARGET_FILE))
        .unwrap();
    f.set_len(HEADER + MIB).unwrap();
    drop(f);
    drop_caches();
    let markers = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".cut-"))
            .collect()
    };
    for round in ["first mount", "after a remount"] {
        m.mount();
        let t = assert_cut_seen(&mut m, 1, round);
        assert_eq!(
            t["revisions"]["listed"],
            serde_json::json!([[1, 1]]),
            "{round}: the revision can lose one target less: {t}"
        );
        let mnt = m.mnt().to_path_buf();
        let text = m.ckptfs_ok(&[OsStr::new("stats"), mnt.as_os_str()]);
        assert!(text.contains("DEGRADED"), "{round}: {text}");
        assert_eq!(markers(&dir), ["ckptfs-target.cut-0"], "{round}");
        m.unmount();
    }
    m.mount();
    let (code, v) = check_json(&mut m);
    assert_eq!(code, Some(1), "less redundancy is damage: {v}");
    assert_eq!(
        (&v["clean"], &v["redundancy_full"]),
        (&true.into(), &false.into()),
        "{v}"
    );
    let r = json(&mut m, &["rebuild"]);
    assert_eq!(r["chunks_lost"], 0, "{r}");
    assert!(r["blocks_rewritten"].as_u64().unwrap() > 0, "{r}");
    let t = json(&mut m, &["targets"]);
    assert_eq!(t["targets"][1]["state"], "ok", "rebuilt in place: {t}");
    assert_eq!(t["revisions"]["listed"], serde_json::json!([[2, 1]]), "{t}");
    assert!(markers(&dir).is_empty(), "the marker goes with the repair");
    m.unmount();
    drop_caches();
    m.mount();
    check_clean(&mut m, "after rebuild");
    m.unmount();
    for i in [3, 4] {
        fs::remove_file(m.target_dir(i).join(TARGET_FILE)).unwrap();
    }
    drop_caches();
    m.mount();
    assert_file_eq(&m.path("ckpt"), &data);
}

/// A target file cut short, then another replaced by an older copy of itself, while the
/// space is mounted: before any read reaches them, `targets` and `stats` say so (the cut
/// target degraded with its marker written, the replaced one failed), new writes and reads
/// go on, `rebuild` restores full redundancy, and after a remount `check` is clean and every
/// file reads back. Before `watch_files`, status said "full redundancy" until a read hit
/// the damage, and what was written to the replaced file was lost at the unmount.
#[test]
fn a_target_file_cut_or_replaced_while_mounted_is_seen_at_once() {
    let seed = test_seed("a_target_file_cut_or_replaced_while_mounted", 0x36_0600);
    // Six targets for rows of five: a spare to re-place the replaced target's shards on.
    let mut m = TestMount::with_targets("256M", 6, "3+2");
    let first = pattern(seed, 24 * MIB as usize);
    fs::write(m.path("first"), &first).unwrap();
    // An older copy of target 3's file, taken while mounted (what a restore would bring).
    let old_copy = m.root().join("t3-copy");
    fs::copy(m.target_dir(3).join(TARGET_FILE), &old_copy).unwrap();
    let second = pattern(seed ^ 1, 8 * MIB as usize);
    fs::write(m.path("second"), &second).unwrap();

    let cut = m.target_dir(1);
    fs::OpenOptions::new()
        .write(true)
        .open(cut.join(TARGET_FILE))
        .unwrap()
        .set_len(HEADER + MIB)
        .unwrap();
    assert_cut_seen(&mut m, 1, "seen before any read");
    assert!(cut.join(format!("{TARGET_FILE}.cut-0")).exists());
    assert_eq!(
        fs::metadata(cut.join(TARGET_FILE)).unwrap().len(),
        fs::metadata(m.target_dir(0).join(TARGET_FILE))
            .unwrap()
            .len(),
        "extended to its reserved size again"
    );
    let mnt = m.mnt().to_path_buf();
    let text = m.ckptfs_ok(&[OsStr::new("stats"), mnt.as_os_str()]);
    assert!(text.contains("DEGRADED"), "{text}");

    fs::rename(&old_copy, m.target_dir(3).join(TARGET_FILE)).unwrap();
    let t = json(&mut m, &["targets"]);
    let state = t["targets"][3]["state"].as_str().unwrap();
    assert!(
        state.contains("failed") && state.contains("replaced while mounted"),
        "{t}"
    );
    // Writes go on within the remaining redundancy; everything reads back.
    let third = pattern(seed ^ 2, 8 * MIB as usize);
    fs::write(m.path("third"), &third).unwrap();
    for (name, data) in [("first", &first), ("second", &second), ("third", &third)] {
        assert_file_eq(&m.path(name), data);
    }
    let r = json(&mut m, &["rebuild"]);
    assert_eq!(r["chunks_lost"], 0, "{r}");
    let t = json(&mut m, &["targets"]);
    assert_eq!(t["targets"][1]["state"], "ok", "rebuilt in place: {t}");
    let text = m.ckptfs_ok(&[OsStr::new("stats"), mnt.as_os_str()]);
    assert!(!text.contains("DEGRADED"), "{text}");
    assert!(!cut.join(format!("{TARGET_FILE}.cut-0")).exists());
    m.unmount();
    drop_caches();
    m.mount();
    check_clean(&mut m, "after rebuild");
    for (name, data) in [("first", &first), ("second", &second), ("third", &third)] {
        assert_file_eq(&m.path(name), data);
    }
}

fn rounds() -> usize {
    std::env::var("CKPTFS_DAMAGE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

/// Seeded rounds of damage within the budget (K = 2 shards per row: a lost target counts as
/// one, a target with damaged bytes as one), each followed by a rebuild onto a replacement
/// or a scrub; new checkpoints are written between rounds. Every committed byte survives,
/// and every round leaves the space clean and whole.
#[test]
fn seeded_damage_within_the_budget_across_rebuilds_loses_nothing() {
    let seed = test_seed("seeded_damage_within_the_budget", 0x36_0400);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::with_targets("512M", 5, "3+2");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut next = 0u64;
    for round in 0..rounds() {
        for _ in 0..2 {
            let name = format!("ckpt-{next}");
            let data = pattern(seed ^ next, (4 * MIB + rng.random_range(0..MIB)) as usize);
            fs::write(m.path(&name), &data).unwrap();
            files.push((name, data));
            next += 1;
        }
        let mut live = live_targets(&mut m);
        live.shuffle(&mut rng);
        let lose = rng.random_bool(0.5);
        m.unmount();
        let damaged = if lose { 1 } else { 2 };
        for (i, dir) in &live[..damaged] {
            println!("round {round}: damaging target {i}");
            damage(dir, &mut rng, 300, 8 * MIB);
        }
        if lose {
            let (i, dir) = &live[damaged];
            println!("round {round}: losing target {i}");
            fs::remove_file(dir.join(TARGET_FILE)).unwrap();
        }
        drop_caches();
        m.mount();
        for (name, data) in &files {
            assert_file_eq(&m.path(name), data);
        }
        if lose {
            let new = m.root().join("targets").join(format!("round{round}"));
            let old = live[damaged].0.to_string();
            replace(&mut m, &old, &new);
        } else {
            let v = json(&mut m, &["scrub"]);
            println!("round {round}: scrub: {v}");
            assert_eq!(
                (v["chunks_lost"].as_u64(), v["segments_lost"].as_u64()),
                (Some(0), Some(0)),
                "{v}"
            );
        }
        m.unmount();
        drop_caches();
        m.mount();
        for (name, data) in &files {
            assert_file_eq(&m.path(name), data);
        }
        check_clean(&mut m, &format!("round {round}"));
    }
}
