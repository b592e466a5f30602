//! N-1 across nodes against a model of the documented rule (README "Several nodes, one
//! space": a file written by several nodes). Random writes from 2 to 4 nodes into one file
//! at a time: `pwrite` anywhere (into holes, across other nodes' bytes, past the end),
//! `O_APPEND` writes, all-zero writes, `O_TRUNC` opens, truncates by path and through an
//! open descriptor, `fsync`s and closes in random order, and remounts. Whenever no
//! descriptor is open, every node reads the whole file, which must equal the model's byte
//! for byte, size included.
//!
//! The model keeps the file as its layers, as the daemons do: a node writes into its newest
//! layer while that is the top one (no other node's layer started, and no other node
//! truncated, after it), else into a new layer on top, which starts when it opens the file
//! for writing. A byte comes from the newest layer that wrote it (holes are no writes,
//! written zeros are writes). A truncate at length L cuts every layer that started before
//! it at L; the layer it goes to is the truncating node's top layer, or a new one on top
//! (empty up to L), into which that node's descriptors write from then on (what they wrote
//! before is committed in their old layer first); an `O_TRUNC` open or a truncate to 0
//! empties the node's newest layer instead and dates it after the others. An `O_TRUNC`
//! open's truncate counts from its first commit (a close, an fsync, or a later truncate by
//! the same node); every other change of a layer counts from the close or fsync that
//! commits it, and a truncate by path at once.

use crate::cluster::Cluster;
use rand::rngs::SmallRng as StdRng;
use rand::{Rng, SeedableRng};
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// One layer of the model's file.
struct Layer {
    node: usize,
    created: u64,
    /// (stamp, length): the last truncate that went to this layer, with the length it
    /// cuts the layers that started before it at.
    clip: Option<(u64, u64)>,
    /// Committed content; None is a hole (no write). Its length is the layer's size.
    bytes: Vec<Option<u8>>,
}

/// A descriptor a node holds open for writing, with what it wrote since its last commit.
struct Handle {
    file: fs::File,
    layer: usize,
    live: Vec<Option<u8>>,
    append: bool,
    /// An O_TRUNC open's truncate (its stamp), recorded with the first commit.
    clip: Option<u64>,
}

#[derive(Default)]
struct Model {
    layers: Vec<Layer>,
    clock: u64,
}

impl Model {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The length every layer but `i` cuts layer `i` at (u64::MAX: uncut).
    fn cut(&self, i: usize) -> u64 {
        let c = self.layers[i].created;
        self.layers
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, o)| o.clip.filter(|(s, _)| *s > c).map(|(_, l)| l))
            .min()
            .unwrap_or(u64::MAX)
    }

    fn order(&self) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.layers.len()).collect();
        idx.sort_by_key(|&i| self.layers[i].created);
        idx
    }

    /// The file as every node reads it once nothing is open; `live`: a node's descriptor's
    /// layer and its uncommitted content, for the size that node sees.
    fn merged(&self, live: Option<(usize, &[Option<u8>])>) -> Vec<u8> {
        let content = |i: usize| match live {
            Some((l, b)) if l == i => b,
            _ => &self.layers[i].bytes[..],
        };
        let size = (0..self.layers.len())
            .map(|i| (content(i).len() as u64).min(self.cut(i)))
            .max()
            .unwrap_or(0) as usize;
        let mut out = vec![0u8; size];
        for i in self.order() {
            let stop = (self.cut(i) as usize).min(content(i).len());
            for (o, b) in out.iter_mut().zip(&content(i)[..stop]) {
                if let Some(b) = b {
                    *o = *b;
                }
            }
        }
        out
    }

    fn newest_of(&self, node: usize) -> Option<usize> {
        (0..self.layers.len())
            .filter(|&i| self.layers[i].node == node)
            .max_by_key(|&i| self.layers[i].created)
    }

    /// The layer a node's change goes to (`reuse_newest`: its newest even below others),
    /// and whether that one was the top; a new one is made on top where neither.
    fn layer_for(&mut self, node: usize, stamp: u64, reuse_newest: bool) -> (usize, bool) {
        let others_top = self
            .layers
            .iter()
            .filter(|l| l.node != node)
            .map(|l| l.created.max(l.clip.map_or(0, |c| c.0)))
            .max()
            .unwrap_or(0);
        if let Some(m) = self.newest_of(node) {
            if self.layers[m].created >= others_top {
                return (m, true);
            }
            if reuse_newest {
                return (m, false);
            }
        }
        self.layers.push(Layer {
            node,
            created: stamp,
            clip: None,
            bytes: Vec::new(),
        });
        (self.layers.len() - 1, true)
    }

    /// Records a truncate in `layer`; `again`: the layer was the node's top one already, so
    /// the shorter of its cuts holds for the layers under it.
    fn truncate(&mut self, layer: usize, again: bool, stamp: u64, len: u64) {
        let l = &mut self.layers[layer];
        l.clip = Some(match (again, l.clip) {
            (true, Some((_, old))) => (stamp, old.min(len)),
            _ => (stamp, len),
        });
        l.created = l.created.max(stamp);
    }
}

fn write_into(live: &mut Vec<Option<u8>>, off: usize, data: &[u8]) {
    if live.len() < off + data.len() {
        live.resize(off + data.len(), None);
    }
    for (d, s) in live[off..].iter_mut().zip(data) {
        *d = Some(*s);
    }
}

fn resize(live: &mut Vec<Option<u8>>, len: usize) {
    live.resize(len, None);
}

fn data(rng: &mut StdRng, len: usize) -> Vec<u8> {
    if rng.random_bool(0.1) {
        return vec![0u8; len];
    }
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn length(rng: &mut StdRng) -> usize {
    match rng.random_range(0..10) {
        0..=3 => rng.random_range(1..300),
        4..=7 => rng.random_range(300..20_000),
        _ => rng.random_range(20_000..200_000),
    }
}

/// Runs `ops` random operations from seed `seed` on a fresh space of `nodes` slots (2 to 4
/// nodes when None), on `clients` (a shared filesystem's clients) or a local directory.
pub fn run(seed: u64, ops: usize, nodes: Option<usize>, clients: &[std::path::PathBuf]) {
    let mut rng = StdRng::seed_from_u64(seed);
    let nodes = nodes.unwrap_or_else(|| rng.random_range(2..=4));
    eprintln!("n1 model: seed {seed}, {nodes} nodes, {ops} operations (CKPTFS_SEED={seed})");
    let mut c = Cluster::on_clients(
        nodes as u32,
        &format!("{}M", 256 * nodes),
        nodes,
        Duration::from_secs(5),
        clients,
    );
    for n in 0..nodes {
        c.mount(n, &[]);
    }
    let mut model = Model::default();
    let mut handles: Vec<Option<Handle>> = (0..nodes).map(|_| None).collect();
    let mut file = 0;
    let mut log: Vec<String> = Vec::new();
    let name = |f: usize| format!("f{f}");
    for op in 0..ops {
        // A new file now and then, so the layer lists stay short enough to read.
        if op > 0 && op % 60 == 0 {
            quiesce(&mut c, &mut model, &mut handles, &mut rng, &mut log);
            check(&c, &model, &name(file), seed, &log);
            file += 1;
            model = Model {
                layers: Vec::new(),
                clock: model.clock,
            };
            log.clear();
        }
        let n = rng.random_range(0..nodes);
        let path = c.path(n, &name(file));
        match handles[n].take() {
            None => {
                let roll = rng.random_range(0..100);
                if roll < 4 {
                    log.push(format!("n{n} remount"));
                    c.unmount(n);
                    c.mount(n, &[]);
                    // `ckptfs umount` and `mount` run as child processes of this one, which
                    // inherit every open descriptor until their exec closes it: a FLUSH from
                    // another process, which commits what was written (unlisted, as an
                    // fsync point) and publishes it.
                    for h in handles.iter_mut().flatten() {
                        commit(&mut model, h);
                    }
                } else if roll < 14 && !model.layers.is_empty() {
                    let size = model.merged(None).len();
                    let len = match rng.random_range(0..4) {
                        0 => 0,
                        1 => size + rng.random_range(0..100_000),
                        _ => rng.random_range(0..=size),
                    };
                    log.push(format!("n{n} truncate {len}"));
                    let stamp = model.tick();
                    let before = model.layers.len();
                    let (layer, top) = model.layer_for(n, stamp, len == 0);
                    let made = model.layers.len() > before;
                    model.truncate(layer, top && !made, stamp, len as u64);
                    if len == 0 {
                        model.layers[layer].bytes.clear();
                    }
                    resize(&mut model.layers[layer].bytes, len);
                    let r = crate::check(unsafe {
                        libc::truncate(crate::cpath(&path).as_ptr(), len as libc::off_t)
                    });
                    r.unwrap_or_else(|e| panic!("seed {seed}: truncate: {e}\n{log:#?}"));
                } else {
                    let trunc = !model.layers.is_empty() && rng.random_range(0..100) < 10;
                    let append = !trunc && rng.random_bool(0.3);
                    log.push(format!("n{n} open trunc={trunc} append={append}"));
                    let f = fs::OpenOptions::new()
                        .write(true)
                        .append(append)
                        .truncate(trunc)
                        .create(true)
                        .open(&path)
                        .unwrap_or_else(|e| panic!("seed {seed}: open: {e}\n{log:#?}"));
                    let stamp = model.tick();
                    let (layer, _) = if model.layers.is_empty() {
                        model.layers.push(Layer {
                            node: n,
                            created: stamp,
                            clip: None,
                            bytes: Vec::new(),
                        });
                        (0, true)
                    } else {
                        model.layer_for(n, stamp, trunc)
                    };
                    let live = match trunc {
                        true => Vec::new(),
                        false => model.layers[layer].bytes.clone(),
                    };
                    handles[n] = Some(Handle {
                        file: f,
                        layer,
                        live,
                        append,
                        clip: trunc.then_some(stamp),
                    });
                }
            }
            Some(mut h) => {
                let roll = rng.random_range(0..100);
                if roll < 55 {
                    let len = length(&mut rng);
                    let d = data(&mut rng, len);
                    if h.append {
                        // The kernel appends at the size it knows: fstat refreshes it (a
                        // multi-slot mount's attributes are never cached).
                        let seen = model.merged(Some((h.layer, &h.live))).len();
                        let st = h.file.metadata().unwrap().len() as usize;
                        assert_eq!(st, seen, "seed {seed}: size n{n} sees\n{log:#?}");
                        log.push(format!("n{n} append {len} at {seen}"));
                        h.file
                            .write_all(&d)
                            .unwrap_or_else(|e| panic!("seed {seed}: append: {e}"));
                        write_into(&mut h.live, seen, &d);
                    } else {
                        let size = model.merged(Some((h.layer, &h.live))).len();
                        let off = rng.random_range(0..=size + 150_000);
                        log.push(format!("n{n} pwrite {len} at {off}"));
                        h.file
                            .write_all_at(&d, off as u64)
                            .unwrap_or_else(|e| panic!("seed {seed}: pwrite: {e}"));
                        write_into(&mut h.live, off, &d);
                    }
                    handles[n] = Some(h);
                } else if roll < 62 {
                    let size = model.merged(Some((h.layer, &h.live))).len();
                    let len = rng.random_range(0..=size + 50_000);
                    log.push(format!("n{n} ftruncate {len}"));
                    h.file
                        .set_len(len as u64)
                        .unwrap_or_else(|e| panic!("seed {seed}: ftruncate: {e}\n{log:#?}"));
                    let stamp = model.tick();
                    // An O_TRUNC still to be recorded is committed first.
                    if h.clip.is_some() {
                        commit(&mut model, &mut h);
                    }
                    let before = model.layers.len();
                    let (layer, top) = model.layer_for(n, stamp, len == 0);
                    let made = model.layers.len() > before;
                    if made {
                        // A new top layer: what the descriptor wrote is committed in its old
                        // layer, and it writes into the new one from now on.
                        commit(&mut model, &mut h);
                        h.layer = layer;
                        h.live = Vec::new();
                    } else {
                        assert_eq!(
                            layer, h.layer,
                            "the descriptor's layer is the node's newest"
                        );
                    }
                    model.truncate(layer, top && !made, stamp, len as u64);
                    if len == 0 {
                        h.live.clear();
                    }
                    resize(&mut h.live, len);
                    if !top {
                        // Dated after the others: committed at once.
                        commit(&mut model, &mut h);
                    }
                    handles[n] = Some(h);
                } else if roll < 72 {
                    log.push(format!("n{n} fsync"));
                    h.file
                        .sync_all()
                        .unwrap_or_else(|e| panic!("seed {seed}: fsync: {e}"));
                    commit(&mut model, &mut h);
                    handles[n] = Some(h);
                } else {
                    log.push(format!("n{n} close"));
                    commit(&mut model, &mut h);
                    crate::close_checked(h.file)
                        .unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
                }
            }
        }
        if rng.random_range(0..100) < 6 {
            quiesce(&mut c, &mut model, &mut handles, &mut rng, &mut log);
            check(&c, &model, &name(file), seed, &log);
        }
    }
    quiesce(&mut c, &mut model, &mut handles, &mut rng, &mut log);
    check(&c, &model, &name(file), seed, &log);
    // Every node remounted: what was committed is what every node reads.
    for n in 0..nodes {
        c.unmount(n);
    }
    for n in 0..nodes {
        c.mount(n, &[]);
    }
    log.push("all remounted".into());
    check(&c, &model, &name(file), seed, &log);
    for f in 0..file {
        let want = fs::read(c.path(0, &name(f))).unwrap();
        for n in 1..nodes {
            assert!(
                fs::read(c.path(n, &name(f))).unwrap() == want,
                "seed {seed}: node {n} reads {} otherwise than node 0 after remounts",
                name(f)
            );
        }
    }
}

fn commit(model: &mut Model, h: &mut Handle) {
    let l = &mut model.layers[h.layer];
    l.bytes = h.live.clone();
    if let Some(stamp) = h.clip.take() {
        l.clip = Some((stamp, 0));
        l.created = l.created.max(stamp);
    }
}

/// Closes every open descriptor, in random order.
fn quiesce(
    _c: &mut Cluster,
    model: &mut Model,
    handles: &mut [Option<Handle>],
    rng: &mut StdRng,
    log: &mut Vec<String>,
) {
    let mut open: Vec<usize> = (0..handles.len())
        .filter(|&n| handles[n].is_some())
        .collect();
    while !open.is_empty() {
        let n = open.swap_remove(rng.random_range(0..open.len()));
        let mut h = handles[n].take().expect("open");
        log.push(format!("n{n} close (quiesce)"));
        commit(model, &mut h);
        crate::close_checked(h.file).expect("close");
    }
}

fn check(c: &Cluster, model: &Model, name: &str, seed: u64, log: &[String]) {
    if model.layers.is_empty() {
        return;
    }
    let want = model.merged(None);
    for n in 0..c.nodes.len() {
        let got = fs::read(c.path(n, name))
            .unwrap_or_else(|e| panic!("seed {seed}: node {n} reads {name}: {e}"));
        if let Some(d) = crate::first_difference(&got, &want) {
            let _ = std::io::stderr().flush();
            // Which layer each byte at the first difference comes from, in the model.
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            let layers: Vec<String> = model
                .order()
                .into_iter()
                .map(|i| {
                    let l = &model.layers[i];
                    format!(
                        "layer {i} of n{} created {} clip {:?} size {} cut {} byte {:?}",
                        l.node,
                        l.created,
                        l.clip,
                        l.bytes.len(),
                        model.cut(i),
                        l.bytes.get(at)
                    )
                })
                .collect();
            panic!(
                "seed {seed} (CKPTFS_SEED={seed}): node {n} reads {name} otherwise than the \
                 model: {d}\nat {at}: read {:?}, model {:?}; the model's layers, oldest \
                 first:\n{}\noperations on {name}:\n{}",
                got.get(at),
                want.get(at),
                layers.join("\n"),
                log.join("\n")
            );
        }
    }
}

pub use crate::env_usize;
