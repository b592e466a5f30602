//! A backing space: format, open (with its lock), file commits and statistics.

use crate::device::{Device, FileDevice};
use crate::error::{Error, Result};
use crate::filemap::{ChunkIo, ExtentMap, FileState};
use crate::format::*;
use crate::meta::{self, NsTxn};
use crate::store::ChunkStore;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The smallest reserved space `format` accepts.
pub const MIN_SPACE_BYTES: u64 = 16 << 20;
/// Page cache redb may use for the metadata table.
const META_CACHE_BYTES: usize = 64 << 20;

pub struct Space {
    dir: PathBuf,
    sb: Superblock,
    db: Arc<Database>,
    store: ChunkStore,
    /// Held for the life of the Space: its flock is what makes a second mount fail.
    lock: File,
}

/// What `ckptfs stats` reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Sum of the sizes of the current (linked) regular files.
    pub logical_bytes: u64,
    /// Bytes of data extents over all kept revisions, current or not (holes excluded): what
    /// would be stored without dedup.
    pub referenced_bytes: u64,
    /// Bytes physically held in the data file for committed chunks (after compression).
    pub stored_bytes: u64,
    /// Uncompressed size of all distinct committed chunks.
    pub raw_chunk_bytes: u64,
    pub chunks: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// fifos, sockets and device nodes
    pub special: u64,
    pub revisions: u64,
    pub reserved_bytes: u64,
    /// Bytes of the data file in use (committed and not-yet-reclaimed chunks).
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub chunk_avg_bytes: u32,
    /// An earlier backing I/O failure has made the space refuse writes.
    pub failed: bool,
}

impl Stats {
    /// Referenced bytes (all kept revisions) per distinct chunk byte: how much dedup saves
    /// (1.0 = nothing).
    pub fn dedup_ratio(&self) -> f64 {
        ratio(self.referenced_bytes, self.raw_chunk_bytes)
    }
    /// Distinct chunk bytes per stored byte: how much compression saves.
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.raw_chunk_bytes, self.stored_bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

fn open_private(path: &Path, create: bool) -> Result<File> {
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(path)?)
}

/// Takes the space's lock without blocking; the lock file says who holds it.
fn take_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let mut f = open_private(&path, false).map_err(|e| match e {
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => Error::NotASpace(format!(
            "{} is not a ckptfs backing space (no lock file); run `ckptfs format {}`",
            dir.display(),
            dir.display()
        )),
        other => other,
    })?;
    // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut who = String::new();
        let _ = f.read_to_string(&mut who);
        return Err(Error::Locked(format!(
            "backing space {} is in use by another ckptfs process ({})",
            dir.display(),
            who.trim()
        )));
    }
    Ok(f)
}

/// Reads the lock file of a space, which names the process and mountpoint holding it.
pub fn lock_holder(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join(LOCK_FILE))
        .ok()
        .filter(|s| !s.trim().is_empty())
}

pub fn read_superblock(dir: &Path) -> Result<Superblock> {
    let path = dir.join(SUPERBLOCK_FILE);
    match fs::read(&path) {
        Ok(b) => Superblock::decode(&b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotASpace(format!(
            "{} is not a ckptfs backing space (no superblock); run `ckptfs format {}`",
            dir.display(),
            dir.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Bytes available to unprivileged users on the filesystem holding `dir`.
pub fn free_disk_bytes(dir: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Invalid("path contains a NUL byte".into()))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

impl Space {
    /// Creates a backing space in `dir`. Refuses a directory holding anything that is not a
    /// ckptfs space, and an existing space unless `force` (and never one that is mounted).
    pub fn format(dir: &Path, size_bytes: u64, chunk_avg_bytes: u32, force: bool) -> Result<()> {
        let chunk = ChunkParams::from_avg(chunk_avg_bytes)?;
        if size_bytes < MIN_SPACE_BYTES {
            return Err(Error::Invalid(format!(
                "size {size_bytes} bytes is below the minimum of {} MiB",
                MIN_SPACE_BYTES >> 20
            )));
        }
        if dir.exists() && !dir.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        fs::create_dir_all(dir)?;
        let names: Vec<String> = fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        let _guard = if names.is_empty() {
            None
        } else if names.iter().all(|n| SPACE_FILES.contains(&n.as_str())) {
            if !force {
                return Err(Error::Invalid(format!(
                    "{} already holds a ckptfs space; use --force to erase it and format anew",
                    dir.display()
                )));
            }
            // Hold the old space's lock while erasing it, so a mounted space is never erased.
            let guard = if names.iter().any(|n| n == LOCK_FILE) {
                Some(take_lock(dir)?)
            } else {
                None
            };
            for n in &names {
                if n != LOCK_FILE {
                    fs::remove_file(dir.join(n))?;
                }
            }
            guard
        } else {
            return Err(Error::Invalid(format!(
                "{} is not empty and is not a ckptfs space; refusing to format it",
                dir.display()
            )));
        };
        let free = free_disk_bytes(dir)?;
        if size_bytes > free {
            return Err(Error::Invalid(format!(
                "size {size_bytes} bytes is larger than the free space on that disk ({free} bytes)"
            )));
        }

        let data = open_private(&dir.join(DATA_FILE), true)?;
        // SAFETY: fallocate on a valid descriptor; arguments are plain integers.
        let rc = unsafe { libc::fallocate(data.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                log::warn!("fallocate is not supported here; the data file is sparse");
                data.set_len(size_bytes)?;
            } else {
                let _ = fs::remove_file(dir.join(DATA_FILE));
                return Err(e.into());
            }
        }
        data.sync_all()?;

        let meta_path = dir.join(META_FILE);
        drop(open_private(&meta_path, true)?);
        let db = Database::create(&meta_path)?;
        let now = Timestamp::now();
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let root = InodeRecord {
            kind: NodeKind::Dir,
            perm: 0o755,
            uid,
            gid,
            nlink: 2,
            size: 0,
            current_rev: RevisionId(0),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            parent: InodeId::ROOT,
            rdev: 0,
            target: Vec::new(),
        };
        let txn = db.begin_write()?;
        {
            let mut inodes = txn.open_table(meta::INODES)?;
            inodes.insert(InodeId::ROOT.0, root.encode().as_slice())?;
            let mut c = txn.open_table(meta::COUNTERS)?;
            c.insert(meta::NEXT_INO, 2)?;
            c.insert(meta::NEXT_REV, 1)?;
            c.insert(meta::NEXT_COOKIE, meta::FIRST_COOKIE)?;
            c.insert(meta::ALLOC_HEAD, 0)?;
            txn.open_table(meta::DIRENTS)?;
            txn.open_table(meta::DIRLIST)?;
            txn.open_table(meta::REVISIONS)?;
            txn.open_table(meta::EXTENTS)?;
            txn.open_table(meta::CHUNKS)?;
        }
        txn.commit()?;
        drop(db);
        drop(open_private(&dir.join(LOCK_FILE), true)?);
        drop(open_private(&dir.join(LOG_FILE), true)?);

        // The superblock goes last: a directory without one is never mistaken for a space.
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(
            &blake3::hash(format!("{:?}{}{:?}", now, std::process::id(), dir).as_bytes())
                .as_bytes()[..16],
        );
        let sb = Superblock {
            version: FORMAT_VERSION,
            uuid,
            data_size_bytes: size_bytes,
            chunk,
            created_unix_s: now.secs as u64,
        };
        let tmp = dir.join("superblock.tmp");
        let mut f = open_private(&tmp, true)?;
        f.write_all(&sb.encode())?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(SUPERBLOCK_FILE))?;
        sync_dir(dir)?;
        Ok(())
    }

    /// Opens a space for exclusive use; fails if another process holds it.
    pub fn open(dir: &Path) -> Result<Space> {
        if !dir.is_dir() {
            return Err(Error::Invalid(format!(
                "backing directory {} does not exist or is not a directory",
                dir.display()
            )));
        }
        let sb = read_superblock(dir)?;
        let mut lock = take_lock(dir)?;
        lock.set_len(0)?;
        lock.write_all(format!("pid {}", std::process::id()).as_bytes())?;
        let data = open_private(&dir.join(DATA_FILE), false)?;
        let dev = FileDevice::new(data)?;
        if dev.len() != sb.data_size_bytes {
            return Err(Error::Corrupt(format!(
                "data file is {} bytes, the superblock says {}",
                dev.len(),
                sb.data_size_bytes
            )));
        }
        let db = Database::builder()
            .set_cache_size(META_CACHE_BYTES)
            .open(dir.join(META_FILE))
            .map_err(|e| Error::Meta(format!("cannot open the metadata table: {e}")))?;
        let db = Arc::new(db);
        let head = {
            let txn = db.begin_read()?;
            let c = txn.open_table(meta::COUNTERS)?;
            meta::counter(&c, meta::ALLOC_HEAD)?
        };
        if head > sb.data_size_bytes {
            return Err(Error::Corrupt(
                "allocation head beyond the data file".into(),
            ));
        }
        let store = ChunkStore::new(Arc::new(dev), db.clone(), head);
        Ok(Space {
            dir: dir.to_path_buf(),
            sb,
            db,
            store,
            lock,
        })
    }

    /// Records the mountpoint in the lock file, so tools can find the mount from the space.
    pub fn set_lock_note(&mut self, note: &str) -> Result<()> {
        self.lock.set_len(0)?;
        use std::os::unix::fs::FileExt;
        self.lock.write_all_at(note.as_bytes(), 0)?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn chunk_params(&self) -> ChunkParams {
        self.sb.chunk
    }

    pub fn chunks(&self) -> &dyn ChunkIo {
        &self.store
    }

    pub fn store(&self) -> &ChunkStore {
        &self.store
    }

    pub fn db(&self) -> &Database {
        &self.db
    }

    /// Runs a namespace change in one write transaction. `durable` commits make it (and every
    /// earlier non-durable commit) survive a crash; the others are ordered but may be lost.
    pub fn ns_write<R, E: From<Error>>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut NsTxn) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        if self.store.is_failed() {
            return Err(Error::Failed.into());
        }
        let mut txn = self.db.begin_write().map_err(Error::from)?;
        if !durable {
            txn.set_durability(Durability::None)
                .map_err(|e| Error::Meta(e.to_string()))?;
        }
        let r = {
            let mut t = NsTxn {
                inodes: txn.open_table(meta::INODES).map_err(Error::from)?,
                dirents: txn.open_table(meta::DIRENTS).map_err(Error::from)?,
                dirlist: txn.open_table(meta::DIRLIST).map_err(Error::from)?,
                counters: txn.open_table(meta::COUNTERS).map_err(Error::from)?,
            };
            f(&mut t)
        };
        match r {
            Ok(v) => {
                txn.commit().map_err(Error::from)?;
                Ok(v)
            }
            Err(e) => {
                txn.abort().map_err(Error::from)?;
                Err(e)
            }
        }
    }

    pub fn get_inode(&self, ino: InodeId) -> Result<Option<InodeRecord>> {
        let txn = self.db.begin_read()?;
        meta::get_inode(&txn.open_table(meta::INODES)?, ino)
    }

    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        let txn = self.db.begin_read()?;
        meta::lookup(&txn.open_table(meta::DIRENTS)?, parent, name)
    }

    pub fn list_dir(&self, dir: InodeId, after: u64, limit: usize) -> Result<Vec<meta::DirEntry>> {
        let txn = self.db.begin_read()?;
        meta::list_dir(
            &txn.open_table(meta::DIRLIST)?,
            &txn.open_table(meta::DIRENTS)?,
            dir,
            after,
            limit,
        )
    }

    /// The extent map of a committed revision.
    pub fn load_map(&self, rev: RevisionId) -> Result<ExtentMap> {
        let mut map = ExtentMap::new();
        if rev.0 == 0 {
            return Ok(map);
        }
        let txn = self.db.begin_read()?;
        let t = txn.open_table(meta::EXTENTS)?;
        for item in t.range((rev.0, 0)..=(rev.0, u64::MAX))? {
            let (k, v) = item?;
            map.push_loaded(k.value().1, Extent::decode(v.value())?)?;
        }
        Ok(map)
    }

    /// Opens a file's committed content for reading and writing.
    pub fn load_file(&self, rec: &InodeRecord) -> Result<FileState> {
        let map = self.load_map(rec.current_rev)?;
        if let Some((o, e)) = map.iter().next_back() {
            if o + e.len as u64 > rec.size {
                return Err(Error::Corrupt(
                    "extent map reaches past the file size".into(),
                ));
            }
        }
        Ok(FileState::new(self.sb.chunk, map, rec.size))
    }

    /// Commits `file` (after `finish`) as a new revision of `ino`, with `rec` as its inode
    /// record. Protocol: write out and sync the data file, then one durable metadata
    /// transaction names the new chunks, the revision and its extents. A crash before the
    /// transaction commits leaves the previous revision current and intact, because chunks are
    /// only ever appended past the committed allocation head.
    pub fn commit_file(
        &self,
        ino: InodeId,
        file: &FileState,
        rec: &mut InodeRecord,
        sealed: bool,
    ) -> Result<RevisionId> {
        assert_eq!(rec.kind, NodeKind::File);
        let head = self.store.flush_sync()?;
        let txn = self.db.begin_write()?;
        let mut newly_committed = Vec::new();
        let rev = {
            let mut counters = txn.open_table(meta::COUNTERS)?;
            let rev = RevisionId(meta::counter(&counters, meta::NEXT_REV)?);
            counters.insert(meta::NEXT_REV, rev.0 + 1)?;
            let old_head = meta::counter(&counters, meta::ALLOC_HEAD)?;
            counters.insert(meta::ALLOC_HEAD, old_head.max(head))?;

            let mut chunks = txn.open_table(meta::CHUNKS)?;
            let mut extents = txn.open_table(meta::EXTENTS)?;
            let mut new_bytes = 0u64;
            for (off, e) in file.map().iter() {
                extents.insert((rev.0, off), e.encode().as_slice())?;
                let key = e.chunk.0;
                let existing = chunks
                    .get(key.as_slice())?
                    .map(|v| ChunkRecord::decode(v.value()))
                    .transpose()?;
                let updated = match existing {
                    Some(r) => ChunkRecord {
                        refs: r.refs + 1,
                        ..r
                    },
                    None => {
                        let r = self.store.pending_record(&e.chunk).ok_or_else(|| {
                            Error::Corrupt(format!("extent names unknown chunk {:?}", e.chunk))
                        })?;
                        debug_assert!(r.offset.0 + r.stored_len as u64 <= head);
                        new_bytes += r.stored_len as u64;
                        newly_committed.push(e.chunk);
                        ChunkRecord { refs: 1, ..r }
                    }
                };
                chunks.insert(key.as_slice(), updated.encode().as_slice())?;
            }
            let mut revs = txn.open_table(meta::REVISIONS)?;
            let rr = RevisionRecord {
                size: file.size(),
                committed: Timestamp::now(),
                new_stored_bytes: new_bytes,
                sealed,
            };
            revs.insert((ino.0, rev.0), rr.encode().as_slice())?;
            rec.size = file.size();
            rec.current_rev = rev;
            let mut inodes = txn.open_table(meta::INODES)?;
            inodes.insert(ino.0, rec.encode().as_slice())?;
            rev
        };
        txn.commit()?;
        self.store.forget_pending(&newly_committed);
        Ok(rev)
    }

    /// Makes every earlier non-durable metadata commit durable (fsync of a directory).
    pub fn sync_meta(&self) -> Result<()> {
        self.ns_write(true, |_| Ok::<(), Error>(()))
    }

    pub fn stats(&self) -> Result<Stats> {
        let txn = self.db.begin_read()?;
        let mut s = Stats {
            reserved_bytes: self.sb.data_size_bytes,
            used_bytes: self.store.head(),
            chunk_avg_bytes: self.sb.chunk.avg_bytes,
            failed: self.store.is_failed(),
            ..Stats::default()
        };
        s.free_bytes = s.reserved_bytes.saturating_sub(s.used_bytes);
        let inodes = txn.open_table(meta::INODES)?;
        let extents = txn.open_table(meta::EXTENTS)?;
        for item in inodes.iter()? {
            let (_, v) = item?;
            let rec = InodeRecord::decode(v.value())?;
            if rec.nlink == 0 {
                continue;
            }
            match rec.kind {
                NodeKind::Dir => s.dirs += 1,
                NodeKind::Symlink => s.symlinks += 1,
                NodeKind::Fifo
                | NodeKind::Socket
                | NodeKind::CharDevice
                | NodeKind::BlockDevice => s.special += 1,
                NodeKind::File => {
                    s.files += 1;
                    s.logical_bytes += rec.size;
                }
            }
        }
        s.dirs = s.dirs.saturating_sub(1); // the root is not counted
        for e in extents.iter()? {
            s.referenced_bytes += Extent::decode(e?.1.value())?.len as u64;
        }
        s.revisions = txn.open_table(meta::REVISIONS)?.len()?;
        for item in txn.open_table(meta::CHUNKS)?.iter()? {
            let r = ChunkRecord::decode(item?.1.value())?;
            s.chunks += 1;
            s.stored_bytes += r.stored_len as u64;
            s.raw_chunk_bytes += r.raw_len as u64;
        }
        Ok(s)
    }
}
