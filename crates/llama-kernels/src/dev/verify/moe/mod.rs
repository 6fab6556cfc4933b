//! MoE cases: each stage (route, align, gather, grouped GEMM, combine) and the whole layer,
//! against the f64 reference in `reference::moe`.

mod cases;
mod common;
mod ffn;
mod gemm;
mod permute;
mod route;

pub use cases::moe_cases;
pub use common::{NEAR_TIE, ROUTE_WEIGHT_TOLERANCE, moe_tolerance};
pub use ffn::*;
pub use gemm::*;
pub use permute::*;
pub use route::*;
