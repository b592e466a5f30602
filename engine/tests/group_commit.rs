//! Group commit (`space::group`): file commits that arrive while another is in flight share
//! one metadata transaction. Held back until all have arrived, six commits of six files,
//! some of them new revisions of files committed before, take one transaction; each
//! revision is current for its file and reads back exactly, also after the space is
//! opened again, and `check` is clean. Racing commits without the hold are
//! `dedup_race.rs`'s writers.
//!
//! Seeded: `CKPTFS_SEED` picks another seed.

use ckptfs_engine::space::Seal;
use ckptfs_engine::Space;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

mod common;
use common::{env_u64, fresh_space, new_file};

#[test]
fn commits_held_back_together_take_one_transaction_and_each_lands() {
    let seed = env_u64("CKPTFS_SEED", 0x9c0_33e7);
    eprintln!("seed {seed} (CKPTFS_SEED)");
    let (dir, space) = fresh_space("group-commit", 256 << 20);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut base = vec![0u8; 2 << 20];
    rng.fill_bytes(&mut base);
    // Six files; three of them get a first revision now, committed one at a time.
    let mut files = Vec::new();
    for i in 0..6 {
        let (ino, mut rec) = new_file(&space, &format!("f{i}"));
        if i % 2 == 0 {
            let mut f = space.files().load_file(&rec).unwrap();
            f.write(space.data().chunks(), 0, &base).unwrap();
            f.finish(space.data().chunks()).unwrap();
            space
                .commit_file(ino, &mut f, &mut rec, Seal::Complete)
                .unwrap();
        }
        files.push((ino, rec));
    }
    let before = space.report().stats().unwrap().commits;
    let held = space.hold_commits();
    let writers: Vec<_> = files
        .into_iter()
        .enumerate()
        .map(|(i, (ino, mut rec))| {
            let space = space.clone();
            let mut data = base.clone();
            for blk in data.chunks_mut(64 << 10) {
                if rng.random_range(0..4) == 0 {
                    rng.fill_bytes(blk);
                }
            }
            data.truncate(data.len() - i * 4097);
            std::thread::spawn(move || {
                let mut f = space.files().load_file(&rec).unwrap();
                f.write(space.data().chunks(), 0, &data).unwrap();
                f.truncate(data.len() as u64);
                f.finish(space.data().chunks()).unwrap();
                let rev = space
                    .commit_file(ino, &mut f, &mut rec, Seal::Complete)
                    .unwrap();
                assert_eq!(
                    rec.current_rev, rev,
                    "the caller's record names the new revision"
                );
                assert_eq!(rec.size, data.len() as u64);
                (ino, rev, data)
            })
        })
        .collect();
    space.wait_for_held_commits(6);
    drop(held);
    let committed: Vec<_> = writers
        .into_iter()
        .map(|w| w.join().expect("a writer panicked"))
        .collect();
    let after = space.report().stats().unwrap().commits;
    assert_eq!(
        (
            after.files - before.files,
            after.transactions - before.transactions
        ),
        (6, 1),
        "six commits in one transaction (seed {seed})"
    );
    drop(space);
    let space = Space::open(&dir).unwrap();
    for (ino, rev, _) in &committed {
        let rec = space.ns().get_inode(*ino).unwrap().expect("the file");
        assert_eq!(
            rec.current_rev, *rev,
            "current after reopening (seed {seed})"
        );
    }
    common::assert_read_back_and_clean(
        &space,
        committed
            .iter()
            .map(|(_, rev, data)| (*rev, data.as_slice())),
        seed,
    );
    drop(space);
    let _ = std::fs::remove_dir_all(&dir);
}
