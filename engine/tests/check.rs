//! `check`: a healthy space is clean; a damaged chunk is reported with every file, revision
//! and byte range that uses it (and nothing else); inconsistent metadata is reported.

use ckptfs_engine::catalog::tables as meta;
use ckptfs_engine::format::*;
use ckptfs_engine::maintenance::check::{check, Damage};
use ckptfs_engine::space::Config;
use ckptfs_engine::space::Seal;
use ckptfs_engine::{Error, Space};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use redb::ReadableTable;
use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

fn temp_space(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ckptfs-check-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Space::format(&dir, 32 << 20, 4096, Config::default(), false).unwrap();
    dir
}

fn random(seed: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    SmallRng::seed_from_u64(seed).fill_bytes(&mut b);
    b
}

/// Creates `name` in `parent` (a directory when `dir`), as the fs layer does.
fn create(space: &Space, parent: InodeId, name: &[u8], dir: bool) -> InodeId {
    space
        .ns_write(true, |t| {
            let ino = t.alloc_ino()?;
            let rec = if dir {
                InodeRecord {
                    parent,
                    target: name.to_vec(),
                    ..InodeRecord::new(NodeKind::Dir, 0o755, 0, 0)
                }
            } else {
                InodeRecord {
                    history: t.new_history(ino)?,
                    ..InodeRecord::new(NodeKind::File, 0o644, 0, 0)
                }
            };
            t.put_inode(ino, &rec)?;
            t.add_entry(parent, name, ino)?;
            Ok::<_, Error>(ino)
        })
        .unwrap()
}

/// Commits `data` as the new content of `ino`; returns the revision.
fn commit(space: &Space, ino: InodeId, data: &[u8]) -> RevisionId {
    let mut rec = space.ns().get_inode(ino).unwrap().unwrap();
    let mut f = space.files().load_file(&rec).unwrap();
    f.truncate(0);
    f.write(space.data().chunks(), 0, data).unwrap();
    f.finish(space.data().chunks()).unwrap();
    space
        .commit_file(ino, &mut f, &mut rec, Seal::Complete)
        .unwrap()
}

fn chunks_of(space: &Space, rev: RevisionId) -> Vec<(u64, Extent)> {
    space
        .files()
        .load_map(rev)
        .unwrap()
        .iter()
        .map(|(o, e)| (o, *e))
        .collect()
}

fn flip(dir: &std::path::Path, off: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(DATA_FILE))
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, off).unwrap();
}

#[test]
fn damage_is_reported_with_every_file_and_revision_that_uses_it() {
    let dir = temp_space("damage");
    let space = Space::open(&dir).unwrap();
    let d = create(&space, InodeId::ROOT, b"d", true);
    let a = create(&space, d, b"a", false);
    let b = create(&space, InodeId::ROOT, b"b", false);
    let shared = random(1, 50_000);
    let a1 = commit(&space, a, &shared);
    let mut a2_data = shared.clone();
    a2_data.extend_from_slice(&random(2, 30_000));
    let a2 = commit(&space, a, &a2_data);
    let b1 = commit(&space, b, &random(3, 40_000));
    // b's second revision starts with a's content: it shares a's first chunks.
    let mut b2_data = shared.clone();
    b2_data.extend_from_slice(&random(4, 10_000));
    let b2 = commit(&space, b, &b2_data);

    let mut seen = Vec::new();
    let clean = check(&space, &mut |d, t| seen.push((d, t))).unwrap();
    assert!(clean.is_clean(), "fresh space not clean: {clean:#?}");
    assert_eq!(clean.revisions, 4);
    assert_eq!(clean.chunks, clean.chunks_verified);
    assert_eq!(clean.bytes_verified, clean.stored_bytes);
    assert_eq!(seen.last().map(|p| p.0), Some(clean.stored_bytes));
    assert!(clean.used_bytes > 0 && clean.used_bytes + clean.free_bytes == clean.reserved_bytes);

    // Damage the first chunk of the shared content, and one chunk only b1 has.
    let (_, first) = chunks_of(&space, a1)[0];
    let (b1_off, b1_only) = chunks_of(&space, b1)[1];
    let rec_first = space
        .store()
        .committed_record(&first.chunk)
        .unwrap()
        .unwrap();
    let rec_b1 = space
        .store()
        .committed_record(&b1_only.chunk)
        .unwrap()
        .unwrap();
    drop(space);
    flip(&dir, rec_first.offset.0 + 7);
    flip(&dir, rec_b1.offset.0 + rec_b1.stored_len as u64 - 1);

    let space = Space::open(&dir).unwrap();
    let r = check(&space, &mut |_, _| {}).unwrap();
    assert!(!r.is_clean());
    assert!(r.problems.is_empty(), "metadata is fine: {:?}", r.problems);
    assert_eq!(r.damaged.len(), 2, "{r:#?}");
    for dc in &r.damaged {
        assert!(
            matches!(dc.reason, Damage::HashMismatch | Damage::Decode(_)),
            "{dc:?}"
        );
    }
    let got: BTreeSet<(String, u64, bool, u64, u64)> = r
        .damaged_revisions()
        .iter()
        .flat_map(|d| {
            d.ranges.iter().map(|&(s, e)| {
                (
                    String::from_utf8_lossy(d.path.as_deref().unwrap_or(b"?")).into_owned(),
                    d.revision.0,
                    d.current,
                    s,
                    e,
                )
            })
        })
        .collect();
    let len = first.len as u64;
    let want: BTreeSet<(String, u64, bool, u64, u64)> = [
        ("d/a".to_string(), a1.0, false, 0, len),
        ("d/a".to_string(), a2.0, true, 0, len),
        (
            "b".to_string(),
            b1.0,
            false,
            b1_off,
            b1_off + b1_only.len as u64,
        ),
        ("b".to_string(), b2.0, true, 0, len),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want);
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn inconsistent_metadata_is_reported() {
    let dir = temp_space("meta");
    let space = Space::open(&dir).unwrap();
    let a = create(&space, InodeId::ROOT, b"a", false);
    let rev = commit(&space, a, &random(5, 20_000));
    let (_, e) = chunks_of(&space, rev)[0];
    // A reference count one too high, and an entry naming a missing inode.
    let txn = space.catalog().raw().begin_write().unwrap();
    {
        let mut chunks = txn.open_table(meta::CHUNKS).unwrap();
        let rec = ChunkRecord::decode(chunks.get(e.chunk.0.as_slice()).unwrap().unwrap().value())
            .unwrap();
        let rec = ChunkRecord {
            refs: rec.refs + 1,
            ..rec
        };
        chunks
            .insert(e.chunk.0.as_slice(), rec.encode().as_slice())
            .unwrap();
        let mut dirents = txn.open_table(meta::DIRENTS).unwrap();
        dirents
            .insert((InodeId::ROOT.0, b"ghost".as_slice()), (999, 7))
            .unwrap();
        // Extended attributes of an inode and a revision that do not exist.
        let mut xattrs = txn.open_table(meta::XATTRS).unwrap();
        xattrs
            .insert((888, b"user.orphan".as_slice()), b"v".as_slice())
            .unwrap();
        let mut rev_xattrs = txn.open_table(meta::REV_XATTRS).unwrap();
        rev_xattrs.insert(777, b"".as_slice()).unwrap();
    }
    txn.commit().unwrap();
    let r = check(&space, &mut |_, _| {}).unwrap();
    assert!(!r.is_clean());
    assert!(r.damaged.is_empty(), "{:?}", r.damaged);
    let all = r.problems.join("\n");
    assert!(all.contains("reference count"), "{all}");
    assert!(all.contains("inode 999"), "{all}");
    assert!(all.contains("extended attribute of inode 888"), "{all}");
    assert!(all.contains("revision 777, which does not exist"), "{all}");
    assert!(
        all.contains("at or above next_cookie") || all.contains("readdir"),
        "{all}"
    );
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A space formatted before the extended-attribute tables existed gets them at its next
/// open (and only then is meta.redb written); its files keep working and check clean.
#[test]
fn a_space_without_xattr_tables_gains_them_at_open() {
    let dir = temp_space("upgrade");
    let space = Space::open(&dir).unwrap();
    let a = create(&space, InodeId::ROOT, b"a", false);
    commit(&space, a, &random(9, 10_000));
    // The table itself holds the commit (a checkpoint) before it is changed behind the
    // catalog's back.
    space.sync_all().unwrap();
    let txn = space.catalog().raw().begin_write().unwrap();
    assert!(txn.delete_table(meta::XATTRS).unwrap());
    assert!(txn.delete_table(meta::REV_XATTRS).unwrap());
    txn.commit().unwrap();
    drop(space);

    let space = Space::open(&dir).unwrap();
    assert!(space.ns().xattrs(a).unwrap().is_empty());
    space
        .ns_write(true, |t| t.put_xattr(a, b"user.k", b"v"))
        .unwrap();
    let rev = commit(&space, a, &random(10, 10_000));
    assert_eq!(space.ns().revision_xattrs(rev).unwrap().len(), 1);
    let r = check(&space, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{r:#?}");
    drop(space);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A metadata table whose header is damaged (redb's magic number) is reported as damage
/// naming the table, not as an I/O error of the backing space: `ckptfs check` then exits
/// with "damage" rather than "could not check".
#[test]
fn a_damaged_table_header_is_corruption_not_an_io_error() {
    let dir = temp_space("magic");
    let meta = dir.join(ckptfs_engine::format::META_FILE);
    let mut b = std::fs::read(&meta).unwrap();
    b[0] ^= 0xff;
    std::fs::write(&meta, &b).unwrap();
    match Space::open(&dir) {
        Err(Error::Corrupt(ckptfs_engine::error::Corruption::Catalog(m))) => {
            assert!(m.contains("cannot be opened"), "{m}")
        }
        Err(e) => panic!("want corruption, got: {e}"),
        Ok(_) => panic!("a table with a damaged header opened"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
