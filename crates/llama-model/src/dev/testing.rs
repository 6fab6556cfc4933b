//! Test support of the model crate: seeded random models and the real test model's path.
//! The generators and tolerances are the kernel crate's ([`llama_kernels::dev::testing`]).

use llama_kernels::DType;
use llama_kernels::dev::testing::Rng;
use llama_kernels::spec::weights::{HostLayerWeights, HostTensor};

use crate::error::Result;
use crate::formats::config::ModelConfig;
use crate::model::HostModel;

impl HostModel {
    /// A seeded random model of the layers of `config_json` (a `config.json` text), with a
    /// `vocab`-token embedding and, unless `tied`, its own LM head.
    pub fn random(config_json: &str, vocab: usize, tied: bool, dtype: DType, seed: u64) -> Result<Self> {
        let config = ModelConfig::from_json(config_json)?;
        let layers = (0..config.num_layers())
            .map(|i| {
                let spec = config.layer(i)?;
                Ok((spec, HostLayerWeights::random(&spec, dtype, seed + i as u64)))
            })
            .collect::<Result<Vec<_>>>()?;
        let hidden = layers.first().map_or(0, |(s, _)| s.hidden);
        let eps = layers.first().map_or(1e-5, |(s, _)| s.rms_norm_eps);
        let mut rng = Rng::new(seed ^ 0x5eed);
        let embed = HostTensor::random(&mut rng, &[vocab, hidden], 1.0, dtype);
        let norm = HostTensor::uniform(&mut rng, &[hidden], 0.5, 1.5, dtype);
        let lm_head =
            (!tied).then(|| HostTensor::random(&mut rng, &[vocab, hidden], 1.0 / (hidden as f64).sqrt(), dtype));
        Ok(Self { config, layers, embed, norm, lm_head, eps, lm_head_packed: None })
    }
}

/// The real test model (SmolLM2-135M-Instruct, GGUF) that `scripts/setup.sh` fetches into
/// `.cache/models/`, or the file `LLK_MODEL` names; `None` (with the reason) when absent.
pub fn test_model_path() -> std::result::Result<std::path::PathBuf, String> {
    let path = match std::env::var_os("LLK_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        // The repository's `.cache`, two folders above this crate.
        None => match std::path::Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2) {
            Some(repo) => repo.join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            None => return Err("this crate is not in a repository checkout".into()),
        },
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} is missing (run scripts/setup.sh, which fetches it)", path.display()))
    }
}
