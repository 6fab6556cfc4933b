//! One projection of a layer on the device ([`Proj`]): a dense weight multiplied by
//! [`ops::linear`](mod@llama_kernels::ops::linear) (cuBLAS on CUDA), or packed weights multiplied by
//! [`ops::qlinear`](mod@llama_kernels::ops::qlinear) (the GEMV for decode steps, dequantize-and-GEMM
//! for prefill). A fused projection (q|k|v, gate|up) is its parts' rows one after another; packed
//! parts of one format are concatenated into one weight at load, parts of different formats
//! (a GGUF `Q4_K_M` file keeps some v projections in Q6_K) each write their own columns of the
//! output.

use std::collections::BTreeMap;

use half::{bf16, f16};

use crate::error::{Error, Result};
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;
use llama_kernels::ops::qlinear::{self, QScratch, QWeight};
use llama_kernels::ops::{linear, linear_backward, qlinear_backward};
use llama_kernels::spec::quant::PackedWeight;
use llama_kernels::spec::weights::HostTensor;
use llama_kernels::tensor::Tensor;

/// A projection's weight (see the module docs).
#[derive(Clone, Debug)]
pub enum Proj {
    /// `[out, in]` in the run dtype.
    Dense(Tensor),
    /// Packed parts, in output order.
    Packed(Vec<QWeight>),
}

impl Proj {
    /// The weight of the parts `names` (Hugging Face names, in output order) of `dense`: packed
    /// when every part is in `packed`, else dense (the parts' values converted to `dtype`).
    pub(crate) fn upload(
        device: &Device,
        dtype: DType,
        parts: &[(&str, &HostTensor)],
        packed: &BTreeMap<String, PackedWeight>,
    ) -> Result<Proj> {
        let found: Vec<&PackedWeight> = parts.iter().filter_map(|(n, _)| packed.get(*n)).collect();
        if found.len() == parts.len() && !found.is_empty() {
            let mut groups: Vec<Vec<&PackedWeight>> = Vec::new();
            for p in found {
                match groups.last_mut() {
                    Some(g)
                        if g[0].layout().format() == p.layout().format()
                            && g[0].layout().block() == p.layout().block()
                            && g[0].code() == p.code() =>
                    {
                        g.push(p)
                    }
                    _ => groups.push(vec![p]),
                }
            }
            let weights = groups
                .iter()
                .map(|g| {
                    if g.len() == 1 {
                        QWeight::new(device, g[0])
                    } else {
                        QWeight::new(device, &PackedWeight::concat_rows(g)?)
                    }
                })
                .collect::<llama_kernels::Result<Vec<_>>>()?;
            return Ok(Proj::Packed(weights));
        }
        let cols = parts.first().and_then(|(_, t)| t.shape.get(1)).copied().unwrap_or(0);
        let rows: usize = parts.iter().map(|(_, t)| t.shape.first().copied().unwrap_or(0)).sum();
        let data: Vec<f32> = parts.iter().flat_map(|(_, t)| t.data.iter().copied()).collect();
        Ok(Proj::Dense(upload(device, dtype, &data, &[rows, cols])?))
    }

    /// Whether the weight is packed.
    pub fn is_packed(&self) -> bool {
        matches!(self, Proj::Packed(_))
    }

    /// The packed parts (none for a dense weight).
    pub fn packed(&self) -> &[QWeight] {
        match self {
            Proj::Dense(_) => &[],
            Proj::Packed(p) => p,
        }
    }

    /// Bytes of the weight on the device (what one product reads).
    pub fn bytes(&self) -> usize {
        match self {
            Proj::Dense(t) => t.numel() * t.dtype().size(),
            Proj::Packed(p) => p.iter().map(QWeight::bytes).sum(),
        }
    }

    /// `y = x Wᵀ + bias`, or `y += ...` when `add`. Packed weights take no bias and need
    /// `scratch` for more than [`qlinear::MAX_GEMV_ROWS`] rows.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        add: bool,
        scratch: Option<&QScratch>,
    ) -> Result<()> {
        match self {
            Proj::Dense(w) if add => Ok(linear::linear_add(x, w, bias, y)?),
            Proj::Dense(w) => Ok(linear::linear(x, w, bias, y)?),
            Proj::Packed(parts) => {
                if bias.is_some() {
                    return Err(Error::Unsupported { what: "a bias on a packed projection".into() });
                }
                let last = y.rank().saturating_sub(1);
                let mut first = 0;
                for w in parts {
                    let n = w.shape()[0];
                    let yp = y.narrow(last, first, n)?;
                    if add { qlinear::qlinear_add(x, w, &yp, scratch) } else { qlinear::qlinear(x, w, &yp, scratch) }?;
                    first += n;
                }
                Ok(())
            }
        }
    }
}

impl Proj {
    /// The input gradient of [`Proj::forward`]: `dx = dy W` (or `dx += dy W` when `add`), from
    /// the packed bytes for a packed weight (never a dense copy of it). `scratch` as for the
    /// forward (the f32 and misaligned paths of a packed weight dequantize bands into it).
    pub(crate) fn backward_input(&self, dy: &Tensor, dx: &Tensor, add: bool, scratch: Option<&QScratch>) -> Result<()> {
        match self {
            Proj::Dense(w) => Ok(linear_backward::linear_backward_input(dy, w, dx, add)?),
            Proj::Packed(parts) => {
                let last = dy.rank().saturating_sub(1);
                let mut first = 0;
                for (i, w) in parts.iter().enumerate() {
                    let n = w.shape()[0];
                    qlinear_backward::qlinear_backward_input(
                        &dy.narrow(last, first, n)?,
                        w,
                        dx,
                        add || i > 0,
                        scratch,
                    )?;
                    first += n;
                }
                Ok(())
            }
        }
    }
}

/// Uploads f32 values (already rounded to `dtype`) as a `dtype` tensor.
pub(crate) fn upload(device: &Device, dtype: DType, data: &[f32], shape: &[usize]) -> Result<Tensor> {
    match dtype {
        DType::F32 => Ok(Tensor::from_slice(device, data, shape)?),
        DType::F16 => {
            Ok(Tensor::from_slice(device, &data.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(), shape)?)
        }
        DType::BF16 => {
            Ok(Tensor::from_slice(device, &data.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), shape)?)
        }
        other => Err(Error::from(llama_kernels::Error::UnsupportedDType {
            op: "LayerWeights",
            what: "run dtype",
            dtype: other,
            supported: "f32, f16, bf16".into(),
        })),
    }
}
