//! The read-ahead policy: how far ahead of a sequential reader chunks are read, for this
//! slot's files and other nodes' alike (`fs` asks it after each read and hands the range it
//! returns to the store's prefetch).

use std::sync::Arc;

/// One open file being read ahead, counted in `Fs::prefetch_streams` while it lives.
pub(crate) struct PrefetchStream(Arc<std::sync::atomic::AtomicUsize>);

/// The read-ahead of one open file (this slot's), or of one read handle of a file another
/// node wrote: the same policy for both.
///
/// A sequential reader (a restart): the chunks ahead of it are read and verified on the
/// store's read threads, so the kernel's next requests find them decoded. The kernel's
/// readahead keeps only a few requests in flight; this adds depth. Sequential: the read
/// starts near where the reads so far ended (the kernel's readahead requests for one file
/// arrive on several FUSE threads, a little out of order). The depth ramps up with the run
/// of sequential reads, as the kernel's readahead does, so a random reader (or one reading
/// a few scattered tensors) does not get the full depth read and verified behind each read:
/// before, 4 KiB random reads of a cold 1 GiB file read 6.9 GB from the disk for 56 MB
/// returned.
#[derive(Default)]
pub struct ReadAhead {
    /// File offset up to which chunks were handed to the store's prefetch.
    prefetched_to: u64,
    /// Where the reads so far ended (the furthest end of the current run of sequential
    /// reads), and how many sequential reads that run has had.
    read_end: u64,
    streak: u32,
    /// Held while this file is read ahead: counts it among the readers sharing the cache.
    prefetching: Option<PrefetchStream>,
}

impl ReadAhead {
    /// After a read of `off..end` of a file of `size` bytes: the range to hand to the
    /// store's prefetch now, if any (`streams`: the readers sharing the cache).
    pub fn next(
        &mut self,
        streams: &Arc<std::sync::atomic::AtomicUsize>,
        off: u64,
        end: u64,
        size: u64,
    ) -> Option<(u64, u64)> {
        if off.abs_diff(self.read_end) <= SEQUENTIAL_SLACK {
            self.streak = self.streak.saturating_add(1);
            self.read_end = self.read_end.max(end);
        } else {
            self.streak = 0;
            self.read_end = end;
            self.prefetched_to = end;
        }
        if self.streak == 0 {
            return None;
        }
        if self.prefetching.is_none() {
            streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.prefetching = Some(PrefetchStream(streams.clone()));
        }
        let depth = prefetch_depth(streams.load(std::sync::atomic::Ordering::Relaxed))
            .min(PREFETCH_FIRST_BYTES << (self.streak - 1).min(16));
        if off <= self.prefetched_to && end + depth / 2 > self.prefetched_to {
            let from = self.prefetched_to.max(end);
            let to = (end + depth).min(size);
            if from < to {
                self.prefetched_to = to;
                return Some((from, to));
            }
        } else if off > self.prefetched_to || end + depth < self.prefetched_to {
            // Not where the last prefetch went: start over from here.
            self.prefetched_to = end;
        }
        None
    }
}

impl Drop for PrefetchStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How far ahead of a sequential reader chunks are read (see `ReadAhead`), at most: one
/// reader's device reads then overlap deeply enough to keep a disk busy (8 MiB ahead
/// reached 650 MiB/s cold where the disk gives 1.1 GiB/s, 32 MiB about 730). With several
/// readers at once each gets an equal share of half the decoded-chunk cache, so one's
/// prefetch does not evict another's before it is read, but never less than
/// `PREFETCH_MIN_BYTES`. That minimum is 4 MiB so 8 readers still keep to half the cache:
/// at 8 MiB they asked for all of it, and once the cache charged read buffers whole, 8 cold
/// readers of 128 MiB each read 1.85 GiB from the disk for their 1 GiB (1.2 GiB at 4 MiB).
pub const PREFETCH_BYTES: u64 = 32 << 20;

/// The read-ahead depth after a reader's first sequential read, doubling with each next one
/// up to the full depth (see `ReadAhead`).
pub const PREFETCH_FIRST_BYTES: u64 = 2 << 20;

/// How far from where the reads so far ended a read may start and still count as
/// sequential: the kernel's readahead window (4 MiB, the mount's max_readahead), whose
/// requests the FUSE threads may take out of order.
const SEQUENTIAL_SLACK: u64 = 4 << 20;
pub const PREFETCH_MIN_BYTES: u64 = 4 << 20;

/// The read-ahead depth for each of `readers` sequential readers (see `PREFETCH_BYTES`).
fn prefetch_depth(readers: usize) -> u64 {
    (crate::read::CACHE_BYTES as u64 / 2 / readers.max(1) as u64)
        .clamp(PREFETCH_MIN_BYTES, PREFETCH_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const MIB: u64 = 1 << 20;

    /// A sequential reader gets read-ahead that ramps from `PREFETCH_FIRST_BYTES`, doubling,
    /// to `PREFETCH_BYTES`; a reader that jumps about gets none; each reader counts among
    /// those sharing the cache while it reads ahead, and no longer once it is dropped.
    #[test]
    fn sequential_readers_ramp_up_and_random_ones_get_nothing() {
        let streams = Arc::new(AtomicUsize::new(0));
        let size = 1 << 40;
        let mut a = ReadAhead::default();
        // A read from the start is a run's first read already.
        let mut depths = Vec::new();
        let mut off = 0;
        for _ in 0..8 {
            if let Some((from, to)) = a.next(&streams, off, off + MIB, size) {
                assert!(from >= off + MIB, "prefetch starts past the read");
                depths.push(to - (off + MIB));
            }
            off += MIB;
        }
        assert_eq!(depths.first(), Some(&PREFETCH_FIRST_BYTES), "{depths:?}");
        assert!(depths.iter().all(|d| *d <= PREFETCH_BYTES), "{depths:?}");
        assert_eq!(streams.load(Ordering::Relaxed), 1);
        // Never past the end of the file.
        let mut e = ReadAhead::default();
        assert_eq!(e.next(&streams, 0, MIB, 2 * MIB), Some((MIB, 2 * MIB)));
        drop(e);
        // Random reads: every one far from the last, no read-ahead.
        let mut r = ReadAhead::default();
        for k in [900u64, 10, 500, 77, 1000, 30] {
            assert_eq!(
                r.next(&streams, k * 64 * MIB, k * 64 * MIB + 4096, size),
                None
            );
        }
        drop(a);
        assert_eq!(streams.load(Ordering::Relaxed), 0);
    }
}
