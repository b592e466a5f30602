//! Test data shared by the emulation and GPU tests, generated from a seed.

#![allow(dead_code)] // each test binary uses its own subset

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
