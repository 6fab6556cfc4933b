//! Test and verification support of the model crate (the `dev` feature): the block and model
//! checks of `verify`, seeded random models and the real test model's path. The generators,
//! tolerances and op cases are the kernel crate's ([`llama_kernels::dev`]).
//!
//! * [`testing`]: seeded random models, the test model's path.
//! * [`verify`]: whole decoder layers stage by stage, and whole models, against the f64
//!   reference.

pub mod testing;
pub mod verify;
