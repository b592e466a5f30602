//! The BLAKE3 and gear-candidate kernels (`cuda/hash.cu`) run on the CPU through the
//! emulation shim, checked bit for bit: every hash equals the `blake3` crate's, every
//! candidate bitmap equals the CPU reference, and the cuts walked from it equal
//! `fastcdc::v2020`'s (the engine's CPU cutter's), on random, text, zero, float and
//! low-entropy data and on lengths at every BLAKE3 chunk and tree boundary.

use ckptfs_kernels::cut::{self, GearParams};
use ckptfs_kernels::Emu;

mod common;
use common::*;

fn params(min: usize, avg: usize, max: usize) -> GearParams {
    use fastcdc::v2020::{get_gear_with_seed, select_masks, Normalization};
    let (mask_s, mask_l) = select_masks(avg, Normalization::Level1);
    let (gear, _) = get_gear_with_seed(0);
    GearParams::new(min, avg, max, mask_s, mask_l, &gear).expect("valid parameters")
}

/// Data of each kind the checks run on.
fn kinds(n: usize, seed: u64) -> Vec<(&'static str, Vec<u8>)> {
    let mut low = random(n, seed + 1);
    // Long stretches of few byte values: hashes that repeat, cuts at max.
    for (i, b) in low.iter_mut().enumerate() {
        if (i / 70_000) % 2 == 0 {
            *b &= 1;
        }
    }
    vec![
        ("random", random(n, seed)),
        ("text", text(n, seed + 2)),
        ("field", field(n, seed + 3)),
        ("zeros", vec![0u8; n]),
        ("low entropy", low),
    ]
}

#[test]
fn blake3_kernel_equals_the_crate_at_every_boundary() {
    let k = 1024;
    let lens = [
        0,
        1,
        63,
        64,
        65,
        k - 1,
        k,
        k + 1,
        2 * k - 1,
        2 * k,
        2 * k + 1,
        3 * k,
        4 * k + 1,
        31 * k,
        32 * k,
        33 * k + 5,
        64 * k,
        65 * k + 7,
        100_000,
        256 * k,
        257 * k + 3,
        1 << 20,
        (1 << 20) + 1,
    ];
    for (kind, data) in kinds(2 << 20, 7) {
        let pieces: Vec<&[u8]> = lens.iter().map(|&n| &data[..n]).collect();
        let got = Emu.blake3(&pieces).expect("emulated blake3");
        for (p, h) in pieces.iter().zip(&got) {
            assert_eq!(
                h,
                blake3::hash(p).as_bytes(),
                "{kind}: BLAKE3 of {} bytes",
                p.len()
            );
        }
    }
}

#[test]
fn blake3_kernel_hashes_a_batch_of_engine_sized_chunks() {
    // Pieces as the engine cuts them, many per launch, so blocks run on several threads.
    let data = field(8 << 20, 11);
    let p = params(16 << 10, 64 << 10, 256 << 10);
    let lens: Vec<usize> = fastcdc::v2020::FastCDC::new(&data, p.min, p.avg, p.max)
        .map(|c| c.length)
        .collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    for n in lens {
        pieces.push(&data[at..at + n]);
        at += n;
    }
    let got = Emu.blake3(&pieces).expect("emulated blake3");
    for (i, (p, h)) in pieces.iter().zip(&got).enumerate() {
        assert_eq!(
            h,
            blake3::hash(p).as_bytes(),
            "chunk {i} of {} bytes",
            p.len()
        );
    }
}

#[test]
fn gear_kernel_candidates_and_walked_cuts_equal_fastcdc() {
    let sizes = [
        (64, 256, 1024),
        (1 << 10, 4 << 10, 16 << 10),
        (4 << 10, 16 << 10, 64 << 10),
        (16 << 10, 64 << 10, 256 << 10),
        (64 << 10, 256 << 10, 1 << 20),
    ];
    for (min, avg, max) in sizes {
        let p = params(min, avg, max);
        for (kind, data) in kinds(6 << 20, 21) {
            // The whole stream as one piece, and split at odd places (the kernel's bits
            // of a piece must not depend on what else is in the launch).
            let splits = [data.len(), 1_000_003, 777, 65_536 + 31];
            let pieces: Vec<&[u8]> = {
                let mut v = vec![&data[..]];
                let mut at = 0;
                for &n in &splits[1..] {
                    v.push(&data[at..at + n]);
                    at += n;
                }
                v
            };
            let bits = Emu.gear_candidates(&pieces, &p).expect("emulated gear");
            for (piece, b) in pieces.iter().zip(&bits) {
                assert!(
                    *b == cut::candidates(&p, piece),
                    "{kind} {avg}: kernel candidates of {} bytes differ from the CPU's",
                    piece.len()
                );
            }
            let want: Vec<usize> = fastcdc::v2020::FastCDC::new(&data, min, avg, max)
                .map(|c| c.length)
                .collect();
            let got = cut::cuts(&p, &data, &bits[0]).expect("walk");
            assert_eq!(got, want, "{kind} {avg}: cuts differ from fastcdc");
            // And on a stream shorter than a chunk, and one of a few chunks.
            for n in [min - 1, min, min + 1, avg, max + 3, 3 * max + 17] {
                let d = &data[..n.min(data.len())];
                let want: Vec<usize> = fastcdc::v2020::FastCDC::new(d, min, avg, max)
                    .map(|c| c.length)
                    .collect();
                let b = cut::candidates(&p, d);
                assert_eq!(
                    cut::cuts(&p, d, &b).unwrap(),
                    want,
                    "{kind} {avg}: {n} bytes"
                );
            }
        }
    }
}

#[test]
fn gear_parameters_the_walk_cannot_honour_are_refused() {
    let (gear, _) = fastcdc::v2020::get_gear_with_seed(0);
    assert!(
        GearParams::new(32, 256, 1024, 0xff, 0xf, &gear).is_err(),
        "min < 64"
    );
    assert!(
        GearParams::new(64, 256, 1024, 1 << 63, 0xf, &gear).is_err(),
        "bit 63"
    );
    assert!(
        GearParams::new(64, 256, 1024, 0xff, 0xf, &gear[..255]).is_err(),
        "table"
    );
    let p = params(64, 256, 1024);
    assert!(cut::cuts(&p, &[0u8; 100], &[]).is_err(), "bitmap too short");
}
