//! The engine's modules form layers: no module reaches (through `crate::...` paths) a
//! module that reaches it back. A cycle is how the engine regrew tangles before (the
//! file map, the pipeline and the predictor each importing the others; gc and space),
//! so this test reads the sources and fails naming the cycle.
//!
//! Test code (`#[cfg(test)] mod ...` blocks) is left out: a unit test may build whatever
//! it needs. Comments are left out too. The sources are read at run time from
//! `CARGO_MANIFEST_DIR/src`, so pointing that variable at another tree checks that tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("engine sources") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without comment lines and without its test modules.
fn production_code(src: &str) -> String {
    let mut out = String::new();
    let mut lines = src.lines().peekable();
    while let Some(l) = lines.next() {
        let t = l.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("#[cfg(test)]") {
            // Skip the item that follows when it is a module: to its closing brace at the
            // attribute's indentation (rustfmt's layout).
            if lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod "))
            {
                let indent = l.len() - t.len();
                let close = format!("{}}}", " ".repeat(indent));
                let head = lines.next().unwrap_or_default();
                if !head.trim_end().ends_with(';') {
                    for n in lines.by_ref() {
                        if n.trim_end() == close {
                            break;
                        }
                    }
                }
                continue;
            }
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// The top-level modules `code` names through `crate::`: `crate::x::...` and every first
/// segment inside `crate::{a::..., b, ...}`.
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut start = 0;
            let mut end = group.len();
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = j;
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            out.insert(ident(group[start..end].trim()));
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out
}

/// A cycle through `graph`, if there is one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(m.to_string(), Mark::Open);
        path.push(m.to_string());
        for d in graph.get(m).into_iter().flatten() {
            match marks.get(d).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let at = path.iter().position(|x| x == d).unwrap_or(0);
                    let mut cycle = path[at..].to_vec();
                    cycle.push(d.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(d, graph, marks, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(m.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in graph.keys() {
        if marks.get(m).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(m, graph, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("a module name");
        // The crate root declares every module (and a binary's holds its options): not a
        // layer.
        if top == "lib" || top == "main" {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(f).expect("readable source"));
        let deps = graph.entry(top.clone()).or_default();
        deps.extend(uses(&code).into_iter().filter(|d| *d != top));
    }
    let known: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| known.contains(d));
    }
    graph
}

#[test]
fn engine_modules_import_each_other_without_cycles() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo");
    let graph = module_graph(&Path::new(&root).join("src"));
    assert!(graph.len() > 20, "read only {} modules", graph.len());
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "engine modules import each other in a cycle: {}\n(every module's imports: {graph:#?})",
            cycle.join(" -> ")
        );
    }
}

/// The benchmark's modules too (`bench/src`): its scenarios, report and helpers grew an
/// import circle once (bench, limits, report, ckptfs, sink, sys), which made any one of
/// them impossible to read or change alone.
#[test]
fn bench_modules_import_each_other_without_cycles() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo");
    let graph = module_graph(&Path::new(&root).join("../bench/src"));
    assert!(graph.len() > 10, "read only {} modules", graph.len());
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "bench modules import each other in a cycle: {}\n(every module's imports: {graph:#?})",
            cycle.join(" -> ")
        );
    }
}

/// The filesystem layer reaches the engine through `Space`, `Stats`, the error type and the
/// one face module (`ckptfs_engine::face`), never into the engine's modules: what `fs`
/// depends on stays one list (`engine/ARCHITECTURE.md`).
#[test]
fn fs_uses_the_engine_through_its_face() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo");
    let mut files = Vec::new();
    sources(&Path::new(&root).join("../fs/src"), &mut files);
    assert!(files.len() >= 4, "read only {} fs sources", files.len());
    let allowed = ["face", "Space", "Stats", "Error", "Result"];
    let mut bad = Vec::new();
    for f in &files {
        let code = production_code(&std::fs::read_to_string(f).expect("readable source"));
        let mut rest = code.as_str();
        while let Some(i) = rest.find("ckptfs_engine::") {
            rest = &rest[i + "ckptfs_engine::".len()..];
            let names: Vec<String> = match rest.strip_prefix('{') {
                Some(g) => g[..g.find('}').unwrap_or(g.len())]
                    .split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect(),
                None => vec![rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()],
            };
            for n in names {
                if !allowed.contains(&n.as_str()) {
                    bad.push(format!("{}: ckptfs_engine::{n}", f.display()));
                }
            }
        }
        // Namespace changes go through the typed operations (`Space::ns`), never through a
        // transaction over the tables; the catalog is the engine's.
        for raw in [".ns_write(", ".catalog()", "Txn"] {
            if code.contains(raw) {
                bad.push(format!("{}: {raw}", f.display()));
            }
        }
    }
    assert!(bad.is_empty(), "fs reaches into the engine: {bad:#?}");
}

#[test]
fn the_cycle_finder_finds_cycles_and_reads_grouped_imports() {
    let code = "use crate::{a::X, b::{Y, Z}, c};\n// crate::commented\nfn f() { crate::d::g(); }\n\
                #[cfg(test)]\nmod tests {\n    use crate::e;\n}\n";
    let u = uses(&production_code(code));
    assert_eq!(
        u.into_iter().collect::<Vec<_>>(),
        vec!["a", "b", "c", "d"],
        "grouped, nested and path imports; no comments, no tests"
    );
    let g = |edges: &[(&str, &str)]| {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            m.entry(a.to_string()).or_default().insert(b.to_string());
            m.entry(b.to_string()).or_default();
        }
        m
    };
    assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        find_cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
