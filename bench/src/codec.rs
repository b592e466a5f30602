//! `ckptfs-bench codec`: the chunk codecs side by side on seeded data and on files, no mount:
//! stored fraction under `float` (`--codec float`), under `lz4` (the default), and under
//! zstd level 1 of the plain chunk for reference, with encode
//! and decode GiB/s on one core; and ZipNN (the lossless state of the art for model
//! tensors) on the same bytes in the same run, through Python, where `zipnn` is installed.
//!
//! Chunks are cut as a space cuts them (FastCDC, `--chunk-size` average), so float arrays
//! start at any offset inside a chunk, as they do in real checkpoints. ZipNN compresses each
//! data set whole (its own 256 KiB pieces), which is its best case.
//!
//! Every encode and decode speed is the best of `PASSES` passes over the data, as ZipNN's
//! (through Python) is: the first pass also pays for faulting in the memory its outputs
//! take, which a running daemon has long since (its workers free each batch's frames once
//! stored and the next batch reuses them, `heap::TRIM_THRESHOLD`). One pass put the float
//! codec's bf16 encode at 0.91-1.00 GiB/s, the best of three at 1.4-1.5 on the same data.

use std::path::PathBuf;
use std::time::Instant;

use ckptfs_engine::codec::{self, Policy};
use ckptfs_engine::format::Codec;
use rand::{Rng, SeedableRng};

use crate::data;

#[derive(clap::Args, Clone, Debug)]
pub struct CodecOpts {
    /// Bytes of each generated data kind
    #[arg(long, default_value = "64M", value_parser = ckptfs_engine::parse_size)]
    pub size: u64,
    /// Average chunk size (as `ckptfs format --chunk-size`)
    #[arg(long, default_value = "64K", value_parser = ckptfs_engine::parse_size)]
    pub chunk_size: u64,
    /// Seed of the generated data
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also measure these files (a framework checkpoint, say)
    pub files: Vec<PathBuf>,
    /// Also print the table as JSON
    #[arg(long)]
    pub json: bool,
    /// Python interpreter that runs ZipNN (`pip install zipnn`) beside the codecs
    #[arg(long, default_value = "python3")]
    pub python: String,
}

/// N(0, std) float32 values (Box-Muller), as weights are initialised.
fn normals(seed: u64, n: usize, std: f32) -> Vec<f32> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-12), rng.random());
            std * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// AdamW's moments after `steps` steps of N(0, 1e-3) gradients (beta 0.9 / 0.95).
fn adam_moments(seed: u64, n: usize, steps: u32) -> (Vec<f32>, Vec<f32>) {
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    for s in 0..steps {
        let g = normals(seed ^ ((u64::from(s) + 1) * 0x9E37), n, 1e-3);
        for ((m, v), g) in m.iter_mut().zip(v.iter_mut()).zip(g) {
            *m = 0.9 * *m + 0.1 * g;
            *v = 0.95 * *v + 0.05 * g * g;
        }
    }
    (m, v)
}

/// The generated data kinds: (name, bytes, ZipNN's dtype for them where it takes them).
fn kinds(o: &CodecOpts) -> Vec<(String, Vec<u8>, Option<&'static str>)> {
    let len = o.size as usize;
    let n32 = len / 4;
    let fp32 = normals(o.seed, n32, 0.02);
    let bf16: Vec<u8> = normals(o.seed + 1, len / 2, 0.02)
        .iter()
        .flat_map(|f| {
            let b = f.to_le_bytes();
            [b[2], b[3]]
        })
        .collect();
    let (m, v) = adam_moments(o.seed + 2, n32 / 3, 3);
    // A GPT-2-like checkpoint: weights, then the two AdamW moments, a third each.
    let mut gpt2 = bytes_of(&fp32[..n32 / 3]);
    gpt2.extend(bytes_of(&m));
    gpt2.extend(bytes_of(&v));
    let text: Vec<u8> = (0..)
        .flat_map(|i: u64| {
            format!(
                "step {i} loss {:.5} lr {:.3e} grad_norm {:.4}\n",
                2.0 / (1.0 + i as f64 * 1e-3),
                3e-4 * (1.0 - i as f64 / 1e7),
                1.0 + (i % 97) as f64 * 0.01
            )
            .into_bytes()
        })
        .take(len)
        .collect();
    // Arrays whose 8-byte elements end in zero bytes: LZ4 takes a short match about every
    // 8 bytes of them (the default policy shuffles such chunks first, `codec::encode`).
    let fp32_as_fp64: Vec<u8> = normals(o.seed + 3, len / 8, 1.0)
        .iter()
        .flat_map(|&f| f64::from(f).to_le_bytes())
        .collect();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(o.seed + 4);
    let indices: Vec<u8> = (0..len / 8)
        .flat_map(|_| rng.random_range(0i64..50_000).to_le_bytes())
        .collect();
    let spec = data::RandomSpec::new(o.seed);
    let (f32s, bf16s) = (Some("float32"), Some("bfloat16"));
    vec![
        ("bf16 weights N(0,0.02)".into(), bf16, bf16s),
        ("fp32 weights N(0,0.02)".into(), bytes_of(&fp32), f32s),
        ("AdamW exp_avg".into(), bytes_of(&m), f32s),
        ("AdamW exp_avg_sq".into(), bytes_of(&v), f32s),
        ("GPT-2-like fp32 + AdamW".into(), gpt2, f32s),
        (
            "fp64 field (bench data)".into(),
            data::field(o.seed, len),
            None,
        ),
        (
            "dense fp32 (bench data)".into(),
            data::dense(o.seed, len),
            f32s,
        ),
        ("fp32 values as fp64 N(0,1)".into(), fp32_as_fp64, None),
        ("int64 indices 0..50000".into(), indices, None),
        ("text log".into(), text, None),
        ("zeros".into(), vec![0u8; len], None),
        ("random".into(), spec.generate(len), None),
    ]
}

/// The bytes of a file to measure, and ZipNN's dtype for them: a `.safetensors` file's
/// tensor data (after its header, so ZipNN's byte groups line up with the elements; the
/// float codec needs no alignment), `bfloat16` where the name or the safetensors header
/// says bf16, `float32` otherwise.
fn file_data(path: &std::path::Path) -> Result<(Vec<u8>, &'static str), String> {
    let d = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = path.display().to_string().to_lowercase();
    if name.ends_with(".safetensors") && d.len() >= 8 {
        let header = u64::from_le_bytes(d[..8].try_into().expect("8 bytes")) as usize;
        if let Some(body) = d.get(8 + header..) {
            let h = String::from_utf8_lossy(&d[8..8 + header]);
            let dtype = if h.contains("\"BF16\"") {
                "bfloat16"
            } else {
                "float32"
            };
            return Ok((body.to_vec(), dtype));
        }
    }
    let dtype = if name.contains("bf16") || name.contains("bfloat16") {
        "bfloat16"
    } else {
        "float32"
    };
    Ok((d, dtype))
}

/// ZipNN on one data set: stored fraction, compress and decompress GiB/s (one thread, round
/// trip checked).
#[derive(Clone, Copy, Debug, serde::Deserialize)]
struct Zipnn {
    stored: f64,
    compress: f64,
    decompress: f64,
}

/// Runs ZipNN through `python` on `sets` ((file, dtype) pairs): its figures per file, or why
/// not (no interpreter, no `zipnn` module, a failed round trip).
fn zipnn(python: &str, sets: &[(std::path::PathBuf, &str)]) -> Result<Vec<Zipnn>, String> {
    const SCRIPT: &str = r#"
import json, sys, time, warnings
warnings.filterwarnings("ignore")
try:
    import zipnn
except ImportError as e:
    print(json.dumps({"error": f"no zipnn module ({e}): pip install zipnn"})); sys.exit(0)
out = []
for path, dtype in zip(sys.argv[1::2], sys.argv[2::2]):
    d = open(path, "rb").read()
    z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
    best_c = best_d = float("inf")
    for _ in range(3):
        buf = bytearray(d)  # ZipNN reorders its input in place
        t = time.perf_counter(); c = z.compress(buf); best_c = min(best_c, time.perf_counter() - t)
        t = time.perf_counter(); r = z.decompress(c); best_d = min(best_d, time.perf_counter() - t)
        if bytes(r) != d:
            print(json.dumps({"error": f"zipnn round trip of {path} differs"})); sys.exit(0)
    g = len(d) / 2**30
    out.append({"stored": len(c) / len(d), "compress": g / best_c, "decompress": g / best_d})
print(json.dumps({"sets": out}))
"#;
    let mut cmd = std::process::Command::new(python);
    cmd.arg("-c").arg(SCRIPT);
    for (p, dtype) in sets {
        cmd.arg(p).arg(dtype);
    }
    let out = cmd
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| format!("{python} said {:?} ({e})", text.trim()))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(e.to_string());
    }
    serde_json::from_value(v["sets"].clone()).map_err(|e| format!("ZipNN's figures: {e}"))
}

struct Row {
    name: String,
    bytes: usize,
    lz4: f64,
    float: f64,
    zstd1: f64,
    float_chunks: f64,
    enc_lz4: f64,
    /// Under `Lz4Plain` (LZ4 or raw, never shuffled: the default before storm chunks were).
    lz4_plain: f64,
    enc_lz4_plain: f64,
    /// Chunks the default policy byte-shuffled, and decode of its output (all chunks).
    shuffled_chunks: f64,
    dec_lz4: f64,
    enc_float: f64,
    dec_float: f64,
    /// The content-defined cutter alone (FastCDC v2020, the crate's own loop).
    cut: f64,
    /// The engine's cutter over the same bytes (same cuts, checked), with the search it chose
    /// for this CPU (`ckptfs_engine::write::gear_search`).
    cut_engine: f64,
    /// BLAKE3 of every chunk, as the store names chunks.
    hash: f64,
    /// ZipNN on the same bytes, where it takes them and ran.
    zipnn: Option<Zipnn>,
}

/// Timed passes of each codec over the data; the fastest counts (see the module doc).
const PASSES: usize = 3;

/// Runs `f` `PASSES` times, dropping each pass's output before the next: the last output
/// and the shortest time in seconds.
fn best_of<T>(mut f: impl FnMut() -> T) -> (T, f64) {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..PASSES {
        drop(out.take());
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    (out.expect("PASSES > 0"), best)
}

fn gib_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / (1u64 << 30) as f64
}

/// `cuts` encoded under `policy` as a store worker encodes them: in batches of
/// `BATCH_BYTES`, each chunk after the first of a batch with the streak of the one before.
fn in_batches(cuts: &[&[u8]], policy: Policy) -> Vec<(Codec, Option<Vec<u8>>)> {
    let mut out = Vec::with_capacity(cuts.len());
    let (mut streak, mut batch) = (codec::Streak::default(), 0);
    for c in cuts {
        out.push(codec::encode_after(c, policy, &mut streak));
        batch += c.len();
        if batch >= ckptfs_engine::store::BATCH_BYTES {
            (streak, batch) = (codec::Streak::default(), 0);
        }
    }
    out
}

fn measure(name: &str, d: &[u8], avg: usize) -> Result<Row, String> {
    let t = Instant::now();
    let cuts: Vec<&[u8]> = fastcdc::v2020::FastCDC::new(d, avg / 4, avg, avg * 4)
        .map(|c| &d[c.offset..c.offset + c.length])
        .collect();
    let cut = gib_s(d.len(), t.elapsed().as_secs_f64());
    let params = ckptfs_engine::format::ChunkParams::from_avg(avg as u32)
        .map_err(|e| format!("--chunk-size: {e}"))?;
    let t = Instant::now();
    let engine = ckptfs_engine::write::gear_cut_lengths(params, d);
    let cut_engine = gib_s(d.len(), t.elapsed().as_secs_f64());
    if !engine.iter().copied().eq(cuts.iter().map(|c| c.len())) {
        return Err(format!(
            "{name}: the engine's cuts ({}) differ from FastCDC's ({})",
            ckptfs_engine::write::gear_search().name,
            cuts.len()
        ));
    }
    let t = Instant::now();
    let fold = cuts
        .iter()
        .fold(0u8, |a, c| a ^ blake3::hash(c).as_bytes()[0]);
    let hash = gib_s(d.len(), t.elapsed().as_secs_f64());
    std::hint::black_box(fold);
    let stored = |enc: &[(Codec, Option<Vec<u8>>)]| -> usize {
        enc.iter()
            .zip(&cuts)
            .map(|((_, s), c)| s.as_ref().map_or(c.len(), Vec::len))
            .sum()
    };
    // As the store encodes: in worker batches of consecutive chunks, where a storm array's
    // chunks after the first skip the probes (`codec::Streak`).
    let (lz4, enc_lz4) = best_of(|| in_batches(&cuts, Policy::Lz4));
    let (plain, enc_lz4_plain) = best_of(|| {
        cuts.iter()
            .map(|c| codec::encode(c, Policy::Lz4Plain))
            .collect::<Vec<_>>()
    });
    let shuffled_chunks = lz4
        .iter()
        .filter(|(c, _)| matches!(c, Codec::Shuffle4Lz4 | Codec::Shuffle8Lz4))
        .count();
    // Decode speed of the chunks the default policy compressed (raw ones need none).
    let (decoded, secs) = best_of(|| {
        let mut decoded = 0usize;
        for ((c, s), raw) in lz4.iter().zip(&cuts) {
            if let Some(s) = s {
                decoded += codec::decode_slice(*c, s, raw.len())
                    .expect("decodes")
                    .len();
            }
        }
        decoded
    });
    let dec_lz4 = if decoded == 0 {
        f64::NAN
    } else {
        gib_s(decoded, secs)
    };
    // As the store encodes, in worker batches (a tensor's chunks after the first keep its
    // transform, `codec::Streak`).
    let (fl, enc_float) = best_of(|| in_batches(&cuts, Policy::Float));
    let float_chunks = fl
        .iter()
        .filter(|(c, _)| matches!(c, Codec::Float(_)))
        .count();
    // Decode speed of the chunks the float codec took (the others decode as under lz4).
    let taken: Vec<(Codec, &Vec<u8>, usize)> = fl
        .iter()
        .zip(&cuts)
        .filter_map(|((c, s), raw)| match (c, s) {
            (Codec::Float(_), Some(s)) => Some((*c, s, raw.len())),
            _ => None,
        })
        .collect();
    let (decoded, secs) = best_of(|| {
        let mut decoded = 0usize;
        for (c, s, raw_len) in &taken {
            let out = codec::decode_slice(*c, s, *raw_len).expect("decodes");
            decoded += out.len();
        }
        decoded
    });
    let dec_float = gib_s(decoded, secs);
    let zstd1: usize = cuts
        .iter()
        .map(|c| zstd::bulk::compress(c, 1).map_or(c.len(), |z| z.len().min(c.len())))
        .sum();
    Ok(Row {
        name: name.to_string(),
        bytes: d.len(),
        lz4: stored(&lz4) as f64 / d.len() as f64,
        float: stored(&fl) as f64 / d.len() as f64,
        zstd1: zstd1 as f64 / d.len() as f64,
        float_chunks: float_chunks as f64 / cuts.len().max(1) as f64,
        enc_lz4: gib_s(d.len(), enc_lz4),
        lz4_plain: stored(&plain) as f64 / d.len() as f64,
        enc_lz4_plain: gib_s(d.len(), enc_lz4_plain),
        shuffled_chunks: shuffled_chunks as f64 / cuts.len().max(1) as f64,
        dec_lz4,
        enc_float: gib_s(d.len(), enc_float),
        dec_float: if taken.is_empty() {
            f64::NAN
        } else {
            dec_float
        },
        cut,
        cut_engine,
        hash,
        zipnn: None,
    })
}

pub fn run(o: &CodecOpts) -> Result<(), String> {
    // The daemon's malloc settings (before any thread of this run starts), so the codecs'
    // buffers come and go as they do in the daemon.
    ckptfs_engine::heap::tune();
    let avg = o.chunk_size as usize;
    // Chosen (and measured) once per process: before the first timed cut, not inside it.
    let search = ckptfs_engine::write::gear_search();
    let mut rows = Vec::new();
    // The data sets ZipNN takes, written out for it: (row, file, dtype).
    let dir = std::env::temp_dir().join(format!("ckptfs-bench-codec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut sets = Vec::new();
    let mut add = |rows: &mut Vec<Row>, name: &str, d: &[u8], dtype: Option<&'static str>| {
        rows.push(measure(name, d, avg)?);
        if let Some(dtype) = dtype {
            let p = dir.join(format!("set-{}", rows.len()));
            std::fs::write(&p, d).map_err(|e| format!("{}: {e}", p.display()))?;
            sets.push((rows.len() - 1, p, dtype));
        }
        Ok::<(), String>(())
    };
    for (name, d, dtype) in kinds(o) {
        add(&mut rows, &name, &d, dtype)?;
    }
    for f in &o.files {
        let (d, dtype) = file_data(f)?;
        add(&mut rows, &f.display().to_string(), &d, Some(dtype))?;
    }
    let files: Vec<_> = sets.iter().map(|(_, p, t)| (p.clone(), *t)).collect();
    let zipnn_note = match zipnn(&o.python, &files) {
        Ok(z) => {
            for ((row, _, _), z) in sets.iter().zip(z) {
                rows[*row].zipnn = Some(z);
            }
            "ZipNN: the `zipnn` package through Python, one thread, each data set whole (its \
             256 KiB pieces), round trip checked, in this run"
                .to_string()
        }
        Err(why) => format!("ZipNN: not measured: {why}"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "chunk codecs, one core, {} KiB average chunks (stored / raw; GiB/s of raw bytes, \
         the best of {PASSES} passes); the engine's cutter searches with: {} ({})",
        avg >> 10,
        search.name,
        search.measured
    );
    println!(
        "{:<34} {:>8} {:>7} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7} {:>10} {:>7}",
        "data",
        "MiB",
        "float",
        "zipnn",
        "enc float",
        "dec float",
        "enc zipnn",
        "dec zipnn",
        "s/GiB+",
        "lz4",
        "lz4 shuf",
        "lz4-plain",
        "zstd-1",
        "float %ch",
        "enc lz4",
        "enc plain",
        "dec lz4",
        "cut",
        "cut ckptfs",
        "blake3"
    );
    for r in &rows {
        let z = |f: fn(&Zipnn) -> f64, digits: usize| {
            r.zipnn
                .as_ref()
                .map_or("-".to_string(), |z| format!("{:.*}", digits, f(z)))
        };
        println!(
            "{:<34} {:>8} {:>7.4} {:>7} {:>10.2} {:>10.2} {:>9} {:>9} {:>+9.3} {:>9.3} {:>8.0}% {:>9.3} {:>7.3} {:>8.0}% {:>9.2} {:>9.2} {:>9.2} {:>7.2} {:>10.2} {:>7.2}",
            r.name,
            r.bytes >> 20,
            r.float,
            z(|z| z.stored, 4),
            r.enc_float,
            r.dec_float,
            z(|z| z.compress, 2),
            z(|z| z.decompress, 2),
            1.0 / r.enc_float - 1.0 / r.enc_lz4,
            r.lz4,
            r.shuffled_chunks * 100.0,
            r.lz4_plain,
            r.zstd1,
            r.float_chunks * 100.0,
            r.enc_lz4,
            r.enc_lz4_plain,
            r.dec_lz4,
            r.cut,
            r.cut_engine,
            r.hash
        );
    }
    println!("{zipnn_note}");
    println!(
        "float: `--codec float` (the float codec where it beats what lz4 stores, else \
         that), encoded as the store does, in worker batches of 512 KiB where a \
         tensor's chunks after the first keep its transform; zipnn, enc/dec zipnn: ZipNN's \
         stored fraction and GiB/s on the same bytes (`-`: data it does not take, or not \
         run); s/GiB+: CPU seconds per GiB that encoding under float costs more than under \
         lz4; lz4: the default policy (LZ4 where it pays, else raw; byte-shuffled first where LZ4 \
         would take a short match every few bytes), encoded as the store does, in worker \
         batches of 512 KiB where a storm array's chunks after the first skip the probes; lz4 \
         shuf: chunks it shuffled; lz4-plain: \
         LZ4 or raw, never shuffled (the default of earlier builds); dec lz4: decode of the \
         chunks lz4 compressed; zstd-1: zstd level 1 of each plain chunk, for \
         reference; float %ch: chunks the float codec took; dec float: decode of those chunks; \
         cut: FastCDC v2020 alone (the crate's loop); cut ckptfs: the engine's cutter, same \
         cuts (checked): the same loop, or eight lanes at once with AVX-512; blake3: \
         BLAKE3 of every chunk. Every byte written passes the cutter or a confirming hash, and \
         new bytes both: with the FUSE transport's cost (`limits`) these are the floor of \
         the daemon's CPU per GiB on this machine"
    );
    if o.json {
        let j: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "data": r.name, "bytes": r.bytes, "lz4": r.lz4, "float": r.float,
                    "zstd1": r.zstd1, "float_chunks": r.float_chunks,
                    "encode_lz4_gib_s": r.enc_lz4, "lz4_shuffled_chunks": r.shuffled_chunks,
                    "lz4_plain": r.lz4_plain, "encode_lz4_plain_gib_s": r.enc_lz4_plain,
                    "decode_lz4_gib_s": r.dec_lz4, "encode_float_gib_s": r.enc_float,
                    "decode_float_gib_s": r.dec_float,
                    "zipnn": r.zipnn.map(|z| serde_json::json!({
                        "stored": z.stored, "compress_gib_s": z.compress,
                        "decompress_gib_s": z.decompress,
                    })),
                    "cut_gib_s": r.cut, "cut_engine_gib_s": r.cut_engine,
                    "blake3_gib_s": r.hash,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(j));
    }
    Ok(())
}
