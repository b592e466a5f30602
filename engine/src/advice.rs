//! When should a job checkpoint next? The pure core of `ckptfs advise` (in the spirit of
//! SCR_Need_checkpoint): optimum intervals, a failure-rate estimate, the resulting advice and
//! a one-step look-ahead for a predicted availability drop. No I/O and no clock reads: every
//! time is passed in, so the advice is deterministic and testable. Also a small failure
//! simulator and a seeded exponential failure trace, for tests and benchmarks.

use std::fmt;

/// Young's first-order optimum interval between checkpoints, `sqrt(2 C M)` (Young 1974),
/// for commit time `C` and system MTBF `M`, both in seconds and positive.
pub(crate) fn young_interval(commit_secs: f64, mtbf_secs: f64) -> f64 {
    (2.0 * commit_secs * mtbf_secs).sqrt()
}

/// Daly's higher-order estimate of the optimum compute time between checkpoints (Daly, "A
/// higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 2006):
///
/// ```text
/// T = sqrt(2 C M) * (1 + (1/3) sqrt(C / 2M) + (1/9) (C / 2M)) - C    if C < 2M
/// T = M                                                              otherwise
/// ```
///
/// for commit time `C` and system MTBF `M`, both in seconds and positive.
pub fn daly_interval(commit_secs: f64, mtbf_secs: f64) -> f64 {
    let (c, m) = (commit_secs, mtbf_secs);
    if c < 2.0 * m {
        let x = c / (2.0 * m);
        young_interval(c, m) * (1.0 + x.sqrt() / 3.0 + x / 9.0) - c
    } else {
        m
    }
}

/// Expected fraction of wall-clock time lost at compute interval `T`, to first order:
/// `C/(T+C) + (T+C)/(2M) + R/M` — the checkpoint overhead, half a period of rework per
/// failure and one restart per failure (all in seconds). Meaningful while well below 1.
pub(crate) fn waste_fraction(interval: f64, commit: f64, restart: f64, mtbf: f64) -> f64 {
    let period = interval + commit;
    commit / period + period / (2.0 * mtbf) + restart / mtbf
}

/// An input the advice cannot be computed from.
#[derive(Debug, Clone, PartialEq)]
pub enum AdviceError {
    /// The failure model counts no nodes.
    NoNodes,
    /// A number out of range: what it is, its value, and the range it must lie in.
    OutOfRange(&'static str, f64, &'static str),
}

impl fmt::Display for AdviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdviceError::NoNodes => write!(f, "the failure model needs at least one node"),
            AdviceError::OutOfRange(what, v, range) => write!(f, "{what} is {v}, expected {range}"),
        }
    }
}

impl std::error::Error for AdviceError {}

/// `value` if finite and positive (or zero, when `zero_ok`).
fn check(what: &'static str, value: f64, zero_ok: bool) -> Result<f64, AdviceError> {
    match (value.is_finite(), zero_ok) {
        (true, false) if value > 0.0 => Ok(value),
        (true, true) if value >= 0.0 => Ok(value),
        (_, false) => Err(AdviceError::OutOfRange(what, value, "a finite number > 0")),
        (_, true) => Err(AdviceError::OutOfRange(what, value, "a finite number >= 0")),
    }
}

/// What is known about failures: a declared per-node MTBF, the node count, the failures
/// observed so far over how long, and the time a restart takes.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureModel {
    /// Declared mean time between failures of one node, in seconds.
    pub node_mtbf_secs: f64,
    /// Nodes the job runs on; any one failing fails the job.
    pub nodes: u64,
    /// Job failures observed during `observed_secs`.
    pub observed_failures: u64,
    /// Wall-clock seconds of observation (0 when nothing was observed).
    pub observed_secs: f64,
    /// Seconds from a failure until the job computes again (0 to ignore).
    pub restart_secs: f64,
}

impl FailureModel {
    /// A model from the declared MTBF alone: nothing observed, restarts free.
    pub fn new(node_mtbf_secs: f64, nodes: u64) -> Self {
        FailureModel {
            node_mtbf_secs,
            nodes,
            observed_failures: 0,
            observed_secs: 0.0,
            restart_secs: 0.0,
        }
    }

    /// The system MTBF in seconds: the posterior mean failure rate of a gamma prior centred
    /// on `node_mtbf / nodes`, updated with the Poisson observations, inverted.
    pub fn system_mtbf_secs(&self) -> Result<f64, AdviceError> {
        let node_mtbf = check("node MTBF (s)", self.node_mtbf_secs, false)?;
        if self.nodes == 0 {
            return Err(AdviceError::NoNodes);
        }
        let observed = check("observed time (s)", self.observed_secs, true)?;
        check("restart time (s)", self.restart_secs, true)?;
        let prior_mtbf = node_mtbf / self.nodes as f64;
        // The declared MTBF counts as one failure's worth of evidence: a few observed
        // failures move the estimate, many dominate it, and with none it is the prior.
        let prior_events = 1.0;
        let rate =
            (prior_events + self.observed_failures as f64) / (prior_events * prior_mtbf + observed);
        check("system MTBF (s)", 1.0 / rate, false)
    }
}

/// A prediction that the system MTBF drops to `mtbf_after_secs` in `in_secs` seconds (a
/// node reported degraded, a maintenance window, a failure predictor's warning).
#[derive(Debug, Clone, PartialEq)]
pub struct AvailabilityDrop {
    /// Seconds from now until the drop.
    pub in_secs: f64,
    /// System MTBF after the drop, in seconds.
    pub mtbf_after_secs: f64,
}

/// The one-step look-ahead's verdict on a predicted availability drop.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookahead {
    /// Take an extra checkpoint that completes by the drop (starting now if the drop is
    /// nearer than one commit).
    pub checkpoint_before_drop: bool,
    /// Why, in words, with the numbers compared.
    pub reason: String,
    /// The interval to use once the drop has happened (Daly at the lower MTBF).
    pub interval_after_secs: f64,
}

/// The advice for a job: its interval, whether to checkpoint now, and the figures behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// Compute seconds between checkpoints (Daly's estimate).
    pub interval_secs: f64,
    /// Young's first-order interval, for comparison.
    pub young_secs: f64,
    /// The system MTBF the interval was computed for.
    pub system_mtbf_secs: f64,
    /// Seconds one checkpoint takes to commit.
    pub commit_secs: f64,
    /// Seconds since the last checkpoint completed.
    pub since_last_commit_secs: f64,
    /// Checkpoint now: the interval has elapsed, or the look-ahead wants a checkpoint that
    /// must start now to finish by the drop.
    pub checkpoint_now: bool,
    /// Seconds until the next checkpoint should start (0 when `checkpoint_now`).
    pub next_in_secs: f64,
    /// Expected seconds lost per hour at the advised interval (see [`waste_fraction`]).
    pub waste_per_hour_secs: f64,
    /// The verdict on a predicted availability drop, when one was given.
    pub lookahead: Option<Lookahead>,
}

/// Advises a job that commits in `commit_secs` and last committed `since_last_commit_secs`
/// ago, given the failure model and optionally a predicted availability drop.
pub fn advise(
    commit_secs: f64,
    model: &FailureModel,
    since_last_commit_secs: f64,
    predicted_drop: Option<AvailabilityDrop>,
) -> Result<Advice, AdviceError> {
    let c = check("commit time (s)", commit_secs, false)?;
    let since = check("time since last commit (s)", since_last_commit_secs, true)?;
    let mtbf = model.system_mtbf_secs()?;
    let interval = daly_interval(c, mtbf);
    let mut checkpoint_now = since >= interval;
    let mut next_in = (interval - since).max(0.0);
    let lookahead = match predicted_drop {
        Some(drop) => {
            let l = look_ahead(c, since, next_in, &drop)?;
            if l.checkpoint_before_drop {
                // Started one commit ahead of the drop, the extra checkpoint secures the most
                // work while still finishing in time.
                let start = (drop.in_secs - c).max(0.0);
                next_in = next_in.min(start);
                checkpoint_now |= start == 0.0;
            }
            Some(l)
        }
        None => None,
    };
    Ok(Advice {
        interval_secs: interval,
        young_secs: young_interval(c, mtbf),
        system_mtbf_secs: mtbf,
        commit_secs: c,
        since_last_commit_secs: since,
        checkpoint_now,
        next_in_secs: next_in,
        waste_per_hour_secs: 3600.0 * waste_fraction(interval, c, model.restart_secs, mtbf),
        lookahead,
    })
}

/// One step of look-ahead (after failure-aware checkpointing, Ren et al.). If the scheduled
/// checkpoint comes before the drop, the schedule already protects the work. Otherwise the
/// window from the drop to the scheduled checkpoint runs at the higher failure rate; an extra
/// checkpoint completing at the drop would secure the work done until then (`since` plus
/// the time to the drop, less the commit), which a failure in that window would otherwise
/// lose. Take it when that expected loss, `P(failure in window) * secured work`, exceeds
/// the commit time it costs. The job re-plans at the lower MTBF after the drop either way.
fn look_ahead(
    c: f64,
    since: f64,
    next_in: f64,
    drop: &AvailabilityDrop,
) -> Result<Lookahead, AdviceError> {
    let d = check("time until the availability drop (s)", drop.in_secs, true)?;
    let mtbf_after = check("MTBF after the drop (s)", drop.mtbf_after_secs, false)?;
    let interval_after = daly_interval(c, mtbf_after);
    if next_in <= d {
        return Ok(Lookahead {
            checkpoint_before_drop: false,
            reason: format!(
                "the scheduled checkpoint (in {next_in:.0} s) comes before the drop (in {d:.0} s)"
            ),
            interval_after_secs: interval_after,
        });
    }
    let p_fail = 1.0 - (-(next_in - d) / mtbf_after).exp();
    let secured = since + (d - c).max(0.0);
    let loss = p_fail * secured;
    let take = loss > c;
    let cmp = if take { ">" } else { "<=" };
    Ok(Lookahead {
        checkpoint_before_drop: take,
        reason: format!(
            "expected rework if waiting: P(failure) {p_fail:.3} x {secured:.0} s = {loss:.0} s \
             {cmp} {c:.0} s commit"
        ),
        interval_after_secs: interval_after,
    })
}

#[cfg(test)]
/// Wall-clock seconds to finish `work_secs` of computation that checkpoints after every
/// `interval_secs` of computation (not after the last piece: the job ends there). A
/// checkpoint takes `commit_secs`; a failure at a time in `failure_times` (absolute wall
/// clock, sorted) loses the work since the last completed checkpoint, including a commit in
/// progress, and costs `restart_secs`, during which further failures restart the restart.
/// Failures after the job ends are ignored. A non-positive or NaN interval never finishes.
pub(crate) fn simulate(
    interval_secs: f64,
    commit_secs: f64,
    restart_secs: f64,
    failure_times: &[f64],
    work_secs: f64,
) -> f64 {
    if interval_secs.is_nan() || interval_secs <= 0.0 {
        return f64::INFINITY;
    }
    let mut failures = failure_times.iter().copied().peekable();
    let (mut t, mut done) = (0.0_f64, 0.0_f64);
    while done < work_secs {
        let piece = interval_secs.min(work_secs - done);
        let last = done + piece >= work_secs;
        let end = t + piece + if last { 0.0 } else { commit_secs };
        // Failures while the job was down (restarting) were consumed below, so the next one
        // is never before `t`.
        match failures.next_if(|&f| f < end) {
            Some(f) => {
                t = f + restart_secs;
                while let Some(f) = failures.next_if(|&f| f < t) {
                    t = f + restart_secs;
                }
            }
            None => {
                t = end;
                done += piece;
            }
        }
    }
    t
}

#[cfg(test)]
/// splitmix64 (Steele, Lea and Flood 2014): tiny, seedable with any value, and good enough
/// for failure traces; it keeps the engine off an extra dependency for tests.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
/// Failure times (sorted, absolute seconds) of a Poisson process with mean gap `mtbf_secs`,
/// up to `horizon_secs`, from `seed`: the same seed gives the same trace. Empty when either
/// argument is not a positive finite number.
pub(crate) fn exponential_trace(seed: u64, mtbf_secs: f64, horizon_secs: f64) -> Vec<f64> {
    let mut out = Vec::new();
    if !(mtbf_secs.is_finite() && mtbf_secs > 0.0 && horizon_secs.is_finite() && horizon_secs > 0.0)
    {
        return out;
    }
    let mut state = seed;
    let mut t = 0.0;
    loop {
        // Uniform in (0, 1], so the logarithm is finite.
        let u = ((splitmix64(&mut state) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        t += -mtbf_secs * u.ln();
        if t >= horizon_secs {
            return out;
        }
        out.push(t);
    }
}

/// Revisions whose write windows come closer than this belong to one checkpoint: ranks of
/// one job write their files together, and one process writes its files back to back.
pub(crate) const CHECKPOINT_GAP_SECS: f64 = 2.0;
/// What counts as a checkpoint: a group of revisions (above) holding at least this many
/// bytes. A log line, a `done` marker or a small config file written now and then commits
/// in milliseconds; counted, they made the measured commit time fall to 0.0 s and the advice
/// to checkpoint every few seconds (issue 36). Checkpoints smaller than this are not
/// measured: give `--commit` for them.
pub(crate) const CHECKPOINT_MIN_BYTES: u64 = 1 << 20;
/// Above this expected waste (checkpoint overhead, rework and restarts, as a fraction of
/// the run at the advised interval), the advice warns that checkpointing costs more than the
/// failure model allows.
pub(crate) const WASTE_WARN_FRACTION: f64 = 0.5;
/// The commit time is the median of at most this many recent checkpoints.
pub(crate) const COMMIT_SAMPLES: usize = 5;
/// At most this many of the newest revisions are read to find the recent checkpoints (the
/// bound on the advice's cost: one checkpoint of more files than this is measured short).
pub(crate) const REVISIONS_SCANNED: usize = 4096;

/// The failure model a space keeps for `ckptfs advise` (its config; 0 = not given).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdviceConfig {
    pub node_mtbf_secs: u64,
    pub nodes: u64,
    /// 0: take the restart to cost what a commit costs (reading the checkpoint back).
    pub restart_secs: u64,
}

/// One checkpoint as the revisions show it: from the first write of its first file to the
/// commit of its last.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    pub start_unix: f64,
    pub end_unix: f64,
    /// Revisions committed in it (files, plus fsync points).
    pub revisions: u64,
    /// Their bytes (file sizes).
    #[serde(default)]
    pub bytes: u64,
}

impl Checkpoint {
    pub fn secs(&self) -> f64 {
        self.end_unix - self.start_unix
    }
}

/// Groups revisions, given as (commit time, seconds spent writing, bytes), into
/// checkpoints: windows `[commit - write, commit]` closer than `gap` seconds merge. Oldest
/// first.
pub fn checkpoints(revisions: &[(f64, f64, u64)], gap: f64) -> Vec<Checkpoint> {
    let mut w: Vec<(f64, f64, u64)> = revisions
        .iter()
        .filter(|(end, secs, _)| end.is_finite() && secs.is_finite() && *secs >= 0.0)
        .map(|&(end, secs, bytes)| (end - secs, end, bytes))
        .collect();
    w.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<Checkpoint> = Vec::new();
    for (start, end, bytes) in w {
        match out.last_mut() {
            Some(c) if start <= c.end_unix + gap => {
                c.end_unix = c.end_unix.max(end);
                c.revisions += 1;
                c.bytes += bytes;
            }
            _ => out.push(Checkpoint {
                start_unix: start,
                end_unix: end,
                revisions: 1,
                bytes,
            }),
        }
    }
    out
}

/// What the advice is computed from, as the space knows it: gathered by the daemon (or an
/// offline open) and turned into advice by [`report`] wherever it is asked for.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdviceInputs {
    pub now_unix: f64,
    /// The newest checkpoints, oldest first (at most `COMMIT_SAMPLES`).
    pub recent: Vec<Checkpoint>,
    pub config: AdviceConfig,
    /// Storage targets that failed (failed or retired) since the space was formatted.
    pub target_failures: u64,
    /// Seconds since the space was formatted.
    pub observed_secs: f64,
    /// Groups of commits too small to be checkpoints (`CHECKPOINT_MIN_BYTES`) among the
    /// revisions read, not measured.
    #[serde(default)]
    pub small_commits_ignored: u64,
}

impl AdviceInputs {
    /// Inputs from `revisions` (commit time, write seconds, bytes) at `now`: the newest
    /// `COMMIT_SAMPLES` groups that look like checkpoints (`CHECKPOINT_MIN_BYTES`).
    pub fn new(
        now_unix: f64,
        revisions: &[(f64, f64, u64)],
        config: AdviceConfig,
        target_failures: u64,
        observed_secs: f64,
    ) -> Self {
        let all = checkpoints(revisions, CHECKPOINT_GAP_SECS);
        let groups = all.len() as u64;
        let mut recent: Vec<Checkpoint> = all
            .into_iter()
            .filter(|c| c.bytes >= CHECKPOINT_MIN_BYTES)
            .collect();
        let small_commits_ignored = groups - recent.len() as u64;
        let drop = recent.len().saturating_sub(COMMIT_SAMPLES);
        recent.drain(..drop);
        AdviceInputs {
            now_unix,
            recent,
            config,
            target_failures,
            observed_secs: observed_secs.max(0.0),
            small_commits_ignored,
        }
    }
}

/// Values given for this one question, over the space's config and measurements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    pub commit_secs: Option<f64>,
    pub restart_secs: Option<f64>,
    pub node_mtbf_secs: Option<f64>,
    pub nodes: Option<u64>,
    pub drop: Option<AvailabilityDrop>,
}

/// The look-ahead's verdict with the prediction it judged.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LookaheadReport {
    pub drop_in_secs: f64,
    pub mtbf_after_secs: f64,
    pub checkpoint_before_drop: bool,
    pub reason: String,
    pub interval_after_secs: f64,
}

/// The advice and every input it used, with where each came from.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdviceReport {
    pub checkpoint_now: bool,
    pub next_in_secs: f64,
    pub interval_secs: f64,
    pub young_secs: f64,
    pub waste_per_hour_secs: f64,
    pub system_mtbf_secs: f64,
    pub commit_secs: f64,
    /// "measured: median of the last N checkpoints" or "given".
    pub commit_source: String,
    pub restart_secs: f64,
    pub restart_source: String,
    /// None when no checkpoint is recorded (the advice then counts from now).
    pub since_last_commit_secs: Option<f64>,
    pub node_mtbf_secs: f64,
    pub nodes: u64,
    pub observed_failures: u64,
    pub observed_secs: f64,
    pub recent: Vec<Checkpoint>,
    pub lookahead: Option<LookaheadReport>,
    /// Groups of small commits not counted as checkpoints (`CHECKPOINT_MIN_BYTES`).
    #[serde(default)]
    pub small_commits_ignored: u64,
    /// Said plainly when checkpointing costs more than the failure model allows: a commit
    /// as long as two MTBFs, or an expected waste above `WASTE_WARN_FRACTION`.
    #[serde(default)]
    pub warning: Option<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The advice for `inputs`, with `o` taking precedence. Errors say what is missing.
pub fn report(inputs: &AdviceInputs, o: &Overrides) -> Result<AdviceReport, String> {
    let node_mtbf = o
        .node_mtbf_secs
        .or((inputs.config.node_mtbf_secs > 0).then_some(inputs.config.node_mtbf_secs as f64))
        .ok_or(
            "no failure model: give --node-mtbf (and --nodes) once; they are kept in the \
             space's config",
        )?;
    let nodes = o
        .nodes
        .or((inputs.config.nodes > 0).then_some(inputs.config.nodes))
        .unwrap_or(1);
    // A commit shorter than a millisecond (an empty checkpoint) is measured as one.
    let measured: Vec<f64> = inputs.recent.iter().map(|c| c.secs().max(1e-3)).collect();
    let (commit, commit_source) = match (o.commit_secs, measured.is_empty()) {
        (Some(c), _) => (c, "given".to_string()),
        (None, false) => (
            median(measured.clone()),
            format!(
                "measured: median of the last {} checkpoint(s) ({})",
                measured.len(),
                measured
                    .iter()
                    .map(|s| format!("{s:.1} s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        (None, true) => {
            return Err(
                "no checkpoint measured in this space yet (the commit time comes from \
                 how long recent checkpoints took to write): write one, or give --commit"
                    .into(),
            )
        }
    };
    let (restart, restart_source) = match (o.restart_secs, inputs.config.restart_secs) {
        (Some(r), _) => (r, "given".to_string()),
        (None, 0) => (
            commit,
            "assumed equal to the commit time (reading the checkpoint back)".to_string(),
        ),
        (None, r) => (r as f64, "config".to_string()),
    };
    let since = inputs
        .recent
        .last()
        .map(|c| (inputs.now_unix - c.end_unix).max(0.0));
    // The space sees storage targets fail, not nodes: the declared node failure rate stands
    // as given, and the targets' observed failure rate is added to it. That rate's estimate
    // starts from one system MTBF of failure-free observation, so one early failure raises
    // the rate without swamping it, and a run without target failures adds nothing (it is
    // no evidence that the nodes are reliable).
    let declared = FailureModel::new(node_mtbf, nodes)
        .system_mtbf_secs()
        .map_err(|e| e.to_string())?;
    let target_rate = inputs.target_failures as f64 / (inputs.observed_secs + declared);
    let system_mtbf = 1.0 / (1.0 / declared + target_rate);
    let model = FailureModel {
        restart_secs: restart,
        ..FailureModel::new(system_mtbf, 1)
    };
    let a =
        advise(commit, &model, since.unwrap_or(0.0), o.drop.clone()).map_err(|e| e.to_string())?;
    let waste = a.waste_per_hour_secs / 3600.0;
    let warning = if commit >= 2.0 * a.system_mtbf_secs {
        Some(format!(
            "a checkpoint takes {} but the job is expected to fail every {} (system MTBF): \
             most checkpoints will not finish before a failure and no interval helps; \
             checkpoint less data, write to faster storage, or run on fewer nodes",
            human_secs(commit),
            human_secs(a.system_mtbf_secs)
        ))
    } else if waste >= WASTE_WARN_FRACTION {
        Some(format!(
            "checkpointing costs more than the failure model allows: even at the best interval \
             {:.0}% of the run goes to checkpoints, rework and restarts (a checkpoint takes {}, \
             the system fails every {} on average); checkpoint less data, write to faster \
             storage, or run on fewer nodes",
            (waste * 100.0).min(100.0),
            human_secs(commit),
            human_secs(a.system_mtbf_secs)
        ))
    } else {
        None
    };
    Ok(AdviceReport {
        checkpoint_now: a.checkpoint_now,
        next_in_secs: a.next_in_secs,
        interval_secs: a.interval_secs,
        young_secs: a.young_secs,
        waste_per_hour_secs: a.waste_per_hour_secs,
        system_mtbf_secs: a.system_mtbf_secs,
        commit_secs: commit,
        commit_source,
        restart_secs: restart,
        restart_source,
        since_last_commit_secs: since,
        node_mtbf_secs: node_mtbf,
        nodes,
        observed_failures: inputs.target_failures,
        observed_secs: inputs.observed_secs,
        recent: inputs.recent.clone(),
        lookahead: a
            .lookahead
            .zip(o.drop.clone())
            .map(|(l, d)| LookaheadReport {
                drop_in_secs: d.in_secs,
                mtbf_after_secs: d.mtbf_after_secs,
                checkpoint_before_drop: l.checkpoint_before_drop,
                reason: l.reason,
                interval_after_secs: l.interval_after_secs,
            }),
        small_commits_ignored: inputs.small_commits_ignored,
        warning,
    })
}

/// Seconds as people read them: `42 s`, `17.5 min`, `3.2 h`, `4.1 d`, `5.0 y`.
pub(crate) fn human_secs(s: f64) -> String {
    match s {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 2.0 * 3600.0 => format!("{:.1} min", s / 60.0),
        s if s < 2.0 * 86400.0 => format!("{:.1} h", s / 3600.0),
        s if s < 2.0 * 365.0 * 86400.0 => format!("{:.1} d", s / 86400.0),
        s => format!("{:.1} y", s / (365.0 * 86400.0)),
    }
}

/// The advice as text, for `ckptfs advise` and `/.ckptfs/advice`. The first line is the
/// verdict, `checkpoint-now: yes` or `no`, for job scripts to grep.
pub fn render(r: &AdviceReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let h = human_secs;
    // Both forms where the human one rounds: "3.2 min (192 s)", but "42 s".
    let hs = |s: f64| match s < 120.0 {
        true => h(s),
        false => format!("{} ({s:.0} s)", h(s)),
    };
    let _ = writeln!(
        o,
        "checkpoint-now: {}",
        if r.checkpoint_now { "yes" } else { "no" }
    );
    if let Some(w) = &r.warning {
        let _ = writeln!(o, "WARNING: {w}");
    }
    let _ = writeln!(o, "next checkpoint in: {}", hs(r.next_in_secs));
    let _ = writeln!(
        o,
        "interval: {} (Daly; Young's: {})",
        hs(r.interval_secs),
        hs(r.young_secs)
    );
    // The first-order estimate is meaningful only well below the whole run.
    match r.waste_per_hour_secs < 3600.0 {
        true => {
            let _ = writeln!(
                o,
                "expected waste: {:.0} s per hour ({:.1}%) at this interval",
                r.waste_per_hour_secs,
                r.waste_per_hour_secs / 36.0
            );
        }
        false => {
            let _ = writeln!(
                o,
                "expected waste: all of the run (the first-order estimate exceeds 100%)"
            );
        }
    }
    let _ = writeln!(
        o,
        "since last checkpoint: {}",
        r.since_last_commit_secs
            .map_or("none recorded (counting from now)".to_string(), hs)
    );
    let _ = writeln!(o, "inputs:");
    let _ = writeln!(
        o,
        "  commit time: {:.1} s, {}",
        r.commit_secs, r.commit_source
    );
    if r.small_commits_ignored > 0 {
        let _ = writeln!(
            o,
            "  ({} group(s) of commits under {} KiB not counted as checkpoints)",
            r.small_commits_ignored,
            CHECKPOINT_MIN_BYTES >> 10
        );
    }
    let _ = writeln!(
        o,
        "  restart time: {:.1} s, {}",
        r.restart_secs, r.restart_source
    );
    let _ = writeln!(
        o,
        "  system MTBF: {} = node MTBF {} / {} node(s){}",
        hs(r.system_mtbf_secs),
        h(r.node_mtbf_secs),
        r.nodes,
        match r.observed_failures {
            0 => format!(", no target failure in {}", h(r.observed_secs)),
            n => format!(
                ", with the rate of {n} target failure(s) in {} added",
                h(r.observed_secs)
            ),
        }
    );
    if let Some(l) = &r.lookahead {
        let _ = writeln!(
            o,
            "look-ahead: MTBF drops to {} in {}: {} ({}); interval after the drop {}",
            h(l.mtbf_after_secs),
            h(l.drop_in_secs),
            if l.checkpoint_before_drop {
                "checkpoint before the drop"
            } else {
                "no extra checkpoint"
            },
            l.reason,
            h(l.interval_after_secs)
        );
    }
    o
}

/// Parses a duration: a number with an optional unit, `s` (the default), `m`/`min`, `h`,
/// `d`, `w`, `y` (365 days): `90`, `45s`, `30m`, `12h`, `5y`, `1.5d`.
pub fn parse_duration(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (like 90, 45s, 30m, 12h, 5y)"))?;
    let mul = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "m" | "min" | "mins" => 60.0,
        "h" | "hr" | "hours" => 3600.0,
        "d" | "day" | "days" => 86400.0,
        "w" | "week" | "weeks" => 7.0 * 86400.0,
        "y" | "yr" | "year" | "years" => 365.0 * 86400.0,
        u => return Err(format!("{s:?}: unknown unit {u:?} (s, m, h, d, w, y)")),
    };
    let secs = v * mul;
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("{s:?} is not a duration >= 0"));
    }
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: f64 = 3600.0;
    const DAY: f64 = 86400.0;
    const YEAR: f64 = 365.0 * DAY;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    fn observed(mtbf: f64, failures: u64, secs: f64) -> FailureModel {
        let mut m = FailureModel::new(mtbf, 1);
        (m.observed_failures, m.observed_secs) = (failures, secs);
        m
    }

    fn with_restart(mtbf: f64, nodes: u64, restart: f64) -> FailureModel {
        let mut m = FailureModel::new(mtbf, nodes);
        m.restart_secs = restart;
        m
    }

    #[test]
    fn young_and_daly_match_hand_computed_values() {
        // Expected values from the formulas written out independently.
        let big = 5.0 * YEAR / 1024.0;
        for (c, m) in [
            (60.0, DAY),
            (600.0, HOUR),
            (5.0, big),
            (1.0, 1e9),
            (99.0, 50.0),
        ] {
            let young = (2.0 * c * m).sqrt();
            let x: f64 = c / (2.0 * m);
            let daly = young * (1.0 + x.sqrt() / 3.0 + x / 9.0) - c;
            assert!(close(young_interval(c, m), young, 1e-12), "young({c}, {m})");
            assert!(close(daly_interval(c, m), daly, 1e-12), "daly({c}, {m})");
        }
        // By hand: sqrt(2CM) * (1/3) sqrt(C/2M) = C/3 and sqrt(2CM) * (1/9)(C/2M) =
        // (C/9) sqrt(C/2M), so Daly = sqrt(2CM) - 2C/3 + (C/9) sqrt(C/2M).
        // C = 60, M = 86400: sqrt(10,368,000) = 3219.938 (3220^2 = 10,368,400, less
        // 400/6440); sqrt(60/172800) = 0.018634; 3219.938 - 40 + 6.667 * 0.018634 = 3180.062.
        assert!((young_interval(60.0, DAY) - 3219.938).abs() < 0.01);
        assert!((daly_interval(60.0, DAY) - 3180.062).abs() < 0.01);
        // C = 600, M = 3600: sqrt(4,320,000) = 2078.461 (2078^2 = 4,318,084, plus
        // 1916/4156); sqrt(1/12) = 0.288675; 2078.461 - 400 + 66.667 * 0.288675 = 1697.706.
        assert!((young_interval(600.0, HOUR) - 2078.461).abs() < 0.01);
        assert!((daly_interval(600.0, HOUR) - 1697.706).abs() < 0.01);
        // C >= 2M: checkpointing costs more than it saves; Daly says to run one MTBF.
        for (c, m) in [(100.0, 50.0), (100.0, 40.0), (1e4, 1.0)] {
            assert_eq!(daly_interval(c, m), m);
        }
    }

    #[test]
    fn daly_below_young_and_converges_as_commit_shrinks() {
        let mut prev_ratio = 0.0;
        for k in 2..=10 {
            let c = DAY * 10f64.powi(-k);
            let (d, y) = (daly_interval(c, DAY), young_interval(c, DAY));
            assert!(d <= y * (1.0 + 1e-9), "C/M = 1e-{k}: daly {d} > young {y}");
            assert!(d / y > prev_ratio, "the ratio must grow as C/M shrinks");
            prev_ratio = d / y;
        }
        assert!(prev_ratio > 0.9999 && prev_ratio <= 1.0);
    }

    #[test]
    fn system_mtbf_prior_observations_and_errors() {
        let mtbf = |m: FailureModel| m.system_mtbf_secs();
        let prior = mtbf(FailureModel::new(5.0 * YEAR, 1024)).unwrap();
        assert!(close(prior, 5.0 * YEAR / 1024.0, 1e-12));
        // One failure in one prior MTBF agrees with the prior.
        assert!(close(mtbf(observed(HOUR, 1, HOUR)).unwrap(), HOUR, 1e-12));
        // A few failures move the estimate part way; many dominate the prior.
        let few = mtbf(observed(HOUR, 2, 2000.0)).unwrap();
        assert!(few > 1000.0 && few < HOUR, "{few}");
        let many = mtbf(observed(HOUR, 1000, 1e6)).unwrap();
        assert!(close(many, 1000.0, 0.01), "{many}");
        assert_eq!(mtbf(FailureModel::new(HOUR, 0)), Err(AdviceError::NoNodes));
        for v in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(mtbf(FailureModel::new(v, 8)).is_err(), "{v}");
        }
        assert!(mtbf(observed(HOUR, 0, -1.0)).is_err());
        assert!(mtbf(with_restart(HOUR, 8, f64::NAN)).is_err());
        assert!(advise(0.0, &FailureModel::new(HOUR, 1), 0.0, None).is_err());
        assert!(advise(60.0, &FailureModel::new(HOUR, 1), -1.0, None).is_err());
    }

    #[test]
    fn advise_flips_exactly_at_the_interval() {
        let model = with_restart(4.0 * DAY, 96, 30.0);
        let interval = daly_interval(60.0, model.system_mtbf_secs().unwrap());
        let at = |since: f64| advise(60.0, &model, since, None).unwrap();
        let a = at(f64::from_bits(interval.to_bits() - 1));
        assert!(!a.checkpoint_now && a.next_in_secs > 0.0 && a.interval_secs == interval);
        let a = at(interval);
        assert!(a.checkpoint_now && a.next_in_secs == 0.0);
        let a = at(2.0 * interval);
        assert!(a.checkpoint_now && a.next_in_secs == 0.0 && a.lookahead.is_none());
        let a = at(0.0);
        assert!(a.next_in_secs == interval && a.young_secs > a.interval_secs);
    }

    #[test]
    fn waste_is_lowest_near_the_advised_interval() {
        let big = 5.0 * YEAR / 1024.0;
        for (c, m, r) in [(60.0, HOUR, 30.0), (600.0, DAY, 0.0), (5.0, big, 120.0)] {
            let a = advise(c, &with_restart(m, 1, r), 0.0, None).unwrap();
            let w = |t| waste_fraction(t, c, r, m);
            let per_hour = 3600.0 * w(a.interval_secs);
            assert!(close(a.waste_per_hour_secs, per_hour, 1e-12));
            assert!(w(a.interval_secs) < w(0.5 * a.interval_secs), "C={c} M={m}");
            assert!(w(a.interval_secs) < w(2.0 * a.interval_secs), "C={c} M={m}");
        }
    }

    #[test]
    fn simulator_hand_cases() {
        let sim = |failures: &[f64]| simulate(30.0, 5.0, 10.0, failures, 100.0);
        // 100 s of work in pieces of 30: three checkpoints of 5 s, none after the last piece.
        assert_eq!(sim(&[]), 115.0);
        assert_eq!(simulate(200.0, 5.0, 10.0, &[], 100.0), 100.0);
        // Failure at 50 s, in the second piece (35..65): 15 s lost, 10 s restart.
        assert_eq!(sim(&[50.0]), 140.0);
        // Failure at 67 s, during the second commit (65..70): 32 s lost with the commit.
        assert_eq!(sim(&[67.0]), 157.0);
        // A second failure during the restart (50..60) restarts it: down until 65.
        assert_eq!(sim(&[50.0, 55.0]), 145.0);
        // Failures at or after the end change nothing.
        assert_eq!(sim(&[115.0, 500.0]), 115.0);
        assert_eq!(simulate(0.0, 5.0, 10.0, &[], 100.0), f64::INFINITY);
    }

    #[test]
    fn exponential_trace_is_seeded_and_has_the_right_mean() {
        let a = exponential_trace(7, HOUR, 10_000.0 * HOUR);
        assert_eq!(a, exponential_trace(7, HOUR, 10_000.0 * HOUR));
        assert_ne!(a, exponential_trace(8, HOUR, 10_000.0 * HOUR));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // About 10,000 events; the count's standard deviation is 100.
        assert!((9_500..10_500).contains(&a.len()), "{}", a.len());
        assert!(exponential_trace(1, 0.0, HOUR).is_empty());
    }

    #[test]
    fn advised_interval_is_near_the_best_simulated_interval() {
        let (c, r, m, work) = (60.0, 30.0, HOUR, 200.0 * HOUR);
        let daly = daly_interval(c, m);
        // 40 intervals log-spaced from 0.1x to 10x Daly's.
        let scale = |i: usize| 0.1 * 100f64.powf(i as f64 / 39.0);
        let grid: Vec<f64> = (0..40).map(|i| daly * scale(i)).collect();
        let (mut advised_sum, mut grid_sums) = (0.0, vec![0.0; grid.len()]);
        let seeds = [1u64, 2, 3, 4, 5];
        for seed in seeds {
            let trace = exponential_trace(seed, m, 20.0 * work);
            let run = |t: f64| simulate(t, c, r, &trace, work);
            let advised = run(daly);
            let times: Vec<f64> = grid.iter().map(|&t| run(t)).collect();
            let best = times.iter().copied().fold(f64::INFINITY, f64::min);
            // The trace must outlast the slowest run, or late failures would be missing.
            assert!(times.iter().all(|&t| t < 20.0 * work));
            let at = grid[times.iter().position(|&t| t == best).unwrap()];
            let (a, b) = (advised / HOUR, best / HOUR);
            println!("seed {seed}: advised {daly:.0} s: {a:.2} h; grid {at:.0} s: {b:.2} h");
            advised_sum += advised;
            grid_sums.iter_mut().zip(times).for_each(|(s, t)| *s += t);
        }
        let n = seeds.len() as f64;
        let best_mean = grid_sums.iter().copied().fold(f64::INFINITY, f64::min) / n;
        let advised_mean = advised_sum / n;
        let (a, b) = (advised_mean / HOUR, best_mean / HOUR);
        println!("mean: advised {a:.2} h, best grid {b:.2} h");
        assert!(
            advised_mean <= 1.10 * best_mean,
            "advised {a} h vs best {b} h"
        );
    }

    #[test]
    fn lookahead_checkpoints_before_a_near_drop_only() {
        let model = FailureModel::new(DAY, 1);
        let interval = daly_interval(60.0, DAY);
        let with_drop = |since: f64, in_secs: f64, mtbf_after_secs: f64| {
            let drop = AvailabilityDrop {
                in_secs,
                mtbf_after_secs,
            };
            advise(60.0, &model, since, Some(drop))
        };
        let verdict = |a: &Advice| a.lookahead.as_ref().unwrap().checkpoint_before_drop;
        // 1000 s since the last commit, the MTBF falls to 10 minutes in 5 minutes, long
        // before the scheduled checkpoint: a failure after the drop is nearly certain.
        let a = with_drop(1000.0, 300.0, 600.0).unwrap();
        assert!(verdict(&a), "{:?}", a.lookahead);
        let after = a.lookahead.as_ref().unwrap().interval_after_secs;
        assert_eq!(after, daly_interval(60.0, 600.0));
        // Start one commit before the drop.
        assert!(!a.checkpoint_now && a.next_in_secs == 240.0);
        // A drop nearer than one commit: start now.
        assert!(with_drop(1000.0, 30.0, 600.0).unwrap().checkpoint_now);
        // A drop well after the next scheduled checkpoint: the schedule covers it.
        let a = with_drop(1000.0, 10.0 * interval, 600.0).unwrap();
        assert!(!verdict(&a) && a.next_in_secs == interval - 1000.0);
        // Just after a commit with the drop now, there is nothing to secure.
        assert!(!verdict(&with_drop(0.0, 0.0, 600.0).unwrap()));
        // A mild drop is not worth a commit.
        assert!(!verdict(&with_drop(1000.0, 300.0, 0.9 * DAY).unwrap()));
        assert!(with_drop(0.0, -1.0, 600.0).is_err());
        assert!(with_drop(0.0, 10.0, 0.0).is_err());
    }

    #[test]
    fn revisions_group_into_checkpoints() {
        // Two ranks writing together, one writing 1 s after the other finished (one
        // checkpoint), then a pause and a second checkpoint.
        let revs = [
            (100.0, 10.0, 1),
            (101.0, 9.0, 2),
            (102.5, 0.5, 3),
            (200.0, 4.0, 4),
            (203.0, 1.0, 5),
        ];
        let c = checkpoints(&revs, CHECKPOINT_GAP_SECS);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(
            (c[0].start_unix, c[0].end_unix, c[0].revisions, c[0].bytes),
            (90.0, 102.5, 3, 6)
        );
        assert_eq!(
            (c[1].start_unix, c[1].end_unix, c[1].revisions, c[1].bytes),
            (196.0, 203.0, 2, 9)
        );
        assert!(checkpoints(&[(1.0, f64::NAN, 1)], 2.0).is_empty());
    }

    /// Checkpoint-sized commits: 64 MiB each.
    fn big(revs: &[(f64, f64)]) -> Vec<(f64, f64, u64)> {
        revs.iter().map(|&(e, s)| (e, s, 64 << 20)).collect()
    }

    fn inputs(recent: &[(f64, f64)], config: AdviceConfig, now: f64) -> AdviceInputs {
        AdviceInputs::new(now, &big(recent), config, 0, 0.0)
    }

    /// Issue 36: small commits between checkpoints (a log, a marker file) are not
    /// checkpoints; counted, they made the commit time 0.0 s and the advice "checkpoint
    /// every 25 s". Only groups of at least `CHECKPOINT_MIN_BYTES` are measured.
    #[test]
    fn small_commits_are_not_counted_as_checkpoints() {
        let config = AdviceConfig {
            node_mtbf_secs: DAY as u64,
            nodes: 1,
            restart_secs: 0,
        };
        let mut revs: Vec<(f64, f64, u64)> = Vec::new();
        for i in 0..5 {
            let t = 1000.0 + i as f64 * 600.0;
            // A checkpoint of 4 ranks x 256 MiB taking 30 s...
            for r in 0..4 {
                revs.push((t + r as f64 * 0.1, 30.0, 256 << 20));
            }
            // ...and, minutes later, a log line and a marker, committed in a millisecond.
            revs.push((t + 300.0, 0.001, 120));
            revs.push((t + 400.0, 0.001, 0));
        }
        let i = AdviceInputs::new(4000.0, &revs, config, 0, 0.0);
        assert_eq!(i.recent.len(), 5, "{:?}", i.recent);
        assert!(i.recent.iter().all(|c| c.revisions == 4), "{:?}", i.recent);
        assert_eq!(i.small_commits_ignored, 10);
        let r = report(&i, &Overrides::default()).unwrap();
        assert!(close(r.commit_secs, 30.3, 1e-9), "{}", r.commit_secs);
        assert!(close(r.interval_secs, daly_interval(30.3, DAY), 1e-9));
        assert!(render(&r).contains("10 group(s) of commits under 1024 KiB not counted"));
        // A checkpoint just under the floor is not one; at the floor it is.
        let at = |bytes: u64| AdviceInputs::new(10.0, &[(5.0, 1.0, bytes)], config, 0, 0.0);
        assert!(at(CHECKPOINT_MIN_BYTES - 1).recent.is_empty());
        assert_eq!(at(CHECKPOINT_MIN_BYTES).recent.len(), 1);
    }

    /// A commit longer than the failure model allows: said plainly, on the line after the
    /// verdict, and no waste figure above 100%.
    #[test]
    fn checkpointing_that_costs_more_than_failures_allow_is_warned_about() {
        let config = |mtbf: u64| AdviceConfig {
            node_mtbf_secs: mtbf,
            nodes: 1,
            restart_secs: 0,
        };
        let i = inputs(&[(1000.0, 120.0)], config(30), 1100.0);
        let r = report(&i, &Overrides::default()).unwrap();
        let w = r.warning.clone().expect("a warning");
        assert!(w.contains("no interval helps"), "{w}");
        let text = render(&r);
        let mut lines = text.lines();
        assert!(lines.next().unwrap().starts_with("checkpoint-now: "));
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("WARNING: a checkpoint takes"),
            "{text}"
        );
        assert!(
            !text.contains("10565") && text.contains("exceeds 100%"),
            "{text}"
        );
        // Commit well below 2M, but still a waste over half the run.
        let r = report(
            &inputs(&[(1000.0, 60.0)], config(200), 1100.0),
            &Overrides::default(),
        )
        .unwrap();
        assert!(r.waste_per_hour_secs / 3600.0 >= WASTE_WARN_FRACTION);
        assert!(r
            .warning
            .unwrap()
            .contains("costs more than the failure model allows"));
        // A sane job: no warning.
        let r = report(
            &inputs(&[(1000.0, 60.0)], config(30 * DAY as u64), 1100.0),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(r.warning, None);
        assert!(!render(&r).contains("WARNING"));
    }

    #[test]
    fn the_report_uses_the_median_commit_and_says_where_inputs_came_from() {
        let config = AdviceConfig {
            node_mtbf_secs: 5 * YEAR as u64,
            nodes: 1024,
            restart_secs: 0,
        };
        // Seven checkpoints taking 10..70 s: the newest five (30..70 s) count, median 50.
        let revs: Vec<(f64, f64)> = (1..=7)
            .map(|i| (i as f64 * 10_000.0, i as f64 * 10.0))
            .collect();
        let i = inputs(&revs, config, 70_000.0 + 600.0);
        assert_eq!(i.recent.len(), COMMIT_SAMPLES);
        let r = report(&i, &Overrides::default()).unwrap();
        assert!(close(r.commit_secs, 50.0, 1e-9), "{}", r.commit_secs);
        assert!(r.commit_source.contains("median of the last 5"));
        assert_eq!(r.restart_secs, r.commit_secs);
        let mtbf = 5.0 * YEAR / 1024.0;
        assert!(close(r.system_mtbf_secs, mtbf, 1e-9));
        assert!(close(r.interval_secs, daly_interval(50.0, mtbf), 1e-9));
        assert_eq!(r.since_last_commit_secs, Some(600.0));
        assert!(!r.checkpoint_now && close(r.next_in_secs, r.interval_secs - 600.0, 1e-9));
        assert!(render(&r).starts_with("checkpoint-now: no\n"));

        // Overdue: the same space a day later.
        let late = inputs(&revs, config, 70_000.0 + DAY);
        let r = report(&late, &Overrides::default()).unwrap();
        assert!(r.checkpoint_now && r.next_in_secs == 0.0);
        assert!(render(&r).starts_with("checkpoint-now: yes\n"));

        // A given commit time and restart time win; a stored restart time is used.
        let o = Overrides {
            commit_secs: Some(8.0),
            restart_secs: Some(30.0),
            ..Default::default()
        };
        let r = report(&i, &o).unwrap();
        assert_eq!((r.commit_secs, r.restart_secs), (8.0, 30.0));
        assert_eq!(r.commit_source, "given");
        let stored = AdviceConfig {
            restart_secs: 90,
            ..config
        };
        let r = report(&inputs(&revs, stored, 70_600.0), &Overrides::default()).unwrap();
        assert_eq!(
            (r.restart_secs, r.restart_source.as_str()),
            (90.0, "config")
        );

        // Time without target failures is no evidence about nodes: the declared MTBF
        // stands. Target failures add their rate: 3 in a day, over a day plus one
        // declared MTBF of failure-free prior.
        let mut quiet = inputs(&revs, config, 70_600.0);
        quiet.observed_secs = 30.0 * DAY;
        let r1 = report(&quiet, &Overrides::default()).unwrap();
        assert!(close(r1.system_mtbf_secs, mtbf, 1e-12));
        let mut failing = inputs(&revs, config, 70_600.0);
        failing.target_failures = 3;
        failing.observed_secs = DAY;
        let r2 = report(&failing, &Overrides::default()).unwrap();
        let want = 1.0 / (1.0 / mtbf + 3.0 / (DAY + mtbf));
        assert!(
            close(r2.system_mtbf_secs, want, 1e-9),
            "{}",
            r2.system_mtbf_secs
        );
        assert!(r2.interval_secs < r1.interval_secs);
        assert!(render(&r2).contains("rate of 3 target failure(s) in 24.0 h added"));
    }

    #[test]
    fn the_report_says_what_is_missing() {
        let none = inputs(&[(10.0, 1.0)], AdviceConfig::default(), 20.0);
        let e = report(&none, &Overrides::default()).unwrap_err();
        assert!(e.contains("--node-mtbf"), "{e}");
        let config = AdviceConfig {
            node_mtbf_secs: 1000,
            nodes: 0,
            restart_secs: 0,
        };
        let empty = inputs(&[], config, 20.0);
        let e = report(&empty, &Overrides::default()).unwrap_err();
        assert!(e.contains("no checkpoint measured"), "{e}");
        // Nodes default to 1; with a given commit and no checkpoint, counting from now.
        let o = Overrides {
            commit_secs: Some(10.0),
            ..Default::default()
        };
        let r = report(&empty, &o).unwrap();
        assert_eq!((r.nodes, r.since_last_commit_secs), (1, None));
        assert!(render(&r).contains("none recorded"));
    }

    #[test]
    fn durations_parse_with_units() {
        for (s, v) in [
            ("90", 90.0),
            ("45s", 45.0),
            ("30m", 1800.0),
            ("12h", 43200.0),
            ("1.5d", 129600.0),
            ("2w", 14.0 * DAY),
            ("5y", 5.0 * YEAR),
            (" 3 h ", 10800.0),
        ] {
            assert_eq!(parse_duration(s).unwrap(), v, "{s}");
        }
        for bad in ["", "h", "5x", "-3h", "1e999s", "nan"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
