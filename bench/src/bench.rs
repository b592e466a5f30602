//! The end-to-end benchmark: each scenario against a plain directory and against a ckptfs
//! mount whose backing space is on the same disk, alternating the two sides repetition by
//! repetition so drift on a shared machine hits both alike.
//!
//! Durability is the same on both sides: a plain writer calls fsync() before close(), a ckptfs
//! writer only close() (which commits durably by contract). Data is generated before each timed
//! part; a "first checkpoint" gets a fresh seed every repetition (really new data), a "next
//! revision" is written next to its base from the same repetition.

use crate::ckptfs::{self, Ckptfs};
use crate::data::{self, mix, name_label, RandomSpec};
use crate::limits::{self, Limits};
use crate::report::{self, Access, Limit, Results, Sample, Side, Stages};
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir, n1_ranges, size_label, BIG_READ};
use crate::worker::{self, file_of, Group, Op, Task};
use crate::Opts;
use serde_json::json;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Per 10,000 blocks changed by a "next revision" of random data: 5%.
const CHANGED_PER10000: u32 = 500;
const GIB: u64 = 1 << 30;

/// Which scenarios run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Selection {
    pub first: bool,
    pub next: bool,
    pub nn: bool,
    pub n1_seg: bool,
    pub n1_strided: bool,
    pub restart: bool,
    /// Checkpoint steps as jobs lay them out (`steps`): not part of `all`.
    pub steps: bool,
    /// Measure the limits first (`limits.rs`) and print each row as a fraction of them.
    pub limits: bool,
}

impl Selection {
    pub fn all() -> Selection {
        Selection {
            first: true,
            next: true,
            nn: true,
            n1_seg: true,
            n1_strided: true,
            restart: true,
            steps: false,
            limits: true,
        }
    }
}

/// How a job lays out its checkpoint steps (`steps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    NewDir,
    InPlace,
    TempRename,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::NewDir => "new dir per step",
            Layout::InPlace => "in place",
            Layout::TempRename => "temp + rename",
        }
    }

    /// The directory (under `top`) step `step` writes in, and the name of writer i's file.
    fn files(self, top: &str, step: usize) -> (String, fn(usize) -> String) {
        match self {
            Layout::NewDir => (format!("{top}/step-{step}"), |i| format!("rank-{i}")),
            Layout::InPlace => (top.to_string(), |i| format!("rank-{i}")),
            Layout::TempRename => (top.to_string(), |i| format!("rank-{i}.tmp")),
        }
    }
}

/// A file kept from an earlier scenario of this run for the cold reads of `restart`.
struct Kept {
    data: &'static str,
    name: String,
    len: u64,
    hash: blake3::Hash,
}

fn order(rep: usize) -> [Side; 2] {
    if rep.is_multiple_of(2) {
        [Side::Plain, Side::Ckptfs]
    } else {
        [Side::Ckptfs, Side::Plain]
    }
}

/// What the daemon looked like just before a timed part.
struct Probe {
    pid: u32,
    cpu0: f64,
    stored0: Option<u64>,
    /// Stage seconds so far (None: the daemon reports no stages).
    stages0: Option<Stages>,
    /// CPU seconds of each daemon thread so far (`sys::thread_cpu`).
    threads0: std::collections::BTreeMap<u32, (String, f64)>,
    /// The stages' estimated CPU seconds so far (`ckptfs::stage_cpu_seconds`).
    samples0: Option<Stages>,
    /// The stages' counts so far (`ckptfs::stage_counts`).
    counts0: Option<Stages>,
    /// How each daemon thread was scheduled so far (`sys::thread_sched`), and the daemon's
    /// minor page faults.
    sched0: std::collections::BTreeMap<u32, (String, f64, f64)>,
    faults0: Option<u64>,
}

struct Bench<'a> {
    o: &'a Opts,
    exe: PathBuf,
    plain: PathBuf,
    ck: Ckptfs,
    res: Results,
    root: bool,
    start: Instant,
    /// Keep the last repetition's files of `first` and `nn` for `restart`, instead of writing
    /// the same kind of files again.
    keep_for_restart: bool,
    kept: Vec<Kept>,
    kept_nn: Option<(Vec<String>, Vec<RandomSpec>)>,
}

impl Bench<'_> {
    fn dir(&self, side: Side) -> &Path {
        match side {
            Side::Plain => &self.plain,
            Side::Ckptfs => self.ck.mnt(),
        }
    }

    fn path(&self, side: Side, name: &str) -> PathBuf {
        self.dir(side).join(name)
    }

    fn size(&self) -> usize {
        self.o.size as usize
    }

    fn block(&self) -> usize {
        self.o.block as usize
    }

    /// A seed for (scenario, repetition): different data in every repetition.
    fn seed(&self, tag: &str, rep: usize) -> u64 {
        mix(mix(self.o.seed, name_label(tag)), rep as u64)
    }

    fn progress(&self, msg: &str) {
        eprintln!("[{:5.0}s] {msg}", self.start.elapsed().as_secs_f64());
    }

    fn record(
        &mut self,
        scenario: &str,
        data: &str,
        access: Access,
        side: Side,
        rep: usize,
        s: Sample,
    ) {
        let line = format!(
            "{scenario} | {data} | rep {}/{} {:<6} {}",
            rep + 1,
            self.o.reps,
            side.name(),
            s.line()
        );
        if self.o.verbose {
            println!("{line}");
        } else {
            self.progress(&line);
        }
        self.res.add(scenario, data, access, side, s);
    }

    /// Untimed preparation right before a timed part: flush other writeback, and on ckptfs note
    /// the daemon's stage times, (for writes) stored_bytes and CPU time, and reset its peak RSS.
    fn before(&mut self, side: Side, write: bool) -> Result<Option<Probe>> {
        sys::check_interrupted()?;
        sys::sync_all();
        if side == Side::Plain {
            return Ok(None);
        }
        let pid = self.ck.daemon_pid()?;
        // Reading stats makes the daemon read its metadata; a cold read must not get it warm.
        // A cold read comes right after a mount, whose stage counters start at 0.
        let (stored0, stages0, samples0, counts0) = if write || !self.ck.fresh() {
            let st = self.ck.stats()?;
            let stored = if write {
                Some(ckptfs::stored_bytes(&st)?)
            } else {
                None
            };
            (
                stored,
                ckptfs::stage_seconds(&st),
                ckptfs::stage_cpu_seconds(&st),
                ckptfs::stage_counts(&st),
            )
        } else {
            (
                None,
                Some(Stages::new()),
                Some(Stages::new()),
                Some(Stages::new()),
            )
        };
        sys::reset_peak_rss(pid);
        Ok(Some(Probe {
            pid,
            cpu0: sys::cpu_seconds(pid)?,
            stored0,
            stages0,
            threads0: sys::thread_cpu(pid),
            samples0,
            counts0,
            sched0: sys::thread_sched(pid),
            faults0: sys::minor_faults(pid),
        }))
    }

    /// Untimed, right after a timed part: the daemon's CPU time and peak RSS first, then the
    /// stats (which cost the daemon CPU of their own).
    fn after(&mut self, p: Option<Probe>, mut s: Sample) -> Result<Sample> {
        if let Some(p) = p {
            let threads1 = sys::thread_cpu(p.pid);
            let sched1 = sys::thread_sched(p.pid);
            let faults1 = sys::minor_faults(p.pid);
            let cpu = sys::cpu_seconds(p.pid)? - p.cpu0;
            if !sched1.is_empty() {
                let (runs, waits) = report::sched_delta(&p.sched0, &sched1);
                s.runs = Some(runs);
                s.waits = Some(waits);
            }
            s.faults = faults1.zip(p.faults0).map(|(a, b)| a.saturating_sub(b));
            s.cpu_s = Some(cpu);
            s.threads = Some(report::thread_delta(&p.threads0, &threads1, cpu));
            s.rss_kib = sys::peak_rss_kib(p.pid);
            let st = self.ck.stats()?;
            if let Some(s0) = p.stored0 {
                s.stored = Some(ckptfs::stored_bytes(&st)? as i64 - s0 as i64);
            }
            s.stages = match (ckptfs::stage_seconds(&st), &p.stages0) {
                (Some(a), Some(b)) => Some(report::stage_delta(&a, b)),
                _ => None,
            };
            s.stage_cpu = match (ckptfs::stage_cpu_seconds(&st), &p.samples0) {
                (Some(a), Some(b)) => Some(report::stage_delta(&a, b)),
                _ => None,
            };
            s.requests = match (ckptfs::stage_counts(&st), &p.counts0) {
                (Some(a), Some(b)) => Some(report::stage_delta(&a, b)),
                _ => None,
            };
        }
        Ok(s)
    }

    fn write_file(&self, side: Side, name: &str, data: &[u8]) -> Result<worker::Timed> {
        let path = self.path(side, name);
        worker::write_ranges(
            &path,
            data,
            &[(0, data.len() as u64)],
            self.block(),
            true,
            side == Side::Plain,
        )
        .map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// One writer, `--block` write() calls, then fsync+close (plain) or close (ckptfs).
    fn timed_write(&mut self, side: Side, name: &str, data: &[u8]) -> Result<Sample> {
        let p = self.before(side, true)?;
        let t = self.write_file(side, name, data)?;
        let s = Sample {
            bytes: t.bytes,
            secs: (t.t1 - t.t0) as f64 / 1e9,
            closes: vec![t.close_ns as f64 / 1e9],
            ..Sample::default()
        };
        self.after(p, s)
    }

    /// Starts the workers, waits until their data is ready, then times barrier to last close.
    fn timed_group(&mut self, side: Side, tasks: &[Task], write: bool) -> Result<(Sample, Group)> {
        let mut g = Group::start(&self.exe, tasks)?;
        let p = self.before(side, write)?;
        let (t_go, ts) = g.go()?;
        let end = ts.iter().map(|t| t.t1).max().unwrap_or(t_go);
        let s = Sample {
            bytes: ts.iter().map(|t| t.bytes).sum(),
            secs: (end - t_go) as f64 / 1e9,
            closes: if write {
                ts.iter().map(|t| t.close_ns as f64 / 1e9).collect()
            } else {
                Vec::new()
            },
            ..Sample::default()
        };
        Ok((self.after(p, s)?, g))
    }

    /// One writer per name, --size split over them.
    fn write_tasks(&self, side: Side, names: &[String], specs: &[RandomSpec]) -> Vec<Task> {
        self.write_tasks_of(side, names, specs, 1)
    }

    /// `write_tasks`, each writer writing `files` files one after the other (`Task::files`).
    fn write_tasks_of(
        &self,
        side: Side,
        names: &[String],
        specs: &[RandomSpec],
        files: u32,
    ) -> Vec<Task> {
        let part = (self.o.size / names.len().max(1) as u64).max(1);
        names
            .iter()
            .zip(specs)
            .map(|(n, spec)| Task {
                op: Op::Write {
                    truncate: true,
                    fsync: side == Side::Plain,
                },
                path: self.path(side, n),
                spec: *spec,
                ranges: vec![(0, part)],
                block: self.block(),
                files,
            })
            .collect()
    }

    fn remove(&self, side: Side, names: &[String]) -> Result<()> {
        for n in names {
            let p = self.path(side, n);
            fs::remove_file(&p).map_err(|e| format!("remove {}: {e}", p.display()))?;
        }
        Ok(())
    }

    /// After a repetition's files are removed: on ckptfs, gc so their space comes back (the
    /// space is configured to keep nothing of removed files).
    fn reclaim(&mut self, side: Side) -> Result<()> {
        if side == Side::Ckptfs {
            self.ck.gc()?;
        }
        Ok(())
    }

    /// The file an "in place" row rewrites with O_TRUNC, as jobs with a fixed checkpoint name
    /// do: `base_name` itself, or when that file is kept for `restart`, a copy of it written
    /// now (untimed) under another name.
    fn in_place_target(
        &self,
        side: Side,
        base_name: &str,
        base: &[u8],
        keep: bool,
    ) -> Result<String> {
        if !keep {
            return Ok(base_name.to_string());
        }
        let name = format!("{base_name}.fixed");
        self.write_file(side, &name, base)?;
        Ok(name)
    }

    /// `first` random and `next` random: the next revision is the first checkpoint of the same
    /// repetition with 5% of its 64-KiB blocks replaced, written in full under a new name; then
    /// another such revision over the first checkpoint's file (in place, O_TRUNC).
    fn random_family(&mut self, sel: Selection) -> Result<()> {
        let reps = self.o.reps;
        for rep in 0..reps {
            let seed = self.seed("random", rep);
            let spec = RandomSpec::new(seed);
            let base = spec.generate(self.size());
            let next = sel.next.then(|| {
                spec.next(mix(seed, 1), CHANGED_PER10000)
                    .generate(self.size())
            });
            // The in-place row's revision: as many blocks changed, other ones (the store still
            // holds the chunks of `next`, which the row would otherwise find there).
            let next_in_place = sel.next.then(|| {
                spec.next(mix(seed, 3), CHANGED_PER10000)
                    .generate(self.size())
            });
            let keep = self.keep_for_restart && rep + 1 == reps;
            let base_name = format!("random-{rep}.dat");
            let next_name = format!("random-{rep}.next.dat");
            for side in order(rep) {
                if sel.first {
                    let s = self.timed_write(side, &base_name, &base)?;
                    self.record("first", "random", Access::Write1, side, rep, s);
                } else {
                    self.write_file(side, &base_name, &base)?;
                }
                if let (Some(next), Some(next_in_place)) = (&next, &next_in_place) {
                    let s = self.timed_write(side, &next_name, next)?;
                    self.record("next", "random 5%", Access::Write1, side, rep, s);
                    self.remove(side, std::slice::from_ref(&next_name))?;
                    let fixed = self.in_place_target(side, &base_name, &base, keep)?;
                    let s = self.timed_write(side, &fixed, next_in_place)?;
                    self.record("next", "random 5%, in place", Access::Write1, side, rep, s);
                    if fixed != base_name {
                        self.remove(side, std::slice::from_ref(&fixed))?;
                    }
                }
                if !keep {
                    self.remove(side, std::slice::from_ref(&base_name))?;
                }
                self.reclaim(side)?;
            }
            if keep {
                self.kept.push(Kept {
                    data: "random",
                    name: base_name,
                    len: base.len() as u64,
                    hash: blake3::hash(&base),
                });
            }
        }
        Ok(())
    }

    fn field_family(&mut self) -> Result<()> {
        let reps = self.o.reps;
        for rep in 0..reps {
            let f = data::field(self.seed("field", rep), self.size());
            let keep = self.keep_for_restart && rep + 1 == reps;
            let name = format!("field-{rep}.dat");
            for side in order(rep) {
                let s = self.timed_write(side, &name, &f)?;
                self.record("first", "field", Access::Write1, side, rep, s);
                if !keep {
                    self.remove(side, std::slice::from_ref(&name))?;
                }
                self.reclaim(side)?;
            }
            if keep {
                self.kept.push(Kept {
                    data: "field",
                    name,
                    len: f.len() as u64,
                    hash: blake3::hash(&f),
                });
            }
        }
        Ok(())
    }

    /// `first` dense, `next` dense (every value nudged) and `next` finetune (a few tensors
    /// changed), both revisions of the same base under new names; then two more revisions of
    /// the same kinds (other seeds: the store holds the chunks of the first two) over the
    /// base's file, one after the other, as a job with a fixed checkpoint name writes them.
    /// Each set of revisions is generated when needed, so at most three files' data are held.
    fn dense_family(&mut self, sel: Selection) -> Result<()> {
        for rep in 0..self.o.reps {
            let seed = self.seed("dense", rep);
            let base = data::dense(seed, self.size());
            let revisions = |dense_seed: u64, finetune_seed: u64| {
                if !sel.next {
                    return Vec::new();
                }
                vec![
                    ("dense", data::dense_next(&base, mix(seed, dense_seed))),
                    (
                        "finetune",
                        data::finetune_next(&base, mix(seed, finetune_seed)),
                    ),
                ]
            };
            let base_name = format!("dense-{rep}.dat");
            let fresh = revisions(1, 2);
            let mut names = vec![base_name.clone()];
            names.extend(
                fresh
                    .iter()
                    .map(|(kind, _)| format!("{kind}-{rep}.next.dat")),
            );
            for side in order(rep) {
                if sel.first {
                    let s = self.timed_write(side, &base_name, &base)?;
                    self.record("first", "dense", Access::Write1, side, rep, s);
                } else {
                    self.write_file(side, &base_name, &base)?;
                }
                for ((kind, rev), name) in fresh.iter().zip(&names[1..]) {
                    let s = self.timed_write(side, name, rev)?;
                    self.record("next", kind, Access::Write1, side, rep, s);
                }
            }
            drop(fresh);
            let in_place = revisions(3, 4);
            for side in order(rep) {
                for (kind, rev) in &in_place {
                    let s = self.timed_write(side, &base_name, rev)?;
                    let label = format!("{kind}, in place");
                    self.record("next", &label, Access::Write1, side, rep, s);
                }
                self.remove(side, &names)?;
                self.reclaim(side)?;
            }
        }
        Ok(())
    }

    /// N-N: one file per process, then the next revision of each (5% of blocks changed) under
    /// new names, and another such revision in place over the first files.
    fn nn(&mut self) -> Result<()> {
        let reps = self.o.reps;
        let procs = self.o.procs;
        for rep in 0..reps {
            let seed = self.seed("nn", rep);
            let specs: Vec<RandomSpec> = (0..procs)
                .map(|i| RandomSpec::new(mix(seed, i as u64)))
                .collect();
            let next_specs: Vec<RandomSpec> = specs
                .iter()
                .map(|s| s.next(mix(s.seed, 1), CHANGED_PER10000))
                .collect();
            // Other blocks changed for the in-place row (the store holds `next_specs`' chunks).
            let in_place_specs: Vec<RandomSpec> = specs
                .iter()
                .map(|s| s.next(mix(s.seed, 3), CHANGED_PER10000))
                .collect();
            let names: Vec<String> = (0..procs).map(|i| format!("nn-{rep}-{i}.dat")).collect();
            let next_names: Vec<String> = (0..procs)
                .map(|i| format!("nn-{rep}-{i}.next.dat"))
                .collect();
            let keep = self.keep_for_restart && rep + 1 == reps;
            for side in order(rep) {
                let tasks = self.write_tasks(side, &names, &specs);
                let (s, g) = self.timed_group(side, &tasks, true)?;
                g.finish()?;
                self.record("nn", "random", Access::WriteNn, side, rep, s);
                let tasks = self.write_tasks(side, &next_names, &next_specs);
                let (s, g) = self.timed_group(side, &tasks, true)?;
                g.finish()?;
                self.record("nn", "random 5%", Access::WriteNn, side, rep, s);
                self.remove(side, &next_names)?;
                // Over the first files, O_TRUNC; over copies of them written now when the first
                // files are kept for `restart`.
                let fixed: Vec<String> = if keep {
                    let copies: Vec<String> = names.iter().map(|n| format!("{n}.fixed")).collect();
                    let mut g = Group::start(&self.exe, &self.write_tasks(side, &copies, &specs))?;
                    g.go()?;
                    g.finish()?;
                    copies
                } else {
                    names.clone()
                };
                let tasks = self.write_tasks(side, &fixed, &in_place_specs);
                let (s, g) = self.timed_group(side, &tasks, true)?;
                g.finish()?;
                self.record("nn", "random 5%, in place", Access::WriteNn, side, rep, s);
                // The copies, or the first files themselves when they are not kept.
                self.remove(side, &fixed)?;
                self.reclaim(side)?;
            }
            if keep {
                self.kept_nn = Some((names, specs));
            }
        }
        Ok(())
    }

    /// Checkpoint steps as jobs lay them out, for each writer count of `--writers` (at most
    /// `max(8, cores)`): W processes write --size in all (one file each), a full step of new
    /// data and then a next step with 5% of its 64-KiB blocks changed, in three layouts:
    /// a new directory per step (`step-N/rank-i`), in place (`rank-i` rewritten with
    /// O_TRUNC), and temp + rename (`rank-i.tmp` written, then renamed over `rank-i` once
    /// every writer closed; the renames are not timed).
    fn steps(&mut self) -> Result<()> {
        let cap = data::threads().max(8);
        let files = self.o.files_per_writer;
        let (writers, left): (Vec<usize>, Vec<usize>) =
            self.o.writers.iter().partition(|&&w| w >= 1 && w <= cap);
        // Said, not dropped silently: `--writers 16` on a 2-core machine used to end with
        // empty tables and nothing to say why.
        if !left.is_empty() {
            let left: Vec<String> = left.iter().map(usize::to_string).collect();
            self.progress(&format!(
                "steps: left out --writers {} (from 1 to max(8, cores) = {cap} writers run here)",
                left.join(",")
            ));
        }
        if writers.is_empty() {
            return Err(format!(
                "steps: no writer count of --writers runs here (from 1 to {cap})"
            ));
        }
        for &w in &writers {
            for layout in [Layout::NewDir, Layout::InPlace, Layout::TempRename] {
                self.progress(&format!("steps: {w} writers, {}", layout.name()));
                for rep in 0..self.o.reps {
                    let seed = self.seed(&format!("steps-{w}-{}", layout.name()), rep);
                    let full: Vec<RandomSpec> = (0..w)
                        .map(|i| match self.o.data.as_str() {
                            "field" => RandomSpec::field(mix(seed, i as u64)),
                            "tensor" => RandomSpec::tensor(mix(seed, i as u64)),
                            _ => RandomSpec::new(mix(seed, i as u64)),
                        })
                        .collect();
                    let next: Vec<RandomSpec> = full
                        .iter()
                        .map(|s| s.next(mix(s.seed, 1), CHANGED_PER10000))
                        .collect();
                    let top = format!("steps-{w}-{}-{rep}", layout.name());
                    for side in order(rep) {
                        fs::create_dir_all(self.path(side, &top))
                            .map_err(|e| format!("mkdir {top}: {e}"))?;
                        for (step, specs, label) in [(1, &full, "full"), (2, &next, "next 5%")] {
                            let (dir, name) = layout.files(&top, step);
                            fs::create_dir_all(self.path(side, &dir))
                                .map_err(|e| format!("mkdir {dir}: {e}"))?;
                            let names: Vec<String> =
                                (0..w).map(|i| format!("{dir}/{}", name(i))).collect();
                            let tasks = self.write_tasks_of(side, &names, specs, files);
                            let (s, g) = self.timed_group(side, &tasks, true)?;
                            g.finish()?;
                            if layout == Layout::TempRename {
                                for (i, n) in names.iter().enumerate() {
                                    let to = self.path(side, &format!("{dir}/rank-{i}"));
                                    let from = self.path(side, n);
                                    for (from, to) in match files {
                                        1 => vec![(from, to)],
                                        _ => (0..files as usize)
                                            .map(|k| (file_of(&from, k), file_of(&to, k)))
                                            .collect(),
                                    } {
                                        fs::rename(&from, &to).map_err(|e| {
                                            format!("rename {}: {e}", from.display())
                                        })?;
                                    }
                                }
                            }
                            let writers = match files {
                                1 => format!("{w} writers"),
                                f => format!("{w} writers x {f} files"),
                            };
                            let data =
                                format!("{writers}, {}, {} {label}", layout.name(), self.o.data);
                            self.record("steps", &data, Access::WriteNn, side, rep, s);
                        }
                        let p = self.path(side, &top);
                        fs::remove_dir_all(&p)
                            .map_err(|e| format!("remove {}: {e}", p.display()))?;
                        self.reclaim(side)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// N-1: every process writes its part of one shared, pre-created file; then the whole file
    /// is read back and checked.
    fn n1(&mut self, strided: bool) -> Result<()> {
        let scenario = if strided { "n1-strided" } else { "n1-seg" };
        let (procs, block) = (self.o.procs, self.o.block);
        // Whole blocks for every process, so both layouts write the same bytes.
        let unit = block * procs as u64;
        let len = (self.o.size / unit) * unit;
        for rep in 0..self.o.reps {
            let spec = RandomSpec::new(self.seed(scenario, rep));
            let expected = spec.hash(len);
            let name = format!("{scenario}-{rep}.dat");
            for side in order(rep) {
                let path = self.path(side, &name);
                let f = fs::File::create(&path)
                    .map_err(|e| format!("create {}: {e}", path.display()))?;
                if side == Side::Plain {
                    f.sync_all()
                        .map_err(|e| format!("fsync {}: {e}", path.display()))?;
                }
                drop(f);
                let tasks: Vec<Task> = (0..procs)
                    .map(|i| Task {
                        op: Op::Write {
                            truncate: false,
                            fsync: side == Side::Plain,
                        },
                        path: path.clone(),
                        spec,
                        ranges: n1_ranges(i, procs, len, block, strided),
                        block: block as usize,
                        files: 1,
                    })
                    .collect();
                let (mut s, g) = self.timed_group(side, &tasks, true)?;
                g.finish()?;
                let (got_len, got) = hash_file(&path)?;
                s.verified = Some(got_len == len && got == expected);
                self.record(
                    scenario,
                    "random",
                    Access::WriteN1 { strided },
                    side,
                    rep,
                    s,
                );
                self.remove(side, std::slice::from_ref(&name))?;
                self.reclaim(side)?;
            }
        }
        Ok(())
    }

    /// Before a cold read: unmount ckptfs (its caches go), drop the kernel's caches, mount again.
    fn cold(&mut self, side: Side) -> Result<()> {
        if side == Side::Ckptfs {
            self.ck.umount()?;
        }
        if self.root {
            sys::drop_caches()?;
        }
        if side == Side::Ckptfs {
            self.ck.mount()?;
        }
        Ok(())
    }

    /// The files `restart` reads when `first`/`nn` did not leave them: written now, untimed,
    /// the same way.
    fn restart_files(&mut self) -> Result<()> {
        for data in ["random", "field"] {
            if self.kept.iter().any(|k| k.data == data) {
                continue;
            }
            let seed = self.seed(&format!("restart-{data}"), 0);
            let bytes = match data {
                "random" => RandomSpec::new(seed).generate(self.size()),
                _ => data::field(seed, self.size()),
            };
            let name = format!("restart-{data}.dat");
            self.progress(&format!("restart: writing {name} (untimed)"));
            for side in [Side::Plain, Side::Ckptfs] {
                self.write_file(side, &name, &bytes)?;
            }
            self.kept.push(Kept {
                data,
                name,
                len: bytes.len() as u64,
                hash: blake3::hash(&bytes),
            });
        }
        if self.kept_nn.is_none() {
            let seed = self.seed("restart-nn", 0);
            let specs: Vec<RandomSpec> = (0..self.o.procs)
                .map(|i| RandomSpec::new(mix(seed, i as u64)))
                .collect();
            let names: Vec<String> = (0..self.o.procs)
                .map(|i| format!("restart-nn-{i}.dat"))
                .collect();
            self.progress("restart: writing the N-N files (untimed)");
            for side in [Side::Plain, Side::Ckptfs] {
                let mut g = Group::start(&self.exe, &self.write_tasks(side, &names, &specs))?;
                g.go()?;
                g.finish()?;
            }
            self.kept_nn = Some((names, specs));
        }
        Ok(())
    }

    /// Cold reads of a first checkpoint (one reader) and of N-N files (one reader each), checked
    /// against the expected blake3 after the timer stops.
    fn restart(&mut self) -> Result<()> {
        self.restart_files()?;
        let note = if self.root { "" } else { " (warm: not root)" };
        let mut buf = worker::prefaulted(self.size());
        let single = [
            ("random", self.block()),
            ("random", BIG_READ),
            ("field", self.block()),
        ];
        for (data, rblock) in single {
            let Some(k) = self.kept.iter().find(|k| k.data == data) else {
                continue;
            };
            let (name, len, hash) = (k.name.clone(), k.len, k.hash);
            let label = format!(
                "{data}, 1 reader, {} reads{note}",
                size_label(rblock as u64)
            );
            for rep in 0..self.o.reps {
                for side in order(rep) {
                    self.cold(side)?;
                    let path = self.path(side, &name);
                    let p = self.before(side, false)?;
                    let t = worker::read_into(&path, &mut buf, rblock)
                        .map_err(|e| format!("read {}: {e}", path.display()))?;
                    let s = Sample {
                        bytes: t.bytes,
                        secs: (t.t1 - t.t0) as f64 / 1e9,
                        ..Sample::default()
                    };
                    let mut s = self.after(p, s)?;
                    s.verified =
                        Some(t.bytes == len && blake3::hash(&buf[..t.bytes as usize]) == hash);
                    let access = Access::Read1 {
                        block: rblock as u64,
                    };
                    self.record("restart", &label, access, side, rep, s);
                }
            }
        }
        drop(buf);
        let (names, specs) = self.kept_nn.clone().ok_or("no N-N files")?;
        let part = (self.o.size / self.o.procs as u64).max(1);
        let label = format!(
            "random, {} readers, {} reads{note}",
            self.o.procs,
            size_label(self.o.block)
        );
        for rep in 0..self.o.reps {
            for side in order(rep) {
                self.cold(side)?;
                let tasks: Vec<Task> = names
                    .iter()
                    .zip(&specs)
                    .map(|(n, spec)| Task {
                        op: Op::Read,
                        path: self.path(side, n),
                        spec: *spec,
                        ranges: vec![(0, part)],
                        block: self.block(),
                        files: 1,
                    })
                    .collect();
                let (mut s, mut g) = self.timed_group(side, &tasks, false)?;
                s.verified = Some(g.verify()?);
                g.finish()?;
                self.record("restart", &label, Access::ReadN, side, rep, s);
            }
        }
        Ok(())
    }

    fn run(&mut self, sel: Selection) -> Result<()> {
        if sel.first || sel.next {
            self.progress("random: first checkpoint / next revision");
            self.random_family(sel)?;
        }
        if sel.first {
            self.progress("field: first checkpoint");
            self.field_family()?;
        }
        if sel.first || sel.next {
            self.progress("dense / finetune");
            self.dense_family(sel)?;
        }
        if sel.nn {
            self.progress("nn");
            self.nn()?;
        }
        if sel.n1_seg {
            self.progress("n1-seg");
            self.n1(false)?;
        }
        if sel.n1_strided {
            self.progress("n1-strided");
            self.n1(true)?;
        }
        if sel.restart {
            self.progress("restart (cold reads)");
            self.restart()?;
        }
        if sel.steps {
            self.steps()?;
        }
        Ok(())
    }
}

/// (length, blake3) of a file, read in 4 MiB pieces.
fn hash_file(path: &Path) -> Result<(u64, blake3::Hash)> {
    let err = |e: std::io::Error| format!("read back {}: {e}", path.display());
    let mut f = fs::File::open(path).map_err(err)?;
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(err)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    Ok((len, h.finalize()))
}

/// Runs the selected scenarios and prints the table. Returns false when a verification failed.
pub fn run(o: &Opts, sel: Selection) -> Result<bool> {
    let start = Instant::now();
    let bin = ckptfs_bin(o)?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    limits::check_opts(o)?;
    sys::catch_signals();
    let root = sys::is_root();
    if !root {
        eprintln!("ckptfs-bench: WARNING: not root: cannot drop the page cache, so the 'cold' reads of `restart` are WARM (marked in the table); the daemon's peak RSS may not reset between scenarios");
    }
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let (plain, backing, mnt, logs) = (
        dir.join("plain"),
        dir.join("backing"),
        dir.join("mnt"),
        dir.join("logs"),
    );
    fresh_dir(&logs)?;
    fs::create_dir_all(&mnt).map_err(|e| format!("create {}: {e}", mnt.display()))?;
    let mut ck = Ckptfs::new(
        bin.clone(),
        backing.clone(),
        mnt,
        logs,
        o.mount_args.clone(),
    );
    ck.clear_stale_mount()?;
    fresh_dir(&plain)?;
    fresh_dir(&backing)?;

    // The space holds at most about 5 x size at once (the files kept for `restart` plus a dense
    // base and two revisions); 8 x leaves room for segments not yet compacted. The plain side
    // holds up to 6 x size at once.
    let space = o.space.unwrap_or((8 * o.size).max(GIB));
    sys::ensure_free(
        &dir,
        space + 6 * o.size + GIB,
        &format!(
            "{:.1} GiB ckptfs space + {:.1} GiB plain files + 1 GiB margin",
            space as f64 / GIB as f64,
            (6 * o.size) as f64 / GIB as f64
        ),
    )?;

    let env = sys::environment(&dir, &bin);
    println!("ckptfs-bench");
    for (k, v) in &env {
        println!("  {k:<13} {v}");
    }
    println!(
        "  {:<13} --size {} --block {} --procs {} --reps {} --seed {}; ckptfs space {}, chunk size {}",
        "options",
        size_label(o.size),
        size_label(o.block),
        o.procs,
        o.reps,
        o.seed,
        size_label(space),
        o.chunk_size
    );
    println!(
        "  {:<13} {}",
        "mount args",
        if o.mount_args.is_empty() {
            "(none)".to_string()
        } else {
            o.mount_args.join(" ")
        }
    );
    println!();

    // Measured first, with nothing else running.
    let limits = if sel.limits || o.limits {
        let progress = |m: &str| eprintln!("[{:5.0}s] {m}", start.elapsed().as_secs_f64());
        Some(limits::measure(o, &exe, &dir, &progress)?)
    } else {
        None
    };
    let limit = limits.as_ref().map(|l| l as &dyn Limit);

    ck.format(space, &o.chunk_size, &[])?;
    ck.mount()?;
    ck.configure()?;
    let mut b = Bench {
        o,
        exe,
        plain: plain.clone(),
        ck,
        res: Results::default(),
        root,
        start,
        keep_for_restart: sel.restart,
        kept: Vec::new(),
        kept_nn: None,
    };
    if let Err(e) = b.run(sel) {
        // Dropping `b` unmounts the space; its files stay for a look (the next run clears them).
        drop(b);
        return Err(format!(
            "{e}\n(ckptfs is unmounted; the plain files and the space are left in {} for inspection, \
             the next run removes them)",
            dir.display()
        ));
    }
    b.ck.umount()?;
    let wall = start.elapsed().as_secs_f64();

    println!();
    if let Some(l) = &limits {
        print!("{}", l.table());
        println!();
    }
    print!("{}", b.res.table(limit));
    println!();
    print!("{}", b.res.reps_table());
    println!();
    if let Some(t) = b.res.stage_table() {
        print!("{t}");
        println!();
    }
    if let Some(t) = b.res.stage_cpu_table() {
        print!("{t}");
        println!();
    }
    if let Some(t) = b.res.thread_table() {
        print!("{t}");
        println!();
    }
    if let Some(t) = b.res.sched_table() {
        print!("{t}");
        println!();
    }
    println!(
        "MiB/s: logical bytes / (open to close returned), or for several processes (start barrier to last close). \
         plain: fsync+close, ckptfs: close (durable by contract). ratio: ckptfs/plain of medians. \
         stored/logical: growth of ckptfs stored_bytes / bytes written. daemon CPU: utime+stime over the timed part (median); CPU s/GiB: the same per GiB written or read (comparable across runs when MiB/s is not). \
         Peak RSS: max VmHWM over repetitions (reset before each). close p99 of few closes is their max. restart: after {}drop_caches and a ckptfs remount. \
         in place: a revision like the row of the same name without \", in place\" (as many blocks changed, other ones) written over \
         the previous revision's file, opened O_TRUNC as jobs with a fixed checkpoint name do, where that row writes a new file. Per rep: every repetition's MiB/s in run order, and the daemon's CPU s/GiB of each ckptfs one \
         (a difference between runs smaller than their spread is noise); the plain side's \
         modes split its sorted repetitions at a gap over 1.5x, with the ckptfs median as a fraction of each.",
        if root { "" } else { "(NOT: not root) " }
    );
    if limits.is_some() {
        println!(
            "of sink: ckptfs median / the FUSE sink's median for the same access (writers, files, read size); \
             of blake3: ckptfs median / blake3 on all cores (random data); \
             of disk: what ckptfs moved to or from the disk per second (reads: the logical MiB/s; writes: times stored/logical) \
             / the disk's direct I/O (reads: with the store's read-ahead threads)."
        );
        println!("{}", limits::legend());
    }
    println!("wall time {wall:.0} s");
    let failed = b.res.any_failed();
    if failed {
        println!("VERIFICATION FAILED: a file read back differs from what was written");
    }
    if let Some(path) = &o.json {
        let v = json!({
            "environment": env.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "options": {
                "size": o.size, "block": o.block, "procs": o.procs, "reps": o.reps,
                "seed": o.seed, "space": space, "chunk_size": o.chunk_size,
                "ckptfs": bin.to_string_lossy(), "dir": dir.to_string_lossy(), "root": root,
                "mount_args": o.mount_args,
            },
            "rows": b.res.json(limit),
            "limits": limits.as_ref().map(Limits::json),
            "wall_s": wall,
            "verification_failed": failed,
        });
        let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        fs::write(path, text + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    if !o.keep {
        fs::remove_dir_all(&plain).map_err(|e| format!("remove {}: {e}", plain.display()))?;
        fs::remove_dir_all(&backing).map_err(|e| format!("remove {}: {e}", backing.display()))?;
    }
    Ok(!failed)
}
