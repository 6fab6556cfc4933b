//! The C ABI shared with the kernels, as bindgen mirrors of the headers (generated, committed,
//! checked for staleness by `xtask/tests/params_mirror.rs`; regenerate with `cargo xtask regen-params`).
//!
//! * [`params`]: `kernels/params.h`, one params struct per kernel family plus every tile and
//!   shared-memory constant both sides need.
//! * [`emu_abi`]: `kernels/emu/emu_abi.h`, the emulator's launch and report structs.
//!
//! Crate-private: the safe API in [`crate::ops`] is the only way to fill these structs. The
//! `dev` feature shows the constants of [`params`] to tools that model the kernels
//! (`dev::geometry`).

// bindgen's generated `Default` impls zero the structs in unsafe blocks it does not comment.
#[allow(clippy::undocumented_unsafe_blocks)]
pub(crate) mod emu_abi;
// Generated: the header documents each constant and field.
#[allow(clippy::undocumented_unsafe_blocks, missing_docs)]
pub mod params;
