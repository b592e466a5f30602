//! `ckptfs gc`: runs (or plans, `--dry-run`) gc through the daemon, offline, or on every
//! slot of a multi-slot space.

use super::*;

pub(crate) fn gc_json(r: &GcReport) -> serde_json::Value {
    serde_json::to_value(r).expect("gc report serializes")
}

pub(crate) fn cmd_gc(
    path: &Path,
    dry_run: bool,
    empty_trash: bool,
    json: bool,
) -> Result<(), CliError> {
    let opts = GcOptions {
        dry_run,
        empty_trash,
        ..GcOptions::default()
    };
    let abs = absolute(path);
    if abs.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() && slots::is_multi_slot(&abs) {
        // Every slot ever claimed that no live mount holds, one after the other.
        let done = slots::for_each_offline_slot(&abs, "gc", |space| {
            Fs::new(space)
                .gc_with(opts.clone(), &mut |_| {})
                .map(|r| serde_json::to_value(&r).expect("gc report serializes"))
                .map_err(CliError::from)
        })?;
        let failed = done.iter().filter(|(_, r)| r.is_err()).count();
        if json {
            let v: Vec<serde_json::Value> = done
                .iter()
                .map(|(s, r)| match r {
                    Ok(v) => serde_json::json!({"slot": s, "report": v}),
                    Err(e) => serde_json::json!({"slot": s, "error": e}),
                })
                .collect();
            println!("{}", serde_json::json!({ "slots": v }));
        } else {
            for (s, r) in &done {
                match r {
                    Ok(v) => println!(
                        "slot {s}: {} revisions dropped, {} freed, {} copied",
                        v["revisions_dropped"],
                        human(v["bytes_freed"].as_u64().unwrap_or(0)),
                        human(v["bytes_copied"].as_u64().unwrap_or(0))
                    ),
                    Err(e) => println!("slot {s}: {e}"),
                }
            }
        }
        return match failed {
            0 => Ok(()),
            n => Err(format!("{n} slot(s) were not collected (see above)").into()),
        };
    }
    let pb = progress_bar(!json);
    let target = match target_of(path)? {
        // The kernel refuses setxattr (the control channel) on a read-only mount. A dry run
        // writes nothing: plan it on the space directly (read-only opens share its lock).
        Target::Mounted { mnt } if is_read_only_mount(&mnt) => {
            if !dry_run {
                return Err(format!(
                    "{} is mounted read-only; gc changes the space (remount it read-write), \
                     `--dry-run` shows what it would do",
                    mnt.display()
                )
                .into());
            }
            let backing = backing_of(&mnt).ok_or("cannot find the mount's backing space")?;
            Target::Offline {
                fs: Box::new(Fs::new(
                    Space::open_as(&backing, &Mode::ReadOnly).map_err(CliError::from)?,
                )),
            }
        }
        t => t,
    };
    let mut bucket = None;
    let r = match target {
        Target::Mounted { mnt } => {
            // The daemon runs gc inside the setxattr; the bar only shows that it is working.
            if let Some(pb) = &pb {
                pb.set_message("gc in the daemon");
            }
            let v = control::send(
                &mnt,
                &control::Request::Gc {
                    dry_run,
                    empty_trash,
                },
            )?;
            let r = gc_from_json(&v).ok_or("malformed gc answer")?;
            // The object-store tier's bucket, after the space (what the space dropped may
            // make packs unnamed once the next manifests stop naming them).
            bucket = control::send(&mnt, &control::Request::RemoteGc { dry_run })
                .ok()
                .filter(|v| v["tier"] != false);
            r
        }
        Target::Offline { fs } => fs
            .gc_with(opts, &mut |p| {
                if let Some(pb) = &pb {
                    let (msg, done, total) = match p {
                        GcProgress::Revisions {
                            histories_done,
                            histories,
                        } => ("retention", histories_done, histories),
                        GcProgress::Chunks { done, total } => ("unreferenced chunks", done, total),
                        GcProgress::Compact {
                            segments_done,
                            segments,
                        } => ("compacting", segments_done, segments),
                    };
                    pb.set_message(msg);
                    pb.set_length(total);
                    pb.set_position(done);
                }
            })
            .map_err(CliError::from)?,
    };
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if json {
        let mut v = gc_json(&r);
        if let Some(b) = &bucket {
            v["bucket"] = b.clone();
        }
        println!("{v}");
    } else {
        println!(
            "{}dropped {} revisions{}, freed {} chunks ({}), copied {}, freed {} segments",
            if r.dry_run { "would have " } else { "" },
            r.revisions_dropped,
            match r.trash_revisions_dropped {
                0 => String::new(),
                n => format!(" ({n} of removed files, from the trash)"),
            },
            r.chunks_freed,
            human(r.bytes_freed),
            human(r.bytes_copied),
            r.segments_freed
        );
        if r.planned_kept > 0 {
            println!(
                "kept {} planned revisions that were opened or restored while gc ran",
                r.planned_kept
            );
        }
        println!(
            "free space {} -> {} in {:.2}s",
            human(r.free_bytes_before),
            human(r.free_bytes_after),
            r.seconds
        );
        if let Some(b) = &bucket {
            if let Some(e) = b["error"].as_str() {
                println!("bucket: gc failed: {e}");
            } else {
                let list = |k: &str| {
                    b[k].as_array()
                        .map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>())
                        .unwrap_or_default()
                };
                let (m, p) = (list("manifests_deleted"), list("packs_deleted"));
                println!(
                    "bucket: {} {} manifests and {} packs ({}); kept {} manifests, {} packs ({}), \
                     {} younger than the grace period",
                    if r.dry_run { "would delete" } else { "deleted" },
                    m.len(),
                    p.len(),
                    human(b["bytes_deleted"].as_u64().unwrap_or(0)),
                    b["manifests_kept"],
                    b["packs_kept"],
                    human(b["bytes_kept"].as_u64().unwrap_or(0)),
                    b["young_kept"]
                );
                if r.dry_run {
                    for k in m.iter().chain(&p) {
                        println!("  {k}");
                    }
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn gc_from_json(v: &serde_json::Value) -> Option<GcReport> {
    serde_json::from_value(v.clone()).ok()
}
