//! The whole model on the device ([`Model`]): embedding lookup, every decoder layer over one
//! paged KV cache, the final RMSNorm and the LM head, planned once for a number of sequences, a
//! context length and a token budget per step.
//!
//! A step takes new token ids for some sequences (a prompt, a chunk of one, or one token each
//! for decode, in any mix) and returns logits: by default each sequence's last position only
//! ([`Logits::Last`]: the norm and the LM head run on those rows alone), or every position
//! ([`Logits::All`], for verification and perplexity). Sequences are identified by their cache
//! slot; [`Model::clear`] frees a slot's pages for the next sequence.

use crate::block::{DecoderLayer, KvCache, KvCacheConfig, LayerSpec, LayerWorkspace, Proj};
use crate::error::{Error, Result};
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;
use llama_kernels::ops::embedding::EmbeddingTable;
use llama_kernels::ops::qlinear::{QScratch, QWeight};
use llama_kernels::ops::{ErrorFlag, embedding, rms_norm};
use llama_kernels::tensor::Tensor;

use super::weights::HostModel;

/// What a [`Model`] is planned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelPlan {
    /// Sequences in flight at once (cache slots).
    pub slots: usize,
    /// Most tokens of one sequence (prompt plus generated).
    pub max_len: usize,
    /// Most new tokens in one step, all sequences together (the prefill chunk).
    pub max_tokens: usize,
}

/// Which positions of a step get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Logits {
    /// Each sequence's last new token: `[sequences, vocab]`, in batch order.
    #[default]
    Last,
    /// Every new token: `[tokens, vocab]`, in batch order.
    All,
}

/// The model on the device, with its KV cache and workspaces.
#[derive(Debug)]
pub struct Model {
    device: Device,
    dtype: DType,
    plan: ModelPlan,
    vocab: usize,
    hidden: usize,
    eps: f32,
    layers: Vec<DecoderLayer>,
    /// The token embedding: a dense table, or the packed LM head it is tied to.
    embed: EmbeddingTable,
    norm: Tensor,
    /// The LM head: its own weight, the embedding (tied), or packed.
    head: Proj,
    /// The prefill band of a packed head (more than 16 rows of logits).
    head_scratch: Option<QScratch>,
    cache: KvCache,
    ws: LayerWorkspace,
    pub(super) errors: ErrorFlag,
    /// `[max_tokens]` i32: the step's token ids; `[max_tokens]` i32: rows that get logits.
    ids: Tensor,
    rows: Tensor,
    /// `[max_tokens, hidden]`: the hidden states (in place through the layers), the rows that
    /// get logits, and their norm.
    hidden_states: Tensor,
    picked: Tensor,
    normed: Tensor,
    /// `[max_tokens, vocab]`.
    logits: Tensor,
}

impl Model {
    /// Checks `host` ([`HostModel::validate`]), uploads it in `dtype` and plans the cache and
    /// workspaces for `plan`.
    pub fn new(device: &Device, host: &HostModel, dtype: DType, plan: ModelPlan) -> Result<Model> {
        const OP: &str = "Model::new";
        host.validate()?;
        if plan.slots == 0 || plan.max_len == 0 || plan.max_tokens == 0 {
            return Err(Error::invalid(OP, "plan", format!("{plan:?}"), "every size must be > 0"));
        }
        let specs: Vec<LayerSpec> = host.layers.iter().map(|(s, _)| *s).collect();
        let layers =
            host.layers.iter().map(|(s, w)| DecoderLayer::new(device, dtype, *s, w)).collect::<Result<Vec<_>>>()?;
        let (vocab, hidden) = (host.vocab(), host.hidden());
        let up = |t: &crate::block::HostTensor| crate::block::proj::upload(device, dtype, &t.data, &t.shape);
        let norm = up(&host.norm)?;
        // A packed head tied to the embedding (no separate lm_head) is the embedding table too.
        let (embed, head) = match (&host.lm_head_packed, &host.lm_head) {
            (Some(p), None) => {
                let w = QWeight::new(device, p)?;
                (EmbeddingTable::Packed(w.clone()), Proj::Packed(vec![w]))
            }
            (Some(p), Some(_)) => {
                (EmbeddingTable::Dense(up(&host.embed)?), Proj::Packed(vec![QWeight::new(device, p)?]))
            }
            (None, Some(h)) => (EmbeddingTable::Dense(up(&host.embed)?), Proj::Dense(up(h)?)),
            (None, None) => {
                let embed = up(&host.embed)?;
                (EmbeddingTable::Dense(embed.clone()), Proj::Dense(embed))
            }
        };
        let head_scratch = match &head {
            Proj::Packed(w) => Some(QScratch::new(device, dtype, &w.iter().collect::<Vec<_>>())?),
            Proj::Dense(_) => None,
        };
        let cache = KvCache::for_layers_with(device, dtype, &specs, &KvCacheConfig::new(plan.slots, plan.max_len))?;
        let mut ws = LayerWorkspace::plan(device, dtype, &specs, plan.max_tokens, &cache)?;
        ws.plan_packed(&layers.iter().collect::<Vec<_>>())?;
        let t = plan.max_tokens;
        Ok(Model {
            device: device.clone(),
            dtype,
            plan,
            vocab,
            hidden,
            eps: host.eps,
            layers,
            embed,
            norm,
            head,
            head_scratch,
            cache,
            ws,
            errors: ErrorFlag::new(device)?,
            ids: Tensor::zeros(device, DType::I32, &[t])?,
            rows: Tensor::zeros(device, DType::I32, &[t])?,
            hidden_states: Tensor::zeros(device, dtype, &[t, hidden])?,
            picked: Tensor::zeros(device, dtype, &[t, hidden])?,
            normed: Tensor::zeros(device, dtype, &[t, hidden])?,
            logits: Tensor::zeros(device, dtype, &[t, vocab])?,
        })
    }

    /// Attaches a LoRA adapter in peft's format to every layer, unmerged: the base stays as
    /// loaded (packed projections stay packed) and each adapted projection adds its branch
    /// (`alpha/r · x Aᵀ Bᵀ`, no dropout). Replaces any adapter attached before; on an error none
    /// is attached. [`HostModel::merge_adapter`] merges one into the weights instead.
    pub fn attach_adapter(&mut self, adapter: &crate::formats::peft::Adapter) -> Result<()> {
        let attached = self.layers.iter_mut().try_for_each(|l| l.attach_adapter(&self.device, adapter));
        let planned = attached.and_then(|()| {
            let layers: Vec<&DecoderLayer> = self.layers.iter().collect();
            self.ws.plan_lora(&self.device, &layers, adapter.config.lora.r)
        });
        if planned.is_err() {
            self.layers.iter_mut().for_each(DecoderLayer::detach_adapter);
        }
        planned
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The run dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// What the model was planned for.
    pub fn plan(&self) -> ModelPlan {
        self.plan
    }
    /// Tokens in the vocabulary.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
    /// Elements per token of the hidden states.
    pub fn hidden(&self) -> usize {
        self.hidden
    }
    /// Tokens cached for `slot` so far.
    pub fn len(&self, slot: usize) -> usize {
        self.cache.lens().get(slot).copied().unwrap_or(0)
    }
    /// Forgets `slot`'s sequence and frees its pages.
    pub fn clear(&mut self, slot: usize) {
        self.cache.clear(slot);
    }
    /// Reads and clears the device error flag (waits for the device): `Err` when a token id of
    /// an earlier step was outside the vocabulary (its embedding row was zeros).
    pub fn check_errors(&self) -> Result<()> {
        Ok(self.errors.check("Model::step")?)
    }

    /// One step: `batch` lists `(slot, new token ids)` in increasing slot order; returns the
    /// logits of [`Logits`] `which` (a view of the model's buffer, valid until the next step).
    pub fn step(&mut self, batch: &[(usize, &[u32])], which: Logits) -> Result<Tensor> {
        self.step_observed(batch, which, &mut |_, _| Ok(()))
    }

    /// [`Model::step`], calling `observe(layer, hidden)` after each layer with its output
    /// (`[tokens, hidden]`; for verification: reading it waits for the device).
    pub fn step_observed(
        &mut self,
        batch: &[(usize, &[u32])],
        which: Logits,
        observe: &mut dyn FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        const OP: &str = "Model::step";
        let mut ids = Vec::new();
        for (slot, tokens) in batch {
            if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
                return Err(Error::invalid(
                    OP,
                    "token id",
                    bad,
                    format!("slot {slot}: the vocabulary has {}", self.vocab),
                ));
            }
            ids.extend(tokens.iter().map(|&t| t as i32));
        }
        let shape: Vec<(usize, usize)> = batch.iter().map(|(s, t)| (*s, t.len())).collect();
        let step = self.ws.begin_step(&mut self.cache, &shape)?;
        let t = step.tokens;
        let ids_t = self.ids.narrow(0, 0, t)?;
        ids_t.copy_from_slice(&ids)?;
        let hidden = self.hidden_states.narrow(0, 0, t)?;
        self.embed.lookup(&ids_t, &hidden, &self.errors)?;
        for (i, layer) in self.layers.iter().enumerate() {
            layer.forward(&mut self.ws, &self.cache, i, &step, &hidden)?;
            observe(i, &hidden)?;
        }
        // The rows that get logits: all of them, or each sequence's last, gathered by the
        // embedding kernel (a row gather of the hidden states).
        let (rows, n) = match which {
            Logits::All => (hidden, t),
            Logits::Last => {
                let last: Vec<i32> = step.seqs.iter().map(|s| (s.offset + s.new - 1) as i32).collect();
                let rows_t = self.rows.narrow(0, 0, last.len())?;
                rows_t.copy_from_slice(&last)?;
                let picked = self.picked.narrow(0, 0, last.len())?;
                embedding(&hidden, &rows_t, &picked, &self.errors)?;
                (picked, last.len())
            }
        };
        let normed = self.normed.narrow(0, 0, n)?;
        rms_norm(&rows, &self.norm, self.eps, &normed)?;
        let logits = self.logits.narrow(0, 0, n)?;
        self.head.forward(&normed, None, &logits, false, self.head_scratch.as_ref())?;
        self.cache.commit(&step)?;
        Ok(logits)
    }
}
