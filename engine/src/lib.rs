//! ckptfs storage engine: the reserved backing space, chunk store, metadata table and commit.
//! Knows nothing of FUSE; the `fs` crate builds filesystem semantics on top of it.

pub mod advice;
pub mod alloc;
pub mod catalog;
pub mod chunk;
pub mod clock;
pub mod codec;
pub mod device;
pub mod error;
pub mod face;
pub mod format;
pub mod heap;
pub(crate) mod ids;
pub mod layout;
pub mod maintenance;
pub mod manifest;
pub(crate) mod mirror;
pub mod nslock;
pub mod pins;
pub(crate) mod placement;
pub mod read;
pub mod sim;
pub mod slots;
pub mod space;
pub mod stamp;
pub mod store;
pub mod targets;
pub mod usage;
pub mod write;

/// The GPU codec crate, for the daemon to choose a device or the emulation.
pub use ckptfs_kernels as kernels;
pub use error::{DevResult, Error, Fault, MetaFault, Result, TargetFault};
pub use space::{Space, Stats};

/// Parses a byte count with an optional binary suffix: 4096, 64K, 256M, 1G, 1GiB (the CLI's
/// and the benchmark's size arguments).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size too large: {s:?}"))
}
