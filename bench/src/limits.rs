//! `ckptfs-bench limits`: the ceilings of this machine, measured in the same run as the rows
//! they bound, so a row can be read as a fraction of what is possible here and now.
//!
//! - The FUSE path: a do-nothing filesystem (`sink.rs`) written and read exactly as the ckptfs
//!   scenarios write and read (the same worker code, descriptors, block size and number of
//!   processes). No daemon can move bytes through FUSE faster than this; the sink's CPU
//!   seconds per GiB are the part of a daemon's that is only the FUSE transport.
//! - The compute: blake3 (every byte written is hashed, every byte read verified) and the
//!   engine's LZ4 codec, per chunk, on all cores, over random 64 KiB blocks and the
//!   benchmark's own field and dense data.
//! - The disk under the work directory (where the ckptfs space and the plain files live):
//!   direct I/O of a preallocated file, written in 8 MiB pieces as the store writes, read in
//!   2 MiB pieces by one thread and by as many threads as the store reads ahead with. A
//!   restart cannot read faster than this, nor a new checkpoint store its new bytes.

use crate::data::{self, mix, name_label, RandomSpec};
use crate::report::{render_table, Access, Limit, Sample};
use crate::sink::{self, SinkMount};
use crate::sys::{self, Result};
use crate::util::{n1_ranges, size_label, BIG_READ};
use crate::worker::{self, Group, Op, Task};
use crate::Opts;
use ckptfs_engine::codec::{self, Policy};
use ckptfs_engine::format::Codec;
use serde_json::{json, Value};
use std::fs;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes of each data kind the compute rows run over (less when --size is smaller).
const COMPUTE_BYTES: usize = 256 << 20;
/// Each compute measurement repeats passes over its data for at least this long.
const MIN_TIME: Duration = Duration::from_millis(200);
const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// One sink row: its repetitions (bytes, seconds, sink CPU seconds).
pub struct SinkRow {
    access: Access,
    /// A read through a handle the sink opened with direct I/O, past the page cache: not a
    /// path ckptfs takes (its readers get the page cache and readahead), shown for what that
    /// costs.
    direct: bool,
    samples: Vec<Sample>,
}

/// One data kind on all cores: GiB/s per repetition.
pub struct ComputeRow {
    kind: &'static str,
    blake3: Vec<f64>,
    lz4: Vec<f64>,
    /// Stored over logical bytes of the codec's choice per chunk (LZ4, or raw where LZ4 does
    /// not make a chunk smaller).
    stored_ratio: f64,
    /// Over the chunks stored LZ4-compressed; empty when they are under 1% of the bytes.
    decode: Vec<f64>,
    /// blake3 then the codec, per chunk: a new chunk's compute on the write path.
    both: Vec<f64>,
}

/// One disk row: MiB/s per repetition.
pub struct DiskRow {
    write: bool,
    threads: usize,
    /// Read through the page cache (after dropping it), with the kernel's readahead, as the
    /// store reads the data file; else direct I/O.
    cached: bool,
    mibs: Vec<f64>,
}

impl DiskRow {
    fn label(&self) -> String {
        if self.write {
            format!(
                "write, {} direct, preallocated file, fdatasync",
                size_label(DISK_WRITE as u64)
            )
        } else {
            format!(
                "read, {} thread{}, {} {}",
                self.threads,
                if self.threads == 1 { "" } else { "s" },
                size_label(DISK_READ as u64),
                if self.cached {
                    "through the page cache"
                } else {
                    "direct"
                }
            )
        }
    }
}

/// Piece sizes of the disk rows: the store's write-out and about its read-ahead runs.
const DISK_WRITE: usize = 8 << 20;
const DISK_READ: usize = 2 << 20;

pub struct Limits {
    procs: usize,
    block: u64,
    threads: usize,
    chunk: usize,
    pub sink: Vec<SinkRow>,
    pub compute: Vec<ComputeRow>,
    /// Empty when the work directory's filesystem refuses direct I/O.
    pub disk: Vec<DiskRow>,
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// "med (min-max)" with `prec` decimals, or "-".
fn spread(v: &[f64], prec: usize) -> String {
    let (Some(m), Some(a), Some(b)) = (
        median(v),
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
    ) else {
        return "-".into();
    };
    format!("{m:.prec$} ({a:.prec$}-{b:.prec$})")
}

impl SinkRow {
    fn label(&self, procs: usize, block: u64) -> String {
        let l = self.access.label(procs, block);
        if self.direct {
            l + ", direct I/O (not ckptfs's path)"
        } else {
            l
        }
    }

    fn mibs(&self) -> Vec<f64> {
        self.samples.iter().map(Sample::mibs).collect()
    }

    fn cpu_per_gib(&self) -> Option<f64> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.bytes > 0)
            .filter_map(|s| Some(s.cpu_s? / (s.bytes as f64 / GIB)))
            .collect();
        median(&v)
    }
}

impl Limit for Limits {
    fn sink_mibs(&self, access: Access) -> Option<f64> {
        let r = self.sink.iter().find(|r| r.access == access && !r.direct)?;
        median(&r.mibs())
    }

    fn blake3_mibs(&self) -> Option<f64> {
        let r = self.compute.iter().find(|r| r.kind == "random")?;
        Some(median(&r.blake3)? * 1024.0)
    }

    fn disk_mibs(&self, read: bool) -> Option<f64> {
        // Reads: the most any read row got (the store reads on 8 threads through the page
        // cache, so either kind of row may be what bounds it).
        self.disk
            .iter()
            .filter(|r| r.write != read)
            .filter_map(|r| median(&r.mibs))
            .max_by(f64::total_cmp)
    }
}

impl Limits {
    pub fn table(&self) -> String {
        let mut out = format!(
            "limits: FUSE sink (a filesystem that drops what it is written and reads zeros; {} \
             threads, {} requests and readahead, direct I/O on write-only opens, as ckptfs)\n",
            sink::THREADS,
            size_label(u64::from(crate::sys::MAX_WRITE_BYTES))
        );
        let mut cells = vec![vec![
            "access".to_string(),
            "MiB/s med (min-max)".into(),
            "GiB/s".into(),
            "sink CPU s/GiB".into(),
        ]];
        for r in &self.sink {
            let m = r.mibs();
            cells.push(vec![
                r.label(self.procs, self.block),
                spread(&m, 0),
                median(&m).map_or("-".into(), |x| format!("{:.2}", x / 1024.0)),
                r.cpu_per_gib().map_or("-".into(), |x| format!("{x:.2}")),
            ]);
        }
        out += &render_table(&cells, 1);
        out += &format!(
            "\nlimits: compute on {} threads, per {} chunk, GiB/s med (min-max)\n",
            self.threads,
            size_label(self.chunk as u64)
        );
        let mut cells = vec![vec![
            "data".to_string(),
            "blake3".into(),
            "LZ4 (codec)".into(),
            "stored/logical".into(),
            "LZ4 decode".into(),
            "blake3+LZ4".into(),
            "per thread: blake3 / LZ4".into(),
        ]];
        for r in &self.compute {
            let per = |v: &[f64]| {
                median(v).map_or("-".into(), |x| format!("{:.2}", x / self.threads as f64))
            };
            cells.push(vec![
                r.kind.to_string(),
                spread(&r.blake3, 2),
                spread(&r.lz4, 2),
                format!("{:.3}", r.stored_ratio),
                spread(&r.decode, 2),
                spread(&r.both, 2),
                format!("{} / {}", per(&r.blake3), per(&r.lz4)),
            ]);
        }
        out += &render_table(&cells, 1);
        if !self.disk.is_empty() {
            out += "\nlimits: the work directory's disk, MiB/s med (min-max)\n";
            let mut cells = vec![vec!["access".to_string(), "MiB/s med (min-max)".into()]];
            for r in &self.disk {
                cells.push(vec![r.label(), spread(&r.mibs, 0)]);
            }
            out += &render_table(&cells, 1);
        }
        out
    }

    pub fn json(&self) -> Value {
        json!({
            "sink_threads": sink::THREADS,
            "compute_threads": self.threads,
            "chunk_size": self.chunk,
            "sink": self.sink.iter().map(|r| json!({
                "access": r.label(self.procs, self.block),
                "mib_s": r.mibs(),
                "mib_s_median": median(&r.mibs()),
                "sink_cpu_s": r.samples.iter().map(|s| s.cpu_s).collect::<Vec<_>>(),
                "sink_cpu_s_per_gib_median": r.cpu_per_gib(),
            })).collect::<Vec<_>>(),
            "compute_gib_s": self.compute.iter().map(|r| json!({
                "data": r.kind,
                "blake3": r.blake3,
                "lz4": r.lz4,
                "stored_over_logical": r.stored_ratio,
                "lz4_decode": r.decode,
                "blake3_then_lz4": r.both,
            })).collect::<Vec<_>>(),
            "disk_mib_s": self.disk.iter().map(|r| json!({
                "access": r.label(),
                "mib_s": r.mibs,
                "mib_s_median": median(&r.mibs),
            })).collect::<Vec<_>>(),
        })
    }
}

/// GiB/s of `f` over every item on `threads` threads (contiguous shares), after one untimed
/// pass, repeating passes until `MIN_TIME` has passed. `bytes`: logical bytes of one pass.
fn all_cores<T: Sync>(items: &[T], bytes: usize, threads: usize, f: impl Fn(&T) + Sync) -> f64 {
    let per = items.len().div_ceil(threads.max(1)).max(1);
    let pass = || {
        std::thread::scope(|s| {
            for share in items.chunks(per) {
                let f = &f;
                s.spawn(move || share.iter().for_each(f));
            }
        })
    };
    pass();
    let t = Instant::now();
    let mut passes = 0usize;
    while passes == 0 || t.elapsed() < MIN_TIME {
        pass();
        passes += 1;
    }
    (passes * bytes) as f64 / GIB / t.elapsed().as_secs_f64()
}

fn compute_row(
    kind: &'static str,
    data: &[u8],
    chunk: usize,
    threads: usize,
    reps: usize,
) -> ComputeRow {
    let chunks: Vec<&[u8]> = data.chunks(chunk).collect();
    let encoded: Vec<(Codec, Option<Vec<u8>>)> = chunks
        .iter()
        .map(|c| codec::encode(c, Policy::Lz4))
        .collect();
    let stored: usize = chunks
        .iter()
        .zip(&encoded)
        .map(|(c, (_, e))| e.as_ref().map_or(c.len(), Vec::len))
        .sum();
    let compressed: Vec<(&[u8], usize)> = chunks
        .iter()
        .zip(&encoded)
        .filter_map(|(c, (_, e))| Some((e.as_deref()?, c.len())))
        .collect();
    let compressed_bytes: usize = compressed.iter().map(|c| c.1).sum();
    let mut r = ComputeRow {
        kind,
        blake3: Vec::new(),
        lz4: Vec::new(),
        stored_ratio: stored as f64 / data.len().max(1) as f64,
        decode: Vec::new(),
        both: Vec::new(),
    };
    for _ in 0..reps {
        r.blake3.push(all_cores(&chunks, data.len(), threads, |c| {
            black_box(blake3::hash(c));
        }));
        r.lz4.push(all_cores(&chunks, data.len(), threads, |c| {
            black_box(codec::encode(c, Policy::Lz4));
        }));
        // A kind that barely compresses (dense: a few header chunks) gives no decode figure
        // worth printing.
        if compressed_bytes * 100 >= data.len() {
            r.decode.push(all_cores(
                &compressed,
                compressed_bytes,
                threads,
                |(s, n)| {
                    black_box(lz4_flex::block::decompress(s, *n).ok());
                },
            ));
        }
        r.both.push(all_cores(&chunks, data.len(), threads, |c| {
            black_box(blake3::hash(c));
            black_box(codec::encode(c, Policy::Lz4));
        }));
    }
    r
}

/// The sink rows: each access the scenarios use, through the sink at `mnt`, `reps` times.
fn sink_rows(
    o: &Opts,
    exe: &Path,
    sink: &SinkMount,
    progress: &dyn Fn(&str),
) -> Result<Vec<SinkRow>> {
    let (size, block, procs) = (o.size, o.block, o.procs);
    let mnt = sink.mnt();
    let seed = mix(o.seed, name_label("limits"));
    let mut reads = vec![Access::Read1 { block }];
    if block != BIG_READ as u64 {
        reads.push(Access::Read1 {
            block: BIG_READ as u64,
        });
    }
    let mut rows: Vec<SinkRow> = [
        Access::Write1,
        Access::WriteNn,
        Access::WriteN1 { strided: false },
        Access::WriteN1 { strided: true },
    ]
    .into_iter()
    .chain(reads)
    .chain([Access::ReadN])
    .map(|access| (access, false))
    .chain([(Access::Read1 { block }, true)])
    .map(|(access, direct)| SinkRow {
        access,
        direct,
        samples: Vec::new(),
    })
    .collect();
    // One buffer: the single writer's data, then the single reader's destination.
    let mut buf = RandomSpec::new(seed).generate(size as usize);
    let part = (size / procs as u64).max(1);
    let unit = block * procs as u64;
    let n1_len = (size / unit) * unit;
    let cpu = || sys::cpu_seconds(sink.pid());
    for rep in 0..o.reps {
        let one = mnt.join(format!("one-{rep}.dat"));
        let nn: Vec<_> = (0..procs)
            .map(|i| mnt.join(format!("nn-{rep}-{i}.dat")))
            .collect();
        let shared = mnt.join(format!("n1-{rep}.dat"));
        // The sink opens this name with direct I/O (`sink::DIRECT_SUFFIX`); its size is all a
        // reader needs of it.
        let direct = mnt.join(format!("one-{rep}.{}", sink::DIRECT_SUFFIX));
        fs::File::create(&direct)
            .and_then(|f| f.set_len(size))
            .map_err(|e| format!("create {}: {e}", direct.display()))?;
        for row in &mut rows {
            sys::check_interrupted()?;
            sys::sync_all();
            let spec = RandomSpec::new(mix(seed, rep as u64));
            let s = match row.access {
                Access::Write1 | Access::Read1 { .. } => {
                    let path = if row.direct { &direct } else { &one };
                    let c0 = cpu()?;
                    let t = match row.access {
                        Access::Read1 { block } => {
                            worker::read_into(path, &mut buf, block as usize)
                        }
                        _ => worker::write_ranges(
                            path,
                            &buf,
                            &[(0, size)],
                            block as usize,
                            true,
                            false,
                        ),
                    }
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                    Sample {
                        bytes: t.bytes,
                        secs: (t.t1 - t.t0) as f64 / 1e9,
                        cpu_s: Some(cpu()? - c0),
                        ..Sample::default()
                    }
                }
                Access::WriteNn | Access::WriteN1 { .. } | Access::ReadN => {
                    let tasks: Vec<Task> = match row.access {
                        Access::WriteN1 { strided } => {
                            fs::File::create(&shared)
                                .map_err(|e| format!("create {}: {e}", shared.display()))?;
                            (0..procs)
                                .map(|i| Task {
                                    op: Op::Write {
                                        truncate: false,
                                        fsync: false,
                                    },
                                    path: shared.clone(),
                                    spec,
                                    ranges: n1_ranges(i, procs, n1_len, block, strided),
                                    block: block as usize,
                                    files: 1,
                                })
                                .collect()
                        }
                        _ => nn
                            .iter()
                            .enumerate()
                            .map(|(i, p)| Task {
                                op: if row.access == Access::ReadN {
                                    Op::Read
                                } else {
                                    Op::Write {
                                        truncate: true,
                                        fsync: false,
                                    }
                                },
                                path: p.clone(),
                                spec: RandomSpec::new(mix(spec.seed, i as u64)),
                                ranges: vec![(0, part)],
                                block: block as usize,
                                files: 1,
                            })
                            .collect(),
                    };
                    let mut g = Group::start(exe, &tasks)?;
                    let c0 = cpu()?;
                    let (t_go, ts) = g.go()?;
                    let c1 = cpu()?;
                    // Readers are not checked: the sink serves zeros.
                    g.finish()?;
                    let end = ts.iter().map(|t| t.t1).max().unwrap_or(t_go);
                    Sample {
                        bytes: ts.iter().map(|t| t.bytes).sum(),
                        secs: (end - t_go) as f64 / 1e9,
                        cpu_s: Some(c1 - c0),
                        ..Sample::default()
                    }
                }
            };
            progress(&format!(
                "limits | sink {} | rep {}/{} {:8.1} MiB/s  {:6.2} s  sink cpu {:.2} s",
                row.label(procs, block),
                rep + 1,
                o.reps,
                s.mibs(),
                s.secs,
                s.cpu_s.unwrap_or(0.0)
            ));
            row.samples.push(s);
        }
        for p in nn.iter().chain([&one, &shared, &direct]) {
            fs::remove_file(p).map_err(|e| format!("remove {}: {e}", p.display()))?;
        }
    }
    Ok(rows)
}

/// The disk rows, on a file of about `--size` in `dir` (removed after). None when the
/// filesystem refuses direct I/O (tmpfs): no row then, and the reason in the progress.
fn disk_rows(o: &Opts, dir: &Path, progress: &dyn Fn(&str)) -> Result<Vec<DiskRow>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let path = dir.join("disk-limit.dat");
    let size = (o.size / DISK_WRITE as u64).max(1) * DISK_WRITE as u64;
    let open = |write: bool| {
        fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .create(write)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
    };
    let file = match open(true) {
        Ok(f) => f,
        Err(e) => {
            progress(&format!(
                "limits: no disk rows: {} refuses direct I/O ({e})",
                path.display()
            ));
            return Ok(Vec::new());
        }
    };
    drop(file);
    let mut rows = vec![DiskRow {
        write: true,
        threads: 1,
        cached: false,
        mibs: Vec::new(),
    }];
    // The page-cache rows need the cache dropped first (root).
    let can_drop = sys::drop_caches().is_ok();
    if !can_drop {
        progress("limits: no page-cache disk rows: dropping the page cache needs root");
    }
    for threads in [1, ckptfs_engine::store::READ_THREADS] {
        for cached in [false, true] {
            if cached && !can_drop {
                continue;
            }
            rows.push(DiskRow {
                write: false,
                threads,
                cached,
                mibs: Vec::new(),
            });
        }
    }
    let mut piece = ckptfs_engine::device::IoBuf::new();
    piece.extend_from_slice(&RandomSpec::new(mix(o.seed, 7)).generate(DISK_WRITE));
    let result = (|| -> Result<()> {
        for rep in 0..o.reps {
            for row in &mut rows {
                sys::check_interrupted()?;
                let err = |e: std::io::Error| format!("{}: {e}", path.display());
                if row.write {
                    // A fresh preallocated file each time, as the space's data file is.
                    let _ = fs::remove_file(&path);
                    let f = open(true).map_err(err)?;
                    // SAFETY: plain syscall on a descriptor this function owns.
                    let r = unsafe {
                        use std::os::fd::AsRawFd;
                        libc::posix_fallocate(f.as_raw_fd(), 0, size as libc::off_t)
                    };
                    if r != 0 {
                        return Err(format!("fallocate {}: errno {r}", path.display()));
                    }
                    let t = Instant::now();
                    for off in (0..size).step_by(DISK_WRITE) {
                        f.write_all_at(piece.as_slice(), off).map_err(err)?;
                    }
                    f.sync_data().map_err(err)?;
                    row.mibs.push(size as f64 / MIB / t.elapsed().as_secs_f64());
                } else {
                    let f = if row.cached {
                        sys::drop_caches()?;
                        fs::File::open(&path).map_err(err)?
                    } else {
                        open(false).map_err(err)?
                    };
                    let t = Instant::now();
                    let share = size
                        .div_ceil(row.threads as u64)
                        .next_multiple_of(DISK_READ as u64);
                    std::thread::scope(|s| -> Result<()> {
                        let hs: Vec<_> = (0..row.threads as u64)
                            .map(|i| {
                                let f = &f;
                                s.spawn(move || -> std::io::Result<()> {
                                    let mut buf = ckptfs_engine::device::IoBuf::new();
                                    buf.extend_zeros(DISK_READ);
                                    let end = ((i + 1) * share).min(size);
                                    let mut off = i * share;
                                    while off < end {
                                        let n = (end - off).min(DISK_READ as u64) as usize;
                                        f.read_exact_at(&mut buf.as_mut_slice()[..n], off)?;
                                        off += n as u64;
                                    }
                                    Ok(())
                                })
                            })
                            .collect();
                        for h in hs {
                            h.join().expect("disk reader panicked").map_err(err)?;
                        }
                        Ok(())
                    })?;
                    row.mibs.push(size as f64 / MIB / t.elapsed().as_secs_f64());
                }
                progress(&format!(
                    "limits | disk {} | rep {}/{} {:8.1} MiB/s",
                    row.label(),
                    rep + 1,
                    o.reps,
                    row.mibs.last().copied().unwrap_or(0.0)
                ));
            }
        }
        Ok(())
    })();
    let _ = fs::remove_file(&path);
    result.map(|()| rows)
}

/// Measures every limit: the sink (mounted at DIR/sink for the duration), then the compute,
/// then the disk.
pub fn measure(o: &Opts, exe: &Path, dir: &Path, progress: &dyn Fn(&str)) -> Result<Limits> {
    progress("limits: mounting the FUSE sink");
    let sink = SinkMount::start(exe, &dir.join("sink"))?;
    let rows = sink_rows(o, exe, &sink, progress);
    // Unmounted before the error (if any) is returned, and before the compute rows.
    let stopped = sink.stop();
    let rows = rows?;
    stopped?;
    let chunk = ckptfs_engine::parse_size(&o.chunk_size)
        .map_err(|e| format!("--chunk-size {}: {e}", o.chunk_size))? as usize;
    if chunk == 0 {
        return Err("--chunk-size must be positive".into());
    }
    let threads = data::threads();
    let n = ((o.size as usize).min(COMPUTE_BYTES) / chunk).max(1) * chunk;
    let mut compute = Vec::new();
    for kind in ["random", "field", "dense"] {
        sys::check_interrupted()?;
        let seed = mix(o.seed, name_label(&format!("limits-{kind}")));
        let bytes = match kind {
            "random" => RandomSpec::new(seed).generate(n),
            "field" => data::field(seed, n),
            _ => data::dense(seed, n),
        };
        progress(&format!(
            "limits: compute on {kind} ({}, {threads} threads)",
            size_label(n as u64)
        ));
        compute.push(compute_row(kind, &bytes, chunk, threads, o.reps));
    }
    let disk = disk_rows(o, dir, progress)?;
    Ok(Limits {
        procs: o.procs,
        block: o.block,
        threads,
        chunk,
        sink: rows,
        compute,
        disk,
    })
}

/// Checks the options the limits use.
pub fn check_opts(o: &Opts) -> Result<()> {
    if o.reps == 0 || o.procs == 0 || o.block == 0 {
        return Err("--reps, --procs and --block must be positive".into());
    }
    let min = o.block * o.procs as u64;
    if o.size < min {
        return Err(format!(
            "--size {} is below --block x --procs ({})",
            o.size, min
        ));
    }
    Ok(())
}

/// `ckptfs-bench limits`: measures and prints the limits.
pub fn run(o: &Opts) -> Result<()> {
    let start = Instant::now();
    check_opts(o)?;
    sys::catch_signals();
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    let dir = fs::canonicalize(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    // Without the lines about ckptfs and the work dir's disk: the limits use neither.
    let env: Vec<(String, String)> = sys::environment(&dir, Path::new(""))
        .into_iter()
        .filter(|(k, _)| k != "ckptfs" && k != "work dir")
        .collect();
    println!("ckptfs-bench limits");
    for (k, v) in &env {
        println!("  {k:<13} {v}");
    }
    println!(
        "  {:<13} --size {} --block {} --procs {} --reps {} --seed {}, chunk size {}",
        "options",
        size_label(o.size),
        size_label(o.block),
        o.procs,
        o.reps,
        o.seed,
        o.chunk_size
    );
    println!();
    let progress = |m: &str| eprintln!("[{:5.0}s] {m}", start.elapsed().as_secs_f64());
    let limits = measure(o, &exe, &dir, &progress)?;
    println!();
    print!("{}", limits.table());
    println!();
    println!("{}", legend());
    println!("wall time {:.0} s", start.elapsed().as_secs_f64());
    if let Some(path) = &o.json {
        let v = json!({
            "environment": env.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "options": {
                "size": o.size, "block": o.block, "procs": o.procs, "reps": o.reps,
                "seed": o.seed, "chunk_size": o.chunk_size,
            },
            "limits": limits.json(),
            "wall_s": start.elapsed().as_secs_f64(),
        });
        let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        fs::write(path, text + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// What the limits tables mean.
pub fn legend() -> String {
    format!(
        "sink MiB/s: logical bytes / (open to close returned), or for several processes (start barrier to last close); \
         the same worker code and descriptors as the ckptfs rows, no fsync (as ckptfs). sink CPU s/GiB: the sink process's \
         utime+stime per GiB, the FUSE transport's share of a daemon's CPU. Reads are cold for the kernel (no page cache: \
         written with direct I/O, and opening without keep_cache drops it). compute: GiB/s of logical bytes on all cores \
         ({} MiB of each data kind at most); LZ4 (codec): the engine's per-chunk choice, LZ4 or raw where LZ4 does not \
         shrink it; LZ4 decode: over the chunks stored compressed (- when under 1% are). disk: direct I/O of a \
         preallocated file of --size in the work directory (host caches under a virtual disk included), written in 8 MiB \
         pieces then fdatasync, read in 2 MiB pieces by 1 thread and by as many threads as the store's read-ahead, each a \
         contiguous share.",
        COMPUTE_BYTES >> 20
    )
}
