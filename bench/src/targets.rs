//! `ckptfs-bench targets`: a space over several storage targets (erasure-coded M+K) next to
//! a one-target space and a plain directory, all on the same disk (the targets are
//! directories of it, so this measures the coding and the extra I/O, not disk
//! parallelism), with the same writers and bytes.
//!
//! Per repetition, the sides in rotating order:
//! - N-N write: --procs writer processes, one file each; barrier to last close.
//! - cold read: unmount, drop the page cache, mount, read every file (checked).
//! - on the targets side also a degraded cold read: --lose target files removed (after
//!   unmounting), the space mounted again and every file read back through reconstruction;
//!   then the targets come back by a fresh format at the next repetition.
//!
//! Also, in-process: Reed-Solomon encode and reconstruct GiB/s of this machine for M+K
//! (reed-solomon-simd, the crate the targets use), so the rows say what the coding costs.

use crate::ckptfs::Ckptfs;
use crate::data::{mix, name_label, RandomSpec};
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir, size_label};
use crate::worker::{Group, Op, Task};
use crate::Opts;
use clap::Args;
use serde_json::json;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

const GIB: u64 = 1 << 30;

#[derive(Args, Clone, Debug)]
pub struct TargetsOpts {
    #[command(flatten)]
    pub o: Opts,
    /// Targets of the erasure-coded side
    #[arg(long, default_value_t = 5)]
    pub targets: usize,
    /// Its redundancy M+K
    #[arg(long, default_value = "3+2")]
    pub redundancy: String,
    /// Target files removed for the degraded read (at most K)
    #[arg(long, default_value_t = 2)]
    pub lose: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Plain,
    One,
    Coded,
}

const SIDES: [Side; 3] = [Side::Plain, Side::One, Side::Coded];

fn timed(exe: &Path, tasks: &[Task], read: bool) -> Result<(f64, bool)> {
    let mut g = Group::start(exe, tasks)?;
    let (t_go, ts) = g.go()?;
    let end = ts.iter().map(|t| t.t1).max().unwrap_or(t_go);
    let ok = if read { g.verify()? } else { true };
    g.finish()?;
    Ok(((end - t_go) as f64 / 1e9, ok))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Shard bytes per encode call: what one 64-row batch of a segment gives each shard, as
/// the write path and rebuild hand the codec (one call over a whole 256 MiB buffer would
/// time page faults and cache misses instead of the codec).
const CODING_SHARD_BYTES: usize = 256 << 10;

/// Encode and reconstruct GiB/s (of data bytes) for M+K over `bytes` of random data, on one
/// thread, in calls of M shards of `CODING_SHARD_BYTES`, after one warm-up call.
fn coding_speed(m: usize, k: usize, bytes: usize) -> Result<(f64, f64)> {
    let shard = CODING_SHARD_BYTES;
    let calls = (bytes / (shard * m)).max(1);
    let spec = RandomSpec::new(7);
    let data = spec.generate(shard * m * calls);
    let stripes: Vec<Vec<&[u8]>> = data
        .chunks(shard * m)
        .map(|s| s.chunks(shard).collect())
        .collect();
    let encode = |st: &[&[u8]]| {
        reed_solomon_simd::encode(m, k, st.iter().copied()).map_err(|e| format!("encode: {e}"))
    };
    encode(&stripes[0])?;
    let t = Instant::now();
    let mut parities = Vec::with_capacity(calls);
    for st in &stripes {
        parities.push(encode(st)?);
    }
    let enc = (shard * m * calls) as f64 / t.elapsed().as_secs_f64() / GIB as f64;
    // Lose the first min(k, m) data shards: the worst case a degraded read meets.
    let lost = k.min(m);
    let decode = |st: &[&[u8]], parity: &[Vec<u8>]| {
        reed_solomon_simd::decode(
            m,
            k,
            (lost..m).map(|i| (i, st[i])),
            parity.iter().enumerate().map(|(j, p)| (j, p.as_slice())),
        )
        .map_err(|e| format!("decode: {e}"))
    };
    decode(&stripes[0], &parities[0])?;
    let t = Instant::now();
    let mut restored = Vec::with_capacity(calls);
    for (st, parity) in stripes.iter().zip(&parities) {
        restored.push(decode(st, parity)?);
    }
    let dec = (shard * m * calls) as f64 / t.elapsed().as_secs_f64() / GIB as f64;
    for (st, r) in stripes.iter().zip(&restored) {
        for (i, want) in st.iter().enumerate().take(lost) {
            if r.get(&i).map(|v| v.as_slice()) != Some(*want) {
                return Err(format!("reconstructed shard {i} differs"));
            }
        }
    }
    Ok((enc, dec))
}

pub fn run(to: &TargetsOpts) -> Result<bool> {
    let o = &to.o;
    let start = Instant::now();
    let (m, k) = to
        .redundancy
        .split_once('+')
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .ok_or_else(|| format!("--redundancy {:?} is not M+K", to.redundancy))?;
    if to.targets < m + k || to.lose > k {
        return Err(format!(
            "--targets must be at least M+K ({}) and --lose at most K ({k})",
            m + k
        ));
    }
    if o.reps == 0 || o.procs == 0 || o.block == 0 || o.size < o.block * o.procs as u64 {
        return Err("--reps, --procs, --block positive; --size at least --block x --procs".into());
    }
    let bin = ckptfs_bin(o)?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    sys::catch_signals();
    if !sys::is_root() {
        eprintln!(
            "ckptfs-bench: WARNING: not root: cannot drop the page cache, so the cold reads are WARM"
        );
    }
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let space = o.space.unwrap_or((3 * o.size).max(GIB));
    // The coded side's target files hold (M+K)/M of the space, plus a quarter of slack.
    let coded = space / m as u64 * (m + k) as u64 * 5 / 4;
    sys::ensure_free(
        &dir,
        space + coded + o.size + GIB,
        "one space, the coded targets, the plain files, 1 GiB margin",
    )?;
    let logs = dir.join("logs");
    fresh_dir(&logs)?;
    let plain = dir.join("plain");
    fresh_dir(&plain)?;
    let mk = |name: &str, backing: &Path| -> Result<Ckptfs> {
        let mnt = dir.join(name);
        fs::create_dir_all(&mnt).map_err(|e| format!("create {}: {e}", mnt.display()))?;
        let l = logs.join(name);
        fs::create_dir_all(&l).map_err(|e| format!("create {}: {e}", l.display()))?;
        let mut c = Ckptfs::new(
            bin.clone(),
            backing.to_path_buf(),
            mnt,
            l,
            o.mount_args.clone(),
        );
        c.clear_stale_mount()?;
        Ok(c)
    };
    let (one_b, coded_b) = (dir.join("backing-one"), dir.join("backing-targets"));
    let tdirs: Vec<PathBuf> = (0..to.targets)
        .map(|i| dir.join(format!("target{i}")))
        .collect();
    let mut one = mk("mnt-one", &one_b)?;
    let mut cod = mk("mnt-targets", &coded_b)?;
    fresh_dir(&one_b)?;
    one.format(space, &o.chunk_size, &[])?;
    one.mount()?;
    one.configure()?;
    let format_coded = |cod: &mut Ckptfs| -> Result<()> {
        fresh_dir(&coded_b)?;
        let mut extra: Vec<String> = vec!["--redundancy".into(), to.redundancy.clone()];
        for t in &tdirs {
            let _ = fs::remove_dir_all(t);
            extra.push("--target".into());
            extra.push(t.display().to_string());
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        cod.format(space, &o.chunk_size, &extra)?;
        cod.mount()?;
        cod.configure()
    };

    println!("ckptfs-bench targets");
    for (key, v) in sys::environment(&dir, &bin) {
        println!("  {key:<13} {v}");
    }
    println!(
        "  {:<13} --size {} --block {} --procs {} --targets {} --redundancy {} --lose {} --reps {}; each space {}",
        "options",
        size_label(o.size),
        size_label(o.block),
        o.procs,
        to.targets,
        to.redundancy,
        to.lose,
        o.reps,
        size_label(space)
    );

    let mut figures: Vec<(Side, &str, Vec<f64>)> = Vec::new();
    let mut record = |side: Side, part: &'static str, v: f64| {
        eprintln!(
            "[{:5.0}s] {side:?} {part}: {v:.1}",
            start.elapsed().as_secs_f64()
        );
        match figures.iter_mut().find(|f| f.0 == side && f.1 == part) {
            Some(f) => f.2.push(v),
            None => figures.push((side, part, vec![v])),
        }
    };
    let mut ok = true;
    let procs = o.procs;
    let part = o.size / procs as u64;
    let mib = |secs: f64| (part * procs as u64) as f64 / secs / (1 << 20) as f64;
    for rep in 0..o.reps {
        let seed = mix(mix(o.seed, name_label("targets")), rep as u64);
        let specs: Vec<RandomSpec> = (0..procs)
            .map(|i| RandomSpec::new(mix(seed, i as u64)))
            .collect();
        for k_side in 0..3 {
            sys::check_interrupted()?;
            let side = SIDES[(rep + k_side) % 3];
            if side == Side::Coded {
                format_coded(&mut cod)?;
            }
            let dir_of = |side: Side| -> PathBuf {
                match side {
                    Side::Plain => plain.clone(),
                    Side::One => one.mnt().to_path_buf(),
                    Side::Coded => cod.mnt().to_path_buf(),
                }
            };
            let d = dir_of(side);
            let name = |i: usize| d.join(format!("rank-{rep}-{i:04}.dat"));
            let tasks = |op: Op| -> Vec<Task> {
                (0..procs)
                    .map(|i| Task {
                        op: op.clone(),
                        path: name(i),
                        spec: specs[i],
                        ranges: vec![(0, part)],
                        block: o.block as usize,
                        files: 1,
                    })
                    .collect()
            };
            let w = tasks(Op::Write {
                truncate: true,
                fsync: side == Side::Plain,
            });
            let secs = timed(&exe, &w, false)?.0;
            record(side, "write", mib(secs));
            let remount = |c: &mut Ckptfs| -> Result<()> {
                c.umount()?;
                if sys::is_root() {
                    sys::drop_caches()?;
                }
                c.mount()
            };
            match side {
                Side::Plain => {
                    if sys::is_root() {
                        sys::drop_caches()?;
                    }
                }
                Side::One => remount(&mut one)?,
                Side::Coded => remount(&mut cod)?,
            }
            let (secs, good) = timed(&exe, &tasks(Op::Read), true)?;
            ok &= good;
            record(side, "read", mib(secs));
            if side == Side::Coded {
                cod.umount()?;
                for t in tdirs.iter().take(to.lose) {
                    fs::remove_file(t.join("ckptfs-target"))
                        .map_err(|e| format!("remove a target file: {e}"))?;
                }
                if sys::is_root() {
                    sys::drop_caches()?;
                }
                cod.mount()?;
                let (secs, good) = timed(&exe, &tasks(Op::Read), true)?;
                ok &= good;
                record(side, "degraded read", mib(secs));
                cod.umount()?;
            } else {
                for i in 0..procs {
                    let p = name(i);
                    fs::remove_file(&p).map_err(|e| format!("remove {}: {e}", p.display()))?;
                }
                if side == Side::One {
                    one.gc()?;
                }
            }
        }
    }
    one.umount()?;
    let (enc, dec) = coding_speed(m, k, 256 << 20)?;

    println!();
    println!(
        "{} writers, {} in total, {} targets {} on the same disk; medians of {} repetitions",
        procs,
        size_label(o.size),
        to.targets,
        to.redundancy,
        o.reps
    );
    println!(
        "{:<20} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "MiB/s", "plain", "1 target", "targets", "1t/plain", "tgt/1t"
    );
    let get = |side: Side, key: &str| {
        figures
            .iter()
            .find(|f| f.0 == side && f.1 == key)
            .map_or(f64::NAN, |f| median(&f.2))
    };
    let mut rows = Vec::new();
    // The degraded row compares the coded side's degraded read with the others' reads.
    for (label, key, coded_key) in [
        ("N-N write", "write", "write"),
        ("N-N cold read", "read", "read"),
        ("degraded cold read", "read", "degraded read"),
    ] {
        let (p, one_v, c) = (
            get(Side::Plain, key),
            get(Side::One, key),
            get(Side::Coded, coded_key),
        );
        println!(
            "{label:<20} {p:>10.1} {one_v:>10.1} {c:>10.1} {:>10.2} {:>10.2}",
            one_v / p,
            c / one_v
        );
        rows.push(json!({"part": label, "plain": p, "one_target": one_v, "targets": c}));
    }
    println!(
        "Reed-Solomon {m}+{k} on this machine (one thread): encode {enc:.2} GiB/s, reconstruct \
         {} lost data shards {dec:.2} GiB/s",
        k.min(m)
    );
    println!(
        "verification: {}",
        if ok { "all bytes matched" } else { "FAILED" }
    );
    if let Some(j) = &o.json {
        let doc = json!({"scenario": "targets", "targets": to.targets,
            "redundancy": to.redundancy, "lose": to.lose, "procs": procs, "size": o.size,
            "reps": o.reps, "rows": rows, "encode_gib_s": enc, "reconstruct_gib_s": dec,
            "verified": ok});
        fs::write(j, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("write {}: {e}", j.display()))?;
    }
    if !o.keep {
        for d in [&plain, &one_b, &coded_b] {
            let _ = fs::remove_dir_all(d);
        }
        for t in &tdirs {
            let _ = fs::remove_dir_all(t);
        }
    }
    Ok(ok)
}
