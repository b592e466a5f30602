//! The float codec's encoder: byte planes, entropy-coded, written as a standard zstd frame.
//!
//! Floats barely compress with LZ4: neighbouring values share no byte strings. What they do
//! share is a skewed distribution of each byte *position*: the exponent byte of N(0, 0.02)
//! weights carries about 2.5 bits of information, the mantissa bytes nearly 8. So a chunk is
//! transformed and then each byte position is entropy-coded on its own:
//!
//! 1. **rotate** (optional): the whole chunk, read as one little-endian bit string, is rotated
//!    left by one bit: `t[i] = b[i] << 1 | b[i-1] >> 7`. For IEEE floats of any width at any
//!    alignment this puts the whole exponent into one byte (bf16, fp32) or the top 8 of its
//!    11 bits into one byte (fp64), and moves the sign bit into the low mantissa byte, where it
//!    costs nothing. It needs no element boundaries, so chunks cut anywhere in an array work.
//! 2. **planes** of width `w` (1, 2, 4 or 8): all bytes at positions `0 mod w`, then all at
//!    `1 mod w`, ... (`shuffle`), trailing bytes that make no whole element last. Order-0
//!    entropy does not depend on where elements start, so no phase is needed either.
//! 3. One **zstd frame** (RFC 8878) of the transformed bytes: frame content size set, no
//!    checksum (chunks are named by blake3 and verified on every read), and per plane blocks
//!    of at most 128 KiB that are RLE (a constant plane), raw (a plane that does not
//!    compress), or compressed with Huffman-coded literals only: four streams, the tree
//!    written directly as 4-bit weights, and zero sequences. No match finder, no FSE: a GPU
//!    produces exactly these bytes with a histogram, a table and bit packing
//!    (`cuda/float.cu` is the same algorithm, checked byte for byte against this file).
//!
//! Any zstd decoder decodes the frame into the transformed bytes; undoing steps 2 and 1 is
//! [`inverse`]. A plane whose largest byte value is over 128 is stored raw: the direct weight
//! form describes at most 129 symbols, and such planes (mantissa bytes, bytes with the sign
//! of an unrotated float) are close to 8 bits of entropy anyway.

/// The zstd frame magic number.
pub const ZSTD_MAGIC: u32 = 0xFD2F_B528;
/// Largest block zstd allows.
pub const BLOCK_MAX: usize = 128 << 10;
/// Longest Huffman code zstd allows.
pub const MAX_BITS: u32 = 11;
/// Pieces shorter than this are stored raw: a table and a jump table cost more than they
/// could save.
pub const MIN_HUFFMAN: usize = 64;
/// Largest byte value a directly written Huffman tree can describe.
pub const MAX_DIRECT_SYMBOL: usize = 128;
/// Bytes of a frame before its first block: magic, descriptor, 4-byte content size.
pub const FRAME_HEADER: usize = 9;

/// The most bytes a frame of a `len`-byte chunk takes: every block raw, with its 3-byte
/// header, plus the frame header (the kernel's `ckpt_float_bound`).
pub fn bound(len: usize) -> usize {
    len + FRAME_HEADER + 3 * ((len >> 17) + 10)
}

/// How a chunk is transformed before entropy coding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transform {
    /// Byte-plane width: 1 (no split), 2, 4 or 8.
    pub width: u8,
    /// Rotate the chunk left by one bit first.
    pub rotate: bool,
}

impl Transform {
    pub const WIDTHS: [u8; 4] = [1, 2, 4, 8];

    /// Every transform, in the order ties are broken (narrow and unrotated first).
    pub fn all() -> impl Iterator<Item = Transform> {
        [false, true].into_iter().flat_map(|rotate| {
            Transform::WIDTHS
                .into_iter()
                .map(move |width| Transform { width, rotate })
        })
    }

    /// A number 0..8 for codec ids: `log2(width) * 2 + rotate`.
    pub fn index(self) -> u8 {
        self.width.trailing_zeros() as u8 * 2 + self.rotate as u8
    }

    pub fn from_index(i: u8) -> Option<Transform> {
        (i < 8).then(|| Transform {
            width: 1 << (i / 2),
            rotate: i % 2 == 1,
        })
    }
}

/// Rotates `data` left by one bit, as one little-endian bit string, in place.
pub fn rotate_left(data: &mut [u8]) {
    let Some(&last) = data.last() else { return };
    let mut carry = u64::from(last >> 7);
    // Eight bytes at a time as one little-endian word: the same bit string.
    let mut words = data.chunks_exact_mut(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        w.copy_from_slice(&(v << 1 | carry).to_le_bytes());
        carry = v >> 63;
    }
    for b in words.into_remainder() {
        let next = *b >> 7;
        *b = *b << 1 | carry as u8;
        carry = u64::from(next);
    }
}

/// Inverse of [`rotate_left`].
pub fn rotate_right(data: &mut [u8]) {
    let Some(&first) = data.first() else { return };
    // Walks from the end; `carry` is the low bit of the (original) byte after the current one.
    let mut carry = first & 1;
    let words_len = data.len() / 8 * 8;
    let (words, rest) = data.split_at_mut(words_len);
    for b in rest.iter_mut().rev() {
        let next = *b & 1;
        *b = *b >> 1 | carry << 7;
        carry = next;
    }
    for w in words.chunks_exact_mut(8).rev() {
        let v = u64::from_le_bytes((&*w).try_into().expect("8 bytes"));
        w.copy_from_slice(&(v >> 1 | u64::from(carry) << 63).to_le_bytes());
        carry = (v & 1) as u8;
    }
}

/// Byte planes: output byte `j * n + e` is byte `j` of element `e`, for `n = len / width`
/// elements; trailing bytes that make no whole element are copied last as they are.
pub fn shuffle(data: &[u8], width: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    match width {
        1 => out.copy_from_slice(data),
        2 => planes::<2>(data, &mut out, false),
        4 => planes::<4>(data, &mut out, false),
        8 => planes::<8>(data, &mut out, false),
        w => panic!("byte-plane width {w}"),
    }
    out
}

/// Inverse of [`shuffle`].
pub fn unshuffle(data: &[u8], width: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    match width {
        1 => out.copy_from_slice(data),
        2 => planes::<2>(data, &mut out, true),
        4 => planes::<4>(data, &mut out, true),
        8 => planes::<8>(data, &mut out, true),
        w => panic!("byte-plane width {w}"),
    }
    out
}

/// Splits `elems` into `W` planes (or joins planes back into elements, `join`): 16
/// elements a step with SIMD where the processor has it (`simd`), then eight at a time, so
/// each plane row gets eight contiguous bytes per step; a width known at compile time lets
/// the compiler unroll the byte moves.
fn planes<const W: usize>(src: &[u8], dst: &mut [u8], join: bool) {
    let n = src.len() / W;
    let done = simd::planes(src, dst, W, n, join);
    let n8 = done + (n - done) / 8 * 8;
    for g in (done..n8).step_by(8) {
        for j in 0..W {
            let row = j * n + g;
            if join {
                let r: [u8; 8] = src[row..row + 8].try_into().expect("8 bytes");
                let el = &mut dst[g * W..(g + 8) * W];
                for (i, v) in r.into_iter().enumerate() {
                    el[i * W + j] = v;
                }
            } else {
                let el = &src[g * W..(g + 8) * W];
                let r: [u8; 8] = std::array::from_fn(|i| el[i * W + j]);
                dst[row..row + 8].copy_from_slice(&r);
            }
        }
    }
    for e in n8..n {
        for j in 0..W {
            if join {
                dst[e * W + j] = src[j * n + e];
            } else {
                dst[j * n + e] = src[e * W + j];
            }
        }
    }
    let body = n * W;
    dst[body..].copy_from_slice(&src[body..]);
}

/// Byte planes 16 elements at a time in SSE registers: joining interleaves plane rows with
/// unpack instructions (SSE2, in every x86-64), splitting gathers each element's bytes with
/// a byte shuffle first (SSSE3, detected at run time). Elsewhere nothing is done here and
/// the portable loop does all of it.
mod simd {
    /// Elements (a multiple of 16) of the `n` in `src` moved to `dst`.
    pub fn planes(src: &[u8], dst: &mut [u8], w: usize, n: usize, join: bool) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let n16 = n / 16 * 16;
            assert!(src.len() >= n * w && dst.len() >= n * w);
            if join {
                // SAFETY: SSE2 is part of x86-64; every load and store below is of 16 bytes
                // within plane rows `j * n + e` (e + 16 <= n16) of `src` and elements
                // `e * w .. (e + 16) * w` of `dst`, both within `n * w` bytes (asserted).
                unsafe { x86::join(src, dst, w, n, n16) };
                return n16;
            }
            if std::arch::is_x86_feature_detected!("ssse3") {
                // SAFETY: as above, with SSSE3 checked.
                unsafe { x86::split(src, dst, w, n, n16) };
                return n16;
            }
        }
        let _ = (src, dst, w, n, join);
        0
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[inline(always)]
        unsafe fn ld(p: &[u8], at: usize) -> __m128i {
            _mm_loadu_si128(p.as_ptr().add(at) as *const __m128i)
        }

        #[inline(always)]
        unsafe fn st(p: &mut [u8], at: usize, v: __m128i) {
            _mm_storeu_si128(p.as_mut_ptr().add(at) as *mut __m128i, v)
        }

        /// Planes to elements.
        #[target_feature(enable = "sse2")]
        pub unsafe fn join(src: &[u8], dst: &mut [u8], w: usize, n: usize, n16: usize) {
            for e in (0..n16).step_by(16) {
                let p = |j: usize| ld(src, j * n + e);
                match w {
                    2 => {
                        let (a, b) = (p(0), p(1));
                        st(dst, e * 2, _mm_unpacklo_epi8(a, b));
                        st(dst, e * 2 + 16, _mm_unpackhi_epi8(a, b));
                    }
                    4 => {
                        let (a, b, c, d) = (p(0), p(1), p(2), p(3));
                        let (ab_lo, ab_hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
                        let (cd_lo, cd_hi) = (_mm_unpacklo_epi8(c, d), _mm_unpackhi_epi8(c, d));
                        st(dst, e * 4, _mm_unpacklo_epi16(ab_lo, cd_lo));
                        st(dst, e * 4 + 16, _mm_unpackhi_epi16(ab_lo, cd_lo));
                        st(dst, e * 4 + 32, _mm_unpacklo_epi16(ab_hi, cd_hi));
                        st(dst, e * 4 + 48, _mm_unpackhi_epi16(ab_hi, cd_hi));
                    }
                    8 => {
                        let r: [__m128i; 8] = std::array::from_fn(p);
                        // Bytes 2k, 2k+1 of elements 0-7 (lo) and 8-15 (hi), as u16 lanes.
                        let pair_lo: [__m128i; 4] =
                            std::array::from_fn(|k| _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]));
                        let pair_hi: [__m128i; 4] =
                            std::array::from_fn(|k| _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]));
                        for (half, pairs) in [pair_lo, pair_hi].iter().enumerate() {
                            // Bytes 0-3 and 4-7 of elements 0-3 / 4-7 of this half, as u32.
                            let q03 = _mm_unpacklo_epi16(pairs[0], pairs[1]);
                            let q47 = _mm_unpackhi_epi16(pairs[0], pairs[1]);
                            let r03 = _mm_unpacklo_epi16(pairs[2], pairs[3]);
                            let r47 = _mm_unpackhi_epi16(pairs[2], pairs[3]);
                            let base = (e + 8 * half) * 8;
                            st(dst, base, _mm_unpacklo_epi32(q03, r03));
                            st(dst, base + 16, _mm_unpackhi_epi32(q03, r03));
                            st(dst, base + 32, _mm_unpacklo_epi32(q47, r47));
                            st(dst, base + 48, _mm_unpackhi_epi32(q47, r47));
                        }
                    }
                    _ => unreachable!("width {w}"),
                }
            }
        }

        /// Elements to planes.
        #[target_feature(enable = "ssse3")]
        pub unsafe fn split(src: &[u8], dst: &mut [u8], w: usize, n: usize, n16: usize) {
            for e in (0..n16).step_by(16) {
                match w {
                    2 => {
                        let m = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                        let x0 = _mm_shuffle_epi8(ld(src, e * 2), m);
                        let x1 = _mm_shuffle_epi8(ld(src, e * 2 + 16), m);
                        st(dst, e, _mm_unpacklo_epi64(x0, x1));
                        st(dst, n + e, _mm_unpackhi_epi64(x0, x1));
                    }
                    4 => {
                        let m = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
                        let y: [__m128i; 4] =
                            std::array::from_fn(|k| _mm_shuffle_epi8(ld(src, e * 4 + 16 * k), m));
                        let t0 = _mm_unpacklo_epi32(y[0], y[1]);
                        let t1 = _mm_unpackhi_epi32(y[0], y[1]);
                        let t2 = _mm_unpacklo_epi32(y[2], y[3]);
                        let t3 = _mm_unpackhi_epi32(y[2], y[3]);
                        st(dst, e, _mm_unpacklo_epi64(t0, t2));
                        st(dst, n + e, _mm_unpackhi_epi64(t0, t2));
                        st(dst, 2 * n + e, _mm_unpacklo_epi64(t1, t3));
                        st(dst, 3 * n + e, _mm_unpackhi_epi64(t1, t3));
                    }
                    8 => {
                        let m = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
                        // y[r]: byte j of elements 2r and 2r+1 as u16 lane j.
                        let y: [__m128i; 8] =
                            std::array::from_fn(|k| _mm_shuffle_epi8(ld(src, e * 8 + 16 * k), m));
                        let a: [__m128i; 8] = std::array::from_fn(|k| {
                            let (p, q) = (y[2 * (k / 2)], y[2 * (k / 2) + 1]);
                            if k % 2 == 0 {
                                _mm_unpacklo_epi16(p, q)
                            } else {
                                _mm_unpackhi_epi16(p, q)
                            }
                        });
                        // b: lanes j, j+1 of four element pairs, as u32.
                        let b = [
                            _mm_unpacklo_epi32(a[0], a[2]),
                            _mm_unpackhi_epi32(a[0], a[2]),
                            _mm_unpacklo_epi32(a[1], a[3]),
                            _mm_unpackhi_epi32(a[1], a[3]),
                            _mm_unpacklo_epi32(a[4], a[6]),
                            _mm_unpackhi_epi32(a[4], a[6]),
                            _mm_unpacklo_epi32(a[5], a[7]),
                            _mm_unpackhi_epi32(a[5], a[7]),
                        ];
                        for k in 0..4 {
                            st(dst, 2 * k * n + e, _mm_unpacklo_epi64(b[k], b[k + 4]));
                            st(dst, (2 * k + 1) * n + e, _mm_unpackhi_epi64(b[k], b[k + 4]));
                        }
                    }
                    _ => unreachable!("width {w}"),
                }
            }
        }
    }
}

/// The transformed bytes of `data` (rotate, then planes).
pub fn forward(data: &[u8], t: Transform) -> Vec<u8> {
    if !t.rotate {
        return shuffle(data, t.width as usize);
    }
    let mut r = data.to_vec();
    rotate_left(&mut r);
    shuffle(&r, t.width as usize)
}

/// The chunk whose transformed bytes are `planes`.
pub fn inverse(planes: &[u8], t: Transform) -> Vec<u8> {
    let mut out = unshuffle(planes, t.width as usize);
    if t.rotate {
        rotate_right(&mut out);
    }
    out
}

/// The pieces of transformed bytes that get their own blocks: each plane, then the tail.
fn pieces(len: usize, width: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = len / width;
    let planes = (0..width).map(move |j| (j * n, n));
    let tail = (n * width < len).then_some((n * width, len - n * width));
    planes.chain(tail).filter(|&(_, l)| l > 0)
}

/// The zstd frame of `data` under transform `t`. Deterministic: the same input gives the same
/// bytes here and in the CUDA kernel.
pub fn encode(data: &[u8], t: Transform) -> Vec<u8> {
    thread_local! {
        /// Buffers reused from chunk to chunk on a thread (rotated copy, planes, literals,
        /// streams), so encoding allocates and zero-fills nothing but its result. Each is
        /// at most a chunk's size (plus a few bytes).
        static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    }
    SCRATCH.with(|s| encode_with(data, t, &mut s.borrow_mut()))
}

#[derive(Default)]
struct Scratch {
    rotated: Vec<u8>,
    planes: Vec<u8>,
    literals: Vec<u8>,
    streams: Vec<u8>,
}

fn encode_with(data: &[u8], t: Transform, s: &mut Scratch) -> Vec<u8> {
    let src = if t.rotate {
        s.rotated.clear();
        s.rotated.extend_from_slice(data);
        rotate_left(&mut s.rotated);
        &s.rotated[..]
    } else {
        data
    };
    // Every byte is overwritten below: only a change of length touches memory here.
    s.planes.resize(data.len(), 0);
    let planes = &mut s.planes[..];
    match t.width {
        1 => planes.copy_from_slice(src),
        2 => self::planes::<2>(src, planes, false),
        4 => self::planes::<4>(src, planes, false),
        8 => self::planes::<8>(src, planes, false),
        w => panic!("byte-plane width {w}"),
    }
    let planes = &s.planes[..];
    let mut out = Vec::with_capacity(bound(data.len()));
    out.extend_from_slice(&ZSTD_MAGIC.to_le_bytes());
    // Frame_Content_Size_Flag 2 (4 bytes), Single_Segment_Flag: the window is the content,
    // so no window descriptor; no checksum, no dictionary.
    out.push(0xA0);
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    let blocks: Vec<(usize, usize)> = pieces(planes.len(), t.width as usize)
        .flat_map(|(at, len)| {
            (0..len.div_ceil(BLOCK_MAX)).map(move |k| {
                let s = at + k * BLOCK_MAX;
                (s, (at + len - s).min(BLOCK_MAX))
            })
        })
        .collect();
    if blocks.is_empty() {
        // A frame has at least one block: an empty last raw block.
        block_header(&mut out, true, 0, 0);
    }
    for (i, &(at, len)) in blocks.iter().enumerate() {
        encode_block(
            &planes[at..at + len],
            i + 1 == blocks.len(),
            &mut out,
            &mut s.literals,
            &mut s.streams,
        );
    }
    out
}

/// Appends a 3-byte block header: Last_Block, Block_Type (0 raw, 1 RLE, 2 compressed), size.
fn block_header(out: &mut Vec<u8>, last: bool, kind: u32, size: usize) {
    let h = last as u32 | kind << 1 | (size as u32) << 3;
    out.extend_from_slice(&h.to_le_bytes()[..3]);
}

/// Appends one block holding `piece`: RLE when it is one repeated byte, Huffman-coded
/// literals when that is possible and smaller, raw otherwise.
fn encode_block(
    piece: &[u8],
    last: bool,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
    streams: &mut Vec<u8>,
) {
    // Mantissa planes have a byte over 128 within their first few bytes: they skip counting.
    let describable = !piece
        .chunks(64)
        .any(|c| usize::from(c.iter().fold(0, |m, &b| m.max(b))) > MAX_DIRECT_SYMBOL);
    if describable && piece.len() >= MIN_HUFFMAN {
        let seg = segment_histograms(piece);
        let counts: [u32; 256] = std::array::from_fn(|s| seg.iter().map(|h| h[s]).sum());
        if counts.iter().filter(|&&c| c > 0).count() == 1 {
            block_header(out, last, 1, piece.len());
            out.push(piece[0]);
            return;
        }
        scratch.clear();
        if huffman_literals(piece, &counts, &seg, scratch, streams) && scratch.len() < piece.len() {
            block_header(out, last, 2, scratch.len());
            out.extend_from_slice(scratch);
            return;
        }
    } else if piece.iter().all(|&b| b == piece[0]) {
        block_header(out, last, 1, piece.len());
        out.push(piece[0]);
        return;
    }
    block_header(out, last, 0, piece.len());
    out.extend_from_slice(piece);
}

/// The four Huffman streams' segments of a piece of `n` bytes: `(n + 3) / 4` bytes each,
/// the last the rest.
fn segments(n: usize) -> [(usize, usize); 4] {
    let seg = n.div_ceil(4);
    std::array::from_fn(|k| ((k * seg).min(n), ((k + 1) * seg).min(n)))
}

/// Byte counts of each stream segment of `piece`, counted in one interleaved pass: two
/// tables per segment (even and odd positions), eight in all, so a run of one value (the
/// usual case in an exponent plane) does not serialise on one counter in memory.
fn segment_histograms(piece: &[u8]) -> [[u32; 256]; 4] {
    let segs = segments(piece.len());
    let mut h = [[0u32; 256]; 8];
    let common = segs[3].1 - segs[3].0;
    let pairs = common / 2 * 2;
    let parts: [&[u8]; 4] = segs.map(|(from, _)| &piece[from..from + pairs]);
    for i in (0..pairs).step_by(2) {
        for (k, part) in parts.iter().enumerate() {
            h[k][part[i] as usize] += 1;
            h[4 + k][part[i + 1] as usize] += 1;
        }
    }
    for (k, &(from, to)) in segs.iter().enumerate() {
        for &b in &piece[from + pairs..to] {
            h[k][b as usize] += 1;
        }
    }
    std::array::from_fn(|k| std::array::from_fn(|s| h[k][s] + h[4 + k][s]))
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

/// One Huffman stream being written: the way zstd's decoder reads a bitstream, bits fill a
/// little-endian word from its low end, the last symbol first (the decoder reads from the
/// stream's end), then an end mark (one 1 bit) and zero padding.
struct Stream<'a> {
    buf: &'a mut [u8],
    at: usize,
    acc: u64,
    n: u32,
}

impl Stream<'_> {
    #[inline(always)]
    fn put(&mut self, code: u32, len: u8) {
        self.acc |= u64::from(code) << self.n;
        self.n += u32::from(len);
    }

    /// Stores the whole word and keeps the bits of the last partial byte (at most 7): after
    /// at most 4 symbols of at most 11 bits the word never overflows.
    #[inline(always)]
    fn flush(&mut self) {
        self.buf[self.at..self.at + 8].copy_from_slice(&self.acc.to_le_bytes());
        let bytes = self.n / 8;
        self.at += bytes as usize;
        self.acc = self.acc.checked_shr(bytes * 8).unwrap_or(0);
        self.n &= 7;
    }

    fn finish(mut self, dst: &mut [u8]) {
        self.put(1, 1);
        self.flush();
        let len = self.at + usize::from(self.n > 0);
        self.buf[self.at] = self.acc as u8;
        dst.copy_from_slice(&self.buf[..len]);
    }
}

/// Slack after each stream's region in the scratch buffer: a word store at its end.
const STREAM_SLACK: usize = 16;

/// Writes the four streams of `piece` into `dst` (exactly `sizes` bytes each, back to
/// back). The streams are written side by side, four independent bit writers, so the
/// processor overlaps them; each into its own region of `scratch`, since a word store of
/// one would overwrite the next stream's first bytes.
fn huffman_streams(
    piece: &[u8],
    codes: &[u32; 256],
    lens: &[u8; 256],
    sizes: &[usize; 4],
    dst: &mut [u8],
    scratch: &mut Vec<u8>,
) {
    let segs = segments(piece.len());
    scratch.resize(sizes.iter().map(|s| s + STREAM_SLACK).sum(), 0);
    let (b0, rest) = scratch.split_at_mut(sizes[0] + STREAM_SLACK);
    let (b1, rest) = rest.split_at_mut(sizes[1] + STREAM_SLACK);
    let (b2, b3) = rest.split_at_mut(sizes[2] + STREAM_SLACK);
    let mut w = [b0, b1, b2, b3].map(|buf| Stream {
        buf,
        at: 0,
        acc: 0,
        n: 0,
    });
    // Code and length in one table entry: one load a symbol.
    let table: [u32; 256] = std::array::from_fn(|b| codes[b] | u32::from(lens[b]) << 16);
    let mut quads = segs.map(|(from, to)| piece[from..to].rchunks_exact(4));
    // Four symbols of every stream in turn, from their ends; stream 3 may be shorter, and
    // the others go on alone after it.
    let put4 = |s: &mut Stream, q: &[u8]| {
        for &b in q.iter().rev() {
            let e = table[b as usize];
            s.put(e & 0xFFFF, (e >> 16) as u8);
        }
        s.flush();
    };
    while let Some(q3) = quads[3].next() {
        for k in 0..3 {
            let q = quads[k].next().expect("streams 0-2 are at least as long");
            put4(&mut w[k], q);
        }
        put4(&mut w[3], q3);
    }
    for (k, s) in w.iter_mut().enumerate() {
        for q in &mut quads[k] {
            put4(s, q);
        }
        // Fewer than four symbols at the segment's start.
        for &b in quads[k].remainder().iter().rev() {
            let e = table[b as usize];
            s.put(e & 0xFFFF, (e >> 16) as u8);
        }
    }
    let mut at = 0;
    for (k, s) in w.into_iter().enumerate() {
        s.finish(&mut dst[at..at + sizes[k]]);
        at += sizes[k];
    }
}

/// Appends a compressed literals section (4 Huffman streams, tree in direct weights) and an
/// empty sequences section for `piece` with byte `counts` (`seg`: per stream segment).
/// False where this form cannot describe it (a byte over 128, or a single symbol) or a
/// size does not fit its field.
fn huffman_literals(
    piece: &[u8],
    counts: &[u32; 256],
    seg: &[[u32; 256]; 4],
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> bool {
    let Some(max_sym) = (0..256).rev().find(|&s| counts[s] > 0) else {
        return false;
    };
    if max_sym > MAX_DIRECT_SYMBOL || counts.iter().filter(|&&c| c > 0).count() < 2 {
        return false;
    }
    let lens = code_lengths(counts);
    let max_bits = u32::from(*lens.iter().max().expect("256 lengths"));
    // Canonical codes as zstd assigns them: longest codes first, in symbol order within a
    // length, counting up from zero.
    let mut codes = [0u32; 256];
    let mut next = 0u32;
    for len in (1..=max_bits).rev() {
        for s in 0..=max_sym {
            if u32::from(lens[s]) == len {
                codes[s] = next >> (max_bits - len);
                next += 1 << (max_bits - len);
            }
        }
    }
    debug_assert_eq!(next, 1 << max_bits, "a Huffman tree is complete");

    // Literals section header placeholder, filled once the compressed size is known.
    let n = piece.len();
    let header_bytes = if n <= 1023 {
        3
    } else if n <= 16383 {
        4
    } else {
        5
    };
    let start = out.len();
    out.resize(start + header_bytes, 0);
    // Tree description: direct 4-bit weights of symbols 0..max_sym; the last symbol's weight
    // is implied.
    out.push(127 + max_sym as u8);
    let weight = |s: usize| {
        if lens[s] == 0 {
            0
        } else {
            (max_bits + 1 - u32::from(lens[s])) as u8
        }
    };
    for s in (0..max_sym).step_by(2) {
        let hi = weight(s);
        let lo = if s + 1 < max_sym { weight(s + 1) } else { 0 };
        out.push(hi << 4 | lo);
    }
    // Four streams of (n + 3) / 4 bytes each, the last taking the rest, after a jump table.
    // Their sizes follow from the segments' counts: the bits of their codes, an end mark,
    // padding to a byte.
    let sizes: [usize; 4] = std::array::from_fn(|k| {
        let bits: u64 = (0..256)
            .map(|s| u64::from(seg[k][s]) * u64::from(lens[s]))
            .sum();
        (bits as usize + 1).div_ceil(8)
    });
    if sizes[..3].iter().any(|&s| s > 0xFFFF) {
        return false;
    }
    for &s in &sizes[..3] {
        out.extend_from_slice(&(s as u16).to_le_bytes());
    }
    let at = out.len();
    out.resize(at + sizes.iter().sum::<usize>(), 0);
    huffman_streams(piece, &codes, &lens, &sizes, &mut out[at..], scratch);
    let compressed = out.len() - start - header_bytes;
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
    out[start..start + header_bytes].copy_from_slice(&h.to_le_bytes()[..header_bytes]);
    // Sequences section: Number_of_Sequences 0.
    out.push(0);
    true
}

/// Bytes of a chunk's sample that [`choose`] looks at.
pub const SAMPLE: usize = 4 << 10;

/// `n * log2(n)` for every count a sample's plane can have.
fn nlogn_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=SAMPLE as u32)
            .map(|i| {
                if i == 0 {
                    0.0
                } else {
                    i as f32 * (i as f32).log2()
                }
            })
            .collect()
    })
}

/// Bits this codec would need for one plane of a sample with these counts: entropy plus
/// the table (about 4 bits a symbol up to the largest) and headers; raw where the direct
/// tree cannot describe it or coding does not pay; almost nothing for one repeated byte.
fn plane_bits(h: &[u32; 256], nlogn: &[f32]) -> f32 {
    let mut total = 0u32;
    let (mut max_sym, mut distinct, mut sum) = (0usize, 0u32, 0.0f32);
    for (s, &c) in h.iter().enumerate() {
        if c > 0 {
            total += c;
            max_sym = s;
            distinct += 1;
            sum += nlogn[c as usize];
        }
    }
    let raw = 8.0 * total as f32;
    if distinct <= 1 {
        return if total == 0 { 0.0 } else { 32.0 };
    }
    if max_sym > MAX_DIRECT_SYMBOL {
        return raw;
    }
    (nlogn[total as usize] - sum + 4.0 * max_sym as f32 + 128.0).min(raw)
}

fn add(a: &[u32; 256], b: &[u32; 256]) -> [u32; 256] {
    std::array::from_fn(|i| a[i] + b[i])
}

/// The transform that should store `data` smallest, and the estimated stored fraction, from
/// histograms of a sample (the first and middle `SAMPLE / 2` bytes): one pass counts bytes
/// by position mod 8, unrotated and rotated; the planes of width 4, 2 and 1 are sums of
/// those (positions `j mod 4` are `j` and `j + 4 mod 8`, and so on).
pub fn choose(data: &[u8]) -> (Transform, f32) {
    let (a, b): (&[u8], &[u8]) = if data.len() <= SAMPLE {
        (data, &[])
    } else {
        // The middle part starts at a multiple of 8, so positions mod 8 stay aligned.
        let mid = (data.len() / 2) & !7;
        (&data[..SAMPLE / 2], &data[mid..mid + SAMPLE / 2])
    };
    let mut raw = [[0u32; 256]; 8];
    let mut rot = [[0u32; 256]; 8];
    for s in [a, b] {
        let mut prev_top = s.last().map_or(0, |b| b >> 7);
        for (k, &byte) in s.iter().enumerate() {
            raw[k & 7][byte as usize] += 1;
            rot[k & 7][(byte << 1 | prev_top) as usize] += 1;
            prev_top = byte >> 7;
        }
    }
    let total = a.len() + b.len();
    let plain = Transform {
        width: 1,
        rotate: false,
    };
    if total == 0 {
        return (plain, 1.0);
    }
    let nlogn = nlogn_table();
    let mut best = (plain, f32::MAX);
    for (rotate, h8) in [(false, &raw), (true, &rot)] {
        let h4: [[u32; 256]; 4] = std::array::from_fn(|j| add(&h8[j], &h8[j + 4]));
        let h2: [[u32; 256]; 2] = std::array::from_fn(|j| add(&h4[j], &h4[j + 2]));
        let h1 = add(&h2[0], &h2[1]);
        let costs = [
            (1, plane_bits(&h1, nlogn)),
            (2, h2.iter().map(|h| plane_bits(h, nlogn)).sum()),
            (4, h4.iter().map(|h| plane_bits(h, nlogn)).sum()),
            (8, h8.iter().map(|h| plane_bits(h, nlogn)).sum()),
        ];
        for (width, bits) in costs {
            if bits < best.1 {
                best = (Transform { width, rotate }, bits);
            }
        }
    }
    (best.0, best.1 / (8.0 * total as f32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes of xorshift noise from state `x`.
    fn noise(x: &mut u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                *x as u8
            })
            .collect()
    }

    #[test]
    fn rotation_and_planes_invert() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for len in (0..70).chain([4095, 4096, 65_537]) {
            let d = noise(&mut x, len);
            for t in Transform::all() {
                assert_eq!(inverse(&forward(&d, t), t), d, "len {len} {t:?}");
            }
        }
    }

    /// The transforms (SIMD where there is SIMD) equal the format's definition written out
    /// byte by byte: rotated byte `i` is `b[i] << 1 | b[i - 1] >> 7` (wrapping), plane `j`
    /// holds byte `j` of every element, the tail comes last.
    #[test]
    fn transforms_equal_their_definition() {
        let mut x = 7u64;
        for len in (1..80).chain([4095, 4099, 65_541]) {
            let d = noise(&mut x, len);
            for t in Transform::all() {
                let w = t.width as usize;
                let r: Vec<u8> = (0..len)
                    .map(|i| {
                        if t.rotate {
                            d[i] << 1 | d[(i + len - 1) % len] >> 7
                        } else {
                            d[i]
                        }
                    })
                    .collect();
                let n = len / w;
                let mut want = r.clone();
                for e in 0..n {
                    for j in 0..w {
                        want[j * n + e] = r[e * w + j];
                    }
                }
                assert_eq!(forward(&d, t), want, "len {len} {t:?}");
                assert_eq!(inverse(&want, t), d, "len {len} {t:?}");
            }
        }
    }

    #[test]
    fn transform_ids_round_trip() {
        for t in Transform::all() {
            assert_eq!(Transform::from_index(t.index()), Some(t));
        }
        assert_eq!(Transform::from_index(8), None);
    }

    /// Rotation puts an fp32's exponent into one byte whatever the alignment.
    #[test]
    fn rotation_isolates_the_exponent() {
        let v: Vec<u8> = [1.5f32, -1.5, 3.0e-3, -7.0e-6]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        for skew in 0..4 {
            let mut d = vec![0xAAu8; skew];
            d.extend_from_slice(&v);
            let mut r = d.clone();
            rotate_left(&mut r);
            for (k, f) in [1.5f32, -1.5, 3.0e-3, -7.0e-6].iter().enumerate() {
                let exp = (f.to_bits() >> 23 & 0xFF) as u8;
                assert_eq!(r[skew + 4 * k + 3], exp, "skew {skew} value {f}");
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
}
