//! Shared memory per block of every kernel against each architecture's limit: which kernel
//! configurations run on which GPUs.
//!
//! A block's shared memory is its static arrays (from the `ptxas -v` report of the image the
//! architecture loads: sm_90 for 9.x, sm_80 for every 8.x) plus the dynamic size its planner
//! requests (the formulas the ops launch with). A configuration over an architecture's per-block
//! limit cannot run there: the op returns a named error before launching. The README's table
//! "Shared memory per architecture" is [`table`], checked by `tests/static_checks.rs`.

use crate::backend::EmuArch;
use crate::dtype::DType;
use crate::ffi::params::{LLK_MOE_GEMM_BLOCK_M, LLK_MOE_GEMM_SMEM_BYTES, LLK_MOE_GEMM_SMEM_BYTES_DECODE};
use crate::kernels::attention::KERNELS as PREFILL;
use crate::kernels::moe::GEMM;
use crate::kernels::paged_attention::DECODE_KERNELS;
use crate::ops::attention::{decode_smem_bytes, mma_smem_bytes};

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
}

/// The architectures the crate builds for, by per-block shared memory: Hopper (227 KiB), A100
/// (163 KiB) and consumer Ampere / Ada (99 KiB).
pub const ARCHS: [ArchLimit; 3] = [
    ArchLimit {
        name: "9.0 (H100, H200)",
        image: "sm_90",
        max_block_bytes: EmuArch::Sm90.max_shared_memory_per_block(),
    },
    ArchLimit { name: "8.0 (A100, A30)", image: "sm_80", max_block_bytes: EmuArch::Sm80.max_shared_memory_per_block() },
    ArchLimit {
        name: "8.6, 8.9 (RTX 30xx/40xx, A10, L4, L40)",
        image: "sm_80",
        max_block_bytes: EmuArch::Sm86.max_shared_memory_per_block(),
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
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F8E4M3 => "fp8",
        other => other.name(),
    }
}

/// Every kernel configuration with dynamic shared memory (the tensor-core paths; f32 kernels use
/// only static arrays), with the bytes its planner requests.
pub fn dynamic_uses() -> Vec<SmemUse> {
    let mut out = Vec::new();
    for &((dtype, head_dim), symbol) in PREFILL.entries {
        if dtype != DType::F32 {
            let what = format!("prefill attention, {}, head_dim {head_dim}", dtype_name(dtype));
            out.push(SmemUse { what, symbol, dynamic: mma_smem_bytes(head_dim) as usize });
        }
    }
    for &((dtype, page, head_dim), symbol) in DECODE_KERNELS.entries {
        if dtype != DType::F32 {
            let what =
                format!("paged decode, {} q, {} pages, head_dim {head_dim}", dtype_name(dtype), dtype_name(page));
            out.push(SmemUse { what, symbol, dynamic: decode_smem_bytes(head_dim, page.size()) });
        }
    }
    // Both weight layouts and both epilogues stage the same tiles.
    for &((_, _, block_m, dtype), symbol) in GEMM.entries {
        if dtype != DType::F32 {
            let bytes = if block_m == LLK_MOE_GEMM_BLOCK_M as usize {
                LLK_MOE_GEMM_SMEM_BYTES
            } else {
                LLK_MOE_GEMM_SMEM_BYTES_DECODE
            };
            let what = format!("MoE grouped GEMM, {}, {block_m}-row blocks", dtype_name(dtype));
            out.push(SmemUse { what, symbol, dynamic: bytes as usize });
        }
    }
    out
}

/// Static shared memory of `symbol` in `image`'s `ptxas` report (0 if it has none).
fn static_bytes(resources: &[KernelResources], symbol: &str) -> usize {
    resources.iter().find(|k| k.name == symbol).map_or(0, |k| k.smem_bytes as usize)
}

/// Total shared memory per block (static + dynamic) of every dynamic use, per architecture.
pub fn totals() -> crate::Result<Vec<(SmemUse, [usize; ARCHS.len()])>> {
    let per_image = |image: &str| -> crate::Result<Vec<KernelResources>> {
        Ok(all_resources(image)?.into_iter().flat_map(|(_, kernels)| kernels).collect())
    };
    let (sm90, sm80) = (per_image("sm_90")?, per_image("sm_80")?);
    Ok(dynamic_uses()
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

/// The README table: one row per distinct (configuration family, size), each architecture's
/// column `yes` or `no` (over its limit). Configurations of both 16-bit dtypes share a row.
pub fn table() -> crate::Result<String> {
    let mut rows: Vec<(String, usize, [bool; ARCHS.len()])> = Vec::new();
    for (u, total) in totals()? {
        // bf16 and f16 have the same layout: one row for both.
        let what = u.what.replace("bf16", "16-bit").replace("f16", "16-bit");
        let fits = std::array::from_fn(|i| total[i] <= ARCHS[i].max_block_bytes);
        let bytes = total[0].max(total[1]);
        if !rows.iter().any(|(w, b, _)| *w == what && *b == bytes) {
            rows.push((what, bytes, fits));
        }
    }
    let mut s = String::from("| kernel configuration | shared memory per block |");
    for a in ARCHS {
        s += &format!(" {} |", a.name);
    }
    s += "\n| --- | ---: |";
    s += &" :---: |".repeat(ARCHS.len());
    s.push('\n');
    for (what, bytes, fits) in rows {
        s += &format!("| {what} | {bytes} |");
        for f in fits {
            s += if f { " yes |" } else { " **no** |" };
        }
        s.push('\n');
    }
    Ok(s)
}
