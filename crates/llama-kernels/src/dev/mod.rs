//! Test and verification support (the `dev` feature): what this crate's own tests, benches and
//! command-line front end use, and what a user's CI can reuse to check the kernels on its
//! machines. Not needed to call the kernels.
//!
//! * [`testing`]: a seeded generator, per-dtype tolerances, comparisons that name the worst
//!   element, and seeded random layer weights.
//! * [`verify`]: every op, and whole decoder layers stage by stage, against the f64 reference.
//! * [`build`]: what the build found (the CUDA tools, the device-code folder).
//! * [`geometry`]: every kernel's launch geometry, for tools that model the kernels.
//! * [`selftest`]: emulator self-test kernels (warp operations, barriers, cp.async).

pub mod build;
pub mod geometry;
pub mod selftest;
pub mod testing;
pub mod verify;

/// Every kernel the library's wrappers and the self-tests may load, for static checks: each
/// exists in the PTX of both architectures and in the emulated registry, and every PTX entry
/// is reachable from exactly one of them.
pub fn kernel_symbols() -> Vec<crate::KernelRef> {
    let mut v = crate::kernels::all();
    v.extend(selftest::kernel_symbols());
    v
}
