//! `ckptfs-bench saves`: checkpoint steps made of many files, shaped as frameworks save them,
//! beside a plain directory with and without `fsync` per file (the figures of the issue on
//! many-file checkpoints; no framework is needed to run it).
//!
//! Layouts (`--layouts`):
//! - `trainer`: a Hugging Face `Trainer` step, ten files as measured on a GPT-2-sized run: the
//!   weights (15 MiB), the optimizer state (14 MiB), and eight small ones (scheduler, RNG
//!   state, trainer state, configs, training arguments), 29.5 MiB in all;
//! - `zarr`: an array saved as 64 chunk files of 256 KiB and its `.zarray` metadata.
//!
//! Each of `--jobs` jobs (threads, as ranks saving at once) saves `--steps` steps, each into a
//! new directory `job-J/step-S`, file after file: create, 1 MiB writes, (`fsync`,) close. The
//! first step is new data; each later one changes 5% of every file's 64 KiB blocks, as a
//! training step does to its tensors (a ckptfs side stores about that much). A step is timed
//! from one barrier to the last job's last close; per side, the median step of every
//! repetition. Sides alternate in rotating order on the same disk: plain without `fsync`
//! (the page cache), plain with `fsync` per file (what a careful application pays for the
//! durability every ckptfs close gives), and a ckptfs mount.

use crate::ckptfs::Ckptfs;
use crate::data::RandomSpec;
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir, median};
use crate::Opts;
use clap::Args;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

const GIB: u64 = 1 << 30;
/// The size of each write() call.
const WRITE: usize = 1 << 20;
/// The block a later step changes 5% of.
const BLOCK: usize = 64 << 10;

#[derive(Args, Clone, Debug)]
pub struct SavesOpts {
    #[command(flatten)]
    pub o: Opts,
    /// Layouts, comma-separated: trainer, zarr
    #[arg(long, value_delimiter = ',', default_value = "trainer,zarr",
          value_parser = ["trainer", "zarr"])]
    pub layouts: Vec<String>,
    /// Jobs saving at once, comma-separated
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4])]
    pub jobs: Vec<usize>,
    /// Steps each job saves per repetition (the first new, the rest 5% changed)
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
}

/// The files of one step of `layout`: name and size.
fn files_of(layout: &str) -> Vec<(String, usize)> {
    match layout {
        "trainer" => [
            ("model.safetensors", 15 << 20),
            ("optimizer.pt", 14 << 20),
            ("scheduler.pt", 1_064),
            ("rng_state.pth", 14_244),
            ("trainer_state.json", 4_812),
            ("config.json", 665),
            ("generation_config.json", 119),
            ("training_args.bin", 5_240),
            ("tokenizer_config.json", 1_207),
            ("special_tokens_map.json", 99),
        ]
        .iter()
        .map(|(n, s)| (n.to_string(), *s))
        .collect(),
        _ => (0..64)
            .map(|i| (format!("0.{i}"), 256 << 10))
            .chain(std::iter::once((".zarray".to_string(), 312)))
            .collect(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Plain,
    PlainFsync,
    Ckptfs,
}

/// One job's files: their contents now, changed in place between steps.
struct Job {
    files: Vec<(String, Vec<u8>)>,
    rng: RandomSpec,
    changes: u64,
}

impl Job {
    fn new(layout: &str, seed: u64) -> Job {
        let rng = RandomSpec::new(seed);
        let mut at = 0u64;
        let files = files_of(layout)
            .into_iter()
            .map(|(name, size)| {
                let mut data = vec![0u8; size];
                rng.fill_par(at, &mut data);
                at += size as u64;
                (name, data)
            })
            .collect();
        Job {
            files,
            rng,
            changes: 1 << 40,
        }
    }

    /// A training step: 5% of every file's blocks (at least one) get new bytes.
    fn step(&mut self) {
        for (i, (_, data)) in self.files.iter_mut().enumerate() {
            let blocks = data.len().div_ceil(BLOCK);
            let n = (blocks / 20).max(1);
            for k in 0..n {
                let b = (k * 20 + i + self.changes as usize) % blocks;
                let end = ((b + 1) * BLOCK).min(data.len());
                self.rng.fill_par(self.changes, &mut data[b * BLOCK..end]);
                self.changes += BLOCK as u64;
            }
        }
    }

    /// Saves the files into `dir`, one after the other; seconds are the caller's.
    fn save(&self, dir: &Path, fsync: bool) -> Result<()> {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        for (name, data) in &self.files {
            let p = dir.join(name);
            let err = |what: &str, e: std::io::Error| format!("{what} {}: {e}", p.display());
            let mut fd = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&p)
                .map_err(|e| err("create", e))?;
            for piece in data.chunks(WRITE) {
                fd.write_all(piece).map_err(|e| err("write", e))?;
            }
            if fsync {
                fd.sync_all().map_err(|e| err("fsync", e))?;
            }
            crate::worker::close(fd).map_err(|e| err("close", e))?;
        }
        Ok(())
    }
}

/// Every job saves step `step` into `root/job-J/step-S` at once; seconds from the barrier to
/// the last close.
fn save_step(root: &Path, jobs: &[Job], step: usize, fsync: bool) -> Result<f64> {
    let barrier = std::sync::Barrier::new(jobs.len() + 1);
    let t0 = std::sync::OnceLock::new();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(j, job)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    job.save(&root.join(format!("job-{j}/step-{step}")), fsync)
                })
            })
            .collect();
        barrier.wait();
        t0.set(sys::mono_ns()).expect("set once");
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a job panicked".into())))
            .collect()
    });
    let secs = (sys::mono_ns() - t0.get().expect("set")) as f64 / 1e9;
    for r in results {
        r?;
    }
    Ok(secs)
}

pub fn run(so: &SavesOpts) -> Result<()> {
    let o = &so.o;
    if so.layouts.is_empty() || so.jobs.is_empty() || so.jobs.contains(&0) {
        return Err("--layouts and --jobs must be given and positive".into());
    }
    if so.steps == 0 || o.reps == 0 {
        return Err("--steps and --reps must be positive".into());
    }
    let bin = ckptfs_bin(o)?;
    sys::catch_signals();
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let step_bytes = so
        .layouts
        .iter()
        .map(|l| files_of(l).iter().map(|f| f.1 as u64).sum::<u64>())
        .max()
        .expect("a layout");
    let most = step_bytes * *so.jobs.iter().max().expect("a job count") as u64 * so.steps as u64;
    let space = o.space.unwrap_or((4 * most).max(GIB));
    sys::ensure_free(
        &dir,
        space + most + GIB,
        "a ckptfs space, the plain files, 1 GiB margin",
    )?;
    let (mut ck, plain, mnt) =
        Ckptfs::beside_plain(&bin, &dir, o.mount_args.clone(), space, &o.chunk_size, &[])?;
    println!("ckptfs-bench saves");
    for (k, v) in sys::environment(&dir, &bin) {
        println!("  {k:<13} {v}");
    }
    println!(
        "  {:<13} --layouts {} --jobs {} --steps {} --reps {}",
        "run",
        so.layouts.join(","),
        so.jobs
            .iter()
            .map(|j| j.to_string())
            .collect::<Vec<_>>()
            .join(","),
        so.steps,
        o.reps
    );
    // (layout, jobs, ms per step: plain, plain+fsync, ckptfs)
    let mut rows: Vec<(String, usize, [f64; 3])> = Vec::new();
    for layout in &so.layouts {
        for &n in &so.jobs {
            let mut secs = [vec![], vec![], vec![]];
            for rep in 0..o.reps {
                let order = [Side::Plain, Side::PlainFsync, Side::Ckptfs];
                for k in 0..3 {
                    let side = order[(rep + k) % 3];
                    sys::check_interrupted()?;
                    sys::sync_all();
                    let root = match side {
                        Side::Ckptfs => mnt.join(format!("{layout}-{n}-{rep}")),
                        _ => plain.clone(),
                    };
                    fresh_dir(&root)?;
                    // The same data on every side: the jobs start afresh per side.
                    let mut jobs: Vec<Job> = (0..n)
                        .map(|j| Job::new(layout, o.seed ^ ((j as u64 + 1) << 32)))
                        .collect();
                    let mut steps = Vec::with_capacity(so.steps);
                    for step in 0..so.steps {
                        if step > 0 {
                            jobs.iter_mut().for_each(Job::step);
                        }
                        let s = save_step(&root, &jobs, step, side == Side::PlainFsync)?;
                        if o.verbose {
                            eprintln!(
                                "  {layout} x{n} rep {}/{} step {step} {:<11} {:.1} ms",
                                rep + 1,
                                o.reps,
                                ["plain", "plain+fsync", "ckptfs"][side as usize],
                                s * 1e3
                            );
                        }
                        steps.push(s);
                    }
                    secs[side as usize].push(median(&mut steps));
                    match side {
                        Side::Ckptfs => {
                            fs::remove_dir_all(&root)
                                .map_err(|e| format!("remove {}: {e}", root.display()))?;
                            ck.gc()?;
                        }
                        _ => fresh_dir(&plain)?,
                    }
                }
            }
            let mut ms = [0.0; 3];
            for (i, v) in secs.iter_mut().enumerate() {
                ms[i] = median(v) * 1e3;
            }
            rows.push((layout.clone(), n, ms));
        }
    }
    ck.umount()?;
    if !o.keep {
        for d in [dir.join("backing"), plain] {
            fs::remove_dir_all(&d).map_err(|e| format!("remove {}: {e}", d.display()))?;
        }
    }
    println!(
        "\nsaves: each job saves its files one after the other into a new step directory; the \
         median step (first new, later ones 5% changed) of each rep, median over {} reps",
        o.reps
    );
    println!(
        "| layout | jobs | plain ms/step | plain+fsync ms/step | ckptfs ms/step | \
         ckptfs / plain+fsync | ckptfs / plain |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (layout, n, ms) in rows {
        println!(
            "| {layout} | {n} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            ms[0],
            ms[1],
            ms[2],
            ms[2] / ms[1],
            ms[2] / ms[0]
        );
    }
    Ok(())
}
