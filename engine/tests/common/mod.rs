//! Helpers shared by the engine's integration tests.

use ckptfs_engine::format::*;
use ckptfs_engine::Space;

/// Creates an empty regular file `name` in the root directory: (its inode, its record).
pub fn new_file(space: &Space, name: &str) -> (InodeId, InodeRecord) {
    space
        .ns_write(false, |t| {
            let ino = t.alloc_ino()?;
            let rec = InodeRecord {
                history: t.new_history(ino)?,
                ..InodeRecord::new(NodeKind::File, 0o644, 0, 0)
            };
            t.put_inode(ino, &rec)?;
            t.add_entry(InodeId::ROOT, name.as_bytes(), ino)?;
            Ok::<_, ckptfs_engine::Error>((ino, rec))
        })
        .unwrap()
}

/// Asserts that each revision reads back as its bytes, then that `check` is clean.
pub fn assert_read_back_and_clean<'a>(
    space: &Space,
    revisions: impl IntoIterator<Item = (RevisionId, &'a [u8])>,
    seed: u64,
) {
    for (rev, data) in revisions {
        let f = space.load_revision(rev).unwrap();
        let got = f.read(space.chunks(), 0, f.size() as usize).unwrap();
        assert!(
            got == data,
            "revision {rev:?} reads back exactly (seed {seed})"
        );
    }
    let report = ckptfs_engine::check::check(space, &mut |_, _| {}).unwrap();
    assert!(report.is_clean(), "seed {seed}: {report:?}");
}
