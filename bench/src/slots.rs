//! `ckptfs-bench slots`: several daemons sharing one multi-slot space (the stand-in for several
//! nodes of a job) next to one daemon on a single-slot space and a plain directory, all on the
//! same disk, with the same total writers and bytes.
//!
//! Per repetition, the three sides in rotating order:
//! - N-N write: --procs writer processes, one file each in a step directory; on the multi-slot
//!   side writer i writes through daemon i mod --nodes (its "node"). Barrier to last close.
//! - cold read after a restart elsewhere: every daemon is remounted and the page cache dropped;
//!   on the multi-slot side rank i's file is read through the next daemon, one that did not
//!   write it (the remote path: published manifests, blake3-verified reads). Checked.
//! - small files: --small-files files of 4 KiB created by one process (spread over the nodes
//!   round-robin), then stat'ed by name through another node: what the TTL-0 lookups and the
//!   per-lookup refresh of a multi-slot mount cost, next to one daemon whose kernel caches
//!   attributes.
//!
//! Durability is equal: the plain side fsyncs each file before close, ckptfs commits at close.

use crate::ckptfs::Ckptfs;
use crate::data::{mix, name_label, RandomSpec};
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir, size_label};
use crate::worker::{Group, Op, Task};
use crate::Opts;
use clap::Args;
use serde_json::json;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const GIB: u64 = 1 << 30;
const SMALL: usize = 4096;

#[derive(Args, Clone, Debug)]
pub struct SlotsOpts {
    #[command(flatten)]
    pub o: Opts,
    /// Daemons on the multi-slot space (each one a "node" with its own slot)
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Files of the small-file (lookup) part
    #[arg(long, default_value_t = 2000)]
    pub small_files: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Plain,
    One,
    Nodes,
}

const SIDES: [Side; 3] = [Side::Plain, Side::One, Side::Nodes];

/// The measured parts, in table order: (key, label, unit).
const PARTS: [(&str, &str, &str); 4] = [
    ("write", "N-N write", "MiB/s"),
    ("read", "N-N cold read", "MiB/s"),
    ("create", "small-file create", "files/s"),
    ("stat", "small-file stat", "files/s"),
];

struct Run<'a> {
    so: &'a SlotsOpts,
    exe: PathBuf,
    plain: PathBuf,
    one: Ckptfs,
    nodes: Vec<Ckptfs>,
    /// (side, part) -> one figure per repetition.
    figures: Vec<(Side, &'static str, Vec<f64>)>,
    ok: bool,
    start: Instant,
}

impl Run<'_> {
    fn progress(&self, msg: &str) {
        eprintln!("[{:5.0}s] {msg}", self.start.elapsed().as_secs_f64());
    }

    fn record(&mut self, side: Side, part: &'static str, v: f64) {
        self.progress(&format!("{side:?} {part}: {v:.1}"));
        match self.figures.iter_mut().find(|f| f.0 == side && f.1 == part) {
            Some(f) => f.2.push(v),
            None => self.figures.push((side, part, vec![v])),
        }
    }

    /// The directory that writer/creator `i` uses on `side`.
    fn dir_for(&self, side: Side, i: usize) -> PathBuf {
        match side {
            Side::Plain => self.plain.clone(),
            Side::One => self.one.mnt().to_path_buf(),
            Side::Nodes => self.nodes[i % self.nodes.len()].mnt().to_path_buf(),
        }
    }

    /// The directory that reads what `i` wrote: on the multi-slot side, the next node.
    fn reader_dir(&self, side: Side, i: usize) -> PathBuf {
        self.dir_for(side, if side == Side::Nodes { i + 1 } else { i })
    }

    fn mounts(&mut self, side: Side) -> Vec<&mut Ckptfs> {
        match side {
            Side::Plain => Vec::new(),
            Side::One => vec![&mut self.one],
            Side::Nodes => self.nodes.iter_mut().collect(),
        }
    }

    /// Unmount (the daemons' caches go), drop the page cache, mount again.
    fn cold(&mut self, side: Side) -> Result<()> {
        for m in self.mounts(side) {
            m.umount()?;
        }
        if sys::is_root() {
            sys::drop_caches()?;
        }
        for m in self.mounts(side) {
            m.mount()?;
        }
        Ok(())
    }

    fn rep(&mut self, rep: usize) -> Result<()> {
        let o = &self.so.o;
        let procs = o.procs;
        let part = o.size / procs as u64;
        let seed = mix(mix(o.seed, name_label("slots")), rep as u64);
        let specs: Vec<RandomSpec> = (0..procs)
            .map(|i| RandomSpec::new(mix(seed, i as u64)))
            .collect();
        let order: Vec<Side> = (0..3).map(|k| SIDES[(rep + k) % 3]).collect();
        for side in order {
            sys::check_interrupted()?;
            let step = format!("step-{rep}");
            // Every node makes the step directory, as `mkdir -p` in each rank does; on the
            // multi-slot side the directories merge.
            for i in 0..procs.min(self.width(side)) {
                let d = self.dir_for(side, i).join(&step);
                match fs::create_dir(&d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("mkdir {}: {e}", d.display())),
                }
            }
            let name = |i: usize| format!("{step}/rank-{i:04}.dat");
            let tasks: Vec<Task> = (0..procs)
                .map(|i| Task {
                    op: Op::Write {
                        truncate: true,
                        fsync: side == Side::Plain,
                    },
                    path: self.dir_for(side, i).join(name(i)),
                    spec: specs[i],
                    ranges: vec![(0, part)],
                    block: o.block as usize,
                    files: 1,
                })
                .collect();
            let secs = timed(&self.exe, &tasks, false)?.0;
            self.record(
                side,
                "write",
                (part * procs as u64) as f64 / secs / (1 << 20) as f64,
            );

            self.cold(side)?;
            let tasks: Vec<Task> = (0..procs)
                .map(|i| Task {
                    op: Op::Read,
                    path: self.reader_dir(side, i).join(name(i)),
                    spec: specs[i],
                    ranges: vec![(0, part)],
                    block: o.block as usize,
                    files: 1,
                })
                .collect();
            let (secs, ok) = timed(&self.exe, &tasks, true)?;
            if !ok {
                eprintln!("ckptfs-bench: {side:?}: a cold read returned wrong bytes");
                self.ok = false;
            }
            self.record(
                side,
                "read",
                (part * procs as u64) as f64 / secs / (1 << 20) as f64,
            );

            let n = self.so.small_files;
            let small = |i: usize| format!("{step}/small-{i:06}");
            let buf = vec![0x5au8; SMALL];
            let t = Instant::now();
            for i in 0..n {
                let p = self.dir_for(side, i).join(small(i));
                write_small(&p, &buf, side == Side::Plain)?;
            }
            self.record(side, "create", n as f64 / t.elapsed().as_secs_f64());
            let t = Instant::now();
            for i in 0..n {
                let p = self.reader_dir(side, i).join(small(i));
                let m = fs::metadata(&p).map_err(|e| format!("stat {}: {e}", p.display()))?;
                if m.len() != SMALL as u64 {
                    eprintln!("ckptfs-bench: {} has {} bytes", p.display(), m.len());
                    self.ok = false;
                }
            }
            self.record(side, "stat", n as f64 / t.elapsed().as_secs_f64());

            // Clean up through the writers' own nodes (a removal through another node would
            // only hide the file behind a whiteout, and gc of the owner's slot would keep it),
            // then gc so the space comes back.
            let mut names: Vec<(usize, String)> = (0..procs).map(|i| (i, name(i))).collect();
            names.extend((0..n).map(|i| (i, small(i))));
            for (i, nm) in names {
                let p = self.dir_for(side, i).join(nm);
                fs::remove_file(&p).map_err(|e| format!("remove {}: {e}", p.display()))?;
            }
            for i in 0..self.width(side) {
                let _ = fs::remove_dir(self.dir_for(side, i).join(&step));
            }
            for m in self.mounts(side) {
                m.gc()?;
            }
        }
        Ok(())
    }

    /// How many distinct directories a side spreads its writers over.
    fn width(&self, side: Side) -> usize {
        match side {
            Side::Nodes => self.nodes.len(),
            _ => 1,
        }
    }
}

/// Starts the workers, releases them at once, and returns barrier-to-last-close seconds and, for
/// readers, whether every byte matched.
fn timed(exe: &Path, tasks: &[Task], read: bool) -> Result<(f64, bool)> {
    let mut g = Group::start(exe, tasks)?;
    let (t_go, ts) = g.go()?;
    let end = ts.iter().map(|t| t.t1).max().unwrap_or(t_go);
    let ok = if read { g.verify()? } else { true };
    g.finish()?;
    Ok(((end - t_go) as f64 / 1e9, ok))
}

fn write_small(p: &Path, buf: &[u8], fsync: bool) -> Result<()> {
    let err = |e: std::io::Error| format!("write {}: {e}", p.display());
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(p)
        .map_err(err)?;
    f.write_all(buf).map_err(err)?;
    if fsync {
        f.sync_all().map_err(err)?;
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

pub fn run(so: &SlotsOpts) -> Result<bool> {
    let o = &so.o;
    let start = Instant::now();
    if so.nodes < 2 {
        return Err("--nodes must be at least 2".into());
    }
    if o.procs < so.nodes || o.reps == 0 || o.block == 0 {
        return Err("--procs must be at least --nodes; --reps and --block positive".into());
    }
    if o.size < o.block * o.procs as u64 {
        return Err(format!(
            "--size {} is below --block x --procs",
            size_label(o.size)
        ));
    }
    let bin = ckptfs_bin(o)?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    sys::catch_signals();
    if !sys::is_root() {
        eprintln!("ckptfs-bench: WARNING: not root: cannot drop the page cache, so the cold reads are WARM");
    }
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    // Each space holds one repetition's files at a time (gc runs between repetitions); 4 x
    // leaves room for segments not yet compacted and, on the multi-slot side, for every slot's
    // equal share and manifest area.
    let space = o.space.unwrap_or((4 * o.size).max(GIB));
    sys::ensure_free(
        &dir,
        2 * space + 2 * o.size + GIB,
        &format!(
            "two ckptfs spaces of {}, the plain files, 1 GiB margin",
            size_label(space)
        ),
    )?;
    let logs = dir.join("logs");
    fresh_dir(&logs)?;
    let plain = dir.join("plain");
    fresh_dir(&plain)?;
    let mk = |name: &str, backing: &Path, extra: &[String]| -> Result<Ckptfs> {
        let mnt = dir.join(name);
        fs::create_dir_all(&mnt).map_err(|e| format!("create {}: {e}", mnt.display()))?;
        let l = logs.join(name);
        fs::create_dir_all(&l).map_err(|e| format!("create {}: {e}", l.display()))?;
        let mut c = Ckptfs::new(
            bin.clone(),
            backing.to_path_buf(),
            mnt,
            l,
            o.mount_args.iter().chain(extra).cloned().collect(),
        );
        c.clear_stale_mount()?;
        Ok(c)
    };
    let (one_b, multi_b) = (dir.join("backing-one"), dir.join("backing-slots"));
    let mut one = mk("mnt-one", &one_b, &[])?;
    // Node i always mounts slot i, so "the next node" reads another slot after every remount.
    let mut nodes = (0..so.nodes)
        .map(|i| {
            mk(
                &format!("mnt-node{i}"),
                &multi_b,
                &["--slot".into(), i.to_string()],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    fresh_dir(&one_b)?;
    fresh_dir(&multi_b)?;
    one.format(space, &o.chunk_size, &[])?;
    let slots = so.nodes.to_string();
    nodes[0].format(space, &o.chunk_size, &["--slots", &slots])?;
    one.mount()?;
    one.configure()?;
    for n in &mut nodes {
        n.mount()?;
        n.configure()?;
    }

    println!("ckptfs-bench slots");
    for (k, v) in sys::environment(&dir, &bin) {
        println!("  {k:<13} {v}");
    }
    println!(
        "  {:<13} --size {} --block {} --procs {} --nodes {} --small-files {} --reps {}; each space {}",
        "options",
        size_label(o.size),
        size_label(o.block),
        o.procs,
        so.nodes,
        so.small_files,
        o.reps,
        size_label(space)
    );

    let mut r = Run {
        so,
        exe,
        plain,
        one,
        nodes,
        figures: Vec::new(),
        ok: true,
        start,
    };
    for rep in 0..o.reps {
        r.rep(rep)?;
    }
    for m in r.mounts(Side::One).into_iter() {
        m.umount()?;
    }
    for m in r.mounts(Side::Nodes).into_iter() {
        m.umount()?;
    }
    if !o.keep {
        // As the other scenarios: the spaces and plain files go unless --keep.
        for d in [&r.plain, &one_b, &multi_b] {
            let _ = fs::remove_dir_all(d);
        }
    }

    let k = so.nodes;
    println!();
    println!(
        "{} writers, {} in total; cold reads and stats through the writer's mount (plain, 1 \
         daemon) or the next node's (slots); medians of {} repetitions",
        o.procs,
        size_label(o.size),
        o.reps
    );
    println!(
        "{:<20} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "",
        "unit",
        "plain",
        "1 daemon",
        format!("{k} daemons"),
        "1d/plain",
        format!("{k}d/1d")
    );
    let mut rows = Vec::new();
    for (key, label, unit) in PARTS {
        let get = |side: Side| {
            r.figures
                .iter()
                .find(|f| f.0 == side && f.1 == key)
                .map_or(f64::NAN, |f| median(&f.2))
        };
        let (p, one, multi) = (get(Side::Plain), get(Side::One), get(Side::Nodes));
        println!(
            "{label:<20} {unit:>8} {p:>10.1} {one:>10.1} {multi:>10.1} {:>10.2} {:>10.2}",
            one / p,
            multi / one
        );
        rows.push(
            json!({"part": key, "unit": unit, "plain": p, "one_daemon": one,
            "daemons": multi, "one_over_plain": one / p, "daemons_over_one": multi / one}),
        );
    }
    println!(
        "verification: {}",
        if r.ok {
            "all bytes and sizes matched"
        } else {
            "FAILED"
        }
    );
    if let Some(j) = &o.json {
        let doc = json!({"scenario": "slots", "nodes": k, "procs": o.procs, "size": o.size,
            "block": o.block, "small_files": so.small_files, "reps": o.reps, "rows": rows,
            "verified": r.ok});
        fs::write(j, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("write {}: {e}", j.display()))?;
    }
    Ok(r.ok)
}
