//! `ckptfs config`: the retention policy and automatic gc settings, through the daemon or
//! offline.

use super::*;

/// Retention options shared by `format` and `config`.
#[derive(clap::Args, Default)]
pub(crate) struct RetentionArgs {
    /// Newest complete revisions kept per path (default 2).
    #[arg(long)]
    pub(crate) keep_revisions: Option<u64>,
    /// Also keep revisions younger than this (e.g. 6h, 7d; `off` to disable).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) keep_age: Option<u64>,
    /// Keep the revisions of an unlinked path this long (default 7d).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) keep_unlinked: Option<u64>,
    /// Run gc automatically when free space falls below this percentage (default 20; 0 = off).
    #[arg(long)]
    pub(crate) auto_gc_free_percent: Option<u64>,
}

/// `30s`, `10m`, `2h`, `7d`, a plain number of seconds, or `off` (0).
pub(crate) fn parse_duration(s: &str) -> Result<u64, CliError> {
    let t = s.trim();
    if t == "off" {
        return Ok(0);
    }
    let (num, mult) = match t.chars().last() {
        Some('s') => (&t[..t.len() - 1], 1),
        Some('m') => (&t[..t.len() - 1], 60),
        Some('h') => (&t[..t.len() - 1], 3600),
        Some('d') => (&t[..t.len() - 1], 86400),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (use 30s, 10m, 2h, 7d)"))?;
    Ok(n.checked_mul(mult)
        .ok_or_else(|| format!("duration too large: {s:?}"))?)
}

/// Applies `key=value,...` to a config (the daemon's side of `ckptfs config`).
pub(crate) fn apply_config(c: &mut Config, pairs: &str) -> Result<(), CliError> {
    for kv in pairs.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or("expected key=value")?;
        let v: u64 = v.parse().map_err(|_| format!("bad value for {k}"))?;
        match k {
            "keep_revisions" => c.keep_revisions = v,
            "keep_age_secs" => c.keep_age_secs = v,
            "keep_unlinked_secs" => c.keep_unlinked_secs = v,
            "auto_gc_free_percent" => c.auto_gc_free_percent = v,
            _ => return Err(format!("unknown setting {k}").into()),
        }
    }
    c.validate().map_err(CliError::from)
}

pub(crate) fn config_json(c: &Config) -> serde_json::Value {
    serde_json::json!({
        "keep_revisions": c.keep_revisions,
        "keep_age_secs": c.keep_age_secs,
        "keep_unlinked_secs": c.keep_unlinked_secs,
        "auto_gc_free_percent": c.auto_gc_free_percent,
    })
}

pub(crate) fn cmd_config(path: &Path, r: &RetentionArgs, json: bool) -> Result<(), CliError> {
    // Each setting is valid or not on its own, so checking them over the defaults refuses a
    // bad value before anything is opened (an offline open rewrites the lock file), and with
    // the engine's message rather than the daemon's bare EINVAL.
    let mut proposed = Config::default();
    r.apply(&mut proposed);
    proposed.validate().map_err(CliError::from)?;
    let c = match target_of(path)? {
        Target::Mounted { mnt } => {
            let v = match r.is_empty() {
                true => control::send(&mnt, &control::Request::Config)?,
                false => control::send(&mnt, &control::Request::SetConfig(r.to_pairs()))?,
            };
            let g = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            Config {
                keep_revisions: g("keep_revisions"),
                keep_age_secs: g("keep_age_secs"),
                keep_unlinked_secs: g("keep_unlinked_secs"),
                auto_gc_free_percent: g("auto_gc_free_percent"),
            }
        }
        Target::Offline { fs } => {
            let mut c = fs.space().settings().config().map_err(CliError::from)?;
            if !r.is_empty() {
                r.apply(&mut c);
                fs.space()
                    .settings()
                    .set_config(&c)
                    .map_err(CliError::from)?;
            }
            c
        }
    };
    if json {
        println!("{}", config_json(&c));
    } else {
        let age = |s: u64| {
            if s == 0 {
                "off".to_string()
            } else {
                format!("{s}s")
            }
        };
        println!("keep revisions        {}", c.keep_revisions);
        println!("keep younger than     {}", age(c.keep_age_secs));
        println!("keep unlinked for     {}", age(c.keep_unlinked_secs));
        println!(
            "automatic gc below    {}",
            if c.auto_gc_free_percent == 0 {
                "off".to_string()
            } else {
                format!("{}% free", c.auto_gc_free_percent)
            }
        );
    }
    Ok(())
}

impl RetentionArgs {
    pub(crate) fn is_empty(&self) -> bool {
        self.keep_revisions.is_none()
            && self.keep_age.is_none()
            && self.keep_unlinked.is_none()
            && self.auto_gc_free_percent.is_none()
    }

    pub(crate) fn apply(&self, c: &mut Config) {
        if let Some(v) = self.keep_revisions {
            c.keep_revisions = v;
        }
        if let Some(v) = self.keep_age {
            c.keep_age_secs = v;
        }
        if let Some(v) = self.keep_unlinked {
            c.keep_unlinked_secs = v;
        }
        if let Some(v) = self.auto_gc_free_percent {
            c.auto_gc_free_percent = v;
        }
    }

    /// The same settings as `key=value,...`, the form the daemon's config xattr takes.
    pub(crate) fn to_pairs(&self) -> String {
        let mut c = Vec::new();
        let mut push = |k: &str, v: Option<u64>| {
            if let Some(v) = v {
                c.push(format!("{k}={v}"));
            }
        };
        push("keep_revisions", self.keep_revisions);
        push("keep_age_secs", self.keep_age);
        push("keep_unlinked_secs", self.keep_unlinked);
        push("auto_gc_free_percent", self.auto_gc_free_percent);
        c.join(",")
    }
}
