//! The kernel source run on the CPU through the emulation shim: every block it emits must
//! decode with lz4_flex to exactly the input, its ratio must be close to lz4_flex's, and its
//! decompressor must return the input for any LZ4 block and refuse malformed ones.

use ckptfs_kernels::{BatchCodec, Emu, Error};

mod common;
use common::*;

/// Compresses `chunks` with the emulated kernel; checks that every block decodes to its chunk
/// and returns (kernel stored bytes, lz4_flex stored bytes), raw chunks counted at full size.
fn check_roundtrip(chunks: &[Vec<u8>]) -> (usize, usize) {
    let out = Emu.compress(&refs(chunks)).expect("emulated compress");
    let ours = check_blocks("emulated", chunks, &out);
    let flex = chunks
        .iter()
        .map(|c| lz4_flex::block::compress(c).len().min(c.len()))
        .sum();
    (ours, flex)
}

fn chunks_of(data: Vec<u8>) -> Vec<Vec<u8>> {
    data.chunks(CHUNK).map(|c| c.to_vec()).collect()
}

/// Ratio within 10% of lz4_flex's (the bar), where there is something to compress.
fn assert_ratio_close(kind: &str, ours: usize, flex: usize, total: usize) {
    let (r_ours, r_flex) = (ours as f64 / total as f64, flex as f64 / total as f64);
    eprintln!("{kind}: kernel ratio {r_ours:.4}, lz4_flex {r_flex:.4}");
    assert!(
        r_ours <= r_flex * 1.10 + 1e-3,
        "{kind}: kernel ratio {r_ours:.4} is more than 10% above lz4_flex's {r_flex:.4}"
    );
}

#[test]
fn random_chunks_are_stored_raw_and_never_grow() {
    let chunks = chunks_of(random(4 * CHUNK, 1));
    let (ours, _) = check_roundtrip(&chunks);
    assert_eq!(ours, 4 * CHUNK, "random data does not compress");
}

#[test]
fn float_field_decodes_and_ratio_matches_lz4_flex() {
    let chunks = chunks_of(field(6 * CHUNK, 2));
    let (ours, flex) = check_roundtrip(&chunks);
    assert_ratio_close("field", ours, flex, 6 * CHUNK);
}

#[test]
fn sparse_weights_decode_and_ratio_matches_lz4_flex() {
    let chunks = chunks_of(weights(6 * CHUNK, 3));
    let (ours, flex) = check_roundtrip(&chunks);
    assert!(ours < 6 * CHUNK / 2, "sparse weights compress");
    assert_ratio_close("sparse weights", ours, flex, 6 * CHUNK);
}

#[test]
fn text_decodes_and_ratio_matches_lz4_flex() {
    let chunks = chunks_of(text(6 * CHUNK, 4));
    let (ours, flex) = check_roundtrip(&chunks);
    assert_ratio_close("text", ours, flex, 6 * CHUNK);
}

#[test]
fn synthetic_structures_decode_and_ratio_matches_lz4_flex() {
    // Runs of any byte value, repeats at scattered offsets (some beyond LZ4's 64 KiB reach),
    // small alphabets, and chunks over 64 KiB (the table keeps 16-bit positions).
    for (i, (alpha, mode)) in [(255u8, 2u32), (255, 4), (3, 1), (255, 7), (3, 7), (1, 0)]
        .into_iter()
        .enumerate()
    {
        let chunks: Vec<Vec<u8>> = [CHUNK, CHUNK, 100_000]
            .iter()
            .enumerate()
            .map(|(j, &n)| synthetic(n, (i * 10 + j) as u64, alpha, mode))
            .collect();
        let total = chunks.iter().map(|c| c.len()).sum();
        let (ours, flex) = check_roundtrip(&chunks);
        assert_ratio_close(&format!("alpha {alpha} mode {mode}"), ours, flex, total);
    }
}

#[test]
fn zero_chunks_compress_to_almost_nothing() {
    let chunks = vec![vec![0u8; CHUNK]; 4];
    let (ours, flex) = check_roundtrip(&chunks);
    eprintln!("zeros: kernel {ours} bytes, lz4_flex {flex} bytes for 4 chunks");
    // lz4_flex stores 64 KiB of zeros in about 270 bytes; the kernel's first window of
    // literals is the only extra.
    assert!(ours < 4 * 400, "zeros: {ours} bytes for 4 chunks");
}

#[test]
fn odd_sizes_and_edges_round_trip() {
    let mut chunks = Vec::new();
    for (i, &n) in [
        1usize, 4, 11, 12, 13, 31, 32, 33, 100, 4097, 65535, 65536, 65537, 200_000,
    ]
    .iter()
    .enumerate()
    {
        // Half compressible, half random, so matches meet the end-of-block rules.
        let mut c = text(n / 2, i as u64);
        c.extend_from_slice(&random(n - n / 2, i as u64));
        chunks.push(c);
        chunks.push(vec![7u8; n]);
    }
    // A run that ends exactly at the last position a match may cover.
    let mut edge = vec![0u8; 1000];
    edge[995..].copy_from_slice(&[1, 2, 3, 4, 5]);
    chunks.push(edge);
    // Matches at the largest offset LZ4 allows, and just beyond it.
    for gap in [65535usize, 65536] {
        let head = random(64, 9);
        let mut c = head.clone();
        c.extend_from_slice(&random(gap - 64, 10));
        c.extend_from_slice(&head);
        c.extend_from_slice(&random(32, 11));
        chunks.push(c);
    }
    check_roundtrip(&chunks);
}

#[test]
fn same_input_same_bytes() {
    let chunks = chunks_of(field(3 * CHUNK, 5));
    let a = Emu.compress(&refs(&chunks)).unwrap();
    let b = Emu.compress(&refs(&chunks)).unwrap();
    for i in 0..chunks.len() {
        assert_eq!(
            a.get(i),
            b.get(i),
            "chunk {i}: output depends on scheduling"
        );
    }
}

#[test]
fn decompress_returns_the_input_for_lz4_flex_blocks() {
    let mut chunks = chunks_of(field(2 * CHUNK, 6));
    chunks.extend(chunks_of(text(2 * CHUNK, 7)));
    chunks.push(vec![0u8; CHUNK]);
    chunks.push(b"abcabcabcabcabcabcabcabcabcabcabcabcabcabcab".to_vec());
    let blocks: Vec<Vec<u8>> = chunks
        .iter()
        .map(|c| lz4_flex::block::compress(c))
        .collect();
    let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
    let lens: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
    let out = Emu.decompress(&refs, &lens).expect("emulated decompress");
    assert!(
        out == chunks.concat(),
        "decoded bytes differ from the input"
    );
}

#[test]
fn decompress_refuses_malformed_blocks() {
    let good = lz4_flex::block::compress(&text(CHUNK, 8));
    let mut bad_offset = lz4_flex::block::compress(b"0123456789012345678901234567890123456789");
    // The first sequence's offset points before the start of the output.
    let lit = (bad_offset[0] >> 4) as usize;
    assert!(lit < 15);
    bad_offset[1 + lit] = 0xff;
    bad_offset[2 + lit] = 0xff;
    let truncated = good[..good.len() / 2].to_vec();
    for (name, block, len) in [
        ("offset before the start", bad_offset, 40),
        ("truncated", truncated, CHUNK),
        ("longer than expected", good.clone(), CHUNK - 1),
        ("shorter than expected", good.clone(), CHUNK + 1),
    ] {
        let refs: Vec<&[u8]> = vec![&good, &block];
        match Emu.decompress(&refs, &[CHUNK, len]) {
            Err(Error::Corrupt { index: 1 }) => {}
            other => panic!("{name}: expected Corrupt at block 1, got {other:?}"),
        }
    }
}

#[test]
fn many_chunks_in_one_batch() {
    // More chunks than emulation threads, of mixed kinds, keep their order.
    let mut chunks = Vec::new();
    for i in 0..24u64 {
        chunks.push(match i % 3 {
            0 => text(CHUNK / 4, i),
            1 => weights(CHUNK / 4, i),
            _ => random(CHUNK / 4, i),
        });
    }
    check_roundtrip(&chunks);
}

/// The float codec's kernel, emulated, writes the very bytes of the Rust encoder for every
/// transform and plane mask, on float, integer, text, zero, random and edge-case data, odd
/// lengths and planes that need FSE-coded Huffman weights, and the zstd library decodes
/// them back to the input.
#[test]
fn float_kernel_bytes_equal_the_cpu_encoder() {
    let cases = float_cases();
    let chunks: Vec<&[u8]> = cases.iter().map(|c| c.1.as_slice()).collect();
    let plans: Vec<_> = cases.iter().map(|c| c.2).collect();
    let frames = Emu
        .float_compress(&chunks, &plans)
        .expect("emulated kernel");
    let huffman = check_float_frames("emulation", &cases, &frames);
    println!("{} frames equal, {huffman} compressed", frames.len());
    assert!(
        huffman > 20,
        "only {huffman} frames compressed: the test misses the Huffman path"
    );
}
