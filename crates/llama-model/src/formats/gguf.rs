//! GGUF files (llama.cpp's format): metadata, tensor directory and tensor data, read defensively
//! with positioned reads ([`ModelFile`]: a file truncated by another process while it is read
//! is a named error, not a `SIGBUS`).
//!
//! Layout (version 2 and 3, little endian): the magic `GGUF`, a `u32` version, a `u64` tensor
//! count and a `u64` metadata count; the metadata as key (`u64` length + UTF-8) / type (`u32`) /
//! value triples; one directory entry per tensor (name, `u32` rank, `u64` dimensions with the
//! fastest-varying first, `u32` type, `u64` offset into the data section); padding to
//! `general.alignment` (default 32); the data section.
//!
//! A file is untrusted input: every count and length is checked against the bytes that remain
//! before anything is allocated from it, ranks are at most [`MAX_RANK`], a metadata array holds at
//! most [`MAX_ARRAY`] values and all of them together at most [`MAX_METADATA_VALUES`] (so parsed
//! metadata costs a bounded multiple of what real vocabularies need, whatever the file's size),
//! tensor names are unique, every tensor's byte range lies inside the file and starts at an
//! aligned offset (for every type, decoded or not), and an unknown value or tensor type is a named
//! [`Error::Io`] or [`Error::Checkpoint`], never a panic.
//!
//! Tensors are decoded to f32 by [`GgufFile::dequantize`] exactly as llama.cpp's
//! `dequantize_row_*` do: F32, F16, BF16, Q8_0, Q4_0 and Q4_1 (block of 32 values with an f16
//! scale, plus an f16 minimum for Q4_1; 4-bit values `q` of byte `j` are element `j` (low
//! nibble) and `j + 16` (high nibble), `x = d * (q - 8)` for Q4_0 and `x = d * q + m` for Q4_1),
//! Q5_0 and Q5_1 (a fifth bit per value), the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K
//! (super-blocks of 256 with per-sub-block scales), and IQ4_NL and IQ4_XS (a fixed non-linear
//! code book), each bit for bit as the `gguf` package decodes it. The other types llama.cpp
//! writes (Q8_1, Q8_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, TQ1_0, TQ2_0, and
//! the integer and F64 types) have their byte ranges checked and are a named error to decode.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};

use super::files::ModelFile;
use crate::error::{Error, Result};
use llama_kernels::spec::quant::{PackedWeight, QuantFormat, scale_min_k4};

/// The most dimensions a GGUF tensor has (GGML_MAX_DIMS).
pub const MAX_RANK: usize = 4;
/// Largest metadata array the reader accepts, in elements: the longest merge list the tokenizer
/// accepts (the tokenizer's `MAX_MERGES`); real vocabularies hold at most
/// a few hundred thousand entries.
pub const MAX_ARRAY: u64 = 1 << 22;
/// Most metadata values (array elements included) one file may hold: enough for the largest
/// vocabulary (tokens, scores, types) and merge list the tokenizer accepts. Each parsed value
/// takes 32 bytes (a string 24 more, plus its bytes, which the file holds), so parsed metadata
/// costs at most about 900 MiB beyond the file's own string bytes, whatever the file claims.
pub const MAX_METADATA_VALUES: u64 = 1 << 24;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Any of the unsigned integer types.
    U64(u64),
    /// Any of the signed integer types.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values of one type.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }
    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// How a tensor's elements are stored (ggml's type names).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit floats.
    F32,
    /// 16-bit IEEE floats.
    F16,
    /// bfloat16.
    BF16,
    /// Blocks of 32: an f16 scale and 32 signed bytes.
    Q8_0,
    /// Blocks of 32: an f16 scale and 16 bytes of 4-bit values offset by 8.
    Q4_0,
    /// Blocks of 32: an f16 scale, an f16 minimum and 16 bytes of 4-bit values.
    Q4_1,
    /// Blocks of 32: an f16 scale, 32 fifth bits and 16 bytes of 4-bit values; `d (q - 16)`.
    Q5_0,
    /// Blocks of 32: an f16 scale and minimum, 32 fifth bits, 16 bytes of 4-bit values; `d q + m`.
    Q5_1,
    /// Super-blocks of 256: sixteen 4-bit scale / 4-bit minimum pairs, 2-bit values, f16 scale
    /// and minimum.
    Q2_K,
    /// Super-blocks of 256: a high-bit mask, 2-bit low values, sixteen 6-bit signed scales, an
    /// f16 scale.
    Q3_K,
    /// Super-blocks of 256: f16 scale and minimum, eight 6-bit sub-block scales and minimums,
    /// 4-bit values.
    Q4_K,
    /// As Q4_K with a fifth bit per value.
    Q5_K,
    /// Super-blocks of 256: 4 low and 2 high bits per value, sixteen i8 sub-block scales, an f16
    /// scale.
    Q6_K,
    /// Blocks of 32: an f16 scale and 4-bit indices into a fixed non-linear code book.
    IQ4_NL,
    /// Super-blocks of 256: IQ4_NL's code book with eight 6-bit signed sub-block scales.
    IQ4_XS,
    /// A type whose block size this reader knows (so its byte range is checked) but which it
    /// does not decode ([`GgmlType::name`] names it). Holds the ggml type id.
    Undecoded(u32),
}

/// The ggml types this reader checks but does not decode: (id, name, elements per block, bytes
/// per block), as llama.cpp's `ggml_type_traits` (and the `gguf` package's `GGML_QUANT_SIZES`).
const UNDECODED: [(u32, &str, usize, usize); 16] = [
    (9, "Q8_1", 32, 36),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
];

impl GgmlType {
    /// The type of ggml id `id`, or `None` for an id this reader does not know.
    fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            30 => GgmlType::BF16,
            _ if UNDECODED.iter().any(|u| u.0 == id) => GgmlType::Undecoded(id),
            _ => return None,
        })
    }
    /// ggml's name of the type (`Q4_K`, `IQ2_XXS`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::Undecoded(id) => UNDECODED.iter().find(|u| u.0 == id).map_or("?", |u| u.1),
        }
    }
    /// The packed format the kernels read this type in, if any.
    pub fn quant_format(self) -> Option<QuantFormat> {
        Some(match self {
            GgmlType::Q8_0 => QuantFormat::Q8_0,
            GgmlType::Q4_0 => QuantFormat::Q4_0,
            GgmlType::Q4_1 => QuantFormat::Q4_1,
            GgmlType::Q5_0 => QuantFormat::Q5_0,
            GgmlType::Q5_1 => QuantFormat::Q5_1,
            GgmlType::Q4_K => QuantFormat::Q4_K,
            GgmlType::Q5_K => QuantFormat::Q5_K,
            GgmlType::Q6_K => QuantFormat::Q6_K,
            _ => return None,
        })
    }
    /// Elements per block and bytes per block (ggml's `blck_size` and `type_size`).
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q2_K => (256, 84),
            GgmlType::Q3_K => (256, 110),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            GgmlType::Q6_K => (256, 210),
            GgmlType::IQ4_NL => (32, 18),
            GgmlType::IQ4_XS => (256, 136),
            // from_id admits only the table's ids.
            GgmlType::Undecoded(id) => UNDECODED.iter().find(|u| u.0 == id).map_or((1, 1), |u| (u.2, u.3)),
        }
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, slowest-varying first (the reverse of GGUF's order): a `[out, in]` weight
    /// as in PyTorch.
    pub shape: Vec<usize>,
    /// How its elements are stored.
    pub dtype: GgmlType,
    /// Byte range in the file.
    range: (usize, usize),
}

/// A GGUF file: metadata and tensor directory parsed and checked; tensor data read on demand.
pub struct GgufFile {
    path: String,
    file: ModelFile,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgufFile({}, v{}, {} tensors)", self.path, self.version, self.tensors.len())
    }
}

/// A cursor over the file's header whose every read is bounds-checked against the file's length.
/// The header is read into `buf` as the cursor reaches it, in doubling chunks, so it costs at most
/// twice its own size and never more than the file holds.
struct Reader<'a> {
    file: &'a ModelFile,
    buf: Vec<u8>,
    at: usize,
    path: &'a str,
    /// Metadata values parsed so far (see [`MAX_METADATA_VALUES`]).
    values: u64,
}

impl<'a> Reader<'a> {
    fn err(&self, why: impl Into<String>) -> Error {
        Error::Io { path: self.path.to_string(), why: format!("malformed GGUF at byte {}: {}", self.at, why.into()) }
    }
    fn len(&self) -> usize {
        usize::try_from(self.file.len()).unwrap_or(usize::MAX)
    }
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.len()).ok_or_else(|| self.err("truncated"))?;
        if end > self.buf.len() {
            let want = end.max(self.buf.len().saturating_mul(2)).max(1 << 16).min(self.len());
            let more = self.file.read(self.buf.len() as u64, want as u64)?;
            self.buf.extend_from_slice(&more);
        }
        let start = self.at;
        self.at = end;
        Ok(&self.buf[start..end])
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn remaining(&self) -> usize {
        self.len() - self.at
    }
    /// A count of items of at least `min_bytes` each: never more than the bytes left could hold.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize> {
        let n = self.u64()?;
        if n > (self.remaining() / min_bytes.max(1)) as u64 {
            return Err(self.err(format!("{what} count {n} exceeds what the file's remaining bytes can hold")));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String> {
        let n = self.count("string byte", 1)?;
        let at = self.at;
        let bytes = self.take(n)?.to_vec();
        String::from_utf8(bytes).map_err(|_| {
            self.at = at;
            self.err("a string is not UTF-8")
        })
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue> {
        self.values += 1;
        if self.values > MAX_METADATA_VALUES {
            return Err(self.err(format!("more than {MAX_METADATA_VALUES} metadata values")));
        }
        Ok(match ty {
            0 => GgufValue::U64(u64::from(self.array::<1>()?[0])),
            1 => GgufValue::I64(i64::from(self.array::<1>()?[0] as i8)),
            2 => GgufValue::U64(u64::from(u16::from_le_bytes(self.array()?))),
            3 => GgufValue::I64(i64::from(i16::from_le_bytes(self.array()?))),
            4 => GgufValue::U64(u64::from(self.u32()?)),
            5 => GgufValue::I64(i64::from(i32::from_le_bytes(self.array()?))),
            6 => GgufValue::F64(f64::from(f32::from_le_bytes(self.array()?))),
            7 => GgufValue::Bool(self.array::<1>()?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(self.err("nested arrays are not supported"));
                }
                let elem = self.u32()?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    _ => return Err(self.err(format!("unknown array element type {elem}"))),
                };
                let n = self.count("array element", min)?;
                if n as u64 > MAX_ARRAY {
                    return Err(self.err(format!("array of {n} elements exceeds {MAX_ARRAY}")));
                }
                if self.values.saturating_add(n as u64) > MAX_METADATA_VALUES {
                    return Err(self.err(format!("more than {MAX_METADATA_VALUES} metadata values")));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(self.err(format!("unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Opens and checks `path` (a regular file): header, metadata and tensor directory.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let file = ModelFile::open(path.as_ref())?;
        let name = file.path().to_string();
        let (version, metadata, tensors) = Self::parse(&file, &name)?;
        Ok(GgufFile { path: name, file, version, metadata, tensors })
    }

    #[allow(clippy::type_complexity)]
    fn parse(file: &ModelFile, path: &str) -> Result<(u32, BTreeMap<String, GgufValue>, Vec<GgufTensor>)> {
        let mut r = Reader { file, buf: Vec::new(), at: 0, path, values: 0 };
        if r.take(4).ok() != Some(&b"GGUF"[..]) {
            return Err(r.err("not a GGUF file (no GGUF magic)"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.err(format!("version {version} unsupported (supported: 2, 3)")));
        }
        // A directory entry is at least 8 (name) + 4 (rank) + 4 (type) + 8 (offset) bytes; a
        // metadata pair at least 8 (key) + 4 (type) + 1 (value).
        let n_tensors = r.count("tensor", 24)?;
        let n_kv = r.count("metadata", 13)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(r.err(format!("metadata key `{key}` appears twice")));
            }
        }
        let mut entries = Vec::with_capacity(n_tensors);
        let mut names = std::collections::HashSet::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = r.string()?;
            if !names.insert(name.clone()) {
                return Err(r.err(format!("tensor `{name}` appears twice in the directory")));
            }
            let rank = r.u32()? as usize;
            if rank == 0 || rank > MAX_RANK {
                return Err(r.err(format!("tensor `{name}` has rank {rank} (1..={MAX_RANK})")));
            }
            let mut dims = Vec::with_capacity(rank);
            for _ in 0..rank {
                let d =
                    usize::try_from(r.u64()?).map_err(|_| r.err(format!("tensor `{name}`: dimension too large")))?;
                dims.push(d);
            }
            let id = r.u32()?;
            let dtype = GgmlType::from_id(id).ok_or_else(|| r.err(format!("tensor `{name}` has unknown type {id}")))?;
            let offset = usize::try_from(r.u64()?).map_err(|_| r.err(format!("tensor `{name}`: offset too large")))?;
            dims.reverse();
            entries.push((name, dims, dtype, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => v
                .as_u64()
                .filter(|a| a.is_power_of_two() && *a <= 1 << 20)
                .ok_or_else(|| r.err(format!("general.alignment {v:?} is not a power of two")))?
                as usize,
        };
        let data = r.at.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(entries.len());
        for (name, shape, dtype, offset) in entries {
            let bad = |why: String| Error::Checkpoint { tensor: name.clone(), why };
            if offset % alignment != 0 {
                return Err(bad(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
            }
            let numel =
                shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| bad("shape overflows".into()))?;
            let (per_block, block_bytes) = dtype.block();
            let cols = shape.last().copied().unwrap_or(1);
            if cols % per_block != 0 {
                return Err(bad(format!("{cols} columns are not whole blocks of {per_block} ({dtype:?})")));
            }
            let start = data.checked_add(offset);
            let end = (numel / per_block).checked_mul(block_bytes).and_then(|n| start?.checked_add(n));
            let range = match (start, end) {
                (Some(s), Some(e)) if e <= r.len() => (s, e),
                _ => return Err(bad(format!("data at offset {offset} runs past the end of the file"))),
            };
            tensors.push(GgufTensor { name, shape, dtype, range });
        }
        Ok((version, metadata, tensors))
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }
    /// Every metadata pair, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }
    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }
    /// The directory entry of `name`.
    pub fn tensor(&self, name: &str) -> Result<&GgufTensor> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::Checkpoint { tensor: name.to_string(), why: format!("not in {}", self.path) })
    }

    /// Tensor `name` (a matrix, or a higher-rank tensor seen as rows of its last dimension) kept
    /// in its quantized format, repacked into the kernels' layout ([`llama_kernels::spec::quant`]):
    /// Q8_0, Q4_0, Q4_1, Q4_K and Q6_K. Other types are an [`Error::Checkpoint`] naming the type.
    pub fn packed(&self, name: &str) -> Result<PackedWeight> {
        let t = self.tensor(name)?;
        let format = t.dtype.quant_format().ok_or_else(|| Error::Checkpoint {
            tensor: name.to_string(),
            why: format!(
                "type {} is not kept packed (packed: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
                t.dtype.name()
            ),
        })?;
        let cols = t.shape.last().copied().unwrap_or(0);
        let rows = t.shape.iter().rev().skip(1).product::<usize>();
        let bytes = self.data(t)?;
        PackedWeight::from_gguf_blocks(format, rows, cols, &bytes)
            .map_err(|e| Error::Checkpoint { tensor: name.to_string(), why: e.to_string() })
    }

    /// The stored bytes of tensor `t` (a named error if the file was truncated since it was
    /// opened).
    fn data(&self, t: &GgufTensor) -> Result<Vec<u8>> {
        let (start, end) = t.range;
        self.file
            .read(start as u64, end as u64)
            .map_err(|e| Error::Checkpoint { tensor: t.name.clone(), why: e.to_string() })
    }

    /// Tensor `name` decoded to f32, row-major in [`GgufTensor::shape`] order.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.tensor(name)?;
        let unsupported = || Error::Checkpoint {
            tensor: name.to_string(),
            why: format!(
                "type {} is not decoded (decoded: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, \
                 Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)",
                t.dtype.name()
            ),
        };
        if let GgmlType::Undecoded(_) = t.dtype {
            return Err(unsupported());
        }
        let bytes = self.data(t)?;
        Ok(match t.dtype {
            GgmlType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            GgmlType::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            GgmlType::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            GgmlType::Q5_0 => bytes.chunks_exact(22).flat_map(q5_0).collect(),
            GgmlType::Q5_1 => bytes.chunks_exact(24).flat_map(q5_1).collect(),
            GgmlType::Q2_K => bytes.chunks_exact(84).flat_map(q2_k).collect(),
            GgmlType::Q3_K => bytes.chunks_exact(110).flat_map(q3_k).collect(),
            GgmlType::Q5_K => bytes.chunks_exact(176).flat_map(q5_k).collect(),
            GgmlType::IQ4_NL => bytes.chunks_exact(18).flat_map(iq4_nl).collect(),
            GgmlType::IQ4_XS => bytes.chunks_exact(136).flat_map(iq4_xs).collect(),
            GgmlType::Undecoded(_) => return Err(unsupported()),
            _ => self.packed(name)?.dequantize(),
        })
    }
}

/// One Q5_K super-block: `x = (d * sc) * q - dmin * m` per 32-value sub-block, q the Q4_K nibble
/// with a fifth bit from `qh`; separate f32 operations as llama.cpp's reference and the `gguf`
/// package compute it. (Q5_K is decoded at load only: no kernel keeps it packed.)
fn q5_k(b: &[u8]) -> [f32; 256] {
    let f16_at = |i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let (d, dmin, scales, qh, qs) = (f16_at(0), f16_at(2), &b[4..16], &b[16..48], &b[48..176]);
    let mut out = [0f32; 256];
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        let (dj, mj) = (d * f32::from(sc), dmin * f32::from(m));
        let bytes = &qs[(j / 2) * 32..][..32];
        for l in 0..32 {
            let low = if j % 2 == 0 { bytes[l] & 0x0f } else { bytes[l] >> 4 };
            let q = low | (((qh[l] >> j) & 1) << 4);
            out[j * 32 + l] = dj * f32::from(q) - mj;
        }
    }
    out
}

// The decoders below compute each value with the f32 operations, in the order, of the `gguf`
// package's numpy `dequantize_blocks` (llama.cpp's `dequantize_row_*`), so that they agree bit
// for bit; element `e` of a block is the value the package writes at that position.

fn f16_le(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// A 32-value block's 4-bit code of element `e`: the low nibbles of `qs` are elements 0..16,
/// the high nibbles 16..32.
fn nibble(qs: &[u8], e: usize) -> u8 {
    if e < 16 { qs[e] & 0x0f } else { qs[e - 16] >> 4 }
}

/// One Q5_0 block: `d * (q - 16)`, q the nibble with bit `e` of `qh` as its fifth bit.
fn q5_0(b: &[u8]) -> [f32; 32] {
    let (d, qh, qs) = (f16_le(b, 0), u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22]);
    std::array::from_fn(|e| {
        let q = nibble(qs, e) | ((((qh >> e) & 1) as u8) << 4);
        d * f32::from(q as i8 - 16)
    })
}

/// One Q5_1 block: `d * q + m`.
fn q5_1(b: &[u8]) -> [f32; 32] {
    let (d, m, qh, qs) = (f16_le(b, 0), f16_le(b, 2), u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]);
    std::array::from_fn(|e| {
        let q = nibble(qs, e) | ((((qh >> e) & 1) as u8) << 4);
        d * f32::from(q) + m
    })
}

/// Element `e` of a 256-value super-block's 2-bit plane `qs` (64 bytes): two halves of 128
/// values, each four shifts of the half's 32 bytes.
fn two_bits(qs: &[u8], e: usize) -> u8 {
    let (half, shift, byte) = (e / 128, (e % 128) / 32, e % 32);
    (qs[half * 32 + byte] >> (2 * shift)) & 3
}

/// One Q2_K super-block: `(d * sc) * q - dmin * m` per 16-value sub-block (sc, m the low and
/// high nibbles of its scale byte).
fn q2_k(b: &[u8]) -> [f32; 256] {
    let (scales, qs, d, dmin) = (&b[0..16], &b[16..80], f16_le(b, 80), f16_le(b, 82));
    std::array::from_fn(|e| {
        let sc = scales[e / 16];
        let (dl, ml) = (d * f32::from(sc & 0x0f), dmin * f32::from(sc >> 4));
        dl * f32::from(two_bits(qs, e)) - ml
    })
}

/// One Q3_K super-block: `(d * s) * (q - 4 [high bit clear])` per 16-value sub-block, s a 6-bit
/// scale minus 32 (low 4 bits from bytes 0..8, high 2 from bytes 8..12 of the scales).
fn q3_k(b: &[u8]) -> [f32; 256] {
    let (hmask, qs, sc, d) = (&b[0..32], &b[32..96], &b[96..108], f16_le(b, 108));
    let scale = |i: usize| -> f32 {
        let low = if i < 8 { sc[i] & 0x0f } else { sc[i - 8] >> 4 };
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        f32::from((low | (high << 4)) as i8 - 32)
    };
    std::array::from_fn(|e| {
        let high_clear = ((hmask[e % 32] >> (e / 32)) & 1) ^ 1;
        let q = two_bits(qs, e) as i8 - (high_clear << 2) as i8;
        (d * scale(e / 16)) * f32::from(q)
    })
}

/// IQ4_NL's (and IQ4_XS's) code book.
const IQ4_CODE: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// One IQ4_NL block: `d * code[q]`.
fn iq4_nl(b: &[u8]) -> [f32; 32] {
    let (d, qs) = (f16_le(b, 0), &b[2..18]);
    std::array::from_fn(|e| d * f32::from(IQ4_CODE[usize::from(nibble(qs, e))]))
}

/// One IQ4_XS super-block: `(d * s) * code[q]` per 32-value sub-block, s a 6-bit scale minus
/// 32 (low 4 bits from `scales_l`, high 2 from the u16 `scales_h`), q as IQ4_NL's within it.
fn iq4_xs(b: &[u8]) -> [f32; 256] {
    let (d, scales_h, scales_l, qs) = (f16_le(b, 0), u16::from_le_bytes([b[2], b[3]]), &b[4..8], &b[8..136]);
    let scale = |j: usize| -> f32 {
        let low = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
        let high = ((scales_h >> (2 * j)) & 3) as u8;
        f32::from((low | (high << 4)) as i8 - 32)
    };
    std::array::from_fn(|e| {
        let (j, t) = (e / 32, e % 32);
        (d * scale(j)) * f32::from(IQ4_CODE[usize::from(nibble(&qs[j * 16..], t))])
    })
}
