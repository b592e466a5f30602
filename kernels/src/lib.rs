//! GPU codecs for ckptfs over plain byte slices.
//!
//! The kernels are CUDA C in `cuda/lz4.cu` (and the float codec's encoder in
//! `cuda/float.cu`, whose CPU reference is [`float`]), embedded in the binary and compiled at first use
//! by NVRTC ([`gpu::Gpu`]). The same source is also compiled for the host at build time,
//! with a shim that emulates the CUDA built-ins ([`Emu`]); that is how the kernel logic is
//! tested on machines without a GPU, and the emulation produces the same bytes as the GPU.
//!
//! Output is the standard LZ4 block format, so any CPU LZ4 decoder (`lz4_flex`) reads what
//! the GPU wrote. This crate knows nothing of the storage engine.

pub mod cut;
mod emu;
pub mod float;
pub mod gpu;

pub use emu::Emu;

/// The kernel source, as NVRTC compiles it.
pub const LZ4_SOURCE: &str = include_str!("../cuda/lz4.cu");

/// The float codec's kernel source (`float::encode` on the GPU).
pub const FLOAT_SOURCE: &str = include_str!("../cuda/float.cu");

/// The BLAKE3 and gear-candidate kernels' source (`cuda/hash.cu`). Run through the CPU
/// emulation in CI; the GPU backend does not launch them yet (see ARCHITECTURE.md, GPU).
pub const HASH_SOURCE: &str = include_str!("../cuda/hash.cu");

/// Threads per block: one warp cooperates on each chunk (the kernels use warp votes).
pub const WARP: u32 = 32;

/// The kernels' per-chunk length meaning "not compressed" (compress: the chunk does not
/// shrink, store it raw; decompress: the block is malformed or does not fit).
pub const NONE: u32 = u32::MAX;

/// Largest chunk the kernels take: lengths and in-chunk positions are 32-bit.
pub const MAX_CHUNK: usize = (u32::MAX - 1) as usize;

#[derive(Debug)]
pub enum Error {
    /// No usable GPU: a library, the driver or a device is missing. Says which.
    Unavailable(String),
    /// A CUDA or NVRTC call failed.
    Cuda(String),
    /// Decompression: block `index` is not valid LZ4 or does not decode to its length.
    Corrupt { index: usize },
    /// A chunk larger than [`MAX_CHUNK`], or mismatched argument lengths.
    Invalid(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Unavailable(s) => write!(f, "no usable GPU: {s}"),
            Error::Cuda(s) => write!(f, "CUDA: {s}"),
            Error::Corrupt { index } => write!(f, "block {index} is not a valid LZ4 block"),
            Error::Invalid(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// A compressed batch: chunk `i`'s LZ4 block, or `None` where compression does not pay and
/// the chunk is to be stored raw.
#[derive(Debug, Default)]
pub struct Compressed {
    bytes: Vec<u8>,
    spans: Vec<Option<(usize, usize)>>,
}

impl Compressed {
    pub fn with_capacity(chunks: usize, bytes: usize) -> Compressed {
        Compressed {
            bytes: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(chunks),
        }
    }

    /// Appends the next chunk's result.
    pub fn push(&mut self, block: Option<&[u8]>) {
        self.spans.push(block.map(|b| {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(b);
            (start, b.len())
        }));
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Appends the next chunks' results, copying the blocks on up to `threads` threads.
    pub fn push_all(&mut self, blocks: &[Option<&[u8]>], threads: usize) {
        let start = self.bytes.len();
        let mut at = start;
        for b in blocks {
            self.spans.push(b.map(|b| {
                at += b.len();
                (at - b.len(), b.len())
            }));
        }
        self.bytes.resize(at, 0);
        let pieces: Vec<&[u8]> = blocks.iter().flatten().copied().collect();
        copy_pieces(&mut self.bytes[start..], &pieces, threads);
    }

    /// Chunk `i`'s LZ4 block; `None`: store it raw.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.spans[i].map(|(s, n)| &self.bytes[s..s + n])
    }

    /// Stored bytes of the batch (raw chunks counted at `raw_lens`).
    pub fn stored_bytes(&self, raw_lens: impl IntoIterator<Item = usize>) -> usize {
        self.spans
            .iter()
            .zip(raw_lens)
            .map(|(s, raw)| s.map_or(raw, |(_, n)| n))
            .sum()
    }
}

/// A batch LZ4 codec: the GPU, or the CPU emulation of the same kernels.
pub trait BatchCodec: Send + Sync {
    /// What runs the kernels, for logs ("NVIDIA H100 80GB HBM3 (sm_90)", "CPU emulation").
    fn describe(&self) -> String;

    /// Compresses every chunk into a standard LZ4 block, or marks it raw where that does not
    /// make it smaller.
    fn compress(&self, chunks: &[&[u8]]) -> Result<Compressed>;

    /// Decodes LZ4 blocks whose decoded lengths are `raw_lens`; returns the decoded chunks
    /// back to back. A block that is malformed or decodes to another length is an error.
    fn decompress(&self, blocks: &[&[u8]], raw_lens: &[usize]) -> Result<Vec<u8>>;
}

/// A batch for the float codec's kernel, packed as the kernel takes it (the emulation and
/// the GPU share it): chunks back to back with their offsets and lengths, a packed plan per
/// chunk (`float::Plan::packed`), and each frame's place in the output (`float::bound` bytes
/// per chunk).
pub(crate) struct FloatBatch {
    pub bytes: Vec<u8>,
    pub offs: Vec<u64>,
    pub lens: Vec<u32>,
    pub plans: Vec<u32>,
    pub out_offs: Vec<u64>,
    pub out_bytes: usize,
}

impl FloatBatch {
    pub fn new(chunks: &[&[u8]], plans: &[float::Plan]) -> Result<FloatBatch> {
        check_batch(chunks)?;
        if chunks.len() != plans.len() {
            return Err(Error::Invalid("float_compress: one plan per chunk".into()));
        }
        let mut b = FloatBatch {
            bytes: Vec::with_capacity(chunks.iter().map(|c| c.len()).sum()),
            offs: Vec::with_capacity(chunks.len()),
            lens: Vec::with_capacity(chunks.len()),
            plans: plans.iter().map(|p| p.packed()).collect(),
            out_offs: Vec::with_capacity(chunks.len()),
            out_bytes: 0,
        };
        for c in chunks {
            b.offs.push(b.bytes.len() as u64);
            b.lens.push(c.len() as u32);
            b.bytes.extend_from_slice(c);
            b.out_offs.push(b.out_bytes as u64);
            b.out_bytes += float::bound(c.len());
        }
        Ok(b)
    }

    /// Frame `i` of the kernel's output `out`, `out_lens[i]` bytes long.
    pub fn frames(&self, out: &[u8], out_lens: &[u32]) -> Vec<Vec<u8>> {
        self.out_offs
            .iter()
            .zip(out_lens)
            .map(|(&s, &n)| out[s as usize..s as usize + n as usize].to_vec())
            .collect()
    }
}

/// Checks batch arguments shared by every codec.
fn check_batch(chunks: &[&[u8]]) -> Result<()> {
    if let Some(c) = chunks.iter().find(|c| c.len() > MAX_CHUNK) {
        return Err(Error::Invalid(format!(
            "chunk of {} bytes is over the kernels' limit of {MAX_CHUNK}",
            c.len()
        )));
    }
    Ok(())
}

/// Copies below this size stay on one thread: starting threads would cost more.
const PARALLEL_COPY_MIN: usize = 4 << 20;

/// Copies `pieces`, back to back, into `dst` (exactly as long), on up to `threads` threads.
/// One core copies about 10 GB/s, less into write-combined pinned memory: packing a batch
/// for the GPU and unpacking its results on one thread would cap the GPU path below the
/// 20 GiB/s it is meant to reach.
pub(crate) fn copy_pieces(dst: &mut [u8], pieces: &[&[u8]], threads: usize) {
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    assert_eq!(total, dst.len(), "copy_pieces: destination length");
    if threads <= 1 || total < PARALLEL_COPY_MIN {
        let mut at = 0;
        for p in pieces {
            dst[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        return;
    }
    // Thread k copies destination bytes [k * per, (k + 1) * per), pieces cut at the seams.
    let per = total.div_ceil(threads);
    let mut work: Vec<Vec<&[u8]>> = vec![Vec::new(); threads];
    let mut at = 0;
    for p in pieces {
        let mut p = *p;
        while !p.is_empty() {
            let k = at / per;
            let n = ((k + 1) * per - at).min(p.len());
            work[k].push(&p[..n]);
            p = &p[n..];
            at += n;
        }
    }
    std::thread::scope(|s| {
        let mut rest = dst;
        for w in work {
            let len = w.iter().map(|p| p.len()).sum();
            let (mine, tail) = rest.split_at_mut(len);
            rest = tail;
            s.spawn(move || {
                let mut o = 0;
                for p in w {
                    mine[o..o + p.len()].copy_from_slice(p);
                    o += p.len();
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_pieces_splits_work_at_any_seam() {
        let pieces: Vec<Vec<u8>> = (0..37u32)
            .map(|i| (0..(i * 997 + 1) * 211).map(|b| (b ^ i) as u8).collect())
            .collect();
        let refs: Vec<&[u8]> = pieces.iter().map(|p| p.as_slice()).collect();
        let want = pieces.concat();
        assert!(want.len() > PARALLEL_COPY_MIN);
        for threads in [1, 2, 3, 7, 16] {
            let mut dst = vec![0u8; want.len()];
            copy_pieces(&mut dst, &refs, threads);
            assert!(dst == want, "{threads} threads");
        }
    }

    #[test]
    fn push_all_keeps_order_and_raw_marks() {
        let big = vec![7u8; PARALLEL_COPY_MIN];
        let blocks: Vec<Option<&[u8]>> = vec![Some(b"ab"), None, Some(&big), Some(b""), None];
        let mut c = Compressed::default();
        c.push(Some(b"first"));
        c.push_all(&blocks, 4);
        assert_eq!(c.len(), 6);
        assert_eq!(c.get(0), Some(&b"first"[..]));
        assert_eq!(c.get(1), Some(&b"ab"[..]));
        assert_eq!(c.get(2), None);
        assert_eq!(c.get(3), Some(&big[..]));
        assert_eq!(c.get(4), Some(&b""[..]));
        assert_eq!(c.get(5), None);
    }
}
