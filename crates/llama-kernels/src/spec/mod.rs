//! The specification's vocabulary: what each op computes, as types both the kernels' wrappers
//! ([`crate::ops`]) and the f64 reference ([`crate::reference`]) are written against. Nothing here
//! knows how a kernel is launched.

pub mod attention;
pub mod dropout;
pub mod layer;
pub mod lora;
pub mod moe;
pub mod quant;
pub mod quant_nf4;
pub mod rope;
pub mod sampling;
pub mod weights;
