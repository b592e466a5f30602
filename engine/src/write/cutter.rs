//! The content-defined cutter: FastCDC cuts (the gear hash, vectorised in `gearscan`),
//! predicted cuts of a next revision confirmed by blake3 (`predict`), and the cut search
//! that picks the fastest scan for this CPU.

use super::*;
use crate::format::{ChunkHash, ChunkParams};
use crate::write::pipeline::Predictor;
use crate::write::pipeline::{Piece, SharedBytes};

/// The engine's cuts of a whole stream, as chunk lengths (`Gear::scan` chunk by chunk, as
/// the cutter scans new data): for `ckptfs-bench codec`, which times it beside FastCDC's own
/// loop.
#[doc(hidden)]
pub fn gear_cut_lengths(p: ChunkParams, data: &[u8]) -> Vec<usize> {
    Gear::new(p).cut_lengths(data)
}

/// How the cutter searches on this CPU: `name` (`scalar` or `avx512`, `gearscan`), its
/// kernel (None: the scalar loop, `Gear::pairs`), and what the choice measured.
#[derive(Clone, Copy, Debug)]
pub struct Search {
    pub name: &'static str,
    pub(super) kernel: Option<crate::write::gearscan::Kernel>,
    /// GiB/s per core of each candidate (`name=GiB/s ...`), or why nothing was measured.
    pub measured: &'static str,
}

/// The search this process's cutters use, chosen once. `CKPTFS_GEAR=scalar|avx512` picks
/// one (for measuring one against the other); by default (`auto`) each candidate this CPU
/// can run cuts the same MiB a few times, alternating, and the fastest wins. Having
/// AVX-512 does not settle it: its gathers made the search 1.5x the scalar loop on the Xeon
/// GPU nodes and 0.3x on AMD Zen 4 (EPYC 9004, this project's VM of 2026-11-27). Every
/// candidate gives the same cuts, so the choice changes only the speed. A few ms, once per
/// process (the mount asks at start, and logs the answer).
pub fn gear_search() -> Search {
    static S: std::sync::OnceLock<Search> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        let want = std::env::var("CKPTFS_GEAR").unwrap_or_default();
        let all = searches();
        if let Some(c) = all.iter().find(|c| c.name == want) {
            return Search {
                measured: "chosen by CKPTFS_GEAR",
                ..*c
            };
        }
        if !(want.is_empty() || want == "auto") {
            log::warn!(
                "CKPTFS_GEAR={want}: not one of {:?} on this CPU; choosing by measurement",
                all.iter().map(|c| c.name).collect::<Vec<_>>()
            );
        }
        if all.len() == 1 {
            return Search {
                measured: "the only search this CPU has",
                ..all[0]
            };
        }
        fastest(&all)
    })
}

/// The searches this CPU can run (`gearscan::candidates`), not yet measured.
pub(super) fn searches() -> Vec<Search> {
    crate::write::gearscan::candidates()
        .into_iter()
        .map(|(name, kernel)| Search {
            name,
            kernel,
            measured: "",
        })
        .collect()
}

/// The fastest of `all` cutting the same pseudo-random MiB into 64 KiB chunks: the best of
/// five alternating rounds each.
pub(super) fn fastest(all: &[Search]) -> Search {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    let params = ChunkParams::from_avg(64 << 10).expect("64 KiB");
    let mut best = vec![f64::INFINITY; all.len()];
    for _ in 0..5 {
        for (c, best) in all.iter().zip(best.iter_mut()) {
            let g = Gear::with_kernel(params, c.kernel);
            let t = std::time::Instant::now();
            std::hint::black_box(g.cut_lengths(&data));
            *best = best.min(t.elapsed().as_secs_f64());
        }
    }
    let i = (0..all.len())
        .min_by(|&a, &b| best[a].total_cmp(&best[b]))
        .expect("the scalar loop is always a candidate");
    let measured = all
        .iter()
        .zip(&best)
        .map(|(c, t)| {
            format!(
                "{}={:.2}",
                c.name,
                data.len() as f64 / t / (1u64 << 30) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    Search {
        measured: Box::leak(format!("measured GiB/s per core: {measured}").into_boxed_str()),
        ..all[i]
    }
}

/// FastCDC cuts of `buf[from..]`: (offset in `buf`, length).
#[cfg(test)]
pub(super) fn cdc(p: ChunkParams, buf: &[u8], from: usize) -> Vec<(usize, usize)> {
    fastcdc::v2020::FastCDC::new(
        &buf[from..],
        p.min_bytes as usize,
        p.avg_bytes as usize,
        p.max_bytes as usize,
    )
    .map(|ch| (from + ch.offset, ch.length))
    .collect()
}

/// A cutter's state between segments: the chunk parameters and, where the store keeps chunk
/// sequences (`predict`), what it needs to predict the next chunk.
pub(super) struct Cutter {
    pub(super) params: ChunkParams,
    pub(super) pred: Option<Predictor>,
    /// The hash prefix (`predict::prefix`) of the last chunk emitted, when the cutter hashed
    /// it, or of the old chunk it took the place of (see `resync`): what predicts the next.
    pub(super) prev: Option<u64>,
    /// After a predicted chunk `n` starting at file offset `o` missed (its bytes changed):
    /// where the old chunk sequence goes on, as (file offset where one of its chunks ends,
    /// that chunk's hash prefix), starting with `n` itself at `o + n.len`. Content-defined
    /// cuts after a change in place (same offsets: a checkpoint's tensors rewritten) land on
    /// the old boundaries again once past the changed bytes; at the first that does, the
    /// old successor is predicted, so the chunk after a change is confirmed by one hash
    /// instead of a FastCDC scan. Followed for at most `RESYNC_STEPS` old chunks.
    pub(super) resync: Option<(u64, u64)>,
    /// Content-defined chunks in a row whose hash had no successor; past `HASH_MISSES` the
    /// cutter stops hashing every content-defined chunk (new data: the workers hash it in
    /// parallel instead) and only samples one in `HASH_SAMPLE` to find known data again.
    pub(super) misses: u32,
    pub(super) cdc_chunks: u64,
    /// Chunks taken from a confirmed prediction.
    pub(super) predicted: u64,
    /// Of those, the ones confirmed by fingerprint (`predict`).
    pub(super) fingerprinted: u64,
    /// Bytes of the chunks confirmed by fingerprint: what decides whether the stream's next
    /// segment is cut on the writing thread (`CutInner::here`).
    pub(super) fingerprinted_bytes: u64,
    /// Where the last content-defined scan ran out of bytes without a cut: (file offset
    /// of the chunk it scanned, `Gear::scan`'s resume point). The next segment carries that
    /// chunk's bytes again and the scan resumes where it stopped: scanning the carry again
    /// doubled the cutting of files written in small segments (many files at once).
    pub(super) scan: Option<(u64, (usize, u64))>,
    /// Predictions that missed, as (file offset, prediction, blake3 of the bytes where
    /// confirming computed it), so a retry of the same one at the same offset (a look past a
    /// miss that waited for more bytes, `follow`) does not hash the same bytes again: one
    /// cutter cuts one stream, whose bytes at an offset never change. At most
    /// `FOLLOW_STEPS` + 1 entries: the chunks of one look.
    pub(super) missed: Vec<(u64, crate::write::predict::Next, Option<ChunkHash>)>,
    /// Chunks cut at the previous revision's boundaries around changed bytes (`follow`).
    pub(super) followed: u64,
    pub(super) gear: Gear,
}

/// What `Cutter::confirm` says of a predicted chunk: Ok(its hash) where the bytes are it,
/// else Err(the blake3 of the bytes where it was computed to confirm them).
pub(super) type Confirmed = std::result::Result<ChunkHash, Option<ChunkHash>>;

/// What `Cutter::follow` found past a predicted chunk that missed.
pub(super) enum Follow {
    /// The old chunk sequence goes on at its old offsets: the changed old chunks end at
    /// these offsets of the buffer (the last is where the confirmed one starts), each with
    /// the blake3 of its bytes where confirming it computed that; the confirmed chunk ends
    /// at `.1` with hash `.2`.
    Found(Vec<(usize, Option<ChunkHash>)>, usize, ChunkHash),
    /// An old chunk to confirm reaches past the bytes handed over: decide with more.
    Wait,
    /// No old chunk within reach is where it was: cut by content.
    Lost,
}

/// FastCDC v2020 as `fastcdc::v2020::FastCDC` cuts (default gear table, normalization
/// level 1), with a scan that can stop at the end of its bytes and resume there when more
/// come (the crate's `cut` always starts at the chunk's start). The gear hash after a
/// position does not depend on where the scan started once 64 bytes were hashed, and a
/// resumed scan carries the hash over, so the cuts are the crate's exactly (the tests
/// compare them with `FastCDC`'s).
pub(super) struct Gear {
    pub(super) min: usize,
    pub(super) avg: usize,
    pub(super) max: usize,
    pub(super) mask_s: u64,
    pub(super) mask_l: u64,
    pub(super) gear: &'static [u64; 256],
    pub(super) gear_ls: &'static [u64; 256],
    /// The many-lane search of the steady part of a scan, where this CPU has a faster one
    /// (`gear_search`).
    pub(super) kernel: Option<crate::write::gearscan::Kernel>,
    /// The gear hash after 64 or more zero bytes: `gear[0]` times 2^64 - 1 (`search`).
    pub(super) zero_hash: u64,
}

/// `Gear::search` looks for zeros after each window of this many bytes it scanned (the
/// many-lane search's blocks are 8 KiB), and skips them in blocks of `ZERO_BLOCK`: a run of
/// zeros is scanned for at most a window.
pub(super) const ZERO_WINDOW: usize = 4 << 10;
pub(super) const ZERO_WINDOW_LANES: usize = 8 << 10;
pub(super) const ZERO_BLOCK: usize = 256;

impl Gear {
    pub(super) fn new(p: ChunkParams) -> Gear {
        Gear::with_kernel(p, gear_search().kernel)
    }

    /// `new` with the given search (`gear_search` measures the candidates with this).
    pub(super) fn with_kernel(
        p: ChunkParams,
        kernel: Option<crate::write::gearscan::Kernel>,
    ) -> Gear {
        use fastcdc::v2020::{get_gear_with_seed, select_masks, Normalization};
        let (mask_s, mask_l) = select_masks(p.avg_bytes as usize, Normalization::Level1);
        let table = |t: std::borrow::Cow<'static, [u64]>| match t {
            std::borrow::Cow::Borrowed(t) => t.try_into().expect("256 gear entries"),
            std::borrow::Cow::Owned(_) => unreachable!("seed 0 borrows the default tables"),
        };
        let (gear, gear_ls) = get_gear_with_seed(0);
        let gear = table(gear);
        Gear {
            min: p.min_bytes as usize,
            avg: p.avg_bytes as usize,
            max: p.max_bytes as usize,
            mask_s,
            mask_l,
            gear,
            gear_ls: table(gear_ls),
            kernel,
            zero_hash: gear[0].wrapping_mul(u64::MAX),
        }
    }

    /// The lengths of the chunks `data` cuts into, the last one where `data` ends.
    pub(super) fn cut_lengths(&self, data: &[u8]) -> Vec<usize> {
        let mut out = Vec::with_capacity(data.len() / self.avg.max(1) + 1);
        let mut pos = 0;
        while pos < data.len() {
            let n = self
                .scan(&data[pos..], self.start())
                .unwrap_or(data.len() - pos);
            out.push(n);
            pos += n;
        }
        out
    }

    /// Where a fresh scan starts: (byte pair index, gear hash).
    pub(super) fn start(&self) -> (usize, u64) {
        (self.min / 2, 0)
    }

    /// Cuts the chunk starting at `src[0]`: Ok(its length), or Err(where to resume) when
    /// `src` (shorter than the max chunk) ends without a cut. `from` is `start()` or what
    /// an earlier scan of a prefix of these bytes returned.
    pub(super) fn scan(
        &self,
        src: &[u8],
        from: (usize, u64),
    ) -> std::result::Result<usize, (usize, u64)> {
        let len = src.len();
        if len <= self.min {
            return Err(self.start());
        }
        let remaining = len.min(self.max);
        let center = if len < self.avg { len } else { self.avg };
        let from = if from.0 * 2 > remaining {
            self.start()
        } else {
            from
        };
        let src = &src[..remaining];
        // The harder mask before the average size, the easier one after (normalization).
        let mut at = from;
        for (end, mask) in [(center / 2, self.mask_s), (remaining / 2, self.mask_l)] {
            match self.search(src, at, end, mask) {
                Ok(stopped) => at = stopped,
                Err(cut) => return Ok(cut),
            }
        }
        if len >= self.max {
            Ok(self.max)
        } else {
            Err(at)
        }
    }

    /// `search_bytes`, skipping runs of zeros where they cannot hold a cut: over 64 zero
    /// bytes the gear hash is a constant (`zero_hash`: every byte before them is shifted
    /// out), so once a run has been hashed that far, every position in it meets `mask` or
    /// none does, and where none does the scan jumps to the run's end with that hash. The
    /// cuts, resume points and hashes are `search_bytes`' exactly (the tests compare them
    /// with FastCDC's over data with zero runs); what changes is that zero-filled regions
    /// (sparse fields, padding, zero-initialized state) cost next to no cutting.
    pub(super) fn search(
        &self,
        src: &[u8],
        mut at: (usize, u64),
        end: usize,
        mask: u64,
    ) -> std::result::Result<(usize, u64), usize> {
        let z = self.zero_hash;
        // The pair loop's two tests, even byte and odd byte, in a run of zeros.
        if (z << 1) & (mask << 1) == 0 || z & mask == 0 {
            return self.search_bytes(src, at, end, mask);
        }
        // The bytes are searched a window at a time; where a window ends (and where the
        // search starts) in a steady zero state (the hash `z` after 64 hashed zero bytes),
        // the zero blocks after it are skipped. The first window of a chunk ends once 64
        // bytes are hashed, so a chunk of zeros is skipped from there. Dense data pays one
        // comparison per window.
        let window = if self.kernel.is_some() {
            ZERO_WINDOW_LANES
        } else {
            ZERO_WINDOW
        } / 2;
        let hashed = self.start().0 + crate::write::gearscan::WARM / 2;
        loop {
            let q = 2 * at.0;
            if at.1 == z && at.0 >= hashed && all_zero(&src[q - crate::write::gearscan::WARM..q]) {
                let mut e = q;
                while e + ZERO_BLOCK <= 2 * end && all_zero(&src[e..e + ZERO_BLOCK]) {
                    e += ZERO_BLOCK;
                }
                at = (e / 2, z);
            }
            if at.0 >= end {
                return Ok(at);
            }
            let to = if at.0 < hashed { hashed } else { at.0 + window };
            at = self.search_bytes(src, at, to.min(end), mask)?;
        }
    }

    /// `pairs`, with the part where the hash is steady (64 bytes after the scan's first
    /// byte, `min` rounded down to even) searched on eight lanes at once where the CPU can
    /// (`gearscan`): the same cuts, and the same resume point and hash.
    pub(super) fn search_bytes(
        &self,
        src: &[u8],
        at: (usize, u64),
        end: usize,
        mask: u64,
    ) -> std::result::Result<(usize, u64), usize> {
        let Some(kernel) = self.kernel else {
            return self.pairs(src, at, end, mask);
        };
        let steady = (self.min / 2 * 2 + crate::write::gearscan::WARM) / 2;
        let at = if at.0 < steady {
            self.pairs(src, at, end.min(steady), mask)?
        } else {
            at
        };
        if at.0 >= end {
            return Ok(at);
        }
        match crate::write::gearscan::first_hit(kernel, self.gear, src, 2 * at.0, 2 * end, mask) {
            Some(cut) => Err(cut),
            None => Ok((
                end,
                crate::write::gearscan::rolling(self.gear, src, 2 * end - 1),
            )),
        }
    }

    /// FastCDC v2020's loop, four bytes a step, over byte pairs from `from` up to `end`
    /// with `mask`: Err(a cut at that length) where the hash meets the mask, else Ok(where
    /// the scan stopped). Inlined into `scan`'s two calls, as the crate's two loops are.
    #[inline(always)]
    pub(super) fn pairs(
        &self,
        src: &[u8],
        (index, mut hash): (usize, u64),
        end: usize,
        mask: u64,
    ) -> std::result::Result<(usize, u64), usize> {
        let mask_ls = mask << 1;
        let (gear, gear_ls) = (self.gear, self.gear_ls);
        // Over the bytes as a slice's chunks: no bounds check in the loop (indexing cost it
        // two per pair, a tenth of its speed, where the compiler could not prove them).
        let to = end.max(index);
        let bytes = &src[2 * index..2 * to];
        // Two pairs a step. The loop is bound by instructions (two loads, a shift or add
        // and a test per byte), not by the hash's chain, so what pays is fewer of them: the
        // four hashes come from the step's start (`hash << 2`, `hash << 4`) and the step's
        // own table terms (wrapping adds: the same values as pair by pair, whatever the
        // order), and a hit anywhere in the step is one branch. Measured on AMD Zen 4 with
        // `ckptfs-bench codec`: the engine's cutter went from 2.7 to 3.3 GiB/s per core on
        // dense data. The shape matters to the compiler: an array of the four hashes and a
        // search over it for the hit kept the old speed (register spills).
        let mut quads = bytes.chunks_exact(4);
        for (i, q) in (&mut quads).enumerate() {
            let a = gear_ls[q[0] as usize];
            let ab = a.wrapping_add(gear[q[1] as usize]);
            let c = gear_ls[q[2] as usize];
            let cd = c.wrapping_add(gear[q[3] as usize]);
            let s2 = hash << 2;
            let h0 = s2.wrapping_add(a);
            let h1 = s2.wrapping_add(ab);
            let s4 = hash << 4;
            let ab4 = ab << 2;
            let h2 = s4.wrapping_add(ab4.wrapping_add(c));
            let h3 = s4.wrapping_add(ab4.wrapping_add(cd));
            if (h0 & mask_ls == 0) | (h1 & mask == 0) | (h2 & mask_ls == 0) | (h3 & mask == 0) {
                let at = 2 * index + 4 * i;
                return Err(if h0 & mask_ls == 0 {
                    at
                } else if h1 & mask == 0 {
                    at + 1
                } else if h2 & mask_ls == 0 {
                    at + 2
                } else {
                    at + 3
                });
            }
            hash = h3;
        }
        if let [b0, b1] = *quads.remainder() {
            let at = 2 * to - 2;
            hash = (hash << 2).wrapping_add(gear_ls[b0 as usize]);
            if hash & mask_ls == 0 {
                return Err(at);
            }
            hash = hash.wrapping_add(gear[b1 as usize]);
            if hash & mask == 0 {
                return Err(at + 1);
            }
        }
        Ok((to, hash))
    }
}

/// See `Cutter::misses`.
pub(super) const HASH_MISSES: u32 = 8;
pub(super) const HASH_SAMPLE: u64 = 16;
/// See `Cutter::resync`.
pub(super) const RESYNC_STEPS: u32 = 8;
/// See `Cutter::follow`: old chunks tried past a miss, and how far past its start they
/// may end, in largest chunks. Field data's chunks average twice the nominal size (no cuts in
/// zero runs), so a 64 KiB block changed in place touches two or three chunks of up to 256
/// KiB each: within 1 MiB in 168 of 169 such changes of a simulated next step, within 256 KiB
/// in 27 (random data: 174 and 104 of 177, with 4 chunks).
pub(super) const FOLLOW_STEPS: usize = 8;
pub(super) const FOLLOW_SPAN_CHUNKS: usize = 4;

/// The longest carry a cutter leaves between segments: an unfinished chunk is at most a
/// largest chunk, but a look past a changed chunk (`Cutter::follow`) that waits for more
/// bytes carries everything from that chunk's start, less than `FOLLOW_SPAN_CHUNKS` largest
/// chunks. The spill file's slots are this long, so such carries spill too and the carries'
/// memory budget holds.
pub(crate) fn longest_carry(max_bytes: u32) -> usize {
    FOLLOW_SPAN_CHUNKS * max_bytes as usize
}

impl Cutter {
    pub(super) fn new(params: ChunkParams, pred: Option<Predictor>) -> Self {
        Cutter {
            params,
            pred,
            prev: None,
            resync: None,
            misses: 0,
            cdc_chunks: 0,
            predicted: 0,
            fingerprinted: 0,
            fingerprinted_bytes: 0,
            scan: None,
            missed: Vec::new(),
            followed: 0,
            gear: Gear::new(params),
        }
    }

    /// Hashes the content-defined chunk `b` (timed as `hash`) and fingerprints it, so a
    /// later prediction of it is confirmed by fingerprint.
    pub(super) fn hash(&self, b: &[u8]) -> ChunkHash {
        let pr = self.pred.as_ref();
        let t = pr
            .and_then(|p| p.pipeline.as_ref())
            .map(|pl| (pl, pl.stages.hash.start()));
        let h = ChunkHash::of(b);
        if let Some(pr) = pr {
            pr.table.remember(&h, b);
        }
        if let Some((pl, t)) = t {
            pl.stages.hash.stop(t, b.len());
        }
        h
    }

    /// The hash of `b` where its bytes are the predicted chunk `n`'s: confirmed by the
    /// fingerprint where this mount has one for that chunk, else by blake3 (and then
    /// fingerprinted, so the next revision's prediction is confirmed the cheap way). Timed
    /// as `predict_fingerprint` or `predict`, or `predict_miss` where the bytes changed.
    /// Err where they did not confirm it: with their blake3 where that was computed.
    pub(super) fn confirm(&mut self, b: &[u8], n: crate::write::predict::Next) -> Confirmed {
        let Some(pr) = self.pred.as_ref() else {
            return Err(None);
        };
        // Sampled by `predict`'s count, whichever of the three stages it turns out to be.
        let t = pr
            .pipeline
            .as_ref()
            .map(|pl| (pl, pl.stages.predict.start()));
        let table = &pr.table;
        let (got, by_fingerprint) = match table.fingerprinted(n.hash_prefix) {
            Some((h, fp)) => {
                let hit = crate::write::predict::fingerprint(b) == fp;
                self.fingerprinted += hit as u64;
                self.fingerprinted_bytes += if hit { b.len() as u64 } else { 0 };
                (if hit { Ok(h) } else { Err(None) }, true)
            }
            None => {
                let h = ChunkHash::of(b);
                let hit = crate::write::predict::prefix(&h) == n.hash_prefix;
                if hit {
                    table.remember(&h, b);
                }
                (if hit { Ok(h) } else { Err(Some(h)) }, false)
            }
        };
        if let Some((pl, t)) = t {
            let st = &pl.stages;
            let stage = match (got.is_ok(), by_fingerprint) {
                (false, _) => &st.predict_miss,
                (true, true) => &st.predict_fingerprint,
                (true, false) => &st.predict,
            };
            stage.stop(t, b.len());
        }
        got
    }

    /// `confirm` of the predicted chunk `n` at file offset `at`, unless it missed there
    /// before (the same stream bytes: a retry with more of them after `Follow::Wait`).
    pub(super) fn confirm_at(
        &mut self,
        at: u64,
        b: &[u8],
        n: crate::write::predict::Next,
    ) -> Confirmed {
        if let Some(m) = self.missed.iter().find(|m| (m.0, m.1) == (at, n)) {
            return Err(m.2);
        }
        let got = self.confirm(b, n);
        if let Err(h) = got {
            if self.missed.len() > FOLLOW_STEPS {
                self.missed.clear();
            }
            self.missed.push((at, n, h));
        }
        got
    }

    /// Past the predicted chunk `n` at `buf[pos..]`, whose bytes changed: whether the old
    /// chunks after it are still where they were, confirmed as predictions at their old
    /// offsets, up to `FOLLOW_STEPS` of them ending within `FOLLOW_SPAN_CHUNKS` largest
    /// chunks of `pos`. Where one is, the change was in place (a checkpoint's tensors
    /// rewritten, same shapes), and the changed bytes are cut at the old boundaries: only the
    /// old chunks the change touched become new chunks. A content-defined scan from `pos`
    /// instead meets the old boundaries again only a chunk or two past the change, and cuts
    /// differently until then: on random data with 5% of 64 KiB blocks changed, 13.5% of the
    /// bytes became new chunks against 11.6% at the old boundaries, every one of them
    /// scanned (a simulation; the test `in_place_changes_keep_the_old_boundaries` checks the
    /// same). Where none is (bytes inserted or removed shift everything after them, or a
    /// longer change), the scan by content takes over as before, having cost a fingerprint
    /// (or blake3) of each old chunk tried.
    ///
    /// The cuts of the changed bytes then depend on the previous revision, not on the bytes
    /// alone; what is stored is still exactly the stream's bytes (a cut only decides where a
    /// chunk ends), and the next revision predicts from these boundaries the same way.
    pub(super) fn follow(
        &mut self,
        buf: &[u8],
        pos: usize,
        base: u64,
        n: crate::write::predict::Next,
        missed: Option<ChunkHash>,
        last: bool,
    ) -> Follow {
        let span = longest_carry(self.params.max_bytes);
        let mut bounds = vec![(pos + n.len as usize, missed)];
        let mut prev = n.hash_prefix;
        for _ in 0..FOLLOW_STEPS {
            let Some(next) = self.pred.as_ref().and_then(|p| p.table.next_after(prev)) else {
                return Follow::Lost;
            };
            let from = bounds.last().expect("one bound at least").0;
            let end = from + next.len as usize;
            if next.len == 0 || next.len > self.params.max_bytes || end - pos > span {
                return Follow::Lost;
            }
            if end > buf.len() {
                return if last { Follow::Lost } else { Follow::Wait };
            }
            match self.confirm_at(base + from as u64, &buf[from..end], next) {
                Ok(h) => return Follow::Found(bounds, end, h),
                Err(h) => bounds.push((end, h)),
            }
            prev = next.hash_prefix;
        }
        Follow::Lost
    }

    /// The length of the next chunk, where the last one predicts it.
    pub(super) fn predicted_len(&self) -> Option<usize> {
        let n = self.pred.as_ref()?.table.next_after(self.prev?)?;
        (n.len > 0 && n.len <= self.params.max_bytes).then_some(n.len as usize)
    }

    /// Whether to hash a content-defined chunk here (to look up what followed it).
    pub(super) fn hash_cdc(&self) -> bool {
        match &self.pred {
            None => false,
            Some(p) => {
                (self.misses < HASH_MISSES || self.cdc_chunks.is_multiple_of(HASH_SAMPLE))
                    && !p.table.is_empty()
            }
        }
    }

    /// Cuts `buf[from..]` chunk by chunk (the bytes at `base` in the file) until a chunk
    /// starts at or past `stop`; a chunk that would end at the end of `buf` is cut only if
    /// `last` (else more bytes may move its cut). Returns where the cut chunks end.
    pub(super) fn run(
        &mut self,
        buf: &SharedBytes,
        from: usize,
        base: u64,
        last: bool,
        stop: usize,
        out: &mut Vec<(u64, Piece, bool)>,
    ) -> usize {
        let p = self.params;
        let mut push = |o: usize, l: usize, h: Option<ChunkHash>| {
            let piece = match h {
                Some(h) => Piece::hashed(buf.clone(), o, l, h),
                None => Piece::new(buf.clone(), o, l),
            };
            let zero = all_zero(piece.bytes());
            out.push((base + o as u64, piece, zero));
        };
        let mut pos = from;
        while pos < buf.len() && pos < stop {
            let predicted = match (&self.pred, self.prev) {
                (Some(pr), Some(prev)) => pr.table.next_after(prev),
                _ => None,
            };
            if let Some(n) = predicted.filter(|n| n.len > 0 && n.len <= p.max_bytes) {
                let mut end = pos + n.len as usize;
                if end <= buf.len() {
                    let mut confirmed = self.confirm_at(base + pos as u64, &buf[pos..end], n);
                    let follows = self.pred.as_ref().is_some_and(|p| p.table.follows());
                    if let (Err(missed), true) = (confirmed, follows) {
                        match self.follow(buf, pos, base, n, missed, last) {
                            Follow::Found(bounds, hit_end, h) => {
                                // The changed chunks, named by the blake3 their
                                // confirmation computed where it did (and fingerprinted,
                                // as the workers do the chunks they hash).
                                let mut from = pos;
                                for (b, hash) in bounds {
                                    if let (Some(h), Some(pr)) = (&hash, &self.pred) {
                                        pr.table.remember(h, &buf[from..b]);
                                    }
                                    push(from, b - from, hash);
                                    self.followed += 1;
                                    from = b;
                                }
                                pos = from;
                                end = hit_end;
                                confirmed = Ok(h);
                            }
                            Follow::Wait => break,
                            Follow::Lost => {}
                        }
                    }
                    if let Ok(h) = confirmed {
                        push(pos, end - pos, Some(h));
                        self.predicted += 1;
                        self.resync = None;
                        self.missed.clear();
                        self.prev = Some(crate::write::predict::prefix(&h));
                        pos = end;
                        continue;
                    }
                    // Known bytes changed here: cut by content from this chunk's start.
                    // (The hash just computed is of a guessed length, not of a chunk.)
                    self.resync = Some((base + end as u64, n.hash_prefix));
                } else if !last {
                    // The predicted chunk reaches into bytes not handed over yet: try again
                    // with the next segment.
                    break;
                }
            }
            let at = base + pos as u64;
            let from = match self.scan.take() {
                Some((o, from)) if o == at => from,
                _ => self.gear.start(),
            };
            let end = match self.gear.scan(&buf[pos..], from) {
                Ok(n) => pos + n,
                Err(resume) => {
                    if !last {
                        self.scan = Some((at, resume));
                        break;
                    }
                    buf.len()
                }
            };
            self.cdc_chunks += 1;
            let h = self.hash_cdc().then(|| self.hash(&buf[pos..end]));
            if let Some(h) = &h {
                let known = self
                    .pred
                    .as_ref()
                    .is_some_and(|pr| pr.table.next(h).is_some());
                self.misses = if known {
                    0
                } else {
                    self.misses.saturating_add(1)
                };
            }
            push(pos, end - pos, h);
            let known = |k: u64| {
                self.pred
                    .as_ref()
                    .is_some_and(|pr| pr.table.next_after(k).is_some())
            };
            let own = h.as_ref().map(crate::write::predict::prefix);
            self.prev = own;
            if !own.is_some_and(known) {
                // Follow the old chunk sequence past the changed bytes: where this cut lands
                // on one of its boundaries, what followed there follows here.
                let at = base + end as u64;
                let mut steps = 0;
                while let Some((old_end, old)) = self.resync {
                    if old_end >= at {
                        if old_end == at {
                            self.prev = Some(old);
                            self.resync = None;
                        }
                        break;
                    }
                    steps += 1;
                    self.resync = match &self.pred {
                        Some(pr) if steps <= RESYNC_STEPS => pr
                            .table
                            .next_after(old)
                            .map(|n| (old_end + n.len as u64, n.hash_prefix)),
                        _ => None,
                    };
                }
            }
            pos = end;
        }
        pos
    }
}

/// Cuts the stream bytes `carry` (at file offset `start`) followed by `seg` into pieces;
/// returns them (offset, piece, all zeros) and the new carry (offset, bytes): the bytes after
/// the last chunk cut, unless `last`. Without predictions the result is the same as FastCDC
/// over the whole stream; with them, chunks confirmed by their hash take a predicted
/// chunk's place (`predict`).
///
/// Only chunks that begin in the carry are cut on a joined copy (they end within the first
/// `max_bytes` of the segment); the rest is cut in place and its pieces share the segment's
/// buffer, so the stream's bytes are not copied again here.
pub(super) fn cut_segment(
    cutter: &mut Cutter,
    start: u64,
    carry: &[u8],
    seg: SharedBytes,
    last: bool,
) -> (Vec<(u64, Piece, bool)>, u64, Vec<u8>) {
    #[cfg(test)]
    if seg.starts_with(tests::PANIC_CUT) {
        panic!("a cutter bug, as the test asked");
    }
    let p = cutter.params;
    let mut pieces = Vec::new();
    // Where the in-place part of the segment starts.
    let mut from = 0;
    let carry_len = carry.len();
    if carry_len > 0 {
        let full = seg.len().min(p.max_bytes as usize);
        let join = |head: usize| {
            let mut joined = Vec::with_capacity(carry_len + head);
            joined.extend_from_slice(carry);
            joined.extend_from_slice(&seg[..head]);
            SharedBytes::from(joined)
        };
        if full == seg.len() {
            // Everything is in the joined buffer (a short segment): cut it like a stream.
            let joined = join(full);
            let end = cutter.run(&joined, 0, start, last, usize::MAX, &mut pieces);
            if end == 0 {
                // Nothing cut (a short segment of a file written in small requests): the
                // joined bytes are the new carry, without copying them once more.
                debug_assert!(pieces.is_empty());
                let all = joined.into_vec();
                return (pieces, start, all);
            }
            let rest = joined[end..].to_vec();
            compact_sparse(&mut pieces, &joined);
            return (pieces, start + end as u64, rest);
        }
        // Only the chunk that starts in the carry (the carry is one unfinished chunk) is cut
        // on a joined copy. Where the cutter predicts that chunk's length, only that much
        // is joined first, about a quarter of `full` for 64 KiB chunks; if the prediction
        // misses and FastCDC cannot decide within so few bytes, nothing is cut and `full`
        // is joined (the missed prediction is hashed once more: it misses again).
        //
        // Without a prediction the chunk's end is guessed as well: one average chunk past
        // the carry, at least two from the chunk's start, where FastCDC's eased mask past
        // the average has most likely cut. A miss leaves the cutter's resumable scan where
        // it ran out, so only the joined copy is made twice, not the scan. With `full`
        // joined every time (a quarter of a 1 MiB segment for 64 KiB chunks), joining was
        // 4.5% of the daemon's CPU on a full step, 2.7% with the guess (perf).
        let avg = p.avg_bytes as usize;
        let guess = match cutter.predicted_len() {
            Some(l) => l.checked_sub(carry_len).filter(|&h| h > 0),
            None => Some(avg.max((2 * avg).saturating_sub(carry_len))),
        }
        .filter(|&h| h < full);
        let mut cut_to = None;
        for head in guess.into_iter().chain([full]) {
            let joined = join(head);
            // With `full` joined, a chunk that starts in the carry ends before the joined
            // buffer does (a chunk is at most max_bytes long), so this cuts at least to the
            // end of the carry, unless the cutter looks past a changed chunk at the old
            // chunks after it (`Cutter::follow`) and waits for bytes beyond `full`.
            let end = cutter.run(&joined, 0, start, false, carry_len, &mut pieces);
            if end >= carry_len {
                compact_sparse(&mut pieces, &joined);
                cut_to = Some(end);
                break;
            }
            if end > 0 {
                // Chunks ended inside the carry (one left unfinished by a prediction that
                // reached past its segment may hold content-defined cuts): they stand; the
                // rest of the carry is cut with the segment.
                compact_sparse(&mut pieces, &joined);
                let (more, s, c) =
                    cut_segment(cutter, start + end as u64, &carry[end..], seg, last);
                pieces.extend(more);
                return (pieces, s, c);
            }
        }
        let Some(end) = cut_to else {
            // A look past a changed chunk waits for more than `full` (rare: it starts in
            // the carry and reaches past a largest chunk into the segment): the whole
            // segment is joined, and the look decides within it or waits for the next.
            let mut all = carry.to_vec();
            all.extend_from_slice(&seg);
            return cut_segment(cutter, start, &all, SharedBytes::default(), last);
        };
        from = end - carry_len;
    }
    // File offset of seg[0].
    let seg_off = start + carry_len as u64;
    let end = cutter.run(&seg, from, seg_off, last, usize::MAX, &mut pieces);
    let rest = seg[end..].to_vec();
    compact_sparse(&mut pieces, &seg);
    (pieces, seg_off + end as u64, rest)
}

/// `carry` followed by `seg` cut in chunks of `max_bytes` (the last one shorter, or left
/// as the carry unless `last`): what a failed cutter's segment becomes (see `CutState::run`).
pub(super) fn cut_by_size(
    p: ChunkParams,
    start: u64,
    carry: &[u8],
    seg: &[u8],
    last: bool,
) -> (Vec<(u64, Piece, bool)>, u64, Vec<u8>) {
    let mut all = Vec::with_capacity(carry.len() + seg.len());
    all.extend_from_slice(carry);
    all.extend_from_slice(seg);
    let all = SharedBytes::from(all);
    let max = p.max_bytes as usize;
    let whole = if last {
        all.len()
    } else {
        all.len() / max * max
    };
    let mut pieces = Vec::new();
    for o in (0..whole).step_by(max) {
        let piece = Piece::new(all.clone(), o, max.min(whole - o));
        let zero = all_zero(piece.bytes());
        pieces.push((start + o as u64, piece, zero));
    }
    (pieces, start + whole as u64, all[whole..].to_vec())
}

/// Pieces cut in place share the buffer they were cut from until they are stored and
/// retired. Where they cover less than half of it (a short segment whose bytes mostly go on
/// as the carry, a joined copy of a long carry cut near its start) they get buffers of their
/// own, so pieces never keep more than twice their bytes alive: the rest of the buffer is
/// copied into the carry anyway.
pub(super) fn compact_sparse(pieces: &mut [(u64, Piece, bool)], buf: &SharedBytes) {
    let shared: usize = pieces
        .iter()
        .filter(|(_, p, _)| p.shares(buf))
        .map(|(_, p, _)| p.len())
        .sum();
    if shared == 0 || shared * 2 >= buf.held() {
        return;
    }
    for (_, p, _) in pieces.iter_mut() {
        if p.shares(buf) {
            let taken = std::mem::replace(p, Piece::new(SharedBytes::default(), 0, 0));
            *p = taken.compacted();
        }
    }
}
