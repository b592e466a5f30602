//! A chunk's bytes on their way out of the data file, typed by what has been checked: bytes
//! as read (`Stored`, possibly damaged), bytes whose decoding matched the hash that names
//! them (`Verified`, raw), and stored bytes known to decode to that hash (`Checked`, what gc
//! may copy forward). Reads return only `Verified`, gc's copies take only `Checked`, so bytes
//! that were never compared with their blake3 cannot be handed to a reader or moved.

use crate::error::{ChunkDamage, Corruption, Error, Result};
use crate::format::{ChunkHash, ChunkRecord};

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
    pub fn unverified_bytes(&self) -> &[u8] {
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
pub struct StoredRef<'a> {
    hash: ChunkHash,
    rec: ChunkRecord,
    bytes: &'a [u8],
}

impl<'a> StoredRef<'a> {
    pub fn new(hash: ChunkHash, rec: ChunkRecord, bytes: &'a [u8]) -> Self {
        StoredRef { hash, rec, bytes }
    }

    /// `Stored::verify` without copying the stored bytes first: the raw bytes that match
    /// the hash, in the shared form the read cache keeps (one copy for a raw chunk, the
    /// decoded bytes' for a compressed one).
    pub fn verify_shared(self) -> Result<std::sync::Arc<[u8]>> {
        let (h, rec) = (self.hash, self.rec);
        let damaged = |damage| damaged(h, rec, damage);
        let raw = crate::codec::decode_slice(rec.codec, self.bytes, rec.raw_len as usize)
            .map_err(damaged)?;
        if raw.len() != rec.raw_len as usize || ChunkHash::of(&raw) != h {
            return Err(damaged(ChunkDamage::HashMismatch));
        }
        Ok(std::sync::Arc::from(&*raw))
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
