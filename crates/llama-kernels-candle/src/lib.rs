//! wip
#![warn(missing_debug_implementations, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod bridge;
pub mod nn;
pub mod ops;
pub mod unfused;

pub use ops::*;
