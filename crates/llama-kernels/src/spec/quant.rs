//! Packed weight formats: GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, and
//! bitsandbytes' NF4, in the
//! one layout the kernels read ([`QuantLayout`]), with the f32 dequantization that defines them
//! ([`PackedWeight::dequantize`]).
//!
//! # The packed layout
//!
//! A weight `[rows, cols]` (`nn.Linear`'s `[out, in]`) is read in chunks of
//! `LLK_QUANT_CHUNK` (32) consecutive elements of a row. Three planes, each row-major with
//! rows padded to 16 bytes, one after the other in one buffer:
//!
//! - `qs`: the values. 4-, 5- and 6-bit formats: 16 bytes per chunk, byte `i` holding the low 4
//!   bits of element `i` in its low nibble and of element `i + 16` in its high nibble (GGUF's
//!   Q4_0 order; Q4_K, Q5_K, Q6_K and NF4 are reordered into it at packing). Q8_0: 32 signed
//!   bytes per chunk.
//! - `qh`: Q6_K's top two bits of each 6-bit value, 8 bytes per chunk, byte `i` holding
//!   elements `i`, `i + 8`, `i + 16` and `i + 24` in bits 0-1, 2-3, 4-5 and 6-7; the 5-bit
//!   formats' fifth bits, 4 bytes per chunk, a little-endian word whose bit `i` is element `i`'s
//!   (GGUF's Q5_0 `qh` word as stored; Q5_K's reordered into it).
//! - `meta`: one header per block, the bytes the format stores: Q8_0 and Q4_0 an f16 scale `d`;
//!   Q4_1 `d` and the minimum `m` (f16); Q5_0 as Q4_0, Q5_1 as Q4_1; Q4_K and Q5_K `d`, `dmin`
//!   (f16) and 12 bytes of 6-bit sub-block scales and minimums; Q6_K 16 signed sub-block scales
//!   and `d` (f16); NF4 the block's absmax (f32).
//!
//! So the bytes are the format's own (4.5 bits per weight for Q4_0, 5.5 for Q5_0, 6 for Q5_1,
//! 4.5 for Q4_K, 5.5 for Q5_K, 6.5625 for Q6_K, 8.5 for Q8_0, 4.5 for NF4 with f32 absmax and
//! blocks of 64), plus row padding.
//!
//! # Dequantization
//!
//! Each formula is evaluated in f32 with every product and sum rounded as written, the order
//! llama.cpp's `dequantize_row_*` (and the `gguf` package) and bitsandbytes' `dequantize_4bit`
//! use, so the values are theirs bit for bit: Q8_0 `q * d`; Q4_0 `(q - 8) * d`; Q5_0
//! `(q - 16) * d`; Q4_1 and Q5_1 `q * d + m`; Q4_K and Q5_K `(d * sc) * q - (dmin * mn)` per
//! 32-element sub-block; Q6_K
//! `(d * sc) * (q - 32)` per 16-element group; NF4 `code[q] * absmax`. A double-quantized NF4
//! absmax (bitsandbytes' `nested_absmax`) is resolved to its f32 value at packing, with the same
//! operations bitsandbytes uses ([`resolve_nested_absmax`](super::quant_nf4::resolve_nested_absmax)).

use crate::error::{Error, Result};
use crate::ffi::params::{LLK_QUANT_CHUNK, LlkQuantFormat};

const CHUNK: usize = LLK_QUANT_CHUNK as usize;

/// bitsandbytes' NF4 code book (`bitsandbytes.functional.get_4bit_type("nf4")`), the values of
/// the 16 codes, in code order.
pub const NF4_CODE: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// A packed weight format.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// GGUF Q8_0: blocks of 32 signed bytes and an f16 scale.
    Q8_0,
    /// GGUF Q4_0: blocks of 32 4-bit values offset by 8 and an f16 scale.
    Q4_0,
    /// GGUF Q4_1: blocks of 32 4-bit values, an f16 scale and an f16 minimum.
    Q4_1,
    /// GGUF Q4_K: super-blocks of 256 4-bit values with 6-bit scales and minimums per 32.
    Q4_K,
    /// GGUF Q6_K: super-blocks of 256 6-bit values with 8-bit scales per 16.
    Q6_K,
    /// bitsandbytes NF4: blocks (64 by default) of 4-bit codes and an absmax.
    NF4,
    /// GGUF Q5_0: blocks of 32 5-bit values offset by 16 and an f16 scale.
    Q5_0,
    /// GGUF Q5_1: blocks of 32 5-bit values, an f16 scale and an f16 minimum.
    Q5_1,
    /// GGUF Q5_K: super-blocks of 256 5-bit values with 6-bit scales and minimums per 32.
    Q5_K,
}

impl QuantFormat {
    /// Every format.
    pub const ALL: [QuantFormat; 9] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
        QuantFormat::NF4,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q5_K,
    ];
    /// The short name used in kernel symbols (`qgemv_q4_k_bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "q8_0",
            QuantFormat::Q4_0 => "q4_0",
            QuantFormat::Q4_1 => "q4_1",
            QuantFormat::Q4_K => "q4_k",
            QuantFormat::Q6_K => "q6_k",
            QuantFormat::NF4 => "nf4",
            QuantFormat::Q5_0 => "q5_0",
            QuantFormat::Q5_1 => "q5_1",
            QuantFormat::Q5_K => "q5_k",
        }
    }
    /// The block size of the GGUF formats (elements per header); NF4's is chosen per weight
    /// (64 by default, see [`QuantLayout::new`]).
    pub const fn default_block(self) -> usize {
        match self {
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => 256,
            QuantFormat::NF4 => 64,
            _ => 32,
        }
    }
    /// Bytes of one block header in the `meta` plane.
    pub const fn meta_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q5_0 => 2,
            QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::NF4 => 4,
            QuantFormat::Q4_K | QuantFormat::Q5_K => 16,
            QuantFormat::Q6_K => 18,
        }
    }
    /// Bytes of one block as a GGUF file stores it (ggml's `type_size`); `None` for NF4, which
    /// is not a GGUF type.
    pub const fn gguf_block_bytes(self) -> Option<usize> {
        match self {
            QuantFormat::Q8_0 => Some(34),
            QuantFormat::Q4_0 => Some(18),
            QuantFormat::Q4_1 => Some(20),
            QuantFormat::Q4_K => Some(144),
            QuantFormat::Q6_K => Some(210),
            QuantFormat::Q5_0 => Some(22),
            QuantFormat::Q5_1 => Some(24),
            QuantFormat::Q5_K => Some(176),
            QuantFormat::NF4 => None,
        }
    }
    /// Bytes of one chunk in the `qs` plane.
    const fn qs_chunk_bytes(self) -> usize {
        if matches!(self, QuantFormat::Q8_0) { CHUNK } else { CHUNK / 2 }
    }
    /// Bytes of one chunk in the `qh` plane: Q6_K's top two bits, the 5-bit formats' fifth.
    const fn qh_chunk_bytes(self) -> usize {
        match self {
            QuantFormat::Q6_K => 8,
            QuantFormat::Q5_0 | QuantFormat::Q5_1 | QuantFormat::Q5_K => 4,
            _ => 0,
        }
    }
    /// The params enum.
    pub(crate) const fn ffi(self) -> LlkQuantFormat {
        match self {
            QuantFormat::Q8_0 => LlkQuantFormat::LLK_QUANT_Q8_0,
            QuantFormat::Q4_0 => LlkQuantFormat::LLK_QUANT_Q4_0,
            QuantFormat::Q4_1 => LlkQuantFormat::LLK_QUANT_Q4_1,
            QuantFormat::Q4_K => LlkQuantFormat::LLK_QUANT_Q4_K,
            QuantFormat::Q6_K => LlkQuantFormat::LLK_QUANT_Q6_K,
            QuantFormat::NF4 => LlkQuantFormat::LLK_QUANT_NF4,
            QuantFormat::Q5_0 => LlkQuantFormat::LLK_QUANT_Q5_0,
            QuantFormat::Q5_1 => LlkQuantFormat::LLK_QUANT_Q5_1,
            QuantFormat::Q5_K => LlkQuantFormat::LLK_QUANT_Q5_K,
        }
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where each plane of a packed `[rows, cols]` weight lies (byte offsets into one buffer, each
/// 16-byte aligned; see the module docs). The only way to make one is [`QuantLayout::new`], so
/// every value has a block its format allows and whole blocks per row:
///
/// ```
/// use llama_kernels::spec::quant::{QuantFormat, QuantLayout};
/// assert!(QuantLayout::new(QuantFormat::NF4, 48, 1, 48).is_err()); // NF4 blocks are powers of two
/// assert!(QuantLayout::new(QuantFormat::Q4_0, 32, 1, 40).is_err()); // 40 is not whole blocks
/// assert_eq!(QuantLayout::new(QuantFormat::NF4, 64, 2, 128).map(|l| l.cols()).ok(), Some(128));
/// ```
///
/// ```compile_fail
/// use llama_kernels::spec::quant::{QuantFormat, QuantLayout};
/// let unchecked = QuantLayout { format: QuantFormat::NF4, block: 48, rows: 1, cols: 48 };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantLayout {
    format: QuantFormat,
    block: usize,
    rows: usize,
    cols: usize,
}

const fn pad16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

impl QuantLayout {
    /// The layout of a `[rows, cols]` weight in `format` with `block` elements per header (the
    /// GGUF formats' own block; for NF4 a power of two from 32 to 4096). `cols` must be a whole
    /// number of blocks.
    pub fn new(format: QuantFormat, block: usize, rows: usize, cols: usize) -> Result<QuantLayout> {
        let ok_block = match format {
            QuantFormat::NF4 => block.is_power_of_two() && (CHUNK..=4096).contains(&block),
            _ => block == format.default_block(),
        };
        if !ok_block {
            return Err(Error::invalid("qlinear", "block", block, format!("not a {format} block size")));
        }
        if cols == 0 || cols % block != 0 {
            return Err(Error::invalid(
                "qlinear",
                "in features",
                cols,
                format!("must be a positive multiple of the {format} block ({block})"),
            ));
        }
        // Every byte offset stays below 2^62 (checked products of bounded sizes).
        let layout = QuantLayout { format, block, rows, cols };
        layout.total_bytes_checked().ok_or_else(|| Error::invalid("qlinear", "weight size", rows, "too large"))?;
        Ok(layout)
    }
    /// The format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }
    /// Elements per block header.
    pub fn block(&self) -> usize {
        self.block
    }
    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns (input features), a multiple of [`QuantLayout::block`].
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes per row of the `qs` plane.
    pub fn qs_row_bytes(&self) -> usize {
        pad16(self.cols / CHUNK * self.format.qs_chunk_bytes())
    }
    /// Bytes per row of the `qh` plane (0 unless Q6_K or a 5-bit format).
    pub fn qh_row_bytes(&self) -> usize {
        pad16(self.cols / CHUNK * self.format.qh_chunk_bytes())
    }
    /// Bytes per row of the `meta` plane.
    pub fn meta_row_bytes(&self) -> usize {
        pad16(self.cols / self.block * self.format.meta_bytes())
    }
    /// Offsets of the `qs`, `qh` and `meta` planes.
    pub fn planes(&self) -> [usize; 3] {
        let qh = self.rows * self.qs_row_bytes();
        [0, qh, qh + self.rows * self.qh_row_bytes()]
    }
    fn total_bytes_checked(&self) -> Option<usize> {
        let per_row = self.qs_row_bytes().checked_add(self.qh_row_bytes())?.checked_add(self.meta_row_bytes())?;
        per_row.checked_mul(self.rows).filter(|&b| b < 1 << 62)
    }
    /// Bytes of the whole packed weight.
    pub fn total_bytes(&self) -> usize {
        self.total_bytes_checked().unwrap_or(usize::MAX)
    }
    /// Bytes a product must read per row of the weight (the planes, padding included).
    pub fn bits_per_weight(&self) -> f64 {
        8.0 * (self.qs_row_bytes() + self.qh_row_bytes() + self.meta_row_bytes()) as f64 / self.cols as f64
    }
}

/// A packed weight on the host: its layout, the planes' bytes and (NF4) the code book. Made by
/// [`PackedWeight::new`] or a format's constructor, so its bytes are always as long as its
/// layout needs:
///
/// ```
/// use llama_kernels::spec::quant::{NF4_CODE, PackedWeight, QuantFormat, QuantLayout};
/// let layout = QuantLayout::new(QuantFormat::Q8_0, 32, 4, 64).unwrap();
/// assert!(PackedWeight::new(layout, vec![0; layout.total_bytes() - 1], NF4_CODE).is_err());
/// assert!(PackedWeight::new(layout, vec![0; layout.total_bytes()], NF4_CODE).is_ok());
/// ```
///
/// ```compile_fail
/// use llama_kernels::spec::quant::{NF4_CODE, PackedWeight, QuantFormat, QuantLayout};
/// let layout = QuantLayout::new(QuantFormat::Q8_0, 32, 4, 64).unwrap();
/// let short = PackedWeight { layout, bytes: vec![], code: NF4_CODE };
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    layout: QuantLayout,
    bytes: Vec<u8>,
    code: [f32; 16],
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Sub-block `j`'s 6-bit scale and minimum from the 12 packed bytes of a Q4_K/Q5_K super-block
/// (llama.cpp's `get_scale_min_k4`).
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// A 32-value chunk's 4-bit values (element order) into the layout's 16 bytes.
fn pack_nibbles(q: &[u8; CHUNK], out: &mut [u8]) {
    for i in 0..16 {
        out[i] = (q[i] & 0x0f) | (q[i + 16] << 4);
    }
}

impl PackedWeight {
    /// A packed weight from its parts: `bytes` must be exactly [`QuantLayout::total_bytes`]
    /// long; `code` is NF4's code book (bitsandbytes' `quant_map`; ignored by the other formats).
    pub fn new(layout: QuantLayout, bytes: Vec<u8>, code: [f32; 16]) -> Result<PackedWeight> {
        if bytes.len() != layout.total_bytes() {
            return Err(Error::invalid(
                "PackedWeight::new",
                "bytes",
                bytes.len(),
                format!("the layout needs {}", layout.total_bytes()),
            ));
        }
        Ok(PackedWeight { layout, bytes, code })
    }
    /// Where the planes lie in [`PackedWeight::bytes`].
    pub fn layout(&self) -> &QuantLayout {
        &self.layout
    }
    /// The planes, [`QuantLayout::total_bytes`] long.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// NF4's code book (bitsandbytes' `quant_map`); unused by the other formats.
    pub fn code(&self) -> &[f32; 16] {
        &self.code
    }
    /// The same planes with another code book (NF4).
    pub fn with_code(&self, code: [f32; 16]) -> PackedWeight {
        PackedWeight { layout: self.layout, bytes: self.bytes.clone(), code }
    }
    /// `[rows, cols]`: `[out, in]` of the weight.
    pub fn shape(&self) -> [usize; 2] {
        [self.layout.rows, self.layout.cols]
    }

    fn zeroed(layout: QuantLayout) -> PackedWeight {
        PackedWeight { layout, bytes: vec![0; layout.total_bytes()], code: NF4_CODE }
    }

    /// Repacks GGUF blocks (`rows` rows of `cols / block` blocks each, the bytes of a GGUF tensor
    /// of type `format`) into the layout. The values are unchanged: dequantizing gives llama.cpp's.
    pub fn from_gguf_blocks(format: QuantFormat, rows: usize, cols: usize, raw: &[u8]) -> Result<PackedWeight> {
        let block_bytes = format
            .gguf_block_bytes()
            .ok_or_else(|| Error::invalid("qlinear", "format", format, "is not a GGUF type"))?;
        let layout = QuantLayout::new(format, format.default_block(), rows, cols)?;
        let per_row = cols / layout.block;
        if Some(raw.len()) != rows.checked_mul(per_row * block_bytes) {
            return Err(Error::invalid(
                "qlinear",
                "GGUF bytes",
                raw.len(),
                format!("expected {rows} x {per_row} blocks of {block_bytes}"),
            ));
        }
        let mut w = PackedWeight::zeroed(layout);
        let [qs0, qh0, meta0] = layout.planes();
        let (qsr, qhr, mr, mb) =
            (layout.qs_row_bytes(), layout.qh_row_bytes(), layout.meta_row_bytes(), format.meta_bytes());
        for r in 0..rows {
            for (bi, b) in
                raw[r * per_row * block_bytes..][..per_row * block_bytes].chunks_exact(block_bytes).enumerate()
            {
                let meta = &mut w.bytes[meta0 + r * mr + bi * mb..][..mb];
                let chunks_per_block = layout.block / CHUNK;
                let first = bi * chunks_per_block; // the block's first chunk within the row
                match format {
                    QuantFormat::Q8_0 => {
                        meta.copy_from_slice(&b[..2]);
                        w.bytes[qs0 + r * qsr + first * 32..][..32].copy_from_slice(&b[2..34]);
                    }
                    QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                        meta.copy_from_slice(&b[..mb]);
                        w.bytes[qs0 + r * qsr + first * 16..][..16].copy_from_slice(&b[mb..mb + 16]);
                    }
                    QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
                        // d (and m), then qh (u32: bit i = element i's fifth bit), then qs.
                        meta.copy_from_slice(&b[..mb]);
                        w.bytes[qh0 + r * qhr + first * 4..][..4].copy_from_slice(&b[mb..mb + 4]);
                        w.bytes[qs0 + r * qsr + first * 16..][..16].copy_from_slice(&b[mb + 4..mb + 20]);
                    }
                    QuantFormat::Q5_K => {
                        // d, dmin, scales[12], qh[32], qs[128]: sub-block j's element l has its
                        // low bits in qs[(j / 2) * 32 + l] (low nibble for even j) and its fifth
                        // in bit j of qh[l].
                        meta.copy_from_slice(&b[..16]);
                        for j in 0..8 {
                            let mut q = [0u8; CHUNK];
                            let mut fifth = 0u32;
                            for (l, v) in q.iter_mut().enumerate() {
                                let byte = b[48 + (j / 2) * 32 + l];
                                *v = if j % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                                fifth |= u32::from((b[16 + l] >> j) & 1) << l;
                            }
                            pack_nibbles(&q, &mut w.bytes[qs0 + r * qsr + (first + j) * 16..][..16]);
                            w.bytes[qh0 + r * qhr + (first + j) * 4..][..4].copy_from_slice(&fifth.to_le_bytes());
                        }
                    }
                    QuantFormat::Q4_K => {
                        meta.copy_from_slice(&b[..16]);
                        // qs[(j / 2) * 32 + l]: sub-block j's element l, low nibble for even j.
                        for j in 0..8 {
                            let mut q = [0u8; CHUNK];
                            for (l, v) in q.iter_mut().enumerate() {
                                let byte = b[16 + (j / 2) * 32 + l];
                                *v = if j % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                            }
                            pack_nibbles(&q, &mut w.bytes[qs0 + r * qsr + (first + j) * 16..][..16]);
                        }
                    }
                    QuantFormat::Q6_K | QuantFormat::NF4 => {
                        // Q6_K (NF4 has no GGUF blocks: refused above): ql[128], qh[64],
                        // scales[16], d; element e = 128 h + 32 c + l.
                        meta[..16].copy_from_slice(&b[192..208]);
                        meta[16..].copy_from_slice(&b[208..210]);
                        for chunk in 0..8 {
                            let (h, c) = (chunk / 4, chunk % 4);
                            let mut low = [0u8; CHUNK];
                            let mut high = [0u8; 8];
                            for l in 0..CHUNK {
                                low[l] = (b[h * 64 + (c % 2) * 32 + l] >> (4 * (c / 2))) & 0x0f;
                                let top = (b[128 + h * 32 + l] >> (2 * c)) & 3;
                                high[l % 8] |= top << (2 * (l / 8));
                            }
                            pack_nibbles(&low, &mut w.bytes[qs0 + r * qsr + (first + chunk) * 16..][..16]);
                            w.bytes[qh0 + r * qhr + (first + chunk) * 8..][..8].copy_from_slice(&high);
                        }
                    }
                }
            }
        }
        Ok(w)
    }

    /// An NF4 weight from bitsandbytes' storage: `packed` holds the flattened `[rows * cols]`
    /// codes two per byte (element `2j` in the high nibble of byte `j`), `absmax` one f32 per
    /// `block` consecutive elements (already resolved when double-quantized), `code` the code book.
    /// `cols` must be a multiple of `block` (each block lies in one row).
    pub fn from_nf4(
        rows: usize,
        cols: usize,
        block: usize,
        packed: &[u8],
        absmax: &[f32],
        code: [f32; 16],
    ) -> Result<PackedWeight> {
        let layout = QuantLayout::new(QuantFormat::NF4, block, rows, cols)?;
        let n = rows * cols;
        if packed.len() != n / 2 || absmax.len() != n / block {
            return Err(Error::invalid(
                "qlinear",
                "NF4 sizes",
                format!("{} bytes, {} absmax", packed.len(), absmax.len()),
                format!("expected {} bytes and {} absmax for [{rows}, {cols}] in blocks of {block}", n / 2, n / block),
            ));
        }
        let mut w = PackedWeight::zeroed(layout);
        w.code = code;
        let [qs0, _, meta0] = layout.planes();
        let (qsr, mr) = (layout.qs_row_bytes(), layout.meta_row_bytes());
        for r in 0..rows {
            for c in 0..cols / CHUNK {
                let mut q = [0u8; CHUNK];
                for (i, v) in q.iter_mut().enumerate() {
                    let e = r * cols + c * CHUNK + i;
                    *v = if e % 2 == 0 { packed[e / 2] >> 4 } else { packed[e / 2] & 0x0f };
                }
                pack_nibbles(&q, &mut w.bytes[qs0 + r * qsr + c * 16..][..16]);
            }
            for bi in 0..cols / block {
                let a = absmax[(r * cols) / block + bi];
                w.bytes[meta0 + r * mr + bi * 4..][..4].copy_from_slice(&a.to_le_bytes());
            }
        }
        Ok(w)
    }

    /// Quantizes a dense row-major `[rows, cols]` weight to NF4 as bitsandbytes'
    /// `quantize_4bit(quant_type="nf4")` does: per block the absmax, then each value divided by it
    /// and mapped to the nearest code (ties to the upper code, as its midpoint decision tree).
    pub fn quantize_nf4(rows: usize, cols: usize, block: usize, data: &[f32]) -> Result<PackedWeight> {
        QuantLayout::new(QuantFormat::NF4, block, rows, cols)?;
        if data.len() != rows * cols {
            return Err(Error::invalid("qlinear", "dense weight", data.len(), format!("expected {rows} x {cols}")));
        }
        let mut packed = vec![0u8; data.len() / 2];
        let mut absmax = Vec::with_capacity(data.len() / block);
        for (bi, blk) in data.chunks_exact(block).enumerate() {
            let a = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            absmax.push(a);
            let inv = if a > 0.0 { 1.0 / a } else { 0.0 };
            for (i, &v) in blk.iter().enumerate() {
                let x = v * inv;
                let mut q = 0u8;
                for c in 1..16u8 {
                    if x >= 0.5 * (NF4_CODE[usize::from(c) - 1] + NF4_CODE[usize::from(c)]) {
                        q = c;
                    }
                }
                let e = bi * block + i;
                packed[e / 2] |= if e % 2 == 0 { q << 4 } else { q };
            }
        }
        PackedWeight::from_nf4(rows, cols, block, &packed, &absmax, NF4_CODE)
    }

    /// Chunk `c` of row `r`, dequantized (the specification the kernels implement).
    pub fn dequantize_chunk(&self, r: usize, c: usize) -> [f32; CHUNK] {
        let l = &self.layout;
        let [qs0, qh0, meta0] = l.planes();
        let meta = &self.bytes[meta0 + r * l.meta_row_bytes()..][..l.meta_row_bytes()];
        let first = c * CHUNK;
        let blk = first / l.block;
        let mut w = [0f32; CHUNK];
        if l.format == QuantFormat::Q8_0 {
            let d = f16_at(meta, blk * 2);
            for (i, v) in w.iter_mut().enumerate() {
                *v = f32::from(self.bytes[qs0 + r * l.qs_row_bytes() + c * 32 + i] as i8) * d;
            }
            return w;
        }
        let qs = &self.bytes[qs0 + r * l.qs_row_bytes() + c * 16..][..16];
        let fifth = match l.format {
            QuantFormat::Q5_0 | QuantFormat::Q5_1 | QuantFormat::Q5_K => {
                let h = &self.bytes[qh0 + r * l.qh_row_bytes() + c * 4..][..4];
                u32::from_le_bytes([h[0], h[1], h[2], h[3]])
            }
            _ => 0,
        };
        let q = |i: usize| {
            let low = if i < 16 { qs[i] & 0x0f } else { qs[i - 16] >> 4 };
            low | (((fifth >> i) & 1) as u8) << 4
        };
        match l.format {
            QuantFormat::Q5_0 => {
                let d = f16_at(meta, blk * 2);
                w.iter_mut().enumerate().for_each(|(i, v)| *v = (i32::from(q(i)) - 16) as f32 * d);
            }
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                let (d, m) = (f16_at(meta, blk * 4), f16_at(meta, blk * 4 + 2));
                w.iter_mut().enumerate().for_each(|(i, v)| *v = f32::from(q(i)) * d + m);
            }
            QuantFormat::Q4_0 => {
                let d = f16_at(meta, blk * 2);
                w.iter_mut().enumerate().for_each(|(i, v)| *v = (f32::from(q(i)) - 8.0) * d);
            }
            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                let e = &meta[blk * 16..][..16];
                let (sc, mn) = scale_min_k4((first % 256) / CHUNK, &e[4..]);
                let (d1, m1) = (f16_at(e, 0) * f32::from(sc), f16_at(e, 2) * f32::from(mn));
                w.iter_mut().enumerate().for_each(|(i, v)| *v = d1 * f32::from(q(i)) - m1);
            }
            QuantFormat::Q6_K => {
                let e = &meta[blk * 18..][..18];
                let hi = &self.bytes[qh0 + r * l.qh_row_bytes() + c * 8..][..8];
                let (d, group) = (f16_at(e, 16), (first % 256) / 16);
                for (i, v) in w.iter_mut().enumerate() {
                    let top = (hi[i % 8] >> (2 * (i / 8))) & 3;
                    let s = d * f32::from(e[group + i / 16] as i8);
                    *v = s * (i32::from(q(i) | (top << 4)) - 32) as f32;
                }
            }
            _ => {
                let a = f32::from_le_bytes([meta[blk * 4], meta[blk * 4 + 1], meta[blk * 4 + 2], meta[blk * 4 + 3]]);
                w.iter_mut().enumerate().for_each(|(i, v)| *v = self.code[usize::from(q(i))] * a);
            }
        }
        w
    }

    /// The whole weight dequantized and rounded to `dtype` (what the kernels multiply by with
    /// activations of that dtype), row-major `[rows, cols]`.
    pub fn dequantize_to(&self, dtype: crate::dtype::DType) -> Vec<f32> {
        self.dequantize().into_iter().map(|v| crate::dtype::round_to(dtype, f64::from(v)) as f32).collect()
    }

    /// The whole weight dequantized, row-major `[rows, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let l = &self.layout;
        let mut out = Vec::with_capacity(l.rows * l.cols);
        for r in 0..l.rows {
            for c in 0..l.cols / CHUNK {
                out.extend_from_slice(&self.dequantize_chunk(r, c));
            }
        }
        out
    }

    /// The same weight with its rows reordered: row `i` of the result is row `perm[i]` of this one
    /// (how the GGUF loader undoes llama.cpp's q/k permutation on packed rows).
    pub fn permute_rows(&self, perm: &[usize]) -> Result<PackedWeight> {
        let l = self.layout;
        let mut seen = vec![false; l.rows];
        if perm.len() != l.rows || !perm.iter().all(|&p| p < l.rows && !std::mem::replace(&mut seen[p], true)) {
            return Err(Error::invalid(
                "qlinear",
                "row permutation",
                perm.len(),
                format!("not a permutation of {} rows", l.rows),
            ));
        }
        let mut w = PackedWeight::zeroed(l);
        w.code = self.code;
        for (plane, row_bytes) in l.planes().into_iter().zip([l.qs_row_bytes(), l.qh_row_bytes(), l.meta_row_bytes()]) {
            for (i, &p) in perm.iter().enumerate() {
                w.bytes[plane + i * row_bytes..][..row_bytes]
                    .copy_from_slice(&self.bytes[plane + p * row_bytes..][..row_bytes]);
            }
        }
        Ok(w)
    }

    /// These rows followed by `other`'s (same format, block, code book and columns): how q, k and
    /// v (or gate and up) become one weight, one GEMV.
    pub fn concat_rows(parts: &[&PackedWeight]) -> Result<PackedWeight> {
        let first = parts.first().ok_or_else(|| Error::invalid("qlinear", "parts", 0, "nothing to concatenate"))?;
        let l0 = first.layout;
        if let Some(p) = parts.iter().find(|p| {
            let l = p.layout;
            (l.format, l.block, l.cols) != (l0.format, l0.block, l0.cols) || p.code != first.code
        }) {
            return Err(Error::invalid(
                "qlinear",
                "concatenated weights",
                format!("{} [{}, {}]", p.layout.format, p.layout.rows, p.layout.cols),
                format!("must share {} with {} columns", l0.format, l0.cols),
            ));
        }
        let rows = parts.iter().map(|p| p.layout.rows).sum();
        let mut w = PackedWeight::zeroed(QuantLayout::new(l0.format, l0.block, rows, l0.cols)?);
        w.code = first.code;
        let planes = w.layout.planes();
        let mut row = 0;
        for p in parts {
            for (k, (dst, src)) in planes.iter().zip(p.layout.planes()).enumerate() {
                let len = p.layout.rows * [l0.qs_row_bytes(), l0.qh_row_bytes(), l0.meta_row_bytes()][k];
                let row_bytes = [l0.qs_row_bytes(), l0.qh_row_bytes(), l0.meta_row_bytes()][k];
                w.bytes[dst + row * row_bytes..][..len].copy_from_slice(&p.bytes[src..][..len]);
            }
            row += p.layout.rows;
        }
        Ok(w)
    }
}
