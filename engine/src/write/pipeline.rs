//! The write pipeline's moving parts: a pool of worker threads, a byte budget that bounds what
//! is in flight, and tickets through which a file state learns what became of a chunk.
//!
//! A writer's FUSE thread only copies bytes into its file state and cuts them into chunks;
//! hashing, the dedup lookup, compression and the append to the segment buffer run on the
//! workers. A file keeps every piece it handed over (and the piece's bytes) until the piece's
//! ticket says it is stored, so reads see it and a failed piece can be handed over again.
//!
//! Bounds: the bytes of pieces queued for or being processed by the workers are at most
//! `Budget::limit` (plus one piece, so a piece larger than the limit still goes); a writer
//! that would exceed it waits (back-pressure), so the daemon's memory does not grow with the
//! number or speed of writers. A finished piece stays with its file state until that file's
//! next write or commit retires it, or the fs layer's sweep of idle open files does (every
//! 32 MiB written), so the files open for writing do not each keep their last request's
//! bytes; their stream buffers share `STREAM_BYTES`.

use crate::chunk::ChunkBytes;
use crate::error::{Error, Result};
use crate::format::ChunkHash;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// Bytes of chunk data in flight between file states and the workers, by default.
pub(crate) const PIPELINE_BYTES: usize = 64 << 20;

/// Stream bytes of all files waiting for their cutters, at most (writers wait beyond it).
/// Only many files written at once reach it (one file queues at most `CUT_QUEUE_BYTES`, 8
/// files 32 MiB), and with them it was full at the same time as `STREAM_BYTES` and the
/// pieces in flight: at 64 MiB each, 1024 files written 64 KiB at a time peaked at 587-636
/// MiB RSS, at 32 MiB 392-447 MiB, with the same throughput there and for 8 writers.
pub(crate) const CUT_BYTES: usize = 32 << 20;

/// The chunk sequences a cutter predicts from, and where its hashing is timed.
#[derive(Clone)]
pub struct Predictor {
    pub table: Arc<crate::write::predict::Successors>,
    /// `predict`, `predict_fingerprint` and `predict_miss` stages; none in tests.
    pub pipeline: Option<Arc<Pipeline>>,
}

/// Access to chunk bytes by content hash; the chunk store in production, a map in tests.
pub trait ChunkIo {
    /// Stores `data` (or finds it already stored) and returns its hash.
    fn put(&self, data: &[u8]) -> Result<ChunkHash>;
    /// Returns the verified bytes of a chunk.
    fn get(&self, hash: &ChunkHash) -> Result<ChunkBytes>;
    /// `get` for several chunks (one lookup and few device reads in the store).
    fn get_many(&self, hashes: &[ChunkHash]) -> Result<Vec<ChunkBytes>> {
        hashes.iter().map(|h| self.get(h)).collect()
    }
    /// Starts storing a piece; the ticket tells when it is stored and under which hash. A
    /// successful ticket holds one pin, like `put`. May wait for room in the pipeline.
    fn submit(&self, piece: Piece) -> Ticket {
        Ticket::ready(self.put(piece.bytes()))
    }
    /// `submit` for several pieces at once (one hand-over to the workers, not one each).
    fn submit_all(&self, pieces: Vec<Piece>) -> Vec<Ticket> {
        pieces.into_iter().map(|p| self.submit(p)).collect()
    }
    /// Where file states run their cutters; `None`: cut on the writing thread, unbounded
    /// (tests with a map for a store).
    fn cutters(&self) -> Option<&dyn Cutters> {
        None
    }
    /// The chunk sequences cutters may predict from (`predict`); `None`: cut by content only.
    fn successors(&self) -> Option<Predictor> {
        None
    }
}

/// Cutter scheduling: where a file state's content-defined cutter runs, and the bound on
/// stream bytes queued for all cutters.
pub trait Cutters: Send + Sync {
    /// Room for `bytes` of stream handed to a cutter, shared by all files (waits for it);
    /// `None`: no bound.
    fn reserve_cut(&self, bytes: usize) -> Option<Permit>;
    /// Runs a cutter job.
    fn spawn_cut(&self, job: Box<dyn FnOnce() + Send>);
    /// Runs a cutter job on the calling thread, counted as a cut.
    fn cut_here(&self, job: &mut dyn FnMut()) {
        job()
    }
    /// How many files have a stream buffer now (they share `STREAM_BYTES`); `None`: no
    /// bound (tests).
    fn live_streams(&self) -> Option<Arc<std::sync::atomic::AtomicUsize>> {
        None
    }
    /// Where cutters charge their carried chunks, spilled beyond a budget (`spill`);
    /// `None`: carries stay in memory, unbounded (tests).
    fn carries(&self) -> Option<Arc<crate::write::spill::Carries>> {
        None
    }
}

/// What the stream buffers of all files being written sequentially may hold together: with
/// more such files than `STREAM_BYTES` / 1 MiB, each hands its buffer to its cutter sooner
/// (at least every `STREAM_MIN_BYTES`), so memory does not grow with the number of files.
/// 32 MiB: up to 32 such files still get the full 1 MiB buffer (see `CUT_BYTES` for why not
/// more).
pub(crate) const STREAM_BYTES: usize = 32 << 20;
pub(crate) const STREAM_MIN_BYTES: usize = 16 << 10;

/// The write pipeline's shared parts: the worker pool, the two byte budgets (pieces in
/// flight to the workers; stream bytes queued for cutters) and the stage timers. The store
/// runs its chunk jobs here, file states their cutters; neither owns the other's scheduling.
pub struct Pipeline {
    me: std::sync::Weak<Pipeline>,
    pool: Mutex<Arc<Pool>>,
    /// Bounds the bytes of submitted pieces queued for or in the workers.
    budget: Arc<Budget>,
    /// Bounds the stream bytes of all files queued for their cutters.
    cut_budget: Arc<Budget>,
    /// Files with a stream buffer now (`Cutters::live_streams`).
    streams: Arc<std::sync::atomic::AtomicUsize>,
    /// The cutters' carried chunks (`spill::CARRY_BYTES` in memory at most, once the
    /// space says where to spill: `Carries::spill_to`).
    pub carries: Arc<crate::write::spill::Carries>,
    /// Where the data path's time goes.
    pub stages: Stages,
}

impl Pipeline {
    pub fn new() -> Arc<Pipeline> {
        Arc::new_cyclic(|me| Pipeline {
            me: me.clone(),
            pool: Mutex::new(Arc::new(Pool::new(default_workers(), "ckptfs-store"))),
            budget: Budget::new(PIPELINE_BYTES),
            cut_budget: Budget::new(CUT_BYTES),
            streams: Arc::default(),
            carries: crate::write::spill::Carries::new(crate::write::spill::CARRY_BYTES),
            stages: Stages::default(),
        })
    }

    /// The worker pool as it is now (`set_workers` replaces it; jobs already given to the old
    /// one finish there).
    pub fn pool(&self) -> Arc<Pool> {
        self.pool.lock().clone()
    }

    /// Sets the number of worker threads; 0 runs every job on the thread that submits it,
    /// in order (the crash tests use that to replay a run exactly).
    pub fn set_workers(&self, n: usize) {
        *self.pool.lock() = Arc::new(Pool::new(n, "ckptfs-store"));
    }

    pub fn workers(&self) -> usize {
        self.pool.lock().workers()
    }

    /// Room for `bytes` of pieces in flight to the workers (waits for it: back-pressure).
    pub(crate) fn admit(&self, bytes: usize) -> Permit {
        self.stages
            .budget_wait
            .time(0, || self.budget.acquire(bytes))
    }
}

impl Cutters for Pipeline {
    fn reserve_cut(&self, bytes: usize) -> Option<Permit> {
        Some(
            self.stages
                .budget_wait
                .time(0, || self.cut_budget.acquire(bytes)),
        )
    }

    fn live_streams(&self) -> Option<Arc<std::sync::atomic::AtomicUsize>> {
        Some(self.streams.clone())
    }

    fn carries(&self) -> Option<Arc<crate::write::spill::Carries>> {
        Some(self.carries.clone())
    }

    /// Runs a file's cutter on a worker, timed as the `cut` stage.
    fn spawn_cut(&self, job: Box<dyn FnOnce() + Send>) {
        let me = self.me.upgrade().expect("a pipeline in use is alive");
        self.pool().run(move || me.stages.cut.time(0, job));
    }

    fn cut_here(&self, job: &mut dyn FnMut()) {
        self.stages.cut.time_nested(0, job)
    }
}

/// Bytes that stream segments and the pieces cut from them share: a buffer of the engine's
/// own, or a window of a buffer the caller handed over (the FUSE request a write arrived
/// in), so a large write is cut and stored without being copied first. Cloning shares.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Owner,
    start: usize,
    len: usize,
}

#[derive(Clone)]
enum Owner {
    Vec(Arc<Vec<u8>>),
    /// With the bytes the buffer keeps in memory, as its giver counted them.
    Other(Arc<dyn AsRef<[u8]> + Send + Sync>, usize),
}

impl Owner {
    fn all(&self) -> &[u8] {
        match self {
            Owner::Vec(v) => v,
            Owner::Other(o, _) => (**o).as_ref(),
        }
    }
}

impl SharedBytes {
    /// `len` bytes at `start` of what `owner` holds, which keeps `held` bytes in memory
    /// (what `held` reports); the bytes must not change while shared (a FUSE request
    /// buffer is reused only once no window of it is left).
    pub fn window(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
        held: usize,
    ) -> Self {
        assert!(
            start + len <= (*owner).as_ref().len(),
            "window inside its buffer"
        );
        SharedBytes {
            owner: Owner::Other(owner, held.max(len)),
            start,
            len,
        }
    }

    /// `len` bytes from `start` of these, sharing their buffer.
    pub(crate) fn slice(&self, start: usize, len: usize) -> SharedBytes {
        assert!(start + len <= self.len, "slice inside its window");
        SharedBytes {
            owner: self.owner.clone(),
            start: self.start + start,
            len,
        }
    }

    /// Memory the buffer these bytes are in keeps alive.
    pub(crate) fn held(&self) -> usize {
        match &self.owner {
            Owner::Vec(v) => v.capacity(),
            Owner::Other(_, held) => *held,
        }
    }

    /// Whether both are windows of the same buffer.
    pub(crate) fn same_buffer(&self, other: &SharedBytes) -> bool {
        match (&self.owner, &other.owner) {
            (Owner::Vec(a), Owner::Vec(b)) => Arc::ptr_eq(a, b),
            (Owner::Other(a, _), Owner::Other(b, _)) => {
                std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
            }
            _ => false,
        }
    }

    /// The bytes as a vector of their own: without copying where this is the only holder
    /// of a whole vector.
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self.owner {
            Owner::Vec(v) if self.start == 0 && self.len == v.len() => {
                Arc::try_unwrap(v).unwrap_or_else(|v| (*v).clone())
            }
            o => o.all()[self.start..self.start + self.len].to_vec(),
        }
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(v: Vec<u8>) -> Self {
        SharedBytes {
            len: v.len(),
            start: 0,
            owner: Owner::Vec(Arc::new(v)),
        }
    }
}

impl Default for SharedBytes {
    fn default() -> Self {
        Vec::new().into()
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.owner.all()[self.start..self.start + self.len]
    }
}

/// A slice of a shared buffer: the bytes of one chunk, without copying them out of the
/// stream buffer, request or dirty block they were written into.
#[derive(Clone)]
pub struct Piece {
    bytes: SharedBytes,
    /// The blake3 of exactly these bytes, where the cutter already computed it (a predicted
    /// chunk it confirmed): the store does not hash them again.
    hash: Option<ChunkHash>,
}

impl Piece {
    pub fn new(buf: SharedBytes, start: usize, len: usize) -> Self {
        Piece {
            bytes: buf.slice(start, len),
            hash: None,
        }
    }

    /// A piece whose hash the caller computed over `buf[start..start + len]`.
    pub fn hashed(buf: SharedBytes, start: usize, len: usize, hash: ChunkHash) -> Self {
        debug_assert_eq!(ChunkHash::of(&buf[start..start + len]), hash);
        Piece {
            hash: Some(hash),
            ..Piece::new(buf, start, len)
        }
    }

    /// The hash of the bytes, if already known.
    pub(crate) fn known_hash(&self) -> Option<ChunkHash> {
        self.hash
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Whether the piece's bytes lie in `buf`.
    pub fn shares(&self, buf: &SharedBytes) -> bool {
        self.bytes.same_buffer(buf)
    }

    /// The same bytes in a buffer of their own, letting go of the one shared with other
    /// pieces or a cutter's carry.
    pub fn compacted(self) -> Piece {
        Piece {
            bytes: self.bytes.to_vec().into(),
            hash: self.hash,
        }
    }

    /// The first `len` bytes.
    pub fn truncated(&self, len: usize) -> Piece {
        Piece {
            bytes: self.bytes.slice(0, len),
            // The hash was of all the bytes.
            hash: if len == self.len() { self.hash } else { None },
        }
    }
}

/// Counts bytes in flight against a limit.
pub(crate) struct Budget {
    limit: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Budget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Budget {
            limit,
            used: Mutex::new(0),
            freed: Condvar::new(),
        })
    }

    /// Waits until `n` more bytes fit (always admits one request when nothing is in flight,
    /// so an oversized request cannot wait forever).
    pub(crate) fn acquire(self: &Arc<Self>, n: usize) -> Permit {
        let mut used = self.used.lock();
        while *used > 0 && *used + n > self.limit {
            self.freed.wait(&mut used);
        }
        *used += n;
        Permit {
            budget: self.clone(),
            n,
        }
    }
}

/// Bytes admitted by a `Budget`, given back when dropped.
pub struct Permit {
    budget: Arc<Budget>,
    n: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock();
        *used -= self.n;
        self.budget.freed.notify_all();
    }
}

#[derive(Default)]
struct Slot {
    result: Mutex<Option<Result<ChunkHash>>>,
    done: Condvar,
}

/// What became of one handed-over piece.
pub struct Ticket {
    slot: Arc<Slot>,
}

/// The worker's end of a ticket. Dropped without a result (the job panicked), it completes
/// the ticket with an error, so no writer waits forever.
pub struct Completion(Arc<Slot>);

impl Completion {
    pub fn complete(self, r: Result<ChunkHash>) {
        *self.0.result.lock() = Some(r);
        self.0.done.notify_all();
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        let mut r = self.0.result.lock();
        if r.is_none() {
            *r = Some(Err(Error::Io(std::io::Error::other(
                "a pipeline worker failed while storing a chunk",
            ))));
            self.0.done.notify_all();
        }
    }
}

impl Ticket {
    pub fn ready(r: Result<ChunkHash>) -> Ticket {
        let t = Ticket::pending();
        *t.slot.result.lock() = Some(r);
        t
    }

    pub fn pending() -> Ticket {
        Ticket {
            slot: Arc::new(Slot::default()),
        }
    }

    pub fn completion(&self) -> Completion {
        Completion(self.slot.clone())
    }

    pub(crate) fn is_done(&self) -> bool {
        self.slot.result.lock().is_some()
    }

    /// Waits for the outcome. A success can be read again; an error is handed out once
    /// (the ticket is spent then, and the piece must be handed over again).
    pub fn wait(&self) -> Result<ChunkHash> {
        let mut r = self.slot.result.lock();
        while r.is_none() {
            self.slot.done.wait(&mut r);
        }
        match r.as_ref().expect("checked above") {
            Ok(h) => Ok(*h),
            Err(_) => match r.take() {
                Some(Err(e)) => Err(e),
                _ => unreachable!("checked above"),
            },
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Worker threads taking jobs in FIFO order. Dropping the pool lets the workers finish the
/// queued jobs and exit; it does not wait for them (the last owner of what a job uses may be
/// a worker itself).
///
/// Idle workers wait on the queue's condition variable, so a job wakes one of them. The
/// pool used to share one std `mpsc` receiver behind a mutex: one idle worker waited in
/// `recv` holding the mutex and the others waited for the mutex, so a job woke its taker and
/// the taker's unlock woke the next waiter, and a burst of jobs reached the workers one
/// handoff after another. On the 2-core VM the two cost the same CPU per GiB (1 and 8
/// writers, full and next steps); the store threads were put on a CPU 3.2 thousand times
/// per GiB of a one-writer next step, against 3.3-3.6 thousand.
pub struct Pool {
    queue: Option<Arc<Queue>>,
    workers: usize,
}

/// The pool's shared state: its jobs, and a condition variable idle workers wait on.
#[derive(Default)]
struct Queue {
    jobs: Mutex<Jobs>,
    ready: Condvar,
}

/// The jobs not yet taken, and whether the pool was dropped (workers exit once it is empty).
#[derive(Default)]
struct Jobs {
    waiting: std::collections::VecDeque<Job>,
    closed: bool,
}

impl Pool {
    /// `workers == 0`: no threads; `run` runs the job at once on the caller's thread.
    pub fn new(workers: usize, name: &str) -> Pool {
        if workers == 0 {
            return Pool {
                queue: None,
                workers: 0,
            };
        }
        let q = Arc::new(Queue::default());
        for i in 0..workers {
            let q = q.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || loop {
                    let job = {
                        let mut g = q.jobs.lock();
                        loop {
                            if let Some(job) = g.waiting.pop_front() {
                                break job;
                            }
                            if g.closed {
                                return;
                            }
                            q.ready.wait(&mut g);
                        }
                    };
                    // A panicking job completes its ticket with an error (Completion's
                    // Drop); the worker lives on for the next job.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                })
                .expect("cannot start a worker thread");
        }
        Pool {
            queue: Some(q),
            workers,
        }
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        match &self.queue {
            Some(q) => {
                q.jobs.lock().waiting.push_back(Box::new(job));
                q.ready.notify_one();
            }
            None => job(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(q) = &self.queue {
            q.jobs.lock().closed = true;
            q.ready.notify_all();
        }
    }
}

/// Worker threads to use by default: one per core, at most 16.
pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .min(16)
}

/// Time spent in one stage of the data path since the space was opened, by all threads
/// together: the evidence for which stage limits a workload (`ckptfs stats --json`).
///
/// Wall time counts a thread's waits (a lock, the disk, the scheduler of a busy machine)
/// as the stage's, so the CPU each stage costs is measured too, from the thread's CPU clock
/// around sampled timings. Reading that clock is a system call (about 0.8 us on this
/// project's VMs), too dear for every chunk: a stage whose timings are short (under
/// `CPU_ALWAYS_NS` on average so far) samples every `CPU_SAMPLE`-th of them and counts each
/// sample `CPU_SAMPLE` times; one whose timings are long (a cut of a whole segment, a
/// commit) samples all of them, where a few unsampled ones would make the estimate swing.
/// Sampling by the stage's own count, not a per-thread one, keeps a stage that always comes
/// at the same point of a thread's cycle from never being sampled.
///
/// Each stage has cache lines of its own (128 bytes: a line and the one the hardware
/// prefetches with it): every thread of the data path updates these counters several times
/// per chunk, and stages side by side in one line made the threads of different stages
/// (the cutters' `predict_fingerprint`, the workers' `lookup`) take that line from one
/// another on each update.
#[derive(Default)]
#[repr(align(128))]
pub struct Stage {
    ns: std::sync::atomic::AtomicU64,
    count: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
    /// Timings started (`start`).
    ticks: std::sync::atomic::AtomicU64,
    /// Sampled timings, and the estimated CPU nanoseconds (each sample times its weight).
    sampled: std::sync::atomic::AtomicU64,
    cpu_ns: std::sync::atomic::AtomicU64,
}

/// A stage whose timings are short samples one in this many (see `Stage`).
pub const CPU_SAMPLE: u64 = 16;
/// A stage whose timings take this long on average samples every one (see `Stage`).
pub const CPU_ALWAYS_NS: u64 = 50_000;

/// The calling thread's CPU time, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A timing under way (`Stage::start`, `Stage::stop`), for code that picks the stage it
/// counts against after the work (the cutter's confirmation: `predict`,
/// `predict_fingerprint` or `predict_miss`).
pub struct Timing {
    wall: std::time::Instant,
    /// The thread's CPU clock at the start and the sample's weight, when sampled.
    cpu: Option<(u64, u64)>,
    /// `NESTED` at the start: what timings nested in this one count elsewhere.
    nested: (u64, u64),
}

thread_local! {
    /// Wall and CPU nanoseconds this thread spent in timings counted as a stage of their own
    /// while other timings ran around them (`Stage::time_nested`: a cut run on the FUSE
    /// thread within its write's `ingest`). The enclosing timing leaves them out, so no
    /// nanosecond counts in two stages and the stages still add up to the daemon's CPU.
    static NESTED: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    /// Set inside an exact span (`exact_span_begin`): the CPU nanoseconds of the stage
    /// timings stopped in it so far, each measured (weight 1) and without the timings
    /// nested in it, so their sum is the span's CPU that some stage counted.
    static EXACT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Starts an exact span on this thread: until `exact_span_end`, every stage timing here
/// is measured (weight 1) instead of one in `CPU_SAMPLE` at weight `CPU_SAMPLE`. Each timing
/// still counts once in expectation, so the stages' estimates stay unbiased. For the FUSE
/// layer's sampled dispatches: what a dispatch took less what its stages counted is the
/// `dispatch` stage, exactly for that request.
pub fn exact_span_begin() {
    EXACT.set(Some(0));
}

/// Ends this thread's exact span: the CPU nanoseconds its stage timings counted (0 when
/// none was open).
pub fn exact_span_end() -> u64 {
    EXACT.take().unwrap_or(0)
}

impl Stage {
    /// Starts a timing, sampled for CPU as `Stage` says.
    pub fn start(&self) -> Timing {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.ticks.fetch_add(1, Relaxed);
        let count = self.count.load(Relaxed);
        // Without a history, every timing counts as long: a stage of rare, long timings
        // (a commit) would otherwise count its first one `CPU_SAMPLE` times.
        let long = count == 0 || self.ns.load(Relaxed) / count >= CPU_ALWAYS_NS;
        let weight = match (long, n.is_multiple_of(CPU_SAMPLE)) {
            _ if EXACT.get().is_some() => Some(1),
            (true, _) => Some(1),
            (false, true) => Some(CPU_SAMPLE),
            (false, false) => None,
        };
        Timing {
            cpu: weight.map(|w| (thread_cpu_ns(), w)),
            wall: std::time::Instant::now(),
            nested: NESTED.get(),
        }
    }

    /// Runs `f`, counting its time against this stage.
    pub fn time<T>(&self, bytes: usize, f: impl FnOnce() -> T) -> T {
        let t = self.start();
        let r = f();
        self.stop(t, bytes);
        r
    }

    /// `time`, for work done inside another stage's timing on this thread: its time counts
    /// here and not in the enclosing timing (`NESTED`). Its CPU is always measured, since
    /// the enclosing timing, if sampled, must leave out exactly this much.
    pub fn time_nested<T>(&self, bytes: usize, f: impl FnOnce() -> T) -> T {
        let mut t = self.start();
        let c0 = t.cpu.map_or_else(thread_cpu_ns, |(c, _)| c);
        // Weight 1 even where `start` drew this timing as the sample of `CPU_SAMPLE`: every
        // nested timing is measured, so a weighted one counted its CPU about twice over
        // (the `compress` stage, nested in `append`, read 0.23 CPU-s/GiB for 0.11).
        t.cpu = Some((c0, 1));
        let r = f();
        let end = thread_cpu_ns();
        let (wall, cpu) = (t.wall.elapsed().as_nanos() as u64, end - c0);
        let outer = t.nested;
        // Counted up to the same clock reading the enclosing timing leaves out: with a
        // second reading in `stop`, the time between the two counted here and there too
        // (an exact span then summed more CPU than the thread spent).
        self.stop_at(t, bytes, Some(end));
        // What this timing took, nested ones included (the enclosing timing leaves it all out).
        NESTED.set((outer.0 + wall, outer.1 + cpu));
        r
    }

    /// Counts a timing (started by this stage or a sibling) against this stage, less the
    /// timings nested in it that counted elsewhere.
    pub fn stop(&self, t: Timing, bytes: usize) {
        self.stop_at(t, bytes, None);
    }

    /// `stop` with the thread's CPU clock read already (`end`), or read here (None).
    fn stop_at(&self, t: Timing, bytes: usize, end: Option<u64>) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = NESTED.get();
        let wall = t
            .wall
            .elapsed()
            .saturating_sub(std::time::Duration::from_nanos(now.0 - t.nested.0));
        if let Some((c0, weight)) = t.cpu {
            let end = end.unwrap_or_else(thread_cpu_ns);
            let cpu = (end.saturating_sub(c0)).saturating_sub(now.1 - t.nested.1);
            self.sampled.fetch_add(1, Relaxed);
            self.cpu_ns.fetch_add(cpu * weight, Relaxed);
            if let Some(sum) = EXACT.get() {
                EXACT.set(Some(sum + cpu));
            }
        }
        self.add(wall, bytes);
    }

    /// Counts one event of `bytes` with no wall time, and `cpu_ns` of CPU where the caller
    /// sampled it (already weighted by the events it stands for): `transport`, timed by the
    /// FUSE layer's own sampling.
    pub fn add_cpu(&self, bytes: usize, cpu_ns: Option<u64>) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(c) = cpu_ns {
            self.sampled.fetch_add(1, Relaxed);
            self.cpu_ns.fetch_add(c, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts `d` against this stage without a CPU sample (nothing timed here).
    pub fn add(&self, d: std::time::Duration, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.ns.fetch_add(d.as_nanos() as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes as u64, Relaxed);
    }
}

/// One stage's totals. In JSON, `Stats` lists them as a map from the stage's name.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StageTime {
    #[serde(skip)]
    pub name: String,
    /// Wall seconds, summed over threads (waits included).
    pub seconds: f64,
    pub count: u64,
    pub bytes: u64,
    /// Estimated CPU seconds, summed over threads (`Stage`: sampled timings, each counted
    /// as many times as timings it stands for).
    #[serde(default)]
    pub cpu_seconds: f64,
    /// Timings sampled for `cpu_seconds`.
    #[serde(default)]
    pub sampled_count: u64,
}

/// `Vec<StageTime>` as a JSON map from each stage's name to its totals.
pub mod stage_map {
    use super::StageTime;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(v: &[StageTime], s: S) -> Result<S::Ok, S::Error> {
        v.iter()
            .map(|t| (t.name.as_str(), t))
            .collect::<BTreeMap<_, _>>()
            .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<StageTime>, D::Error> {
        Ok(BTreeMap::<String, StageTime>::deserialize(d)?
            .into_iter()
            .map(|(name, t)| StageTime { name, ..t })
            .collect())
    }
}

macro_rules! stages {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// The stages of the write and read paths.
        #[derive(Default)]
        pub struct Stages { $($(#[$doc])* pub $name: Stage,)* }

        impl Stages {
            pub fn snapshot(&self) -> Vec<StageTime> {
                use std::sync::atomic::Ordering::Relaxed;
                vec![$({
                    let st = &self.$name;
                    StageTime {
                        name: stringify!($name).to_string(),
                        seconds: st.ns.load(Relaxed) as f64 / 1e9,
                        count: st.count.load(Relaxed),
                        bytes: st.bytes.load(Relaxed),
                        cpu_seconds: st.cpu_ns.load(Relaxed) as f64 / 1e9,
                        sampled_count: st.sampled.load(Relaxed),
                    }
                },)*]
            }
        }
    };
}

stages! {
    /// FUSE requests read from the kernel (every request, not only writes): CPU only, the
    /// transport's (the kernel's copy of each request into the daemon's buffer and the
    /// pinning of its pages), sampled by the FUSE layer (`Stage::add_cpu`); its wall time
    /// would be the wait for requests and is not counted. A read's data going back is in
    /// `reply`.
    transport,
    /// FUSE requests dispatched on the FUSE threads, less the stages timed within them
    /// (`ingest`, `commit`, `reply`, ...): decoding each request, the filesystem's methods
    /// outside those stages (lookups of open files, attributes, names, locks), and the
    /// replies. CPU only, from the FUSE layer's samples (`Filesystem::dispatched`); count:
    /// requests dispatched.
    dispatch,
    /// FUSE write requests taken into file states (copy, hand-over to the cutter and the
    /// workers, including waiting when the file's cutter is `CUT_QUEUE_BYTES` behind). A
    /// cut run on the FUSE thread (`CKPTFS_CUT_HERE=1`) counts as `cut`, not here.
    ingest,
    /// Content-defined cutting of sequential streams (worker threads, or the FUSE thread
    /// where `CKPTFS_CUT_HERE=1`: `write::CUT_HERE_SHARE`), including `predict`.
    cut,
    /// Part of `cut`: blake3 of chunks the cutter predicted from the chunk sequences of
    /// recent files (`predict`) and their bytes confirmed (count and bytes: those chunks),
    /// where this mount had no fingerprint of the predicted chunk. The workers do not hash
    /// them again.
    predict,
    /// Part of `cut`: predicted chunks confirmed by their fingerprint (xxh3-128, where this
    /// mount hashed the chunk before; `predict`'s module doc) instead of blake3.
    predict_fingerprint,
    /// Part of `cut`: blake3 or the fingerprint over predicted chunks that the bytes did not
    /// confirm (the cutter cut by content there instead).
    predict_miss,
    /// Writers waiting for room in the pipeline (back-pressure).
    budget_wait,
    /// blake3 of pieces not predicted: on the workers, or by the cutter (within `cut`) where
    /// it looks up what followed a chunk.
    hash,
    /// Dedup lookups in the chunk table: one read of it per worker batch of pieces (about
    /// eight chunks) for those not pinned already (`ChunkStore::lookup_many`).
    lookup,
    /// Compression of chunks not found (on the workers).
    compress,
    /// Batches of new chunks compressed by the GPU (wall time per batch on the GPU's thread,
    /// transfers included; bytes are the chunks' raw bytes).
    gpu,
    /// Appending to the segment buffer, including waiting for its lock.
    append,
    /// Writes of the segment buffer to the data file.
    write,
    /// fdatasync of the data file before a commit.
    sync,
    /// Metadata commits of file revisions (table writes and their syncs).
    commit,
    /// Reading stored chunks from the data file.
    read,
    /// Decompression and blake3 verification of chunks read.
    decode,
    /// A read's reply: its bytes copied out of the verified chunks into the FUSE thread's
    /// reply buffer (bytes not counted: the same bytes as the reply), and the kernel's copy
    /// of that buffer (`Space::reply_stage`, timed in the mount; bytes counted).
    reply,
    /// Chunks read ahead of sequential readers (`ChunkStore::prefetch`, of this slot's
    /// files or another's): jobs and raw bytes only, no time of its own (the reads are in
    /// `read` and `decode`; count: read-ahead jobs).
    read_ahead,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every job runs, jobs queued when the pool is dropped included, and a job that
    /// panics leaves its worker to take the next ones; with one worker, in FIFO order.
    #[test]
    fn the_pool_runs_every_job_in_order_past_panics_and_its_drop() {
        for workers in [1, 4] {
            let (tx, rx) = std::sync::mpsc::channel();
            let pool = Pool::new(workers, "test-pool");
            for i in 0..2000u32 {
                let tx = tx.clone();
                pool.run(move || {
                    if i % 500 == 7 {
                        panic!("a job that panics, as the test asked");
                    }
                    tx.send(i).unwrap();
                });
            }
            drop(pool);
            drop(tx);
            // Ends once every worker exited and dropped what it held: all jobs ran.
            let got: Vec<u32> = rx.iter().collect();
            let want: Vec<u32> = (0..2000).filter(|i| i % 500 != 7).collect();
            if workers == 1 {
                assert_eq!(got, want);
            } else {
                let mut sorted = got.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, want);
            }
        }
    }

    /// Short timings are sampled one in `CPU_SAMPLE` and weighted so, long ones every time,
    /// and waiting is not CPU: a stage that sleeps shows far less CPU than wall time, one
    /// that computes shows CPU.
    #[test]
    fn stage_cpu_is_sampled_per_stage_and_counts_no_waiting() {
        let st = Stages::default();
        // A history of short lookups, so one timing preempted on a busy machine cannot lift
        // the average past `CPU_ALWAYS_NS`.
        for _ in 0..10_000 {
            st.lookup.add(std::time::Duration::from_nanos(100), 0);
        }
        for _ in 0..33 {
            // Long timings (2 ms each): all sampled after the first.
            st.sync.time(0, || {
                std::thread::sleep(std::time::Duration::from_millis(2))
            });
            st.lookup.time(0, || std::hint::black_box(1));
        }
        st.read_ahead.add(std::time::Duration::ZERO, 100);
        let snap = st.snapshot();
        let get = |n: &str| snap.iter().find(|t| t.name == n).unwrap().clone();
        let (sync, lookup, ahead) = (get("sync"), get("lookup"), get("read_ahead"));
        // Every sync timing is long (the first for want of a history).
        assert_eq!((sync.count, sync.sampled_count), (33, 33));
        // Short timings: 0, 16 and 32.
        assert_eq!((lookup.count, lookup.sampled_count), (10_033, 3));
        // 66 ms asleep cost next to no CPU.
        assert!(sync.cpu_seconds < sync.seconds / 4.0, "{sync:?}");
        // Nothing timed, nothing sampled.
        assert_eq!((ahead.sampled_count, ahead.cpu_seconds), (0, 0.0));
    }

    /// Some CPU work: about 0.2-0.5 ms: long enough that the clock reads around a timing (each a
    /// system call, some microseconds on a busy VM) stay a few percent of it. At a tenth
    /// of this, `an_exact_span_measures_every_timing_once_and_sums_them` saw 73% of the
    /// thread's CPU counted under CI's load.
    fn burn() -> u64 {
        let mut x = 0u64;
        for i in 0..200_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        x
    }

    /// A stage timed nested in another counts each timing's CPU once: nested timings are
    /// all measured, so none may carry the weight of a sample. (One in `CPU_SAMPLE` did,
    /// and a nested stage of short timings counted about twice its CPU.)
    #[test]
    fn a_nested_stage_counts_its_cpu_once() {
        let st = Stages::default();
        // A history of short timings: `start` samples one in `CPU_SAMPLE`.
        for _ in 0..10_000 {
            st.compress.add(std::time::Duration::from_nanos(100), 0);
        }
        let c0 = thread_cpu_ns();
        st.append.time(0, || {
            for _ in 0..4 * CPU_SAMPLE {
                st.compress.time_nested(0, burn);
            }
        });
        let spent = (thread_cpu_ns() - c0) as f64 / 1e9;
        let snap = st.snapshot();
        let get = |n: &str| snap.iter().find(|t| t.name == n).unwrap().clone();
        let (compress, append) = (get("compress"), get("append"));
        assert_eq!(compress.sampled_count, 4 * CPU_SAMPLE, "{compress:?}");
        // Measured once each, the nested timings and the rest of the outer one add up to
        // what the thread spent (a little overhead aside), never twice it.
        let counted = compress.cpu_seconds + append.cpu_seconds;
        assert!(
            counted <= spent * 1.2 && compress.cpu_seconds >= spent * 0.5,
            "counted {counted} s ({compress:?}, {append:?}) for {spent} s spent"
        );
    }

    /// In an exact span every timing is measured at weight 1, and the span returns the CPU
    /// its stages counted (nested ones once), so a sampled FUSE dispatch can tell its own
    /// CPU from theirs; outside it, short timings are sampled again.
    #[test]
    fn an_exact_span_measures_every_timing_once_and_sums_them() {
        let st = Stages::default();
        for _ in 0..10_000 {
            st.ingest.add(std::time::Duration::from_nanos(100), 0);
        }
        let c0 = thread_cpu_ns();
        exact_span_begin();
        for _ in 0..5 {
            st.ingest.time(0, || {
                burn();
                st.cut.time_nested(0, burn);
            });
        }
        let counted = exact_span_end();
        let spent = thread_cpu_ns() - c0;
        let snap = st.snapshot();
        let get = |n: &str| snap.iter().find(|t| t.name == n).unwrap().clone();
        let (ingest, cut) = (get("ingest"), get("cut"));
        // All five measured, at weight 1 (without the span: one, at weight 16).
        assert_eq!((ingest.sampled_count, cut.sampled_count), (5, 5));
        // (Both in whole nanoseconds; the snapshot's seconds round.)
        let stages = (ingest.cpu_seconds + cut.cpu_seconds) * 1e9;
        assert!(
            (counted as f64 - stages).abs() <= 2.0,
            "the span's sum {counted} is what the stages counted, {stages}"
        );
        assert!(
            counted <= spent && counted * 10 >= spent * 8,
            "counted {counted} ns of {spent} ns spent"
        );
        // The span is closed: sampling resumes, and a second end returns nothing.
        assert_eq!(exact_span_end(), 0);
        for _ in 0..2 * CPU_SAMPLE {
            st.ingest.time(0, || std::hint::black_box(1));
        }
        let ingest = st
            .snapshot()
            .into_iter()
            .find(|t| t.name == "ingest")
            .unwrap();
        assert_eq!(ingest.sampled_count, 5 + 2, "{ingest:?}");
    }

    /// A computing stage's CPU estimate is of the order of its wall time (a loose bound:
    /// the machine may be busy, which lowers CPU per wall, never raises it above wall).
    #[test]
    fn a_computing_stage_shows_cpu() {
        let st = Stages::default();
        for _ in 0..64 {
            st.hash.time(4096, || {
                let mut x = 0u64;
                for i in 0..100_000u64 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
                x
            });
        }
        let hash = st
            .snapshot()
            .into_iter()
            .find(|t| t.name == "hash")
            .unwrap();
        assert!(hash.sampled_count >= 4, "{hash:?}");
        assert!(hash.cpu_seconds > 0.0, "{hash:?}");
    }
}
