//! Crash and fault injection through the whole write path (namespace, chunk store, commit,
//! seal, gc) on simulated disks, checked against a model of what must survive.
//!
//! A run formats a space on a `SimDisk`, then performs a seeded random workload of saves
//! (create or open, writes, sometimes an fsync in the middle, close), unlinks, gc and
//! directory fsyncs through `Fs`. Either power is lost at a chosen device operation (crash
//! runs), or one chosen operation fails with EIO or ENOSPC and the run goes on (fault runs).
//! Then the disk is "rebooted" from its crash image (synced writes plus a random subset of the
//! unsynced ones, some torn) and reopened.
//!
//! The model: the workload records the namespace state (every file's content and its sealed
//! revisions) after every change, and which state the last acknowledged durable call (close,
//! fsync, gc, directory fsync) covered. After the reboot the space must open with no repair
//! step, pass the engine's consistency check, and equal one of the recorded states from the
//! acknowledged one on: nothing acknowledged lost, nothing half-written mixed in.
//!
//! Replay one run: CKPTFS_CRASH_SEED=<seed> CKPTFS_CRASH_POINT=<op> (printed on failure).
//! More runs: CKPTFS_CRASH_SEEDS=<n> (default 60 seeds; each does 1 clean, 12 crash and
//! 6 fault runs).

use ckptfs_engine::format::{InodeId, Superblock};
use ckptfs_engine::sim::{Fault, Image, OpKind, SimDevice, SimDisk};
use ckptfs_engine::space::{Config, Devices};
use ckptfs_engine::Space;
use ckptfs_fs::{Caller, Error, Fs, HandleId};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

const FILES: usize = 4;
const SPACE_BYTES: u64 = 64 << 20;
const ROOT: InodeId = InodeId::ROOT;
const ME: Caller = Caller { uid: 0, gid: 0 };

#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct FileModel {
    content: Arc<Vec<u8>>,
    sealed: Vec<Arc<Vec<u8>>>,
}

type State = BTreeMap<String, FileModel>;

/// Every state the namespace went through, and the first one a crash may fall back to.
struct Model {
    states: Vec<State>,
    acked: usize,
}

impl Model {
    fn cur(&self) -> State {
        self.states.last().unwrap().clone()
    }
    fn push(&mut self, s: State) {
        self.states.push(s);
    }
    /// A durable call returned success: everything so far survives any crash.
    fn ack(&mut self) {
        self.acked = self.states.len() - 1;
    }
}

fn name(i: usize) -> String {
    format!("f{i}")
}

fn devices(disk: &Arc<SimDisk>, data: Image, meta: Image) -> Devices {
    Devices {
        data: SimDevice::new("data", disk, data),
        meta: SimDevice::new("meta", disk, meta),
    }
}

struct Sim {
    disk: Arc<SimDisk>,
    data: Arc<SimDevice>,
    meta: Arc<SimDevice>,
    sb: Superblock,
}

fn format() -> Sim {
    let disk = SimDisk::new();
    let data = SimDevice::new("data", &disk, Image::new(SPACE_BYTES));
    let meta = SimDevice::new("meta", &disk, Image::new(0));
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

/// The bytes of a new version of a file: pieces of a shared pool (dedup across files and
/// revisions), fresh random bytes, and zeros (holes).
fn content(rng: &mut SmallRng, pool: &[Vec<u8>]) -> Vec<u8> {
    let len = match rng.random_range(0..10) {
        0 => 0,
        1..=3 => rng.random_range(1..20_000),
        _ => rng.random_range(20_000..600_000),
    };
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let n = rng.random_range(1..100_000).min(len - v.len());
        match rng.random_range(0..4) {
            0 | 1 => {
                let p = &pool[rng.random_range(0..pool.len())];
                let at = rng.random_range(0..p.len() - n.min(p.len() - 1));
                let n = n.min(p.len() - at);
                v.extend_from_slice(&p[at..at + n]);
            }
            2 => {
                let s = v.len();
                v.resize(s + n, 0);
                rng.fill_bytes(&mut v[s..]);
            }
            _ => v.resize(v.len() + n, 0),
        }
    }
    v
}

/// Runs the workload of `seed`; returns the first error, if any, and the file that was being
/// saved then (its in-memory state holds unacknowledged writes).
fn workload(fs: &Fs, sim: &Sim, seed: u64, model: &mut Model) -> Option<(String, String)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let pool: Vec<Vec<u8>> = (0..6)
        .map(|_| {
            let mut b = vec![0u8; 150_000];
            rng.fill_bytes(&mut b);
            b
        })
        .collect();
    let mut fh = HandleId(1);
    // Handles whose RELEASE has not come yet: the kernel sends RELEASE asynchronously, often
    // after the same process's next OPEN of the file, and a reader's at any time.
    let mut late: Vec<(InodeId, HandleId)> = Vec::new();
    let steps = rng.random_range(10..40);
    for _ in 0..steps {
        if sim.disk.has_crashed() {
            return Some(("power lost".into(), String::new()));
        }
        let f = rng.random_range(0..FILES);
        let nm = name(f);
        let r: Result<(), Error> = (|| {
            if !late.is_empty() && rng.random_bool(0.4) {
                let (ino, h) = late.swap_remove(rng.random_range(0..late.len()));
                fs.release(ino, h)?;
            }
            match rng.random_range(0..22) {
                0..=13 => {
                    // A save: new content, written sequentially or patched in place.
                    fh.0 += 1;
                    let mut s = model.cur();
                    let existing = fs.lookup(ROOT, nm.as_bytes());
                    let ino = match existing {
                        Ok(a) => {
                            let trunc = rng.random_bool(0.7);
                            fs.open(a.ino, fh, true, trunc)?;
                            if trunc {
                                s.get_mut(&nm).unwrap().content = Arc::new(Vec::new());
                            }
                            a.ino
                        }
                        Err(Error::NotFound) => {
                            let a = fs.create(ROOT, nm.as_bytes(), 0o644, ME, fh, true)?;
                            s.insert(nm.clone(), FileModel::default());
                            model.push(s.clone());
                            a.ino
                        }
                        Err(e) => return Err(e),
                    };
                    let mut data = (*s[&nm].content).clone();
                    let new = content(&mut rng, &pool);
                    let at = if data.is_empty() || rng.random_bool(0.6) {
                        0
                    } else {
                        rng.random_range(0..data.len() as u64)
                    };
                    // Write in a few pieces, sometimes out of order.
                    let mut pieces: Vec<(u64, &[u8])> = Vec::new();
                    let mut off = 0usize;
                    while off < new.len() {
                        let n = rng.random_range(1..200_000).min(new.len() - off);
                        pieces.push((at + off as u64, &new[off..off + n]));
                        off += n;
                    }
                    if rng.random_bool(0.2) {
                        pieces.reverse();
                    }
                    let fsync_after = rng
                        .random_bool(0.3)
                        .then(|| rng.random_range(0..=pieces.len()));
                    for (i, (o, p)) in pieces.iter().enumerate() {
                        if fsync_after == Some(i) {
                            // The state is recorded before the call: a crash during the
                            // commit may or may not keep it.
                            let mut s2 = s.clone();
                            s2.get_mut(&nm).unwrap().content = Arc::new(data.clone());
                            model.push(s2);
                            fs.fsync(ino, fh)?;
                            model.ack();
                        }
                        fs.write(ino, fh, 7, *o, p)?;
                        let end = *o as usize + p.len();
                        if data.len() < end {
                            data.resize(end, 0);
                        }
                        data[*o as usize..end].copy_from_slice(p);
                    }
                    let data = Arc::new(data);
                    let m = s.get_mut(&nm).unwrap();
                    m.content = data.clone();
                    // A close lists a revision only when its handle wrote; a handle that only
                    // truncated makes its state durable without listing it.
                    if !pieces.is_empty() {
                        m.sealed.push(data);
                    }
                    model.push(s);
                    fs.flush(ino, fh, 7)?;
                    model.ack();
                    if rng.random_bool(0.4) {
                        late.push((ino, fh));
                    } else {
                        fs.release(ino, fh)?;
                    }
                }
                20 | 21 => {
                    // A bystander (a monitoring script, a data loader): opens the file,
                    // maybe reads and closes it, and releases now or later.
                    if let Ok(a) = fs.lookup(ROOT, nm.as_bytes()) {
                        fh.0 += 1;
                        fs.open(a.ino, fh, false, false)?;
                        if rng.random_bool(0.5) {
                            fs.read(a.ino, fh, 0, 4096)?;
                        }
                        fs.flush(a.ino, fh, 9)?;
                        if rng.random_bool(0.5) {
                            late.push((a.ino, fh));
                        } else {
                            fs.release(a.ino, fh)?;
                        }
                    }
                }
                14..=16 => {
                    if fs.lookup(ROOT, nm.as_bytes()).is_ok() {
                        let mut s = model.cur();
                        s.remove(&nm);
                        model.push(s);
                        fs.unlink(ROOT, nm.as_bytes())?;
                    }
                }
                17 | 18 => {
                    fs.gc(false, None, &mut |_| {})?;
                    model.ack();
                }
                _ => {
                    fs.fsync_dir()?;
                    model.ack();
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            return Some((format!("{e:?}"), nm));
        }
    }
    for (ino, h) in late {
        if let Err(e) = fs.release(ino, h) {
            return Some((format!("late release: {e:?}"), String::new()));
        }
    }
    // Every handle is released: the open-file table must hold none, and no node but those
    // whose commit failed (a fault run stops at the first error, before this point).
    let (_, handles) = fs.open_counts();
    if handles != 0 {
        return Some((
            format!("{handles} handles left after every release"),
            String::new(),
        ));
    }
    None
}

/// Reads the namespace of a reopened space: each file's content and sealed revisions.
fn observe(fs: &Fs) -> Result<State, String> {
    let mut s = State::new();
    for i in 0..FILES {
        let nm = name(i);
        let a = match fs.lookup(ROOT, nm.as_bytes()) {
            Ok(a) => a,
            Err(Error::NotFound) => continue,
            Err(e) => return Err(format!("lookup {nm}: {e:?}")),
        };
        fs.open(a.ino, HandleId(1000 + i as u64), false, false)
            .map_err(|e| format!("open {nm}: {e:?}"))?;
        let content = fs
            .read(a.ino, HandleId(1000 + i as u64), 0, a.rec.size as usize + 1)
            .map_err(|e| format!("read {nm}: {e:?}"))?;
        fs.release(a.ino, HandleId(1000 + i as u64))
            .map_err(|e| format!("release {nm}: {e:?}"))?;
        let mut sealed = Vec::new();
        for r in fs
            .revisions_of(nm.as_bytes())
            .map_err(|e| format!("revisions of {nm}: {e:?}"))?
        {
            let st = fs
                .read_revision(nm.as_bytes(), r.id)
                .map_err(|e| format!("revision {} of {nm}: {e:?}", r.id))?;
            let bytes = st
                .read(fs.space().chunks(), 0, st.size() as usize + 1)
                .map_err(|e| format!("read revision {} of {nm}: {e:?}", r.id))?;
            sealed.push(Arc::new(bytes));
        }
        s.insert(
            nm,
            FileModel {
                content: Arc::new(content),
                sealed,
            },
        );
    }
    Ok(s)
}

fn describe(s: &State) -> String {
    s.iter()
        .map(|(k, v)| {
            format!(
                "{k}: {} bytes {}, sealed [{}]",
                v.content.len(),
                blake3_short(&v.content),
                v.sealed
                    .iter()
                    .map(|c| format!("{} {}", c.len(), blake3_short(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn blake3_short(b: &[u8]) -> String {
    let h = ckptfs_engine::format::ChunkHash::of(b);
    format!("{:02x}{:02x}{:02x}", h.0[0], h.0[1], h.0[2])
}

/// What a run exercised.
#[derive(Default, Debug)]
struct Tally {
    runs: u64,
    crashes: u64,
    faults_fired: u64,
    lost_writes_possible: u64,
    acked_states_checked: u64,
}

fn run(seed: u64, plan: Plan, tally: &mut Tally) -> Result<u64, String> {
    let sim = format();
    let base = sim.disk.ops();
    let devs = Devices {
        data: sim.data.clone(),
        meta: sim.meta.clone(),
    };
    let space =
        Space::open_devices(sim.sb.clone(), devs).map_err(|e| format!("open after format: {e}"))?;
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
    let mut model = Model {
        states: vec![State::new()],
        acked: 0,
    };
    let failed = workload(&fs, &sim, seed, &mut model);
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
                    .create(ROOT, f.as_bytes(), 0o644, ME, HandleId(99_999), true)
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
    if sim.data.pending_writes() + sim.meta.pending_writes() > 0 {
        tally.lost_writes_possible += 1;
    }
    let data = sim.data.crash_image(&mut rng);
    let meta = sim.meta.crash_image(&mut rng);
    drop(fs);
    let disk2 = SimDisk::new();
    let space = Space::open_devices(sim.sb.clone(), devices(&disk2, data, meta))
        .map_err(|e| format!("reopen after the crash failed: {e}"))?;
    let report = ckptfs_engine::check::check(&space, &mut |_, _| {})
        .map_err(|e| format!("check failed to run: {e}"))?;
    if !report.is_clean() {
        return Err(format!(
            "check after the crash: {} damaged chunks (first: {:?}), problems: {:?}",
            report.damaged.len(),
            report.damaged.first(),
            report.problems.iter().take(5).collect::<Vec<_>>()
        ));
    }
    let fs = Fs::new(space);
    let got = observe(&fs)?;
    tally.acked_states_checked += 1;
    if !model.states[model.acked..].contains(&got) {
        return Err(format!(
            "the recovered state is none of the states from the last acknowledged one on\n  \
             recovered: {}\n  acknowledged: {}\n  later states: {}",
            describe(&got),
            describe(&model.states[model.acked]),
            model.states.len() - 1 - model.acked
        ) + &format!(
            "\n  it equals earlier state(s) {:?} of {}; acknowledged was {}",
            model
                .states
                .iter()
                .enumerate()
                .filter(|(_, s)| **s == got)
                .map(|(i, _)| i)
                .collect::<Vec<_>>(),
            model.states.len(),
            model.acked
        ));
    }
    // The space takes writes again.
    let a = fs
        .create(ROOT, b"after-reboot", 0o644, ME, HandleId(5), true)
        .map_err(|e| format!("create after reboot: {e:?}"))?;
    fs.write(a.ino, HandleId(5), 1, 0, b"alive")
        .and_then(|_| fs.flush(a.ino, HandleId(5), 1))
        .and_then(|_| fs.release(a.ino, HandleId(5)))
        .map_err(|e| format!("write after reboot: {e:?}"))?;
    Ok(total_ops)
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

#[test]
fn committed_revisions_survive_crashes_and_faults() {
    if let (Some(seed), Some(point)) = (env_u64("CKPTFS_CRASH_SEED"), env_u64("CKPTFS_CRASH_POINT"))
    {
        let mut t = Tally::default();
        run(seed, Plan::Crash(point), &mut t)
            .unwrap_or_else(|e| panic!("seed {seed} point {point}: {e}"));
        return;
    }
    let seeds = env_u64("CKPTFS_CRASH_SEEDS").unwrap_or(60);
    let first = env_u64("CKPTFS_CRASH_SEED").unwrap_or(1);
    let mut t = Tally::default();
    let mut points = 0u64;
    for seed in first..first + seeds {
        let total = run(seed, Plan::Clean, &mut t)
            .unwrap_or_else(|e| panic!("seed {seed} (clean run): {e}"));
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..12 {
            let p = rng.random_range(0..total.max(1));
            points += 1;
            run(seed, Plan::Crash(p), &mut t).unwrap_or_else(|e| {
                panic!("seed {seed} crash point {p} (replay: CKPTFS_CRASH_SEED={seed} CKPTFS_CRASH_POINT={p}): {e}")
            });
        }
        for _ in 0..6 {
            let (kind, nth) = match rng.random_range(0..4) {
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
            run(seed, Plan::Fault(nth, kind, errno), &mut t)
                .unwrap_or_else(|e| panic!("seed {seed} fault {kind:?} #{nth} errno {errno}: {e}"));
        }
    }
    println!(
        "crash/fault driver: {seeds} seeds, {points} crash points, {} runs ({} crashed mid-workload, \
         {} faults fired, {} with unsynced writes at power-off), {} recovered states checked, 0 lost",
        t.runs, t.crashes, t.faults_fired, t.lost_writes_possible, t.acked_states_checked
    );
}
