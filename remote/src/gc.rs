//! gc of the bucket: the newest `KEEP_MANIFESTS` manifests (by sequence number, up to the
//! head) are kept, with every pack they name; any other manifest or pack is deleted once it
//! is older than `GRACE_SECS` (a reader that began with an older head still finds what it
//! names, and a pack another upload is writing right now is not taken for garbage). Under
//! the checkpoint-rotation pattern (keep N step directories, delete the oldest) a deleted
//! step's packs stop being named after `KEEP_MANIFESTS` more uploads, so the bucket holds
//! about the local space's live data plus what the last manifests named.
//!
//! A pack is kept whole while any chunk in it is named (packs are not rewritten): a pack of
//! 32 MiB with one live chunk stays. Compaction of such packs is not done yet.

use crate::bucket::Bucket;
use crate::manifest::{manifest_seq, Manifest, MANIFESTS, PACKS};
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{BTreeSet, HashSet};

/// Manifests kept behind (and including) the head.
pub const KEEP_MANIFESTS: usize = 3;
/// Age before an unnamed object may be deleted.
pub const GRACE_SECS: i64 = 600;

/// What a gc of the bucket did (or would do, `dry_run`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct BucketGc {
    pub dry_run: bool,
    pub manifests_kept: u64,
    pub packs_kept: u64,
    pub bytes_kept: u64,
    pub manifests_deleted: Vec<String>,
    pub packs_deleted: Vec<String>,
    pub bytes_deleted: u64,
    /// Unnamed objects left because they are younger than the grace period.
    pub young_kept: u64,
}

/// Collects the bucket whose head is `head_seq` (see the module doc); `now_unix` is the
/// clock the grace is measured by.
pub fn collect(bucket: &Bucket, head_seq: u64, now_unix: i64, dry_run: bool) -> Result<BucketGc> {
    let mut r = BucketGc {
        dry_run,
        ..Default::default()
    };
    let manifests = bucket.list(MANIFESTS)?;
    let seqs: BTreeSet<u64> = manifests
        .iter()
        .filter_map(|m| manifest_seq(&m.rel))
        .filter(|s| *s <= head_seq)
        .collect();
    let keep_seqs: HashSet<u64> = seqs.iter().rev().take(KEEP_MANIFESTS).copied().collect();
    let mut named: HashSet<String> = HashSet::new();
    let mut doomed = Vec::new();
    for m in &manifests {
        let young = now_unix - m.modified_unix < GRACE_SECS;
        let keep = match manifest_seq(&m.rel) {
            Some(s) => keep_seqs.contains(&s) || young,
            None => true, // not ours: never deleted
        };
        if !keep {
            doomed.push(m.rel.clone());
            continue;
        }
        if manifest_seq(&m.rel).is_none() {
            continue;
        }
        r.manifests_kept += 1;
        let (b, _) = match bucket.get(&m.rel)? {
            Some(x) => x,
            None => continue,
        };
        // Older manifests are not named by the head with their blake3: one that does not
        // read stops this gc (nothing is deleted on a guess).
        let man = Manifest::decode_unchecked(&b).map_err(|e| {
            Error::Damaged(format!(
                "{}: {e}; bucket gc stopped, nothing deleted",
                m.rel
            ))
        })?;
        named.extend(man.packs);
    }
    let packs = bucket.list(PACKS)?;
    let mut doomed_packs = Vec::new();
    for p in &packs {
        if named.contains(&p.rel) {
            r.packs_kept += 1;
            r.bytes_kept += p.size;
        } else if now_unix - p.modified_unix < GRACE_SECS {
            r.young_kept += 1;
            r.bytes_kept += p.size;
        } else {
            r.bytes_deleted += p.size;
            doomed_packs.push(p.rel.clone());
        }
    }
    if !dry_run {
        // Manifests first: a manifest never names a pack that is gone.
        for m in &doomed {
            bucket.delete(m)?;
        }
        for p in &doomed_packs {
            bucket.delete(p)?;
        }
    }
    r.manifests_deleted = doomed;
    r.packs_deleted = doomed_packs;
    Ok(r)
}
