//! From views to kernel arguments: registering memory for a launch ([`args`]), seeing it as
//! rows or heads ([`layout`]), the TMA tensor maps of sm_90 kernels ([`tensor_map`]) and the
//! validators every op shares ([`validate`]).

pub(crate) mod args;
pub(crate) mod layout;
pub(crate) mod pool;
pub mod tensor_map;
pub(crate) mod validate;

pub(crate) use args::{Arg, KernelArgs};
pub(crate) use layout::{Heads, Region, Rows};
pub(crate) use validate::{check_disjoint, check_dtype, check_float, check_shape, grid_x, grid_y, to_i64};
