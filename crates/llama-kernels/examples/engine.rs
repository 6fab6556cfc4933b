//! Using llama-kernels from an engine that owns its stream and its buffers.
//!
//! ```sh
//! cargo run --release --example engine
//! ```
//!
//! With a GPU, the "engine" creates its own cudarc context, stream and `CudaSlice` buffers, and
//! calls the kernels on borrowed views of them, queued on its stream: no copy, no tensor of this
//! crate on the hot path, nothing allocated per call (the RoPE table and the attention workspace
//! are planned once). Without a GPU the very same calls run on host buffers on the emulated
//! target, which is how an engine's CI can test its kernel plumbing.

use cudarc::driver::{CudaContext, CudaSlice};
use half::bf16;
use llama_kernels::ops::{
    self, AttentionArgs, AttentionMask, AttentionOptions, AttentionWorkspace, CuSeqlens, GateUpView, KvInput, Rope,
    RopeConfig,
};
use llama_kernels::{Device, Element, Queue, Result, TensorView, TensorViewMut};

const TOKENS: usize = 12; // two sequences, of 5 and 7 tokens
const Q_HEADS: usize = 8;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const HIDDEN: usize = Q_HEADS * HEAD_DIM;
const QKV_HEADS: usize = Q_HEADS + 2 * KV_HEADS;
const FFN: usize = 256;

/// An engine buffer the kernels can borrow: a cudarc slice on the GPU, a host vector on the
/// emulated target.
trait EngineBuf {
    fn view(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<TensorView<'_>>;
    fn view_mut(&mut self, shape: &[usize], strides: &[usize], offset: usize) -> Result<TensorViewMut<'_>>;
    fn to_f32(&self) -> Vec<f32>;
}

impl<T: Element + cudarc::driver::DeviceRepr + Default + Clone> EngineBuf for CudaSlice<T>
where
    CudaSlice<T>: llama_kernels::tensor::CudaWrite,
{
    fn view(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<TensorView<'_>> {
        TensorView::cuda_strided(self, shape, strides, offset)
    }
    fn view_mut(&mut self, shape: &[usize], strides: &[usize], offset: usize) -> Result<TensorViewMut<'_>> {
        TensorViewMut::cuda_strided(self, shape, strides, offset)
    }
    fn to_f32(&self) -> Vec<f32> {
        let host = self.stream().clone_dtoh(self).unwrap_or_default();
        host.into_iter().map(|v| v.to_f64() as f32).collect()
    }
}

impl<T: Element> EngineBuf for Vec<T> {
    fn view(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<TensorView<'_>> {
        TensorView::host_strided(self, shape, strides, offset)
    }
    fn view_mut(&mut self, shape: &[usize], strides: &[usize], offset: usize) -> Result<TensorViewMut<'_>> {
        TensorViewMut::host_strided(self, shape, strides, offset)
    }
    fn to_f32(&self) -> Vec<f32> {
        self.iter().map(|v| v.to_f64() as f32).collect()
    }
}

/// The engine's buffers for one step.
struct Buffers<B, I> {
    x: B,          // [tokens, hidden]
    norm_w: B,     // [hidden]
    y: B,          // [tokens, hidden]
    qkv: B,        // [tokens, q_heads + 2 kv_heads, head_dim]: one fused QKV GEMM's output
    attn: B,       // [tokens, q_heads, head_dim]
    gate_up: B,    // [tokens, 2 ffn]: one fused gate/up GEMM's output
    h: B,          // [tokens, ffn]
    positions: I,  // [tokens] i32
    cu_seqlens: I, // [batch + 1] i32
}

/// The kernels of one step, on borrowed views, queued on `queue`.
fn step<B: EngineBuf, I: EngineBuf>(
    queue: &impl Queue,
    rope: &Rope,
    ws: &mut AttentionWorkspace,
    b: &mut Buffers<B, I>,
) -> Result<()> {
    let row = |n: usize| [n, 1];
    let qkv_strides = [QKV_HEADS * HEAD_DIM, HEAD_DIM, 1];
    // RMSNorm into the engine's y.
    let x = b.x.view(&[TOKENS, HIDDEN], &row(HIDDEN), 0)?;
    let w = b.norm_w.view(&[HIDDEN], &[1], 0)?;
    ops::rms_norm_on(queue, Some(&x), &w, 1e-5, &mut b.y.view_mut(&[TOKENS, HIDDEN], &row(HIDDEN), 0)?)?;
    // RoPE in place on q and k. In a fused QKV buffer the k heads follow the q heads, and both
    // get the same rotation: one view of q_heads + kv_heads heads covers them.
    let positions = b.positions.view(&[TOKENS], &[1], 0)?;
    let mut qk = b.qkv.view_mut(&[TOKENS, Q_HEADS + KV_HEADS, HEAD_DIM], &qkv_strides, 0)?;
    rope.apply_on(queue, &mut qk, None, &positions)?;
    drop(qk);
    // Attention over q, k and v: three read-only views of the same buffer, device-resident
    // sequence offsets (no host copy: capturable into a CUDA graph).
    let q = b.qkv.view(&[TOKENS, Q_HEADS, HEAD_DIM], &qkv_strides, 0)?;
    let k = b.qkv.view(&[TOKENS, KV_HEADS, HEAD_DIM], &qkv_strides, Q_HEADS * HEAD_DIM)?;
    let v = b.qkv.view(&[TOKENS, KV_HEADS, HEAD_DIM], &qkv_strides, (Q_HEADS + KV_HEADS) * HEAD_DIM)?;
    let cu = b.cu_seqlens.view(&[3], &[1], 0)?;
    let mut out = b.attn.view_mut(&[TOKENS, Q_HEADS, HEAD_DIM], &[HIDDEN, HEAD_DIM, 1], 0)?;
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let args = AttentionArgs {
        q: &q,
        kv: KvInput::Contiguous { k: &k, v: &v },
        cu_seqlens: CuSeqlens::Device { q: &cu, k: &cu },
        out: &mut out,
        lse: None,
    };
    ws.forward_on(queue, args, &opts)?;
    // SwiGLU from the packed gate/up GEMM output.
    let gate_up = b.gate_up.view(&[TOKENS, 2 * FFN], &row(2 * FFN), 0)?;
    ops::swiglu_on(queue, GateUpView::GateThenUp(&gate_up), &mut b.h.view_mut(&[TOKENS, FFN], &row(FFN), 0)?)?;
    Ok(())
}

fn wave(n: usize, f: f32) -> Vec<bf16> {
    (0..n).map(|i| bf16::from_f32((i as f32 * f).sin())).collect()
}

fn summary(b: &Buffers<impl EngineBuf, impl EngineBuf>, ws: &AttentionWorkspace) -> Result<()> {
    ws.check_errors()?; // waits: once per step at most, outside any captured graph
    let y = b.y.to_f32();
    let mean_sq: f32 = y[..HIDDEN].iter().map(|v| v * v).sum::<f32>() / HIDDEN as f32;
    let attn = b.attn.to_f32();
    let h = b.h.to_f32();
    println!("rms_norm: token 0 has mean square {mean_sq:.4} (1 after normalizing with unit weights)");
    println!("attention: {} outputs, all finite: {}", attn.len(), attn.iter().all(|v| v.is_finite()));
    println!("swiglu: {} outputs, all finite: {}", h.len(), h.iter().all(|v| v.is_finite()));
    Ok(())
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let cfg = RopeConfig::llama3_1(HEAD_DIM);
    let positions = vec![0i32, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6];
    let cu_seqlens = vec![0i32, 5, 12];
    match Device::cuda_unavailable_reason() {
        None => {
            // The engine's own context, stream and buffers.
            let ctx = CudaContext::new(0)?;
            let stream = ctx.new_stream()?;
            let mut b = Buffers {
                x: stream.clone_htod(&wave(TOKENS * HIDDEN, 0.37))?,
                norm_w: stream.clone_htod(&vec![bf16::ONE; HIDDEN])?,
                y: stream.alloc_zeros::<bf16>(TOKENS * HIDDEN)?,
                qkv: stream.clone_htod(&wave(TOKENS * QKV_HEADS * HEAD_DIM, 0.11))?,
                attn: stream.alloc_zeros::<bf16>(TOKENS * HIDDEN)?,
                gate_up: stream.clone_htod(&wave(TOKENS * 2 * FFN, 0.05))?,
                h: stream.alloc_zeros::<bf16>(TOKENS * FFN)?,
                positions: stream.clone_htod(&positions)?,
                cu_seqlens: stream.clone_htod(&cu_seqlens)?,
            };
            // Planned once, on the stream's context: the RoPE table and the attention workspace.
            let device = Device::cuda_on_stream(stream.clone())?;
            let rope = Rope::new(&device, cfg)?;
            let mut ws = AttentionWorkspace::plan(&device, 8)?;
            println!("GPU: {}", device.description());
            step(&stream, &rope, &mut ws, &mut b)?;
            summary(&b, &ws)?;
        }
        Some(reason) => {
            println!("no GPU here ({reason})");
            println!("running the same calls on the emulated target, on host buffers");
            let device = Device::emulated();
            let mut b = Buffers {
                x: wave(TOKENS * HIDDEN, 0.37),
                norm_w: vec![bf16::ONE; HIDDEN],
                y: vec![bf16::ZERO; TOKENS * HIDDEN],
                qkv: wave(TOKENS * QKV_HEADS * HEAD_DIM, 0.11),
                attn: vec![bf16::ZERO; TOKENS * HIDDEN],
                gate_up: wave(TOKENS * 2 * FFN, 0.05),
                h: vec![bf16::ZERO; TOKENS * FFN],
                positions,
                cu_seqlens,
            };
            let rope = Rope::new(&device, cfg)?;
            let mut ws = AttentionWorkspace::plan(&device, 8)?;
            let before = device.counters();
            step(&device, &rope, &mut ws, &mut b)?;
            let after = device.counters();
            println!(
                "{} launches; allocations, copies and host waits during the step: {}",
                after.launches - before.launches,
                (after.allocations - before.allocations)
                    + (after.pageable_uploads - before.pageable_uploads)
                    + (after.pinned_uploads - before.pinned_uploads)
                    + (after.synchronizations - before.synchronizations)
            );
            summary(&b, &ws)?;
        }
    }
    Ok(())
}
