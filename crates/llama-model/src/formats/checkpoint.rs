//! Hugging Face checkpoints: `config.json` plus safetensors weights, read with positioned reads
//! ([`ModelFile`]: a file truncated by another process while it is read is a named error, not a
//! `SIGBUS`).
//!
//! A directory holds either one or more `*.safetensors` files (their headers list the tensors),
//! or a sharded checkpoint whose `model.safetensors.index.json` maps each tensor name to its
//! shard. Files are opened lazily, only when a tensor they hold is read, so a directory that
//! holds only some layers' tensors (or only some shards) works for those layers.
//!
//! Layer tensors are found under `model.layers.N.` (Llama, `Llama4ForCausalLM`),
//! `language_model.model.layers.N.` (`Llama4ForConditionalGeneration` checkpoints) or
//! `model.language_model.layers.N.` (newer transformers). Every tensor is converted once to the
//! run dtype (from F32, F16, BF16 or F64; each value rounded once, to nearest even), and its
//! shape is checked against the config. A missing tensor, a wrong shape or a dtype that cannot be
//! converted is an [`Error::Checkpoint`] naming the tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use half::{bf16, f16};
use safetensors::tensor::{Dtype, Metadata};

use super::config::{LayerSpec, ModelConfig};
use super::files::{MAX_CONFIG_BYTES, ModelFile, read_bounded_text};
use crate::error::{Error, Result};
use llama_kernels::dtype::{DType, round_to};
use llama_kernels::spec::weights::{HostLayerWeights, HostTensor};

const INDEX: &str = "model.safetensors.index.json";

/// Largest safetensors header read, in bytes (the `safetensors` crate's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One safetensors file and its parsed header.
pub(crate) struct Shard {
    file: ModelFile,
    /// Where the tensor data starts (8 + header length).
    data_start: u64,
    meta: Metadata,
}

/// Whether `name` is a plain file name: one path component, not `.` or `..`, no separator. Shard
/// names of an index must be, so that every file read lies inside the checkpoint directory
/// (a shard may still be a symlink, as in the Hugging Face cache).
fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!((parts.next(), parts.next()), (Some(std::path::Component::Normal(n)), None) if n == name)
        && !name.contains(['/', '\\', '\0'])
}

impl Shard {
    /// Opens `path` and reads its header: an 8-byte length (at most [`MAX_HEADER_BYTES`]), the
    /// JSON tensor table, and data whose length the table accounts for exactly.
    pub(crate) fn open(path: &Path) -> Result<Shard> {
        let file = ModelFile::open(path)?;
        let bad = |why: String| Error::Io {
            path: path.display().to_string(),
            why: format!("not a valid safetensors file: {why}"),
        };
        if file.len() < 8 {
            return Err(bad(format!("{} bytes, shorter than the header length", file.len())));
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&file.read(0, 8)?);
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER_BYTES || n > file.len() - 8 {
            return Err(bad(format!("a header of {n} bytes (at most {MAX_HEADER_BYTES}, and within the file)")));
        }
        let meta: Metadata = serde_json::from_slice(&file.read(8, 8 + n)?).map_err(|e| bad(e.to_string()))?;
        let data = file.len() - 8 - n;
        if meta.data_len() as u64 != data {
            return Err(bad(format!("the header accounts for {} data bytes, the file holds {data}", meta.data_len())));
        }
        Ok(Shard { file, data_start: 8 + n, meta })
    }

    /// Reads tensor `name`, checks its shape, and converts it to `dtype` (values returned as f32,
    /// exactly representable in `dtype`).
    pub(crate) fn tensor(&self, name: &str, shape: &[usize], dtype: DType) -> Result<HostTensor> {
        let m = self;
        let err = |why: String| Error::Checkpoint { tensor: name.to_string(), why };
        let info = m.meta.info(name).ok_or_else(|| err(format!("not in {}", m.file.path())))?;
        if info.shape != shape {
            return Err(err(format!("shape {:?} disagrees with the config (expected {shape:?})", info.shape)));
        }
        let (start, end) = info.data_offsets;
        let bytes = m.read(start, end)?;
        let n: usize = shape.iter().product();
        let width = match info.dtype {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::F64 => 8,
            other => {
                return Err(err(format!(
                    "dtype {other:?} cannot be converted to {dtype} (supported: F32, F16, BF16, F64)"
                )));
            }
        };
        if bytes.len() != n * width {
            return Err(err(format!("{} data bytes for {n} {:?} values", bytes.len(), info.dtype)));
        }
        let round = |v: f64| round_to(dtype, v) as f32;
        let data: Vec<f32> = match info.dtype {
            Dtype::F32 => {
                bytes.chunks_exact(4).map(|c| round(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))).collect()
            }
            Dtype::F16 => bytes.chunks_exact(2).map(|c| round(f16::from_le_bytes([c[0], c[1]]).to_f64())).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|c| round(bf16::from_le_bytes([c[0], c[1]]).to_f64())).collect(),
            _ => bytes
                .chunks_exact(8)
                .map(|c| round(f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])))
                .collect(),
        };
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(err(format!("element {i} is not finite after conversion to {dtype}")));
        }
        Ok(HostTensor { shape: shape.to_vec(), data })
    }

    /// The names of the tensors the file holds.
    pub(crate) fn names(&self) -> Vec<String> {
        self.meta.tensors().into_keys().collect()
    }

    /// The bytes at `start..end` of the data section.
    fn read(&self, start: usize, end: usize) -> Result<Vec<u8>> {
        self.file.read(self.data_start + start as u64, self.data_start + end as u64)
    }
}

/// A tensor's bytes as stored, with its safetensors dtype and shape ([`Checkpoint::raw`]).
pub(crate) struct RawTensor {
    bytes: Vec<u8>,
    /// The stored dtype.
    pub(crate) dtype: Dtype,
    /// The stored shape.
    pub(crate) shape: Vec<usize>,
}

impl RawTensor {
    /// The tensor's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// A checkpoint directory: its config and where each tensor lives.
pub struct Checkpoint {
    dir: PathBuf,
    config: ModelConfig,
    /// Tensor name -> file name (relative to `dir`).
    files_by_tensor: HashMap<String, String>,
    shards: Mutex<HashMap<String, Arc<Shard>>>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Checkpoint({}, {} tensors)", self.dir.display(), self.files_by_tensor.len())
    }
}

impl Checkpoint {
    /// Opens `dir`: reads `config.json`, then `model.safetensors.index.json` if present,
    /// otherwise the headers of every `*.safetensors` file in the directory.
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint> {
        let dir = dir.as_ref().to_path_buf();
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let mut files_by_tensor = HashMap::new();
        let mut shards = HashMap::new();
        let index = dir.join(INDEX);
        if index.exists() {
            let text = read_bounded_text(&index, MAX_CONFIG_BYTES)?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::Io { path: index.display().to_string(), why: format!("not valid JSON: {e}") })?;
            let map = value
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::Io { path: index.display().to_string(), why: "no `weight_map` object".into() })?;
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| Error::Io {
                    path: index.display().to_string(),
                    why: format!("weight_map entry `{name}` is not a file name"),
                })?;
                if !is_plain_file_name(file) {
                    return Err(Error::Io {
                        path: index.display().to_string(),
                        why: format!(
                            "weight_map entry `{name}` names `{file}`: shards must be plain file names in the checkpoint directory"
                        ),
                    });
                }
                files_by_tensor.insert(name.clone(), file.to_string());
            }
        } else {
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| Error::Io { path: dir.display().to_string(), why: e.to_string() })?;
            let mut files: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::Io {
                    path: dir.display().to_string(),
                    why: format!("no {INDEX} and no *.safetensors file"),
                });
            }
            for file in files {
                let shard = Shard::open(&dir.join(&file))?;
                for name in shard.meta.tensors().keys() {
                    files_by_tensor.insert(name.clone(), file.clone());
                }
                shards.insert(file, Arc::new(shard));
            }
        }
        Ok(Checkpoint { dir, config, files_by_tensor, shards: Mutex::new(shards) })
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Whether the checkpoint lists `name` (its file may still be absent).
    pub fn lists(&self, name: &str) -> bool {
        self.files_by_tensor.contains_key(name)
    }

    fn file(&self, tensor: &str) -> Result<Arc<Shard>> {
        let file = self.files_by_tensor.get(tensor).ok_or_else(|| Error::Checkpoint {
            tensor: tensor.to_string(),
            why: format!("missing (not listed in {})", self.dir.display()),
        })?;
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = shards.get(file) {
            return Ok(m.clone());
        }
        let path = self.dir.join(file);
        if !path.exists() {
            return Err(Error::Checkpoint {
                tensor: tensor.to_string(),
                why: format!("its shard {file} is not in {}", self.dir.display()),
            });
        }
        let m = Arc::new(Shard::open(&path)?);
        shards.insert(file.clone(), m.clone());
        Ok(m)
    }

    /// Reads tensor `name`, checks its shape, and converts it to `dtype` (values returned as f32,
    /// exactly representable in `dtype`).
    pub fn tensor(&self, name: &str, shape: &[usize], dtype: DType) -> Result<HostTensor> {
        self.file(name)?.tensor(name, shape, dtype)
    }

    /// Tensor `name` as stored: its safetensors dtype, shape and bytes, for formats read byte for byte (bitsandbytes' packed weights, `block::bnb`).
    /// The byte range is checked against the file and against the dtype and shape.
    pub(crate) fn raw(&self, name: &str) -> Result<RawTensor> {
        let m = self.file(name)?;
        let err = |why: String| Error::Checkpoint { tensor: name.to_string(), why };
        let info = m.meta.info(name).ok_or_else(|| err("listed in the index but not in its file".into()))?;
        let (start, end) = info.data_offsets;
        let bits = info
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(info.dtype.bitsize()));
        if end < start || bits != (end - start).checked_mul(8) {
            return Err(err(format!("{start}..{end} data bytes for shape {:?} of {:?}", info.shape, info.dtype)));
        }
        let bytes = m.read(start, end)?;
        Ok(RawTensor { bytes, dtype: info.dtype, shape: info.shape.clone() })
    }

    /// The name prefix of layer `index`'s tensors: the first of `model.layers.N.`,
    /// `language_model.model.layers.N.` and `model.language_model.layers.N.` that the
    /// checkpoint lists.
    pub fn layer_prefix(&self, index: usize) -> Result<String> {
        let candidates = [
            format!("model.layers.{index}."),
            format!("language_model.model.layers.{index}."),
            format!("model.language_model.layers.{index}."),
        ];
        for p in &candidates {
            if self.lists(&format!("{p}input_layernorm.weight")) {
                return Ok(p.clone());
            }
        }
        Err(Error::Checkpoint {
            tensor: format!("{}input_layernorm.weight", candidates[0]),
            why: format!(
                "missing (also looked under {} and {})",
                candidates[1].trim_end_matches('.'),
                candidates[2].trim_end_matches('.')
            ),
        })
    }

    /// Layer `index`: its spec and its weights converted to `dtype`.
    pub fn layer(&self, index: usize, dtype: DType) -> Result<(LayerSpec, HostLayerWeights)> {
        if !dtype.is_float() {
            return Err(Error::from(llama_kernels::Error::UnsupportedDType {
                op: "Checkpoint::layer",
                what: "run dtype",
                dtype,
                supported: "f32, f16, bf16".into(),
            }));
        }
        let spec = self.config.layer(index)?;
        let prefix = self.layer_prefix(index)?;
        // bitsandbytes NF4 projections stay packed; their dense tensors hold the dequantized
        // values rounded to `dtype` (what the packed kernels multiply by).
        let mut packed = std::collections::BTreeMap::new();
        let mut w = HostLayerWeights::from_source(&spec, |name, shape| {
            let full = format!("{prefix}{name}");
            match self.packed(&full)? {
                Some(p) if [p.layout().rows(), p.layout().cols()] == shape => {
                    let t = HostTensor::new(shape, p.dequantize_to(dtype))?;
                    packed.insert(name.to_string(), p);
                    Ok(t)
                }
                Some(p) => Err(Error::Checkpoint {
                    tensor: full,
                    why: format!(
                        "NF4 shape [{}, {}] disagrees with the config ({shape:?})",
                        p.layout().rows(),
                        p.layout().cols()
                    ),
                }),
                None => self.tensor(&full, shape, dtype),
            }
        })?;
        w.packed = packed;
        Ok((spec, w))
    }
}

/// Writes `tensors` (name, values) as one safetensors file of `dtype` at `path`: a helper for
/// tests and for `verify`'s self-made checkpoints.
pub fn write_safetensors(path: &Path, tensors: &[(String, &HostTensor)], dtype: DType) -> Result<()> {
    let (st, bytes_of): (Dtype, fn(f32) -> Vec<u8>) = match dtype {
        DType::F32 => (Dtype::F32, |v| v.to_le_bytes().to_vec()),
        DType::F16 => (Dtype::F16, |v| f16::from_f32(v).to_le_bytes().to_vec()),
        DType::BF16 => (Dtype::BF16, |v| bf16::from_f32(v).to_le_bytes().to_vec()),
        other => {
            return Err(Error::from(llama_kernels::Error::UnsupportedDType {
                op: "write_safetensors",
                what: "dtype",
                dtype: other,
                supported: "f32, f16, bf16".into(),
            }));
        }
    };
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.data.iter().flat_map(|&v| bytes_of(v)).collect(), t.shape.clone()))
        .collect();
    let views = data
        .iter()
        .map(|(n, b, s)| {
            safetensors::tensor::TensorView::new(st, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::Checkpoint { tensor: n.clone(), why: e.to_string() })
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::tensor::serialize(views, None)
        .map_err(|e| Error::Io { path: path.display().to_string(), why: e.to_string() })?;
    std::fs::write(path, bytes).map_err(|e| Error::Io { path: path.display().to_string(), why: e.to_string() })
}
