//! `ckptfs-bench tree`: metadata-heavy work beside a plain directory on the same disk: the
//! untar of a tree of many small files (a Python environment or a source tree beside a
//! checkpoint: 5,000 files, about 90 MiB, by default), then `ls -l` and a `stat` of every
//! file of one directory of 20,000.
//!
//! The tree is generated (sizes log-normal around 8 KiB, at most 2 MiB, in directories of
//! 25 files; half of each file random bytes, half zeros, as source text compresses) and
//! packed once with the system `tar`; each repetition unpacks it with `tar xf` into a fresh
//! directory on each side, in rotating order, then unpacks an archive of 20,000 empty files
//! (untimed) and times `ls -l` of that directory and a `stat` (`symlink_metadata`) of each of
//! its entries. The plain side does not `fsync` (tar never does); every ckptfs close is
//! durable when it returns unless the mount says `--durability fsync`
//! (`--mount-arg=--durability=fsync`). Reported: the median seconds per side and ckptfs over
//! plain.

use crate::ckptfs::Ckptfs;
use crate::data::RandomSpec;
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir, median};
use crate::Opts;
use clap::Args;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

const GIB: u64 = 1 << 30;

#[derive(Args, Clone, Debug)]
pub struct TreeOpts {
    #[command(flatten)]
    pub o: Opts,
    /// Files of the unpacked tree
    #[arg(long, default_value_t = 5000)]
    pub files: usize,
    /// Files of the directory listed and stat'ed
    #[arg(long, default_value_t = 20000)]
    pub listed: usize,
    /// Slots of the ckptfs space (2 or more: a multi-slot space, one daemon on slot 0)
    #[arg(long, default_value_t = 1)]
    pub slots: u32,
}

/// The sizes of the tree's files: log-normal (sigma 1.3) around 8 KiB, at most 2 MiB, from
/// `seed` (a xorshift and Box-Muller: the same tree on every machine).
fn sizes(files: usize, seed: u64) -> Vec<usize> {
    let mut x = seed | 1;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..files)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            let n = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
            ((8192.0 * (1.3 * n).exp()) as usize).min(2 << 20)
        })
        .collect()
}

/// Writes the tree under `src/tree` and `n` empty files under `src/flat`, and packs each
/// into an archive beside `src`; returns the archives and the tree's bytes.
fn make_archives(
    dir: &Path,
    files: usize,
    listed: usize,
    seed: u64,
) -> Result<(String, String, u64)> {
    let src = dir.join("src");
    fresh_dir(&src)?;
    let rng = RandomSpec::new(seed);
    let mut bytes = 0u64;
    for (i, size) in sizes(files, seed).into_iter().enumerate() {
        let d = src.join(format!("tree/pkg{:03}/mod{:02}", i / 500, (i / 25) % 20));
        fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
        let mut data = vec![0u8; size];
        rng.fill_par(bytes, &mut data[..size / 2]);
        bytes += size as u64;
        let p = d.join(format!("f{i:05}.py"));
        fs::write(&p, &data).map_err(|e| format!("write {}: {e}", p.display()))?;
    }
    let flat = src.join("flat");
    fs::create_dir_all(&flat).map_err(|e| format!("create {}: {e}", flat.display()))?;
    for i in 0..listed {
        let p = flat.join(format!("entry-{i:06}"));
        fs::write(&p, b"").map_err(|e| format!("write {}: {e}", p.display()))?;
    }
    let tree_tar = dir.join("tree.tar").display().to_string();
    let flat_tar = dir.join("flat.tar").display().to_string();
    for (tar, what) in [(&tree_tar, "tree"), (&flat_tar, "flat")] {
        run_cmd(
            Command::new("tar")
                .args(["cf", tar, "-C"])
                .arg(&src)
                .arg(what),
            "tar cf",
        )?;
    }
    fs::remove_dir_all(&src).map_err(|e| format!("remove {}: {e}", src.display()))?;
    Ok((tree_tar, flat_tar, bytes))
}

fn run_cmd(c: &mut Command, what: &str) -> Result<()> {
    let st = c
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{what}: {e} (is it installed?)"))?;
    match st.success() {
        true => Ok(()),
        false => Err(format!("{what} failed: {st}")),
    }
}

/// Seconds `f` takes.
fn timed(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t0 = sys::mono_ns();
    f()?;
    Ok((sys::mono_ns() - t0) as f64 / 1e9)
}

/// One side's repetition under `root`: (untar, ls -l, stat) seconds.
fn rep(root: &Path, tree_tar: &str, flat_tar: &str) -> Result<[f64; 3]> {
    fresh_dir(root)?;
    let untar = timed(|| {
        run_cmd(
            Command::new("tar").args(["xf", tree_tar, "-C"]).arg(root),
            "tar xf",
        )
    })?;
    run_cmd(
        Command::new("tar").args(["xf", flat_tar, "-C"]).arg(root),
        "tar xf",
    )?;
    let flat = root.join("flat");
    let ls = timed(|| run_cmd(Command::new("ls").arg("-l").arg(&flat), "ls -l"))?;
    let stat = timed(|| {
        let entries = fs::read_dir(&flat).map_err(|e| format!("list {}: {e}", flat.display()))?;
        for e in entries {
            let e = e.map_err(|e| format!("list {}: {e}", flat.display()))?;
            fs::symlink_metadata(e.path()).map_err(|x| format!("stat {:?}: {x}", e.path()))?;
        }
        Ok(())
    })?;
    Ok([untar, ls, stat])
}

pub fn run(to: &TreeOpts) -> Result<()> {
    let o = &to.o;
    if to.files == 0 || to.listed == 0 || o.reps == 0 {
        return Err("--files, --listed and --reps must be positive".into());
    }
    let bin = ckptfs_bin(o)?;
    sys::catch_signals();
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let (tree_tar, flat_tar, bytes) = make_archives(&dir, to.files, to.listed, o.seed)?;
    let space = o.space.unwrap_or((8 * bytes).max(GIB));
    sys::ensure_free(
        &dir,
        space + 4 * bytes + GIB,
        "a ckptfs space, the plain files, the archives, 1 GiB margin",
    )?;
    let slots = to.slots.to_string();
    let format_args: Vec<&str> = match to.slots {
        0 | 1 => vec![],
        _ => vec!["--slots", &slots],
    };
    let (mut ck, plain, mnt) = Ckptfs::beside_plain(
        &bin,
        &dir,
        o.mount_args.clone(),
        space,
        &o.chunk_size,
        &format_args,
    )?;
    println!("ckptfs-bench tree");
    for (k, v) in sys::environment(&dir, &bin) {
        println!("  {k:<13} {v}");
    }
    println!(
        "  {:<13} --files {} ({:.1} MiB) --listed {} --slots {} --reps {}{}",
        "run",
        to.files,
        bytes as f64 / (1 << 20) as f64,
        to.listed,
        to.slots.max(1),
        o.reps,
        match o.mount_args.is_empty() {
            true => String::new(),
            false => format!(" (mount {})", o.mount_args.join(" ")),
        }
    );
    // [side][untar, ls, stat] seconds per rep.
    let mut secs: [[Vec<f64>; 3]; 2] = Default::default();
    for r in 0..o.reps {
        for k in 0..2 {
            let side = (r + k) % 2;
            sys::check_interrupted()?;
            sys::sync_all();
            let root = match side {
                0 => plain.join(format!("r{r}")),
                _ => mnt.join(format!("r{r}")),
            };
            let t = rep(&root, &tree_tar, &flat_tar)?;
            if o.verbose {
                eprintln!(
                    "  rep {}/{} {:<6} untar {:.2} s, ls -l {:.3} s, stat {:.3} s",
                    r + 1,
                    o.reps,
                    ["plain", "ckptfs"][side],
                    t[0],
                    t[1],
                    t[2]
                );
            }
            for (i, v) in t.into_iter().enumerate() {
                secs[side][i].push(v);
            }
            fs::remove_dir_all(&root).map_err(|e| format!("remove {}: {e}", root.display()))?;
            if side == 1 {
                ck.gc()?;
            }
        }
    }
    ck.umount()?;
    if !o.keep {
        for d in [dir.join("backing"), plain] {
            fs::remove_dir_all(&d).map_err(|e| format!("remove {}: {e}", d.display()))?;
        }
    }
    for t in [&tree_tar, &flat_tar] {
        let _ = fs::remove_file(t);
    }
    println!(
        "\ntree: `tar xf` of {} files, then `ls -l` and a stat of each of {} files in one \
         directory; median seconds over {} reps (plain: no fsync)",
        to.files, to.listed, o.reps
    );
    println!("| work | plain s | ckptfs s | ckptfs / plain |");
    println!("|---|---|---|---|");
    for (i, what) in ["untar", "ls -l", "stat"].iter().enumerate() {
        let p = median(&mut secs[0][i]);
        let c = median(&mut secs[1][i]);
        println!("| {what} | {p:.3} | {c:.3} | {:.2} |", c / p);
    }
    Ok(())
}
