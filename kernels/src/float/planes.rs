//! The float codec's transforms: rotation by `k` bits (1 or 3) and byte planes, with SIMD where the
//! processor has it, and the fused pass the encoder uses (rotate and split in one read).

use super::Transform;
use std::mem::MaybeUninit;

/// Rotates `data` left by `k` bits (1 to 7), as one little-endian bit string, in place:
/// byte `i` becomes `b[i] << k | b[i - 1] >> (8 - k)`, the byte before the first being the
/// last.
pub fn rotate_left(data: &mut [u8], k: u32) {
    assert!((1..8).contains(&k), "rotation by {k} bits");
    let Some(&last) = data.last() else { return };
    let mut carry = u64::from(last >> (8 - k));
    // Eight bytes at a time as one little-endian word: the same bit string.
    let mut words = data.chunks_exact_mut(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        w.copy_from_slice(&(v << k | carry).to_le_bytes());
        carry = v >> (64 - k);
    }
    for b in words.into_remainder() {
        let next = *b >> (8 - k);
        *b = *b << k | carry as u8;
        carry = u64::from(next);
    }
}

/// Inverse of [`rotate_left`]: byte `i` becomes `t[i] >> k | t[i + 1] << (8 - k)`, the byte
/// after the last being the first. Walks forward, so each byte is written after the byte
/// after it was read: 64 bytes a step as eight 64-bit words where the processor has
/// AVX-512, the rest one byte at a time.
pub fn rotate_right(data: &mut [u8], k: u32) {
    assert!((1..8).contains(&k), "rotation by {k} bits");
    let Some(&first) = data.first() else { return };
    let len = data.len();
    let done = simd::rotate_right(data, k);
    for i in done..len {
        let next = if i + 1 < len { data[i + 1] } else { first };
        data[i] = data[i] >> k | next << (8 - k);
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
        rotate: 0,
    }
}

/// Joins `W` planes back into elements: 16 elements a step with SIMD where the processor
/// has it (`simd`), then eight at a time, so each plane row gives eight contiguous bytes per
/// step; a width known at compile time lets the compiler unroll the byte moves.
fn join<const W: usize>(rows: &[&[u8]], tail: &[u8], dst: &mut [MaybeUninit<u8>]) {
    let n = rows[0].len();
    let done = simd::join(rows, dst, W, n);
    let n8 = done + (n - done) / 8 * 8;
    for g in (done..n8).step_by(8) {
        for (j, row) in rows.iter().enumerate() {
            let r: [u8; 8] = row[g..g + 8].try_into().expect("8 bytes");
            let el = &mut dst[g * W..(g + 8) * W];
            for (i, v) in r.into_iter().enumerate() {
                el[i * W + j].write(v);
            }
        }
    }
    for e in n8..n {
        for (j, row) in rows.iter().enumerate() {
            dst[e * W + j].write(row[e]);
        }
    }
    dst[n * W..].write_copy_of_slice(tail);
}

/// Where a split writes: plane `j`'s `n` bytes at `at[j]`, the tail's (the bytes after the
/// last whole element) at `tail`. Pointers, not slices, so the planes can go straight to
/// their places in a frame between block headers (`encode_plan`), or side by side in one
/// buffer (`forward_into`).
pub(super) struct Planes {
    pub at: [*mut u8; 8],
    pub tail: *mut u8,
}

/// Splits `src` into planes of width `w` at `d`, rotated left by `rotate` bits first (0:
/// not rotated): one pass that reads each byte once.
///
/// # Safety
/// For `n = src.len() / w`: `d.at[j]` (j < w) has `n` writable bytes and `d.tail`
/// `src.len() - n * w`; none of them overlaps `src` or another.
pub(super) unsafe fn split_to(src: &[u8], w: usize, rotate: u8, d: &Planes) {
    let len = src.len();
    if len == 0 {
        return;
    }
    let n = len / w;
    let done = simd::split(src, w, n, rotate, d);
    // Rotated byte i: b[i] << k | b[i - 1] >> (8 - k), the byte before the first being the
    // last.
    let rb = |i: usize| {
        if rotate == 0 {
            src[i]
        } else {
            src[i] << rotate | src[if i == 0 { len - 1 } else { i - 1 }] >> (8 - rotate)
        }
    };
    for e in done..n {
        for (j, &at) in d.at[..w].iter().enumerate() {
            *at.add(e) = rb(e * w + j);
        }
    }
    for i in n * w..len {
        *d.tail.add(i - n * w) = rb(i);
    }
}

/// Byte planes 16 elements at a time in SSE registers: joining interleaves plane rows with
/// unpack instructions (SSE2, in every x86-64), splitting gathers each element's bytes with
/// a byte shuffle first (SSSE3, detected at run time). Elsewhere nothing is done here and
/// the portable loop does all of it.
mod simd {
    use std::mem::MaybeUninit;
    /// Bytes at the start of `data` rotated right by `k` bits (`super::rotate_right`), a
    /// multiple of 64 that leaves at least 8 bytes after it (the last word it reads).
    pub fn rotate_right(data: &mut [u8], k: u32) -> usize {
        #[cfg(target_arch = "x86_64")]
        if data.len() >= 72 && super::super::avx512() {
            // SAFETY: AVX-512 F checked; each step reads bytes at..at + 72 and writes
            // at..at + 64, with at + 72 <= len.
            return unsafe { x86::rotate_right(data, k) };
        }
        let _ = (data, k);
        0
    }

    /// Elements (a multiple of 16) of the `n` in the planes `rows` joined into elements in
    /// `dst`.
    pub fn join(rows: &[&[u8]], dst: &mut [MaybeUninit<u8>], w: usize, n: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let n16 = n / 16 * 16;
            assert!(rows.len() == w && rows.iter().all(|r| r.len() >= n) && dst.len() >= n * w);
            if w <= 4 && super::super::avx512() {
                let n64 = n / 64 * 64;
                // SAFETY: AVX-512 F/BW/VBMI checked; loads of 64 bytes at `e` of each row
                // (e + 64 <= n64 <= n), stores of 64 bytes at `e * w + 64 * k` (k < w),
                // within `n * w` bytes (asserted).
                unsafe { x86::join512(rows, dst, w, n64) };
                return n64;
            }
            // SAFETY: SSE2 is part of x86-64; every load and store below is of 16 bytes at
            // `e` of a row (e + 16 <= n16 <= n) and at elements `e * w .. (e + 16) * w` of
            // `dst`, within `n * w` bytes (asserted).
            unsafe { x86::join(rows, dst, w, n16) };
            return n16;
        }
        #[allow(unreachable_code)]
        {
            let _ = (rows, dst, w, n);
            0
        }
    }

    /// Elements (a multiple of 16) of the `n` in `src` split into the planes `d` names,
    /// rotated left by `rotate` bits first (as one bit string, the byte before the first
    /// being the last; 0: not rotated): 64 elements a step in AVX-512 registers where the
    /// processor has VBMI (one byte permute gathers a register's bytes by plane), else 16
    /// with SSSE3, else none.
    ///
    /// # Safety
    /// As [`super::split_to`].
    pub unsafe fn split(src: &[u8], w: usize, n: usize, rotate: u8, d: &super::Planes) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            assert!(src.len() >= n * w && !src.is_empty());
            if w <= 4 && super::super::avx512() {
                let n64 = n / 64 * 64;
                // SAFETY: AVX-512 F/BW/VBMI checked; loads of 64 bytes at `e * w + 64 * k`
                // (k < w, e + 64 <= n64) lie within `n * w` bytes of `src` (asserted), stores
                // of 64 bytes at `d.at[j] + e` within the plane's `n` bytes (the caller's
                // promise).
                if rotate > 0 {
                    x86::split512::<true>(src, w, n64, d, rotate.into());
                } else {
                    x86::split512::<false>(src, w, n64, d, 0);
                }
                return n64;
            }
            if w > 1 && std::arch::is_x86_feature_detected!("ssse3") {
                let n16 = n / 16 * 16;
                // SAFETY: SSSE3 checked; loads as above of 16 bytes, stores of 16 bytes at
                // `d.at[j] + e` (e + 16 <= n16 <= n), plus the one byte `src[len - 1]`.
                if rotate > 0 {
                    x86::split::<true>(src, w, n16, d, rotate.into());
                } else {
                    x86::split::<false>(src, w, n16, d, 0);
                }
                return n16;
            }
        }
        let _ = (src, w, n, rotate, d);
        0
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::super::Planes;
        use std::arch::x86_64::*;
        use std::mem::MaybeUninit;

        /// [`super::rotate_right`] on 64 bytes a step: word `i` becomes `w[i] >> k |
        /// w[i + 1] << (64 - k)`, the next words read as one load 8 bytes further on.
        #[target_feature(enable = "avx512f")]
        pub unsafe fn rotate_right(data: &mut [u8], k: u32) -> usize {
            let p = data.as_mut_ptr();
            let (right, left) = (
                _mm_cvtsi32_si128(k as i32),
                _mm_cvtsi32_si128(64 - k as i32),
            );
            let mut at = 0;
            while at + 72 <= data.len() {
                let x = _mm512_loadu_si512(p.add(at) as *const __m512i);
                let y = _mm512_loadu_si512(p.add(at + 8) as *const __m512i);
                let r = _mm512_or_si512(_mm512_srl_epi64(x, right), _mm512_sll_epi64(y, left));
                _mm512_storeu_si512(p.add(at) as *mut __m512i, r);
                at += 64;
            }
            at
        }

        /// Planes to elements, 64 a step: the inverse of [`split512`] (the same lane
        /// transpose, then the inverse byte permute).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        pub unsafe fn join512(rows: &[&[u8]], dst: &mut [MaybeUninit<u8>], w: usize, n64: usize) {
            let ld =
                |j: usize, e: usize| _mm512_loadu_si512(rows[j].as_ptr().add(e) as *const __m512i);
            let out = dst.as_mut_ptr().cast::<u8>();
            let st = |at: usize, v: __m512i| _mm512_storeu_si512(out.add(at) as *mut __m512i, v);
            // Byte q of an element register (element q / w, byte q % w) is at q % w * per
            // + q / w of the plane-major register.
            let scatter = |w: usize| -> __m512i {
                let per = 64 / w;
                let idx: [u8; 64] = std::array::from_fn(|q| ((q % w) * per + q / w) as u8);
                _mm512_loadu_si512(idx.as_ptr() as *const __m512i)
            };
            match w {
                1 => {
                    for e in (0..n64).step_by(64) {
                        st(e, ld(0, e));
                    }
                }
                2 => {
                    let m = scatter(2);
                    for e in (0..n64).step_by(64) {
                        let (p0, p1) = (ld(0, e), ld(1, e));
                        let r0 = _mm512_shuffle_i64x2::<0x44>(p0, p1);
                        let r1 = _mm512_shuffle_i64x2::<0xEE>(p0, p1);
                        st(e * 2, _mm512_permutexvar_epi8(m, r0));
                        st(e * 2 + 64, _mm512_permutexvar_epi8(m, r1));
                    }
                }
                4 => {
                    let m = scatter(4);
                    for e in (0..n64).step_by(64) {
                        let p: [__m512i; 4] = std::array::from_fn(|j| ld(j, e));
                        let a = _mm512_shuffle_i64x2::<0x44>(p[0], p[1]);
                        let b = _mm512_shuffle_i64x2::<0x44>(p[2], p[3]);
                        let c = _mm512_shuffle_i64x2::<0xEE>(p[0], p[1]);
                        let d = _mm512_shuffle_i64x2::<0xEE>(p[2], p[3]);
                        let r = [
                            _mm512_shuffle_i64x2::<0x88>(a, b),
                            _mm512_shuffle_i64x2::<0xDD>(a, b),
                            _mm512_shuffle_i64x2::<0x88>(c, d),
                            _mm512_shuffle_i64x2::<0xDD>(c, d),
                        ];
                        for (k, r) in r.into_iter().enumerate() {
                            st(e * 4 + 64 * k, _mm512_permutexvar_epi8(m, r));
                        }
                    }
                }
                _ => unreachable!("width {w}"),
            }
        }

        /// Elements to planes, 64 a step (`w` registers of 64 bytes), rotated left by `k`
        /// bits first (`ROT`) or not: a byte permute gathers each register's bytes by plane (16 bytes of each of
        /// four planes, or 32 of each of two), then 128-bit lanes are shuffled across
        /// registers so that each holds 64 bytes of one plane. The rotation works on 64-bit
        /// lanes (the same little-endian bit string): each lane shifted left by `k`, or'd with
        /// the top `k` bits of the lane before it, the last lane of the register before for
        /// the first.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        pub unsafe fn split512<const ROT: bool>(
            src: &[u8],
            w: usize,
            n64: usize,
            d: &Planes,
            k: u32,
        ) {
            let (left, right) = (
                _mm_cvtsi32_si128(k as i32),
                _mm_cvtsi32_si128(64 - k as i32),
            );
            // Lane 7 of `prev` is the word before the first: its top bits are the chunk's last
            // (only those `k` bits are used).
            let last = u64::from(src[src.len() - 1]) << 56;
            let mut prev = _mm512_set1_epi64(last as i64);
            // [prev.7, v.0, ..., v.6]: each lane's predecessor.
            let before = _mm512_setr_epi64(15, 0, 1, 2, 3, 4, 5, 6);
            let mut load = |at: usize| {
                let v = _mm512_loadu_si512(src.as_ptr().add(at) as *const __m512i);
                if !ROT {
                    return v;
                }
                let p = _mm512_permutex2var_epi64(v, before, prev);
                prev = v;
                _mm512_or_si512(_mm512_sll_epi64(v, left), _mm512_srl_epi64(p, right))
            };
            let put = |j: usize, e: usize, v: __m512i| {
                _mm512_storeu_si512(d.at[j].add(e) as *mut __m512i, v)
            };
            // Output byte p of a register takes source byte idx[p]: plane-major within it.
            let gather = |w: usize| -> __m512i {
                let per = 64 / w;
                let idx: [u8; 64] = std::array::from_fn(|p| ((p % per) * w + p / per) as u8);
                _mm512_loadu_si512(idx.as_ptr() as *const __m512i)
            };
            match w {
                1 => {
                    for e in (0..n64).step_by(64) {
                        put(0, e, load(e));
                    }
                }
                2 => {
                    let m = gather(2);
                    for e in (0..n64).step_by(64) {
                        let r0 = _mm512_permutexvar_epi8(m, load(e * 2));
                        let r1 = _mm512_permutexvar_epi8(m, load(e * 2 + 64));
                        put(0, e, _mm512_shuffle_i64x2::<0x44>(r0, r1));
                        put(1, e, _mm512_shuffle_i64x2::<0xEE>(r0, r1));
                    }
                }
                4 => {
                    let m = gather(4);
                    for e in (0..n64).step_by(64) {
                        let r: [__m512i; 4] = std::array::from_fn(|k| {
                            _mm512_permutexvar_epi8(m, load(e * 4 + 64 * k))
                        });
                        // Lanes 0-1 / 2-3 of r0 and r1, of r2 and r3; then plane j is lane j
                        // of r0..r3.
                        let a = _mm512_shuffle_i64x2::<0x44>(r[0], r[1]);
                        let b = _mm512_shuffle_i64x2::<0x44>(r[2], r[3]);
                        let c = _mm512_shuffle_i64x2::<0xEE>(r[0], r[1]);
                        let dd = _mm512_shuffle_i64x2::<0xEE>(r[2], r[3]);
                        put(0, e, _mm512_shuffle_i64x2::<0x88>(a, b));
                        put(1, e, _mm512_shuffle_i64x2::<0xDD>(a, b));
                        put(2, e, _mm512_shuffle_i64x2::<0x88>(c, dd));
                        put(3, e, _mm512_shuffle_i64x2::<0xDD>(c, dd));
                    }
                }
                _ => unreachable!("width {w}"),
            }
        }

        #[inline(always)]
        unsafe fn ld(p: &[u8], at: usize) -> __m128i {
            _mm_loadu_si128(p.as_ptr().add(at) as *const __m128i)
        }

        #[inline(always)]
        unsafe fn st(p: &mut [MaybeUninit<u8>], at: usize, v: __m128i) {
            _mm_storeu_si128(p.as_mut_ptr().add(at) as *mut __m128i, v)
        }

        /// Planes to elements.
        #[target_feature(enable = "sse2")]
        pub unsafe fn join(rows: &[&[u8]], dst: &mut [MaybeUninit<u8>], w: usize, n16: usize) {
            for e in (0..n16).step_by(16) {
                let p = |j: usize| ld(rows[j], e);
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

        /// How [`ld_rotated`] rotates by `k` bits: the shift counts and the byte masks.
        #[derive(Clone, Copy)]
        struct Rot {
            left: __m128i,
            right: __m128i,
            high: __m128i,
            low: __m128i,
        }

        impl Rot {
            #[inline(always)]
            unsafe fn new(k: u32) -> Rot {
                Rot {
                    left: _mm_cvtsi32_si128(k as i32),
                    right: _mm_cvtsi32_si128(8 - k as i32),
                    high: _mm_set1_epi8((0xFFu8 << k) as i8),
                    low: _mm_set1_epi8(((1u8 << k) - 1) as i8),
                }
            }
        }

        /// One 16-byte vector of the rotated bit string at byte `at`: `v << k` per byte,
        /// or'd with the top `k` bits of the byte before it (the last byte of `prev`, the
        /// vector loaded before this one). The shifts are of 16-bit lanes, the masks keep
        /// each byte's own bits.
        #[inline(always)]
        unsafe fn ld_rotated(src: &[u8], at: usize, prev: &mut __m128i, r: Rot) -> __m128i {
            let v = ld(src, at);
            let before = _mm_alignr_epi8::<15>(v, *prev);
            *prev = v;
            let top = _mm_and_si128(_mm_srl_epi16(before, r.right), r.low);
            _mm_or_si128(_mm_and_si128(_mm_sll_epi16(v, r.left), r.high), top)
        }

        /// Elements to planes, rotated left by `k` bits first (`ROT`) or not.
        #[target_feature(enable = "ssse3")]
        pub unsafe fn split<const ROT: bool>(src: &[u8], w: usize, n16: usize, d: &Planes, k: u32) {
            let rot = Rot::new(if ROT { k } else { 1 });
            let put = |j: usize, e: usize, v: __m128i| {
                _mm_storeu_si128(d.at[j].add(e) as *mut __m128i, v)
            };
            // The byte before the first is the chunk's last (the rotation wraps around).
            let last = if ROT { src[src.len() - 1] } else { 0 };
            let mut prev = _mm_insert_epi16::<7>(_mm_setzero_si128(), i32::from(last) << 8);
            // Loads come at increasing offsets 16 bytes apart, so `prev` is the vector before.
            macro_rules! load {
                ($at:expr) => {
                    if ROT {
                        ld_rotated(src, $at, &mut prev, rot)
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
                        put(0, e, _mm_unpacklo_epi64(x0, x1));
                        put(1, e, _mm_unpackhi_epi64(x0, x1));
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
                        put(0, e, _mm_unpacklo_epi64(t0, t2));
                        put(1, e, _mm_unpackhi_epi64(t0, t2));
                        put(2, e, _mm_unpacklo_epi64(t1, t3));
                        put(3, e, _mm_unpackhi_epi64(t1, t3));
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
                            put(2 * k, e, _mm_unpacklo_epi64(b[k], b[k + 4]));
                            put(2 * k + 1, e, _mm_unpackhi_epi64(b[k], b[k + 4]));
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

/// [`forward`] into `dst` (as long as `data`): the planes side by side, then the tail.
pub fn forward_into(data: &[u8], t: Transform, dst: &mut [u8]) {
    assert_eq!(data.len(), dst.len());
    let w = t.width as usize;
    assert!(matches!(w, 1 | 2 | 4 | 8), "byte-plane width {w}");
    let n = data.len() / w;
    let base = dst.as_mut_ptr();
    // SAFETY: plane j is `dst[j * n..(j + 1) * n]`, the tail `dst[n * w..]`: disjoint, within
    // `dst` (as long as `data`), which is borrowed mutably and so overlaps nothing.
    unsafe {
        let d = Planes {
            at: std::array::from_fn(|j| base.add(j.min(w) * n)),
            tail: base.add(n * w),
        };
        split_to(data, w, t.rotate, &d);
    }
}

/// [`join`] for a width known at run time (1: a copy).
fn join_any(rows: &[&[u8]], tail: &[u8], dst: &mut [MaybeUninit<u8>]) {
    match rows.len() {
        1 => {
            dst[..rows[0].len()].write_copy_of_slice(rows[0]);
            dst[rows[0].len()..].write_copy_of_slice(tail);
        }
        2 => join::<2>(rows, tail, dst),
        4 => join::<4>(rows, tail, dst),
        8 => join::<8>(rows, tail, dst),
        w => panic!("byte-plane width {w}"),
    }
}

/// The chunk whose transformed bytes are `planes`.
pub fn inverse(planes: &[u8], t: Transform) -> Vec<u8> {
    let w = t.width as usize;
    assert!(matches!(w, 1 | 2 | 4 | 8), "byte-plane width {w}");
    let n = planes.len() / w;
    let rows: [&[u8]; 8] =
        std::array::from_fn(|j| &planes[j.min(w) * n..(j.min(w) * n + n).min(planes.len())]);
    inverse_rows(&rows[..w], &planes[n * w..], t)
}

/// [`inverse`] from planes that need not lie side by side (`rows`: `t.width` planes of
/// equal length, then the `tail`), as a frame's raw blocks do. The chunk is joined into new
/// memory that is not cleared first only to be overwritten (clearing 64 KiB is a few percent
/// of decoding it): the join writes every byte.
pub fn inverse_rows(rows: &[&[u8]], tail: &[u8], t: Transform) -> Vec<u8> {
    assert_eq!(rows.len(), t.width as usize);
    let n = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == n));
    let len = n * rows.len() + tail.len();
    let mut out = Vec::with_capacity(len);
    join_any(rows, tail, &mut out.spare_capacity_mut()[..len]);
    // SAFETY: the join wrote every one of the `len` bytes: the rows' n * width bytes
    // element by element, then the tail after them.
    unsafe { out.set_len(len) };
    if t.rotate > 0 {
        rotate_right(&mut out, t.rotate.into());
    }
    out
}
