//! The decoder-block composer: Llama 3 and Llama 4 layers built from Hugging Face checkpoints,
//! run with this crate's ops, prefill and decode.
//!
//! ```no_run
//! use llama_kernels::{DType, Device, Tensor};
//! use llama_model::Checkpoint;
//! use llama_model::block::{DecoderLayer, KvCache, LayerWorkspace};
//! # fn main() -> llama_model::Result<()> {
//! let device = Device::best();
//! let ckpt = Checkpoint::open("/models/Llama-3.1-8B-Instruct")?; // config.json + safetensors
//! let layer = DecoderLayer::load(&device, &ckpt, 0, DType::BF16)?;
//! let spec = *layer.spec();
//! // Plan once: a cache of 8 sequences x 4096 tokens, and steps of up to 512 tokens.
//! let mut cache = KvCache::for_layers(&device, DType::BF16, &[spec], 8, 4096)?;
//! let mut ws = LayerWorkspace::plan(&device, DType::BF16, &[spec], 512, &cache)?;
//! // Prefill two sequences (slots 0 and 1) of 5 and 3 tokens, then decode one token each.
//! for batch in [vec![(0, 5), (1, 3)], vec![(0, 1), (1, 1)]] {
//!     let step = ws.begin_step(&mut cache, &batch)?;
//!     let hidden = Tensor::zeros(&device, DType::BF16, &[step.tokens, spec.hidden])?; // the embeddings
//!     layer.forward(&mut ws, &cache, 0, &step, &hidden)?; // in place: hidden is the layer output
//!     cache.commit(&step)?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Layers come from the files of [`crate::formats`] (a `config.json` gives a [`LayerSpec`] per
//! layer; a checkpoint its weights).
//!
//! * [`weights`]: host weights (HF layouts) and device weights (q/k/v and gate/up fused).
//! * [`layer`]: the forward (dense and MoE feed-forwards), its planned workspace and the paged KV
//!   cache.
//!
//! The f64 reference of the same layers is [`llama_kernels::reference::block`]. Semantics matched to
//! Hugging Face transformers (`LlamaDecoderLayer`, `Llama4TextDecoderLayer`), and where this
//! composer differs by a rounding:
//!
//! * RMSNorm: Hugging Face normalizes in f32, rounds to the model dtype, then multiplies by the
//!   weight in the model dtype (both Llama and Llama 4); the kernel rounds once, after the weight.
//! * RoPE: computed in f32 and rounded once (as HF); Llama 3 is half-split (`rotate_half`),
//!   Llama 4 interleaved (complex multiply). Llama 4's qk-norm (`Llama4TextL2Norm`, weightless,
//!   eps = `rms_norm_eps`, in f32) follows the rotation on RoPE layers only; the kernel fuses
//!   both with one rounding where HF rounds twice.
//! * Llama 4 NoPE layers: temperature tuning scales the query at absolute position p by
//!   `log1p(floor((p + 1) / floor_scale)) * attn_scale + 1` (HF uses `cache_position`, the
//!   absolute position, so decode steps use the cached length + i); the kernel applies it to the
//!   f32 scores, HF to q rounded to the dtype. RoPE layers use chunked attention (keys in the
//!   query's `attention_chunk_size` chunk, by absolute position), NoPE layers full causal.
//! * MoE (Llama 4): router logits `x Wr^T`; top-k of the logits (ties to the lower expert);
//!   the chosen logits go through a sigmoid (no softmax, no renormalization); each chosen
//!   expert gets its **input** scaled by that weight (`routed_in = x * score`, rounded to the
//!   dtype as in HF) and computes `down(silu(gate) * up)` with the expert weights in
//!   `x @ W` layout; the routed outputs are summed and added to the shared expert's output.
//! * Residual adds: HF rounds the block output and then the sum; the composer fuses the
//!   feed-forward residual into the down projection (cuBLAS `beta = 1`): one rounding.

mod kv_cache;
pub mod layer;
pub mod proj;
mod step;
pub mod weights;
mod workspace;

pub use crate::formats::config::{FfnSpec, LayerSpec, ModelKind};
pub use kv_cache::{DEFAULT_PAGE_SIZE, KvCache, KvCacheConfig, MAX_SLOTS};
pub use layer::{DecoderLayer, Trace};
pub use proj::Proj;
pub use step::{Step, StepSeq};
pub use weights::{HostFfn, HostLayerWeights, HostTensor, LayerWeights};
pub use workspace::LayerWorkspace;
