//! `ckptfs advise PATH`: when the job should checkpoint next, from Daly's interval over the
//! measured commit time of recent checkpoints and the failure model kept in the space's
//! config (`--node-mtbf`, `--nodes`, `--restart`, stored when given), updated with the
//! failures observed on its storage targets. `/.ckptfs/advice` in a mount is the same text.

use crate::error::CliError;
use ckptfs_engine::advice::{self, AdviceConfig, AdviceInputs, AvailabilityDrop, Overrides};
use std::path::Path;

/// What the command line gave.
pub struct Args<'a> {
    pub node_mtbf: Option<&'a str>,
    pub nodes: Option<u64>,
    pub restart: Option<&'a str>,
    pub commit: Option<&'a str>,
    pub drop_in: Option<&'a str>,
    pub mtbf_after: Option<&'a str>,
    pub json: bool,
}

fn duration(flag: &str, v: Option<&str>) -> Result<Option<f64>, CliError> {
    Ok(
        v.map(|s| advice::parse_duration(s).map_err(|e| format!("--{flag}: {e}")))
            .transpose()?,
    )
}

pub fn run(path: &Path, a: &Args) -> Result<(), CliError> {
    let node_mtbf = duration("node-mtbf", a.node_mtbf)?;
    let restart = duration("restart", a.restart)?;
    let commit = duration("commit", a.commit)?;
    let drop_in = duration("drop-in", a.drop_in)?;
    let mtbf_after = duration("mtbf-after", a.mtbf_after)?;
    if node_mtbf == Some(0.0) || a.nodes == Some(0) || commit == Some(0.0) {
        return Err("--node-mtbf, --nodes and --commit must be greater than 0".into());
    }
    if mtbf_after == Some(0.0) {
        return Err("--mtbf-after must be greater than 0".into());
    }
    let store = node_mtbf.is_some() || a.nodes.is_some() || restart.is_some();
    let merge = |c: AdviceConfig| AdviceConfig {
        node_mtbf_secs: node_mtbf.map_or(c.node_mtbf_secs, |v| v.round().max(1.0) as u64),
        nodes: a.nodes.unwrap_or(c.nodes),
        restart_secs: restart.map_or(c.restart_secs, |v| v.round() as u64),
    };
    let inputs: AdviceInputs = match crate::target_of(path)? {
        crate::Target::Mounted { mnt } => {
            let get = || -> Result<AdviceInputs, CliError> {
                Ok(serde_json::from_value(crate::control::send(
                    &mnt,
                    &crate::control::Request::Advice,
                )?)
                .map_err(|e| format!("malformed advice inputs from the daemon: {e}"))?)
            };
            let i = get()?;
            if store {
                let c = merge(i.config);
                let set = crate::control::Request::SetAdvice(c);
                crate::control::send(&mnt, &set).map_err(|e| {
                    format!("{e} (changing the failure model is for root and the mount's owner)")
                })?;
                get()?
            } else {
                i
            }
        }
        crate::Target::Offline { fs } => {
            let space = fs.space();
            if store {
                let c = merge(
                    space
                        .report()
                        .advice_inputs()
                        .map_err(CliError::from)?
                        .config,
                );
                space
                    .settings()
                    .set_advice_config(&c)
                    .map_err(CliError::from)?;
            }
            space.report().advice_inputs().map_err(CliError::from)?
        }
    };
    let o = Overrides {
        commit_secs: commit,
        // Stored above; the report reads them from the config.
        restart_secs: None,
        node_mtbf_secs: None,
        nodes: None,
        drop: drop_in
            .zip(mtbf_after)
            .map(|(in_secs, mtbf_after_secs)| AvailabilityDrop {
                in_secs,
                mtbf_after_secs,
            }),
    };
    let r = advice::report(&inputs, &o)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&r).map_err(|e| format!("serialize: {e}"))?
        );
    } else {
        print!("{}", advice::render(&r));
    }
    Ok(())
}
