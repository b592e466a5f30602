//! gc without a mount: space must come back under keep-N retention, kept revisions must read
//! back exactly, dropped ones must be gone, and a dry run must change nothing.

use ckptfs_engine::format::*;
use ckptfs_engine::maintenance::gc::GcOptions;
use ckptfs_engine::space::Config;
use ckptfs_engine::space::Seal;
use ckptfs_engine::{Error, Space};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

fn temp_space(tag: &str, size: u64, config: Config) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ckptfs-gc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Space::format(&dir, size, 65536, config, false).unwrap();
    dir
}

/// A file record with a fresh history owned by inode 2.
fn new_file(space: &Space) -> InodeRecord {
    let hid = space
        .ns_write(false, |t| t.new_history(InodeId(2)))
        .unwrap();
    file_record(hid)
}

fn file_record(history: HistoryId) -> InodeRecord {
    InodeRecord {
        history,
        ..InodeRecord::new(NodeKind::File, 0o644, 0, 0)
    }
}

/// Writes `data` as the whole new content of the file (O_TRUNC + sequential writes) and
/// commits it as a complete revision.
fn write_revision(space: &Space, rec: &mut InodeRecord, data: &[u8]) -> Result<RevisionId, Error> {
    let mut f = space.files().load_file(rec)?;
    f.truncate(0);
    for piece in data.chunks(1 << 20) {
        let off = f.size();
        f.write(space.data().chunks(), off, piece)?;
    }
    f.finish(space.data().chunks())?;
    // On an error, dropping `f` releases its pins.
    space.commit_file(InodeId(2), &mut f, rec, Seal::Complete)
}

fn read_revision(space: &Space, rev: RevisionId) -> Vec<u8> {
    let f = space.files().load_revision(rev).unwrap();
    f.read(space.data().chunks(), 0, f.size() as usize).unwrap()
}

/// The scenario at engine level: 256 MiB reserved, keep 2, 50 revisions of a 64 MiB
/// checkpoint with 30% changed each time. gc runs when free space is low, as the daemon's
/// automatic gc does; no revision may fail.
#[test]
fn fifty_revisions_fit_in_256_mib_with_keep_two() {
    let dir = temp_space("fifty", 256 << 20, Config::default());
    let space = Space::open(&dir).unwrap();
    let mut rng = SmallRng::seed_from_u64(50);
    let mut data = vec![0u8; 64 << 20];
    rng.fill_bytes(&mut data);
    let mut rec = new_file(&space);
    let mut kept: Vec<(RevisionId, Vec<u8>)> = Vec::new();
    let mut gcs = 0;
    for i in 0..50 {
        if i > 0 {
            // 30% changed: three contiguous regions of 10% (rewritten tensors).
            for _ in 0..3 {
                let len = data.len() / 10;
                let at = rng.random_range(0..data.len() - len);
                rng.fill_bytes(&mut data[at..at + len]);
            }
        }
        let free_pct = space.store().free_bytes() * 100 / space.store().capacity();
        if free_pct < 50 {
            space.gc(&GcOptions::default(), &mut |_| {}).unwrap();
            gcs += 1;
        }
        let rev = write_revision(&space, &mut rec, &data)
            .unwrap_or_else(|e| panic!("revision {i} failed: {e} (free {free_pct}%)"));
        kept.push((rev, data.clone()));
        if kept.len() > 2 {
            kept.remove(0);
        }
    }
    space.gc(&GcOptions::default(), &mut |_| {}).unwrap();
    let listed = space.ns().revisions(rec.history).unwrap();
    assert_eq!(listed.len(), 2, "keep-2 leaves two revisions");
    for (rev, want) in &kept {
        assert!(
            read_revision(&space, *rev) == *want,
            "revision {} differs",
            rev.0
        );
    }
    let s = space.report().stats().unwrap();
    println!(
        "50 revisions, {gcs} gc runs: stored {} MiB, free {} MiB of {} MiB",
        s.stored_bytes >> 20,
        s.free_bytes >> 20,
        s.reserved_bytes >> 20
    );
    drop(space);
    let space = Space::open(&dir).unwrap();
    for (rev, want) in &kept {
        assert!(
            read_revision(&space, *rev) == *want,
            "after reopen, revision {} differs",
            rev.0
        );
    }
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gc_plan_matches_what_gc_does_when_revisions_share_chunks() {
    // Each revision changes 1 of 16 blocks of the one before: most chunks are named by
    // kept and dropped revisions alike, and only those the drops leave unreferenced go.
    let config = Config {
        keep_revisions: 2,
        ..Config::default()
    };
    let dir = temp_space("plan-dedup", 64 << 20, config);
    let space = Space::open(&dir).unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    // (The helpers write inode 2, so one file: a second would share its inode record.)
    let mut rec = new_file(&space);
    let mut d = vec![0u8; 1 << 20];
    rng.fill_bytes(&mut d);
    for round in 0..10 {
        let b = rng.random_range(0..16usize) * (64 << 10);
        rng.fill_bytes(&mut d[b..b + (64 << 10)]);
        write_revision(&space, &mut rec, &d).unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    let listed = space.ns().revisions(rec.history).unwrap().len() as u64;
    let before = space.report().stats().unwrap();
    let plan = space
        .gc(
            &GcOptions {
                dry_run: true,
                ..GcOptions::default()
            },
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(
        space.report().stats().unwrap(),
        before,
        "the plan changed the space"
    );
    assert_eq!(plan.revisions_dropped, listed - 2, "keep 2: {plan:?}");
    let real = space.gc(&GcOptions::default(), &mut |_| {}).unwrap();
    for (what, p, r) in [
        ("revisions", plan.revisions_dropped, real.revisions_dropped),
        ("histories", plan.histories_dropped, real.histories_dropped),
        ("inodes", plan.inodes_dropped, real.inodes_dropped),
        ("chunks", plan.chunks_freed, real.chunks_freed),
        ("bytes", plan.bytes_freed, real.bytes_freed),
    ] {
        assert_eq!(
            p, r,
            "{what}: the plan said {p}, gc did {r}\n{plan:?}\n{real:?}"
        );
    }
    // Shared chunks stayed: far fewer chunks went than the dropped revisions name.
    assert!(
        real.chunks_freed > 0 && real.chunks_freed < real.revisions_dropped * 16,
        "{real:?}"
    );
}

#[test]
fn gc_keeps_newest_n_drops_the_rest_and_dry_run_changes_nothing() {
    let config = Config {
        keep_revisions: 3,
        ..Config::default()
    };
    let dir = temp_space("keep", 64 << 20, config);
    let space = Space::open(&dir).unwrap();
    let mut rng = SmallRng::seed_from_u64(3);
    let mut rec = new_file(&space);
    let mut all = Vec::new();
    for _ in 0..8 {
        // 2 MiB each: the first four fill segment 0, which the drops leave empty.
        let mut d = vec![0u8; 2 << 20];
        rng.fill_bytes(&mut d);
        let rev = write_revision(&space, &mut rec, &d).unwrap();
        all.push((rev, d));
    }
    assert_eq!(space.ns().revisions(rec.history).unwrap().len(), 8);
    let before = space.report().stats().unwrap();
    let dry = space
        .gc(
            &GcOptions {
                dry_run: true,
                ..GcOptions::default()
            },
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(dry.revisions_dropped, 5);
    assert!(dry.chunks_freed > 0);
    assert_eq!(
        space.report().stats().unwrap(),
        before,
        "dry run changed the space"
    );
    assert_eq!(space.ns().revisions(rec.history).unwrap().len(), 8);
    let real = space.gc(&GcOptions::default(), &mut |_| {}).unwrap();
    // The dry run is the plan gc applies: on a space nobody writes to meanwhile, every
    // figure is gc's, compaction's included.
    let figures = |r: &ckptfs_engine::maintenance::gc::GcReport| {
        (
            r.revisions_dropped,
            r.histories_dropped,
            r.inodes_dropped,
            r.chunks_freed,
            r.bytes_freed,
            r.segments_freed,
            r.segments_compacted,
            r.bytes_copied,
        )
    };
    assert_eq!(figures(&real), figures(&dry), "\n{dry:?}\n{real:?}");
    assert!(dry.segments_freed > 0, "{dry:?}");
    assert_eq!(real.planned_kept, 0, "{real:?}");
    assert!(real.free_bytes_after > real.free_bytes_before, "{real:?}");
    let listed: Vec<RevisionId> = space
        .ns()
        .revisions(rec.history)
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, all[5..].iter().map(|(r, _)| *r).collect::<Vec<_>>());
    for (rev, want) in &all[5..] {
        assert!(read_revision(&space, *rev) == *want);
    }
    for (rev, _) in &all[..5] {
        assert!(
            space.ns().revision(*rev).unwrap().is_none(),
            "dropped revision still there"
        );
    }
    // A pinned revision survives even outside the policy.
    let mut opts = GcOptions::default();
    let mut d = vec![0u8; 1 << 20];
    rng.fill_bytes(&mut d);
    let pinned = all[5].0;
    write_revision(&space, &mut rec, &d).unwrap();
    opts.pinned_revisions.insert(pinned);
    space.gc(&opts, &mut |_| {}).unwrap();
    assert!(read_revision(&space, pinned) == all[5].1);
    // fsync points are not listed and are replaced by the next commit.
    let mut f = space.files().load_file(&rec).unwrap();
    f.write(space.data().chunks(), 0, b"in progress").unwrap();
    f.finish(space.data().chunks()).unwrap();
    let n = space.ns().revisions(rec.history).unwrap().len();
    space
        .commit_file(InodeId(2), &mut f, &mut rec, Seal::FsyncPoint)
        .unwrap();
    let l = space.ns().revisions(rec.history).unwrap();
    assert_eq!(l.len(), n, "an fsync point is durable but not listed");
    assert!(
        l.iter().all(|r| !r.current),
        "no listed revision is current now"
    );
    f.write(space.data().chunks(), 0, b"done!!!!!!!").unwrap();
    f.finish(space.data().chunks()).unwrap();
    space
        .commit_file(InodeId(2), &mut f, &mut rec, Seal::Complete)
        .unwrap();
    let l2 = space.ns().revisions(rec.history).unwrap();
    assert_eq!(l2.len(), n + 1, "the fsync point was replaced, not kept");
    assert!(l2.iter().all(|r| r.rec.sealed) && l2.last().unwrap().current);
    let content = space.files().load_revision(l2.last().unwrap().id).unwrap();
    assert_eq!(
        content.read(space.data().chunks(), 0, 11).unwrap(),
        b"done!!!!!!!"
    );
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Appends `data` to the file and commits the result as a complete revision.
fn append_revision(space: &Space, rec: &mut InodeRecord, data: &[u8]) -> RevisionId {
    let mut f = space.files().load_file(rec).unwrap();
    let off = f.size();
    f.write(space.data().chunks(), off, data).unwrap();
    f.finish(space.data().chunks()).unwrap();
    space
        .commit_file(InodeId(2), &mut f, rec, Seal::Complete)
        .unwrap()
}

/// (file offset, extent) of every extent of a revision, with its chunk's committed record.
fn placed_extents(space: &Space, rev: RevisionId) -> Vec<(u64, Extent, ChunkRecord)> {
    space
        .files()
        .load_map(rev)
        .unwrap()
        .iter()
        .map(|(off, e)| {
            let rec = space.store().committed_record(&e.chunk).unwrap().unwrap();
            (off, *e, rec)
        })
        .collect()
}

/// gc moves the chunks of a kept revision out of mostly-dead segments while a reader reads
/// that revision. Proves (1) chunks of the revision were moved (their records name new
/// offsets, and the bytes there verify), and (2) the reader overlapped the moves: it was
/// reading before gc committed its first moves, and read the whole revision again, from the
/// data file at the new locations, before gc returned.
#[test]
fn readers_see_moved_chunks_while_gc_compacts() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    const MIB: usize = 1 << 20;
    const READ: usize = 64 << 10;
    // The kept file is larger than the store's decoded-chunk cache, and the reader reads it
    // front to back over and over: the cache (FIFO) has let a chunk go by the time the
    // reader comes back to it, so each pass reads every chunk from the data file again.
    const KEEP_PIECES: usize = 72;
    const { assert!(KEEP_PIECES * MIB > ckptfs_engine::store::CACHE_BYTES) };
    let config = Config {
        keep_revisions: 1,
        ..Config::default()
    };
    let dir = temp_space("moving", 256 << 20, config);
    let space = Arc::new(Space::open(&dir).unwrap());
    let mut rng = SmallRng::seed_from_u64(7);
    // The kept file grows by 1 MiB per revision, each followed by 1.25 MiB of a junk file
    // that keep-1 drops: every segment ends up less than half live (a victim), and holds
    // chunks of the kept file.
    let mut rec = new_file(&space);
    let mut junk = new_file(&space);
    let mut expect = Vec::with_capacity(KEEP_PIECES * MIB);
    let mut keep = RevisionId(0);
    for _ in 0..KEEP_PIECES {
        let mut piece = vec![0u8; MIB];
        rng.fill_bytes(&mut piece);
        keep = append_revision(&space, &mut rec, &piece);
        expect.extend_from_slice(&piece);
        let mut j = vec![0u8; MIB + MIB / 4];
        rng.fill_bytes(&mut j);
        write_revision(&space, &mut junk, &j).unwrap();
    }
    let expect = Arc::new(expect);
    let before = placed_extents(&space, keep);

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (space, stop, expect, reads) =
            (space.clone(), stop.clone(), expect.clone(), reads.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let f = space.files().load_revision(keep).unwrap();
                let off = (n * READ) % expect.len();
                let got = f.read(space.data().chunks(), off as u64, READ).unwrap();
                assert!(got == expect[off..off + READ], "wrong bytes at {off}");
                n += 1;
                reads.store(n as u64, Ordering::SeqCst);
            }
        })
    };
    // Waits (polling, with a hang guard) until the reader has done `n` reads.
    let wait_reads = |n: u64, what: &str| {
        let start = Instant::now();
        while reads.load(Ordering::SeqCst) < n {
            assert!(
                !reader.is_finished(),
                "the reader stopped (panicked) {what}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "the reader did not reach {n} reads {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait_reads(1, "before gc");
    let pass = (expect.len() / READ) as u64;
    // Both files are committed as inode 2 (no namespace here), so the kept file's history is
    // not the inode's: pinned, as an open reader's revision is.
    let mut opts = GcOptions::default();
    opts.pinned_revisions.insert(keep);
    let mut at_first_move = None;
    let r = space
        .gc(&opts, &mut |p| {
            // Called after each compaction round has committed its moves: at the first, the
            // reader must read the whole revision once more while gc is still running.
            if let ckptfs_engine::maintenance::gc::GcProgress::Compact { .. } = p {
                if at_first_move.is_none() {
                    let n = reads.load(Ordering::SeqCst);
                    at_first_move = Some(n);
                    wait_reads(n + pass, "after gc's first moves");
                }
            }
        })
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    reader.join().expect("reader panicked");
    let total_reads = reads.load(Ordering::SeqCst);
    let at_first_move = at_first_move.expect("gc compacted no round");
    println!(
        "gc: {r:?}; concurrent reads: {total_reads} ({at_first_move} before the first moves \
         committed, one pass is {pass})"
    );
    assert!(
        at_first_move > 0,
        "the reader had not read before the moves"
    );
    assert!(total_reads >= at_first_move + pass);
    assert!(
        r.bytes_copied > 0 && r.segments_compacted > 0,
        "gc moved nothing: {r:?}"
    );

    // The kept revision's chunks: many moved, and each moved one verifies at its new place
    // (read from the data file, not the cache) with the bytes the revision holds there.
    let after = placed_extents(&space, keep);
    assert_eq!(before.len(), after.len());
    let mut moved = 0;
    for ((off, e, old), (off2, e2, new)) in before.iter().zip(&after) {
        assert_eq!((off, e), (off2, e2), "the extent map changed");
        if new.offset == old.offset {
            continue;
        }
        moved += 1;
        let data = space
            .store()
            .reader()
            .read_stored(&e.chunk, new)
            .unwrap()
            .verify()
            .unwrap_or_else(|err| panic!("moved chunk at {}: {err}", new.offset.0))
            .into_bytes();
        let (o, c) = (*off as usize, e.chunk_off as usize);
        assert!(
            data[c..c + e.len as usize] == expect[o..o + e.len as usize],
            "moved chunk at file offset {o} holds other bytes"
        );
    }
    println!("{moved} of {} extents' chunks moved", after.len());
    // Every segment of the kept file is a victim; a quarter is far below what one gc moves
    // (it copies as much as fits in the free space).
    assert!(
        moved * 4 >= after.len(),
        "only {moved} of {} chunks of the kept revision moved",
        after.len()
    );
    assert!(read_revision(&space, keep) == *expect);
    drop(space);
    let space = Space::open(&dir).unwrap();
    assert!(
        read_revision(&space, keep) == *expect,
        "after reopen, the kept revision differs"
    );
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `keep-age` by the engine's clock: revisions younger than the age survive a gc even past
/// `keep-revisions`, and once the clock has moved past the age the next gc drops them. The
/// clock is moved (`clock::advance`), not slept through; this test's process is its own
/// (nextest), so moving it touches no other test.
#[test]
fn keep_age_is_measured_by_the_engine_clock() {
    use ckptfs_engine::clock;
    use std::time::Duration;
    let config = Config {
        keep_revisions: 1,
        keep_age_secs: 600,
        ..Config::default()
    };
    let dir = temp_space("age", 64 << 20, config);
    let space = Space::open(&dir).unwrap();
    let mut rec = new_file(&space);
    let mut revs = Vec::new();
    for i in 0..3u8 {
        revs.push(write_revision(&space, &mut rec, &vec![i; 300_000]).unwrap());
        clock::advance(Duration::from_secs(60));
    }
    let gc = |space: &Space| space.gc(&GcOptions::default(), &mut |_| {}).unwrap();
    // All three are younger than 600 s by the engine's clock.
    assert_eq!(gc(&space).revisions_dropped, 0);
    assert_eq!(space.ns().revisions(rec.history).unwrap().len(), 3);
    // Ten minutes later the two older ones are past the age; the current one always stays.
    clock::advance(Duration::from_secs(600));
    assert_eq!(gc(&space).revisions_dropped, 2);
    let left = space.ns().revisions(rec.history).unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(read_revision(&space, revs[2]), vec![2u8; 300_000]);
    drop(space);
    let _ = std::fs::remove_dir_all(&dir);
}
