//! Crash simulation of a slot of a multi-slot space: the commit steps a slot adds (manifest
//! batches, header flips with the new manifest length, the snapshot at a takeover) on
//! simulated disks, with power lost at a chosen device operation.
//!
//! A run formats a 2-slot space on one `SimDisk` (data file, slot table, slot 0's table),
//! claims slot 0 and runs a seeded workload of saves, unlinks, directory fsyncs and gc through
//! `Fs`, recording every namespace state and which one the last acknowledged durable call
//! (close, fsync, directory fsync, gc) covered. Power is lost at a chosen operation. Then,
//! from the crash image:
//!
//! 1. another node (a reader in slot 1) reads slot 0's published manifest as the crash left
//!    it: the files it shows, byte for byte, must be one of the states from the acknowledged
//!    one on (a close returns only after its publication is durable);
//! 2. a new owner takes slot 0 over (as `mount --slot 0 --take-over` after a node death),
//!    which publishes a snapshot; its own namespace must be one of those states, and the
//!    reader in slot 1 must then see exactly that namespace.
//!
//! Replay: CKPTFS_SLOT_CRASH_SEED=<seed> CKPTFS_SLOT_CRASH_POINT=<op>. More runs:
//! CKPTFS_SLOT_CRASH_SEEDS=<n> (default 25 seeds of 1 clean and 10 crash runs).

use ckptfs_engine::device::Device;
use ckptfs_engine::format::{InodeId, NodeKind, SlotId, Superblock};
use ckptfs_engine::manifest::Union;
use ckptfs_engine::sim::{Image, SimDevice, SimDisk};
use ckptfs_engine::slots::{SlotRequest, SlotTable};
use ckptfs_engine::space::{Config, Devices, OnDevices};
use ckptfs_engine::Space;
use ckptfs_fs::{Caller, Error, Fs, HandleId};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const FILES: usize = 4;
const SPACE_BYTES: u64 = 128 << 20;
const ROOT: InodeId = InodeId::ROOT;
const ME: Caller = Caller { uid: 0, gid: 0 };

/// name -> content.
type State = BTreeMap<String, Vec<u8>>;

struct Sim {
    disk: Arc<SimDisk>,
    data: Arc<SimDevice>,
    headers: Arc<SimDevice>,
    meta: Arc<SimDevice>,
    sb: Superblock,
}

fn format() -> Sim {
    let disk = SimDisk::new();
    let data = SimDevice::new("data", &disk, Image::new(SPACE_BYTES));
    let headers = SimDevice::new("headers", &disk, Image::new(0));
    let meta = SimDevice::new("meta", &disk, Image::new(0));
    let config = Config {
        keep_revisions: 3,
        keep_age_secs: 0,
        keep_unlinked_secs: 0,
        auto_gc_free_percent: 0,
    };
    let d: Arc<dyn Device> = data.clone();
    let h: Arc<dyn Device> = headers.clone();
    let sb = Space::format_slots_devices(&d, &h, 4096, config, 2).expect("format 2 slots");
    Sim {
        disk,
        data,
        headers,
        meta,
        sb,
    }
}

fn claim(sb: &Superblock, data: Arc<SimDevice>, meta: Arc<SimDevice>, h: Arc<SimDevice>) -> Space {
    let req = SlotRequest {
        slot: Some(SlotId(0)),
        lease: Duration::from_secs(600),
        mountpoint: "/sim".into(),
        take_over: true,
    };
    let space = Space::open_devices_as(
        sb.clone(),
        OnDevices::Slot {
            devs: Devices { data, meta },
            headers: h,
            req,
            settle: Duration::ZERO,
        },
    )
    .expect("claim slot 0");
    // Chunks stored on the calling thread: a printed seed and point replay exactly.
    space.store().set_workers(0);
    space
}

/// What a node in slot 1 reads of slot 0 from `data` and `headers` as they are.
fn published(
    sb: &Superblock,
    data: Arc<SimDevice>,
    headers: Arc<SimDevice>,
) -> Result<State, String> {
    let u = Union::new(
        SlotTable::new(headers, sb.slots),
        data.clone(),
        None,
        sb.clone(),
        SlotId(1),
    );
    u.refresh()
        .map_err(|e| format!("reading the manifests: {e}"))?;
    let mut s = State::new();
    let Some(v) = u.view(SlotId(0)) else {
        return Ok(s);
    };
    let names: Vec<Vec<u8>> = v
        .by_parent
        .get(&ROOT)
        .map(|n| n.iter().cloned().collect())
        .unwrap_or_default();
    for name in &names {
        let Some(b) = v.binding(ROOT, name) else {
            continue;
        };
        if b.is_tombstone() || b.kind != NodeKind::File {
            continue;
        }
        // Slot 0 alone writes here: a file's content is its own version's.
        let n = &v
            .versions
            .get(&b.child)
            .ok_or_else(|| format!("{name:?}: listed, not published"))?
            .node;
        let mut b = vec![0u8; n.size as usize];
        for e in n.extents.iter() {
            // What the store's reader does with a published record: read, verify.
            let mut raw = vec![0u8; e.stored_len as usize];
            ckptfs_engine::device::Device::read_at(&*data, &mut raw, e.at.0)
                .map_err(|err| format!("{name:?}: chunk at {}: {err}", e.off))?;
            let raw = ckptfs_engine::chunk::Stored::new(e.hash, e.chunk_record(), raw)
                .verify()
                .map_err(|err| format!("{name:?}: chunk at {}: {err}", e.off))?
                .into_bytes();
            let from = e.chunk_off as usize;
            b[e.off as usize..e.off as usize + e.len as usize]
                .copy_from_slice(&raw[from..from + e.len as usize]);
        }
        s.insert(String::from_utf8_lossy(name).into_owned(), b);
    }
    Ok(s)
}

/// This slot's own namespace through `Fs`.
fn observe(fs: &Fs) -> Result<State, String> {
    let mut s = State::new();
    for i in 0..FILES {
        let nm = format!("f{i}");
        let a = match fs.lookup(ROOT, nm.as_bytes()) {
            Ok(a) => a,
            Err(Error::NotFound) => continue,
            Err(e) => return Err(format!("lookup {nm}: {e:?}")),
        };
        let fh = HandleId(1000 + i as u64);
        fs.open(a.ino, fh, false, false)
            .map_err(|e| format!("open {nm}: {e:?}"))?;
        let b = fs
            .read(a.ino, fh, 0, a.rec.size as usize + 1)
            .map_err(|e| format!("read {nm}: {e:?}"))?;
        fs.release(a.ino, fh).map_err(|e| format!("{e:?}"))?;
        s.insert(nm, b);
    }
    Ok(s)
}

fn describe(s: &State) -> String {
    s.iter()
        .map(|(k, v)| format!("{k}: {} bytes", v.len()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a call acknowledged: durability (gc), or durability and publication (close,
/// directory fsync, and every namespace change of a shared namespace).
enum Ack {
    Durable,
    Published,
}

/// The seeded workload; returns every state, the index of the last one a durable call
/// acknowledged, and of the last one a publishing call acknowledged.
fn workload(fs: &Fs, disk: &SimDisk, seed: u64) -> (Vec<State>, usize, usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut states = vec![State::new()];
    let (mut acked, mut published) = (0, 0);
    let mut fh = HandleId(1);
    for _ in 0..rng.random_range(8..24) {
        if disk.has_crashed() {
            break;
        }
        let nm = format!("f{}", rng.random_range(0..FILES));
        let mut s = states.last().unwrap().clone();
        let r: Result<Ack, Error> = (|| match rng.random_range(0..10) {
            0..=6 => {
                fh.0 += 1;
                let ino = match fs.lookup(ROOT, nm.as_bytes()) {
                    Ok(a) => {
                        fs.open(a.ino, fh, true, true)?;
                        a.ino
                    }
                    Err(Error::NotFound) => {
                        // In a shared namespace a create is durable and published when it
                        // returns: the empty file is a state of its own (one a crash during
                        // the call may leave), acknowledged by the return.
                        let mut empty = s.clone();
                        empty.insert(nm.clone(), Vec::new());
                        states.push(empty);
                        let a =
                            fs.create(ROOT, nm.as_bytes(), 0o644, ME, fh, true, false, false)?;
                        acked = states.len() - 1;
                        published = acked;
                        a.ino
                    }
                    Err(e) => return Err(e),
                };
                let mut b = vec![0u8; rng.random_range(1..300_000)];
                rng.fill_bytes(&mut b);
                fs.write(ino, fh, 1, 0, &b)?;
                s.insert(nm.clone(), b);
                states.push(s.clone());
                fs.flush(ino, fh, 1)?;
                fs.release(ino, fh)?;
                Ok(Ack::Published)
            }
            7 => {
                // A state from the moment the call is made (a crash inside it may leave the
                // removal durable and published); acknowledged by its return, as every
                // namespace change of a shared namespace is published before it returns.
                s.remove(&nm);
                states.push(s.clone());
                fs.unlink(ROOT, nm.as_bytes()).or_else(|e| match e {
                    Error::NotFound => Ok(()),
                    e => Err(e),
                })?;
                Ok(Ack::Published)
            }
            8 => {
                fs.fsync_dir()?;
                Ok(Ack::Published)
            }
            _ => {
                fs.gc(false, None, &mut |_| {})?;
                Ok(Ack::Durable)
            }
        })();
        match r {
            Ok(Ack::Published) => {
                acked = states.len() - 1;
                published = acked;
            }
            Ok(Ack::Durable) => acked = states.len() - 1,
            Err(_) => break,
        }
    }
    (states, acked, published)
}

fn run(seed: u64, crash: Option<u64>) -> Result<u64, String> {
    let sim = format();
    let space = claim(
        &sim.sb,
        sim.data.clone(),
        sim.meta.clone(),
        sim.headers.clone(),
    );
    let fs = Fs::new(space);
    fs.publish_all()
        .map_err(|e| format!("first publication: {e:?}"))?;
    let base = sim.disk.ops();
    if let Some(n) = crash {
        sim.disk.crash_at(base + n);
    }
    let (states, acked, pub_acked) = workload(&fs, &sim.disk, seed);
    let total = sim.disk.ops() - base;
    if crash.is_none() && sim.disk.has_crashed() {
        return Err("a clean run crashed".into());
    }
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xc0ffee);
    let data = sim.data.crash_image(&mut rng);
    let headers = sim.headers.crash_image(&mut rng);
    let meta = sim.meta.crash_image(&mut rng);
    drop(fs);
    let later = &states[acked..];
    // 1. Another node reads what the dead owner had published.
    let disk2 = SimDisk::new();
    let (d2, h2) = (
        SimDevice::new("data", &disk2, data.clone()),
        SimDevice::new("headers", &disk2, headers.clone()),
    );
    let seen = published(&sim.sb, d2, h2)?;
    if !states[pub_acked..].contains(&seen) {
        return Err(format!(
            "another node reads a published state that is none from the last published \
             acknowledgement on: {}; acknowledged: {}",
            describe(&seen),
            describe(&states[pub_acked])
        ));
    }
    // 2. A new owner takes the slot over and publishes; everyone sees its namespace.
    let disk3 = SimDisk::new();
    let (d3, h3, m3) = (
        SimDevice::new("data", &disk3, data),
        SimDevice::new("headers", &disk3, headers),
        SimDevice::new("meta", &disk3, meta),
    );
    let space = claim(&sim.sb, d3.clone(), m3, h3.clone());
    let report = ckptfs_engine::maintenance::check::check(&space, &mut |_, _| {})
        .map_err(|e| format!("check after takeover could not run: {e}"))?;
    if !report.is_clean() {
        return Err(format!("check after takeover: {:?}", report.problems));
    }
    let fs = Fs::new(space);
    fs.publish_all()
        .map_err(|e| format!("publication at takeover: {e:?}"))?;
    let own = observe(&fs)?;
    if !later.contains(&own) {
        return Err(format!(
            "the slot after takeover holds none of the states from the acknowledged one on: {}",
            describe(&own)
        ));
    }
    let seen = published(&sim.sb, d3, h3)?;
    if seen != own {
        return Err(format!(
            "after takeover another node reads {} but the slot holds {}",
            describe(&seen),
            describe(&own)
        ));
    }
    Ok(total)
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

#[test]
fn published_manifests_and_takeover_survive_crashes() {
    if let (Some(seed), Some(p)) = (
        env_u64("CKPTFS_SLOT_CRASH_SEED"),
        env_u64("CKPTFS_SLOT_CRASH_POINT"),
    ) {
        run(seed, Some(p)).unwrap_or_else(|e| panic!("seed {seed} point {p}: {e}"));
        return;
    }
    let seeds = env_u64("CKPTFS_SLOT_CRASH_SEEDS").unwrap_or(25);
    let mut points = 0;
    for seed in 1..=seeds {
        let total = run(seed, None).unwrap_or_else(|e| panic!("seed {seed} (clean): {e}"));
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..10 {
            let p = rng.random_range(0..total.max(1));
            points += 1;
            run(seed, Some(p)).unwrap_or_else(|e| {
                panic!(
                    "seed {seed} point {p} (replay: CKPTFS_SLOT_CRASH_SEED={seed} \
                     CKPTFS_SLOT_CRASH_POINT={p}): {e}"
                )
            });
        }
    }
    println!("slot crash driver: {seeds} seeds, {points} crash points, 0 acknowledged states lost");
}
