//! The batch-job examples (examples/slurm) run as a simulated SLURM job: the prolog mounts
//! the job's space, the job checkpoints, the node "dies" (the job and the ckptfs daemon are
//! killed with SIGKILL in the middle of a step), the prolog runs again on the "replacement
//! node" (clearing the dead mount), the requeued job resumes, and the epilog reports and
//! unmounts. The restart must resume from a verified checkpoint no older than the last one
//! the job acknowledged.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ckptfs_tests::{ckptfs_bin, TempDir};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/slurm")
        .join(name)
}

fn job_env<'a>(cmd: &'a mut Command, root: &Path, mnt: &Path) -> &'a mut Command {
    cmd.env("SLURM_JOB_ID", "4242")
        .env("SLURM_JOB_NAME", "train-demo")
        .env("SLURM_NODEID", "0")
        .env("CKPTFS_SPACE_ROOT", root)
        .env("CKPTFS_SPACE_SIZE", "1G")
        .env("CKPTFS_MOUNT", mnt)
        .env("CKPTFS", ckptfs_bin())
        .env("RANKS", "4")
        .env("CKPT_MIB", "4")
        .env("STEP_SECS", "0.2")
}

#[track_caller]
fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("--- {what} ---\n{text}");
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

fn step_of(line: &str, prefix: &str) -> Option<u64> {
    line.strip_prefix(prefix)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn a_requeued_job_resumes_from_its_newest_acknowledged_checkpoint_after_a_node_dies() {
    let dir = TempDir::new("job");
    let (root, mnt) = (dir.path().join("pfs"), dir.path().join("ckpt"));
    let backing = root.join("train-demo");

    run_ok(
        job_env(&mut Command::new(script("prolog.sh")), &root, &mnt),
        "prolog",
    );

    // The job, in its own process group so the whole of it can be killed.
    let mut job = job_env(&mut Command::new(script("job.sh")), &root, &mnt)
        .env("STEPS", "1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .expect("start job.sh");
    let (tx, rx) = mpsc::channel();
    let out = job.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut acked = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked < 4 {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the job acknowledged fewer than 4 checkpoints in 120 s");
        println!("{line}");
        if let Some(n) = step_of(&line, "job: checkpoint ") {
            acked = n;
        }
    }
    // Into the middle of the next step's writes, then the node dies: job and daemon at once.
    // The writes have begun when the next step's first rank file has bytes (the job sleeps
    // STEP_SECS before it writes, so a fixed wait would kill it there, not mid-write).
    let writing = mnt.join(format!("step-{}.tmp/rank-0.bin", acked + 1));
    let begun = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&writing).map_or(true, |m| m.len() == 0) {
        assert!(
            Instant::now() < begun,
            "the job did not begin writing step {} in 60 s",
            acked + 1
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let note = std::fs::read_to_string(backing.join("lock")).expect("lock note");
    let daemon: i32 = step_of(&note, "pid ").expect("daemon pid in the lock note") as i32;
    // SAFETY: plain kill(2) of the job's process group and of the daemon.
    unsafe {
        libc::kill(-(job.id() as i32), libc::SIGKILL);
        libc::kill(daemon, libc::SIGKILL);
    }
    let _ = job.wait();
    for line in rx.try_iter() {
        println!("{line}");
        if let Some(n) = step_of(&line, "job: checkpoint ") {
            acked = n;
        }
    }
    println!("killed the job and the daemon after checkpoint {acked} was acknowledged");
    // The daemon is gone when its pid is (the lock is its flock, released at exit).
    let gone = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{daemon}")).exists() && Instant::now() < gone {
        std::thread::sleep(Duration::from_millis(50));
    }

    // The replacement node: prolog (clears the dead mount), the requeued job, the epilog.
    run_ok(
        job_env(&mut Command::new(script("prolog.sh")), &root, &mnt),
        "prolog after the failure",
    );
    let latest = std::fs::read_link(mnt.join("latest")).expect("latest after the restart");
    let resumed_from: u64 = latest
        .to_str()
        .and_then(|s| s.strip_prefix("step-"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("latest -> {latest:?}"));
    let text = run_ok(
        job_env(&mut Command::new(script("job.sh")), &root, &mnt)
            .env("STEPS", (resumed_from + 3).to_string()),
        "requeued job",
    );
    let resumed = text
        .lines()
        .find_map(|l| step_of(l, "job: resuming from step "))
        .unwrap_or_else(|| panic!("the requeued job did not resume:\n{text}"));
    assert_eq!(resumed, resumed_from, "resumed from what latest names");
    assert!(
        resumed >= acked,
        "checkpoint {acked} was acknowledged before the failure, but the job resumed from {resumed}"
    );
    assert!(
        text.contains(&format!("job: done at step {}", resumed_from + 3)),
        "{text}"
    );

    let report = run_ok(
        job_env(&mut Command::new(script("epilog.sh")), &root, &mnt),
        "epilog",
    );
    for want in ["stored bytes", "dedup ratio"] {
        assert!(
            report.contains(want),
            "the epilog's report lacks {want:?}:\n{report}"
        );
    }
    assert!(!mnt.exists(), "the epilog removes the job's mountpoint");
}
