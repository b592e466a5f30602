//! `ckptfs-bench full`: a space under steady pressure, as jobs that rotate checkpoints keep
//! it (issue 36). The space holds three steps; each step is written by `--procs` writers
//! (random data, new every step), then the step three back is removed (`rm -rf`), for
//! `--steps` steps, with the default retention (removed files kept 7 days while there is
//! room, automatic gc below 20% free). The same rotation runs in a plain directory on the
//! same disk (each file fsynced before close: equal durability, ckptfs commits at close).
//!
//! Reported per side (medians of `--reps`, the sides alternating): MiB/s of the writes, the
//! bytes the application wrote, the bytes the side made the disk write (the daemon's
//! `write_bytes` from /proc for ckptfs; this process's for the plain side, less what was
//! cancelled before writeback), their ratio (write amplification), and for ckptfs what gc
//! copied and whether any write failed. Then the space is left idle for `--idle-secs` and
//! what the daemon wrote meanwhile is reported per minute: compaction must not churn a full
//! space of live data (the issue saw 6.5 GiB in 20 s on 1 GiB).

use crate::ckptfs::Ckptfs;
use crate::data::RandomSpec;
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir};
use crate::Opts;
use clap::Args;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

const MIB: f64 = (1u64 << 20) as f64;

#[derive(Args, Clone, Debug)]
pub struct FullOpts {
    #[command(flatten)]
    pub o: Opts,
    /// Steps written per repetition (three are kept at a time)
    #[arg(long, default_value_t = 12)]
    pub steps: usize,
    /// Seconds the full space is left idle after the last repetition, to measure what the
    /// daemon writes with nothing to do
    #[arg(long, default_value_t = 60)]
    pub idle_secs: u64,
}

/// `write_bytes - cancelled_write_bytes` of /proc/PID/io (`self` for this process): bytes
/// sent to the storage layer on its behalf.
fn disk_writes(pid: &str) -> Result<u64> {
    let io = fs::read_to_string(format!("/proc/{pid}/io"))
        .map_err(|e| format!("read /proc/{pid}/io: {e} (run as root)"))?;
    let field = |k: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    Ok(field("write_bytes:").saturating_sub(field("cancelled_write_bytes:")))
}

/// Writes step `step` (`len` bytes split over `procs` files) into `dir`; returns the
/// seconds it took, or the first error.
fn write_step(dir: &Path, data: &[u8], procs: usize, block: usize, fsync: bool) -> Result<f64> {
    fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let per = data.len() / procs;
    let t0 = sys::mono_ns();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..procs)
            .map(|r| {
                let part = &data[r * per..(r + 1) * per];
                let p = dir.join(format!("rank-{r}"));
                s.spawn(move || -> Result<()> {
                    let e = |what: &str, x: std::io::Error| format!("{what} {}: {x}", p.display());
                    let mut f = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&p)
                        .map_err(|x| e("create", x))?;
                    for piece in part.chunks(block) {
                        f.write_all(piece).map_err(|x| e("write", x))?;
                    }
                    if fsync {
                        f.sync_all().map_err(|x| e("fsync", x))?;
                    }
                    crate::worker::close(f).map_err(|x| e("close", x))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a writer panicked".into())))
            .collect()
    });
    let secs = (sys::mono_ns() - t0) as f64 / 1e9;
    for r in results {
        r?;
    }
    Ok(secs)
}

struct Sample {
    mibs: f64,
    app: u64,
    disk: u64,
    /// ckptfs: gc bytes copied, and the first failed write (ENOSPC) if any.
    copied: u64,
    failed: Option<String>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n % 2 {
        1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn run(fo: &FullOpts) -> Result<bool> {
    let o = &fo.o;
    if fo.steps < 4 || o.procs == 0 || o.reps == 0 {
        return Err("--steps must be at least 4, --procs and --reps positive".into());
    }
    if !sys::is_root() {
        return Err("full needs root: it reads the daemon's /proc/PID/io".into());
    }
    let bin = ckptfs_bin(o)?;
    sys::catch_signals();
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    // The space of the issue: three steps fill 84% of it.
    let space = o.space.unwrap_or(1 << 30);
    let step_bytes = (space as f64 * 0.28) as usize / o.procs / 4096 * 4096 * o.procs;
    sys::ensure_free(
        &dir,
        space + 4 * step_bytes as u64,
        "the space and 3 plain steps",
    )?;
    let logs = dir.join("logs");
    fresh_dir(&logs)?;
    let (plain, mnt, backing) = (dir.join("plain"), dir.join("mnt"), dir.join("backing"));
    fs::create_dir_all(&mnt).map_err(|e| format!("create {}: {e}", mnt.display()))?;
    let mut ck = Ckptfs::new(
        bin.clone(),
        backing.clone(),
        mnt.clone(),
        logs,
        o.mount_args.clone(),
    );
    ck.clear_stale_mount()?;
    eprintln!(
        "full: {} space, steps of {:.0} MiB by {} writers, {} steps, 3 kept; ckptfs {}",
        crate::util::size_label(space),
        step_bytes as f64 / MIB,
        o.procs,
        fo.steps,
        bin.display()
    );
    let mut data = vec![0u8; step_bytes];
    let mut samples: Vec<(bool, Sample)> = Vec::new();
    for rep in 0..o.reps {
        let order = if rep % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for on_ckptfs in order {
            sys::check_interrupted()?;
            let root = if on_ckptfs {
                fresh_dir(&backing)?;
                ck.format(space, &o.chunk_size, &[])?;
                ck.mount()?;
                mnt.clone()
            } else {
                fresh_dir(&plain)?;
                plain.clone()
            };
            sys::sync_all();
            let pid = match on_ckptfs {
                true => ck.daemon_pid()?.to_string(),
                false => "self".to_string(),
            };
            let disk0 = disk_writes(&pid)?;
            let (mut secs, mut app, mut failed) = (0.0, 0u64, None);
            for step in 0..fo.steps {
                if step >= 3 {
                    let old = root.join(format!("step-{}", step - 3));
                    fs::remove_dir_all(&old)
                        .map_err(|e| format!("rm -rf {}: {e}", old.display()))?;
                }
                let key = (rep * fo.steps + step) as u64 * step_bytes as u64;
                RandomSpec::new(o.seed).fill_par(key, &mut data);
                let d = root.join(format!("step-{step}"));
                match write_step(&d, &data, o.procs, o.block as usize, !on_ckptfs) {
                    Ok(s) => secs += s,
                    Err(e) => {
                        failed = Some(format!("step {step}: {e}"));
                        break;
                    }
                }
                app += step_bytes as u64;
            }
            sys::sync_all();
            let disk = disk_writes(&pid)? - disk0;
            let copied = match on_ckptfs {
                true => ck.stats()?["gc"]["bytes_copied"].as_u64().unwrap_or(0),
                false => 0,
            };
            let s = Sample {
                mibs: app as f64 / MIB / secs.max(1e-9),
                app,
                disk,
                copied,
                failed,
            };
            eprintln!(
                "  rep {}/{} {:<6} {:7.1} MiB/s, app wrote {:.0} MiB, disk writes {:.0} MiB \
                 ({:.2}x), gc copied {:.0} MiB{}",
                rep + 1,
                o.reps,
                if on_ckptfs { "ckptfs" } else { "plain" },
                s.mibs,
                s.app as f64 / MIB,
                s.disk as f64 / MIB,
                s.disk as f64 / s.app.max(1) as f64,
                s.copied as f64 / MIB,
                s.failed
                    .as_ref()
                    .map_or(String::new(), |f| format!("; FAILED {f}"))
            );
            let last = rep + 1 == o.reps && on_ckptfs == order[1];
            if on_ckptfs && !last {
                ck.umount()?;
            }
            samples.push((on_ckptfs, s));
        }
    }
    // The last ckptfs repetition may have run first in its pair: mount the space it left.
    if !crate::ckptfs::is_mountpoint(&mnt) {
        ck.mount()?;
    }
    let pid = ck.daemon_pid()?.to_string();
    let st = ck.stats()?;
    eprintln!(
        "  idle: {} s on the full space ({:.0} MiB free of {:.0})",
        fo.idle_secs,
        st["free_bytes"].as_u64().unwrap_or(0) as f64 / MIB,
        space as f64 / MIB
    );
    let idle0 = disk_writes(&pid)?;
    let copied0 = st["gc"]["bytes_copied"].as_u64().unwrap_or(0);
    std::thread::sleep(std::time::Duration::from_secs(fo.idle_secs));
    sys::sync_all();
    let idle_disk = disk_writes(&pid)? - idle0;
    let idle_copied = ck.stats()?["gc"]["bytes_copied"].as_u64().unwrap_or(0) - copied0;
    ck.umount()?;
    if !o.keep {
        for d in [&backing, &plain] {
            fs::remove_dir_all(d).map_err(|e| format!("remove {}: {e}", d.display()))?;
        }
    }
    let side = |c: bool| samples.iter().filter(move |(x, _)| *x == c).map(|(_, s)| s);
    let row = |c: bool| -> (f64, f64, f64, f64, usize) {
        let mut mibs: Vec<f64> = side(c).map(|s| s.mibs).collect();
        let mut app: Vec<f64> = side(c).map(|s| s.app as f64).collect();
        let mut wa: Vec<f64> = side(c)
            .map(|s| s.disk as f64 / s.app.max(1) as f64)
            .collect();
        let mut copied: Vec<f64> = side(c).map(|s| s.copied as f64).collect();
        let failed = side(c).filter(|s| s.failed.is_some()).count();
        (
            median(&mut mibs),
            median(&mut app),
            median(&mut wa),
            median(&mut copied),
            failed,
        )
    };
    let (p, c) = (row(false), row(true));
    println!(
        "\nfull: rotating {} steps of {:.0} MiB ({} writers, 3 kept) in a {} space; medians of {} reps",
        fo.steps,
        step_bytes as f64 / MIB,
        o.procs,
        crate::util::size_label(space),
        o.reps
    );
    println!("| side | MiB/s | app wrote MiB | disk writes / app bytes | gc copied MiB | reps with a failed write |");
    println!("|---|---|---|---|---|---|");
    for (name, r) in [("plain", p), ("ckptfs", c)] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2} | {:.0} | {} |",
            r.0,
            r.1 / MIB,
            r.2,
            r.3 / MIB,
            r.4
        );
    }
    println!(
        "ckptfs/plain: MiB/s {:.2}, write amplification {:.2}",
        c.0 / p.0,
        c.2 / p.2
    );
    let per_min = |b: u64| b as f64 / MIB * 60.0 / fo.idle_secs.max(1) as f64;
    println!(
        "idle {} s on the full space afterwards: the daemon wrote {:.1} MiB ({:.1} MiB/min), gc \
         copied {:.1} MiB",
        fo.idle_secs,
        idle_disk as f64 / MIB,
        per_min(idle_disk),
        idle_copied as f64 / MIB
    );
    Ok(p.4 + c.4 == 0)
}
