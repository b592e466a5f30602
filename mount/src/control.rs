//! The control channel to a running daemon, as one typed request/reply API.
//!
//! The wire is extended attributes of the mount's control file: `getxattr` of
//! `user.ckptfs.NAME` asks for an answer; `setxattr` of it with a value runs a change, whose
//! answer the same process then reads with `getxattr` of the same name (the daemon keeps one
//! answer per process). Both sides use `Request`: the CLI builds one and `send`s it; the
//! FUSE adapter parses the attribute back into one (`Request::parse`) and answers it
//! (`fuse::CkptFs::control`). A new request is one variant here, one arm in the adapter.
//!
//! Every answer is JSON (an empty value for `select` and `restore`).

use crate::error::CliError;
use crate::{fuse, CROSS_SLOT};
use ckptfs_engine::advice::AdviceConfig;
use std::path::Path;

/// The prefix of the control attributes' names.
pub const PREFIX: &str = "user.ckptfs.";

/// A listing of revisions goes page by page: `revisions-after-ID` names the last id seen.
pub const REVISIONS_AFTER: &str = "revisions-after-";

/// One control request.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// The daemon's pid, for `ckptfs umount` to wait on.
    Pid,
    /// Commit every open file, make everything durable and published; say what could not be.
    Sync,
    /// Move the daemon's clock forward by seconds (tests; a daemon started with
    /// `CKPTFS_TEST_CLOCK=1` only).
    Clock(f64),
    Stats,
    /// The object-store tier's status (`{"tier": false}` without one).
    Remote,
    /// `Remote`, after asking the uploader to upload everything changed before now
    /// (`ckptfs umount` and `ckptfs remote --sync` then poll `Remote`).
    RemoteNudge,
    /// `ckptfs check --remote` on a mount: the bucket verified, damaged chunks uploaded again.
    RemoteCheck,
    /// gc of the bucket (`ckptfs gc` on a mount with a tier).
    RemoteGc {
        dry_run: bool,
    },
    /// `ckptfs rebuild`: optionally replace target `old` by the spec `new` first.
    Rebuild {
        replace: Option<(String, String)>,
        throttle: Option<f64>,
    },
    Scrub {
        throttle: Option<f64>,
    },
    /// Forget the decoded chunks the daemon caches (cold-read measurements, tests).
    DropCaches,
    /// The advice's inputs, or a new failure model.
    Advice,
    SetAdvice(AdviceConfig),
    Redundancy,
    Targets,
    /// The retention config, or changes to it as `key=value,...` pairs.
    Config,
    SetConfig(String),
    Gc {
        dry_run: bool,
        empty_trash: bool,
    },
    Check,
    /// Selects the path (relative to the mount's root) the revision requests below are
    /// about, for this process.
    Select(Vec<u8>),
    /// `Select` by gets of the selected file's own attributes, for callers who may not set
    /// an attribute of the mount's root (a user other than its owner). The kernel lets a
    /// get of a `user.` attribute through only to a caller who can reach the file and read
    /// it, so the request itself proves the access the revision view asks for; the daemon
    /// selects the path only if it names that very file. The path travels hex-encoded in
    /// attribute names of at most `SELECT_PIECE` path bytes each: pieces before the last
    /// (`last` false) are kept, the last completes the selection.
    SelectPiece {
        last: bool,
        piece: Vec<u8>,
    },
    /// A page of the selected path's revisions, those with ids above this one.
    RevisionsAfter(u64),
    /// What the selected path (another slot's file) costs.
    Cost,
    History,
    /// Restore the selected path's revision in place.
    Restore(u64),
}

/// Names of a selection by gets (`Request::SelectPiece`), asked of the selected file.
pub const SELECT_LAST: &str = "select-end-hex-";
pub const SELECT_PART: &str = "select-part-hex-";
/// Path bytes per `SelectPiece`: hex-encoded with the longer prefix they stay within the
/// 255 bytes an attribute name may have.
pub const SELECT_PIECE: usize = 100;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, Refused> {
    if !s.len().is_multiple_of(2) || s.len() > 2 * SELECT_PIECE {
        return Err(Refused::Invalid);
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| Refused::Invalid))
        .collect()
}

/// Why an attribute is not a request.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// No such request (ENODATA, as any missing attribute).
    Unknown,
    /// A known request with a malformed value (EINVAL).
    Invalid,
}

/// The requests that change the space, run its costly jobs or move its clock: root and the
/// owner of the mount's root directory only (`select` and the read-only answers are for
/// everyone who can see the mount). By name and direction, so a malformed request from
/// anyone else is refused for who sends it before what it says.
pub fn owner_only(name: &str, set: bool) -> bool {
    match set {
        true => matches!(
            name,
            "clock" | "rebuild" | "scrub" | "drop_caches" | "advice" | "config" | "gc" | "restore"
        ),
        false => matches!(name, "check" | "remote_gc" | "remote_check"),
    }
}

fn json(v: &[u8]) -> Result<serde_json::Value, Refused> {
    serde_json::from_slice(v).map_err(|_| Refused::Invalid)
}

fn text<T: std::str::FromStr>(v: &[u8]) -> Result<T, Refused> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or(Refused::Invalid)
}

impl Request {
    /// The request an attribute name (without `PREFIX`) and value (`None`: a get) make.
    pub fn parse(name: &str, value: Option<&[u8]>) -> Result<Request, Refused> {
        use Request::*;
        Ok(match (name, value) {
            ("pid", None) => Pid,
            ("sync", None) => Sync,
            ("clock", Some(v)) => Clock(
                Some(text::<f64>(v)?)
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .ok_or(Refused::Invalid)?,
            ),
            ("stats", None) => Stats,
            ("remote", None) => Remote,
            ("remote_nudge", None) => RemoteNudge,
            ("remote_gc", None) => RemoteGc { dry_run: false },
            ("remote_check", None) => RemoteCheck,
            ("remote_gc_dry_run", None) => RemoteGc { dry_run: true },
            ("rebuild", Some(v)) => {
                let r = json(v)?;
                let replace = match r["replace"].as_array() {
                    Some(a) => {
                        let s = |i: usize| a.get(i).and_then(|x| x.as_str()).map(str::to_string);
                        Some((s(0).ok_or(Refused::Invalid)?, s(1).ok_or(Refused::Invalid)?))
                    }
                    None => None,
                };
                Rebuild {
                    replace,
                    throttle: r["throttle"].as_f64(),
                }
            }
            ("scrub", Some(v)) => Scrub {
                throttle: json(v)?["throttle"].as_f64(),
            },
            ("drop_caches", Some(_)) => DropCaches,
            ("advice", None) => Advice,
            ("advice", Some(v)) => {
                SetAdvice(serde_json::from_slice(v).map_err(|_| Refused::Invalid)?)
            }
            ("redundancy", None) => Redundancy,
            ("targets", None) => Targets,
            ("config", None) => Config,
            ("config", Some(v)) => {
                SetConfig(String::from_utf8(v.to_vec()).map_err(|_| Refused::Invalid)?)
            }
            ("gc", Some(v)) => {
                let (dry_run, empty_trash) = match v {
                    b"run" => (false, false),
                    b"dry-run" => (true, false),
                    b"empty-trash" => (false, true),
                    b"dry-run,empty-trash" => (true, true),
                    _ => return Err(Refused::Invalid),
                };
                Gc {
                    dry_run,
                    empty_trash,
                }
            }
            ("check", None) => Check,
            ("select", Some(v)) => Select(v.to_vec()),
            ("cost", None) => Cost,
            ("history", None) => History,
            ("restore", Some(v)) => Restore(text(v)?),
            (n, None) if n.starts_with(SELECT_LAST) => SelectPiece {
                last: true,
                piece: unhex(&n[SELECT_LAST.len()..])?,
            },
            (n, None) if n.starts_with(SELECT_PART) => SelectPiece {
                last: false,
                piece: unhex(&n[SELECT_PART.len()..])?,
            },
            (n, None) if n.starts_with(REVISIONS_AFTER) => RevisionsAfter(
                n[REVISIONS_AFTER.len()..]
                    .parse()
                    .map_err(|_| Refused::Invalid)?,
            ),
            _ => return Err(Refused::Unknown),
        })
    }

    /// The attribute's name (without `PREFIX`) and, for a change, its value.
    pub fn to_wire(&self) -> (String, Option<Vec<u8>>) {
        use Request::*;
        let get = |n: &str| (n.to_string(), None);
        let set = |n: &str, v: Vec<u8>| (n.to_string(), Some(v));
        match self {
            Pid => get("pid"),
            Sync => get("sync"),
            Clock(s) => set("clock", s.to_string().into_bytes()),
            Stats => get("stats"),
            Remote => get("remote"),
            RemoteNudge => get("remote_nudge"),
            RemoteGc { dry_run: false } => get("remote_gc"),
            RemoteCheck => get("remote_check"),
            RemoteGc { dry_run: true } => get("remote_gc_dry_run"),
            Rebuild { replace, throttle } => {
                let mut r = serde_json::json!({});
                if let Some((old, new)) = replace {
                    r["replace"] = serde_json::json!([old, new]);
                }
                if let Some(t) = throttle {
                    r["throttle"] = serde_json::json!(t);
                }
                set("rebuild", r.to_string().into_bytes())
            }
            Scrub { throttle } => {
                let mut r = serde_json::json!({});
                if let Some(t) = throttle {
                    r["throttle"] = serde_json::json!(t);
                }
                set("scrub", r.to_string().into_bytes())
            }
            DropCaches => set("drop_caches", b"1".to_vec()),
            Advice => get("advice"),
            SetAdvice(c) => set("advice", serde_json::to_vec(c).expect("plain fields")),
            Redundancy => get("redundancy"),
            Targets => get("targets"),
            Config => get("config"),
            SetConfig(pairs) => set("config", pairs.clone().into_bytes()),
            Gc {
                dry_run,
                empty_trash,
            } => {
                let v: &[u8] = match (dry_run, empty_trash) {
                    (false, false) => b"run",
                    (true, false) => b"dry-run",
                    (false, true) => b"empty-trash",
                    (true, true) => b"dry-run,empty-trash",
                };
                set("gc", v.to_vec())
            }
            Check => get("check"),
            Select(p) => set("select", p.clone()),
            SelectPiece { last, piece } => get(&format!(
                "{}{}",
                if *last { SELECT_LAST } else { SELECT_PART },
                hex(piece)
            )),
            RevisionsAfter(id) => get(&format!("{REVISIONS_AFTER}{id}")),
            Cost => get("cost"),
            History => get("history"),
            Restore(rev) => set("restore", rev.to_string().into_bytes()),
        }
    }

    /// Whether a change's answer is read back (`send`); `select`, `restore`, `clock` and
    /// `drop_caches` answer nothing worth a second request.
    fn answers_change(&self) -> bool {
        matches!(
            self,
            Request::Rebuild { .. }
                | Request::Scrub { .. }
                | Request::SetAdvice(_)
                | Request::SetConfig(_)
                | Request::Gc { .. }
        )
    }
}

/// Sends `r` to the daemon of the mount at `mnt` and returns its answer (`Null` for a change
/// that answers nothing). A get computes its answer in the daemon; a change runs inside the
/// setxattr (gc, rebuild: as long as they take) and its answer is read back after.
pub fn send(mnt: &Path, r: &Request) -> Result<serde_json::Value, CliError> {
    let (name, value) = r.to_wire();
    match value {
        None => control_get(mnt, &name, true),
        Some(v) => {
            control_set(mnt, &name, &v)?;
            match r.answers_change() {
                true => control_get(mnt, &name, false),
                false => Ok(serde_json::Value::Null),
            }
        }
    }
}

/// Selects `rel` (the path of `file` under the mount `mnt`) for this process: by setting
/// `select` on the mount's root (one request), or, where this user may not set attributes
/// of the root (it is not theirs), by gets of `SelectPiece`s asked of `file` itself, which
/// the kernel allows anyone who may read the file.
pub fn select(mnt: &Path, file: &Path, rel: &[u8]) -> Result<(), CliError> {
    let e = match set_xattr(&cpath(mnt)?, &xattr_name("select"), rel) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if !matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
        return Err(format!("select: {e}").into());
    }
    let f = cpath(file)?;
    let pieces: Vec<&[u8]> = match rel.is_empty() {
        true => vec![rel],
        false => rel.chunks(SELECT_PIECE).collect(),
    };
    for (i, piece) in pieces.iter().enumerate() {
        let (name, _) = Request::SelectPiece {
            last: i + 1 == pieces.len(),
            piece: piece.to_vec(),
        }
        .to_wire();
        if let Err(e) = xattr_size(&f, &xattr_name(&name)) {
            return Err(format!(
                "{}: {e}: not readable by this user, or not a file of the mount",
                file.display()
            )
            .into());
        }
    }
    Ok(())
}

// The wire: one attribute of the mount's root per request.

pub(crate) fn xattr_name(op: &str) -> std::ffi::CString {
    std::ffi::CString::new(format!("{}{op}", fuse::CONTROL_PREFIX)).expect("no NUL")
}

pub(crate) fn cpath(p: &Path) -> Result<std::ffi::CString, CliError> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(CliError::from)
}

/// setxattr(2) of `n` on `p`.
fn set_xattr(p: &std::ffi::CStr, n: &std::ffi::CStr, value: &[u8]) -> std::io::Result<()> {
    // SAFETY: valid C strings and a readable value buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The size of attribute `n` of `p` (getxattr(2) with no buffer: for a control attribute,
/// this makes the daemon compute its answer).
fn xattr_size(p: &std::ffi::CStr, n: &std::ffi::CStr) -> std::io::Result<usize> {
    // SAFETY: a size query writes nothing.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    match r < 0 {
        true => Err(std::io::Error::last_os_error()),
        false => Ok(r as usize),
    }
}

pub(crate) fn control_set(mnt: &Path, op: &str, value: &[u8]) -> Result<(), CliError> {
    if let Err(e) = set_xattr(&cpath(mnt)?, &xattr_name(op), value) {
        if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) && op != "select" {
            return Err(format!(
                "{op}: {e}: only root and the owner of the mount's root directory ({}) may \
                 run gc, restore in place or change the config",
                mnt.display()
            )
            .into());
        }
        return Err(format!("{}: {e}", op_word(op)).into());
    }
    Ok(())
}

/// The command a control request serves, as users name it (a listing goes page by page
/// through requests named after the last revision seen).
pub(crate) fn op_word(op: &str) -> &str {
    match op.strip_prefix(REVISIONS_AFTER) {
        Some(_) => "revisions",
        None => op,
    }
}

/// The last control request's failure as a sentence.
pub(crate) fn control_error(op: &str) -> String {
    let op = op_word(op);
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EXDEV) {
        // A shared namespace: the file is another slot's, which keeps its revisions.
        return format!("{op}: {CROSS_SLOT}: run this through a mount of that slot");
    }
    format!("{op}: {e}")
}

/// Reads a control answer. `probe` first asks for the size, which makes the daemon compute
/// the answer; without it the daemon returns the answer of this process's last request.
pub(crate) fn control_get(
    mnt: &Path,
    op: &str,
    probe: bool,
) -> Result<serde_json::Value, CliError> {
    let (p, n) = (cpath(mnt)?, xattr_name(op));
    let mut len = 65536;
    if probe {
        len = xattr_size(&p, &n).map_err(|_| CliError::from(control_error(op)))?;
    }
    let mut buf = vec![0u8; len.max(1)];
    // SAFETY: getxattr writes at most buf.len() bytes into buf.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(CliError::from(control_error(op)));
    }
    Ok(serde_json::from_slice(&buf[..r as usize])
        .map_err(|e| format!("{}: bad answer: {e}", op_word(op)))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every request goes over the wire and comes back the same; what is not a request is
    /// told apart from a malformed one.
    #[test]
    fn requests_survive_the_wire_and_bad_ones_are_told_apart() {
        use Request::*;
        let all = [
            Pid,
            Sync,
            Clock(2.5),
            Stats,
            Rebuild {
                replace: Some(("/a".into(), "/b:domain=r1".into())),
                throttle: Some(0.5),
            },
            Rebuild {
                replace: None,
                throttle: None,
            },
            Scrub {
                throttle: Some(1.0),
            },
            DropCaches,
            Advice,
            SetAdvice(AdviceConfig::default()),
            Redundancy,
            Targets,
            Config,
            SetConfig("keep-revisions=3".into()),
            Gc {
                dry_run: true,
                empty_trash: false,
            },
            Gc {
                dry_run: false,
                empty_trash: true,
            },
            Check,
            Select(b"dir/ckpt.pt".to_vec()),
            SelectPiece {
                last: true,
                piece: b"dir/\xffckpt.pt".to_vec(),
            },
            SelectPiece {
                last: false,
                piece: vec![b'a'; SELECT_PIECE],
            },
            RevisionsAfter(42),
            Cost,
            History,
            Restore(7),
        ];
        for r in all {
            let (name, value) = r.to_wire();
            assert_eq!(
                Request::parse(&name, value.as_deref()),
                Ok(r.clone()),
                "{name}"
            );
            let owner = owner_only(&name, value.is_some());
            let changes = matches!(
                r,
                Clock(_)
                    | Rebuild { .. }
                    | Scrub { .. }
                    | DropCaches
                    | SetAdvice(_)
                    | SetConfig(_)
                    | Gc { .. }
                    | Restore(_)
                    | Check
            );
            assert_eq!(owner, changes, "{r:?}: owner only");
        }
        assert_eq!(Request::parse("nothing", None), Err(Refused::Unknown));
        assert_eq!(Request::parse("stats", Some(b"x")), Err(Refused::Unknown));
        assert_eq!(Request::parse("gc", Some(b"now")), Err(Refused::Invalid));
        assert_eq!(Request::parse("clock", Some(b"-1")), Err(Refused::Invalid));
        assert_eq!(Request::parse("restore", Some(b"x")), Err(Refused::Invalid));
        assert_eq!(Request::parse("rebuild", Some(b"{")), Err(Refused::Invalid));
        assert_eq!(
            Request::parse("revisions-after-x", None),
            Err(Refused::Invalid)
        );
    }
}
