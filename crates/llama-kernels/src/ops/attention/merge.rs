//! Merging two attention states by their log-sum-exp (kernels/paged_attention.cu): the split
//! merge of decode as a public op, for cascade attention over a shared prefix.

use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{LLK_DECODE_THREADS, MergeStatesParams};
use crate::kernels::paged_attention::{MERGE_KERNELS, MergeSource};
use crate::launch::KernelArgs;
use crate::launch::{Heads, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const MERGE: &str = "merge_attention_states";
const THREADS: u32 = LLK_DECODE_THREADS;

/// A `[heads, tokens]` (or any 2-D) f32 LSE view as `(addr, token stride, head stride)`.
fn lse_layout(
    op: &'static str,
    what: &'static str,
    b: &crate::launch::Arg,
    heads: usize,
    tokens: usize,
) -> Result<(u64, usize, usize)> {
    check_dtype(op, what, b.dtype, DType::F32)?;
    if b.shape() != [heads, tokens] {
        return Err(Error::shape(op, what, b.shape().to_vec(), format!("[{heads}, {tokens}] (heads, tokens)")));
    }
    let s = b.strides();
    Ok((b.addr, s[1], s[0]))
}

/// Merges two attention states over disjoint key sets: `lse = log(e^lse_a + e^lse_b)`,
/// `out = e^(lse_a - lse) v_a + e^(lse_b - lse) v_b` (FlashInfer's `merge_state`, vLLM's
/// `merge_attn_states`). `v_a`, `v_b`, `out`: `[tokens, heads, head_dim]` of one float dtype, any
/// token/head strides; `lse_a`, `lse_b`, `lse_out`: f32 `[heads, tokens]` (the layout attention's
/// LSE output has), any strides. A state with `lse = -inf` (no keys) contributes nothing; both
/// empty give zeros and `-inf`. f32 math. Outputs must not overlap the inputs.
pub fn merge_attention_states_on(
    queue: &impl Queue,
    v_a: &TensorView<'_>,
    lse_a: &TensorView<'_>,
    v_b: &TensorView<'_>,
    lse_b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    lse_out: Option<&mut TensorViewMut<'_>>,
) -> Result<()> {
    const OP: &str = MERGE;
    let device = queue.queue_device()?;
    let dtype = v_a.dtype();
    check_float(OP, "v_a", dtype)?;
    check_dtype(OP, "v_b", v_b.dtype(), dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let lob = match lse_out {
        Some(l) => Some(args.write("lse_out", l)?),
        None => None,
    };
    let (ab, bb) = (args.read("v_a", v_a)?, args.read("v_b", v_b)?);
    let (lab, lbb) = (args.read("lse_a", lse_a)?, args.read("lse_b", lse_b)?);
    let (ah, bh, oh) = (Heads::of(OP, "v_a", &ab)?, Heads::of(OP, "v_b", &bb)?, Heads::of(OP, "out", &ob)?);
    for (what, b, h) in [("v_b", &bb, &bh), ("out", &ob, &oh)] {
        if (h.tokens, h.heads, h.head_dim) != (ah.tokens, ah.heads, ah.head_dim) {
            return Err(Error::shape(OP, what, b.shape().to_vec(), format!("{:?} like v_a", ab.shape())));
        }
    }
    let (tokens, heads) = (ah.tokens, ah.heads);
    let la = lse_layout(OP, "lse_a", &lab, heads, tokens)?;
    let lbl = lse_layout(OP, "lse_b", &lbb, heads, tokens)?;
    let lo = match &lob {
        Some(l) => Some(lse_layout(OP, "lse_out", l, heads, tokens)?),
        None => None,
    };
    // Overlaps: outputs against every input (LSE views as their spans).
    let span = |addr: u64, ts: usize, hs: usize| {
        let last = tokens.saturating_sub(1) * ts + heads.saturating_sub(1) * hs + 1;
        Rows { addr, elem: 4, rows: 1, cols: if tokens * heads == 0 { 0 } else { last }, row_stride: last }
    };
    for (what, h) in [("v_a", ah), ("v_b", bh)] {
        check_disjoint(OP, ("out", oh), (what, h))?;
    }
    for (what, l) in [("lse_a", la), ("lse_b", lbl)] {
        check_disjoint(OP, ("out", oh), (what, span(l.0, l.1, l.2)))?;
    }
    if let Some(l) = lo {
        let r = span(l.0, l.1, l.2);
        for (what, h) in [("v_a", ah), ("v_b", bh), ("out", oh)] {
            check_disjoint(OP, ("lse_out", r), (what, h))?;
        }
        for (what, x) in [("lse_a", la), ("lse_b", lbl)] {
            check_disjoint(OP, ("lse_out", r), (what, span(x.0, x.1, x.2)))?;
        }
    }
    if tokens == 0 || heads == 0 || ah.head_dim == 0 {
        return Ok(());
    }
    let params = MergeStatesParams {
        v_a: ab.addr,
        lse_a: la.0,
        v_b: bb.addr,
        lse_b: lbl.0,
        out: ob.addr,
        lse_out: lo.map_or(0, |l| l.0),
        tokens: to_i64(OP, "tokens", tokens)?,
        heads: to_i64(OP, "heads", heads)?,
        head_dim: to_i64(OP, "head_dim", ah.head_dim)?,
        num_states: 2,
        a_token_stride: to_i64(OP, "v_a token stride", ah.token_stride)?,
        a_head_stride: to_i64(OP, "v_a head stride", ah.head_stride)?,
        b_token_stride: to_i64(OP, "v_b token stride", bh.token_stride)?,
        b_head_stride: to_i64(OP, "v_b head stride", bh.head_stride)?,
        out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
        out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
        lse_a_token_stride: to_i64(OP, "lse_a stride", la.1)?,
        lse_a_head_stride: to_i64(OP, "lse_a stride", la.2)?,
        lse_b_token_stride: to_i64(OP, "lse_b stride", lbl.1)?,
        lse_b_head_stride: to_i64(OP, "lse_b stride", lbl.2)?,
        lse_out_token_stride: to_i64(OP, "lse_out stride", lo.map_or(0, |l| l.1))?,
        lse_out_head_stride: to_i64(OP, "lse_out stride", lo.map_or(0, |l| l.2))?,
    };
    let rows = tokens * heads;
    let dims = LaunchDims { grid: (grid_x(OP, rows.div_ceil(4))?, 1, 1), block: (THREADS, 1, 1), smem_at_launch: 0 };
    args.launch(MERGE_KERNELS.find(OP, "v_a", (MergeSource::TwoStates, dtype))?, dims, &params)
}

/// [`merge_attention_states_on`] on tensors.
pub fn merge_attention_states(
    v_a: &Tensor,
    lse_a: &Tensor,
    v_b: &Tensor,
    lse_b: &Tensor,
    out: &Tensor,
    lse_out: Option<&Tensor>,
) -> Result<()> {
    let mut lo = lse_out.map(TensorViewMut::of_tensor);
    merge_attention_states_on(
        v_a.device(),
        &v_a.view(),
        &lse_a.view(),
        &v_b.view(),
        &lse_b.view(),
        &mut TensorViewMut::of_tensor(out),
        lo.as_mut(),
    )
}
