//! Text in, text out: a [`Model`] with its [`Tokenizer`], chat template and stop ids, loaded
//! together from one GGUF file or one Hugging Face checkpoint directory ([`TextModel`]).
//!
//! The run dtype defaults to the weights' own precision ([`default_dtype`]): f32 for a GGUF
//! file (quantized weights dequantize exactly to f32, not to bf16; SmolLM2-135M answers the
//! capital of France correctly in f32 and not in bf16), bf16 for a checkpoint directory.

use std::path::Path;

use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;

use super::generate::{GenerateOptions, Generation, SamplingConfig};
use super::runner::{Model, ModelPlan};
use super::weights::{HostModel, WeightFormat};
use crate::text::chat::ChatTemplate;
use crate::text::stop::StopIds;
use crate::text::tokenizer::Tokenizer;

/// The run dtype for the model at `path` when none is asked for (see the module docs).
pub fn default_dtype(path: &Path) -> DType {
    if path.is_dir() { DType::BF16 } else { DType::F32 }
}

/// A model with everything it needs to turn text into text.
#[derive(Debug)]
pub struct TextModel {
    /// The model on the device (one slot).
    pub model: Model,
    /// Text <-> token ids.
    pub tokenizer: Tokenizer,
    /// The chat template, when the model has one.
    pub template: Option<ChatTemplate>,
    /// The ids that end a turn or the text.
    pub stop: StopIds,
}

impl TextModel {
    /// Loads a GGUF file or a checkpoint directory in `dtype` for sequences of up to `max_len`
    /// tokens (prompt and reply), prefilled `max_tokens` at a time.
    pub fn open(device: &Device, path: &Path, dtype: DType, max_len: usize, max_tokens: usize) -> Result<TextModel> {
        TextModel::open_with(device, path, dtype, (max_len, max_tokens), WeightFormat::AsStored)
    }

    /// [`TextModel::open`] with the projections run as `weights` says; `(max_len, max_tokens)`
    /// as there.
    pub fn open_with(
        device: &Device,
        path: &Path,
        dtype: DType,
        sizes: (usize, usize),
        weights: WeightFormat,
    ) -> Result<TextModel> {
        TextModel::open_with_adapter(device, path, dtype, sizes, weights, None)
    }

    /// [`TextModel::open_with`] with a LoRA adapter in peft's format (a directory) attached
    /// unmerged ([`Model::attach_adapter`]: the base stays as `weights` says, packed projections
    /// stay packed).
    pub fn open_with_adapter(
        device: &Device,
        path: &Path,
        dtype: DType,
        (max_len, max_tokens): (usize, usize),
        weights: WeightFormat,
        adapter: Option<&Path>,
    ) -> Result<TextModel> {
        let TextParts { mut host, tokenizer, template, stop } = TextParts::open(path, dtype)?;
        host.set_weight_format(weights, dtype)?;
        let plan = ModelPlan { slots: 1, max_len, max_tokens };
        let mut model = Model::new(device, &host, dtype, plan)?;
        if let Some(dir) = adapter {
            model.attach_adapter(&crate::formats::peft::Adapter::load(dir, &host.config, DType::F32)?)?;
        }
        Ok(TextModel { model, tokenizer, template, stop })
    }

    /// The token ids of `prompt`: as one user turn of the chat template with the generation
    /// prompt (`chat`), or as plain text (with the tokenizer's BOS when it adds one).
    pub fn prompt_ids(&self, prompt: &str, chat: bool) -> Result<Vec<u32>> {
        if !chat {
            return self.tokenizer.encode(prompt, true);
        }
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| Error::Unsupported { what: "--chat: the model has no chat template".into() })?;
        self.tokenizer.encode(&template.render_user_turn(prompt)?, false)
    }

    /// Generates a reply to `prompt` ids, streaming its text to `on_text` as whole characters
    /// become available (the stop token is not text). Returns the reply and the generation.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampling: SamplingConfig,
        seed: u64,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(String, Generation)> {
        let opts = GenerateOptions { max_new_tokens, stop: self.stop.as_set().clone(), sampling, seed };
        let mut decoder = self.tokenizer.stream(true);
        let mut text = String::new();
        let mut failed = None;
        let generation = self.model.generate(0, prompt, &opts, &mut |id| match decoder.push(id) {
            Ok(piece) => {
                on_text(&piece);
                text.push_str(&piece);
                true
            }
            Err(e) => {
                failed = Some(e);
                false
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        let rest = decoder.finish();
        on_text(&rest);
        text.push_str(&rest);
        Ok((text, generation))
    }
}

/// What a GGUF file or a checkpoint directory holds besides the device model: its host weights,
/// tokenizer, chat template (if any) and stop ids.
#[derive(Debug)]
pub struct TextParts {
    /// The weights, converted to the run dtype.
    pub host: HostModel,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, when the model has one.
    pub template: Option<ChatTemplate>,
    /// The ids that end a reply.
    pub stop: StopIds,
}

impl TextParts {
    /// Reads a GGUF file or a checkpoint directory in `dtype`.
    pub fn open(path: &Path, dtype: DType) -> Result<TextParts> {
        if path.is_dir() {
            let tokenizer = Tokenizer::from_hf_dir(path)?;
            // No template is fine (a base model); a broken one is an error.
            let has_template = path.join("chat_template.jinja").is_file()
                || std::fs::read_to_string(path.join("tokenizer_config.json"))
                    .is_ok_and(|t| t.contains("\"chat_template\""));
            let template = has_template.then(|| ChatTemplate::from_hf_dir(path)).transpose()?;
            let stop = StopIds::from_hf_dir(path)?;
            Ok(TextParts { host: HostModel::from_checkpoint(path, dtype)?, tokenizer, template, stop })
        } else {
            let file = GgufFile::open(path)?;
            let tokenizer = Tokenizer::from_gguf(&file)?;
            let has_template = file.metadata().contains_key("tokenizer.chat_template");
            let template = has_template.then(|| ChatTemplate::from_gguf(&file)).transpose()?;
            let stop = StopIds::from_gguf(&file, &tokenizer)?;
            drop(file);
            Ok(TextParts { host: HostModel::from_gguf(path, dtype)?, tokenizer, template, stop })
        }
    }
}
