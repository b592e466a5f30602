//! One POSIX namespace from every node: random namespace and data operations, each issued on
//! a random node of a multi-slot space (2 to 4 nodes), compared call by call with a
//! reference model of one local filesystem (`ckptfs_tests::nsmodel`), then every node's
//! whole tree compared with the model, `ckptfs check` of every slot, a remount of every
//! node (each may get another slot) and the comparison again, and an offline check.
//!
//! The operations include what jobs do across nodes: `mkdir -p` of the same directories,
//! ranks writing into a staging directory that one node renames when all are done, files
//! held open on one node while another renames their directory (the later close lands under
//! the new name), renames and removals of other nodes' entries, truncates and chmods of
//! them, and writes into other nodes' files.
//!
//! Knobs: `CKPTFS_SEED` replays one seed; `CKPTFS_MODEL_OPS` operations per seed (default
//! 160); `CKPTFS_MODEL_SEEDS` how many seeds from the first (default 2).

use ckptfs_tests::cluster::Cluster;
use ckptfs_tests::nsmodel::{diff_trees, seen_tree, Ino, Model, R};
use ckptfs_tests::{close_checked, pattern};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::time::Duration;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

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
            self.log[self.log.len().saturating_sub(25)..].join("\n")
        );
    }
}

fn compare_all(c: &Cluster, run: &Run, nodes: usize, when: &str) {
    let want = run.model.tree();
    for n in 0..nodes {
        let got = seen_tree(&c.nodes[n].mnt)
            .unwrap_or_else(|e| panic!("seed {}: {when}: walking node {n}'s tree: {e}", run.seed));
        let d = diff_trees(&want, &got, 20);
        assert!(
            d.is_empty(),
            "seed {}: {when}: node {n} differs from the model:\n{}\nlast operations:\n{}",
            run.seed,
            d.join("\n"),
            run.log[run.log.len().saturating_sub(40)..].join("\n")
        );
    }
}

fn one_seed(seed: u64, ops: usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let nodes = rng.random_range(2..=4usize);
    println!("seed {seed}: {nodes} nodes, {ops} operations");
    let mut c = Cluster::new(nodes as u32, "1G", nodes, Duration::from_secs(10));
    for n in 0..nodes {
        c.mount(n, &[]);
    }
    let mut run = Run {
        seed,
        rng,
        model: Model::new(),
        log: Vec::new(),
        step: 0,
    };
    let mut held: Option<Held> = None;
    for i in 0..ops {
        let n = run.rng.random_range(0..nodes);
        let at = |p: &str| c.path(n, p.trim_start_matches('/'));
        // A held handle writes and closes after a few operations (its inode may have moved
        // or gone meanwhile).
        if let Some(h) = held.as_mut() {
            if h.ops_left == 0 {
                let h = held.take().expect("held");
                let bytes = run.data();
                let got = err(h
                    .file
                    .write_all_at(&bytes, 0)
                    .and_then(|_| close_checked(h.file)));
                run.model.write_at(h.ino, 0, &bytes);
                run.expect(
                    &format!(
                        "#{i} node {}: write {} bytes to held {} and close",
                        h.node,
                        bytes.len(),
                        h.path
                    ),
                    Ok(()),
                    got,
                );
                continue;
            }
            h.ops_left -= 1;
        }
        let held_ino = held.as_ref().map(|h| h.ino);
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
                let p = run.path();
                if run.model.crosses_symlink(&p) || run.model.is_symlink(&p) {
                    continue;
                }
                if run.model.lookup(&p).ok() == held_ino && held_ino.is_some() {
                    continue;
                }
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
                let p = run.path();
                if run.model.crosses_symlink(&p) || run.model.is_symlink(&p) {
                    continue;
                }
                if run.model.lookup(&p).ok() == held_ino && held_ino.is_some() {
                    continue;
                }
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
                let p = run.path();
                if run.model.crosses_symlink(&p) || run.model.is_symlink(&p) {
                    continue;
                }
                if run.model.lookup(&p).ok() == held_ino && held_ino.is_some() {
                    continue;
                }
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
                let want = run
                    .model
                    .lookup(&p)
                    .and_then(|ino| match run.model.obj(ino) {
                        Some(ckptfs_tests::nsmodel::Obj::File { data, .. }) => Ok(data.clone()),
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
                            ckptfs_tests::first_difference(g, w).unwrap_or_default(),
                            run.log[run.log.len().saturating_sub(25)..].join("\n")
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
                    run.log[run.log.len().saturating_sub(25)..].join("\n")
                );
            }
            87..=91 => {
                // A job's step: every node `mkdir -p` the staging directory and writes its
                // rank file into it; then one node renames the directory to the step's name.
                run.step += 1;
                let tmp = format!("/run/tmp-{}", run.step);
                let fin = format!("/run/step-{}", run.step);
                if run.model.crosses_symlink(&format!("{tmp}/x"))
                    || run.model.lookup("/run").is_ok_and(|i| {
                        !matches!(
                            run.model.obj(i),
                            Some(ckptfs_tests::nsmodel::Obj::Dir { .. })
                        )
                    })
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
                if held.is_some() {
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
                        Some(ckptfs_tests::nsmodel::Obj::Dir { .. })
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
        let bytes = pattern(seed, 1234);
        let got = err(h
            .file
            .write_all_at(&bytes, 0)
            .and_then(|_| close_checked(h.file)));
        run.model.write_at(h.ino, 0, &bytes);
        run.expect(
            &format!("end: node {}: write and close held {}", h.node, h.path),
            Ok(()),
            got,
        );
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
        c.mount(n, &[]);
    }
    compare_all(&c, &run, nodes, "after every node remounted");
}

#[test]
fn every_node_sees_one_posix_tree() {
    let first = ckptfs_tests::test_seed("every_node_sees_one_posix_tree", 1);
    let ops = env_usize("CKPTFS_MODEL_OPS", 160);
    let seeds = match std::env::var_os("CKPTFS_SEED") {
        Some(_) => 1,
        None => env_usize("CKPTFS_MODEL_SEEDS", 2),
    };
    for s in 0..seeds as u64 {
        one_seed(first + s, ops);
    }
}
