//! Cut jobs: a file's content-defined stream, the bytes in flight to the store, and the
//! cut state a worker runs (`CutState::run`) so writers never wait for the cutter.

use super::*;
use crate::write::pipeline::ChunkIo;
use crate::write::pipeline::{Permit, Piece, SharedBytes, Ticket};
use crate::write::spill::{Carries, Charge, Spill, SpillFile, SpillSlot};
use std::collections::VecDeque;
use std::sync::Arc;

/// Runs a cutter job where `c` schedules cutters (the pipeline's workers), or at once.
pub(super) fn run_cutter(c: &dyn ChunkIo, job: Box<dyn FnOnce() + Send>) {
    match c.cutters() {
        Some(p) => p.spawn_cut(job),
        None => job(),
    }
}

/// A stream of at most this many bytes that is handed over whole as its file closes is cut
/// on the closing thread: for a small file the hand-off to a worker and back was most of
/// its cut's cost.
pub(super) const SMALL_STREAM: usize = 256 << 10;

/// Bytes a file's dirty blocks may hold before they are flushed into chunks.
pub(super) const DIRTY_LIMIT_BYTES: usize = 32 << 20;

pub(super) struct Stream {
    pub(super) start: u64,
    pub(super) buf: Vec<u8>,
    /// Counts this stream among the files sharing `pipeline::STREAM_BYTES` while it lives.
    pub(super) _live: Option<LiveStream>,
}

/// One file's stream buffer, counted in `Cutters::live_streams`.
pub(super) struct LiveStream(Arc<std::sync::atomic::AtomicUsize>);

impl LiveStream {
    pub(super) fn new(n: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LiveStream(n)
    }
}

impl Drop for LiveStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A piece of content handed to the store and not yet in the map: newer than the map, older
/// than the dirty blocks and the stream, and older than the entries after it.
pub(super) struct InFlight {
    pub(super) off: u64,
    pub(super) work: Work,
}

pub(super) enum Work {
    /// All zeros: punched from the map when it retires (in order, so it cannot be undone by
    /// an older chunk retiring after it).
    Hole(u64),
    /// `ticket` is None until the piece is handed to the store, and again after a failure
    /// (it is handed over again on the next `retire`).
    Chunk {
        piece: Piece,
        ticket: Option<Ticket>,
    },
    /// Sequential bytes being cut into chunks by a worker; the pieces cut so far take this
    /// entry's place in order (`take_cuts`), and it goes once its bytes are all cut.
    Cut(Arc<CutState>),
}

impl InFlight {
    /// Bytes this entry covers now (for a cut: bytes not yet taken out as pieces).
    pub(super) fn len(&self) -> u64 {
        match &self.work {
            Work::Hole(n) => *n,
            Work::Chunk { piece, .. } => piece.len() as u64,
            Work::Cut(st) => {
                let g = st.m.lock();
                g.end - g.taken_to
            }
        }
    }
}

/// Bytes of a sequential stream handed to the cutter and not yet cut, per file at most:
/// a writer that outruns its cutter waits (bounded memory, back-pressure). All files
/// together are bounded too (`ChunkIo::reserve_cut`; the store's `CUT_BYTES`).
pub(super) const CUT_QUEUE_BYTES: usize = 4 << 20;

/// With cutting on the writing thread on (`CKPTFS_CUT_HERE=1` in the daemon's environment;
/// off by default, see below), a stream whose last `CUT_HERE_WINDOW` bytes were at least
/// this share (half) chunks confirmed by fingerprint has its next segment cut on the thread
/// that hands it over (the FUSE thread the write arrived on), not on a worker. Such a stream
/// (a next checkpoint repeating the last one) costs little to cut: one xxh3 pass over bytes
/// the kernel has just copied into this thread's cache, where a worker on another core
/// reads them from the shared cache or memory first, and no hand-over to a worker (a
/// wake-up, a context switch on each side). Half, not more: one changed block in a window
/// already drops it to about four fifths (5% of blocks changed re-cut about a fifth of the
/// bytes). A stream of new data (a first checkpoint) confirms nothing and stays on the
/// workers, since content-defined cutting on the writer's path would bound it to one core's
/// cutting speed (`CutState`).
///
/// Why it is off: on a 16-core node it saved 0.03-0.08 of a next step's 0.79-0.93 daemon
/// CPU-s/GiB (`predict_fingerprint` 0.07 against 0.08-0.10), but the writers wait for the
/// cut, and the FUSE threads, now cutting too, became the bottleneck: the next step was
/// written 25-30% slower at 1 to 16 writers (1 writer 1501-1773 against 2151-2457 MiB/s; 8
/// writers 5097-5465 against 6275-7072). On the 2-core VM the CPU did not change. With more
/// FUSE threads it might pay; that is not measured yet.
pub(super) const CUT_HERE_SHARE: (u64, u64) = (1, 2);
/// Stream bytes over which `CUT_HERE_SHARE` is measured.
pub(super) const CUT_HERE_WINDOW: u64 = 512 << 10;

/// Whether segments may be cut on the handing-over thread (`CUT_HERE_SHARE`): the
/// environment is read once.
pub(super) fn cut_here_enabled() -> bool {
    cut_here_switch().load(std::sync::atomic::Ordering::Relaxed)
}

pub(super) fn cut_here_switch() -> &'static std::sync::atomic::AtomicBool {
    static ON: std::sync::OnceLock<std::sync::atomic::AtomicBool> = std::sync::OnceLock::new();
    ON.get_or_init(|| {
        let on = std::env::var("CKPTFS_CUT_HERE").is_ok_and(|v| v == "1");
        if on {
            log::info!("CKPTFS_CUT_HERE=1: next checkpoints' streams are cut on the FUSE threads");
        }
        std::sync::atomic::AtomicBool::new(on)
    })
}

/// The content-defined cut of a sequential stream, done by a worker so the writer's
/// request only copies bytes: FastCDC takes about as long as blake3 on this hardware, and
/// on the request path it bounds a single writer to one core's cutting speed.
pub(super) struct CutState {
    pub(super) m: parking_lot::Mutex<CutInner>,
    pub(super) cv: parking_lot::Condvar,
    pub(super) me: std::sync::Weak<CutState>,
    /// Where the carry is charged and spilled beyond the budget (`spill`); `None`: it
    /// stays in memory (tests with a map for a store).
    pub(super) carries: Option<Arc<Carries>>,
}

pub(super) struct CutInner {
    /// Taken out by the running cutter (only one runs at a time: `running`).
    pub(super) cutter: Option<Cutter>,
    /// Segments handed over, in order and back to back, until they are cut (then their
    /// bytes are in pieces, taken or in `out`, and in the carry); reads see the stream
    /// through them, `out` and the carry.
    pub(super) segs: VecDeque<(u64, SharedBytes)>,
    /// Index in `segs` of the first segment not yet cut, and the bytes from there on.
    pub(super) next: usize,
    pub(super) queued: usize,
    /// The global room each segment not yet cut holds (`ChunkIo::reserve_cut`), in order.
    pub(super) permits: VecDeque<Option<Permit>>,
    /// File offset after the last segment.
    pub(super) end: u64,
    /// The cutter's unfinished last chunk (it may grow with the next segment); shared with
    /// the running cutter, so reads see it while the next segment is cut. Empty while it
    /// is spilled (`spilled`).
    pub(super) carry_start: u64,
    pub(super) carry: Arc<Vec<u8>>,
    /// The carry's bytes while they are in the spill file (`spill`): only between cuts.
    pub(super) spilled: Option<SpillSlot>,
    /// The carry's memory, charged to the pipeline's carries.
    pub(super) charge: Option<Charge>,
    /// Counts carries: an order entry (`Carries::touch`) names the carry it was made for.
    pub(super) gen: u64,
    /// The carry could not be read back from the spill file: this stream's bytes from
    /// `carry_start` on are lost, and the file's writes fail with this.
    pub(super) failed: Option<String>,
    /// The cutter has taken `segs[next - 1]` and not yet put its pieces in `out`.
    pub(super) in_cut: bool,
    /// Cut pieces not yet taken by the file state: offset, bytes, all zeros.
    pub(super) out: Vec<(u64, Piece, bool)>,
    /// Offset up to which pieces were taken.
    pub(super) taken_to: u64,
    /// No more segments come; the carry is cut to the end.
    pub(super) finish: bool,
    /// A cutter is scheduled or running.
    pub(super) running: bool,
    /// The next segment is cut on the thread that hands it over (`hand_over`) rather than
    /// on a worker: the stream's last window was mostly chunks confirmed by fingerprint
    /// (`CUT_HERE_SHARE`).
    pub(super) here: bool,
    /// Segment bytes cut since `here` was last decided, and the bytes of chunks confirmed by
    /// fingerprint among them.
    pub(super) window: (u64, u64),
}

impl CutInner {
    pub(super) fn done(&self) -> bool {
        self.finish
            && !self.running
            && self.next == self.segs.len()
            && self.carry.is_empty()
            && self.spilled.is_none()
    }

    /// The carry, in memory: brought back from the spill file if it is there.
    pub(super) fn load_carry(&mut self, carries: Option<&Arc<Carries>>) -> std::io::Result<()> {
        if let Some(slot) = &self.spilled {
            let v = slot.load()?;
            self.spilled = None;
            if let Some(cs) = carries {
                cs.loaded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.charge = Some(cs.charge(v.capacity()));
            }
            self.carry = Arc::new(v);
        }
        Ok(())
    }

    /// Ends the stream after its carry was lost (see `failed`): what was queued is dropped
    /// and waiters are let go; the file state reports the failure.
    pub(super) fn fail(&mut self, e: std::io::Error) {
        log::error!(
            "a file's carried chunk at offset {} could not be read back from the spill file \
             ({e}): its writes fail with EIO",
            self.carry_start
        );
        self.failed = Some(format!(
            "a carried chunk at file offset {} could not be read back from the spill file: {e}",
            self.carry_start
        ));
        self.segs.clear();
        self.next = 0;
        self.queued = 0;
        self.permits.clear();
        self.carry = Arc::default();
        self.spilled = None;
        self.charge = None;
        self.finish = true;
        self.in_cut = false;
        self.running = false;
    }
}

impl Spill for CutState {
    fn spill(&self, gen: u64, to: &Arc<SpillFile>) -> Option<usize> {
        let mut g = self.m.lock();
        if g.gen != gen || g.running || g.spilled.is_some() || g.carry.is_empty() {
            return None;
        }
        let slot = to.store(&g.carry)?;
        let n = slot.len();
        g.spilled = Some(slot);
        g.carry = Arc::default();
        g.charge = None;
        Some(n)
    }

    fn current(&self, gen: u64) -> bool {
        let g = self.m.lock();
        g.gen == gen && g.spilled.is_none() && !g.carry.is_empty()
    }
}

impl CutState {
    pub(super) fn new(cutter: Cutter, start: u64, carries: Option<Arc<Carries>>) -> Arc<Self> {
        Arc::new_cyclic(|me| CutState {
            me: me.clone(),
            carries,
            m: parking_lot::Mutex::new(CutInner {
                cutter: Some(cutter),
                segs: VecDeque::new(),
                next: 0,
                queued: 0,
                permits: VecDeque::new(),
                end: start,
                carry_start: start,
                carry: Arc::default(),
                spilled: None,
                charge: None,
                gen: 0,
                failed: None,
                in_cut: false,
                out: Vec::new(),
                taken_to: start,
                finish: false,
                running: false,
                here: false,
                window: (0, 0),
            }),
            cv: parking_lot::Condvar::new(),
        })
    }

    /// Cuts queued segments until none is left, then returns. Whoever sets `running` runs
    /// this, on a worker or inline.
    pub(super) fn run(&self) {
        // The carry the last cut left, to be entered in the spill order once no cutter runs
        // on this state (a running one is not spilled).
        let mut touch: Option<(Arc<Carries>, u64)> = None;
        loop {
            let (start, carry, seg, last, mut cutter) = {
                let mut g = self.m.lock();
                if g.next < g.segs.len() || (g.finish && g.spilled.is_some()) {
                    if let Err(e) = g.load_carry(self.carries.as_ref()) {
                        g.fail(e);
                        drop(g);
                        self.cv.notify_all();
                        return;
                    }
                }
                if g.next < g.segs.len() {
                    let seg = g.segs[g.next].1.clone();
                    g.next += 1;
                    g.queued -= seg.len();
                    // Its bytes go on as pieces, which the store's own budget bounds.
                    drop(g.permits.pop_front());
                    let last = g.finish && g.next == g.segs.len();
                    let carry = g.carry.clone();
                    g.in_cut = true;
                    let start = g.carry_start;
                    let cutter = g.cutter.take().expect("one cutter runs at a time");
                    drop(g);
                    self.cv.notify_all();
                    (start, carry, seg, last, cutter)
                } else if g.finish && !g.carry.is_empty() {
                    let carry = g.carry.clone();
                    let cutter = g.cutter.take().expect("one cutter runs at a time");
                    (g.carry_start, carry, SharedBytes::default(), true, cutter)
                } else {
                    g.running = false;
                    drop(g);
                    self.cv.notify_all();
                    // Not under the lock: spilling takes other states' locks (and this
                    // one's, should it be the least recently cut).
                    if let Some((cs, gen)) = touch {
                        let me: std::sync::Weak<dyn Spill> = self.me.clone();
                        cs.touch(me, gen);
                        cs.trim();
                    }
                    return;
                }
            };
            // A cutter that panics (a bug) must not leave this state running for ever: the
            // file's close would wait on it, and then every FUSE thread. Its segment is cut
            // in fixed-size chunks instead (the bytes are kept, their dedup is lost) and the
            // stream goes on with a fresh cutter.
            let params = cutter.params;
            let confirmed_before = cutter.fingerprinted_bytes;
            let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                cut_segment(&mut cutter, start, &carry, seg.clone(), last)
            }));
            let confirmed = cutter.fingerprinted_bytes - confirmed_before;
            let (pieces, carry_start, carry) = match cut {
                Ok(r) => r,
                Err(_) => {
                    log::error!(
                        "the chunk cutter failed (a bug) at file offset {start}: these {} bytes \
                         are cut in fixed-size chunks instead, so they are kept but not deduplicated",
                        carry.len() + seg.len()
                    );
                    cutter = Cutter::new(params, None);
                    cut_by_size(params, start, &carry, &seg, last)
                }
            };
            let mut g = self.m.lock();
            g.cutter = Some(cutter);
            // Decided over at least `CUT_HERE_WINDOW` bytes: a writer whose buffer is not
            // page-aligned sends each large write as a large request and a few bytes (two
            // segments), and the few bytes alone, holding no whole chunk, must not decide.
            let w = &mut g.window;
            w.0 += seg.len() as u64;
            w.1 += confirmed;
            if w.0 >= CUT_HERE_WINDOW {
                let here = cut_here_enabled() && w.1 * CUT_HERE_SHARE.1 >= w.0 * CUT_HERE_SHARE.0;
                g.here = here;
                g.window = (0, 0);
            }
            g.out.extend(pieces);
            g.charge = None;
            g.gen += 1;
            touch = (!carry.is_empty())
                .then_some(self.carries.as_ref())
                .flatten()
                .map(|cs| {
                    g.charge = Some(cs.charge(carry.capacity()));
                    (cs.clone(), g.gen)
                });
            g.carry = Arc::new(carry);
            g.carry_start = carry_start;
            g.in_cut = false;
            // The segment's bytes are in `out` and the carry now: reads see them there. A
            // short segment was copied whole into a joined buffer, so keeping it until the
            // file state takes the pieces would hold its bytes twice.
            while g.next > 0 {
                g.segs.pop_front();
                g.next -= 1;
            }
            drop(g);
            self.cv.notify_all();
        }
    }

    /// Ends the stream: the carry is cut to the end. Runs the cutter here if none is
    /// running, else waits for the running one.
    pub(super) fn finish_and_wait(&self) {
        let run_here = {
            let mut g = self.m.lock();
            g.finish = true;
            !std::mem::replace(&mut g.running, true)
        };
        if run_here {
            self.run();
        }
        let mut g = self.m.lock();
        while !g.done() {
            self.cv.wait(&mut g);
        }
    }
}

impl Stream {
    pub(super) fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
}
