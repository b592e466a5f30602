//! Layouts: where a space's bytes live on the backing storage (one data file, a slot's share
//! of it, erasure-coded targets, a slot's share of every target, metadata mirrors), and the
//! one way to open them: `open(dir, Mode)`, whose `Opened` a `Space` is composed of
//! (`Space::open`, `Space::compose`). A layout is composed, not forked: slots over targets is
//! a slot's placement over the erasure placement. Fault injection (`CKPTFS_FAULTS`) wraps
//! every device once, in `open`.
//!
//! `dir`: the backing directory's own files (superblock, lock). `targets`: the targets table,
//! its copies and the metadata mirrors on the targets, `recover` from them, and opening the
//! targets. `open`: the modes and the composition of each layout.

use crate::device::{Device, FileDevice};
use crate::error::{Corruption, Error, Result};
use crate::format::*;
use crate::manifest::{Publisher, Union};
use crate::placement::Placement;
use crate::slots::{FencedDevice, Lease, SlotRequest, SlotTable};
use crate::targets::TargetsTable;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod dir;
mod open;
pub mod targets;

pub use dir::*;
pub(crate) use open::{claimed, slot_data_file, table_on, SlotData};
pub use open::{open, slot_table, Mode, Opened};
pub use targets::*;

/// Environment variable naming I/O faults to inject (tests only; see `sim::parse_faults`).
pub(crate) const FAULTS_ENV: &str = "CKPTFS_FAULTS";

/// The devices a space keeps its bytes on: the reserved data file and the metadata table.
#[derive(Clone)]
pub struct Devices {
    pub data: Arc<dyn Device>,
    pub meta: Arc<dyn Device>,
}

/// The parts of a space only some layouts have, owned here rather than as a field each of
/// `Space`'s: a single-slot space on one data file has none of them.
#[derive(Default)]
pub struct Layout {
    /// Of a multi-slot space: this slot's manifest writer, and the other slots' manifests.
    pub(crate) publisher: Option<Publisher>,
    pub(crate) union: Option<Arc<Union>>,
    /// Of a slot of a shared namespace: its clock (`stamp`), set once the slot's table says
    /// where it stands (`Space::compose`).
    pub(crate) clock: Option<Arc<crate::stamp::Clock>>,
    /// The storage targets of a space over several (`format --target`): their state for
    /// `ckptfs targets` and `stats`.
    pub(crate) targets: Option<Arc<crate::targets::Erasure>>,
    pub(crate) targets_table: Option<SharedTable>,
    /// Of a read-write mount of a space over several targets: the devices written to the
    /// metadata mirrors too (`mirror.rs`), which `ckptfs scrub` verifies.
    pub(crate) mirrored: MirroredDevices,
    /// What this open found differing on the old holders' metadata mirrors, and rewrote
    /// (`targets::refresh_mirrors`): `ckptfs check` reports it.
    pub(crate) mirror_findings: Vec<String>,
    /// The lease of a slot of a multi-slot space. Last, so it is released after the other
    /// parts (and, `Layout` being `Space`'s last field, after its table and store) closed.
    pub(crate) lease: Option<crate::slots::LeaseGuard>,
}
