//! `ckptfs stats`: a space's figures, from its daemon or offline, as text, JSON or
//! Prometheus text.

use super::*;

pub(crate) fn stats_json(s: &Stats) -> serde_json::Value {
    serde_json::to_value(StatsReport::from(s.clone())).expect("stats serialize")
}

pub(crate) fn stats_from_json(v: &serde_json::Value) -> Option<Stats> {
    serde_json::from_value::<StatsReport>(v.clone())
        .ok()
        .map(|r| r.stats)
}

/// Stats from a mount (through an xattr the daemon answers) or a backing directory (read
/// directly when unmounted; through its mount when mounted).
pub(crate) fn read_stats(path: &Path) -> Result<Stats, CliError> {
    let path = absolute(path);
    let from_mount = |mnt: &Path| -> Result<Stats, CliError> {
        let c =
            std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).map_err(CliError::from)?;
        let name = c"user.ckptfs.stats";
        let mut buf = vec![0u8; 16384];
        // SAFETY: getxattr writes at most buf.len() bytes into buf.
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(format!(
                "{} is not a ckptfs mount: {}",
                mnt.display(),
                std::io::Error::last_os_error()
            )
            .into());
        }
        let v: serde_json::Value =
            serde_json::from_slice(&buf[..n as usize]).map_err(CliError::from)?;
        Ok(stats_from_json(&v).ok_or_else(|| "malformed stats from the daemon".to_string())?)
    };
    if path.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        // Read-only: stats of an unmounted (or read-only mounted) space change nothing.
        return match open_or_through(&path, true, || Space::open_as(&path, &Mode::ReadOnly))? {
            Opened::Here(space) => space.report().stats().map_err(CliError::from),
            Opened::Through(mnt) => from_mount(&mnt),
        };
    }
    if backing_of(&path).is_none() {
        return Err(not_a_space(&path));
    }
    from_mount(&path)
}

pub(crate) fn human(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// A ratio as `2.50x`, or `-` with why when there is nothing to compare.
pub(crate) fn ratio_text(r: Option<f64>, none: &str) -> String {
    match r {
        Some(r) => format!("{r:.2}x"),
        None => format!("- ({none})"),
    }
}

pub(crate) fn print_stats(s: &Stats) {
    println!("logical bytes      {}", human(s.logical_bytes));
    println!("stored bytes       {}", human(s.stored_bytes));
    println!(
        "dedup ratio        {}",
        ratio_text(s.dedup_ratio(), "no current file holds data")
    );
    println!(
        "compression ratio  {}",
        ratio_text(s.compression_ratio(), "nothing stored")
    );
    println!("chunks             {}", s.chunks);
    if s.remote_chunks > 0 {
        println!(
            "in the bucket only {} chunks, {} stored (fetched as they are read)",
            s.remote_chunks,
            human(s.remote_bytes)
        );
    }
    println!("files              {}", s.files);
    println!("directories        {}", s.dirs);
    println!("revisions          {}", s.revisions);
    println!("reserved space     {}", human(s.reserved_bytes));
    println!("free space         {}", human(s.free_bytes));
    // Where the used space is, by what would give it back (engine/src/usage.rs).
    let u = &s.split;
    println!("used space         {}, of it:", human(s.used_bytes));
    println!("  live             {} (current files)", human(u.live_bytes));
    println!(
        "  kept revisions   {} ({} older revisions of present files; retention keeps them)",
        human(u.kept_revision_bytes),
        u.kept_revisions
    );
    println!(
        "  removed files    {} ({} revisions of {} removed files, the trash; emptied oldest \
         first when writers need room, or by `ckptfs gc --empty-trash`)",
        human(u.trash_bytes),
        u.trash_revisions,
        u.trash_files
    );
    println!(
        "  reclaimable      {} (holding no referenced chunk; gc gives it back)",
        human(s.reclaimable_bytes() + u.unreferenced_bytes)
    );
    if !s.commits.durability.is_empty() {
        println!(
            "durability         {}{}",
            match s.commits.durability.as_str() {
                "fsync" =>
                    "at fsync and unmount (--durability fsync): a crash may lose \
                            closes after the last fsync",
                _ => "every close, when it returns",
            },
            match (s.commits.journal, s.commits.durability.as_str()) {
                (true, "fsync") => "; through the journal (one sync per fsync)",
                (true, _) => "; through the journal (one sync per close, shared)",
                (false, _) => "",
            }
        );
    }
    match s.commits.coherence.as_str() {
        "strict" => {
            println!("coherence          strict: every lookup and stat sees other nodes' changes")
        }
        "close-to-open" => println!(
            "coherence          close-to-open (--coherence): opens see other nodes' changes, \
             a stat may show them up to 1 s late"
        ),
        _ => {}
    }
    if s.gc.runs > 0 {
        println!(
            "gc since mount     {} runs, {} revisions dropped, {} freed, {} copied, {:.1}s",
            s.gc.runs,
            s.gc.revisions_dropped,
            human(s.gc.bytes_freed),
            human(s.gc.bytes_copied),
            s.gc.seconds
        );
    }
    // The data path's stages since the mount (`stages` in --json; README "stages"): what
    // the daemon's time went to, wall and estimated CPU, summed over threads.
    let busy: Vec<_> = s
        .stages
        .iter()
        .filter(|t| t.seconds >= 0.01 || t.cpu_seconds >= 0.01)
        .collect();
    if !busy.is_empty() {
        println!("data path since mount (wall / CPU seconds summed over threads, bytes):");
        for t in busy {
            println!(
                "  {:<14} {:>9.2} s {:>9.2} s  {}",
                t.name,
                t.seconds,
                t.cpu_seconds,
                human(t.bytes)
            );
        }
    }
    if s.carries.spills > 0 {
        println!(
            "carried chunks     {} in memory, {} spilled now; {} spills ({}) since mount",
            human(s.carries.resident_bytes),
            human(s.carries.spilled_now_bytes),
            s.carries.spills,
            human(s.carries.spilled_bytes)
        );
    }
    if s.failed {
        // A daemon of an older build gives no reason.
        let why = s
            .failure
            .as_deref()
            .unwrap_or("a backing write or sync failed");
        println!("STATE              FAILED (writes refused until remount): {why}");
    }
    if s.backing_full {
        println!(
            "STATE              BACKING FULL: the backing filesystem has no room for the \
             metadata table to grow; new data gets ENOSPC until room is freed there"
        );
    }
}

/// The targets' lines of `ckptfs stats` (a space over several targets): their state, a
/// missing-mirror warning, and the revisions' redundancy.
pub(crate) fn print_targets(
    t: Option<&ckptfs_engine::targets::TargetsReport>,
    red: Option<&ckptfs_engine::space::RevisionRedundancy>,
) {
    if let Some(t) = t {
        println!("{}", targets::summary_line(t));
        if let Some(w) = targets::mirror_warning(t) {
            println!("{w}");
        }
    }
    if let Some(r) = red {
        println!("{}", targets::redundancy_line(r));
    }
}

/// `ckptfs stats`: of a mount or a backing directory, as text, JSON or Prometheus.
pub(crate) fn cmd_stats(path: &Path, json: bool, prometheus: bool) -> Result<(), CliError> {
    // A space over several targets: whether its data has full redundancy now, and
    // each target's errors since the mount; and what redundancy each revision has
    // (a pass over the extent table). Of a multi-slot space's mount: that slot's.
    let targets_of = |path: &Path| {
        let t = targets::report(path).unwrap_or_else(|e| {
            eprintln!("ckptfs: the targets' state could not be read: {e}");
            None
        });
        let red = match t.is_some() && !prometheus {
            true => targets::redundancy(path).unwrap_or_else(|e| {
                eprintln!("ckptfs: the revisions' redundancy could not be read: {e}");
                None
            }),
            false => None,
        };
        (t, red)
    };
    // A multi-slot space: what the mount's own slot holds, then every slot's line
    // and the whole space's totals from the slot headers. Of its backing directory,
    // only the latter (each slot's table is its node's).
    let abs = absolute(path);
    let backing = match abs.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        true => Some(abs.clone()),
        false => backing_of(&abs),
    };
    let multi = backing
        .as_deref()
        .filter(|b| !prometheus && slots::is_multi_slot(b));
    if let Some(b) = multi {
        // Of the backing directory itself: no mount of its own to ask, and what this
        // host's exiting daemons commit last is in the figures once they let go.
        let offline = b == abs.as_path();
        if offline {
            slots::wait_for_exiting_daemons(b)?;
        }
        let summary = slots::summary(b)?;
        let own = match offline {
            true => None,
            false => Some(read_stats(path)?),
        };
        let (t, red) = match own.is_some() {
            true => targets_of(path),
            false => (None, None),
        };
        if json {
            let mut v = own.as_ref().map_or(serde_json::json!({}), stats_json);
            if let Some(t) = &t {
                v["targets"] = serde_json::to_value(t).unwrap_or_default();
            }
            if let Some(r) = &red {
                v["revision_redundancy"] = serde_json::to_value(r).unwrap_or_default();
            }
            v["slots"] = summary["slots"].clone();
            v["space"] = summary["space"].clone();
            println!("{v}");
        } else {
            if let Some(s) = &own {
                print_stats(s);
            }
            print_targets(t.as_ref(), red.as_ref());
            slots::print_summary(&summary);
        }
        return Ok(());
    }
    let s = read_stats(path)?;
    let (t, red) = targets_of(path);
    // The object-store tier of a mount that has one.
    let remote = match mounted_at(&abs) {
        true => control::send(&abs, &control::Request::Remote)
            .ok()
            .filter(|v| v["tier"] != false),
        false => None,
    };
    if json {
        let mut v = stats_json(&s);
        if let Some(r) = &remote {
            v["remote"] = r.clone();
        }
        if let Some(t) = &t {
            v["targets"] = serde_json::to_value(t).unwrap_or_default();
        }
        if let Some(r) = &red {
            v["revision_redundancy"] = serde_json::to_value(r).unwrap_or_default();
        }
        println!("{v}");
    } else if prometheus {
        print!(
            "{}",
            metrics::prometheus(
                &s,
                t.as_ref(),
                remote.as_ref(),
                &absolute(path).to_string_lossy()
            )
        );
    } else {
        print_stats(&s);
        print_targets(t.as_ref(), red.as_ref());
        if let Some(r) = &remote {
            let u = |k: &str| r[k].as_u64().unwrap_or(0);
            println!(
                "object-store tier  {} ({} durability): {}; bucket holds manifest {}; \
                 behind {} commits, {} changes, {:.1} s",
                r["url"].as_str().unwrap_or("?"),
                r["durability"].as_str().unwrap_or("?"),
                r["state"].as_str().unwrap_or("?"),
                u("head_seq"),
                u("behind_commits"),
                u("behind_changes"),
                r["behind_seconds"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}
