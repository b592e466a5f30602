//! A reference model of one POSIX tree, for tests that drive several nodes of one space with
//! random operations and compare what every node sees with what one local filesystem would
//! show (`tests/tests/namespace_model.rs`).
//!
//! The model keeps inodes apart from names, as a filesystem does: an open handle writes its
//! inode wherever renames have moved it, and a removed inode's later writes show nowhere.
//! Each operation returns the result Linux gives on a local filesystem (`Ok` or the errno),
//! so a test can compare every call, not only the final tree.

use std::collections::{BTreeMap, HashMap};

pub type Ino = u64;
pub const ROOT: Ino = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Obj {
    Dir {
        entries: BTreeMap<String, Ino>,
        mode: u32,
    },
    File {
        data: Vec<u8>,
        mode: u32,
    },
    Symlink(String),
}

/// What a node lists at a path: kind, permission bits, and a file's bytes or a symlink's
/// target.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seen {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink(String),
}

#[derive(Clone, Debug)]
pub struct Model {
    objs: HashMap<Ino, Obj>,
    next: Ino,
}

pub type R<T = ()> = Result<T, i32>;

/// A path's components (no empty ones, no "." or "..").
pub fn comps(path: &str) -> Vec<&str> {
    path.split('/').filter(|c| !c.is_empty()).collect()
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Model {
    pub fn new() -> Model {
        let mut objs = HashMap::new();
        objs.insert(
            ROOT,
            Obj::Dir {
                entries: BTreeMap::new(),
                mode: 0o755,
            },
        );
        Model { objs, next: 2 }
    }

    pub fn obj(&self, ino: Ino) -> Option<&Obj> {
        self.objs.get(&ino)
    }

    /// The inode at `path` without following a final symlink (lstat); `Err` is the errno a
    /// lookup gives (ENOENT, ENOTDIR for a non-directory in the middle).
    pub fn lookup(&self, path: &str) -> R<Ino> {
        let mut ino = ROOT;
        for c in comps(path) {
            match self.objs.get(&ino) {
                Some(Obj::Dir { entries, .. }) => {
                    ino = *entries.get(c).ok_or(libc::ENOENT)?;
                }
                _ => return Err(libc::ENOTDIR),
            }
        }
        Ok(ino)
    }

    /// The directory that holds `path`'s last component, and that component.
    fn parent<'a>(&self, path: &'a str) -> R<(Ino, &'a str)> {
        let c = comps(path);
        let (last, dir) = c.split_last().ok_or(libc::EINVAL)?;
        let mut ino = ROOT;
        for d in dir {
            match self.objs.get(&ino) {
                Some(Obj::Dir { entries, .. }) => ino = *entries.get(*d).ok_or(libc::ENOENT)?,
                _ => return Err(libc::ENOTDIR),
            }
        }
        match self.objs.get(&ino) {
            Some(Obj::Dir { .. }) => Ok((ino, last)),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> &mut BTreeMap<String, Ino> {
        match self.objs.get_mut(&dir) {
            Some(Obj::Dir { entries, .. }) => entries,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    fn child(&self, dir: Ino, name: &str) -> Option<Ino> {
        match self.objs.get(&dir) {
            Some(Obj::Dir { entries, .. }) => entries.get(name).copied(),
            _ => None,
        }
    }

    fn alloc(&mut self, o: Obj) -> Ino {
        let ino = self.next;
        self.next += 1;
        self.objs.insert(ino, o);
        ino
    }

    /// Whether a path crosses a symlink before its last component: the model does not
    /// follow symlinks, so tests do not send such paths.
    pub fn crosses_symlink(&self, path: &str) -> bool {
        let c = comps(path);
        let mut ino = ROOT;
        for d in c.iter().take(c.len().saturating_sub(1)) {
            match self.objs.get(&ino) {
                Some(Obj::Dir { entries, .. }) => match entries.get(*d) {
                    Some(i) => ino = *i,
                    None => return false,
                },
                Some(Obj::Symlink(_)) => return true,
                _ => return false,
            }
        }
        matches!(self.objs.get(&ino), Some(Obj::Symlink(_)))
    }

    pub fn is_symlink(&self, path: &str) -> bool {
        matches!(
            self.lookup(path).ok().and_then(|i| self.objs.get(&i)),
            Some(Obj::Symlink(_))
        )
    }

    pub fn mkdir(&mut self, path: &str, mode: u32) -> R {
        let (p, name) = self.parent(path)?;
        if self.child(p, name).is_some() {
            return Err(libc::EEXIST);
        }
        let ino = self.alloc(Obj::Dir {
            entries: BTreeMap::new(),
            mode,
        });
        self.entries_mut(p).insert(name.to_string(), ino);
        Ok(())
    }

    /// `mkdir -p` (std's `create_dir_all`): every missing directory; an existing
    /// non-directory on the way fails with ENOTDIR, at the end with EEXIST.
    pub fn mkdir_p(&mut self, path: &str, mode: u32) -> R {
        let c = comps(path);
        let mut so_far = String::new();
        for (i, comp) in c.iter().enumerate() {
            so_far.push('/');
            so_far.push_str(comp);
            match self.lookup(&so_far) {
                Ok(ino) => match self.objs.get(&ino) {
                    Some(Obj::Dir { .. }) => {}
                    _ if i + 1 == c.len() => return Err(libc::EEXIST),
                    _ => return Err(libc::ENOTDIR),
                },
                Err(_) => self.mkdir(&so_far, mode)?,
            }
        }
        Ok(())
    }

    /// open(O_WRONLY | O_CREAT [| O_TRUNC]): the file's inode.
    pub fn open_create(&mut self, path: &str, truncate: bool, mode: u32) -> R<Ino> {
        let (p, name) = self.parent(path)?;
        match self.child(p, name) {
            Some(i) => match self.objs.get_mut(&i) {
                Some(Obj::File { data, .. }) => {
                    if truncate {
                        data.clear();
                    }
                    Ok(i)
                }
                Some(Obj::Dir { .. }) => Err(libc::EISDIR),
                _ => Err(libc::ELOOP),
            },
            None => {
                let ino = self.alloc(Obj::File {
                    data: Vec::new(),
                    mode,
                });
                self.entries_mut(p).insert(name.to_string(), ino);
                Ok(ino)
            }
        }
    }

    /// open(O_WRONLY) of an existing file.
    pub fn open_existing(&self, path: &str) -> R<Ino> {
        let i = self.lookup(path)?;
        match self.objs.get(&i) {
            Some(Obj::File { .. }) => Ok(i),
            Some(Obj::Dir { .. }) => Err(libc::EISDIR),
            _ => Err(libc::ELOOP),
        }
    }

    /// pwrite on an open inode (removed or not).
    pub fn write_at(&mut self, ino: Ino, off: usize, bytes: &[u8]) {
        if let Some(Obj::File { data, .. }) = self.objs.get_mut(&ino) {
            if data.len() < off + bytes.len() {
                data.resize(off + bytes.len(), 0);
            }
            data[off..off + bytes.len()].copy_from_slice(bytes);
        }
    }

    pub fn set_len(&mut self, ino: Ino, len: usize) {
        if let Some(Obj::File { data, .. }) = self.objs.get_mut(&ino) {
            data.resize(len, 0);
        }
    }

    pub fn chmod(&mut self, path: &str, new: u32) -> R {
        let i = self.lookup(path)?;
        match self.objs.get_mut(&i) {
            Some(Obj::File { mode, .. }) | Some(Obj::Dir { mode, .. }) => {
                *mode = new;
                Ok(())
            }
            _ => Err(libc::ELOOP),
        }
    }

    pub fn symlink(&mut self, target: &str, path: &str) -> R {
        let (p, name) = self.parent(path)?;
        if self.child(p, name).is_some() {
            return Err(libc::EEXIST);
        }
        let ino = self.alloc(Obj::Symlink(target.to_string()));
        self.entries_mut(p).insert(name.to_string(), ino);
        Ok(())
    }

    pub fn unlink(&mut self, path: &str) -> R {
        let (p, name) = self.parent(path)?;
        let i = self.child(p, name).ok_or(libc::ENOENT)?;
        if matches!(self.objs.get(&i), Some(Obj::Dir { .. })) {
            return Err(libc::EISDIR);
        }
        self.entries_mut(p).remove(name);
        Ok(())
    }

    pub fn rmdir(&mut self, path: &str) -> R {
        let (p, name) = self.parent(path)?;
        let i = self.child(p, name).ok_or(libc::ENOENT)?;
        match self.objs.get(&i) {
            Some(Obj::Dir { entries, .. }) if entries.is_empty() => {}
            Some(Obj::Dir { .. }) => return Err(libc::ENOTEMPTY),
            _ => return Err(libc::ENOTDIR),
        }
        self.entries_mut(p).remove(name);
        Ok(())
    }

    /// Whether directory `anc` is `ino` or one of its ancestors.
    fn is_ancestor(&self, anc: Ino, ino: Ino) -> bool {
        if anc == ino {
            return true;
        }
        match self.objs.get(&anc) {
            Some(Obj::Dir { entries, .. }) => entries.values().any(|c| self.is_ancestor(*c, ino)),
            _ => false,
        }
    }

    /// rename(2) without flags, as Linux answers it: both parents are resolved before the
    /// source is looked up.
    pub fn rename(&mut self, from: &str, to: &str) -> R {
        let (sp, sname) = self.parent(from)?;
        let (dp, dname) = self.parent(to)?;
        let src = self.child(sp, sname).ok_or(libc::ENOENT)?;
        let src_dir = matches!(self.objs.get(&src), Some(Obj::Dir { .. }));
        if src_dir && self.is_ancestor(src, dp) {
            return Err(libc::EINVAL);
        }
        if let Some(dst) = self.child(dp, dname) {
            if dst == src {
                return Ok(());
            }
            match (src_dir, self.objs.get(&dst)) {
                (true, Some(Obj::Dir { entries, .. })) if !entries.is_empty() => {
                    return Err(libc::ENOTEMPTY)
                }
                (true, Some(Obj::Dir { .. })) => {}
                (true, _) => return Err(libc::ENOTDIR),
                (false, Some(Obj::Dir { .. })) => return Err(libc::EISDIR),
                (false, _) => {}
            }
        }
        self.entries_mut(sp).remove(sname);
        self.entries_mut(dp).insert(dname.to_string(), src);
        Ok(())
    }

    /// Every path below the root with what it shows, sorted.
    pub fn tree(&self) -> BTreeMap<String, Seen> {
        let mut out = BTreeMap::new();
        self.walk(ROOT, "", &mut out);
        out
    }

    fn walk(&self, dir: Ino, prefix: &str, out: &mut BTreeMap<String, Seen>) {
        let Some(Obj::Dir { entries, .. }) = self.objs.get(&dir) else {
            return;
        };
        for (name, ino) in entries {
            let p = format!("{prefix}/{name}");
            match &self.objs[ino] {
                Obj::Dir { mode, .. } => {
                    out.insert(p.clone(), Seen::Dir { mode: *mode });
                    self.walk(*ino, &p, out);
                }
                Obj::File { data, mode } => {
                    out.insert(
                        p,
                        Seen::File {
                            mode: *mode,
                            data: data.clone(),
                        },
                    );
                }
                Obj::Symlink(t) => {
                    out.insert(p, Seen::Symlink(t.clone()));
                }
            }
        }
    }

    /// Every directory path (the root as ""), for choosing where to operate.
    pub fn dirs(&self) -> Vec<String> {
        let mut out = vec![String::new()];
        for (p, s) in self.tree() {
            if matches!(s, Seen::Dir { .. }) {
                out.push(p);
            }
        }
        out
    }
}

/// What a real directory tree at `root` shows, in the model's terms (modes masked to the
/// permission bits).
pub fn seen_tree(root: &std::path::Path) -> std::io::Result<BTreeMap<String, Seen>> {
    use std::os::unix::fs::PermissionsExt;
    fn walk(
        base: &std::path::Path,
        rel: &str,
        out: &mut BTreeMap<String, Seen>,
    ) -> std::io::Result<()> {
        let dir = base.join(rel.trim_start_matches('/'));
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let p = format!("{rel}/{name}");
            let path = e.path();
            let m = std::fs::symlink_metadata(&path)?;
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.insert(
                    p,
                    Seen::Symlink(std::fs::read_link(&path)?.to_string_lossy().into_owned()),
                );
            } else if m.is_dir() {
                out.insert(p.clone(), Seen::Dir { mode });
                walk(base, &p, out)?;
            } else {
                let data = std::fs::read(&path)?;
                if data.len() as u64 != m.len() {
                    return Err(std::io::Error::other(format!(
                        "{p}: stat says {} bytes, a read gives {}",
                        m.len(),
                        data.len()
                    )));
                }
                out.insert(p, Seen::File { mode, data });
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out)?;
    Ok(out)
}

/// The differences between two trees, readably (at most `max` lines).
pub fn diff_trees(
    want: &BTreeMap<String, Seen>,
    got: &BTreeMap<String, Seen>,
    max: usize,
) -> Vec<String> {
    let show = |s: &Seen| match s {
        Seen::Dir { mode } => format!("dir {mode:o}"),
        Seen::File { mode, data } => format!(
            "file {mode:o} {} bytes (blake3 {})",
            data.len(),
            &blake3_hex(data)[..12]
        ),
        Seen::Symlink(t) => format!("symlink -> {t}"),
    };
    let mut out = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => out.push(format!("missing {p} ({})", show(w))),
            Some(g) if g != w => out.push(format!("{p}: want {}, got {}", show(w), show(g))),
            _ => {}
        }
    }
    for (p, g) in got {
        if !want.contains_key(p) {
            out.push(format!("unexpected {p} ({})", show(g)));
        }
    }
    out.truncate(max);
    out
}

fn blake3_hex(b: &[u8]) -> String {
    // A short content fingerprint for messages (not a checksum anything relies on).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_answers_as_linux_does() {
        let mut m = Model::new();
        assert_eq!(m.mkdir("/a", 0o755), Ok(()));
        assert_eq!(m.mkdir("/a", 0o755), Err(libc::EEXIST));
        assert_eq!(m.mkdir("/x/y", 0o755), Err(libc::ENOENT));
        let f = m.open_create("/a/f", true, 0o644).unwrap();
        m.write_at(f, 0, b"hello");
        assert_eq!(m.mkdir("/a/f/g", 0o755), Err(libc::ENOTDIR));
        assert_eq!(m.rmdir("/a"), Err(libc::ENOTEMPTY));
        assert_eq!(m.unlink("/a"), Err(libc::EISDIR));
        assert_eq!(m.rename("/a", "/a/b"), Err(libc::EINVAL));
        assert_eq!(m.rename("/a", "/b"), Ok(()));
        // The open inode follows its directory.
        m.write_at(f, 5, b"!");
        assert_eq!(
            m.tree().get("/b/f"),
            Some(&Seen::File {
                mode: 0o644,
                data: b"hello!".to_vec()
            })
        );
        assert_eq!(m.mkdir_p("/b/c/d", 0o755), Ok(()));
        assert_eq!(m.mkdir_p("/b/f/d", 0o755), Err(libc::ENOTDIR));
        assert_eq!(m.rename("/b/f", "/b/c"), Err(libc::EISDIR));
        assert_eq!(m.rename("/b/c", "/b/f"), Err(libc::ENOTDIR));
        assert_eq!(m.unlink("/b/f"), Ok(()));
        // A removed inode's writes show nowhere.
        m.write_at(f, 0, b"gone");
        assert!(m.tree().keys().all(|p| !p.ends_with("/f")));
    }
}
