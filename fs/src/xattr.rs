//! Extended attributes: stored in the metadata table per inode, recorded by each revision of
//! a file, restored with it, and shown on the revision view's files.
//!
//! Namespaces: `user.`, `trusted.` and `security.`. The kernel enforces who may use each
//! (default_permissions: write permission for `user.` sets, CAP_SYS_ADMIN for `trusted.`,
//! `user.` only on regular files and directories) and the size limits (names up to 255 bytes,
//! else ERANGE; values up to 64 KiB, else E2BIG) before a request reaches the daemon; they
//! are checked again here so no caller of this crate can store more. `system.` names (POSIX
//! ACLs) and the labels of Linux security modules (`security.selinux`, `security.SMACK64*`,
//! `security.apparmor`) are not offered: EOPNOTSUPP to get, set and remove, never ENODATA.
//! That answer is what lets `ls -l` stop asking: it probes every file for its SELinux label
//! and its ACL and remembers "not supported" per device, while ENODATA (the kernel caches
//! neither for FUSE) costs two round trips per listed file (20,000 files: 13x plain). A
//! system that runs such a module answers its label itself, in the kernel, before a request
//! reaches a filesystem. On the root, `user.ckptfs.*` names are ckptfs's control interface
//! and cannot be stored.

use super::{Error, Fs, Result};
use ckptfs_engine::face::{InodeId, Timestamp, Xattrs, XATTR_NAME_MAX, XATTR_VALUE_MAX};

/// The control names on the root (see the adapter's control interface).
pub const CONTROL_PREFIX: &[u8] = b"user.ckptfs.";

/// The attribute holding a file's capabilities (setcap).
const FILE_CAPS: &[u8] = b"security.capability";

const NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// Names not offered although their namespace is: the labels of security modules (see the
/// module's comment).
const LSM_LABELS: [&[u8]; 3] = [
    b"security.selinux",
    b"security.SMACK64",
    b"security.apparmor",
];

/// Whether `name` is one ckptfs never stores: outside the offered namespaces, or a security
/// module's label. Its get, set and remove answer EOPNOTSUPP.
fn not_offered(name: &[u8]) -> bool {
    !NAMESPACES.iter().any(|ns| name.starts_with(ns))
        || LSM_LABELS.iter().any(|l| name.starts_with(l))
}

/// setxattr(2)'s flags; neither set: create or replace. Both set is legal and checked in
/// this order, as ext4 does: EEXIST if the attribute exists, else ENODATA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XattrSet {
    /// XATTR_CREATE: fail with EEXIST if the attribute exists.
    pub create: bool,
    /// XATTR_REPLACE: fail with ENODATA if it does not.
    pub replace: bool,
}

fn check_xattr_name(ino: InodeId, name: &[u8]) -> Result<()> {
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::OutOfRange);
    }
    if not_offered(name) {
        return Err(Error::NotSupported);
    }
    let ns = NAMESPACES
        .iter()
        .find(|ns| name.starts_with(ns))
        .expect("not_offered: in an offered namespace");
    if name.len() == ns.len() || name.contains(&0) {
        return Err(Error::Invalid);
    }
    if ino == InodeId::ROOT && name.starts_with(CONTROL_PREFIX) {
        return Err(Error::NotPermitted);
    }
    Ok(())
}

/// The names of `x` as listxattr(2) returns them: each followed by a NUL.
fn name_list(x: &Xattrs) -> Vec<u8> {
    let mut out = Vec::new();
    for n in x.keys() {
        out.extend_from_slice(n);
        out.push(0);
    }
    out
}

impl Fs {
    /// Another slot's object of a shared namespace (its extended attributes are not
    /// published, so it has none here, and setting one is refused).
    fn foreign(&self, ino: InodeId) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| ino != InodeId::ROOT && ckptfs_engine::face::owner_slot(ino) != s.me)
    }

    fn xattrs_of(&self, ino: InodeId) -> Result<Xattrs> {
        if super::view::is_virtual(ino) {
            return self.view_xattrs(ino);
        }
        if self.foreign(ino) {
            // Extended attributes are not published (yet): other slots' objects have none.
            self.getattr(ino)?;
            return Ok(Xattrs::default());
        }
        // An inode that does not exist has no attributes to list: ENOENT, not an empty list.
        self.record(ino)?;
        Ok(self.space.ns().xattrs(ino)?)
    }

    /// getxattr(2): the value, or ENODATA. One table lookup when the attribute exists: the
    /// kernel asks for `security.capability` before page-cache writes, so this is on the
    /// write path.
    pub fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        if name.len() > XATTR_NAME_MAX {
            return Err(Error::OutOfRange);
        }
        if not_offered(name) {
            return Err(Error::NotSupported);
        }
        if super::view::is_virtual(ino) || self.foreign(ino) {
            return self.xattrs_of(ino)?.remove(name).ok_or(Error::NoData);
        }
        match self.space.ns().xattr(ino, name)? {
            Some(v) => Ok(v),
            None => {
                // ENOENT for an inode that is gone; an open one exists (the write path).
                if self.open_node(ino).is_none() {
                    self.record(ino)?;
                }
                Err(Error::NoData)
            }
        }
    }

    /// listxattr(2): the names, each followed by a NUL. `trusted.` names only for a
    /// privileged caller (holding CAP_SYS_ADMIN: see `creds`), as ext4 lists them only to
    /// such a caller; the kernel hides their values from others itself.
    pub fn listxattr(&self, ino: InodeId, privileged: bool) -> Result<Vec<u8>> {
        let mut x = self.xattrs_of(ino)?;
        // A label a build before these were refused stored stays hidden, as its get says.
        x.retain(|n, _| (privileged || !n.starts_with(b"trusted.")) && !not_offered(n));
        Ok(name_list(&x))
    }

    /// setxattr(2). Like any namespace change it is ordered with the others and becomes
    /// durable with the next fsync or close of a written file (or the next durable commit);
    /// the next commit of a file records it in that revision.
    pub fn setxattr(&self, ino: InodeId, name: &[u8], value: &[u8], how: XattrSet) -> Result<()> {
        self.writable(ino)?;
        if self.foreign(ino) {
            // Not published: set here, no other node would see it.
            return Err(Error::NotSupported);
        }
        self.refuse_if_failed()?;
        check_xattr_name(ino, name)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(Error::ValueTooBig);
        }
        // Within the room a record keeps for names and values (ENOSPC past it); the
        // change moves the ctime, stored and in the open copy of the record.
        let now = Timestamp::now();
        let how = ckptfs_engine::face::XattrHow {
            create: how.create,
            replace: how.replace,
        };
        self.xattrs_changed(ino);
        let r = self.space.ns().set_xattr(ino, (name, value), how, now);
        self.xattrs_changed(ino);
        r?;
        self.refresh_open(ino, |r| r.ctime = now);
        Ok(())
    }

    /// Drops the file capabilities (`security.capability`) of `ino`, as the kernel does on
    /// every write and truncate through the page cache, whoever writes. Writes that bypass
    /// it (direct-I/O handles) and the O_TRUNC the daemon does at open come here instead.
    /// One table read when there is nothing to drop.
    pub(crate) fn drop_file_caps(&self, ino: InodeId) -> Result<()> {
        let node = self.open_node(ino);
        let epoch = match &node {
            Some(n) => {
                let n = n.lock();
                if n.no_caps_at == Some(n.xattr_epoch) {
                    return Ok(());
                }
                Some(n.xattr_epoch)
            }
            None => None,
        };
        if self.space.ns().xattr(ino, FILE_CAPS)?.is_none() {
            if let (Some(n), Some(e)) = (node, epoch) {
                // Only if no change came between the epoch read and the table's answer.
                let mut n = n.lock();
                if n.xattr_epoch == e {
                    n.no_caps_at = Some(e);
                }
            }
            return Ok(());
        }
        match self.removexattr(ino, FILE_CAPS) {
            Err(Error::NoData) => Ok(()),
            r => r,
        }
    }

    /// Marks the extended attributes of open inode `ino` changed, so that a write looks for
    /// file capabilities again (`drop_file_caps`). Called before and after a change, so
    /// that a capability check racing it cannot record the answer from before.
    pub(crate) fn xattrs_changed(&self, ino: InodeId) {
        if let Some(n) = self.open_node(ino) {
            let mut n = n.lock();
            n.xattr_epoch += 1;
            n.no_caps_at = None;
        }
    }

    /// removexattr(2): ENODATA if there is no such attribute.
    pub fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<()> {
        self.writable(ino)?;
        if self.foreign(ino) {
            // Another slot's object has none here (`xattrs_of`).
            return Err(Error::NoData);
        }
        self.refuse_if_failed()?;
        if name.len() > XATTR_NAME_MAX {
            return Err(Error::OutOfRange);
        }
        if not_offered(name) {
            return Err(Error::NotSupported);
        }
        let now = Timestamp::now();
        self.space.ns().drop_xattr(ino, name, now)?;
        self.refresh_open(ino, |r| r.ctime = now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_the_offered_namespaces_are_refused() {
        let f = InodeId(5);
        assert!(check_xattr_name(f, b"user.a").is_ok());
        assert!(check_xattr_name(f, b"trusted.a").is_ok());
        assert!(check_xattr_name(f, b"security.capability").is_ok());
        assert!(matches!(
            check_xattr_name(f, b"system.posix_acl_access"),
            Err(Error::NotSupported)
        ));
        for lsm in [
            b"security.selinux".as_slice(),
            b"security.SMACK64EXEC",
            b"security.apparmor",
        ] {
            assert!(matches!(check_xattr_name(f, lsm), Err(Error::NotSupported)));
        }
        assert!(check_xattr_name(f, b"security.s").is_ok());
        assert!(matches!(check_xattr_name(f, b"user."), Err(Error::Invalid)));
        assert!(check_xattr_name(f, b"user.ckptfs.x").is_ok());
        assert!(matches!(
            check_xattr_name(InodeId::ROOT, b"user.ckptfs.x"),
            Err(Error::NotPermitted)
        ));
        let long = [b"user.".as_slice(), &[b'a'; 251]].concat();
        assert!(matches!(check_xattr_name(f, &long), Err(Error::OutOfRange)));
    }
}
