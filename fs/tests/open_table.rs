//! The open-file table under racing requests, without a kernel in between: several threads
//! call `Fs` the way FUSE worker threads do, with the orderings the kernel really produces
//! (a RELEASE arrives asynchronously, often after the same process's next OPEN of the file;
//! bystanders open, read, stat and release the file at any moment; a rename replaces it).
//!
//! Writers also change the mode of the file they are writing before closing it, as an untar
//! does (held by the engine until the next transaction: `space::deferred`).
//!
//! After every acknowledged close (FLUSH returned Ok) a writer reads its file back through a
//! fresh handle and compares, its mode too; at the end every file holds its last acknowledged content, the
//! table holds no handle and no node, and the same is true after the space is reopened.
//!
//! Seeded: `CKPTFS_SEED` replays each thread's choices (the interleaving is up to the
//! scheduler); `CKPTFS_OPEN_TABLE_SAVES` sets the saves per writer (default 1000).

use ckptfs_engine::format::InodeId;
use ckptfs_engine::space::Config;
use ckptfs_engine::Space;
use ckptfs_fs::{Caller, Error, Fs, HandleId};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const ROOT: InodeId = InodeId::ROOT;
const ME: Caller = Caller { uid: 0, gid: 0 };
const WRITERS: usize = 3;
const BYSTANDERS: usize = 3;

fn seed() -> u64 {
    let s = std::env::var("CKPTFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0b3e_7ab1);
    println!("seed {s} (replay with CKPTFS_SEED={s})");
    s
}

/// File handles are unique for the life of the daemon, as the adapter hands them out.
static NEXT_FH: AtomicU64 = AtomicU64::new(1);
fn fh() -> HandleId {
    HandleId(NEXT_FH.fetch_add(1, Ordering::Relaxed))
}

fn read_all(fs: &Fs, name: &str) -> Result<Vec<u8>, String> {
    let a = fs
        .lookup(ROOT, name.as_bytes())
        .map_err(|e| format!("lookup {name}: {e:?}"))?;
    let h = fh();
    fs.open(a.ino, h, false, false)
        .map_err(|e| format!("open {name} to read: {e:?}"))?;
    let size = fs.getattr(a.ino).map_err(|e| format!("{e:?}"))?.rec.size;
    let r = fs.read(a.ino, h, 0, size as usize + 1);
    fs.release(a.ino, h)
        .map_err(|e| format!("release {name} after read: {e:?}"))?;
    r.map_err(|e| format!("read {name}: {e:?}"))
}

struct Writer {
    name: String,
    acked: Vec<u8>,
    /// The mode of its last acknowledged save.
    mode: u32,
    /// A handle whose RELEASE the "kernel" has not sent yet: it goes after the next OPEN.
    late_release: Option<(InodeId, HandleId)>,
}

impl Writer {
    fn save(&mut self, fs: &Fs, rng: &mut SmallRng, n: u64) -> Result<(), String> {
        let len = rng.random_range(1..200_000usize);
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        let e = |what: &str, err: Error| format!("save {n} of {}: {what}: {err:?}", self.name);
        let how = rng.random_range(0..10);
        let mut mode = self.mode;
        let expected = if how < 2 {
            // write-temp-then-rename over the file.
            let tmp = format!("{}.tmp", self.name);
            let h = fh();
            let a = match fs.lookup(ROOT, tmp.as_bytes()) {
                Ok(a) => {
                    fs.open(a.ino, h, true, true)
                        .map_err(|x| e("open tmp", x))?;
                    a
                }
                Err(_) => fs
                    .create(ROOT, tmp.as_bytes(), 0o644, ME, h, true, false, false)
                    .map_err(|x| e("create tmp", x))?,
            };
            fs.write(a.ino, h, 1, 0, &data)
                .map_err(|x| e("write tmp", x))?;
            // The temporary file's mode goes with it over the name (a new inode).
            mode = match rng.random_bool(0.5) {
                true => chmod(fs, a.ino, rng).map_err(|x| e("chmod tmp", x))?,
                false => fs.getattr(a.ino).map_err(|x| e("stat tmp", x))?.rec.perm,
            };
            fs.flush(a.ino, h, 1).map_err(|x| e("flush tmp", x))?;
            fs.release(a.ino, h).map_err(|x| e("release tmp", x))?;
            fs.rename(
                ROOT,
                tmp.as_bytes(),
                ROOT,
                self.name.as_bytes(),
                false,
                false,
            )
            .map_err(|x| e("rename", x))?;
            data
        } else {
            let trunc = how < 6;
            let a = fs
                .lookup(ROOT, self.name.as_bytes())
                .map_err(|x| e("lookup", x))?;
            let h = fh();
            fs.open(a.ino, h, true, trunc).map_err(|x| e("open", x))?;
            // The previous close's RELEASE, delivered after this OPEN.
            if let Some((ino, old)) = self.late_release.take() {
                fs.release(ino, old).map_err(|x| e("late release", x))?;
            }
            if rng.random_bool(0.2) {
                let half = data.len() / 2;
                fs.write(a.ino, h, 1, 0, &data[..half])
                    .map_err(|x| e("write", x))?;
                fs.fsync(a.ino, h).map_err(|x| e("fsync", x))?;
                fs.write(a.ino, h, 1, half as u64, &data[half..])
                    .map_err(|x| e("write", x))?;
            } else {
                fs.write(a.ino, h, 1, 0, &data).map_err(|x| e("write", x))?;
            }
            if rng.random_bool(0.4) {
                mode = chmod(fs, a.ino, rng).map_err(|x| e("chmod", x))?;
            }
            fs.flush(a.ino, h, 1).map_err(|x| e("flush", x))?;
            if rng.random_bool(0.5) {
                self.late_release = Some((a.ino, h));
            } else {
                fs.release(a.ino, h).map_err(|x| e("release", x))?;
            }
            let mut exp = data;
            if !trunc && self.acked.len() > exp.len() {
                exp.extend_from_slice(&self.acked[exp.len()..]);
            }
            exp
        };
        let got_mode = fs
            .lookup(ROOT, self.name.as_bytes())
            .map_err(|x| e("lookup after close", x))?
            .rec
            .perm;
        if got_mode != mode {
            return Err(format!(
                "save {n} of {}: mode {got_mode:o} after the close, expected {mode:o}",
                self.name
            ));
        }
        let got = read_all(fs, &self.name)?;
        if got != expected {
            return Err(format!(
                "save {n} of {}: close returned Ok but a read gives {} bytes, expected {} \
                 (first difference at {:?})",
                self.name,
                got.len(),
                expected.len(),
                got.iter().zip(&expected).position(|(a, b)| a != b)
            ));
        }
        self.acked = expected;
        self.mode = mode;
        Ok(())
    }

    fn finish(&mut self, fs: &Fs) -> Result<(), String> {
        if let Some((ino, h)) = self.late_release.take() {
            fs.release(ino, h)
                .map_err(|e| format!("final release of {}: {e:?}", self.name))?;
        }
        Ok(())
    }
}

/// A chmod of the open file `ino` to a random mode, which it returns.
fn chmod(fs: &Fs, ino: InodeId, rng: &mut SmallRng) -> Result<u32, Error> {
    let perm = 0o600 | rng.random_range(0..0o100u32);
    let s = ckptfs_fs::SetAttr {
        perm: Some(perm),
        ..ckptfs_fs::SetAttr::default()
    };
    Ok(fs.setattr(ino, &s)?.rec.perm)
}

/// Opens, reads, stats and releases the writers' files, sometimes keeping a handle across
/// several of its own steps, until `stop`.
fn bystander(fs: &Fs, seed: u64, stop: &AtomicBool) -> Result<u64, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut held: Vec<(InodeId, HandleId)> = Vec::new();
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        let name = format!("f{}", rng.random_range(0..WRITERS));
        let a = match fs.lookup(ROOT, name.as_bytes()) {
            Ok(a) => a,
            Err(Error::NotFound) => continue,
            Err(e) => return Err(format!("bystander lookup {name}: {e:?}")),
        };
        match rng.random_range(0..10) {
            0..=5 => {
                let h = fh();
                match fs.open(a.ino, h, false, false) {
                    Ok(()) => {}
                    // Replaced by a rename and dropped between lookup and open.
                    Err(Error::NotFound) => continue,
                    Err(e) => return Err(format!("bystander open {name}: {e:?}")),
                }
                if rng.random_bool(0.3) {
                    fs.read(a.ino, h, 0, 4096)
                        .map_err(|e| format!("bystander read {name}: {e:?}"))?;
                }
                if rng.random_bool(0.2) {
                    fs.flush(a.ino, h, 2)
                        .map_err(|e| format!("bystander flush {name}: {e:?}"))?;
                }
                if rng.random_bool(0.2) {
                    held.push((a.ino, h));
                } else {
                    fs.release(a.ino, h)
                        .map_err(|e| format!("bystander release {name}: {e:?}"))?;
                }
            }
            6 | 7 => {
                let _ = fs.getattr(a.ino);
            }
            _ => {
                if !held.is_empty() {
                    let (ino, h) = held.swap_remove(rng.random_range(0..held.len()));
                    fs.release(ino, h)
                        .map_err(|e| format!("bystander late release: {e:?}"))?;
                }
            }
        }
        ops += 1;
    }
    for (ino, h) in held {
        fs.release(ino, h)
            .map_err(|e| format!("bystander final release: {e:?}"))?;
    }
    Ok(ops)
}

#[test]
fn racing_open_flush_release_rename_lose_nothing() {
    let seed = seed();
    let saves: u64 = std::env::var("CKPTFS_OPEN_TABLE_SAVES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let dir = std::env::temp_dir().join(format!("ckptfs-open-table-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = Config {
        keep_revisions: 2,
        ..Config::default()
    };
    Space::format(&dir, 512 << 20, 16384, config, false).expect("format");
    let fs = Arc::new(Fs::new(Space::open(&dir).expect("open")));
    // Every write sweeps the other open files (retiring their pieces, handing over their
    // streams and dirty blocks) while their own threads open, write, flush and release them.
    fs.set_memory_sweep(1, 0);
    let mut writers: Vec<Writer> = (0..WRITERS)
        .map(|i| {
            let name = format!("f{i}");
            let h = fh();
            let a = fs
                .create(ROOT, name.as_bytes(), 0o644, ME, h, true, false, false)
                .expect("create");
            fs.flush(a.ino, h, 1).expect("flush");
            fs.release(a.ino, h).expect("release");
            Writer {
                name,
                acked: Vec::new(),
                mode: 0o644,
                late_release: None,
            }
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let bystanders: Vec<_> = (0..BYSTANDERS)
        .map(|b| {
            let (fs, stop) = (fs.clone(), stop.clone());
            std::thread::spawn(move || bystander(&fs, seed ^ (0xb0 + b as u64), &stop))
        })
        .collect();
    let handles: Vec<_> = writers
        .drain(..)
        .enumerate()
        .map(|(i, mut w)| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (i as u64 + 1) << 40);
                let mut result = Ok(());
                for n in 1..=saves {
                    result = w.save(&fs, &mut rng, n);
                    if result.is_err() {
                        break;
                    }
                }
                (w, result)
            })
        })
        .collect();
    let mut failures = Vec::new();
    for h in handles {
        let (mut w, r) = h.join().expect("writer panicked");
        if let Err(e) = r.and_then(|()| w.finish(&fs)) {
            failures.push(e);
        }
        writers.push(w);
    }
    stop.store(true, Ordering::Relaxed);
    for b in bystanders {
        match b.join().expect("bystander panicked") {
            Ok(ops) => println!("bystander: {ops} ops"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    for w in &writers {
        assert!(
            read_all(&fs, &w.name).unwrap() == w.acked,
            "{} differs",
            w.name
        );
    }
    assert_eq!(
        fs.open_counts(),
        (0, 0),
        "(nodes, handles) left in the open-file table after every handle was released"
    );
    // A handle the daemon does not know is an error, never a silent success.
    let a = fs.lookup(ROOT, b"f0").unwrap();
    assert!(matches!(
        fs.flush(a.ino, HandleId(1 << 60), 1),
        Err(Error::BadHandle)
    ));
    assert!(matches!(
        fs.release(a.ino, HandleId(1 << 60)),
        Err(Error::BadHandle)
    ));

    fs.commit_all().expect("commit at unmount");
    drop(Arc::into_inner(fs).expect("only reference"));
    let fs = Fs::new(Space::open(&dir).expect("reopen"));
    for w in &writers {
        assert!(
            read_all(&fs, &w.name).unwrap() == w.acked,
            "{} differs after reopening the space",
            w.name
        );
        let perm = fs.lookup(ROOT, w.name.as_bytes()).unwrap().rec.perm;
        assert_eq!(perm, w.mode, "{}'s mode after reopening the space", w.name);
    }
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}
