//! A chunk's bytes on their way out of the data file, typed by what has been checked: bytes
//! as read (`Stored`, possibly damaged), bytes whose decoding matched the hash that names
//! them (`Verified`, raw), and stored bytes known to decode to that hash (`Checked`, what gc
//! may copy forward). Reads return only `Verified`, gc's copies take only `Checked`, so bytes
//! that were never compared with their blake3 cannot be handed to a reader or moved.

use crate::error::{ChunkDamage, Corruption, Error, Result};
use crate::format::{ChunkHash, ChunkRecord};
use std::sync::Arc;

/// A chunk's bytes as read from the data file, not yet checked.
pub struct Stored {
    hash: ChunkHash,
    rec: ChunkRecord,
    bytes: Vec<u8>,
}

/// A chunk's raw (decoded) bytes that match its hash.
pub struct Verified(Vec<u8>);

/// A chunk's stored (encoded) bytes that decode to its hash: safe to copy elsewhere.
pub struct Checked {
    bytes: Vec<u8>,
}

impl Stored {
    pub fn new(hash: ChunkHash, rec: ChunkRecord, bytes: Vec<u8>) -> Stored {
        Stored { hash, rec, bytes }
    }

    /// The bytes as read, for a diagnosis of what is wrong with them (`ckptfs check`).
    pub(crate) fn unverified_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Decodes and checks against the hash (the hash lives in the metadata, not next to the
    /// data, so a torn, misdirected or rotted write is caught here and the reader gets an
    /// error instead of wrong bytes).
    pub fn verify(self) -> Result<Verified> {
        let (h, rec) = (self.hash, self.rec);
        let damaged = |damage| damaged(h, rec, damage);
        let raw =
            crate::codec::decode(rec.codec, self.bytes, rec.raw_len as usize).map_err(damaged)?;
        if raw.len() != rec.raw_len as usize || ChunkHash::of(&raw) != h {
            return Err(damaged(ChunkDamage::HashMismatch));
        }
        Ok(Verified(raw))
    }

    /// Checks the stored bytes (as `verify`) and keeps them encoded, for a copy.
    pub fn check(self) -> Result<Checked> {
        let bytes = self.bytes.clone();
        self.verify()?;
        Ok(Checked { bytes })
    }
}

/// The error for chunk `h` (stored as `rec`) whose bytes are damaged.
fn damaged(h: ChunkHash, rec: ChunkRecord, damage: ChunkDamage) -> Error {
    Error::from(Corruption::Chunk {
        hash: h,
        offset: rec.offset,
        damage,
    })
}

/// A chunk's stored bytes borrowed from a larger read (several chunks read in one device
/// read), not yet checked.
pub(crate) struct StoredRef<'a> {
    hash: ChunkHash,
    rec: ChunkRecord,
    bytes: &'a [u8],
}

impl<'a> StoredRef<'a> {
    pub fn new(hash: ChunkHash, rec: ChunkRecord, bytes: &'a [u8]) -> Self {
        StoredRef { hash, rec, bytes }
    }

    /// `Stored::verify` without copying the stored bytes first: the raw bytes that match
    /// the hash, borrowed from the read for a raw chunk (no copy at all), the decoded
    /// bytes for a compressed one.
    pub(crate) fn verify_raw(self) -> Result<std::borrow::Cow<'a, [u8]>> {
        let (h, rec) = (self.hash, self.rec);
        let damaged = |damage| damaged(h, rec, damage);
        let raw = crate::codec::decode_slice(rec.codec, self.bytes, rec.raw_len as usize)
            .map_err(damaged)?;
        if raw.len() != rec.raw_len as usize || ChunkHash::of(&raw) != h {
            return Err(damaged(ChunkDamage::HashMismatch));
        }
        Ok(raw)
    }
}

/// What owns the bytes a `ChunkBytes` points into.
pub(crate) type Owner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A chunk's verified raw bytes, shared by the read cache and its readers without a copy:
/// a range of the device-read buffer the chunk was checked in (a raw chunk: the buffer
/// lives as long as some chunk of it is cached or being read), or a buffer of its own (a
/// decoded chunk, or one from a test's map). Only verified bytes are ever put in one.
#[derive(Clone)]
pub struct ChunkBytes {
    owner: Owner,
    start: usize,
    len: usize,
}

impl ChunkBytes {
    /// `range` of what `owner` holds; panics if it lies outside. Only the engine makes
    /// these, and only of bytes it verified.
    pub(crate) fn new(owner: Owner, range: std::ops::Range<usize>) -> ChunkBytes {
        assert!(range.start <= range.end && range.end <= (*owner).as_ref().len());
        ChunkBytes {
            owner,
            start: range.start,
            len: range.end - range.start,
        }
    }

    /// Bytes of the buffer this chunk keeps alive (more than its own length when it is a
    /// range of a larger read), for a cache that bounds what it holds.
    pub fn owner_len(&self) -> usize {
        (*self.owner).as_ref().len()
    }

    /// Identifies the buffer this chunk keeps alive (equal for chunks sharing one).
    pub(crate) fn owner_key(&self) -> usize {
        Arc::as_ptr(&self.owner) as *const u8 as usize
    }
}

impl std::ops::Deref for ChunkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl ChunkBytes {
    /// A buffer of its own (a decoded chunk, verified), for the engine only: no `From`
    /// impl, which any crate could call.
    pub(crate) fn owned(v: Vec<u8>) -> ChunkBytes {
        let len = v.len();
        ChunkBytes {
            owner: Arc::new(v),
            start: 0,
            len,
        }
    }
}

impl Verified {
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl Checked {
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}
