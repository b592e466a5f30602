use std::io;
use std::mem::align_of;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// A buffer that provides an aligned sub-slice for FUSE operations.
///
/// This struct wraps a `Vec<u8>` and provides access to an aligned portion
/// of the buffer, ensuring proper alignment for `fuse_in_header`.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    buffer: Vec<u8>,
}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf` with the default buffer size.
    ///
    /// The actual buffer may be slightly larger to accommodate alignment requirements.
    pub(crate) fn new() -> Self {
        Self {
            buffer: vec![0; BUFFER_SIZE],
        }
    }

    /// Returns a mutable reference to the aligned portion of the buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        let off = aligned_start(&self.buffer);
        &mut self.buffer[off..]
    }
}

fn aligned_start(buffer: &[u8]) -> usize {
    let alignment = align_of::<abi::fuse_in_header>();
    (alignment - (buffer.as_ptr() as usize) % alignment) % alignment
}

// ckptfs patch: request buffers a filesystem may keep.
//
// Upstream reads every request into one buffer per thread and hands `write` a `&[u8]` into
// it, so a filesystem that keeps written bytes past the call must copy them. Here the event
// loop's buffer is a `RequestBuffer` behind an `Arc`: during a request's dispatch,
// `current_request_buffer()` returns a clone, and a filesystem that keeps it keeps the
// bytes without copying them (`RequestBuffer::window_of` says where `data` lies in it). The
// loop reads the next request into its buffer again only if nobody kept it; otherwise it
// takes another from a per-session pool, which buffers return to when the last holder
// drops them.
//
// Memory: a buffer is `MAX_WRITE_SIZE` + 4 KiB of address space (its own anonymous
// mapping), resident only where a request was read into it. `resident()` is that high-water
// mark; a buffer going back to the pool gives back (MADV_DONTNEED) the pages past its last
// request when they are more than half of it, so a pooled buffer keeps about its last
// request's bytes. At most `POOL_BYTES` of them wait in the pool; more are unmapped.

/// Resident bytes of the buffers waiting in a session's pool for reuse (64 buffers of 1 MiB
/// requests, 16 of 4 MiB): enough to cover the writes a filesystem holds in flight at once
/// on this kind of machine, so kept buffers come back instead of being mapped, faulted in
/// and zeroed again. A buffer that would go over is unmapped.
const POOL_BYTES: usize = 64 << 20;

/// Anonymous memory of `BUFFER_SIZE` bytes, mapped for one buffer: pages are zero and not
/// resident until touched, and nothing is zeroed by hand (a `vec![0; 16 MiB]` from the heap
/// would be, for every buffer the filesystem keeps).
#[derive(Debug)]
struct Mapping {
    ptr: std::ptr::NonNull<u8>,
}

// SAFETY: the mapping is owned memory like a `Vec<u8>`'s.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A new mapping, or the error of `mmap` (out of memory or address space).
    fn new() -> io::Result<Mapping> {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BUFFER_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: std::ptr::NonNull::new(p.cast()).expect("mmap returned null"),
        })
    }

    fn all(&self) -> &[u8] {
        // SAFETY: BUFFER_SIZE mapped bytes, readable (zero where never written).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), BUFFER_SIZE) }
    }

    fn all_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `all`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), BUFFER_SIZE) }
    }

    /// Gives back the pages from byte `keep` on (they read as zero again).
    fn release_from(&mut self, keep: usize) {
        let page = page_size::get();
        let from = keep.div_ceil(page) * page;
        if from < BUFFER_SIZE {
            // SAFETY: whole pages inside this mapping, which only `self` references.
            unsafe {
                libc::madvise(
                    self.ptr.as_ptr().add(from).cast(),
                    (BUFFER_SIZE - from) / page * page,
                    libc::MADV_DONTNEED,
                );
            }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), BUFFER_SIZE);
        }
    }
}

/// Where the event loops of a session get request buffers and kept ones come back to.
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    /// Buffers, their resident bytes and the trim epoch they came back in; and the sum of
    /// resident bytes. Taken most recently returned first, so idle ones sit at the front.
    free: Mutex<(Vec<(Mapping, usize, u64)>, usize)>,
    /// Calls of `trim_idle` so far.
    epoch: std::sync::atomic::AtomicU64,
}

/// Every session's pool, for `trim_idle_request_buffers`.
static POOLS: Mutex<Vec<std::sync::Weak<BufferPool>>> = Mutex::new(Vec::new());

/// ckptfs patch: gives back the memory of request buffers that waited in a pool since the
/// previous call (their pages read as zero again; the mappings stay), so a burst of writes
/// leaves no resident pool behind once writing stops. Call it periodically (ckptfs: once a
/// second); buffers in use between two calls are left alone. Returns the bytes given back.
pub fn trim_idle_request_buffers() -> usize {
    let mut pools = POOLS.lock();
    pools.retain(|p| p.strong_count() > 0);
    pools
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .map(|p| p.trim_idle())
        .sum()
}

impl BufferPool {
    /// A new pool, registered for `trim_idle_request_buffers`.
    pub(crate) fn new() -> Arc<BufferPool> {
        let p = Arc::new(BufferPool::default());
        POOLS.lock().push(Arc::downgrade(&p));
        p
    }

    /// Gives back the pages of buffers returned before the previous call.
    fn trim_idle(&self) -> usize {
        use std::sync::atomic::Ordering;
        let now = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        let mut free = self.free.lock();
        let (list, total) = &mut *free;
        let mut given = 0;
        for (map, resident, at) in list.iter_mut() {
            if *at + 1 < now && *resident > 0 {
                map.release_from(0);
                given += *resident;
                *total -= *resident;
                *resident = 0;
            }
        }
        given
    }

    /// A buffer from the pool, else a new mapping; the error of `mmap` when that fails
    /// (out of memory or address space).
    pub(crate) fn take(self: &Arc<Self>) -> io::Result<RequestBuffer> {
        let popped = {
            let mut free = self.free.lock();
            let got = free.0.pop();
            if let Some((_, r, _)) = &got {
                free.1 -= r;
            }
            got.map(|(m, r, _)| (m, r))
        };
        let (map, resident) = match popped {
            Some(got) => got,
            None => (Mapping::new()?, 0),
        };
        Ok(RequestBuffer {
            map: Some(map),
            len: 0,
            resident,
            pool: self.clone(),
        })
    }
}

/// A request as read from the kernel, which a filesystem may keep past the request's
/// dispatch (see `current_request_buffer`).
#[derive(Debug)]
pub struct RequestBuffer {
    /// Page aligned, so aligned for `fuse_in_header`; `None` only while dropping.
    map: Option<Mapping>,
    /// Bytes of the request read into it.
    len: usize,
    /// Bytes of the buffer that may be resident (the largest request read into it since
    /// its pages were last given back).
    resident: usize,
    pool: Arc<BufferPool>,
}

impl RequestBuffer {
    /// The buffer, to read a request into.
    pub(crate) fn read_into(&mut self) -> &mut [u8] {
        self.map.as_mut().expect("mapped").all_mut()
    }

    /// Records that `len` bytes were read.
    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
        self.resident = self.resident.max(len);
    }

    /// The request's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map.as_ref().expect("mapped").all()[..self.len]
    }

    /// Where `data` (a slice the filesystem was handed during this request's dispatch) lies
    /// in `bytes()`: `Some((offset, len))`, or `None` if it is not inside this buffer.
    pub fn window_of(&self, data: &[u8]) -> Option<(usize, usize)> {
        let base = self.bytes().as_ptr() as usize;
        let p = data.as_ptr() as usize;
        (p >= base && p + data.len() <= base + self.len).then(|| (p - base, data.len()))
    }

    /// Memory this buffer may hold resident, in bytes.
    pub fn resident(&self) -> usize {
        self.resident
    }
}

impl AsRef<[u8]> for RequestBuffer {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for RequestBuffer {
    fn drop(&mut self) {
        let Some(mut map) = self.map.take() else {
            return;
        };
        let mut resident = self.resident;
        if self.resident > 2 * self.len.max(page_size::get()) {
            map.release_from(self.len);
            resident = self.len;
        }
        let mut free = self.pool.free.lock();
        if free.1 + resident > POOL_BYTES {
            return;
        }
        free.1 += resident;
        let at = self
            .pool
            .epoch
            .load(std::sync::atomic::Ordering::Relaxed);
        free.0.push((map, resident, at));
    }
}
