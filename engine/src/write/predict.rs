//! Chunk-boundary prediction: which chunk followed a given chunk in the files this mount has
//! recently committed or opened, so a cutter that has just emitted that chunk can try the
//! same next chunk by confirming it instead of scanning for a content-defined cut.
//!
//! Why a prediction is safe: it only decides where a chunk ends, and a predicted chunk is
//! taken only where its bytes are confirmed to be the predicted chunk's. Confirmation is by
//! blake3 (the chunk's name) where the predicted chunk has no fingerprint here, and by its
//! fingerprint (xxh3-128 of its bytes, `fingerprint`) where this mount hashed that chunk
//! before: the bytes then take the blake3 name remembered with the fingerprint. blake3 of
//! every predicted byte was the largest part of a next revision's cost (0.19 of 0.6-0.7
//! CPU-s/GiB on a 2-core machine); xxh3 costs a fifth of it or less. A fingerprint is not a
//! cryptographic hash: two different 64 KiB chunks of the same length meet the same 128-bit
//! fingerprint by accident with a chance of 2^-128 per confirmation, and a writer could craft
//! bytes that meet a known chunk's fingerprint, but only with bytes of its own file, whose
//! old chunk it already knows (to compute its fingerprint), so what it can make its file read
//! back is data it could have written anyway. `--confirm blake3` on the mount confirms every
//! prediction by blake3, as before. Fingerprints live only in memory: after a remount they
//! come back as chunks are read (a restart reads the checkpoint the next one repeats) or
//! confirmed by blake3.
//!
//! Why it gives the same cuts as FastCDC when it hits: a FastCDC cut depends only on the
//! bytes from the chunk's start to the cut, so after an identical chunk that began at a
//! content-defined cut, identical bytes are cut at the same place. Where the previous
//! revision was not cut by content (dirty blocks of random writes), a hit still finds the
//! stored chunk. Where a predicted chunk misses because bytes changed in place (the same
//! offsets: a checkpoint's tensors rewritten), the cutter first looks whether the old chunks
//! after it are still where they were (`write::Cutter::follow`); if one is, the changed
//! bytes are cut at the old boundaries, so only the old chunks the change touched are new
//! (FastCDC's cuts of the changed bytes would differ for a chunk or two past the change).
//! Otherwise (bytes inserted or removed, or a longer change) it falls back to FastCDC from
//! the same start, which resynchronises with the old cuts past the change.
//!
//! Memory bound: successors in two generations of at most `GENERATION_ENTRIES` entries each
//! (a key and a 12-byte value, about 26 MiB in all when full), and fingerprints likewise (a
//! key and 40 bytes, about 49 MiB when full); when the newer generation fills, the older one
//! is dropped. At 64 KiB chunks one generation covers 16 GiB of files.

use crate::format::{ChunkHash, Extent};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

/// Entries per generation: see the module's memory bound.
pub(crate) const GENERATION_ENTRIES: usize = 1 << 18;

/// The chunk predicted to come next: its length and the first 8 bytes of its hash (enough
/// to tell a hit from a miss; the chunk is named by the full hash computed over its bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Next {
    pub len: u32,
    pub hash_prefix: u64,
}

/// The first 8 bytes of a hash, as a key or a check.
pub fn prefix(h: &ChunkHash) -> u64 {
    u64::from_le_bytes(h.0[..8].try_into().expect("8 bytes"))
}

/// Keys are prefixes of blake3 hashes, uniformly distributed already: hashing them again
/// would only cost time.
#[derive(Default)]
struct PrefixHasher(u64);

impl Hasher for PrefixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type Table<V> = HashMap<u64, V, BuildHasherDefault<PrefixHasher>>;

/// Two generations of a table keyed by hash prefixes: at most `cap` entries in the newer;
/// when it fills, it becomes the older and the older is dropped.
struct Generations<V> {
    newer: Table<V>,
    older: Table<V>,
}

impl<V: Copy> Generations<V> {
    fn get(&self, k: u64) -> Option<V> {
        self.newer.get(&k).or_else(|| self.older.get(&k)).copied()
    }

    fn insert(&mut self, k: u64, v: V, cap: usize) {
        if self.newer.len() >= cap {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(k, v);
    }

    fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }
}

impl<V> Default for Generations<V> {
    fn default() -> Self {
        Generations {
            newer: Table::default(),
            older: Table::default(),
        }
    }
}

/// The fingerprint of a chunk's bytes: xxh3-128 (see the module doc).
pub fn fingerprint(bytes: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(bytes)
}

/// A chunk this mount hashed, by its hash prefix: the rest of its blake3 hash and its
/// fingerprint (byte arrays: 40 bytes, no padding).
#[derive(Clone, Copy)]
struct Fingerprinted {
    rest: [u8; 24],
    fp: [u8; 16],
}

/// Successor chunks, learned from extent maps, and the fingerprints of chunks this mount
/// hashed (see the module doc).
pub struct Successors {
    gens: Mutex<Generations<Next>>,
    fingerprints: Mutex<Generations<Fingerprinted>>,
    cap: usize,
    /// Whether chunks are fingerprinted, so predictions of them are confirmed by fingerprint
    /// (`--confirm fingerprint`, the default) rather than by blake3.
    by_fingerprint: AtomicBool,
    /// Whether a cutter looks past a predicted chunk that missed for the old chunks after
    /// it at their old offsets (`write::Cutter::follow`; `--cuts`).
    follow: AtomicBool,
}

impl Default for Successors {
    fn default() -> Self {
        Self::with_capacity(GENERATION_ENTRIES)
    }
}

impl Successors {
    /// At most `cap` entries per generation (tests use small ones to exercise rotation).
    pub fn with_capacity(cap: usize) -> Self {
        Successors {
            gens: Mutex::default(),
            fingerprints: Mutex::default(),
            cap: cap.max(1),
            by_fingerprint: AtomicBool::new(true),
            follow: AtomicBool::new(true),
        }
    }

    /// Whether predictions are confirmed by fingerprint where one is known (the default),
    /// or all by blake3 (`--confirm blake3`: the fingerprints kept so far are dropped).
    pub fn confirm_by_fingerprint(&self, on: bool) {
        self.by_fingerprint.store(on, Ordering::Relaxed);
        if !on {
            *self.fingerprints.lock() = Generations::default();
        }
    }

    /// Whether bytes changed in place are cut at the previous revision's boundaries (the
    /// default, `--cuts follow`) or always by content (`--cuts content`: the cuts of any
    /// bytes are FastCDC's, whatever this mount wrote before).
    pub fn follow_changes(&self, on: bool) {
        self.follow.store(on, Ordering::Relaxed);
    }

    pub fn follows(&self) -> bool {
        self.follow.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.gens.lock().len()
    }

    /// Whether chunks are fingerprinted as they are hashed (see `remember`).
    pub fn fingerprints(&self) -> bool {
        self.by_fingerprint.load(Ordering::Relaxed)
    }

    /// Fingerprints `bytes`, whose blake3 hash `h` is, so a prediction of that chunk can be
    /// confirmed by fingerprint; nothing (not even the fingerprint's cost) where fingerprints
    /// are off.
    pub fn remember(&self, h: &ChunkHash, bytes: &[u8]) {
        if self.fingerprints() {
            self.remember_fingerprint(h, fingerprint(bytes));
        }
    }

    /// `remember` with the fingerprint given (tests give wrong ones).
    pub(crate) fn remember_fingerprint(&self, h: &ChunkHash, fp: u128) {
        if !self.fingerprints() {
            return;
        }
        let v = Fingerprinted {
            rest: h.0[8..].try_into().expect("24 bytes"),
            fp: fp.to_le_bytes(),
        };
        self.fingerprints.lock().insert(prefix(h), v, self.cap);
    }

    /// The hash and fingerprint of the chunk whose hash begins with `k`, where this mount
    /// fingerprinted it.
    pub(crate) fn fingerprinted(&self, k: u64) -> Option<(ChunkHash, u128)> {
        if !self.fingerprints() {
            return None;
        }
        let f = self.fingerprints.lock().get(k)?;
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&k.to_le_bytes());
        h[8..].copy_from_slice(&f.rest);
        Some((ChunkHash(h), u128::from_le_bytes(f.fp)))
    }

    /// How many chunks have a fingerprint here.
    pub fn fingerprinted_len(&self) -> usize {
        self.fingerprints.lock().len()
    }

    /// The chunk that followed `after` where it was last seen.
    pub fn next(&self, after: &ChunkHash) -> Option<Next> {
        self.next_after(prefix(after))
    }

    /// The chunk that followed the chunk whose hash begins with `k`.
    pub(crate) fn next_after(&self, k: u64) -> Option<Next> {
        self.gens.lock().get(k)
    }

    /// Learns the chunk sequence of a file: each whole-chunk extent followed, back to back,
    /// by another extent that starts a chunk and is at most `max_len` long. (An extent that
    /// is only a chunk's head still teaches a successor; a wrong one costs one hash.)
    ///
    /// Not the last extent: it was cut where the file ended, not by content, and a next
    /// revision that goes on past it would otherwise be cut there, where FastCDC would not
    /// (the same bytes written later without predictions would then not deduplicate). Other
    /// chunks not cut by content (a stream the writer left by seeking, blocks of random
    /// writes) are learned too; predicting them costs some dedup against content-defined
    /// cuts of the same bytes, never correctness.
    pub fn learn<'a>(&self, extents: impl IntoIterator<Item = (u64, &'a Extent)>, max_len: u32) {
        let mut pairs = Vec::new();
        let mut prev: Option<(u64, &Extent)> = None;
        let mut extents = extents.into_iter().peekable();
        while let Some((off, e)) = extents.next() {
            if extents.peek().is_none() {
                break;
            }
            if let Some((po, pe)) = prev {
                if po + pe.len as u64 == off
                    && pe.chunk_off == 0
                    && e.chunk_off == 0
                    && e.len <= max_len
                {
                    pairs.push((
                        prefix(&pe.chunk),
                        Next {
                            len: e.len,
                            hash_prefix: prefix(&e.chunk),
                        },
                    ));
                }
            }
            prev = Some((off, e));
        }
        if pairs.is_empty() {
            return;
        }
        let mut g = self.gens.lock();
        for (k, n) in pairs {
            g.insert(k, n, self.cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Extent;

    fn h(i: u8) -> ChunkHash {
        ChunkHash::of(&[i])
    }

    fn map(chunks: &[(u8, u32)]) -> Vec<(u64, Extent)> {
        let mut m = Vec::new();
        let mut off = 0;
        for &(c, len) in chunks {
            m.push((
                off,
                Extent {
                    chunk: h(c),
                    chunk_off: 0,
                    len,
                },
            ));
            off += len as u64;
        }
        m
    }

    #[test]
    fn learns_back_to_back_chunks_and_skips_gaps_and_long_extents() {
        let s = Successors::default();
        let mut m = map(&[(1, 100), (2, 200), (3, 300)]);
        // A gap after chunk 3, then chunk 4: no successor for 3.
        m.push((
            1000,
            Extent {
                chunk: h(4),
                chunk_off: 0,
                len: 10,
            },
        ));
        s.learn(m.iter().map(|(o, e)| (*o, e)), 250);
        assert_eq!(
            s.next(&h(1)),
            Some(Next {
                len: 200,
                hash_prefix: prefix(&h(2))
            })
        );
        // Chunk 3's extent is longer than the largest chunk the cutter may take; chunk 4's is
        // the last (cut where the file ended).
        assert_eq!(s.next(&h(2)), None);
        assert_eq!(s.next(&h(3)), None);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn generations_bound_the_table_and_keep_the_newest() {
        let s = Successors::with_capacity(4);
        let chunks: Vec<(u8, u32)> = (0..21).map(|i| (i, 10)).collect();
        s.learn(map(&chunks).iter().map(|(o, e)| (*o, e)), 100);
        assert!(s.len() <= 8, "{} entries", s.len());
        assert_eq!(s.next(&h(18)).map(|n| n.hash_prefix), Some(prefix(&h(19))));
        assert_eq!(s.next(&h(19)), None, "the last extent is not learned");
        assert_eq!(s.next(&h(0)), None, "the oldest entries are dropped");
    }

    #[test]
    fn fingerprints_give_back_the_whole_hash_and_are_bounded_and_can_be_turned_off() {
        let s = Successors::with_capacity(4);
        assert!(s.fingerprints(), "fingerprints are the default");
        for i in 0..21u8 {
            s.remember(&h(i), &[i]);
        }
        assert!(s.fingerprinted_len() <= 8, "{}", s.fingerprinted_len());
        assert_eq!(
            s.fingerprinted(prefix(&h(20))),
            Some((h(20), fingerprint(&[20])))
        );
        assert_eq!(
            s.fingerprinted(prefix(&h(0))),
            None,
            "the oldest are dropped"
        );
        s.confirm_by_fingerprint(false);
        assert_eq!(s.fingerprinted(prefix(&h(20))), None);
        assert_eq!(s.fingerprinted_len(), 0, "turning them off drops them");
        s.remember(&h(3), &[3]);
        assert_eq!(s.fingerprinted_len(), 0, "nor are new ones kept");
    }
}
