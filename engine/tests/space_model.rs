//! Engine tests without a mount: random writes and commits to several files of a real backing
//! space, checked against a byte-vector model after every reopen, plus the space's own
//! invariants (refcounts, stored-bytes accounting, no overlapping chunk extents, dedup).

use ckptfs_engine::catalog::tables as meta;
use ckptfs_engine::format::*;
use ckptfs_engine::space::Config;
use ckptfs_engine::space::Seal;
use ckptfs_engine::{Error, Space};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use redb::{ReadableDatabase, ReadableTable};
use std::collections::HashMap;
use std::path::PathBuf;

fn temp_space(tag: &str, size: u64) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ckptfs-engine-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Space::format(&dir, size, 4096, Config::default(), false).unwrap();
    dir
}

fn file_record() -> InodeRecord {
    InodeRecord::new(NodeKind::File, 0o644, 0, 0)
}

/// Checks what must hold of any committed space.
fn check_space(space: &Space) {
    let txn = space.catalog().raw().begin_read().unwrap();
    let chunks = txn.open_table(meta::CHUNKS).unwrap();
    let extents = txn.open_table(meta::EXTENTS).unwrap();
    let free: std::collections::HashSet<u64> = txn
        .open_table(meta::FREE)
        .unwrap()
        .iter()
        .unwrap()
        .map(|i| i.unwrap().0.value())
        .collect();
    let seg = space.superblock().segment_bytes as u64;
    let mut refs: HashMap<[u8; 32], u64> = HashMap::new();
    for e in extents.iter().unwrap() {
        let e = Extent::decode(e.unwrap().1.value()).unwrap();
        *refs.entry(e.chunk.0).or_default() += 1;
    }
    let mut spans = Vec::new();
    let mut live = 0usize;
    for c in chunks.iter().unwrap() {
        let (k, v) = c.unwrap();
        let r = ChunkRecord::decode(v.value()).unwrap();
        let key: [u8; 32] = k.value().try_into().unwrap();
        assert_eq!(
            refs.get(&key).copied().unwrap_or(0),
            r.refs,
            "refcount of a chunk"
        );
        let s0 = r.offset.0 / seg;
        assert_eq!(
            s0,
            (r.offset.0 + r.stored_len as u64 - 1) / seg,
            "chunk crosses segments"
        );
        assert!(!free.contains(&s0), "committed chunk in a free segment");
        if r.refs > 0 {
            live += 1;
        }
        spans.push((r.offset.0, r.offset.0 + r.stored_len as u64));
    }
    assert_eq!(
        refs.len(),
        live,
        "chunks with references differ from the chunks extents name"
    );
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "chunk extents overlap in the data file: {w:?}"
        );
    }
}

#[test]
fn commits_survive_reopen_and_keep_invariants() {
    for seed in 0..6u64 {
        let r = std::panic::catch_unwind(|| run(seed));
        if r.is_err() {
            panic!("space model failed with seed {seed}");
        }
    }
}

fn run(seed: u64) {
    let dir = temp_space(&format!("model{seed}"), 64 << 20);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut space = Space::open(&dir).unwrap();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut recs: HashMap<u64, InodeRecord> = HashMap::new();
    // A pool of blocks reused across files and revisions, so dedup has something to find.
    let pool: Vec<Vec<u8>> = (0..8)
        .map(|_| {
            let mut b = vec![0u8; 30_000];
            rng.fill_bytes(&mut b);
            b
        })
        .collect();
    let mut committed_bytes = 0u64;
    for step in 0..60 {
        let ino = rng.random_range(2..6u64);
        let rec = recs.entry(ino).or_insert_with(|| InodeRecord {
            history: HistoryId(ino),
            ..file_record()
        });
        let mut file = space.files().load_file(rec).unwrap();
        let content = model.entry(ino).or_default();
        for _ in 0..rng.random_range(1..6) {
            let data = pool[rng.random_range(0..pool.len())].clone();
            let off = if rng.random_bool(0.5) {
                content.len() as u64
            } else {
                rng.random_range(0..content.len() as u64 + 1)
            };
            file.write(space.data().chunks(), off, &data).unwrap();
            let end = off as usize + data.len();
            if content.len() < end {
                content.resize(end, 0);
            }
            content[off as usize..end].copy_from_slice(&data);
        }
        if rng.random_bool(0.2) {
            let n = rng.random_range(0..content.len() as u64 + 1);
            file.truncate(n);
            content.truncate(n as usize);
        }
        file.finish(space.data().chunks()).unwrap();
        space
            .commit_file(InodeId(ino), &mut file, rec, Seal::Complete)
            .unwrap();
        committed_bytes += file.size();
        if step % 10 == 9 {
            drop(space);
            space = Space::open(&dir).unwrap();
            check_space(&space);
            for (ino, want) in &model {
                let rec = space.ns().get_inode(InodeId(*ino)).unwrap().unwrap();
                let f = space.files().load_file(&rec).unwrap();
                assert_eq!(
                    &f.read(space.data().chunks(), 0, want.len() + 1).unwrap(),
                    want
                );
            }
        }
    }
    let s = space.report().stats().unwrap();
    // Every revision is kept, and all content comes from 8 blocks of 30 KB: the distinct
    // chunk bytes must be a small fraction of everything committed.
    assert!(
        s.raw_chunk_bytes * 3 < committed_bytes,
        "repeated blocks were not deduplicated: {} distinct of {committed_bytes} committed",
        s.raw_chunk_bytes
    );
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupted_chunk_is_an_error_not_wrong_bytes() {
    let dir = temp_space("corrupt", 32 << 20);
    let space = Space::open(&dir).unwrap();
    let mut a = vec![0u8; 200_000];
    let mut b = vec![0u8; 200_000];
    SmallRng::seed_from_u64(9).fill_bytes(&mut a);
    SmallRng::seed_from_u64(10).fill_bytes(&mut b);
    let mut ra = InodeRecord {
        history: HistoryId(1),
        ..file_record()
    };
    let mut rb = InodeRecord {
        history: HistoryId(2),
        ..file_record()
    };
    for (ino, data, rec) in [(2, &a, &mut ra), (3, &b, &mut rb)] {
        let mut f = space.files().load_file(rec).unwrap();
        f.write(space.data().chunks(), 0, data).unwrap();
        f.finish(space.data().chunks()).unwrap();
        space
            .commit_file(InodeId(ino), &mut f, rec, Seal::Complete)
            .unwrap();
    }
    drop(space);
    // Damage one byte inside file a's first chunk: it starts at data offset 0.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(DATA_FILE))
            .unwrap();
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, 100).unwrap();
        byte[0] ^= 0x55;
        f.write_all_at(&byte, 100).unwrap();
    }
    let space = Space::open(&dir).unwrap();
    let fa = space
        .files()
        .load_file(&space.ns().get_inode(InodeId(2)).unwrap().unwrap())
        .unwrap();
    match fa.read(space.data().chunks(), 0, 1000) {
        Err(Error::Corrupt(_)) => {}
        other => panic!(
            "expected a corruption error, got {:?}",
            other.map(|v| v.len())
        ),
    }
    let fb = space
        .files()
        .load_file(&space.ns().get_inode(InodeId(3)).unwrap().unwrap())
        .unwrap();
    assert_eq!(fb.read(space.data().chunks(), 0, b.len()).unwrap(), b);
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn full_space_gives_no_space_and_keeps_committed_data() {
    let dir = temp_space("full", 16 << 20);
    let space = Space::open(&dir).unwrap();
    let mut first = vec![0u8; 6 << 20];
    SmallRng::seed_from_u64(1).fill_bytes(&mut first);
    let mut rec = InodeRecord {
        history: HistoryId(1),
        ..file_record()
    };
    let mut f = space.files().load_file(&rec).unwrap();
    f.write(space.data().chunks(), 0, &first).unwrap();
    f.finish(space.data().chunks()).unwrap();
    space
        .commit_file(InodeId(2), &mut f, &mut rec, Seal::Complete)
        .unwrap();
    // 20 MiB of new random data cannot fit in the remaining ~10 MiB.
    let mut big = vec![0u8; 20 << 20];
    SmallRng::seed_from_u64(2).fill_bytes(&mut big);
    let mut rec2 = InodeRecord {
        history: HistoryId(2),
        ..file_record()
    };
    let mut g = space.files().load_file(&rec2).unwrap();
    let r = g
        .write(space.data().chunks(), 0, &big)
        .and_then(|_| g.finish(space.data().chunks()))
        .and_then(|_| {
            space
                .commit_file(InodeId(3), &mut g, &mut rec2, Seal::Complete)
                .map(|_| ())
        });
    assert!(
        matches!(r, Err(Error::NoSpace)),
        "expected NoSpace, got {r:?}"
    );
    drop(space);
    let space = Space::open(&dir).unwrap();
    let rec = space.ns().get_inode(InodeId(2)).unwrap().unwrap();
    let f = space.files().load_file(&rec).unwrap();
    assert_eq!(
        f.read(space.data().chunks(), 0, first.len()).unwrap(),
        first
    );
    assert!(space.ns().get_inode(InodeId(3)).unwrap().is_none());
    check_space(&space);
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn format_refuses_foreign_and_existing_dirs_and_second_open() {
    let dir = std::env::temp_dir().join(format!("ckptfs-engine-refuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("precious.txt"), b"user data").unwrap();
    assert!(matches!(
        Space::format(&dir, 32 << 20, 65536, Config::default(), true),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(Space::open(&dir), Err(Error::NotASpace(_))));
    assert_eq!(
        std::fs::read(dir.join("precious.txt")).unwrap(),
        b"user data"
    );
    std::fs::remove_file(dir.join("precious.txt")).unwrap();
    Space::format(&dir, 32 << 20, 65536, Config::default(), false).unwrap();
    assert!(matches!(
        Space::format(&dir, 32 << 20, 65536, Config::default(), false),
        Err(Error::Invalid(_))
    ));
    let held = Space::open(&dir).unwrap();
    assert!(matches!(Space::open(&dir), Err(Error::Locked(_))));
    assert!(matches!(
        Space::format(&dir, 32 << 20, 65536, Config::default(), true),
        Err(Error::Locked(_))
    ));
    drop(held);
    Space::format(&dir, 32 << 20, 65536, Config::default(), true).unwrap();
    assert!(matches!(
        Space::format(&dir, 1 << 20, 65536, Config::default(), true),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        Space::format(&dir, 32 << 20, 1000, Config::default(), true),
        Err(Error::Invalid(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
