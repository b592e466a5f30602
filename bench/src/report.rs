//! Measurements, the summary table and its JSON form.

use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Seconds per daemon stage (summed over the daemon's threads).
pub type Stages = BTreeMap<String, f64>;

/// The daemon's stages in the order of the write and read paths; names not listed go last.
const STAGE_ORDER: [&str; 15] = [
    "ingest",
    "cut",
    "predict",
    "predict_fingerprint",
    "budget_wait",
    "hash",
    "lookup",
    "compress",
    "append",
    "write",
    "sync",
    "commit",
    "read",
    "decode",
    "reply",
];
/// Stages below this many seconds are left out of the stage table.
const STAGE_MIN_S: f64 = 0.005;

/// `after - before`, per stage (a stage missing from `before` counts from 0).
/// CPU seconds per thread group between two `sys::thread_cpu` readings of a process whose
/// total grew by `total` seconds; what live threads do not account for is "exited".
pub fn thread_delta(
    before: &BTreeMap<u32, (String, f64)>,
    after: &BTreeMap<u32, (String, f64)>,
    total: f64,
) -> Stages {
    let mut out = Stages::new();
    for (tid, (name, s)) in after {
        let d = s - before.get(tid).map_or(0.0, |b| b.1);
        *out.entry(name.clone()).or_insert(0.0) += d;
    }
    let accounted: f64 = out.values().sum();
    if total - accounted > 0.005 {
        out.insert("exited".into(), total - accounted);
    }
    out
}

/// Runs and runnable-wait seconds per thread group between two `sys::thread_sched`
/// readings (threads that exited in between are left out).
pub fn sched_delta(
    before: &BTreeMap<u32, (String, f64, f64)>,
    after: &BTreeMap<u32, (String, f64, f64)>,
) -> (Stages, Stages) {
    let (mut runs, mut waits) = (Stages::new(), Stages::new());
    for (tid, (name, r, w)) in after {
        let (r0, w0) = before.get(tid).map_or((0.0, 0.0), |b| (b.1, b.2));
        *runs.entry(name.clone()).or_insert(0.0) += r - r0;
        *waits.entry(name.clone()).or_insert(0.0) += w - w0;
    }
    (runs, waits)
}

pub fn stage_delta(after: &Stages, before: &Stages) -> Stages {
    after
        .iter()
        .map(|(k, a)| (k.clone(), a - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// (name, seconds) in path order.
fn ordered(st: &Stages) -> Vec<(&str, f64)> {
    let rank = |k: &str| {
        STAGE_ORDER
            .iter()
            .position(|o| *o == k)
            .unwrap_or(STAGE_ORDER.len())
    };
    let mut v: Vec<(&str, f64)> = st.iter().map(|(k, s)| (k.as_str(), *s)).collect();
    v.sort_by(|a, b| rank(a.0).cmp(&rank(b.0)).then(a.0.cmp(b.0)));
    v
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Plain,
    Ckptfs,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Plain => "plain",
            Side::Ckptfs => "ckptfs",
        }
    }
}

/// How a row's bytes cross the FUSE boundary: which of the do-nothing sink's rows is its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// One writer, one file (created, or truncated in place).
    Write1,
    /// `--procs` writers, one file each.
    WriteNn,
    /// `--procs` writers of one shared file: contiguous parts, or round-robin stripes.
    WriteN1 { strided: bool },
    /// One reader, `block`-byte reads.
    Read1 { block: u64 },
    /// `--procs` readers, one file each.
    ReadN,
}

impl Access {
    pub fn is_read(self) -> bool {
        matches!(self, Access::Read1 { .. } | Access::ReadN)
    }

    /// How the limits table names it.
    pub fn label(self, procs: usize, block: u64) -> String {
        let b = crate::util::size_label(block);
        match self {
            Access::Write1 => format!("write, 1 writer, {b} writes"),
            Access::WriteNn => format!("write, {procs} writers (N-N), {b} writes"),
            Access::WriteN1 { strided: false } => {
                format!("write, {procs} writers of one file (N-1 seg), {b} writes")
            }
            Access::WriteN1 { strided: true } => {
                format!("write, {procs} writers of one file (N-1 strided), {b} writes")
            }
            Access::Read1 { block } => {
                format!("read, 1 reader, {} reads", crate::util::size_label(block))
            }
            Access::ReadN => format!("read, {procs} readers (N-N), {b} reads"),
        }
    }
}

/// What the table compares each ckptfs row with (`limits.rs`): the sink's MiB/s for the row's
/// access, and blake3's MiB/s on all cores.
pub trait Limit {
    fn sink_mibs(&self, access: Access) -> Option<f64>;
    fn blake3_mibs(&self) -> Option<f64>;
    /// The work directory's disk: direct reads with the store's read-ahead threads, or
    /// direct writes.
    fn disk_mibs(&self, read: bool) -> Option<f64>;
}

/// A plain side's repetitions split in two where sorted neighbours differ by more than this
/// factor: its fresh-file writes are bimodal, and a median falls between the modes.
const MODE_GAP: f64 = 1.5;

/// The repetitions' values split into modes (sorted, at most two): at the largest ratio
/// between sorted neighbours, when it is over `MODE_GAP`.
fn modes(v: &[f64]) -> Vec<Vec<f64>> {
    let mut v = v.to_vec();
    sort(&mut v);
    let cut = (1..v.len())
        .map(|i| (i, v[i] / v[i - 1].max(1e-9)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|&(_, r)| r > MODE_GAP)
        .map(|(i, _)| i);
    match cut {
        Some(i) => vec![v[..i].to_vec(), v[i..].to_vec()],
        None if v.is_empty() => Vec::new(),
        None => vec![v],
    }
}

/// One repetition of one row on one side.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Logical bytes written or read.
    pub bytes: u64,
    /// Open to last close (one file), or barrier to last close (several processes).
    pub secs: f64,
    /// Close latency of each file: fsync+close (plain), close (ckptfs).
    pub closes: Vec<f64>,
    /// ckptfs only: growth of stored_bytes over the timed part.
    pub stored: Option<i64>,
    /// ckptfs only: daemon utime+stime over the timed part.
    pub cpu_s: Option<f64>,
    /// ckptfs only: daemon VmHWM after the timed part (reset just before it).
    pub rss_kib: Option<u64>,
    /// ckptfs only: growth of the daemon's stage seconds over the timed part (None from a
    /// ckptfs that does not report stages).
    pub stages: Option<Stages>,
    /// ckptfs only: the daemon's CPU seconds over the timed part per thread group (names
    /// without digits: `ckptfs-worker`, the FUSE threads, ...), and "exited" for threads
    /// that ended during it (the process's CPU not accounted to a live thread).
    pub threads: Option<Stages>,
    /// ckptfs only: the daemon's estimated CPU seconds per stage over the timed part
    /// (`ckptfs::stage_cpu`).
    pub stage_cpu: Option<Stages>,
    /// ckptfs only: per thread group, over the timed part, the times its threads were put
    /// on a CPU and the seconds they were runnable but waited for one (`sys::thread_sched`;
    /// live threads only).
    pub runs: Option<Stages>,
    pub waits: Option<Stages>,
    /// ckptfs only: the daemon's minor page faults over the timed part.
    pub faults: Option<u64>,
    /// ckptfs only: the daemon's stage counts over the timed part (`ckptfs::stage_counts`):
    /// FUSE requests in all (`dispatch`), write requests (`ingest`), read requests (`reply`).
    pub requests: Option<Stages>,
    pub verified: Option<bool>,
}

impl Sample {
    pub fn mibs(&self) -> f64 {
        self.bytes as f64 / 1048576.0 / self.secs.max(1e-9)
    }

    /// Daemon CPU seconds per GiB moved (None without a CPU reading or bytes).
    fn cpu_per_gib(&self) -> Option<f64> {
        if self.bytes == 0 {
            return None;
        }
        Some(self.cpu_s? / (self.bytes as f64 / (1u64 << 30) as f64))
    }

    pub fn line(&self) -> String {
        let mut s = format!("{:8.1} MiB/s  {:6.2} s", self.mibs(), self.secs);
        if !self.closes.is_empty() {
            let mut c = self.closes.clone();
            sort(&mut c);
            s += &format!(
                "  close max {:.1} ms (of {})",
                1e3 * c[c.len() - 1],
                c.len()
            );
        }
        if let Some(st) = self.stored {
            s += &format!(
                "  stored/logical {:.3}",
                st as f64 / self.bytes.max(1) as f64
            );
        }
        if let Some(c) = self.cpu_s {
            s += &format!("  daemon cpu {c:.2} s");
        }
        if let Some(r) = self.rss_kib {
            s += &format!("  peak rss {} MiB", r >> 10);
        }
        if let Some(v) = self.verified {
            s += if v {
                "  verified ok"
            } else {
                "  VERIFY FAILED"
            };
        }
        s
    }
}

pub struct Row {
    pub scenario: String,
    pub data: String,
    pub access: Access,
    pub read: bool,
    pub plain: Vec<Sample>,
    pub ckptfs: Vec<Sample>,
}

fn sort(v: &mut [f64]) {
    v.sort_by(|a, b| a.total_cmp(b));
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    sort(&mut v);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Nearest-rank percentile.
fn percentile(v: &[f64], p: f64) -> Option<f64> {
    let mut v = v.to_vec();
    sort(&mut v);
    if v.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

struct SideSummary {
    med: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    close_p50: Option<f64>,
    close_p99: Option<f64>,
}

fn summarize(samples: &[Sample]) -> SideSummary {
    let mibs: Vec<f64> = samples.iter().map(Sample::mibs).collect();
    let closes: Vec<f64> = samples.iter().flat_map(|s| s.closes.clone()).collect();
    SideSummary {
        med: median(&mibs),
        min: mibs.iter().copied().reduce(f64::min),
        max: mibs.iter().copied().reduce(f64::max),
        close_p50: percentile(&closes, 50.0),
        close_p99: percentile(&closes, 99.0),
    }
}

impl Row {
    fn samples(&self, side: Side) -> &[Sample] {
        match side {
            Side::Plain => &self.plain,
            Side::Ckptfs => &self.ckptfs,
        }
    }

    fn ratio(&self) -> Option<f64> {
        Some(summarize(&self.ckptfs).med? / summarize(&self.plain).med?)
    }

    /// Stored over logical bytes, over all repetitions.
    fn stored_ratio(&self) -> Option<f64> {
        let stored: Option<i64> = self.ckptfs.iter().map(|s| s.stored).sum();
        let logical: u64 = self.ckptfs.iter().map(|s| s.bytes).sum();
        Some(stored? as f64 / logical.max(1) as f64)
    }

    fn cpu_median(&self) -> Option<f64> {
        let v: Vec<f64> = self.ckptfs.iter().filter_map(|s| s.cpu_s).collect();
        median(&v)
    }

    /// Daemon CPU seconds per GiB moved (median over repetitions): comparable across runs
    /// and machines when throughput is not, since a busy neighbour slows both sides.
    fn cpu_per_gib(&self) -> Option<f64> {
        let v: Vec<f64> = self.ckptfs.iter().filter_map(Sample::cpu_per_gib).collect();
        median(&v)
    }

    fn rss_max_kib(&self) -> Option<u64> {
        self.ckptfs.iter().filter_map(|s| s.rss_kib).max()
    }

    /// Thread-group CPU seconds summed over the ckptfs repetitions, per GiB of them.
    fn threads_per_gib(&self) -> Option<Stages> {
        self.per_gib(|s| s.threads.as_ref())
    }

    /// Estimated stage CPU seconds summed over the ckptfs repetitions, per GiB of them.
    fn stage_cpu_per_gib(&self) -> Option<Stages> {
        self.per_gib(|s| s.stage_cpu.as_ref())
    }

    /// Times each thread group was put on a CPU, per GiB (summed over repetitions).
    fn runs_per_gib(&self) -> Option<Stages> {
        self.per_gib(|s| s.runs.as_ref())
    }

    /// The daemon's FUSE requests per GiB: all of them, writes and reads (stage counts, see
    /// `Sample::requests`).
    fn requests_per_gib(&self) -> Option<Stages> {
        self.per_gib(|s| s.requests.as_ref())
    }

    /// Seconds each thread group was runnable but waited for a CPU, per GiB.
    fn waits_per_gib(&self) -> Option<Stages> {
        self.per_gib(|s| s.waits.as_ref())
    }

    /// The daemon's minor page faults per GiB (summed over repetitions).
    fn faults_per_gib(&self) -> Option<f64> {
        let (mut faults, mut bytes) = (0u64, 0u64);
        for s in &self.ckptfs {
            faults += s.faults?;
            bytes += s.bytes;
        }
        (bytes > 0).then(|| faults as f64 / (bytes as f64 / (1u64 << 30) as f64))
    }

    fn per_gib(&self, of: impl Fn(&Sample) -> Option<&Stages>) -> Option<Stages> {
        let mut sum: Option<Stages> = None;
        let mut bytes = 0u64;
        for s in self.ckptfs.iter() {
            let Some(m) = of(s) else { continue };
            bytes += s.bytes;
            let sum = sum.get_or_insert_with(Stages::new);
            for (k, v) in m {
                *sum.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        let gib = bytes as f64 / (1u64 << 30) as f64;
        sum.filter(|_| gib > 0.0)
            .map(|m| m.into_iter().map(|(k, v)| (k, v / gib)).collect())
    }

    /// Stage seconds summed over the ckptfs repetitions; None when no repetition has them.
    fn stages(&self) -> Option<Stages> {
        let mut sum: Option<Stages> = None;
        for st in self.ckptfs.iter().filter_map(|s| s.stages.as_ref()) {
            let sum = sum.get_or_insert_with(Stages::new);
            for (k, v) in st {
                *sum.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        sum
    }

    /// Timed seconds of the ckptfs side, summed over repetitions.
    fn ckptfs_wall(&self) -> f64 {
        self.ckptfs.iter().map(|s| s.secs).sum()
    }

    /// The ckptfs median as a fraction of the sink's for the same access.
    fn of_sink(&self, limits: &dyn Limit) -> Option<f64> {
        Some(summarize(&self.ckptfs).med? / limits.sink_mibs(self.access)?)
    }

    /// The ckptfs median as a fraction of blake3 on all cores (every byte written is hashed,
    /// every byte read is verified).
    fn of_blake3(&self, limits: &dyn Limit) -> Option<f64> {
        Some(summarize(&self.ckptfs).med? / limits.blake3_mibs()?)
    }

    /// The bytes ckptfs moved to or from the disk per second as a fraction of the disk's
    /// direct I/O: for a read, the logical MiB/s (compressed chunks read fewer bytes); for
    /// a write, the logical MiB/s times stored/logical (what reached the data file).
    fn of_disk(&self, limits: &dyn Limit) -> Option<f64> {
        let med = summarize(&self.ckptfs).med?;
        if self.read {
            Some(med / limits.disk_mibs(true)?)
        } else {
            Some(med * self.stored_ratio()?.max(0.0) / limits.disk_mibs(false)?)
        }
    }

    /// None when nothing was verified; Some(false) when any repetition failed.
    pub fn verified(&self) -> Option<bool> {
        let v: Vec<bool> = self
            .plain
            .iter()
            .chain(&self.ckptfs)
            .filter_map(|s| s.verified)
            .collect();
        (!v.is_empty()).then(|| v.iter().all(|&b| b))
    }
}

#[derive(Default)]
pub struct Results {
    pub rows: Vec<Row>,
}

impl Results {
    pub fn add(&mut self, scenario: &str, data: &str, access: Access, side: Side, s: Sample) {
        let i = match self
            .rows
            .iter()
            .position(|r| r.scenario == scenario && r.data == data)
        {
            Some(i) => i,
            None => {
                self.rows.push(Row {
                    scenario: scenario.into(),
                    data: data.into(),
                    access,
                    read: access.is_read(),
                    plain: Vec::new(),
                    ckptfs: Vec::new(),
                });
                self.rows.len() - 1
            }
        };
        match side {
            Side::Plain => self.rows[i].plain.push(s),
            Side::Ckptfs => self.rows[i].ckptfs.push(s),
        }
    }

    pub fn any_failed(&self) -> bool {
        self.rows.iter().any(|r| r.verified() == Some(false))
    }

    /// The summary table; with `limits`, each ckptfs median also as a fraction of the sink's
    /// MiB/s for the same access and of blake3's on all cores.
    pub fn table(&self, limits: Option<&dyn Limit>) -> String {
        let mut head = vec![
            "scenario",
            "data",
            "plain MiB/s med (min-max)",
            "ckptfs MiB/s med (min-max)",
            "ratio",
        ];
        if limits.is_some() {
            head.extend(["of sink", "of blake3", "of disk"]);
        }
        head.extend([
            "stored/logical",
            "daemon CPU s",
            "CPU s/GiB",
            "daemon peak RSS MiB",
            "close p50/p99 ms plain",
            "close p50/p99 ms ckptfs",
            "verified",
        ]);
        let opt = |v: Option<f64>, prec: usize| match v {
            Some(x) => format!("{x:.prec$}"),
            None => "-".into(),
        };
        let thr = |s: &SideSummary| match (s.med, s.min, s.max) {
            (Some(m), Some(a), Some(b)) => format!("{m:.0} ({a:.0}-{b:.0})"),
            _ => "-".into(),
        };
        let close = |s: &SideSummary, read: bool| {
            if read {
                return "-".into();
            }
            match (s.close_p50, s.close_p99) {
                (Some(a), Some(b)) => format!("{:.1}/{:.1}", 1e3 * a, 1e3 * b),
                _ => "-".into(),
            }
        };
        let mut cells: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
        for r in &self.rows {
            let p = summarize(&r.plain);
            let c = summarize(&r.ckptfs);
            let mut row = vec![
                r.scenario.clone(),
                r.data.clone(),
                thr(&p),
                thr(&c),
                opt(r.ratio(), 2),
            ];
            if let Some(l) = limits {
                row.extend([
                    opt(r.of_sink(l), 2),
                    opt(r.of_blake3(l), 2),
                    opt(r.of_disk(l), 2),
                ]);
            }
            row.extend([
                if r.read {
                    "-".into()
                } else {
                    opt(r.stored_ratio(), 3)
                },
                opt(r.cpu_median(), 2),
                opt(r.cpu_per_gib(), 2),
                r.rss_max_kib()
                    .map(|k| (k >> 10).to_string())
                    .unwrap_or("-".into()),
                close(&p, r.read),
                close(&c, r.read),
                match r.verified() {
                    None => "-".into(),
                    Some(true) => "ok".into(),
                    Some(false) => "FAIL".into(),
                },
            ]);
            cells.push(row);
        }
        render_table(&cells, 2)
    }

    /// Every repetition's MiB/s (in run order) per side, and the plain side's modes: its
    /// fresh-file writes are bimodal on some machines, where one median hides both the fast
    /// and the slow case; the ratio is given against each mode.
    pub fn reps_table(&self) -> String {
        let head = [
            "scenario",
            "data",
            "plain MiB/s per rep",
            "plain modes MiB/s (reps)",
            "ratio vs each mode",
            "ckptfs MiB/s per rep",
            "ckptfs CPU s/GiB per rep",
        ];
        let each = |v: &[Sample]| {
            let s: Vec<String> = v.iter().map(|s| format!("{:.0}", s.mibs())).collect();
            s.join(" ")
        };
        // Each repetition's daemon CPU per GiB, beside the median the summary gives: on a
        // shared host the same build's full step ran 0.96-1.40 CPU-s/GiB within one hour
        // (2026-11-29), so a difference between two runs means something only where it
        // is larger than either run's own spread.
        let cpu_each = |v: &[Sample]| {
            let s: Vec<String> = v
                .iter()
                .map(|s| s.cpu_per_gib().map_or("-".into(), |c| format!("{c:.2}")))
                .collect();
            s.join(" ")
        };
        let mut cells: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
        for r in &self.rows {
            let plain: Vec<f64> = r.plain.iter().map(Sample::mibs).collect();
            let m = modes(&plain);
            let meds: Vec<f64> = m.iter().filter_map(|g| median(g)).collect();
            let ck = summarize(&r.ckptfs).med;
            let (mode_cell, ratio_cell) = if m.len() < 2 {
                ("one".to_string(), "-".to_string())
            } else {
                let cell: Vec<String> = m
                    .iter()
                    .zip(&meds)
                    .map(|(g, med)| format!("{med:.0} ({})", g.len()))
                    .collect();
                let ratios: Vec<String> = meds
                    .iter()
                    .map(|med| match ck {
                        Some(c) => format!("{:.2}", c / med),
                        None => "-".into(),
                    })
                    .collect();
                (cell.join(", "), ratios.join(", "))
            };
            cells.push(vec![
                r.scenario.clone(),
                r.data.clone(),
                each(&r.plain),
                mode_cell,
                ratio_cell,
                each(&r.ckptfs),
                cpu_each(&r.ckptfs),
            ]);
        }
        render_table(&cells, 2)
    }

    /// Per row: scenario, data, ckptfs wall seconds and the daemon's stage seconds, both summed
    /// over repetitions. None when the daemon reported no stages (an older ckptfs).
    pub fn stage_table(&self) -> Option<String> {
        self.per_row_table(
            "daemon stage seconds (summed over threads and reps; wall = ckptfs timed seconds)",
            Row::stages,
            |r, _| format!("wall {:.2}", r.ckptfs_wall()),
            |st| {
                ordered(st)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect()
            },
            STAGE_MIN_S,
        )
    }

    /// Per row: the daemon's estimated CPU seconds per GiB by stage (sampled thread CPU, see
    /// the engine's `pipeline::Stage`), what they add up to, and the daemon's CPU per GiB:
    /// the difference is the samples' noise and CPU no stage timed (the daemon's other
    /// threads: housekeeping, gc). `predict`, `predict_fingerprint` and `predict_miss` are
    /// parts of `cut` and not added again.
    pub fn stage_cpu_table(&self) -> Option<String> {
        self.per_row_table(
            "daemon CPU seconds per GiB by stage (estimated from sampled thread CPU; in \
             stages: their sum, the predict stages counted within cut; daemon: all its \
             CPU)",
            Row::stage_cpu_per_gib,
            |r, st| {
                let inside: f64 = st
                    .iter()
                    .filter(|(k, _)| !k.starts_with("predict"))
                    .map(|(_, v)| v)
                    .sum();
                let all = r
                    .cpu_per_gib()
                    .map_or("-".to_string(), |c| format!("{c:.2}"));
                format!("daemon {all}  in stages {inside:.2}")
            },
            |st| {
                ordered(st)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect()
            },
            0.005,
        )
    }

    /// Per row: the daemon's CPU seconds per GiB by thread group (over all ckptfs
    /// repetitions), largest first. None when no row has them.
    pub fn thread_table(&self) -> Option<String> {
        self.per_row_table(
            "daemon CPU seconds per GiB by thread (utime+stime; digits dropped from names; \
             exited: threads that ended during the timed part)",
            Row::threads_per_gib,
            |_, th| format!("all {:.2}", th.values().sum::<f64>()),
            |th| {
                let mut v: Vec<(String, f64)> = th.clone().into_iter().collect();
                v.sort_by(|a, b| b.1.total_cmp(&a.1));
                v
            },
            0.005,
        )
    }

    /// Per row: how the daemon's threads were scheduled per GiB, by thread group: the times
    /// they were put on a CPU and the seconds they were runnable but waited for one; and
    /// the daemon's minor page faults per GiB. None when no row has them.
    pub fn sched_table(&self) -> Option<String> {
        self.rows_table(
            "daemon scheduling per GiB by thread (runs: times put on a CPU, thousands; wait: \
             seconds runnable but not running; live threads only), its minor page faults \
             (thousands), and its FUSE requests (writes, reads; a 1 MiB write or read each \
             is 1024 per GiB: more where the kernel split or shrank them)",
            |r| {
                let runs = r.runs_per_gib()?;
                Some((
                    runs,
                    r.waits_per_gib().unwrap_or_default(),
                    r.faults_per_gib(),
                    r.requests_per_gib(),
                ))
            },
            |_, (runs, waits, faults, requests)| {
                let mut line = faults.map_or(String::new(), |f| format!("faults {:.1}k ", f / 1e3));
                if let Some(q) = requests {
                    let n = |k: &str| q.get(k).copied().unwrap_or(0.0);
                    line += &format!(
                        "requests {:.0} (writes {:.0}, reads {:.0}) ",
                        n("dispatch"),
                        n("ingest"),
                        n("reply")
                    );
                }
                let mut groups: Vec<(&String, f64)> = runs
                    .iter()
                    .map(|(g, n)| (g, *n))
                    .filter(|(_, n)| *n >= 500.0)
                    .collect();
                groups.sort_by(|a, b| b.1.total_cmp(&a.1));
                for (g, n) in groups {
                    let wait = waits.get(g).copied().unwrap_or(0.0);
                    line += &format!(" {g} {:.1}k/{wait:.3}s", n / 1e3);
                }
                line
            },
        )
    }

    /// One line per row that has `of`: scenario, data, `head`, then the `items` of at least
    /// `min`, under `title`. None when no row has them.
    fn per_row_table(
        &self,
        title: &str,
        of: impl Fn(&Row) -> Option<Stages>,
        head: impl Fn(&Row, &Stages) -> String,
        items: impl Fn(&Stages) -> Vec<(String, f64)>,
        min: f64,
    ) -> Option<String> {
        self.rows_table(title, of, |r, st| {
            let mut line = head(r, st);
            for (k, v) in items(st) {
                if v >= min {
                    line += &format!("  {k} {v:.2}");
                }
            }
            line
        })
    }

    /// One line per row that has `of`: scenario, data, then `line` of it, under `title`.
    /// None when no row has it.
    fn rows_table<T>(
        &self,
        title: &str,
        of: impl Fn(&Row) -> Option<T>,
        line: impl Fn(&Row, &T) -> String,
    ) -> Option<String> {
        let rows: Vec<(&Row, T)> = self.rows.iter().filter_map(|r| Some((r, of(r)?))).collect();
        if rows.is_empty() {
            return None;
        }
        let w0 = rows.iter().map(|(r, _)| r.scenario.chars().count()).max();
        let w1 = rows.iter().map(|(r, _)| r.data.chars().count()).max();
        let (w0, w1) = (w0.unwrap_or(0), w1.unwrap_or(0));
        let mut out = format!("{title}\n");
        for (r, t) in rows {
            let l = format!("{:<w0$} | {:<w1$} | {}", r.scenario, r.data, line(r, &t));
            out += l.trim_end();
            out.push('\n');
        }
        Some(out)
    }

    pub fn json(&self, limits: Option<&dyn Limit>) -> Value {
        let side = |r: &Row, side: Side| {
            let samples = r.samples(side);
            let s = summarize(samples);
            json!({
                "mib_s": samples.iter().map(Sample::mibs).collect::<Vec<_>>(),
                "secs": samples.iter().map(|s| s.secs).collect::<Vec<_>>(),
                "bytes": samples.iter().map(|s| s.bytes).collect::<Vec<_>>(),
                "mib_s_median": s.med, "mib_s_min": s.min, "mib_s_max": s.max,
                "close_ms_p50": s.close_p50.map(|x| x * 1e3),
                "close_ms_p99": s.close_p99.map(|x| x * 1e3),
                "close_ms": samples.iter().map(|s| s.closes.iter().map(|c| c * 1e3).collect::<Vec<_>>()).collect::<Vec<_>>(),
                "stored_bytes": samples.iter().map(|s| s.stored).collect::<Vec<_>>(),
                "daemon_cpu_s": samples.iter().map(|s| s.cpu_s).collect::<Vec<_>>(),
                "daemon_peak_rss_kib": samples.iter().map(|s| s.rss_kib).collect::<Vec<_>>(),
                "verified": samples.iter().map(|s| s.verified).collect::<Vec<_>>(),
            })
        };
        Value::Array(
            self.rows
                .iter()
                .map(|r| {
                    json!({
                        "scenario": r.scenario,
                        "data": r.data,
                        "kind": if r.read { "read" } else { "write" },
                        "plain": side(r, Side::Plain),
                        "ckptfs": side(r, Side::Ckptfs),
                        "ratio_ckptfs_over_plain": r.ratio(),
                        "plain_modes_mib_s": modes(&r.plain.iter().map(Sample::mibs).collect::<Vec<_>>()),
                        "fraction_of_sink": limits.and_then(|l| r.of_sink(l)),
                        "fraction_of_blake3": limits.and_then(|l| r.of_blake3(l)),
                        "stored_over_logical": if r.read { None } else { r.stored_ratio() },
                        "daemon_cpu_s_median": r.cpu_median(),
                        "daemon_cpu_s_per_gib_median": r.cpu_per_gib(),
                        "daemon_peak_rss_mib": r.rss_max_kib().map(|k| k as f64 / 1024.0),
                        "ckptfs_wall_seconds": r.ckptfs_wall(),
                        "stages": r.stages(),
                        "daemon_cpu_s_per_gib_by_thread": r.threads_per_gib(),
                        "daemon_cpu_s_per_gib_by_stage": r.stage_cpu_per_gib(),
                        "daemon_runs_per_gib_by_thread": r.runs_per_gib(),
                        "daemon_runnable_wait_s_per_gib_by_thread": r.waits_per_gib(),
                        "daemon_minor_faults_per_gib": r.faults_per_gib(),
                        "daemon_requests_per_gib": r.requests_per_gib().map(|q| json!({
                            "all": q.get("dispatch"),
                            "write": q.get("ingest"),
                            "read": q.get("reply"),
                        })),
                        "verified": r.verified(),
                    })
                })
                .collect(),
        )
    }
}

/// Renders rows of cells (the first row is the header) as a text table: the first
/// `left_cols` columns left-aligned, the rest right-aligned, a rule under the header.
pub fn render_table(cells: &[Vec<String>], left_cols: usize) -> String {
    let cols = cells.first().map_or(0, |r| r.len());
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (n, row) in cells.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < left_cols {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        out += line.join(" | ").trim_end();
        out.push('\n');
        if n == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out += &rule.join("-|-");
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scheduling deltas are summed per thread group over the threads alive at the end, a
    /// thread new since the first reading counting from zero; and this process's own
    /// readings parse (the kernel here keeps schedstats).
    #[test]
    fn scheduling_is_counted_per_thread_group() {
        let t = |n: &str, runs: f64, wait: f64| (n.to_string(), runs, wait);
        let before = BTreeMap::from([(1, t("fuser", 10.0, 0.5)), (2, t("fuser", 4.0, 0.0))]);
        let after = BTreeMap::from([
            (1, t("fuser", 15.0, 0.75)),
            (2, t("fuser", 6.0, 0.25)),
            (3, t("ckptfs-store", 7.0, 0.125)),
        ]);
        let (runs, waits) = sched_delta(&before, &after);
        assert_eq!(
            runs,
            Stages::from([("fuser".into(), 7.0), ("ckptfs-store".into(), 7.0)])
        );
        assert_eq!(
            waits,
            Stages::from([("fuser".into(), 0.5), ("ckptfs-store".into(), 0.125)])
        );
        let me = std::process::id();
        assert!(crate::sys::minor_faults(me).is_some());
        let own = crate::sys::thread_sched(me);
        assert!(own.values().any(|(_, runs, _)| *runs >= 1.0), "{own:?}");
    }

    #[test]
    fn stats() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[5.0], 99.0), Some(5.0));
    }

    /// The per-rep table gives each ckptfs repetition's CPU per GiB, in run order, and
    /// "-" for one without a CPU reading; the summary's median is of the same figures.
    #[test]
    fn each_repetition_shows_its_cpu_per_gib() {
        let rep = |mib: u64, cpu: Option<f64>| Sample {
            bytes: mib << 20,
            secs: 1.0,
            cpu_s: cpu,
            ..Sample::default()
        };
        let mut res = Results::default();
        for s in [rep(1024, Some(1.1)), rep(512, Some(0.25)), rep(1024, None)] {
            res.add("steps", "field full", Access::Write1, Side::Ckptfs, s);
        }
        let table = res.reps_table();
        let row = table.lines().last().unwrap();
        assert!(row.trim_end().ends_with("1.10 0.50 -"), "{table}");
        assert_eq!(res.rows[0].cpu_per_gib(), Some(0.8));
    }

    #[test]
    fn bimodal() {
        assert_eq!(
            modes(&[1944.0, 320.0, 392.0]),
            vec![vec![320.0, 392.0], vec![1944.0]]
        );
        assert_eq!(modes(&[1000.0, 1100.0, 1200.0]).len(), 1);
        assert_eq!(modes(&[900.0]), vec![vec![900.0]]);
        assert!(modes(&[]).is_empty());
    }
}
