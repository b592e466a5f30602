//! Self-describing file content: a reader can check a whole file without knowing who wrote
//! it or which version to expect. Used by the concurrency soak, whose readers open files that
//! other processes keep replacing.
//!
//! Layout: bytes 0..8 the magic `ckptTAG1`, 8..16 the key (little-endian), 16..24 the total
//! length, then [`fill_pattern`] of the key from offset 24 to the end. A torn or mixed file
//! (a header of one version with the body or length of another) fails [`check`].

use crate::{fill_pattern, first_difference};

pub const MAGIC: [u8; 8] = *b"ckptTAG1";
pub const HEADER_BYTES: u64 = 24;

/// A whole version: `len` (at least [`HEADER_BYTES`]) bytes keyed by `key`.
pub fn bytes(key: u64, len: u64) -> Vec<u8> {
    assert!(
        len >= HEADER_BYTES,
        "tagged content needs at least {HEADER_BYTES} bytes"
    );
    let mut v = vec![0u8; len as usize];
    v[..8].copy_from_slice(&MAGIC);
    v[8..16].copy_from_slice(&key.to_le_bytes());
    v[16..24].copy_from_slice(&len.to_le_bytes());
    fill_pattern(key, HEADER_BYTES, &mut v[HEADER_BYTES as usize..]);
    v
}

/// Ok when `data` is exactly one whole version; else what is wrong.
pub fn check(data: &[u8]) -> Result<(), String> {
    if (data.len() as u64) < HEADER_BYTES || data[..8] != MAGIC {
        let head = &data[..data.len().min(24)];
        return Err(format!(
            "{} bytes with no tag header: {head:02x?}",
            data.len()
        ));
    }
    let word = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let (key, len) = (word(8), word(16));
    if len != data.len() as u64 {
        return Err(format!(
            "header of key {key:#x} says {len} bytes, the file has {}",
            data.len()
        ));
    }
    match first_difference(data, &bytes(key, len)) {
        None => Ok(()),
        Some(d) => Err(format!(
            "body does not match its header (key {key:#x}): {d}"
        )),
    }
}
