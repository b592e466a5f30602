//! Helpers every scenario uses (sizes, work directories, the binary under test, the N-1
//! ranges): a leaf of the bench's modules, so that scenarios and the report do not import
//! each other through `bench`.

use crate::sys::Result;
use crate::Opts;
use std::fs;
use std::path::{Path, PathBuf};

/// The larger read size tried for a cold single-reader restart.
pub(crate) const BIG_READ: usize = 4 << 20;

/// A byte count as the tables write it: 4K, 64M, 1G (or the bare number).
pub fn size_label(b: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b}")
}

/// The byte ranges process `i` of `procs` writes of a shared `len`-byte file (a multiple of
/// `block` x `procs`): one contiguous part, or every `procs`-th `block` stripe.
pub(crate) fn n1_ranges(
    i: usize,
    procs: usize,
    len: u64,
    block: u64,
    strided: bool,
) -> Vec<(u64, u64)> {
    if strided {
        (i as u64..len / block)
            .step_by(procs)
            .map(|b| (b * block, block))
            .collect()
    } else {
        vec![(i as u64 * (len / procs as u64), len / procs as u64)]
    }
}

/// The `ckptfs` binary: `--ckptfs`, else target/release/ckptfs of this workspace.
pub(crate) fn ckptfs_bin(o: &Opts) -> Result<PathBuf> {
    let p = match &o.ckptfs {
        Some(p) => p.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/ckptfs"),
    };
    if !p.is_file() {
        return Err(format!(
            "no ckptfs binary at {}: build it (cargo build --release -p ckptfs) or pass --ckptfs PATH",
            p.display()
        ));
    }
    fs::canonicalize(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// The median of `v` (the upper one of an even count), sorting it.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub(crate) fn fresh_dir(p: &Path) -> Result<()> {
    match fs::remove_dir_all(p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("remove {}: {e}", p.display())),
    }
    fs::create_dir_all(p).map_err(|e| format!("create {}: {e}", p.display()))
}
