//! The MoE feed-forward layer on the device: router GEMM -> route -> align -> gather -> grouped
//! GEMM 1 + SwiGLU -> grouped GEMM 2, the shared expert, then combine (+ residual), planned once
//! ([`MoeWorkspace`]) and paired with its weights ([`MoeFfn`]). The ops are
//! [`crate::ops::moe`]; the semantics are [`crate::reference::moe`].

use crate::backend::{Device, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::launch::{check_dtype, check_float};
use crate::ops::moe::check_routing;
use crate::ops::moe::{
    BLOCK_M, ExpertWeightsView, GemmGroups, MoeAlign, MoeResidual, moe_combine_on, moe_gather_on, moe_grouped_gemm_on,
    moe_route_on, padded_rows, preferred_block_m,
};
use crate::spec::moe::{MoeFfnConfig, MoeRouting, WeightLayout};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const OP_FFN: &str = "moe_ffn";

/// Gate and up projections of the routed experts.
#[derive(Clone, Debug)]
pub enum GateUpTensors {
    /// One tensor with `2 intermediate` outputs per expert, gate first (`[E, hidden, 2I]` InOut:
    /// Llama 4 `gate_up_proj`; `[E, 2I, hidden]` OutIn).
    Packed(Tensor),
    /// Two tensors with `intermediate` outputs each and the same strides (Mixtral `w1`, `w3`).
    Separate {
        /// Gate projection: `intermediate` outputs per expert.
        gate: Tensor,
        /// Up projection: the same shape and strides as `gate`.
        up: Tensor,
    },
}

/// A shared expert (a dense SwiGLU MLP applied to every token), `nn.Linear` weights:
/// gate and up `[shared_intermediate, hidden]`, down `[hidden, shared_intermediate]`.
#[derive(Clone, Debug)]
pub struct SharedExpertTensors {
    /// `[shared_intermediate, hidden]`.
    pub gate: Tensor,
    /// `[shared_intermediate, hidden]`.
    pub up: Tensor,
    /// `[hidden, shared_intermediate]`.
    pub down: Tensor,
}

/// The weights of a MoE layer, in the layer's dtype (the router bias in f32).
#[derive(Clone, Debug)]
pub struct MoeFfnWeights {
    /// `[experts, hidden]` (`nn.Linear`).
    pub router: Tensor,
    /// Grouped routing's selection bias `[experts]` f32, or none.
    pub router_bias: Option<Tensor>,
    /// Layout of `gate_up` and `down`.
    pub layout: WeightLayout,
    /// Gate and up projections of the routed experts, in `layout`.
    pub gate_up: GateUpTensors,
    /// `[experts, intermediate, hidden]` (InOut) or `[experts, hidden, intermediate]` (OutIn).
    pub down: Tensor,
    /// The shared expert, or `None`.
    pub shared: Option<SharedExpertTensors>,
}

/// The planned buffers of a MoE feed-forward (router logits, routing, permutation, the
/// expert-contiguous activations, the shared expert's), for one configuration and a maximum
/// token count, without weights. One workspace serves every MoE layer of a model: the block
/// composer passes each layer's weights to [`MoeWorkspace::forward_on`]. [`MoeFfn`] pairs one
/// with its weights.
#[derive(Debug)]
pub struct MoeWorkspace {
    device: Device,
    config: MoeFfnConfig,
    dtype: DType,
    max_tokens: usize,
    /// The largest shared-expert intermediate size planned for (0: none).
    shared_capacity: usize,
    logits: Tensor,
    ids: Tensor,
    route_weights: Tensor,
    align: MoeAlign,
    xp: Tensor,
    h: Tensor,
    y: Tensor,
    /// Flat `[max_tokens * shared_capacity]`: viewed as `[tokens, shared intermediate]`.
    shared_h: Tensor,
    shared_out: Tensor,
    last_tokens: usize,
    last_shared: bool,
}

/// A MoE feed-forward layer with its workspace, planned once for a maximum token count:
/// router GEMM -> route -> align -> gather -> GEMM 1 + SwiGLU -> GEMM 2, the shared expert as two
/// dense GEMMs (the grouped GEMM with one group), then combine (+ residual). A forward within
/// the planned size allocates nothing, copies nothing and never waits on the host.
#[derive(Debug)]
pub struct MoeFfn {
    workspace: MoeWorkspace,
    weights: MoeFfnWeights,
}

/// The device tensors of the last forward's stages (views of the workspace, `tokens` rows).
#[derive(Clone, Debug)]
pub struct MoeFfnStages {
    /// Router logits `[tokens, experts]`, in the layer's dtype.
    pub logits: Tensor,
    /// Chosen experts `[tokens, top_k]` i32, best first.
    pub ids: Tensor,
    /// Routing weights `[tokens, top_k]` f32, in the order of `ids`.
    pub weights: Tensor,
    /// The shared expert's output, when there is one.
    pub shared: Option<Tensor>,
}

/// Checks `weights` against `config` on `device`; returns their dtype and the shared expert's
/// intermediate size (0 without one).
pub(crate) fn check_ffn_weights(
    device: &Device,
    config: &MoeFfnConfig,
    weights: &MoeFfnWeights,
) -> Result<(DType, usize)> {
    const OP: &str = OP_FFN;
    let MoeFfnConfig { hidden, intermediate, experts, top_k, routing, .. } = *config;
    let dtype = weights.router.dtype();
    check_float(OP, "router", dtype)?;
    check_routing(OP, experts, top_k, routing)?;
    for (what, v) in [("hidden", hidden), ("intermediate", intermediate)] {
        if v == 0 {
            return Err(Error::invalid(OP, what, 0, "must be > 0"));
        }
    }
    let shape = |what: &'static str, t: &Tensor, expected: &[usize]| -> Result<()> {
        check_dtype(OP, what, t.dtype(), dtype)?;
        if t.shape() != expected {
            return Err(Error::shape(OP, what, t.shape().to_vec(), format!("{expected:?}")));
        }
        if !t.device().same_context(device) {
            return Err(Error::DeviceMismatch { op: OP, what });
        }
        Ok(())
    };
    shape("router", &weights.router, &[experts, hidden])?;
    if let Some(b) = &weights.router_bias {
        check_dtype(OP, "router_bias", b.dtype(), DType::F32)?;
        if !matches!(routing, MoeRouting::Grouped { .. }) {
            return Err(Error::invalid(OP, "router_bias", "given", "only grouped routing takes a selection bias"));
        }
        if b.shape() != [experts] {
            return Err(Error::shape(OP, "router_bias", b.shape().to_vec(), format!("[{experts}]")));
        }
    }
    let io = |out: usize, inp: usize| match weights.layout {
        WeightLayout::InOut => vec![experts, inp, out],
        WeightLayout::OutIn => vec![experts, out, inp],
    };
    match &weights.gate_up {
        GateUpTensors::Packed(w) => shape("gate_up", w, &io(2 * intermediate, hidden))?,
        GateUpTensors::Separate { gate, up } => {
            shape("gate", gate, &io(intermediate, hidden))?;
            shape("up", up, &io(intermediate, hidden))?;
        }
    }
    shape("down", &weights.down, &io(hidden, intermediate))?;
    let shared_intermediate = match &weights.shared {
        Some(s) => {
            let si = s.gate.shape().first().copied().unwrap_or(0);
            shape("shared gate", &s.gate, &[si, hidden])?;
            shape("shared up", &s.up, &[si, hidden])?;
            shape("shared down", &s.down, &[hidden, si])?;
            if si == 0 {
                return Err(Error::invalid(OP, "shared intermediate", 0, "must be > 0"));
            }
            si
        }
        None => 0,
    };
    Ok((dtype, shared_intermediate))
}

impl MoeWorkspace {
    /// Plans the buffers for up to `max_tokens` tokens of `dtype` and a shared expert of up to
    /// `shared_intermediate` (0: no shared expert).
    pub fn plan(
        device: &Device,
        config: MoeFfnConfig,
        dtype: DType,
        shared_intermediate: usize,
        max_tokens: usize,
    ) -> Result<MoeWorkspace> {
        const OP: &str = OP_FFN;
        let MoeFfnConfig { hidden, intermediate, experts, top_k, routing, .. } = config;
        check_float(OP, "dtype", dtype)?;
        check_routing(OP, experts, top_k, routing)?;
        for (what, v) in [("hidden", hidden), ("intermediate", intermediate)] {
            if v == 0 {
                return Err(Error::invalid(OP, what, 0, "must be > 0"));
            }
        }
        let max_tokens = max_tokens.max(1);
        let slots =
            max_tokens.checked_mul(top_k).ok_or_else(|| Error::invalid(OP, "max_tokens", max_tokens, "too large"))?;
        let rows = padded_rows(slots, experts, BLOCK_M)?;
        let shared_len = max_tokens
            .checked_mul(shared_intermediate)
            .ok_or_else(|| Error::invalid(OP, "shared intermediate", shared_intermediate, "too large"))?;
        let z = |dt, shape: &[usize]| Tensor::zeros(device, dt, shape);
        Ok(MoeWorkspace {
            device: device.clone(),
            config,
            dtype,
            max_tokens,
            shared_capacity: shared_intermediate,
            logits: z(dtype, &[max_tokens, experts])?,
            ids: z(DType::I32, &[max_tokens, top_k])?,
            route_weights: z(DType::F32, &[max_tokens, top_k])?,
            align: MoeAlign::plan(device, experts, slots)?,
            xp: z(dtype, &[rows, hidden])?,
            h: z(dtype, &[rows, intermediate])?,
            y: z(dtype, &[rows, hidden])?,
            shared_h: z(dtype, &[shared_len])?,
            shared_out: z(dtype, &[if shared_intermediate > 0 { max_tokens } else { 0 }, hidden])?,
            last_tokens: 0,
            last_shared: false,
        })
    }

    /// The routing and shapes planned for.
    pub fn config(&self) -> &MoeFfnConfig {
        &self.config
    }
    /// The dtype of the activations (and of the weights).
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Most tokens one forward may have.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    /// The permutation of the last forward (its counts, offsets and rows live on the device).
    pub fn permutation(&self) -> &MoeAlign {
        &self.align
    }

    /// The last forward's router logits, routing and shared-expert output (device views).
    pub fn stages(&self) -> Result<MoeFfnStages> {
        let t = self.last_tokens;
        Ok(MoeFfnStages {
            logits: self.logits.narrow(0, 0, t)?,
            ids: self.ids.narrow(0, 0, t)?,
            weights: self.route_weights.narrow(0, 0, t)?,
            shared: if self.last_shared { Some(self.shared_out.narrow(0, 0, t)?) } else { None },
        })
    }

    /// Reads the device-side error flag of the permutation (waits for the device).
    pub fn check_errors(&self) -> Result<()> {
        self.align.check_errors()
    }

    /// `out = moe(x) (+ residual)` with `weights` (checked against the planned configuration):
    /// the tensor form of [`MoeWorkspace::forward_on`].
    pub fn forward(
        &mut self,
        weights: &MoeFfnWeights,
        x: &Tensor,
        residual: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        let rv = residual.map(Tensor::view);
        let in_place = residual.is_some_and(|r| r.shares_storage(out) && r.dims() == out.dims());
        let res = match (&rv, in_place) {
            (_, true) => MoeResidual::InPlace,
            (Some(r), false) => MoeResidual::Separate(r),
            (None, _) => MoeResidual::None,
        };
        let device = x.device().clone();
        self.forward_on(&device, weights, &x.view(), res, &mut TensorViewMut::of_tensor(out))
    }

    /// `out = moe(x) (+ residual)` on borrowed views, queued on `queue`, with `weights` checked
    /// against the planned configuration (host-side shape checks only).
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        weights: &MoeFfnWeights,
        x: &TensorView<'_>,
        residual: MoeResidual<'_, '_>,
        out: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        const OP: &str = OP_FFN;
        let (dtype, shared) = check_ffn_weights(&self.device, &self.config, weights)?;
        check_dtype(OP, "weights", dtype, self.dtype)?;
        if shared > self.shared_capacity {
            return Err(Error::invalid(
                OP,
                "shared intermediate",
                shared,
                format!("exceeds the planned {} (MoeWorkspace::plan)", self.shared_capacity),
            ));
        }
        self.run(queue, weights, x, residual, out)
    }

    /// The forward, `weights` already checked.
    fn run(
        &mut self,
        queue: &impl Queue,
        weights: &MoeFfnWeights,
        x: &TensorView<'_>,
        residual: MoeResidual<'_, '_>,
        out: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        let tokens = self.check_call(queue, x, out)?;
        self.last_tokens = tokens;
        self.last_shared = weights.shared.is_some();
        if tokens == 0 {
            return Ok(());
        }
        let MoeFfnConfig { experts, top_k, weights_on_input, .. } = self.config;
        let slots = tokens * top_k;
        let block_m = preferred_block_m(slots, experts);
        let rows = padded_rows(slots, experts, block_m)?;
        let logits = self.logits.narrow(0, 0, tokens)?;
        let ids = self.ids.narrow(0, 0, tokens)?;
        let rw = self.route_weights.narrow(0, 0, tokens)?;
        let (xp, h, y) = (self.xp.narrow(0, 0, rows)?, self.h.narrow(0, 0, rows)?, self.y.narrow(0, 0, rows)?);
        let w = weights;
        let layout = w.layout;
        self.route(queue, x, w, &logits, &ids, &rw)?;
        self.align.align_on(queue, &ids.view(), block_m)?;
        let rwv = rw.view();
        moe_gather_on(queue, x, &self.align, weights_on_input.then_some(&rwv), &mut TensorViewMut::of_tensor(&xp))?;
        let groups = GemmGroups::Experts(&self.align);
        let mut hv = TensorViewMut::of_tensor(&h);
        match &w.gate_up {
            GateUpTensors::Packed(gu) => moe_grouped_gemm_on(
                queue,
                &xp.view(),
                layout,
                ExpertWeightsView::SwiGluPacked(&gu.view()),
                groups,
                &mut hv,
            )?,
            GateUpTensors::Separate { gate, up } => moe_grouped_gemm_on(
                queue,
                &xp.view(),
                layout,
                ExpertWeightsView::SwiGluSeparate { gate: &gate.view(), up: &up.view() },
                groups,
                &mut hv,
            )?,
        }
        moe_grouped_gemm_on(
            queue,
            &h.view(),
            layout,
            ExpertWeightsView::Plain(&w.down.view()),
            groups,
            &mut TensorViewMut::of_tensor(&y),
        )?;
        let shared = self.shared_expert(queue, x, w, tokens)?;
        let sv = shared.as_ref().map(Tensor::view);
        moe_combine_on(queue, &y.view(), &self.align, (!weights_on_input).then_some(&rwv), sv.as_ref(), residual, out)
    }

    /// Checks the call against the planned configuration; returns the token count.
    fn check_call(&self, queue: &impl Queue, x: &TensorView<'_>, out: &TensorViewMut<'_>) -> Result<usize> {
        const OP: &str = OP_FFN;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "layer" });
        }
        check_dtype(OP, "x", x.dtype(), self.dtype)?;
        check_dtype(OP, "out", out.dtype(), self.dtype)?;
        let hidden = self.config.hidden;
        let tokens = match x.shape() {
            [t, h] if *h == hidden => *t,
            _ => {
                return Err(Error::shape(OP, "x", x.shape().to_vec(), format!("[tokens, {hidden}]")));
            }
        };
        if out.shape() != x.shape() {
            return Err(Error::shape(OP, "out", out.shape().to_vec(), format!("{:?} like x", x.shape())));
        }
        if tokens > self.max_tokens {
            return Err(Error::invalid(
                OP,
                "tokens",
                tokens,
                format!("exceeds the planned {} (MoeFfn::plan)", self.max_tokens),
            ));
        }
        Ok(tokens)
    }

    /// The router GEMM (`logits = x router^T`, one group) and top-k routing.
    fn route(
        &self,
        queue: &impl Queue,
        x: &TensorView<'_>,
        w: &MoeFfnWeights,
        logits: &Tensor,
        ids: &Tensor,
        rw: &Tensor,
    ) -> Result<()> {
        let routing = self.config.routing;
        moe_grouped_gemm_on(
            queue,
            x,
            WeightLayout::OutIn,
            ExpertWeightsView::Plain(&w.router.view()),
            GemmGroups::Dense,
            &mut TensorViewMut::of_tensor(logits),
        )?;
        let bias = w.router_bias.as_ref().map(Tensor::view);
        moe_route_on(
            queue,
            &logits.view(),
            bias.as_ref(),
            routing,
            &mut TensorViewMut::of_tensor(ids),
            &mut TensorViewMut::of_tensor(rw),
        )?;
        Ok(())
    }

    /// The shared expert (two one-group GEMMs, SwiGLU fused into the first), when there is one.
    fn shared_expert(
        &self,
        queue: &impl Queue,
        x: &TensorView<'_>,
        w: &MoeFfnWeights,
        tokens: usize,
    ) -> Result<Option<Tensor>> {
        Ok(match &w.shared {
            Some(s) => {
                let si = s.gate.shape().first().copied().unwrap_or(0);
                let sh = self.shared_h.narrow(0, 0, tokens * si)?.reshape(&[tokens, si])?;
                let so = self.shared_out.narrow(0, 0, tokens)?;
                moe_grouped_gemm_on(
                    queue,
                    x,
                    WeightLayout::OutIn,
                    ExpertWeightsView::SwiGluSeparate { gate: &s.gate.view(), up: &s.up.view() },
                    GemmGroups::Dense,
                    &mut TensorViewMut::of_tensor(&sh),
                )?;
                moe_grouped_gemm_on(
                    queue,
                    &sh.view(),
                    WeightLayout::OutIn,
                    ExpertWeightsView::Plain(&s.down.view()),
                    GemmGroups::Dense,
                    &mut TensorViewMut::of_tensor(&so),
                )?;
                Some(so)
            }
            None => None,
        })
    }
}

impl MoeFfn {
    /// Checks the weights against `config` and plans the workspace for up to `max_tokens` tokens.
    pub fn plan(device: &Device, config: MoeFfnConfig, weights: MoeFfnWeights, max_tokens: usize) -> Result<MoeFfn> {
        let (dtype, shared) = check_ffn_weights(device, &config, &weights)?;
        Ok(MoeFfn { workspace: MoeWorkspace::plan(device, config, dtype, shared, max_tokens)?, weights })
    }

    /// The routing and shapes planned for.
    pub fn config(&self) -> &MoeFfnConfig {
        self.workspace.config()
    }
    /// The dtype of the activations (and of the weights).
    pub fn dtype(&self) -> DType {
        self.workspace.dtype()
    }
    /// Most tokens one forward may have.
    pub fn max_tokens(&self) -> usize {
        self.workspace.max_tokens()
    }
    /// The layer's weights.
    pub fn weights(&self) -> &MoeFfnWeights {
        &self.weights
    }
    /// The permutation of the last forward (its counts, offsets and rows live on the device).
    pub fn permutation(&self) -> &MoeAlign {
        self.workspace.permutation()
    }
    /// The last forward's router logits, routing and shared-expert output (device views).
    pub fn stages(&self) -> Result<MoeFfnStages> {
        self.workspace.stages()
    }
    /// Reads the device-side error flag of the permutation (waits for the device).
    pub fn check_errors(&self) -> Result<()> {
        self.workspace.check_errors()
    }

    /// `out = moe(x) (+ residual)`: `x`, `out` (and `residual`) `[tokens, hidden]`,
    /// `tokens <= max_tokens`. `residual` may be `out` itself (`out += moe(x)`).
    pub fn forward(&mut self, x: &Tensor, residual: Option<&Tensor>, out: &Tensor) -> Result<()> {
        self.workspace.forward(&self.weights, x, residual, out)
    }

    /// [`MoeFfn::forward`] on borrowed views, queued on `queue`.
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        x: &TensorView<'_>,
        residual: MoeResidual<'_, '_>,
        out: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        self.workspace.run(queue, &self.weights, x, residual, out)
    }
}
