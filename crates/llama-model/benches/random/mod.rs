//! Random models for the benches: SmolLM2-135M's and Llama 3 8B's shapes, weights uniform with a
//! trained layer's scale (1/sqrt(fan in)), drawn in parallel.
#![allow(dead_code)]

use llama_model::block::{HostFfn, HostLayerWeights, HostTensor};
use llama_model::formats::ModelConfig;
use llama_model::model::HostModel;
use llama_model::{Error, Result};

use super::common;

pub const SMOLLM2: &str = r#"{"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
  "num_key_value_heads": 3, "intermediate_size": 1536, "num_hidden_layers": 30, "rms_norm_eps": 1e-5,
  "rope_theta": 100000.0}"#;
pub const SMOLLM2_VOCAB: usize = 49152;

pub const LLAMA3_8B: &str = r#"{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
  "num_key_value_heads": 8, "intermediate_size": 14336, "num_hidden_layers": LAYERS, "rms_norm_eps": 1e-5,
  "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;
pub const LLAMA3_VOCAB: usize = 128256;
pub const LLAMA3_LAYERS: usize = 32;

/// A random model of `config_json`'s layers, drawn in parallel (see the module docs).
pub fn random_host(config_json: &str, vocab: usize, tied: bool, seed: u64) -> Result<HostModel> {
    let config = ModelConfig::from_json(config_json)?;
    let t = |shape: &[usize], std: f64, seed: u64| {
        let mut data = vec![0f32; shape.iter().product()];
        common::par_uniform(&mut data, std, seed);
        HostTensor { shape: shape.to_vec(), data }
    };
    let ones = |n: usize| HostTensor { shape: vec![n], data: vec![1.0; n] };
    let s = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
    let mut layers = Vec::new();
    for i in 0..config.num_layers() {
        let spec = config.layer(i)?;
        let (h, d, inter) = (spec.hidden, spec.head_dim, spec.intermediate());
        let (qd, kvd) = (spec.q_heads * d, spec.kv_heads * d);
        let seed = seed.wrapping_add(16 * i as u64);
        let w = HostLayerWeights {
            input_norm: ones(h),
            q_proj: t(&[qd, h], s(h), seed + 1),
            k_proj: t(&[kvd, h], s(h), seed + 2),
            v_proj: t(&[kvd, h], s(h), seed + 3),
            o_proj: t(&[h, qd], s(qd), seed + 4),
            attn_bias: None,
            post_norm: ones(h),
            ffn: HostFfn::Dense {
                gate: t(&[inter, h], s(h), seed + 5),
                up: t(&[inter, h], s(h), seed + 6),
                down: t(&[h, inter], s(inter), seed + 7),
                bias: None,
            },
            packed: Default::default(),
        };
        layers.push((spec, w));
    }
    let (hidden, eps) = layers
        .first()
        .map(|(s, _)| (s.hidden, s.rms_norm_eps))
        .ok_or_else(|| Error::Config { field: "num_hidden_layers".into(), why: "0".into() })?;
    Ok(HostModel {
        config,
        layers,
        embed: t(&[vocab, hidden], 1.0, seed ^ 0xe1),
        norm: ones(hidden),
        lm_head: (!tied).then(|| t(&[vocab, hidden], s(hidden), seed ^ 0x4ead)),
        eps,
        lm_head_packed: None,
    })
}
