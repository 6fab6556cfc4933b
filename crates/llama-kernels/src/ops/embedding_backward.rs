//! The backward of the embedding lookup (kernels/embedding.cu): `d_table[v] (+)= sum of
//! d_out[t] over the tokens t with ids[t] == v`, for full fine-tuning of the embedding.
//!
//! Deterministic without atomics: per chunk of at most [`CHUNK`] tokens, one block sorts the
//! keys `(id, token)`, so the tokens of one id form a run in token order, and each table row sums
//! its run in f32 in that order: the same ids and gradients give the same bits on every run.
//! The first chunk writes every row of the table (rows without tokens get zeros, so the table
//! needs no separate clearing); later chunks, and calls with `accumulate`, add only to the rows of
//! their ids. Nothing is synchronized; the sort scratch is planned once
//! ([`EmbeddingBackward::new`]).
//!
//! Shapes: `d_out` `[tokens, hidden]` (f32, f16, bf16; rows any stride), `ids` `[tokens]` i32
//! contiguous, `d_table` `[vocab, hidden]` f32 (rows any stride). An id outside `[0, vocab)`
//! adds nothing and raises the error flag ([`ErrorFlag::check`]).

use crate::backend::{Device, LaunchDims};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    EmbeddingBackwardParams, LLK_EMBEDDING_BWD_CHUNK, LLK_EMBEDDING_BWD_SORT_THREADS, LLK_EMBEDDING_THREADS,
    LlkEmbeddingBwdMode,
};
use crate::kernels::Access;
use crate::kernels::embedding::{BACKWARD, BACKWARD_SORT};
use crate::launch::{KernelArgs, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorViewMut};

use super::ErrorFlag;

const OP: &str = "embedding_backward";

/// Tokens per sorted chunk.
pub const CHUNK: usize = LLK_EMBEDDING_BWD_CHUNK as usize;

/// The backward's scratch: the sorted keys of one chunk.
#[derive(Debug)]
pub struct EmbeddingBackward {
    keys: Tensor,
}

impl EmbeddingBackward {
    /// Plans the scratch on `device` (one allocation of [`CHUNK`] keys).
    pub fn new(device: &Device) -> Result<EmbeddingBackward> {
        Ok(EmbeddingBackward { keys: Tensor::zeros(device, DType::I64, &[CHUNK])? })
    }

    /// `d_table (+)= ` the gradient of the lookup; see the module docs.
    pub fn run(
        &self,
        d_out: &Tensor,
        ids: &Tensor,
        d_table: &Tensor,
        accumulate: bool,
        errors: &ErrorFlag,
    ) -> Result<()> {
        let dtype = d_out.dtype();
        check_float(OP, "d_out", dtype)?;
        check_dtype(OP, "ids", ids.dtype(), DType::I32)?;
        check_dtype(OP, "d_table", d_table.dtype(), DType::F32)?;
        if !d_out.device().same_context(errors.device()) {
            return Err(Error::DeviceMismatch { op: OP, what: "error flag" });
        }
        let [vocab, hidden] = *d_table.shape() else {
            return Err(Error::shape(OP, "d_table", d_table.shape().to_vec(), "[vocab, hidden]"));
        };
        if ids.shape().len() != 1 || !ids.is_contiguous() {
            return Err(Error::shape(OP, "ids", ids.shape().to_vec(), "contiguous [tokens]"));
        }
        let tokens = ids.shape()[0];
        if d_out.shape() != [tokens, hidden] {
            return Err(Error::shape(OP, "d_out", d_out.shape().to_vec(), format!("[{tokens}, {hidden}]")));
        }
        if vocab >= 1 << 31 {
            return Err(Error::invalid(OP, "vocab", vocab, "must be < 2^31"));
        }
        if hidden == 0 || vocab == 0 {
            return Ok(());
        }
        if tokens == 0 && accumulate {
            return Ok(());
        }
        // One pass per chunk; the first writes every row unless accumulating.
        let mut r0 = 0;
        loop {
            let n = CHUNK.min(tokens - r0);
            let (dy, id) = (d_out.narrow(0, r0, n)?, ids.narrow(0, r0, n)?);
            let first = r0 == 0;
            if n > 0 {
                self.sort(&id, vocab, errors)?;
            }
            let mode = if first && !accumulate {
                LlkEmbeddingBwdMode::LLK_EMBEDDING_BWD_ROWS
            } else {
                LlkEmbeddingBwdMode::LLK_EMBEDDING_BWD_SEGMENTS
            };
            self.sum(&dy, n, d_table, mode, errors)?;
            r0 += n;
            if r0 >= tokens {
                return Ok(());
            }
        }
    }

    fn sort(&self, ids: &Tensor, vocab: usize, errors: &ErrorFlag) -> Result<()> {
        let mut args = KernelArgs::new(OP, ids.device());
        let ib = args.read_tensor("ids", ids)?;
        let kb = args.write_tensor("keys", &self.keys)?;
        let fb = args.write_tensor("error flag", errors.tensor())?;
        let params = EmbeddingBackwardParams {
            ids: ib,
            keys: kb,
            error_flag: fb,
            tokens: to_i64(OP, "tokens", ids.shape()[0])?,
            vocab: to_i64(OP, "vocab", vocab)?,
            ..empty()
        };
        let dims = LaunchDims { grid: (1, 1, 1), block: (LLK_EMBEDDING_BWD_SORT_THREADS, 1, 1), smem_at_launch: 0 };
        args.launch(BACKWARD_SORT, dims, &params)
    }

    /// The row sums of the sorted chunk of `tokens` rows of `d_out`.
    fn sum(
        &self,
        d_out: &Tensor,
        tokens: usize,
        d_table: &Tensor,
        mode: LlkEmbeddingBwdMode,
        errors: &ErrorFlag,
    ) -> Result<()> {
        if mode == LlkEmbeddingBwdMode::LLK_EMBEDDING_BWD_SEGMENTS && tokens == 0 {
            return Ok(());
        }
        let dtype = d_out.dtype();
        let (dv, mut tv) = (d_out.view(), TensorViewMut::of_tensor(d_table));
        let mut args = KernelArgs::new(OP, d_out.device());
        let tb = args.write("d_table", &mut tv)?;
        let db = args.read("d_out", &dv)?;
        let kb = args.read_tensor("keys", &self.keys)?;
        let fb = args.write_tensor("error flag", errors.tensor())?;
        let (tr, dr) = (Rows::of(OP, "d_table", &tb, 1)?, Rows::of(OP, "d_out", &db, 1)?);
        check_disjoint(OP, ("d_table", tr), ("d_out", dr))?;
        let (vocab, hidden) = (tr.rows, tr.cols);
        let aligned = |r: &Rows, bytes: usize| {
            r.addr % bytes as u64 == 0 && (r.rows <= 1 || (r.row_stride * r.elem) % bytes == 0)
        };
        let vectorized = hidden % 4 == 0 && aligned(&tr, 16) && aligned(&dr, 4 * dtype.size());
        let vec = if vectorized { 4 } else { 1 };
        let threads = LLK_EMBEDDING_THREADS as usize;
        let slices = hidden.div_ceil(vec).div_ceil(threads);
        let blocks = if mode == LlkEmbeddingBwdMode::LLK_EMBEDDING_BWD_ROWS { vocab } else { tokens };
        let params = EmbeddingBackwardParams {
            d_out: db.addr,
            keys: kb,
            d_table: tb.addr,
            error_flag: fb,
            tokens: to_i64(OP, "tokens", tokens)?,
            hidden: to_i64(OP, "hidden", hidden)?,
            vocab: to_i64(OP, "vocab", vocab)?,
            d_out_row_stride: to_i64(OP, "d_out row stride", dr.row_stride)?,
            d_table_row_stride: to_i64(OP, "d_table row stride", tr.row_stride)?,
            mode,
            ..empty()
        };
        let slices = u32::try_from(slices)
            .ok()
            .filter(|&s| s <= 65535)
            .ok_or_else(|| Error::invalid(OP, "hidden", hidden, "too wide for grid.y"))?;
        let dims = LaunchDims {
            grid: (grid_x(OP, blocks)?, slices, 1),
            block: (LLK_EMBEDDING_THREADS, 1, 1),
            smem_at_launch: 0,
        };
        args.launch(BACKWARD.find(OP, "d_out", (Access::of(vectorized), dtype))?, dims, &params)
    }
}

fn empty() -> EmbeddingBackwardParams {
    EmbeddingBackwardParams {
        d_out: 0,
        ids: 0,
        keys: 0,
        d_table: 0,
        error_flag: 0,
        tokens: 0,
        hidden: 0,
        vocab: 0,
        d_out_row_stride: 0,
        d_table_row_stride: 0,
        mode: LlkEmbeddingBwdMode::LLK_EMBEDDING_BWD_ROWS,
    }
}
