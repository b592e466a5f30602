//! A zstd compressed literals section (RFC 8878 3.1.1.3.1): Huffman code lengths, the tree
//! description (direct 4-bit weights, or weights compressed with FSE where a byte over 128
//! occurs or that is smaller), four Huffman streams and the section header. Every step is
//! integer-only and deterministic, so `cuda/float.cu` writes the very same bytes.

use std::borrow::Cow;
use std::collections::HashMap;

/// Longest Huffman code zstd allows.
pub const MAX_BITS: u32 = 11;
/// Largest byte value a directly written Huffman tree can describe.
pub const MAX_DIRECT_SYMBOL: usize = 128;
/// Accuracy log of the FSE table that codes Huffman weights (zstd allows at most 6).
pub const WEIGHT_LOG: u32 = 6;
/// Largest tree description: its header byte holds the size of an FSE-coded one below 128.
const MAX_TREE_BYTES: usize = 127;

/// Byte counts of `p`: with AVX-512 where most of its bytes are a few values (an exponent
/// plane), else eight tables side by side ([`histogram_scalar`]). Both count exactly, so
/// the Huffman table, and the frame, do not depend on which ran.
pub fn histogram(p: &[u8]) -> [u32; 256] {
    #[cfg(target_arch = "x86_64")]
    if let Some(h) = few::histogram(p) {
        return h;
    }
    histogram_scalar(p)
}

/// Byte counts of `p`, eight tables side by side so that a run of one value (an exponent
/// plane is mostly a handful of values) does not wait on one counter in memory: each
/// increment of a table depends on the one eight bytes before, not the one before.
pub fn histogram_scalar(p: &[u8]) -> [u32; 256] {
    let mut h = [[0u32; 256]; 8];
    let mut words = p.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        for (k, t) in h.iter_mut().enumerate() {
            t[(v >> (8 * k)) as u8 as usize] += 1;
        }
    }
    for &b in words.remainder() {
        h[0][b as usize] += 1;
    }
    std::array::from_fn(|s| h.iter().map(|t| t[s]).sum())
}

/// Counting a plane whose bytes are mostly a few values with compares instead of table
/// increments. The scalar histogram stores to a counter for every byte (about 1.3 cycles a
/// byte here, a third of a float chunk's encoding); an exponent plane of weights or
/// optimizer state is 99% a dozen values. So: the values of a 1 KiB sample that cover
/// nearly all of it are compared with 64 bytes at a time, each match adding one to a byte
/// counter of its lane in a register (summed before it can wrap), and the few bytes that
/// are none of them (found by a table lookup of 64 bytes at once) are counted one by one. A plane that turns out not to be so (more than an eighth of its bytes left
/// over after any 4 KiB) is finished by the scalar loop.
#[cfg(target_arch = "x86_64")]
mod few {
    use std::arch::x86_64::*;

    /// Bytes of the sample the candidates come from.
    const SAMPLE: usize = 1 << 10;
    /// At most this many candidates (each costs a compare, a popcount and an add per 64
    /// bytes; beyond 16 the scalar loop is as fast).
    const MAX_CANDIDATES: usize = 16;
    /// The candidates must cover this many of the sample's bytes (97%).
    const COVER: u32 = 993;
    /// Bytes counted between checks that the leftovers stay rare.
    const STRETCH: usize = 4 << 10;

    /// The counts of `p`, or None where it is short, the processor lacks AVX-512 BW, or a
    /// few values do not cover its sample.
    pub fn histogram(p: &[u8]) -> Option<[u32; 256]> {
        if p.len() < 4 * SAMPLE || !super::super::avx512() {
            return None;
        }
        let mut sample = [0u32; 256];
        for &b in &p[..SAMPLE] {
            sample[b as usize] += 1;
        }
        let mut order: Vec<u8> = (0..=255u8).filter(|&s| sample[s as usize] > 0).collect();
        order.sort_unstable_by_key(|&s| std::cmp::Reverse(sample[s as usize]));
        let mut covered = 0;
        let mut k = 0;
        while k < order.len() && k < MAX_CANDIDATES && covered < COVER {
            covered += sample[order[k] as usize];
            k += 1;
        }
        if covered < COVER {
            return None;
        }
        // Padded to a count known at compile time (so the counters stay in registers) with
        // values the sample did not have, which are counted like the others.
        let width = if k <= 4 {
            4
        } else if k <= 8 {
            8
        } else {
            16
        };
        let mut candidates = order[..k].to_vec();
        candidates.extend(
            (0..=255u8)
                .filter(|&s| sample[s as usize] == 0)
                .take(width - k),
        );
        // SAFETY: AVX-512 BW, VBMI and POPCNT checked above.
        Some(unsafe {
            match width {
                4 => count::<4>(p, &candidates),
                8 => count::<8>(p, &candidates),
                _ => count::<16>(p, &candidates),
            }
        })
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,popcnt")]
    unsafe fn count<const K: usize>(p: &[u8], candidates: &[u8]) -> [u32; 256] {
        let mut h = [0u32; 256];
        // Byte b of `member` (b < 128) / of `member_hi` (b >= 128) is 0xFF for a candidate.
        let mut table = [0u8; 256];
        for &c in candidates {
            table[c as usize] = 0xFF;
        }
        let lo = _mm512_loadu_si512(table.as_ptr() as *const __m512i);
        let lo2 = _mm512_loadu_si512(table.as_ptr().add(64) as *const __m512i);
        let hi = _mm512_loadu_si512(table.as_ptr().add(128) as *const __m512i);
        let hi2 = _mm512_loadu_si512(table.as_ptr().add(192) as *const __m512i);
        let values: [__m512i; K] = std::array::from_fn(|i| _mm512_set1_epi8(candidates[i] as i8));
        // Per-lane byte counters, summed into `n` before they can wrap (255 steps).
        let mut acc = [_mm512_setzero_si512(); K];
        let mut n = [0u64; K];
        let one = _mm512_set1_epi8(1);
        let flush = |acc: &mut [__m512i; K], n: &mut [u64; K]| {
            for (a, n) in acc.iter_mut().zip(n.iter_mut()) {
                let s = _mm512_sad_epu8(*a, _mm512_setzero_si512());
                *n += _mm512_reduce_add_epi64(s) as u64;
                *a = _mm512_setzero_si512();
            }
        };
        let body = p.len() / 64 * 64;
        let (mut at, mut left_over, mut steps) = (0, 0usize, 0u32);
        while at < body {
            let end = (at + STRETCH).min(body);
            while at < end {
                // SAFETY: at + 64 <= body <= p.len().
                let v = _mm512_loadu_si512(p.as_ptr().add(at) as *const __m512i);
                for (a, &c) in acc.iter_mut().zip(&values) {
                    *a = _mm512_mask_add_epi8(*a, _mm512_cmpeq_epi8_mask(v, c), *a, one);
                }
                // Candidates by table lookup: the low 7 bits index 128 entries, the top
                // bit picks the half.
                let in_lo = _mm512_permutex2var_epi8(lo, v, lo2);
                let in_hi = _mm512_permutex2var_epi8(hi, v, hi2);
                let top = _mm512_movepi8_mask(v);
                let member = _mm512_mask_blend_epi8(top, in_lo, in_hi);
                let mut rest = !_mm512_movepi8_mask(member);
                if rest != 0 {
                    left_over += rest.count_ones() as usize;
                    while rest != 0 {
                        h[p[at + rest.trailing_zeros() as usize] as usize] += 1;
                        rest &= rest - 1;
                    }
                }
                steps += 1;
                if steps == 255 {
                    flush(&mut acc, &mut n);
                    steps = 0;
                }
                at += 64;
            }
            if left_over * 8 > at {
                break;
            }
        }
        flush(&mut acc, &mut n);
        let tail = super::histogram_scalar(&p[at..]);
        for (h, t) in h.iter_mut().zip(tail) {
            *h += t;
        }
        for (&c, &n) in candidates.iter().zip(&n) {
            h[c as usize] += n as u32;
        }
        h
    }
}

/// Huffman code lengths for `counts` (zero where a count is zero), at most [`MAX_BITS`].
///
/// Plain Huffman over the symbols sorted by (count, symbol), merging the two lightest nodes
/// and taking a leaf before an internal node of equal weight. Where codes come out longer
/// than 11 bits, the number of codes of each length is adjusted as JPEG does (Annex K.3:
/// the deepest pair moves up, a shorter code splits to make room, which keeps the code
/// complete), and lengths are handed out again, the longest to the rarest symbols. Every
/// step is deterministic, so the kernel builds the very same table.
pub fn code_lengths(counts: &[u32; 256]) -> [u8; 256] {
    let mut leaves: Vec<(u32, u8)> = (0..=255u8)
        .filter(|&s| counts[s as usize] > 0)
        .map(|s| (counts[s as usize], s))
        .collect();
    leaves.sort_unstable();
    let n = leaves.len();
    let mut lens = [0u8; 256];
    if n == 1 {
        lens[leaves[0].1 as usize] = 1;
        return lens;
    }
    // Nodes 0..n are the leaves in sorted order, n.. the internal nodes in creation order
    // (their weights never decrease, so both lists stay sorted: the two-queue method).
    let mut weight = [0u64; 511];
    let mut parent = [0u16; 511];
    for (w, &(c, _)) in weight.iter_mut().zip(&leaves) {
        *w = u64::from(c);
    }
    let (mut li, mut ii, mut next) = (0usize, n, n);
    for _ in 0..n - 1 {
        let mut take = || {
            if ii >= next || (li < n && weight[li] <= weight[ii]) {
                li += 1;
                li - 1
            } else {
                ii += 1;
                ii - 1
            }
        };
        let (a, b) = (take(), take());
        weight[next] = weight[a] + weight[b];
        parent[a] = next as u16;
        parent[b] = next as u16;
        next += 1;
    }
    // Depths from the root (the last node) down: parents are made after their children.
    let root = 2 * n - 2;
    let mut depth = [0u8; 511];
    for v in (0..root).rev() {
        depth[v] = depth[parent[v] as usize] + 1;
    }
    // Codes per length (a tree over at most 256 leaves is at most 255 deep).
    let mut count = [0u32; 256];
    for &d in &depth[..n] {
        count[d as usize] += 1;
    }
    let limit = MAX_BITS as usize;
    for i in (limit + 1..256).rev() {
        while count[i] > 0 {
            let mut j = i - 2;
            while count[j] == 0 {
                j -= 1;
            }
            count[i] -= 2;
            count[i - 1] += 1;
            count[j + 1] += 2;
            count[j] -= 1;
        }
    }
    // The longest lengths to the rarest symbols (the front of the sorted leaves).
    let mut at = 0;
    for len in (1..=limit).rev() {
        for _ in 0..count[len] {
            lens[leaves[at].1 as usize] = len as u8;
            at += 1;
        }
    }
    lens
}

/// A bit writer as zstd's decoders read a bitstream backwards: bits fill a little-endian
/// word from its low end; `finish` adds the end mark (one 1 bit) and pads to a byte.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn new() -> Bits {
        Bits {
            out: Vec::new(),
            acc: 0,
            n: 0,
        }
    }

    /// Appends the low `len` bits of `v` (at most 32).
    fn put(&mut self, v: u32, len: u32) {
        debug_assert!(len <= 32 && (len == 32 || v >> len == 0));
        self.acc |= u64::from(v) << self.n;
        self.n += len;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// The bytes, the last partial byte included (no end mark: an FSE table description).
    fn bytes(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }

    /// The bytes with the end mark (a bitstream).
    fn finish(mut self) -> Vec<u8> {
        self.put(1, 1);
        self.bytes()
    }
}

/// Probabilities of the weight values normalised to `1 << WEIGHT_LOG`, every present value at
/// least 1: each gets `count * 64 / n` (at least 1), the shortfall goes to the most frequent
/// value (the first of equals), an excess comes off the largest share one at a time (the
/// first of equals). None where fewer than two values occur: FSE cannot code one value.
fn normalize(counts: &[u32; 16], n: u32) -> Option<[u32; 16]> {
    let table = 1u32 << WEIGHT_LOG;
    if counts.iter().filter(|&&c| c > 0).count() < 2 {
        return None;
    }
    let mut norm: [u32; 16] = std::array::from_fn(|s| {
        if counts[s] == 0 {
            0
        } else {
            (counts[s] * table / n).max(1)
        }
    });
    let mut sum: u32 = norm.iter().sum();
    if sum < table {
        let top = (0..16).fold(0, |b, s| if counts[s] > counts[b] { s } else { b });
        norm[top] += table - sum;
        sum = table;
    }
    while sum > table {
        let top = (0..16).fold(0, |b, s| if norm[s] > norm[b] { s } else { b });
        norm[top] -= 1;
        sum -= 1;
    }
    Some(norm)
}

/// The FSE table description (RFC 8878 4.1.1) of `norm`: the accuracy log, then each value's
/// probability + 1 in a variable number of bits, zero probabilities followed by 2-bit repeat
/// flags, up to the last value with a probability.
fn table_description(norm: &[u32; 16], bits: &mut Bits) {
    let log = WEIGHT_LOG;
    bits.put(log - 5, 4);
    let (mut remaining, mut threshold, mut nb) = ((1i32 << log) + 1, 1i32 << log, log + 1);
    let (mut s, mut after_zero) = (0usize, false);
    while remaining > 1 {
        if after_zero {
            let mut start = s;
            while norm[s] == 0 {
                s += 1;
            }
            while s >= start + 3 {
                bits.put(3, 2);
                start += 3;
            }
            bits.put((s - start) as u32, 2);
        }
        let p = norm[s] as i32;
        s += 1;
        // Values below `max` take one bit less; those from `threshold` on are shifted up.
        let max = 2 * threshold - 1 - remaining;
        remaining -= p;
        let mut v = p + 1;
        if v >= threshold {
            v += max;
        }
        bits.put(v as u32, if v < max { nb - 1 } else { nb });
        after_zero = v == 1;
        while remaining < threshold {
            nb -= 1;
            threshold >>= 1;
        }
    }
}

/// The weights of all symbols but the last, FSE-coded as a Huffman tree description (RFC
/// 8878 4.2.1.2): the header byte (the size that follows, below 128), the table description,
/// then a bitstream of two interleaved states, the states of the last two weights written
/// last. None where it cannot be coded or would take 128 bytes or more.
///
/// The decoder counts weights by running out of bits: after the last bit it decodes one
/// more weight from each state, and stops when reading the next state's bits overflows. So
/// each of the last two weights starts from its value's first cell in table order, whose
/// transition always reads at least one bit (a value's first cell reads `6 - log2(p)` bits,
/// and no value has all 64 cells).
pub fn fse_weights(weights: &[u8]) -> Option<Vec<u8>> {
    let n = weights.len();
    if n < 3 {
        return None;
    }
    let mut counts = [0u32; 16];
    for &w in weights {
        counts[w as usize] += 1;
    }
    let norm = normalize(&counts, n as u32)?;
    let size = 1usize << WEIGHT_LOG;
    // Spread (RFC 8878 4.1.1): values in order, each cell `step` after the last, mod size.
    let mut cell_value = [0u8; 64];
    let (mut pos, step) = (0usize, (size >> 1) + (size >> 3) + 3);
    for (v, &p) in norm.iter().enumerate() {
        for _ in 0..p {
            cell_value[pos] = v as u8;
            pos = (pos + step) & (size - 1);
        }
    }
    // Each value's cells in table order: the decoder numbers them so.
    let mut first = [0usize; 17];
    for v in 0..16 {
        first[v + 1] = first[v] + norm[v] as usize;
    }
    let mut cells = [0u32; 64];
    let mut fill = first;
    for (u, &v) in cell_value.iter().enumerate() {
        cells[fill[v as usize]] = u as u32;
        fill[v as usize] += 1;
    }
    let table = size as u32;
    let mut bits = Bits::new();
    table_description(&norm, &mut bits);
    let description = bits.bytes();
    // Encoding runs from the last weight to the first; state 0 codes even positions, state
    // 1 odd ones, as the decoder alternates.
    let start = |v: u8| table + cells[first[v as usize]];
    let mut state = [0u32; 2];
    state[(n - 1) % 2] = start(weights[n - 1]);
    state[(n - 2) % 2] = start(weights[n - 2]);
    let mut stream = Bits::new();
    for i in (0..n - 2).rev() {
        let x = &mut state[i % 2];
        let v = weights[i] as usize;
        let p = norm[v];
        // The fewest bits k with (x >> k) < 2p: from the two bit lengths, then one step
        // (a loop of up to six compares per weight cost a tenth of this function).
        let mut k = (32 - x.leading_zeros()).saturating_sub(32 - (2 * p).leading_zeros());
        if (*x >> k) >= 2 * p {
            k += 1;
        }
        stream.put(*x & ((1 << k) - 1), k);
        *x = table + cells[first[v] + ((*x >> k) - p) as usize];
    }
    stream.put(state[1] - table, WEIGHT_LOG);
    stream.put(state[0] - table, WEIGHT_LOG);
    let stream = stream.finish();
    let len = description.len() + stream.len();
    if len > MAX_TREE_BYTES {
        return None;
    }
    let mut out = Vec::with_capacity(1 + len);
    out.push(len as u8);
    out.extend_from_slice(&description);
    out.extend_from_slice(&stream);
    Some(out)
}

/// The tree description of `lens` (symbols `0..=max_sym`, codes at most `max_bits` long):
/// the direct 4-bit form where every symbol is at most 128 and it is no longer than the FSE
/// form, else the FSE form; None where neither can describe it.
fn tree_description(lens: &[u8; 256], max_sym: usize, max_bits: u32) -> Option<Vec<u8>> {
    let weight = |s: usize| {
        if lens[s] == 0 {
            0
        } else {
            (max_bits + 1 - u32::from(lens[s])) as u8
        }
    };
    // The last symbol's weight is implied by the others.
    let weights: Vec<u8> = (0..max_sym).map(weight).collect();
    let fse = fse_weights(&weights);
    let direct_len = 1 + max_sym.div_ceil(2);
    if max_sym <= MAX_DIRECT_SYMBOL && fse.as_ref().is_none_or(|f| direct_len <= f.len()) {
        let mut out = Vec::with_capacity(direct_len);
        out.push((127 + max_sym) as u8);
        for pair in weights.chunks(2) {
            out.push(pair[0] << 4 | pair.get(1).copied().unwrap_or(0));
        }
        return Some(out);
    }
    fse
}

/// Slack after each stream's region of the scratch buffer: the writer stores whole words.
const STREAM_SLACK: usize = 16;

/// The four Huffman streams' segments of a piece of `n` bytes: `(n + 3) / 4` bytes each,
/// the last the rest.
fn segments(n: usize) -> [(usize, usize); 4] {
    let seg = n.div_ceil(4);
    std::array::from_fn(|k| ((k * seg).min(n), ((k + 1) * seg).min(n)))
}

/// The four segments of a piece of `n` bytes, and the size of the region of `scratch` each
/// one's stream is written to (11 bits a symbol and the writers' slack), `scratch` grown to
/// hold the four.
fn stream_regions(n: usize, scratch: &mut Vec<u8>) -> ([(usize, usize); 4], usize) {
    let region = (n.div_ceil(4) * MAX_BITS as usize).div_ceil(8) + STREAM_SLACK;
    scratch.resize(4 * region, 0);
    (segments(n), region)
}

/// One stream's bit writer over its region of the scratch buffer.
struct Stream {
    at: *mut u8,
    start: *mut u8,
    acc: u64,
    n: u32,
}

impl Stream {
    /// The streams of segments `pair` and `pair + 1`, each at the start of its region of
    /// `region` bytes from `base`.
    ///
    /// # Safety
    /// `base` holds at least `(pair + 2) * region` bytes.
    unsafe fn pair(base: *mut u8, region: usize, pair: usize) -> [Stream; 2] {
        std::array::from_fn(|i| {
            // SAFETY: within the caller's buffer, as the caller promises.
            let start = unsafe { base.add((pair + i) * region) };
            Stream {
                at: start,
                start,
                acc: 0,
                n: 0,
            }
        })
    }

    /// `e`: the code in the low 16 bits, its length above.
    #[inline(always)]
    fn put(&mut self, e: u32) {
        self.acc |= u64::from(e & 0xFFFF) << self.n;
        self.n += e >> 16;
    }

    /// Stores the word and keeps the bits of the last partial byte (at most 7): after at
    /// most 4 codes of at most 11 bits the word never overflows.
    ///
    /// # Safety
    /// `at` has 8 writable bytes: regions hold 11 bits per symbol plus `STREAM_SLACK`.
    #[inline(always)]
    unsafe fn flush(&mut self) {
        (self.at as *mut u64).write_unaligned(self.acc.to_le());
        let bytes = self.n >> 3;
        self.at = self.at.add(bytes as usize);
        self.acc >>= bytes * 8;
        self.n &= 7;
    }

    /// Adds the end mark; the stream's length in bytes.
    unsafe fn finish(&mut self) -> usize {
        self.put(1 << 16 | 1);
        self.flush();
        self.at.offset_from(self.start) as usize + usize::from(self.n > 0)
    }
}

/// Writes the four streams of `piece` into `scratch` (one region each) and returns their
/// lengths. Each segment is written from its end, the last symbol first (the decoder reads
/// backwards), four codes at a time: their shifts within the group depend only on their
/// own lengths, so the writer's state advances once per four symbols, and one stream's
/// state stays in registers (four streams side by side spilled to the stack).
fn write_streams(piece: &[u8], table: &[u32; 256], scratch: &mut Vec<u8>) -> [usize; 4] {
    #[cfg(target_arch = "x86_64")]
    if super::avx512() {
        // SAFETY: AVX-512 F/BW/VBMI and BMI2 checked.
        return unsafe { wide::write_streams(piece, table, scratch) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("bmi2") {
        // SAFETY: BMI2 checked (shifts by a register without the `cl` register: a third
        // faster here).
        return unsafe { write_streams_bmi2(piece, table, scratch) };
    }
    write_streams_with(piece, table, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2")]
unsafe fn write_streams_bmi2(
    piece: &[u8],
    table: &[u32; 256],
    scratch: &mut Vec<u8>,
) -> [usize; 4] {
    write_streams_with(piece, table, scratch)
}

/// Codes of the four symbols in `v` (bytes 3, 2, 1, 0: the last symbol goes in first) as
/// one group of bits and its length: their shifts within the group depend only on their
/// own lengths.
///
/// # Safety
/// `table` points at 256 entries.
#[inline(always)]
unsafe fn group(table: *const u32, v: u32) -> (u64, u32) {
    let e3 = *table.add((v >> 24) as usize);
    let e2 = *table.add((v >> 16 & 0xFF) as usize);
    let e1 = *table.add((v >> 8 & 0xFF) as usize);
    let e0 = *table.add((v & 0xFF) as usize);
    let (l3, l2, l1) = (e3 >> 16, e2 >> 16, e1 >> 16);
    let g = u64::from(e3 & 0xFFFF)
        | u64::from(e2 & 0xFFFF) << l3
        | u64::from(e1 & 0xFFFF) << (l3 + l2)
        | u64::from(e0 & 0xFFFF) << (l3 + l2 + l1);
    (g, l3 + l2 + l1 + (e0 >> 16))
}

#[inline(always)]
fn write_streams_with(piece: &[u8], table: &[u32; 256], scratch: &mut Vec<u8>) -> [usize; 4] {
    let (segs, region) = stream_regions(piece.len(), scratch);
    let base = scratch.as_mut_ptr();
    let t = table.as_ptr();
    let mut sizes = [0usize; 4];
    // Two streams side by side, their state in locals (with iterators and four streams the
    // state spilled to the stack, and writing took over a nanosecond a symbol).
    for pair in [0, 2] {
        // SAFETY: each region is `region` bytes, enough for its segment's codes at 11 bits
        // each plus a word store past the last byte written; regions do not overlap; the
        // input pointers stay within their segments (each step reads the 4 bytes below).
        unsafe {
            let mut s = Stream::pair(base, region, pair);
            let (f0, e0) = segs[pair];
            let (f1, e1) = segs[pair + 1];
            let common = ((e0 - f0) / 4).min((e1 - f1) / 4);
            let (mut p0, mut p1) = (piece.as_ptr().add(e0), piece.as_ptr().add(e1));
            let [s0, s1] = &mut s;
            let mut two = Two::of(s0, s1);
            for _ in 0..common {
                p0 = p0.sub(4);
                p1 = p1.sub(4);
                let (g0, l0) = group(t, (p0 as *const u32).read_unaligned());
                let (g1, l1) = group(t, (p1 as *const u32).read_unaligned());
                two.put(g0, l0, g1, l1);
            }
            two.back(s0, s1);
            for (i, (s, p, from)) in [(s0, p0, f0), (s1, p1, f1)].into_iter().enumerate() {
                let end = p.offset_from(piece.as_ptr()) as usize;
                sizes[pair + i] = finish_segment(s, piece, from, end, table);
            }
        }
    }
    sizes
}

/// Two streams' writer state as plain values, so that it stays in registers while the
/// streams are written side by side (through two `&mut Stream`s it stayed in memory, and
/// writing took over a nanosecond a symbol).
struct Two {
    a: [u64; 2],
    n: [u32; 2],
    at: [*mut u8; 2],
}

impl Two {
    fn of(s0: &Stream, s1: &Stream) -> Two {
        Two {
            a: [s0.acc, s1.acc],
            n: [s0.n, s1.n],
            at: [s0.at, s1.at],
        }
    }

    fn back(self, s0: &mut Stream, s1: &mut Stream) {
        (s0.acc, s0.n, s0.at) = (self.a[0], self.n[0], self.at[0]);
        (s1.acc, s1.n, s1.at) = (self.a[1], self.n[1], self.at[1]);
    }

    /// Appends a group of bits (`g0`, `l0` bits) to the first stream and one to the second,
    /// as `Stream::put` and `flush` do: at most 44 bits onto at most 7.
    ///
    /// # Safety
    /// As `Stream::flush`, for both.
    #[inline(always)]
    unsafe fn put(&mut self, g0: u64, l0: u32, g1: u64, l1: u32) {
        let [mut a0, mut a1] = self.a;
        let [mut n0, mut n1] = self.n;
        let [mut o0, mut o1] = self.at;
        a0 |= g0 << n0;
        n0 += l0;
        a1 |= g1 << n1;
        n1 += l1;
        (o0 as *mut u64).write_unaligned(a0.to_le());
        (o1 as *mut u64).write_unaligned(a1.to_le());
        let (b0, b1) = (n0 >> 3, n1 >> 3);
        o0 = o0.add(b0 as usize);
        o1 = o1.add(b1 as usize);
        a0 >>= b0 * 8;
        a1 >>= b1 * 8;
        n0 &= 7;
        n1 &= 7;
        (self.a, self.n, self.at) = ([a0, a1], [n0, n1], [o0, o1]);
    }
}

/// Writes the symbols of `piece[from..end]` into `s`, four at a time from the end and then
/// the fewer than four at the segment's start, and ends the stream: its length in bytes.
/// Both stream writers finish each segment so, after their faster loops over its end.
///
/// # Safety
/// `s`'s region has room for the segment's codes (as in `write_streams_with`), and
/// `from <= end <= piece.len()`.
#[inline(always)]
unsafe fn finish_segment(
    s: &mut Stream,
    piece: &[u8],
    from: usize,
    mut end: usize,
    table: &[u32; 256],
) -> usize {
    while end - from >= 4 {
        end -= 4;
        let (g, l) = group(
            table.as_ptr(),
            (piece.as_ptr().add(end) as *const u32).read_unaligned(),
        );
        s.acc |= g << s.n;
        s.n += l;
        s.flush();
    }
    for &b in piece[from..end].iter().rev() {
        s.put(table[b as usize]);
    }
    s.flush();
    s.finish()
}

/// Appends a compressed literals section (4 Huffman streams) and an empty sequences section
/// for `piece` with byte `counts` (at least two distinct bytes) to `out`. False, with `out`
/// as it was, where the tree cannot be described or a size does not fit its field.
pub fn literals(
    piece: &[u8],
    counts: &[u32; 256],
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> bool {
    let max_sym = (0..256)
        .rev()
        .find(|&s| counts[s] > 0)
        .expect("two symbols");
    let lens = code_lengths(counts);
    let bits: u64 = (0..=max_sym)
        .map(|s| u64::from(counts[s]) * u64::from(lens[s]))
        .sum();
    literals_with(piece, &lens, max_sym, bits, None, out, scratch)
}

/// [`literals`] with codes of one length for a piece whose bytes vary only in the bits of
/// `mask` (at least one, not all eight) and have `constant` in the others: every one of the
/// `2^v` bytes of that form (v bits in `mask`) gets a `v`-bit code, its rank among them, so
/// no histogram is needed, and the streams are the `mask` bits of each byte packed (one
/// `pext` for eight bytes where the processor has a fast one). Where those bits are uniform
/// (the low mantissa bits and the sign of floats, under a rotation that left constant
/// exponent bits beside them) Huffman coding would give the same lengths.
pub fn fixed_literals(
    piece: &[u8],
    mask: u8,
    constant: u8,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> bool {
    debug_assert!(mask != 0 && mask != 0xFF && constant & mask == 0);
    let (lens, max_sym) = fixed_lengths(mask, constant);
    let bits = piece.len() as u64 * u64::from(mask.count_ones());
    literals_with(
        piece,
        &lens,
        max_sym,
        bits,
        Some((mask, constant)),
        out,
        scratch,
    )
}

/// The code lengths of [`fixed_literals`]: `v` for each byte of the form, and the largest.
fn fixed_lengths(mask: u8, constant: u8) -> ([u8; 256], usize) {
    let v = mask.count_ones() as u8;
    let lens = std::array::from_fn(|s| if s as u8 & !mask == constant { v } else { 0 });
    (lens, usize::from(constant | mask))
}

/// Every form of codes of one length, both ways: the tree description [`fixed_literals`]
/// writes for each (mask, constant), as [`tree_description`] makes it, and the form of each
/// such description. A description equal to one of these bytes for bytes describes exactly
/// that tree, so a decoder may unpack the streams without building a table
/// ([`decode_fixed`]).
struct Forms {
    trees: HashMap<(u8, u8), Box<[u8]>>,
    by_tree: HashMap<Box<[u8]>, (u8, u8)>,
}

/// The [`Forms`], built once (6,304 descriptions, about 8 ms here, under 2 MB).
fn fixed_forms() -> &'static Forms {
    static FORMS: std::sync::OnceLock<Forms> = std::sync::OnceLock::new();
    FORMS.get_or_init(|| {
        let (mut trees, mut by_tree) = (HashMap::new(), HashMap::new());
        for mask in 1..=254u8 {
            for constant in (0..=255u8).filter(|&c| c & mask == 0) {
                let (lens, max_sym) = fixed_lengths(mask, constant);
                if let Some(d) = tree_description(&lens, max_sym, mask.count_ones()) {
                    let d = d.into_boxed_slice();
                    by_tree.insert(d.clone(), (mask, constant));
                    trees.insert((mask, constant), d);
                }
            }
        }
        Forms { trees, by_tree }
    })
}

/// Whether this processor's `pext` and `pdep` are fast: BMI2 on Intel, and on AMD from Zen 3
/// (family 19h) on; Zen 1 and 2 run them in microcode, hundreds of cycles for the masks here,
/// so there the table-driven writer and the zstd library's decoder are used instead.
pub fn fast_bit_scatter() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static FAST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *FAST.get_or_init(|| {
            if !std::arch::is_x86_feature_detected!("bmi2") {
                return false;
            }
            let v = std::arch::x86_64::__cpuid(0);
            let (vendor, sig) = ([v.ebx, v.edx, v.ecx], std::arch::x86_64::__cpuid(1).eax);
            let amd = vendor == [0x6874_7541, 0x6974_6E65, 0x444D_4163]; // "AuthenticAMD"
            let base = sig >> 8 & 0xF;
            let family = base + if base == 0xF { sig >> 20 & 0xFF } else { 0 };
            !amd || family >= 0x19
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Decodes the compressed block `content` (a literals section written by [`fixed_literals`]
/// and an empty sequences section) into `dst`: the tree is looked up among the fixed forms,
/// and each stream's codes are deposited back into the mask's bits eight at a time. False,
/// with `dst` partly written, where the block is not of that form or anything in it does not
/// add up (a stream that does not end exactly at its last code, sizes that do not fit): the
/// caller then decodes the block with the zstd library, which decodes any valid block and
/// refuses a damaged one.
pub fn decode_fixed(content: &[u8], dst: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if fast_bit_scatter() {
        // SAFETY: BMI2 checked (fast_bit_scatter).
        return unsafe { decode_fixed_bmi2(content, dst) };
    }
    let _ = (content, dst);
    false
}

/// The tables of `fixed_wide` for one block (its four streams share a mask): the byte each
/// code becomes, `pdep(code, mask) | constant`, for every 7-bit index (the table repeats
/// every `2^v` entries, so the bits above a code need no mask), and where each output
/// lane's eight codes start in a 64-byte load.
#[cfg(target_arch = "x86_64")]
struct WideTables {
    bytes: [u8; 128],
    gather: [u8; 64],
}

#[cfg(target_arch = "x86_64")]
impl WideTables {
    /// None where `v` bits a code do not fit the 7-bit index.
    #[target_feature(enable = "bmi2")]
    fn new(v: usize, mask: u8, constant: u8) -> Option<WideTables> {
        use std::arch::x86_64::_pdep_u32;
        (1..=7).contains(&v).then(|| WideTables {
            bytes: std::array::from_fn(|i| {
                _pdep_u32(i as u32 & ((1 << v) - 1), u32::from(mask)) as u8 | constant
            }),
            // Output lane g holds the codes `o + 8g ..`: the group nearest the stream's
            // start is the last (codes are read from the end), so lane g starts
            // `v * (7 - g)` bytes in.
            gather: std::array::from_fn(|b| (v * (7 - b / 8) + b % 8) as u8),
        })
    }
}

/// `decode_fixed_bmi2`'s loop 64 codes at a time with AVX-512 VBMI: the `v` bytes that hold
/// each eight codes are gathered into a 64-bit lane each (`vpermb` of one 64-byte load, the
/// stream's bit offset the same for every group since a group is `v` whole bytes), each code
/// is shifted into a byte of its lane (`vpmultishiftqb`), and the bytes are looked up in
/// `t` (`vpermi2b`, which reads the low seven bits of each index). Five instructions for 64
/// bytes, where the scalar loop takes about eight for eight: it was a quarter of a bf16
/// chunk's decode. Returns where it stopped (`o`, `p`); the scalar loops finish the stream.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn fixed_wide(
    t: &WideTables,
    s: &[u8],
    mut p: usize,
    mut o: usize,
    to: usize,
    v: usize,
    dst: &mut [u8],
) -> (usize, usize) {
    use std::arch::x86_64::*;
    if o + 64 > to {
        return (o, p);
    }
    // The bit offset of every group within its bytes: p falls by 64v bits, 8v bytes, a step.
    let shift = (p - 64 * v) % 8;
    let control: [u8; 64] = std::array::from_fn(|b| (shift + (7 - b % 8) * v) as u8);
    let lo = _mm512_loadu_si512(t.bytes.as_ptr().cast());
    let hi = _mm512_loadu_si512(t.bytes.as_ptr().add(64).cast());
    let gather = _mm512_loadu_si512(t.gather.as_ptr().cast());
    let control = _mm512_loadu_si512(control.as_ptr().cast());
    while o + 64 <= to {
        p -= 64 * v;
        let at = p / 8;
        let have = s.len() - at;
        let k: u64 = if have >= 64 { !0 } else { (1 << have) - 1 };
        let x = _mm512_maskz_loadu_epi8(k, s.as_ptr().add(at).cast());
        let lanes = _mm512_permutexvar_epi8(gather, x);
        let codes = _mm512_multishift_epi64_epi8(control, lanes);
        let bytes = _mm512_permutex2var_epi8(lo, codes, hi);
        _mm512_storeu_si512(dst.as_mut_ptr().add(o).cast(), bytes);
        o += 64;
    }
    (o, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2")]
unsafe fn decode_fixed_bmi2(content: &[u8], dst: &mut [u8]) -> bool {
    use std::arch::x86_64::_pdep_u64;
    let Some((header, regenerated, compressed)) = super::frame::literals_header(content) else {
        return false;
    };
    let n = dst.len();
    // Size_Format 0 is one stream (never written here).
    let four_streams = content[0] >> 2 & 3 != 0;
    // As the zstd library reads a one-block frame of the block: no block larger than its
    // content; and only blocks the encoder could have written (it codes no shorter piece).
    if !four_streams
        || regenerated != n
        || header + compressed + 1 != content.len()
        || content[header + compressed] != 0
        || content.len() > n
        || n < super::MIN_HUFFMAN
    {
        return false;
    }
    let section = &content[header..header + compressed];
    let tree_len = match section.first() {
        Some(&h) if h < 128 => 1 + usize::from(h),
        Some(&h) => 1 + (usize::from(h) - 127).div_ceil(2),
        None => return false,
    };
    let Some(&(mask, constant)) = section
        .get(..tree_len)
        .and_then(|d| fixed_forms().by_tree.get(d))
    else {
        return false;
    };
    let Some(jump) = section.get(tree_len..tree_len + 6) else {
        return false;
    };
    let sizes3: [usize; 3] =
        std::array::from_fn(|k| usize::from(u16::from_le_bytes([jump[2 * k], jump[2 * k + 1]])));
    let streams = &section[tree_len + 6..];
    let Some(last) = streams.len().checked_sub(sizes3.iter().sum::<usize>()) else {
        return false;
    };
    let v = mask.count_ones() as usize;
    let wide = u64::from(mask) * 0x0101_0101_0101_0101;
    let fill = u64::from(constant) * 0x0101_0101_0101_0101;
    let field = (1u64 << (8 * v)) - 1;
    let segs = segments(n);
    // Once a block: its four streams share the tables.
    let tables = match super::avx512() {
        true => WideTables::new(v, mask, constant),
        false => None,
    };
    let mut at = 0;
    for (k, size) in [sizes3[0], sizes3[1], sizes3[2], last]
        .into_iter()
        .enumerate()
    {
        let s = &streams[at..at + size];
        at += size;
        let (from, to) = segs[k];
        // The end mark: the highest set bit of the last byte; the codes are below it.
        let Some(&end) = s.last() else { return false };
        if end == 0 || (s.len() - 1) * 8 + (7 - end.leading_zeros() as usize) != (to - from) * v {
            return false;
        }
        // Bits [p - 8v, p) hold the next eight codes, the first of them highest. A word is
        // read from the byte holding bit p - 8v; near the stream's end through a padded copy.
        let word = |bit: usize| -> u64 {
            let b = bit / 8;
            let mut w = [0u8; 8];
            let have = (s.len() - b).min(8);
            w[..have].copy_from_slice(&s[b..b + have]);
            u64::from_le_bytes(w) >> (bit % 8)
        };
        let mut p = (to - from) * v;
        let mut o = from;
        if let Some(t) = &tables {
            // SAFETY: AVX-512 F, BW and VBMI checked (`tables`); `o + 64 <= to <= dst.len()`
            // and loads masked to `s` inside `fixed_wide`.
            (o, p) = fixed_wide(t, s, p, o, to, v, dst);
        }
        while o + 8 <= to {
            p -= 8 * v;
            let w = if p / 8 + 8 <= s.len() {
                (s.as_ptr().add(p / 8) as *const u64)
                    .read_unaligned()
                    .to_le()
                    >> (p % 8)
            } else {
                word(p)
            };
            let bytes = _pdep_u64(w & field, wide).swap_bytes() | fill;
            dst[o..o + 8].copy_from_slice(&bytes.to_le_bytes());
            o += 8;
        }
        while o < to {
            p -= v;
            let code = word(p) & ((1 << v) - 1);
            dst[o] = _pdep_u64(code, u64::from(mask)) as u8 | constant;
            o += 1;
        }
    }
    true
}

/// The section for code lengths `lens` (symbols up to `max_sym`; `bits`: the streams' total
/// bits), the streams packed by mask where `fixed` names the form (mask, constant) whose
/// codes of one length `lens` are.
fn literals_with(
    piece: &[u8],
    lens: &[u8; 256],
    max_sym: usize,
    bits: u64,
    fixed: Option<(u8, u8)>,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> bool {
    let max_bits = u32::from(*lens.iter().max().expect("256 lengths"));
    let tree: Option<Cow<[u8]>> = match fixed {
        Some(form) => fixed_forms()
            .trees
            .get(&form)
            .map(|t| Cow::Borrowed(&t[..])),
        None => tree_description(lens, max_sym, max_bits).map(Cow::Owned),
    };
    let Some(tree) = tree else {
        return false;
    };
    // Canonical codes as zstd assigns them: longest codes first, in symbol order within a
    // length, counting up from zero. Table entries hold code and length, one load a symbol.
    // One pass over the symbols from each length's first code: a pass per length with a
    // compare per symbol (11 x 256, mispredicted) was 9% of a float chunk's encoding.
    let mut table = [0u32; 256];
    let mut first = [0u32; MAX_BITS as usize + 1];
    let mut per_len = [0u32; MAX_BITS as usize + 1];
    for &l in &lens[..=max_sym] {
        per_len[usize::from(l)] += 1;
    }
    let mut next = 0u32;
    for len in (1..=max_bits).rev() {
        first[len as usize] = next;
        next += per_len[len as usize] << (max_bits - len);
    }
    debug_assert_eq!(next, 1 << max_bits, "a Huffman tree is complete");
    for (s, &l) in lens[..=max_sym].iter().enumerate() {
        if l > 0 {
            let len = u32::from(l);
            let at = &mut first[usize::from(l)];
            table[s] = *at >> (max_bits - len) | len << 16;
            *at += 1 << (max_bits - len);
        }
    }
    // The streams take at least their bits: where that with the tree and headers is not
    // below the raw size, the block will be stored raw, so nothing is written (the same
    // decision the exact sizes give, at a tenth of the cost).
    if (bits / 8) as usize + tree.len() + 6 + 3 + 1 >= piece.len() {
        return false;
    }
    let sizes = match fixed {
        Some((mask, _)) => write_fixed_streams(piece, mask, &table, scratch),
        None => write_streams(piece, &table, scratch),
    };
    if sizes[..3].iter().any(|&s| s > 0xFFFF) {
        return false;
    }
    let n = piece.len();
    let header_bytes = if n <= 1023 {
        3
    } else if n <= 16383 {
        4
    } else {
        5
    };
    let compressed = tree.len() + 6 + sizes.iter().sum::<usize>();
    // Literals_Block_Type 2 (compressed), Size_Format 1/2/3 (four streams, 10/14/18-bit
    // sizes), Regenerated_Size, Compressed_Size.
    let (format, field) = match header_bytes {
        3 => (1u64, 10),
        4 => (2, 14),
        _ => (3, 18),
    };
    if compressed >= 1 << field {
        return false;
    }
    let h: u64 = 2 | format << 2 | (n as u64) << 4 | (compressed as u64) << (4 + field);
    out.extend_from_slice(&h.to_le_bytes()[..header_bytes]);
    out.extend_from_slice(&tree);
    for &s in &sizes[..3] {
        out.extend_from_slice(&(s as u16).to_le_bytes());
    }
    let region = scratch.len() / 4;
    for (k, &s) in sizes.iter().enumerate() {
        out.extend_from_slice(&scratch[k * region..k * region + s]);
    }
    // Sequences section: Number_of_Sequences 0.
    out.push(0);
    true
}

/// The four streams of a piece whose codes are the `mask` bits of each byte (`table` holds
/// them as codes too): the same bytes [`write_streams`] writes from `table` (tested), eight
/// symbols a step with BMI2's `pext` where it is fast (the eight bytes reversed, so the last
/// comes first, as the streams are written), else through `table`.
fn write_fixed_streams(
    piece: &[u8],
    mask: u8,
    table: &[u32; 256],
    scratch: &mut Vec<u8>,
) -> [usize; 4] {
    #[cfg(target_arch = "x86_64")]
    if fast_bit_scatter() {
        // SAFETY: BMI2 checked.
        return unsafe { write_fixed_streams_bmi2(piece, mask, table, scratch) };
    }
    let _ = mask;
    write_streams(piece, table, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2")]
unsafe fn write_fixed_streams_bmi2(
    piece: &[u8],
    mask: u8,
    table: &[u32; 256],
    scratch: &mut Vec<u8>,
) -> [usize; 4] {
    use std::arch::x86_64::_pext_u64;
    let (segs, region) = stream_regions(piece.len(), scratch);
    let base = scratch.as_mut_ptr();
    let wide = u64::from(mask) * 0x0101_0101_0101_0101;
    let step = 8 * mask.count_ones();
    let mut sizes = [0usize; 4];
    for pair in [0, 2] {
        // SAFETY: regions as in `write_streams_with` (at most 7 bits a symbol here, where
        // they allow 11); each 8-byte read is of the 8 bytes below `end`, within the
        // segment; after a flush at most 7 bits are pending, so 56 more fit in the word.
        let mut s = Stream::pair(base, region, pair);
        for (i, st) in s.iter_mut().enumerate() {
            let (from, mut end) = segs[pair + i];
            while end - from >= 8 {
                end -= 8;
                let v = (piece.as_ptr().add(end) as *const u64).read_unaligned();
                st.acc |= _pext_u64(u64::from_le(v).swap_bytes(), wide) << st.n;
                st.n += step;
                st.flush();
            }
            sizes[pair + i] = finish_segment(st, piece, from, end, table);
        }
    }
    sizes
}

/// The four streams with AVX-512: codes of 64 symbols looked up at once (byte permutes over
/// the code table split into bytes) and merged in registers into sixteen groups of four,
/// each group's bits as the scalar writer's `group` makes them; the groups are then appended
/// one by one as there. The same bytes as [`write_streams_with`] (the tests compare them),
/// about half its work a symbol: the lookups and in-group shifts were most of it.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{finish_segment, stream_regions, Stream, Two};
    use std::arch::x86_64::*;

    /// The code table as four 64-byte registers each of code bytes (low 8 bits) and of
    /// high bits with the length (`code >> 8 | len << 3`).
    struct Tables {
        lo: [__m512i; 4],
        hl: [__m512i; 4],
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    unsafe fn tables(table: &[u32; 256]) -> Tables {
        let lo: [u8; 256] = std::array::from_fn(|s| table[s] as u8);
        let hl: [u8; 256] =
            std::array::from_fn(|s| ((table[s] & 0xFFFF) >> 8 | (table[s] >> 16) << 3) as u8);
        let ld =
            |t: &[u8; 256], k: usize| _mm512_loadu_si512(t.as_ptr().add(64 * k) as *const __m512i);
        Tables {
            lo: std::array::from_fn(|k| ld(&lo, k)),
            hl: std::array::from_fn(|k| ld(&hl, k)),
        }
    }

    /// The 16 groups of the 64 symbols at `p` (group `g`: symbols `4g..4g + 4`, the last
    /// of them in the lowest bits) and their lengths in bits.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    unsafe fn groups(p: *const u8, t: &Tables, out: &mut [u64; 16], lens: &mut [u64; 16]) {
        let v = _mm512_loadu_si512(p as *const __m512i);
        let top = _mm512_movepi8_mask(v);
        let look = |r: &[__m512i; 4]| {
            _mm512_mask_blend_epi8(
                top,
                _mm512_permutex2var_epi8(r[0], v, r[1]),
                _mm512_permutex2var_epi8(r[2], v, r[3]),
            )
        };
        let (lo, hl) = (look(&t.lo), look(&t.hl));
        for half in 0..2 {
            let (lo, hl) = if half == 0 {
                (_mm512_castsi512_si256(lo), _mm512_castsi512_si256(hl))
            } else {
                (
                    _mm512_extracti64x4_epi64::<1>(lo),
                    _mm512_extracti64x4_epi64::<1>(hl),
                )
            };
            let (lo, hl) = (_mm512_cvtepu8_epi16(lo), _mm512_cvtepu8_epi16(hl));
            let code = _mm512_or_si512(
                lo,
                _mm512_slli_epi16::<8>(_mm512_and_si512(hl, _mm512_set1_epi16(7))),
            );
            let len = _mm512_srli_epi16::<3>(hl);
            // Pairs (u32 lanes): symbol 2k + 1 first (low bits), then 2k.
            let low16 = _mm512_set1_epi32(0xFFFF);
            let (c_even, c_odd) = (_mm512_and_si512(code, low16), _mm512_srli_epi32::<16>(code));
            let (l_even, l_odd) = (_mm512_and_si512(len, low16), _mm512_srli_epi32::<16>(len));
            let pair = _mm512_or_si512(c_odd, _mm512_sllv_epi32(c_even, l_odd));
            let plen = _mm512_add_epi32(l_even, l_odd);
            // Groups (u64 lanes): pair 2m + 1 first, then 2m.
            let low32 = _mm512_set1_epi64(0xFFFF_FFFF);
            let (p_even, p_odd) = (_mm512_and_si512(pair, low32), _mm512_srli_epi64::<32>(pair));
            let (q_even, q_odd) = (_mm512_and_si512(plen, low32), _mm512_srli_epi64::<32>(plen));
            let group = _mm512_or_si512(p_odd, _mm512_sllv_epi64(p_even, q_odd));
            let glen = _mm512_add_epi64(q_even, q_odd);
            _mm512_storeu_si512(out.as_mut_ptr().add(8 * half) as *mut __m512i, group);
            _mm512_storeu_si512(lens.as_mut_ptr().add(8 * half) as *mut __m512i, glen);
        }
    }

    /// Appends 16 groups, the last first (symbols are written from the end).
    #[inline(always)]
    unsafe fn append(s: &mut Stream, g: &[u64; 16], l: &[u64; 16]) {
        for k in (0..16).rev() {
            s.acc |= g[k] << s.n;
            s.n += l[k] as u32;
            s.flush();
        }
    }

    /// # Safety
    /// AVX-512 F/BW/VBMI and BMI2 are available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,bmi2")]
    pub unsafe fn write_streams(
        piece: &[u8],
        table: &[u32; 256],
        scratch: &mut Vec<u8>,
    ) -> [usize; 4] {
        let (segs, region) = stream_regions(piece.len(), scratch);
        let base = scratch.as_mut_ptr();
        let t = tables(table);
        let mut sizes = [0usize; 4];
        let (mut g0, mut l0, mut g1, mut l1) = ([0u64; 16], [0u64; 16], [0u64; 16], [0u64; 16]);
        for pair in [0, 2] {
            // SAFETY (all below): regions as in `write_streams_with`; each 64-byte load is
            // of the 64 symbols below `p`, within the segment (`p - 64 >= from`).
            let mut s = Stream::pair(base, region, pair);
            let seg = [segs[pair], segs[pair + 1]];
            let mut p = seg.map(|(_, e)| piece.as_ptr().add(e));
            let blocks = seg.map(|(f, e)| (e - f) / 64);
            let [s0, s1] = &mut s;
            let mut two = Two::of(s0, s1);
            for _ in 0..blocks[0].min(blocks[1]) {
                p[0] = p[0].sub(64);
                p[1] = p[1].sub(64);
                groups(p[0], &t, &mut g0, &mut l0);
                groups(p[1], &t, &mut g1, &mut l1);
                for k in (0..16).rev() {
                    two.put(g0[k], l0[k] as u32, g1[k], l1[k] as u32);
                }
            }
            two.back(s0, s1);
            for (i, s) in [s0, s1].into_iter().enumerate() {
                let from = piece.as_ptr().add(seg[i].0);
                while p[i].offset_from(from) >= 64 {
                    p[i] = p[i].sub(64);
                    groups(p[i], &t, &mut g0, &mut l0);
                    append(s, &g0, &l0);
                }
                let end = p[i].offset_from(piece.as_ptr()) as usize;
                sizes[pair + i] = finish_segment(s, piece, seg[i].0, end, table);
            }
        }
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests' pseudo-random words (xorshift64), from `seed`.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The AVX-512 stream writer writes the bytes the scalar one writes: skewed and flat
    /// pieces, bytes above 127 (the upper half of the lookup), lengths around every block and
    /// group boundary of the four segments.
    #[test]
    fn wide_streams_equal_the_scalar_streams() {
        use std::sync::atomic::Ordering::Relaxed;
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        let mut lens: Vec<usize> = (64..600).step_by(7).collect();
        lens.extend([1023, 1024, 1025, 4096, 16_384 + 3, 65_536, 131_071]);
        for len in lens {
            for kind in 0..3 {
                let piece: Vec<u8> = (0..len)
                    .map(|_| {
                        let r = next();
                        match kind {
                            0 => 0x78 + (r >> 8).trailing_zeros().min(20) as u8,
                            1 => r as u8,
                            _ => 0xF0 | (r & 3) as u8 | ((r >> 9).is_multiple_of(97) as u8 * 8),
                        }
                    })
                    .collect();
                let counts = histogram(&piece);
                if counts.iter().filter(|&&c| c > 0).count() < 2 {
                    continue;
                }
                let run = |wide_off: bool| {
                    super::super::NO_AVX512.store(wide_off, Relaxed);
                    let (mut out, mut scratch) = (Vec::new(), Vec::new());
                    let ok = literals(&piece, &counts, &mut out, &mut scratch);
                    super::super::NO_AVX512.store(false, Relaxed);
                    (ok, out)
                };
                assert_eq!(run(false), run(true), "len {len} kind {kind}");
            }
        }
    }

    /// Codes of one length: the packed streams are the bytes the table-driven writer makes
    /// from the same lengths (every mask width, constants in any bits, lengths that leave a
    /// segment remainder of every size), and the section decodes to the piece.
    #[test]
    fn fixed_streams_equal_the_table_streams_and_decode() {
        let mut next = xorshift(0x1234_5678_9ABC_DEF1);
        let masks = [0x01u8, 0x80, 0xF8, 0x7E, 0xFE, 0x7F, 0xE7, 0x3C, 0xAA];
        let mut lens: Vec<usize> = (64..200).step_by(13).collect();
        lens.extend([1023, 4099, 16_384, 65_536 + 5]);
        for mask in masks {
            for &len in &lens {
                let constant = (next() as u8) & !mask;
                let piece: Vec<u8> = (0..len).map(|_| next() as u8 & mask | constant).collect();
                let v = mask.count_ones() as u8;
                let table_lens: [u8; 256] =
                    std::array::from_fn(|s| if s as u8 & !mask == constant { v } else { 0 });
                let max_sym = usize::from(constant | mask);
                let bits = len as u64 * u64::from(v);
                let (mut a, mut b, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
                let packed = fixed_literals(&piece, mask, constant, &mut a, &mut scratch);
                let table = literals_with(
                    &piece,
                    &table_lens,
                    max_sym,
                    bits,
                    None,
                    &mut b,
                    &mut scratch,
                );
                assert_eq!((packed, &a), (table, &b), "mask {mask:#x} len {len}");
                // The encoder stores a block raw unless the section is smaller (a compressed
                // block may be no larger than the frame's content, here the piece).
                if !packed || a.len() >= len {
                    continue;
                }
                // A one-block frame of the section, as the zstd library reads it.
                let mut frame = super::super::ZSTD_MAGIC.to_le_bytes().to_vec();
                frame.push(0xA0);
                frame.extend_from_slice(&(len as u32).to_le_bytes());
                let h = 1u32 | 2 << 1 | (a.len() as u32) << 3;
                frame.extend_from_slice(&h.to_le_bytes()[..3]);
                frame.extend_from_slice(&a);
                let got = zstd::bulk::decompress(&frame, len)
                    .unwrap_or_else(|e| panic!("mask {mask:#x} len {len}: {e}"));
                assert_eq!(got, piece, "mask {mask:#x} len {len}");
                // Unpacked without the library: the same bytes, where `pdep` is fast, with
                // and without the AVX-512 loop (64 codes a step).
                use std::sync::atomic::Ordering::Relaxed;
                let mut unpacked = vec![0u8; len];
                let fast = fast_bit_scatter();
                for wide_off in [false, true] {
                    super::super::NO_AVX512.store(wide_off, Relaxed);
                    unpacked.fill(0);
                    let ok = decode_fixed(&a, &mut unpacked);
                    super::super::NO_AVX512.store(false, Relaxed);
                    assert_eq!(ok, fast, "mask {mask:#x} len {len}");
                    if fast {
                        assert_eq!(unpacked, piece, "mask {mask:#x} len {len} {wide_off}");
                    }
                }
                // Damaged anywhere: unpacked only where the library reads the same bytes.
                for _ in 0..8 {
                    let mut bad = a.clone();
                    let bit = next() as usize % (bad.len() * 8);
                    bad[bit / 8] ^= 1 << (bit % 8);
                    if decode_fixed(&bad, &mut unpacked) {
                        let mut frame = frame.clone();
                        let at = frame.len() - bad.len();
                        frame[at..].copy_from_slice(&bad);
                        let lib = zstd::bulk::decompress(&frame, len).ok();
                        assert_eq!(
                            lib.as_ref(),
                            Some(&unpacked),
                            "mask {mask:#x} len {len} bit {bit}"
                        );
                    }
                }
            }
        }
    }

    /// The histogram counts exactly what the scalar loop counts, whichever way it runs: planes
    /// of a few values (the compare path), with rare values among them and at odd places,
    /// planes whose sample is a few values and whose rest is not (the path gives up midway),
    /// planes of many values (never taken), at lengths that are no multiple of 64.
    #[test]
    fn histogram_counts_what_the_scalar_loop_counts() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for len in [0, 63, 4095, 4096, 4161, 16_384, 65_536 + 37, 131_072] {
            let few: Vec<u8> = (0..len)
                .map(|_| {
                    let r = next();
                    // Geometric over about a dozen values, 1 in 500 anything.
                    if r.is_multiple_of(500) {
                        (r >> 20) as u8
                    } else {
                        0x70 + (r >> 8).trailing_zeros().min(15) as u8
                    }
                })
                .collect();
            let mut turning = few.clone();
            for b in turning.iter_mut().skip(len / 2) {
                *b = next() as u8;
            }
            let many: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let one = vec![0x7Fu8; len];
            for p in [&few, &turning, &many, &one] {
                assert_eq!(histogram(p), histogram_scalar(p), "len {len}");
            }
        }
    }

    #[test]
    fn code_lengths_are_complete_and_limited() {
        // Fibonacci counts make the deepest possible tree: the limit must cut it.
        let mut counts = [0u32; 256];
        let (mut a, mut b) = (1u32, 1u32);
        for c in counts.iter_mut().take(30) {
            *c = a;
            (a, b) = (b, a + b);
        }
        for counts in [counts, [1u32; 256], {
            let mut c = [0u32; 256];
            c[3] = 10;
            c[200] = 1;
            c
        }] {
            let lens = code_lengths(&counts);
            let max = *lens.iter().max().unwrap() as u32;
            assert!(max <= MAX_BITS);
            let kraft: u64 = lens
                .iter()
                .filter(|&&l| l > 0)
                .map(|&l| 1u64 << (max - l as u32))
                .sum();
            assert_eq!(kraft, 1 << max, "complete tree");
            for s in 0..256 {
                assert_eq!(lens[s] > 0, counts[s] > 0);
            }
        }
    }

    /// Normalised probabilities sum to the table and keep every present value.
    #[test]
    fn normalized_weights_fill_the_table() {
        let mut x = 3u64;
        for _ in 0..2000 {
            let mut counts = [0u32; 16];
            let n = 3 + (x % 253) as u32;
            for _ in 0..n {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                counts[(x % 12) as usize * usize::from(!x.is_multiple_of(5))] += 1;
            }
            let Some(norm) = normalize(&counts, n) else {
                assert!(counts.iter().filter(|&&c| c > 0).count() < 2);
                continue;
            };
            assert_eq!(norm.iter().sum::<u32>(), 1 << WEIGHT_LOG);
            for s in 0..16 {
                assert_eq!(norm[s] > 0, counts[s] > 0);
                assert!(norm[s] < 1 << WEIGHT_LOG);
            }
        }
    }
}
