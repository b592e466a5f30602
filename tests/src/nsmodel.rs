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

// ---------------------------------------------------------------------------------------
// The driver: random operations on the nodes of a cluster, each compared with the model.

use crate::cluster::Cluster;
use crate::{close_checked, pattern};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

/// The operations a failure report shows: the last 40, or all with
/// `CKPTFS_MODEL_LOG=all`.
fn tail(log: &[String]) -> String {
    let all = std::env::var("CKPTFS_MODEL_LOG").is_ok_and(|v| v == "all");
    let from = if all { 0 } else { log.len().saturating_sub(40) };
    log[from..].join("\n")
}

pub use crate::env_usize;

fn err<T>(r: std::io::Result<T>) -> R<T> {
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Errors Linux gives for the same mistake in different orders of checks: either is right.
fn same_error(want: i32, got: i32) -> bool {
    want == got
        || matches!(
            (want, got),
            // rename of a file onto an ancestor directory: EISDIR by type, ENOTEMPTY by the
            // ancestor trap (Linux checks the trap first).
            (libc::EISDIR, libc::ENOTEMPTY) | (libc::ENOTEMPTY, libc::EISDIR)
        )
}

const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// An open handle kept across other operations: its node, the model inode, and the file.
struct Held {
    node: usize,
    ino: Ino,
    file: fs::File,
    path: String,
    ops_left: usize,
}

struct Run {
    seed: u64,
    rng: SmallRng,
    model: Model,
    log: Vec<String>,
    step: usize,
    /// Close-to-open mounts: a barrier (`barrier`) before an operation on another node
    /// than the last, and before every comparison.
    close_to_open: bool,
}

impl Run {
    /// A random path of depth 1..=3 through directories that exist (mostly), ending in one
    /// of a few names.
    fn path(&mut self) -> String {
        let dirs = self.model.dirs();
        let base = if self.rng.random_range(0..6) == 0 {
            // Sometimes through a directory that does not exist.
            format!("/{}", NAMES[self.rng.random_range(0..NAMES.len())])
        } else {
            dirs[self.rng.random_range(0..dirs.len())].clone()
        };
        let p = format!("{base}/{}", NAMES[self.rng.random_range(0..NAMES.len())]);
        if p.matches('/').count() > 4 {
            return format!("/{}", NAMES[self.rng.random_range(0..NAMES.len())]);
        }
        p
    }

    /// A random path for a data operation: not through or at a symlink (the model follows
    /// none), not the file a handle holds open (its bytes are the holder's until it closes).
    fn data_path(&mut self, held: Option<Ino>) -> Option<String> {
        let p = self.path();
        let bad = self.model.crosses_symlink(&p)
            || self.model.is_symlink(&p)
            || (held.is_some() && self.model.lookup(&p).ok() == held);
        (!bad).then_some(p)
    }

    fn data(&mut self) -> Vec<u8> {
        let len = match self.rng.random_range(0..10) {
            0 => 0,
            1 => 300_000 + self.rng.random_range(0..100_000),
            _ => self.rng.random_range(1..70_000),
        };
        pattern(self.rng.random(), len)
    }

    fn expect(&mut self, what: &str, want: R, got: R) {
        self.log.push(format!("{what}: {got:?}"));
        let ok = match (want, got) {
            (Ok(()), Ok(())) => true,
            (Err(w), Err(g)) => same_error(w, g),
            _ => false,
        };
        assert!(
            ok,
            "seed {}: {what}: the model says {want:?}, the mount said {got:?}\nlast operations:\n{}",
            self.seed,
            tail(&self.log)
        );
    }
}

/// Writes `bytes` at the start of a held handle's file and closes it (`when` names the
/// moment in the log).
fn close_held(run: &mut Run, h: Held, bytes: &[u8], when: &str) {
    let got = err(h
        .file
        .write_all_at(bytes, 0)
        .and_then(|_| close_checked(h.file)));
    run.model.write_at(h.ino, 0, bytes);
    run.expect(
        &format!(
            "{when}: node {}: write {} bytes to held {} and close",
            h.node,
            bytes.len(),
            h.path
        ),
        Ok(()),
        got,
    );
}

/// What a job's barrier stands for on close-to-open mounts (`run_close_to_open`): `node`'s
/// kernel forgets the names it is not using and its daemon reads every node's records.
fn barrier(c: &Cluster, node: usize) {
    let _ = fs::write("/proc/sys/vm/drop_caches", b"2");
    crate::cluster::drop_daemon_caches(&c.nodes[node].mnt);
}

fn compare_all(c: &Cluster, run: &Run, nodes: usize, when: &str) {
    let want = run.model.tree();
    for n in 0..nodes {
        if run.close_to_open {
            barrier(c, n);
        }
        let got = seen_tree(&c.nodes[n].mnt)
            .unwrap_or_else(|e| panic!("seed {}: {when}: walking node {n}'s tree: {e}", run.seed));
        let d = diff_trees(&want, &got, 20);
        assert!(
            d.is_empty(),
            "seed {}: {when}: node {n} differs from the model:\n{}\nlast operations:\n{}",
            run.seed,
            d.join("\n"),
            tail(&run.log)
        );
    }
}

/// One seeded run: 2 to 4 nodes (by the seed) of a space in a local directory, or on the
/// shared filesystem whose `clients` (one directory as each client mounts it) are given,
/// `ops` random operations, then every node's tree, `ckptfs check`, a remount of every
/// node and the trees again. Panics with the seed and the last operations on a difference.
pub fn run(seed: u64, ops: usize, clients: &[PathBuf]) {
    run_inner(seed, ops, clients, None, &[])
}

/// `run` with every node mounted `--coherence close-to-open`: each node's kernel keeps
/// names and attributes for a second, so a node may act on a name another node changed
/// within it (as an NFS client does), which the model does not. The contract is that an
/// application that synchronises with the other nodes and looks again sees their changes:
/// before each operation on a node other than the last one's, the node's kernel forgets
/// the names it is not using (`drop_caches`) and its daemon reads every node's records
/// (the `drop_caches` control); no handle is held across operations (it would keep its
/// path's names in the kernel: the strict run covers that).
pub fn run_close_to_open(seed: u64, ops: usize) {
    run_inner(seed, ops, &[], None, &["--coherence", "close-to-open"])
}

/// One seeded run on one mount of a single-slot space (the default kind), whose daemon is
/// killed with SIGKILL after every `kill_every` operations, with no close or fsync before
/// the kill (a handle held open is closed first, and the operations after it are often
/// renames, removals, mkdirs and chmods only). After each kill the space is mounted again
/// and its tree must equal the model's: every operation that returned survives the death of
/// the daemon, as every operation that returned survives the death of a process on a local
/// filesystem (README, "Guarantees").
pub fn run_killing(seed: u64, ops: usize, kill_every: usize) {
    run_inner(seed, ops, &[], Some(kill_every.max(1)), &[])
}

fn run_inner(seed: u64, ops: usize, clients: &[PathBuf], kill_every: Option<usize>, args: &[&str]) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let nodes = match kill_every {
        Some(_) => 1,
        None => rng.random_range(2..=4usize),
    };
    println!("seed {seed}: {nodes} nodes, {ops} operations");
    let mut c = Cluster::on_clients(nodes as u32, "1G", nodes, Duration::from_secs(10), clients);
    for n in 0..nodes {
        c.mount(n, args);
    }
    let mut run = Run {
        seed,
        rng,
        model: Model::new(),
        log: Vec::new(),
        step: 0,
        close_to_open: args.contains(&"close-to-open"),
    };
    let mut held: Option<Held> = None;
    let mut kills = 0;
    let mut last_node = None;
    for i in 0..ops {
        if kill_every.is_some_and(|k| i > 0 && i % k == 0) {
            if let Some(h) = held.take() {
                let bytes = pattern(run.seed, 1234);
                close_held(&mut run, h, &bytes, &format!("#{i} before the kill"));
            }
            let last = run.log.last().cloned().unwrap_or_default();
            run.log
                .push(format!("#{i}: kill -9 of the daemon, then a mount"));
            c.kill(0);
            c.mount(0, &[]);
            kills += 1;
            compare_all(
                &c,
                &run,
                nodes,
                &format!("after kill {kills} (the last operation before it: {last})"),
            );
        }
        let n = run.rng.random_range(0..nodes);
        if run.close_to_open && last_node != Some(n) {
            barrier(&c, n);
        }
        last_node = Some(n);
        let at = |p: &str| c.path(n, p.trim_start_matches('/'));
        // A held handle writes and closes after a few operations (its inode may have moved
        // or gone meanwhile).
        if let Some(h) = held.as_mut() {
            if h.ops_left == 0 {
                let h = held.take().expect("held");
                let bytes = run.data();
                close_held(&mut run, h, &bytes, &format!("#{i}"));
                continue;
            }
            h.ops_left -= 1;
        }
        let held_ino = held.as_ref().map(|h| h.ino);
        let held_node = held.as_ref().map(|h| h.node);
        match run.rng.random_range(0..100) {
            0..=9 => {
                let p = run.path();
                if run.model.crosses_symlink(&p) {
                    continue;
                }
                let want = run.model.mkdir(&p, 0o755);
                let got = err(fs::create_dir(at(&p)));
                run.expect(&format!("#{i} node {n}: mkdir {p}"), want, got);
            }
            10..=14 => {
                let p = format!(
                    "{}/{}",
                    run.path(),
                    NAMES[run.rng.random_range(0..NAMES.len())]
                );
                if run.model.crosses_symlink(&p) || run.model.is_symlink(&p) {
                    continue;
                }
                let want = run.model.mkdir_p(&p, 0o755);
                let got = err(fs::create_dir_all(at(&p)));
                run.expect(&format!("#{i} node {n}: mkdir -p {p}"), want, got);
            }
            15..=29 => {
                // Save a file: open(O_CREAT|O_TRUNC), write, close.
                let Some(p) = run.data_path(held_ino) else {
                    continue;
                };
                let bytes = run.data();
                let want = run.model.open_create(&p, true, 0o644).map(|ino| {
                    run.model.write_at(ino, 0, &bytes);
                });
                let got = err(fs::File::create(at(&p)).and_then(|mut f| {
                    f.write_all(&bytes)?;
                    close_checked(f)
                }));
                run.expect(
                    &format!("#{i} node {n}: save {p} ({} bytes)", bytes.len()),
                    want,
                    got,
                );
            }
            30..=36 => {
                // Write into an existing file at an offset (another node's, often).
                let Some(p) = run.data_path(held_ino) else {
                    continue;
                };
                let off = run.rng.random_range(0..100_000usize);
                let bytes = pattern(run.rng.random(), run.rng.random_range(1..50_000));
                let want = run.model.open_existing(&p).map(|ino| {
                    run.model.write_at(ino, off, &bytes);
                });
                let got = err(fs::OpenOptions::new()
                    .write(true)
                    .open(at(&p))
                    .and_then(|f| {
                        f.write_all_at(&bytes, off as u64)?;
                        close_checked(f)
                    }));
                run.expect(
                    &format!(
                        "#{i} node {n}: write {} bytes at {off} into {p}",
                        bytes.len()
                    ),
                    want,
                    got,
                );
            }
            37..=40 => {
                let Some(p) = run.data_path(held_ino) else {
                    continue;
                };
                let len = run.rng.random_range(0..120_000usize);
                let want = run
                    .model
                    .open_existing(&p)
                    .map(|ino| run.model.set_len(ino, len));
                let got = err(fs::OpenOptions::new()
                    .write(true)
                    .open(at(&p))
                    .and_then(|f| f.set_len(len as u64)));
                run.expect(&format!("#{i} node {n}: truncate {p} to {len}"), want, got);
            }
            41..=48 => {
                let p = run.path();
                if run.model.crosses_symlink(&p) {
                    continue;
                }
                let want = run.model.unlink(&p);
                let got = err(fs::remove_file(at(&p)));
                run.expect(&format!("#{i} node {n}: unlink {p}"), want, got);
            }
            49..=53 => {
                let p = run.path();
                if run.model.crosses_symlink(&p) {
                    continue;
                }
                let want = run.model.rmdir(&p);
                let got = err(fs::remove_dir(at(&p)));
                run.expect(&format!("#{i} node {n}: rmdir {p}"), want, got);
            }
            54..=66 => {
                let (a, b) = (run.path(), run.path());
                if run.model.crosses_symlink(&a) || run.model.crosses_symlink(&b) {
                    continue;
                }
                let want = run.model.rename(&a, &b);
                let got = err(fs::rename(at(&a), at(&b)));
                run.expect(&format!("#{i} node {n}: rename {a} -> {b}"), want, got);
            }
            67..=69 => {
                let p = run.path();
                if run.model.crosses_symlink(&p) {
                    continue;
                }
                let target = format!("t{}", run.rng.random_range(0..100));
                let want = run.model.symlink(&target, &p);
                let got = err(std::os::unix::fs::symlink(&target, at(&p)));
                run.expect(
                    &format!("#{i} node {n}: symlink {p} -> {target}"),
                    want,
                    got,
                );
            }
            70..=74 => {
                let p = run.path();
                if run.model.crosses_symlink(&p) || run.model.is_symlink(&p) {
                    continue;
                }
                let mode = [0o600, 0o640, 0o644, 0o700, 0o755][run.rng.random_range(0..5)];
                let want = run.model.chmod(&p, mode);
                let got = err(fs::set_permissions(
                    at(&p),
                    fs::Permissions::from_mode(mode),
                ));
                run.expect(&format!("#{i} node {n}: chmod {mode:o} {p}"), want, got);
            }
            75..=82 => {
                // Read a file and compare its bytes.
                let p = run.path();
                if run.model.crosses_symlink(&p) || run.model.is_symlink(&p) {
                    continue;
                }
                // Close-to-open: other nodes see a held file's O_TRUNC and bytes at its
                // close, as NFS clients do (README, "Several nodes").
                if held_ino.is_some()
                    && run.model.lookup(&p).ok() == held_ino
                    && held_node != Some(n)
                {
                    continue;
                }
                let want = run
                    .model
                    .lookup(&p)
                    .and_then(|ino| match run.model.obj(ino) {
                        Some(Obj::File { data, .. }) => Ok(data.clone()),
                        _ => Err(libc::EISDIR),
                    });
                let got = err(fs::read(at(&p)));
                let what = format!("#{i} node {n}: read {p}");
                match (&want, &got) {
                    (Ok(w), Ok(g)) => {
                        run.log.push(format!("{what}: {} bytes", g.len()));
                        assert!(
                            w == g,
                            "seed {seed}: {what}: {} bytes read, the model has {} ({})\nlast operations:\n{}",
                            g.len(),
                            w.len(),
                            crate::first_difference(g, w).unwrap_or_default(),
                            tail(&run.log)
                        );
                    }
                    _ => run.expect(&what, want.map(drop), got.map(drop)),
                }
            }
            83..=86 => {
                // List a directory and compare the names.
                let dirs = run.model.dirs();
                let d = dirs[run.rng.random_range(0..dirs.len())].clone();
                let mut want: Vec<String> = run
                    .model
                    .tree()
                    .keys()
                    .filter(|k| k.rsplit_once('/').map(|x| x.0) == Some(d.as_str()))
                    .map(|k| k.rsplit('/').next().unwrap_or_default().to_string())
                    .collect();
                want.sort();
                let got = fs::read_dir(at(&d)).map(|rd| {
                    let mut v: Vec<String> = rd
                        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                        .collect::<Result<_, _>>()
                        .unwrap_or_default();
                    v.sort();
                    v
                });
                let got = err(got);
                run.log.push(format!("#{i} node {n}: ls {d}: {got:?}"));
                assert_eq!(
                    got,
                    Ok(want),
                    "seed {seed}: #{i} node {n}: ls {d}\nlast operations:\n{}",
                    tail(&run.log)
                );
            }
            87..=91 => {
                // A job's step: every node `mkdir -p` the staging directory and writes its
                // rank file into it; then one node renames the directory to the step's name.
                run.step += 1;
                let tmp = format!("/run/tmp-{}", run.step);
                let fin = format!("/run/step-{}", run.step);
                if run.model.crosses_symlink(&format!("{tmp}/x"))
                    || run
                        .model
                        .lookup("/run")
                        .is_ok_and(|i| !matches!(run.model.obj(i), Some(Obj::Dir { .. })))
                {
                    continue;
                }
                for r in 0..nodes {
                    let want = run.model.mkdir_p(&tmp, 0o755);
                    let got = err(fs::create_dir_all(c.path(r, tmp.trim_start_matches('/'))));
                    run.expect(&format!("#{i} node {r}: mkdir -p {tmp}"), want, got);
                }
                for r in 0..nodes {
                    let p = format!("{tmp}/rank-{r}");
                    let bytes = pattern(seed ^ (run.step * 64 + r) as u64, 20_000 + r * 1000);
                    let want = run.model.open_create(&p, true, 0o644).map(|ino| {
                        run.model.write_at(ino, 0, &bytes);
                    });
                    let got = err(
                        fs::File::create(c.path(r, p.trim_start_matches('/'))).and_then(|mut f| {
                            f.write_all(&bytes)?;
                            close_checked(f)
                        }),
                    );
                    run.expect(&format!("#{i} node {r}: save {p}"), want, got);
                }
                let want = run.model.rename(&tmp, &fin);
                let got = err(fs::rename(at(&tmp), at(&fin)));
                run.expect(&format!("#{i} node {n}: rename {tmp} -> {fin}"), want, got);
            }
            92..=95 => {
                // Open a file and keep it open across the next operations.
                if held.is_some() || run.close_to_open {
                    continue;
                }
                let p = run.path();
                if run.model.crosses_symlink(&p) || run.model.is_symlink(&p) {
                    continue;
                }
                let want = run.model.open_create(&p, true, 0o644);
                let got = err(fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o644)
                    .open(at(&p)));
                let what = format!("#{i} node {n}: open {p} and hold it");
                match (want, got) {
                    (Ok(ino), Ok(file)) => {
                        run.log.push(format!("{what}: ok"));
                        held = Some(Held {
                            node: n,
                            ino,
                            file,
                            path: p,
                            ops_left: run.rng.random_range(1..8),
                        })
                    }
                    (w, g) => run.expect(&what, w.map(drop), g.map(drop)),
                }
            }
            _ => {
                // rm -rf of a directory.
                let dirs = run.model.dirs();
                let d = dirs[run.rng.random_range(0..dirs.len())].clone();
                if d.is_empty() {
                    continue;
                }
                let paths: Vec<String> = run
                    .model
                    .tree()
                    .keys()
                    .filter(|k| k.starts_with(&format!("{d}/")))
                    .cloned()
                    .collect();
                for p in paths.iter().rev() {
                    let is_dir = matches!(
                        run.model.lookup(p).ok().and_then(|i| run.model.obj(i)),
                        Some(Obj::Dir { .. })
                    );
                    let _ = if is_dir {
                        run.model.rmdir(p)
                    } else {
                        run.model.unlink(p)
                    };
                }
                let want = run.model.rmdir(&d);
                let got = err(fs::remove_dir_all(at(&d)));
                run.expect(&format!("#{i} node {n}: rm -rf {d}"), want, got);
            }
        }
    }
    if let Some(h) = held.take() {
        let bytes = pattern(run.seed, 1234);
        close_held(&mut run, h, &bytes, "end");
    }
    compare_all(&c, &run, nodes, "after the operations");
    for n in 0..nodes {
        let (st, out, e) = c.ckptfs(&["check".into(), c.nodes[n].mnt.clone().into()]);
        assert!(
            st.success(),
            "seed {seed}: check through node {n}: {out}{e}"
        );
    }
    // Every node unmounted, then mounted again in another order (slots change hands).
    for n in 0..nodes {
        c.unmount(n);
    }
    let (st, out, e) = c.ckptfs(&["check".into(), c.backing.clone().into()]);
    assert!(
        st.success(),
        "seed {seed}: offline check of the space: {out}{e}"
    );
    for n in (0..nodes).rev() {
        c.mount(n, args);
    }
    compare_all(&c, &run, nodes, "after every node remounted");
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
