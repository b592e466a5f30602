//! The float codec's encoder: byte planes, entropy-coded, written as a standard zstd frame.
//!
//! Floats barely compress with LZ4: neighbouring values share no byte strings. What they do
//! share is a skewed distribution of each byte *position*: the exponent byte of N(0, 0.02)
//! weights carries about 2.5 bits of information, the mantissa bytes nearly 8 (real weights
//! and optimizer state often less: bytes a format conversion zeroed, a sign that never
//! changes, exact zeros). So a chunk is transformed and then each byte position is
//! entropy-coded on its own:
//!
//! 1. **rotate** (optional): the whole chunk, read as one little-endian bit string, is rotated
//!    left by one or three bits: `t[i] = b[i] << r | b[i-1] >> (8 - r)`. For IEEE floats of
//!    any width at any alignment one bit puts the whole exponent into one byte (bf16, fp32)
//!    or the top 8 of its 11 bits into one byte (fp64), and moves the sign bit into the low
//!    mantissa byte, where it costs nothing. Three bits put the low six exponent bits and the
//!    top two mantissa bits into that byte, and the sign and the top two exponent bits into
//!    the low byte ([`Transform::ROTATIONS`] says why). It needs no element boundaries, so
//!    chunks cut anywhere in an array work.
//! 2. **planes** of width `w` (1, 2, 4 or 8): all bytes at positions `0 mod w`, then all at
//!    `1 mod w`, ... (`shuffle`), trailing bytes that make no whole element last. Order-0
//!    entropy does not depend on where elements start, so no phase is needed either.
//! 3. One **zstd frame** (RFC 8878) of the transformed bytes: frame content size set, no
//!    checksum (chunks are named by blake3 and verified on every read), and per plane blocks
//!    of at most 128 KiB that are RLE (a constant plane), raw (a plane that does not
//!    compress, or that the plan leaves uncoded), or compressed with Huffman-coded literals
//!    only: four streams, the tree as direct 4-bit weights or as FSE-coded weights
//!    (`huffman`), and zero sequences; where the plan names a plane whose bytes vary only in
//!    some bits, uniformly, its codes are those bits ([`Fixed`]: no histogram, the streams
//!    packed eight bytes an instruction). No match finder: a GPU produces exactly these bytes
//!    with a histogram, a table and bit packing (`cuda/float.cu` is the same algorithm,
//!    checked byte for byte against this file).
//!
//! Which planes are worth a histogram is part of the [`Plan`] ([`choose`] decides it from a
//! sample): on float tensors the mantissa planes are usually within a percent of 8 bits,
//! and skipping them is most of the encoder's speed. Any zstd decoder decodes the frame into
//! the transformed bytes; undoing steps 2 and 1 is [`inverse`].

mod choose;
pub mod frame;
mod huffman;
mod planes;

pub use choose::{choose, choose_for, quick_floor, SAMPLE};
pub use huffman::{
    code_lengths, fse_weights, histogram, histogram_scalar, MAX_BITS, MAX_DIRECT_SYMBOL,
};
pub use planes::{
    forward, forward_into, inverse, inverse_rows, rotate_left, rotate_right, shuffle, unshuffle,
};

/// Whether the AVX-512 paths of this codec run here (detected once): the split and join of
/// planes, the un-rotation, the exponent-plane histogram and the Huffman stream writer all
/// need F, BW and VBMI (byte permutes), the last two also POPCNT and BMI2, which every
/// processor with VBMI has. Elsewhere the SSE and scalar paths run; their results are the
/// same (tested).
#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    #[cfg(test)]
    if NO_AVX512.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("popcnt")
            && std::arch::is_x86_feature_detected!("bmi2")
    })
}

/// Tests set this to run the SSE and scalar paths on a processor with AVX-512 (both must
/// give the same results; CI machines have AVX-512, users' may not). Process-wide: tests
/// running meanwhile take the other paths too, which are as correct.
#[cfg(test)]
static NO_AVX512: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The zstd frame magic number.
pub const ZSTD_MAGIC: u32 = 0xFD2F_B528;
/// Largest block zstd allows.
pub const BLOCK_MAX: usize = 128 << 10;
/// Pieces shorter than this are stored raw: a table and a jump table cost more than they
/// could save.
pub const MIN_HUFFMAN: usize = 64;
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
    /// Bits the chunk is rotated left by first: 0, 1 or 3 ([`Transform::ROTATIONS`]).
    pub rotate: u8,
}

impl Transform {
    pub const WIDTHS: [u8; 4] = [1, 2, 4, 8];
    /// The rotations a transform may have. One bit puts a bf16's or fp32's whole exponent
    /// into one byte (and the sign into the lowest mantissa byte). Three bits put the low
    /// six exponent bits and the top two mantissa bits there instead, and the sign and top
    /// two exponent bits into the lowest byte: where those two bits are constant (every
    /// value between 2^-63 and 2 in magnitude, which weights and optimizer state are) the
    /// lowest plane then codes to six bits a byte, and the mantissa's top bits, skewed by
    /// the exponent (a normal distribution's density falls across each binade above its
    /// standard deviation), are coded together with it: 0.1 to 0.8 points of a tensor
    /// smaller than one bit, at the cost of a second coded plane.
    pub const ROTATIONS: [u8; 3] = [0, 1, 3];

    /// Every transform, in the order ties are broken (narrow and unrotated first).
    pub fn all() -> impl Iterator<Item = Transform> {
        Transform::ROTATIONS.into_iter().flat_map(|rotate| {
            Transform::WIDTHS
                .into_iter()
                .map(move |width| Transform { width, rotate })
        })
    }

    /// A number 0..12 for codec ids: `log2(width) * 2 + rotate` for rotations 0 and 1 (the
    /// ids of the first builds), `8 + log2(width)` for rotation 3.
    pub fn index(self) -> u8 {
        let log = self.width.trailing_zeros() as u8;
        match self.rotate {
            3 => 8 + log,
            r => log * 2 + r,
        }
    }

    pub fn from_index(i: u8) -> Option<Transform> {
        match i {
            0..8 => Some(Transform {
                width: 1 << (i / 2),
                rotate: i % 2,
            }),
            8..12 => Some(Transform {
                width: 1 << (i - 8),
                rotate: 3,
            }),
            _ => None,
        }
    }
}

/// How a chunk is encoded: its transform, and which of its pieces (plane `j` is bit `j`;
/// the tail of trailing bytes is never coded) get a histogram and, where it pays, Huffman
/// coding. The other pieces are stored raw (RLE where one shorter than [`MIN_HUFFMAN`] is one
/// repeated byte). Not recorded: the frame describes itself; the codec id names the
/// transform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    pub transform: Transform,
    pub coded: u16,
    /// A coded plane to try with codes of one length (at most one a chunk).
    pub fixed: Option<Fixed>,
}

/// A coded plane whose sample varied only in the bits of `mask`, uniformly: each block of it
/// whose bytes vary in exactly those bits is coded with `v`-bit codes for the `2^v` bytes of
/// that form ([`huffman::fixed_literals`]: no histogram, the streams packed with one
/// instruction for eight bytes); a block whose bytes vary in other bits too (a zero among
/// the weights, say) gets the histogram and Huffman codes as any coded plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fixed {
    pub plane: u8,
    pub mask: u8,
}

impl Plan {
    /// Every plane tried.
    pub fn every(transform: Transform) -> Plan {
        Plan {
            transform,
            coded: 0xFF,
            fixed: None,
        }
    }

    /// The plan as the kernel takes it: the transform's index in bits 0-3, `coded` in bits
    /// 4-11; a fixed plane's index in bits 12-14 with bit 15 set, its mask in bits 16-23.
    pub fn packed(self) -> u32 {
        let fixed = self.fixed.map_or(0, |f| {
            (8 | u32::from(f.plane)) << 12 | u32::from(f.mask) << 16
        });
        u32::from(self.transform.index()) | u32::from(self.coded & 0xFF) << 4 | fixed
    }
}

/// The pieces of transformed bytes that get their own blocks, as (index, offset, length):
/// each plane `j`, then the tail (index `width`), the empty ones left out.
fn pieces(len: usize, width: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let n = len / width;
    let planes = (0..width).map(move |j| (j, j * n, n));
    let tail = (n * width < len).then_some((width, n * width, len - n * width));
    planes.chain(tail).filter(|&(_, _, l)| l > 0)
}

/// The zstd frame of `data` under transform `t`, every plane tried.
pub fn encode(data: &[u8], t: Transform) -> Vec<u8> {
    encode_plan(data, Plan::every(t))
}

/// The zstd frame of `data` under `plan`. Deterministic: the same input gives the same bytes
/// here and in the CUDA kernel.
pub fn encode_plan(data: &[u8], plan: Plan) -> Vec<u8> {
    thread_local! {
        /// Buffers reused from chunk to chunk on a thread (planes, streams), so encoding
        /// allocates nothing but its result. Each is at most a chunk's size (the streams'
        /// at most 11/8 of a block plus 64 bytes).
        static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    }
    SCRATCH.with(|s| encode_with(data, plan, &mut s.borrow_mut()))
}

#[derive(Default)]
struct Scratch {
    planes: Vec<u8>,
    streams: Vec<u8>,
}

fn encode_with(data: &[u8], plan: Plan, s: &mut Scratch) -> Vec<u8> {
    let t = plan.transform;
    let w = t.width as usize;
    let len = data.len();
    let n = len / w;
    let mut out = Vec::with_capacity(bound(len));
    out.extend_from_slice(&ZSTD_MAGIC.to_le_bytes());
    // Frame_Content_Size_Flag 2 (4 bytes), Single_Segment_Flag: the window is the content,
    // so no window descriptor; no checksum, no dictionary.
    out.push(0xA0);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    // The planes before the first coded one are raw blocks whatever their bytes (an uncoded
    // plane of at least MIN_HUFFMAN bytes in one block): the split writes them straight into
    // the frame after their headers, so most of a float chunk's bytes are moved once, not
    // split into a buffer and copied again. The rest (coded planes, the planes after them,
    // the tail) go to the scratch buffer and are encoded from there.
    let direct = if (MIN_HUFFMAN..=BLOCK_MAX).contains(&n) {
        (plan.coded | !0u16 << w).trailing_zeros() as usize
    } else {
        0
    };
    let frame_start = out.len();
    let rest = len - direct * n;
    s.planes.resize(rest + 4096, 0);
    // The scratch planes start half a page away from their place in the frame (mod 4 KiB):
    // copying a raw plane from a source at nearly the same page offset as its destination
    // stalls every load behind the stores before it (4K aliasing).
    let pad = (out.as_ptr() as usize + frame_start + direct * (n + 3) + 2048)
        .wrapping_sub(s.planes.as_ptr() as usize)
        & 4095;
    {
        let spare = out.spare_capacity_mut();
        assert!(spare.len() >= direct * (n + 3));
        let base = spare.as_mut_ptr() as *mut u8;
        let scratch = s.planes[pad..pad + rest].as_mut_ptr();
        // SAFETY: plane j < direct goes to its block in `out`'s spare capacity (after a
        // 3-byte header, n bytes, within `direct * (n + 3)` bytes: asserted), plane j >=
        // direct to the scratch buffer at `(j - direct) * n`, the tail after the last plane
        // there: disjoint, within `rest` bytes, and neither overlaps `data`.
        unsafe {
            let d = planes::Planes {
                at: std::array::from_fn(|j| {
                    if j < direct {
                        base.add(j * (n + 3) + 3)
                    } else {
                        scratch.add((j.min(w) - direct) * n)
                    }
                }),
                tail: scratch.add((w - direct) * n),
            };
            planes::split_to(data, w, t.rotate, &d);
        }
    }
    let mut blocks: Vec<(usize, usize, Coding)> = Vec::new();
    for (j, at, l) in pieces(len, w).skip(direct) {
        let coding = if j >= w || plan.coded >> j & 1 == 0 {
            Coding::Raw
        } else {
            match plan.fixed {
                Some(f) if usize::from(f.plane) == j => Coding::Fixed(f.mask),
                _ => Coding::Huffman,
            }
        };
        let at = at - direct * n;
        for k in 0..l.div_ceil(BLOCK_MAX) {
            let s = at + k * BLOCK_MAX;
            blocks.push((s, (at + l - s).min(BLOCK_MAX), coding));
        }
    }
    for j in 0..direct {
        let last = j + 1 == direct && blocks.is_empty();
        let h = last as u32 | (n as u32) << 3;
        // SAFETY: within the spare capacity (asserted above); the plane's bytes after it
        // were written by the split.
        unsafe {
            let p = (out.spare_capacity_mut().as_mut_ptr() as *mut u8).add(j * (n + 3));
            std::ptr::copy_nonoverlapping(h.to_le_bytes().as_ptr(), p, 3);
        }
    }
    // SAFETY: the first `direct * (n + 3)` spare bytes are written (headers and planes).
    unsafe { out.set_len(frame_start + direct * (n + 3)) };
    if blocks.is_empty() && direct == 0 {
        // A frame has at least one block: an empty last raw block.
        block_header(&mut out, true, 0, 0);
    }
    let rest = &s.planes[pad..pad + rest];
    for (i, &(at, l, coding)) in blocks.iter().enumerate() {
        let last = i + 1 == blocks.len();
        encode_block(&rest[at..at + l], last, coding, &mut out, &mut s.streams);
    }
    out
}

/// Appends a 3-byte block header: Last_Block, Block_Type (0 raw, 1 RLE, 2 compressed), size.
fn block_header(out: &mut Vec<u8>, last: bool, kind: u32, size: usize) {
    let h = last as u32 | kind << 1 | (size as u32) << 3;
    out.extend_from_slice(&h.to_le_bytes()[..3]);
}

/// How a block is to be written (the plan's word for its plane).
#[derive(Clone, Copy, Debug)]
enum Coding {
    Raw,
    Huffman,
    /// Codes of one length where the block's bytes vary in exactly these bits.
    Fixed(u8),
}

/// The AND and the OR of the bytes of `p` (the bits they all have, and the bits any has).
fn and_or(p: &[u8]) -> (u8, u8) {
    let (mut and, mut or) = (!0u64, 0u64);
    let mut words = p.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        and &= v;
        or |= v;
    }
    let fold = |x: u64, f: fn(u8, u8) -> u8| x.to_le_bytes().into_iter().fold(x as u8, f);
    let (mut and, mut or) = (fold(and, |a, b| a & b), fold(or, |a, b| a | b));
    for &b in words.remainder() {
        and &= b;
        or |= b;
    }
    (and, or)
}

/// Appends one block holding `piece`. A coded piece of at least [`MIN_HUFFMAN`] bytes: RLE
/// when it is one repeated byte, Huffman-coded literals when they are smaller (codes of one
/// length where the plan says so and the bytes vary in exactly its bits), raw otherwise. A
/// shorter piece: RLE or raw. An uncoded one: raw.
///
/// The fixed plane's first byte may be the one exception to its form: a rotation carries the
/// chunk's last bits into its first byte, and a chunk cut anywhere in a tensor ends in
/// another byte of an element than the exponent's. So where every byte but the first has
/// the form, the first goes alone into a raw block of one byte before the rest's.
fn encode_block(
    piece: &[u8],
    last: bool,
    coding: Coding,
    out: &mut Vec<u8>,
    streams: &mut Vec<u8>,
) {
    let rle = |out: &mut Vec<u8>| {
        block_header(out, last, 1, piece.len());
        out.push(piece[0]);
    };
    let raw = |out: &mut Vec<u8>, piece: &[u8]| {
        block_header(out, last, 0, piece.len());
        out.extend_from_slice(piece);
    };
    if piece.len() < MIN_HUFFMAN {
        if piece.iter().all(|&b| b == piece[0]) && !piece.is_empty() {
            return rle(out);
        }
        return raw(out, piece);
    }
    match coding {
        Coding::Raw => return raw(out, piece),
        Coding::Fixed(mask) => {
            // The bits the bytes after the first vary in, and with the first.
            let (and, or) = and_or(&piece[1..]);
            let first = piece[0];
            let whole = (or | first) & !(and & first) == mask;
            if whole || (piece.len() > MIN_HUFFMAN && or & !and == mask) {
                let rest = if whole {
                    piece
                } else {
                    block_header(out, false, 0, 1);
                    out.push(first);
                    &piece[1..]
                };
                let constant = and & !mask;
                if !compressed(rest, last, out, |o| {
                    huffman::fixed_literals(rest, mask, constant, o, streams)
                }) {
                    raw(out, rest)
                }
                return;
            }
        }
        Coding::Huffman => {}
    }
    let counts = histogram(piece);
    if counts.iter().filter(|&&c| c > 0).count() == 1 {
        return rle(out);
    }
    if !compressed(piece, last, out, |o| {
        huffman::literals(piece, &counts, o, streams)
    }) {
        raw(out, piece)
    }
}

/// Appends a compressed block of `piece` whose content `write` appends (false: it could
/// not); true where it did and the block is smaller than `piece` raw, else nothing is left
/// appended.
fn compressed(
    piece: &[u8],
    last: bool,
    out: &mut Vec<u8>,
    write: impl FnOnce(&mut Vec<u8>) -> bool,
) -> bool {
    let at = out.len();
    block_header(out, last, 2, 0);
    if write(out) && out.len() - at - 3 < piece.len() {
        let size = out.len() - at - 3;
        let h = last as u32 | 2 << 1 | (size as u32) << 3;
        out[at..at + 3].copy_from_slice(&h.to_le_bytes()[..3]);
        return true;
    }
    out.truncate(at);
    false
}

#[cfg(test)]
mod tests {
    use super::planes::rotate_left;
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
        check_transforms();
    }

    /// The same with AVX-512 off (the SSE and scalar paths), where the processor has it. The
    /// flag is process-wide: other tests running meanwhile take the other paths too, which
    /// are as correct (this test is what checks that).
    #[test]
    fn transforms_without_avx512_equal_their_definition() {
        use std::sync::atomic::Ordering::Relaxed;
        NO_AVX512.store(true, Relaxed);
        check_transforms();
        NO_AVX512.store(false, Relaxed);
    }

    fn check_transforms() {
        let mut x = 7u64;
        for len in (1..80).chain([4095, 4099, 65_541]) {
            let d = noise(&mut x, len);
            for t in Transform::all() {
                let w = t.width as usize;
                let r: Vec<u8> = (0..len)
                    .map(|i| {
                        let k = t.rotate;
                        if k == 0 {
                            d[i]
                        } else {
                            d[i] << k | d[(i + len - 1) % len] >> (8 - k)
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

    /// A tensor chunk cut mid-element, rotated by three bits: the lowest plane's first byte
    /// takes its low bits from the chunk's last byte (a mantissa byte), so it alone breaks the
    /// plane's form; it gets a raw block of its own and the rest codes of one length, and the
    /// zstd library reads the frame back.
    #[test]
    fn the_fixed_planes_first_byte_may_go_alone() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let weights: Vec<u8> = (0..16_384)
            .flat_map(|_| {
                // N(0, 0.02) by Box-Muller: every exponent below 127, above 64.
                let mut uniform = || {
                    let b = noise(&mut x, 4);
                    (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 8) as f32 / 16_777_216.0
                };
                let (u, v) = (uniform().max(1e-7), uniform());
                (0.02 * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()).to_le_bytes()
            })
            .collect();
        let mut split = 0;
        for len in (65_536 - 11..=65_536).rev() {
            let d = &weights[..len];
            let (plan, _) = choose(d);
            assert_eq!(plan.transform.rotate, 3, "len {len}: {plan:?}");
            let fixed = plan.fixed.expect("a fixed plane");
            assert_eq!(fixed.plane, 0, "len {len}");
            // The first byte breaks the form where the chunk's last byte is not an exponent
            // byte and its top bits differ from the sign and exponent bits of the others.
            let n = len / 4;
            let plane0 = &forward(d, plan.transform)[..n];
            let and = plane0[1..].iter().fold(0xFF, |a, &b| a & b);
            let breaks = plane0[0] & !fixed.mask != and & !fixed.mask;
            assert!(!breaks || len % 4 != 0, "len {len}");
            let frame = encode_plan(d, plan);
            let blocks = frame::blocks(&frame, len).expect("this encoder's frame");
            let alone = blocks[0].len == 1;
            assert_eq!(alone, breaks, "len {len}");
            split += usize::from(alone);
            let rest = &blocks[usize::from(alone)];
            assert!(
                matches!(rest.kind, frame::BlockKind::Literals(_)),
                "len {len}"
            );
            assert_eq!(rest.len, n - usize::from(alone), "len {len}");
            let planes = zstd::bulk::decompress(&frame, len).expect("a valid frame");
            assert_eq!(inverse(&planes, plan.transform), d, "len {len}");
        }
        assert!(
            split >= 3,
            "{split} of 12 lengths had a first byte of its own"
        );
    }

    #[test]
    fn transform_ids_round_trip() {
        for t in Transform::all() {
            assert_eq!(Transform::from_index(t.index()), Some(t));
        }
        assert_eq!(Transform::from_index(12), None);
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
            rotate_left(&mut r, 1);
            for (k, f) in [1.5f32, -1.5, 3.0e-3, -7.0e-6].iter().enumerate() {
                let exp = (f.to_bits() >> 23 & 0xFF) as u8;
                assert_eq!(r[skew + 4 * k + 3], exp, "skew {skew} value {f}");
            }
        }
    }
}
