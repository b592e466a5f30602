//! What the kernel was told of names and attributes on a close-to-open mount of a
//! multi-slot space (`ckptfs mount --coherence close-to-open`, README "Several nodes").
//!
//! On such a mount the kernel keeps names and attributes for `C2O_TTL` instead of asking
//! the daemon at every path walk and stat: one `stat` of a file was five requests, each
//! reading the other slots' hints, about 0.3 ms against 2 us on a plain directory. What it
//! keeps may be up to `C2O_TTL` old where another node changed it, so an open checks it,
//! as NFS's close-to-open does: the daemon reads what every node published, and where the
//! name the kernel walked (or a directory above it) no longer leads to the inode it opens,
//! it answers ESTALE, on which the kernel walks the path again asking the daemon for every
//! name (LOOKUP_REVAL). Where only the attributes moved (another node wrote the file), it
//! drops the kernel's attributes, so a read past the old end asks for the new size; an
//! O_APPEND open, which writes at the kernel's size without asking, gets ESTALE then too.
//!
//! Bounds: `TOLD_MAX` inodes (the names of the last `C2O_TTL` are all that matters: an
//! older name the kernel asks for again before using it), `REFUSED_MAX` refusals.

use fuser::FileAttr;
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

/// How long the kernel keeps names and attributes on a close-to-open mount: what a stat
/// may show late of another node's change. The same as a single-slot mount's.
pub(crate) const C2O_TTL: Duration = Duration::from_secs(1);
/// How old a read of the other slots' records a lookup or getattr that finds its object
/// may use on a close-to-open mount (`Fs::set_lookup_window`): the kernel keeps what it is
/// told for `C2O_TTL` anyway, and an `ls -l` asked for one name per file, each reading the
/// hints (0.5 s of 5,000 files' 0.52). So a stat may show a change up to 1.1 s late.
pub(crate) const LOOKUP_WINDOW: Duration = Duration::from_millis(100);
/// Inodes whose last name and attributes are kept (about 100 bytes each).
const TOLD_MAX: usize = 1 << 17;
/// Directories above an opened file that an open checks (deeper trees stop there).
const CHAIN_MAX: usize = 256;
/// Refusals awaiting the kernel's retry that are remembered.
const REFUSED_MAX: usize = 4096;
/// How long a refusal waits for the kernel's retry (which follows at once).
const REFUSE_AGAIN_AFTER: Duration = Duration::from_secs(1);
/// A name told this long ago was asked for again before the kernel used it (its entry
/// expired at `C2O_TTL`; twice that leaves room for the kernel's rounding to its ticks).
const TOLD_FOR: Duration = Duration::from_secs(2);

/// The attributes an open compares: what another node's change moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Print {
    size: u64,
    mtime: SystemTime,
    ctime: SystemTime,
    perm: u16,
    uid: u32,
    gid: u32,
    nlink: u32,
}

impl Print {
    pub(crate) fn of(a: &FileAttr) -> Print {
        Print {
            size: a.size,
            mtime: a.mtime,
            ctime: a.ctime,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
        }
    }
}

struct Entry {
    parent: u64,
    name: Box<[u8]>,
    at: Instant,
    print: Print,
}

/// What an open checks of inode `ino`: the names from it up to the root as the kernel was
/// told them, and the attributes it was told last.
pub(crate) struct Chain {
    /// `(parent, name, child)`, the opened inode's own name first.
    pub(crate) links: Vec<(u64, Vec<u8>, u64)>,
    /// None where nothing was told of it in the last `TOLD_FOR` (forgotten, or never).
    pub(crate) print: Option<Print>,
}

#[derive(Default)]
pub(crate) struct Told {
    by_ino: HashMap<u64, Entry>,
    refused: HashMap<u64, Instant>,
}

impl Told {
    /// The kernel was told `a` under `name` in `parent` (a lookup, a create, a listing).
    pub(crate) fn named(&mut self, parent: u64, name: &[u8], a: &FileAttr) {
        if name == b"." || name == b".." {
            return;
        }
        let now = Instant::now();
        if self.by_ino.len() >= TOLD_MAX && !self.by_ino.contains_key(&a.ino.0) {
            self.by_ino
                .retain(|_, e| now.duration_since(e.at) < TOLD_FOR);
            if self.by_ino.len() >= TOLD_MAX {
                // More names than that in two seconds: forgotten ones are refused once at
                // their open (`Chain::print` None) and told again.
                self.by_ino.clear();
            }
        }
        self.by_ino.insert(
            a.ino.0,
            Entry {
                parent,
                name: name.into(),
                at: now,
                print: Print::of(a),
            },
        );
    }

    /// The kernel was told `a` without a name (getattr, setattr).
    pub(crate) fn attrs(&mut self, a: &FileAttr) {
        if let Some(e) = self.by_ino.get_mut(&a.ino.0) {
            e.print = Print::of(a);
        }
    }

    /// What an open of `ino` checks (`Chain`).
    pub(crate) fn chain(&self, ino: u64) -> Chain {
        let now = Instant::now();
        let fresh = |i: u64| {
            self.by_ino
                .get(&i)
                .filter(|e| now.duration_since(e.at) < TOLD_FOR)
        };
        let print = fresh(ino).map(|e| e.print);
        let mut links = Vec::new();
        let mut at = ino;
        // A name told longer ago than `TOLD_FOR` was not walked without asking: the
        // chain ends there (and at the root, which has no name).
        while let Some(e) = fresh(at) {
            if links.len() >= CHAIN_MAX {
                break;
            }
            links.push((e.parent, e.name.to_vec(), at));
            at = e.parent;
        }
        Chain { links, print }
    }

    /// Whether an open of `ino` found stale (`stale`) is answered ESTALE. The kernel
    /// retries a refused open once, after asking for every name on its path: an open after
    /// a refusal and a new name for `ino` is that retry, and is let through even where
    /// `ino` moved again in between (a second ESTALE would fail the caller's open). Every
    /// open ends what a refusal left.
    pub(crate) fn refuse(&mut self, ino: u64, stale: bool) -> bool {
        let now = Instant::now();
        let earlier = self.refused.remove(&ino);
        if !stale {
            return false;
        }
        let retry = earlier.is_some_and(|t| {
            now.duration_since(t) < REFUSE_AGAIN_AFTER
                && self.by_ino.get(&ino).is_some_and(|e| e.at >= t)
        });
        if retry {
            return false;
        }
        if self.refused.len() >= REFUSED_MAX {
            self.refused
                .retain(|_, t| now.duration_since(*t) < REFUSE_AGAIN_AFTER);
            if self.refused.len() >= REFUSED_MAX {
                self.refused.clear();
            }
        }
        self.refused.insert(ino, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuser::{FileType, INodeNo};

    fn attr(ino: u64, size: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    #[test]
    fn a_chain_runs_from_the_file_to_the_root() {
        let mut t = Told::default();
        t.named(1, b"a", &attr(10, 0));
        t.named(10, b"b", &attr(20, 0));
        t.named(20, b"latest", &attr(30, 7));
        let c = t.chain(30);
        assert_eq!(
            c.links,
            vec![
                (20, b"latest".to_vec(), 30),
                (10, b"b".to_vec(), 20),
                (1, b"a".to_vec(), 10)
            ]
        );
        assert_eq!(c.print, Some(Print::of(&attr(30, 7))));
        t.attrs(&attr(30, 9));
        assert_eq!(t.chain(30).print, Some(Print::of(&attr(30, 9))));
        // Never told: nothing to check against, which the open treats as stale.
        assert!(t.chain(99).print.is_none());
        assert!(t.chain(99).links.is_empty());
    }

    #[test]
    fn a_refused_open_lets_its_retry_through_and_later_opens_are_checked_again() {
        let mut t = Told::default();
        assert!(t.refuse(5, true));
        // Another process's open before the retry's lookup: refused as well.
        assert!(t.refuse(5, true));
        // The retry: a lookup told a name since the refusal.
        t.named(1, b"f", &attr(5, 1));
        assert!(!t.refuse(5, true), "the kernel's retry must get through");
        // A later change is refused again, and a fresh open passes.
        assert!(t.refuse(5, true));
        assert!(!t.refuse(5, false));
        assert!(!t.refuse(6, false));
    }
}
