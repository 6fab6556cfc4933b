//! The candle ops against candle's own unfused computation in f64, forward and gradients
//! (candle's autograd through our `bwd` vs through its plain ops), on the CPU (the emulated
//! target), plus named errors for bad input.

mod attention;
mod block;
mod common;
mod cross_entropy;
mod errors;
mod lora;
mod nn;
mod paged_decode;
mod qlinear;
mod rms_norm;
mod rope;
mod swiglu;
