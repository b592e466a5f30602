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
        let (t, est) = float::choose(&d);
        let frame = float::encode(&d, t);
        let ratio = frame.len() as f64 / d.len() as f64;
        println!("{name}: {t:?} estimated {est:.3}, stored {ratio:.3}");
        assert!(t.width > 1 && ratio < 0.9, "{name}: {t:?} {ratio}");
        assert!(
            (est as f64 - ratio).abs() < 0.05,
            "{name}: estimate {est} vs {ratio}"
        );
    }
}
