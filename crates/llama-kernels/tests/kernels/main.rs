//! The kernel crate's tests: every op against the f64 reference on the emulated target (and on
//! a GPU when one is usable), the emulator's own checks, and the device code's freshness. One
//! binary, so that the device code it embeds is linked once.

mod attention;
mod attention_backward;
mod common;
mod cross_entropy;
mod devices_and_tensors;
mod embedding;
mod embedding_backward;
mod emu_conversions;
mod emulator;
mod gpu_graph;
mod interop;
mod linear;
mod linear_backward;
mod lora;
mod mbarrier;
mod moe;
mod optimizer;
mod paged_attention;
mod prebuilt_fresh;
mod properties;
mod ptx_wrappers;
mod qlinear;
mod qlinear_backward;
mod rms_norm;
mod rms_norm_backward;
mod rope;
mod rope_backward;
mod sampling;
mod swiglu;
mod swiglu_backward;
mod tma;
mod warp_specialize;
mod wgmma;
