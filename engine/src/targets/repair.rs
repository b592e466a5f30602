//! Repair from verified bytes only (`ckptfs rebuild`, `ckptfs scrub`): a segment's rows are
//! read, every committed chunk in them is checked against its blake3 (as stored, else
//! rebuilt without one shard, then two, ... until it verifies), and only then is anything
//! encoded from them: the shards of a failed target onto a new one, and in place the blocks
//! of healthy targets that were found damaged, stale or unreadable. A chunk that no
//! combination of readable shards verifies is lost, counted and listed, and the rows it lies
//! in are rewritten nowhere (nothing says what they should hold).
//!
//! Bytes of a row that no committed chunk covers (padding, dead chunks) cannot be verified
//! and need not be: they are taken as read, or, where the row is inconsistent, from the
//! decoding that agrees with the most stored shards, so a damaged block there is rewritten
//! rather than the healthy parity re-encoded around it.
//!
//! The caller (`Space`, engine/src/scrub.rs) holds off gc while a segment is repaired and
//! says whether the segment is being written (new chunks not committed yet): such a segment's
//! rows are copied to new shards as they are, and nothing in it is rewritten in place.
//!
//! Memory: one window of rows of all M+K shards (`REPAIR_ROWS`, extended to the end of the
//! last chunk starting in it, so at most `REPAIR_ROWS` + a maximal chunk's rows), and the
//! data shards of at most `TRIED_MAX` decodings of it being tried.

use super::*;
use crate::error::DevResult;

/// Rows a repair reads at a time, before extending to the end of the chunks it holds.
pub(crate) const REPAIR_ROWS: u64 = 64;
/// Decodings of a window (without one set of shards each) kept while its chunks are
/// verified: chunks damaged the same way reuse them. Bounds the memory at this many windows.
const TRIED_MAX: usize = 16;
/// For the bytes of an inconsistent row no chunk covers, decodings without up to this many
/// shards are tried (at most 1 + n + n(n-1)/2 for n shards: 137 at 16): enough to outvote
/// one or two damaged blocks; the verified chunk bytes do not depend on it.
const CANDIDATE_EXCLUDED_MAX: usize = 2;

/// A committed chunk of the segment being repaired: bytes [offset, offset + len) of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentChunk {
    pub offset: u64,
    pub len: u32,
}

/// One segment to repair.
pub(crate) struct SegmentJob<'a> {
    pub seg: u64,
    /// Its committed chunks, by offset, inside the segment.
    pub chunks: &'a [SegmentChunk],
    /// Being written: rows without a committed chunk may hold chunks about to commit.
    pub busy: bool,
}

/// A byte rate limit on the shards a repair writes.
pub(crate) struct Throttle {
    limit_bytes_s: Option<f64>,
    start: Instant,
    written: u64,
}

impl Throttle {
    pub fn new(limit_bytes_s: Option<f64>) -> Throttle {
        Throttle {
            limit_bytes_s: limit_bytes_s.filter(|l| *l > 0.0),
            start: Instant::now(),
            written: 0,
        }
    }

    fn wrote(&mut self, bytes: u64) {
        self.written += bytes;
        if let Some(limit) = self.limit_bytes_s {
            let due = self.written as f64 / limit;
            let now = self.start.elapsed().as_secs_f64();
            if due > now {
                std::thread::sleep(std::time::Duration::from_secs_f64(due - now));
            }
        }
    }
}

/// One shard per element, each the same rows.
type Columns = Vec<Vec<u8>>;

/// Where logical bytes [at, at + len) of rows of `m` data shards lie, piece by piece (each
/// within one block): (column, offset in that column, offset in the bytes, length).
fn pieces(m: usize, at: u64, len: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let o = at + pos as u64;
        let b = o / BLOCK as u64;
        let (row, col) = ((b / m as u64) as usize, (b % m as u64) as usize);
        let in_block = (o % BLOCK as u64) as usize;
        let n = (BLOCK - in_block).min(len - pos);
        let piece = (col, row * BLOCK + in_block, pos, n);
        pos += n;
        Some(piece)
    })
}

/// Logical bytes [at, at + out.len()) of rows whose data shards are `cols` (window-relative).
fn gather(cols: &[Vec<u8>], m: usize, at: u64, out: &mut [u8]) {
    for (col, src, pos, n) in pieces(m, at, out.len()) {
        out[pos..pos + n].copy_from_slice(&cols[col][src..src + n]);
    }
}

/// The inverse of `gather`.
fn scatter(cols: &mut [Vec<u8>], m: usize, at: u64, bytes: &[u8]) {
    for (col, dst, pos, n) in pieces(m, at, bytes.len()) {
        cols[col][dst..dst + n].copy_from_slice(&bytes[pos..pos + n]);
    }
}

/// Copies logical bytes [lo, hi) (window-relative) from `src` to `dst` data columns.
fn copy_logical(dst: &mut [Vec<u8>], src: &[Vec<u8>], m: usize, lo: u64, hi: u64) {
    let mut buf = vec![0u8; (hi - lo) as usize];
    gather(src, m, lo, &mut buf);
    scatter(dst, m, lo, &buf);
}

impl Erasure {
    /// The M data shards of the rows `shards` hold (all the same length), decoded from the
    /// shards present and not in `exclude`. None with fewer than M of those.
    pub(super) fn decode_data(
        &self,
        shards: &[Option<&[u8]>],
        exclude: &[usize],
    ) -> Option<Vec<Vec<u8>>> {
        let (m, k) = (self.r.data, self.r.parity);
        let usable = |i: usize| shards[i].is_some() && !exclude.contains(&i);
        if (0..m + k).filter(|&i| usable(i)).count() < m {
            return None;
        }
        if (0..m).all(usable) {
            return Some((0..m).map(|i| shards[i].unwrap_or(&[]).to_vec()).collect());
        }
        let originals = (0..m)
            .filter(|&i| usable(i))
            .filter_map(|i| shards[i].map(|b| (i, b)));
        let recovery = (m..m + k)
            .filter(|&i| usable(i))
            .filter_map(|i| shards[i].map(|b| (i - m, b)));
        let restored = reed_solomon_simd::decode(m, k, originals, recovery).ok()?;
        (0..m)
            .map(|i| match usable(i) {
                true => shards[i].map(<[u8]>::to_vec),
                false => restored.get(&i).cloned(),
            })
            .collect()
    }

    /// The K parity shards of data shards `data`.
    pub(super) fn encode_parity(&self, data: &[Vec<u8>]) -> DevResult<Vec<Vec<u8>>> {
        if self.r.parity == 0 {
            return Ok(Vec::new());
        }
        reed_solomon_simd::encode(self.r.data, self.r.parity, data.iter().map(Vec::as_slice))
            .map_err(|e| TargetFault::Codec(format!("encode: {e}")).into())
    }

    /// Which shards of one row (`row[i]`: shard i's block, None if not read) are damaged,
    /// judged by consistency alone: the smallest set whose exclusion leaves more than M
    /// shards that all agree with each other, when exactly one set of that size does. Empty
    /// when the row is consistent or cannot tell (then only a blake3 check can).
    pub(super) fn locate_damage(&self, row: &[Option<&[u8]>]) -> Vec<usize> {
        let (m, k) = (self.r.data, self.r.parity);
        let present: Vec<usize> = (0..m + k).filter(|&i| row[i].is_some()).collect();
        let consistent_without = |set: &[usize]| -> bool {
            let Some(data) = self.decode_data(row, set) else {
                return false;
            };
            let Ok(parity) = self.encode_parity(&data) else {
                return false;
            };
            present.iter().filter(|i| !set.contains(i)).all(|&i| {
                let want = if i < m { &data[i] } else { &parity[i - m] };
                row[i] == Some(want.as_slice())
            })
        };
        if consistent_without(&[]) {
            return Vec::new();
        }
        // More than M must remain, or any M agree with each other and nothing is told.
        for size in 1..present.len().saturating_sub(m) {
            let found: Vec<Vec<usize>> = combinations(&present, size)
                .into_iter()
                .filter(|set| consistent_without(set))
                .take(2)
                .collect();
            match found.len() {
                0 => continue,
                1 => return found.into_iter().next().unwrap_or_default(),
                _ => return Vec::new(),
            }
        }
        Vec::new()
    }

    /// Segment `seg` is placed with some shard not on a healthy target (or never written),
    /// or with a shard found unreadable or damaged since the mount: what `rebuild` visits
    /// (all it knows to be short of full redundancy).
    pub(crate) fn needs_rebuild(&self, seg: u64) -> bool {
        let all = self.all();
        let Some(p) = self.map.read().get(seg as usize).cloned().flatten() else {
            return false;
        };
        let sus = self.suspects.lock();
        // `holds` covers a target suspect as a whole (more suspect shards than remembered
        // one by one): every segment with a shard on it is visited.
        p.shards.iter().enumerate().any(|(i, s)| {
            s.is_none_or(|a| !all[a.target as usize].healthy() || sus.holds(seg, i, a.target))
        })
    }

    /// Some target is suspect as a whole (see `Suspects`).
    pub(crate) fn any_whole_suspect(&self) -> bool {
        self.suspects.lock().any_whole()
    }

    /// Segment `seg` has a placement.
    pub(crate) fn is_placed(&self, seg: u64) -> bool {
        self.map
            .read()
            .get(seg as usize)
            .is_some_and(Option::is_some)
    }

    /// A repair pass visited every segment: targets counted unreadable as a whole are judged
    /// by what it found.
    pub(crate) fn repair_pass_done(&self) {
        self.suspects.lock().clear_whole();
    }

    /// Slots on healthy targets in failure domains `p` does not use yet, for its shards
    /// `bad` (fewer when there are not enough).
    fn take_fix_slots(&self, p: &Placed, bad: &[usize]) -> Vec<(usize, ShardAt)> {
        let all = self.all();
        let taken: BTreeSet<String> = p
            .shards
            .iter()
            .enumerate()
            .filter(|(i, _)| !bad.contains(i))
            .filter_map(|(_, s)| s.map(|a| all[a.target as usize].domain.clone()))
            .collect();
        let mut free = self.free.lock();
        let chosen = self.choose_for(&free, &taken, bad.len());
        bad.iter()
            .zip(chosen)
            .map(|(&i, t)| {
                let slot = free[t as usize]
                    .pop_first()
                    .expect("chosen targets have a free slot");
                (i, ShardAt { target: t, slot })
            })
            .collect()
    }

    fn give_back(&self, fixes: &[(usize, ShardAt)]) {
        let mut free = self.free.lock();
        for (_, a) in fixes {
            free[a.target as usize].insert(a.slot);
        }
    }

    /// A segment holding nothing live with shards on failed targets: unplaced (its record
    /// zeroed, its slots free again), so nothing names those targets any more and nothing is
    /// copied for it; the store places it afresh when it takes it (`prepare`).
    fn unplace_empty(&self, seg: u64, p: &Placed, bad: &[usize]) -> DevResult<()> {
        if bad.iter().all(|&i| p.shards[i].is_none()) {
            // Its shards hold nothing live: one found damaged (or past a target's cut) costs
            // no redundancy, and would otherwise keep the target degraded (and its cut
            // marker) until the segment is written again.
            self.suspects.lock().clear_segment(seg);
            return Ok(());
        }
        let mut map = self.map.write();
        if map[seg as usize].as_ref() != Some(p) {
            return Ok(());
        }
        self.map_dev
            .write_at(&[0u8; RECORD_BYTES], seg * RECORD_BYTES as u64)
            .and_then(|()| self.map_dev.sync())?;
        map[seg as usize] = None;
        drop(map);
        let all = self.all();
        let mut free = self.free.lock();
        for a in p.shards.iter().flatten() {
            if all[a.target as usize].healthy() {
                free[a.target as usize].insert(a.slot);
            }
        }
        drop(free);
        self.suspects.lock().clear_segment(seg);
        Ok(())
    }

    /// Repairs one segment (see the module comment): verifies its committed chunks, writes
    /// the shards on failed targets to new targets (switching the record once they are
    /// durable) and, unless it is busy, rewrites in place what it found damaged on healthy
    /// targets. `verify(i, bytes)`: whether `bytes` are chunk `job.chunks[i]`'s stored bytes.
    /// Under the segment's stripe: writes to it wait, reads go on.
    pub(crate) fn repair_segment(
        &self,
        job: &SegmentJob,
        verify: &mut dyn FnMut(usize, &[u8]) -> bool,
        rep: &mut RebuildReport,
        throttle: &mut Throttle,
    ) -> DevResult<()> {
        let seg = job.seg;
        let (m, k) = (self.r.data, self.r.parity);
        let n = m + k;
        let _stripe = self.stripes[seg as usize % STRIPES].write();
        let Some(p) = self.map.read().get(seg as usize).cloned().flatten() else {
            if !job.chunks.is_empty() {
                rep.segments_lost += 1;
                for c in job.chunks {
                    rep.lose(seg, c.offset, c.len);
                }
            }
            return Ok(());
        };
        rep.segments_checked += 1;
        let all = self.all();
        let on_healthy = |i: usize| p.shards[i].is_some_and(|a| all[a.target as usize].healthy());
        let bad: Vec<usize> = (0..n).filter(|&i| !on_healthy(i)).collect();
        if job.chunks.is_empty() && !job.busy {
            return self.unplace_empty(seg, &p, &bad);
        }
        if n - bad.len() < m {
            log::error!(
                "segment {seg}: only {} of its {n} shards are on healthy targets, {m} are \
                 needed; the {} chunks it held are lost (`ckptfs check` names the files)",
                n - bad.len(),
                job.chunks.len()
            );
            rep.segments_lost += 1;
            for c in job.chunks {
                rep.lose(seg, c.offset, c.len);
            }
            return Ok(());
        }
        let fixes = self.take_fix_slots(&p, &bad);
        if job.busy {
            rep.segments_busy += 1;
        }
        let mut w = SegmentRepair {
            p: &p,
            seg,
            fixes: &fixes,
            in_place: !job.busy,
            lost_rows: false,
        };
        let mut failed = self.repair_windows(&mut w, job, verify, rep, throttle);
        // What was written, new shards and blocks rewritten in place, is durable before the
        // record names the new shards and before the pass says so.
        if failed.is_none() {
            failed = self.sync_repaired(&p, &fixes)?;
        }
        if let Some(why) = failed {
            log::error!("repairing segment {seg}: {why}; it stays degraded");
            self.give_back(&fixes);
            rep.segments_short += 1;
            return Ok(());
        }
        if !w.lost_rows && !job.busy {
            // Every shard of every live row verified or rewritten.
            self.suspects.lock().clear_segment(seg);
        }
        if fixes.is_empty() {
            if !bad.is_empty() {
                rep.segments_short += 1;
            }
            return Ok(());
        }
        if !self.switch_to_fixes(seg, &p, &fixes)? {
            return Ok(());
        }
        rep.segments_rebuilt += 1;
        rep.shards_written += fixes.len() as u64;
        if fixes.len() < bad.len() {
            rep.segments_short += 1;
        }
        Ok(())
    }

    /// Repairs a segment window by window (`REPAIR_ROWS` rows each). Returns why it
    /// stopped short, if it did.
    fn repair_windows(
        &self,
        w: &mut SegmentRepair,
        job: &SegmentJob,
        verify: &mut dyn FnMut(usize, &[u8]) -> bool,
        rep: &mut RebuildReport,
        throttle: &mut Throttle,
    ) -> Option<String> {
        let rows_total = self.shard_bytes / BLOCK as u64;
        let rb = self.row_bytes();
        // A busy segment moving shards copies every row (its uncommitted rows included);
        // otherwise only the rows holding committed chunks matter.
        let every_row = job.busy && !w.fixes.is_empty();
        // Windows own `REPAIR_ROWS` rows each and never share one: a row is rewritten only
        // by the window that owns it, which verified every chunk with bytes in it (those
        // reaching into the next or the previous window too: the window reads past its own
        // rows to their ends).
        let end = |c: &SegmentChunk| c.offset + c.len as u64;
        let (mut ci, mut r0) = (0usize, 0u64);
        let mut failed: Option<String> = None;
        while failed.is_none() && r0 < rows_total {
            // The first chunk with bytes at or after this window.
            while job.chunks.get(ci).is_some_and(|c| end(c) <= r0 * rb) {
                ci += 1;
            }
            if !every_row {
                let Some(c) = job.chunks.get(ci) else { break };
                r0 = r0.max(c.offset / rb);
            }
            let r1 = (r0 + REPAIR_ROWS).min(rows_total);
            let cj = ci + job.chunks[ci..].partition_point(|c| c.offset < r1 * rb);
            let mine = &job.chunks[ci..cj];
            let read = match (mine.first(), mine.last()) {
                (Some(a), Some(z)) => (a.offset / rb).min(r0)..end(z).div_ceil(rb).max(r1),
                _ => r0..r1,
            };
            let read = read.start..read.end.min(rows_total);
            let mut check = |j: usize, b: &[u8]| verify(ci + j, b);
            match self.repair_window(w, read, r0..r1, mine, &mut check, rep) {
                Ok(bytes) => throttle.wrote(bytes),
                Err(e) => failed = Some(format!("rows {r0}..{r1}: {e}")),
            }
            r0 = r1;
        }
        failed
    }

    /// Syncs the targets a repair wrote to (the segment's and the new shards'). A target
    /// whose sync fails is failed; if it held a new shard, returns why the repair stops
    /// short. A fenced sync is an error: this node no longer owns the space.
    fn sync_repaired(&self, p: &Placed, fixes: &[(usize, ShardAt)]) -> DevResult<Option<String>> {
        let mut failed = None;
        let targets: BTreeSet<u16> = p
            .shards
            .iter()
            .flatten()
            .chain(fixes.iter().map(|(_, a)| a))
            .map(|a| a.target)
            .collect();
        for t in targets {
            let tg = self.tg(t);
            if !tg.healthy() || !tg.dirty.swap(false, Ordering::SeqCst) {
                continue;
            }
            if let Some(Err(e)) = tg.dev.as_ref().map(|d| d.sync()) {
                if e.is_fenced() {
                    return Err(e);
                }
                tg.errors.fetch_add(1, Ordering::Relaxed);
                self.fail_target(t, format!("sync: {e}"));
                if fixes.iter().any(|(_, a)| a.target == t) {
                    failed = Some(format!("syncing target {t}: {e}"));
                }
            }
        }
        Ok(failed)
    }

    /// Switches segment `seg`'s record from `p` to the new shards (`fixes`, durable now),
    /// durably. False: the segment was re-placed meanwhile (freed and taken again), so the
    /// rebuilt shards are moot and go back.
    fn switch_to_fixes(&self, seg: u64, p: &Placed, fixes: &[(usize, ShardAt)]) -> DevResult<bool> {
        let mut next = p.clone();
        next.generation += 1;
        for (i, a) in fixes {
            next.shards[*i] = Some(*a);
        }
        let mut map = self.map.write();
        if map[seg as usize].as_ref() != Some(p) {
            drop(map);
            self.give_back(fixes);
            return Ok(false);
        }
        self.map_dev
            .write_at(&next.encode(), seg * RECORD_BYTES as u64)
            .and_then(|()| self.map_dev.sync())?;
        map[seg as usize] = Some(next);
        drop(map);
        let mut sus = self.suspects.lock();
        for (i, _) in fixes {
            sus.clear_shard(seg, *i);
        }
        Ok(true)
    }

    /// Repairs the rows `own` of the segment of `w`, whose bytes lie in `chunks` (those
    /// with bytes in `own`) and elsewhere nothing committed; reads the rows `read` (`own`
    /// and the rest of those chunks). Window-relative offsets are `offset - read.start *
    /// row`. Returns the bytes written.
    ///
    /// In four steps: the stored shards are read and decoded; every chunk is verified
    /// (`verify_window`: the data as decoded, or without the shards that make it wrong);
    /// the rows whose stored shards disagree with the verified data are found
    /// (`rows_to_rewrite`); then they are rewritten in place and the new shards written.
    fn repair_window(
        &self,
        w: &mut SegmentRepair,
        read: Range<u64>,
        own: Range<u64>,
        chunks: &[SegmentChunk],
        verify: &mut dyn FnMut(usize, &[u8]) -> bool,
        rep: &mut RebuildReport,
    ) -> DevResult<u64> {
        let m = self.r.data;
        let n = m + self.r.parity;
        let (p, seg) = (w.p, w.seg);
        let (r0, r1) = (read.start, read.end);
        let stored: Vec<Option<IoBuf>> = (0..n)
            .map(|i| {
                let expected = self.readable(p, i);
                let b = expected
                    .then(|| self.read_shard(seg, p, i, r0, r1))
                    .flatten();
                rep.read_errors += (expected && b.is_none()) as u64;
                b
            })
            .collect();
        let slices: Vec<Option<&[u8]>> = stored
            .iter()
            .map(|b| b.as_ref().map(IoBuf::as_slice))
            .collect();
        let win = Window {
            slices: &slices,
            present: (0..n).filter(|&i| slices[i].is_some()).collect(),
            r0,
            rows: (r1 - r0) as usize,
            // Rows this window may rewrite, window-relative.
            mine: (own.start - r0) as usize..(own.end - r0) as usize,
            own_from: own.start * self.row_bytes(),
        };
        let Some(base) = self.decode_data(&slices, &[]) else {
            for c in chunks.iter().filter(|c| win.counts(c)) {
                rep.lose(seg, c.offset, c.len);
            }
            w.lost_rows = true;
            return match w.fixes.is_empty() {
                true => Ok(0),
                false => Err(TargetFault::Unreadable {
                    segment: seg,
                    readable: win.present.len(),
                    needed: m,
                }
                .into()),
            };
        };
        let mut v = self.verify_window(w, &win, base, chunks, verify, rep);
        let mut parity = self.encode_parity(&v.truth)?;
        let rewrite = self.rows_to_rewrite(p, &win, &mut v, &mut parity)?;
        let mut written = 0u64;
        if w.in_place {
            written += self.rewrite_in_place(w, &win, &v.truth, &parity, &rewrite, rep)?;
        }
        written += self.write_fixes(w, &win, &v.truth, &parity, own.start, rep)?;
        Ok(written)
    }

    /// Verifies every chunk of a window against `verify`; where the bytes as decoded fail,
    /// searches the sets of shards to do without (smallest first) for a decoding that
    /// verifies. Returns the verified data (`truth`) and which rows hold live and lost bytes.
    fn verify_window(
        &self,
        w: &mut SegmentRepair,
        win: &Window,
        base: Columns,
        chunks: &[SegmentChunk],
        verify: &mut dyn FnMut(usize, &[u8]) -> bool,
        rep: &mut RebuildReport,
    ) -> Verified {
        let m = self.r.data;
        let (p, seg) = (w.p, w.seg);
        let rb = self.row_bytes();
        let base_at = win.r0 * rb;
        let mut v = Verified {
            truth: base.clone(),
            live: vec![false; win.rows],
            lost: vec![false; win.rows],
            spans: Vec::with_capacity(chunks.len()),
        };
        let mut tried: HashMap<Vec<usize>, Option<Vec<Vec<u8>>>> = HashMap::new();
        for (j, c) in chunks.iter().enumerate() {
            let at = c.offset - base_at;
            let end = at + c.len as u64;
            let row_span = (at / rb) as usize..(end.div_ceil(rb) as usize).min(win.rows);
            v.spans.push((at, end));
            for r in row_span.clone() {
                v.live[r] = true;
            }
            let mut bytes = vec![0u8; c.len as usize];
            gather(&base, m, at, &mut bytes);
            if verify(j, &bytes) {
                rep.chunks_verified += win.counts(c) as u64;
                continue;
            }
            let mut found: Option<Vec<usize>> = None;
            'search: for size in 1..=win.present.len().saturating_sub(m) {
                for set in combinations(&win.present, size) {
                    if tried.len() >= TRIED_MAX && !tried.contains_key(&set) {
                        tried.clear();
                    }
                    let d = tried
                        .entry(set.clone())
                        .or_insert_with(|| self.decode_data(win.slices, &set));
                    let Some(d) = d else { continue };
                    gather(d, m, at, &mut bytes);
                    if verify(j, &bytes) {
                        found = Some(set);
                        break 'search;
                    }
                }
            }
            match found {
                Some(set) => {
                    scatter(&mut v.truth, m, at, &bytes);
                    rep.chunks_verified += win.counts(c) as u64;
                    rep.chunks_repaired += win.counts(c) as u64;
                    for &i in &set {
                        if let Some(a) = p.shards[i] {
                            self.damaged_shard(
                                seg,
                                i,
                                a,
                                "found by a repair, which rewrites it from verified data",
                            );
                        }
                    }
                }
                None => {
                    if win.counts(c) {
                        rep.lose(seg, c.offset, c.len);
                    }
                    w.lost_rows = true;
                    for r in row_span {
                        v.lost[r] = true;
                    }
                }
            }
        }
        v
    }

    /// The (shard, row) blocks of this window's own rows whose stored bytes disagree with
    /// the verified data. Bytes no chunk covers are taken from the decoding of the row
    /// that agrees with the most stored shards (`truth` and `parity` are updated with it).
    fn rows_to_rewrite(
        &self,
        p: &Placed,
        win: &Window,
        v: &mut Verified,
        parity: &mut Columns,
    ) -> DevResult<Vec<(usize, usize)>> {
        let (m, k) = (self.r.data, self.r.parity);
        let n = m + k;
        let rb = self.row_bytes();
        let slices = win.slices;
        let mut rewrite: Vec<(usize, usize)> = Vec::new(); // (shard, row)
        for r in win.mine.clone() {
            if !v.live[r] || v.lost[r] {
                continue;
            }
            let range = r * BLOCK..(r + 1) * BLOCK;
            let matches = |i: usize, data: &[Vec<u8>], par: &[Vec<u8>]| -> bool {
                let want = if i < m {
                    &data[i][range.clone()]
                } else {
                    &par[i - m][range.clone()]
                };
                slices[i].is_some_and(|s| &s[range.clone()] == want)
            };
            let on_target = |i: usize| p.shards[i].is_some_and(|a| self.tg(a.target).healthy());
            let mism: Vec<usize> = (0..n)
                .filter(|&i| on_target(i) && !matches(i, &v.truth, parity))
                .collect();
            if mism.is_empty() {
                continue;
            }
            // Candidates: this row decoded without each set of shards, with the verified
            // chunk bytes laid over it.
            let row_slices: Vec<Option<&[u8]>> = slices
                .iter()
                .map(|s| s.map(|b| &b[range.clone()]))
                .collect();
            let row_lo = r as u64 * rb;
            let row_hi = row_lo + rb;
            // (shards agreeing, data shards, parity shards) of the best decoding so far.
            let mut best: Option<(usize, Columns, Columns)> = None;
            for size in 0..=win
                .present
                .len()
                .saturating_sub(m)
                .min(CANDIDATE_EXCLUDED_MAX)
            {
                for set in combinations(&win.present, size) {
                    let Some(mut d) = self.decode_data(&row_slices, &set) else {
                        continue;
                    };
                    // Window-relative columns of one row: lay the verified bytes over it.
                    let mut one: Vec<Vec<u8>> =
                        v.truth.iter().map(|c| c[range.clone()].to_vec()).collect();
                    for &(a, b) in &v.spans {
                        let (lo, hi) = (a.max(row_lo), b.min(row_hi));
                        if lo < hi {
                            copy_logical(&mut d, &one, m, lo - row_lo, hi - row_lo);
                        }
                    }
                    one.clear();
                    let par = self.encode_parity(&d)?;
                    let agree = (0..n)
                        .filter(|&i| {
                            let want = if i < m { &d[i] } else { &par[i - m] };
                            row_slices[i] == Some(want.as_slice())
                        })
                        .count();
                    if best.as_ref().is_none_or(|(a, _, _)| agree > *a) {
                        best = Some((agree, d, par));
                    }
                }
                if best
                    .as_ref()
                    .is_some_and(|(a, _, _)| *a + size >= win.present.len())
                {
                    break;
                }
            }
            if let Some((_, d, par)) = best {
                for (col, row) in v.truth.iter_mut().zip(&d).take(m) {
                    col[range.clone()].copy_from_slice(row);
                }
                for (col, row) in parity.iter_mut().zip(&par).take(k) {
                    col[range.clone()].copy_from_slice(row);
                }
            }
            for i in (0..n).filter(|&i| on_target(i) && !matches(i, &v.truth, parity)) {
                rewrite.push((i, r));
            }
        }
        Ok(rewrite)
    }

    /// Writes the verified bytes over the `rewrite` blocks on healthy targets (a target
    /// whose write fails is failed; a fenced write stops the repair). Returns bytes written.
    fn rewrite_in_place(
        &self,
        w: &SegmentRepair,
        win: &Window,
        truth: &Columns,
        parity: &Columns,
        rewrite: &[(usize, usize)],
        rep: &mut RebuildReport,
    ) -> DevResult<u64> {
        let m = self.r.data;
        let (p, seg) = (w.p, w.seg);
        let mut written = 0u64;
        for &(i, r) in rewrite {
            let Some(a) = p.shards[i] else { continue };
            let t = self.tg(a.target);
            let Some(dev) = t.dev.as_ref().filter(|_| t.healthy()) else {
                continue;
            };
            let range = r * BLOCK..(r + 1) * BLOCK;
            let src = if i < m {
                &truth[i][range]
            } else {
                &parity[i - m][range]
            };
            let mut b = IoBuf::new();
            b.extend_from_slice(src);
            if win.slices[i].is_some() {
                // Read fine but wrong: damaged, or stale (blamed once per shard).
                if !rewrite.iter().any(|&(x, y)| x == i && y < r) {
                    self.damaged_shard(
                        seg,
                        i,
                        a,
                        "its row disagrees with verified data; a repair rewrites it",
                    );
                }
            }
            match dev.write_at(b.as_slice(), self.shard_offset(a.slot, win.r0 + r as u64)) {
                Ok(()) => {
                    t.dirty.store(true, Ordering::SeqCst);
                    t.repaired_blocks.fetch_add(1, Ordering::Relaxed);
                    t.bytes_written.fetch_add(BLOCK as u64, Ordering::Relaxed);
                    rep.blocks_rewritten += 1;
                    written += BLOCK as u64;
                }
                Err(e) if e.is_fenced() => return Err(e),
                Err(e) => {
                    t.errors.fetch_add(1, Ordering::Relaxed);
                    self.fail_target(a.target, format!("write: {e}"));
                }
            }
        }
        Ok(written)
    }

    /// Writes this window's own rows of each shard that moves (`w.fixes`) to its new
    /// place; any failure fails the window (the segment stays degraded, its record
    /// unchanged). Returns the bytes written.
    fn write_fixes(
        &self,
        w: &SegmentRepair,
        win: &Window,
        truth: &Columns,
        parity: &Columns,
        own_start: u64,
        rep: &mut RebuildReport,
    ) -> DevResult<u64> {
        let m = self.r.data;
        let mut written = 0u64;
        for (i, at) in w.fixes {
            let src = if *i < m { &truth[*i] } else { &parity[*i - m] };
            let t = self.tg(at.target);
            let Some(dev) = t.dev.as_ref().filter(|_| t.healthy()) else {
                return Err(TargetFault::TargetFailed {
                    target: at.target,
                    why: "failed before the repair wrote to it".into(),
                }
                .into());
            };
            let mut b = IoBuf::new();
            b.extend_from_slice(&src[win.mine.start * BLOCK..win.mine.end * BLOCK]);
            if let Err(e) = dev.write_at(b.as_slice(), self.shard_offset(at.slot, own_start)) {
                if e.is_fenced() {
                    return Err(e);
                }
                t.errors.fetch_add(1, Ordering::Relaxed);
                self.fail_target(at.target, format!("write: {e}"));
                return Err(TargetFault::TargetFailed {
                    target: at.target,
                    why: format!("writing: {e}"),
                }
                .into());
            }
            t.dirty.store(true, Ordering::SeqCst);
            t.bytes_written.fetch_add(b.len() as u64, Ordering::Relaxed);
            rep.bytes_written += b.len() as u64;
            written += b.len() as u64;
        }
        Ok(written)
    }
}

/// One window of a segment's repair as read: its shards, rows and the rows it owns.
struct Window<'a> {
    /// The stored shards of the window's rows (None: not readable).
    slices: &'a [Option<&'a [u8]>],
    /// The shards read.
    present: Vec<usize>,
    /// The window's first row in the segment and its number of rows.
    r0: u64,
    rows: usize,
    /// The rows this window owns and may rewrite, window-relative.
    mine: Range<usize>,
    /// The segment offset where this window's own rows begin.
    own_from: u64,
}

impl Window<'_> {
    /// Whether chunk `c` is this window's to count: one reaching in from the previous
    /// window was counted there.
    fn counts(&self, c: &SegmentChunk) -> bool {
        c.offset >= self.own_from
    }
}

/// A window's chunks verified: the data columns with every verified chunk's bytes, and
/// which rows hold live bytes and which bytes that could not be verified.
struct Verified {
    truth: Columns,
    live: Vec<bool>,
    lost: Vec<bool>,
    /// Window-relative byte spans of the chunks.
    spans: Vec<(u64, u64)>,
}

/// The state of one segment's repair across its windows.
struct SegmentRepair<'a> {
    p: &'a Placed,
    seg: u64,
    fixes: &'a [(usize, ShardAt)],
    /// Rewrite damaged blocks on healthy targets (not while the segment is being written).
    in_place: bool,
    /// Some chunk of the segment could not be verified.
    lost_rows: bool,
}
