//! Token embedding lookup (kernels/embedding.cu): `out[t] = table[ids[t]]`.
//!
//! ```
//! use llama_kernels::ops::embedding::embedding;
//! use llama_kernels::ops::ErrorFlag;
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (vocab, hidden) = (1000, 64);
//! let table = Tensor::zeros(&device, DType::BF16, &[vocab, hidden])?;
//! let ids = Tensor::from_slice(&device, &[5i32, 17, 999], &[3])?;
//! let out = Tensor::zeros(&device, DType::BF16, &[3, hidden])?;
//! let errors = ErrorFlag::new(&device)?;
//! embedding(&table, &ids, &out, &errors)?;
//! errors.check("embedding")?; // an id outside [0, vocab) would be reported here
//! # Ok(())
//! # }
//! ```
//!
//! Shapes: `table` is `[vocab, hidden]` (rows may be strided, each row contiguous), `ids` is i32
//! `[tokens]` (contiguous), `out` is `[tokens, hidden]` of the table's dtype (f32, f16 or bf16;
//! rows may be strided) and must not overlap the inputs. Rows are copied bit for bit, with
//! 16-byte accesses when the sizes, addresses and strides allow. Token ids live on the device and
//! are checked there: an id outside `[0, vocab)` is never read from; its row is zeros and the
//! kernel raises the error flag, which [`ErrorFlag::check`] reports after the step (no host
//! synchronization in the call itself).

use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{EmbeddingParams, LLK_EMBEDDING_THREADS};
use crate::kernels::embedding::KERNELS;
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use super::ErrorFlag;

const OP: &str = "embedding";

/// [`embedding`] on borrowed views, queued on `queue`.
pub fn embedding_on(
    queue: &impl Queue,
    table: &TensorView<'_>,
    ids: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    errors: &ErrorFlag,
) -> Result<()> {
    let device = queue.queue_device()?;
    if !device.same_context(errors.device()) {
        return Err(Error::DeviceMismatch { op: OP, what: "error flag" });
    }
    let dtype = table.dtype();
    check_float(OP, "table", dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    check_dtype(OP, "ids", ids.dtype(), DType::I32)?;
    if table.shape().len() != 2 {
        return Err(Error::shape(OP, "table", table.shape().to_vec(), "[vocab, hidden]"));
    }
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let (tb, ib) = (args.read("table", table)?, args.read("ids", ids)?);
    let flag = args.write_tensor("error flag", errors.tensor())?;
    let (tr, or) = (Rows::of(OP, "table", &tb, 1)?, Rows::of(OP, "out", &ob, 1)?);
    let tokens = ib.shape().iter().product::<usize>();
    if ib.shape().len() != 1 || !ib.dims.is_contiguous() {
        return Err(Error::shape(OP, "ids", ib.shape().to_vec(), "contiguous [tokens]"));
    }
    if or.rows != tokens || or.cols != tr.cols {
        return Err(Error::shape(
            OP,
            "out",
            ob.shape().to_vec(),
            format!("[{tokens}, {}] (one row of the table per id)", tr.cols),
        ));
    }
    if i32::try_from(tr.rows).is_err() {
        return Err(Error::invalid(OP, "vocab", tr.rows, "must fit in i32 (the ids are i32)"));
    }
    let id_rows = Rows { addr: ib.addr, elem: 4, rows: 1, cols: tokens, row_stride: tokens };
    check_disjoint(OP, ("out", or), ("table", tr))?;
    check_disjoint(OP, ("out", or), ("ids", id_rows))?;
    let hidden = or.cols;
    if tokens == 0 || hidden == 0 {
        return Ok(());
    }
    let params = EmbeddingParams {
        table: tb.addr,
        ids: ib.addr,
        out: ob.addr,
        error_flag: flag,
        tokens: to_i64(OP, "tokens", tokens)?,
        hidden: to_i64(OP, "hidden", hidden)?,
        vocab: to_i64(OP, "vocab", tr.rows)?,
        table_row_stride: to_i64(OP, "table row stride", tr.row_stride)?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
    };
    let v = dtype.vec16();
    let aligned = |addr: u64, stride: usize| addr % 16 == 0 && stride % v == 0;
    let vectorized = hidden % v == 0 && aligned(params.table, tr.row_stride) && aligned(params.out, or.row_stride);
    let nvec = if vectorized { hidden / v } else { hidden };
    let block = nvec.div_ceil(32).min(LLK_EMBEDDING_THREADS as usize / 32) * 32;
    let dims = LaunchDims {
        grid: (grid_x(OP, nvec.div_ceil(block))?, tokens.min(65535) as u32, 1),
        block: (block as u32, 1, 1),
        dyn_smem: 0,
    };
    args.launch(KERNELS.find(OP, "table", (vectorized, dtype), dtype)?, dims, &params)
}

/// Gathers `table` rows `ids` into `out`; an id outside `[0, vocab)` gives a row of zeros and
/// raises `errors` (see the module docs).
pub fn embedding(table: &Tensor, ids: &Tensor, out: &Tensor, errors: &ErrorFlag) -> Result<()> {
    embedding_on(out.device(), &table.view(), &ids.view(), &mut TensorViewMut::of_tensor(out), errors)
}
