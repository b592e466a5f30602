//! `ckptfs advise` and `/.ckptfs/advice`: the commit time is measured from how long recent
//! checkpoints took to write, the failure model is kept in the space's config once given,
//! and the verdict flips to `checkpoint-now: yes` once the advised interval has passed.

use ckptfs_engine::advice::daly_interval;
use ckptfs_engine::clock;
use ckptfs_tests::cluster::{advance_daemon_clock, set_control};
use ckptfs_tests::{pattern, TestMount};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::time::Duration;

/// One checkpoint: `ranks` files written at once, each in 4 pieces with the daemon's clock
/// moved 300 ms between pieces (`CKPTFS_TEST_CLOCK`), so by the daemon's clock it takes at
/// least 0.9 s to write, however fast or slow this machine is.
/// Returns how far it moved the clock.
fn slow_checkpoint(m: &TestMount, step: u32, ranks: u32) -> Duration {
    fs::create_dir_all(m.path(format!("step-{step}"))).expect("mkdir");
    let mut files: Vec<fs::File> = (0..ranks)
        .map(|r| fs::File::create(m.path(format!("step-{step}/rank-{r}"))).expect("create"))
        .collect();
    for i in 0..4u64 {
        if i > 0 {
            advance_daemon_clock(m.mnt(), Duration::from_millis(300));
        }
        for (r, f) in files.iter_mut().enumerate() {
            f.write_all(&pattern(u64::from(step * 100 + r as u32) ^ i, 256 << 10))
                .expect("write");
        }
    }
    for f in &files {
        f.sync_all().expect("fsync");
    }
    Duration::from_millis(900)
}

fn advise(m: &mut TestMount, extra: &[&str]) -> serde_json::Value {
    let at = m.target().as_os_str().to_os_string();
    let mut args = vec![OsStr::new("advise"), at.as_os_str(), OsStr::new("--json")];
    args.extend(extra.iter().map(OsStr::new));
    m.ckptfs_json(&args)
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("no number {k} in {v}"))
}

#[test]
fn advice_measures_checkpoints_keeps_its_model_and_flips_when_due() {
    // The daemon's clock is moved by the test, never slept through.
    let mut m = TestMount::new();
    // A daemon started without it refuses to have its clock moved.
    let no = set_control(m.mnt(), "clock", b"5");
    assert_eq!(
        no.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EPERM)),
        "a mount without CKPTFS_TEST_CLOCK=1 let its clock be moved"
    );
    m.unmount();
    m.set_env(clock::TEST_CLOCK_ENV, "1");
    m.mount();
    let mnt = m.mnt().as_os_str().to_os_string();

    // Nothing to go on yet: a clear error, nothing stored.
    let (st, _, err) = m.ckptfs(&[OsStr::new("advise"), &mnt]);
    assert!(!st.success() && err.contains("--node-mtbf"), "{err}");
    let text = fs::read_to_string(m.path(".ckptfs/advice")).expect("read advice");
    assert!(text.starts_with("checkpoint-now: unknown\n"), "{text}");

    let mut moved = Duration::ZERO;
    for step in 1..=3 {
        moved += slow_checkpoint(&m, step, 3);
        // Checkpoints closer than 2 s by the daemon's clock count as one.
        advance_daemon_clock(m.mnt(), Duration::from_millis(2500));
        moved += Duration::from_millis(2500);
    }
    let a = advise(&mut m, &["--node-mtbf", "30d", "--nodes", "64"]);
    println!("advice: {a}");
    assert_eq!(a["recent"].as_array().map(Vec::len), Some(3), "{a}");
    for c in a["recent"].as_array().unwrap() {
        assert_eq!(c["revisions"], 3, "three ranks per checkpoint: {a}");
    }
    let commit = f(&a, "commit_secs");
    assert!(commit >= 0.9, "each checkpoint took at least 0.9 s: {a}");
    let mtbf = f(&a, "system_mtbf_secs");
    assert!((mtbf / (30.0 * 86400.0 / 64.0) - 1.0).abs() < 1e-9, "{a}");
    let want = daly_interval(commit, mtbf);
    assert!((f(&a, "interval_secs") - want).abs() < 1e-6 * want, "{a}");
    assert_eq!(a["checkpoint_now"], false, "{a}");

    // The model is kept: across a remount, without the flags, from the file too.
    m.remount();
    // A new daemon's clock starts at the system's again: bring it to where the last one
    // was, so the checkpoints it committed are not in its future.
    advance_daemon_clock(m.mnt(), moved);
    let b = advise(&mut m, &[]);
    assert_eq!(
        (b["nodes"].as_u64(), f(&b, "node_mtbf_secs")),
        (Some(64), 30.0 * 86400.0)
    );
    let text = fs::read_to_string(m.path(".ckptfs/advice")).expect("read advice");
    assert!(text.starts_with("checkpoint-now: no\n"), "{text}");
    assert!(
        text.contains("median of the last 3 checkpoint(s)"),
        "{text}"
    );
    let ls: Vec<String> = fs::read_dir(m.path(".ckptfs"))
        .expect("readdir")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(ls.contains(&"advice".to_string()), "{ls:?}");
    assert!(
        fs::write(m.path(".ckptfs/advice"), b"x").is_err(),
        "advice is read-only"
    );

    // A model whose interval (Daly, C = 1 s, M = 2 s: 1.39 s) passes within seconds:
    // the verdict turns to yes once the time since the last checkpoint reaches it.
    let mut c = advise(
        &mut m,
        &["--node-mtbf", "2s", "--nodes", "1", "--commit", "1s"],
    );
    assert!(
        (f(&c, "interval_secs") - daly_interval(1.0, 2.0)).abs() < 1e-9,
        "{c}"
    );
    if c["checkpoint_now"] == false {
        advance_daemon_clock(
            m.mnt(),
            Duration::from_secs_f64(f(&c, "next_in_secs") + 0.5),
        );
        c = advise(&mut m, &["--commit", "1s"]);
    }
    assert_eq!(c["checkpoint_now"], true, "{c}");
    assert_eq!(c["next_in_secs"], 0.0, "{c}");
    let text = fs::read_to_string(m.path(".ckptfs/advice")).expect("read advice");
    assert!(text.starts_with("checkpoint-now: yes\n"), "{text}");

    // The one-step look-ahead: a drop to a 10 s MTBF in 5 s, the next checkpoint (at a
    // 30-day node MTBF) far later: checkpoint before the drop.
    let d = advise(
        &mut m,
        &[
            "--node-mtbf",
            "300d",
            "--commit",
            "2s",
            "--drop-in",
            "5s",
            "--mtbf-after",
            "10s",
        ],
    );
    assert_eq!(d["lookahead"]["checkpoint_before_drop"], true, "{d}");
    assert!(f(&d, "next_in_secs") <= 3.0 + 1e-9, "{d}");

    // Offline, on the backing directory: the same inputs.
    m.unmount();
    let backing = m.backing().as_os_str().to_os_string();
    let (st, out, err) = m.ckptfs(&[OsStr::new("advise"), &backing]);
    assert!(st.success(), "{err}");
    assert!(out.contains("node MTBF 300.0 d / 1 node(s)"), "{out}");
    let (st, _, err) = m.ckptfs(&[
        OsStr::new("advise"),
        &backing,
        OsStr::new("--node-mtbf"),
        OsStr::new("5 parsecs"),
    ]);
    assert!(!st.success() && err.contains("unknown unit"), "{err}");
}
