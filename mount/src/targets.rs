//! `ckptfs targets PATH`: the storage targets of a space over several (`format --target`):
//! per target its state, failure domain, errors, shards and free shard slots, bytes moved
//! and write bandwidth; and what redundancy the data has right now.

use crate::error::CliError;
use crate::{open_or_through, Opened};
use ckptfs_engine::layout::Mode;
use ckptfs_engine::space::{RevisionRedundancy, Space};
use ckptfs_engine::targets::TargetsReport;
use std::path::Path;

/// The report of the space at `path` (a mountpoint, or a backing directory: read-only,
/// or through its mount when it is mounted). None for a space with one target.
pub fn report(path: &Path) -> Result<Option<TargetsReport>, CliError> {
    let path = crate::absolute(path);
    if path.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return match open_or_through(&path, true, || Space::open_as(&path, &Mode::ReadOnly))? {
            Opened::Here(space) => Ok(space.report().targets_report()),
            Opened::Through(mnt) => from_mount(&mnt),
        };
    }
    from_mount(&path)
}

/// What redundancy each listed revision has now (None for a space with one target). One
/// pass over the extent table, offline or in the daemon.
pub fn redundancy(path: &Path) -> Result<Option<RevisionRedundancy>, CliError> {
    let path = crate::absolute(path);
    let from_mount = |mnt: &Path| -> Result<Option<RevisionRedundancy>, CliError> {
        match crate::control::send(mnt, &crate::control::Request::Redundancy)? {
            serde_json::Value::Null => Ok(None),
            v => serde_json::from_value(v)
                .map(Some)
                .map_err(|e| format!("malformed redundancy report from the daemon: {e}").into()),
        }
    };
    if path.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return match open_or_through(&path, true, || Space::open_as(&path, &Mode::ReadOnly))? {
            Opened::Here(space) => space.report().revision_redundancy().map_err(CliError::from),
            Opened::Through(mnt) => from_mount(&mnt),
        };
    }
    from_mount(&path)
}

/// One line for `targets` and `stats`: listed revisions by how many more targets they can
/// lose.
pub fn redundancy_line(r: &RevisionRedundancy) -> String {
    let parts: Vec<String> = r
        .listed
        .iter()
        .map(|&(tol, n)| match tol {
            t if t < 0 => format!("{n} LOST"),
            t if t == r.full_tolerance => format!("{n} can lose {t} more target(s) (full)"),
            t => format!("{n} can lose {t} more"),
        })
        .collect();
    match parts.is_empty() {
        true => "revisions: none listed yet".to_string(),
        false => format!("revisions: {}", parts.join(", ")),
    }
}

fn from_mount(mnt: &Path) -> Result<Option<TargetsReport>, CliError> {
    let v = crate::control::send(mnt, &crate::control::Request::Targets)?;
    match v {
        serde_json::Value::Null => Ok(None),
        v => Ok(serde_json::from_value(v)
            .map(Some)
            .map_err(|e| format!("malformed targets report from the daemon: {e}"))?),
    }
}

/// One line for `ckptfs stats`.
pub fn summary_line(r: &TargetsReport) -> String {
    let (failed, degraded) = r.failed_and_degraded();
    let short = r.segments_degraded.iter().map(|(_, n)| n).sum::<u64>();
    let state = match (r.degraded(), r.segments_lost) {
        (false, _) => "full redundancy".to_string(),
        (true, 0) => format!(
            "DEGRADED: {failed} target(s) failed, {degraded} with shards found unreadable or \
             damaged, {short} segment(s) short of readable shards"
        ),
        (true, lost) => format!(
            "LOST: {lost} segment(s) hold data that fewer than M shards give back ({} read(s) \
             of a chunk no M shards gave back verified since the mount; `ckptfs check` lists \
             the files); {failed} target(s) failed, {degraded} with shards found unreadable or \
             damaged, {short} segment(s) short of readable shards",
            r.chunks_lost_reads
        ),
    };
    let (rd, vf): (u64, u64) = r
        .targets
        .iter()
        .fold((0, 0), |(a, b), t| (a + t.read_errors, b + t.verify_errors));
    format!(
        "{} targets, redundancy {}: {state}; since mount: {rd} failed shard reads, {vf} \
         times a shard held damaged bytes, reads rebuilt {}, repaired {}",
        r.targets.len(),
        r.redundancy,
        r.reconstructed_reads,
        r.repaired_reads
    )
}

/// The metadata mirrors K+1 targets should hold (None: a space of slots, which keeps none).
pub fn mirrors_wanted(r: &TargetsReport) -> Option<usize> {
    if r.slot.is_some() {
        return None;
    }
    // K+1 holders let the backing directory and any K targets die together.
    r.redundancy
        .split_once('+')
        .and_then(|(_, k)| k.trim().parse::<usize>().ok())
        .map(|k| k + 1)
}

/// What `targets` and `stats` say when fewer than K+1 targets hold a current metadata mirror.
pub fn mirror_warning(r: &TargetsReport) -> Option<String> {
    let want = mirrors_wanted(r)?;
    let have = r.targets.iter().filter(|t| t.metadata_mirror).count();
    (have < want).then(|| {
        format!(
            "FEWER THAN K+1 = {want} metadata mirrors ({have}): a holder failed or its copy was \
             removed or replaced while mounted (the log says which), or too few targets are \
             healthy; the next mount copies the metadata to healthy targets again"
        )
    })
}

pub fn run(path: &Path, json: bool) -> Result<(), CliError> {
    let Some(r) = report(path)? else {
        if json {
            println!("null");
        } else {
            println!(
                "{} keeps its data in one file (no --target at format): nothing to show",
                path.display()
            );
        }
        return Ok(());
    };
    let red = redundancy(path)?;
    if json {
        let mut v = serde_json::to_value(&r).map_err(|e| format!("serialize: {e}"))?;
        v["revisions"] = serde_json::to_value(&red).map_err(|e| format!("serialize: {e}"))?;
        println!("{v}");
        return Ok(());
    }
    println!("{}", summary_line(&r));
    let mirrors: Vec<String> = r
        .targets
        .iter()
        .filter(|t| t.metadata_mirror)
        .map(|t| t.index.to_string())
        .collect();
    match r.slot {
        Some(slot) => println!(
            "metadata: each slot's table in the backing directory (slots/), not mirrored on \
             the targets; the segment counts are slot {slot}'s (each node reports its own)"
        ),
        None => {
            println!(
                "metadata: in the backing directory, mirrored on target(s) {} (`ckptfs \
                 recover` rebuilds a lost backing directory from them)",
                match mirrors.is_empty() {
                    true => "none".to_string(),
                    false => mirrors.join(", "),
                }
            );
            if let Some(w) = mirror_warning(&r) {
                println!("  {w}");
            }
        }
    }
    if let Some(red) = &red {
        println!("{}", redundancy_line(red));
        // The worst few by name: /.ckptfs/histories/<history>/<revision> in the mount.
        for s in red.short.iter().take(10) {
            println!(
                "  revision {} (.ckptfs/histories/{}/{}) {}",
                s.revision,
                s.history,
                s.revision,
                match s.can_lose {
                    t if t < 0 => "LOST: fewer than M shards of some chunk".to_string(),
                    t => format!("can lose {t} more"),
                }
            );
        }
        if red.short_total > 10 {
            println!(
                "  ... {} more short of full redundancy (--json lists up to {})",
                red.short_total - 10,
                RevisionRedundancy::LISTED_MAX
            );
        }
    }
    let m: usize = r
        .redundancy
        .split('+')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let k: usize = r
        .redundancy
        .split('+')
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    println!(
        "segments: {} with all {} shards on healthy targets{}{}",
        r.segments_full,
        m + k,
        r.segments_degraded
            .iter()
            .map(|(tol, n)| format!(", {n} that can lose {tol} more"))
            .collect::<String>(),
        match r.segments_lost {
            0 => String::new(),
            n => format!(", {n} LOST (fewer than {m} shards left)"),
        }
    );
    // Errors are since the mount: failed reads of its shards, damaged shards found, and
    // 4 KiB blocks a repair rewrote.
    println!(
        "{:>3}  {:<8} {:<16} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>10} {:>9} {:>4}  path",
        "#",
        "state",
        "domain",
        "shards",
        "free",
        "rd-err",
        "damaged",
        "fixed",
        "written",
        "read",
        "MiB/s",
        "meta"
    );
    for t in &r.targets {
        let (state, why) = match t.state.split_once(": ") {
            Some((s, w)) => (s, Some(w)),
            None => (t.state.as_str(), None),
        };
        println!(
            "{:>3}  {:<8} {:<16} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>10} {:>9} {:>4}  {}",
            t.index,
            state,
            t.domain,
            t.shards,
            t.free_shards,
            t.read_errors,
            t.verify_errors,
            t.repaired_blocks,
            crate::human(t.bytes_written),
            crate::human(t.bytes_read),
            t.write_mib_s.map_or("-".into(), |b| format!("{b:.0}")),
            if t.metadata_mirror { "yes" } else { "-" },
            t.path
        );
        if let Some(w) = why {
            println!("       {w}");
        }
    }
    Ok(())
}

/// `ckptfs rebuild PATH [--replace OLD=NEW] [--throttle MIB_S] [--json]`.
pub fn rebuild(
    path: &Path,
    replace: Option<&str>,
    throttle_mib_s: Option<f64>,
    json: bool,
) -> Result<(), CliError> {
    let replace = match replace {
        Some(r) => {
            let (old, new) = r
                .split_once('=')
                .ok_or_else(|| format!("--replace {r:?} is not OLD=NEW"))?;
            let mut spec = ckptfs_engine::targets::TargetSpec::parse(new)?;
            spec.path = crate::absolute(&spec.path);
            // An OLD directory is matched as recorded (absolute); an index as given.
            let old = match old.parse::<u16>() {
                Ok(_) => old.to_string(),
                Err(_) => crate::absolute(Path::new(old)).display().to_string(),
            };
            Some((old, spec))
        }
        None => None,
    };
    let throttle = throttle_mib_s.map(|m| m * (1 << 20) as f64);
    let abs = crate::absolute(path);
    let mounted_at = match abs.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        false => Some(abs.clone()),
        true => None,
    };
    let offline = match &mounted_at {
        Some(_) => None,
        None => match open_or_through(&abs, false, || Space::open(&abs))? {
            Opened::Here(s) => Some(s),
            Opened::Through(mnt) => return rebuild_through(&mnt, &replace, throttle, json),
        },
    };
    let r = match (offline, mounted_at) {
        (Some(space), _) => {
            let pb = crate::progress_bar(!json);
            if let Some(pb) = &pb {
                pb.set_message("rebuilding segments");
            }
            let r = space
                .rebuild(
                    replace.as_ref().map(|(o, n)| (o.as_str(), n)),
                    throttle,
                    &mut |done, total| {
                        if let Some(pb) = &pb {
                            pb.set_length(total);
                            pb.set_position(done);
                        }
                    },
                )
                .map_err(CliError::from)?;
            if let Some(pb) = pb {
                pb.finish_and_clear();
            }
            serde_json::to_value(r).map_err(CliError::from)?
        }
        (None, Some(mnt)) => return rebuild_through(&mnt, &replace, throttle, json),
        (None, None) => unreachable!("one of the two is set"),
    };
    print_rebuild(&r, json)
}

fn rebuild_through(
    mnt: &Path,
    replace: &Option<(String, ckptfs_engine::targets::TargetSpec)>,
    throttle: Option<f64>,
    json: bool,
) -> Result<(), CliError> {
    let mut wire_replace = None;
    if let Some((old, new)) = replace {
        if crate::backing_of(mnt).is_some_and(|b| crate::slots::is_multi_slot(&b)) {
            return Err(CliError::from(
                ckptfs_engine::maintenance::scrub::replace_refused_on_shared(old, &new.path)
                    .to_string(),
            ));
        }
        let new = match new.domain.is_empty() {
            true => new.path.display().to_string(),
            false => format!("{}:domain={}", new.path.display(), new.domain),
        };
        wire_replace = Some((old.clone(), new));
    }
    let req = crate::control::Request::Rebuild {
        replace: wire_replace,
        throttle,
    };
    daemon_job(mnt, "rebuild", &req, json)
}

/// Runs job `what` (rebuild, scrub) in the daemon of mount `mnt` with request `req`, under a
/// spinner on a terminal, and prints its report.
fn daemon_job(
    mnt: &Path,
    what: &str,
    req: &crate::control::Request,
    json: bool,
) -> Result<(), CliError> {
    let pb = crate::progress_bar(!json);
    if let Some(pb) = &pb {
        pb.set_message(format!("{what} in the daemon"));
    }
    let v = crate::control::send(mnt, req)?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    print_rebuild(&v, json)
}

fn print_rebuild(v: &serde_json::Value, json: bool) -> Result<(), CliError> {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    if json {
        println!("{v}");
    } else {
        println!(
            "rebuilt {} shards in {} segments ({}) in {:.1} s; {} segments still short of \
             shards",
            n("shards_written"),
            n("segments_rebuilt"),
            crate::human(n("bytes_written")),
            v["seconds"].as_f64().unwrap_or(0.0),
            n("segments_short"),
        );
        println!(
            "verified {} chunks by blake3 ({} rebuilt from the other shards because their \
             stored bytes were damaged), rewrote {} damaged, stale or unreadable shard blocks \
             in place; {} failed shard reads{}",
            n("chunks_verified"),
            n("chunks_repaired"),
            n("blocks_rewritten"),
            n("read_errors"),
            match n("segments_busy") {
                0 => String::new(),
                b => format!(
                    "; {b} segment(s) were being written and were copied, not repaired in \
                     place (run `ckptfs scrub` again later)"
                ),
            }
        );
        if n("mirror_copies_checked") > 0 {
            println!(
                "compared {} copies of the metadata on its mirror holders with the primary: \
                 {} damaged 4 KiB block(s) and {} outdated or damaged file(s) rewritten from it",
                n("mirror_copies_checked"),
                n("mirror_blocks_rewritten"),
                n("mirror_files_rewritten"),
            );
        }
        for f in v["mirror_failures"].as_array().into_iter().flatten() {
            println!("metadata mirror: {}", f.as_str().unwrap_or_default());
        }
        match (n("chunks_lost"), n("segments_lost")) {
            (0, 0) => println!("nothing lost"),
            (c, s) => println!(
                "LOST: {c} committed chunk(s) that no combination of readable shards verifies \
                 ({s} segment(s) with fewer than M shards left); `ckptfs check` names the \
                 files and revisions"
            ),
        }
    }
    match (n("segments_short"), n("chunks_lost"), n("segments_lost")) {
        (0, 0, 0) => Ok(()),
        (s, c, l) => Err(format!(
            "{s} segment(s) could not get all their shards back, {c} chunk(s) and {l} \
             segment(s) are lost: see `ckptfs targets`, `ckptfs check` and the daemon log"
        )
        .into()),
    }
}

/// `ckptfs scrub PATH [--throttle MIB_S] [--json]`: reads every segment, verifies every
/// committed chunk and repairs what redundancy allows (engine/src/scrub.rs).
pub fn scrub(path: &Path, throttle_mib_s: Option<f64>, json: bool) -> Result<(), CliError> {
    let throttle = throttle_mib_s.map(|m| m * (1 << 20) as f64);
    let abs = crate::absolute(path);
    let through = |mnt: &Path| -> Result<(), CliError> {
        daemon_job(
            mnt,
            "scrub",
            &crate::control::Request::Scrub { throttle },
            json,
        )
    };
    if !abs.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return through(&abs);
    }
    let space = match open_or_through(&abs, false, || Space::open(&abs))? {
        Opened::Here(s) => s,
        Opened::Through(mnt) => return through(&mnt),
    };
    let pb = crate::progress_bar(!json);
    if let Some(pb) = &pb {
        pb.set_message("scrubbing segments");
    }
    let r = space
        .scrub(throttle, &mut |done, total| {
            if let Some(pb) = &pb {
                pb.set_length(total);
                pb.set_position(done);
            }
        })
        .map_err(CliError::from)?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    print_rebuild(&serde_json::to_value(r).map_err(CliError::from)?, json)
}
