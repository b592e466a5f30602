//! Differential test: one seeded random sequence of file operations is applied to a plain
//! directory and to the mount. Every operation must give the same result (value or errno), and
//! the trees (types, sizes, mode bits, bytes) must be identical, also after remounts.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ckptfs_tests::{check, cpath, errno, fill_pattern, list_tree, test_seed, TempDir, TestMount};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const OPS: usize = 2000;
const SLOTS: usize = 6;
const MAX_IO: usize = 256 * 1024;
const MAX_OFFSET: u64 = 3 << 20;
const NAMES: [&str; 5] = ["a", "b", "c", "x", "y"];
const MODES: [u32; 6] = [0o600, 0o644, 0o755, 0o700, 0o444, 0o640];

#[derive(Debug, Clone)]
enum Op {
    Create {
        slot: usize,
        path: String,
        excl: bool,
        trunc: bool,
    },
    Open {
        slot: usize,
        path: String,
    },
    Write {
        slot: usize,
        off: u64,
        len: usize,
        seed: u64,
    },
    Read {
        slot: usize,
        off: u64,
        len: usize,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Ftruncate {
        slot: usize,
        len: u64,
    },
    Rename {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Close {
        slot: usize,
    },
    Fsync {
        slot: usize,
        data_only: bool,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Stat {
        path: String,
    },
}

#[derive(Debug, PartialEq, Eq)]
enum Out {
    Unit,
    Bytes(Vec<u8>),
    Stat {
        kind: &'static str,
        size: Option<u64>,
        mode: u32,
    },
}

/// One side of the comparison: a root directory and its open-file slots.
struct Side {
    root: PathBuf,
    slots: Vec<Option<File>>,
}

fn kind_of(ft: fs::FileType) -> &'static str {
    if ft.is_file() {
        "file"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "other"
    }
}

impl Side {
    fn new(root: &Path) -> Side {
        Side {
            root: root.to_path_buf(),
            slots: (0..SLOTS).map(|_| None).collect(),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn slot(&self, slot: usize) -> &File {
        self.slots[slot].as_ref().expect("op on an empty slot")
    }

    fn apply(&mut self, op: &Op) -> Result<Out, i32> {
        let unit = |r: std::io::Result<()>| errno(r).map(|()| Out::Unit);
        match op {
            Op::Create {
                slot,
                path,
                excl,
                trunc,
            } => {
                let mut o = OpenOptions::new();
                o.read(true).write(true).mode(0o644);
                if *excl {
                    o.create_new(true);
                } else {
                    o.create(true).truncate(*trunc);
                }
                let f = errno(o.open(self.p(path)))?;
                self.slots[*slot] = Some(f);
                Ok(Out::Unit)
            }
            Op::Open { slot, path } => {
                let f = errno(OpenOptions::new().read(true).write(true).open(self.p(path)))?;
                self.slots[*slot] = Some(f);
                Ok(Out::Unit)
            }
            Op::Write {
                slot,
                off,
                len,
                seed,
            } => {
                let mut buf = vec![0u8; *len];
                fill_pattern(*seed, *off, &mut buf);
                unit(self.slot(*slot).write_all_at(&buf, *off))
            }
            Op::Read { slot, off, len } => {
                let f = self.slot(*slot);
                let mut buf = vec![0u8; *len];
                let mut got = 0;
                while got < *len {
                    let n = errno(f.read_at(&mut buf[got..], off + got as u64))?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                buf.truncate(got);
                Ok(Out::Bytes(buf))
            }
            Op::Truncate { path, len } => {
                // SAFETY: valid C string path.
                let r = check(unsafe {
                    libc::truncate(cpath(&self.p(path)).as_ptr(), *len as libc::off_t)
                });
                unit(r.map(|_| ()))
            }
            Op::Ftruncate { slot, len } => unit(self.slot(*slot).set_len(*len)),
            Op::Rename { from, to } => unit(fs::rename(self.p(from), self.p(to))),
            Op::Unlink { path } => unit(fs::remove_file(self.p(path))),
            Op::Mkdir { path } => unit(fs::create_dir(self.p(path))),
            Op::Rmdir { path } => unit(fs::remove_dir(self.p(path))),
            Op::Close { slot } => {
                self.slots[*slot] = None;
                Ok(Out::Unit)
            }
            Op::Fsync { slot, data_only } => {
                let f = self.slot(*slot);
                unit(if *data_only {
                    f.sync_data()
                } else {
                    f.sync_all()
                })
            }
            Op::Chmod { path, mode } => unit(fs::set_permissions(
                self.p(path),
                fs::Permissions::from_mode(*mode),
            )),
            Op::Stat { path } => {
                let md = errno(fs::symlink_metadata(self.p(path)))?;
                Ok(Out::Stat {
                    kind: kind_of(md.file_type()),
                    size: md.is_file().then_some(md.len()),
                    mode: md.mode() & 0o7777,
                })
            }
        }
    }

    fn close_all(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
    }
}

type Tree = BTreeMap<PathBuf, (&'static str, Option<u64>, u32, Option<Vec<u8>>)>;

fn tree(root: &Path) -> Tree {
    list_tree(root)
        .into_iter()
        .map(|rel| {
            let p = root.join(&rel);
            let md = fs::symlink_metadata(&p).expect("lstat");
            let file = md.is_file();
            let content = file.then(|| fs::read(&p).expect("read"));
            (
                rel,
                (
                    kind_of(md.file_type()),
                    file.then_some(md.len()),
                    md.mode() & 0o7777,
                    content,
                ),
            )
        })
        .collect()
}

fn compare_trees(plain: &Path, mnt: &Path, ctx: &str) {
    let (a, b) = (tree(plain), tree(mnt));
    let ka: Vec<_> = a.keys().collect();
    let kb: Vec<_> = b.keys().collect();
    assert_eq!(
        kb, ka,
        "{ctx}: paths on the mount (left) vs the plain dir (right)"
    );
    for (k, va) in &a {
        let vb = &b[k];
        assert_eq!(
            (vb.0, vb.1, format!("{:o}", vb.2)),
            (va.0, va.1, format!("{:o}", va.2)),
            "{ctx}: {}: (type, size, mode) on the mount (left) vs the plain dir (right)",
            k.display()
        );
        if let (Some(ca), Some(cb)) = (&va.3, &vb.3) {
            if let Some(d) = ckptfs_tests::first_difference(cb, ca) {
                panic!("{ctx}: {}: content on the mount differs: {d}", k.display());
            }
        }
    }
}

struct Gen {
    rng: SmallRng,
}

impl Gen {
    fn random_path(&mut self) -> String {
        let depth = self.rng.random_range(1..=3);
        (0..depth)
            .map(|_| NAMES[self.rng.random_range(0..NAMES.len())])
            .collect::<Vec<_>>()
            .join("/")
    }

    /// An existing path of the wanted kind (from the plain side) most of the time, else any.
    fn path(&mut self, existing: &[(String, bool)], want_dir: Option<bool>) -> String {
        let pool: Vec<&String> = existing
            .iter()
            .filter(|(_, d)| want_dir.is_none_or(|w| w == *d))
            .map(|(p, _)| p)
            .collect();
        if !pool.is_empty() && self.rng.random_bool(0.75) {
            pool[self.rng.random_range(0..pool.len())].clone()
        } else {
            self.random_path()
        }
    }

    /// A path that does not exist yet, when possible (to create things).
    fn new_path(&mut self, existing: &[(String, bool)]) -> String {
        let dirs: Vec<&String> = existing
            .iter()
            .filter(|(_, d)| *d)
            .map(|(p, _)| p)
            .collect();
        for _ in 0..10 {
            let name = NAMES[self.rng.random_range(0..NAMES.len())];
            let p = if !dirs.is_empty() && self.rng.random_bool(0.6) {
                format!("{}/{name}", dirs[self.rng.random_range(0..dirs.len())])
            } else {
                name.to_string()
            };
            if !existing.iter().any(|(e, _)| *e == p) && p.matches('/').count() < 4 {
                return p;
            }
        }
        self.random_path()
    }

    fn op(&mut self, plain: &Side, i: usize) -> Op {
        let existing: Vec<(String, bool)> = list_tree(&plain.root)
            .into_iter()
            .map(|rel| {
                let is_dir = plain.root.join(&rel).is_dir();
                (rel.to_string_lossy().into_owned(), is_dir)
            })
            .collect();
        let open: Vec<usize> = (0..SLOTS).filter(|&s| plain.slots[s].is_some()).collect();
        let free: Vec<usize> = (0..SLOTS).filter(|&s| plain.slots[s].is_none()).collect();
        let size_of = |slot: usize| plain.slot(slot).metadata().map(|m| m.len()).unwrap_or(0);
        let r = &mut self.rng;
        let roll = r.random_range(0..100);
        let want_slot_op = roll < 45;
        if want_slot_op && !open.is_empty() {
            let slot = open[r.random_range(0..open.len())];
            let size = size_of(slot);
            return match roll {
                0..=24 => {
                    let off = if r.random_bool(0.7) {
                        r.random_range(0..=size)
                    } else {
                        r.random_range(0..=size + (1 << 20))
                    }
                    .min(MAX_OFFSET);
                    let len = if r.random_bool(0.05) {
                        0
                    } else {
                        r.random_range(1..=MAX_IO)
                    };
                    Op::Write {
                        slot,
                        off,
                        len,
                        seed: i as u64,
                    }
                }
                25..=32 => Op::Read {
                    slot,
                    off: r.random_range(0..=size + 1000),
                    len: r.random_range(0..=MAX_IO + 4096),
                },
                33..=36 => Op::Ftruncate {
                    slot,
                    len: r.random_range(0..=size + size / 2 + 65536).min(MAX_OFFSET),
                },
                37..=40 => Op::Fsync {
                    slot,
                    data_only: r.random_bool(0.5),
                },
                _ => Op::Close { slot },
            };
        }
        if free.is_empty() {
            return Op::Close {
                slot: open[r.random_range(0..open.len())],
            };
        }
        let slot = free[self.rng.random_range(0..free.len())];
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=24 => {
                let path = if self.rng.random_bool(0.6) {
                    self.new_path(&existing)
                } else {
                    self.path(&existing, Some(false))
                };
                Op::Create {
                    slot,
                    path,
                    excl: self.rng.random_bool(0.2),
                    trunc: self.rng.random_bool(0.3),
                }
            }
            25..=39 => Op::Open {
                slot,
                path: self.path(&existing, Some(false)),
            },
            40..=47 => {
                let path = self.path(&existing, None);
                let len = self.rng.random_range(0..=1u64 << 20);
                Op::Truncate { path, len }
            }
            48..=59 => {
                let from = self.path(&existing, None);
                let to = if self.rng.random_bool(0.5) {
                    self.new_path(&existing)
                } else {
                    self.path(&existing, None)
                };
                Op::Rename { from, to }
            }
            60..=67 => Op::Unlink {
                path: self.path(&existing, Some(false)),
            },
            68..=79 => Op::Mkdir {
                path: self.new_path(&existing),
            },
            80..=85 => Op::Rmdir {
                path: self.path(&existing, Some(true)),
            },
            86..=90 => Op::Chmod {
                path: self.path(&existing, None),
                mode: MODES[self.rng.random_range(0..MODES.len())],
            },
            _ => Op::Stat {
                path: self.path(&existing, None),
            },
        }
    }
}

fn short(r: &Result<Out, i32>) -> String {
    match r {
        Ok(Out::Bytes(b)) => format!("Ok({} bytes)", b.len()),
        Ok(o) => format!("Ok({o:?})"),
        Err(e) => format!("Err({})", std::io::Error::from_raw_os_error(*e)),
    }
}

fn outcome(r: &Result<Out, i32>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => std::io::Error::from_raw_os_error(*e).to_string(),
    }
}

#[test]
fn random_ops_match_a_plain_directory() {
    let seed = test_seed("differential", 0x5eed_0006);
    let mut gen = Gen {
        rng: SmallRng::seed_from_u64(seed),
    };
    let plain_dir = TempDir::new("plain");
    let mut m = TestMount::new();
    let mut plain = Side::new(plain_dir.path());
    let mut mount = Side::new(m.mnt());
    let mut log: Vec<String> = Vec::new();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();

    for i in 0..OPS {
        let op = gen.op(&plain, i);
        let want = plain.apply(&op);
        let got = mount.apply(&op);
        log.push(format!("#{i} {op:?} -> {}", short(&want)));
        *tally.entry(outcome(&want)).or_default() += 1;
        if got != want {
            let recent = log[log.len().saturating_sub(25)..].join("\n");
            let detail = match (&got, &want) {
                (Ok(Out::Bytes(g)), Ok(Out::Bytes(w))) => {
                    ckptfs_tests::first_difference(g, w).unwrap_or_default()
                }
                _ => String::new(),
            };
            panic!(
                "seed {seed}, op #{i} {op:?}: the mount gave {} but the plain dir gave {} {detail}\n\
                 last ops:\n{recent}",
                short(&got),
                short(&want)
            );
        }
        if i % 250 == 249 {
            compare_trees(
                plain.root.as_path(),
                m.mnt(),
                &format!("seed {seed}, after op #{i}"),
            );
        }
        if i == OPS / 2 {
            plain.close_all();
            mount.close_all();
            m.remount();
            compare_trees(
                plain.root.as_path(),
                m.mnt(),
                &format!("seed {seed}, mid-run remount"),
            );
        }
    }
    println!("op results on the plain dir: {tally:?}");
    plain.close_all();
    mount.close_all();
    compare_trees(plain.root.as_path(), m.mnt(), &format!("seed {seed}, end"));
    m.remount();
    compare_trees(
        plain.root.as_path(),
        m.mnt(),
        &format!("seed {seed}, after final remount"),
    );
    let files = tree(plain.root.as_path()).len();
    println!("final tree: {files} entries");
}
