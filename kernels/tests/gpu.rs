//! The kernels on a real GPU. Where there is none (no libcuda, no NVRTC, no device) every test
//! prints `SKIPPED: no GPU: <reason>` to stderr and passes, unless `CKPTFS_REQUIRE` (a
//! comma-separated list, the one skip policy of every test) names `gpu`, which makes a
//! missing GPU a failure. Test names contain `gpu` so that the nextest override
//! shows their output.

use std::sync::OnceLock;
use std::time::Instant;

use ckptfs_kernels::gpu::{Gpu, GpuOptions, SUB_BATCH_BYTES};
use ckptfs_kernels::{BatchCodec, Compressed, Emu, Error};
use rand::Rng;

mod common;
use common::*;

fn require_gpu() -> bool {
    std::env::var("CKPTFS_REQUIRE").is_ok_and(|v| v.split(',').any(|r| r.trim() == "gpu"))
}

/// The GPU shared by the tests of this process, or `None` (after saying so) where there is
/// none. A GPU that is there but fails (kernel compile, self-test) fails the test.
fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<std::result::Result<Gpu, String>> = OnceLock::new();
    let opened = GPU.get_or_init(|| match Gpu::open(&GpuOptions::default()) {
        Ok(g) => {
            eprintln!("GPU: {}", g.describe());
            Ok(g)
        }
        Err(Error::Unavailable(reason)) => Err(reason),
        Err(e) => panic!("a GPU is there but does not work: {e}"),
    });
    match opened {
        Ok(g) => Some(g),
        Err(reason) if require_gpu() => {
            panic!("CKPTFS_REQUIRE names gpu but there is no usable GPU: {reason}")
        }
        Err(reason) => {
            eprintln!();
            eprintln!("**************************************************************");
            eprintln!("SKIPPED: no GPU: {reason}");
            eprintln!("**************************************************************");
            None
        }
    }
}

fn compress(gpu: &Gpu, what: &str, chunks: &[Vec<u8>]) -> Compressed {
    let out = gpu
        .compress(&refs(chunks))
        .unwrap_or_else(|e| panic!("{what}: GPU compress: {e}"));
    let stored = check_blocks(what, chunks, &out);
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    eprintln!(
        "{what}: {total} bytes stored as {stored} (ratio {:.4})",
        stored as f64 / total.max(1) as f64
    );
    out
}

#[test]
fn gpu_random_chunks_are_stored_raw() {
    let Some(gpu) = gpu() else { return };
    let chunks: Vec<Vec<u8>> = (0..8).map(|i| random(CHUNK, i)).collect();
    let out = compress(gpu, "random", &chunks);
    for i in 0..chunks.len() {
        assert!(out.get(i).is_none(), "random chunk {i} should be raw");
    }
}

#[test]
fn gpu_float_data_round_trips() {
    let Some(gpu) = gpu() else { return };
    let f: Vec<Vec<u8>> = (0..6).map(|i| field(CHUNK, 100 + i)).collect();
    compress(gpu, "f64 field", &f);
    let w: Vec<Vec<u8>> = (0..6).map(|i| weights(CHUNK, 200 + i)).collect();
    let out = compress(gpu, "f32 weights", &w);
    for i in 0..w.len() {
        assert!(
            out.get(i).is_some(),
            "sparse weights chunk {i} should compress"
        );
    }
    let t: Vec<Vec<u8>> = (0..6).map(|i| text(CHUNK, 300 + i)).collect();
    let out = compress(gpu, "text", &t);
    for i in 0..t.len() {
        assert!(out.get(i).is_some(), "text chunk {i} should compress");
    }
}

#[test]
fn gpu_zero_chunks_and_odd_sizes() {
    let Some(gpu) = gpu() else { return };
    let zeros: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; CHUNK]).collect();
    let out = compress(gpu, "zeros", &zeros);
    for i in 0..zeros.len() {
        let b = out.get(i).expect("a zero chunk compresses");
        assert!(b.len() < 1024, "zero chunk {i}: {} bytes", b.len());
    }
    let mut chunks = Vec::new();
    for (i, &n) in [0usize, 1, 13, 100, 65536, 65537, 200_000]
        .iter()
        .enumerate()
    {
        chunks.push(vec![0u8; n]);
        chunks.push(weights(n, 400 + i as u64));
        chunks.push(random(n, 500 + i as u64));
        let mut half = text(n / 2, 600 + i as u64);
        half.extend_from_slice(&random(n - n / 2, 700 + i as u64));
        chunks.push(half);
    }
    let out = compress(gpu, "odd sizes", &chunks);
    assert!(out.get(0).is_none(), "an empty chunk is stored raw");
    for (i, c) in chunks.iter().enumerate() {
        if c.len() >= 65536 && c.iter().all(|&b| b == 0) {
            assert!(out.get(i).is_some(), "chunk {i}: zeros compress");
        }
    }
}

#[test]
fn gpu_output_equals_the_emulation() {
    let Some(gpu) = gpu() else { return };
    let mut chunks = vec![
        field(CHUNK, 1),
        weights(CHUNK, 2),
        text(CHUNK, 3),
        random(CHUNK, 4),
        vec![0u8; CHUNK],
    ];
    for (i, &n) in [1usize, 13, 100, 4097, 65537].iter().enumerate() {
        let mut c = text(n / 2, 800 + i as u64);
        c.extend_from_slice(&random(n - n / 2, 900 + i as u64));
        chunks.push(c);
    }
    let ours = gpu.compress(&refs(&chunks)).expect("GPU compress");
    let emu = Emu.compress(&refs(&chunks)).expect("emulated compress");
    for (i, c) in chunks.iter().enumerate() {
        assert!(
            ours.get(i) == emu.get(i),
            "chunk {i} ({} bytes): GPU and emulation differ ({:?} vs {:?} bytes)",
            c.len(),
            ours.get(i).map(<[u8]>::len),
            emu.get(i).map(<[u8]>::len)
        );
    }
}

#[test]
fn gpu_decompresses_lz4_flex_blocks() {
    let Some(gpu) = gpu() else { return };
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for i in 0..4 {
        chunks.push(field(CHUNK, 10 + i));
        chunks.push(weights(CHUNK, 20 + i));
        chunks.push(text(CHUNK, 30 + i));
        chunks.push(random(CHUNK, 40 + i));
    }
    chunks.push(vec![0u8; 200_000]);
    chunks.push(b"abcabcabcabcabcabcabcabcabcabcabcabcabcabcab".to_vec());
    chunks.push(vec![9u8; 1]);
    chunks.push(Vec::new());
    let blocks: Vec<Vec<u8>> = chunks
        .iter()
        .map(|c| lz4_flex::block::compress(c))
        .collect();
    let lens: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
    let out = gpu
        .decompress(&refs(&blocks), &lens)
        .expect("GPU decompress");
    assert!(
        out == chunks.concat(),
        "decoded bytes differ from the input"
    );

    // And the GPU's own blocks.
    let packed = gpu.compress(&refs(&chunks)).expect("GPU compress");
    let (mut own, mut own_lens, mut expect) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in chunks.iter().enumerate() {
        if let Some(b) = packed.get(i) {
            own.push(b);
            own_lens.push(c.len());
            expect.extend_from_slice(c);
        }
    }
    let out = gpu.decompress(&own, &own_lens).expect("GPU decompress");
    assert!(out == expect, "GPU blocks decode on the GPU to other bytes");
}

#[test]
fn gpu_refuses_corrupt_blocks() {
    let Some(gpu) = gpu() else { return };
    let chunks: Vec<Vec<u8>> = (0..6).map(|i| text(CHUNK, 50 + i)).collect();
    let good: Vec<Vec<u8>> = chunks
        .iter()
        .map(|c| lz4_flex::block::compress(c))
        .collect();
    let mut bad_offset = lz4_flex::block::compress(b"0123456789012345678901234567890123456789");
    // The first sequence's offset points before the start of the output.
    let lit = (bad_offset[0] >> 4) as usize;
    assert!(lit < 15);
    bad_offset[1 + lit] = 0xff;
    bad_offset[2 + lit] = 0xff;
    let truncated = good[3][..good[3].len() / 2].to_vec();
    let cases: [(&str, Vec<u8>, usize); 5] = [
        ("offset before the start", bad_offset, 40),
        ("truncated", truncated, CHUNK),
        ("longer than expected", good[3].clone(), CHUNK - 1),
        ("shorter than expected", good[3].clone(), CHUNK + 1),
        ("garbage", random(5000, 60), CHUNK),
    ];
    for (name, block, len) in cases {
        let mut blocks = good.clone();
        blocks[3] = block;
        let mut lens = vec![CHUNK; blocks.len()];
        lens[3] = len;
        match gpu.decompress(&refs(&blocks), &lens) {
            Err(Error::Corrupt { index: 3 }) => {}
            other => panic!(
                "{name}: expected Corrupt at block 3, got {:?}",
                other.map(|v| v.len())
            ),
        }
    }
    // Two bad blocks: the first is reported.
    let mut blocks = good.clone();
    blocks[1] = random(100, 61);
    blocks[4] = random(100, 62);
    match gpu.decompress(&refs(&blocks), &[CHUNK; 6]) {
        Err(Error::Corrupt { index: 1 }) => {}
        other => panic!(
            "expected Corrupt at block 1, got {:?}",
            other.map(|v| v.len())
        ),
    }

    // Bit flips: the GPU agrees with the emulation, and where it decodes, with lz4_flex.
    const SMALL: usize = 4096;
    let mut r = rng(63);
    let base = lz4_flex::block::compress(&chunks[0][..SMALL]);
    let g0 = lz4_flex::block::compress(&chunks[1][..SMALL]);
    let g2 = lz4_flex::block::compress(&chunks[2][..SMALL]);
    for round in 0..64 {
        let mut b = base.clone();
        for _ in 0..1 + round % 4 {
            let at = r.random_range(0..b.len());
            b[at] ^= 1 << r.random_range(0..8);
        }
        let blocks: Vec<&[u8]> = vec![&g0, &b, &g2];
        let lens = [SMALL; 3];
        let ours = gpu.decompress(&blocks, &lens);
        let emu = Emu.decompress(&blocks, &lens);
        match (&ours, &emu) {
            (Err(Error::Corrupt { index: 1 }), Err(Error::Corrupt { index: 1 })) => {}
            (Ok(o), Ok(e)) => {
                assert!(
                    o == e,
                    "round {round}: GPU and emulation decode differently"
                );
                assert!(o[..SMALL] == chunks[1][..SMALL] && o[2 * SMALL..] == chunks[2][..SMALL]);
                if let Ok(flex) = lz4_flex::block::decompress(&b, SMALL) {
                    assert!(
                        o[SMALL..2 * SMALL] == flex[..],
                        "round {round}: decodes differently from lz4_flex"
                    );
                }
            }
            _ => panic!(
                "round {round}: GPU {:?} but emulation {:?}",
                ours.as_ref().map(Vec::len),
                emu.as_ref().map(Vec::len)
            ),
        }
    }
}

#[test]
fn gpu_large_batch_keeps_order_across_slots() {
    let Some(gpu) = gpu() else { return };
    // More than two sub-batches of 64 KiB chunks, each chunk different, and one chunk larger
    // than a sub-batch in the middle.
    let n = (2 * SUB_BATCH_BYTES + SUB_BATCH_BYTES / 2) / CHUNK;
    let mut chunks: Vec<Vec<u8>> = Vec::with_capacity(n + 1);
    for i in 0..n as u64 {
        chunks.push(match i % 4 {
            0 => field(CHUNK, 1000 + i),
            1 => weights(CHUNK, 1000 + i),
            2 => random(CHUNK, 1000 + i),
            _ => {
                let mut c = weights(CHUNK / 2, 1000 + i);
                c.extend_from_slice(&i.to_le_bytes().repeat(CHUNK / 16));
                c
            }
        });
        if i as usize == n / 2 {
            chunks.push(weights(SUB_BATCH_BYTES + 12_345, 999));
        }
    }
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    assert!(total > 2 * SUB_BATCH_BYTES);

    let t = Instant::now();
    let out = gpu.compress(&refs(&chunks)).expect("GPU compress");
    let secs = t.elapsed().as_secs_f64();
    let kernel = gpu.last_kernel_seconds();
    eprintln!(
        "compress {} MiB: {:.0} MiB/s end to end, {:.0} MiB/s in the kernels",
        total >> 20,
        total as f64 / secs / (1 << 20) as f64,
        total as f64 / kernel.max(1e-9) / (1 << 20) as f64
    );
    check_blocks("large batch", &chunks, &out);

    let (mut blocks, mut lens, mut expect) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in chunks.iter().enumerate() {
        if let Some(b) = out.get(i) {
            blocks.push(b);
            lens.push(c.len());
            expect.extend_from_slice(c);
        }
    }
    assert!(expect.len() > 2 * SUB_BATCH_BYTES);
    let t = Instant::now();
    let back = gpu.decompress(&blocks, &lens).expect("GPU decompress");
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "decompress {} MiB: {:.0} MiB/s end to end, {:.0} MiB/s in the kernels",
        expect.len() >> 20,
        expect.len() as f64 / secs / (1 << 20) as f64,
        expect.len() as f64 / gpu.last_kernel_seconds().max(1e-9) / (1 << 20) as f64
    );
    assert!(back == expect, "decoded large batch differs from the input");
}

#[test]
fn gpu_open_reports_what_is_missing() {
    let opts = GpuOptions {
        device: 0,
        lib_dir: Some("/nonexistent/ckptfs-cuda".into()),
        ..Default::default()
    };
    match Gpu::open(&opts) {
        Ok(g) => eprintln!(
            "GPU with a bad --cuda-lib-dir still opens: {}",
            g.describe()
        ),
        Err(Error::Unavailable(reason)) => {
            eprintln!("SKIPPED: no GPU: {reason}");
            assert!(!require_gpu(), "CKPTFS_REQUIRE names gpu but: {reason}");
            assert!(
                reason.contains("no CUDA device")
                    || (reason.contains("--cuda-lib-dir")
                        && reason.contains("CKPTFS_CUDA_LIB_DIR")
                        && reason.contains("/nonexistent/ckptfs-cuda")),
                "the reason says what is missing and where it looked: {reason}"
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
    if gpu().is_some() {
        let opts = GpuOptions {
            device: 1000,
            ..Default::default()
        };
        match Gpu::open(&opts) {
            Err(Error::Unavailable(reason)) => assert!(reason.contains("1000"), "{reason}"),
            other => panic!("device 1000: {:?}", other.map(|g| g.describe())),
        }
    }
    let empty: [&[u8]; 0] = [];
    if let Some(gpu) = gpu() {
        assert!(gpu.compress(&empty).unwrap().is_empty());
        assert!(gpu.decompress(&empty, &[]).unwrap().is_empty());
        assert!(matches!(
            gpu.decompress(&[b"x".as_slice()], &[]),
            Err(Error::Invalid(_))
        ));
    }
}

/// The float codec's kernel on the GPU writes the very bytes of the Rust encoder (and of the
/// emulation, which CI checks) for every transform, plane mask and edge case.
#[test]
fn gpu_float_kernel_equals_the_cpu_encoder() {
    let Some(gpu) = gpu() else { return };
    let cases = float_cases();
    let chunks: Vec<&[u8]> = cases.iter().map(|c| c.1.as_slice()).collect();
    let plans: Vec<_> = cases.iter().map(|c| c.2).collect();
    let frames = gpu
        .float_compress(&chunks, &plans)
        .expect("GPU float kernel");
    let huffman = check_float_frames("GPU", &cases, &frames);
    eprintln!(
        "GPU float kernel: {} frames equal the CPU's, {huffman} compressed",
        frames.len()
    );
}
