//! `ckptfs-bench codec`: the chunk codecs side by side on seeded data and on files, no mount:
//! stored fraction under `lz4` (what a space stores by default), under `float`, and under
//! zstd level 1 of the plain chunk for reference, with encode and decode GiB/s on one core.
//!
//! Chunks are cut as a space cuts them (FastCDC, `--chunk-size` average), so float arrays
//! start at any offset inside a chunk, as they do in real checkpoints.

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

/// The generated data kinds: (name, bytes).
fn kinds(o: &CodecOpts) -> Vec<(String, Vec<u8>)> {
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
    vec![
        ("bf16 weights N(0,0.02)".into(), bf16),
        ("fp32 weights N(0,0.02)".into(), bytes_of(&fp32)),
        ("AdamW exp_avg_sq".into(), bytes_of(&v)),
        ("GPT-2-like fp32 + AdamW".into(), gpt2),
        ("fp64 field (bench data)".into(), data::field(o.seed, len)),
        ("dense fp32 (bench data)".into(), data::dense(o.seed, len)),
        ("fp32 values as fp64 N(0,1)".into(), fp32_as_fp64),
        ("int64 indices 0..50000".into(), indices),
        ("text log".into(), text),
        ("zeros".into(), vec![0u8; len]),
        ("random".into(), spec.generate(len)),
    ]
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
    /// for this CPU (`ckptfs_engine::filemap::gear_search`).
    cut_engine: f64,
    /// BLAKE3 of every chunk, as the store names chunks.
    hash: f64,
}

fn gib_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / (1u64 << 30) as f64
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
    let engine = ckptfs_engine::filemap::gear_cut_lengths(params, d);
    let cut_engine = gib_s(d.len(), t.elapsed().as_secs_f64());
    if !engine.iter().copied().eq(cuts.iter().map(|c| c.len())) {
        return Err(format!(
            "{name}: the engine's cuts ({}) differ from FastCDC's ({})",
            ckptfs_engine::filemap::gear_search().name,
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
    let t = Instant::now();
    let mut lz4 = Vec::with_capacity(cuts.len());
    let (mut streak, mut batch) = (codec::Streak::default(), 0);
    for c in &cuts {
        lz4.push(codec::encode_after(c, Policy::Lz4, &mut streak));
        batch += c.len();
        if batch >= ckptfs_engine::store::BATCH_BYTES {
            (streak, batch) = (codec::Streak::default(), 0);
        }
    }
    let enc_lz4 = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let plain: Vec<_> = cuts
        .iter()
        .map(|c| codec::encode(c, Policy::Lz4Plain))
        .collect();
    let enc_lz4_plain = t.elapsed().as_secs_f64();
    let shuffled_chunks = lz4
        .iter()
        .filter(|(c, _)| matches!(c, Codec::Shuffle4Lz4 | Codec::Shuffle8Lz4))
        .count();
    // Decode speed of the chunks the default policy compressed (raw ones need none).
    let t = Instant::now();
    let mut decoded = 0usize;
    for ((c, s), raw) in lz4.iter().zip(&cuts) {
        if let Some(s) = s {
            decoded += codec::decode_slice(*c, s, raw.len())
                .expect("decodes")
                .len();
        }
    }
    let dec_lz4 = if decoded == 0 {
        f64::NAN
    } else {
        gib_s(decoded, t.elapsed().as_secs_f64())
    };
    let t = Instant::now();
    let fl: Vec<_> = cuts
        .iter()
        .map(|c| codec::encode(c, Policy::Float))
        .collect();
    let enc_float = t.elapsed().as_secs_f64();
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
    let t = Instant::now();
    let mut decoded = 0usize;
    for (c, s, raw_len) in &taken {
        let out = codec::decode_slice(*c, s, *raw_len).expect("decodes");
        decoded += out.len();
    }
    let dec_float = gib_s(decoded, t.elapsed().as_secs_f64());
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
    })
}

pub fn run(o: &CodecOpts) -> Result<(), String> {
    let avg = o.chunk_size as usize;
    // Chosen (and measured) once per process: before the first timed cut, not inside it.
    let search = ckptfs_engine::filemap::gear_search();
    let mut rows = Vec::new();
    for (name, d) in kinds(o) {
        rows.push(measure(&name, &d, avg)?);
    }
    for f in &o.files {
        let d = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        rows.push(measure(&f.display().to_string(), &d, avg)?);
    }
    println!(
        "chunk codecs, one core, {} KiB average chunks (stored / raw; GiB/s of raw bytes); \
         the engine's cutter searches with: {} ({})",
        avg >> 10,
        search.name,
        search.measured
    );
    println!(
        "{:<34} {:>8} {:>7} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>7} {:>10} {:>7}",
        "data",
        "MiB",
        "lz4",
        "lz4 shuf",
        "lz4-plain",
        "float",
        "zstd-1",
        "float %ch",
        "enc lz4",
        "enc plain",
        "dec lz4",
        "enc float",
        "dec float",
        "cut",
        "cut ckptfs",
        "blake3"
    );
    for r in &rows {
        println!(
            "{:<34} {:>8} {:>7.3} {:>8.0}% {:>9.3} {:>7.3} {:>7.3} {:>8.0}% {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>10.2} {:>7.2} {:>10.2} {:>7.2}",
            r.name,
            r.bytes >> 20,
            r.lz4,
            r.shuffled_chunks * 100.0,
            r.lz4_plain,
            r.float,
            r.zstd1,
            r.float_chunks * 100.0,
            r.enc_lz4,
            r.enc_lz4_plain,
            r.dec_lz4,
            r.enc_float,
            r.dec_float,
            r.cut,
            r.cut_engine,
            r.hash
        );
    }
    println!(
        "ZipNN (published, whole models, Huffman over byte groups after exponent extraction): \
         about 0.67 of bf16 models and 0.83 of fp32 models (a third and a sixth saved)"
    );
    println!(
        "lz4: the default policy (LZ4 where it pays, else raw; byte-shuffled first where LZ4 \
         would take a short match every few bytes), encoded as the store does, in worker \
         batches of 512 KiB where a storm array's chunks after the first skip the probes; lz4 \
         shuf: chunks it shuffled; lz4-plain: \
         LZ4 or raw, never shuffled (the default of earlier builds); dec lz4: decode of the \
         chunks the default policy compressed; float: `--codec float` (the \
         float codec where it beats LZ4); zstd-1: zstd level 1 of each plain chunk, for \
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
                    "cut_gib_s": r.cut, "cut_engine_gib_s": r.cut_engine,
                    "blake3_gib_s": r.hash,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(j));
    }
    Ok(())
}
