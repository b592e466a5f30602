//! The float codec's frames decode with the reference zstd library to the transformed bytes,
//! and back to the input, for every transform, dtype and edge case.

use ckptfs_kernels::float::{self, Transform};
use rand::{Rng, RngCore, SeedableRng};

fn decode(frame: &[u8], len: usize, t: Transform) -> Vec<u8> {
    let planes = zstd::bulk::decompress(frame, len).expect("a standard zstd frame");
    assert_eq!(planes.len(), len);
    float::inverse(&planes, t)
}

fn cases() -> Vec<(String, Vec<u8>)> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let mut v: Vec<(String, Vec<u8>)> = Vec::new();
    let normal = |rng: &mut rand::rngs::SmallRng| -> f32 {
        (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0
    };
    let f32s: Vec<u8> = (0..16384)
        .flat_map(|_| (0.02 * normal(&mut rng)).to_le_bytes())
        .collect();
    v.push(("fp32 N(0,0.02)".into(), f32s.clone()));
    let bf16: Vec<u8> = f32s.chunks(4).flat_map(|c| [c[2], c[3]]).collect();
    v.push(("bf16".into(), bf16));
    let f64s: Vec<u8> = (0..8192)
        .flat_map(|i| (1.0 + (i as f64 * 0.001).sin()).to_le_bytes())
        .collect();
    v.push(("fp64 field".into(), f64s));
    let specials: Vec<u8> = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        f32::MIN_POSITIVE / 3.0,
        -f32::MIN_POSITIVE / 7.0,
        f32::MAX,
        f32::MIN,
    ]
    .iter()
    .cycle()
    .take(3001)
    .flat_map(|f| f.to_le_bytes())
    .collect();
    v.push(("fp32 specials".into(), specials));
    let f64sp: Vec<u8> = [
        f64::NAN,
        f64::INFINITY,
        -0.0,
        f64::MIN_POSITIVE / 5.0,
        1e300,
    ]
    .iter()
    .cycle()
    .take(2001)
    .flat_map(|f| f.to_le_bytes())
    .collect();
    v.push(("fp64 specials".into(), f64sp));
    let mut random = vec![0u8; 70_001];
    rng.fill_bytes(&mut random);
    v.push(("random".into(), random));
    v.push(("zeros".into(), vec![0u8; 65_536]));
    let text: Vec<u8> = b"step 1000 loss 0.1234 lr 3e-4\n"
        .iter()
        .cycle()
        .take(50_000)
        .copied()
        .collect();
    v.push(("text".into(), text));
    // A plane over 128 KiB (several blocks) and odd tails.
    let big: Vec<u8> = (0..300_003u32).map(|i| (i % 7 * 3 + i % 5) as u8).collect();
    v.push(("big".into(), big));
    for len in [0usize, 1, 2, 3, 5, 7, 63, 64, 65, 127, 129] {
        let mut d = vec![0u8; len];
        rng.fill_bytes(&mut d);
        for b in d.iter_mut().step_by(2) {
            *b &= 3;
        }
        v.push((format!("short {len}"), d));
    }
    v
}

#[test]
fn every_transform_round_trips_through_the_zstd_library() {
    for (name, d) in cases() {
        for t in Transform::all() {
            let frame = float::encode(&d, t);
            assert_eq!(decode(&frame, d.len(), t), d, "{name} {t:?}");
        }
    }
}

/// Skewed planes give Huffman blocks (not only raw or RLE ones), and they pay.
#[test]
fn floats_compress_and_choose_picks_the_float_transforms() {
    for (name, d) in cases().into_iter().take(3) {
        let (plan, est) = float::choose(&d);
        let t = plan.transform;
        let frame = float::encode_plan(&d, plan);
        let ratio = frame.len() as f64 / d.len() as f64;
        println!("{name}: {plan:?} estimated {est:.3}, stored {ratio:.3}");
        assert!(t.width > 1 && ratio < 0.9, "{name}: {t:?} {ratio}");
        assert_eq!(decode(&frame, d.len(), t), d, "{name}");
        assert!(
            (est as f64 - ratio).abs() < 0.05,
            "{name}: estimate {est} vs {ratio}"
        );
    }
}

/// Planes with bytes over 128 (the direct tree form stops at 128) are Huffman-coded with
/// FSE-coded weights where that pays, and the zstd library decodes them: a positive tensor
/// (every low mantissa byte even after rotation) and a skewed plane over all 256 values
/// store well below raw under the plans `choose` gives, which code those planes.
#[test]
fn planes_over_128_are_coded_with_fse_weights_and_decode() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(12);
    let positive: Vec<u8> = (0..30_000)
        .flat_map(|_| (1e-6 * rng.random::<f32>().powi(2) + 1e-9).to_le_bytes())
        .collect();
    let skewed: Vec<u8> = (0..60_000)
        .map(|_| {
            let r: u32 = rng.random();
            (r.trailing_zeros() * 16 + (r >> 28)).min(255) as u8 ^ 0x80
        })
        .collect();
    for (name, d, most) in [
        ("positive fp32", positive, 0.84),
        ("skewed bytes", skewed, 0.8),
    ] {
        let (plan, _) = float::choose(&d);
        let w = plan.transform.width as usize;
        let n = d.len() / w;
        let planes = float::forward(&d, plan.transform);
        let over_128 = (0..w).any(|j| {
            plan.coded >> j & 1 == 1 && planes[j * n..(j + 1) * n].iter().any(|&b| b > 128)
        });
        assert!(
            over_128,
            "{name}: {plan:?} codes no plane with a byte over 128"
        );
        let frame = float::encode_plan(&d, plan);
        let ratio = frame.len() as f64 / d.len() as f64;
        println!("{name}: {plan:?} stored {ratio:.3}");
        assert!(ratio < most, "{name}: stored {ratio:.3}, want < {most}");
        assert_eq!(decode(&frame, d.len(), plan.transform), d, "{name}");
    }
}

/// FSE-coded weights of every shape the encoder can meet (two to eleven distinct values,
/// 3 to 255 weights, runs of zeros) decode with the zstd library: each is wrapped as the
/// tree of a literals block of a hand-made frame whose Huffman codes follow those weights.
#[test]
fn fse_weights_decode_with_the_zstd_library() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(13);
    let mut checked = 0;
    for round in 0..3000 {
        // Random byte counts over a random alphabet: the encoder's own path from counts to
        // weights to frame, checked through libzstd's decoder.
        let symbols = 2 + rng.random_range(0..255usize);
        let n = 200 + rng.random_range(0..3000usize);
        let spread = 1 + round % 7;
        let d: Vec<u8> = (0..n)
            .map(|_| {
                let r: u32 = rng.random();
                let s =
                    (r.trailing_zeros() as usize * spread + (r >> 24) as usize % spread) % symbols;
                (255 - s) as u8
            })
            .collect();
        let t = float::Transform {
            width: 1,
            rotate: 0,
        };
        let frame = float::encode(&d, t);
        assert_eq!(decode(&frame, d.len(), t), d, "round {round}");
        checked += usize::from(frame.len() < d.len());
    }
    assert!(checked > 2000, "only {checked} of 3000 frames were coded");
}
