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

/// Chunks confirmed by a cut prediction, from the daemon's stage counters.
fn predicted_chunks(s: &Report<StatsReport>) -> u64 {
    s.stats
        .stages
        .iter()
        .find(|st| st.name == "predict")
        .map_or(0, |st| st.count)
}

/// A next checkpoint is cut by predicting each chunk from the previous one's sequence (and
/// confirming it by its hash); those cuts must be exactly the content-defined ones. Shown
/// from outside: the same bytes written again after a remount (nothing learned, so cut by
/// FastCDC alone) add no chunk and no stored byte.
#[test]
fn predicted_cuts_are_the_content_defined_cuts() {
    let seed = test_seed("dedup-predict", 0x5eed_0003);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::new();
    let base = pattern(seed, 32 * MIB);
    write_checkpoint(&m, "step-1.bin", &base);

    // The next checkpoint: 5% of the 64 KiB blocks changed, 8 bytes inserted, 100 KiB more.
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
    println!(
        "next checkpoint: {predicted} chunks predicted of {} new chunk records; stored grew {} bytes",
        s1.stats.chunks - s0.stats.chunks,
        s1.stats.stored_bytes - s0.stats.stored_bytes
    );
    // 32 MiB at 64 KiB chunks is about 500 chunks; most are unchanged.
    assert!(
        predicted >= 300,
        "only {predicted} chunks of the next checkpoint were predicted"
    );

    m.remount();
    let s2 = m.stats();
    write_checkpoint(&m, "step-2-again.bin", &next);
    let s3 = m.stats();
    assert_eq!(
        predicted_chunks(&s3),
        0,
        "nothing was opened since the remount, so nothing is predicted"
    );
    assert_eq!(
        (s3.stats.chunks, s3.stats.stored_bytes),
        (s2.stats.chunks, s2.stats.stored_bytes),
        "the content-defined cuts of the same bytes found chunks the predicted cuts did not make"
    );
    assert_file_eq(&m.path("step-1.bin"), &base);
    assert_file_eq(&m.path("step-2.bin"), &next);
    assert_file_eq(&m.path("step-2-again.bin"), &next);
}
