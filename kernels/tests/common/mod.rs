//! Test data shared by the emulation and GPU tests, generated from a seed.

#![allow(dead_code)] // each test binary uses its own subset

use ckptfs_kernels::Compressed;
use rand::{Rng, RngCore, SeedableRng};

pub const CHUNK: usize = 64 << 10;

pub fn rng(seed: u64) -> rand::rngs::SmallRng {
    rand::rngs::SmallRng::seed_from_u64(seed)
}

pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng(seed).fill_bytes(&mut v);
    v
}

/// A smooth float64 field (a simulation's state).
pub fn field(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut x = r.random::<f64>();
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x += (r.random::<f64>() - 0.5) * 1e-3;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// float32 weights quantized to a few levels, with many zeros.
pub fn weights(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut v = Vec::with_capacity(n + 4);
    while v.len() < n {
        let w: f32 = if r.random_bool(0.6) {
            0.0
        } else {
            (r.random_range(-8i32..8) as f32) * 0.125
        };
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Text-like data: repeated lines with changing numbers.
pub fn text(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut v = Vec::with_capacity(n + 80);
    let mut i = 0u64;
    while v.len() < n {
        let line = format!(
            "step {i:>8} loss {:.5} lr 3.0e-4 grad_norm {:.3}\n",
            r.random::<f64>() * 4.0,
            r.random::<f64>()
        );
        v.extend_from_slice(line.as_bytes());
        i += 1;
    }
    v.truncate(n);
    v
}

/// Synthetic data of a chosen structure: `mode` bits 1 = bursts of bytes below `alpha`, 2 =
/// copies of earlier bytes at offsets up to 70000 (some beyond LZ4's reach), 4 = runs of one
/// byte value; bytes below `alpha` fill the rest.
pub fn synthetic(n: usize, seed: u64, alpha: u8, mode: u32) -> Vec<u8> {
    let mut r = rng(seed);
    let mut v: Vec<u8> = Vec::with_capacity(n);
    while v.len() < n {
        match r.random_range(0..4) {
            0 if mode & 1 != 0 => {
                for _ in 0..r.random_range(1..40) {
                    v.push(r.random_range(0..=alpha));
                }
            }
            1 if !v.is_empty() && mode & 2 != 0 => {
                let off = r.random_range(1..=v.len().min(70_000));
                for _ in 0..r.random_range(1..300) {
                    v.push(v[v.len() - off]);
                }
            }
            2 if mode & 4 != 0 => {
                let b: u8 = r.random();
                v.extend(std::iter::repeat_n(b, r.random_range(1..500)));
            }
            _ => v.push(r.random_range(0..=alpha)),
        }
    }
    v.truncate(n);
    v
}

pub fn refs(chunks: &[Vec<u8>]) -> Vec<&[u8]> {
    chunks.iter().map(|c| c.as_slice()).collect()
}

/// Checks that every block decodes with lz4_flex to exactly its chunk and is smaller than it;
/// returns the stored bytes (raw chunks at full size).
pub fn check_blocks(what: &str, chunks: &[Vec<u8>], out: &Compressed) -> usize {
    assert_eq!(out.len(), chunks.len(), "{what}: one result per chunk");
    let mut stored = 0;
    for (i, c) in chunks.iter().enumerate() {
        match out.get(i) {
            Some(block) => {
                assert!(
                    block.len() < c.len(),
                    "{what}: chunk {i}: a block of {} bytes for {} bytes",
                    block.len(),
                    c.len()
                );
                let back = lz4_flex::block::decompress(block, c.len())
                    .unwrap_or_else(|e| panic!("{what}: chunk {i}: lz4_flex rejects it: {e}"));
                assert!(back == *c, "{what}: chunk {i} decodes to different bytes");
                stored += block.len();
            }
            None => stored += c.len(),
        }
    }
    stored
}

/// The float codec's test set: floats of every width with NaN, ±Inf, -0.0 and denormals,
/// integers, text, zeros, random bytes, a plane over one 128 KiB block, odd lengths and
/// tails, planes with bytes over 128 that only FSE-coded weights describe; each entry with
/// every transform, and each transform with every plane tried, none tried and the plane
/// mask `choose` gives. Returns (name, chunk, plan).
#[allow(dead_code)]
pub fn float_cases() -> Vec<(String, Vec<u8>, ckptfs_kernels::float::Plan)> {
    let mut rng = rng(31);
    let mut data: Vec<(String, Vec<u8>)> = Vec::new();
    let normal = |rng: &mut rand::rngs::SmallRng| -> f32 {
        (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0
    };
    let fp32: Vec<u8> = (0..20_000)
        .flat_map(|_| (0.03 * normal(&mut rng)).to_le_bytes())
        .collect();
    data.push((
        "bf16".into(),
        fp32.chunks(4).flat_map(|c| [c[2], c[3]]).collect(),
    ));
    data.push(("fp32".into(), fp32));
    data.push((
        "fp64".into(),
        (0..9000)
            .flat_map(|i| (300.0 * (i as f64 * 1e-3).cos()).to_le_bytes())
            .collect(),
    ));
    let specials: Vec<u8> = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        1e-40,
        -1e-44,
        f32::MAX,
    ]
    .iter()
    .cycle()
    .take(4099)
    .flat_map(|f| f.to_le_bytes())
    .chain([1, 2, 3])
    .collect();
    data.push(("fp32 specials, odd tail".into(), specials));
    // Weights cut where a store cuts them: the chunk ends inside an element, so under the
    // three-bit rotation the first byte of the lowest plane takes bits of a mantissa byte,
    // not the sign and exponent bits every other byte of that plane has.
    data.push((
        "fp32 N(0, 0.02), cut mid-element".into(),
        (0..20_000)
            .flat_map(|_| (0.02 * normal(&mut rng)).to_le_bytes())
            .take(80_001 - 2)
            .collect(),
    ));
    data.push((
        "fp64 specials".into(),
        [f64::NAN, f64::NEG_INFINITY, -0.0, 5e-324, 1e308]
            .iter()
            .cycle()
            .take(1001)
            .flat_map(|f| f.to_le_bytes())
            .collect(),
    ));
    data.push((
        "int32 indices".into(),
        (0..15_000u32)
            .flat_map(|i| (i * 7 % 5000).to_le_bytes())
            .collect(),
    ));
    data.push((
        "text".into(),
        b"epoch 3 step 1200 loss 2.3125\n"
            .iter()
            .cycle()
            .take(20_001)
            .copied()
            .collect(),
    ));
    data.push(("zeros".into(), vec![0u8; 70_000]));
    // Skewed bytes over more than one 128 KiB block per plane.
    data.push((
        "skewed, 300 KiB".into(),
        (0..307_203u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 29) as u8 * 9)
            .collect(),
    ));
    let mut random = vec![0u8; 33_333];
    rng.fill_bytes(&mut random);
    data.push(("random".into(), random));
    // Optimizer state: positive (the sign bit is 0: after rotation every low mantissa byte
    // is even) with many exact zeros, so every plane is skewed and has bytes over 128.
    data.push((
        "fp32 exp_avg_sq, zeros".into(),
        (0..24_001)
            .flat_map(|i| {
                let v = if i % 3 == 0 {
                    0.0
                } else {
                    1e-6 * normal(&mut rng).powi(2)
                };
                v.to_le_bytes()
            })
            .collect(),
    ));
    // A plane of all 256 byte values, skewed (a geometric-like spread).
    data.push((
        "skewed over all 256 values".into(),
        (0..50_000)
            .map(|_| {
                let r: u32 = rng.random();
                (r.trailing_zeros() * 16 + (r >> 28)).min(255) as u8 ^ 0x80
            })
            .collect(),
    ));
    for len in [0usize, 1, 3, 7, 63, 64, 65, 200] {
        let d: Vec<u8> = (0..len).map(|_| rng.random::<u8>() & 7).collect();
        data.push((format!("short {len}"), d));
    }
    use ckptfs_kernels::float::{Fixed, Plan};
    let mut out = Vec::new();
    for (name, d) in data {
        for t in ckptfs_kernels::float::Transform::all() {
            out.push((format!("{name} {t:?}"), d.clone(), Plan::every(t)));
            let none = Plan {
                transform: t,
                coded: 0,
                fixed: None,
            };
            out.push((format!("{name} {t:?} uncoded"), d.clone(), none));
            // Codes of one length for the lowest plane: with the bits it varies in (taken),
            // with the bits it varies in after its first byte (which a rotation fills from
            // the chunk's last byte: that byte then gets a block of its own), and with a mask
            // it does not vary in exactly (Huffman codes instead).
            let n = d.len() / usize::from(t.width);
            let plane0 = &ckptfs_kernels::float::forward(&d, t)[..n];
            let varying = |p: &[u8]| {
                let (and, or) = p.iter().fold((0xFFu8, 0u8), |(a, o), &b| (a & b, o | b));
                or & !and
            };
            let mut masks = vec![
                varying(plane0),
                varying(plane0.get(1..).unwrap_or(&[])),
                0x3C,
            ];
            masks.dedup();
            for mask in masks {
                if mask == 0 || mask == 0xFF {
                    continue;
                }
                let fixed = Plan {
                    fixed: Some(Fixed { plane: 0, mask }),
                    ..Plan::every(t)
                };
                out.push((format!("{name} {t:?} fixed {mask:#x}"), d.clone(), fixed));
            }
        }
        let (chosen, _) = ckptfs_kernels::float::choose(&d);
        out.push((format!("{name} {chosen:?} chosen"), d.clone(), chosen));
    }
    out
}

/// Checks frames against the CPU encoder and the zstd library; returns how many compressed.
#[allow(dead_code)]
pub fn check_float_frames(
    what: &str,
    cases: &[(String, Vec<u8>, ckptfs_kernels::float::Plan)],
    frames: &[Vec<u8>],
) -> usize {
    use ckptfs_kernels::float;
    assert_eq!(frames.len(), cases.len(), "{what}: one frame per chunk");
    let mut compressed = 0;
    for ((name, d, plan), frame) in cases.iter().zip(frames) {
        let t = &plan.transform;
        let want = float::encode_plan(d, *plan);
        assert!(
            *frame == want,
            "{what}: {name}: kernel {} bytes, CPU {} bytes",
            frame.len(),
            want.len()
        );
        let planes = zstd::bulk::decompress(frame, d.len()).expect("zstd decodes");
        assert_eq!(float::inverse(&planes, *t), *d, "{what}: {name}");
        compressed += usize::from(frame.len() * 10 < d.len() * 9);
    }
    compressed
}
