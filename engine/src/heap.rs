//! The malloc settings of a process that moves chunk buffers: the mount's daemon sets them
//! before its threads start, and `ckptfs-bench codec` too, so the codecs are measured as the
//! daemon runs them.

/// Malloc arenas the daemon's threads share (`M_ARENA_MAX`). glibc gives threads up to 8
/// arenas per core, and each keeps its own high-water mark of freed buffers: with 8192
/// files written 64 KiB at a time in turn on 2 cores the daemon's peak RSS was 453-531 MiB
/// with glibc's default (16 arenas), 449-479 with 4, 384-425 with 2 (`tests/tests/
/// many_files.rs`), and on a 16-core node the default is 128. The buffers that go through
/// malloc are 16 KiB to 4 MiB, one or a few per chunk or request, so two arenas are not
/// contended (tcache serves the small allocations per thread).
pub const ARENAS: i32 = 2;

/// Buffers at least this large are mapped on their own (`M_MMAP_THRESHOLD`), smaller ones
/// come from the arenas. glibc's default starts at 128 KiB and moves with what is freed, so
/// chunk-sized buffers (up to 4x the average chunk: 256 KiB at the default 64 KiB) were
/// mapped, zeroed by the kernel and unmapped one by one. Fixed, chunk buffers of spaces up
/// to 256 KiB average chunks stay in the arenas; request buffers of several MiB are still
/// mapped.
pub const MMAP_THRESHOLD: i32 = 1 << 20;

/// Free memory at the top of an arena that `free` keeps instead of giving it back at once
/// (`M_TRIM_THRESHOLD`; glibc's default is 128 KiB, moved with the mmap threshold). With
/// the default a batch of encoded frames freed together shrank the heap and the next batch
/// faulted every page in again: a quarter of the float codec's encoding time in
/// `ckptfs-bench codec`, 0.70 -> 1.12 GiB/s on fp32 with this. The daemon gives freed
/// memory back once a second anyway (`malloc_trim`), so its resident memory stays bounded
/// by what it held within a second, not by this.
pub const TRIM_THRESHOLD: i32 = 64 << 20;

/// Sets the above. Call before other threads start (mallopt is not thread-safe).
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; the caller calls it before other
    // threads start.
    unsafe {
        for (param, value, what) in [
            (libc::M_ARENA_MAX, ARENAS, "arenas"),
            (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD, "mmap threshold"),
            (libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD, "trim threshold"),
        ] {
            if libc::mallopt(param, value) != 1 {
                log::warn!("could not set malloc's {what} to {value} (mallopt failed)");
            }
        }
    }
}
