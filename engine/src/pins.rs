//! Revision pins: the revisions open files read from (and restores copy), which gc must
//! keep. A pin is a guard: dropping it unpins, so no caller has to remember to.
//!
//! Taking a pin and loading the revision happen under the space's pin gate (shared), and gc
//! samples the pins under the same gate (exclusive) right before its retention commits:
//! a revision is never dropped under a reader that pinned it after gc started, and a
//! reader never loads a revision gc already dropped without noticing (the load fails).
//!
//! Bound: one entry per open file and per restore in progress.

use crate::format::{InodeId, RevisionId};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The pins of one space.
#[derive(Default)]
pub struct RevisionPins {
    /// pin id -> (revision, the open inode that holds it, if one does)
    pins: Mutex<HashMap<u64, (RevisionId, Option<InodeId>)>>,
    next: AtomicU64,
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

    /// Adds every pinned revision and every inode a pin holds open.
    pub(crate) fn sample(&self, revs: &mut HashSet<RevisionId>, inos: &mut HashSet<InodeId>) {
        for (rev, ino) in self.pins.lock().values() {
            revs.insert(*rev);
            if let Some(i) = ino {
                inos.insert(*i);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.pins.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
