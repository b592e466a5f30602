//! Intents: how the nodes of a shared namespace serialise changes to the same names without
//! a server (FORMAT.md "Intents").
//!
//! A change announces the keys it touches (hashes of a name in a directory, of a
//! directory's existence, of "a directory moves") in its slot's hint, makes that visible,
//! and reads every other slot's hint. Two announcements of conflicting keys cannot both be
//! missed by each other: of two nodes that write then read, the later reader sees the
//! earlier writer. So:
//! - a change that sees a conflicting intent older than its own (lower `(prio, slot)`)
//!   withdraws, waits a little, and announces again with the same priority (it ages, so
//!   it is not starved);
//! - a change that sees only younger conflicting intents keeps its own and waits until
//!   each of them is withdrawn or replaced: a younger change either saw this one and
//!   withdraws, or did not and is already under way, and finishes;
//! - then it reads what the others published (a refresh that starts after the wait), so
//!   every change it conflicts with that finished before is in its view, checks what
//!   POSIX requires against that view, commits, publishes, and withdraws its intent.
//!
//! Intents of a slot whose lease ran out are ignored: its owner is fenced before a taker
//! could have claimed it. Waiting is bounded (`WAIT_LEASES` leases): past that the
//! change fails with `NamespaceBusy` rather than hang a system call.

use crate::error::{Error, Result};
use crate::format::{InodeId, Intent, SlotId, INTENT_KEYS};
use crate::manifest::Union;
use crate::slots::Lease;
use std::time::{Duration, Instant};

/// How long a change waits for other nodes' changes of the same names, in leases.
const WAIT_LEASES: u32 = 3;

/// The key of every directory rename: they are serialised among themselves, so a check
/// that a directory does not move into its own subtree sees a tree no other node changes.
pub const RENAME_DIRS: u64 = 0x5245_4e41_4d45_4449;

fn hash_key(parts: &[&[u8]], exclusive: bool) -> u64 {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let k = u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8"));
    // Bit 0 says exclusive; 0 is no key.
    let k = (k & !1) | exclusive as u64;
    if k & !1 == 0 {
        2 | exclusive as u64
    } else {
        k
    }
}

/// The key of name `name` in directory `parent`.
pub fn name_key(parent: InodeId, name: &[u8], exclusive: bool) -> u64 {
    hash_key(&[b"name", &parent.0.to_le_bytes(), name], exclusive)
}

/// The key of directory `dir`'s existence: held shared by every change that adds a name
/// in it, exclusively by its removal.
pub fn dir_key(dir: InodeId, exclusive: bool) -> u64 {
    hash_key(&[b"dir", &dir.0.to_le_bytes()], exclusive)
}

/// The exclusive form of a key.
pub fn exclusive(k: u64) -> u64 {
    k | 1
}

/// Held while a change of the shared namespace is made; withdraws the intent when dropped.
/// Holds this node's other changes of names off meanwhile (`Lease::changing`).
pub struct NsGuard<'a> {
    lease: &'a Lease,
    _one: Option<parking_lot::MutexGuard<'a, ()>>,
}

impl Drop for NsGuard<'_> {
    fn drop(&mut self) {
        // The intent is withdrawn before the next change of this node may announce its own
        // (fields drop after this body).
        if let Err(e) = self.lease.clear_intent() {
            // A fenced or failing owner: its intent stays until its lease runs out, after
            // which the others ignore it.
            log::warn!("withdrawing this slot's namespace intent: {e}");
        }
    }
}

/// Announces `keys` (at most `INTENT_KEYS`; duplicates merged, exclusive winning) and
/// waits until this change may go on (the module comment). `prio` is the change's stamp.
pub fn lock<'a>(lease: &'a Lease, union: &Union, keys: &[u64], prio: u64) -> Result<NsGuard<'a>> {
    let mut merged: Vec<u64> = Vec::with_capacity(INTENT_KEYS);
    for &k in keys {
        match merged.iter_mut().find(|m| **m | 1 == k | 1) {
            Some(m) => *m |= k & 1,
            None => merged.push(k),
        }
    }
    assert!(
        merged.len() <= INTENT_KEYS,
        "a namespace change names {} keys, at most {INTENT_KEYS} fit an intent",
        merged.len()
    );
    let mut mine = [0u64; INTENT_KEYS];
    mine[..merged.len()].copy_from_slice(&merged);
    let me = Intent {
        seq: 0,
        prio,
        keys: mine,
    };
    let my_slot = lease.slot();
    let started = Instant::now();
    let limit = lease.lease_len() * WAIT_LEASES;
    let mut backoff = Duration::from_micros(500);
    // One change of names of this node at a time, from its announcement to its withdrawal
    // (the slot's hint holds one intent). Held across a retry's wait too: the next change
    // of this node would only meet the same older change of another node.
    let mut one = Some(lease.changing.lock());
    loop {
        lease
            .announce(mine, prio)
            .map_err(|e| match lease.fenced() {
                Some(why) => Error::Fenced(why),
                None => Error::from(e),
            })?;
        let mut guard = NsGuard { lease, _one: None };
        let seen = union.intents()?;
        let live = |slot: SlotId| -> Result<bool> {
            let h = union.table().read(slot)?;
            Ok(crate::slots::is_live(&h, crate::slots::now_unix_ns()))
        };
        let mut older = false;
        let mut younger: Vec<(SlotId, u64)> = Vec::new();
        for s in &seen {
            if !me.conflicts(&s.intent) || !live(s.slot)? {
                continue;
            }
            if (s.intent.prio, s.slot) < (prio, my_slot) {
                older = true;
                break;
            }
            younger.push((s.slot, s.intent.seq));
        }
        if older {
            // Withdraws, keeping this node's turn.
            drop(guard);
            if started.elapsed() > limit {
                return Err(busy(started));
            }
            // Let the older change finish: a random part of a growing wait, so two
            // changes that keep meeting fall out of step.
            let jitter = (crate::slots::now_unix_ns() % 1000) as u32;
            std::thread::sleep(backoff.mul_f64(0.5 + jitter as f64 / 2000.0));
            backoff = (backoff * 2).min(Duration::from_millis(50));
            continue;
        }
        // Younger conflicting changes finish (or withdraw) without waiting for this one.
        let mut poll = Duration::from_micros(200);
        while !younger.is_empty() {
            if started.elapsed() > limit {
                return Err(busy(started));
            }
            std::thread::sleep(poll);
            poll = (poll * 2).min(Duration::from_millis(10));
            let now = union.intents()?;
            let mut still = Vec::new();
            for (slot, seq) in younger {
                let same = now
                    .iter()
                    .any(|s| s.slot == slot && s.intent.seq == seq && me.conflicts(&s.intent));
                if same && live(slot)? {
                    still.push((slot, seq));
                }
            }
            younger = still;
        }
        guard._one = one.take();
        return Ok(guard);
    }
}

fn busy(since: Instant) -> Error {
    Error::NamespaceBusy(format!(
        "another node has been changing the same names for {:.1} s without finishing; \
         try again",
        since.elapsed().as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_conflict_only_when_one_side_is_exclusive() {
        let a = name_key(InodeId(1), b"x", true);
        let a_shared = name_key(InodeId(1), b"x", false);
        assert_eq!(a, exclusive(a_shared));
        assert_ne!(a, name_key(InodeId(1), b"y", true));
        assert_ne!(dir_key(InodeId(1), true), name_key(InodeId(1), b"", true));
        let i = |keys: &[u64]| {
            let mut k = [0; INTENT_KEYS];
            k[..keys.len()].copy_from_slice(keys);
            Intent {
                seq: 1,
                prio: 1,
                keys: k,
            }
        };
        let shared = dir_key(InodeId(5), false);
        assert!(!i(&[shared]).conflicts(&i(&[shared])));
        assert!(i(&[exclusive(shared)]).conflicts(&i(&[shared])));
        assert!(i(&[a]).conflicts(&i(&[a_shared, 8])));
        assert!(!i(&[a]).conflicts(&i(&[name_key(InodeId(2), b"x", true)])));
        assert!(!i(&[]).conflicts(&i(&[a])));
    }
}
