//! Kernels that test the emulation runtime itself (kernels/selftest.cu).
//!
//! The `Correct` variants run on every target and must agree with the plain-Rust expectations
//! in the tests; the `PlantedBug` variants carry a bug (missing barrier, a lane skipping a
//! shuffle, divergent barriers) that the emulator must expose. Never launch a planted bug on a
//! GPU: a deadlock there hangs the device, which is exactly what the emulator exists to prevent.

use crate::backend::{Device, KernelRef, LaunchDims, Target};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    Fp8ConvertParams, LLK_MBARRIER_TEST_DATA, LLK_MBARRIER_TEST_MAX_STAGES, LLK_MBARRIER_TEST_MAX_TILES,
    LLK_MBARRIER_TEST_TILE, LLK_TMA_TEST_BLOCK, LLK_TMA_TEST_HEADER, LLK_TMA_TEST_SMEM, LLK_WGMMA_TEST_A,
    LLK_WGMMA_TEST_C, LLK_WGMMA_TEST_IMAGE, LLK_WGMMA_TEST_SMEM, LLK_WS_TEST_BLOCK, LLK_WS_TEST_DATA,
    LLK_WS_TEST_MAX_ROUNDS, LlkSelftestVariant, LlkTensorMap, SelftestParams,
};
use crate::launch::KernelArgs;
use crate::launch::tensor_map::TmaLayout;
use crate::launch::{check_dtype, grid_x, to_i64};
use crate::tensor::Tensor;

/// Threads per block of `selftest_stencil` (kBlock in kernels/selftest.cu).
pub const STENCIL_BLOCK: usize = 256;

/// Where `selftest_wgmma`'s input puts each part, in 32-bit words (kernels/params.h): the
/// accumulators, the A fragments and the shared-memory image; and the image's size in bytes.
pub const WGMMA_ACCUMULATORS: usize = LLK_WGMMA_TEST_C as usize;
pub const WGMMA_A_FRAGMENTS: usize = LLK_WGMMA_TEST_A as usize;
pub const WGMMA_IMAGE: usize = LLK_WGMMA_TEST_IMAGE as usize;
pub const WGMMA_SMEM_BYTES: usize = LLK_WGMMA_TEST_SMEM as usize;
/// `Kernel::Mbarrier`: the first input word of the tiles, the floats of one tile, at most so many
/// tiles, stages.
pub const MBARRIER_DATA: usize = LLK_MBARRIER_TEST_DATA as usize;
pub const MBARRIER_TILE: usize = LLK_MBARRIER_TEST_TILE as usize;
pub const MBARRIER_MAX_TILES: usize = LLK_MBARRIER_TEST_MAX_TILES as usize;
pub const MBARRIER_MAX_STAGES: usize = LLK_MBARRIER_TEST_MAX_STAGES as usize;
const MBARRIER_INPUT_WORDS: usize = MBARRIER_DATA + MBARRIER_MAX_TILES * MBARRIER_TILE;
const MBARRIER_BLOCK: usize = 32 + MBARRIER_TILE;
/// `Kernel::Tma`: the header words (its input), the dynamic shared memory in bytes; its output
/// is that memory as 32-bit words, the barrier's last 8 bytes excepted.
pub const TMA_HEADER: usize = LLK_TMA_TEST_HEADER as usize;
pub const TMA_SMEM_BYTES: usize = LLK_TMA_TEST_SMEM as usize;
pub const TMA_OUT_WORDS: usize = TMA_SMEM_BYTES / 4 - 2;
/// `Kernel::WarpSpecialize`: the first input word of the rounds, and at most so many rounds.
pub const WS_DATA: usize = LLK_WS_TEST_DATA as usize;
pub const WS_MAX_ROUNDS: usize = LLK_WS_TEST_MAX_ROUNDS as usize;

/// Which version of a self-test kernel to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Correct,
    PlantedBug,
}

/// The self-test kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// 3-point stencil through shared memory (`in: f32 [n]` -> `out: f32 [n]`); bug: no barrier.
    Stencil,
    /// Warp shuffle then barrier (`out: f32 [block]`); bug: only lane 0 shuffles (deadlock).
    Deadlock,
    /// A barrier (`out: f32 [block]`); bug: half the block at another barrier.
    DivergentBarrier,
    /// Every shuffle and vote (`out: i32 [8 * threads]`).
    WarpOps,
    /// Per-block reversal through dynamic shared memory (`in`, `out: f32 [n]`), sized at launch.
    DynSmem,
    /// The same through exactly the dynamic shared memory its row declares
    /// (`LLK_DECLARED_SMEM_TEST_BYTES`, one block of `LLK_DECLARED_SMEM_TEST_BLOCK` threads;
    /// `in`, `out: f32 [block]`); bug: a write of the float past the declaration.
    DeclaredSmem,
    /// atomicAdd of thread indices and counts (`out: i32 [2]`, zeroed by the caller).
    Atomics,
    /// Shuffle edge cases (`out: i32 [6 * threads]`): offsets mod 32, widths, segments.
    ShflEdges,
    /// Emulator guards (`out: f32 [block]`, blocks of 64 threads); `n` picks one, each with its
    /// planted bug: 1 dynamic shared memory (a write past the launch's size), 2 warp operations
    /// (half a warp shuffles, half votes), 3 a static `__shared__` array (an index one past its
    /// end), 4 params (a read of the byte after the struct), 5 and 6 a 16-byte vector load and
    /// store 4 bytes off alignment, 7 and 8 `cp.async` with a misaligned shared destination and
    /// global source, 9 `ldmatrix` with a misaligned row address, 10 a local array indexed past
    /// its end.
    Guards,
    /// Always a planted bug, emulated only: 96 KiB of locals per thread (`out: f32 [block]`).
    StackHog,
    /// One bf16 `mma.m16n8k16` (`in: f32 [A 16x16 | B^T 8x16 | C 16x8]`, `out: f32 [16x8]`).
    MmaBf16,
    /// The same in f16.
    MmaF16,
    /// ldmatrix x1/x2/x4, plain and .trans (`in: f32 [4][8][8]`, `out: i32 [6][32][4]`).
    Ldmatrix,
    /// cp.async with zero-fill (`in: f32 [32][4]`, `out: f32 [32][4]`).
    CpAsync,
    /// `out[i] = 1` for `i < n` (`in: f32 [1]`, `out: f32 [n]`); bug: thread 0 also writes
    /// `out[n + in[0]]`, outside the buffer (emulated only).
    OutOfBounds,
    /// `out[i] = 1` for `i < n` (`out: f32 [n]`), with `__launch_bounds__(128, 4)`: a launch
    /// with larger blocks is the planted bug.
    BoundedFill,
    /// `fast_exp2`, `fast_rcp` and `__fadd_rn(__fmul_rn(x, x), c)` (`in: f32 [x: n | c: n]`,
    /// `out: f32 [3][n]`).
    FastMath,
    /// `__byte_perm(x, y, s & 0x7777)`, the bf16 pair sum of x and y and `llk::prmt(x, y, s)`
    /// (`prmt.b32`, sign replication included; `in: f32 [n][x, y, s]` as bits, `out: i32 [n][3]`).
    BytePerm,
    /// One warpgroup's `wgmma.mma_async` (one block of 128 threads, dynamic shared memory
    /// `LLK_WGMMA_TEST_SMEM`): `in: f32 [LLK_WGMMA_TEST_IMAGE + LLK_WGMMA_TEST_SMEM / 4]` as bits
    /// (header, accumulators, A fragments, shared-memory image: kernels/params.h),
    /// `out: f32 [128][N/2]`. Needs an sm_90a build on a GPU (the prebuilt sm_90 code traps).
    Wgmma,
    /// A producer/consumer pipeline on mbarriers and bulk copies (one block of 96 threads,
    /// dynamic shared memory `LLK_MBARRIER_TEST_SMEM`): `in: f32 [LLK_MBARRIER_TEST_DATA +
    /// tiles * 64]` (header words as bits, then the tiles), `out: f32 [tiles][64]`,
    /// `out[i][c] = 2 tile[i][c] + i` (kernels/params.h). Needs sm_90 on a GPU.
    Mbarrier,
    /// Two warpgroups taking turns on a shared-memory slot through named barriers, with
    /// setmaxnreg and elect.sync (one block of 256 threads): `in: f32 [WS_DATA + rounds * 128]`
    /// (header words as bits, then the rounds), `out: f32 [rounds][128]` with
    /// `out[r][i] = 3 data[r][i] + r`, then the lane each of the 8 warps elected. Needs sm_90.
    WarpSpecialize,
    /// One tensor copy (`cp.async.bulk.tensor`) from the tensor map of [`launch_tma`] (one block
    /// of 64 threads, dynamic shared memory `TMA_SMEM_BYTES`): `in: f32 [TMA_HEADER]` as bits
    /// (rank, coordinates, destination offset, bytes: kernels/params.h), `out: f32
    /// [TMA_OUT_WORDS]`, shared memory after the copy. Through [`launch`] its map is all zeros.
    /// Needs sm_90 on a GPU.
    Tma,
}

impl Kernel {
    fn symbol(self) -> &'static str {
        match self {
            Kernel::Stencil => "selftest_stencil",
            Kernel::Deadlock => "selftest_deadlock",
            Kernel::DivergentBarrier => "selftest_divergent_barrier",
            Kernel::WarpOps => "selftest_warp_ops",
            Kernel::DynSmem => "selftest_dyn_smem",
            Kernel::DeclaredSmem => "selftest_declared_smem",
            Kernel::Atomics => "selftest_atomics",
            Kernel::ShflEdges => "selftest_shfl_edges",
            Kernel::Guards => "selftest_guards",
            Kernel::StackHog => "selftest_stack_hog",
            Kernel::MmaBf16 => "selftest_mma_bf16",
            Kernel::MmaF16 => "selftest_mma_f16",
            Kernel::Ldmatrix => "selftest_ldmatrix",
            Kernel::CpAsync => "selftest_cp_async",
            Kernel::OutOfBounds => "selftest_out_of_bounds",
            Kernel::BoundedFill => "selftest_bounded_fill",
            Kernel::FastMath => "selftest_fast_math",
            Kernel::BytePerm => "selftest_byte_perm",
            Kernel::Wgmma => "selftest_wgmma",
            Kernel::Mbarrier => "selftest_mbarrier",
            Kernel::WarpSpecialize => "selftest_warp_specialize",
            Kernel::Tma => "selftest_tma",
        }
    }
    pub const ALL: [Kernel; 22] = [
        Kernel::Stencil,
        Kernel::Deadlock,
        Kernel::DivergentBarrier,
        Kernel::WarpOps,
        Kernel::DynSmem,
        Kernel::DeclaredSmem,
        Kernel::Atomics,
        Kernel::ShflEdges,
        Kernel::Guards,
        Kernel::StackHog,
        Kernel::MmaBf16,
        Kernel::MmaF16,
        Kernel::Ldmatrix,
        Kernel::CpAsync,
        Kernel::OutOfBounds,
        Kernel::BoundedFill,
        Kernel::FastMath,
        Kernel::BytePerm,
        Kernel::Wgmma,
        Kernel::Mbarrier,
        Kernel::WarpSpecialize,
        Kernel::Tma,
    ];
    /// Warp-level PTX checks: one warp, fixed input and output sizes (in, out elements).
    fn fixed_io(self) -> Option<(usize, usize)> {
        match self {
            Kernel::MmaBf16 | Kernel::MmaF16 => Some((512, 128)),
            Kernel::Ldmatrix => Some((256, 6 * 32 * 4)),
            Kernel::CpAsync => Some((128, 128)),
            Kernel::Wgmma => Some(((LLK_WGMMA_TEST_IMAGE + LLK_WGMMA_TEST_SMEM / 4) as usize, 128 * 128)),
            Kernel::Mbarrier => Some((MBARRIER_INPUT_WORDS, MBARRIER_MAX_TILES * MBARRIER_TILE)),
            Kernel::WarpSpecialize => Some((WS_DATA + WS_MAX_ROUNDS * 128, WS_MAX_ROUNDS * 128 + 8)),
            Kernel::Tma => Some((TMA_HEADER, TMA_OUT_WORDS)),
            _ => None,
        }
    }
}

/// The symbols of this family, for static checks.
pub fn kernel_symbols() -> impl Iterator<Item = KernelRef> {
    Kernel::ALL
        .into_iter()
        .map(|k| KernelRef { module: "selftest", symbol: k.symbol() })
        .chain(std::iter::once(FP8_CONVERT))
}

/// Launches a self-test kernel over `threads` threads in blocks of `block` threads.
/// `input` is needed by `Stencil` and `DynSmem`; `n` is the element count the kernel guards on.
pub fn launch(
    kernel: Kernel,
    variant: Variant,
    input: Option<&Tensor>,
    out: &Tensor,
    n: usize,
    threads: usize,
    block: usize,
) -> Result<()> {
    launch_with_dyn_smem(kernel, variant, input, out, n, threads, block, None)
}

/// [`launch`] with `dyn_smem` bytes of dynamic shared memory instead of what the kernel needs
/// (`None`: what it needs), for launches that test the shared-memory limits.
#[allow(clippy::too_many_arguments)]
pub fn launch_with_dyn_smem(
    kernel: Kernel,
    variant: Variant,
    input: Option<&Tensor>,
    out: &Tensor,
    n: usize,
    threads: usize,
    block: usize,
    dyn_smem: Option<u32>,
) -> Result<()> {
    launch_inner(kernel, variant, input, out, n, threads, block, dyn_smem, None)
}

/// Runs [`Kernel::Tma`]: one tensor copy from the map of `layout` over `source`, as the header
/// `input` (rank, coordinates, destination offset, bytes) says; `out` receives shared memory.
pub fn launch_tma(variant: Variant, source: &Tensor, layout: &TmaLayout, input: &Tensor, out: &Tensor) -> Result<()> {
    launch_inner(Kernel::Tma, variant, Some(input), out, 0, 0, 0, None, Some((source, layout)))
}

#[allow(clippy::too_many_arguments)]
fn launch_inner(
    kernel: Kernel,
    variant: Variant,
    input: Option<&Tensor>,
    out: &Tensor,
    n: usize,
    threads: usize,
    block: usize,
    dyn_smem: Option<u32>,
    tensor_map: Option<(&Tensor, &TmaLayout)>,
) -> Result<()> {
    const OP: &str = "selftest";
    if (variant == Variant::PlantedBug || kernel == Kernel::StackHog) && out.device().target() == Target::Cuda {
        return Err(Error::invalid(OP, "variant", "PlantedBug", "planted bugs run on the emulated target only"));
    }
    let (block, threads) = match kernel {
        Kernel::Stencil => (STENCIL_BLOCK, threads),
        Kernel::Wgmma => (128, 128),
        Kernel::Mbarrier => (MBARRIER_BLOCK, MBARRIER_BLOCK),
        Kernel::WarpSpecialize => (LLK_WS_TEST_BLOCK as usize, LLK_WS_TEST_BLOCK as usize),
        Kernel::Tma => (LLK_TMA_TEST_BLOCK as usize, LLK_TMA_TEST_BLOCK as usize),
        k if k.fixed_io().is_some() => (32, 32),
        _ => (block, threads),
    };
    if block == 0 || block > 1024 {
        return Err(Error::invalid(OP, "block", block, "must be 1..=1024"));
    }
    let out_dtype = if matches!(
        kernel,
        Kernel::WarpOps | Kernel::Atomics | Kernel::Ldmatrix | Kernel::ShflEdges | Kernel::BytePerm
    ) {
        DType::I32
    } else {
        DType::F32
    };
    check_dtype(OP, "out", out.dtype(), out_dtype)?;
    let (n, needed) = match kernel.fixed_io() {
        Some((inputs, outputs)) => (inputs, outputs),
        None => match kernel {
            Kernel::WarpOps => (n, 8 * threads),
            Kernel::ShflEdges => (n, 6 * threads),
            Kernel::Guards | Kernel::StackHog => (n, block),
            Kernel::Atomics => (n, 2),
            Kernel::FastMath => (n, 3 * n),
            Kernel::BytePerm => (n, 3 * n),
            Kernel::Deadlock | Kernel::DivergentBarrier => (n, n.min(block)),
            _ => (n, n),
        },
    };
    if !out.is_contiguous() || out.numel() < needed {
        return Err(Error::invalid(OP, "out", out.numel(), format!("needs {needed} contiguous elements")));
    }
    let inputs = match kernel {
        Kernel::OutOfBounds => 1,
        Kernel::FastMath => 2 * n,
        Kernel::BytePerm => 3 * n,
        _ => n,
    };
    if let Some(i) = input {
        check_dtype(OP, "in", i.dtype(), DType::F32)?;
        if !i.is_contiguous() || i.numel() < inputs {
            return Err(Error::invalid(OP, "in", i.numel(), format!("needs {inputs} contiguous elements")));
        }
    } else if matches!(
        kernel,
        Kernel::Stencil
            | Kernel::DynSmem
            | Kernel::DeclaredSmem
            | Kernel::OutOfBounds
            | Kernel::FastMath
            | Kernel::BytePerm
    ) || kernel.fixed_io().is_some()
    {
        return Err(Error::invalid(OP, "in", "None", "this kernel reads an input"));
    }
    let mut args = KernelArgs::new(OP, out.device());
    let tensor_map = match tensor_map {
        Some((source, layout)) => args.tensor_map("source", source, layout)?,
        None => LlkTensorMap { opaque: [0; 16] },
    };
    let params = SelftestParams {
        input: match input {
            Some(i) => args.read_tensor("in", i)?,
            None => 0,
        },
        out: args.write_tensor("out", out)?,
        n: to_i64(
            OP,
            "n",
            match kernel {
                Kernel::WarpOps => 8 * threads,
                Kernel::ShflEdges => 6 * threads,
                _ => n,
            },
        )?,
        variant: match variant {
            Variant::Correct => LlkSelftestVariant::LLK_SELFTEST_CORRECT,
            Variant::PlantedBug => LlkSelftestVariant::LLK_SELFTEST_PLANTED_BUG,
        },
        tensor_map,
    };
    let dims = LaunchDims {
        grid: (grid_x(OP, threads.div_ceil(block))?, 1, 1),
        block: (block as u32, 1, 1),
        // Kernels sized at launch take `dyn_smem` (by default a float per thread); the others
        // run with their declaration.
        smem_at_launch: match dyn_smem {
            Some(bytes) => bytes,
            None if matches!(kernel, Kernel::DynSmem | Kernel::Guards) => (block * 4) as u32,
            None => 0,
        },
    };
    args.launch(KernelRef { module: "selftest", symbol: kernel.symbol() }, dims, &params)
}

// ----------------------------------------------------------------------------- fp8 conversions
/// The fp8 conversion test kernel (kernels/selftest.cu).
const FP8_CONVERT: KernelRef = KernelRef { module: "selftest", symbol: "fp8_e4m3_convert" };

/// The kernels' own e4m3fn conversions, run on `device`: the code of every input value (f32 ->
/// e4m3fn as kv_append rounds), and the value of every code by the scalar decode and by the four
/// packed paths of the decode kernel (`[5][256]`, see `Fp8ConvertParams` in kernels/params.h).
/// For tests that compare them with [`crate::dtype::f8e4m3_encode`] and
/// [`crate::dtype::f8e4m3_decode`].
pub fn fp8_kernel_conversions(device: &Device, input: &[f32]) -> Result<(Vec<u8>, Vec<f32>)> {
    const OP: &str = "fp8_e4m3_convert";
    let n = input.len();
    let inp = Tensor::from_slice(device, input, &[n.max(1)].map(|x| if n == 0 { 0 } else { x }))?;
    let codes = Tensor::zeros(device, DType::F8E4M3, &[n])?;
    let decoded = Tensor::zeros(device, DType::F32, &[5 * 256])?;
    let mut args = KernelArgs::new(OP, device);
    let params = Fp8ConvertParams {
        input: args.read_tensor("input", &inp)?,
        codes: args.write_tensor("codes", &codes)?,
        decoded: args.write_tensor("decoded", &decoded)?,
        n: to_i64(OP, "n", n)?,
    };
    let dims =
        LaunchDims { grid: (grid_x(OP, n.max(256).div_ceil(256))?, 1, 1), block: (256, 1, 1), smem_at_launch: 0 };
    args.launch(FP8_CONVERT, dims, &params)?;
    let codes = codes.to_vec::<crate::dtype::F8E4M3>()?.into_iter().map(|c| c.0).collect();
    Ok((codes, decoded.to_vec::<f32>()?))
}
