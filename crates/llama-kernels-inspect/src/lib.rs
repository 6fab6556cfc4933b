//! # llama-kernels-inspect
//!
//! Static facts about the kernels of `llama-kernels`, read from the device code its build made:
//! PTX entry points, `ptxas -v` resources, SASS ([`sass`]), and a performance model of the sm_90
//! SASS on an H200 calibrated against published figures of peer kernels ([`perf`],
//! [`perf_json`]): predictions, not measurements. The launch geometry it models comes from the
//! kernel crate's own planners and constants (`llama_kernels::dev::geometry`), never restated.
//!
//! Used by `llama-kernels info` and by the tests that check, without a GPU, that every symbol the
//! wrappers load exists, that no kernel spills registers, and what the SASS of the hot loops holds.

// A lab, not a library: its report rows are documented at the module level.
#![allow(missing_docs)]

pub mod attention_model;
pub mod backward_model;
pub mod coverage;
pub mod h200;
pub mod hopper_report;
pub mod kernel_spec;
pub mod layer_model;
pub mod memory_model;
pub mod perf;
pub mod perf_json;
pub mod qlinear_model;
pub mod sass;
pub mod smem;
pub mod wgmma_model;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use llama_kernels::backend::{KernelModuleInfo, kernel_modules};

/// The dynamic shared memory the kernel `symbol` declares (its row in its family's list), which
/// every launch of it requests.
pub fn declared_smem(symbol: &str) -> Result<u32, String> {
    llama_kernels::backend::declared_shared_memory(symbol)
        .map(|s| s.bytes())
        .ok_or_else(|| format!("no family lists a kernel {symbol}"))
}

/// Resources of one kernel, as reported by `ptxas -v`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    /// Static shared memory (bytes).
    pub smem_bytes: u32,
}

/// The `.entry` names declared in a PTX module.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .filter_map(|rest| rest.split('(').next())
        .map(|name| name.trim().to_string())
        .collect()
}

fn number_before(text: &str, unit: &str) -> Option<u32> {
    let idx = text.find(unit)?;
    text[..idx].split_whitespace().last()?.parse().ok()
}

/// Parses a `ptxas -v` report into one entry per kernel.
pub fn parse_ptxas(report: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelResources { name, ..Default::default() });
        } else if let Some(k) = out.last_mut() {
            if line.contains("bytes stack frame") {
                k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used ") && line.contains("registers") {
                k.registers = number_before(line, "registers").unwrap_or(0);
                k.smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// Resources of every kernel of every family for `arch` (`"sm_90"` or `"sm_80"`). Fails only when
/// a build with external device code cannot read it.
pub fn all_resources(arch: &str) -> llama_kernels::Result<Vec<(KernelModuleInfo, Vec<KernelResources>)>> {
    Ok(kernel_modules()?
        .map(|m| {
            let report = if arch == "sm_80" { m.ptxas_sm80 } else { m.ptxas_sm90 };
            (m, parse_ptxas(report))
        })
        .collect())
}

/// One kernel as the static report reads it: its sm_90 `ptxas -v` resources, its SASS, and the
/// cubin it came from (for line tables).
#[derive(Clone, Debug)]
pub struct KernelCode {
    pub resources: KernelResources,
    pub code: Vec<sass::Sass>,
    pub cubin: &'static [u8],
}

/// `kernel` of family `module`, read from the embedded (or external) sm_90 device code. Each
/// kernel is disassembled once per process (the report reads the same kernel at many shapes).
pub fn kernel_code(module: &str, kernel: &str) -> Result<KernelCode, String> {
    type Cache = Mutex<HashMap<(String, String), KernelCode>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (module.to_string(), kernel.to_string());
    let cache = CACHE.get_or_init(Cache::default);
    // A poisoned lock only means another thread panicked while inserting: the map is still valid.
    if let Some(code) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(code.clone());
    }
    let m =
        kernel_modules().map_err(|e| e.to_string())?.find(|m| m.name == module).ok_or(format!("no module {module}"))?;
    let resources = parse_ptxas(m.ptxas_sm90)
        .into_iter()
        .find(|k| k.name == kernel)
        .ok_or(format!("{kernel} not in the ptxas report"))?;
    let code = KernelCode { resources, code: sass::disassemble(m.cubin_sm90, kernel)?, cubin: m.cubin_sm90 };
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, code.clone());
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_ptxas_report() {
        let r = "ptxas info    : 0 bytes gmem\n\
                 ptxas info    : Compiling entry function 'rms_norm_f32' for 'sm_90'\n\
                 ptxas info    : Function properties for rms_norm_f32\n    \
                 8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                 ptxas info    : Used 30 registers, used 1 barriers, 128 bytes smem, 424 bytes cmem[0]\n";
        let k = parse_ptxas(r);
        assert_eq!(k.len(), 1);
        assert_eq!(
            k[0],
            KernelResources {
                name: "rms_norm_f32".into(),
                registers: 30,
                spill_stores: 4,
                spill_loads: 12,
                stack_bytes: 8,
                smem_bytes: 128
            }
        );
        assert_eq!(
            ptx_entries(".visible .entry foo(\n.param x\n)\n.visible .entry bar_baz(\n"),
            vec!["foo", "bar_baz"]
        );
    }
}
