//! The float codec's transforms: rotation by one bit and byte planes, with SIMD where the
//! processor has it, and the fused pass the encoder uses (rotate and split in one read).

use super::Transform;

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
    forward(data, unrotated(width))
}

/// Inverse of [`shuffle`].
pub fn unshuffle(data: &[u8], width: usize) -> Vec<u8> {
    inverse(data, unrotated(width))
}

fn unrotated(width: usize) -> Transform {
    assert!(matches!(width, 1 | 2 | 4 | 8), "byte-plane width {width}");
    Transform {
        width: width as u8,
        rotate: false,
    }
}

/// Splits `elems` into `W` planes (or joins planes back into elements, `join`): 16
/// elements a step with SIMD where the processor has it (`simd`), then eight at a time, so
/// each plane row gets eight contiguous bytes per step; a width known at compile time lets
/// the compiler unroll the byte moves.
pub(super) fn planes<const W: usize>(src: &[u8], dst: &mut [u8], join: bool) {
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
                unsafe { x86::split::<false>(src, dst, w, n, n16) };
                return n16;
            }
        }
        let _ = (src, dst, w, n, join);
        0
    }

    /// Elements (a multiple of 16) of the `n` in `src` rotated left by one bit (as one
    /// bit string, the byte before the first being the last) and split into planes in `dst`.
    pub fn split_rotated(src: &[u8], dst: &mut [u8], w: usize, n: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let n16 = n / 16 * 16;
            assert!(src.len() >= n * w && dst.len() >= n * w && !src.is_empty());
            if std::arch::is_x86_feature_detected!("ssse3") {
                // SAFETY: SSSE3 checked; loads and stores as in `split` (within `n * w` bytes,
                // asserted), plus the one byte `src[len - 1]` read by index.
                unsafe { x86::split::<true>(src, dst, w, n, n16) };
                return n16;
            }
        }
        let _ = (src, dst, w, n);
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

        /// One 16-byte vector of the rotated bit string at byte `at`: `v << 1` per byte,
        /// or'd with the top bit of the byte before it (the last byte of `prev`, the vector
        /// loaded before this one).
        #[inline(always)]
        unsafe fn ld_rotated(src: &[u8], at: usize, prev: &mut __m128i) -> __m128i {
            let v = ld(src, at);
            let before = _mm_alignr_epi8::<15>(v, *prev);
            *prev = v;
            let top = _mm_and_si128(_mm_srli_epi16::<7>(before), _mm_set1_epi8(1));
            _mm_or_si128(_mm_add_epi8(v, v), top)
        }

        /// Elements to planes, rotated left by one bit first (`ROT`) or not.
        #[target_feature(enable = "ssse3")]
        pub unsafe fn split<const ROT: bool>(
            src: &[u8],
            dst: &mut [u8],
            w: usize,
            n: usize,
            n16: usize,
        ) {
            // The byte before the first is the chunk's last (the rotation wraps around).
            let last = if ROT { src[src.len() - 1] } else { 0 };
            let mut prev = _mm_insert_epi16::<7>(_mm_setzero_si128(), i32::from(last) << 8);
            // Loads come at increasing offsets 16 bytes apart, so `prev` is the vector before.
            macro_rules! load {
                ($at:expr) => {
                    if ROT {
                        ld_rotated(src, $at, &mut prev)
                    } else {
                        ld(src, $at)
                    }
                };
            }
            for e in (0..n16).step_by(16) {
                match w {
                    2 => {
                        let m = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                        let x0 = _mm_shuffle_epi8(load!(e * 2), m);
                        let x1 = _mm_shuffle_epi8(load!(e * 2 + 16), m);
                        st(dst, e, _mm_unpacklo_epi64(x0, x1));
                        st(dst, n + e, _mm_unpackhi_epi64(x0, x1));
                    }
                    4 => {
                        let m = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
                        let mut y = [_mm_setzero_si128(); 4];
                        for (k, y) in y.iter_mut().enumerate() {
                            *y = _mm_shuffle_epi8(load!(e * 4 + 16 * k), m);
                        }
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
                        let mut y = [_mm_setzero_si128(); 8];
                        for (k, y) in y.iter_mut().enumerate() {
                            *y = _mm_shuffle_epi8(load!(e * 8 + 16 * k), m);
                        }
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
    let mut out = vec![0u8; data.len()];
    forward_into(data, t, &mut out);
    out
}

/// [`forward`] into `dst` (as long as `data`): one pass that reads each byte once, rotating
/// the 16-byte vectors it loads before splitting them where the processor has SSSE3.
pub fn forward_into(data: &[u8], t: Transform, dst: &mut [u8]) {
    assert_eq!(data.len(), dst.len());
    let w = t.width as usize;
    if !t.rotate {
        return split_or_join(data, dst, w, false);
    }
    let len = data.len();
    if len == 0 {
        return;
    }
    let n = len / w;
    let done = if w == 1 {
        0
    } else {
        simd::split_rotated(data, dst, w, n)
    };
    // Rotated byte i: b[i] << 1 | b[i - 1] >> 7, the byte before the first being the last.
    let rb = |i: usize| data[i] << 1 | data[if i == 0 { len - 1 } else { i - 1 }] >> 7;
    for e in done..n {
        for j in 0..w {
            dst[j * n + e] = rb(e * w + j);
        }
    }
    for (i, d) in dst.iter_mut().enumerate().skip(n * w) {
        *d = rb(i);
    }
}

/// [`planes`] for a width known at run time (1: a copy).
fn split_or_join(src: &[u8], dst: &mut [u8], width: usize, join: bool) {
    match width {
        1 => dst.copy_from_slice(src),
        2 => planes::<2>(src, dst, join),
        4 => planes::<4>(src, dst, join),
        8 => planes::<8>(src, dst, join),
        w => panic!("byte-plane width {w}"),
    }
}

/// The chunk whose transformed bytes are `planes`.
pub fn inverse(planes: &[u8], t: Transform) -> Vec<u8> {
    let mut out = vec![0u8; planes.len()];
    inverse_into(planes, t, &mut out);
    out
}

/// [`inverse`] into `dst` (as long as `planes`).
pub fn inverse_into(planes: &[u8], t: Transform, dst: &mut [u8]) {
    assert_eq!(planes.len(), dst.len());
    split_or_join(planes, dst, t.width as usize, true);
    if t.rotate {
        rotate_right(dst);
    }
}
