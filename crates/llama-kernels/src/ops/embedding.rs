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
//! [`embedding_packed`] looks rows up in a table kept packed ([`QWeight`], any
//! [`QuantFormat`](crate::spec::quant::QuantFormat)): each row is dequantized as
//! [`PackedWeight::dequantize`](crate::spec::quant::PackedWeight::dequantize) defines it and
//! rounded to `out`'s dtype, so the result equals the dense lookup of the dequantized table bit
//! for bit; bad ids are handled the same way. A GGUF model whose embedding is tied to a packed LM
//! head looks its tokens up there and keeps no dense table on the device.
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
use crate::ffi::params::{
    EmbeddingParams, LLK_EMBEDDING_ROWS, LLK_EMBEDDING_THREADS, LLK_QUANT_CHUNK, QEmbeddingParams,
};
use crate::kernels::Access;
use crate::kernels::embedding::{KERNELS, PACKED};
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use super::ErrorFlag;
use super::qlinear::QWeight;

const OP: &str = "embedding";

/// Checks the error flag's device, `ids` (contiguous i32 `[tokens]`) and `out` (`[tokens,
/// hidden]` of `dtype`), and registers them: (out, ids, flag) addresses, out's rows, tokens.
fn lookup_args<'a>(
    args: &mut KernelArgs<'a>,
    device: &crate::backend::Device,
    ids: &'a TensorView<'_>,
    out: &'a mut TensorViewMut<'_>,
    errors: &'a ErrorFlag,
    dtype: DType,
    hidden: usize,
) -> Result<(u64, u64, u64, Rows, usize)> {
    if !device.same_context(errors.device()) {
        return Err(Error::DeviceMismatch { op: OP, what: "error flag" });
    }
    check_dtype(OP, "out", out.dtype(), dtype)?;
    check_dtype(OP, "ids", ids.dtype(), DType::I32)?;
    let ob = args.write("out", out)?;
    let ib = args.read("ids", ids)?;
    let flag = args.write_tensor("error flag", errors.tensor())?;
    let or = Rows::of(OP, "out", &ob, 1)?;
    let tokens = ib.shape().iter().product::<usize>();
    if ib.shape().len() != 1 || !ib.dims.is_contiguous() {
        return Err(Error::shape(OP, "ids", ib.shape().to_vec(), "contiguous [tokens]"));
    }
    if or.rows != tokens || or.cols != hidden {
        return Err(Error::shape(
            OP,
            "out",
            ob.shape().to_vec(),
            format!("[{tokens}, {hidden}] (one row of the table per id)"),
        ));
    }
    let id_rows = Rows { addr: ib.addr, elem: 4, rows: 1, cols: tokens, row_stride: tokens };
    check_disjoint(OP, ("out", or), ("ids", id_rows))?;
    Ok((ob.addr, ib.addr, flag, or, tokens))
}

/// [`embedding`] on borrowed views, queued on `queue`.
pub fn embedding_on(
    queue: &impl Queue,
    table: &TensorView<'_>,
    ids: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    errors: &ErrorFlag,
) -> Result<()> {
    let device = queue.queue_device()?;
    let dtype = table.dtype();
    check_float(OP, "table", dtype)?;
    if table.shape().len() != 2 {
        return Err(Error::shape(OP, "table", table.shape().to_vec(), "[vocab, hidden]"));
    }
    let mut args = KernelArgs::new(OP, &device);
    let tb = args.read("table", table)?;
    let tr = Rows::of(OP, "table", &tb, 1)?;
    let (out_addr, ids_addr, flag, or, tokens) = lookup_args(&mut args, &device, ids, out, errors, dtype, tr.cols)?;
    if i32::try_from(tr.rows).is_err() {
        return Err(Error::invalid(OP, "vocab", tr.rows, "must fit in i32 (the ids are i32)"));
    }
    check_disjoint(OP, ("out", or), ("table", tr))?;
    let hidden = or.cols;
    if tokens == 0 || hidden == 0 {
        return Ok(());
    }
    let params = EmbeddingParams {
        table: tb.addr,
        ids: ids_addr,
        out: out_addr,
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
        grid: (grid_x(OP, nvec.div_ceil(block))?, tokens.div_ceil(LLK_EMBEDDING_ROWS as usize).min(65535) as u32, 1),
        block: (block as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(KERNELS.find(OP, "table", (Access::of(vectorized), dtype))?, dims, &params)
}

/// Gathers `table` rows `ids` into `out`; an id outside `[0, vocab)` gives a row of zeros and
/// raises `errors` (see the module docs).
pub fn embedding(table: &Tensor, ids: &Tensor, out: &Tensor, errors: &ErrorFlag) -> Result<()> {
    embedding_on(out.device(), &table.view(), &ids.view(), &mut TensorViewMut::of_tensor(out), errors)
}

/// Gathers rows `ids` of the packed `table` into `out`, dequantized and rounded to `out`'s dtype
/// (f32, f16 or bf16); an id outside `[0, vocab)` gives a row of zeros and raises `errors` (see
/// the module docs).
pub fn embedding_packed(table: &QWeight, ids: &Tensor, out: &Tensor, errors: &ErrorFlag) -> Result<()> {
    embedding_packed_on(out.device(), table, &ids.view(), &mut TensorViewMut::of_tensor(out), errors)
}

/// [`embedding_packed`] on borrowed views, queued on `queue`.
pub fn embedding_packed_on(
    queue: &impl Queue,
    table: &QWeight,
    ids: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    errors: &ErrorFlag,
) -> Result<()> {
    let device = queue.queue_device()?;
    if !device.same_context(table.device()) {
        return Err(Error::DeviceMismatch { op: OP, what: "table" });
    }
    let dtype = out.dtype();
    check_float(OP, "out", dtype)?;
    let [vocab, hidden] = table.shape();
    if i32::try_from(vocab).is_err() {
        return Err(Error::invalid(OP, "vocab", vocab, "must fit in i32 (the ids are i32)"));
    }
    let mut args = KernelArgs::new(OP, &device);
    let (out_addr, ids_addr, flag, or, tokens) = lookup_args(&mut args, &device, ids, out, errors, dtype, hidden)?;
    let tb = args.read_tensor("table", table.tensor())?;
    let tr = Rows { addr: tb, elem: 1, rows: 1, cols: table.bytes(), row_stride: table.bytes() };
    check_disjoint(OP, ("out", or), ("table", tr))?;
    if tokens == 0 || hidden == 0 {
        return Ok(());
    }
    let params = QEmbeddingParams {
        w: super::qlinear::weight_params(table, tb)?,
        ids: ids_addr,
        out: out_addr,
        error_flag: flag,
        tokens: to_i64(OP, "tokens", tokens)?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
    };
    let threads = tokens * (hidden / LLK_QUANT_CHUNK as usize);
    let block = LLK_EMBEDDING_THREADS as usize;
    let dims = LaunchDims {
        grid: (grid_x(OP, threads.div_ceil(block))?, 1, 1),
        block: (block as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(PACKED.find(OP, "out", (table.layout().format(), dtype))?, dims, &params)
}

/// An embedding table on the device: dense, or packed ([`embedding`] or [`embedding_packed`]).
#[derive(Clone, Debug)]
pub enum EmbeddingTable {
    /// `[vocab, hidden]` of the output dtype.
    Dense(Tensor),
    /// `[vocab, hidden]` in a packed format, dequantized and rounded to the output dtype.
    Packed(QWeight),
}

impl EmbeddingTable {
    /// Gathers rows `ids` into `out` with the table's lookup.
    pub fn lookup(&self, ids: &Tensor, out: &Tensor, errors: &ErrorFlag) -> Result<()> {
        match self {
            EmbeddingTable::Dense(table) => embedding(table, ids, out, errors),
            EmbeddingTable::Packed(table) => embedding_packed(table, ids, out, errors),
        }
    }
}
