//! The records of a space over storage targets (FORMAT.md "Targets"): a target file's
//! header, the `targets` table (redundancy, geometry, every target's path, failure domain,
//! mirror and failed flags) and the `placement` file's per-segment records. The erasure
//! coding and placement that use them are `crate::targets`; only the bytes are here.

use crate::error::Corruption;
use std::path::PathBuf;

/// Bytes before the first shard slot of a target file (its header).
pub(crate) const TARGET_HEADER_BYTES: u64 = 4096;
/// Bytes of one segment's record in the placement file.
pub const RECORD_BYTES: usize = 128;
/// Most shards (M+K) a segment may have: what a record holds.
pub(crate) const MAX_SHARDS: usize = 16;
const TARGET_MAGIC: &[u8; 8] = b"CKPTFSTG";
const TARGET_VERSION: u32 = 1;

/// M data shards and K parity shards per segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Redundancy {
    pub data: usize,
    pub parity: usize,
}

impl Redundancy {
    pub fn shards(self) -> usize {
        self.data + self.parity
    }

    /// Parses "M+K".
    pub fn parse(s: &str) -> Result<Redundancy, String> {
        let (m, k) = s
            .split_once('+')
            .ok_or_else(|| format!("redundancy {s:?} is not M+K (for example 3+2)"))?;
        let p = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("redundancy {s:?} is not M+K (for example 3+2)"))
        };
        let r = Redundancy {
            data: p(m)?,
            parity: p(k)?,
        };
        if r.data == 0 || r.shards() > MAX_SHARDS {
            return Err(format!(
                "redundancy {s}: need at least 1 data shard and at most {MAX_SHARDS} shards in all"
            ));
        }
        Ok(r)
    }
}

impl std::fmt::Display for Redundancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.data, self.parity)
    }
}

/// The header of a target file (its first 4 KiB): which space, which target, what layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TargetHeader {
    pub space_uuid: [u8; 16],
    pub index: u16,
    pub shard_bytes: u64,
    pub slots: u64,
}

impl TargetHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; TARGET_HEADER_BYTES as usize];
        b[0..8].copy_from_slice(TARGET_MAGIC);
        b[8..12].copy_from_slice(&TARGET_VERSION.to_le_bytes());
        b[12..14].copy_from_slice(&self.index.to_le_bytes());
        b[16..32].copy_from_slice(&self.space_uuid);
        b[32..40].copy_from_slice(&self.shard_bytes.to_le_bytes());
        b[40..48].copy_from_slice(&self.slots.to_le_bytes());
        let sum = blake3::hash(&b[..4064]);
        b[4064..4096].copy_from_slice(sum.as_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<TargetHeader, Corruption> {
        if b.len() < TARGET_HEADER_BYTES as usize || &b[0..8] != TARGET_MAGIC {
            return Err(record_err(
                "target file header",
                "not a ckptfs target file (no CKPTFSTG header)",
            ));
        }
        if blake3::hash(&b[..4064]).as_bytes() != &b[4064..4096] {
            return Err(record_err(
                "target file header",
                "its header fails its checksum",
            ));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default());
        if version != TARGET_VERSION {
            return Err(record_err(
                "target file header",
                format!("unknown target file version {version}"),
            ));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let mut space_uuid = [0u8; 16];
        space_uuid.copy_from_slice(&b[16..32]);
        Ok(TargetHeader {
            space_uuid,
            index: u16::from_le_bytes([b[12], b[13]]),
            shard_bytes: u64_at(32),
            slots: u64_at(40),
        })
    }
}

const TABLE_MAGIC: &[u8; 8] = b"CKPTTGTS";
const TABLE_VERSION: u32 = 1;
const TABLE_HEAD: usize = 64;
const TABLE_ENTRY: usize = 512;
const MAX_PATH: usize = 440;
const MAX_DOMAIN: usize = 62;

/// A target as given to `format --target DIR[:domain=LABEL]`. Without a label (an empty
/// `domain`) each target is its own failure domain, which format names `targetN`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    pub path: PathBuf,
    pub domain: String,
}

impl TargetSpec {
    pub fn parse(s: &str) -> Result<TargetSpec, String> {
        let (path, domain) = match s.rsplit_once(":domain=") {
            Some((p, d)) => (p, Some(d)),
            None => (s, None),
        };
        if path.is_empty() {
            return Err(format!("target {s:?} names no directory"));
        }
        // No label: its own domain, named `targetN` by format.
        let domain = domain.unwrap_or_default().to_string();
        if (domain.is_empty() && s.contains(":domain=")) || domain.len() > MAX_DOMAIN {
            return Err(format!(
                "target {s:?}: a failure-domain label has 1 to {MAX_DOMAIN} bytes"
            ));
        }
        if path.len() > MAX_PATH {
            return Err(format!(
                "target path {path:?} is longer than {MAX_PATH} bytes"
            ));
        }
        Ok(TargetSpec {
            path: PathBuf::from(path),
            domain,
        })
    }
}

/// What the `targets` file records: the redundancy, the geometry, every target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetsTable {
    pub redundancy: Redundancy,
    pub shard_bytes: u64,
    /// Shard slots in each target's file.
    pub slots: u64,
    pub segments: u64,
    pub targets: Vec<TargetSpec>,
    /// Targets that failed while the space was mounted: their shards may be stale, so they
    /// stay failed at every later mount until `rebuild` replaces them.
    pub failed: Vec<bool>,
    /// Targets holding a current mirror of the space's metadata (`mirror.rs`).
    pub mirror: Vec<bool>,
    /// Bumped at every rewrite of the table: of the copies a lost backing directory leaves
    /// on the targets, the newest says which mirrors are current.
    pub generation: u64,
}

impl TargetsTable {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; TABLE_HEAD + self.targets.len() * TABLE_ENTRY];
        b[0..8].copy_from_slice(TABLE_MAGIC);
        b[8..12].copy_from_slice(&TABLE_VERSION.to_le_bytes());
        b[12] = self.redundancy.data as u8;
        b[13] = self.redundancy.parity as u8;
        b[14..16].copy_from_slice(&(self.targets.len() as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.shard_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.slots.to_le_bytes());
        b[32..40].copy_from_slice(&self.segments.to_le_bytes());
        b[40..48].copy_from_slice(&self.generation.to_le_bytes());
        for (i, t) in self.targets.iter().enumerate() {
            let e = &mut b[TABLE_HEAD + i * TABLE_ENTRY..TABLE_HEAD + (i + 1) * TABLE_ENTRY];
            let p = std::os::unix::ffi::OsStrExt::as_bytes(t.path.as_os_str());
            e[0..2].copy_from_slice(&(p.len() as u16).to_le_bytes());
            e[2..2 + p.len()].copy_from_slice(p);
            e[448] = t.domain.len() as u8;
            e[449..449 + t.domain.len()].copy_from_slice(t.domain.as_bytes());
            e[510] = u8::from(self.mirror.get(i).copied().unwrap_or(false));
            e[511] = u8::from(self.failed.get(i).copied().unwrap_or(false));
        }
        let sum = blake3::hash(&b);
        b.extend_from_slice(sum.as_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<TargetsTable, Corruption> {
        if b.len() < TABLE_HEAD + 32 || &b[0..8] != TABLE_MAGIC {
            return Err(record_err("targets table", "not a ckptfs targets table"));
        }
        let (body, sum) = b.split_at(b.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(record_err(
                "targets table",
                "the targets table fails its checksum",
            ));
        }
        let version = u32::from_le_bytes(body[8..12].try_into().unwrap_or_default());
        if version != TABLE_VERSION {
            return Err(record_err(
                "targets table",
                format!("unknown targets table version {version}"),
            ));
        }
        let n = u16::from_le_bytes([body[14], body[15]]) as usize;
        if body.len() != TABLE_HEAD + n * TABLE_ENTRY {
            return Err(record_err(
                "targets table",
                format!("the targets table has the wrong length for {n} targets"),
            ));
        }
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or_default());
        let mut targets = Vec::with_capacity(n);
        let mut failed = Vec::with_capacity(n);
        let mut mirror = Vec::with_capacity(n);
        for i in 0..n {
            let e = &body[TABLE_HEAD + i * TABLE_ENTRY..TABLE_HEAD + (i + 1) * TABLE_ENTRY];
            let pl = (u16::from_le_bytes([e[0], e[1]]) as usize).min(MAX_PATH);
            let dl = (e[448] as usize).min(MAX_DOMAIN);
            let path = PathBuf::from(
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&e[2..2 + pl]),
            );
            targets.push(TargetSpec {
                path,
                domain: String::from_utf8_lossy(&e[449..449 + dl]).into_owned(),
            });
            failed.push(e[511] != 0);
            mirror.push(e[510] != 0);
        }
        Ok(TargetsTable {
            redundancy: Redundancy {
                data: body[12] as usize,
                parity: body[13] as usize,
            },
            shard_bytes: u64_at(16),
            slots: u64_at(24),
            segments: u64_at(32),
            targets,
            failed,
            mirror,
            generation: u64_at(40),
        })
    }

    /// Bytes of each target's file.
    pub fn target_file_bytes(&self) -> u64 {
        TARGET_HEADER_BYTES + self.slots * self.shard_bytes
    }
}

/// Where one shard of a segment lives: a target and a shard slot in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ShardAt {
    pub target: u16,
    pub slot: u32,
}

/// One segment's placement: shard `i` (data for i < M, parity after) and where it is, or
/// None for a parity shard not written (too few healthy targets when it was placed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    /// Counts placements of this segment, so a record rewritten in place is told apart.
    pub generation: u64,
    pub shards: Vec<Option<ShardAt>>,
}

impl Placed {
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..8].copy_from_slice(&self.generation.to_le_bytes());
        b[8] = self.shards.len() as u8;
        for (i, s) in self.shards.iter().enumerate() {
            let at = 16 + i * 6;
            let (t, slot) = s.map_or((u16::MAX, u32::MAX), |s| (s.target, s.slot));
            b[at..at + 2].copy_from_slice(&t.to_le_bytes());
            b[at + 2..at + 6].copy_from_slice(&slot.to_le_bytes());
        }
        let sum = blake3::hash(&b[..112]);
        b[112..128].copy_from_slice(&sum.as_bytes()[..16]);
        b
    }

    /// None for an all-zero record (never placed); an error for a damaged one.
    pub fn decode(b: &[u8]) -> Result<Option<Placed>, Corruption> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if blake3::hash(&b[..112]).as_bytes()[..16] != b[112..128] {
            return Err(record_err("placement record", "fails its checksum"));
        }
        let n = b[8] as usize;
        if n > MAX_SHARDS {
            return Err(record_err("placement record", format!("names {n} shards")));
        }
        let shards = (0..n)
            .map(|i| {
                let at = 16 + i * 6;
                let t = u16::from_le_bytes([b[at], b[at + 1]]);
                let slot = u32::from_le_bytes(b[at + 2..at + 6].try_into().unwrap_or_default());
                (t != u16::MAX).then_some(ShardAt { target: t, slot })
            })
            .collect();
        Ok(Some(Placed {
            generation: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
            shards,
        }))
    }
}

fn record_err(record: &'static str, why: impl Into<String>) -> Corruption {
    Corruption::Record {
        record,
        why: why.into(),
    }
}
