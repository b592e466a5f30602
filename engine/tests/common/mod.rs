//! Helpers shared by the engine's integration tests.

use ckptfs_engine::format::*;
use ckptfs_engine::space::Config;
use ckptfs_engine::Space;
use std::path::PathBuf;
use std::sync::Arc;

/// The number in environment variable `name`, else `default` (seeds, rounds).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A newly formatted space of `size` bytes (64 KiB chunks) in a directory of the temporary
/// directory named after `tag` and this process, opened; (its directory, the space). The
/// caller removes the directory when done.
pub fn fresh_space(tag: &str, size: u64) -> (PathBuf, Arc<Space>) {
    let dir = std::env::temp_dir().join(format!("ckptfs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Space::format(&dir, size, 65536, Config::default(), false).unwrap();
    let space = Arc::new(Space::open(&dir).unwrap());
    (dir, space)
}

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
        let f = space.files().load_revision(rev).unwrap();
        let got = f.read(space.data().chunks(), 0, f.size() as usize).unwrap();
        assert!(
            got == data,
            "revision {rev:?} reads back exactly (seed {seed})"
        );
    }
    let report = ckptfs_engine::maintenance::check::check(space, &mut |_, _| {}).unwrap();
    assert!(report.is_clean(), "seed {seed}: {report:?}");
}
