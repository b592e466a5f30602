//! The host half of the GPU cutter: picks FastCDC v2020's cuts (the crate's, and so the
//! engine's CPU cutter's, exactly) from the candidate bitmap that `ckpt_gear_candidates`
//! (`cuda/hash.cu`) computes in parallel.
//!
//! Why a walk is needed at all: whether a position is a cut depends on where its chunk
//! starts (the first `min` bytes are skipped, the mask tightens before `avg` and loosens
//! after, a chunk ends at `max`), so cuts are a sequential choice; but the test at each
//! position depends only on the 64 bytes before it, which is what the kernel evaluates
//! everywhere at once. The walk touches the bitmap's words (one bit per byte, mostly zero)
//! and rehashes 64 bytes per candidate and per chunk start: a few percent of the cutting
//! work. The first 64 tested bytes of a chunk are hashed here from a fresh hash, as the
//! crate does (its hash starts from zero at the chunk's first tested byte, so those positions
//! differ from the rolling hash in their high bits).

use crate::{Error, Result};

/// FastCDC v2020 parameters and tables as the crate computes them (`fastcdc::v2020`'s
/// `get_gear_with_seed(0)` and `select_masks(avg, Normalization::Level1)`); this crate does
/// not depend on the chunking crate, the caller passes them.
#[derive(Clone, Debug)]
pub struct GearParams {
    pub min: usize,
    pub avg: usize,
    pub max: usize,
    /// The mask before `avg` (more bits: cuts are rarer).
    pub mask_s: u64,
    /// The mask after `avg`.
    pub mask_l: u64,
    pub gear: [u64; 256],
}

/// Bytes a chunk's fresh hash needs before it equals the rolling hash on every bit.
pub const WARM: usize = 64;

/// The rolling gear hash after byte `i` of `data` (`i >= 63`): it depends only on the 64
/// bytes up to `i`. Also the engine's CPU cutter's (`gearscan`).
pub fn rolling(gear: &[u64; 256], data: &[u8], i: usize) -> u64 {
    data[i + 1 - WARM..=i]
        .iter()
        .fold(0u64, |h, &b| (h << 1).wrapping_add(gear[b as usize]))
}

impl GearParams {
    /// Checks what the kernel's per-byte test relies on: masks without bit 63 (the crate
    /// tests even bytes with the mask shifted left by one) and a `min` of at least 64 bytes
    /// (the walk's fresh-hash window lies inside the chunk).
    pub fn new(
        min: usize,
        avg: usize,
        max: usize,
        mask_s: u64,
        mask_l: u64,
        gear: &[u64],
    ) -> Result<Self> {
        let gear: [u64; 256] = gear
            .try_into()
            .map_err(|_| Error::Invalid(format!("{} gear entries, not 256", gear.len())))?;
        if (mask_s | mask_l) >> 63 != 0 {
            return Err(Error::Invalid("a gear mask uses bit 63".into()));
        }
        if min < WARM || !(min <= avg && avg <= max) || max > crate::MAX_CHUNK {
            return Err(Error::Invalid(format!(
                "chunk sizes {min}/{avg}/{max}: need 64 <= min <= avg <= max"
            )));
        }
        Ok(GearParams {
            min,
            avg,
            max,
            mask_s,
            mask_l,
            gear,
        })
    }

    /// The rolling gear hash after byte `i` of `data` (`i >= 63`).
    fn rolling(&self, data: &[u8], i: usize) -> u64 {
        rolling(&self.gear, data, i)
    }
}

/// The candidate bitmap of `data` computed on the CPU, as the kernel computes it: bit i set
/// where the rolling hash after byte i meets either mask. For tests of the kernel, and the
/// reference the walk is checked with.
pub fn candidates(p: &GearParams, data: &[u8]) -> Vec<u32> {
    let mut bits = vec![0u32; data.len().div_ceil(32)];
    let mut h = 0u64;
    for (i, &b) in data.iter().enumerate() {
        h = (h << 1).wrapping_add(p.gear[b as usize]);
        if h & p.mask_s == 0 || h & p.mask_l == 0 {
            bits[i / 32] |= 1 << (i % 32);
        }
    }
    bits
}

/// The chunk lengths of `data` cut as FastCDC v2020 cuts a whole stream (the last chunk is
/// the rest), using `bits` (`candidates`, or the kernel's output for the same bytes).
pub fn cuts(p: &GearParams, data: &[u8], bits: &[u32]) -> Result<Vec<usize>> {
    if bits.len() < data.len().div_ceil(32) {
        return Err(Error::Invalid(format!(
            "{} candidate words for {} bytes",
            bits.len(),
            data.len()
        )));
    }
    let mut out = Vec::with_capacity(data.len() / p.avg + 1);
    let mut s = 0;
    while s < data.len() {
        let n = cut(p, data, bits, s);
        out.push(n);
        s += n;
    }
    Ok(out)
}

/// The length of the chunk starting at `s`.
fn cut(p: &GearParams, data: &[u8], bits: &[u32], s: usize) -> usize {
    let len = data.len() - s;
    if len <= p.min {
        return len;
    }
    let remaining = len.min(p.max);
    let center = if len < p.avg { len } else { p.avg };
    // The crate steps two bytes at a time from byte min/2*2: bytes [first, mid) are tested
    // with mask_s, [mid, stop) with mask_l.
    let first = p.min / 2 * 2;
    let mid = center / 2 * 2;
    let stop = remaining / 2 * 2;
    let mask = |i: usize| if i < mid { p.mask_s } else { p.mask_l };
    // Fresh hash over the first bytes, as the crate's.
    let mut h = 0u64;
    let warm_end = (first + WARM).min(stop);
    for i in first..warm_end {
        h = (h << 1).wrapping_add(p.gear[data[s + i] as usize]);
        if h & mask(i) == 0 {
            return i;
        }
    }
    // Then the candidates, in order.
    let (from, to) = (s + warm_end, s + stop);
    let mut w = from / 32;
    while w * 32 < to {
        let mut word = bits[w];
        if w == from / 32 {
            word &= !0u32 << (from % 32);
        }
        while word != 0 {
            let q = w * 32 + word.trailing_zeros() as usize;
            if q >= to {
                return remaining;
            }
            if p.rolling(data, q) & mask(q - s) == 0 {
                return q - s;
            }
            word &= word - 1;
        }
        w += 1;
    }
    remaining
}
