//! Creates held for the next transaction (`ckptfs_engine` `space::deferred`): a file opened
//! with O_CREAT on a single-slot space gets its inode, history and readdir cookie from ids a
//! transaction reserved, and its rows ride in the next transaction of any kind, usually its
//! own close's commit. Until then every read overlays it: lookups, listings, attributes,
//! the parent's times. Checked three ways:
//! - one file at a time, every read and every refusal a held create must answer
//!   (`a_held_create_reads_and_refuses_like_a_committed_one`);
//! - seeded random operations compared with a model tree, files kept open across other
//!   operations so that their creates stay held, with remounts
//!   (`held_creates_against_a_model`; `CKPTFS_HELD_SEEDS` sets how many seeds, default 6);
//! - threads racing creates, mkdirs, rmdirs, renames and unlinks of the same few names,
//!   every refusal a POSIX one and the tree consistent after a remount
//!   (`racing_changes_of_the_same_names`; `CKPTFS_HELD_RACE_OPS`, default 1500 per thread);
//! - eight writers of new files at once, whose closes share commit groups: every file
//!   listed, and no close syncing again for the creates the others hold
//!   (`concurrent_writers_of_new_files_find_every_file_listed`; `CKPTFS_HELD_FILES`).

use ckptfs_engine::format::{InodeId, NodeKind};
use ckptfs_engine::space::Config;
use ckptfs_engine::Space;
use ckptfs_fs::{Caller, Error, Fs, HandleId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const ROOT: InodeId = InodeId::ROOT;
const ME: Caller = Caller { uid: 0, gid: 0 };
const PID: u32 = 77;

static NEXT_FH: AtomicU64 = AtomicU64::new(1);
fn fh() -> HandleId {
    HandleId(NEXT_FH.fetch_add(1, Ordering::Relaxed))
}

fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ckptfs-held-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Space::format(&dir, 256 << 20, 4096, Config::default(), false).expect("format");
    dir
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn names(fs: &Fs, dir: InodeId) -> Vec<(Vec<u8>, InodeId)> {
    let mut out = Vec::new();
    let mut off = 0;
    loop {
        // A small page, so that listings resume between held and committed entries.
        let items = fs.readdir(dir, off, 3).expect("readdir");
        let Some(last) = items.last() else { break };
        off = last.offset;
        out.extend(
            items
                .into_iter()
                .filter(|i| !i.is_dots())
                .map(|i| (i.name, i.ino)),
        );
    }
    out.sort();
    out
}

fn read(fs: &Fs, ino: InodeId) -> Vec<u8> {
    let h = fh();
    fs.open(ino, h, false, false).expect("open to read");
    let size = fs.getattr(ino).expect("getattr").rec.size;
    let b = fs.read(ino, h, 0, size as usize + 1).expect("read");
    fs.release(ino, h).expect("release");
    b
}

/// One file at a time: a held create is found, listed, stat-ed and refused over exactly
/// as a committed one, costs no transaction, and is in the table after its close.
#[test]
fn a_held_create_reads_and_refuses_like_a_committed_one() {
    let dir = fresh("one");
    let fs = Fs::new(Space::open(&dir).expect("open"));
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    // The mount's first create reserves ids for the next ones.
    let h0 = fh();
    let first = fs
        .create(d, b"first", 0o644, ME, h0, true, true, false)
        .expect("create")
        .ino;
    fs.flush(first, h0, PID).expect("close");
    fs.release(first, h0).expect("release");

    let before = fs.space().meta_mark();
    let d_before = fs.getattr(d).expect("getattr d").rec.mtime;
    let mut open = Vec::new();
    for i in 0..5u8 {
        let h = fh();
        let name = format!("f{i}");
        let a = fs
            .create(d, name.as_bytes(), 0o640, ME, h, true, true, false)
            .expect("create");
        assert_eq!(a.rec.kind, NodeKind::File);
        fs.write(a.ino, h, PID, 0, &[i; 100]).expect("write");
        open.push((name, a.ino, h));
    }
    assert_eq!(
        fs.space().meta_mark(),
        before,
        "five creates held, no transaction"
    );

    // Read as committed ones.
    for (name, ino, _) in &open {
        assert_eq!(fs.lookup(d, name.as_bytes()).expect("lookup").ino, *ino);
        let a = fs.getattr(*ino).expect("getattr");
        assert_eq!((a.rec.kind, a.rec.perm & 0o7777), (NodeKind::File, 0o640));
    }
    let mut want: Vec<_> = open
        .iter()
        .map(|(n, i, _)| (n.clone().into_bytes(), *i))
        .collect();
    want.push((b"first".to_vec(), first));
    want.sort();
    assert_eq!(names(&fs, d), want, "listed with the committed entry");
    assert!(
        fs.getattr(d).expect("getattr d").rec.mtime >= d_before,
        "the parent's mtime moves with a held create"
    );

    // Refused as committed ones.
    let h = fh();
    assert!(matches!(
        fs.create(d, b"f0", 0o644, ME, h, true, true, false),
        Err(Error::Exists)
    ));
    assert!(matches!(fs.mkdir(d, b"f1", 0o755, ME), Err(Error::Exists)));
    assert!(matches!(fs.rmdir(ROOT, b"d"), Err(Error::NotEmpty)));
    assert!(matches!(
        fs.create(open[0].1, b"x", 0o644, ME, fh(), true, true, false),
        Err(Error::NotDir)
    ));
    assert_eq!(fs.space().meta_mark(), before, "refusals commit nothing");

    // A change of the namespace applies the held creates first, then its own.
    fs.rename(d, b"f1", d, b"g1", false, false)
        .expect("rename a held file");
    fs.unlink(d, b"f2").expect("unlink a held file");
    assert!(matches!(fs.lookup(d, b"f1"), Err(Error::NotFound)));
    assert!(matches!(fs.lookup(d, b"f2"), Err(Error::NotFound)));
    assert_eq!(fs.lookup(d, b"g1").expect("lookup g1").ino, open[1].1);

    for (_, ino, h) in &open {
        fs.flush(*ino, *h, PID).expect("close");
        fs.release(*ino, *h).expect("release");
    }
    // Created after the rename: held again, committed by its close alone.
    let before = fs.space().meta_mark();
    let h = fh();
    let late = fs
        .create(d, b"late", 0o600, ME, h, true, true, false)
        .expect("create")
        .ino;
    fs.write(late, h, PID, 0, b"late").expect("write");
    fs.flush(late, h, PID).expect("close");
    fs.release(late, h).expect("release");
    assert_eq!(
        fs.space().meta_mark() - before,
        1,
        "a new file is one transaction"
    );
    drop(fs);

    let fs = Fs::new(Space::open(&dir).expect("reopen"));
    let listed = names(&fs, d);
    let got: Vec<&[u8]> = listed.iter().map(|(n, _)| n.as_slice()).collect();
    assert_eq!(
        got,
        [&b"f0"[..], b"f3", b"f4", b"first", b"g1", b"late"],
        "after reopening"
    );
    for (n, ino) in &listed {
        let want = match n.as_slice() {
            b"f0" => vec![0; 100],
            b"g1" => vec![1; 100],
            b"f3" => vec![3; 100],
            b"f4" => vec![4; 100],
            b"late" => b"late".to_vec(),
            _ => Vec::new(),
        };
        assert_eq!(read(&fs, *ino), want, "{}", String::from_utf8_lossy(n));
    }
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Dir,
    /// A file: its inode (the content is the model's `content` of it).
    File(InodeId),
}

/// The model: paths (components joined by '/') to nodes, and each file's content as of its
/// last close.
#[derive(Default)]
struct Model {
    tree: BTreeMap<String, Node>,
    content: HashMap<InodeId, Vec<u8>>,
}

impl Model {
    fn children(&self, dir: &str) -> Vec<(String, Node)> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        self.tree
            .iter()
            .filter(|(p, _)| {
                p.starts_with(&prefix)
                    && !p[prefix.len()..].is_empty()
                    && !p[prefix.len()..].contains('/')
            })
            .map(|(p, n)| (p[prefix.len()..].to_string(), n.clone()))
            .collect()
    }

    fn dirs(&self) -> Vec<String> {
        let mut v = vec![String::new()];
        v.extend(
            self.tree
                .iter()
                .filter(|(_, n)| **n == Node::Dir)
                .map(|(p, _)| p.clone()),
        );
        v
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn resolve(fs: &Fs, path: &str) -> InodeId {
    let mut ino = ROOT;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = fs
            .lookup(ino, part.as_bytes())
            .unwrap_or_else(|e| panic!("lookup {part} of {path}: {e:?}"))
            .ino;
    }
    ino
}

/// Every directory's listing, every entry's kind and every closed file's content as the
/// model has them.
fn compare(fs: &Fs, m: &Model, open: &HashMap<InodeId, (HandleId, Vec<u8>)>, when: &str) {
    for d in m.dirs() {
        let ino = resolve(fs, &d);
        let got = names(fs, ino);
        let mut want = m.children(&d);
        want.sort_by(|a, b| a.0.cmp(&b.0));
        let got_names: Vec<String> = got
            .iter()
            .map(|(n, _)| String::from_utf8(n.clone()).expect("utf8"))
            .collect();
        let want_names: Vec<String> = want.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(got_names, want_names, "{when}: listing of /{d}");
        for ((name, got_ino), (_, node)) in got.iter().zip(&want) {
            let a = fs.getattr(*got_ino).expect("getattr");
            match node {
                Node::Dir => assert_eq!(a.rec.kind, NodeKind::Dir, "{when}: /{d}/{name:?}"),
                Node::File(ino) => {
                    assert_eq!(
                        got_ino,
                        ino,
                        "{when}: /{d}/{:?}",
                        String::from_utf8_lossy(name)
                    );
                    assert_eq!(a.rec.kind, NodeKind::File);
                    if !open.contains_key(ino) {
                        assert_eq!(
                            read(fs, *ino),
                            m.content[ino],
                            "{when}: content of /{d}/{}",
                            String::from_utf8_lossy(name)
                        );
                    }
                }
            }
        }
    }
}

/// Random operations on a few names in a few directories, files kept open across other
/// operations (their creates stay held), compared with the model after every operation's
/// result and, at checkpoints, listing by listing; a remount closes every open file first.
#[test]
fn held_creates_against_a_model() {
    let seeds = env("CKPTFS_HELD_SEEDS", 6);
    let base = env("CKPTFS_SEED", 0x4e1d_c4ea);
    for s in 0..seeds {
        let seed = base + s;
        println!("seed {seed} (replay with CKPTFS_SEED={seed} CKPTFS_HELD_SEEDS=1)");
        model_run(seed);
    }
}

/// Closes every open file (its content is what it wrote, `m` learns it), drops `fs` and
/// opens the space again.
fn close_and_reopen(
    fs: Fs,
    dir: &std::path::Path,
    open: &mut HashMap<InodeId, (HandleId, Vec<u8>)>,
    m: &mut Model,
) -> Fs {
    for (ino, (h, buf)) in open.drain() {
        fs.flush(ino, h, PID).expect("close");
        fs.release(ino, h).expect("release");
        m.content.insert(ino, buf);
    }
    drop(fs);
    Fs::new(Space::open(dir).expect("reopen"))
}

fn model_run(seed: u64) {
    let dir = fresh(&format!("model-{seed}"));
    let mut fs = Fs::new(Space::open(&dir).expect("open"));
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = Model::default();
    // Open files: inode -> (handle, bytes written so far).
    let mut open: HashMap<InodeId, (HandleId, Vec<u8>)> = HashMap::new();
    const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
    for step in 0..400 {
        let dirs = m.dirs();
        let d = dirs[rng.random_range(0..dirs.len())].clone();
        let name = NAMES[rng.random_range(0..NAMES.len())];
        let path = join(&d, name);
        let parent = resolve(&fs, &d);
        let existing = m.tree.get(&path).cloned();
        let what = rng.random_range(0..100);
        let ctx = format!("seed {seed} step {step}: /{path}");
        match what {
            0..=34 => {
                // O_CREAT|O_EXCL, kept open.
                let h = fh();
                let r = fs.create(parent, name.as_bytes(), 0o644, ME, h, true, true, false);
                match (&existing, r) {
                    (None, Ok(a)) => {
                        m.tree.insert(path.clone(), Node::File(a.ino));
                        m.content.insert(a.ino, Vec::new());
                        open.insert(a.ino, (h, Vec::new()));
                    }
                    (Some(_), Err(Error::Exists)) => {}
                    (e, r) => panic!("{ctx}: create with {e:?}: {:?}", r.map(|a| a.ino)),
                }
            }
            35..=49 => {
                // Write to an open file.
                if let Some((&ino, _)) = open.iter().nth(rng.random_range(0..open.len().max(1))) {
                    let (h, buf) = open.get_mut(&ino).expect("open");
                    let more = vec![rng.random::<u8>(); rng.random_range(1..3000)];
                    fs.write(ino, *h, PID, buf.len() as u64, &more)
                        .expect("write");
                    buf.extend_from_slice(&more);
                }
            }
            50..=64 => {
                // Close an open file: its bytes are its content now.
                if let Some((&ino, _)) = open.iter().nth(rng.random_range(0..open.len().max(1))) {
                    let (h, buf) = open.remove(&ino).expect("open");
                    fs.flush(ino, h, PID).expect("close");
                    fs.release(ino, h).expect("release");
                    m.content.insert(ino, buf);
                }
            }
            65..=72 => {
                let r = fs.mkdir(parent, name.as_bytes(), 0o755, ME);
                match (&existing, r) {
                    (None, Ok(_)) => {
                        m.tree.insert(path.clone(), Node::Dir);
                    }
                    (Some(_), Err(Error::Exists)) => {}
                    (e, r) => panic!("{ctx}: mkdir with {e:?}: {:?}", r.map(|a| a.ino)),
                }
            }
            73..=80 => {
                let r = fs.unlink(parent, name.as_bytes());
                match (&existing, r) {
                    (Some(Node::File(_)), Ok(())) => {
                        m.tree.remove(&path);
                    }
                    (None, Err(Error::NotFound)) | (Some(Node::Dir), Err(Error::IsDir)) => {}
                    (e, r) => panic!("{ctx}: unlink with {e:?}: {r:?}"),
                }
            }
            81..=86 => {
                let r = fs.rmdir(parent, name.as_bytes());
                let empty = m.children(&path).is_empty();
                match (&existing, r) {
                    (Some(Node::Dir), Ok(())) if empty => {
                        m.tree.remove(&path);
                    }
                    (Some(Node::Dir), Err(Error::NotEmpty)) if !empty => {}
                    (None, Err(Error::NotFound)) | (Some(Node::File(_)), Err(Error::NotDir)) => {}
                    (e, r) => panic!("{ctx}: rmdir with {e:?} (empty {empty}): {r:?}"),
                }
            }
            87..=94 => {
                // Rename a file (only files: no directory moves into itself to model).
                let d2 = dirs[rng.random_range(0..dirs.len())].clone();
                let name2 = NAMES[rng.random_range(0..NAMES.len())];
                let path2 = join(&d2, name2);
                let Some(Node::File(ino)) = existing else {
                    continue;
                };
                let target = m.tree.get(&path2).cloned();
                let parent2 = resolve(&fs, &d2);
                let r = fs.rename(
                    parent,
                    name.as_bytes(),
                    parent2,
                    name2.as_bytes(),
                    false,
                    false,
                );
                match (&target, r) {
                    (_, Ok(())) if path2 == path => {}
                    (None | Some(Node::File(_)), Ok(())) => {
                        m.tree.remove(&path);
                        m.tree.insert(path2, Node::File(ino));
                    }
                    (Some(Node::Dir), Err(Error::IsDir)) => {}
                    (t, r) => panic!("{ctx} -> /{path2}: rename over {t:?}: {r:?}"),
                }
            }
            95..=97 => compare(&fs, &m, &open, &format!("seed {seed} step {step}")),
            _ => {
                // A remount: every open file closed first (its content is what it wrote).
                fs = close_and_reopen(fs, &dir, &mut open, &mut m);
                compare(
                    &fs,
                    &m,
                    &open,
                    &format!("seed {seed} step {step}, remounted"),
                );
            }
        }
    }
    compare(&fs, &m, &open, &format!("seed {seed}: end, files open"));
    let fs = close_and_reopen(fs, &dir, &mut open, &mut m);
    compare(&fs, &m, &open, &format!("seed {seed}: end, reopened"));
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Threads racing creates (kept open a while), mkdirs, rmdirs, renames and unlinks of the
/// same three names in the same two directories: a held create is checked against what
/// every other change did, so every answer is a POSIX one (never an engine error: a create
/// held over a name another change took, or into a directory removed, would fail the
/// transaction that applies it), and after a remount every listed entry looks up to
/// itself and every file reads.
#[test]
fn racing_changes_of_the_same_names() {
    let dir = fresh("race");
    let fs = Arc::new(Fs::new(Space::open(&dir).expect("open")));
    let ops = env("CKPTFS_HELD_RACE_OPS", 1500);
    let seed = env("CKPTFS_SEED", 0x7ace_0001);
    println!("seed {seed} (replay with CKPTFS_SEED={seed})");
    const DIRS: [&str; 2] = ["p", "q"];
    const NAMES: [&str; 3] = ["x", "y", "z"];
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (t << 32));
                let mut open: Vec<(InodeId, HandleId)> = Vec::new();
                let posix = |what: &str, e: &Error| {
                    assert!(
                        matches!(
                            e,
                            Error::NotFound
                                | Error::Exists
                                | Error::NotDir
                                | Error::IsDir
                                | Error::NotEmpty
                        ),
                        "thread {t}: {what}: {e:?}"
                    )
                };
                for _ in 0..ops {
                    let d = DIRS[rng.random_range(0..2)];
                    let n = NAMES[rng.random_range(0..3)];
                    let parent = match fs.lookup(ROOT, d.as_bytes()) {
                        Ok(a) => a.ino,
                        Err(e) => {
                            posix("lookup", &e);
                            match fs.mkdir(ROOT, d.as_bytes(), 0o755, ME) {
                                Ok(_) => {}
                                Err(e) => posix("mkdir", &e),
                            }
                            continue;
                        }
                    };
                    match rng.random_range(0..100) {
                        0..=39 => {
                            let h = fh();
                            match fs.create(parent, n.as_bytes(), 0o644, ME, h, true, true, false) {
                                Ok(a) => open.push((a.ino, h)),
                                Err(e) => posix("create", &e),
                            }
                        }
                        40..=49 => {
                            if let Err(e) = fs.mkdir(parent, n.as_bytes(), 0o755, ME) {
                                posix("mkdir", &e)
                            }
                        }
                        50..=59 => {
                            if let Err(e) = fs.unlink(parent, n.as_bytes()) {
                                posix("unlink", &e)
                            }
                        }
                        60..=69 => {
                            if let Err(e) = fs.rmdir(parent, n.as_bytes()) {
                                posix("rmdir", &e)
                            }
                        }
                        70..=74 => {
                            if let Err(e) = fs.rmdir(ROOT, d.as_bytes()) {
                                posix("rmdir dir", &e)
                            }
                        }
                        75..=84 => {
                            let d2 = DIRS[rng.random_range(0..2)];
                            let n2 = NAMES[rng.random_range(0..3)];
                            if let Ok(p2) = fs.lookup(ROOT, d2.as_bytes()) {
                                if let Err(e) = fs.rename(
                                    parent,
                                    n.as_bytes(),
                                    p2.ino,
                                    n2.as_bytes(),
                                    false,
                                    false,
                                ) {
                                    assert!(
                                        matches!(
                                            e,
                                            Error::NotFound
                                                | Error::Exists
                                                | Error::NotDir
                                                | Error::IsDir
                                                | Error::NotEmpty
                                                | Error::Invalid
                                        ),
                                        "thread {t}: rename: {e:?}"
                                    );
                                }
                            }
                        }
                        85..=89 => {
                            if let Err(e) = fs.readdir(parent, 0, 64) {
                                posix("readdir", &e)
                            }
                        }
                        _ => {
                            if !open.is_empty() {
                                let (ino, h) = open.swap_remove(rng.random_range(0..open.len()));
                                fs.write(ino, h, PID, 0, &[t as u8; 10]).expect("write");
                                fs.flush(ino, h, PID).expect("close");
                                fs.release(ino, h).expect("release");
                            }
                        }
                    }
                }
                for (ino, h) in open {
                    fs.flush(ino, h, PID).expect("close");
                    fs.release(ino, h).expect("release");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a racing thread failed");
    }
    drop(Arc::into_inner(fs).expect("one owner"));
    let fs = Fs::new(Space::open(&dir).expect("reopen"));
    let mut stack = vec![ROOT];
    while let Some(d) = stack.pop() {
        for (name, ino) in names(&fs, d) {
            assert_eq!(fs.lookup(d, &name).expect("lookup a listed entry").ino, ino);
            match fs.getattr(ino).expect("getattr").rec.kind {
                NodeKind::Dir => stack.push(ino),
                _ => {
                    let b = read(&fs, ino);
                    assert!(b.is_empty() || (b.len() == 10 && b.iter().all(|x| *x == b[0])));
                }
            }
        }
    }
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Eight writers each creating, writing and closing files of their own at once, as a
/// checkpoint of many small files does: their closes share commit groups, and a file may be
/// created after the group's transaction began and closed into it (its create then has to
/// be applied by its own close's turn in the group). Every file is listed, and reads back,
/// before and after a remount; no close pays a second durable commit for the creates the
/// other writers hold meanwhile. `CKPTFS_HELD_FILES` sets the files per writer (default 150).
#[test]
fn concurrent_writers_of_new_files_find_every_file_listed() {
    let dir = fresh("writers");
    let fs = Arc::new(Fs::new(Space::open(&dir).expect("open")));
    let files = env("CKPTFS_HELD_FILES", 150);
    let commits = |fs: &Fs| fs.space().report().stats().expect("stats").commits;
    let before = commits(&fs);
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let d = fs
                    .mkdir(ROOT, format!("w{t}").as_bytes(), 0o755, ME)
                    .expect("mkdir")
                    .ino;
                for i in 0..files {
                    let h = fh();
                    let name = format!("f{i}");
                    let ino = fs
                        .create(d, name.as_bytes(), 0o644, ME, h, true, true, false)
                        .expect("create")
                        .ino;
                    fs.write(ino, h, PID, 0, &[t; 64]).expect("write");
                    fs.flush(ino, h, PID).expect("close");
                    fs.release(ino, h).expect("release");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a writer failed");
    }
    // A close owes durability to the changes made before it, not to the creates other
    // writers hold meanwhile: at most one durable metadata commit per close (shared ones
    // count once), where a close that found another writer's create held synced again.
    let after = commits(&fs);
    let closes = after.files - before.files;
    let (durable, groups) = (
        after.durable - before.durable,
        after.transactions - before.transactions,
    );
    assert_eq!(closes, 8 * files, "every close committed its file");
    assert!(
        durable <= groups,
        "{durable} durable metadata commits for {groups} groups of closes ({closes} closes): \
         a close synced again for what other writers hold"
    );
    let check = |fs: &Fs, when: &str| {
        for t in 0..8u8 {
            let d = fs
                .lookup(ROOT, format!("w{t}").as_bytes())
                .expect("lookup")
                .ino;
            let listed = names(fs, d);
            assert_eq!(listed.len() as u64, files, "{when}: files listed in w{t}");
            for (name, ino) in listed {
                assert_eq!(fs.lookup(d, &name).expect("lookup").ino, ino);
                assert_eq!(read(fs, ino), vec![t; 64], "{when}: w{t}");
            }
        }
    };
    check(&fs, "mounted");
    drop(Arc::into_inner(fs).expect("one owner"));
    let fs = Fs::new(Space::open(&dir).expect("reopen"));
    check(&fs, "reopened");
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}
