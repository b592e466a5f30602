//! The store's GPU compression stage, run with the CPU emulation of the CUDA kernels (the
//! same kernel source a GPU runs): chunks of several files written at once are compressed in
//! shared batches, stored as plain LZ4 blocks, and read back by the CPU decoder after a
//! reopen without any GPU. A GPU that fails at run time costs nothing but speed.

use ckptfs_engine::format::*;
use ckptfs_engine::space::Config;
use ckptfs_engine::space::Seal;
use ckptfs_engine::Space;
use ckptfs_kernels::{BatchCodec, Compressed, Emu};
use rand::{Rng, RngCore, SeedableRng};
use std::sync::Arc;

fn temp_space(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ckptfs-gpu-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Space::format(&dir, 256 << 20, 65536, Config::default(), false).unwrap();
    dir
}

/// Half text-like (compresses), half random (stored raw), in 16 KiB stretches.
fn checkpoint(seed: u64, len: usize) -> Vec<u8> {
    let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(len);
    let mut i = 0u64;
    while v.len() < len {
        if (v.len() / (16 << 10)) % 2 == 0 {
            v.extend_from_slice(
                format!("rank {seed} step {i:>8} loss {:.4}\n", r.random::<f64>()).as_bytes(),
            );
            i += 1;
        } else {
            let mut b = [0u8; 4096];
            r.fill_bytes(&mut b);
            v.extend_from_slice(&b);
        }
    }
    v.truncate(len);
    v
}

fn write_file(space: &Space, ino: u64, data: &[u8]) -> RevisionId {
    let hid = space
        .ns_write(false, |t| t.new_history(InodeId(ino)))
        .unwrap();
    let mut rec = InodeRecord {
        history: hid,
        ..InodeRecord::new(NodeKind::File, 0o644, 0, 0)
    };
    let mut f = space.files().load_file(&rec).unwrap();
    for piece in data.chunks(256 << 10) {
        let off = f.size();
        f.write(space.data().chunks(), off, piece).unwrap();
    }
    f.finish(space.data().chunks()).unwrap();
    space
        .commit_file(InodeId(ino), &mut f, &mut rec, Seal::Complete)
        .unwrap()
}

fn read_revision(space: &Space, rev: RevisionId) -> Vec<u8> {
    let f = space.files().load_revision(rev).unwrap();
    f.read(space.data().chunks(), 0, f.size() as usize).unwrap()
}

fn stage(space: &Space, name: &str) -> (u64, u64) {
    let s = space.report().stats().unwrap();
    let t = s.stages.iter().find(|t| t.name == name).unwrap();
    (t.count, t.bytes)
}

#[test]
fn files_written_at_once_share_gpu_batches_and_read_back_without_a_gpu() {
    let dir = temp_space("emu");
    let data: Vec<Vec<u8>> = (0..3).map(|i| checkpoint(i, 768 << 10)).collect();
    let revs = {
        let space = Space::open(&dir).unwrap();
        space.store().set_workers(2);
        space.store().set_batch_codec(Some(Arc::new(Emu)));
        let revs: Vec<RevisionId> = std::thread::scope(|s| {
            let hs: Vec<_> = data
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let space = &space;
                    s.spawn(move || write_file(space, 10 + i as u64, d))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (batches, bytes) = stage(&space, "gpu");
        let total: usize = data.iter().map(|d| d.len()).sum();
        assert_eq!(
            bytes as usize, total,
            "every new chunk went through the GPU stage"
        );
        assert!(batches >= 1);
        eprintln!(
            "{batches} GPU batches for {} chunks of 3 files",
            stage(&space, "hash").0
        );
        let (_, compressed) = stage(&space, "compress");
        assert_eq!(compressed, 0, "nothing was compressed on the CPU");
        let st = space.report().stats().unwrap();
        assert!(
            st.stored_bytes < st.raw_chunk_bytes * 3 / 4,
            "the text halves compress: stored {} of {}",
            st.stored_bytes,
            st.raw_chunk_bytes
        );

        // The same content again: dedup hits never reach the GPU.
        write_file(&space, 20, &data[0]);
        assert_eq!(stage(&space, "gpu").1 as usize, total);
        revs
    };
    // Reopened with no batch codec: the CPU decodes what the kernels wrote.
    let space = Space::open(&dir).unwrap();
    for (rev, d) in revs.iter().zip(&data) {
        assert!(
            read_revision(&space, *rev) == *d,
            "revision {rev:?} reads back"
        );
    }
    let report = ckptfs_engine::maintenance::check::check(&space, &mut |_, _| {}).unwrap();
    // (The test's files have no directory entries, so only the data checks apply.)
    assert!(
        report.damaged.is_empty(),
        "check finds no damage: {report:?}"
    );
    assert_eq!(
        report.chunks_verified, report.chunks,
        "every chunk verified"
    );
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A GPU that fails (driver error, device lost).
struct Broken;

impl BatchCodec for Broken {
    fn describe(&self) -> String {
        "a broken GPU".into()
    }
    fn compress(&self, _: &[&[u8]]) -> ckptfs_kernels::Result<Compressed> {
        Err(ckptfs_kernels::Error::Cuda("device lost".into()))
    }
    fn decompress(&self, _: &[&[u8]], _: &[usize]) -> ckptfs_kernels::Result<Vec<u8>> {
        Err(ckptfs_kernels::Error::Cuda("device lost".into()))
    }
}

/// A GPU codec that panics (a bug in a binding).
struct Panics;

impl BatchCodec for Panics {
    fn describe(&self) -> String {
        "a panicking GPU codec".into()
    }
    fn compress(&self, _: &[&[u8]]) -> ckptfs_kernels::Result<Compressed> {
        panic!("injected panic in the GPU codec")
    }
    fn decompress(&self, _: &[&[u8]], _: &[usize]) -> ckptfs_kernels::Result<Vec<u8>> {
        panic!("injected panic in the GPU codec")
    }
}

#[test]
fn a_failing_gpu_falls_back_to_the_cpu_and_loses_nothing() {
    for (i, codec) in [
        Arc::new(Broken) as Arc<dyn BatchCodec>,
        Arc::new(Panics) as Arc<dyn BatchCodec>,
    ]
    .into_iter()
    .enumerate()
    {
        let dir = temp_space(&format!("broken{i}"));
        let data = checkpoint(7, 1 << 20);
        let space = Space::open(&dir).unwrap();
        space.store().set_workers(2);
        space.store().set_batch_codec(Some(codec));
        let rev = write_file(&space, 10, &data);
        let (_, cpu) = stage(&space, "compress");
        assert_eq!(cpu as usize, data.len(), "the CPU compressed every chunk");
        assert!(read_revision(&space, rev) == data);
        drop(space);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
