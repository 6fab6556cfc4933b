//! The gradient of prefill attention (kernels/attention_backward.cu): dQ, dK and dV from the
//! forward's inputs, its output and log-sum-exp, and dO. See [`crate::ops::attention`] for the
//! shapes and semantics it shares with the forward.
//!
//! Two launches (FlashAttention-2's algorithm with its deterministic split): the dQ kernel over
//! query-row blocks, which also writes `delta = rowsum(dO * O)` to the workspace, then the dK/dV
//! kernel over key blocks of each KV head, which sums over the group's q heads inside the kernel.
//! No atomics: the gradients are bit-identical from run to run.

use super::prefill::AttentionWorkspace;
use super::prefill_launch::{
    CuSeqlens, DevicePlan, OP as FORWARD_OP, Tiles, batch_of, check_cu_seqlens, gqa_pack, plan_on_device,
};
use super::variant::Variant;
use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    AttentionBackwardParams, AttentionParams, LLK_ATTN_BWD_LANES, LLK_ATTN_BWD_LANES_HD256, LLK_ATTN_BWD_MMA_ROWS,
    LLK_ATTN_BWD_THREADS, LlkKvSource,
};
use crate::kernels::attention::SUPPORTED_HEAD_DIMS;
use crate::kernels::attention_backward::{AttentionBackwardKernel, AttentionBackwardPath, KERNELS, MMA_KERNELS};
use crate::launch::{Arg, Heads, KernelArgs, Region, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use super::prefill::{AttentionOptions, Offsets};

const OP: &str = "attention_backward";

/// The path a backward call of `dtype` at `head_dim` runs: tensor cores for bf16 and f16 at
/// head_dim 64 and 128 (when every 16-bit row is 16-byte aligned; otherwise, and for every other
/// case, the SIMT path, which computes the same function in f32 without rounding P and dS).
pub fn backward_path(dtype: DType, head_dim: usize) -> AttentionBackwardPath {
    if MMA_KERNELS.has((AttentionBackwardKernel::Dq, head_dim, dtype)) {
        AttentionBackwardPath::MmaSync
    } else {
        AttentionBackwardPath::Simt
    }
}

/// Rows (query token x q head) of a dQ block, and keys of a dK/dV block, of `path` at
/// `head_dim`: on the SIMT path the block's threads over `LLK_ATTN_BWD_LANES` lanes per row
/// (`LLK_ATTN_BWD_LANES_HD256` at head_dim 256); on tensor cores 16 per warp.
pub const fn backward_rows(path: AttentionBackwardPath, head_dim: usize) -> usize {
    match path {
        AttentionBackwardPath::MmaSync => LLK_ATTN_BWD_MMA_ROWS as usize,
        AttentionBackwardPath::Simt => {
            let lanes = if head_dim <= 128 { LLK_ATTN_BWD_LANES } else { LLK_ATTN_BWD_LANES_HD256 };
            (LLK_ATTN_BWD_THREADS / lanes) as usize
        }
    }
}

/// One backward call on borrowed views ([`AttentionWorkspace::backward_on`]). Shapes as the
/// forward's: q, out, d_out and dq `[total_q, q_heads, head_dim]`; k, v, dk and dv
/// `[total_k, kv_heads, head_dim]` (contiguous K/V: training does not read the paged cache);
/// lse `[q_heads, total_q]` f32, contiguous, as the forward wrote it. One dtype for every tensor
/// but lse; each with its own token and head strides.
#[derive(Debug)]
pub struct AttentionBackwardArgs<'r, 'a> {
    /// The forward's queries.
    pub q: &'r TensorView<'a>,
    /// The forward's keys.
    pub k: &'r TensorView<'a>,
    /// The forward's values.
    pub v: &'r TensorView<'a>,
    /// The forward's output O.
    pub out: &'r TensorView<'a>,
    /// The forward's log-sum-exp (natural log), `[q_heads, total_q]` f32.
    pub lse: &'r TensorView<'a>,
    /// The gradient of the loss with respect to the output.
    pub d_out: &'r TensorView<'a>,
    /// The forward's sequence offsets.
    pub cu_seqlens: CuSeqlens<'r, 'a>,
    /// dQ, written.
    pub dq: &'r mut TensorViewMut<'a>,
    /// dK, written (each KV head's gradient summed over the q heads of its group).
    pub dk: &'r mut TensorViewMut<'a>,
    /// dV, written.
    pub dv: &'r mut TensorViewMut<'a>,
}

/// One backward call on tensors ([`AttentionWorkspace::backward`]): [`AttentionBackwardArgs`]
/// with tensors for views.
#[derive(Clone, Copy, Debug)]
pub struct AttentionBackwardTensors<'t> {
    /// The forward's queries.
    pub q: &'t Tensor,
    /// The forward's keys.
    pub k: &'t Tensor,
    /// The forward's values.
    pub v: &'t Tensor,
    /// The forward's output O.
    pub out: &'t Tensor,
    /// The forward's log-sum-exp, `[q_heads, total_q]` f32.
    pub lse: &'t Tensor,
    /// dO.
    pub d_out: &'t Tensor,
    /// The forward's sequence offsets.
    pub cu_seqlens: Offsets<'t>,
    /// dQ, written.
    pub dq: &'t Tensor,
    /// dK, written.
    pub dk: &'t Tensor,
    /// dV, written.
    pub dv: &'t Tensor,
}

/// The registered views of one launch.
struct BoundGrad {
    q: Heads,
    k: Heads,
    v: Heads,
    out: Heads,
    d_out: Heads,
    dq: Heads,
    dk: Heads,
    dv: Heads,
    lse: Arg,
}

/// Registers every view of `call` with `args` (outputs first) and reads their layouts.
fn bind<'a>(args: &mut KernelArgs<'a>, call: &'a mut AttentionBackwardArgs<'_, '_>) -> Result<BoundGrad> {
    let (dqb, dkb, dvb) = (args.write("dq", call.dq)?, args.write("dk", call.dk)?, args.write("dv", call.dv)?);
    let heads = |what, b: &Arg| Heads::of(OP, what, b);
    let (dq, dk, dv) = (heads("dq", &dqb)?, heads("dk", &dkb)?, heads("dv", &dvb)?);
    let q = heads("q", &args.read("q", call.q)?)?;
    let k = heads("k", &args.read("k", call.k)?)?;
    let v = heads("v", &args.read("v", call.v)?)?;
    let out = heads("out", &args.read("out", call.out)?)?;
    let d_out = heads("d_out", &args.read("d_out", call.d_out)?)?;
    let lse = args.read("lse", call.lse)?;
    Ok(BoundGrad { q, k, v, out, d_out, dq, dk, dv, lse })
}

impl BoundGrad {
    /// Whether every row of every tensor starts 16-byte aligned (the tensor-core path's 16-byte
    /// accesses).
    fn rows_aligned(&self) -> bool {
        [&self.q, &self.k, &self.v, &self.out, &self.d_out, &self.dq, &self.dk, &self.dv]
            .iter()
            .all(|h| h.check_rows_aligned(OP, "rows").is_ok())
    }

    /// Checks dtypes, shapes, head counts, alignment-free layouts and aliasing; returns the dtype
    /// and head dim.
    fn check(&self, dtype: DType) -> Result<usize> {
        check_float(OP, "q", dtype)?;
        let d = self.q.head_dim;
        if !SUPPORTED_HEAD_DIMS.contains(&d) {
            return Err(Error::invalid(OP, "head_dim", d, format!("unsupported (supported: {SUPPORTED_HEAD_DIMS:?})")));
        }
        if self.k.heads == 0 {
            return Err(Error::invalid(OP, "kv_heads", 0, "must be > 0 (k and v need at least one head)"));
        }
        if self.q.heads % self.k.heads != 0 {
            return Err(Error::invalid(
                OP,
                "q_heads",
                self.q.heads,
                format!("not divisible by kv_heads {}", self.k.heads),
            ));
        }
        let like = |what: &'static str, h: &Heads, of: &Heads, name: &str| {
            if (h.tokens, h.heads, h.head_dim) != (of.tokens, of.heads, of.head_dim) {
                return Err(Error::shape(
                    OP,
                    what,
                    vec![h.tokens, h.heads, h.head_dim],
                    format!("[{}, {}, {}] like {name}", of.tokens, of.heads, of.head_dim),
                ));
            }
            Ok(())
        };
        if self.k.head_dim != d {
            return Err(Error::shape(
                OP,
                "k",
                vec![self.k.tokens, self.k.heads, self.k.head_dim],
                format!("head_dim {d} like q"),
            ));
        }
        like("v", &self.v, &self.k, "k")?;
        like("out", &self.out, &self.q, "q")?;
        like("d_out", &self.d_out, &self.q, "q")?;
        like("dq", &self.dq, &self.q, "q")?;
        like("dk", &self.dk, &self.k, "k")?;
        like("dv", &self.dv, &self.k, "k")?;
        let (q_heads, total_q) = (self.q.heads, self.q.tokens);
        if self.lse.shape() != [q_heads, total_q] || !self.lse.dims.is_contiguous() {
            return Err(Error::shape(
                OP,
                "lse",
                self.lse.shape().to_vec(),
                format!("contiguous [{q_heads}, {total_q}] (q_heads, total_q)"),
            ));
        }
        // The three outputs are written: disjoint from each other and from every input.
        let lse_len = q_heads * total_q;
        let lse = Rows { addr: self.lse.addr, elem: 4, rows: 1, cols: lse_len, row_stride: lse_len };
        let reads: [(&'static str, Region); 6] = [
            ("q", self.q.into()),
            ("k", self.k.into()),
            ("v", self.v.into()),
            ("out", self.out.into()),
            ("d_out", self.d_out.into()),
            ("lse", lse.into()),
        ];
        let writes = [("dq", self.dq), ("dk", self.dk), ("dv", self.dv)];
        for (i, (w, h)) in writes.iter().enumerate() {
            for (r, region) in &reads {
                check_disjoint(OP, (*w, *h), (*r, *region))?;
            }
            for (w2, h2) in &writes[i + 1..] {
                check_disjoint(OP, (*w, *h), (*w2, *h2))?;
            }
        }
        Ok(d)
    }

    /// The params of both launches: `tiles` holds the offsets, the query tile map and the flag.
    fn params(
        &self,
        tiles: &Tiles,
        key_tiles: u64,
        batch: usize,
        pack: usize,
        variant: &Variant,
        delta: u64,
    ) -> Result<AttentionBackwardParams> {
        let i = |what: &'static str, x: usize| to_i64(OP, what, x);
        let (q, k, v, o, g) = (&self.q, &self.k, &self.v, &self.out, &self.d_out);
        let attn = AttentionParams {
            q: q.addr,
            k: k.addr,
            v: v.addr,
            out: o.addr,
            lse: self.lse.addr,
            cu_seqlens_q: tiles.cu_q,
            cu_seqlens_k: tiles.cu_k,
            cu_tiles: tiles.cu_tiles,
            batch: i("batch", batch)?,
            q_heads: i("q_heads", q.heads)?,
            kv_heads: i("kv_heads", k.heads)?,
            head_dim: i("head_dim", q.head_dim)?,
            total_q: i("total_q", q.tokens)?,
            q_token_stride: i("q token stride", q.token_stride)?,
            q_head_stride: i("q head stride", q.head_stride)?,
            k_token_stride: i("k token stride", k.token_stride)?,
            k_head_stride: i("k head stride", k.head_stride)?,
            v_token_stride: i("v token stride", v.token_stride)?,
            v_head_stride: i("v head stride", v.head_stride)?,
            out_token_stride: i("out token stride", o.token_stride)?,
            out_head_stride: i("out head stride", o.head_stride)?,
            pack: i("gqa_pack", pack)?,
            variant: variant.raw(OP)?,
            kv_source: LlkKvSource::LLK_KV_CONTIGUOUS,
            block_table: 0,
            error_flag: tiles.error_flag,
            block_table_stride: 0,
            max_pages: 0,
            page_size: 1,
            num_pages: 0,
            k_page_stride: 0,
            v_page_stride: 0,
        };
        Ok(AttentionBackwardParams {
            attn,
            d_out: g.addr,
            dq: self.dq.addr,
            dk: self.dk.addr,
            dv: self.dv.addr,
            delta,
            cu_key_tiles: key_tiles,
            d_out_token_stride: i("d_out token stride", g.token_stride)?,
            d_out_head_stride: i("d_out head stride", g.head_stride)?,
            dq_token_stride: i("dq token stride", self.dq.token_stride)?,
            dq_head_stride: i("dq head stride", self.dq.head_stride)?,
            dk_token_stride: i("dk token stride", self.dk.token_stride)?,
            dk_head_stride: i("dk head stride", self.dk.head_stride)?,
            dv_token_stride: i("dv token stride", self.dv.token_stride)?,
            dv_head_stride: i("dv head stride", self.dv.head_stride)?,
        })
    }
}

/// The dtype every tensor but lse must share (q's), and lse's f32.
fn check_dtypes(call: &AttentionBackwardArgs<'_, '_>) -> Result<DType> {
    let dtype = call.q.dtype();
    for (what, t) in
        [("k", call.k.dtype()), ("v", call.v.dtype()), ("out", call.out.dtype()), ("d_out", call.d_out.dtype())]
    {
        check_dtype(OP, what, t, dtype)?;
    }
    for (what, t) in [("dq", call.dq.dtype()), ("dk", call.dk.dtype()), ("dv", call.dv.dtype())] {
        check_dtype(OP, what, t, dtype)?;
    }
    check_dtype(OP, "lse", call.lse.dtype(), DType::F32)?;
    Ok(dtype)
}

impl AttentionWorkspace {
    /// The gradient of one forward call on tensors (see [`AttentionBackwardTensors`]): dq, dk and
    /// dv are written. `opts` must be the forward's (mask, scale, temperature); its `gqa_pack`
    /// only tunes the dQ launch.
    pub fn backward(&mut self, call: AttentionBackwardTensors<'_>, opts: &AttentionOptions) -> Result<()> {
        let (q, k, v, out, lse, d_out) =
            (call.q.view(), call.k.view(), call.v.view(), call.out.view(), call.lse.view(), call.d_out.view());
        let (cq, ck);
        let cu_seqlens = match call.cu_seqlens {
            Offsets::Host { q, k } => CuSeqlens::Host { q, k },
            Offsets::Device { q, k } => {
                (cq, ck) = (q.view(), k.view());
                CuSeqlens::Device { q: &cq, k: &ck }
            }
        };
        let (mut dq, mut dk, mut dv) =
            (TensorViewMut::of_tensor(call.dq), TensorViewMut::of_tensor(call.dk), TensorViewMut::of_tensor(call.dv));
        let args = AttentionBackwardArgs {
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            lse: &lse,
            d_out: &d_out,
            cu_seqlens,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        self.backward_on(call.q.device(), args, opts)
    }

    /// The gradient of one forward call on borrowed views (see [`AttentionBackwardArgs`]), queued
    /// on `queue`. Device offsets are validated by the device as in the forward
    /// ([`AttentionWorkspace::check_errors`]); invalid ones write nothing.
    pub fn backward_on(
        &mut self,
        queue: &impl Queue,
        mut call: AttentionBackwardArgs<'_, '_>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        let device = queue.queue_device()?;
        if !device.same_context(self.device()) {
            return Err(Error::DeviceMismatch { op: OP, what: "workspace" });
        }
        let dtype = check_dtypes(&call)?;
        let batch = batch_of(call.cu_seqlens).map_err(rename)?;
        self.reserve(batch)?;
        let n = batch + 1;
        let (cq_t, ck_t, q_tiles_t, k_tiles_t, flag_t) =
            (self.array(0, n)?, self.array(1, n)?, self.array(2, n)?, self.array(3, n)?, self.array_flag()?);

        // Validate (one registration of every view, released before the launches).
        let (d, totals, aligned) = {
            let mut args = KernelArgs::new(OP, &device);
            let b = bind(&mut args, &mut call)?;
            (b.check(dtype)?, (b.q.tokens, b.k.tokens, b.q.heads, b.k.heads), b.rows_aligned())
        };
        let (total_q, total_k, q_heads, kv_heads) = totals;
        if let CuSeqlens::Host { q: cq, k: ck } = call.cu_seqlens {
            check_cu_seqlens("cu_seqlens_q", cq, total_q).map_err(rename)?;
            check_cu_seqlens("cu_seqlens_k", ck, total_k).map_err(rename)?;
        }
        let variant = Variant::new(OP, opts.mask, opts.scale, opts.temperature, d)?;
        let pack = gqa_pack(opts.gqa_pack, q_heads / kv_heads).map_err(rename)?;
        if q_heads == 0 || (total_q == 0 && total_k == 0) {
            return Ok(()); // nothing to write
        }
        let path = match backward_path(dtype, d) {
            AttentionBackwardPath::MmaSync if !aligned => AttentionBackwardPath::Simt,
            path => path,
        };
        let rows = backward_rows(path, d);
        let delta = self.delta(q_heads * total_q)?;

        let (offsets, grid_q, grid_k) = match call.cu_seqlens {
            CuSeqlens::Host { q: cq, k: ck } => {
                let (gq, gk) = self.stage_host_offsets(&device, cq, ck, rows / pack, Some(rows))?;
                (None, gq, gk)
            }
            CuSeqlens::Device { q: cq, k: ck } => {
                let plan = |cu_q, cu_k, cu_tiles, per_block, totals| {
                    let p = DevicePlan {
                        cu_seqlens_q: cu_q,
                        cu_seqlens_k: cu_k,
                        cu_tiles,
                        error_flag: &flag_t,
                        batch,
                        tokens_per_block: per_block,
                    };
                    plan_on_device(&device, totals, p).map_err(rename)
                };
                let gq = plan(cq, ck, &q_tiles_t, rows / pack, (total_q, Some(total_k)))?;
                // The key tile map: the same plan over the offsets swapped.
                let gk = plan(ck, cq, &k_tiles_t, rows, (total_k, Some(total_q)))?;
                (Some((cq, ck)), gq, gk)
            }
        };

        let group = q_heads / kv_heads;
        let grid_y = |y: usize| {
            u32::try_from(y)
                .ok()
                .filter(|&y| y <= 65535)
                .ok_or_else(|| Error::invalid(OP, "heads", q_heads, "too many head blocks for grid.y (65535)"))
        };
        let launches = [
            (AttentionBackwardKernel::Dq, grid_q, grid_y(kv_heads * (group / pack))?),
            (AttentionBackwardKernel::DkDv, grid_k, grid_y(kv_heads)?),
        ];
        for (kernel, grid, y) in launches {
            if grid == 0 {
                continue;
            }
            let mut args = KernelArgs::new(OP, &device);
            let (cu_q, cu_k) = match offsets {
                None => (args.read_tensor("workspace", &cq_t)?, args.read_tensor("workspace", &ck_t)?),
                Some((cq, ck)) => (args.read("cu_seqlens_q", cq)?.addr, args.read("cu_seqlens_k", ck)?.addr),
            };
            let tiles = Tiles {
                cu_q,
                cu_k,
                cu_tiles: args.read_tensor("workspace", &q_tiles_t)?,
                error_flag: args.write_tensor("workspace", &flag_t)?,
            };
            let key_tiles = args.read_tensor("workspace", &k_tiles_t)?;
            let delta = match kernel {
                AttentionBackwardKernel::Dq => args.write_tensor("delta", &delta)?,
                AttentionBackwardKernel::DkDv => args.read_tensor("delta", &delta)?,
            };
            let b = bind(&mut args, &mut call)?;
            let params = b.params(&tiles, key_tiles, batch, pack, &variant, delta)?;
            let dims =
                LaunchDims { grid: (grid_x(OP, grid)?, y, 1), block: (LLK_ATTN_BWD_THREADS, 1, 1), smem_at_launch: 0 };
            let table = match path {
                AttentionBackwardPath::MmaSync => &MMA_KERNELS,
                AttentionBackwardPath::Simt => &KERNELS,
            };
            args.launch(table.find(OP, "q", (kernel, d, dtype))?, dims, &params)?;
        }
        Ok(())
    }
}

/// The offset and pack checks shared with the forward name the forward op; in a backward call
/// their errors name the backward.
fn rename(e: Error) -> Error {
    match e {
        Error::InvalidArgument { op, name, value, why } if op == FORWARD_OP => {
            Error::InvalidArgument { op: OP, name, value, why }
        }
        Error::ShapeMismatch { op, what, got, expected } if op == FORWARD_OP => {
            Error::ShapeMismatch { op: OP, what, got, expected }
        }
        other => other,
    }
}
