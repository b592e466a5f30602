//! What the crash drivers (`crash.rs`, `crash_targets.rs`) share: the seeded workload
//! through `Fs`, the model of the states it goes through, and the observation of a
//! recovered space.
#![allow(dead_code)]

use ckptfs_engine::format::InodeId;
use ckptfs_engine::sim::SimDisk;
use ckptfs_fs::{Caller, Error, Fs, HandleId, SetAttr};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const FILES: usize = 4;
pub const ROOT: InodeId = InodeId::ROOT;
pub const ME: Caller = Caller { uid: 0, gid: 0 };

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FileModel {
    pub content: Arc<Vec<u8>>,
    pub sealed: Vec<Arc<Vec<u8>>>,
    /// Mode bits and owner: an untar-like save sets them while the file is open for
    /// writing, which the engine holds until the next transaction (`space::deferred`).
    pub perm: u32,
    pub uid: u32,
}

pub type State = BTreeMap<String, FileModel>;

/// Every state the namespace went through, the first one a crash may fall back to, and the
/// first one the daemon's death may fall back to.
pub struct Model {
    pub states: Vec<State>,
    pub acked: usize,
    /// A namespace change that returned (an unlink) survives the death of the process (its
    /// journal record is written, unsynced: `Space::commit`), in the default mode of a
    /// journaled space.
    pub returned: usize,
}

impl Model {
    pub fn cur(&self) -> State {
        self.states.last().unwrap().clone()
    }
    pub fn push(&mut self, s: State) {
        self.states.push(s);
    }
    pub fn new() -> Model {
        Model {
            states: vec![State::new()],
            acked: 0,
            returned: 0,
        }
    }
    /// A durable call returned success: everything so far survives any crash.
    pub fn ack(&mut self) {
        self.acked = self.states.len() - 1;
        self.returned = self.acked;
    }
    /// A namespace change returned: everything so far survives the daemon's death.
    pub fn returned(&mut self) {
        self.returned = self.states.len() - 1;
    }
}

pub fn name(i: usize) -> String {
    format!("f{i}")
}

/// The bytes of a new version of a file: pieces of a shared pool (dedup across files and
/// revisions), fresh random bytes, and zeros (holes).
pub fn content(rng: &mut SmallRng, pool: &[Vec<u8>]) -> Vec<u8> {
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
pub fn workload(fs: &Fs, disk: &SimDisk, seed: u64, model: &mut Model) -> Option<(String, String)> {
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
        if disk.has_crashed() {
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
                            let a =
                                fs.create(ROOT, nm.as_bytes(), 0o644, ME, fh, true, false, false)?;
                            s.insert(
                                nm.clone(),
                                FileModel {
                                    perm: 0o644,
                                    ..FileModel::default()
                                },
                            );
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
                    if rng.random_bool(0.4) {
                        // As tar does before its close: owner and mode of the file being
                        // written (a namespace change of its own, not part of the save).
                        let (perm, uid) = (
                            0o600 | rng.random_range(0..0o100u32),
                            rng.random_range(0..3u32),
                        );
                        let attr = SetAttr {
                            perm: Some(perm),
                            uid: Some(uid),
                            ..SetAttr::default()
                        };
                        let mut now = model.cur();
                        if let Some(m) = now.get_mut(&nm) {
                            (m.perm, m.uid) = (perm, uid);
                        }
                        model.push(now);
                        let m = s.get_mut(&nm).unwrap();
                        (m.perm, m.uid) = (perm, uid);
                        fs.setattr(ino, &attr)?;
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
                    // A close is a durability point unless the mount defers durability
                    // to fsync (`--durability fsync`).
                    if fs.space().close_durable() {
                        model.ack();
                    }
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
                        model.returned();
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
pub fn observe(fs: &Fs) -> Result<State, String> {
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
                .read(fs.space().data().chunks(), 0, st.size() as usize + 1)
                .map_err(|e| format!("read revision {} of {nm}: {e:?}", r.id))?;
            sealed.push(Arc::new(bytes));
        }
        s.insert(
            nm,
            FileModel {
                content: Arc::new(content),
                sealed,
                perm: a.rec.perm & 0o7777,
                uid: a.rec.uid,
            },
        );
    }
    Ok(s)
}

pub fn describe(s: &State) -> String {
    s.iter()
        .map(|(k, v)| {
            format!(
                "{k}: mode {:o} uid {}, {} bytes {}, sealed [{}]",
                v.perm,
                v.uid,
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

pub fn blake3_short(b: &[u8]) -> String {
    let h = ckptfs_engine::format::ChunkHash::of(b);
    format!("{:02x}{:02x}{:02x}", h.0[0], h.0[1], h.0[2])
}

/// What a run exercised.
#[derive(Default, Debug)]
pub struct Tally {
    pub runs: u64,
    pub crashes: u64,
    pub faults_fired: u64,
    pub lost_writes_possible: u64,
    pub acked_states_checked: u64,
    /// States checked after the daemon's death (every completed write kept).
    pub death_states_checked: u64,
}
