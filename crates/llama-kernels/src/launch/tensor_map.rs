//! TMA tensor maps: how one `cp.async.bulk.tensor` instruction reads a box of a tensor.
//!
//! A map describes a tensor of rank 1 to 5 with dimension 0 innermost and contiguous (the
//! reverse of a row-major shape: a `[rows, cols]` tensor is `dims = [cols, rows]`), the box one
//! copy moves, the swizzle the box gets in shared memory and what elements outside the tensor
//! read as. [`KernelArgs::tensor_map`] checks a layout against the rules of the driver's
//! `cuTensorMapEncodeTiled` and against the tensor it reads (every element the map can address
//! lies in the tensor's buffer), registers the tensor as an input of the launch, and encodes
//! the map for the launching target: the driver's encoding on CUDA, the emulator's
//! (`LlkEmuTensorMap`, kernels/emu/emu_abi.h) on the emulated target. Both targets reject the
//! same layouts, with the same errors. The map travels by value in the kernel's params
//! (`LlkTensorMap`, kernels/params.h); kernels/common/tma.cuh issues the copies.

use crate::backend::Target;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::emu_abi::{LLK_EMU_TENSOR_MAP_TAG, LlkEmuTensorMap};
use crate::ffi::params::LlkTensorMap;
use crate::launch::KernelArgs;

/// The shared-memory swizzle of the boxes a map copies: 16-byte chunk `c` of a row of `span`
/// bytes at shared address `a` lands at chunk `c ^ ((a / 128) % (span / 16))` (none: as is). A
/// swizzled box's rows (`box[0]` elements) are at most the span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaSwizzle {
    /// Rows land as they are.
    None,
    /// A 32-byte span: chunk bit 0 flips with address bit 7.
    B32,
    /// A 64-byte span: chunk bits 0-1 with address bits 7-8.
    B64,
    /// A 128-byte span: chunk bits 0-2 with address bits 7-9 (the layout of wgmma's 128-byte
    /// swizzled operands).
    B128,
}

impl TmaSwizzle {
    /// The span in bytes (0 for none).
    pub fn bytes(self) -> u32 {
        match self {
            TmaSwizzle::None => 0,
            TmaSwizzle::B32 => 32,
            TmaSwizzle::B64 => 64,
            TmaSwizzle::B128 => 128,
        }
    }
}

/// What a box's elements outside the tensor read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaOobFill {
    /// Zeros.
    Zeros,
    /// A NaN (floating-point dtypes only).
    Nan,
}

/// A tensor as TMA copies see it, dimension 0 innermost. Strides are in elements, like every
/// stride of this crate (the map holds bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaLayout {
    /// Elements per dimension (1 to 2^32), dimension 0 contiguous.
    pub dims: Vec<u64>,
    /// Elements from one index of dimension `d + 1` to the next (`rank - 1` of them); each a
    /// multiple of 16 bytes.
    pub strides: Vec<u64>,
    /// The box one copy moves, elements per dimension (1 to 256); `box_dims[0]` times the element
    /// size a multiple of 16 bytes.
    pub box_dims: Vec<u32>,
    /// The swizzle of the boxes in shared memory.
    pub swizzle: TmaSwizzle,
    /// What elements outside the tensor read as.
    pub oob: TmaOobFill,
}

impl TmaLayout {
    /// The bytes one copy moves (and completes on its mbarrier), out-of-bounds elements included.
    pub fn box_bytes(&self, dtype: DType) -> u64 {
        self.box_dims.iter().map(|&b| u64::from(b)).product::<u64>() * dtype.size() as u64
    }

    /// Checks the layout against the encoder's rules; returns the strides in bytes.
    fn check(&self, op: &'static str, dtype: DType) -> Result<Vec<u64>> {
        let rank = self.dims.len();
        let bad = |what: &'static str, value: String, why: &str| Err(Error::invalid(op, what, value, why.to_string()));
        if !(1..=5).contains(&rank) {
            return bad("tensor map dims", format!("{:?}", self.dims), "a tensor map has rank 1 to 5");
        }
        if self.strides.len() != rank - 1 || self.box_dims.len() != rank {
            return bad(
                "tensor map layout",
                format!("{} strides, {} box extents", self.strides.len(), self.box_dims.len()),
                &format!("rank {rank} needs {} strides and {rank} box extents", rank - 1),
            );
        }
        let esize = dtype.size() as u64;
        if !matches!(esize, 1 | 2 | 4 | 8) {
            return bad("tensor map dtype", dtype.to_string(), "TMA copies elements of 1, 2, 4 or 8 bytes");
        }
        if self.oob == TmaOobFill::Nan && !dtype.is_float() {
            return bad("tensor map oob", dtype.to_string(), "a NaN fill needs a floating-point dtype");
        }
        if let Some(d) = self.dims.iter().find(|&&d| d == 0 || d > 1 << 32) {
            return bad("tensor map dims", d.to_string(), "each dimension holds 1 to 2^32 elements");
        }
        if let Some(b) = self.box_dims.iter().find(|&&b| b == 0 || b > 256) {
            return bad("tensor map box", b.to_string(), "each box extent is 1 to 256 elements");
        }
        let mut bytes = Vec::with_capacity(rank - 1);
        for &s in &self.strides {
            match s.checked_mul(esize) {
                Some(b) if b % 16 == 0 && b < 1 << 40 => bytes.push(b),
                _ => {
                    return bad(
                        "tensor map strides",
                        s.to_string(),
                        "each stride is a multiple of 16 bytes below 2^40",
                    );
                }
            }
        }
        let inner = u64::from(self.box_dims[0]) * esize;
        if inner % 16 != 0 {
            return bad("tensor map box", inner.to_string(), "the inner box extent is a multiple of 16 bytes");
        }
        let span = u64::from(self.swizzle.bytes());
        if span != 0 && inner > span {
            return bad(
                "tensor map box",
                inner.to_string(),
                &format!("the inner box extent exceeds the {span}-byte swizzle"),
            );
        }
        Ok(bytes)
    }
}

impl<'a> KernelArgs<'a> {
    /// Registers `t` as an input and returns the tensor map of `layout` over it, its first
    /// element (coordinates all 0) at `t`'s first element. Every element the layout can address
    /// must lie in `t`'s buffer, whose first element must be 16-byte aligned. (The Hopper
    /// kernels map views with [`KernelArgs::tensor_map_at`]; the TMA self-test maps whole tensors.)
    #[cfg(feature = "dev")]
    pub fn tensor_map(
        &mut self,
        what: &'static str,
        t: &'a crate::tensor::Tensor,
        layout: &TmaLayout,
    ) -> Result<LlkTensorMap> {
        let op = self.op();
        let strides = layout.check(op, t.dtype())?;
        let esize = t.dtype().size() as u64;
        // The last byte the map can address, from the tensor's first element.
        let reach = layout
            .dims
            .iter()
            .zip(std::iter::once(&esize).chain(&strides))
            .try_fold(esize, |acc, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| x.checked_add(acc)));
        let available = (t.storage().bytes() as u64).saturating_sub((t.offset() * t.dtype().size()) as u64);
        match reach {
            Some(r) if r <= available => {}
            _ => {
                return Err(Error::invalid(
                    op,
                    what,
                    format!("{:?} with strides {:?}", layout.dims, layout.strides),
                    format!("the tensor map reaches past the tensor's {available} bytes"),
                ));
            }
        }
        let address = self.read_tensor(what, t)?;
        self.encode(what, address, t.dtype(), layout, &strides)
    }

    /// The tensor map of `layout` over elements of `dtype` from `address`, the first element of
    /// a view already registered with this launch whose own dims and strides `layout` repeats
    /// (so that every element the map addresses is in the view).
    pub fn tensor_map_at(
        &self,
        what: &'static str,
        address: u64,
        dtype: DType,
        layout: &TmaLayout,
    ) -> Result<LlkTensorMap> {
        let strides = layout.check(self.op(), dtype)?;
        self.encode(what, address, dtype, layout, &strides)
    }

    /// Encodes a checked `layout` (its strides in bytes) for the launching target.
    fn encode(
        &self,
        what: &'static str,
        address: u64,
        dtype: DType,
        layout: &TmaLayout,
        strides: &[u64],
    ) -> Result<LlkTensorMap> {
        if address % 16 != 0 {
            return Err(Error::invalid(
                self.op(),
                what,
                format!("{address:#x}"),
                "a tensor map's base is 16-byte aligned",
            ));
        }
        match self.device().target() {
            Target::Emulated => Ok(emulated(address, dtype, layout, strides)),
            Target::Cuda => cuda(address, dtype, layout, strides),
        }
    }
}

/// The emulator's encoding (kernels/emu/emu_abi.h) in the opaque map.
fn emulated(address: u64, dtype: DType, layout: &TmaLayout, strides: &[u64]) -> LlkTensorMap {
    let mut m = LlkEmuTensorMap {
        tag: LLK_EMU_TENSOR_MAP_TAG,
        global_address: address,
        dims: [1; 5],
        strides: [0; 4],
        box_: [1; 5],
        rank: layout.dims.len() as u32,
        element_bytes: dtype.size() as u32,
        swizzle_bytes: layout.swizzle.bytes(),
        oob_nan: u32::from(layout.oob == TmaOobFill::Nan),
        reserved: 0,
    };
    m.dims[..layout.dims.len()].copy_from_slice(&layout.dims);
    m.strides[..strides.len()].copy_from_slice(strides);
    m.box_[..layout.box_dims.len()].copy_from_slice(&layout.box_dims);
    const _: () = assert!(size_of::<LlkEmuTensorMap>() == size_of::<LlkTensorMap>());
    let mut out = LlkTensorMap { opaque: [0; 16] };
    // SAFETY: both are plain-old-data structs of 128 bytes (asserted above) without padding
    // that is read: the destination is a u64 array, so any bit pattern is valid, and the source
    // is a fully initialized value read as bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&raw const m).cast::<u8>(),
            (&raw mut out).cast::<u8>(),
            size_of::<LlkEmuTensorMap>(),
        );
    }
    out
}

/// The driver's encoding, by cuTensorMapEncodeTiled.
fn cuda(address: u64, dtype: DType, layout: &TmaLayout, strides: &[u64]) -> Result<LlkTensorMap> {
    use cudarc::driver::sys::{
        CUtensorMap, CUtensorMapDataType as D, CUtensorMapFloatOOBfill as F, CUtensorMapInterleave,
        CUtensorMapL2promotion, CUtensorMapSwizzle as S, cuTensorMapEncodeTiled,
    };
    let data_type = match dtype {
        DType::BF16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::I32 => D::CU_TENSOR_MAP_DATA_TYPE_INT32,
        d if d.size() == 1 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        d => return Err(Error::invalid("tensor_map", "dtype", d, "no CUDA tensor-map data type")),
    };
    let swizzle = match layout.swizzle {
        TmaSwizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
        TmaSwizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        TmaSwizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
        TmaSwizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    let oob = match layout.oob {
        TmaOobFill::Zeros => F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        TmaOobFill::Nan => F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
    };
    let element_strides = [1u32; 5];
    let mut map = CUtensorMap { opaque: [0; 16] };
    // SAFETY: the arrays hold `rank` dims and box extents and `rank - 1` strides, as the call
    // reads (checked by TmaLayout::check); `map` is a writable 128-byte aligned CUtensorMap. The
    // driver only encodes: `address` is not dereferenced here. A CUDA device exists, so the
    // driver library is loaded.
    unsafe {
        cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            layout.dims.len() as u32,
            address as *mut std::ffi::c_void,
            layout.dims.as_ptr(),
            strides.as_ptr(),
            layout.box_dims.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            oob,
        )
        .result()?;
    }
    Ok(LlkTensorMap { opaque: map.opaque })
}
