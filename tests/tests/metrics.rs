//! `ckptfs stats --prometheus`, read back by a real parser of the format (the Python
//! prometheus_client's, from Debian's python3-prometheus-client, which `.ci/run` installs)
//! and compared with `stats --json` of the same space.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use ckptfs_tests::{pattern, TestMount};

/// Parses the exposition with prometheus_client and prints `name<TAB>labels-json<TAB>value`
/// per sample, and `#TYPE<TAB>family<TAB>type` per family.
const PARSE: &str = r##"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    print("#TYPE\t%s\t%s" % (fam.name, fam.type))
    for s in fam.samples:
        print("%s\t%s\t%r" % (s.name, json.dumps(s.labels, sort_keys=True), s.value))
"##;

/// A Python that has prometheus_client: Debian's (pyenv shims may shadow it on PATH).
fn parser_python() -> Option<&'static str> {
    ["/usr/bin/python3", "python3"].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import prometheus_client.parser"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

#[test]
fn prometheus_output_parses_and_matches_the_json_stats() {
    let Some(py) = parser_python() else {
        return ckptfs_tests::skip(
            "prometheus_output_parses_and_matches_the_json_stats",
            "prometheus_client",
            "no Python with prometheus_client (apt-get install python3-prometheus-client)",
        );
    };
    let mut m = TestMount::with_format_args("256M", &["--keep-revisions", "1"]);
    for i in 0..3u64 {
        fs::write(m.path("model.pt"), pattern(i, 3 << 20)).expect("write");
    }
    let g = m.gc(false);
    assert!(g.revisions_dropped >= 2, "keep-1 drops the older two: {g}");
    let mnt = m.mnt().to_path_buf();
    let text = m.ckptfs_ok(&["stats".as_ref(), mnt.as_os_str(), "--prometheus".as_ref()]);
    let s = m.stats();

    let mut child = Command::new(py)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("parser output");
    assert!(
        out.status.success(),
        "prometheus_client refused the output: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut types = BTreeMap::new();
    let mut samples: BTreeMap<(String, String), f64> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f[0] == "#TYPE" {
            types.insert(f[1].to_string(), f[2].to_string());
        } else {
            samples.insert((f[0].to_string(), f[1].to_string()), f[2].parse().unwrap());
        }
    }
    let space = format!("{{\"space\": \"{}\"}}", mnt.display());
    let get = |name: &str| -> f64 {
        *samples
            .get(&(name.to_string(), space.clone()))
            .unwrap_or_else(|| panic!("no sample {name}{space} in:\n{text}"))
    };
    assert_eq!(get("ckptfs_stored_bytes"), s.stats.stored_bytes as f64);
    assert_eq!(get("ckptfs_logical_bytes"), s.stats.logical_bytes as f64);
    assert_eq!(get("ckptfs_reserved_bytes"), s.stats.reserved_bytes as f64);
    assert_eq!(get("ckptfs_revisions"), s.stats.revisions as f64);
    assert_eq!(get("ckptfs_failed"), 0.0);
    assert_eq!(get("ckptfs_backing_full"), 0.0);
    let dedup = s.dedup_ratio.expect("the files hold data: a dedup ratio");
    assert!((get("ckptfs_dedup_ratio") - dedup).abs() < 1e-9);
    // The parser strips `_total` from a counter's family name and keeps it on the sample.
    assert_eq!(
        types.get("ckptfs_gc_runs").map(String::as_str),
        Some("counter")
    );
    assert_eq!(get("ckptfs_gc_runs_total"), s.stats.gc.runs as f64);
    assert!(s.stats.gc.runs >= 1, "the gc above counts: {s}");
    assert_eq!(
        get("ckptfs_gc_revisions_dropped_total"),
        s.stats.gc.revisions_dropped as f64
    );
    assert_eq!(
        types.get("ckptfs_free_bytes").map(String::as_str),
        Some("gauge")
    );
    let hash = format!("{{\"space\": \"{}\", \"stage\": \"hash\"}}", mnt.display());
    assert!(
        samples.contains_key(&("ckptfs_stage_seconds_total".to_string(), hash)),
        "no hash stage in:\n{text}"
    );
}

/// A read's data going back to the kernel counts in the `reply` stage: every byte of a
/// cold read, with CPU (the copy out of the chunks and the kernel's copy of the reply).
/// Before it, the read path's stages left out the FUSE threads' part of a restart.
#[test]
fn the_reply_stage_counts_every_byte_read_and_its_cpu() {
    let mut m = TestMount::with_format_args("256M", &[]);
    let data = pattern(11, 64 << 20);
    fs::write(m.path("ckpt.bin"), &data).expect("write");
    // Read back from the space, not from the writer's open state.
    m.remount();
    let mnt = m.mnt().to_path_buf();
    let before = m.stats_json_of(&mnt);
    let got = fs::read(m.path("ckpt.bin")).expect("read");
    assert!(got == data, "read back other bytes");
    // The stage counts a reply once it has been sent, just after the kernel has it: the
    // reader can return first (seen once in CI: 63 of 64 MiB counted). Wait for the count
    // (the event), bounded, rather than read it once.
    let reply_bytes = |s: &serde_json::Value| s["stages"]["reply"]["bytes"].as_f64();
    let want = reply_bytes(&before).unwrap_or(0.0) + (64 << 20) as f64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut after = m.stats_json_of(&mnt);
    while reply_bytes(&after).is_some_and(|b| b < want) && std::time::Instant::now() < deadline {
        std::thread::yield_now();
        after = m.stats_json_of(&mnt);
    }
    let d = |what: &str| {
        let v = |s: &serde_json::Value| {
            s["stages"]["reply"][what]
                .as_f64()
                .unwrap_or_else(|| panic!("no reply stage {what} in {s}"))
        };
        v(&after) - v(&before)
    };
    assert!(
        d("bytes") >= (64 << 20) as f64 && d("bytes") <= (128 << 20) as f64,
        "the replies' bytes: {}",
        d("bytes")
    );
    assert!(d("count") >= 16.0, "replies counted: {}", d("count"));
    assert!(
        d("cpu_seconds") > 0.0,
        "the copies took CPU: {}",
        d("cpu_seconds")
    );
}

/// Every FUSE request dispatched counts in the `dispatch` stage, with a CPU estimate from the
/// same samples as `transport`, less what the stages inside the dispatch counted: the FUSE
/// threads' CPU that no stage held before (a tenth of a cold read's daemon CPU).
#[test]
fn the_dispatch_stage_counts_every_request_and_its_own_cpu() {
    let d = stage_deltas_of_64k_writes(8);
    assert!(
        d("dispatch", "count") >= 1024.0,
        "one count per request: {}",
        d("dispatch", "count")
    );
    assert!(
        d("dispatch", "sampled_count") >= 32.0,
        "sampled dispatches: {}",
        d("dispatch", "sampled_count")
    );
    assert!(
        d("dispatch", "cpu_seconds") > 0.0,
        "the dispatches took CPU of their own: {}",
        d("dispatch", "cpu_seconds")
    );
    // Samples of both stages are the same requests: as many dispatches as reads sampled
    // (the requests of `stats` itself aside).
    assert!(
        (d("dispatch", "sampled_count") - d("transport", "sampled_count")).abs() <= 4.0,
        "dispatch samples {} against transport's {}",
        d("dispatch", "sampled_count"),
        d("transport", "sampled_count")
    );
}

/// A fresh mount's `stats --json` stages before and after 64 MiB of `pattern(seed)` written
/// in 64 KiB writes (1024 write requests, 64 or more of them sampled): a function of stage
/// name and field (`count`, `cpu_seconds`, ...) giving the difference.
fn stage_deltas_of_64k_writes(seed: u64) -> impl Fn(&str, &str) -> f64 {
    let mut m = TestMount::with_format_args("256M", &[]);
    let mnt = m.mnt().to_path_buf();
    let before = m.stats_json_of(&mnt);
    let data = pattern(seed, 64 << 20);
    let mut f = fs::File::create(m.path("ckpt.bin")).expect("create");
    for piece in data.chunks(64 << 10) {
        f.write_all(piece).expect("write");
    }
    drop(f);
    let after = m.stats_json_of(&mnt);
    move |name, what| {
        let of = |v: &serde_json::Value| {
            v["stages"][name][what]
                .as_f64()
                .unwrap_or_else(|| panic!("no {name} stage {what} in {v}"))
        };
        of(&after) - of(&before)
    }
}

/// Every FUSE request read from the kernel counts in the `transport` stage, with a CPU
/// estimate from the FUSE threads' samples (one read in 16 per thread): the stage that makes
/// the stages' CPU add up to the daemon's. Before it, `stats` had no such stage.
#[test]
fn the_transport_stage_counts_every_request_and_its_cpu() {
    let deltas = stage_deltas_of_64k_writes(7);
    let d = |what: &str| deltas("transport", what);
    assert!(
        d("count") >= 1024.0,
        "one count per request: {}",
        d("count")
    );
    assert!(
        d("bytes") >= (64 << 20) as f64,
        "the requests' bytes: {}",
        d("bytes")
    );
    assert!(
        d("sampled_count") >= 32.0,
        "sampled reads: {}",
        d("sampled_count")
    );
    assert!(
        d("cpu_seconds") > 0.0,
        "the copies took CPU: {}",
        d("cpu_seconds")
    );
}
