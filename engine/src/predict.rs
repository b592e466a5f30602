//! Chunk-boundary prediction: which chunk followed a given chunk in the files this mount has
//! recently committed or opened, so a cutter that has just emitted that chunk can try the
//! same next chunk by hashing it instead of scanning for a content-defined cut.
//!
//! Why it is safe: any cut gives correct data (a chunk is named by the hash of exactly its
//! bytes, computed here); a prediction only decides where a chunk ends. Why it gives the same
//! cuts as FastCDC when it hits: a FastCDC cut depends only on the bytes from the chunk's
//! start to the cut, so after an identical chunk that began at a content-defined cut, identical
//! bytes are cut at the same place. Where the previous revision was not cut by content (dirty
//! blocks of random writes), a hit still finds the stored chunk, and a miss falls back to
//! FastCDC from the same start, which resynchronises with the old cuts past the change.
//!
//! Memory bound: two generations of at most `GENERATION_ENTRIES` entries each (a key and a
//! 12-byte value, about 26 MiB in all when full); when the newer one fills, the older one is
//! dropped. At 64 KiB chunks one generation covers 16 GiB of files.

use crate::format::{ChunkHash, Extent};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

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

type Table = HashMap<u64, Next, BuildHasherDefault<PrefixHasher>>;

#[derive(Default)]
struct Generations {
    newer: Table,
    older: Table,
}

/// Successor chunks, learned from extent maps (see the module doc).
pub struct Successors {
    gens: Mutex<Generations>,
    cap: usize,
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
            gens: Mutex::new(Generations::default()),
            cap: cap.max(1),
        }
    }

    pub fn is_empty(&self) -> bool {
        let g = self.gens.lock();
        g.newer.is_empty() && g.older.is_empty()
    }

    pub fn len(&self) -> usize {
        let g = self.gens.lock();
        g.newer.len() + g.older.len()
    }

    /// The chunk that followed `after` where it was last seen.
    pub fn next(&self, after: &ChunkHash) -> Option<Next> {
        self.next_after(prefix(after))
    }

    /// The chunk that followed the chunk whose hash begins with `k`.
    pub(crate) fn next_after(&self, k: u64) -> Option<Next> {
        let g = self.gens.lock();
        g.newer.get(&k).or_else(|| g.older.get(&k)).copied()
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
            if g.newer.len() >= self.cap {
                g.older = std::mem::take(&mut g.newer);
            }
            g.newer.insert(k, n);
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
}
