//! `ckptfs-bench wide`: many files written at once, each a little at a time, in turn (a job
//! that keeps one file per tensor or per rank open and appends to all of them). What it
//! shows is the daemon's memory against the number of files open for writing: every such
//! file carries an unfinished chunk between its writes, which past 64 MiB in all go to the
//! spill file (`engine::spill`), so peak RSS should level off instead of growing with the
//! files. Throughput is reported next to a plain directory on the same disk, as elsewhere.
//!
//! Per file count, per repetition, the two sides in alternating order: `--threads` threads
//! each open their share of the files (created or truncated), then, from one barrier, write
//! `--request` bytes to each of their files in turn until every file has `--per-file` bytes,
//! and close them (the plain side fsyncs each file first: equal durability, ckptfs commits at
//! close). Timed from the barrier to the last close. The files' bytes are slices of one
//! random pool of `--per-file` x the largest file count, distinct per file.

use crate::ckptfs::Ckptfs;
use crate::data::RandomSpec;
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir, median, size_label};
use crate::Opts;
use clap::Args;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

const GIB: u64 = 1 << 30;

#[derive(Args, Clone, Debug)]
pub struct WideOpts {
    #[command(flatten)]
    pub o: Opts,
    /// Numbers of files written at once, comma-separated
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 4096, 8192])]
    pub files: Vec<usize>,
    /// Bytes written to each file
    #[arg(long, default_value = "128K", value_parser = crate::parse_size)]
    pub per_file: u64,
    /// Bytes per write() call
    #[arg(long, default_value = "64K", value_parser = crate::parse_size)]
    pub request: u64,
    /// Writer threads (the files are split between them)
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Plain,
    Ckptfs,
}

struct Sample {
    mibs: f64,
    /// ckptfs only: daemon CPU seconds per GiB, peak RSS MiB, carries spilled.
    daemon: Option<(f64, u64, u64)>,
}

/// Raises the soft open-file limit to `want` (as far as the hard limit allows); returns it.
fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    r.rlim_cur
}

/// Writes `files` files under `dir` as the module doc says; returns MiB/s.
fn write_wide(wo: &WideOpts, dir: &Path, files: usize, pool: &[u8], fsync: bool) -> Result<f64> {
    let (per, req) = (wo.per_file as usize, wo.request as usize);
    let barrier = std::sync::Barrier::new(wo.threads + 1);
    let t0 = std::sync::OnceLock::new();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..wo.threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<()> {
                    let mine: Vec<usize> = (t..files).step_by(wo.threads).collect();
                    let opened: std::io::Result<Vec<File>> = mine
                        .iter()
                        .map(|f| {
                            OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(true)
                                .open(dir.join(format!("w{f:05}")))
                        })
                        .collect();
                    barrier.wait();
                    let mut fds =
                        opened.map_err(|e| format!("create in {}: {e}", dir.display()))?;
                    for at in (0..per).step_by(req) {
                        let n = req.min(per - at);
                        for (fd, &f) in fds.iter_mut().zip(&mine) {
                            let src = &pool[f * per + at..f * per + at + n];
                            fd.write_all(src)
                                .map_err(|e| format!("write w{f:05}: {e}"))?;
                        }
                    }
                    for (fd, f) in fds.into_iter().zip(mine) {
                        if fsync {
                            fd.sync_all().map_err(|e| format!("fsync w{f:05}: {e}"))?;
                        }
                        crate::worker::close(fd).map_err(|e| format!("close w{f:05}: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        barrier.wait();
        t0.set(sys::mono_ns()).expect("set once");
        handles
            .into_iter()
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
    Ok((files as u64 * wo.per_file) as f64 / (1 << 20) as f64 / secs)
}

fn carry_spills(st: &serde_json::Value) -> u64 {
    st["carries"]["spills"].as_u64().unwrap_or(0)
}

pub fn run(wo: &WideOpts) -> Result<()> {
    let o = &wo.o;
    if wo.files.is_empty() || wo.threads == 0 || wo.request == 0 || wo.per_file == 0 || o.reps == 0
    {
        return Err("--files, --threads, --request, --per-file and --reps must be positive".into());
    }
    let most = *wo.files.iter().max().expect("not empty");
    let nofile = raise_nofile(most as u64 + 256);
    if nofile < most as u64 + 256 {
        return Err(format!(
            "{most} files open at once need {} descriptors; the limit here is {nofile} (ulimit -n)",
            most + 256
        ));
    }
    let bin = ckptfs_bin(o)?;
    sys::catch_signals();
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let bytes = most as u64 * wo.per_file;
    let space = o.space.unwrap_or((4 * bytes).max(2 * GIB));
    sys::ensure_free(
        &dir,
        space + bytes + GIB,
        "a ckptfs space, the plain files, 1 GiB margin",
    )?;
    let (mut ck, plain, mnt) =
        Ckptfs::beside_plain(&bin, &dir, o.mount_args.clone(), space, &o.chunk_size, &[])?;
    eprintln!(
        "wide: {} files at once, {} each in {} writes, {} threads; ckptfs {}",
        wo.files
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("/"),
        size_label(wo.per_file),
        size_label(wo.request),
        wo.threads,
        bin.display()
    );
    let mut pool = vec![0u8; bytes as usize];
    RandomSpec::new(o.seed).fill_par(0, &mut pool);
    let mut rows = Vec::new();
    for &files in &wo.files {
        let mut samples: Vec<(Side, Sample)> = Vec::new();
        for rep in 0..o.reps {
            let sides = if rep % 2 == 0 {
                [Side::Plain, Side::Ckptfs]
            } else {
                [Side::Ckptfs, Side::Plain]
            };
            for side in sides {
                sys::check_interrupted()?;
                sys::sync_all();
                let s = match side {
                    Side::Plain => {
                        fresh_dir(&plain)?;
                        let mibs = write_wide(wo, &plain, files, &pool, true)?;
                        fresh_dir(&plain)?;
                        Sample { mibs, daemon: None }
                    }
                    Side::Ckptfs => {
                        let pid = ck.daemon_pid()?;
                        let spills0 = carry_spills(&ck.stats()?);
                        sys::reset_peak_rss(pid);
                        let cpu0 = sys::cpu_seconds(pid)?;
                        let step = mnt.join(format!("w{files}-{rep}"));
                        fs::create_dir_all(&step)
                            .map_err(|e| format!("create {}: {e}", step.display()))?;
                        let mibs = write_wide(wo, &step, files, &pool, false)?;
                        let cpu = sys::cpu_seconds(pid)? - cpu0;
                        let rss = sys::peak_rss_kib(pid).unwrap_or(0) >> 10;
                        let spills = carry_spills(&ck.stats()?) - spills0;
                        fs::remove_dir_all(&step)
                            .map_err(|e| format!("remove {}: {e}", step.display()))?;
                        ck.gc()?;
                        let gib = (files as u64 * wo.per_file) as f64 / GIB as f64;
                        Sample {
                            mibs,
                            daemon: Some((cpu / gib, rss, spills)),
                        }
                    }
                };
                eprintln!(
                    "  {files} files | rep {}/{} {:<6} {:8.1} MiB/s{}",
                    rep + 1,
                    o.reps,
                    if side == Side::Plain {
                        "plain"
                    } else {
                        "ckptfs"
                    },
                    s.mibs,
                    s.daemon.map_or(String::new(), |(c, r, sp)| format!(
                        "  daemon cpu {c:.2} s/GiB  peak rss {r} MiB  carries spilled {sp}"
                    ))
                );
                samples.push((side, s));
            }
        }
        let of = |side: Side| -> Vec<&Sample> {
            samples
                .iter()
                .filter(|(s, _)| *s == side)
                .map(|(_, s)| s)
                .collect()
        };
        let mut plain_mibs: Vec<f64> = of(Side::Plain).iter().map(|s| s.mibs).collect();
        let ck_s = of(Side::Ckptfs);
        let mut ck_mibs: Vec<f64> = ck_s.iter().map(|s| s.mibs).collect();
        let mut cpu: Vec<f64> = ck_s.iter().filter_map(|s| s.daemon.map(|d| d.0)).collect();
        let rss = ck_s.iter().filter_map(|s| s.daemon.map(|d| d.1)).max();
        let spills = ck_s.iter().filter_map(|s| s.daemon.map(|d| d.2)).max();
        let (p, c) = (median(&mut plain_mibs), median(&mut ck_mibs));
        rows.push((files, p, c, median(&mut cpu), rss, spills));
    }
    ck.umount()?;
    if !o.keep {
        for d in [dir.join("backing"), plain] {
            fs::remove_dir_all(&d).map_err(|e| format!("remove {}: {e}", d.display()))?;
        }
    }
    println!(
        "\nwide: files written at once, {} each in {} writes by {} threads; medians of {} reps, \
         peak RSS and spills the largest of them",
        size_label(wo.per_file),
        size_label(wo.request),
        wo.threads,
        o.reps
    );
    println!(
        "| files at once | plain MiB/s | ckptfs MiB/s | ratio | daemon CPU s/GiB | daemon peak RSS MiB | carries spilled |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (files, p, c, cpu, rss, spills) in rows {
        println!(
            "| {files} | {p:.0} | {c:.0} | {:.2} | {cpu:.2} | {} | {} |",
            c / p,
            rss.map_or("-".into(), |r| r.to_string()),
            spills.map_or("-".into(), |s| s.to_string())
        );
    }
    Ok(())
}
