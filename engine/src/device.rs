//! All backing I/O goes through this trait: the reserved data file, and the metadata table
//! (redb reaches its file through [`MetaBackend`]). Tests substitute devices that keep data in
//! memory, simulate crashes or inject faults (`crate::sim`), and so exercise the very code
//! paths a mounted space runs.

use parking_lot::RwLock;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub trait Device: Send + Sync {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Makes every completed write (and length change) durable.
    fn sync(&self) -> io::Result<()>;
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Grows or shrinks the device; new bytes read as zero. Only the metadata table's device
    /// changes length; the data file is preallocated at format time.
    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

pub struct FileDevice {
    file: File,
    len: AtomicU64,
    /// A growable device (the metadata table) takes writes anywhere; a fixed one (the
    /// preallocated data file) refuses writes past its end with ENOSPC rather than growing
    /// the file on the backing filesystem behind the user's reservation.
    growable: bool,
}

impl FileDevice {
    /// A device of fixed length: the preallocated data file.
    pub fn new(file: File) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(FileDevice {
            file,
            len: AtomicU64::new(len),
            growable: false,
        })
    }

    /// A device whose owner sets its length: the metadata table's file.
    pub fn growable(file: File) -> io::Result<Self> {
        Ok(FileDevice {
            growable: true,
            ..FileDevice::new(file)?
        })
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if !self.growable && off + buf.len() as u64 > self.len() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.file.write_all_at(buf, off)
    }
    fn sync(&self) -> io::Result<()> {
        // fdatasync: file contents plus the size when it changed (a size change is metadata
        // needed to read the data back, so fdatasync includes it).
        self.file.sync_data()
    }
    fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        if !self.growable {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        self.file.set_len(len)?;
        self.len.store(len, Ordering::Relaxed);
        Ok(())
    }
}

/// The metadata table's storage: redb does all its file I/O through this, so the same crash
/// and fault devices that stand in for the data file stand in for the table in tests.
/// Locking is not delegated: the space's own `lock` file already makes its holder the only
/// process that opens the table.
pub struct MetaBackend {
    pub dev: Arc<dyn Device>,
    /// Set by any failed write, length change or sync of the table: the space's sticky
    /// failure flag (shared with the chunk store), raised here because redb may report such
    /// an error from inside a transaction, as a later "previous I/O error", or not at all
    /// (a failed write of pages that a later commit never needed).
    pub failed: Arc<AtomicBool>,
}

impl MetaBackend {
    fn watch<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            if !self.failed.swap(true, Ordering::SeqCst) {
                log::error!(
                    "metadata table I/O failed, refusing further writes until remount: {e}"
                );
            }
        }
        r
    }
}

impl std::fmt::Debug for MetaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MetaBackend({} bytes)", self.dev.len())
    }
}

impl redb::StorageBackend for MetaBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.dev.len())
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        // A failed read changes nothing on disk: an error for this request, not sticky.
        self.dev.read_at(out, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.watch(self.dev.set_len(len))
    }
    fn sync_data(&self) -> io::Result<()> {
        self.watch(self.dev.sync())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.watch(self.dev.write_at(data, offset))
    }
}

/// A device in memory, for engine tests.
pub struct MemDevice {
    bytes: RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(len: usize) -> Self {
        MemDevice {
            bytes: RwLock::new(vec![0; len]),
        }
    }
    /// Flips bits at `off`, as a damaged disk would.
    pub fn corrupt(&self, off: u64) {
        self.bytes.write()[off as usize] ^= 0xff;
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let b = self.bytes.read();
        let end = off as usize + buf.len();
        if end > b.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        buf.copy_from_slice(&b[off as usize..end]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let mut b = self.bytes.write();
        let end = off as usize + buf.len();
        if end > b.len() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        b[off as usize..end].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> u64 {
        self.bytes.read().len() as u64
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.bytes.write().resize(len as usize, 0);
        Ok(())
    }
}
