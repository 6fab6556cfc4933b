//! Dense matrix products: `y = x W^T (+ bias)` with `W` in the `nn.Linear` layout `[out, in]`.
//!
//! Never hand-written: on the CUDA target this is cuBLAS (`cublasGemmEx` with
//! `CUBLAS_COMPUTE_32F`, through cudarc); on the emulated target it is a
//! maintained CPU GEMM (`matrixmultiply`'s f32 `sgemm`) over the host memory of the views. Both
//! have the same semantics: bf16/f16/f32 inputs, every product and sum in f32, and **one
//! rounding** to the output dtype at the end. The f64 reference ([`crate::reference::linear`]) is
//! a plain loop.
//!
//! ```
//! use llama_kernels::ops::linear::linear;
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (tokens, d_in, d_out) = (3, 64, 32);
//! let x = Tensor::from_f64(&device, DType::BF16, &vec![0.5; tokens * d_in], &[tokens, d_in])?;
//! let w = Tensor::from_f64(&device, DType::BF16, &vec![0.25; d_out * d_in], &[d_out, d_in])?;
//! let y = Tensor::zeros(&device, DType::BF16, &[tokens, d_out])?;
//! linear(&x, &w, None, &y)?;
//! assert!(y.to_f64_vec()?.iter().all(|&v| v == 8.0));
//! # Ok(())
//! # }
//! ```
//!
//! Shapes: `x` is `[..., in]` (leading dimensions collapse into tokens; any row stride, so a
//! column range of a wider buffer works: the SwiGLU output written over the gate half of a fused
//! gate-up buffer feeds the down projection directly), `weight` is `[out, in]` with contiguous
//! rows (any row stride), `bias` is `[out]` contiguous, `y` is `[..., out]` with the same
//! leading dimensions as `x` and any row stride. One float dtype throughout. `y` must not
//! overlap the inputs. Sizes and row strides are at most 2^31 - 1 elements (cuBLAS's 32-bit
//! interface), on both targets: a larger one is an [`Error::InvalidArgument`].
//!
//! The backward products ([`super::linear_backward`]) run on the same two GEMM engines, with the
//! operands transposed by cuBLAS's `op` flags (and `sgemm`'s strides), never by a copy.
//!
//! [`linear_add`] accumulates instead (`y += x W^T`): cuBLAS's `beta = 1`, which fuses a residual
//! add into the product with a single rounding of the sum.
//!
//! Planning: on CUDA, one cuBLAS handle per (context, stream) is created by [`plan`] (or the
//! first call on that stream) and kept; a planned call allocates nothing and never waits on the
//! host. A bias is broadcast into `y` by a rank-1 product with a vector of ones that
//! [`plan`] sizes for `max_tokens` (a larger call grows it: the only allocation). On the
//! emulated target the product runs on the host under the device's stream lock, counted as one
//! launch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};

use crate::backend::{Count, Device, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const OP: &str = "linear";

/// `y = x W^T + bias`. See the module docs for shapes.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, y: &Tensor) -> Result<()> {
    let bv = bias.map(Tensor::view);
    linear_on(x.device(), &x.view(), &weight.view(), bv.as_ref(), &mut TensorViewMut::of_tensor(y))
}

/// `y += x W^T + bias` (the sum rounded once). See the module docs for shapes.
pub fn linear_add(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, y: &Tensor) -> Result<()> {
    let bv = bias.map(Tensor::view);
    linear_add_on(x.device(), &x.view(), &weight.view(), bv.as_ref(), &mut TensorViewMut::of_tensor(y))
}

/// [`linear`] on borrowed views, queued on `queue` (a [`Device`] or an engine's
/// `Arc<CudaStream>`).
pub fn linear_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    y: &mut TensorViewMut<'_>,
) -> Result<()> {
    run(&queue.queue_device()?, x, weight, bias, y, false)
}

/// [`linear_add`] on borrowed views: `y += x W^T + bias`.
pub fn linear_add_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    y: &mut TensorViewMut<'_>,
) -> Result<()> {
    run(&queue.queue_device()?, x, weight, bias, y, true)
}

/// Plans the matrix products of `queue`'s stream: creates its cuBLAS handle and sizes the
/// bias-broadcast vector for `max_tokens` rows of `dtype`, so that later calls allocate nothing.
/// A no-op on the emulated target.
pub fn plan(queue: &impl Queue, dtype: DType, max_tokens: usize) -> Result<()> {
    let device = queue.queue_device()?;
    check_float(OP, "dtype", dtype)?;
    match device.cuda_stream() {
        Some(stream) => {
            let entry = handle_for(&device, stream)?;
            let mut e = entry.lock().unwrap_or_else(|p| p.into_inner());
            e.ones(&device, dtype, max_tokens)?;
            Ok(())
        }
        None => Ok(()),
    }
}

fn run(
    device: &Device,
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    y: &mut TensorViewMut<'_>,
    accumulate: bool,
) -> Result<()> {
    let op = if accumulate { "linear_add" } else { OP };
    let dtype = x.dtype();
    check_float(op, "x", dtype)?;
    check_dtype(op, "weight", weight.dtype(), dtype)?;
    check_dtype(op, "y", y.dtype(), dtype)?;
    if let Some(b) = bias {
        check_dtype(op, "bias", b.dtype(), dtype)?;
    }
    if weight.shape().len() != 2 {
        return Err(Error::shape(op, "weight", weight.shape().to_vec(), "[out, in] (the nn.Linear layout)"));
    }
    let (d_out, d_in) = (weight.shape()[0], weight.shape()[1]);
    let xs = x.shape();
    if xs.last() != Some(&d_in) {
        return Err(Error::shape(op, "x", xs.to_vec(), format!("[..., {d_in}] (in = weight's second dimension)")));
    }
    let mut y_expected = xs.to_vec();
    if let Some(last) = y_expected.last_mut() {
        *last = d_out;
    }
    if y.shape() != y_expected.as_slice() {
        return Err(Error::shape(op, "y", y.shape().to_vec(), format!("{y_expected:?}")));
    }
    if let Some(b) = bias {
        if b.shape() != [d_out] {
            return Err(Error::shape(op, "bias", b.shape().to_vec(), format!("[{d_out}]")));
        }
    }

    let mut args = KernelArgs::new(op, device);
    let yb = args.write("y", y)?;
    let xb = args.read("x", x)?;
    let wb = args.read("weight", weight)?;
    let bb = match bias {
        Some(b) => Some(args.read("bias", b)?),
        None => None,
    };
    let yr = Rows::of(op, "y", &yb, 1)?;
    let xr = Rows::of(op, "x", &xb, 1)?;
    let wr = Rows::of(op, "weight", &wb, 1)?;
    let br = bb.as_ref().map(|b| Rows::of(op, "bias", b, 1)).transpose()?;
    check_disjoint(op, ("y", yr), ("x", xr))?;
    check_disjoint(op, ("y", yr), ("weight", wr))?;
    if let Some(br) = br {
        check_disjoint(op, ("y", yr), ("bias", br))?;
    }
    let tokens = yr.rows;
    if tokens == 0 || d_out == 0 {
        return Ok(());
    }
    let g = Gemm {
        dtype,
        out_dtype: dtype,
        m: tokens,
        n: d_out,
        k: d_in,
        // W [out, in] row-major holds B^T for B = W^T [in, out].
        a: Operand { addr: xb.addr, ld: xr.row_stride, transposed: false, ld_name: "x row stride" },
        b: Operand {
            addr: wb.addr,
            ld: if d_out > 1 { wr.row_stride } else { d_in.max(1) },
            transposed: true,
            ld_name: "weight row stride",
        },
        bias: bb.map(|b| b.addr),
        c: yb.addr,
        ldc: if tokens > 1 { yr.row_stride } else { d_out },
        accumulate,
        names: ["tokens", "out", "in", "y row stride"],
    };
    // Both targets take cuBLAS's 32-bit sizes and row strides, so a call valid on one is valid on
    // the other.
    // SAFETY: every address was registered with `args` above, and the row/stride extents were
    // validated by `Rows::of` against the views' shapes.
    unsafe { g.run(op, device, args) }
}

/// One operand of a [`Gemm`], in row-major terms: the matrix itself (`transposed: false`, rows
/// `ld` elements apart) or its transpose stored row-major (`transposed: true`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Operand {
    pub(super) addr: u64,
    pub(super) ld: usize,
    pub(super) transposed: bool,
    /// The name of `ld` in errors ("x row stride").
    pub(super) ld_name: &'static str,
}

/// One validated product `C [m, n] (+)= A [m, k] B [k, n] (+ bias)`, in row-major terms.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gemm {
    /// Of A and B (and the bias).
    pub(super) dtype: DType,
    /// Of C: `dtype`, or f32.
    pub(super) out_dtype: DType,
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) a: Operand,
    pub(super) b: Operand,
    /// `[n]`, added to every row of C.
    pub(super) bias: Option<u64>,
    pub(super) c: u64,
    pub(super) ldc: usize,
    pub(super) accumulate: bool,
    /// The names of m, n, k and ldc in errors.
    pub(super) names: [&'static str; 4],
}

/// cuBLAS's 32-bit sizes and leading dimensions.
#[derive(Clone, Copy, Debug)]
struct CudaDims {
    m: i32,
    n: i32,
    k: i32,
    lda: i32,
    ldb: i32,
    ldc: i32,
}

/// The cuBLAS type of `dtype`.
fn cuda_type(op: &'static str, dtype: DType) -> Result<blas_sys::cudaDataType_t> {
    match dtype {
        DType::F32 => Ok(blas_sys::cudaDataType_t::CUDA_R_32F),
        DType::F16 => Ok(blas_sys::cudaDataType_t::CUDA_R_16F),
        DType::BF16 => Ok(blas_sys::cudaDataType_t::CUDA_R_16BF),
        other => Err(Error::UnsupportedDType { op, what: "x", dtype: other, supported: "f32, f16, bf16".into() }),
    }
}

impl Gemm {
    /// Queues the product on `device` (cuBLAS, or `sgemm` on the host).
    ///
    /// # Safety
    /// Every address must be registered with `args` as a view holding the extents `self`
    /// describes, C disjoint from the inputs.
    pub(super) unsafe fn run(&self, op: &'static str, device: &Device, args: KernelArgs<'_>) -> Result<()> {
        // Both targets take cuBLAS's 32-bit sizes and row strides, so a call valid on one is
        // valid on the other.
        let dims = self.cuda_dims(op)?;
        match device.cuda_stream() {
            Some(stream) => {
                let entry = handle_for(device, stream)?;
                let ones = match self.bias {
                    Some(_) => Some(entry.lock().unwrap_or_else(|p| p.into_inner()).ones(device, self.dtype, self.m)?),
                    None => None,
                };
                args.call(op, |stream| self.cuda(op, stream, &entry, dims, ones), || Ok(()))
            }
            // SAFETY: the caller's contract.
            None => args.call(op, |_| Ok(()), || unsafe { self.host() }),
        }
    }

    /// The row-major (rows, columns) of an operand as stored: `rows x cols` as a matrix, or its
    /// transpose.
    fn stored(o: &Operand, rows: usize, cols: usize) -> (usize, usize) {
        if o.transposed { (cols, rows) } else { (rows, cols) }
    }

    fn cuda_dims(&self, op: &'static str) -> Result<CudaDims> {
        let i = |name: &'static str, v: usize| {
            i32::try_from(v).map_err(|_| Error::invalid(op, name, v, "exceeds cuBLAS's 32-bit sizes (2^31 - 1)"))
        };
        let (_, a_cols) = Self::stored(&self.a, self.m, self.k);
        let (_, b_cols) = Self::stored(&self.b, self.k, self.n);
        Ok(CudaDims {
            m: i(self.names[1], self.n)?,
            n: i(self.names[0], self.m)?,
            k: i(self.names[2], self.k)?,
            lda: i(self.b.ld_name, self.b.ld.max(b_cols).max(1))?,
            ldb: i(self.a.ld_name, self.a.ld.max(a_cols).max(1))?,
            ldc: i(self.names[3], self.ldc.max(self.n).max(1))?,
        })
    }

    /// Column-major view for cuBLAS: row-major C is column-major `C^T [n, m] = B^T A^T`. A
    /// row-major matrix is its column-major transpose, so B (or A) stored as itself is op N, and
    /// stored as its transpose op T.
    fn cuda(
        &self,
        op: &'static str,
        stream: &Arc<CudaStream>,
        entry: &Mutex<BlasEntry>,
        d: CudaDims,
        ones: Option<u64>,
    ) -> Result<()> {
        let ty = cuda_type(op, self.dtype)?;
        let out_ty = cuda_type(op, self.out_dtype)?;
        let e = entry.lock().unwrap_or_else(|p| p.into_inner());
        stream.context().bind_to_thread()?;
        let (one, zero) = (1.0f32, 0.0f32);
        let mut beta = if self.accumulate { one } else { zero };
        let (n_op, t_op) = (blas_sys::cublasOperation_t::CUBLAS_OP_N, blas_sys::cublasOperation_t::CUBLAS_OP_T);
        let op_of = |o: &Operand| if o.transposed { t_op } else { n_op };
        if let (Some(bias), Some(ones)) = (self.bias, ones) {
            // Y^T += bias [out, 1] x ones [1, tokens]: the bias broadcast over the rows, exact.
            // SAFETY: bias holds d_out elements and ones at least `tokens` (sized by `ones`); y
            // holds tokens rows of ldc >= d_out elements; all are device memory of this
            // context, registered (and so ordered on this stream) by KernelArgs; the handle is
            // bound to this stream and locked.
            unsafe {
                blas::gemm_ex(
                    e.handle.0,
                    n_op,
                    n_op,
                    d.m,
                    d.n,
                    1,
                    (&one as *const f32).cast(),
                    bias as *const std::ffi::c_void,
                    ty,
                    d.m.max(1),
                    ones as *const std::ffi::c_void,
                    ty,
                    1,
                    (&beta as *const f32).cast(),
                    self.c as *mut std::ffi::c_void,
                    out_ty,
                    d.ldc,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }?;
            beta = one;
        }
        // SAFETY: A and B hold their stored rows of ld >= stored columns elements, C m rows of
        // ldc >= n (validated by Rows::of); all are device memory of this context registered
        // with KernelArgs, whose guards order them on this stream; the handle is bound to this
        // stream and locked for the call; alpha and beta are host f32s, as CUBLAS_COMPUTE_32F
        // requires in the default pointer mode.
        unsafe {
            blas::gemm_ex(
                e.handle.0,
                op_of(&self.b),
                op_of(&self.a),
                d.m,
                d.n,
                d.k,
                (&one as *const f32).cast(),
                self.b.addr as *const std::ffi::c_void,
                ty,
                d.lda,
                self.a.addr as *const std::ffi::c_void,
                ty,
                d.ldb,
                (&beta as *const f32).cast(),
                self.c as *mut std::ffi::c_void,
                out_ty,
                d.ldc,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }?;
        Ok(())
    }

    /// The emulated target: f32 `sgemm` over host memory, one rounding to the dtype.
    ///
    /// # Safety
    /// The addresses must be host memory of the emulated device holding the extents described by
    /// `self` (validated views registered with `KernelArgs`), with `y` disjoint from the inputs,
    /// and the device's stream lock held.
    unsafe fn host(&self) -> Result<()> {
        let Gemm { dtype, out_dtype, m, n, k, a, b, .. } = *self;
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let Scratch { x, w, acc } = &mut *scratch;
            let (a_rows, a_cols) = Self::stored(&a, m, k);
            let (b_rows, b_cols) = Self::stored(&b, k, n);
            // SAFETY: the caller's contract: the stored rows lie inside the registered views.
            unsafe {
                load_rows(dtype, a.addr, a.ld, a_rows, a_cols, x);
                load_rows(dtype, b.addr, b.ld, b_rows, b_cols, w);
            }
            acc.clear();
            acc.resize(m * n, 0.0);
            // (row stride, column stride) of a contiguous stored copy read as the matrix itself.
            let strides = |o: &Operand, cols: usize| if o.transposed { (1, cols as isize) } else { (cols as isize, 1) };
            let ((rsa, csa), (rsb, csb)) = (strides(&a, a_cols), strides(&b, b_cols));
            // SAFETY: x holds A's stored a_rows x a_cols and w B's stored b_rows x b_cols, both
            // contiguous f32 host vectors, and the strides read them as A [m, k] and B [k, n];
            // acc is [m, n].
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    x.as_ptr(),
                    rsa,
                    csa,
                    w.as_ptr(),
                    rsb,
                    csb,
                    0.0,
                    acc.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            let mut bias = Vec::new();
            if let Some(b) = self.bias {
                // SAFETY: the bias view holds n contiguous elements.
                unsafe { load_rows(dtype, b, n, 1, n, &mut bias) };
            }
            let mut old = Vec::new();
            for t in 0..m {
                let row = &mut acc[t * n..(t + 1) * n];
                let c_row = self.c + (t * self.ldc * out_dtype.size()) as u64;
                if self.accumulate {
                    // SAFETY: row t of C lies inside the registered view.
                    unsafe { load_rows(out_dtype, c_row, 0, 1, n, &mut old) };
                }
                for j in 0..n {
                    let mut v = row[j];
                    if let Some(&b) = bias.get(j) {
                        v += b;
                    }
                    if self.accumulate {
                        v += old[j];
                    }
                    row[j] = v;
                }
                // SAFETY: row t of C lies inside the registered output view, disjoint from the
                // inputs; the stream lock is held.
                unsafe { store_row(out_dtype, c_row, row) };
            }
            Ok(())
        })
    }
}

/// Host scratch of the emulated GEMM (f32 copies of the operands), reused across calls.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    w: Vec<f32>,
    acc: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Reads `rows` rows of `cols` elements of `dtype` at `addr` (rows `stride` elements apart) into
/// `out` as f32 (exact for every dtype here).
///
/// # Safety
/// `addr` must be readable host memory holding those rows.
unsafe fn load_rows(dtype: DType, addr: u64, stride: usize, rows: usize, cols: usize, out: &mut Vec<f32>) {
    out.clear();
    out.reserve(rows * cols);
    for r in 0..rows {
        let base = addr as usize + r * stride * dtype.size();
        // SAFETY: the caller's contract; unaligned reads tolerate any address.
        unsafe {
            match dtype {
                DType::F32 => out.extend((0..cols).map(|c| std::ptr::read_unaligned((base as *const f32).add(c)))),
                DType::F16 => {
                    out.extend((0..cols).map(|c| std::ptr::read_unaligned((base as *const f16).add(c)).to_f32()))
                }
                DType::BF16 => {
                    out.extend((0..cols).map(|c| std::ptr::read_unaligned((base as *const bf16).add(c)).to_f32()))
                }
                DType::I32 | DType::I64 | DType::F8E4M3 | DType::U8 => {}
            }
        }
    }
}

/// Writes one row of f32 values to `addr`, rounded (to nearest even) to `dtype`.
///
/// # Safety
/// `addr` must be writable host memory of `row.len()` elements of `dtype`.
unsafe fn store_row(dtype: DType, addr: u64, row: &[f32]) {
    // SAFETY: the caller's contract; unaligned writes tolerate any address.
    unsafe {
        match dtype {
            DType::F32 => {
                for (c, &v) in row.iter().enumerate() {
                    std::ptr::write_unaligned((addr as *mut f32).add(c), v);
                }
            }
            DType::F16 => {
                for (c, &v) in row.iter().enumerate() {
                    std::ptr::write_unaligned((addr as *mut f16).add(c), f16::from_f32(v));
                }
            }
            DType::BF16 => {
                for (c, &v) in row.iter().enumerate() {
                    std::ptr::write_unaligned((addr as *mut bf16).add(c), bf16::from_f32(v));
                }
            }
            DType::I32 | DType::I64 | DType::F8E4M3 | DType::U8 => {}
        }
    }
}

// ------------------------------------------------------------------------------ cuBLAS handles

/// A cuBLAS handle (destroyed on drop).
struct RawHandle(blas_sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread as long as calls are not concurrent; every
// use goes through the entry's mutex.
unsafe impl Send for RawHandle {}
// SAFETY: as above.
unsafe impl Sync for RawHandle {}

impl Drop for RawHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by create_handle and is destroyed once; a failure here
        // cannot be reported and leaks nothing more than the handle.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// One (context, stream)'s cuBLAS state: the handle, bound to the stream, and per dtype a vector
/// of ones for bias broadcasts.
struct BlasEntry {
    handle: RawHandle,
    /// Ones per dtype, allocated on the context's default stream (so that the entry does not keep
    /// the user's stream alive), with their length.
    ones: HashMap<DType, (CudaSlice<u8>, usize)>,
}

impl BlasEntry {
    /// The device address of at least `n` ones of `dtype`, growing the vector if needed.
    fn ones(&mut self, device: &Device, dtype: DType, n: usize) -> Result<u64> {
        let Some(stream) = device.cuda_stream() else {
            return Err(Error::WrongTarget {
                what: "linear bias",
                expected: crate::Target::Cuda,
                got: device.target(),
            });
        };
        let have = self.ones.get(&dtype).map_or(0, |(_, len)| *len);
        if have < n.max(1) {
            let len = n.max(1).next_power_of_two();
            let bytes: Vec<u8> = match dtype {
                DType::F32 => (0..len).flat_map(|_| 1.0f32.to_le_bytes()).collect(),
                DType::F16 => (0..len).flat_map(|_| f16::ONE.to_le_bytes()).collect(),
                DType::BF16 => (0..len).flat_map(|_| bf16::ONE.to_le_bytes()).collect(),
                other => {
                    return Err(Error::UnsupportedDType {
                        op: OP,
                        what: "bias",
                        dtype: other,
                        supported: "f32, f16, bf16".into(),
                    });
                }
            };
            // Growing: earlier products on this stream may still read the old vector, which is
            // freed below; wait for them (planning makes this a one-time cost).
            device.count(Count::Synchronization);
            stream.synchronize()?;
            device.count(Count::Allocation);
            device.count(Count::PageableUpload);
            let default = stream.context().default_stream();
            let slice = default.clone_htod(&bytes)?;
            default.synchronize()?;
            self.ones.insert(dtype, (slice, len));
        }
        let (slice, _) = self.ones.get(&dtype).ok_or_else(|| Error::invalid(OP, "bias", dtype, "no ones vector"))?;
        let (ptr, _guard) = slice.device_ptr(stream);
        Ok(ptr)
    }
}

struct Registered {
    ctx: usize,
    stream: Weak<CudaStream>,
    cu_stream: usize,
    entry: Arc<Mutex<BlasEntry>>,
}

/// The cuBLAS state of `stream` (created on first use: one handle per context and stream).
fn handle_for(device: &Device, stream: &Arc<CudaStream>) -> Result<Arc<Mutex<BlasEntry>>> {
    static REGISTRY: OnceLock<Mutex<Vec<Registered>>> = OnceLock::new();
    let mut reg = REGISTRY.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|p| p.into_inner());
    reg.retain(|r| r.stream.strong_count() > 0);
    let (ctx, cu_stream) = (stream.context().cu_ctx() as usize, stream.cu_stream() as usize);
    if let Some(r) = reg.iter().find(|r| r.ctx == ctx && r.cu_stream == cu_stream) {
        return Ok(r.entry.clone());
    }
    // Linked rather than loaded (the feature off), cuBLAS is there if the program started.
    #[cfg(feature = "cuda-dynamic-loading")]
    // SAFETY: is_culib_present only tries to dlopen the library; cudarc panics on any cuBLAS call
    // when it is missing, which is why this check comes first.
    if !unsafe { blas_sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "the cuBLAS library (libcublas) was not found; dense matrix products need it".into(),
        ));
    }
    stream.context().bind_to_thread()?;
    device.count(Count::Allocation);
    let handle = RawHandle(blas::create_handle()?);
    // SAFETY: the handle was just created; the stream belongs to the bound context and outlives
    // every use of the handle (entries of dead streams are dropped above before reuse).
    unsafe { blas::set_stream(handle.0, stream.cu_stream() as _) }?;
    let entry = Arc::new(Mutex::new(BlasEntry { handle, ones: HashMap::new() }));
    reg.push(Registered { ctx, stream: Arc::downgrade(stream), cu_stream, entry: entry.clone() });
    Ok(entry)
}
