//! Shared memory per block of every kernel against each architecture's limit: which kernel
//! configurations run on which GPUs.
//!
//! A block's shared memory is its static arrays (from the `ptxas -v` report of the image the
//! architecture loads: sm_90 for 9.x, sm_80 for every 8.x) plus the dynamic size its kernel
//! declares (its row's `LLK_SMEM_FIXED`, read from the registry: what every launch requests). A configuration over an architecture's per-block
//! limit cannot run there: the op returns a named error before launching. Below it, the SM's
//! shared memory bounds the blocks resident per SM ([`blocks_per_sm_by_smem`]), which is what
//! the prefill kernel's second configuration (32-key tiles on GPUs where it makes two blocks per
//! SM, [`mma_keys`]) is for. The Hopper prefill kernel is built for sm_90a and runs on 9.0 only
//! ([`prefill_kernel`](llama_kernels::ops::attention::prefill_kernel)). The table of `docs/shared-memory.md` is [`table`],
//! checked by `tests/static_checks.rs`.

use llama_kernels::backend::{EmuArch, KernelRef, blocks_per_sm_by_smem};
use llama_kernels::dev::geometry::kernels::attention::{KERNELS as PREFILL, SMALL_KEY_KERNELS};
use llama_kernels::dev::geometry::kernels::attention_sm90::KERNELS as HOPPER;
use llama_kernels::dev::geometry::kernels::moe::GEMM;
use llama_kernels::dev::geometry::kernels::paged_attention::{DECODE_KERNELS, FEW_STAGE_DECODE_KERNELS};
use llama_kernels::dev::geometry::params::{LLK_ATTN_KEYS, LLK_ATTN_KEYS_SMALL};
use llama_kernels::dev::geometry::sm90_keys;
use llama_kernels::dtype::DType;
use llama_kernels::ops::attention::{DecodeConfig, decode_config, decode_stages_of, mma_keys};

use super::{KernelResources, all_resources};

/// One architecture's limit: the most shared memory one block may use (with the opt-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchLimit {
    /// Compute capabilities, as the table's column header says them.
    pub name: &'static str,
    /// The image these GPUs load (`sm_90` or `sm_80`), whose `ptxas` report gives static sizes.
    pub image: &'static str,
    /// Bytes of shared memory per block (`cudaDevAttrMaxSharedMemoryPerBlockOptin`).
    pub max_block_bytes: usize,
    /// Bytes of shared memory per SM (`cudaDevAttrMaxSharedMemoryPerMultiprocessor`).
    pub max_sm_bytes: usize,
}

/// The architectures the crate builds for, by per-block shared memory: Hopper (227 KiB), A100
/// (163 KiB) and consumer Ampere / Ada (99 KiB).
pub const ARCHS: [ArchLimit; 3] = [
    ArchLimit {
        name: "9.0 (H100, H200)",
        image: "sm_90",
        max_block_bytes: EmuArch::Sm90.max_shared_memory_per_block(),
        max_sm_bytes: EmuArch::Sm90.max_shared_memory_per_sm(),
    },
    ArchLimit {
        name: "8.0 (A100, A30)",
        image: "sm_80",
        max_block_bytes: EmuArch::Sm80.max_shared_memory_per_block(),
        max_sm_bytes: EmuArch::Sm80.max_shared_memory_per_sm(),
    },
    ArchLimit {
        name: "8.6, 8.9 (RTX 30xx/40xx, A10, L4, L40)",
        image: "sm_80",
        max_block_bytes: EmuArch::Sm86.max_shared_memory_per_block(),
        max_sm_bytes: EmuArch::Sm86.max_shared_memory_per_sm(),
    },
];

/// One kernel configuration that requests dynamic shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmemUse {
    /// What runs, in words (`prefill attention, bf16, head_dim 128`).
    pub what: String,
    /// The kernel's symbol.
    pub symbol: &'static str,
    /// Dynamic bytes the planner requests.
    pub dynamic: usize,
    /// For the attention kernels, which of their configurations this is (the op picks one per GPU).
    pub choice: Option<Choice>,
}

/// An attention configuration the op picks per GPU ([`mma_keys`], [`decode_config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Prefill with `keys`-key tiles.
    Prefill { dtype: DType, head_dim: usize, keys: usize },
    /// Decode in one of its two configurations.
    Decode { dtype: DType, page: DType, head_dim: usize, config: DecodeConfig },
    /// The Hopper prefill kernel, built for sm_90a: chosen on 9.0 only ([`prefill_kernel`](llama_kernels::ops::attention::prefill_kernel)).
    Hopper,
}

impl Choice {
    /// Whether the op picks this configuration on `arch`.
    fn picked_on(self, arch: &ArchLimit) -> bool {
        match self {
            Choice::Prefill { dtype, head_dim, keys } => mma_keys(arch.max_sm_bytes, dtype, head_dim) == keys,
            Choice::Decode { dtype, page, head_dim, config } => {
                decode_config(arch.max_sm_bytes, arch.max_block_bytes, dtype, page, head_dim) == config
            }
            Choice::Hopper => arch.image == "sm_90",
        }
    }
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F8E4M3 => "fp8",
        other => other.name(),
    }
}

/// The dynamic shared memory `symbol` of `module` declares (its row in the family's list).
fn declared(module: &'static str, symbol: &'static str) -> llama_kernels::Result<usize> {
    Ok(KernelRef { module, symbol }.shared_memory()?.bytes() as usize)
}

/// Every kernel configuration with dynamic shared memory (the tensor-core paths; f32 kernels use
/// only static arrays), with the bytes the kernel declares (and so every launch requests).
pub fn dynamic_uses() -> llama_kernels::Result<Vec<SmemUse>> {
    let mut out = Vec::new();
    let keys = [(LLK_ATTN_KEYS as usize, &PREFILL), (LLK_ATTN_KEYS_SMALL as usize, &SMALL_KEY_KERNELS)];
    for (keys, table) in keys {
        for &((head_dim, dtype), symbol) in table.entries {
            if dtype != DType::F32 {
                let what = format!("prefill attention, {}, head_dim {head_dim}, {keys}-key tiles", dtype_name(dtype));
                let dynamic = declared(table.module, symbol)?;
                out.push(SmemUse { what, symbol, dynamic, choice: Some(Choice::Prefill { dtype, head_dim, keys }) });
            }
        }
    }
    for &((head_dim, dtype), symbol) in HOPPER.entries {
        let what = format!(
            "prefill attention on Hopper (TMA, wgmma), {}, head_dim {head_dim}, {}-key tiles",
            dtype_name(dtype),
            sm90_keys(head_dim)
        );
        out.push(SmemUse { what, symbol, dynamic: declared(HOPPER.module, symbol)?, choice: Some(Choice::Hopper) });
    }
    let few = FEW_STAGE_DECODE_KERNELS.entries.iter().map(|&((hd, d), sym)| ((d, d, hd), sym, DecodeConfig::FewStages));
    let first = DECODE_KERNELS.entries.iter().map(|&((hd, p, d), sym)| ((d, p, hd), sym, DecodeConfig::Default));
    for ((dtype, page, head_dim), symbol, config) in first.chain(few) {
        if dtype != DType::F32 {
            let what = format!(
                "paged decode, {} q, {} pages, head_dim {head_dim}, {} stages",
                dtype_name(dtype),
                dtype_name(page),
                decode_stages_of(config, page, head_dim)
            );
            let dynamic = declared(DECODE_KERNELS.module, symbol)?;
            out.push(SmemUse { what, symbol, dynamic, choice: Some(Choice::Decode { dtype, page, head_dim, config }) });
        }
    }
    // Both weight layouts and both epilogues stage the same tiles.
    for &((_, _, block_m, dtype), symbol) in GEMM.entries {
        if dtype != DType::F32 {
            let what = format!("MoE grouped GEMM, {}, {block_m}-row blocks", dtype_name(dtype));
            out.push(SmemUse { what, symbol, dynamic: declared(GEMM.module, symbol)?, choice: None });
        }
    }
    Ok(out)
}

/// Static shared memory of `symbol` in `image`'s `ptxas` report (0 if it has none).
fn static_bytes(resources: &[KernelResources], symbol: &str) -> usize {
    resources.iter().find(|k| k.name == symbol).map_or(0, |k| k.smem_bytes as usize)
}

/// Total shared memory per block (static + dynamic) of every dynamic use, per architecture.
pub fn totals() -> llama_kernels::Result<Vec<(SmemUse, [usize; ARCHS.len()])>> {
    let per_image = |image: &str| -> llama_kernels::Result<Vec<KernelResources>> {
        Ok(all_resources(image)?.into_iter().flat_map(|(_, kernels)| kernels).collect())
    };
    let (sm90, sm80) = (per_image("sm_90")?, per_image("sm_80")?);
    Ok(dynamic_uses()?
        .into_iter()
        .map(|u| {
            let total = ARCHS.map(|a| {
                let resources = if a.image == "sm_90" { &sm90 } else { &sm80 };
                u.dynamic + static_bytes(resources, u.symbol)
            });
            (u, total)
        })
        .collect())
}

/// What one configuration does on `arch` with `total` bytes per block: `no` over the per-block
/// limit, else the blocks per SM its shared memory allows, and for a prefill configuration
/// whether the op picks it there.
fn cell(u: &SmemUse, arch: &ArchLimit, total: usize) -> String {
    if total > arch.max_block_bytes {
        return "**no**".into();
    }
    let blocks = blocks_per_sm_by_smem(arch.max_sm_bytes, total);
    match u.choice {
        Some(c) if c.picked_on(arch) => format!("{blocks}, used"),
        Some(_) => format!("{blocks}, not used"),
        None => blocks.to_string(),
    }
}

/// The configurations as JSON rows: what, symbol, bytes per block and, per architecture, the
/// blocks per SM its shared memory holds (0: over the per-block limit) and whether the op uses it
/// there (null for kernels with one configuration).
pub fn json() -> llama_kernels::Result<serde_json::Value> {
    let rows: Vec<serde_json::Value> = totals()?
        .into_iter()
        .map(|(u, total)| {
            let archs: Vec<serde_json::Value> = ARCHS
                .iter()
                .zip(total)
                .map(|(a, t)| {
                    let fits = t <= a.max_block_bytes;
                    serde_json::json!({
                        "arch": a.name,
                        "bytes": t,
                        "blocks_per_sm": if fits { blocks_per_sm_by_smem(a.max_sm_bytes, t) } else { 0 },
                        "used": u.choice.map(|c| fits && c.picked_on(a)),
                    })
                })
                .collect();
            serde_json::json!({ "configuration": u.what, "symbol": u.symbol, "archs": archs })
        })
        .collect();
    Ok(serde_json::Value::Array(rows))
}

/// The table of `docs/shared-memory.md`: one row per distinct (configuration family, size); each architecture's
/// column says `no` (over its per-block limit) or how many blocks fit on an SM by shared memory
/// (and, for prefill, which configuration the op uses). Both 16-bit dtypes share a row.
pub fn table() -> llama_kernels::Result<String> {
    let mut rows: Vec<(String, usize, Vec<String>)> = Vec::new();
    for (u, total) in totals()? {
        // bf16 and f16 have the same layout: one row for both.
        let what = u.what.replace("bf16", "16-bit").replace("f16", "16-bit");
        let cells = ARCHS.iter().zip(total).map(|(a, t)| cell(&u, a, t)).collect();
        let bytes = total[0].max(total[1]);
        if !rows.iter().any(|(w, b, _)| *w == what && *b == bytes) {
            rows.push((what, bytes, cells));
        }
    }
    let mut s = String::from("| kernel configuration | shared memory per block |");
    for a in ARCHS {
        s += &format!(" {} |", a.name);
    }
    s += "\n| --- | ---: |";
    s += &" :---: |".repeat(ARCHS.len());
    s.push('\n');
    for (what, bytes, cells) in rows {
        s += &format!("| {what} | {bytes} |");
        for c in cells {
            s += &format!(" {c} |");
        }
        s.push('\n');
    }
    Ok(s)
}
