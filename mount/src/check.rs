//! `ckptfs check (MOUNTPOINT|BACKING_DIR) [--json]`: verifies every committed chunk and the
//! metadata invariants, offline or through the mount's daemon (`user.ckptfs.check`).
//!
//! Exit status: 0 clean, 1 damage or inconsistency found (including a metadata table that
//! fails its checksums at open, and, on a space over several targets, data with less
//! redundancy than its M+K: a shard holding wrong bytes, a missing one), 2 when nothing could be checked (usage, not a space, locked
//! by a process that is not a mount, I/O error opening it).

use crate::{absolute, backing_of, human, progress_bar};
use ckptfs_engine::format::SUPERBLOCK_FILE;
use ckptfs_engine::layout::Mode;
use ckptfs_engine::maintenance::check::{check, hash_hex, CheckReport, ChunkUse};
use ckptfs_engine::{Error as EngineError, Space};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Largest answer the daemon gives through the control xattr (the kernel's xattr value
/// limit is 64 KiB); the damaged and problem lists are cut to fit, with counts of the rest.
pub(crate) const ANSWER_MAX_BYTES: usize = 60 << 10;

fn lossy(p: &Option<Vec<u8>>) -> Value {
    match p {
        Some(p) => Value::String(String::from_utf8_lossy(p).into_owned()),
        None => Value::Null,
    }
}

fn use_json(u: &ChunkUse) -> Value {
    json!({
        "history": u.history,
        "path": lossy(&u.path),
        "unlinked": u.unlinked,
        "revision": u.revision.0,
        "current": u.current,
        "sealed": u.sealed,
        "start": u.file_start,
        "end": u.file_end,
    })
}

/// The report as JSON. With `max_bytes`, the `damaged`, `damaged_revisions`, `problems`,
/// `parity_segments` and `warnings` lists are cut so the whole answer fits; `*_omitted` count
/// what was cut. The summary counts are always complete. `parity` (null for a space on one
/// target) is the parity pass's summary; its per-segment findings are `parity_segments`.
pub(crate) fn check_json(r: &CheckReport, max_bytes: Option<usize>) -> Value {
    let damaged: Vec<Value> = r
        .damaged
        .iter()
        .map(|d| {
            json!({
                "hash": hash_hex(&d.hash),
                "offset": d.offset.0,
                "stored_len": d.stored_len,
                "reason": d.reason.kind(),
                "detail": d.reason.detail(),
                "uses": d.uses.iter().map(use_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let revs = r.damaged_revisions();
    let damaged_revisions: Vec<Value> = revs
        .iter()
        .map(|d| {
            json!({
                "history": d.history,
                "path": lossy(&d.path),
                "unlinked": d.unlinked,
                "revision": d.revision.0,
                "current": d.current,
                "sealed": d.sealed,
                "ranges": d.ranges.iter().map(|(s, e)| json!([s, e])).collect::<Vec<_>>(),
            })
        })
        .collect();
    let problems: Vec<Value> = r.problems.iter().map(|p| json!(p)).collect();
    let (parity, parity_segments, parity_omitted) = match &r.parity {
        Some(p) => {
            let mut summary = serde_json::to_value(p).unwrap_or_default();
            let segments = match summary.get_mut("segments").map(Value::take) {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            if let Some(o) = summary.as_object_mut() {
                o.remove("segments");
                o.remove("segments_omitted");
            }
            (summary, segments, p.segments_omitted)
        }
        None => (Value::Null, Vec::new(), 0),
    };
    let warnings: Vec<Value> = r.warnings.iter().map(|p| json!(p)).collect();
    let mut v = json!({
        "clean": r.is_clean(),
        "redundancy_full": r.redundancy_full(),
        "inodes": r.inodes,
        "histories": r.histories,
        "revisions": r.revisions,
        "extents": r.extents,
        "chunks": r.chunks,
        "chunks_verified": r.chunks_verified,
        "repaired_chunks": r.repaired_chunks,
        "bytes_verified": r.bytes_verified,
        "reserved_bytes": r.reserved_bytes,
        "used_bytes": r.used_bytes,
        "free_bytes": r.free_bytes,
        "stored_bytes": r.stored_bytes,
        "remote_chunks": r.remote_chunks,
        "seconds": r.seconds,
        "damaged_chunks": r.damaged.len(),
        "damaged_revision_count": revs.len(),
        "problem_count": r.problems.len() as u64 + r.problems_omitted,
        "damaged": [],
        "damaged_omitted": 0,
        "damaged_revisions": [],
        "damaged_revisions_omitted": 0,
        "problems": [],
        "problems_omitted": r.problems_omitted,
        "parity": parity,
        "parity_segments": [],
        "parity_segments_omitted": parity_omitted,
        "warnings": [],
        "warnings_omitted": 0,
    });
    // Fill the lists in order of importance while they fit: which revisions are damaged,
    // the metadata problems, the parity findings per segment (where rows cannot be rebuilt),
    // the per-chunk detail, then warnings.
    let mut room = max_bytes.map(|m| m.saturating_sub(v.to_string().len() + 64));
    for (key, items) in [
        ("damaged_revisions", damaged_revisions),
        ("problems", problems),
        ("parity_segments", parity_segments),
        ("damaged", damaged),
        ("warnings", warnings),
    ] {
        let mut kept = Vec::new();
        let mut omitted = 0u64;
        for item in items {
            let len = item.to_string().len() + 1;
            match room.as_mut() {
                Some(left) if omitted > 0 || len > *left => omitted += 1,
                Some(left) => {
                    *left -= len;
                    kept.push(item);
                }
                None => kept.push(item),
            }
        }
        v[key] = Value::Array(kept);
        let omitted_key = format!("{key}_omitted");
        let before = v[&omitted_key].as_u64().unwrap_or(0);
        v[&omitted_key] = json!(before + omitted);
    }
    v
}

fn print_human(v: &Value) {
    let u = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    println!(
        "checked {} inodes, {} histories, {} revisions, {} extents, {} chunks ({} read back) \
         in {:.2}s",
        u("inodes"),
        u("histories"),
        u("revisions"),
        u("extents"),
        u("chunks"),
        human(u("bytes_verified")),
        v.get("seconds").and_then(Value::as_f64).unwrap_or(0.0)
    );
    println!(
        "space: {} reserved, {} in use ({} of it live chunks), {} free",
        human(u("reserved_bytes")),
        human(u("used_bytes")),
        human(u("stored_bytes")),
        human(u("free_bytes"))
    );
    if u("remote_chunks") > 0 {
        println!(
            "{} chunks are held only by the object store and were not read back here \
             (`ckptfs check --remote` verifies the bucket)",
            u("remote_chunks")
        );
    }
    for d in v["damaged_revisions"].as_array().into_iter().flatten() {
        let path = d["path"].as_str().unwrap_or("(path unknown)");
        let ranges: Vec<String> = d["ranges"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{}..{}",
                    r[0].as_u64().unwrap_or(0),
                    r[1].as_u64().unwrap_or(0)
                )
            })
            .collect();
        let state = match (
            d["current"].as_bool() == Some(true),
            d["unlinked"].as_bool() == Some(true),
        ) {
            (true, _) => " (current)",
            (false, true) => " (removed file)",
            (false, false) => "",
        };
        println!(
            "DAMAGED  {path}  history {} revision {}{state}: bytes {}",
            d["history"],
            d["revision"],
            ranges.join(", ")
        );
    }
    for d in v["damaged"].as_array().into_iter().flatten() {
        if d["uses"].as_array().is_some_and(|a| a.is_empty()) {
            println!(
                "DAMAGED  unreferenced chunk {} at data offset {}: {}",
                d["hash"].as_str().unwrap_or("?"),
                d["offset"],
                d["detail"].as_str().unwrap_or("?")
            );
        }
    }
    for d in v["damaged"].as_array().into_iter().flatten() {
        println!(
            "  chunk {} at data offset {} ({} bytes): {}",
            d["hash"].as_str().unwrap_or("?"),
            d["offset"],
            d["stored_len"],
            d["detail"].as_str().unwrap_or("?")
        );
    }
    for p in v["problems"].as_array().into_iter().flatten() {
        println!("PROBLEM  {}", p.as_str().unwrap_or("?"));
    }
    print_parity(v);
    for w in v["warnings"].as_array().into_iter().flatten() {
        println!("warning  {}", w.as_str().unwrap_or("?"));
    }
    for (key, what) in [
        ("damaged_revisions_omitted", "damaged revisions"),
        ("damaged_omitted", "damaged chunks"),
        ("problems_omitted", "problems"),
        ("parity_segments_omitted", "segments with parity findings"),
        ("warnings_omitted", "warnings"),
    ] {
        if u(key) > 0 {
            println!(
                "... and {} more {what} (use --json offline for all)",
                u(key)
            );
        }
    }
    if v["clean"].as_bool() == Some(true) && v["redundancy_full"].as_bool() == Some(false) {
        // Shards missing (a failed target) need somewhere to go; damaged ones are rewritten
        // in place.
        let missing = v["parity"]["rows_degraded"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        println!(
            "DEGRADED: every chunk reads back and verifies and the metadata is consistent, but \
             some data has less redundancy than the space's M+K (see the parity line and the \
             warnings): {}",
            match missing {
                true =>
                    "`ckptfs rebuild` on the mount rebuilds the missing shards on healthy \
                    targets in failure domains their rows do not use yet (`--replace \
                    OLD=NEW` gives it a new target where there is none) and rewrites damaged \
                    ones from verified data",
                false => "`ckptfs scrub` on the mount rewrites it from verified data",
            }
        );
    } else if v["clean"].as_bool() == Some(true) {
        println!("clean: every chunk reads back and verifies; the metadata is consistent");
    } else {
        println!(
            "NOT CLEAN: {} damaged chunks in {} revisions, {} metadata problems",
            u("damaged_chunks"),
            u("damaged_revision_count"),
            u("problem_count")
        );
    }
}

/// The parity pass of a space over several targets: one summary line, and the rows that
/// cannot be rebuilt (inconsistent rows are among the warnings).
fn print_parity(v: &Value) {
    let p = &v["parity"];
    if !p.is_object() {
        return;
    }
    let u = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0);
    let degraded: u64 = p["rows_degraded"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| x[1].as_u64().unwrap_or(0))
        .sum();
    println!(
        "parity: {} rows holding live data in {} segments read whole and re-encoded: {} \
         inconsistent, {} degraded (missing shards), {} unrecoverable",
        u("rows_checked"),
        u("segments_checked"),
        u("rows_inconsistent"),
        degraded,
        u("rows_unrecoverable")
    );
    for s in v["parity_segments"].as_array().into_iter().flatten() {
        if s["unrecoverable_rows"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let ranges: Vec<String> = s["unrecoverable"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("{}..{}", r[0], r[1]))
            .collect();
        let missing: Vec<String> = s["missing_shards"]
            .as_array()
            .into_iter()
            .flatten()
            .map(
                |i| match s["targets"][i.as_u64().unwrap_or(0) as usize].as_u64() {
                    Some(t) => format!("{i} (target {t})"),
                    None => format!("{i} (not placed)"),
                },
            )
            .collect();
        println!(
            "UNRECOVERABLE  segment {}: {} rows (rows {}) have fewer readable shards than \
             their data needs (unreadable shards: {}); the chunks in their missing shards are \
             damaged above",
            s["segment"],
            s["unrecoverable_rows"],
            ranges.join(", "),
            missing.join(", ")
        );
    }
}

enum Where {
    Mounted(PathBuf),
    Offline(Box<Space>),
}

/// The space `path` names, opened when it is not mounted. On failure: the message, and
/// whether the failure is damage (a metadata table that fails its checksums or does not
/// decode) rather than "cannot check".
fn resolve(path: &Path) -> Result<Where, (String, bool)> {
    let abs = absolute(path);
    if abs.join(SUPERBLOCK_FILE).exists() {
        // Damage is told apart from "cannot check" by the engine's error, so it is kept.
        let failed = std::cell::Cell::new(false);
        let opened = crate::open_or_through(&abs, false, || {
            Space::open_as(&abs, &Mode::Offline).inspect_err(|e| {
                failed.set(matches!(e, EngineError::Corrupt(_) | EngineError::Meta(_)))
            })
        });
        return match opened {
            Ok(crate::Opened::Here(space)) => Ok(Where::Offline(Box::new(space))),
            Ok(crate::Opened::Through(mnt)) => Ok(Where::Mounted(mnt)),
            Err(m) => Err((m.to_string(), failed.get())),
        };
    }
    if backing_of(&abs).is_some() {
        return Ok(Where::Mounted(abs));
    }
    Err((
        format!(
            "{} is neither a ckptfs mountpoint nor a backing directory",
            abs.display()
        ),
        false,
    ))
}

/// Runs the command; returns its exit status.
pub(crate) fn run(path: &Path, json: bool) -> ExitCode {
    let abs = absolute(path);
    if abs.join(SUPERBLOCK_FILE).exists() && crate::slots::is_multi_slot(&abs) {
        return run_slots(&abs, json);
    }
    let v = match resolve(path) {
        Ok(Where::Mounted(mnt)) => {
            let pb = progress_bar(!json);
            if let Some(pb) = &pb {
                pb.set_message("check in the daemon");
            }
            let v = crate::control::send(&mnt, &crate::control::Request::Check);
            if let Some(pb) = pb {
                pb.finish_and_clear();
            }
            match v {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("ckptfs: check through {}: {e}", mnt.display());
                    return ExitCode::from(2);
                }
            }
        }
        Ok(Where::Offline(space)) => {
            let pb = progress_bar(!json);
            if let Some(pb) = &pb {
                pb.set_message("verifying chunks");
            }
            let r = check(&space, &mut |done, total| {
                if let Some(pb) = &pb {
                    pb.set_length(total);
                    pb.set_position(done);
                }
            });
            if let Some(pb) = pb {
                pb.finish_and_clear();
            }
            match r {
                Ok(r) => check_json(&r, None),
                Err(e) => {
                    let damaged = matches!(e, EngineError::Corrupt(_) | EngineError::Meta(_));
                    return open_failed(path, &e.to_string(), damaged);
                }
            }
        }
        Err((msg, damaged)) => return open_failed(path, &msg, damaged),
    };
    if json {
        println!("{v}");
    } else {
        print_human(&v);
    }
    match whole(&v) {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(1),
    }
}

/// A report with nothing to do: clean, and full redundancy (a report without the field,
/// from a daemon of an older build, is judged by `clean` alone).
fn whole(v: &Value) -> bool {
    v["clean"].as_bool() == Some(true) && v["redundancy_full"].as_bool() != Some(false)
}

/// `check` of an unmounted multi-slot space: every slot that was ever claimed and no live
/// mount holds. Exit 1 if any slot is damaged, else 2 if any could not be checked.
fn run_slots(dir: &Path, json: bool) -> ExitCode {
    let slots = match crate::slots::for_each_offline_slot(dir, "check", |space| {
        Ok(check(&space, &mut |_, _| {})
            .map(|r| check_json(&r, None))
            .map_err(|e| e.to_string())?)
    }) {
        Ok(s) => s,
        Err(e) => return open_failed(dir, &e.to_string(), false),
    };
    let clean = slots.iter().all(|(_, r)| r.as_ref().is_ok_and(whole));
    let data_clean = slots
        .iter()
        .all(|(_, r)| r.as_ref().is_ok_and(|v| v["clean"].as_bool() == Some(true)));
    let damaged = slots
        .iter()
        .any(|(_, r)| r.as_ref().is_ok_and(|v| !whole(v)));
    if json {
        let v = json!({
            "clean": data_clean,
            "redundancy_full": slots.iter().all(|(_, r)| {
                r.as_ref().is_ok_and(|v| v["redundancy_full"].as_bool() != Some(false))
            }),
            "slots": slots.iter().map(|(s, r)| match r {
                Ok(v) => json!({"slot": s, "report": v}),
                Err(e) => json!({"slot": s, "error": e}),
            }).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        for (s, r) in &slots {
            match r {
                Ok(v) => {
                    println!("slot {s}:");
                    print_human(v);
                }
                Err(e) => println!("slot {s}: {e}"),
            }
        }
        if slots.is_empty() {
            println!(
                "no slot of {} was ever claimed: nothing to check",
                dir.display()
            );
        }
    }
    match (clean, damaged) {
        (true, _) => ExitCode::SUCCESS,
        (false, true) => ExitCode::from(1),
        (false, false) => ExitCode::from(2),
    }
}

fn open_failed(path: &Path, msg: &str, damaged: bool) -> ExitCode {
    if damaged {
        eprintln!(
            "ckptfs: check {}: DAMAGED: the space cannot be opened: {msg}",
            path.display()
        );
        ExitCode::from(1)
    } else {
        eprintln!("ckptfs: check {}: {msg}", path.display());
        ExitCode::from(2)
    }
}
