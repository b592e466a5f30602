//! Checkpoint-like data, deterministic from a seed, generated in memory before anything is
//! timed.
//!
//! Four kinds: `random` (incompressible), `field` (a smooth float64 simulation field with empty
//! regions, so LZ4 and zero-chunk dedup find something), `dense` (float32 weights; its next
//! revision nudges every value) and `finetune` (the same weights; its next revision changes a
//! few whole tensors, about 5% of the bytes).

use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

/// Unit of the block-addressed random data and of the "5% of the blocks changed" revisions: the
/// 64-KiB-aligned blocks of the issue.
pub const BLOCK: usize = 64 << 10;

/// splitmix64's finaliser: a cheap, well-mixed hash of a u64.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derives an independent seed from a seed and a label (rep number, process index, block...).
pub fn mix(seed: u64, label: u64) -> u64 {
    splitmix64(seed ^ splitmix64(label))
}

/// A label for a name, so seeds can be derived from scenario names.
pub fn name_label(name: &str) -> u64 {
    // FNV-1a: stable across builds, unlike std's hasher.
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Runs `f(piece_index, piece)` over `piece`-byte pieces of `buf`, spread over all cores:
/// generating a GiB single-threaded would make the untimed part of a run needlessly long.
pub fn par_pieces(buf: &mut [u8], piece: usize, f: impl Fn(usize, &mut [u8]) + Sync) {
    let pieces = buf.len().div_ceil(piece);
    let per_thread = pieces.div_ceil(threads()).max(1);
    std::thread::scope(|s| {
        for (t, band) in buf.chunks_mut(per_thread * piece).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (j, p) in band.chunks_mut(piece).enumerate() {
                    f(t * per_thread + j, p);
                }
            });
        }
    });
}

/// Random bytes addressed by 64-KiB block: block `b` of a file is a function of (seed, b)
/// only, so each writer process generates exactly its own part of a shared file, readers can
/// check theirs, and the parent can hash the whole expected file without holding it.
///
/// `changed`: a next revision, where each block is replaced by new random bytes with
/// probability `per10000`/10000, decided per block from its own seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RandomSpec {
    pub seed: u64,
    pub changed: Option<(u64, u32)>,
    /// Compressible float64 blocks (`field_block`) instead of random bytes.
    pub field: bool,
    /// fp32 tensor blocks (`tensor_block`) instead of random bytes.
    pub tensor: bool,
}

impl RandomSpec {
    pub fn new(seed: u64) -> RandomSpec {
        RandomSpec {
            seed,
            changed: None,
            field: false,
            tensor: false,
        }
    }

    /// `new`, with fp32 tensor blocks (`tensor_block`).
    pub fn tensor(seed: u64) -> RandomSpec {
        RandomSpec {
            tensor: true,
            ..RandomSpec::new(seed)
        }
    }

    /// `new`, with compressible float64 blocks (`field_block`).
    pub fn field(seed: u64) -> RandomSpec {
        RandomSpec {
            field: true,
            ..RandomSpec::new(seed)
        }
    }

    /// The next revision of `self` with `per10000`/10000 of the blocks changed.
    pub fn next(self, seed: u64, per10000: u32) -> RandomSpec {
        RandomSpec {
            changed: Some((seed, per10000)),
            ..self
        }
    }

    fn block_seed(&self, b: u64) -> u64 {
        if let Some((s, p)) = self.changed {
            if mix(s, b) % 10_000 < u64::from(p) {
                return mix(s ^ 0x5eed_5eed, b);
            }
        }
        mix(self.seed, b)
    }

    /// Fills `buf` with the bytes at file offset `offset`.
    pub fn fill(&self, offset: u64, buf: &mut [u8]) {
        let mut tmp: Vec<u8> = Vec::new();
        let mut pos = 0;
        while pos < buf.len() {
            let abs = offset + pos as u64;
            let b = abs / BLOCK as u64;
            let within = (abs % BLOCK as u64) as usize;
            let n = (BLOCK - within).min(buf.len() - pos);
            let seed = self.block_seed(b);
            if within == 0 && n == BLOCK {
                self.block(seed, &mut buf[pos..pos + n]);
            } else {
                tmp.resize(BLOCK, 0);
                self.block(seed, &mut tmp);
                buf[pos..pos + n].copy_from_slice(&tmp[within..within + n]);
            }
            pos += n;
        }
    }

    /// One whole block's bytes from its seed.
    fn block(&self, seed: u64, out: &mut [u8]) {
        if self.field {
            field_block(seed, out)
        } else if self.tensor {
            tensor_block(seed, out)
        } else {
            SmallRng::seed_from_u64(seed).fill_bytes(out)
        }
    }

    /// `fill` on all cores.
    pub fn fill_par(&self, offset: u64, buf: &mut [u8]) {
        if !offset.is_multiple_of(BLOCK as u64) {
            return self.fill(offset, buf);
        }
        par_pieces(buf, BLOCK, |i, p| self.fill(offset + (i * BLOCK) as u64, p));
    }

    pub fn generate(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill_par(0, &mut v);
        v
    }

    /// blake3 of bytes [0, len), generated piece by piece.
    pub fn hash(&self, len: u64) -> blake3::Hash {
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; 16 << 20];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            self.fill_par(off, &mut buf[..n]);
            h.update(&buf[..n]);
            off += n as u64;
        }
        h.finalize()
    }
}

/// A header of plain text in front of the numbers, as real checkpoint formats have (safetensors'
/// JSON index, a pickle, HDF5 metadata). Its odd length keeps tensor boundaries off chunk
/// boundaries, so dedup has to find them by content.
fn header(len: usize, describe: &str) -> Vec<u8> {
    let mut h = Vec::with_capacity(len);
    let mut i = 0;
    while h.len() < len {
        h.extend_from_slice(
            format!(
                "{{\"tensor_{i:05}\": {{\"dtype\": \"{describe}\", \"offsets\": [{}, {}]}}}}\n",
                i * 4096,
                (i + 1) * 4096
            )
            .as_bytes(),
        );
        i += 1;
    }
    h.truncate(len);
    h
}

// ---- field ----

const FIELD_HEADER: usize = 512;
const FIELD_WIDTH: usize = 4096;
const FIELD_STEPS: usize = 4;
const DIFFUSION: f64 = 0.2;

/// One explicit step of 2-D diffusion (5-point stencil), zero on the border.
fn diffuse(u: &[f64], out: &mut [f64], w: usize, h: usize) {
    let rows_per = h.div_ceil(threads()).max(1);
    std::thread::scope(|s| {
        for (t, band) in out.chunks_mut(rows_per * w).enumerate() {
            s.spawn(move || {
                for (dy, row) in band.chunks_mut(w).enumerate() {
                    let y = t * rows_per + dy;
                    if y == 0 || y == h - 1 {
                        row.fill(0.0);
                        continue;
                    }
                    let up = &u[(y - 1) * w..y * w];
                    let c = &u[y * w..(y + 1) * w];
                    let down = &u[(y + 1) * w..(y + 2) * w];
                    row[0] = 0.0;
                    row[w - 1] = 0.0;
                    for x in 1..w - 1 {
                        row[x] =
                            c[x] + DIFFUSION * (up[x] + down[x] + c[x - 1] + c[x + 1] - 4.0 * c[x]);
                    }
                }
            });
        }
    });
}

/// A 64-KiB block of float64 values like a simulation field's: one Gaussian bump of random
/// height, place and width over a zero background, so about half the values are non-zero
/// (their mantissas barely compress, the zeros do): LZ4 stores such blocks at about half,
/// as it does `field`. Block-addressable, so writer processes generate their own parts.
pub fn field_block(seed: u64, out: &mut [u8]) {
    let mut rng = SmallRng::seed_from_u64(mix(seed, name_label("field block")));
    let n = out.len() / 8;
    let amp = 1.0 + 299.0 * rng.random::<f64>();
    let center = rng.random::<f64>() * n as f64;
    // exp(-x^2) falls below f64's smallest normal past |x| of about 26.6, so a bump of
    // width w spans 53.2 w values: n / 53.2 * (0.25..0.65) leaves 25-65% of the block
    // non-zero (less where the bump hangs over the block's edge).
    let width = n as f64 / 53.2 * (0.25 + 0.4 * rng.random::<f64>());
    for (i, c) in out.chunks_exact_mut(8).enumerate() {
        let x = (i as f64 - center) / width;
        let v = amp * (-x * x).exp();
        let v = if v < f64::MIN_POSITIVE { 0.0 } else { v };
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// A 64-KiB block of fp32 weights as a model's: about N(0, 0.02) (the sum of four uniforms,
/// whose exponents spread as a normal's do), so LZ4 stores them raw and the float codec at
/// about 0.83. Block-addressable, so writer processes generate their own parts.
pub fn tensor_block(seed: u64, out: &mut [u8]) {
    let mut rng = SmallRng::seed_from_u64(mix(seed, name_label("tensor block")));
    for c in out.chunks_exact_mut(4) {
        let s: f32 = (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0;
        c.copy_from_slice(&(0.035 * s).to_le_bytes());
    }
}

/// A float64 field after a few diffusion steps from Gaussian blobs over a zero background plus
/// a noisy band: smooth, partly empty. The empty part compresses and dedups (zero chunks); the
/// blobs' mantissas barely compress, as with real simulation output.
pub fn field(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let hdr = FIELD_HEADER.min(len);
    let w = FIELD_WIDTH;
    let h = (len - hdr) / (8 * w);
    let text = header(
        hdr,
        &format!("F64 field {w}x{h}, {FIELD_STEPS} diffusion steps"),
    );
    out[..hdr].copy_from_slice(&text);
    if h < 3 {
        return out;
    }
    let mut rng = SmallRng::seed_from_u64(mix(seed, name_label("field")));
    let mut u = vec![0f64; w * h];
    let m = w.min(h) as f64;
    let cells = (w * h) as f64;
    let mut covered = 0.0;
    // Blobs until their boxes add up to half the grid (overlaps leave roughly 40% non-zero).
    while covered < 0.5 * cells {
        let sigma = (m * (0.02 + 0.08 * rng.random::<f64>())).max(1.0);
        let cx = rng.random::<f64>() * w as f64;
        let cy = rng.random::<f64>() * h as f64;
        let amp = 1.0 + 299.0 * rng.random::<f64>();
        let r = 3.0 * sigma;
        let x0 = (cx - r).max(0.0) as usize;
        let x1 = ((cx + r) as usize).min(w);
        let y0 = (cy - r).max(0.0) as usize;
        let y1 = ((cy + r) as usize).min(h);
        if x1 <= x0 || y1 <= y0 {
            continue;
        }
        covered += ((x1 - x0) * (y1 - y0)) as f64;
        let inv = 1.0 / (2.0 * sigma * sigma);
        for y in y0..y1 {
            let dy = y as f64 - cy;
            for (x, v) in u[y * w + x0..y * w + x1].iter_mut().enumerate() {
                let dx = (x0 + x) as f64 - cx;
                *v += amp * (-(dx * dx + dy * dy) * inv).exp();
            }
        }
    }
    // A turbulent band: small noise everywhere in 10% of the rows.
    let band = (h / 10).max(1);
    let y0 = rng.random_range(0..=h - band);
    for v in &mut u[y0 * w..(y0 + band) * w] {
        *v += 0.01 * (rng.random::<f64>() - 0.5);
    }
    let mut next = vec![0f64; w * h];
    for _ in 0..FIELD_STEPS {
        diffuse(&u, &mut next, w, h);
        std::mem::swap(&mut u, &mut next);
    }
    drop(next);
    let body = &mut out[hdr..hdr + w * h * 8];
    par_pieces(body, 8 * w * 64, |i, p| {
        let vals = &u[i * w * 64..];
        for (b, v) in p.chunks_exact_mut(8).zip(vals) {
            b.copy_from_slice(&v.to_le_bytes());
        }
    });
    out
}

// ---- dense / finetune ----

const DENSE_HEADER: usize = 4321;
/// Tensors the weights are split into; a fine-tuning step changes `FINETUNE_TENSORS` of them.
const TENSORS: usize = 64;
const FINETUNE_TENSORS: usize = 3;
const WEIGHT_STD: f32 = 0.02;
/// Size of an update relative to the weights (an optimizer step).
const UPDATE_STD: f32 = 2e-5;

/// Roughly standard normal from 64 random bits (Irwin-Hall of four 16-bit uniforms).
fn normalish(r: u64) -> f32 {
    let s = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    // Mean 4 * 65535/2, standard deviation 65536 * sqrt(4/12).
    (s as f32 - 131_070.0) / 37_837.2
}

/// Float32 weights, roughly normal with a typical initialisation scale, after a text header.
pub fn dense(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let hdr = DENSE_HEADER.min(len);
    out[..hdr].copy_from_slice(&header(hdr, "F32"));
    par_pieces(&mut out[hdr..], BLOCK, |i, p| {
        let mut rng = SmallRng::seed_from_u64(mix(seed, i as u64));
        for b in p.chunks_exact_mut(4) {
            b.copy_from_slice(&(WEIGHT_STD * normalish(rng.next_u64())).to_le_bytes());
        }
    });
    out
}

/// Adds a small update to every float32 in `bytes` (whole 4-byte values only).
fn nudge(bytes: &mut [u8], seed: u64) {
    par_pieces(bytes, BLOCK, |i, p| {
        let mut rng = SmallRng::seed_from_u64(mix(seed, i as u64));
        for b in p.chunks_exact_mut(4) {
            let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let v = v + UPDATE_STD * normalish(rng.next_u64());
            b.copy_from_slice(&v.to_le_bytes());
        }
    });
}

/// The next revision of `dense` weights after full training: every value changed slightly, so
/// no chunk repeats.
pub fn dense_next(base: &[u8], seed: u64) -> Vec<u8> {
    let mut out = base.to_vec();
    let hdr = DENSE_HEADER.min(out.len());
    nudge(&mut out[hdr..], seed);
    out
}

/// The next revision after fine-tuning: `FINETUNE_TENSORS` of `TENSORS` tensors (about 5% of the
/// bytes, each a contiguous run) updated, the rest frozen.
pub fn finetune_next(base: &[u8], seed: u64) -> Vec<u8> {
    let mut out = base.to_vec();
    let hdr = DENSE_HEADER.min(out.len());
    let floats = (out.len() - hdr) / 4;
    let mut rng = SmallRng::seed_from_u64(mix(seed, name_label("finetune")));
    let mut picked: Vec<usize> = Vec::new();
    while picked.len() < FINETUNE_TENSORS.min(TENSORS) {
        let t = rng.random_range(0..TENSORS);
        if !picked.contains(&t) {
            picked.push(t);
        }
    }
    for t in picked {
        let a = hdr + 4 * (t * floats / TENSORS);
        let b = hdr + 4 * ((t + 1) * floats / TENSORS);
        nudge(&mut out[a..b], mix(seed, t as u64));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field blocks are about half non-zero and compress to about half with LZ4, every
    /// block is generated from its own seed alone, and a next revision keeps the kind.
    #[test]
    fn field_blocks_compress_to_about_half_and_are_addressable() {
        let spec = RandomSpec::field(3);
        let data = spec.generate(64 * BLOCK);
        let packed: usize = data
            .chunks(BLOCK)
            .map(|b| lz4_flex::block::compress(b).len())
            .sum();
        let ratio = packed as f64 / data.len() as f64;
        assert!((0.3..0.75).contains(&ratio), "LZ4 ratio {ratio}");
        let mut part = vec![0u8; 3 * BLOCK + 100];
        spec.fill(5 * BLOCK as u64 + 7, &mut part);
        assert_eq!(part, data[5 * BLOCK + 7..8 * BLOCK + 107]);
        assert!(spec.next(9, 500).field);
    }

    #[test]
    fn random_is_block_addressed() {
        let spec = RandomSpec::new(7);
        let all = spec.generate(5 * BLOCK + 123);
        let mut part = vec![0u8; 2 * BLOCK + 17];
        spec.fill(BLOCK as u64 + 5, &mut part);
        assert_eq!(part[..], all[BLOCK + 5..3 * BLOCK + 22]);
        assert_eq!(spec.hash(all.len() as u64), blake3::hash(&all));
    }

    #[test]
    fn next_changes_about_five_percent_of_blocks() {
        let base = RandomSpec::new(1);
        let next = base.next(2, 500);
        let n = 4000;
        let a = base.generate(n * BLOCK);
        let b = next.generate(n * BLOCK);
        let changed = a
            .chunks(BLOCK)
            .zip(b.chunks(BLOCK))
            .filter(|(x, y)| x != y)
            .count();
        assert!(
            (150..250).contains(&changed),
            "{changed} of {n} blocks changed"
        );
    }

    #[test]
    fn finetune_changes_a_few_tensors_dense_changes_all() {
        let base = dense(3, 8 << 20);
        let ft = finetune_next(&base, 4);
        let dn = dense_next(&base, 5);
        let diff = |x: &[u8]| {
            x.chunks(4096)
                .zip(base.chunks(4096))
                .filter(|(a, b)| a != b)
                .count() as f64
                / (base.len() / 4096) as f64
        };
        let f = diff(&ft);
        assert!((0.03..0.07).contains(&f), "finetune changed {f}");
        assert!(diff(&dn) > 0.99);
    }

    #[test]
    fn field_is_deterministic_and_partly_zero() {
        let a = field(9, 4 << 20);
        assert_eq!(a, field(9, 4 << 20));
        assert_ne!(a, field(10, 4 << 20));
        let zero_pages = a[512..]
            .chunks(4096)
            .filter(|c| c.iter().all(|&b| b == 0))
            .count();
        assert!(zero_pages > 0, "no empty region");
    }
}
