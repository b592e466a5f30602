//! `ckptfs format`: a new space (one data file, slots, targets) and the words that say
//! what it reserved.

use super::*;

/// `ckptfs format` (`c` is a `Cmd::Format`).
pub(crate) fn cmd_format(c: Cmd) -> Result<(), CliError> {
    let Cmd::Format {
        dir,
        size,
        chunk_size,
        force,
        slots,
        targets,
        redundancy,
        codec,
        retention,
        remote,
    } = c
    else {
        unreachable!("cmd_format of another command")
    };
    let mark_codec = |dir: &Path| -> Result<(), CliError> {
        if codec == "float" {
            use ckptfs_engine::format::Features;
            ckptfs_engine::space::mark_features(
                dir,
                Features::INCOMPAT_FLOAT_CODEC.union(Features::INCOMPAT_FLOAT_ROTATE3),
            )
            .map_err(|e| format!("cannot record the codec in the superblock: {e}"))?;
        }
        Ok(())
    };
    let chunk = u32::try_from(chunk_size).map_err(|_| {
        format!("chunk size must be a power of two between 4 KiB and 4 MiB, got {chunk_size} bytes")
    })?;
    let mut config = Config::default();
    retention.apply(&mut config);
    // Checked before anything is formatted: a bad URL, an unreachable store or a prefix
    // that holds another space's checkpoints leave DIR as it was.
    let tier = remote.config()?;
    if let Some(t) = &tier {
        if slots > 1 {
            return Err("--remote takes spaces of one slot".into());
        }
        remote::check_prefix_unused(t)?;
    }
    let save_tier = |dir: &Path| -> Result<(), CliError> {
        if let Some(t) = &tier {
            t.save(dir).map_err(|e| e.to_string())?;
            println!(
                "ckptfs: {} uploads to {} ({} durability)",
                dir.display(),
                t.url,
                t.durability
            );
        }
        Ok(())
    };
    // Erasing a single-slot space right after a plain unmount waits for its exiting
    // daemon, as a mount does (a live one is refused by the lock, as before).
    let abs = absolute(&dir);
    if force
        && abs.join(ckptfs_engine::format::LOCK_FILE).exists()
        && read_backing_dir(&abs, false).is_ok_and(|sb| sb.slots == 1)
    {
        check_not_locked(&abs, false)?;
    }
    // (--redundancy without --target is refused by the parser.)
    if !targets.is_empty() {
        // Without --redundancy: no parity, each segment on one target.
        let r = redundancy.unwrap_or(ckptfs_engine::targets::Redundancy { data: 1, parity: 0 });
        Space::format_targets(&dir, size, chunk, config, force, &targets, r, slots)
            .map_err(CliError::from)?;
        mark_codec(&dir)?;
        save_tier(&dir)?;
        println!(
            "ckptfs: formatted {} ({}) over {} targets, redundancy {r}: any {} may be \
             lost",
            dir.display(),
            reserved_words(&dir, size)?,
            targets.len(),
            r.parity
        );
        return Ok(());
    }
    Space::format_slots(&dir, size, chunk, config, force, slots).map_err(CliError::from)?;
    mark_codec(&dir)?;
    save_tier(&dir)?;
    println!(
        "ckptfs: formatted {} ({})",
        dir.display(),
        reserved_words(&dir, size)?
    );
    Ok(())
}

/// What a new space reserved for chunks, as `df`, `stats` and `ckptfs slots` will report it:
/// whole segments (a size that is not a multiple of one is rounded down), and of a
/// multi-slot space each slot's share less its manifest area.
pub(crate) fn reserved_words(dir: &Path, asked: u64) -> Result<String, CliError> {
    use ckptfs_engine::format::SlotId;
    let sb = read_backing_dir(dir, false).map_err(CliError::from)?;
    let seg = sb.segment_bytes as u64;
    let rounded = match sb.segments() * seg == asked {
        true => String::new(),
        false => format!(
            "; {} asked, rounded down to whole {} segments",
            human(asked),
            human(seg)
        ),
    };
    if sb.slots <= 1 {
        return Ok(format!("{} reserved{rounded}", human(sb.segments() * seg)));
    }
    let shares: Vec<u64> = (0..sb.slots)
        .map(|i| {
            let r = sb.slot_segments(SlotId(i));
            (r.end - r.start) * seg
        })
        .collect();
    let (lo, hi) = (
        *shares.iter().min().expect("slots"),
        *shares.iter().max().expect("slots"),
    );
    let each = match lo == hi {
        true => human(lo),
        false => format!("{} to {}", human(lo), human(hi)),
    };
    Ok(format!(
        "{} slots of {each} each for chunks, {} in all with their manifest areas{rounded}",
        sb.slots,
        human(sb.segments() * seg)
    ))
}

pub(crate) fn parse_target(s: &str) -> Result<ckptfs_engine::targets::TargetSpec, CliError> {
    let mut t = ckptfs_engine::targets::TargetSpec::parse(s)?;
    // Recorded absolute: the daemon and offline commands open it from anywhere.
    t.path = absolute(&t.path);
    Ok(t)
}

pub(crate) fn parse_redundancy(s: &str) -> Result<ckptfs_engine::targets::Redundancy, CliError> {
    Ok(ckptfs_engine::targets::Redundancy::parse(s)?)
}
