//! Pins: what gc must keep while someone still needs it. A pin is a guard: dropping it
//! unpins, so no caller has to remember to.
//!
//! - Revision pins: the revisions open files read from (and restores copy).
//! - Kernel references (`hold`/`forget`): inodes the kernel has looked up and not yet
//!   forgotten. The kernel opens, stats and reopens (`/proc/self/fd`, an `O_PATH` handle) an
//!   inode it holds by number alone, after a rename over its name or an unlink, so gc keeps
//!   the record of an unlinked inode while the kernel holds it, as it does for an open one.
//! - Chunk pins (`ChunkPins`): the chunks an uncommitted file state refers to (stored by it,
//!   found by dedup, or named by a metadata-only copy). The store counts them; the state
//!   owns them and they go when it commits or is dropped.
//!
//! Taking a pin and loading the revision happen under the space's pin gate (shared), and gc
//! samples the pins under the same gate (exclusive) right before its retention commits:
//! a revision is never dropped under a reader that pinned it after gc started, and a
//! reader never loads a revision gc already dropped without noticing (the load fails).
//!
//! Bound: one entry per open file and per restore in progress.

use crate::format::{ChunkHash, InodeId, RevisionId};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// The pins of one space.
#[derive(Default)]
pub(crate) struct RevisionPins {
    /// pin id -> (revision, the open inode that holds it, if one does)
    pins: Mutex<HashMap<u64, (RevisionId, Option<InodeId>)>>,
    next: AtomicU64,
    /// inode -> lookups the kernel has not forgotten (FUSE's `nlookup`). Bound: one entry
    /// per inode in the kernel's inode cache, which the kernel bounds (it forgets inodes
    /// under memory pressure and all of them at unmount).
    held: Mutex<HashMap<InodeId, u64>>,
    /// Notified when the kernel forgets an inode for good (`wait_forgotten`).
    forgot: parking_lot::Condvar,
}

impl RevisionPins {
    pub(crate) fn pin(self: &Arc<Self>, rev: RevisionId, ino: Option<InodeId>) -> RevisionPin {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.pins.lock().insert(id, (rev, ino));
        RevisionPin {
            pins: self.clone(),
            id,
        }
    }

    /// Adds every pinned revision, every inode a pin holds open and every inode the kernel
    /// holds.
    pub(crate) fn sample(&self, revs: &mut HashSet<RevisionId>, inos: &mut HashSet<InodeId>) {
        for (rev, ino) in self.pins.lock().values() {
            revs.insert(*rev);
            if let Some(i) = ino {
                inos.insert(*i);
            }
        }
        inos.extend(self.held.lock().keys().copied());
    }

    /// One more kernel reference to `ino`.
    pub(crate) fn hold(&self, ino: InodeId) {
        *self.held.lock().entry(ino).or_default() += 1;
    }

    /// The kernel forgot `n` references to `ino`. More than were counted (an inode held
    /// before a lookup raced with gc, see `Space::hold_inode`) just ends the count.
    pub(crate) fn forget(&self, ino: InodeId, n: u64) {
        let mut held = self.held.lock();
        if let Some(c) = held.get_mut(&ino) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                held.remove(&ino);
                self.forgot.notify_all();
            }
        }
    }

    /// Waits until the kernel holds none of `inos`, at most `limit`; whether it holds none.
    pub(crate) fn wait_forgotten(&self, inos: &[InodeId], limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut held = self.held.lock();
        loop {
            if !inos.iter().any(|i| held.contains_key(i)) {
                return true;
            }
            if self.forgot.wait_until(&mut held, deadline).timed_out() {
                return !inos.iter().any(|i| held.contains_key(i));
            }
        }
    }
}

/// Keeps one revision from gc while it lives.
pub struct RevisionPin {
    pins: Arc<RevisionPins>,
    id: u64,
}

impl RevisionPin {
    pub fn revision(&self) -> RevisionId {
        self.pins.pins.lock()[&self.id].0
    }

    /// Moves the pin to `rev`: a file that committed reads its new revision from now on.
    /// The new revision is current, so retention keeps it whatever gc sampled before.
    pub fn set(&self, rev: RevisionId) {
        if let Some(p) = self.pins.pins.lock().get_mut(&self.id) {
            p.0 = rev;
        }
    }
}

impl Drop for RevisionPin {
    fn drop(&mut self) {
        self.pins.pins.lock().remove(&self.id);
    }
}

impl std::fmt::Debug for RevisionPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RevisionPin({})", self.revision().0)
    }
}

/// Who counts chunk pins (the chunk store): told once per pin when a `ChunkPins` lets go.
pub trait ReleasePins: Send + Sync {
    fn release(&self, hashes: &[ChunkHash]);
}

/// Chunk pins held by one owner (a file state, a copy in progress): one entry per pin taken,
/// all released when this is dropped. The counter is held weakly: pins outliving their
/// store have nothing left to release.
///
/// Bound: one entry per chunk put or pasted since the owner's last commit.
#[must_use = "dropping chunk pins releases them at once"]
pub struct ChunkPins {
    owner: Option<Weak<dyn ReleasePins>>,
    hashes: Vec<ChunkHash>,
}

impl ChunkPins {
    /// An empty set whose pins `owner` counts.
    pub fn new(owner: Weak<dyn ReleasePins>) -> ChunkPins {
        ChunkPins {
            owner: Some(owner),
            hashes: Vec::new(),
        }
    }

    /// For chunk stores that count no pins (in-memory test stores).
    pub fn detached() -> ChunkPins {
        ChunkPins {
            owner: None,
            hashes: Vec::new(),
        }
    }

    /// Takes over one pin the owner has counted already for `h`.
    pub(crate) fn adopt(&mut self, h: ChunkHash) {
        self.hashes.push(h);
    }

    /// Takes over every pin of `other` (same owner).
    pub(crate) fn absorb(&mut self, mut other: ChunkPins) {
        debug_assert!(
            match (&self.owner, &other.owner) {
                (Some(a), Some(b)) => Weak::ptr_eq(a, b),
                (a, b) => a.is_none() && b.is_none(),
            },
            "pins of two different stores"
        );
        self.hashes.append(&mut other.hashes);
    }

    /// Moves the pins out into a new set, leaving this one empty (and still usable).
    pub(crate) fn split_off(&mut self) -> ChunkPins {
        ChunkPins {
            owner: self.owner.clone(),
            hashes: std::mem::take(&mut self.hashes),
        }
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

impl Drop for ChunkPins {
    fn drop(&mut self) {
        if self.hashes.is_empty() {
            return;
        }
        if let Some(owner) = self.owner.as_ref().and_then(Weak::upgrade) {
            owner.release(&self.hashes);
        }
    }
}

impl std::fmt::Debug for ChunkPins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkPins({})", self.hashes.len())
    }
}
