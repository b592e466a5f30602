//! The engine as the filesystem layer (`fs`) sees it, besides `Space` and `Error`: the value
//! types of files, the namespace and the shared namespace's manifests, the file states, a
//! few functions (advice, check) and the bounds `fs` sizes its own work by. `fs` imports
//! from here and nowhere else in the engine (`engine/ARCHITECTURE.md`), so what it depends
//! on is one list, and a change below that does not touch it does not touch `fs`.

pub use crate::advice::{render as render_advice, report as advice_report};
pub use crate::alloc::GC_RESERVE_SEGMENTS;
pub use crate::catalog::ns::{RenameHow, Replaced, XattrHow};
pub use crate::catalog::DirEntry;
pub use crate::clock;
pub use crate::error::NsFault;
pub use crate::format::{
    owner_slot, Binding, ChunkHash, Extent, HistoryId, HistoryRecord, InodeId, InodeRecord,
    NodeKind, RevisionId, SlotId, Timestamp, VersionMeta, Xattrs, XATTR_NAMES_ROOM, XATTR_NAME_MAX,
    XATTR_VALUES_ROOM, XATTR_VALUE_MAX,
};
pub use crate::maintenance::auto::AutoGc;
pub use crate::maintenance::check::{check as check_space, CheckReport};
pub use crate::maintenance::gc::{GcOptions, GcProgress, GcReport};
pub use crate::maintenance::schedule::Wake;
pub use crate::manifest::{PubExtent, PubNode, PubVersion, Record, SlotView};
pub use crate::nslock::{dir_key, name_key, RENAME_DIRS};
pub use crate::pins::RevisionPin;
pub use crate::read::ReadAhead;
pub use crate::space::{Previous, Seal};
pub use crate::stamp::to_time;
pub use crate::store::CACHE_BYTES;
pub use crate::write::pipeline::SharedBytes;
pub use crate::write::sweep::{with_room, OpenFiles, Sweeper};
pub use crate::write::{ExtentMap, FileState, ReadPart};
