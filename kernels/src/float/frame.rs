//! Reading the frames [`super::encode_plan`] writes, block by block, so a decoder can take
//! raw planes where they lie in the stored frame instead of having the zstd library copy
//! them out first (three quarters of an fp32 chunk's bytes). Only the subset this encoder
//! writes is taken: a single-segment frame with a 4-byte content size and no checksum,
//! blocks raw, RLE, or compressed with Huffman-coded literals (their own tree) and no
//! sequences. Anything else, or anything inconsistent, is None: the caller then gives the
//! whole frame to the zstd library, which decodes any valid frame and refuses damaged ones.

use super::{BLOCK_MAX, FRAME_HEADER, ZSTD_MAGIC};

/// One block of a frame, and where its bytes go in the decoded content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block<'a> {
    /// Offset of its bytes in the decoded content.
    pub at: usize,
    /// Decoded bytes.
    pub len: usize,
    pub kind: BlockKind<'a>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind<'a> {
    /// The bytes as they are.
    Raw(&'a [u8]),
    /// One byte repeated.
    Rle(u8),
    /// A compressed block's content (literals section and an empty sequences section):
    /// decoded by the zstd library as a one-block frame ([`one_block_frame`]).
    Literals(&'a [u8]),
}

/// The blocks of `frame`, which must decode to `len` bytes, or None where the frame is not
/// one of this encoder's subset or is inconsistent.
pub fn blocks(frame: &[u8], len: usize) -> Option<Vec<Block<'_>>> {
    if frame.len() < FRAME_HEADER
        || u32::from_le_bytes(frame[..4].try_into().ok()?) != ZSTD_MAGIC
        || frame[4] != 0xA0
        || u32::from_le_bytes(frame[5..9].try_into().ok()?) as usize != len
    {
        return None;
    }
    let (mut pos, mut at, mut out) = (FRAME_HEADER, 0usize, Vec::new());
    loop {
        let h = frame.get(pos..pos + 3)?;
        let h = u32::from(h[0]) | u32::from(h[1]) << 8 | u32::from(h[2]) << 16;
        pos += 3;
        let (last, kind, size) = (h & 1 == 1, (h >> 1) & 3, (h >> 3) as usize);
        if size > BLOCK_MAX {
            return None;
        }
        let (kind, stored, decoded) = match kind {
            0 => (BlockKind::Raw(frame.get(pos..pos + size)?), size, size),
            1 => (BlockKind::Rle(*frame.get(pos)?), 1, size),
            2 => {
                let content = frame.get(pos..pos + size)?;
                (BlockKind::Literals(content), size, literals_size(content)?)
            }
            _ => return None,
        };
        if decoded > BLOCK_MAX {
            return None;
        }
        out.push(Block {
            at,
            len: decoded,
            kind,
        });
        pos += stored;
        at = at.checked_add(decoded)?;
        if last {
            break;
        }
    }
    (pos == frame.len() && at == len).then_some(out)
}

/// The decoded size of a compressed block's `content` that holds Huffman-coded literals
/// with their own tree (RFC 8878 3.1.1.3.1) and no sequences, else None.
fn literals_size(content: &[u8]) -> Option<usize> {
    let (header, regenerated, compressed) = literals_header(content)?;
    // Then Number_of_Sequences 0 (one zero byte), and nothing after it.
    (header + compressed + 1 == content.len() && content[header + compressed] == 0)
        .then_some(regenerated)
}

/// A compressed literals section's header: its length, the regenerated size and the
/// compressed size (of the tree and streams); None unless Literals_Block_Type is 2
/// (compressed, with its tree; 3, treeless, reuses the tree of a block before: not written
/// here).
pub fn literals_header(content: &[u8]) -> Option<(usize, usize, usize)> {
    let b = |i: usize| content.get(i).map(|&v| v as usize);
    let b0 = b(0)?;
    if b0 & 3 != 2 {
        return None;
    }
    Some(match (b0 >> 2) & 3 {
        0 | 1 => (3, b0 >> 4 | (b(1)? & 0x3F) << 4, b(1)? >> 6 | b(2)? << 2),
        2 => (
            4,
            b0 >> 4 | b(1)? << 4 | (b(2)? & 3) << 12,
            b(2)? >> 2 | b(3)? << 6,
        ),
        _ => (
            5,
            b0 >> 4 | b(1)? << 4 | (b(2)? & 0x3F) << 12,
            b(2)? >> 6 | b(3)? << 2 | b(4)? << 10,
        ),
    })
}

/// Decodes a compressed block's `content` into `dst` without the zstd library where its
/// tree is one of codes of one length; false where it is not (or this processor's `pdep` is
/// slow): the caller asks the library.
pub use super::huffman::decode_fixed;

/// A frame holding only the compressed block `content` (decoding to `len` bytes), for the
/// zstd library, in `buf`.
pub fn one_block_frame(content: &[u8], len: usize, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(&ZSTD_MAGIC.to_le_bytes());
    buf.push(0xA0);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    let h = 1 | 2 << 1 | (content.len() as u32) << 3;
    buf.extend_from_slice(&h.to_le_bytes()[..3]);
    buf.extend_from_slice(content);
}
