//! All I/O on the reserved data file goes through this trait, so tests can substitute devices
//! that keep data in memory, simulate crashes or inject faults.

use parking_lot::RwLock;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub trait Device: Send + Sync {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> io::Result<()>;
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct FileDevice {
    file: File,
    len: u64,
}

impl FileDevice {
    pub fn new(file: File) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(FileDevice { file, len })
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if off + buf.len() as u64 > self.len {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.file.write_all_at(buf, off)
    }
    fn sync(&self) -> io::Result<()> {
        // Only data needs to reach the disk: the file was preallocated at format time, so
        // its size and extents do not change.
        self.file.sync_data()
    }
    fn len(&self) -> u64 {
        self.len
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
}
