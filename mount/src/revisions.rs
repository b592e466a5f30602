//! `ckptfs revisions`, `report` and `restore`: a file's revisions, what each cost, and
//! bringing one back.

use super::*;

pub(crate) fn revisions_json(l: &[RevisionListing]) -> serde_json::Value {
    serde_json::Value::Array(
        l.iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id,
                    "committed_unix": r.committed_unix,
                    "size": r.size,
                    "new_bytes": r.new_bytes,
                    "current": r.current,
                })
            })
            .collect(),
    )
}

/// The mount (or offline space) and relative path a revisions/restore command names.
pub(crate) fn path_target(
    path: &Path,
    space: Option<&Path>,
) -> Result<(Target, Vec<u8>), CliError> {
    match space {
        Some(dir) => Ok((
            space_target(&absolute(dir))?,
            path.as_os_str().as_encoded_bytes().to_vec(),
        )),
        None => {
            let (mnt, rel) = locate_in_mount(path)?;
            Ok((Target::Mounted { mnt }, rel))
        }
    }
}

/// The revisions of `path` as the daemon (or the offline space) lists them: a JSON array of
/// {id, committed_unix, size, new_bytes, current}, oldest first.
pub(crate) fn list_revisions(
    path: &Path,
    space: Option<&Path>,
) -> Result<serde_json::Value, CliError> {
    let (target, rel) = path_target(path, space)?;
    Ok(match target {
        Target::Mounted { mnt } if is_read_only_mount(&mnt) => {
            // The kernel refuses setxattr, and so the daemon's select, on a read-only
            // mount; read the space directly instead (read-only opens share its lock).
            let backing = backing_of(&mnt).ok_or("cannot find the mount's backing space")?;
            let fs = Fs::new(Space::open_as(&backing, &Mode::ReadOnly).map_err(CliError::from)?);
            revisions_json(&fs.revisions_of(&rel).map_err(CliError::from)?)
        }
        Target::Mounted { mnt } => {
            // Paged: one answer must fit an xattr value (64 KiB), a long history does not.
            control::select(&mnt, path, &rel)?;
            let mut all = Vec::new();
            let mut after = 0u64;
            loop {
                let page = control::send(&mnt, &control::Request::RevisionsAfter(after))?;
                let list = page
                    .get("revisions")
                    .and_then(|v| v.as_array())
                    .ok_or("revisions: bad answer from the daemon")?;
                let last = list
                    .last()
                    .and_then(|r| r.get("id"))
                    .and_then(|i| i.as_u64());
                all.extend(list.iter().cloned());
                match (page.get("more").and_then(|m| m.as_bool()), last) {
                    (Some(true), Some(id)) => after = id,
                    _ => break,
                }
            }
            serde_json::Value::Array(all)
        }
        Target::Offline { fs } => revisions_json(&fs.revisions_of(&rel).map_err(CliError::from)?),
    })
}

pub(crate) fn cmd_report(path: &Path, space: Option<&Path>, svg: &Path) -> Result<(), CliError> {
    // The space's ratios for the subtitle: from the mount, or the backing dir offline.
    let stats_of = match space {
        Some(dir) => absolute(dir),
        None => locate_in_mount(path)?.0,
    };
    let (points, what) = if space.is_none() && std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        let mut steps = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("cannot list {}: {e}", path.display()))?
            .collect::<Result<_, _>>()
            .map_err(CliError::from)?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            // Links (`latest`) and the revision view are not checkpoints of their own.
            if name == ".ckptfs" || e.file_type().map_err(CliError::from)?.is_symlink() {
                continue;
            }
            let p = report::step_point(&e.path(), name, &mut |f| {
                list_revisions(f, None).or_else(|err| match is_cross_slot(&err.to_string()) {
                    true => published_cost(f),
                    false => Err(err),
                })
            })?;
            if p.logical > 0 {
                steps.push(p);
            }
        }
        steps.sort_by(|a, b| a.committed_unix.total_cmp(&b.committed_unix));
        (steps, "checkpoint steps")
    } else {
        (
            report::file_points(&list_revisions(path, space)?),
            "revisions",
        )
    };
    let s = read_stats(&stats_of)?;
    let subtitle = format!(
        "{} {what}; the space now: dedup {}, compression {}, {} stored for {} logical",
        points.len(),
        s.dedup_ratio().map_or("-".into(), |r| format!("{r:.2}x")),
        s.compression_ratio()
            .map_or("-".into(), |r| format!("{r:.2}x")),
        human(s.stored_bytes),
        human(s.logical_bytes)
    );
    report::render_svg(&path.display().to_string(), &subtitle, &points, svg)?;
    let (logical, stored) = points
        .iter()
        .fold((0, 0), |(l, s), p| (l + p.logical, s + p.stored));
    println!(
        "wrote {}: {} {what}, {} logical, {} newly stored",
        svg.display(),
        points.len(),
        human(logical),
        human(stored)
    );
    Ok(())
}

/// How a control request over a file another slot made says so (`control_error`).
pub(crate) const CROSS_SLOT: &str = "another node's slot holds this file, and its revisions";

/// Whether a control request failed because the file is another node's slot's.
pub(crate) fn is_cross_slot(err: &str) -> bool {
    err.contains(CROSS_SLOT)
}

/// What another slot's file costs (its slot keeps its revisions), as a one-entry revision
/// listing for the report: its size, newest commit, and the stored bytes of its chunks.
pub(crate) fn published_cost(path: &Path) -> Result<serde_json::Value, CliError> {
    let (target, rel) = path_target(path, None)?;
    let Target::Mounted { mnt } = target else {
        return Err(format!("{}: not in a mount", path.display()).into());
    };
    control::select(&mnt, path, &rel)?;
    let c = control::send(&mnt, &control::Request::Cost)?;
    if c.is_null() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    Ok(serde_json::json!([{
        "current": true,
        "size": c["size"],
        "new_bytes": c["stored"],
        "committed_unix": c["committed_unix"],
    }]))
}

pub(crate) fn cmd_revisions(path: &Path, space: Option<&Path>, json: bool) -> Result<(), CliError> {
    let v = list_revisions(path, space)?;
    // Commit times in the reader's local zone: RFC 3339 for programs, local time and age
    // for people (the daemon's answer carries only the unix time; its zone may differ).
    let mut v = v;
    for r in v.as_array_mut().into_iter().flatten() {
        if let Some(t) = r.get("committed_unix").and_then(|x| x.as_f64()) {
            r["committed"] = serde_json::Value::String(when::rfc3339(t));
        }
    }
    if json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "{:>10}  {:<34}  {:>12}  {:>12}",
        "revision", "committed", "size", "new bytes"
    );
    for r in v.as_array().into_iter().flatten() {
        let g = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        let committed = r
            .get("committed_unix")
            .and_then(|x| x.as_f64())
            .map_or_else(|| "?".to_string(), when::human);
        println!(
            "{:>10}  {:<34}  {:>12}  {:>12}{}",
            g("id"),
            committed,
            human(g("size")),
            human(g("new_bytes")),
            if r.get("current").and_then(|x| x.as_bool()) == Some(true) {
                "  current"
            } else {
                ""
            }
        );
    }
    Ok(())
}

pub(crate) fn cmd_restore(
    path: &Path,
    space: Option<&Path>,
    rev: u64,
    to: Option<&Path>,
) -> Result<(), CliError> {
    let (target, rel) = path_target(path, space)?;
    match (target, to) {
        (Target::Mounted { mnt }, None) => {
            control::select(&mnt, path, &rel)?;
            control::send(&mnt, &control::Request::Restore(rev))?;
        }
        (Target::Mounted { mnt }, Some(to)) => {
            // Through the path's revision view, which anyone who may read the file may read
            // (`.ckptfs/histories` is root's alone); else by history id, so unlinked paths
            // work too.
            let by_path = mnt
                .join(".ckptfs/revisions")
                .join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&rel))
                .join(rev.to_string());
            if by_path.is_file() {
                std::fs::copy(&by_path, to).map_err(|e| {
                    format!("cannot copy revision {rev} ({}): {e}", by_path.display())
                })?;
                return Ok(());
            }
            control::select(&mnt, path, &rel)?;
            let hid = control::send(&mnt, &control::Request::History)?
                .get("history")
                .and_then(|h| h.as_u64())
                .ok_or("malformed history answer")?;
            let src = mnt
                .join(".ckptfs/histories")
                .join(hid.to_string())
                .join(rev.to_string());
            std::fs::copy(&src, to)
                .map_err(|e| format!("cannot copy revision {rev} ({}): {e}", src.display()))?;
        }
        (Target::Offline { fs }, None) => {
            // SAFETY: getuid/getgid cannot fail.
            let c = unsafe {
                Caller {
                    uid: libc::getuid(),
                    gid: libc::getgid(),
                }
            };
            fs.restore(&rel, rev, c).map_err(CliError::from)?;
        }
        (Target::Offline { fs }, Some(to)) => {
            let f = fs.read_revision(&rel, rev).map_err(CliError::from)?;
            let mut out = std::fs::File::create(to).map_err(CliError::from)?;
            let mut off = 0;
            while off < f.size() {
                let piece = f
                    .read(fs.space().data().chunks(), off, 8 << 20)
                    .map_err(CliError::from)?;
                out.write_all(&piece).map_err(CliError::from)?;
                off += piece.len() as u64;
            }
            out.sync_all().map_err(CliError::from)?;
        }
    }
    Ok(())
}
