//! How each tensor of a GGUF file runs: kept packed on the device, dequantized at load, or read
//! as metadata ([`TensorPlan`]), and a printable summary of a file ([`FileReport`]), as
//! `llama-kernels info --model FILE` shows it. The rules are the loader's
//! ([`HostModel::from_gguf`](crate::model::HostModel::from_gguf)): a projection the device
//! runs packed ([`packable_projections`]: q, k, v, o and a dense feed-forward's gate, up and
//! down) whose type is one of the packed formats stays packed, and so does the LM head
//! (`output.weight`, or a tied `token_embd.weight`, which the embedding lookup then reads
//! too); everything else, the MoE feed-forward included, is dequantized to the run dtype.

use std::collections::BTreeMap;

use super::{GgufArch, rope_freqs, tensors};
use crate::error::Result;
use crate::formats::config::ModelConfig;
use crate::formats::gguf::{GgufFile, GgufTensor};
use llama_kernels::spec::layer::FfnSpec;
use llama_kernels::spec::quant::QuantFormat;
use llama_kernels::spec::weights::{expected_shapes, packable_projections};

/// How one tensor of the file runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    /// Kept packed on the device in this format (the packed GEMV and GEMM, or the packed
    /// embedding lookup).
    Packed(QuantFormat),
    /// Dequantized at load to the run dtype (dense kernels and cuBLAS).
    Dequantized,
    /// Read as the model's Llama 3.1 RoPE scaling (`rope_freqs.weight`).
    RopeScaling,
    /// Not read by the loader.
    Unread,
}

/// One tensor of the file and how it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    /// The GGUF tensor.
    pub tensor: GgufTensor,
    /// Bytes of its data in the file.
    pub bytes: usize,
    /// How it runs.
    pub runs: Runs,
}

/// A GGUF file's architecture, configuration and tensor plans.
#[derive(Clone, Debug)]
pub struct FileReport {
    /// The llama.cpp architecture.
    pub arch: GgufArch,
    /// The configuration its metadata stands for.
    pub config: ModelConfig,
    /// Every tensor, in file order.
    pub tensors: Vec<TensorPlan>,
}

impl FileReport {
    /// Reads `file`'s configuration and plans every tensor (nothing is dequantized).
    pub fn of(file: &GgufFile) -> Result<FileReport> {
        let (arch, raw) = super::config(file)?;
        let config = ModelConfig::from_value(&raw)?;
        let mut runs: BTreeMap<String, Runs> = BTreeMap::new();
        let packed_if = |t: &GgufTensor| t.dtype.quant_format().map_or(Runs::Dequantized, Runs::Packed);
        for i in 0..config.num_layers() {
            let spec = config.layer(i)?;
            let packable = packable_projections(&spec);
            for (hf, _) in expected_shapes(&spec) {
                let names = match tensors::source(arch, i, &hf, spec.q_heads, spec.kv_heads) {
                    Some(tensors::Source::Tensor { name, .. }) => vec![name],
                    Some(tensors::Source::ExpertsGateUp { gate, up }) => vec![gate, up],
                    Some(tensors::Source::ExpertsDown { name }) => vec![name],
                    None => vec![],
                };
                for name in names {
                    let how = match file.tensor(&name) {
                        Ok(t) if packable.contains(&hf) => packed_if(t),
                        _ => Runs::Dequantized,
                    };
                    runs.insert(name, how);
                }
            }
        }
        let head = if file.tensor("output.weight").is_ok() { "output.weight" } else { "token_embd.weight" };
        if let Ok(t) = file.tensor(head) {
            runs.insert(head.into(), packed_if(t));
        }
        runs.entry("token_embd.weight".into()).or_insert(Runs::Dequantized);
        runs.insert("output_norm.weight".into(), Runs::Dequantized);
        runs.insert(rope_freqs::TENSOR.into(), Runs::RopeScaling);
        let tensors = file
            .tensors()
            .iter()
            .map(|t| TensorPlan {
                bytes: tensor_bytes(t),
                runs: runs.get(&t.name).copied().unwrap_or(Runs::Unread),
                tensor: t.clone(),
            })
            .collect();
        Ok(FileReport { arch, config, tensors })
    }
}

/// Bytes of `t`'s data (whole blocks of its type).
fn tensor_bytes(t: &GgufTensor) -> usize {
    let (elems, bytes) = t.dtype.block();
    let n: usize = t.shape.iter().product();
    n / elems.max(1) * bytes
}

impl std::fmt::Display for FileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layers = self.config.num_layers();
        write!(f, "architecture: {} ({layers} layers", self.arch.name())?;
        if let Ok(s) = self.config.layer(0) {
            write!(f, ", hidden {}, {} q / {} kv heads of {}", s.hidden, s.q_heads, s.kv_heads, s.head_dim)?;
            if let Some(r) = s.rope {
                write!(f, ", RoPE theta {}", r.theta)?;
                match r.scaling {
                    Some(sc) => write!(
                        f,
                        " with Llama 3.1 scaling (factor {}, low {}, high {}, original context {})",
                        sc.factor, sc.low_freq_factor, sc.high_freq_factor, sc.original_max_position_embeddings
                    )?,
                    None => write!(f, " unscaled")?,
                }
            }
        }
        writeln!(f, ")")?;
        let specs: Vec<_> = (0..layers).filter_map(|i| self.config.layer(i).ok()).collect();
        let nope: Vec<usize> = specs.iter().filter(|s| s.rope.is_none()).map(|s| s.index).collect();
        let moe: Vec<usize> = specs.iter().filter(|s| matches!(s.ffn, FfnSpec::Moe { .. })).map(|s| s.index).collect();
        if !nope.is_empty() {
            writeln!(f, "  NoPE layers (global attention, temperature tuning): {nope:?}")?;
        }
        if let Some(FfnSpec::Moe { experts, top_k, intermediate, .. }) =
            specs.iter().map(|s| s.ffn).find(|ffn| matches!(ffn, FfnSpec::Moe { .. }))
        {
            writeln!(f, "  MoE layers ({experts} experts of {intermediate}, top {top_k}, shared expert): {moe:?}")?;
        }
        // By (type, how it runs): count and bytes.
        let mut groups: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
        for t in &self.tensors {
            let how = match t.runs {
                Runs::Packed(q) => format!("packed on the device ({q})"),
                Runs::Dequantized => "dequantized at load".into(),
                Runs::RopeScaling => "read as the RoPE scaling".into(),
                Runs::Unread => "not read".into(),
            };
            let e = groups.entry((t.tensor.dtype.name().to_string(), how)).or_default();
            e.0 += 1;
            e.1 += t.bytes;
        }
        writeln!(f, "tensors: {}", self.tensors.len())?;
        for ((ty, how), (n, bytes)) in groups {
            writeln!(f, "  {ty:<7} {n:>5} tensors {:>10.2} MiB  {how}", bytes as f64 / (1 << 20) as f64)?;
        }
        Ok(())
    }
}
