//! The target suite (`targets.rs`) again on slots over targets: every space it formats
//! has 3 slots (`ckptfs_tests::targets_slots`), the mount claims one, and what a space
//! over targets promises (any K targets lost, damage repaired and named by `check`,
//! parity checked, writes with targets failing) must hold for that slot's files. What a
//! shared space does not have (metadata mirrors, `rebuild --replace`) is refused there
//! with a message, and those tests check the refusal instead.

#[path = "targets.rs"]
mod targets;
