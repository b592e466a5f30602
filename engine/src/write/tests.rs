//! The write layer's unit tests: the extent map and painter, the cutter, and the model test
//! of `FileState` against a plain byte vector.

use super::*;
use crate::chunk::ChunkBytes;
use crate::error::Error;
use crate::error::{Corruption, Result};
use crate::format::{ChunkHash, ChunkParams, Extent};
use crate::pins::ChunkPins;
use crate::write::pipeline::{Permit, Piece, Predictor, SharedBytes, Ticket};
use crate::write::predict::Successors;
use crate::write::spill::Carries;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The block-wise zero test agrees with the per-byte one for every length around its
/// block size and a single non-zero byte (of every bit) at every position, and for
/// zeros: a chunk with one set byte anywhere must not become a hole.
#[test]
fn all_zero_sees_any_set_byte_anywhere() {
    for len in [0, 1, 255, 256, 257, 511, 512, 513, 1000, 4096 + 77] {
        let mut b = vec![0u8; len];
        assert!(all_zero(&b), "{len} zeros");
        for i in 0..len {
            for bit in [0x01u8, 0x80, 0x10] {
                b[i] = bit;
                assert!(!all_zero(&b), "len {len}, byte {i} = {bit:#x}");
                assert!(
                    all_zero(&b[..i]) && all_zero(&b[i + 1..]),
                    "len {len}, at {i}"
                );
                b[i] = 0;
            }
        }
    }
}

/// The one painter places each piece where it belongs, and a piece that reaches past
/// its chunk (a malformed record, this slot's or another's published one) is reported
/// as corruption instead of panicking or painting wrong bytes.
#[test]
fn the_painter_places_pieces_and_reports_one_past_its_chunk() {
    let a = ChunkBytes::owned(b"abcdefgh".to_vec());
    let b = ChunkBytes::owned(b"01234567".to_vec());
    let ext = |c: &ChunkBytes, chunk_off, len| Extent {
        chunk: ChunkHash::of(c),
        chunk_off,
        len,
    };
    // File bytes [100, 110): 3 bytes of a at 100, a hole, 4 bytes of b at 106.
    let pieces = [(100, ext(&a, 2, 3)), (106, ext(&b, 4, 4))];
    let mut out = vec![b'.'; 10];
    ExtentMap::paint(&pieces, &[a.clone(), b.clone()], 100, |at, bytes| {
        out[at..at + bytes.len()].copy_from_slice(bytes)
    })
    .unwrap();
    assert_eq!(&out, b"cde...4567");
    let bad = [(100, ext(&a, 6, 3))];
    let r = ExtentMap::paint(&bad, &[a], 100, |_, _| panic!("painted a bad piece"));
    assert!(
        matches!(r, Err(Error::Corrupt(Corruption::Record { .. }))),
        "{r:?}"
    );
}

/// A read handed back as pieces (`read_pieces_parts`, what a FUSE reply gathers) is the
/// same bytes as the read copied into one buffer (`read_pieces_to`): random pieces of
/// random chunks with holes between them and before and after, and reads that end
/// inside a piece, seeded.
#[test]
fn reads_as_parts_equal_reads_into_a_buffer() {
    for_seeds(8, reads_as_parts_equal_reads_into_a_buffer_seeded);
}

fn reads_as_parts_equal_reads_into_a_buffer_seeded(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let c = MemChunks::default();
    let stage = crate::write::pipeline::Stage::default();
    for round in 0..50 {
        let mut pieces = Vec::new();
        let off = rng.random_range(0..1000u64);
        let mut at = off + rng.random_range(0..3u64) * rng.random_range(0..5000u64);
        for _ in 0..rng.random_range(0..8) {
            let mut data = vec![0u8; rng.random_range(1..20_000)];
            rng.fill_bytes(&mut data);
            let h = c.put(&data).unwrap();
            let from = rng.random_range(0..data.len());
            let len = rng.random_range(1..=data.len() - from);
            pieces.push((
                at,
                Extent {
                    chunk: h,
                    chunk_off: from as u32,
                    len: len as u32,
                },
            ));
            at += len as u64 + rng.random_range(0..2u64) * rng.random_range(0..3000u64);
        }
        // Sometimes short of the last piece's end, sometimes past it (a hole at the end).
        let len = ((at - off) as usize + rng.random_range(0..4000))
            .saturating_sub(rng.random_range(0..2usize) * rng.random_range(0..3000usize));
        let mut want = Vec::new();
        ExtentMap::read_pieces_to(&c, pieces.clone(), off, len, &mut want, &stage).unwrap();
        let parts = ExtentMap::read_pieces_parts(&c, pieces, off, len).unwrap();
        let mut got = Vec::new();
        for p in &parts {
            assert!(!p.is_empty(), "round {round} (seed {seed}): an empty part");
            match p {
                ReadPart::Chunk(b, r) => got.extend_from_slice(&b[r.clone()]),
                ReadPart::Zeros(n) => got.resize(got.len() + n, 0),
            }
        }
        assert_eq!(got.len(), len, "round {round} (seed {seed}): length");
        assert!(got == want, "round {round} (seed {seed}): other bytes");
    }
}

#[derive(Default)]
pub(crate) struct MemChunks {
    pub chunks: Mutex<HashMap<ChunkHash, ChunkBytes>>,
}

impl ChunkIo for MemChunks {
    fn put(&self, data: &[u8]) -> Result<ChunkHash> {
        let h = ChunkHash::of(data);
        self.chunks
            .lock()
            .entry(h)
            .or_insert_with(|| ChunkBytes::owned(data.to_vec()));
        Ok(h)
    }
    fn get(&self, hash: &ChunkHash) -> Result<ChunkBytes> {
        self.chunks
            .lock()
            .get(hash)
            .cloned()
            .ok_or_else(|| Corruption::UnknownChunk(*hash).into())
    }
}

pub(crate) fn params() -> ChunkParams {
    ChunkParams::from_avg(4096).unwrap()
}

fn check_invariants(f: &FileState) {
    let mut prev_end = 0;
    for (o, e) in f.map.iter() {
        assert!(o >= prev_end, "overlapping extents");
        prev_end = o + e.len as u64;
    }
    assert!(prev_end <= f.size, "extent past size");
}

/// Random writes (sequential, overlapping, sparse), truncates, reads and commits against
/// a plain byte vector. A failure prints the seed; rerun with CKPTFS_SEED=<seed>.
#[test]
fn file_state_matches_model() {
    for_seeds(150, |seed| {
        run_model(seed, &MemChunks::default(), &ChunkPins::detached);
    });
}

/// The same with pieces stored by worker threads that finish late, out of order, and
/// sometimes fail (as a full space does): no byte may be lost or reordered, failed pieces
/// must be retried, and every pin taken must be released exactly once: at a commit, or
/// when a state is dropped with pieces still in flight.
#[test]
fn file_state_matches_model_with_async_failing_store() {
    use std::sync::atomic::Ordering::SeqCst;
    for_seeds(60, |seed| {
        let chunks = AsyncChunks::new(seed);
        let committed = run_model(seed, &chunks, &|| chunks.new_pins());
        // Every state is dropped by now, and a dropped state waits for its tickets, so
        // every job has counted its pin.
        let taken = chunks.pins.load(SeqCst);
        assert_eq!(
            taken,
            chunks.released.n.load(SeqCst),
            "pins taken vs released"
        );
        assert!(committed > 0 && taken > 0, "the model committed nothing");
    });
}

/// The same with every carry spilled whenever no cutter runs on it (what files get
/// once more are written at once than `spill::CARRY_BYTES` holds): reads see the spilled
/// carry, the next cut brings it back, and no byte is lost or moved.
#[test]
fn file_state_matches_model_with_spilled_carries() {
    use std::sync::atomic::Ordering::Relaxed;
    let (spilled, loaded) = (
        std::sync::atomic::AtomicU64::new(0),
        std::sync::atomic::AtomicU64::new(0),
    );
    for_seeds(40, |seed| {
        let chunks = AsyncChunks::spilling(seed);
        run_model(seed, &chunks, &|| chunks.new_pins());
        chunks.quiesce();
        let cs = chunks.carries.as_ref().unwrap();
        spilled.fetch_add(cs.spilled.load(Relaxed), Relaxed);
        loaded.fetch_add(cs.loaded.load(Relaxed), Relaxed);
        assert_eq!(
            cs.resident_bytes(),
            0,
            "carries charged after every state is gone"
        );
    });
    let (spilled, loaded) = (spilled.into_inner(), loaded.into_inner());
    println!("{spilled} carries spilled, {loaded} loaded back");
    assert!(
        !all_seeds() ||
        // About 150 and 100 here; fewer when the machine is busy (runs batch more
        // segments), never none.
        spilled > 40 && loaded > 25,
        "the model spilled {spilled}, loaded {loaded}"
    );
}

/// Several files written, read and committed at once by their own threads, sharing one
/// spill file, their carries spilled by whichever cutter ends first: a spill races the
/// file's own reads, writes and commits, and the slots are reused all the while.
#[test]
fn files_spilling_each_others_carries_match_their_models() {
    use std::sync::atomic::Ordering::Relaxed;
    let spilled = std::sync::atomic::AtomicU64::new(0);
    for_seeds(12, |seed| {
        let chunks = AsyncChunks::spilling(seed);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let chunks = &chunks;
                s.spawn(move || run_model(seed * 16 + t, chunks, &|| chunks.new_pins()));
            }
        });
        chunks.quiesce();
        let cs = chunks.carries.as_ref().unwrap();
        spilled.fetch_add(cs.spilled.load(Relaxed), Relaxed);
        assert_eq!(
            cs.resident_bytes(),
            0,
            "carries charged after every state is gone"
        );
    });
    assert!(
        !all_seeds() || spilled.into_inner() > 100,
        "too few spills to race anything"
    );
}

/// A carry that comes back from the spill file with other bytes (a disk that lost the
/// spill file's pages) fails the file's reads and writes with an error; it never gives
/// wrong bytes nor cuts them into chunks.
#[test]
fn a_spilled_carry_read_back_wrong_fails_the_file() {
    let c = AsyncChunks::spilling(5);
    let mut rng = SmallRng::seed_from_u64(5);
    let mut data = vec![0u8; 1 << 20];
    rng.fill_bytes(&mut data);
    let mut f = FileState::new(params(), ExtentMap::new(), 0, c.new_pins());
    retry(|| f.write(&c, 0, &data));
    // The whole stream goes to the cutter, whose carry (the end of the stream) spills.
    retry(|| f.release(&c, true));
    let cs = c.carries.as_ref().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cs.spilled.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the carry never spilled"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        f.read(&c, 0, data.len()).unwrap(),
        data,
        "read while spilled"
    );
    cs.damage_spill_file();
    assert!(
        f.read(&c, 0, data.len()).is_err(),
        "a read of a damaged carry"
    );
    // The next write brings the carry back, finds it damaged, and fails: then and on
    // every later try (the bytes are gone), never succeeding with a hole or garbage.
    let more = vec![7u8; 100_000];
    let mut failures = 0;
    for _ in 0..3 {
        let r = f
            .write(&c, data.len() as u64, &more)
            .and_then(|()| f.finish(&c));
        match r {
            Err(Error::Io(e)) => {
                assert!(e.to_string().contains("spill file"), "{e}");
                failures += 1;
            }
            Err(Error::NoSpace) => {}
            other => panic!("a file with a lost carry: {other:?}"),
        }
    }
    assert!(failures > 0, "the lost carry was never reported");
}

/// Whether `for_seeds` runs all its seeds (not the one CKPTFS_SEED names): totals over
/// them are checked only then.
fn all_seeds() -> bool {
    std::env::var_os("CKPTFS_SEED").is_none()
}

/// Runs `f` for seeds 0..n, or for the one in CKPTFS_SEED.
fn for_seeds(n: u64, f: impl Fn(u64) + std::panic::RefUnwindSafe) {
    let seeds: Vec<u64> = match std::env::var("CKPTFS_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (0..n).collect(),
    };
    for seed in seeds {
        let result = std::panic::catch_unwind(|| f(seed));
        if result.is_err() {
            panic!("model test failed with seed {seed} (rerun: CKPTFS_SEED={seed})");
        }
    }
}

/// Stores pieces on two worker threads after a random delay; one in 16 fails with
/// `NoSpace`. Counts the pins successful pieces take.
struct AsyncChunks {
    mem: Arc<MemChunks>,
    pool: crate::write::pipeline::Pool,
    rng: Mutex<SmallRng>,
    pins: Arc<std::sync::atomic::AtomicU64>,
    released: Arc<Released>,
    /// Learned at each commit, so rewrites are cut with predictions.
    successors: Arc<Successors>,
    /// Where cutters charge (and spill) their carries, if anywhere.
    carries: Option<Arc<Carries>>,
    /// Cuts run on the writing thread (`Cutters::cut_here`).
    cut_here: std::sync::atomic::AtomicU64,
    /// Whether one piece in 16 fails (`NoSpace`), as a full space fails them.
    failing: bool,
}

/// Counts released pins.
#[derive(Default)]
struct Released {
    n: std::sync::atomic::AtomicU64,
}

impl crate::pins::ReleasePins for Released {
    fn release(&self, hashes: &[ChunkHash]) {
        self.n
            .fetch_add(hashes.len() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl AsyncChunks {
    fn new(seed: u64) -> Self {
        AsyncChunks {
            mem: Arc::default(),
            pool: crate::write::pipeline::Pool::new(2, "test-store"),
            rng: Mutex::new(SmallRng::seed_from_u64(seed ^ 0x5eed)),
            pins: Arc::default(),
            released: Arc::default(),
            successors: Arc::default(),
            carries: None,
            cut_here: Default::default(),
            failing: true,
        }
    }

    /// Every carry is spilled as soon as no cutter runs on it (a budget of 0), to a
    /// file in the temporary directory.
    fn spilling(seed: u64) -> Self {
        let carries = Carries::new(0);
        // Whatever the temporary directory's free space: these tests are about the
        // carries, `spill::tests` about the room left.
        carries.spill_to_keeping(
            &std::env::temp_dir(),
            longest_carry(params().max_bytes),
            Arc::new(|| 0),
        );
        AsyncChunks {
            carries: Some(carries),
            ..AsyncChunks::new(seed)
        }
    }

    /// Returns once every job queued on the pool so far has ended: each of its two
    /// workers takes one barrier job, which it reaches only after the jobs queued before.
    /// (A discarded file state's cut may still run on the pool, charging its carry until
    /// it ends.)
    fn quiesce(&self) {
        let barrier = Arc::new(std::sync::Barrier::new(3));
        for _ in 0..2 {
            let b = barrier.clone();
            self.pool.run(move || {
                b.wait();
            });
        }
        barrier.wait();
    }

    fn new_pins(&self) -> ChunkPins {
        let owner: std::sync::Weak<dyn crate::pins::ReleasePins> =
            Arc::downgrade(&self.released) as _;
        ChunkPins::new(owner)
    }
}

/// Cutters on the test's pool after a random delay, unbounded.
impl crate::write::pipeline::Cutters for AsyncChunks {
    fn reserve_cut(&self, _bytes: usize) -> Option<Permit> {
        None
    }
    fn carries(&self) -> Option<Arc<Carries>> {
        self.carries.clone()
    }
    fn spawn_cut(&self, job: Box<dyn FnOnce() + Send>) {
        let delay_us = self.rng.lock().random_range(0..40u64);
        self.pool.run(move || {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
            job()
        });
    }
    fn cut_here(&self, job: &mut dyn FnMut()) {
        self.cut_here
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        job()
    }
}

impl ChunkIo for AsyncChunks {
    fn put(&self, data: &[u8]) -> Result<ChunkHash> {
        self.mem.put(data)
    }
    fn get(&self, hash: &ChunkHash) -> Result<ChunkBytes> {
        self.mem.get(hash)
    }
    fn cutters(&self) -> Option<&dyn crate::write::pipeline::Cutters> {
        Some(self)
    }
    fn successors(&self) -> Option<Predictor> {
        Some(Predictor {
            table: self.successors.clone(),
            pipeline: None,
        })
    }
    fn submit(&self, piece: Piece) -> Ticket {
        if let Some(h) = piece.known_hash() {
            assert_eq!(
                h,
                ChunkHash::of(piece.bytes()),
                "a piece's hash is of its bytes"
            );
        }
        let (delay_us, fail) = {
            let mut r = self.rng.lock();
            (
                r.random_range(0..40u64),
                self.failing && r.random_range(0..16) == 0,
            )
        };
        let t = Ticket::pending();
        let done = t.completion();
        let (mem, pins) = (self.mem.clone(), self.pins.clone());
        self.pool.run(move || {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
            if fail {
                done.complete(Err(Error::NoSpace));
            } else {
                pins.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                done.complete(mem.put(piece.bytes()));
            }
        });
        t
    }
}

/// Retries an operation that a failing store makes fail now and then (what the fs
/// layer does after gc makes room).
fn retry(mut op: impl FnMut() -> Result<()>) {
    for _ in 0..200 {
        match op() {
            Ok(()) => return,
            Err(Error::NoSpace) => continue,
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }
    panic!("still failing after 200 tries");
}

/// Returns the number of commits. `pins` makes the pin set of each new state.
fn run_model(seed: u64, chunks: &dyn ChunkIo, pins: &dyn Fn() -> ChunkPins) -> u64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    let mut f = FileState::new(params(), ExtentMap::new(), 0, pins());
    // What the last commit saved: a discarded state goes back to it.
    let mut saved = (ExtentMap::new(), Vec::new());
    let mut commits = 0u64;
    for _ in 0..300 {
        match rng.random_range(0..100) {
            0..=34 => {
                // sequential append, sometimes large enough to cut the stream (and to
                // hand all of it to the cutter, so the next write past the end starts a
                // new stream while that cut is still open)
                let len = if rng.random_range(0..8) == 0 {
                    rng.random_range(1 << 20..3 << 20)
                } else {
                    rng.random_range(1..200_000)
                };
                let mut data = vec![0u8; len];
                fill(&mut rng, &mut data);
                let off = model.len() as u64;
                if rng.random_bool(0.5) {
                    // In the request's own buffer, as the mount passes large writes.
                    let sh = SharedBytes::from(data.clone());
                    retry(|| f.write_shared(chunks, off, sh.clone()));
                } else {
                    retry(|| f.write(chunks, off, &data));
                }
                model.extend_from_slice(&data);
            }
            35..=64 => {
                let off = rng.random_range(0..model.len() as u64 + 20_000);
                let len = rng.random_range(1..40_000);
                let mut data = vec![0u8; len];
                fill(&mut rng, &mut data);
                retry(|| f.write(chunks, off, &data));
                let end = off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            65..=68 => {
                let n = rng.random_range(0..model.len() as u64 + 10_000);
                f.truncate(n);
                model.resize(n as usize, 0);
            }
            69..=72 => {
                // A next revision under the same name (open with O_TRUNC, write it all
                // again with some blocks changed): cut with predictions learned at the
                // last commit.
                let mut next = model.clone();
                for blk in next.chunks_mut(4096) {
                    if rng.random_range(0..10) == 0 {
                        fill(&mut rng, blk);
                    }
                }
                f.truncate(0);
                let w = rng.random_range(4096..1 << 20);
                if rng.random_bool(0.5) {
                    for (i, part) in next.chunks(w).enumerate() {
                        retry(|| f.write(chunks, (i * w) as u64, part));
                    }
                } else {
                    // From a buffer off a page boundary, split as the kernel splits it.
                    let mut off = 0;
                    for r in split_requests(next.len(), rng.random_range(0..4096)) {
                        let sh = SharedBytes::from(next[off..off + r].to_vec());
                        retry(|| f.write_shared(chunks, off as u64, sh.clone()));
                        off += r;
                    }
                }
                model = next;
            }
            73..=80 => {
                retry(|| f.finish(chunks));
                if let Some(pr) = chunks.successors() {
                    pr.table.learn(f.map.iter(), params().max_bytes);
                }
                f.mark_committed();
                drop(f.take_pins());
                commits += 1;
                // Reload from the committed map, as a remount would.
                saved = (f.map.clone(), model.clone());
                f = FileState::new(params(), saved.0.clone(), model.len() as u64, pins());
            }
            84..=87 => {
                // Another file's writer makes this one let go of memory (fs's sweep).
                let all = rng.random_bool(0.5);
                retry(|| f.release(chunks, all));
            }
            81..=83 => {
                // Discarded (an unlink, a save given up) with pieces possibly still in
                // flight: back to the last commit.
                model = saved.1.clone();
                f = FileState::new(params(), saved.0.clone(), model.len() as u64, pins());
            }
            _ => {
                let off = rng.random_range(0..model.len() as u64 + 100);
                let len = rng.random_range(0..100_000);
                let got = f.read(chunks, off, len).unwrap();
                let s = (off as usize).min(model.len());
                let t = (off as usize + len).min(model.len());
                assert_eq!(got, &model[s..t], "read at {off} len {len}");
            }
        }
        assert_eq!(f.size(), model.len() as u64);
        check_invariants(&f);
    }
    retry(|| f.finish(chunks));
    check_invariants(&f);
    assert_eq!(f.read(chunks, 0, model.len()).unwrap(), model);
    commits
}

/// Data with runs of zeros and repeated blocks, so holes and dedup paths are exercised.
fn fill(rng: &mut SmallRng, data: &mut [u8]) {
    match rng.random_range(0..5) {
        0 => data.fill(0),
        1 => data.fill(rng.random()),
        2 => sparse(rng, data),
        _ => rng.fill_bytes(data),
    }
}

/// Random bytes with runs of zeros (what `Gear::search` skips): short ones, ones about
/// as long as the shortest it skips, long ones, some at either end.
fn sparse(rng: &mut SmallRng, data: &mut [u8]) {
    rng.fill_bytes(data);
    let n = data.len();
    for _ in 0..rng.random_range(1..8) {
        let len = match rng.random_range(0..3) {
            0 => rng.random_range(1..64),
            1 => rng.random_range(ZERO_WINDOW - 600..ZERO_WINDOW + 600),
            _ => rng.random_range(ZERO_WINDOW..300_000),
        }
        .min(n);
        let at = match rng.random_range(0..6) {
            0 => 0,
            1 => n - len,
            _ => rng.random_range(0..=n - len),
        };
        data[at..at + len].fill(0);
    }
}

/// Cuts `data` in random segments (with the carry between them, as the cutter does);
/// checks every piece holds the stream's bytes at its offset and the pieces tile the
/// stream; returns (offset, length, hash if the cutter computed it).
fn cut_in_segments(
    rng: &mut SmallRng,
    cutter: &mut Cutter,
    data: &[u8],
    what: &str,
) -> Vec<(u64, usize, Option<ChunkHash>)> {
    cut_in_segments_of(rng, cutter, data, what, 300_000)
}

/// `cut_in_segments` with segments of 1 to `max_seg` bytes.
fn cut_in_segments_of(
    rng: &mut SmallRng,
    cutter: &mut Cutter,
    data: &[u8],
    what: &str,
    max_seg: usize,
) -> Vec<(u64, usize, Option<ChunkHash>)> {
    let mut got = Vec::new();
    let (mut start, mut carry, mut at) = (0u64, Vec::new(), 0usize);
    while at < data.len() {
        let n = rng.random_range(1..max_seg).min(data.len() - at);
        let last = at + n == data.len();
        let seg = SharedBytes::from(data[at..at + n].to_vec());
        let (pieces, s, c) = cut_segment(cutter, start, &carry, seg, last);
        for (off, piece, zero) in pieces {
            let want = &data[off as usize..off as usize + piece.len()];
            assert_eq!(piece.bytes(), want, "{what}");
            assert_eq!(zero, want.iter().all(|&b| b == 0), "{what}");
            if let Some(h) = piece.known_hash() {
                assert_eq!(
                    h,
                    ChunkHash::of(want),
                    "{what}: a piece's hash is of its bytes"
                );
            }
            let expect = got
                .last()
                .map_or(0, |&(o, l, _): &(u64, usize, _)| o + l as u64);
            assert_eq!(off, expect, "{what}: pieces are back to back");
            got.push((off, piece.len(), piece.known_hash()));
        }
        (start, carry, at) = (s, c, at + n);
    }
    assert!(carry.is_empty(), "{what}: the last segment cuts everything");
    got
}

/// A cutter predicting from `table` (no stage timers).
fn predicting(p: ChunkParams, table: Arc<Successors>) -> Cutter {
    Cutter::new(
        p,
        Some(Predictor {
            table,
            pipeline: None,
        }),
    )
}

fn whole_cut(p: ChunkParams, data: &[u8]) -> Vec<(u64, usize)> {
    cdc(p, data, 0)
        .into_iter()
        .map(|(o, l)| (o as u64, l))
        .collect()
}

/// Cutting a stream segment by segment gives exactly FastCDC's chunks of the whole
/// stream, whatever the segment sizes.
#[test]
fn segmented_cut_equals_whole_stream_cut() {
    let p = params();
    let mut rng = SmallRng::seed_from_u64(3);
    for round in 0..40 {
        let mut data = vec![0u8; rng.random_range(1..400_000)];
        fill(&mut rng, &mut data);
        let mut cutter = Cutter::new(p, None);
        let got = cut_in_segments(&mut rng, &mut cutter, &data, &format!("round {round}"));
        let got: Vec<(u64, usize)> = got.into_iter().map(|(o, l, _)| (o, l)).collect();
        assert_eq!(got, whole_cut(p, &data), "round {round}");
    }
}

/// Segments shorter than a chunk, odd and even, down to a byte: the scan stops at the
/// end of each and resumes there with the next (`Gear::scan`), and the cuts are still
/// exactly FastCDC's.
#[test]
fn resumed_scans_cut_like_fastcdc() {
    let p = params();
    let mut rng = SmallRng::seed_from_u64(17);
    for round in 0..200 {
        let mut data = vec![0u8; rng.random_range(1..120_000)];
        fill(&mut rng, &mut data);
        let max_seg = [2, 64, 3000, p.max_bytes as usize * 2][round % 4];
        let mut cutter = Cutter::new(p, None);
        let what = format!("round {round}, segments up to {max_seg}");
        let got = cut_in_segments_of(&mut rng, &mut cutter, &data, &what, max_seg);
        let got: Vec<(u64, usize)> = got.into_iter().map(|(o, l, _)| (o, l)).collect();
        assert_eq!(got, whole_cut(p, &data), "{what}");
    }
}

/// The many-lane search (`gearscan`) inside resumed and whole scans, at several chunk
/// sizes: exactly FastCDC's cuts. With the one-lane kernel everywhere, and with the
/// AVX-512 one where the CPU has it (said loudly where it does not).
/// The search is measured among what this CPU runs, names every candidate's figure, and
/// the process-wide choice is one of them (each kernel's cuts are checked against
/// FastCDC by `searched_scans_cut_like_fastcdc`).
#[test]
fn the_search_is_measured_among_what_this_cpu_runs() {
    let all = searches();
    let names: Vec<_> = all.iter().map(|c| c.name).collect();
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        names.contains(&"avx512"),
        std::arch::is_x86_feature_detected!("avx512f"),
        "{names:?}"
    );
    assert_eq!(names[0], "scalar");
    assert!(all[0].kernel.is_none());
    let chosen = fastest(&all);
    assert!(names.contains(&chosen.name), "{chosen:?}");
    for n in &names {
        assert!(
            chosen.measured.contains(&format!("{n}=")),
            "{n} missing from {:?}",
            chosen.measured
        );
    }
    let s = gear_search();
    assert!(names.contains(&s.name), "{s:?}");
}

fn longest_zeros(b: &[u8]) -> usize {
    b.split(|&x| x != 0).map(|r| r.len()).max().unwrap_or(0)
}

/// A search that skips zero runs ends exactly where the byte-by-byte one does: the same
/// cut, or the same stopping point with the same hash (a resumed scan carries it on),
/// over sparse data from any starting state, with either mask, on every kernel.
#[test]
fn zero_runs_are_skipped_with_the_hash_the_bytes_give() {
    let mut kernels: Vec<Option<crate::write::gearscan::Kernel>> =
        vec![None, Some(crate::write::gearscan::block_scalar)];
    #[cfg(target_arch = "x86_64")]
    if crate::write::gearscan::tests::avx512_here(
        "zero_runs_are_skipped_with_the_hash_the_bytes_give",
    ) {
        kernels.push(Some(crate::write::gearscan::block_avx512));
    }
    let mut rng = SmallRng::seed_from_u64(41);
    let mut skipped = 0;
    for round in 0..400 {
        let p = ChunkParams::from_avg([4096, 16384, 65536][round % 3]).unwrap();
        let g = Gear::with_kernel(p, kernels[round % kernels.len()]);
        let mut src = vec![0u8; rng.random_range(p.min_bytes as usize + 2..600_000)];
        sparse(&mut rng, &mut src);
        let pairs = src.len() / 2;
        let mask = if rng.random() { g.mask_s } else { g.mask_l };
        // A starting state as a scan reaches it: the bytes' own search from the start.
        let mid = rng.random_range(g.start().0..=pairs);
        // (All of a mask's bits zero: as good as never, with the hash starting at zero.)
        let Ok(at) = g.search_bytes(&src, g.start(), mid, u64::MAX) else {
            continue;
        };
        // Half the time, a run that starts and ends on the blocks a skip from here
        // would pass over, with non-zero bytes either side: a skip one byte too far or
        // short shows. (The bytes past `at` do not change `at`.)
        let from = 2 * at.0;
        let blocks = rng.random_range(1..4 * ZERO_WINDOW_LANES / ZERO_BLOCK);
        let run = from + ZERO_BLOCK * rng.random_range(0..4 * ZERO_WINDOW_LANES / ZERO_BLOCK)..;
        let run = run.start..run.start + blocks * ZERO_BLOCK;
        if rng.random() && run.end < src.len() {
            src[run.clone()].fill(0);
            src[run.end] = 1;
            if run.start > from {
                src[run.start - 1] = 1;
            }
        }
        // Ends anywhere, and every end around the next run's end, where the hash that
        // leaves a skip must be the one the bytes give.
        let mut ends = vec![rng.random_range(at.0..=pairs)];
        if run.end < src.len() {
            ends.extend((run.end / 2).saturating_sub(2)..(run.end / 2 + 40).min(pairs + 1));
        }
        for end in ends.into_iter().filter(|&e| e >= at.0) {
            let want = g.search_bytes(&src, at, end, mask);
            assert_eq!(
                g.search(&src, at, end, mask),
                want,
                "round {round}, end {end}"
            );
            // Long enough that a skip must happen (a window, 64 bytes, a block).
            let long = ZERO_WINDOW_LANES + ZERO_BLOCK + 64;
            skipped += usize::from(longest_zeros(&src[2 * at.0..2 * end]) >= 2 * long);
        }
    }
    assert!(skipped > 1000, "only {skipped} searches had a run to skip");
}

#[test]
fn searched_scans_cut_like_fastcdc() {
    let mut kernels: Vec<(&str, crate::write::gearscan::Kernel)> =
        vec![("one lane", crate::write::gearscan::block_scalar)];
    #[cfg(target_arch = "x86_64")]
    if crate::write::gearscan::tests::avx512_here("searched_scans_cut_like_fastcdc") {
        kernels.push(("avx512", crate::write::gearscan::block_avx512));
    }
    let mut rng = SmallRng::seed_from_u64(29);
    for (name, kernel) in kernels {
        for round in 0..60 {
            let p = ChunkParams::from_avg([4096, 8192, 16384, 65536][round % 4]).unwrap();
            let mut data = vec![0u8; rng.random_range(1..600_000)];
            fill(&mut rng, &mut data);
            let max_seg = [64, 3000, 70_000, p.max_bytes as usize * 2][round / 4 % 4];
            let mut cutter = Cutter::new(p, None);
            cutter.gear.kernel = Some(kernel);
            let what = format!("{name}, round {round}, segments up to {max_seg}");
            let got = cut_in_segments_of(&mut rng, &mut cutter, &data, &what, max_seg);
            let got: Vec<(u64, usize)> = got.into_iter().map(|(o, l, _)| (o, l)).collect();
            assert_eq!(got, whole_cut(p, &data), "{what}");
        }
    }
}

fn learned(p: ChunkParams, data: &[u8], cuts: &[(u64, usize)]) -> Arc<Successors> {
    let mut map = ExtentMap::new();
    for &(o, l) in cuts {
        let chunk = ChunkHash::of(&data[o as usize..o as usize + l]);
        map.insert(
            o,
            Extent {
                chunk,
                chunk_off: 0,
                len: l as u32,
            },
        );
    }
    let s = Arc::new(Successors::default());
    s.learn(map.iter(), p.max_bytes);
    s
}

/// A previous revision of 1-4 MB of random bytes: its bytes, its FastCDC cuts, the
/// chunk sequence learned from them, and its chunks as (offset, length, hash).
#[allow(clippy::type_complexity)]
fn old_revision(
    rng: &mut SmallRng,
    p: ChunkParams,
) -> (
    Vec<u8>,
    Vec<(u64, usize)>,
    Arc<Successors>,
    HashSet<(u64, usize, ChunkHash)>,
) {
    let mut old = vec![0u8; rng.random_range(1_000_000..4_000_000)];
    rng.fill_bytes(&mut old);
    let old_cuts = whole_cut(p, &old);
    let table = learned(p, &old, &old_cuts);
    let old_chunks = old_cuts
        .iter()
        .map(|&(o, l)| (o, l, ChunkHash::of(&old[o as usize..o as usize + l])))
        .collect();
    (old, old_cuts, table, old_chunks)
}

/// A next revision cut with predictions learned from the previous one: the cuts are
/// exactly FastCDC's (a predicted chunk that hashes right ends where FastCDC would cut),
/// and most chunks were predicted rather than scanned.
#[test]
fn predicted_cuts_equal_content_defined_cuts() {
    let p = params();
    let mut rng = SmallRng::seed_from_u64(11);
    let (mut predicted, mut total) = (0usize, 0usize);
    for round in 0..12 {
        let mut old = vec![0u8; rng.random_range(200_000..3_000_000)];
        for blk in old.chunks_mut(64 << 10) {
            fill(&mut rng, blk);
        }
        let old_cuts = whole_cut(p, &old);
        let table = learned(p, &old, &old_cuts);
        let mut new = old.clone();
        // 5% of 64 KiB blocks changed, sometimes a few bytes inserted, sometimes grown.
        for blk in new.chunks_mut(64 << 10) {
            if rng.random_range(0..20) == 0 {
                rng.fill_bytes(blk);
            }
        }
        if rng.random_range(0..3) == 0 {
            let at = rng.random_range(0..new.len());
            new.splice(at..at, *b"inserted");
        }
        if rng.random_range(0..3) == 0 {
            let mut tail = vec![0u8; 100_000];
            rng.fill_bytes(&mut tail);
            new.extend_from_slice(&tail);
        }
        let mut cutter = predicting(p, table);
        let got = cut_in_segments(&mut rng, &mut cutter, &new, &format!("round {round}"));
        total += got.len();
        predicted += got.iter().filter(|c| c.2.is_some()).count();
        let got: Vec<(u64, usize)> = got.into_iter().map(|(o, l, _)| (o, l)).collect();
        assert_eq!(got, whole_cut(p, &new), "round {round}");
    }
    // Hashed chunks include the content-defined ones hashed to look up a successor, so
    // this is an upper bound of the predicted ones; it shows the path is taken.
    assert!(predicted * 10 >= total * 8, "{predicted} of {total} hashed");
}

/// Where this mount fingerprinted a predicted chunk, the prediction is confirmed by the
/// fingerprint alone (blake3 is not computed), and the piece is named by the hash
/// remembered with it (`Piece::hashed` checks that it is its bytes' in debug builds). A
/// fingerprint that does not match the bytes is a miss: the chunk is cut by content and
/// named by the blake3 of its bytes, at the same cuts. With fingerprints turned off
/// (`--confirm blake3`) every prediction is confirmed by blake3.
#[test]
fn predictions_are_confirmed_by_fingerprint_and_a_wrong_one_misses() {
    use crate::write::predict::fingerprint;
    let p = params();
    let mut rng = SmallRng::seed_from_u64(12);
    for round in 0..6 {
        // Random bytes: no chunk repeats, so each predicts one successor.
        let mut data = vec![0u8; rng.random_range(1_000_000..3_000_000)];
        rng.fill_bytes(&mut data);
        let cuts = whole_cut(p, &data);
        let table = learned(p, &data, &cuts);
        let mut right = 0;
        for (i, &(o, l)) in cuts.iter().enumerate() {
            let b = &data[o as usize..o as usize + l];
            if i % 3 == 1 {
                table.remember_fingerprint(&ChunkHash::of(b), fingerprint(b) ^ 1);
            } else {
                table.remember(&ChunkHash::of(b), b);
                right += 1;
            }
        }
        for by_fingerprint in [true, false] {
            let what = format!("round {round}, by fingerprint {by_fingerprint}");
            table.confirm_by_fingerprint(by_fingerprint);
            let mut cutter = predicting(p, table.clone());
            let seg = SharedBytes::from(data.clone());
            let (pieces, _, carry) = cut_segment(&mut cutter, 0, &[], seg, true);
            assert!(carry.is_empty(), "{what}");
            let mut got = Vec::new();
            for (off, piece, _) in &pieces {
                let want = &data[*off as usize..*off as usize + piece.len()];
                assert_eq!(piece.bytes(), want, "{what}");
                if let Some(h) = piece.known_hash() {
                    assert_eq!(h, ChunkHash::of(want), "{what}: at {off}");
                }
                got.push((*off, piece.len()));
            }
            assert_eq!(got, cuts, "{what}: the same cuts");
            if by_fingerprint {
                // All but the first chunk (nothing predicts it) and the last (cut where
                // the data ended: not learned) follow a chunk that predicts them (a
                // wrong fingerprint's chunk is hashed after its miss, so what follows
                // it is predicted too); only those with the right fingerprint are
                // confirmed by it.
                assert!(
                    cutter.fingerprinted <= right && cutter.fingerprinted + 2 >= right,
                    "{what}: {} confirmed by fingerprint, {right} right ones",
                    cutter.fingerprinted
                );
                assert!(cutter.predicted >= cutter.fingerprinted, "{what}");
            } else {
                assert_eq!(cutter.fingerprinted, 0, "{what}");
                assert!(
                    cutter.predicted as usize + 2 >= cuts.len(),
                    "{what}: {} of {} predicted",
                    cutter.predicted,
                    cuts.len()
                );
            }
        }
    }
}

/// A next revision whose chunks this mount fingerprinted is cut on the writing thread
/// once a window of its stream was mostly confirmed by fingerprint (`CUT_HERE_SHARE`),
/// while the workers keep cutting the first revision (nothing
/// predicted) and the stretches after changes; either way the file is cut exactly as
/// FastCDC cuts it and reads back exactly. Writes of 1 MiB and of odd sizes (a writer's
/// large request and the few bytes after it), with blocks changed in place and bytes
/// inserted, so segments of both kinds alternate.
#[test]
fn next_revisions_are_cut_on_the_writing_thread_with_the_same_cuts() {
    // On for the whole test process (the other tests' next revisions may be cut on
    // their writing threads too, which they must bear as well).
    cut_here_switch().store(true, std::sync::atomic::Ordering::Relaxed);
    let p = params();
    // No piece fails: a write retried after one lands in blocks, cut by size, not FastCDC.
    let c = AsyncChunks {
        failing: false,
        ..AsyncChunks::new(31)
    };
    let mut rng = SmallRng::seed_from_u64(31);
    let here = || c.cut_here.load(std::sync::atomic::Ordering::Relaxed);
    let mut data = vec![0u8; 6 << 20];
    rng.fill_bytes(&mut data);
    for round in 0..4 {
        let what = format!("round {round}");
        let before = here();
        let mut f = FileState::new(p, ExtentMap::new(), 0, c.new_pins());
        let mut at = 0;
        while at < data.len() {
            let n = match rng.random_range(0..4) {
                0 => rng.random_range(1..64),
                _ => 1 << 20,
            }
            .min(data.len() - at);
            retry(|| f.write(&c, at as u64, &data[at..at + n]));
            at += n;
            // A segment is cut here only where no cutter runs for the stream (one
            // queued behind a running cutter is cut by it): let the workers catch up,
            // so the count does not depend on how busy the machine is.
            c.quiesce();
        }
        retry(|| f.finish(&c));
        let cuts: Vec<(u64, usize)> = f.map().iter().map(|(o, e)| (o, e.len as usize)).collect();
        assert_eq!(
            cuts,
            whole_cut(p, &data),
            "{what}: the same cuts as FastCDC"
        );
        assert!(
            f.read(&c, 0, data.len()).expect("read") == data,
            "{what}: read back"
        );
        let cut_here = here() - before;
        if round == 0 {
            assert_eq!(cut_here, 0, "{what}: nothing predicted, nothing cut here");
        } else {
            // Most 512 KiB windows are mostly unchanged (one block in 40 changes), so
            // most 1 MiB segments after them are cut here.
            assert!(cut_here >= 2, "{what}: only {cut_here} segments cut here");
        }
        // What this mount's store would do: learn the sequence, fingerprint the chunks.
        c.successors.learn(f.map().iter(), p.max_bytes);
        for (o, e) in f.map().iter() {
            let b = &data[o as usize..o as usize + e.len as usize];
            c.successors.remember(&e.chunk, b);
        }
        // The next revision: blocks changed in place, and a few bytes inserted.
        for blk in data.chunks_mut(64 << 10) {
            if rng.random_range(0..40) == 0 {
                rng.fill_bytes(blk);
            }
        }
        let at = rng.random_range(0..data.len());
        data.splice(at..at, [7u8; 9]);
    }
}

/// A segment starting with these bytes makes `cut_segment` panic.
pub(super) const PANIC_CUT: &[u8] = b"ckptfs test: the cutter panics here";

/// A cutter that panics (a bug) costs the dedup of its segment, not the file: the
/// segment is cut in fixed-size chunks, the stream goes on, and every byte reads back.
/// Before, the cut state stayed "running" and `finish` waited for ever (the test ran
/// `finish` on a thread of its own and gave up after 60 s).
#[test]
fn a_panicking_cutter_loses_no_bytes() {
    let c = Arc::new(AsyncChunks::new(21));
    let mut rng = SmallRng::seed_from_u64(21);
    let mut data = vec![0u8; 3_000_000];
    rng.fill_bytes(&mut data);
    // Requests of 1 MiB, each a stream segment of its own; the cutter panics on the
    // second.
    const REQ: usize = 1 << 20;
    data[REQ..REQ + PANIC_CUT.len()].copy_from_slice(PANIC_CUT);
    let (tx, rx) = std::sync::mpsc::channel();
    let cc = c.clone();
    let want = data.clone();
    std::thread::spawn(move || {
        let mut f = FileState::new(params(), ExtentMap::new(), 0, cc.new_pins());
        for (i, req) in want.chunks(REQ).enumerate() {
            // A write may meet a failed piece (one in 16 fails): it is handed over again.
            while f.write(&*cc, (i * REQ) as u64, req).is_err() {}
        }
        while f.finish(&*cc).is_err() {}
        let _ = tx.send(f.read(&*cc, 0, want.len()).expect("read"));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("finish returned (a panicking cutter hung the file)");
    assert!(got == data, "every byte reads back");
}

/// After changes in place (a checkpoint's tensors rewritten: same offsets), the cutter
/// follows the old chunk sequence past the changed bytes, so every chunk that is an old
/// chunk at its old offset is confirmed by one hash, not scanned by FastCDC: including
/// the first one after each change, where the content-defined cut meets the old
/// boundaries again. (Not predictable: the first two chunks of the stream, before any
/// known chunk, and the last, which was cut at the old end and is not learned.)
#[test]
fn in_place_changes_resynchronize_predictions() {
    let p = params();
    let mut rng = SmallRng::seed_from_u64(13);
    for round in 0..10 {
        let (old, _, table, old_chunks) = old_revision(&mut rng, p);
        let mut new = old.clone();
        for blk in new.chunks_mut(64 << 10) {
            if rng.random_range(0..20) == 0 {
                rng.fill_bytes(blk);
            }
        }
        let mut cutter = predicting(p, table);
        let what = format!("round {round}");
        let got = cut_in_segments(&mut rng, &mut cutter, &new, &what);
        let cuts: Vec<(u64, usize)> = got.iter().map(|&(o, l, _)| (o, l)).collect();
        assert_eq!(cuts, whole_cut(p, &new), "{what}");
        let n = cuts.len();
        let unchanged = cuts[2.min(n)..n.saturating_sub(1).max(2.min(n))]
            .iter()
            .filter(|&&(o, l)| {
                old_chunks.contains(&(o, l, ChunkHash::of(&new[o as usize..o as usize + l])))
            })
            .count() as u64;
        assert!(
            cutter.predicted >= unchanged,
            "{what}: {} of {unchanged} unchanged chunks predicted ({n} chunks)",
            cutter.predicted
        );
    }
}

/// A next revision with blocks changed in place is cut at the old boundaries around the
/// changes: the new chunks are exactly the old chunks the changed blocks touch (fewer
/// bytes than FastCDC's cuts make new), every other chunk is the old one, confirmed, and
/// the stream's bytes are all there. Bytes inserted (everything after them shifted) are
/// cut by content as before: the old chunks past them are found again.
#[test]
fn in_place_changes_keep_the_old_boundaries() {
    let p = params();
    let blk = p.avg_bytes as usize;
    let mut rng = SmallRng::seed_from_u64(14);
    let (mut got_total, mut want_total, mut cdc_total, mut followed) = (0, 0, 0, 0);
    for round in 0..16 {
        let (old, old_cuts, table, old_chunks) = old_revision(&mut rng, p);
        // 5% of the blocks of a chunk's average size changed (as 64 KiB blocks of a
        // tensor with 64 KiB chunks), none next to another and none in the first three
        // or last three old chunks (the first has no chunk before it to predict it).
        let (lo, hi) = (
            old_cuts[3].0 as usize,
            old_cuts[old_cuts.len() - 3].0 as usize,
        );
        let mut new = old.clone();
        let mut changed: Vec<usize> = Vec::new();
        for b in lo.div_ceil(blk)..hi / blk {
            if rng.random_range(0..20) == 0 && changed.last().is_none_or(|&c| c + 2 < b) {
                rng.fill_bytes(&mut new[b * blk..(b + 1) * blk]);
                changed.push(b);
            }
        }
        let what = format!("round {round}");
        let fresh = |d: &[u8], o: u64, l: usize| {
            !old_chunks.contains(&(o, l, ChunkHash::of(&d[o as usize..o as usize + l])))
        };
        let mut cutter = predicting(p, table.clone());
        let got = cut_in_segments(&mut rng, &mut cutter, &new, &what);
        let got_new: usize = got
            .iter()
            .filter(|&&(o, l, _)| fresh(&new, o, l))
            .map(|&(_, l, _)| l)
            .sum();
        let want: usize = old_cuts
            .iter()
            .filter(|&&(o, l)| {
                let (o, l) = (o as usize, l);
                changed
                    .iter()
                    .any(|&b| o < (b + 1) * blk && o + l > b * blk)
            })
            .map(|&(_, l)| l)
            .sum();
        assert!(
            got_new >= changed.len() * blk,
            "{what}: {got_new} new bytes for {} changed",
            changed.len() * blk
        );
        let cdc: usize = whole_cut(p, &new)
            .iter()
            .filter(|&&(o, l)| fresh(&new, o, l))
            .map(|&(_, l)| l)
            .sum();
        got_total += got_new;
        want_total += want;
        cdc_total += cdc;
        followed += cutter.followed;

        // A few bytes inserted: cut by content past them, the old chunks found again.
        let at = rng.random_range(0..new.len() / 2);
        new.splice(at..at, *b"inserted");
        let known: HashSet<ChunkHash> = old_chunks.iter().map(|c| c.2).collect();
        let mut cutter = predicting(p, table);
        let got = cut_in_segments(&mut rng, &mut cutter, &new, &what);
        let again = got
            .iter()
            .filter(|&&(o, l, _)| known.contains(&ChunkHash::of(&new[o as usize..][..l])))
            .count();
        assert!(
            again * 10 >= got.len() * 7,
            "{what}: after an insertion {again} of {} chunks known",
            got.len()
        );
    }
    eprintln!(
        "new bytes: {got_total} at the old boundaries, {want_total} in the old chunks the \
         changes touched, {cdc_total} cut by content; {followed} chunks followed"
    );
    assert!(followed > 0, "the old boundaries were followed");
    assert!(
        got_total * 20 <= want_total * 21,
        "{got_total} new bytes, {want_total} in the old chunks the changes touched"
    );
    assert!(
        got_total * 20 <= cdc_total * 19,
        "{got_total} new bytes at the old boundaries, {cdc_total} cut by content"
    );
}

/// Predictions that are not content-defined (a previous revision of fixed-size blocks,
/// another file's sequence, stale entries) still give the stream's exact bytes, back to
/// back: a prediction only decides where a chunk ends.
#[test]
fn any_prediction_gives_the_streams_bytes() {
    let p = params();
    let mut rng = SmallRng::seed_from_u64(12);
    for round in 0..20 {
        let mut data = vec![0u8; rng.random_range(1..2_000_000)];
        for blk in data.chunks_mut(50_000) {
            fill(&mut rng, blk);
        }
        // Fixed blocks of a random size, and CDC cuts of a shifted copy.
        let bs = rng.random_range(1..p.max_bytes as usize + 1000);
        let fixed: Vec<(u64, usize)> = (0..data.len())
            .step_by(bs)
            .map(|o| (o as u64, bs.min(data.len() - o)))
            .collect();
        let table = learned(p, &data, &fixed);
        let shifted = &data[rng.random_range(0..data.len())..];
        let mut map = ExtentMap::new();
        let mut at = 0;
        for &(o, l) in &whole_cut(p, shifted) {
            map.insert(
                at,
                Extent {
                    chunk: ChunkHash::of(&shifted[o as usize..o as usize + l]),
                    chunk_off: 0,
                    len: l as u32,
                },
            );
            at += l as u64;
        }
        table.learn(map.iter(), p.max_bytes);
        let mut cutter = predicting(p, table);
        let got = cut_in_segments(&mut rng, &mut cutter, &data, &format!("round {round}"));
        let end = got.last().map_or(0, |&(o, l, _)| o + l as u64);
        assert_eq!(end, data.len() as u64, "round {round}");
    }
}

/// The requests the kernel makes of one direct write of `len` bytes from a buffer
/// `page_off` bytes past a page boundary: at most 256 pages each (its default
/// `max_pages_limit`), so the first is `page_off` short of 1 MiB and the last takes
/// what is left.
fn split_requests(len: usize, page_off: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = len;
    let mut room = (1 << 20) - page_off;
    while left > 0 {
        let n = left.min(room);
        out.push(n);
        left -= n;
        room = 1 << 20;
    }
    out
}

/// A writer whose buffer is not page-aligned (malloc's are not) has each large write
/// split by the kernel into a request a few bytes short of 1 MiB, whole ones, and a
/// few bytes. Shared large requests become stream segments without being copied into
/// the stream buffer (nothing stays buffered after one), and the file is cut exactly
/// as the same bytes written in whole segments.
#[test]
fn split_shared_requests_are_segments_uncopied_and_cut_alike() {
    for_seeds(12, |seed| {
        let mut rng = SmallRng::seed_from_u64(seed);
        let chunks = MemChunks::default();
        let mut data = vec![0u8; rng.random_range(3 << 20..9 << 20)];
        fill(&mut rng, &mut data);
        let mut whole = FileState::new(params(), ExtentMap::new(), 0, ChunkPins::detached());
        for piece in data.chunks(1 << 20) {
            let off = whole.size();
            whole.write(&chunks, off, piece).unwrap();
        }
        whole.finish(&chunks).unwrap();
        let mut split = FileState::new(params(), ExtentMap::new(), 0, ChunkPins::detached());
        let cut = split.stream_cut_bytes(&chunks);
        let mut off = 0;
        while off < data.len() {
            let w = rng.random_range(cut / 2..3 * cut).min(data.len() - off);
            for r in split_requests(w, rng.random_range(1..4096)) {
                let bytes = &data[off..off + r];
                // As the mount: requests under 512 KiB are copied.
                if r >= 512 << 10 {
                    let sh = SharedBytes::from(bytes.to_vec());
                    split.write_shared(&chunks, off as u64, sh).unwrap();
                } else {
                    split.write(&chunks, off as u64, bytes).unwrap();
                }
                if r >= cut / 2 {
                    assert!(
                        split.stream.is_none(),
                        "a request of {r} bytes at {off} was copied into the stream"
                    );
                }
                off += r;
            }
        }
        split.finish(&chunks).unwrap();
        assert_eq!(split.read(&chunks, 0, data.len()).unwrap(), data);
        let extents =
            |f: &FileState| -> Vec<(u64, Extent)> { f.map.iter().map(|(o, e)| (o, *e)).collect() };
        assert_eq!(extents(&split), extents(&whole), "cut differently");
    });
}

#[test]
fn sequential_stream_is_content_defined() {
    // The same bytes written with an 8-byte insertion near the start share most chunks.
    let chunks = MemChunks::default();
    let mut data = vec![0u8; 4 << 20];
    SmallRng::seed_from_u64(1).fill_bytes(&mut data);
    let mut a = FileState::new(params(), ExtentMap::new(), 0, ChunkPins::detached());
    for piece in data.chunks(128 << 10) {
        let off = a.size();
        a.write(&chunks, off, piece).unwrap();
    }
    a.finish(&chunks).unwrap();
    let mut shifted = data[..100].to_vec();
    shifted.extend_from_slice(b"12345678");
    shifted.extend_from_slice(&data[100..]);
    let mut b = FileState::new(params(), ExtentMap::new(), 0, ChunkPins::detached());
    for piece in shifted.chunks(100_000) {
        let off = b.size();
        b.write(&chunks, off, piece).unwrap();
    }
    b.finish(&chunks).unwrap();
    let set_a: std::collections::HashSet<_> = a.map.iter().map(|(_, e)| e.chunk).collect();
    let shared = b
        .map
        .iter()
        .filter(|(_, e)| set_a.contains(&e.chunk))
        .count();
    assert!(
        shared * 100 >= b.map.len() * 95,
        "only {shared} of {} chunks shared",
        b.map.len()
    );
}

/// A small file written whole and then closed is cut on the closing thread
/// (`SMALL_STREAM`): waking a worker for its few bytes and waiting for it was most of a
/// small close's cut. A larger stream, or one continuing a cut already open, still goes to
/// the workers; the cuts are FastCDC's either way.
#[test]
fn a_small_file_is_cut_on_the_closing_thread() {
    let p = params();
    let c = AsyncChunks {
        failing: false,
        ..AsyncChunks::new(47)
    };
    let here = || c.cut_here.load(std::sync::atomic::Ordering::Relaxed);
    let mut rng = SmallRng::seed_from_u64(47);
    for (len, on_closer) in [
        (1usize, true),
        (4 << 10, true),
        (SMALL_STREAM, true),
        (SMALL_STREAM + 1, false),
        (3 << 20, false),
    ] {
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        let before = here();
        let mut f = FileState::new(p, ExtentMap::new(), 0, c.new_pins());
        retry(|| f.write(&c, 0, &data));
        c.quiesce();
        retry(|| f.finish(&c));
        let cut_here = here() - before;
        assert_eq!(
            cut_here > 0,
            on_closer,
            "{len} bytes: cut on the closing thread {cut_here} times"
        );
        let cuts: Vec<(u64, usize)> = f.map().iter().map(|(o, e)| (o, e.len as usize)).collect();
        assert_eq!(cuts, whole_cut(p, &data), "{len} bytes: FastCDC's cuts");
        assert!(
            f.read(&c, 0, len).expect("read") == data,
            "{len} bytes: read back"
        );
    }
}
