//! The timed I/O (one file written or read with fixed-size calls), and the writer/reader
//! processes of the multi-process scenarios.
//!
//! A worker is this binary re-executed as `ckptfs-bench worker TASK_JSON`. It generates its
//! data, prints `ready` and waits for `go` on stdin, so every worker starts from one barrier and
//! no worker's data generation overlaps another's timed I/O. It then does its I/O, prints one
//! JSON line of timings (CLOCK_MONOTONIC, shared with the parent), and a reader then waits for
//! `verify`: hashing is kept out of the timed part and starts only after every reader is done.
//! A reader whose stdin closes instead exits without checking.

use crate::data::RandomSpec;
use crate::sys::{mono_ns, Result};
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Timings of one file's I/O: open at t0, close returned at t1 (ns, CLOCK_MONOTONIC); `close_ns`
/// covers fsync+close on the plain side and close alone on ckptfs.
#[derive(Clone, Debug)]
pub struct Timed {
    pub bytes: u64,
    pub t0: u64,
    pub t1: u64,
    pub close_ns: u64,
}

impl Timed {
    fn to_json(&self) -> Value {
        json!({"bytes": self.bytes, "t0": self.t0, "t1": self.t1, "close_ns": self.close_ns})
    }

    fn from_json(v: &Value) -> Result<Timed> {
        let f = |k: &str| {
            v[k].as_u64()
                .ok_or_else(|| format!("worker report lacks {k}: {v}"))
        };
        Ok(Timed {
            bytes: f("bytes")?,
            t0: f("t0")?,
            t1: f("t1")?,
            close_ns: f("close_ns")?,
        })
    }
}

/// close(2) with its error: std's `File` drops close errors, but on ckptfs close is the commit
/// and reports ENOSPC/EIO.
pub(crate) fn close(f: File) -> io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: fd is owned (taken from the File) and closed exactly once.
    if unsafe { libc::close(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `data` to the byte ranges `ranges` of `path` (concatenated in `data`), in `block`-sized
/// pwrite calls. `truncate`: create or truncate the file; else open an existing file O_WRONLY,
/// as writers of a shared N-1 file do. `fsync`: the plain side's durability, fsync before close.
pub fn write_ranges(
    path: &Path,
    data: &[u8],
    ranges: &[(u64, u64)],
    block: usize,
    truncate: bool,
    fsync: bool,
) -> io::Result<Timed> {
    let t0 = mono_ns();
    let f = OpenOptions::new()
        .write(true)
        .create(truncate)
        .truncate(truncate)
        .open(path)?;
    let mut pos = 0usize;
    for &(off, len) in ranges {
        let src = &data[pos..pos + len as usize];
        for (i, piece) in src.chunks(block).enumerate() {
            f.write_all_at(piece, off + (i * block) as u64)?;
        }
        pos += len as usize;
    }
    let tc = mono_ns();
    if fsync {
        f.sync_all()?;
    }
    close(f)?;
    let t1 = mono_ns();
    Ok(Timed {
        bytes: pos as u64,
        t0,
        t1,
        close_ns: t1 - tc,
    })
}

/// Reads `path` from the start into `buf` (already faulted in, so page faults are not timed)
/// with `block`-sized reads, up to EOF or `buf.len()`.
pub fn read_into(path: &Path, buf: &mut [u8], block: usize) -> io::Result<Timed> {
    let t0 = mono_ns();
    let f = File::open(path)?;
    let mut pos = 0usize;
    while pos < buf.len() {
        let end = (pos + block).min(buf.len());
        let n = f.read_at(&mut buf[pos..end], pos as u64)?;
        if n == 0 {
            break;
        }
        pos += n;
    }
    let tc = mono_ns();
    close(f)?;
    let t1 = mono_ns();
    Ok(Timed {
        bytes: pos as u64,
        t0,
        t1,
        close_ns: t1 - tc,
    })
}

/// A zeroed buffer whose pages are already mapped.
pub fn prefaulted(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for i in (0..len).step_by(4096) {
        v[i] = 1;
    }
    v
}

#[derive(Clone, Debug)]
pub enum Op {
    Write { truncate: bool, fsync: bool },
    Read,
}

/// What one worker does: write (or read and check) the given ranges of one file, whose
/// content is `spec`'s bytes at the same offsets.
#[derive(Clone, Debug)]
pub struct Task {
    pub op: Op,
    pub path: PathBuf,
    pub spec: RandomSpec,
    pub ranges: Vec<(u64, u64)>,
    pub block: usize,
    /// A writer's bytes split over this many files written one after the other (`PATH-fK`,
    /// each from offset 0; one range from 0 only), as a job that saves its shards one by
    /// one; 1: `path` itself.
    pub files: u32,
}

impl Task {
    fn to_json(&self) -> Value {
        let (op, truncate, fsync) = match self.op {
            Op::Write { truncate, fsync } => ("write", truncate, fsync),
            Op::Read => ("read", false, false),
        };
        json!({
            "op": op, "truncate": truncate, "fsync": fsync,
            "path": self.path.to_string_lossy(),
            "seed": self.spec.seed,
            "changed": self.spec.changed.map(|(s, p)| json!([s, p])),
            "field": self.spec.field,
            "tensor": self.spec.tensor,
            "ranges": self.ranges.iter().map(|&(o, l)| json!([o, l])).collect::<Vec<_>>(),
            "block": self.block,
            "files": self.files,
        })
    }

    fn from_json(s: &str) -> Result<Task> {
        let v: Value = serde_json::from_str(s).map_err(|e| format!("bad task {s}: {e}"))?;
        let bad = || format!("bad task {s}");
        let pair = |x: &Value| -> Option<(u64, u64)> { Some((x[0].as_u64()?, x[1].as_u64()?)) };
        let op = match v["op"].as_str() {
            Some("write") => Op::Write {
                truncate: v["truncate"].as_bool().ok_or_else(bad)?,
                fsync: v["fsync"].as_bool().ok_or_else(bad)?,
            },
            Some("read") => Op::Read,
            _ => return Err(bad()),
        };
        let changed = match &v["changed"] {
            Value::Null => None,
            c => Some(pair(c).ok_or_else(bad)?),
        };
        Ok(Task {
            op,
            path: PathBuf::from(v["path"].as_str().ok_or_else(bad)?),
            spec: RandomSpec {
                seed: v["seed"].as_u64().ok_or_else(bad)?,
                changed: changed.map(|(s, p)| (s, p as u32)),
                field: v["field"].as_bool().unwrap_or(false),
                tensor: v["tensor"].as_bool().unwrap_or(false),
            },
            ranges: v["ranges"]
                .as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|r| pair(r).ok_or_else(bad))
                .collect::<Result<_>>()?,
            block: v["block"].as_u64().ok_or_else(bad)? as usize,
            files: v["files"].as_u64().unwrap_or(1) as u32,
        })
    }

    fn len(&self) -> usize {
        self.ranges.iter().map(|r| r.1 as usize).sum()
    }
}

/// `task.files` files of `task.path`'s bytes, one after the other: one timing, from the
/// first open to the last close, with the closes summed.
fn write_files(task: &Task, data: &[u8], truncate: bool, fsync: bool) -> Result<Timed> {
    let [(0, _)] = task.ranges[..] else {
        return Err("a writer of several files writes one range from offset 0".into());
    };
    let n = task.files as usize;
    let mut all: Option<Timed> = None;
    for k in 0..n {
        let part = &data[k * data.len() / n..(k + 1) * data.len() / n];
        let path = file_of(&task.path, k);
        let t = write_ranges(
            &path,
            part,
            &[(0, part.len() as u64)],
            task.block,
            truncate,
            fsync,
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        all = Some(match all {
            None => t,
            Some(a) => Timed {
                bytes: a.bytes + t.bytes,
                t0: a.t0,
                t1: t.t1,
                close_ns: a.close_ns + t.close_ns,
            },
        });
    }
    all.ok_or_else(|| "no files".to_string())
}

/// The `k`th file of a writer of several (`Task::files`).
pub fn file_of(path: &Path, k: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!("-f{k}"));
    PathBuf::from(p)
}

fn wait_for(stdin: &mut impl BufRead, word: &str) -> Result<()> {
    let mut line = String::new();
    stdin
        .read_line(&mut line)
        .map_err(|e| format!("read stdin: {e}"))?;
    if line.trim() != word {
        return Err(format!("expected {word:?} from the parent, got {line:?}"));
    }
    Ok(())
}

fn say(v: impl std::fmt::Display) -> Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{v}")
        .and_then(|_| out.flush())
        .map_err(|e| format!("write stdout: {e}"))
}

/// `ckptfs-bench worker TASK_JSON`.
pub fn worker_main(task: &str) -> Result<()> {
    let task = Task::from_json(task)?;
    let mut stdin = io::stdin().lock();
    let io_err = |e: io::Error| format!("{}: {e}", task.path.display());
    match task.op {
        Op::Write { truncate, fsync } => {
            let mut data = vec![0u8; task.len()];
            let mut pos = 0;
            for &(off, len) in &task.ranges {
                task.spec.fill(off, &mut data[pos..pos + len as usize]);
                pos += len as usize;
            }
            say("ready")?;
            wait_for(&mut stdin, "go")?;
            let t = if task.files <= 1 {
                write_ranges(&task.path, &data, &task.ranges, task.block, truncate, fsync)
                    .map_err(io_err)?
            } else {
                write_files(&task, &data, truncate, fsync)?
            };
            say(t.to_json())?;
        }
        Op::Read => {
            let [(0, len)] = task.ranges[..] else {
                return Err("a reader reads one range from offset 0".into());
            };
            let mut buf = prefaulted(len as usize);
            say("ready")?;
            wait_for(&mut stdin, "go")?;
            let t = read_into(&task.path, &mut buf, task.block).map_err(io_err)?;
            say(t.to_json())?;
            // The parent closes stdin without asking when the bytes are not checked (the
            // limits sink serves zeros).
            let mut line = String::new();
            stdin
                .read_line(&mut line)
                .map_err(|e| format!("read stdin: {e}"))?;
            match line.trim() {
                "" => return Ok(()),
                "verify" => {}
                other => {
                    return Err(format!(
                        "expected \"verify\" from the parent, got {other:?}"
                    ))
                }
            }
            let ok = t.bytes == len && blake3::hash(&buf) == task.spec.hash(len);
            say(json!({ "ok": ok }))?;
        }
    }
    Ok(())
}

struct Kid {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Kid {
    fn line(&mut self) -> Result<String> {
        let mut s = String::new();
        match self.stdout.read_line(&mut s) {
            Ok(0) => Err(format!(
                "worker {} exited early (see its error above)",
                self.child.id()
            )),
            Ok(_) => Ok(s),
            Err(e) => Err(format!("read from worker {}: {e}", self.child.id())),
        }
    }

    fn send(&mut self, word: &str) -> Result<()> {
        let id = self.child.id();
        let stdin = self.stdin.as_mut().ok_or("worker stdin closed")?;
        writeln!(stdin, "{word}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("write to worker {id}: {e}"))
    }
}

/// A set of running workers; dropping it kills any still running.
pub struct Group {
    kids: Vec<Kid>,
}

impl Group {
    /// Starts one worker per task and waits until each has its data ready.
    pub fn start(exe: &Path, tasks: &[Task]) -> Result<Group> {
        let mut g = Group { kids: Vec::new() };
        for t in tasks {
            let mut child = Command::new(exe)
                .arg("worker")
                .arg(t.to_json().to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("start worker {}: {e}", exe.display()))?;
            let stdin = child.stdin.take();
            let stdout = BufReader::new(child.stdout.take().ok_or("worker has no stdout")?);
            g.kids.push(Kid {
                child,
                stdin,
                stdout,
            });
        }
        for k in &mut g.kids {
            let l = k.line()?;
            if l.trim() != "ready" {
                return Err(format!("worker said {l:?} instead of ready"));
            }
        }
        Ok(g)
    }

    /// Releases the barrier; returns the time of the release and each worker's timings.
    pub fn go(&mut self) -> Result<(u64, Vec<Timed>)> {
        let t_go = mono_ns();
        for k in &mut self.kids {
            k.send("go")?;
        }
        let mut out = Vec::new();
        for k in &mut self.kids {
            let l = k.line()?;
            let v: Value =
                serde_json::from_str(l.trim()).map_err(|e| format!("worker said {l:?}: {e}"))?;
            out.push(Timed::from_json(&v)?);
        }
        Ok((t_go, out))
    }

    /// Readers: checks every reader's data against the expected hash.
    pub fn verify(&mut self) -> Result<bool> {
        for k in &mut self.kids {
            k.send("verify")?;
        }
        let mut all = true;
        for k in &mut self.kids {
            let l = k.line()?;
            let v: Value =
                serde_json::from_str(l.trim()).map_err(|e| format!("worker said {l:?}: {e}"))?;
            all &= v["ok"].as_bool() == Some(true);
        }
        Ok(all)
    }

    /// Waits for every worker to exit successfully.
    pub fn finish(mut self) -> Result<()> {
        // Popped one by one so that on an error the rest are still killed by Drop.
        while let Some(mut k) = self.kids.pop() {
            k.stdin.take();
            let st = k
                .child
                .wait()
                .map_err(|e| format!("wait for worker: {e}"))?;
            if !st.success() {
                return Err(format!("worker {} failed: {st}", k.child.id()));
            }
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for k in &mut self.kids {
            let _ = k.child.kill();
            let _ = k.child.wait();
        }
    }
}
