//! `ckptfs-bench gpu`: the GPU LZ4 codec (ckptfs-kernels) against lz4_flex on all CPU cores.
//!
//! Per data kind, `--bytes` of generated data cut into `--chunk` chunks, and in the same run:
//!
//! - lz4_flex block compress and decompress on every core (`available_parallelism` threads,
//!   each a contiguous share of the chunks), into buffers allocated before timing;
//! - the GPU codec on the whole batch, end to end: one call, so packing into pinned memory, the
//!   transfers both ways and unpacking are all in the time. `Gpu::open` (NVRTC compilation) is
//!   untimed; one warm-up call, then the median of `--reps`. The kernels' own time (CUDA events,
//!   `Gpu::last_kernel_seconds`) is reported beside it, to show what the transfers cost;
//! - stored/logical for both, a chunk that does not shrink being stored raw at its length.
//!
//! Decompression takes each side's own compressed blocks (raw chunks are skipped, as a reader
//! copies them), and its GiB/s counts the decoded bytes. Every GPU block is checked to decode
//! with lz4_flex to exactly its chunk, and the GPU's decompression to give the input back.
//!
//! Needs neither root nor FUSE. Without a GPU the CPU columns still run; `--emulate` runs the
//! same kernel source compiled for the CPU (`ckptfs_kernels::Emu`): its bytes and ratio are the
//! GPU's, its speed means nothing.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use ckptfs_engine::parse_size;
use ckptfs_kernels::gpu::{Gpu, GpuOptions};
use ckptfs_kernels::{BatchCodec, Emu};

use crate::data;

/// The goal: GPU compression, end to end, on an H100.
const GOAL_GIB_S: f64 = 20.0;
const GIB: f64 = (1u64 << 30) as f64;
const KINDS: [&str; 5] = ["random", "field", "dense", "zeros", "log"];

/// Options of `ckptfs-bench gpu`.
#[derive(Args, Clone, Debug)]
pub struct GpuOpts {
    /// Bytes of data per kind [default: 1G; 4M with --emulate, which runs at well under 1 MiB/s]
    #[arg(long, value_parser = parse_size)]
    pub bytes: Option<u64>,
    /// Chunk size: the unit each codec compresses on its own
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub chunk: u64,
    /// Timed repetitions per codec and direction (the median is reported), after one warm-up
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Data kinds, comma-separated: random, field, dense, zeros, log [default: all]
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Seed of all generated data
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run the kernels in the CPU emulation instead of on a GPU: checks the kernels' bytes and
    /// ratio; the speed is meaningless
    #[arg(long)]
    pub emulate: bool,
    /// Exit 1 when no GPU can be used (for runs on GPU machines)
    #[arg(long)]
    pub require_gpu: bool,
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Directory holding libcuda / libnvrtc, when the loader does not find them
    #[arg(long, value_name = "DIR")]
    pub cuda_lib_dir: Option<PathBuf>,
    /// Input bytes per GPU sub-batch (`GpuOptions::sub_batch_bytes`; default 32M): one warp
    /// per chunk, so larger sub-batches keep more of the GPU busy and smaller ones overlap
    /// copies and kernels sooner. Run with several values to choose the default.
    #[arg(long, value_parser = parse_size)]
    pub sub_batch: Option<u64>,
    /// Threads that pack chunks into pinned memory and unpack results
    /// (`GpuOptions::copy_threads`; default up to 4).
    #[arg(long)]
    pub copy_threads: Option<usize>,
    /// Also write the results as JSON to this file
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Timings of one codec in one direction.
#[derive(Clone, Debug, Default)]
struct Timed {
    /// Logical bytes per call (input for compression, output for decompression).
    bytes: usize,
    /// Seconds of each timed call.
    secs: Vec<f64>,
    /// The real GPU: seconds its kernels ran in each timed call.
    kernel_secs: Vec<f64>,
    /// Seconds of the untimed first call.
    warmup_s: Option<f64>,
}

impl Timed {
    /// Records one call: the warm-up, or a timed one (with its kernel seconds, if known).
    fn record(&mut self, warmup: bool, secs: f64, kernel_secs: Option<f64>) {
        if warmup {
            self.warmup_s = Some(secs);
        } else {
            self.secs.push(secs);
            self.kernel_secs.extend(kernel_secs);
        }
    }

    fn gib_s(&self) -> Option<f64> {
        let m = median(&self.secs)?;
        (self.bytes > 0 && m > 0.0).then(|| self.bytes as f64 / GIB / m)
    }

    fn kernel_gib_s(&self) -> Option<f64> {
        let m = median(&self.kernel_secs)?;
        (self.bytes > 0 && m > 0.0).then(|| self.bytes as f64 / GIB / m)
    }

    fn json(&self) -> Value {
        json!({
            "bytes": self.bytes,
            "secs": self.secs,
            "gib_s_median": self.gib_s(),
            "gib_s": self.secs.iter().map(|s| self.bytes as f64 / GIB / s).collect::<Vec<_>>(),
            "kernel_secs": self.kernel_secs,
            "kernel_gib_s_median": self.kernel_gib_s(),
        })
    }
}

/// One codec's results on one kind.
#[derive(Clone, Debug, Default)]
struct Side {
    stored: usize,
    compress: Timed,
    decompress: Timed,
}

impl Side {
    fn json(&self, logical: usize) -> Value {
        json!({
            "stored_bytes": self.stored,
            "ratio": ratio(self.stored, logical),
            "compress": self.compress.json(),
            "decompress": self.decompress.json(),
            "warmup_compress_s": self.compress.warmup_s,
            "warmup_decompress_s": self.decompress.warmup_s,
        })
    }
}

struct KindResult {
    kind: String,
    chunks: usize,
    logical: usize,
    cpu_threads: usize,
    cpu: Side,
    gpu: Option<Side>,
    /// What went wrong, by chunk; empty when everything checked out.
    failures: Vec<String>,
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

fn ratio(stored: usize, logical: usize) -> Option<f64> {
    (logical > 0).then(|| stored as f64 / logical as f64)
}

fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The GPU ratio relative to lz4_flex's, in percent (positive: the GPU stores more).
fn ratio_diff_pct(r: &KindResult) -> Option<f64> {
    let g = r.gpu.as_ref()?;
    let c = ratio(r.cpu.stored, r.logical)?;
    let g = ratio(g.stored, r.logical)?;
    (c > 0.0).then(|| 100.0 * (g - c) / c)
}

// ---- data ----

/// Log-like text: timestamped lines of training metrics, numbers changing from line to line.
/// Generated in 1 MiB pieces, each from its own seed (lines are cut at piece ends).
fn log_text(seed: u64, len: usize) -> Vec<u8> {
    const LEVELS: [&str; 4] = ["INFO ", "INFO ", "DEBUG", "WARN "];
    let mut out = vec![0u8; len];
    data::par_pieces(&mut out, 1 << 20, |i, p| {
        let mut rng = SmallRng::seed_from_u64(data::mix(seed, data::name_label("log") ^ i as u64));
        let mut step = i as u64 * 4096;
        let mut ms = i as u64 * 4_096_000;
        let mut s = String::with_capacity(p.len() + 256);
        while s.len() < p.len() {
            step += 1;
            ms += rng.random_range(200..1800);
            let (h, m, sec, milli) = (
                (ms / 3_600_000) % 24,
                (ms / 60_000) % 60,
                (ms / 1000) % 60,
                ms % 1000,
            );
            let _ = writeln!(
                s,
                "2025-03-14T{h:02}:{m:02}:{sec:02}.{milli:03}Z {} rank {:>3} step {step:>8} \
                 loss {:.4} lr {:.3e} grad_norm {:.3} tokens/s {} mem {} MiB",
                LEVELS[rng.random_range(0..LEVELS.len())],
                rng.random_range(0..256u32),
                1.5 + rng.random::<f64>(),
                3e-4 * rng.random::<f64>(),
                rng.random::<f64>() * 4.0,
                rng.random_range(100_000..200_000u32),
                rng.random_range(40_000..80_000u32),
            );
        }
        p.copy_from_slice(&s.as_bytes()[..p.len()]);
    });
    out
}

fn generate(kind: &str, seed: u64, len: usize) -> Vec<u8> {
    match kind {
        "random" => data::RandomSpec::new(seed).generate(len),
        "field" => data::field(seed, len),
        "dense" => data::dense(seed, len),
        "zeros" => vec![0u8; len],
        "log" => log_text(seed, len),
        _ => unreachable!("kind checked in run"),
    }
}

// ---- lz4_flex on all cores ----

/// Runs `f` on each item of `jobs`, `threads` threads each taking a contiguous share.
fn on_all_cores<T: Send>(jobs: &mut [T], threads: usize, f: impl Fn(&mut T) + Sync) {
    let per = jobs.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for share in jobs.chunks_mut(per) {
            let f = &f;
            s.spawn(move || share.iter_mut().for_each(f));
        }
    });
}

/// lz4_flex's blocks of a batch: block `i` is `lens[i]` bytes at `out[i * slot..]`.
struct CpuBlocks {
    out: Vec<u8>,
    slot: usize,
    lens: Vec<usize>,
}

/// Compresses `chunks` with lz4_flex `reps` + 1 times (the first untimed).
fn cpu_compress(chunks: &[&[u8]], threads: usize, reps: usize, side: &mut Side) -> CpuBlocks {
    let slot =
        lz4_flex::block::get_maximum_output_size(chunks.iter().map(|c| c.len()).max().unwrap_or(0));
    let mut out = vec![0u8; slot * chunks.len()];
    let mut lens = vec![0usize; chunks.len()];
    {
        let mut jobs: Vec<(&[u8], &mut [u8], &mut usize)> = chunks
            .iter()
            .zip(out.chunks_mut(slot.max(1)))
            .zip(lens.iter_mut())
            .map(|((c, o), l)| (*c, o, l))
            .collect();
        side.compress.bytes = chunks.iter().map(|c| c.len()).sum();
        for rep in 0..=reps {
            let t = Instant::now();
            on_all_cores(&mut jobs, threads, |(c, o, l)| {
                **l = lz4_flex::block::compress_into(c, o).expect("output sized to the bound");
            });
            side.compress
                .record(rep == 0, t.elapsed().as_secs_f64(), None);
        }
    }
    side.stored = chunks.iter().zip(&lens).map(|(c, &l)| l.min(c.len())).sum();
    CpuBlocks { out, slot, lens }
}

/// Decodes lz4_flex's own blocks (chunks it stores raw are skipped); checks the result.
fn cpu_decompress(
    chunks: &[&[u8]],
    cpu: &CpuBlocks,
    threads: usize,
    reps: usize,
    side: &mut Side,
    failures: &mut Vec<String>,
) {
    let kept: Vec<usize> = (0..chunks.len())
        .filter(|&i| cpu.lens[i] < chunks[i].len())
        .collect();
    let total: usize = kept.iter().map(|&i| chunks[i].len()).sum();
    side.decompress.bytes = total;
    if kept.is_empty() {
        return;
    }
    let mut out = vec![0u8; total];
    let mut got = vec![0usize; kept.len()];
    {
        let mut rest: &mut [u8] = &mut out;
        let (blocks, slot, lens) = (&cpu.out, cpu.slot, &cpu.lens);
        let mut jobs: Vec<(&[u8], &mut [u8], &mut usize)> = Vec::with_capacity(kept.len());
        for (&i, g) in kept.iter().zip(got.iter_mut()) {
            let (dst, r) = std::mem::take(&mut rest).split_at_mut(chunks[i].len());
            rest = r;
            jobs.push((&blocks[i * slot..i * slot + lens[i]], dst, g));
        }
        for rep in 0..=reps {
            let t = Instant::now();
            on_all_cores(&mut jobs, threads, |(b, o, g)| {
                **g = lz4_flex::block::decompress_into(b, o).unwrap_or(usize::MAX);
            });
            side.decompress
                .record(rep == 0, t.elapsed().as_secs_f64(), None);
        }
    }
    let mut pos = 0;
    for (&i, &g) in kept.iter().zip(&got) {
        let c = chunks[i];
        if g != c.len() || out[pos..pos + c.len()] != *c {
            failures.push(format!(
                "chunk {i}: lz4_flex round trip differs from the input"
            ));
        }
        pos += c.len();
    }
}

// ---- the GPU codec ----

/// Compresses and decompresses with the batch codec; checks every block against lz4_flex and the
/// decompressed batch against the input. `emulated`: one call each way, no warm-up.
fn gpu_side(
    codec: &Codec,
    emulated: bool,
    chunks: &[&[u8]],
    reps: usize,
    failures: &mut Vec<String>,
) -> Option<Side> {
    let mut side = Side::default();
    let calls = if emulated { 1 } else { reps + 1 };
    side.compress.bytes = chunks.iter().map(|c| c.len()).sum();
    let mut compressed = None;
    for call in 0..calls {
        let t = Instant::now();
        let c = match codec.get().compress(chunks) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("GPU compress failed: {e}"));
                return None;
            }
        };
        let s = t.elapsed().as_secs_f64();
        side.compress
            .record(call == 0 && !emulated, s, codec.kernel_seconds());
        if c.len() != chunks.len() {
            failures.push(format!(
                "GPU compress returned {} results for {} chunks",
                c.len(),
                chunks.len()
            ));
            return None;
        }
        let stored = c.stored_bytes(chunks.iter().map(|c| c.len()));
        match compressed {
            None => {
                side.stored = stored;
                compressed = Some(c);
            }
            Some(_) if stored != side.stored => failures.push(format!(
                "GPU compress call {call} stored {stored} bytes, the first {}",
                side.stored
            )),
            Some(_) => {}
        }
    }
    let compressed = compressed?;

    // Every block decodes with lz4_flex to exactly its chunk.
    let mut bad = 0;
    for (i, c) in chunks.iter().enumerate() {
        let Some(b) = compressed.get(i) else { continue };
        let why = match lz4_flex::block::decompress(b, c.len()) {
            Err(e) => Some(format!("lz4_flex cannot decode it: {e}")),
            Ok(d) if d.len() != c.len() => {
                Some(format!("decodes to {} bytes, not {}", d.len(), c.len()))
            }
            Ok(d) if d != *c => Some("decodes to other bytes than the chunk".to_string()),
            Ok(_) if b.len() >= c.len() => Some(format!(
                "block of {} bytes does not shrink the chunk",
                b.len()
            )),
            Ok(_) => None,
        };
        if let Some(why) = why {
            bad += 1;
            if bad <= 5 {
                failures.push(format!("chunk {i}: GPU block {why}"));
            }
        }
    }
    if bad > 5 {
        failures.push(format!("... {} more bad GPU blocks", bad - 5));
    }

    // Decompress the GPU's own blocks.
    let kept: Vec<usize> = (0..chunks.len())
        .filter(|&i| compressed.get(i).is_some())
        .collect();
    let blocks: Vec<&[u8]> = kept.iter().filter_map(|&i| compressed.get(i)).collect();
    let raw_lens: Vec<usize> = kept.iter().map(|&i| chunks[i].len()).collect();
    side.decompress.bytes = raw_lens.iter().sum();
    if blocks.is_empty() {
        return Some(side);
    }
    for call in 0..calls {
        let t = Instant::now();
        let out = match codec.get().decompress(&blocks, &raw_lens) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("GPU decompress failed: {e}"));
                return Some(side);
            }
        };
        let s = t.elapsed().as_secs_f64();
        side.decompress
            .record(call == 0 && !emulated, s, codec.kernel_seconds());
        if call == 0 {
            if out.len() != side.decompress.bytes {
                failures.push(format!(
                    "GPU decompress returned {} bytes, not {}",
                    out.len(),
                    side.decompress.bytes
                ));
                continue;
            }
            let mut pos = 0;
            for &i in &kept {
                let c = chunks[i];
                if out[pos..pos + c.len()] != *c {
                    failures.push(format!(
                        "chunk {i}: GPU decompress output differs from the input"
                    ));
                    break;
                }
                pos += c.len();
            }
        }
    }
    Some(side)
}

/// The codec in the GPU columns.
enum Codec {
    Gpu(Box<Gpu>),
    Other(Box<dyn BatchCodec>),
}

impl Codec {
    fn get(&self) -> &dyn BatchCodec {
        match self {
            Codec::Gpu(g) => g.as_ref(),
            Codec::Other(c) => c.as_ref(),
        }
    }

    /// The real GPU: seconds its kernels ran in the last call.
    fn kernel_seconds(&self) -> Option<f64> {
        match self {
            Codec::Gpu(g) => Some(g.last_kernel_seconds()),
            Codec::Other(_) => None,
        }
    }
}

/// The codec in the GPU columns, or why there is none.
fn open_codec(o: &GpuOpts) -> Result<Codec, String> {
    if o.emulate {
        return Ok(Codec::Other(Box::new(Emu)));
    }
    let opts = GpuOptions {
        device: o.device,
        lib_dir: o.cuda_lib_dir.clone(),
        sub_batch_bytes: o.sub_batch.map(|b| b as usize),
        copy_threads: o.copy_threads,
    };
    match Gpu::open(&opts) {
        Ok(g) => Ok(Codec::Gpu(Box::new(g))),
        Err(ckptfs_kernels::Error::Unavailable(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

// ---- output ----

fn table(results: &[KindResult], emulated: bool) -> String {
    let g = if emulated { "emulated" } else { "gpu" };
    let head = [
        "kind".to_string(),
        "chunks".into(),
        "lz4_flex ratio".into(),
        format!("{g} ratio"),
        "ratio diff %".into(),
        "cpu threads".into(),
        "lz4_flex compress GiB/s".into(),
        format!("{g} compress GiB/s"),
        "speedup".into(),
        "lz4_flex decompress GiB/s".into(),
        format!("{g} decompress GiB/s"),
        "speedup".into(),
        "verified".into(),
    ];
    let opt = |v: Option<f64>, prec: usize| match v {
        Some(x) => format!("{x:.prec$}"),
        None => "-".into(),
    };
    let speedup = |a: Option<f64>, b: Option<f64>| {
        if emulated {
            "-".into()
        } else {
            opt(div(b, a), 1)
        }
    };
    // GiB/s; the emulation's tiny figures with 4 decimals.
    let gib = |v: Option<f64>| match v {
        Some(x) if x < 0.1 => format!("{x:.4}"),
        v => opt(v, 2),
    };
    // Decompression GiB/s, with the share of the data decoded where some chunks were stored raw.
    let dec = |t: &Timed, logical: usize| match t.gib_s() {
        Some(v) if t.bytes < logical => format!(
            "{} ({:.1}%)",
            gib(Some(v)),
            100.0 * t.bytes as f64 / logical as f64
        ),
        v => gib(v),
    };
    let mut cells: Vec<Vec<String>> = vec![head.to_vec()];
    for r in results {
        let gs = r.gpu.as_ref();
        let (cc, cd) = (r.cpu.compress.gib_s(), r.cpu.decompress.gib_s());
        let gc = gs.and_then(|s| s.compress.gib_s());
        let gd = gs.and_then(|s| s.decompress.gib_s());
        cells.push(vec![
            r.kind.clone(),
            r.chunks.to_string(),
            opt(ratio(r.cpu.stored, r.logical), 4),
            opt(gs.and_then(|s| ratio(s.stored, r.logical)), 4),
            opt(ratio_diff_pct(r), 2),
            r.cpu_threads.to_string(),
            gib(cc),
            gib(gc),
            speedup(cc, gc),
            dec(&r.cpu.decompress, r.logical),
            gs.map_or("-".into(), |s| dec(&s.decompress, r.logical)),
            speedup(cd, gd),
            if !r.failures.is_empty() {
                "FAIL".into()
            } else if gs.is_some() {
                "ok".into()
            } else {
                "cpu only".into()
            },
        ]);
    }
    crate::report::render_table(&cells, 1)
}

/// The goal line: measured GPU compression of random and field data against 20 GiB/s.
fn goal_line(results: &[KindResult], gpu: &GpuState) -> String {
    let mut s = format!("goal: GPU compression >= {GOAL_GIB_S:.0} GiB/s end to end (H100):");
    match gpu {
        GpuState::Absent(_) => s += " not measured (no GPU)",
        GpuState::Emulated(_) => s += " not measured (emulated: speed meaningless)",
        GpuState::Real(_) => {
            for kind in ["random", "field"] {
                let Some(r) = results.iter().find(|r| r.kind == kind) else {
                    let _ = write!(s, " {kind} not run;");
                    continue;
                };
                match r.gpu.as_ref().and_then(|g| g.compress.gib_s()) {
                    Some(v) => {
                        let verdict = if v >= GOAL_GIB_S { "met" } else { "NOT met" };
                        let _ = write!(s, " {kind} {v:.2} GiB/s ({verdict});");
                    }
                    None => {
                        let _ = write!(s, " {kind} not measured;");
                    }
                }
            }
            if s.ends_with(';') {
                s.pop();
            }
        }
    }
    s
}

enum GpuState {
    Real(String),
    Emulated(String),
    Absent(String),
}

impl GpuState {
    fn line(&self) -> String {
        match self {
            GpuState::Real(d) => format!("GPU: {d}"),
            GpuState::Emulated(d) => format!(
                "GPU: emulated: {d} (the kernels' bytes and ratio; the speed means nothing)"
            ),
            GpuState::Absent(why) => format!("GPU: not available: {why}"),
        }
    }
}

/// `ckptfs-bench gpu`. Ok(false): a check failed, or no GPU under `--require-gpu`.
pub fn run(o: &GpuOpts) -> Result<bool, Box<dyn std::error::Error>> {
    let bytes = o.bytes.unwrap_or(if o.emulate { 4 << 20 } else { 1 << 30 }) as usize;
    let chunk = o.chunk as usize;
    if chunk == 0 || chunk > ckptfs_kernels::MAX_CHUNK {
        return Err(format!("--chunk must be 1..={}", ckptfs_kernels::MAX_CHUNK).into());
    }
    if o.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    let kinds: Vec<String> = if o.kinds.is_empty() {
        KINDS.iter().map(|k| k.to_string()).collect()
    } else {
        o.kinds.clone()
    };
    if let Some(k) = kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
        return Err(format!("unknown kind {k:?} (kinds: {})", KINDS.join(", ")).into());
    }

    let t = Instant::now();
    let opened = open_codec(o);
    let open_s = t.elapsed().as_secs_f64();
    let (codec, state) = match opened {
        Ok(c) if o.emulate => {
            let d = c.get().describe();
            (Some(c), GpuState::Emulated(d))
        }
        Ok(c) => {
            let sub = o
                .sub_batch
                .unwrap_or(ckptfs_kernels::gpu::SUB_BATCH_BYTES as u64);
            let d = format!("{}, sub-batches of {} MiB", c.get().describe(), sub >> 20);
            (Some(c), GpuState::Real(d))
        }
        Err(why) => (None, GpuState::Absent(why)),
    };
    if let GpuState::Absent(_) = state {
        let line = state.line();
        let bar = "!".repeat(line.len().min(100));
        eprintln!("{bar}\n{line}\n{bar}");
        if o.require_gpu {
            eprintln!("ckptfs-bench gpu: --require-gpu: giving up");
            return Ok(false);
        }
    }
    let threads = data::threads();
    println!("{}", state.line());
    println!(
        "CPU: lz4_flex block codec on {threads} threads; {} per kind in {} KiB chunks, median of {} after a warm-up",
        human(bytes),
        chunk >> 10,
        o.reps
    );

    let mut results = Vec::new();
    for kind in &kinds {
        eprint!("{kind}: generating {}...", human(bytes));
        let _ = std::io::stderr().flush();
        let buf = generate(kind, o.seed, bytes);
        let chunks: Vec<&[u8]> = buf.chunks(chunk).collect();
        let cpu_threads = threads.min(chunks.len()).max(1);
        let mut r = KindResult {
            kind: kind.clone(),
            chunks: chunks.len(),
            logical: bytes,
            cpu_threads,
            cpu: Side::default(),
            gpu: None,
            failures: Vec::new(),
        };
        eprint!(" lz4_flex...");
        let _ = std::io::stderr().flush();
        let blocks = cpu_compress(&chunks, cpu_threads, o.reps, &mut r.cpu);
        cpu_decompress(
            &chunks,
            &blocks,
            cpu_threads,
            o.reps,
            &mut r.cpu,
            &mut r.failures,
        );
        drop(blocks);
        if let Some(codec) = &codec {
            eprint!(" {}...", if o.emulate { "emulation" } else { "GPU" });
            let _ = std::io::stderr().flush();
            r.gpu = gpu_side(codec, o.emulate, &chunks, o.reps, &mut r.failures);
        }
        eprintln!(" done");
        for f in &r.failures {
            eprintln!("MISMATCH: kind {kind}: {f}");
        }
        results.push(r);
    }

    println!();
    print!("{}", table(&results, o.emulate));
    println!(
        "ratio = stored/logical (raw chunks at their length); ratio diff = gpu vs lz4_flex; \
         GiB/s = logical bytes / median seconds; decompression decodes each side's own \
         compressed chunks, (N%) = their share of the data when some are stored raw"
    );
    if let GpuState::Real(_) = state {
        let kernel: Vec<String> = results
            .iter()
            .filter_map(|r| {
                let g = r.gpu.as_ref()?;
                let f = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1}"));
                Some(format!(
                    "{} {}/{}",
                    r.kind,
                    f(g.compress.kernel_gib_s()),
                    f(g.decompress.kernel_gib_s())
                ))
            })
            .collect();
        println!(
            "GPU kernels only (no transfers), compress/decompress GiB/s: {}",
            kernel.join(", ")
        );
        println!("GPU open (NVRTC compilation and self-check): {open_s:.2} s");
    }
    println!("{}", goal_line(&results, &state));
    let failed = results.iter().any(|r| !r.failures.is_empty());
    if failed {
        println!("VERIFICATION FAILED (see MISMATCH lines)");
    }

    if let Some(path) = &o.json {
        let v = json!({
            "device": state.line(),
            "gpu_open_s": open_s,
            "gpu_available": matches!(state, GpuState::Real(_)),
            "emulated": o.emulate,
            "bytes_per_kind": bytes,
            "chunk": chunk,
            "reps": o.reps,
            "seed": o.seed,
            "cpu_threads": threads,
            "goal_gib_s": GOAL_GIB_S,
            "goal": goal_line(&results, &state),
            "kinds": results.iter().map(|r| {
                let gc = r.gpu.as_ref().and_then(|g| g.compress.gib_s());
                let gd = r.gpu.as_ref().and_then(|g| g.decompress.gib_s());
                json!({
                    "kind": r.kind,
                    "chunks": r.chunks,
                    "logical_bytes": r.logical,
                    "cpu_threads": r.cpu_threads,
                    "lz4_flex": r.cpu.json(r.logical),
                    "gpu": r.gpu.as_ref().map(|g| g.json(r.logical)),
                    "ratio_diff_pct": ratio_diff_pct(r),
                    "compress_speedup": if o.emulate { None } else { div(gc, r.cpu.compress.gib_s()) },
                    "decompress_speedup": if o.emulate { None } else { div(gd, r.cpu.decompress.gib_s()) },
                    "verified": r.failures.is_empty(),
                    "failures": r.failures,
                })
            }).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(!(failed || o.require_gpu && codec.is_none()))
}

fn human(n: usize) -> String {
    if n >= 1 << 30 && n.is_multiple_of(1 << 30) {
        format!("{} GiB", n >> 30)
    } else if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_text_is_deterministic_and_compressible() {
        let a = log_text(3, 3 << 20);
        assert_eq!(a.len(), 3 << 20);
        assert_eq!(a, log_text(3, 3 << 20));
        assert!(a.iter().all(|b| b.is_ascii()));
        let c = lz4_flex::block::compress(&a[..64 << 10]);
        assert!(
            c.len() < (64 << 10) / 2,
            "log text compressed to {}",
            c.len()
        );
    }

    #[test]
    fn cpu_side_round_trips() {
        let buf = generate("field", 1, 1 << 20);
        let chunks: Vec<&[u8]> = buf.chunks(64 << 10).collect();
        let mut side = Side::default();
        let mut failures = Vec::new();
        let b = cpu_compress(&chunks, 2, 1, &mut side);
        cpu_decompress(&chunks, &b, 2, 1, &mut side, &mut failures);
        assert!(failures.is_empty(), "{failures:?}");
        assert!(side.stored < buf.len());
        assert_eq!(side.compress.secs.len(), 1);
    }

    /// lz4_flex as a batch codec; `corrupt`: flips a byte of every decoded chunk.
    struct Lz {
        corrupt: bool,
    }

    impl BatchCodec for Lz {
        fn describe(&self) -> String {
            "lz4_flex".into()
        }
        fn compress(&self, chunks: &[&[u8]]) -> ckptfs_kernels::Result<ckptfs_kernels::Compressed> {
            let mut c = ckptfs_kernels::Compressed::default();
            for ch in chunks {
                let b = lz4_flex::block::compress(ch);
                c.push((b.len() < ch.len()).then_some(&b[..]));
            }
            Ok(c)
        }
        fn decompress(
            &self,
            blocks: &[&[u8]],
            raw_lens: &[usize],
        ) -> ckptfs_kernels::Result<Vec<u8>> {
            let mut out = Vec::new();
            for (b, &n) in blocks.iter().zip(raw_lens) {
                let mut d = lz4_flex::block::decompress(b, n).unwrap();
                if self.corrupt {
                    d[n / 2] ^= 1;
                }
                out.extend_from_slice(&d);
            }
            Ok(out)
        }
    }

    #[test]
    fn gpu_side_checks_the_codec() {
        let buf = generate("log", 1, 1 << 20);
        let chunks: Vec<&[u8]> = buf.chunks(64 << 10).collect();
        let mut failures = Vec::new();
        let side = gpu_side(
            &Codec::Other(Box::new(Lz { corrupt: false })),
            false,
            &chunks,
            2,
            &mut failures,
        )
        .unwrap();
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(side.compress.secs.len(), 2);
        assert_eq!(side.decompress.bytes, 1 << 20);
        let mut cpu = Side::default();
        cpu_compress(&chunks, 2, 1, &mut cpu);
        assert_eq!(side.stored, cpu.stored);

        gpu_side(
            &Codec::Other(Box::new(Lz { corrupt: true })),
            true,
            &chunks,
            2,
            &mut failures,
        )
        .unwrap();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].starts_with("chunk 0: "), "{failures:?}");
    }

    #[test]
    fn stats() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(8 << 20), "8 MiB");
    }
}
