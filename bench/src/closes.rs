//! `ckptfs-bench closes`: what one durable close of a small file costs (the groundwork of
//! checkpoints made of many files: a Trainer step, DCP's per-rank files and `.metadata`,
//! zarr chunks, every `config.json`).
//!
//! Per file size and writer count, per repetition, three sides in rotating order on the same
//! disk: a plain directory without `fsync` (what the page cache costs), a plain directory with
//! `fsync` per file (what a careful application pays for the durability every ckptfs close
//! gives), and a ckptfs mount (formatted with `--slots` slots when given, one daemon on slot
//! 0: the multi-slot close also publishes). Each of `--writers` threads writes `--files`
//! files of its own, one after the other: create, one write, (fsync,) close; then the same
//! names again, truncated (`open(O_TRUNC)`: the save-over-the-same-name pattern, which on a
//! multi-slot space also records a truncate). Timed from one barrier to the last close.
//!
//! Beside the times, the daemon's own counts for the ckptfs side (`ckptfs stats --json`,
//! `commits`): durable metadata transactions and manifest publications per close. One close
//! is meant to cost one durable transaction (shared by the closes that arrive together) and,
//! on a multi-slot space, one publication.

use crate::ckptfs::Ckptfs;
use crate::data::RandomSpec;
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir, median, size_label};
use crate::Opts;
use clap::Args;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

const GIB: u64 = 1 << 30;

#[derive(Args, Clone, Debug)]
pub struct ClosesOpts {
    #[command(flatten)]
    pub o: Opts,
    /// File sizes, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "4K", value_parser = crate::parse_size)]
    pub sizes: Vec<u64>,
    /// Writer thread counts, comma-separated
    #[arg(long = "threads", value_delimiter = ',', default_values_t = [1usize, 8])]
    pub threads: Vec<usize>,
    /// Files each writer closes per pass
    #[arg(long, default_value_t = 200)]
    pub files: usize,
    /// Slots of the ckptfs space (2 or more: a multi-slot space, one daemon on slot 0)
    #[arg(long, default_value_t = 1)]
    pub slots: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Plain,
    PlainFsync,
    Ckptfs,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Plain => "plain",
            Side::PlainFsync => "plain+fsync",
            Side::Ckptfs => "ckptfs",
        }
    }
}

/// One timed pass: each of `threads` threads writes its `files` files of `size` bytes under
/// `dir` (created or truncated), with `fsync` before each close when asked. Returns seconds.
fn pass(dir: &Path, threads: usize, files: usize, data: &[u8], fsync: bool) -> Result<f64> {
    let barrier = std::sync::Barrier::new(threads + 1);
    let t0 = std::sync::OnceLock::new();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<()> {
                    barrier.wait();
                    for f in 0..files {
                        let p = dir.join(format!("t{t:02}-{f:05}"));
                        let err =
                            |what: &str, e: std::io::Error| format!("{what} {}: {e}", p.display());
                        let mut fd = OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(&p)
                            .map_err(|e| err("create", e))?;
                        fd.write_all(data).map_err(|e| err("write", e))?;
                        if fsync {
                            fd.sync_all().map_err(|e| err("fsync", e))?;
                        }
                        crate::worker::close(fd).map_err(|e| err("close", e))?;
                    }
                    Ok(())
                })
            })
            .collect();
        barrier.wait();
        t0.set(sys::mono_ns()).expect("set once");
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a writer thread panicked".into()))
            })
            .collect()
    });
    let secs = (sys::mono_ns() - t0.get().expect("set")) as f64 / 1e9;
    for r in results {
        r?;
    }
    Ok(secs)
}

/// (durable metadata transactions, manifest publications, file commits) so far.
fn counts(st: &serde_json::Value) -> [u64; 3] {
    let c = &st["commits"];
    [
        c["durable"].as_u64().unwrap_or(0),
        c["publications"].as_u64().unwrap_or(0),
        c["files"].as_u64().unwrap_or(0),
    ]
}

/// One row of the table: medians over the repetitions, per pass (new files, overwrite).
struct Row {
    size: u64,
    threads: usize,
    pass: &'static str,
    /// Milliseconds per file, per writer (the time a writer waits for one close): plain,
    /// plain + fsync, ckptfs.
    ms: [f64; 3],
    /// Per close on the ckptfs side: durable transactions, publications.
    per_close: [f64; 2],
}

pub fn run(co: &ClosesOpts) -> Result<()> {
    let o = &co.o;
    if co.sizes.is_empty() || co.threads.is_empty() || co.files == 0 || o.reps == 0 {
        return Err("--sizes, --threads, --files and --reps must be given and positive".into());
    }
    if co.threads.contains(&0) || co.slots == 0 {
        return Err("--threads and --slots must be positive".into());
    }
    let bin = ckptfs_bin(o)?;
    sys::catch_signals();
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let most = *co.sizes.iter().max().expect("not empty")
        * *co.threads.iter().max().expect("not empty") as u64
        * co.files as u64;
    let space = o.space.unwrap_or((8 * most).max(GIB));
    sys::ensure_free(
        &dir,
        space + 2 * most + GIB,
        "a ckptfs space, the plain files, 1 GiB margin",
    )?;
    let mut mount_args = o.mount_args.clone();
    if co.slots > 1 {
        mount_args.extend(["--slot".into(), "0".into()]);
    }
    let slots = co.slots.to_string();
    let extra: Vec<&str> = match co.slots {
        1 => vec![],
        _ => vec!["--slots", &slots],
    };
    let (mut ck, plain, mnt) =
        Ckptfs::beside_plain(&bin, &dir, mount_args, space, &o.chunk_size, &extra)?;
    println!("ckptfs-bench closes");
    for (k, v) in sys::environment(&dir, &bin) {
        println!("  {k:<13} {v}");
    }
    println!(
        "  {:<13} --sizes {} --threads {} --files {} per writer --slots {} --reps {}",
        "run",
        co.sizes
            .iter()
            .map(|s| size_label(*s))
            .collect::<Vec<_>>()
            .join(","),
        co.threads
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(","),
        co.files,
        co.slots,
        o.reps
    );
    let mut rows = Vec::new();
    for &size in &co.sizes {
        let mut data = vec![0u8; size as usize];
        RandomSpec::new(o.seed ^ size).fill_par(0, &mut data);
        for &threads in &co.threads {
            // Per pass (new, overwrite) and side: seconds of every repetition.
            let mut secs = [[vec![], vec![], vec![]], [vec![], vec![], vec![]]];
            let mut per_close = [[vec![], vec![]], [vec![], vec![]]];
            let n = (threads * co.files) as f64;
            for rep in 0..o.reps {
                let order = [Side::Plain, Side::PlainFsync, Side::Ckptfs];
                for k in 0..3 {
                    let side = order[(rep + k) % 3];
                    sys::check_interrupted()?;
                    sys::sync_all();
                    let target = match side {
                        Side::Ckptfs => mnt.join(format!("c{size}-{threads}-{rep}")),
                        _ => plain.clone(),
                    };
                    fresh_dir(&target)?;
                    let fsync = side == Side::PlainFsync;
                    for p in 0..2 {
                        let c0 = match side {
                            Side::Ckptfs => Some(counts(&ck.stats()?)),
                            _ => None,
                        };
                        let s = pass(&target, threads, co.files, &data, fsync)?;
                        secs[p][side as usize].push(s);
                        if let Some(c0) = c0 {
                            let c1 = counts(&ck.stats()?);
                            per_close[p][0].push((c1[0] - c0[0]) as f64 / n);
                            per_close[p][1].push((c1[1] - c0[1]) as f64 / n);
                        }
                        if o.verbose {
                            eprintln!(
                                "  {} x{threads} {} rep {}/{} {:<11} {:.3} ms per file",
                                size_label(size),
                                ["new", "overwrite"][p],
                                rep + 1,
                                o.reps,
                                side.label(),
                                s * 1e3 / co.files as f64
                            );
                        }
                    }
                    match side {
                        Side::Ckptfs => {
                            fs::remove_dir_all(&target)
                                .map_err(|e| format!("remove {}: {e}", target.display()))?;
                            ck.gc()?;
                        }
                        _ => fresh_dir(&plain)?,
                    }
                }
            }
            for (p, name) in ["new", "overwrite"].into_iter().enumerate() {
                let mut ms = [0.0; 3];
                for (i, v) in secs[p].iter_mut().enumerate() {
                    ms[i] = median(v) * 1e3 / co.files as f64;
                }
                rows.push(Row {
                    size,
                    threads,
                    pass: name,
                    ms,
                    per_close: [median(&mut per_close[p][0]), median(&mut per_close[p][1])],
                });
            }
        }
    }
    ck.umount()?;
    if !o.keep {
        for d in [dir.join("backing"), plain] {
            fs::remove_dir_all(&d).map_err(|e| format!("remove {}: {e}", d.display()))?;
        }
    }
    println!(
        "\ncloses: each writer creates (then truncates) its files one after the other, one \
         write each; medians of {} reps; ms per file is a writer's time per close",
        o.reps
    );
    println!(
        "| size | writers | pass | plain ms/file | plain+fsync ms/file | ckptfs ms/file | \
         ckptfs / plain+fsync | files/s all writers (ckptfs) | durable commits per close | \
         publications per close |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.0} | {:.2} | {:.2} |",
            size_label(r.size),
            r.threads,
            r.pass,
            r.ms[0],
            r.ms[1],
            r.ms[2],
            r.ms[2] / r.ms[1],
            r.threads as f64 * 1e3 / r.ms[2],
            r.per_close[0],
            r.per_close[1]
        );
    }
    Ok(())
}
