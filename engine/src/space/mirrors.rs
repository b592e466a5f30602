//! The metadata mirrors a read-write mount of a space over targets keeps (`mirror.rs`):
//! what `watch` and `ckptfs scrub` ask of them.

use super::*;

impl Space {
    /// Drops the metadata mirror holders whose copies were removed or replaced while
    /// mounted (`MirrorDevice::watch`, for each mirrored file): (target, what happened).
    pub(crate) fn watch_mirrors(&self) -> Vec<(usize, String)> {
        self.layout
            .mirrored
            .iter()
            .flat_map(|(_, d)| d.watch())
            .collect()
    }

    /// `ckptfs scrub`'s check of the metadata mirrors (`mirror.rs`): every current holder's
    /// copies of the metadata table and the placement records are compared with the primary
    /// block by block, its superblock and targets table as whole files, and whatever
    /// differs is rewritten from the primary (the copy the daemon reads and trusts). Damage
    /// on a holder's disk was found by nothing before: `ckptfs recover` would have rebuilt a
    /// lost backing directory from it.
    pub(crate) fn verify_mirrors(&self, rep: &mut crate::targets::RebuildReport) {
        // A copy removed or replaced under its open file compares whole (the open file is
        // what `verify` reads) yet is not what `recover` would find: such a holder is
        // dropped, and said here.
        for (t, why) in self.watch_mirrors() {
            rep.mirror_failures.push(format!(
                "target {t}: its metadata mirror {why}: no longer a mirror; the next mount \
                 copies the metadata to a healthy target again"
            ));
        }
        for (name, dev) in &self.layout.mirrored {
            for (t, r) in dev.verify() {
                match r {
                    Ok(c) => {
                        rep.mirror_copies_checked += 1;
                        rep.mirror_blocks_rewritten += c.blocks_rewritten;
                        if c.blocks_rewritten > 0 || c.length_fixed {
                            log::error!(
                                "the metadata mirror on target {t}: its {name} differed from \
                                 the primary in {} 4 KiB block(s){}; rewritten from the primary",
                                c.blocks_rewritten,
                                if c.length_fixed { " and in length" } else { "" }
                            );
                        }
                    }
                    Err(e) => rep.mirror_failures.push(format!(
                        "target {t}: its {name} could not be compared or mended ({e}): no \
                         longer a mirror; the next mount copies the metadata to a healthy \
                         target again"
                    )),
                }
            }
        }
        let Some(table) = self
            .layout
            .targets_table
            .as_ref()
            .filter(|_| !self.layout.mirrored.is_empty())
        else {
            return;
        };
        // Under the table's lock: `store_table` writes the table and its copies under it.
        let t = table.lock();
        for (i, spec) in t.targets.iter().enumerate() {
            if !t.mirror[i] {
                continue;
            }
            for (from, name) in [
                (SUPERBLOCK_FILE, crate::mirror::MIRROR_SUPERBLOCK),
                (crate::targets::TARGETS_FILE, crate::mirror::MIRROR_TABLE),
            ] {
                let r = (|| -> Result<bool> {
                    let want = fs::read(self.dir().join(from))?;
                    if fs::read(spec.path.join(name)).ok().as_deref() == Some(&want[..]) {
                        return Ok(false);
                    }
                    write_file_durably(&spec.path, name, &want)?;
                    Ok(true)
                })();
                match r {
                    Ok(false) => {}
                    Ok(true) => {
                        rep.mirror_files_rewritten += 1;
                        log::warn!(
                            "the metadata mirror on target {i}: its {name} differed from the \
                             primary's {from} (damaged, or not updated since the mount \
                             copied it); rewritten"
                        );
                    }
                    Err(e) => rep.mirror_failures.push(format!(
                        "target {i}: its {name} could not be compared or rewritten: {e}"
                    )),
                }
            }
        }
    }
}
