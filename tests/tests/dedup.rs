//! Deduplication across checkpoint files: an identical copy, a revision with 5% of its bytes
//! changed in a few contiguous regions (changed tensors), and a copy shifted by an 8-byte insert
//! near the start (a grown header).

use std::fs::File;
use std::io::Write;

use ckptfs_tests::{assert_file_eq, pattern, test_seed, Report, StatsReport, TestMount};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

const MIB: usize = 1024 * 1024;
const SIZE: usize = 64 * MIB;

fn write_checkpoint(m: &TestMount, name: &str, data: &[u8]) {
    let mut f = File::create(m.path(name)).expect("create");
    for piece in data.chunks(MIB) {
        f.write_all(piece).expect("write");
    }
    // close() returns once data and metadata are durable, so stats are current afterwards.
    drop(f);
}

fn show(stage: &str, s: &Report<StatsReport>) {
    println!(
        "{stage:<28} logical={} stored={} raw_chunk={} chunks={} files={} dedup_ratio={:?} compression_ratio={:?}",
        s.stats.logical_bytes,
        s.stats.stored_bytes,
        s.stats.raw_chunk_bytes,
        s.stats.chunks,
        s.stats.files,
        s.dedup_ratio,
        s.compression_ratio,
    );
}

fn pct(delta: u64) -> f64 {
    delta as f64 * 100.0 / SIZE as f64
}

#[test]
fn dedup_of_copies_revisions_and_shifted_checkpoints() {
    let seed = test_seed("dedup", 0x5eed_0002);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::new();
    let base = pattern(seed, SIZE);

    let s0 = m.stats();
    show("empty", &s0);

    write_checkpoint(&m, "ckpt-0001.bin", &base);
    let s1 = m.stats();
    show("first 64 MiB checkpoint", &s1);
    let d1 = s1.stats.stored_bytes - s0.stats.stored_bytes;
    println!(
        "first checkpoint: stored grew by {d1} bytes ({:.2}% of 64 MiB)",
        pct(d1)
    );

    write_checkpoint(&m, "ckpt-0001-copy.bin", &base);
    let s2 = m.stats();
    show("identical copy", &s2);
    let d2 = s2.stats.stored_bytes - s1.stats.stored_bytes;
    println!(
        "identical copy: stored grew by {d2} bytes ({:.3}% of 64 MiB)",
        pct(d2)
    );

    // 5 contiguous regions of 1% each, one at a random place in each fifth of the file.
    let mut revised = base.clone();
    let region = SIZE / 100;
    let slot = SIZE / 5;
    let mut regions = Vec::new();
    for k in 0..5 {
        let start = k * slot + rng.random_range(0..slot - region);
        rng.fill_bytes(&mut revised[start..start + region]);
        regions.push(start..start + region);
    }
    println!("revision changes {regions:?}");
    write_checkpoint(&m, "ckpt-0002.bin", &revised);
    let s3 = m.stats();
    show("revision (5% changed)", &s3);
    let d3 = s3.stats.stored_bytes - s2.stats.stored_bytes;
    println!(
        "5% revision: stored grew by {d3} bytes ({:.2}% of 64 MiB)",
        pct(d3)
    );

    let mut shifted = Vec::with_capacity(SIZE + 8);
    shifted.extend_from_slice(&base[..100]);
    shifted.extend_from_slice(b"HDRv2+8B");
    shifted.extend_from_slice(&base[100..]);
    write_checkpoint(&m, "ckpt-0001-shifted.bin", &shifted);
    let s4 = m.stats();
    show("8 bytes inserted at 100", &s4);
    let d4 = s4.stats.stored_bytes - s3.stats.stored_bytes;
    println!(
        "8-byte insert: stored grew by {d4} bytes ({:.2}% of 64 MiB)",
        pct(d4)
    );

    assert!(
        d1 as f64 >= 0.9 * SIZE as f64,
        "the first (incompressible) checkpoint must be stored: stored_bytes grew by only {d1}"
    );
    assert!(
        (d2 as f64) < 0.01 * SIZE as f64,
        "identical copy: stored_bytes grew by {d2} bytes ({:.3}%), want < 1% of 64 MiB",
        pct(d2)
    );
    assert!(
        (d3 as f64) < 0.10 * SIZE as f64,
        "5% revision: stored_bytes grew by {d3} bytes ({:.2}%), want < 10% of 64 MiB",
        pct(d3)
    );
    assert!(
        (d4 as f64) < 0.10 * SIZE as f64,
        "8-byte insert at offset 100: stored_bytes grew by {d4} bytes ({:.2}%), want < 10% \
         (at least 90% deduplicated)",
        pct(d4)
    );

    assert_file_eq(&m.path("ckpt-0001.bin"), &base);
    assert_file_eq(&m.path("ckpt-0001-copy.bin"), &base);
    assert_file_eq(&m.path("ckpt-0002.bin"), &revised);
    assert_file_eq(&m.path("ckpt-0001-shifted.bin"), &shifted);

    m.remount();
    let s5 = m.stats();
    show("after remount", &s5);
    // (logical_bytes, stored_bytes, raw_chunk_bytes, chunks, files)
    let core = |s: &StatsReport| {
        let s = &s.stats;
        (
            s.logical_bytes,
            s.stored_bytes,
            s.raw_chunk_bytes,
            s.chunks,
            s.files,
        )
    };
    assert_eq!(core(&s5), core(&s4), "stats changed across remount");
    assert_file_eq(&m.path("ckpt-0001-shifted.bin"), &shifted);
    assert_file_eq(&m.path("ckpt-0002.bin"), &revised);
}

/// Chunks confirmed by a cut prediction, from the daemon's stage counters: by blake3
/// (`predict`) and by fingerprint (`predict_fingerprint`).
fn predicted_chunks(s: &Report<StatsReport>) -> u64 {
    stage_count(s, "predict") + stage_count(s, "predict_fingerprint")
}

fn stage_count(s: &Report<StatsReport>, name: &str) -> u64 {
    s.stats
        .stages
        .iter()
        .find(|st| st.name == name)
        .map_or(0, |st| st.count)
}

/// Writes a checkpoint and its next one (5% of the 64 KiB blocks changed in place, 8 bytes
/// inserted, 100 KiB more), mounted with `--cuts cuts`; then, after a remount (nothing
/// learned, so cut by FastCDC alone), the same next bytes again under another name. Returns
/// the stored bytes each of the two next ones added. Every file reads back exactly.
fn next_then_the_same_bytes_fresh(cuts: &str) -> (u64, u64) {
    let seed = test_seed("dedup-predict", 0x5eed_0003);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::new();
    m.unmount();
    m.mount_with(&["--cuts", cuts]);
    let base = pattern(seed, 32 * MIB);
    write_checkpoint(&m, "step-1.bin", &base);

    let mut next = base.clone();
    for blk in next.chunks_mut(64 << 10) {
        if rng.random_range(0..20) == 0 {
            rng.fill_bytes(blk);
        }
    }
    let at = rng.random_range(0..next.len());
    next.splice(at..at, *b"inserted");
    let mut tail = vec![0u8; 100 << 10];
    rng.fill_bytes(&mut tail);
    next.extend_from_slice(&tail);

    let s0 = m.stats();
    write_checkpoint(&m, "step-2.bin", &next);
    let s1 = m.stats();
    let predicted = predicted_chunks(&s1) - predicted_chunks(&s0);
    let grew = s1.stats.stored_bytes - s0.stats.stored_bytes;
    println!(
        "--cuts {cuts}: next checkpoint: {predicted} chunks predicted of {} new chunk records; \
         stored grew {grew} bytes",
        s1.stats.chunks - s0.stats.chunks,
    );
    // 32 MiB at 64 KiB chunks is about 500 chunks; most are unchanged.
    assert!(
        predicted >= 300,
        "--cuts {cuts}: only {predicted} chunks of the next checkpoint were predicted"
    );

    m.unmount();
    m.mount_with(&["--cuts", cuts]);
    let s2 = m.stats();
    write_checkpoint(&m, "step-2-again.bin", &next);
    let s3 = m.stats();
    assert_eq!(
        predicted_chunks(&s3),
        0,
        "--cuts {cuts}: nothing was opened since the remount, so nothing is predicted"
    );
    let again = s3.stats.stored_bytes - s2.stats.stored_bytes;
    println!("--cuts {cuts}: the same bytes again, cut by content: stored grew {again} bytes");
    assert_file_eq(&m.path("step-1.bin"), &base);
    assert_file_eq(&m.path("step-2.bin"), &next);
    assert_file_eq(&m.path("step-2-again.bin"), &next);
    (grew, again)
}

/// With `--cuts content`, a next checkpoint's predicted cuts are exactly the content-defined
/// ones: the same bytes written again after a remount (cut by FastCDC alone) add no stored
/// byte. With `--cuts follow` (the default), the bytes changed in place are cut at the old
/// boundaries instead: the next checkpoint stores fewer bytes than cut by content, and the
/// same bytes written fresh store again at most what the changed regions took cut by
/// content (everything else deduplicates).
#[test]
fn changes_in_place_follow_the_old_cuts_unless_cut_by_content() {
    let (content, content_again) = next_then_the_same_bytes_fresh("content");
    assert_eq!(
        content_again, 0,
        "the content-defined cuts of the same bytes found chunks the predicted cuts did not make"
    );
    let (follow, follow_again) = next_then_the_same_bytes_fresh("follow");
    assert!(
        follow * 20 <= content * 19,
        "--cuts follow stored {follow} bytes for the next checkpoint, --cuts content {content}"
    );
    assert!(
        follow_again <= content,
        "the same bytes cut by content stored {follow_again} bytes again, more than the \
         {content} the changes took cut by content"
    );
}

/// The next checkpoint of `prev`: 5% of its 64 KiB blocks changed.
fn next_of(rng: &mut SmallRng, prev: &[u8]) -> Vec<u8> {
    let mut next = prev.to_vec();
    for blk in next.chunks_mut(64 << 10) {
        if rng.random_range(0..20) == 0 {
            rng.fill_bytes(blk);
        }
    }
    next
}

/// A chain of next checkpoints, each predicted from the one before, confirmed by the
/// fingerprints the mount took of the chunks it wrote (the first next one) and of those it
/// read back after a remount (a restart: the next one after it), and with `--confirm
/// blake3` by blake3 only. Every checkpoint reads back exactly, each kept its dedup (most
/// chunks predicted, little stored), and `check` finds the space clean.
#[test]
fn next_checkpoints_confirmed_by_fingerprint_or_blake3_read_back_exactly() {
    let seed = test_seed("dedup-confirm", 0x5eed_0004);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::new();
    let mut steps = vec![pattern(seed, 16 * MIB)];
    write_checkpoint(&m, "step-0.bin", &steps[0]);
    let mut step = |m: &mut TestMount, steps: &mut Vec<Vec<u8>>, by_fingerprint: bool| {
        let next = next_of(&mut rng, steps.last().expect("a step"));
        let name = format!("step-{}.bin", steps.len());
        let s0 = m.stats();
        write_checkpoint(m, &name, &next);
        let s1 = m.stats();
        let predicted = predicted_chunks(&s1) - predicted_chunks(&s0);
        let fingerprinted =
            stage_count(&s1, "predict_fingerprint") - stage_count(&s0, "predict_fingerprint");
        let stored = s1.stats.stored_bytes - s0.stats.stored_bytes;
        println!(
            "{name}: {predicted} chunks predicted, {fingerprinted} of them confirmed by \
             fingerprint, {stored} bytes stored"
        );
        // 16 MiB at 64 KiB chunks is about 250 chunks, 5% of the blocks changed.
        assert!(
            predicted >= 150,
            "{name}: only {predicted} chunks predicted"
        );
        if by_fingerprint {
            assert!(
                fingerprinted * 10 >= predicted * 9,
                "{name}: {fingerprinted} of {predicted} confirmed by fingerprint"
            );
        } else {
            assert_eq!(fingerprinted, 0, "{name}: --confirm blake3");
        }
        assert!(
            stored < 4 * MIB as u64,
            "{name}: {stored} bytes stored for a 5% change"
        );
        steps.push(next);
    };
    step(&mut m, &mut steps, true);
    step(&mut m, &mut steps, true);
    m.unmount();
    m.mount_with(&["--confirm", "blake3"]);
    // Opening the last checkpoint teaches its sequence (nothing else was learned).
    assert_file_eq(&m.path("step-2.bin"), &steps[2]);
    step(&mut m, &mut steps, false);
    step(&mut m, &mut steps, false);
    m.unmount();
    m.mount();
    // A restart: the last checkpoint read (its chunks fingerprinted as they are verified).
    assert_file_eq(&m.path("step-4.bin"), &steps[4]);
    step(&mut m, &mut steps, true);
    step(&mut m, &mut steps, true);
    m.remount();
    for (i, data) in steps.iter().enumerate() {
        assert_file_eq(&m.path(format!("step-{i}.bin")), data);
    }
    m.unmount();
    let backing = m.backing().to_path_buf();
    let out = m.ckptfs_ok(&[std::ffi::OsStr::new("check"), backing.as_os_str()]);
    assert!(out.contains("clean"), "{out}");
    no_cutter_failed(&m);
}

/// The daemon's log names no cutter failure. The daemon the tests run is a debug build,
/// where a chunk named by a hash that is not its bytes' (a fingerprint confirming the wrong
/// chunk) panics the cutter; the mount survives that by cutting the segment by size, so the
/// bytes read back right and only the log shows it.
fn no_cutter_failed(m: &TestMount) {
    let log = std::fs::read_to_string(m.backing().join("daemon.log")).unwrap_or_default();
    assert!(
        !log.contains("chunk cutter failed"),
        "a cutter failed: {}",
        m.log_tail()
    );
}

/// Several ranks writing their next checkpoints at once, into a new directory per step, each
/// predicted from its own previous one: the successor and fingerprint tables are shared by
/// all cutters and workers. Every rank's every step reads back exactly after a remount, the
/// later steps are confirmed by fingerprint, and no cutter failed.
#[test]
fn ranks_writing_next_checkpoints_at_once_are_confirmed_by_fingerprint() {
    const RANKS: usize = 4;
    const STEPS: usize = 3;
    let seed = test_seed("dedup-ranks", 0x5eed_0005);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::new();
    // steps[s][r]: rank r's checkpoint at step s.
    let mut steps: Vec<Vec<Vec<u8>>> = vec![(0..RANKS)
        .map(|r| pattern(seed + r as u64, 8 * MIB))
        .collect()];
    for s in 1..STEPS {
        let next = steps[s - 1].iter().map(|d| next_of(&mut rng, d)).collect();
        steps.push(next);
    }
    let mut fingerprinted = Vec::new();
    for (s, ranks) in steps.iter().enumerate() {
        std::fs::create_dir(m.path(format!("step-{s}"))).expect("mkdir");
        let s0 = m.stats();
        std::thread::scope(|sc| {
            for (r, data) in ranks.iter().enumerate() {
                let m = &m;
                sc.spawn(move || write_checkpoint(m, &format!("step-{s}/rank-{r}"), data));
            }
        });
        let s1 = m.stats();
        fingerprinted.push(
            stage_count(&s1, "predict_fingerprint") - stage_count(&s0, "predict_fingerprint"),
        );
    }
    println!("chunks confirmed by fingerprint per step: {fingerprinted:?}");
    // 8 MiB per rank at 64 KiB chunks: about 128 chunks, most of them unchanged.
    for (s, &n) in fingerprinted.iter().enumerate().skip(1) {
        assert!(
            n >= (RANKS * 80) as u64,
            "step {s}: only {n} chunks confirmed by fingerprint"
        );
    }
    m.remount();
    for (s, ranks) in steps.iter().enumerate() {
        for (r, data) in ranks.iter().enumerate() {
            assert_file_eq(&m.path(format!("step-{s}/rank-{r}")), data);
        }
    }
    no_cutter_failed(&m);
}

/// Checkpoints fsynced before their close (what careful jobs do) teach their chunk sequence
/// like any other: the fsync commits the revision (not learned there: it may grow), the close
/// then finds nothing new to commit and only seals it, and the seal is where it is learned.
/// Before, such a job's every next checkpoint was cut by content throughout.
#[test]
fn checkpoints_fsynced_before_close_are_predicted_from() {
    let seed = test_seed("dedup-fsync", 0x5eed_0006);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::new();
    let mut data = pattern(seed, 16 * MIB);
    for step in 0..3 {
        if step > 0 {
            data = next_of(&mut rng, &data);
        }
        let s0 = m.stats();
        let mut f = File::create(m.path(format!("ckpt-{step}"))).expect("create");
        for piece in data.chunks(MIB) {
            f.write_all(piece).expect("write");
        }
        f.sync_all().expect("fsync");
        drop(f);
        let s1 = m.stats();
        let predicted = predicted_chunks(&s1) - predicted_chunks(&s0);
        println!("step {step}: {predicted} chunks predicted");
        if step > 0 {
            assert!(
                predicted >= 150,
                "step {step}: only {predicted} chunks predicted"
            );
        }
    }
    assert_file_eq(&m.path("ckpt-2"), &data);
    no_cutter_failed(&m);
}
