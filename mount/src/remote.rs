//! The object-store tier from the command line: `format --remote`, `ckptfs remote` (status,
//! `--set`, `--sync`), `ckptfs recover --remote`, `ckptfs mount s3://... --cache DIR`, and
//! `ckptfs umount`'s wait for the upload.

use super::*;
use ckptfs_remote::restore::BucketCheck;
use ckptfs_remote::{Bucket, Durability, RemoteConfig};

/// The tier's flags, shared by `format`, `remote --set`, `recover` and `mount s3://`.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct RemoteArgs {
    /// An S3-compatible bucket as the space's durable tier: s3://BUCKET/PREFIX. Credentials
    /// and region come from the AWS_* environment variables and ~/.aws files, as for the
    /// AWS tools.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    pub remote: Option<String>,
    /// The object store's URL, for servers other than AWS (SeaweedFS, Ceph RGW, MinIO,
    /// Garage): e.g. http://127.0.0.1:8333 (also AWS_ENDPOINT_URL).
    #[arg(long, value_name = "URL")]
    pub remote_endpoint: Option<String>,
    /// When close() and fsync() return: `async` (the default) at local durability, the
    /// upload following in the background (`ckptfs remote` says how far behind); `close`
    /// only once the bucket holds the revision.
    #[arg(long, value_name = "MODE", value_parser = ["async", "close"])]
    pub remote_durability: Option<String>,
}

impl RemoteArgs {
    /// The settings these flags make, if `--remote` is given.
    pub(crate) fn config(&self) -> Result<Option<RemoteConfig>, CliError> {
        let Some(url) = &self.remote else {
            if self.remote_endpoint.is_some() || self.remote_durability.is_some() {
                return Err("--remote-endpoint and --remote-durability need --remote".into());
            }
            return Ok(None);
        };
        let d: Durability = self
            .remote_durability
            .as_deref()
            .unwrap_or("async")
            .parse()
            .map_err(|e: ckptfs_remote::Error| e.to_string())?;
        let c =
            RemoteConfig::new(url, self.remote_endpoint.clone(), d).map_err(|e| e.to_string())?;
        Ok(Some(c))
    }
}

/// Refuses a prefix that already holds another space's checkpoints: a new space's first
/// upload would make its empty tree the bucket's newest. Also proves the store answers.
pub(crate) fn check_prefix_unused(cfg: &RemoteConfig) -> Result<(), CliError> {
    let b = Bucket::open(cfg).map_err(|e| e.to_string())?;
    match ckptfs_remote::restore::newest(&b) {
        Ok(None) => Ok(()),
        Ok(Some((h, m))) => Err(format!(
            "{} already holds checkpoints (manifest {}, {} files, written by {}); recover from \
             it (`ckptfs recover DIR --remote {}`) or choose another prefix",
            cfg.url,
            h.seq,
            m.nodes.iter().filter(|n| n.kind == "file").count(),
            h.owner,
            cfg.url
        )
        .into()),
        Err(e) => Err(format!("cannot use {}: {e}", cfg.url).into()),
    }
}

/// `ckptfs remote PATH`: the tier's status (a mount), or its settings and what the bucket
/// holds (a backing directory); `--set` gives an unmounted space a tier; `--sync` waits
/// until the bucket holds everything committed.
pub(crate) fn run(path: &Path, args: &RemoteArgs, sync: bool, json: bool) -> Result<(), CliError> {
    let path = absolute(path);
    if mounted_at(&path) {
        if args.remote.is_some() {
            return Err(format!(
                "{} is mounted: unmount it to change its tier",
                path.display()
            )
            .into());
        }
        if sync {
            wait_uploaded(&path, UMOUNT_TIMEOUT)?;
        }
        let v = control::send(&path, &control::Request::Remote)?;
        if v["tier"] == false {
            return Err(format!("{} has no object-store tier", path.display()).into());
        }
        print_status(&v, json);
        return Ok(());
    }
    let sb = read_backing_dir(&path, false).map_err(CliError::from)?;
    if let Some(cfg) = args.config()? {
        if sb.slots > 1 {
            return Err("an object-store tier takes spaces of one slot".into());
        }
        if let Some(old) = RemoteConfig::load(&path).map_err(|e| e.to_string())? {
            if old.url != cfg.url {
                return Err(format!(
                    "{} already has the tier {}; a space keeps one bucket prefix",
                    path.display(),
                    old.url
                )
                .into());
            }
        } else {
            check_prefix_unused(&cfg)?;
        }
        cfg.save(&path).map_err(|e| e.to_string())?;
        println!(
            "ckptfs: {} has the tier {} ({} durability); its next mount uploads",
            path.display(),
            cfg.url,
            cfg.durability
        );
        return Ok(());
    }
    let cfg = RemoteConfig::load(&path)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} has no object-store tier", path.display()))?;
    let b = Bucket::open(&cfg).map_err(|e| e.to_string())?;
    let newest = ckptfs_remote::restore::newest(&b).map_err(|e| e.to_string())?;
    let v = serde_json::json!({
        "url": cfg.url,
        "durability": cfg.durability.to_string(),
        "mounted": false,
        "head_seq": newest.as_ref().map(|(h, _)| h.seq),
        "head_taken_unix": newest.as_ref().map(|(_, m)| m.taken_unix),
        "files": newest.as_ref().map(|(_, m)| m.nodes.iter().filter(|n| n.kind == "file").count()),
        "logical_bytes": newest.as_ref().map(|(_, m)| m.logical_bytes),
        "stored_bytes": newest.as_ref().map(|(_, m)| m.stored_bytes),
    });
    if json {
        println!("{v}");
    } else {
        println!("tier:        {} ({} durability)", cfg.url, cfg.durability);
        match newest {
            None => println!("bucket:      holds nothing yet"),
            Some((h, m)) => println!(
                "bucket:      manifest {} taken {}: {} files, {} of content in {} stored",
                h.seq,
                when::human(m.taken_unix as f64),
                m.nodes.iter().filter(|n| n.kind == "file").count(),
                human(m.logical_bytes),
                human(m.stored_bytes)
            ),
        }
    }
    Ok(())
}

fn print_status(v: &serde_json::Value, json: bool) {
    if json {
        println!("{v}");
        return;
    }
    let u = |k: &str| v[k].as_u64().unwrap_or(0);
    if v["read_only"] == true {
        println!(
            "tier:        {} (read-only mount: chunks are fetched, nothing is uploaded)",
            v["url"].as_str().unwrap_or("?")
        );
        print_fetched(&v["fetch"]);
        return;
    }
    println!(
        "tier:        {} ({} durability)",
        v["url"].as_str().unwrap_or("?"),
        v["durability"].as_str().unwrap_or("?")
    );
    println!("state:       {}", v["state"].as_str().unwrap_or("?"));
    match u("head_seq") {
        0 => println!("bucket:      holds nothing from this space yet"),
        s => println!(
            "bucket:      manifest {s}, taken {}",
            when::human(v["head_taken_unix"].as_f64().unwrap_or(0.0))
        ),
    }
    println!(
        "behind:      {} commits, {} namespace changes, {:.1} s{}",
        u("behind_commits"),
        u("behind_changes"),
        v["behind_seconds"].as_f64().unwrap_or(0.0),
        match u("pending_bytes") {
            0 => String::new(),
            b => format!(", {} to send", human(b)),
        }
    );
    println!(
        "sent:        {} in {} objects, {} uploads since the mount",
        human(u("sent_bytes")),
        u("sent_objects"),
        u("uploads")
    );
    print_fetched(&v["fetch"]);
    if let Some(e) = v["last_error"].as_str() {
        println!("last error:  {e}");
    }
    if let Some(f) = v["fenced"].as_str() {
        println!("FENCED:      {f}");
    }
}

/// What the mount fetched from the bucket on demand (`FetchStats`), if anything.
fn print_fetched(f: &serde_json::Value) {
    let fu = |k: &str| f.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    if fu("chunks") > 0 {
        println!(
            "fetched:     {} chunks held only by the bucket ({} from the local cache, {} again \
             after a failed check), {} in {} requests; cache {} of {}",
            fu("chunks"),
            fu("cache_hits"),
            fu("refetched"),
            human(fu("fetched_bytes")),
            fu("requests"),
            human(fu("cached_bytes")),
            human(fu("cache_bytes"))
        );
    }
}

/// How long an upload that keeps failing is waited for (`wait_uploaded`), unless
/// `CKPTFS_REMOTE_STALL_SECS` says otherwise.
const STALL_LIMIT: Duration = Duration::from_secs(30);

fn stall_limit() -> Duration {
    std::env::var("CKPTFS_REMOTE_STALL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or(STALL_LIMIT)
}

/// Waits until the bucket holds everything committed on the mount at `mnt` (a mount without
/// a tier returns at once), with a progress bar on a terminal; an error says what is not
/// uploaded.
pub(crate) fn wait_uploaded(mnt: &Path, limit: Duration) -> Result<(), CliError> {
    // A daemon from before the tier answers no such request: it has no tier.
    let Ok(v) = control::send(mnt, &control::Request::RemoteNudge) else {
        return Ok(());
    };
    if v["tier"] == false {
        return Ok(());
    }
    let start = Instant::now();
    let pb = progress_bar(true);
    if let Some(pb) = &pb {
        pb.set_message("uploading to the bucket");
    }
    let mut total = 0u64;
    // Progress is bytes sent; a store that keeps failing (refused credentials, down) for
    // STALL_LIMIT with nothing sent ends the wait with what the bucket lacks.
    let mut last_sent = (u64::MAX, Instant::now());
    loop {
        let v = control::send(mnt, &control::Request::Remote)?;
        let u = |k: &str| v[k].as_u64().unwrap_or(0);
        if u("sent_bytes") != last_sent.0 || v["state"] != "retrying" {
            last_sent = (u("sent_bytes"), Instant::now());
        }
        let stalled = last_sent.1.elapsed() > stall_limit();
        if let Some(f) = v["fenced"].as_str() {
            if let Some(pb) = &pb {
                pb.finish_and_clear();
            }
            return Err(format!("the bucket does not hold everything: fenced ({f})").into());
        }
        if v["state"] == "idle" {
            if let Some(pb) = &pb {
                pb.finish_and_clear();
            }
            return Ok(());
        }
        let pending = u("pending_bytes");
        total = total.max(pending);
        if let Some(pb) = &pb {
            pb.set_length(total >> 20);
            pb.set_position((total - pending) >> 20);
        }
        if start.elapsed() > limit || stalled {
            if let Some(pb) = &pb {
                pb.finish_and_clear();
            }
            return Err(format!(
                "after {} s the bucket still lacks {} commits and {} namespace changes{}{}",
                start.elapsed().as_secs(),
                u("behind_commits"),
                u("behind_changes"),
                match pending {
                    0 => String::new(),
                    b => format!(" ({} to send)", human(b)),
                },
                v["last_error"]
                    .as_str()
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ckptfs recover DIR --remote s3://...`: a new space in DIR from the bucket alone.
///
/// `on_demand` (a mount of s3://...): no chunk is fetched now (`restore::recover`), and
/// fetched ones are kept in up to `cache_bytes`.
pub(crate) fn recover(
    dir: &Path,
    args: &RemoteArgs,
    size: Option<u64>,
    json: bool,
    on_demand: Option<Option<u64>>,
) -> Result<(), CliError> {
    let mut cfg = args.config()?.expect("called with --remote");
    if let Some(c) = on_demand {
        cfg.cache_bytes = c;
    }
    let dir = absolute(dir);
    let chunk = parse_size(DEFAULT_CHUNK)? as u32;
    let pb = progress_bar(!json);
    if let Some(pb) = &pb {
        pb.set_message(match on_demand {
            Some(_) => "reading the bucket's newest checkpoint",
            None => "fetching from the bucket",
        });
    }
    let how = on_demand.is_some();
    let r = ckptfs_remote::restore::recover(&cfg, &dir, size, chunk, how, |done, total| {
        if let Some(pb) = &pb {
            pb.set_length(total >> 20);
            pb.set_position(done >> 20);
        }
    })
    .map_err(|e| format!("cannot recover from {}: {e}", cfg.url))?;
    if let Some(pb) = &pb {
        pb.finish_and_clear();
    }
    if json {
        println!(
            "{}",
            serde_json::to_string(&r).map_err(|e| format!("serialize: {e}"))?
        );
    } else {
        let what = format!(
            "{} (manifest {}, taken {}): {} files, {}",
            cfg.url,
            r.seq,
            when::human(r.taken_unix as f64),
            r.files,
            human(r.logical_bytes)
        );
        match how {
            true => println!(
                "{} is the cache of {what}, fetched as they are read",
                dir.display()
            ),
            false => println!(
                "recovered {} from {what} in {:.1} s, {} fetched in {} requests; mount it to \
                 continue as the bucket's owner",
                dir.display(),
                r.seconds,
                human(r.fetched_bytes),
                r.requests
            ),
        }
    }
    Ok(())
}

/// `ckptfs mount s3://BUCKET/PREFIX MNT --cache DIR`: the backing directory to mount, made
/// from the bucket when DIR holds no space yet.
pub(crate) fn cache_for(
    url: &str,
    cache: Option<&Path>,
    endpoint: Option<String>,
    cache_size: Option<u64>,
) -> Result<PathBuf, CliError> {
    let cache = cache.ok_or_else(|| {
        format!("mounting {url} needs --cache DIR: the local directory its space lives in")
    })?;
    let dir = absolute(cache);
    if dir.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        let have = RemoteConfig::load(&dir).map_err(|e| e.to_string())?;
        match have {
            Some(mut c) if c.url == url.trim_end_matches('/') => {
                if cache_size.is_some() && c.cache_bytes != cache_size {
                    c.cache_bytes = cache_size;
                    c.save(&dir).map_err(|e| e.to_string())?;
                }
                return Ok(dir);
            }
            Some(c) => {
                return Err(
                    format!("{} is the cache of {}, not of {url}", dir.display(), c.url).into(),
                )
            }
            None => return Err(format!("{} holds a space without a tier", dir.display()).into()),
        }
    }
    let args = RemoteArgs {
        remote: Some(url.to_string()),
        remote_endpoint: endpoint,
        remote_durability: None,
    };
    recover(&dir, &args, None, false, Some(cache_size))?;
    Ok(dir)
}

/// `ckptfs check --remote PATH`: exit status 0 clean, 1 damage found, 2 could not check.
pub(crate) fn check(path: &Path, json: bool) -> ExitCode {
    let abs = absolute(path);
    let dir = match mounted_at(&abs) {
        true => match backing_of(&abs) {
            Some(d) => d,
            None => {
                eprintln!(
                    "ckptfs: cannot find the backing directory of {}",
                    abs.display()
                );
                return ExitCode::from(2);
            }
        },
        false => abs,
    };
    let cfg = match RemoteConfig::load(&dir) {
        Ok(Some(c)) => c,
        Ok(None) => {
            eprintln!("ckptfs: {} has no object-store tier", dir.display());
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("ckptfs: {e}");
            return ExitCode::from(2);
        }
    };
    let pb = progress_bar(!json);
    if let Some(pb) = &pb {
        pb.set_message("verifying the bucket");
    }
    // On a mount the daemon checks, and uploads again what failed from its verified local
    // bytes; offline the check only reports.
    let r = match mounted_at(&absolute(path)) {
        true => control::send(&absolute(path), &control::Request::RemoteCheck)
            .map_err(|e| e.to_string())
            .and_then(|v| match v["error"].as_str() {
                Some(e) => Err(e.to_string()),
                None => serde_json::from_value::<BucketCheck>(v).map_err(|e| e.to_string()),
            }),
        false => ckptfs_remote::restore::check(&cfg, |done, total| {
            if let Some(pb) = &pb {
                pb.set_length(total >> 20);
                pb.set_position(done >> 20);
            }
        })
        .map_err(|e| e.to_string()),
    };
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ckptfs: cannot check {}: {e}", cfg.url);
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        match r.seq {
            0 if r.problems.is_empty() => println!("{}: holds nothing yet", r.url),
            _ => println!(
                "{}: manifest {}: {} files, {} chunks ({}) read and verified, {} problems",
                r.url,
                r.seq,
                r.files,
                r.chunks,
                human(r.stored_bytes),
                r.problems.len()
            ),
        }
        for p in &r.problems {
            println!("  {p}");
        }
        if r.reuploaded > 0 {
            println!(
                "{} damaged chunks are being uploaded again from this space's verified bytes \
                 (`ckptfs remote {} --sync` waits for it)",
                r.reuploaded,
                path.display()
            );
        }
        if !r.unrepairable.is_empty() {
            println!(
                "{} damaged chunks cannot be repaired: this space never fetched them, so the \
                 bucket's copy was the only one",
                r.unrepairable.len()
            );
        }
    }
    match r.problems.is_empty() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(1),
    }
}
