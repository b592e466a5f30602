//! `ckptfs slots DIR`: who holds each slot of a multi-slot space. Reads the slot headers
//! only (never a slot's table), so it is safe and cheap from any node at any time.

use crate::error::CliError;
use ckptfs_engine::format::{SlotHeader, SlotState};
use ckptfs_engine::layout::Mode;
use ckptfs_engine::slots::{is_live, now_unix_ns};
use ckptfs_engine::space::{read_backing_dir, slot_table};
use std::path::Path;

/// What `ckptfs slots` says of one slot: the header, plus whether its lease runs now.
fn state_word(h: &SlotHeader, now: u64) -> &'static str {
    match h.state {
        SlotState::Free => "free",
        SlotState::Released => "released",
        SlotState::Held if is_live(h, now) => "held",
        SlotState::Held => "expired",
    }
}

/// Whether the backing directory `dir` holds a multi-slot space.
pub fn is_multi_slot(dir: &Path) -> bool {
    read_backing_dir(dir, false).is_ok_and(|sb| sb.slots > 1)
}

/// Per-slot lines and the whole space's totals, as `ckptfs stats` adds them for a
/// multi-slot space (from the slot headers only).
pub fn summary(dir: &Path) -> Result<serde_json::Value, CliError> {
    let (_, rows) = rows(dir)?;
    let sum = |k: &str| rows.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
    let held = rows.iter().filter(|r| r["state"] == "held").count();
    Ok(serde_json::json!({
        "slots": rows,
        "space": {
            "slots": rows.len(),
            "held": held,
            "reserved_bytes": sum("reserved_bytes"),
            "used_bytes": sum("used_bytes"),
        }
    }))
}

/// Prints `summary`'s lines.
pub fn print_summary(v: &serde_json::Value) {
    let s = &v["space"];
    println!(
        "whole space        {} slots ({} held), {} used of {}",
        s["slots"],
        s["held"],
        crate::human(s["used_bytes"].as_u64().unwrap_or(0)),
        crate::human(s["reserved_bytes"].as_u64().unwrap_or(0))
    );
    for r in v["slots"].as_array().into_iter().flatten() {
        if r["state"] == "free" {
            continue;
        }
        println!(
            "  slot {:>5}        {:<8} {:>10} used  {} {}",
            r["slot"],
            r["state"].as_str().unwrap_or(""),
            crate::human(r["used_bytes"].as_u64().unwrap_or(0)),
            r["host"].as_str().unwrap_or(""),
            r["mountpoint"].as_str().unwrap_or("")
        );
    }
}

fn rows(dir: &Path) -> Result<(Vec<SlotHeader>, Vec<serde_json::Value>), CliError> {
    let sb = read_backing_dir(dir, false).map_err(CliError::from)?;
    if sb.slots == 1 {
        return Err(format!(
            "{} has a single slot (one mount at a time; format with --slots N for several \
             nodes)",
            dir.display()
        )
        .into());
    }
    let (table, _) = slot_table(dir, &sb, false).map_err(CliError::from)?;
    let each = table.each().map_err(CliError::from)?;
    let now = now_unix_ns();
    let seg = sb.segment_bytes as u64;
    let mut all = Vec::with_capacity(each.len());
    let rows: Vec<serde_json::Value> = each
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            let h = match h {
                Ok(h) => h,
                // Damaged (both copies fail their checksums): listed as such, and left out
                // of what the commands that go slot by slot visit.
                Err(e) => {
                    let r = sb.slot_segments(ckptfs_engine::format::SlotId(i as u32));
                    return serde_json::json!({
                        "slot": i,
                        "state": "damaged",
                        "damage": e.to_string(),
                        "reserved_bytes": (r.end - r.start) * seg,
                    });
                }
            };
            all.push(h.clone());
            let h = &h;
            let r = sb.slot_segments(h.slot);
            serde_json::json!({
                "slot": h.slot,
                "state": state_word(h, now),
                "epoch": h.epoch,
                "host": h.host,
                "pid": h.pid,
                "mountpoint": h.mountpoint,
                "lease_ms": h.lease_ms,
                "lease_age_ms": match h.state {
                    SlotState::Free => None,
                    _ => Some(now.saturating_sub(h.renewed_unix_ns) / 1_000_000),
                },
                "used_bytes": h.used_bytes,
                "reserved_bytes": (r.end - r.start) * seg,
            })
        })
        .collect();
    Ok((all, rows))
}

pub fn run(dir: &Path, json: bool) -> Result<(), CliError> {
    let sb = read_backing_dir(dir, false).map_err(CliError::from)?;
    let (all, rows) = rows(dir)?;
    if json {
        let v = serde_json::json!({ "slots": rows });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(());
    }
    let held = rows.iter().filter(|r| r["state"] == "held").count();
    println!(
        "{}: {} slots, {held} held, {} each",
        dir.display(),
        sb.slots,
        crate::human(
            rows.first()
                .map_or(0, |r| r["reserved_bytes"].as_u64().unwrap_or(0))
        )
    );
    println!(
        "{:>5}  {:<8} {:>5}  {:<20} {:>8}  {:>10}  {:>10}  mountpoint",
        "slot", "state", "epoch", "host", "pid", "lease age", "used"
    );
    for r in &rows {
        if r["state"] == "free" {
            continue;
        }
        if r["state"] == "damaged" {
            println!(
                "{:>5}  {:<8} {}",
                r["slot"],
                "damaged",
                r["damage"].as_str().unwrap_or("")
            );
            continue;
        }
        println!(
            "{:>5}  {:<8} {:>5}  {:<20} {:>8}  {:>10}  {:>10}  {}",
            r["slot"],
            r["state"].as_str().unwrap_or(""),
            r["epoch"],
            r["host"].as_str().unwrap_or(""),
            r["pid"],
            format!(
                "{:.1} s",
                r["lease_age_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
            ),
            crate::human(r["used_bytes"].as_u64().unwrap_or(0)),
            r["mountpoint"].as_str().unwrap_or("")
        );
    }
    let free = all.iter().filter(|h| h.state == SlotState::Free).count();
    if free > 0 {
        println!("({free} slots never claimed)");
    }
    Ok(())
}

/// A slot an offline command took (its report) or had to leave (why).
pub type SlotOutcome = (u32, Result<serde_json::Value, String>);

/// What an offline command does with each slot of a multi-slot backing directory: slots
/// never claimed are skipped; a slot a live mount holds is left to that mount (its table is
/// that node's); every other slot is claimed (as a mount would, then released) and given to
/// `each`. Returns (slot, Ok(value) | Err(why not)) per slot it did not skip.
pub fn for_each_offline_slot(
    dir: &Path,
    what: &str,
    mut each: impl FnMut(ckptfs_engine::Space) -> Result<serde_json::Value, CliError>,
) -> Result<Vec<SlotOutcome>, CliError> {
    use ckptfs_engine::format::SlotId;
    use ckptfs_engine::slots::{describe_holder, SlotRequest};
    let (all, rows) = rows(dir)?;
    let now = now_unix_ns();
    let mut out = Vec::new();
    // A damaged slot is said, not skipped: its table cannot be claimed to be looked at.
    for r in rows.iter().filter(|r| r["state"] == "damaged") {
        out.push((
            r["slot"].as_u64().unwrap_or(0) as u32,
            Err(format!(
                "not looked at: its header is damaged ({})",
                r["damage"].as_str().unwrap_or("")
            )),
        ));
    }
    for h in all {
        if h.state == SlotState::Free {
            continue;
        }
        let h = if is_live(&h, now) && left_here(dir, &h) {
            wait_for_exit(dir, h)?
        } else {
            h
        };
        let now = now_unix_ns();
        if is_live(&h, now) {
            // A holder killed on this machine has no mount to go through: say what brings
            // the slot back instead.
            let how = if ckptfs_engine::slots::holder_gone_here(&h) {
                format!(
                    "its daemon no longer runs (killed?): mount the space again at {} on this \
                     host, which takes the slot back at once, and run `ckptfs {what}` through \
                     that mount, or run it here once the lease has run out",
                    h.mountpoint
                )
            } else {
                format!("run `ckptfs {what}` through that mount")
            };
            out.push((
                h.slot.0,
                Err(format!(
                    "not checked here: {}; {how}",
                    describe_holder(&h, now)
                )),
            ));
            continue;
        }
        let req = SlotRequest {
            slot: Some(SlotId(h.slot.0)),
            lease: std::time::Duration::from_secs(10),
            mountpoint: format!("(ckptfs {what})"),
            take_over: false,
        };
        let r = ckptfs_engine::Space::open_as(dir, &Mode::Mount(req))
            .map_err(CliError::from)
            .and_then(&mut each);
        out.push((h.slot.0, r.map_err(|e| e.to_string())));
    }
    Ok(out)
}

/// Whether slot header `h` names a mount of this host that is gone (`fusermount3 -u`
/// returns before the daemon has committed, released its slot and exited). The offline
/// command waits for its daemon (`wait_for_exit`) while that is a ckptfs process here, as a
/// mount waits for an exiting daemon of a single-slot space, instead of sending the user
/// "through" a mountpoint that no longer mounts the space; and a moment more once it has
/// exited, for its release to be seen (`RELEASE_VISIBLE_WAIT`).
fn left_here(dir: &Path, h: &SlotHeader) -> bool {
    h.host == ckptfs_engine::slots::host_name()
        && !crate::mounts_space(Path::new(&h.mountpoint), dir)
}

/// How long a slot header may still read as held by a daemon of this host that has exited
/// and released it. Its release is written and synced through its own client of a shared
/// filesystem; read through another client (GlusterFS mounted twice) the header still read
/// "held" after the daemon was gone in 12 of 80 `check`s run right after unmounting both
/// nodes, and "released" a moment later. Also the most a holder of this host's name whose
/// pid is not a ckptfs process here (another pid namespace) costs a command.
const RELEASE_VISIBLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether process `pid` exists here and is a ckptfs process (its name starts with
/// `ckptfs`). A live pid alone is not enough: a holder's pid from another pid namespace
/// with the same host name (two containers sharing the backing directory) may name an
/// unrelated process here, for which a command would wait its whole bound for nothing.
fn is_ckptfs_process(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.starts_with("ckptfs"))
}

/// Waits (up to `EXITING_HOLDER_WAIT`, saying so after `EXITING_HOLDER_NOTICE`) until the
/// exiting daemon in `h` has let go of its slot; returns the slot's header then, or the last
/// one read when it did not (the caller reports that holder as live).
fn wait_for_exit(dir: &Path, mut h: SlotHeader) -> Result<SlotHeader, CliError> {
    let started = std::time::Instant::now();
    let mut said = false;
    // Since when no ckptfs process of the holder's pid runs here.
    let mut gone: Option<std::time::Instant> = None;
    while is_live(&h, now_unix_ns()) && left_here(dir, &h) {
        if is_ckptfs_process(h.pid) {
            gone = None;
        } else if gone.get_or_insert_with(std::time::Instant::now).elapsed() >= RELEASE_VISIBLE_WAIT
        {
            break;
        }
        if started.elapsed() >= crate::EXITING_HOLDER_WAIT {
            break;
        }
        if !said && started.elapsed() >= crate::EXITING_HOLDER_NOTICE {
            eprintln!(
                "ckptfs: waiting for the daemon that held slot {} of {} to exit (pid {}, \
                 unmounted from {})",
                h.slot.0,
                dir.display(),
                h.pid,
                h.mountpoint
            );
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (all, _) = rows(dir)?;
        match all.into_iter().find(|x| x.slot == h.slot) {
            Some(x) => h = x,
            None => break,
        }
    }
    Ok(h)
}

/// Before a read-write mount of the multi-slot space in `dir` at `mnt`: waits for this
/// host's daemon that was unmounted from `mnt` and is still exiting to release its slot.
/// Without the wait the new mount took another slot (the old one was still held), leaving
/// this node's data in two shares and taking a slot another node may be about to claim.
pub fn wait_for_own_exiting_daemon(dir: &Path, mnt: &Path) -> Result<(), CliError> {
    let mnt = mnt.to_string_lossy();
    // A holder certainly gone (its process no longer runs on this machine) is not waited
    // for: the claim takes its slot over at once (`slots::holder_gone_here`).
    wait_for_exiting(dir, |h| {
        h.mountpoint == mnt && !ckptfs_engine::slots::holder_gone_here(h)
    })
}

/// Before `stats` of the multi-slot space in `dir`: waits for every daemon of this host
/// that is still exiting to release its slot, so the figures include its last commits and
/// its slot does not show as held by a mount that is gone (as `check` and `gc` wait).
pub fn wait_for_exiting_daemons(dir: &Path) -> Result<(), CliError> {
    wait_for_exiting(dir, |_| true)
}

/// Waits for each slot whose holder `which` names and is an exiting daemon of this host.
fn wait_for_exiting(dir: &Path, which: impl Fn(&SlotHeader) -> bool) -> Result<(), CliError> {
    let (all, _) = rows(dir)?;
    let now = now_unix_ns();
    for h in all {
        if is_live(&h, now) && which(&h) && left_here(dir, &h) {
            wait_for_exit(dir, h)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot holder named by host and pid is an exiting daemon only if that pid is a
    /// ckptfs process: a live process of another kind (a pid reused, or one from another
    /// pid namespace under the same host name) is not waited for.
    #[test]
    fn only_a_ckptfs_process_is_taken_for_an_exiting_daemon() {
        let dir = std::env::temp_dir().join(format!("ckptfs-exiting-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut h = SlotHeader::free(ckptfs_engine::format::SlotId(1));
        h.state = SlotState::Held;
        h.host = ckptfs_engine::slots::host_name();
        h.mountpoint = dir.join("gone").display().to_string();
        h.pid = other.id();
        let sleeping = left_here(&dir, &h) && is_ckptfs_process(h.pid);
        other.kill().unwrap();
        other.wait().unwrap();
        // This test's own process is named after its test binary, `ckptfs-...`.
        h.pid = std::process::id();
        let ours = left_here(&dir, &h) && is_ckptfs_process(h.pid);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            !sleeping,
            "a live `sleep` was taken for an exiting ckptfs daemon"
        );
        assert!(
            ours,
            "a live ckptfs process whose mount is gone is an exiting daemon"
        );
    }
}
