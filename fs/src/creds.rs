//! Who asks: the ids and capabilities a POSIX decision of the daemon needs.
//!
//! FUSE passes the caller's fsuid, fsgid and pid with a request, and nothing of its
//! supplementary groups or capabilities. Once the daemon accepts idmapped mounts
//! (FUSE_ALLOW_IDMAP), the kernel passes the ids only with requests that create a node and
//! sends -1 with every other one. So the decisions that need more (whether a writer keeps
//! the setid bits, whether it may run a control operation, whether it sees `trusted.`
//! names) read the calling thread's credentials from `/proc/<pid>/status`: its fs ids, its
//! groups and its effective capabilities, which is what ext4 consults.
//!
//! What this cannot see: the idmap of the mount a request came through. The ids read here
//! are the kernel's own, while a file's owner is compared by the kernel through the mount's
//! idmap; the README lists the one rule where that matters.

/// CAP_FOWNER: may chmod any file (linux/capability.h).
pub const CAP_FOWNER: u32 = 3;
/// CAP_FSETID: keeps setid bits on write and truncate.
pub const CAP_FSETID: u32 = 4;
/// CAP_SYS_ADMIN: may read and write `trusted.` extended attributes.
pub const CAP_SYS_ADMIN: u32 = 21;

/// What FUSE sends for an id it does not pass (FUSE_INVALID_UIDGID).
pub const UNKNOWN_ID: u32 = u32::MAX;

/// A caller's credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The fs uid and gid: what permission checks use.
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// Effective capability set, one bit per capability number.
    pub caps: u64,
}

impl Credentials {
    /// The credentials of the thread `pid` that sent a request carrying `uid`/`gid`. When the
    /// thread is gone, or was never visible here (pid 0: a request the kernel makes itself, or
    /// one from another pid namespace), falls back to the request's ids, with every
    /// capability for uid 0 and none for anyone else (an unknown id included).
    pub fn of(pid: u32, uid: u32, gid: u32) -> Credentials {
        if pid != 0 {
            if let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if let Some(c) = Self::parse(&st) {
                    return c;
                }
            }
        }
        Credentials {
            uid,
            gid,
            groups: Vec::new(),
            caps: if uid == 0 { u64::MAX } else { 0 },
        }
    }

    /// Parses a `/proc/<pid>/status` text: `Uid:` and `Gid:` (real, effective, saved, fs),
    /// `Groups:` and `CapEff:` (hex).
    pub fn parse(status: &str) -> Option<Credentials> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::split_whitespace)
        };
        let fs_id = |name: &str| field(name)?.nth(3)?.parse::<u32>().ok();
        Some(Credentials {
            uid: fs_id("Uid:")?,
            gid: fs_id("Gid:")?,
            groups: field("Groups:")?.filter_map(|g| g.parse().ok()).collect(),
            caps: u64::from_str_radix(field("CapEff:")?.next()?, 16).ok()?,
        })
    }

    /// Whether the effective set holds capability `cap`.
    pub fn has(&self, cap: u32) -> bool {
        cap < 64 && self.caps & (1 << cap) != 0
    }

    /// Whether the caller is in group `gid`, as its fs gid or a supplementary group.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The sender of one request, with its credentials read from `/proc` when first needed:
/// most requests never need them, and a read costs a file open.
#[derive(Debug)]
pub struct Requester {
    pid: u32,
    uid: u32,
    gid: u32,
    creds: std::cell::OnceCell<Credentials>,
}

impl Requester {
    /// The request's pid, uid and gid as FUSE sent them.
    pub fn new(pid: u32, uid: u32, gid: u32) -> Requester {
        Requester {
            pid,
            uid,
            gid,
            creds: std::cell::OnceCell::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn credentials(&self) -> &Credentials {
        self.creds
            .get_or_init(|| Credentials::of(self.pid, self.uid, self.gid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tsh\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t7\n\
        Uid:\t1000\t1000\t1000\t1001\nGid:\t100\t100\t100\t101\nFDSize:\t64\n\
        Groups:\t4 24 27 \nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
        CapEff:\t0000000000000010\n";

    #[test]
    fn reads_fs_ids_groups_and_effective_capabilities() {
        let c = Credentials::parse(STATUS).expect("parses");
        assert_eq!((c.uid, c.gid), (1001, 101), "fs ids are the fourth column");
        assert_eq!(c.groups, vec![4, 24, 27]);
        assert!(c.has(CAP_FSETID));
        assert!(!c.has(CAP_FOWNER) && !c.has(CAP_SYS_ADMIN));
        assert!(c.in_group(101) && c.in_group(24) && !c.in_group(100));
    }

    #[test]
    fn a_thread_that_is_gone_has_the_request_ids_and_no_capability() {
        let c = Credentials::of(0, 65534, 65534);
        assert_eq!((c.uid, c.gid, c.caps), (65534, 65534, 0));
        assert!(Credentials::of(0, 0, 0).has(CAP_FSETID));
        assert!(!Credentials::of(0, UNKNOWN_ID, UNKNOWN_ID).has(CAP_FSETID));
    }

    #[test]
    fn this_process_is_read_from_proc() {
        // SAFETY: getpid/geteuid have no preconditions.
        let (pid, euid) = unsafe { (libc::getpid(), libc::geteuid()) };
        let c = Credentials::of(pid as u32, UNKNOWN_ID, UNKNOWN_ID);
        assert_eq!(c.uid, euid, "fsuid follows euid");
    }
}
