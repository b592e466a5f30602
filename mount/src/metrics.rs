//! `ckptfs stats --prometheus`: the stats in the Prometheus text exposition format (0.0.4),
//! for node_exporter's textfile collector (`ckptfs stats /ckpt --prometheus >
//! /var/lib/node_exporter/ckptfs.prom.tmp && mv ... ckptfs.prom`).
//!
//! Every sample carries `space="<path>"`, so one node's several spaces do not collide.
//! Sizes are gauges in bytes; what only grows while a daemon runs (gc work, stage time) is
//! a counter (`_total`), which restarts at zero with the daemon, as Prometheus counters may.

use ckptfs_engine::targets::TargetsReport;
use ckptfs_engine::Stats;
use std::fmt::Write;

/// A label value with `\`, `"` and newlines escaped as the format requires.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value: integers as integers, non-finite floats spelled as the format spells them.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

struct Out {
    text: String,
    space: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP ckptfs_{name} {help}");
        let _ = writeln!(self.text, "# TYPE ckptfs_{name} {kind}");
    }

    fn sample(&mut self, name: &str, extra: &[(&str, &str)], v: f64) {
        let mut labels = format!("space=\"{}\"", self.space);
        for (k, x) in extra {
            let _ = write!(labels, ",{k}=\"{}\"", label(x));
        }
        let _ = writeln!(self.text, "ckptfs_{name}{{{labels}}} {}", value(v));
    }
}

const G: &str = "gauge";
const C: &str = "counter";

/// The whole exposition for one space (and its storage targets, for a space over several).
pub fn prometheus(
    s: &Stats,
    targets: Option<&TargetsReport>,
    remote: Option<&serde_json::Value>,
    space: &str,
) -> String {
    let mut o = Out {
        text: String::new(),
        space: label(space),
    };
    for (name, kind, help, v) in single(s) {
        o.family(name, kind, help);
        if let Some(v) = v {
            o.sample(name, &[], v);
        }
    }
    if let Some(t) = targets {
        of_targets(&mut o, t);
    }
    of_stages(&mut o, s);
    if let Some(r) = remote {
        of_remote(&mut o, r);
    }
    o.text
}

/// The object-store tier of a mount that has one (`ckptfs remote`'s status).
fn of_remote(o: &mut Out, r: &serde_json::Value) {
    let n = |k: &str| r[k].as_f64().unwrap_or(0.0);
    let fetched = |k: &str| r["fetch"][k].as_f64().unwrap_or(0.0);
    let fams: [(&str, &str, &str, f64); 11] = [
        (
            "remote_head_seq",
            G,
            "Sequence number of the newest manifest the bucket holds (0: none).",
            n("head_seq"),
        ),
        (
            "remote_head_taken_seconds",
            G,
            "Unix time the snapshot of the bucket's newest manifest was taken.",
            n("head_taken_unix"),
        ),
        (
            "remote_behind_commits",
            G,
            "File commits made on this mount that the bucket does not hold yet.",
            n("behind_commits"),
        ),
        (
            "remote_behind_changes",
            G,
            "Namespace changes made on this mount that the bucket does not hold yet.",
            n("behind_changes"),
        ),
        (
            "remote_behind_seconds",
            G,
            "Seconds since the oldest change the bucket does not hold (0 when it holds all).",
            n("behind_seconds"),
        ),
        (
            "remote_pending_bytes",
            G,
            "Stored bytes the running upload still has to send.",
            n("pending_bytes"),
        ),
        (
            "remote_sent_bytes_total",
            C,
            "Bytes sent to the bucket since the mount.",
            n("sent_bytes"),
        ),
        (
            "remote_fetched_bytes_total",
            C,
            "Bytes of chunks held only by the bucket fetched since the mount (ranged reads).",
            fetched("fetched_bytes"),
        ),
        (
            "remote_fetch_requests_total",
            C,
            "Ranged reads of chunks held only by the bucket since the mount.",
            fetched("requests"),
        ),
        (
            "remote_uploads_total",
            C,
            "Manifests written to the bucket since the mount.",
            n("uploads"),
        ),
        (
            "remote_fenced",
            G,
            "1 when another node took the bucket prefix over: nothing more is uploaded.",
            if r["fenced"].is_string() { 1.0 } else { 0.0 },
        ),
    ];
    for (name, kind, help, v) in fams {
        o.family(name, kind, help);
        o.sample(name, &[], v);
    }
    o.family(
        "remote_error",
        G,
        "1 while the last try to upload failed (retrying with backoff).",
    );
    o.sample(
        "remote_error",
        &[],
        if r["last_error"].is_string() {
            1.0
        } else {
            0.0
        },
    );
}

/// The families of one sample each: (name, type, help, value). A ratio of nothing (no data)
/// has no sample: the family is there, the value absent.
fn single(s: &Stats) -> impl Iterator<Item = Sample> {
    space_samples(s).into_iter().chain(activity_samples(s))
}

/// (name, type, help, value) of a family of one sample.
type Sample = (&'static str, &'static str, &'static str, Option<f64>);

/// What the space holds: room, bytes by what would free them, dedup and compression.
fn space_samples(s: &Stats) -> [Sample; 21] {
    [
        (
            "reserved_bytes",
            G,
            "Bytes reserved for the space's data.",
            Some(s.reserved_bytes as f64),
        ),
        (
            "used_bytes",
            G,
            "Reserved bytes in use (segments not free).",
            Some(s.used_bytes as f64),
        ),
        (
            "free_bytes",
            G,
            "Reserved bytes free for new chunks.",
            Some(s.free_bytes as f64),
        ),
        (
            "reclaimable_bytes",
            G,
            "Used bytes holding no committed chunk (gc compacts them).",
            Some(s.reclaimable_bytes() as f64),
        ),
        (
            "live_bytes",
            G,
            "Stored bytes of chunks some current file references.",
            Some(s.split.live_bytes as f64),
        ),
        (
            "kept_revision_bytes",
            G,
            "Stored bytes of chunks only older kept revisions of present files reference.",
            Some(s.split.kept_revision_bytes as f64),
        ),
        (
            "trash_bytes",
            G,
            "Stored bytes of chunks only removed files' kept revisions reference (the trash, emptied when writers need room).",
            Some(s.split.trash_bytes as f64),
        ),
        (
            "trash_revisions",
            G,
            "Kept revisions of removed files.",
            Some(s.split.trash_revisions as f64),
        ),
        (
            "unreferenced_bytes",
            G,
            "Stored bytes of chunks no revision references (the next gc deletes them).",
            Some(s.split.unreferenced_bytes as f64),
        ),
        (
            "stored_bytes",
            G,
            "Bytes the committed chunks take in the space (after compression).",
            Some(s.stored_bytes as f64),
        ),
        (
            "logical_bytes",
            G,
            "Sum of the sizes of the current files.",
            Some(s.logical_bytes as f64),
        ),
        (
            "referenced_bytes",
            G,
            "Data bytes of all kept revisions (what would be stored without dedup).",
            Some(s.referenced_bytes as f64),
        ),
        (
            "chunk_bytes",
            G,
            "Uncompressed bytes of the distinct committed chunks.",
            Some(s.raw_chunk_bytes as f64),
        ),
        (
            "dedup_ratio",
            G,
            "Referenced bytes per distinct chunk byte (1 = no saving).",
            s.dedup_ratio(),
        ),
        (
            "compression_ratio",
            G,
            "Distinct chunk bytes per stored byte (1 = no saving).",
            s.compression_ratio(),
        ),
        ("chunks", G, "Distinct committed chunks.", Some(s.chunks as f64)),
        ("files", G, "Regular files.", Some(s.files as f64)),
        (
            "directories",
            G,
            "Directories (the root not counted).",
            Some(s.dirs as f64),
        ),
        (
            "revisions",
            G,
            "Kept revisions of all files.",
            Some(s.revisions as f64),
        ),
        (
            "failed",
            G,
            "1 when a backing write or sync failed and the space refuses writes until remounted.",
            Some(if s.failed { 1.0 } else { 0.0 }),
        ),
        (
            "backing_full",
            G,
            "1 while the backing filesystem has no room for the metadata table to grow and new data gets ENOSPC.",
            Some(if s.backing_full { 1.0 } else { 0.0 }),
        ),
    ]
}

/// What gc and the writers' carried chunks have done and hold.
fn activity_samples(s: &Stats) -> [Sample; 8] {
    [
        (
            "gc_runs_total",
            C,
            "gc runs (explicit, automatic and under space pressure) since the space was opened.",
            Some(s.gc.runs as f64),
        ),
        (
            "gc_revisions_dropped_total",
            C,
            "Revisions gc dropped since the space was opened.",
            Some(s.gc.revisions_dropped as f64),
        ),
        (
            "gc_freed_bytes_total",
            C,
            "Stored bytes of the chunks gc freed since the space was opened.",
            Some(s.gc.bytes_freed as f64),
        ),
        (
            "gc_copied_bytes_total",
            C,
            "Bytes gc copied to compact segments since the space was opened.",
            Some(s.gc.bytes_copied as f64),
        ),
        (
            "gc_seconds_total",
            C,
            "Seconds spent in gc since the space was opened.",
            Some(s.gc.seconds),
        ),
        (
            "carried_bytes",
            G,
            "Memory held by the unfinished last chunks of files being written (at most 64 MiB; beyond it they spill).",
            Some(s.carries.resident_bytes as f64),
        ),
        (
            "carried_spilled_bytes",
            G,
            "Bytes of unfinished last chunks in the spill file now (files written at once beyond what memory holds).",
            Some(s.carries.spilled_now_bytes as f64),
        ),
        (
            "carry_spills_total",
            C,
            "Unfinished last chunks written to the spill file since the space was opened.",
            Some(s.carries.spills as f64),
        ),
    ]
}

/// A space over targets: its redundancy, its metadata mirrors and one series per target.
fn of_targets(o: &mut Out, t: &TargetsReport) {
    o.family(
        "degraded",
        G,
        "1 while some data has less redundancy than the space's M+K (a failed target, or shards found unreadable or damaged and not repaired).",
    );
    o.sample("degraded", &[], if t.degraded() { 1.0 } else { 0.0 });
    o.family(
        "segments_lost",
        G,
        "Segments whose data fewer than M shards give back (too few left, or more damaged than the parity covers): lost data.",
    );
    o.sample("segments_lost", &[], t.segments_lost as f64);
    o.family(
        "lost_chunk_reads_total",
        C,
        "Reads of a chunk that no M shards gave back verified (EIO to the reader), since the daemon started.",
    );
    o.sample("lost_chunk_reads_total", &[], t.chunks_lost_reads as f64);
    if let Some(want) = crate::targets::mirrors_wanted(t) {
        o.family(
            "metadata_mirrors",
            G,
            "Targets holding a current mirror of the space's metadata (ckptfs recover rebuilds a lost backing directory from one); K+1 wanted, see metadata_mirrors_wanted.",
        );
        let have = t.targets.iter().filter(|x| x.metadata_mirror).count();
        o.sample("metadata_mirrors", &[], have as f64);
        o.family(
            "metadata_mirrors_wanted",
            G,
            "K+1: the metadata mirrors a space over targets keeps when enough targets are healthy.",
        );
        o.sample("metadata_mirrors_wanted", &[], want as f64);
    }
    type Get = fn(&ckptfs_engine::targets::TargetReport) -> f64;
    let per: [(&str, &str, &str, Get); 5] = [
        (
            "target_read_errors_total",
            C,
            "Failed reads of the target's shards since the space was opened.",
            |t| t.read_errors as f64,
        ),
        (
            "target_damaged_shards_total",
            C,
            "Shards on the target found holding damaged bytes since the space was opened.",
            |t| t.verify_errors as f64,
        ),
        (
            "target_repaired_blocks_total",
            C,
            "4 KiB blocks of the target's shards a repair rewrote since the space was opened.",
            |t| t.repaired_blocks as f64,
        ),
        (
            "target_suspect_shards",
            G,
            "The target's shards found unreadable or damaged and not repaired yet.",
            |t| t.suspect_shards as f64,
        ),
        (
            "target_up",
            G,
            "1 for a target in use and ok, 0 when failed, retired or degraded.",
            |t| if t.state == "ok" { 1.0 } else { 0.0 },
        ),
    ];
    for (name, kind, help, get) in per {
        o.family(name, kind, help);
        for tr in &t.targets {
            // No state label: a label that changes would start a new series.
            let idx = tr.index.to_string();
            o.sample(name, &[("target", &idx), ("path", &tr.path)], get(tr));
        }
    }
}

/// The data path's stages: wall and CPU seconds and bytes per stage.
fn of_stages(o: &mut Out, s: &Stats) {
    o.family(
        "stage_seconds_total",
        C,
        "Wall seconds per data-path stage since the space was opened, summed over threads.",
    );
    for st in &s.stages {
        o.sample("stage_seconds_total", &[("stage", &st.name)], st.seconds);
    }
    o.family(
        "stage_cpu_seconds_total",
        C,
        "Estimated CPU seconds per data-path stage since the space was opened, summed over \
         threads (sampled timings' thread CPU).",
    );
    for st in &s.stages {
        o.sample(
            "stage_cpu_seconds_total",
            &[("stage", &st.name)],
            st.cpu_seconds,
        );
    }
    o.family(
        "stage_bytes_total",
        C,
        "Bytes through each data-path stage since the space was opened.",
    );
    for st in &s.stages {
        o.sample("stage_bytes_total", &[("stage", &st.name)], st.bytes as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_values_are_escaped_as_the_format_requires() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(value(f64::NAN), "NaN");
        assert_eq!(value(f64::INFINITY), "+Inf");
        assert_eq!(value(3.0), "3");
        assert_eq!(value(0.25), "0.25");
    }

    #[test]
    fn every_family_has_help_type_and_samples_with_the_space() {
        let s = Stats {
            reserved_bytes: 1 << 30,
            stages: vec![ckptfs_engine::write::pipeline::StageTime {
                name: "hash".into(),
                seconds: 1.5,
                count: 3,
                bytes: 4096,
                ..Default::default()
            }],
            ..Stats::default()
        };
        let remote = serde_json::json!({
            "head_seq": 7, "behind_commits": 2, "behind_seconds": 1.5, "sent_bytes": 4096,
            "fenced": null, "last_error": "503 Slow Down",
        });
        let t = prometheus(&s, None, Some(&remote), "/ckpt");
        assert!(
            t.contains("ckptfs_remote_head_seq{space=\"/ckpt\"} 7\n"),
            "{t}"
        );
        assert!(
            t.contains("ckptfs_remote_behind_seconds{space=\"/ckpt\"} 1.5\n"),
            "{t}"
        );
        assert!(
            t.contains("ckptfs_remote_fenced{space=\"/ckpt\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("ckptfs_remote_error{space=\"/ckpt\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("ckptfs_reserved_bytes{space=\"/ckpt\"} 1073741824\n"),
            "{t}"
        );
        assert!(
            t.contains("ckptfs_stage_seconds_total{space=\"/ckpt\",stage=\"hash\"} 1.5\n"),
            "{t}"
        );
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split('{').next().unwrap();
            assert!(t.contains(&format!("# TYPE {name} ")), "{name} has no TYPE");
        }
    }
}
