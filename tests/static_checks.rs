//! Checks on the built kernels that need no GPU: symbols, register spills, and SASS.

use std::path::PathBuf;
use std::process::Command;

use llama_kernels::backend::{emulated_kernel_names, kernel_modules};
use llama_kernels::inspect::{parse_ptxas, ptx_entries};

#[test]
fn every_symbol_the_wrappers_load_exists_everywhere() {
    let modules: Vec<_> = kernel_modules().collect();
    for k in llama_kernels::ops::kernel_symbols() {
        let m = modules.iter().find(|m| m.name == k.module).unwrap_or_else(|| panic!("no module {}", k.module));
        for (arch, ptx) in [("sm_90", m.ptx_sm90), ("sm_80", m.ptx_sm80)] {
            assert!(ptx_entries(ptx).iter().any(|e| e == k.symbol), "{} missing from {} PTX for {arch}", k.symbol, k.module);
        }
        assert!(emulated_kernel_names(k.module).contains(&k.symbol), "{} missing from the emulated registry", k.symbol);
    }
    // PTX and the emulated registry come from one macro list: they must hold the same names.
    for m in &modules {
        let mut ptx = ptx_entries(m.ptx_sm90);
        let mut emu: Vec<String> = emulated_kernel_names(m.name).iter().map(|s| s.to_string()).collect();
        ptx.sort();
        emu.sort();
        assert_eq!(ptx, emu, "module {}", m.name);
        assert!(m.ptx_sm90.contains(".version 9.0"), "module {}: nvcc 13.0 emits PTX ISA 9.0", m.name);
    }
}

#[test]
fn no_kernel_spills_at_sm_90() {
    for m in kernel_modules() {
        let kernels = parse_ptxas(m.ptxas_sm90);
        assert!(!kernels.is_empty(), "no ptxas report for {}", m.name);
        for k in kernels {
            assert_eq!((k.spill_stores, k.spill_loads), (0, 0), "{} spills at sm_90: {k:?}", k.name);
            assert!(k.registers > 0 && k.registers <= 255, "{k:?}");
        }
    }
}

fn sass(module: &str) -> String {
    let bin = PathBuf::from(env!("LLK_CUDA_BIN")).join("cuobjdump");
    let cubin = PathBuf::from(env!("LLK_KERNEL_BUILD_DIR")).join("sm_90").join(format!("{module}.cubin"));
    let out = Command::new(&bin)
        .arg("-sass")
        .arg(&cubin)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (scripts/setup.sh installs it): {e}", bin.display()));
    assert!(out.status.success(), "cuobjdump failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// SASS instruction mnemonics per function.
fn per_function(sass: &str) -> Vec<(String, Vec<String>)> {
    let mut v: Vec<(String, Vec<String>)> = Vec::new();
    for line in sass.lines() {
        if let Some(name) = line.trim().strip_prefix("Function : ") {
            v.push((name.trim().to_string(), Vec::new()));
        } else if let (Some(f), Some(code)) = (v.last_mut(), line.split("*/").nth(1)) {
            let mut words = code.split_whitespace().filter(|w| !w.starts_with('@'));
            if let Some(op) = words.next() {
                f.1.push(op.trim_end_matches(';').to_string());
            }
        }
    }
    v
}

#[test]
fn vectorized_rms_norm_moves_128_bits_per_access() {
    let funcs = per_function(&sass("rms_norm"));
    let vec_kernels: Vec<_> = funcs.iter().filter(|(n, _)| n.contains("_vec_")).collect();
    assert_eq!(vec_kernels.len(), 6, "{:?}", funcs.iter().map(|f| &f.0).collect::<Vec<_>>());
    for (name, ops) in vec_kernels {
        let global: Vec<_> = ops.iter().filter(|o| o.starts_with("LDG") || o.starts_with("STG")).collect();
        assert!(!global.is_empty(), "{name}: no global accesses found");
        for o in &global {
            assert!(o.contains(".128"), "{name}: {o} is not a 128-bit access");
        }
    }
}
