//! GPU codecs for ckptfs over plain byte slices.
//!
//! The kernels are CUDA C in `cuda/lz4.cu`, embedded in the binary and compiled at first use
//! by NVRTC ([`gpu::Gpu`]). The same source is also compiled for the host at build time,
//! with a shim that emulates the CUDA built-ins ([`Emu`]); that is how the kernel logic is
//! tested on machines without a GPU, and the emulation produces the same bytes as the GPU.
//!
//! Output is the standard LZ4 block format, so any CPU LZ4 decoder (`lz4_flex`) reads what
//! the GPU wrote. This crate knows nothing of the storage engine.

mod emu;
pub mod gpu;

pub use emu::Emu;

/// The kernel source, as NVRTC compiles it.
pub const LZ4_SOURCE: &str = include_str!("../cuda/lz4.cu");

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
