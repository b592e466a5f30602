//! ckptfs storage engine: the reserved backing space, chunk store, metadata table and commit.
//! Knows nothing of FUSE; the `fs` crate builds filesystem semantics on top of it.

pub mod check;
pub mod codec;
pub mod device;
pub mod error;
pub mod filemap;
pub mod format;
pub mod gc;
pub mod meta;
pub mod pipeline;
pub mod sim;
pub mod space;
pub mod store;

pub use error::{Error, Result};
pub use space::{Space, Stats};
