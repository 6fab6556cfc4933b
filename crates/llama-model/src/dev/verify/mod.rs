//! Layer and model verification: decoder layers through the block composer stage by stage, and
//! whole models layer by layer and by their next-token distributions, against the f64
//! reference. The op cases are [`llama_kernels::dev::verify`].

pub mod block;
pub mod model;
