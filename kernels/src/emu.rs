//! The CPU emulation of the CUDA kernels: `cuda/lz4.cu` compiled for the host with the shim
//! `cuda/emu.h` (see build.rs). It runs the very kernel logic the GPU runs, one warp of 32
//! emulated threads per chunk, and produces the same bytes; it is slow (fibers switch at every
//! warp vote) and exists to test the kernels where there is no GPU.

use crate::{check_batch, BatchCodec, Compressed, Error, Result, NONE};

extern "C" {
    fn ckpt_emu_lz4_compress(
        input: *const u8,
        offs: *const u64,
        lens: *const u32,
        out: *mut u8,
        out_lens: *mut u32,
        count: u32,
    ) -> i32;
    fn ckpt_emu_float_compress(
        input: *const u8,
        offs: *const u64,
        lens: *const u32,
        plans: *const u32,
        out: *mut u8,
        out_offs: *const u64,
        out_lens: *mut u32,
        count: u32,
    ) -> i32;
    fn ckpt_emu_lz4_decompress(
        input: *const u8,
        in_offs: *const u64,
        in_lens: *const u32,
        out: *mut u8,
        out_offs: *const u64,
        out_caps: *const u32,
        out_lens: *mut u32,
        count: u32,
    ) -> i32;
    fn ckpt_emu_blake3(
        input: *const u8,
        offs: *const u64,
        lens: *const u32,
        cvs: *mut u32,
        cv_offs: *const u64,
        out: *mut u8,
        count: u32,
    ) -> i32;
    #[allow(clippy::too_many_arguments)]
    fn ckpt_emu_gear_candidates(
        input: *const u8,
        offs: *const u64,
        lens: *const u32,
        gear: *const u64,
        mask_s: u64,
        mask_l: u64,
        bits: *mut u32,
        bit_offs: *const u64,
        count: u32,
    ) -> i32;
}

/// The kernels emulated on the CPU. Chunks are shared out over all cores.
#[derive(Clone, Copy, Debug, Default)]
pub struct Emu;

/// Chunks packed back to back, as the kernels take them.
struct Packed {
    bytes: Vec<u8>,
    offs: Vec<u64>,
    lens: Vec<u32>,
}

fn pack<'a>(chunks: impl ExactSizeIterator<Item = &'a [u8]>) -> Packed {
    let mut p = Packed {
        bytes: Vec::new(),
        offs: Vec::with_capacity(chunks.len()),
        lens: Vec::with_capacity(chunks.len()),
    };
    for c in chunks {
        p.offs.push(p.bytes.len() as u64);
        p.lens.push(c.len() as u32);
        p.bytes.extend_from_slice(c);
    }
    p
}

/// A pointer that may cross to the scoped threads below: each thread touches only its own
/// chunks' slots.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

/// Runs `launch(first, count)` over `count` chunks split into contiguous ranges, one per core.
fn split(count: usize, launch: impl Fn(usize, usize) -> i32 + Sync) -> Result<()> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(count.max(1));
    let per = count.div_ceil(threads);
    let failed = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let launch = &launch;
                s.spawn(move || {
                    let first = t * per;
                    let n = per.min(count.saturating_sub(first));
                    if n == 0 {
                        0
                    } else {
                        launch(first, n)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .any(|h| h.join().expect("emulation thread") != 0)
    });
    if failed {
        return Err(Error::Cuda(
            "emulated kernel: threads of a warp diverged at a barrier".into(),
        ));
    }
    Ok(())
}

impl Emu {
    /// The float codec's kernel (`cuda/float.cu`) on each chunk with its plan: zstd
    /// frames that must equal `float::encode_plan`'s byte for byte.
    pub fn float_compress(
        &self,
        chunks: &[&[u8]],
        plans: &[crate::float::Plan],
    ) -> Result<Vec<Vec<u8>>> {
        let b = crate::FloatBatch::new(chunks, plans)?;
        let mut out = vec![0u8; b.out_bytes];
        let mut out_lens = vec![0u32; chunks.len()];
        let (o, ol) = (Shared(out.as_mut_ptr()), Shared(out_lens.as_mut_ptr()));
        split(chunks.len(), |first, n| {
            let (o, ol) = (o, ol);
            // SAFETY: every array holds `chunks.len()` entries; chunk i's frame is written
            // within its `float::bound` bytes at out_offs[i]; the kernel touches only chunks
            // [first, first + n).
            unsafe {
                ckpt_emu_float_compress(
                    b.bytes.as_ptr(),
                    b.offs.as_ptr().add(first),
                    b.lens.as_ptr().add(first),
                    b.plans.as_ptr().add(first),
                    o.0,
                    b.out_offs.as_ptr().add(first),
                    ol.0.add(first),
                    n as u32,
                )
            }
        })?;
        Ok(b.frames(&out, &out_lens))
    }
}

impl Emu {
    /// BLAKE3 of each piece by the kernel `ckpt_blake3` (`cuda/hash.cu`): must equal
    /// `blake3::hash` of it.
    pub fn blake3(&self, pieces: &[&[u8]]) -> Result<Vec<[u8; 32]>> {
        check_batch(pieces)?;
        let p = pack(pieces.iter().copied());
        // Scratch: 8 words per 1 KiB chunk of each piece.
        let mut cv_offs = Vec::with_capacity(pieces.len());
        let mut words = 0u64;
        for c in pieces {
            cv_offs.push(words);
            words += 8 * c.len().div_ceil(1024).max(1) as u64;
        }
        let mut cvs = vec![0u32; words as usize];
        let mut out = vec![0u8; 32 * pieces.len()];
        let (o, cv) = (Shared(out.as_mut_ptr()), Shared(cvs.as_mut_ptr()));
        split(pieces.len(), |first, n| {
            let (o, cv) = (o, cv);
            // SAFETY: the arrays hold one entry per piece; piece i's scratch is its own
            // cv_offs[i] range and its hash the 32 bytes at 32 i; the kernel touches only
            // pieces [first, first + n).
            unsafe {
                ckpt_emu_blake3(
                    p.bytes.as_ptr(),
                    p.offs.as_ptr().add(first),
                    p.lens.as_ptr().add(first),
                    cv.0,
                    cv_offs.as_ptr().add(first),
                    o.0.add(32 * first),
                    n as u32,
                )
            }
        })?;
        Ok(out
            .chunks_exact(32)
            .map(|h| h.try_into().expect("32 bytes"))
            .collect())
    }

    /// The candidate bitmap of each piece by the kernel `ckpt_gear_candidates`: must equal
    /// `cut::candidates`, and `cut::cuts` over it must equal FastCDC's cuts.
    pub fn gear_candidates(
        &self,
        pieces: &[&[u8]],
        p: &crate::cut::GearParams,
    ) -> Result<Vec<Vec<u32>>> {
        check_batch(pieces)?;
        let packed = pack(pieces.iter().copied());
        let mut bit_offs = Vec::with_capacity(pieces.len());
        let mut words = 0u64;
        for c in pieces {
            bit_offs.push(words);
            words += c.len().div_ceil(32) as u64;
        }
        let mut bits = vec![0u32; words as usize];
        let b = Shared(bits.as_mut_ptr());
        split(pieces.len(), |first, n| {
            // The whole `Shared` (which is Sync), not its raw pointer field, is captured.
            let b = &b;
            // SAFETY: one entry per piece in every array; piece i writes only its own words
            // from bit_offs[i]; the kernel touches only pieces [first, first + n).
            unsafe {
                ckpt_emu_gear_candidates(
                    packed.bytes.as_ptr(),
                    packed.offs.as_ptr().add(first),
                    packed.lens.as_ptr().add(first),
                    p.gear.as_ptr(),
                    p.mask_s,
                    p.mask_l,
                    b.0,
                    bit_offs.as_ptr().add(first),
                    n as u32,
                )
            }
        })?;
        Ok(bit_offs
            .iter()
            .zip(pieces)
            .map(|(&o, c)| bits[o as usize..o as usize + c.len().div_ceil(32)].to_vec())
            .collect())
    }
}

impl BatchCodec for Emu {
    fn describe(&self) -> String {
        "CPU emulation of the CUDA kernels".into()
    }

    fn compress(&self, chunks: &[&[u8]]) -> Result<Compressed> {
        check_batch(chunks)?;
        let p = pack(chunks.iter().copied());
        let mut out = vec![0u8; p.bytes.len()];
        let mut out_lens = vec![0u32; chunks.len()];
        let (o, ol) = (Shared(out.as_mut_ptr()), Shared(out_lens.as_mut_ptr()));
        split(chunks.len(), |first, n| {
            let (o, ol) = (o, ol);
            // SAFETY: the arrays hold `chunks.len()` entries and `out` is as long as the
            // packed input; the kernel writes only chunk slots in [first, first + n).
            unsafe {
                ckpt_emu_lz4_compress(
                    p.bytes.as_ptr(),
                    p.offs.as_ptr().add(first),
                    p.lens.as_ptr().add(first),
                    o.0,
                    ol.0.add(first),
                    n as u32,
                )
            }
        })?;
        let mut r = Compressed::with_capacity(chunks.len(), p.bytes.len());
        for (i, &len) in out_lens.iter().enumerate() {
            let start = p.offs[i] as usize;
            r.push((len != NONE).then(|| &out[start..start + len as usize]));
        }
        Ok(r)
    }

    fn decompress(&self, blocks: &[&[u8]], raw_lens: &[usize]) -> Result<Vec<u8>> {
        check_batch(blocks)?;
        if blocks.len() != raw_lens.len() || raw_lens.iter().any(|&n| n > crate::MAX_CHUNK) {
            return Err(Error::Invalid(
                "decompress: one decoded length per block, each within the chunk limit".into(),
            ));
        }
        let p = pack(blocks.iter().copied());
        let mut out_offs = Vec::with_capacity(raw_lens.len());
        let mut total = 0u64;
        for &n in raw_lens {
            out_offs.push(total);
            total += n as u64;
        }
        let caps: Vec<u32> = raw_lens.iter().map(|&n| n as u32).collect();
        let mut out = vec![0u8; total as usize];
        let mut out_lens = vec![0u32; blocks.len()];
        let (o, ol) = (Shared(out.as_mut_ptr()), Shared(out_lens.as_mut_ptr()));
        split(blocks.len(), |first, n| {
            let (o, ol) = (o, ol);
            // SAFETY: as in `compress`; each block decodes only into its own output slot,
            // bounded by its capacity.
            unsafe {
                ckpt_emu_lz4_decompress(
                    p.bytes.as_ptr(),
                    p.offs.as_ptr().add(first),
                    p.lens.as_ptr().add(first),
                    o.0,
                    out_offs.as_ptr().add(first),
                    caps.as_ptr().add(first),
                    ol.0.add(first),
                    n as u32,
                )
            }
        })?;
        if let Some(index) = (0..blocks.len()).find(|&i| out_lens[i] as usize != raw_lens[i]) {
            return Err(Error::Corrupt { index });
        }
        Ok(out)
    }
}
