//! `ckptfs targets PATH`: the storage targets of a space over several (`format --target`):
//! per target its state, failure domain, errors, shards and free shard slots, bytes moved
//! and write bandwidth; and what redundancy the data has right now.

use ckptfs_engine::space::Space;
use ckptfs_engine::targets::TargetsReport;
use std::path::Path;

/// The report of the space at `path` (a mountpoint, or a backing directory: read-only,
/// or through its mount when it is mounted). None for a space with one target.
pub fn report(path: &Path) -> Result<Option<TargetsReport>, String> {
    let path = crate::absolute(path);
    if path.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return match Space::open_read_only(&path) {
            Ok(space) => Ok(space.targets_report()),
            Err(ckptfs_engine::Error::Locked(m)) => {
                let holder = ckptfs_engine::space::lock_holder(&path).unwrap_or_default();
                match holder.split(" mounted at ").nth(1) {
                    Some(mnt) => from_mount(Path::new(mnt.trim())),
                    None => Err(m),
                }
            }
            Err(e) => Err(e.to_string()),
        };
    }
    from_mount(&path)
}

fn from_mount(mnt: &Path) -> Result<Option<TargetsReport>, String> {
    let v = crate::control_get(mnt, "targets", true)?;
    match v {
        serde_json::Value::Null => Ok(None),
        v => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| format!("malformed targets report from the daemon: {e}")),
    }
}

/// One line for `ckptfs stats`.
pub fn summary_line(r: &TargetsReport) -> String {
    let failed = r.targets.iter().filter(|t| t.state != "ok").count();
    let state = match (r.degraded(), r.segments_lost) {
        (false, _) => "full redundancy".to_string(),
        (true, 0) => format!(
            "DEGRADED: {failed} target(s) failed, {} segment(s) short of shards",
            r.segments_degraded.iter().map(|(_, n)| n).sum::<u64>()
        ),
        (true, lost) => format!(
            "DEGRADED: {failed} target(s) failed, {lost} segment(s) LOST (fewer than M shards)"
        ),
    };
    format!(
        "{} targets, redundancy {}: {state}; reads rebuilt {}, repaired {}",
        r.targets.len(),
        r.redundancy,
        r.reconstructed_reads,
        r.repaired_reads
    )
}

pub fn run(path: &Path, json: bool) -> Result<(), String> {
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
    if json {
        println!(
            "{}",
            serde_json::to_string(&r).map_err(|e| format!("serialize: {e}"))?
        );
        return Ok(());
    }
    println!("{}", summary_line(&r));
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
    println!(
        "{:>3}  {:<8} {:<16} {:>7} {:>7} {:>6} {:>10} {:>10} {:>9}  path",
        "#", "state", "domain", "shards", "free", "errors", "written", "read", "MiB/s"
    );
    for t in &r.targets {
        let (state, why) = match t.state.split_once(": ") {
            Some((s, w)) => (s, Some(w)),
            None => (t.state.as_str(), None),
        };
        println!(
            "{:>3}  {:<8} {:<16} {:>7} {:>7} {:>6} {:>10} {:>10} {:>9}  {}",
            t.index,
            state,
            t.domain,
            t.shards,
            t.free_shards,
            t.errors,
            crate::human(t.bytes_written),
            crate::human(t.bytes_read),
            t.write_mib_s.map_or("-".into(), |b| format!("{b:.0}")),
            t.path
        );
        if let Some(w) = why {
            println!("       {w}");
        }
    }
    Ok(())
}
