//! Choosing a chunk's [`Plan`] from a sample: the transform that should store it smallest
//! and the planes worth coding, with the stored fraction that is expected. Runs on the CPU
//! only (the kernel takes the plan), so it may use floating point.

use super::{Fixed, Plan, Transform, MAX_DIRECT_SYMBOL};

/// Bytes of a chunk's sample that [`choose`] looks at: enough to tell a plane 1% below 8 bits
/// from noise (at width 4 a plane gets 1024 sample bytes, where the corrected entropy of
/// uniform bytes is within about 0.02 bits; with 512 the correction falls short, and a
/// tenth of fp32 chunks got a mantissa plane coded for nothing).
pub const SAMPLE: usize = 4 << 10;

/// A plane is coded only where its estimate saves at least this fraction of its raw size.
/// A coded plane costs a histogram and a Huffman pass on encode (about 1.4 ns a byte here)
/// and a Huffman decode on every read, so a plane near 8 bits is not worth it: the low
/// mantissa byte of fp32 sums of uniforms (7.80 bits, 2.5% of the plane) doubled the
/// encoder's time for 0.6% of the chunk. Planes that do pay save far more: the sign plane of
/// optimizer state (12.5%), zero-heavy planes, the low mantissa bytes of
/// all-MiniLM-L6-v2 (5-6%), exponents (60-70%).
const CODE_MIN_GAIN: f32 = 0.04;

/// A coded plane whose sample entropy is within this many bits a byte of the number of bits
/// in which its bytes vary gets codes of one length ([`Fixed`]). Uniform bits estimate
/// within about 0.01 bits of their count (the Miller-Madow correction leaves no bias, and
/// the spread over a 1 KiB sample of 64 values is under 0.01); a plane 0.03 bits below it
/// would save at most 0.4% of its size with Huffman codes.
const FIXED_SLACK: f32 = 0.03;

/// Fixed-point scale of [`nlogn_table`]: 1/1024 bit.
const NLOGN_ONE: f32 = 1024.0;

/// `n * log2(n)` in 1/1024 bits for every count a sample's plane can have (at most
/// 4096 * 12 * 1024, so a plane's sum fits in a `u32`). Integers: the sum over a plane's 256
/// counts runs as four independent integer chains, where one chain of float additions
/// waited three cycles an addition and was most of `choose`'s time.
fn nlogn_table() -> &'static [u32] {
    static TABLE: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=SAMPLE as u32)
            .map(|i| {
                if i == 0 {
                    0
                } else {
                    (f64::from(i) * f64::from(i).log2() * f64::from(NLOGN_ONE)).round() as u32
                }
            })
            .collect()
    })
}

/// How a plane of a candidate transform is expected to store.
struct PlaneCost {
    bits: f32,
    coded: bool,
    /// The bits its sample varies in, where they look uniform (codes of one length).
    fixed: Option<u8>,
}

/// Bits one plane of `plane_len` bytes is expected to take, and whether to code it, from
/// the histogram `h` of its sample: the sample's entropy with the Miller-Madow correction
/// (a sample's entropy is low by about (K - 1) / (2 ln 2) bits for K distinct bytes),
/// scaled to the plane, plus the tree description and headers; raw where that does not save
/// [`CODE_MIN_GAIN`]; almost nothing for one repeated byte.
fn plane_cost(h: &[u32; 256], plane_len: usize, nlogn: &[u32]) -> PlaneCost {
    let (mut total, mut distinct) = (0u32, 0u32);
    let mut sums = [0u32; 4];
    for q in h.chunks_exact(4) {
        for (k, &c) in q.iter().enumerate() {
            total += c;
            distinct += u32::from(c > 0);
            sums[k] += nlogn[c as usize];
        }
    }
    let sum = sums.iter().map(|&s| s as f32).sum::<f32>() / NLOGN_ONE;
    let max_sym = h.iter().rposition(|&c| c > 0).unwrap_or(0);
    let raw = 8.0 * plane_len as f32 + 24.0;
    if total == 0 {
        return PlaneCost {
            bits: raw,
            coded: false,
            fixed: None,
        };
    }
    if distinct == 1 {
        return PlaneCost {
            bits: 32.0,
            coded: true,
            fixed: None,
        };
    }
    let sample_bits =
        nlogn[total as usize] as f32 / NLOGN_ONE - sum + 0.7213 * (distinct - 1) as f32;
    let (and, or) = (0..=255u8)
        .filter(|&s| h[usize::from(s)] > 0)
        .fold((0xFFu8, 0u8), |(a, o), s| (a & s, o | s));
    let varying = or & !and;
    let fixed = (varying != 0xFF
        && sample_bits / total as f32 >= varying.count_ones() as f32 - FIXED_SLACK)
        .then_some(varying);
    // Direct weights: 4 bits a symbol up to the largest; FSE-coded ones: about half a bit
    // for each absent symbol below the largest and three for each present one.
    let fse = 48.0 + 0.5 * (max_sym + 1 - distinct as usize) as f32 + 3.0 * distinct as f32;
    let tree = if max_sym <= MAX_DIRECT_SYMBOL {
        fse.min(8.0 + 4.0 * max_sym as f32)
    } else {
        fse
    };
    // Block and literals headers and the jump table: 14 bytes.
    let coded = sample_bits * plane_len as f32 / total as f32 + tree + 112.0;
    if coded < raw * (1.0 - CODE_MIN_GAIN) {
        PlaneCost {
            bits: coded,
            coded: true,
            fixed,
        }
    } else {
        PlaneCost {
            bits: raw,
            coded: false,
            fixed: None,
        }
    }
}

fn add(a: &[u32; 256], b: &[u32; 256]) -> [u32; 256] {
    std::array::from_fn(|i| a[i] + b[i])
}

/// The plan that should store `data` smallest, and the estimated stored fraction, from
/// histograms of a sample (the first and middle `SAMPLE / 2` bytes): one pass counts bytes
/// by position mod 8 under each rotation; the planes of width 4, 2 and 1 are sums of
/// those (positions `j mod 4` are `j` and `j + 4 mod 8`, and so on).
pub fn choose(data: &[u8]) -> (Plan, f32) {
    choose_among(data, None)
}

/// [`choose`] for one transform only (the one the chunk before this one got, say): the
/// planes worth coding under `t` and the estimate, for about a quarter of the work.
pub fn choose_for(data: &[u8], t: Transform) -> (Plan, f32) {
    choose_among(data, Some(t))
}

/// The two parts of the sample: the chunk itself when it is short, else its first and
/// middle `SAMPLE / 2` bytes (the middle part starting at a multiple of 8, so positions mod 8
/// stay aligned).
fn sample(data: &[u8]) -> [&[u8]; 2] {
    if data.len() <= SAMPLE {
        return [data, &[]];
    }
    let mid = (data.len() / 2) & !7;
    [&data[..SAMPLE / 2], &data[mid..mid + SAMPLE / 2]]
}

fn choose_among(data: &[u8], only: Option<Transform>) -> (Plan, f32) {
    let parts = sample(data);
    // Histograms by position mod 8 of the sample under each rotation (`Transform::ROTATIONS`
    // in order: none, one bit, three bits).
    let mut hist = [[[0u32; 256]; 8]; 3];
    let counted = Transform::ROTATIONS.map(|r| only.is_none_or(|t| t.rotate == r));
    let [raw, one, three] = &mut hist;
    for s in parts {
        if counted[0] {
            for (k, &byte) in s.iter().enumerate() {
                raw[k & 7][byte as usize] += 1;
            }
        }
        // The byte before the part's first is taken to be its last (a sample's parts have no
        // byte before them here; one byte in 2048 is off).
        let mut prev = s.last().copied().unwrap_or(0);
        if counted[1] || counted[2] {
            for (k, &byte) in s.iter().enumerate() {
                if counted[1] {
                    one[k & 7][(byte << 1 | prev >> 7) as usize] += 1;
                }
                if counted[2] {
                    three[k & 7][(byte << 3 | prev >> 5) as usize] += 1;
                }
                prev = byte;
            }
        }
    }
    let total = parts[0].len() + parts[1].len();
    let plain = Plan {
        transform: only.unwrap_or(Transform {
            width: 1,
            rotate: 0,
        }),
        coded: 0,
        fixed: None,
    };
    if total == 0 {
        return (plain, 1.0);
    }
    let nlogn = nlogn_table();
    let mut best = (plain, f32::MAX);
    for (h8, rotate) in hist.iter().zip(Transform::ROTATIONS) {
        if only.is_some_and(|t| t.rotate != rotate) {
            continue;
        }
        let h4: [[u32; 256]; 4] = std::array::from_fn(|j| add(&h8[j], &h8[j + 4]));
        let h2: [[u32; 256]; 2] = std::array::from_fn(|j| add(&h4[j], &h4[j + 2]));
        let h1 = [add(&h2[0], &h2[1])];
        let candidates: [(u8, &[[u32; 256]]); 4] = [(1, &h1), (2, &h2), (4, &h4), (8, h8)];
        for (width, planes) in candidates {
            if only.is_some_and(|t| t.width != width) {
                continue;
            }
            let plane_len = data.len() / width as usize;
            let (mut bits, mut coded, mut fixed) = (0.0, 0u16, None);
            for (j, h) in planes.iter().enumerate() {
                let c = plane_cost(h, plane_len, nlogn);
                bits += c.bits;
                coded |= u16::from(c.coded) << j;
                if let (None, Some(mask)) = (fixed, c.fixed) {
                    fixed = Some(Fixed {
                        plane: j as u8,
                        mask,
                    });
                }
            }
            // The tail of trailing bytes, raw.
            bits += 8.0 * (data.len() % width as usize) as f32;
            if bits < best.1 {
                let transform = Transform { width, rotate };
                best = (
                    Plan {
                        transform,
                        coded,
                        fixed,
                    },
                    bits,
                );
            }
        }
    }
    (best.0, best.1 / (8.0 * data.len() as f32))
}

/// The sum of the squares of `c`, in 16 lanes (a loop the compiler vectorizes; an iterator
/// sum inside `quick_floor`'s array builders took a third of its time).
fn sum_of_squares(c: &[u8; 256]) -> u32 {
    let mut lanes = [0u32; 16];
    for row in c.chunks_exact(16) {
        for (l, &v) in lanes.iter_mut().zip(row) {
            *l += u32::from(v) * u32::from(v);
        }
    }
    lanes.iter().sum()
}

/// Bytes of the sample [`quick_floor`] looks at.
const QUICK_SAMPLE: usize = 1 << 10;

/// A quick floor under the fraction [`choose`] could find, from the collision counts of a
/// small sample's bytes by position mod 8, under each rotation: the Rényi entropy of order
/// 2 of each position's bytes, which is never above their entropy; a plane of any width is
/// a mix of these positions and has at least their mean entropy. About 4 us a chunk, where
/// `choose` takes several: the policy asks this first on chunks that LZ4 compresses well or
/// not at all (text, random bytes), where the float codec nearly never pays. Noisy by about
/// 0.01 on bytes near 8 bits; `None` for a chunk shorter than the sample.
pub fn quick_floor(data: &[u8]) -> Option<f32> {
    if data.len() < 2 * QUICK_SAMPLE {
        return None;
    }
    let mid = (data.len() / 2) & !7;
    // Counts by position mod 8 under each rotation (none, one bit, three): at most
    // `QUICK_SAMPLE / 8` each, so bytes. Only increments here, eight positions a step so
    // each has its own class; the pairs are summed from the counts after (one pass the
    // compiler vectorizes). Counting pairs as bytes came in made every increment wait on a
    // load of its counter: 5.7 us a chunk, against 3.7-3.9 this way (64 KiB of random bytes,
    // where it decides alone, `ckptfs-bench codec`'s `s/GiB+` of random bytes).
    let mut counts = [[[0u8; 256]; 8]; 3];
    for start in [0, mid] {
        // The bits rotated into the first byte are the top bits of the byte before it.
        let mut prev = data[(start + data.len() - 1) % data.len()];
        for word in data[start..start + QUICK_SAMPLE / 2].chunks_exact(8) {
            for (k, &byte) in word.iter().enumerate() {
                counts[0][k][usize::from(byte)] += 1;
                counts[1][k][usize::from(byte << 1 | prev >> 7)] += 1;
                counts[2][k][usize::from(byte << 3 | prev >> 5)] += 1;
                prev = byte;
            }
        }
    }
    // Pairs in a class of n bytes: the sum over values of c (c - 1) / 2, (sum c^2 - n) / 2.
    let n_class = (QUICK_SAMPLE / 8) as u32;
    let pairs: [[u32; 8]; 3] = std::array::from_fn(|r| {
        std::array::from_fn(|k| (sum_of_squares(&counts[r][k]) - n_class) / 2)
    });
    // Pairs of positions in one class: n (n - 1) / 2 for n = QUICK_SAMPLE / 8.
    let n = (QUICK_SAMPLE / 8) as f32;
    let all_pairs = n * (n - 1.0) / 2.0;
    let bits = |pairs: &[u32; 8]| -> f32 {
        pairs
            .iter()
            .map(|&p| (all_pairs / (p as f32).max(1.0)).log2().min(8.0))
            .sum::<f32>()
            / 64.0
    };
    Some(pairs.iter().map(bits).fold(f32::MAX, f32::min))
}
