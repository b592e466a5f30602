//! The crash driver over a space on erasure-coded storage targets: 3+2 over 6 simulated
//! target devices, with the placement records and the metadata table, all on one `SimDisk`.
//!
//! A run does the seeded workload of `crash.rs` (saves, unlinks, gc, directory fsyncs)
//! through `Fs`, and either:
//! - loses power at a seeded device operation (a row's data or parity write, a placement
//!   record, a commit, gc's copies), or
//! - has one target fail every write from a seeded operation on (EIO, sticky): the
//!   workload must see no error at all, since 4 healthy targets remain.
//!
//! Then the disk reboots from its crash image (synced writes plus a random subset of the
//! unsynced ones, some torn), and at the reboot up to K = 2 whole targets are lost as well
//! (K - 1 after a failing-target run: the failed target counts as one).
//! The recovered space must open, pass `check` (repairs through parity allowed, nothing
//! damaged), and equal one of the workload's states from the last acknowledged one on.
//! Then `rebuild` runs, with power lost at a seeded point inside it; after that reboot the
//! state is the same, `check` is clean, and a second rebuild brings every segment back to
//! full redundancy.
//!
//! Replay: CKPTFS_TARGET_CRASH_SEED=<seed> (the printed one); more seeds:
//! CKPTFS_TARGET_CRASH_SEEDS=<n> (default 12; each does a clean run, 8 crash runs and 2
//! failing-target runs).

mod common;

use ckptfs_engine::format::Superblock;
use ckptfs_engine::sim::{target_device_name, Fault, Image, OpKind, SimDevice, SimDisk};
use ckptfs_engine::space::{Config, OnDevices};
use ckptfs_engine::targets::{Erasure, Redundancy, Target, TargetsTable};
use ckptfs_engine::Space;
use ckptfs_fs::{Fs, HandleId};
use common::*;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Arc;

const SPACE_BYTES: u64 = 64 << 20;
const TARGETS: usize = 6;
const R: Redundancy = Redundancy { data: 3, parity: 2 };

struct Sim {
    disk: Arc<SimDisk>,
    meta: Arc<SimDevice>,
    map: Arc<SimDevice>,
    targets: Vec<Arc<SimDevice>>,
    sb: Superblock,
    table: TargetsTable,
}

fn format() -> Sim {
    let disk = SimDisk::new();
    let meta = SimDevice::new("meta", &disk, Image::new(0));
    let config = Config {
        keep_revisions: 1000,
        keep_age_secs: 0,
        keep_unlinked_secs: 0,
        auto_gc_free_percent: 0,
    };
    let m: Arc<dyn ckptfs_engine::device::Device> = meta.clone();
    let (sb, table) = Space::format_targets_devices(&m, SPACE_BYTES, 4096, config, R, TARGETS)
        .expect("format on sim devices");
    let map = SimDevice::new(
        "data",
        &disk,
        Image::new(table.segments * ckptfs_engine::targets::RECORD_BYTES as u64),
    );
    let targets = (0..TARGETS)
        .map(|i| {
            SimDevice::new(
                target_device_name(i),
                &disk,
                Image::new(table.target_file_bytes()),
            )
        })
        .collect();
    Sim {
        disk,
        meta,
        map,
        targets,
        sb,
        table,
    }
}

/// The placement over `targets` (None: that target is lost).
fn erasure(
    table: &TargetsTable,
    map: Arc<SimDevice>,
    targets: Vec<Option<Arc<SimDevice>>>,
) -> Result<Arc<Erasure>, String> {
    let ts = targets
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            Target::new(
                PathBuf::from(format!("sim{i}")),
                format!("target{i}"),
                table.slots,
                d.map(|d| d as Arc<dyn ckptfs_engine::device::Device>)
                    .ok_or_else(|| "lost at the reboot".to_string()),
            )
        })
        .collect();
    Erasure::open(R, table.shard_bytes, table.segments, ts, map)
        .map(Arc::new)
        .map_err(|e| format!("open the placement: {e}"))
}

/// What a power loss leaves of every device of `sim`.
#[derive(Clone)]
struct Images {
    meta: Image,
    map: Image,
    targets: Vec<Image>,
}

fn power_off(sim: &Sim, rng: &mut SmallRng) -> Images {
    Images {
        meta: sim.meta.crash_image(rng),
        map: sim.map.crash_image(rng),
        targets: sim.targets.iter().map(|t| t.crash_image(rng)).collect(),
    }
}

/// A machine booted from `im`, its disk new.
fn boot(sim: &Sim, im: Images) -> Sim {
    let disk = SimDisk::new();
    Sim {
        meta: SimDevice::new("meta", &disk, im.meta),
        map: SimDevice::new("data", &disk, im.map),
        targets: im
            .targets
            .into_iter()
            .enumerate()
            .map(|(i, t)| SimDevice::new(target_device_name(i), &disk, t))
            .collect(),
        disk,
        sb: sim.sb.clone(),
        table: sim.table.clone(),
    }
}

fn open(sim: &Sim, lost: &[usize]) -> Result<Space, String> {
    let targets = sim
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| (!lost.contains(&i)).then(|| t.clone()))
        .collect();
    let er = erasure(&sim.table, sim.map.clone(), targets)?;
    let space = Space::open_devices_as(
        sim.sb.clone(),
        OnDevices::Targets {
            meta: sim.meta.clone(),
            erasure: er,
        },
    )
    .map_err(|e| format!("open: {e}"))?;
    space.store().set_workers(0);
    Ok(space)
}

/// `check` must find nothing damaged and the metadata consistent (repairs are fine).
fn check_clean(space: &Space, when: &str) -> Result<u64, String> {
    let r = ckptfs_engine::maintenance::check::check(space, &mut |_, _| {})
        .map_err(|e| format!("check {when} failed to run: {e}"))?;
    if !r.is_clean() {
        return Err(format!(
            "check {when}: {} damaged chunks (first: {:?}), problems: {:?}",
            r.damaged.len(),
            r.damaged.first(),
            r.problems.iter().take(5).collect::<Vec<_>>()
        ));
    }
    Ok(r.repaired_chunks)
}

#[derive(Clone, Copy, Debug)]
enum Plan {
    Clean,
    Crash(u64),
    /// Target `t` fails every write from its `n`th on.
    FailingTarget(usize, u64),
}

#[derive(Default)]
struct Totals {
    runs: u64,
    crashes: u64,
    targets_lost: u64,
    repaired: u64,
    rebuild_crashes: u64,
    rebuilt_segments: u64,
}

fn run(seed: u64, plan: Plan, t: &mut Totals) -> Result<u64, String> {
    let sim = format();
    let base = sim.disk.ops();
    let space = open(&sim, &[])?;
    match plan {
        Plan::Clean => {}
        Plan::Crash(n) => sim.disk.crash_at(base + n),
        Plan::FailingTarget(tg, n) => sim.disk.inject(Fault {
            device: Some(target_device_name(tg)),
            kind: OpKind::Write,
            nth: n,
            errno: libc::EIO,
            sticky: true,
        }),
    }
    let fs = Fs::new(space);
    let mut model = Model::new();
    let failed = workload(&fs, &sim.disk, seed, &mut model);
    let total = sim.disk.ops() - base;
    match (plan, &failed) {
        (Plan::Crash(_), Some(_)) if sim.disk.has_crashed() => {}
        (_, Some((e, _))) => {
            return Err(format!(
                "a call failed ({plan:?}), with 4 or more healthy targets: {e}"
            ))
        }
        _ => {}
    }
    t.runs += 1;
    t.crashes += u64::from(sim.disk.has_crashed());
    drop(fs);

    // Reboot, losing up to K targets as well.
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7a7a);
    let mut order: Vec<usize> = (0..TARGETS).collect();
    order.shuffle(&mut rng);
    // A target that failed mid-workload already took one of the K losses the segments it
    // held can bear (its shards there are stale from the failure on).
    let spare = match plan {
        Plan::FailingTarget(..) => R.parity - 1,
        _ => R.parity,
    };
    let lost: Vec<usize> = order[..rng.random_range(0..=spare)].to_vec();
    t.targets_lost += lost.len() as u64;
    let images = power_off(&sim, &mut rng);
    let sim2 = boot(&sim, images.clone());
    let space = open(&sim2, &lost).map_err(|e| format!("reopen (lost {lost:?}): {e}"))?;
    t.repaired += check_clean(&space, &format!("after the reboot (lost {lost:?})"))?;
    let fs = Fs::new(space);
    let got = observe(&fs)?;
    if !model.states[model.acked..].contains(&got) {
        return Err(format!(
            "lost {lost:?}: the recovered state is none of the states from the last \
             acknowledged one on\n  recovered: {}\n  acknowledged: {}",
            describe(&got),
            describe(&model.states[model.acked])
        ));
    }
    drop(fs);

    // A rebuild on these images: first counted, then again from the same images with the
    // power lost at a seeded operation inside it.
    let space = open(&sim2, &lost)?;
    let before = sim2.disk.ops();
    let probe = space
        .rebuild(None, None, &mut |_, _| {})
        .map_err(|e| format!("rebuild: {e}"))?;
    let rebuild_ops = sim2.disk.ops() - before;
    t.rebuilt_segments += probe.segments_rebuilt;
    drop(space);
    let sim3 = if rebuild_ops > 0 {
        let again = boot(&sim, images);
        let space = open(&again, &lost)?;
        let b = again.disk.ops();
        again.disk.crash_at(b + rng.random_range(0..rebuild_ops));
        let _ = space.rebuild(None, None, &mut |_, _| {});
        t.rebuild_crashes += u64::from(again.disk.has_crashed());
        drop(space);
        let im = power_off(&again, &mut rng);
        boot(&again, im)
    } else {
        sim2
    };
    let space = open(&sim3, &lost)?;
    check_clean(&space, "after a crash inside rebuild")?;
    let rep = space
        .rebuild(None, None, &mut |_, _| {})
        .map_err(|e| format!("rebuild after the crash: {e}"))?;
    if rep.segments_lost > 0 {
        return Err(format!("rebuild found lost segments: {rep:?}"));
    }
    let r = space
        .report()
        .targets_report()
        .ok_or("no targets report on a targeted space")?;
    // Every segment whose domains allow it is whole again (6 targets, 4 or more healthy).
    if r.segments_lost > 0 || (lost.len() <= 1 && !r.segments_degraded.is_empty()) {
        return Err(format!(
            "after rebuild (lost {lost:?}): {} degraded, {} lost",
            r.segments_degraded.len(),
            r.segments_lost
        ));
    }
    let fs = Fs::new(space);
    let after = observe(&fs)?;
    if after != got {
        return Err(format!(
            "rebuild changed what the space holds:\n  before: {}\n  after: {}",
            describe(&got),
            describe(&after)
        ));
    }
    // The space takes writes again.
    let a = fs
        .create(
            ROOT,
            b"after-reboot",
            0o644,
            ME,
            HandleId(5),
            true,
            false,
            false,
        )
        .map_err(|e| format!("create after reboot: {e:?}"))?;
    fs.write(a.ino, HandleId(5), 1, 0, b"alive")
        .and_then(|_| fs.flush(a.ino, HandleId(5), 1))
        .and_then(|_| fs.release(a.ino, HandleId(5)))
        .map_err(|e| format!("write after reboot: {e:?}"))?;
    Ok(total)
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

#[test]
fn targets_survive_crashes_lost_targets_and_rebuild_crashes() {
    let seeds = env_u64("CKPTFS_TARGET_CRASH_SEEDS").unwrap_or(12);
    let first = env_u64("CKPTFS_TARGET_CRASH_SEED").unwrap_or(1);
    let mut t = Totals::default();
    let mut points = 0;
    for seed in first..first + seeds {
        let total =
            run(seed, Plan::Clean, &mut t).unwrap_or_else(|e| panic!("seed {seed} clean: {e}"));
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..8 {
            let p = rng.random_range(0..total.max(1));
            points += 1;
            run(seed, Plan::Crash(p), &mut t).unwrap_or_else(|e| {
                panic!("seed {seed} crash point {p} (CKPTFS_TARGET_CRASH_SEED={seed}): {e}")
            });
        }
        for _ in 0..2 {
            let (tg, n) = (rng.random_range(0..TARGETS), rng.random_range(0..40));
            run(seed, Plan::FailingTarget(tg, n), &mut t)
                .unwrap_or_else(|e| panic!("seed {seed} target {tg} failing from write {n}: {e}"));
        }
    }
    println!(
        "target crash driver: {seeds} seeds, {points} crash points, {} runs ({} crashed \
         mid-workload), {} targets lost at reboots, {} chunks repaired by check, {} rebuilds \
         crashed, {} segments rebuilt; 0 acknowledged states lost",
        t.runs, t.crashes, t.targets_lost, t.repaired, t.rebuild_crashes, t.rebuilt_segments
    );
}
