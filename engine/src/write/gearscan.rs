//! The gear-hash search of the content-defined cutter on eight lanes at once (AVX-512), with
//! exactly the cuts of the scalar loop (`write::Gear`).
//!
//! FastCDC's test at byte `q` looks at the gear hash after `q`, `h = (h << 1) + gear[b]`,
//! which depends only on the 64 bytes up to `q` (older bytes are shifted out). So once a
//! chunk's scan has hashed 64 bytes, the first position where `h & mask == 0` can be found
//! by evaluating many positions independently: lane `k` of a block takes a contiguous run
//! of positions, warms its hash up over the 64 bytes before the run, then tests each
//! position; the first hit of the lowest lane that has one is the scan's hit. The scalar
//! loop is bound by instruction throughput (a byte load, a table load, a shift, an add and a
//! test per byte); a lane step costs the same instructions for eight bytes, with the table
//! loads as one gather. Warm-up (64 steps per lane per block) and the positions a block
//! evaluates past the hit are the extra work, a few percent at 1024 positions per lane.
//!
//! Only the part of a scan where the hash is steady comes here; the first 64 bytes after a
//! chunk's `min` (where FastCDC's hash starts from zero) stay on the scalar loop. Where
//! AVX-512 is absent, or where its gathers measure slower than the scalar loop (AMD Zen 4:
//! `write::gear_search`), the scalar loop does everything, as before.

/// The gear hash after a byte as it is once 64 bytes were hashed, and those 64 bytes: the
/// GPU cutter's walk (`kernels::cut`) rests on the same fact.
pub(crate) use crate::kernels::cut::{rolling, WARM};

/// Lanes of a block (64-bit hashes in a 512-bit register).
const LANES: usize = 8;

/// Positions per lane in a full block: the 64 warm-up steps add 6%.
const STEPS: usize = 1024;

/// Positions per lane below which a block is not worth its warm-up: the scalar loop takes
/// the last bytes of a range (fewer than `LANES * MIN_STEPS`).
const MIN_STEPS: usize = 64;

/// Evaluates one block: lane `k` tests positions `start + k * steps + j` for `j` in
/// `0..steps`, and bit `k` of `hits[j]` is set where the hash after that position meets
/// `mask`. Needs `start >= WARM`, `steps % 8 == 0`, `start + LANES * steps <= src.len()` and
/// `hits.len() >= steps`.
pub(crate) type Kernel = fn(&[u64; 256], &[u8], usize, usize, u64, &mut [u8]);

/// The searches this CPU can run, by name: `scalar` (no kernel: the scalar loop,
/// `write::Gear::pairs`) and, where the CPU has AVX-512F, `avx512`. Which one the cutter
/// uses is measured (`write::gear_search`): having AVX-512 does not make its gathers fast.
pub(crate) fn candidates() -> Vec<(&'static str, Option<Kernel>)> {
    #[allow(unused_mut)]
    let mut all: Vec<(&'static str, Option<Kernel>)> = vec![("scalar", None)];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        all.push(("avx512", Some(block_avx512 as Kernel)));
    }
    all
}

/// The first position `q` in `from..to` where the hash after `q` meets `mask`, evaluated by
/// `kernel` in blocks (the last bytes by the scalar loop). Needs `from >= WARM` and
/// `to <= src.len()`.
pub(crate) fn first_hit(
    kernel: Kernel,
    gear: &[u64; 256],
    src: &[u8],
    from: usize,
    to: usize,
    mask: u64,
) -> Option<usize> {
    debug_assert!(from >= WARM && to <= src.len());
    let mut hits = [0u8; STEPS];
    let mut q = from;
    while to.saturating_sub(q) >= LANES * MIN_STEPS {
        let steps = ((to - q) / LANES).min(STEPS) / 8 * 8;
        kernel(gear, src, q, steps, mask, &mut hits);
        let hits = &hits[..steps];
        let any = hits.iter().fold(0u8, |a, &h| a | h);
        if any != 0 {
            let k = any.trailing_zeros() as usize;
            let j = hits
                .iter()
                .position(|&h| h >> k & 1 != 0)
                .expect("a lane with a hit has a step with it");
            return Some(q + k * steps + j);
        }
        q += LANES * steps;
    }
    if q >= to {
        return None;
    }
    let mut h = rolling(gear, src, q - 1);
    for (i, &b) in src[q..to].iter().enumerate() {
        h = (h << 1).wrapping_add(gear[b as usize]);
        if h & mask == 0 {
            return Some(q + i);
        }
    }
    None
}

/// `Kernel` one lane at a time, for tests of the block logic on machines without AVX-512.
#[cfg(test)]
pub(crate) fn block_scalar(
    gear: &[u64; 256],
    src: &[u8],
    start: usize,
    steps: usize,
    mask: u64,
    hits: &mut [u8],
) {
    hits[..steps].fill(0);
    for k in 0..LANES {
        let s = start + k * steps;
        let mut h = rolling(gear, src, s - 1);
        for j in 0..steps {
            h = (h << 1).wrapping_add(gear[src[s + j] as usize]);
            if h & mask == 0 {
                hits[j] |= 1 << k;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn block_avx512(
    gear: &[u64; 256],
    src: &[u8],
    start: usize,
    steps: usize,
    mask: u64,
    hits: &mut [u8],
) {
    assert!(start >= WARM && steps.is_multiple_of(8) && hits.len() >= steps);
    assert!(start + LANES * steps <= src.len());
    // SAFETY: `kernel()` hands this out only where the CPU has AVX-512F; the asserts above
    // are what `avx512` reads within.
    unsafe { avx512(gear, src, start, steps, mask, hits) }
}

/// The AVX-512 block: each step gathers the eight lanes' table entries at once. Reads bytes
/// `start - WARM .. start + LANES * steps` of `src`, eight at a time per lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(
    gear: &[u64; 256],
    src: &[u8],
    start: usize,
    steps: usize,
    mask: u64,
    hits: &mut [u8],
) {
    use std::arch::x86_64::*;
    let offs: [i64; LANES] = std::array::from_fn(|k| (start - WARM + k * steps) as i64);
    // SAFETY (whole body): every gather of `src` reads 8 bytes at `offs[k] + 8 * g` for
    // groups g < (WARM + steps) / 8, the last ending at start + (k + 1) * steps <=
    // src.len(); every gather of `gear` reads index `byte & 0xff` < 256; `hits` has `steps`
    // entries (the caller's assertions).
    let mut off = unsafe { _mm512_loadu_si512(offs.as_ptr().cast()) };
    let eight = _mm512_set1_epi64(8);
    let byte = _mm512_set1_epi64(0xff);
    let maskv = _mm512_set1_epi64(mask as i64);
    let table = gear.as_ptr().cast::<i64>();
    let data = src.as_ptr().cast::<i64>();
    let mut h = _mm512_setzero_si512();
    macro_rules! step {
        ($v:expr, $t:literal) => {{
            let idx = _mm512_and_si512(_mm512_srli_epi64::<{ 8 * $t }>($v), byte);
            let g = unsafe { _mm512_i64gather_epi64::<8>(idx, table) };
            h = _mm512_add_epi64(_mm512_slli_epi64::<1>(h), g);
        }};
    }
    for _ in 0..WARM / 8 {
        let v = unsafe { _mm512_i64gather_epi64::<1>(off, data) };
        off = _mm512_add_epi64(off, eight);
        step!(v, 0);
        step!(v, 1);
        step!(v, 2);
        step!(v, 3);
        step!(v, 4);
        step!(v, 5);
        step!(v, 6);
        step!(v, 7);
    }
    macro_rules! test {
        ($v:expr, $t:literal, $out:expr) => {{
            step!($v, $t);
            $out[$t] = _mm512_testn_epi64_mask(h, maskv);
        }};
    }
    for out in hits[..steps].chunks_exact_mut(8) {
        let v = unsafe { _mm512_i64gather_epi64::<1>(off, data) };
        off = _mm512_add_epi64(off, eight);
        test!(v, 0, out);
        test!(v, 1, out);
        test!(v, 2, out);
        test!(v, 3, out);
        test!(v, 4, out);
        test!(v, 5, out);
        test!(v, 6, out);
        test!(v, 7, out);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    fn gear() -> &'static [u64; 256] {
        let (g, _) = fastcdc::v2020::get_gear_with_seed(0);
        match g {
            std::borrow::Cow::Borrowed(t) => t.try_into().unwrap(),
            std::borrow::Cow::Owned(_) => unreachable!(),
        }
    }

    /// The plain answer: hash every byte from `from - WARM`, test from `from`.
    fn reference(
        gear: &[u64; 256],
        src: &[u8],
        from: usize,
        to: usize,
        mask: u64,
    ) -> Option<usize> {
        let mut h = 0u64;
        for (i, &b) in src.iter().enumerate().take(to).skip(from - WARM) {
            h = (h << 1).wrapping_add(gear[b as usize]);
            if i >= from && h & mask == 0 {
                return Some(i);
            }
        }
        None
    }

    /// Masks of the sizes FastCDC uses (a hit every 2^bits bytes on random data), the
    /// smallest making several hits per block so the lane and step choice is exercised.
    fn cases(seed: u64) -> Vec<(Vec<u8>, u64)> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut out = Vec::new();
        for &(avg, kind) in &[
            (256usize, 0),
            (4096, 1),
            (65536, 2),
            (262144, 0),
            (1 << 12, 3),
        ] {
            let (ms, ml) = fastcdc::v2020::select_masks(avg, fastcdc::v2020::Normalization::Level1);
            let len = rng.random_range(100..300_000);
            let mut d = vec![0u8; len];
            match kind {
                0 => rng.fill_bytes(&mut d),
                // Text-like: few distinct bytes.
                1 => d
                    .iter_mut()
                    .for_each(|b| *b = b"etaoin shrdlu\n"[rng.random_range(0..14)]),
                // Zeros with sparse noise.
                2 => (0..len / 500).for_each(|_| d[rng.random_range(0..len)] = rng.random()),
                // Floats.
                _ => d
                    .chunks_exact_mut(8)
                    .enumerate()
                    .for_each(|(i, c)| c.copy_from_slice(&((i as f64 * 0.01).sin()).to_le_bytes())),
            }
            out.push((d.clone(), ms));
            out.push((d, ml));
        }
        out
    }

    fn check(kernel: Kernel, seeds: u64) {
        let g = gear();
        for seed in 0..seeds {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ 0x5eed);
            for (d, mask) in cases(seed) {
                for _ in 0..6 {
                    let from = rng.random_range(WARM..d.len().max(WARM + 1)).min(d.len());
                    let to = rng.random_range(from..=d.len());
                    assert_eq!(
                        first_hit(kernel, g, &d, from, to, mask),
                        reference(g, &d, from, to, mask),
                        "seed {seed}, {} bytes, {from}..{to}, mask {mask:#x}",
                        d.len()
                    );
                }
            }
        }
    }

    /// The block logic (lane split, warm-up, lowest hit, scalar tail) against the plain
    /// scan, with the one-lane-at-a-time kernel: runs everywhere.
    #[test]
    fn blocks_find_the_first_hit_of_a_plain_scan() {
        check(block_scalar, 24);
    }

    /// Whether this CPU has AVX-512F; where it does not, says the test is SKIPPED (shown on
    /// every run, `.config/nextest.toml`), or fails it when `CKPTFS_REQUIRE` names `avx512`
    /// (`scripts/node-bench.sh` sets that on a node whose /proc/cpuinfo lists it).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn avx512_here(test: &str) -> bool {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return true;
        }
        let required = std::env::var("CKPTFS_REQUIRE").is_ok_and(|v| v.contains("avx512"));
        assert!(
            !required,
            "{test}: CKPTFS_REQUIRE=avx512 but this CPU has no AVX-512F"
        );
        eprintln!("SKIPPED {test}: no avx512: this CPU has no AVX-512F; the AVX-512 kernel is untested here");
        false
    }

    /// The AVX-512 kernel gives the scalar kernel's hits, bit for bit, and `first_hit` with
    /// it the plain scan's answer. Needs AVX-512F: skipped loudly without it (this project's
    /// 2-core VMs; the GPU nodes have it).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_blocks_equal_the_scalar_kernel() {
        if !avx512_here("avx512_blocks_equal_the_scalar_kernel") {
            return;
        }
        let g = gear();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for (d, mask) in cases(3) {
            for steps in [8, 64, 256, 1024] {
                if d.len() < WARM + LANES * steps {
                    continue;
                }
                let start = rng.random_range(WARM..=d.len() - LANES * steps);
                let (mut a, mut b) = ([0u8; STEPS], [0u8; STEPS]);
                block_scalar(g, &d, start, steps, mask, &mut a);
                block_avx512(g, &d, start, steps, mask, &mut b);
                assert_eq!(a[..steps], b[..steps], "start {start}, steps {steps}");
            }
        }
        check(block_avx512, 24);
    }
}
