//! Crash and fault injection through the whole write path (namespace, chunk store, commit,
//! seal, gc) on simulated disks, checked against a model of what must survive.
//!
//! A run formats a space on a `SimDisk`, then performs a seeded random workload of saves
//! (create or open, writes, sometimes an fsync in the middle, close), unlinks, gc and
//! directory fsyncs through `Fs`. Either power is lost at a chosen device operation (crash
//! runs), or one chosen operation fails with EIO or ENOSPC and the run goes on (fault runs).
//! Then the disk is "rebooted" from its crash image (synced writes plus a random subset of the
//! unsynced ones, some torn; on the journal a torn write also leaves one of its sectors
//! garbage, which only a write over a synced block could turn into a lost acknowledged
//! record) and reopened. On a journaled space in the default mode the same
//! point is also taken as the death of the daemon alone (every completed write kept, as the
//! page cache keeps them), after which every change that returned must be there, an unlink
//! with no close after it included.
//!
//! The model: the workload records the namespace state (every file's content and its sealed
//! revisions) after every change, and which state the last acknowledged durable call (close,
//! fsync, gc, directory fsync) covered. After the reboot the space must open with no repair
//! step, pass the engine's consistency check, and equal one of the recorded states from the
//! acknowledged one on: nothing acknowledged lost, nothing half-written mixed in.
//!
//! The same runs go over a space with a journal (`catalog::journal`: a close durable through
//! one journal record), a small one so that it fills and checkpoints mid-workload, with
//! closes durable when they return and with durability deferred to fsync
//! (`--durability fsync`: only fsync, directory fsync and gc acknowledge).
//!
//! Replay one run: CKPTFS_CRASH_SEED=<seed> CKPTFS_CRASH_POINT=<op> CKPTFS_CRASH_KIND=<kind>
//! (printed on failure). More runs: CKPTFS_CRASH_SEEDS=<n> (default 60 seeds for the space
//! without a journal, 30 for each journal kind; each does 1 clean, 12 crash and 6 fault runs).

mod common;

use ckptfs_engine::format::Superblock;
use ckptfs_engine::sim::{Fault, Image, OpKind, SimDevice, SimDisk};
use ckptfs_engine::space::{Config, Devices, OnDevices};
use ckptfs_engine::Space;
use ckptfs_fs::{Error, Fs, HandleId};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const SPACE_BYTES: u64 = 64 << 20;
/// The journal of the journaled runs: small, so records fill it and checkpoints happen in
/// the middle of a workload (a real one is `journal::JOURNAL_BYTES`).
const JOURNAL_BYTES: u64 = 1 << 20;

/// Which space a run writes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// No journal: every durable commit is redb's own.
    Plain,
    /// A journal, closes durable when they return.
    Journal,
    /// A journal, durability deferred to fsync.
    JournalFsync,
}

impl Kind {
    fn parse(s: &str) -> Kind {
        match s {
            "journal" => Kind::Journal,
            "journal-fsync" => Kind::JournalFsync,
            _ => Kind::Plain,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Journal => "journal",
            Kind::JournalFsync => "journal-fsync",
        }
    }
}

fn devices(disk: &Arc<SimDisk>, data: Image, meta: Image) -> Devices {
    Devices {
        data: SimDevice::new("data", disk, data),
        meta: SimDevice::new("meta", disk, meta),
    }
}

/// `OnDevices` of a run's kind.
fn on(devs: Devices, journal: Option<Arc<SimDevice>>) -> OnDevices {
    match journal {
        Some(j) => OnDevices::Journaled { devs, journal: j },
        None => OnDevices::Single(devs),
    }
}

struct Sim {
    disk: Arc<SimDisk>,
    data: Arc<SimDevice>,
    meta: Arc<SimDevice>,
    journal: Option<Arc<SimDevice>>,
    sb: Superblock,
}

fn format(kind: Kind) -> Sim {
    let disk = SimDisk::new();
    let data = SimDevice::new("data", &disk, Image::new(SPACE_BYTES));
    let meta = SimDevice::new("meta", &disk, Image::new(0));
    let journal =
        (kind != Kind::Plain).then(|| SimDevice::new("journal", &disk, Image::new(JOURNAL_BYTES)));
    if let Some(j) = &journal {
        // The journal never writes over a block a sync covered (FORMAT.md "Journal"):
        // a torn write's garbage sector then never holds an acknowledged record.
        j.tear_into_garbage();
    }
    let devs = Devices {
        data: data.clone(),
        meta: meta.clone(),
    };
    let config = Config {
        keep_revisions: 1000,
        keep_age_secs: 0,
        keep_unlinked_secs: 0,
        auto_gc_free_percent: 0,
    };
    let sb = Space::format_devices(&devs, 4096, config).expect("format on a sim disk");
    Sim {
        disk,
        data,
        meta,
        journal,
        sb,
    }
}

/// How a run ends.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// No failure; "power off" at the end anyway.
    Clean,
    /// Power lost at this mutating operation (counted from the end of format).
    Crash(u64),
    /// This operation fails; the workload goes on; power off at the end.
    Fault(u64, OpKind, i32),
}

fn run(seed: u64, plan: Plan, kind: Kind, tally: &mut Tally) -> Result<u64, String> {
    let sim = format(kind);
    let base = sim.disk.ops();
    let devs = Devices {
        data: sim.data.clone(),
        meta: sim.meta.clone(),
    };
    let space = Space::open_devices_as(sim.sb.clone(), on(devs, sim.journal.clone()))
        .map_err(|e| format!("open after format: {e}"))?;
    space.set_close_durable(kind != Kind::JournalFsync);
    // Chunks stored on the writing thread, in order: the crash point counts device
    // operations, and worker threads would interleave them differently on every run, so a
    // printed seed and point could not replay a failure. The commit protocol is the same
    // either way (a commit waits for all of its file's chunks); the FUSE tests run workers.
    space.store().set_workers(0);
    match plan {
        Plan::Clean => {}
        Plan::Crash(n) => sim.disk.crash_at(base + n),
        Plan::Fault(n, kind, errno) => sim.disk.inject(Fault {
            device: None,
            kind,
            nth: n,
            errno,
            sticky: false,
        }),
    }
    let fs = Fs::new(space);
    let mut model = Model::new();
    let failed = workload(&fs, &sim.disk, seed, &mut model);
    let total_ops = sim.disk.ops() - base;
    let fired = sim.disk.fired.load(std::sync::atomic::Ordering::SeqCst);
    match (plan, &failed) {
        (Plan::Clean, Some((e, _))) => return Err(format!("a clean run failed: {e}")),
        (Plan::Fault(_, OpKind::Read, _), _) => {}
        (Plan::Fault(..), Some(_)) if fired > 0 => {
            // Sticky: once a write, sync or commit has failed, nothing more is acknowledged.
            let f = name(0);
            let refused = match fs.lookup(ROOT, f.as_bytes()) {
                Ok(a) => fs
                    .open(a.ino, HandleId(99_999), true, false)
                    .and_then(|_| fs.write(a.ino, HandleId(99_999), 1, 0, b"after the failure"))
                    .and_then(|_| fs.flush(a.ino, HandleId(99_999), 1))
                    .is_err(),
                Err(_) => fs
                    .create(
                        ROOT,
                        f.as_bytes(),
                        0o644,
                        ME,
                        HandleId(99_999),
                        true,
                        false,
                        false,
                    )
                    .and_then(|a| {
                        fs.write(a.ino, HandleId(99_999), 1, 0, b"x")?;
                        fs.flush(a.ino, HandleId(99_999), 1)
                    })
                    .is_err(),
            };
            if !refused {
                return Err("a write was acknowledged after a failed write/sync".into());
            }
            if !fs.stats().map(|s| s.failed).unwrap_or(true) {
                return Err("stats do not report the failed state".into());
            }
            // Committed data stays readable after the failure (the file whose save failed
            // holds unacknowledged writes in memory; reads of it see those, as POSIX wants).
            let dirty = &failed.as_ref().unwrap().1;
            let later = &model.states[model.acked..];
            let names: std::collections::BTreeSet<&String> =
                later.iter().flat_map(|s| s.keys()).collect();
            for nm in names {
                if nm == dirty {
                    continue;
                }
                let a = match fs.lookup(ROOT, nm.as_bytes()) {
                    Err(Error::NotFound) if later.iter().any(|s| !s.contains_key(nm)) => continue,
                    r => r.map_err(|e| format!("lookup {nm} after the failure: {e:?}"))?,
                };
                fs.open(a.ino, HandleId(88_888), false, false)
                    .map_err(|e| format!("open {nm} after the failure: {e:?}"))?;
                let got = fs
                    .read(a.ino, HandleId(88_888), 0, a.rec.size as usize + 1)
                    .map_err(|e| format!("read {nm} after the failure: {e:?}"))?;
                let _ = fs.release(a.ino, HandleId(88_888));
                if !model.states[model.acked..]
                    .iter()
                    .any(|s| s.get(nm).is_some_and(|m| *m.content == got))
                {
                    return Err(format!("{nm} reads wrong bytes after the failure"));
                }
            }
        }
        (Plan::Fault(..), Some((e, _))) => {
            return Err(format!("a call failed with no fault fired: {e}"))
        }
        (Plan::Crash(_), Some(_)) if !sim.disk.has_crashed() => {
            return Err(format!("a call failed before the crash point: {failed:?}"))
        }
        _ => {}
    }
    tally.runs += 1;
    tally.faults_fired += fired;
    if sim.disk.has_crashed() {
        tally.crashes += 1;
    }
    // Power off: keep what a crash would, then reboot.
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
    let journal_pending = sim.journal.as_ref().map_or(0, |j| j.pending_writes());
    if sim.data.pending_writes() + sim.meta.pending_writes() + journal_pending > 0 {
        tally.lost_writes_possible += 1;
    }
    let data = sim.data.crash_image(&mut rng);
    let meta = sim.meta.crash_image(&mut rng);
    let journal = sim.journal.as_ref().map(|j| j.crash_image(&mut rng));
    // Or only the daemon dies, here: every completed write is kept. In the default mode of
    // a journaled space a namespace change that returned survives that too.
    let death = (kind == Kind::Journal).then(|| {
        (
            sim.data.death_image(),
            sim.meta.death_image(),
            sim.journal.as_ref().map(|j| j.death_image()),
        )
    });
    // The power is off: nothing the space does as it is dropped reaches the disk.
    sim.disk.crash_at(0);
    drop(fs);
    if let Some((data, meta, journal)) = death {
        let fs = reopen(&sim.sb, data, meta, journal, "the daemon's death")?;
        let got = observe(&fs)?;
        tally.death_states_checked += 1;
        if !model.states[model.returned..].contains(&got) {
            return Err(format!(
                "after the daemon's death (every completed write kept): {}",
                not_kept(&model, model.returned, &got, "returned")
            ));
        }
    }
    let fs = reopen(&sim.sb, data, meta, journal, "the crash")?;
    let got = observe(&fs)?;
    tally.acked_states_checked += 1;
    if !model.states[model.acked..].contains(&got) {
        return Err(not_kept(&model, model.acked, &got, "acknowledged"));
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
    Ok(total_ops)
}

/// Opens the space on a new disk holding these images (after a reboot), with no repair
/// step, and checks it.
fn reopen(
    sb: &Superblock,
    data: Image,
    meta: Image,
    journal: Option<Image>,
    after: &str,
) -> Result<Fs, String> {
    let disk = SimDisk::new();
    let journal = journal.map(|j| SimDevice::new("journal", &disk, j));
    let space = Space::open_devices_as(sb.clone(), on(devices(&disk, data, meta), journal))
        .map_err(|e| format!("reopen after {after} failed: {e}"))?;
    let report = ckptfs_engine::maintenance::check::check(&space, &mut |_, _| {})
        .map_err(|e| format!("check failed to run: {e}"))?;
    if !report.is_clean() {
        return Err(format!(
            "check after {after}: {} damaged chunks (first: {:?}), problems: {:?}",
            report.damaged.len(),
            report.damaged.first(),
            report.problems.iter().take(5).collect::<Vec<_>>()
        ));
    }
    Ok(Fs::new(space))
}

/// Says that the recovered state `got` is none of the model's states from `from` (the
/// last `what` one) on.
fn not_kept(model: &Model, from: usize, got: &State, what: &str) -> String {
    format!(
        "the recovered state is none of the states from the last {what} one on\n  \
         recovered: {}\n  {what}: {}\n  later states: {}\n  it equals earlier state(s) \
         {:?} of {}; {what} was {from}",
        describe(got),
        describe(&model.states[from]),
        model.states.len() - 1 - from,
        model
            .states
            .iter()
            .enumerate()
            .filter(|(_, s)| *s == got)
            .map(|(i, _)| i)
            .collect::<Vec<_>>(),
        model.states.len(),
    )
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

#[test]
fn committed_revisions_survive_crashes_and_faults() {
    drive(Kind::Plain, 60);
}

/// The same over a journal: what a close acknowledged is in the journal, and the reopen
/// applies it (`journal::replay`).
#[test]
fn journaled_closes_survive_crashes_and_faults() {
    drive(Kind::Journal, 30);
}

/// Durability deferred to fsync: a crash keeps some prefix of the closes after the last
/// fsync (a state the namespace went through, never a later close without an earlier
/// one), and everything before it.
#[test]
fn closes_deferred_to_fsync_survive_crashes_in_order() {
    drive(Kind::JournalFsync, 30);
}

fn drive(kind: Kind, default_seeds: u64) {
    let replay_kind = std::env::var("CKPTFS_CRASH_KIND").map(|k| Kind::parse(&k));
    if let (Some(seed), Some(point)) = (env_u64("CKPTFS_CRASH_SEED"), env_u64("CKPTFS_CRASH_POINT"))
    {
        if replay_kind.as_ref().is_ok_and(|k| *k != kind) {
            return;
        }
        let mut t = Tally::default();
        run(seed, Plan::Crash(point), kind, &mut t)
            .unwrap_or_else(|e| panic!("seed {seed} point {point} kind {}: {e}", kind.name()));
        return;
    }
    let seeds = env_u64("CKPTFS_CRASH_SEEDS").unwrap_or(default_seeds);
    let first = env_u64("CKPTFS_CRASH_SEED").unwrap_or(1);
    let k = kind.name();
    let mut t = Tally::default();
    let mut points = 0u64;
    for seed in first..first + seeds {
        let total = run(seed, Plan::Clean, kind, &mut t)
            .unwrap_or_else(|e| panic!("seed {seed} kind {k} (clean run): {e}"));
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..12 {
            let p = rng.random_range(0..total.max(1));
            points += 1;
            run(seed, Plan::Crash(p), kind, &mut t).unwrap_or_else(|e| {
                panic!("seed {seed} crash point {p} (replay: CKPTFS_CRASH_SEED={seed} CKPTFS_CRASH_POINT={p} CKPTFS_CRASH_KIND={k}): {e}")
            });
        }
        for _ in 0..6 {
            let (fault, nth) = match rng.random_range(0..4) {
                0 => (OpKind::Write, rng.random_range(0..total.max(1))),
                1 => (OpKind::Sync, rng.random_range(0..(total / 4).max(1))),
                2 => (OpKind::SetLen, rng.random_range(0..4)),
                _ => (OpKind::Read, rng.random_range(0..200)),
            };
            let errno = if rng.random_bool(0.2) {
                libc::ENOSPC
            } else {
                libc::EIO
            };
            run(seed, Plan::Fault(nth, fault, errno), kind, &mut t).unwrap_or_else(|e| {
                panic!("seed {seed} kind {k} fault {fault:?} #{nth} errno {errno}: {e}")
            });
        }
    }
    println!(
        "crash/fault driver ({k}): {seeds} seeds, {points} crash points, {} runs ({} crashed \
         mid-workload, {} faults fired, {} with unsynced writes at power-off), {} recovered \
         states checked after a power loss and {} after the daemon's death, 0 lost",
        t.runs,
        t.crashes,
        t.faults_fired,
        t.lost_writes_possible,
        t.acked_states_checked,
        t.death_states_checked
    );
}
