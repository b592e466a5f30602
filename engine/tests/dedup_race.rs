//! Writers whose chunks are each other's, racing: a chunk one writer looks up may be pinned
//! by another's uncommitted file state, committed, or let go of as that state is dropped or
//! committed at that moment. The dedup lookup reads the chunk table once per batch of
//! chunks (`ChunkStore::lookup_many`) and must pin whatever it reports found, so every
//! committed revision reads back exactly and `check` finds nothing wrong.
//!
//! Seeded: `CKPTFS_SEED` picks another seed, `CKPTFS_DEDUP_RACE_ROUNDS` more rounds per
//! writer (default 30).

use ckptfs_engine::format::*;
use ckptfs_engine::space::Seal;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::sync::Arc;

mod common;
use common::{env_u64, fresh_space};

#[test]
fn writers_sharing_chunks_race_with_commits_and_drops() {
    let seed = env_u64("CKPTFS_SEED", 38);
    let rounds = env_u64("CKPTFS_DEDUP_RACE_ROUNDS", 30);
    eprintln!("seed {seed} (CKPTFS_SEED), {rounds} rounds (CKPTFS_DEDUP_RACE_ROUNDS)");
    let (dir, space) = fresh_space("dedup-race", 512 << 20);
    // Two checkpoints every writer's files are variants of, so their chunks are shared.
    let mut rng = SmallRng::seed_from_u64(seed);
    let bases: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..2)
            .map(|_| {
                let mut b = vec![0u8; 3 << 20];
                rng.fill_bytes(&mut b);
                b
            })
            .collect(),
    );
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let (space, bases) = (space.clone(), bases.clone());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ ((w + 1) * 0x9e37_79b9));
                let mut kept = Vec::new();
                for round in 0..rounds {
                    // A base with a few 64 KiB blocks changed, written in requests of
                    // random sizes.
                    let mut data = bases[rng.random_range(0..bases.len())].clone();
                    for blk in data.chunks_mut(64 << 10) {
                        if rng.random_range(0..20) == 0 {
                            rng.fill_bytes(blk);
                        }
                    }
                    let name = format!("w{w}-{round}");
                    let (ino, mut rec) = common::new_file(&space, &name);
                    let mut f = space.files().load_file(&rec).unwrap();
                    let mut at = 0;
                    while at < data.len() {
                        let n = rng.random_range(1..(2 << 20)).min(data.len() - at);
                        f.write(space.data().chunks(), at as u64, &data[at..at + n])
                            .unwrap();
                        at += n;
                    }
                    f.finish(space.data().chunks()).unwrap();
                    if rng.random_range(0..3) == 0 {
                        // Dropped uncommitted: its pins go while other writers look up the
                        // same chunks.
                        drop(f);
                        continue;
                    }
                    let rev = space
                        .commit_file(ino, &mut f, &mut rec, Seal::Complete)
                        .unwrap();
                    kept.push((rev, data));
                }
                kept
            })
        })
        .collect();
    let kept: Vec<(RevisionId, Vec<u8>)> = writers
        .into_iter()
        .flat_map(|t| t.join().expect("a writer panicked"))
        .collect();
    assert!(!kept.is_empty());
    common::assert_read_back_and_clean(
        &space,
        kept.iter().map(|(rev, data)| (*rev, data.as_slice())),
        seed,
    );
    // Shared chunks are stored once: the two bases, plus what the changed blocks added
    // (a twentieth of the blocks, each re-cutting its neighbours), with room for chunks of
    // dropped files.
    let stats = space.report().stats().unwrap();
    assert!(
        stats.stored_bytes < 3 * (3 << 20) + kept.len() as u64 * (3 << 20) / 2,
        "seed {seed}: {} bytes stored for {} revisions",
        stats.stored_bytes,
        kept.len()
    );
    drop(space);
    let _ = std::fs::remove_dir_all(&dir);
}
