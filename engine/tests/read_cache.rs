//! The chunk store's read path without a mount: chunks read together are verified where
//! they were read and shared from that buffer (no copy), and the memory it keeps (cache and
//! spare read buffers) stays within its bounds and goes when reads stop.

use ckptfs_engine::format::*;
use ckptfs_engine::space::{Config, Seal};
use ckptfs_engine::store::{CACHE_BYTES, SPARE_READ_BUFS, SPARE_READ_BUF_BYTES};
use ckptfs_engine::Space;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

const MIB: usize = 1 << 20;

fn temp_space(tag: &str, size: u64) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ckptfs-rc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Space::format(&dir, size, 65536, Config::default(), false).unwrap();
    dir
}

/// Commits `data` as a new file's first revision; returns the revision's extents.
fn write_file(space: &Space, data: &[u8]) -> Vec<(u64, Extent)> {
    let hid = space
        .ns_write(false, |t| t.new_history(InodeId(2)))
        .unwrap();
    let mut rec = InodeRecord {
        history: hid,
        ..InodeRecord::new(NodeKind::File, 0o644, 0, 0)
    };
    let mut f = space.files().load_file(&rec).unwrap();
    for piece in data.chunks(MIB) {
        let off = f.size();
        f.write(space.data().chunks(), off, piece).unwrap();
    }
    f.finish(space.data().chunks()).unwrap();
    let rev = space
        .commit_file(InodeId(2), &mut f, &mut rec, Seal::Complete)
        .unwrap();
    let map = space.files().load_map(rev).unwrap();
    map.iter().map(|(o, e)| (o, *e)).collect()
}

/// Random (stored raw) and compressible (stored LZ4) parts, interleaved in 1 MiB pieces.
fn mixed_data(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    for (i, piece) in data.chunks_mut(MIB).enumerate() {
        if i % 2 == 0 {
            rng.fill_bytes(piece);
        } else {
            for (j, b) in piece.iter_mut().enumerate() {
                *b = (j / 512 % 7) as u8;
            }
        }
    }
    data
}

#[test]
fn chunks_read_together_come_back_verified_and_raw_ones_uncopied() {
    let dir = temp_space("shared", 256 << 20);
    let space = Space::open(&dir).unwrap();
    let data = mixed_data(8 * MIB, 1);
    let extents = write_file(&space, &data);
    // Read from the data file, not from what the write left in memory.
    drop(space);
    let space = Space::open(&dir).unwrap();
    let hashes: Vec<ChunkHash> = extents.iter().map(|(_, e)| e.chunk).collect();
    let got = space.store().get_many(&hashes).unwrap();
    let (mut shared, mut own) = (0, 0);
    for ((off, e), bytes) in extents.iter().zip(&got) {
        let want = &data[*off as usize..*off as usize + e.len as usize];
        assert_eq!(
            &bytes[e.chunk_off as usize..e.chunk_off as usize + e.len as usize],
            want,
            "chunk at file offset {off}"
        );
        // A chunk that lies in a larger read's buffer was not copied out of it.
        if bytes.owner_len() > bytes.len() {
            shared += 1;
        } else {
            own += 1;
        }
    }
    assert!(shared > 0, "no raw chunk was shared from its read buffer");
    assert!(
        own > 0,
        "no compressed chunk was decoded into a buffer of its own"
    );
    // One raw chunk alone fills little of its read buffer: copied out, not kept in it.
    drop(got);
    drop(space);
    let space = Space::open(&dir).unwrap();
    // A chunk wholly inside a random MiB (stored raw).
    let (raw_at, _) = extents
        .iter()
        .enumerate()
        .find(|(_, (off, e))| {
            let (first, last) = (
                *off as usize / MIB,
                (*off as usize + e.len as usize - 1) / MIB,
            );
            first % 2 == 0 && first == last && e.chunk_off == 0
        })
        .unwrap();
    let one = space.store().get_many(&hashes[raw_at..=raw_at]).unwrap();
    assert_eq!(
        one[0].owner_len(),
        one[0].len(),
        "a lone chunk keeps a whole read buffer"
    );
    let got = space.store().get_many(&hashes).unwrap();
    // Read again: from the cache now, the same bytes.
    let again = space.store().get_many(&hashes).unwrap();
    for (a, b) in got.iter().zip(&again) {
        assert_eq!(&a[..], &b[..]);
    }
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn read_memory_stays_bounded_and_spare_buffers_go_when_reads_stop() {
    let dir = temp_space("bounded", 512 << 20);
    let space = Space::open(&dir).unwrap();
    // Three times the cache, incompressible: every chunk keeps a read buffer alive.
    let len = 3 * CACHE_BYTES;
    let mut data = vec![0u8; len];
    SmallRng::seed_from_u64(2).fill_bytes(&mut data);
    let extents = write_file(&space, &data);
    drop(space);
    let space = Space::open(&dir).unwrap();
    let store = space.store();
    let (mut peak_cache, mut peak_spare) = (0, 0);
    // A restart's pattern: read ahead on the store's read threads, then read in order.
    for group in extents.chunks(64) {
        store
            .reader()
            .prefetch(group.iter().map(|(_, e)| e.chunk).collect());
    }
    let mut read = 0usize;
    for group in extents.chunks(16) {
        let hashes: Vec<ChunkHash> = group.iter().map(|(_, e)| e.chunk).collect();
        let got = store.get_many(&hashes).unwrap();
        for ((off, e), bytes) in group.iter().zip(&got) {
            assert_eq!(
                &bytes[e.chunk_off as usize..][..e.len as usize],
                &data[*off as usize..][..e.len as usize]
            );
            read += e.len as usize;
        }
        drop(got);
        let (cache, spare) = store.reader().read_memory();
        peak_cache = peak_cache.max(cache);
        peak_spare = peak_spare.max(spare);
    }
    assert_eq!(read, len);
    assert!(
        peak_cache > 0 && peak_cache <= CACHE_BYTES,
        "cache {peak_cache}"
    );
    assert!(
        peak_spare <= SPARE_READ_BUFS * SPARE_READ_BUF_BYTES,
        "spare read buffers {peak_spare}"
    );
    // Reads stopped: the first call sees the reads, the second frees the spares.
    store.reader().release_idle_read_buffers();
    store.reader().release_idle_read_buffers();
    assert_eq!(store.reader().read_memory().1, 0);
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}
