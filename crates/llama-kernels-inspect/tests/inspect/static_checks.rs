//! Checks on the built kernels that need no GPU: symbols, register spills, and SASS.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use llama_kernels::backend::{emulated_kernel_info, emulated_kernel_names, kernel_modules};
use llama_kernels_inspect::{parse_ptxas, ptx_entries};

mod packed;

#[test]
fn every_symbol_the_wrappers_load_exists_everywhere() {
    let modules: Vec<_> = kernel_modules().expect("the device code").collect();
    for k in llama_kernels::dev::kernel_symbols() {
        let m = modules.iter().find(|m| m.name == k.module).unwrap_or_else(|| panic!("no module {}", k.module));
        for (arch, ptx) in [("sm_90", m.ptx_sm90), ("sm_80", m.ptx_sm80)] {
            assert!(
                ptx_entries(ptx).iter().any(|e| e == k.symbol),
                "{} missing from {} PTX for {arch}",
                k.symbol,
                k.module
            );
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

/// The emulator enforces each kernel's launch bound and shared memory as the GPU does: the bound
/// its host table records is the PTX's `.maxntid`, and its static shared memory is what ptxas
/// reports, for both architectures.
#[test]
fn emulated_launch_bounds_and_static_shared_memory_match_the_device_code() {
    let mut checked = 0;
    for m in kernel_modules().expect("the device code") {
        for (arch, ptx, report) in [("sm_90", m.ptx_sm90, m.ptxas_sm90), ("sm_80", m.ptx_sm80, m.ptxas_sm80)] {
            let resources = parse_ptxas(report);
            let mut lines = ptx.lines();
            while let Some(line) = lines.next() {
                let Some(rest) = line.trim_start().strip_prefix(".visible .entry ") else { continue };
                let name = rest.split('(').next().unwrap_or_default().trim();
                let maxntid = lines
                    .by_ref()
                    .take_while(|l| !l.starts_with('{'))
                    .find_map(|l| l.trim_start().strip_prefix(".maxntid "))
                    .unwrap_or_else(|| {
                        panic!("{name} ({arch}) has no .maxntid: every kernel declares __launch_bounds__")
                    });
                let threads: u32 = maxntid.split(',').map(|d| d.trim().parse::<u32>().unwrap()).product();
                let info =
                    emulated_kernel_info(name).unwrap_or_else(|| panic!("{name} missing from the emulated registry"));
                assert_eq!(info.max_threads, threads, "{name} ({arch}): emulated bound vs .maxntid {maxntid}");
                let smem = resources.iter().find(|k| k.name == name).map_or(0, |k| k.smem_bytes);
                let emulated = if arch == "sm_90" { info.static_smem_sm90 } else { info.static_smem_sm80 };
                assert_eq!(emulated, smem, "{name} ({arch}): static shared memory");
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "only {checked} kernels checked");
}

/// Every kernel in the device code has a shared-memory declaration in the host registry (its
/// row's `LLK_SMEM_*`), and a block's shared memory, its static arrays as `ptxas -v` counts them
/// plus its declared dynamic memory (what the table of `docs/shared-memory.md` adds up), fits
/// sm_90's 227 KiB in both images: a declaration that no GPU could launch fails here.
#[test]
fn declared_shared_memory_and_ptxas_fit_together() {
    use llama_kernels::backend::SharedMemory;
    let mut fixed = 0;
    for m in kernel_modules().expect("the device code") {
        for (arch, report) in [("sm_90", m.ptxas_sm90), ("sm_80", m.ptxas_sm80)] {
            for k in parse_ptxas(report) {
                let declared = llama_kernels::backend::declared_shared_memory(&k.name)
                    .unwrap_or_else(|| panic!("{} ({arch}) is in no family's list", k.name));
                fixed += usize::from(matches!(declared, SharedMemory::Fixed(_)));
                assert!(
                    (k.smem_bytes + declared.bytes()) as usize
                        <= llama_kernels::EmuArch::Sm90.max_shared_memory_per_block(),
                    "{} ({arch}): {} static + {} declared bytes",
                    k.name,
                    k.smem_bytes,
                    declared.bytes()
                );
            }
        }
    }
    assert!(fixed >= 80, "{fixed} kernel images declare a fixed layout");
}

/// The other direction: every kernel in the PTX of either architecture is reachable from
/// exactly one row of the kernel tables (no dead kernel ships, no kernel is listed twice).
#[test]
fn every_ptx_kernel_is_reachable_from_exactly_one_table_row() {
    let rows = llama_kernels::dev::kernel_symbols();
    let mut checked = 0;
    for m in kernel_modules().expect("the device code") {
        for (arch, ptx) in [("sm_90", m.ptx_sm90), ("sm_80", m.ptx_sm80)] {
            let entries = ptx_entries(ptx);
            assert!(!entries.is_empty(), "module {} has no kernels for {arch}", m.name);
            for entry in entries {
                let n = rows.iter().filter(|k| k.module == m.name && k.symbol == entry).count();
                assert_eq!(n, 1, "{entry} of module {} ({arch}) is named by {n} kernel-table rows", m.name);
                checked += 1;
            }
        }
    }
    assert!(checked >= rows.len(), "{checked} PTX entries for {} table rows", rows.len());
}

#[test]
fn no_kernel_spills_at_sm_90() {
    for m in kernel_modules().expect("the device code") {
        let kernels = parse_ptxas(m.ptxas_sm90);
        assert!(!kernels.is_empty(), "no ptxas report for {}", m.name);
        for k in kernels {
            check_spills(&k, "sm_90");
            assert!(k.registers > 0 && k.registers <= 255, "{k:?}");
        }
    }
}

/// The tensor-core prefill attention kernels up to head_dim 128 hold 2 x 16 rows per warp (192
/// f32 accumulators per thread at head_dim 128); what does not fit in 255 registers (mostly
/// loop-invariant values) spills to L1 within this budget. tests/perf_report.rs checks that the
/// main loop touches it little (at most 16 local accesses per tile, at most one of them a store).
/// Every other kernel spills nothing.
const ATTENTION_SPILL_BUDGET: u32 = 128;

fn check_spills(k: &llama_kernels_inspect::KernelResources, arch: &str) {
    let two_m_tiles =
        k.name.starts_with("attention_hd") && !k.name.starts_with("attention_hd256") && !k.name.ends_with("_f32");
    if two_m_tiles {
        assert!(
            k.spill_stores <= ATTENTION_SPILL_BUDGET && k.spill_loads <= ATTENTION_SPILL_BUDGET + 16,
            "{} spills beyond its budget at {arch}: {k:?}",
            k.name
        );
    } else {
        assert_eq!((k.spill_stores, k.spill_loads), (0, 0), "{} spills at {arch}: {k:?}", k.name);
    }
}

fn sass(module: &str) -> String {
    // The bin folder of the nvcc that built the crate, or of the project toolchain when the
    // build used the prebuilt device code; empty when there was neither. The project toolchain
    // may also have been installed after the build: look there too.
    let cuda_bin = llama_kernels::dev::build::CUDA_BIN;
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.toolchain/python/nvidia/cu13/bin/cuobjdump");
    let bin = [PathBuf::from(cuda_bin).join("cuobjdump"), local]
        .into_iter()
        .find(|p| p.is_absolute() && p.is_file())
        .unwrap_or_else(|| {
            panic!("cuobjdump not found (LLK_CUDA_BIN={cuda_bin:?}): run scripts/setup.sh, which installs it into .toolchain")
        });
    let cubin =
        PathBuf::from(llama_kernels::dev::build::KERNEL_BUILD_DIR).join("sm_90").join(format!("{module}.cubin"));
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

/// The kernels of `module` the kernel tables list (what the wrappers and self-tests may load)
/// whose symbols `select` picks.
fn listed(module: &str, select: impl Fn(&str) -> bool) -> BTreeSet<String> {
    llama_kernels::dev::kernel_symbols()
        .into_iter()
        .filter(|k| k.module == module && select(k.symbol))
        .map(|k| k.symbol.to_string())
        .collect()
}

/// The functions a check found in `module`'s SASS are exactly the listed kernels `select` picks
/// (none is left unchecked, none is missing), and there is at least one.
fn assert_listed<T>(module: &str, funcs: &[(String, T)], select: impl Fn(&str) -> bool) {
    let found: BTreeSet<String> = funcs.iter().map(|f| f.0.clone()).collect();
    let want = listed(module, select);
    assert!(!want.is_empty(), "{module}: the tables list no such kernel");
    assert_eq!(found, want, "{module}: the SASS functions checked are not the kernels the tables list");
}

/// The `_vec_` kernels of a module: (name, global loads and stores); exactly those the tables list.
fn vector_kernels(module: &str) -> Vec<(String, Vec<String>)> {
    let funcs = per_function(&sass(module));
    let v: Vec<_> = funcs
        .into_iter()
        .filter(|(n, _)| n.contains("_vec_"))
        .map(|(n, ops)| (n, ops.into_iter().filter(|o| o.starts_with("LDG") || o.starts_with("STG")).collect()))
        .collect();
    assert_listed(module, &v, |n| n.contains("_vec_"));
    v
}

#[test]
fn vectorized_rms_norm_and_swiglu_move_128_bits_per_access() {
    for module in ["rms_norm", "swiglu"] {
        for (name, global) in vector_kernels(module) {
            assert!(!global.is_empty(), "{name}: no global accesses found");
            for o in &global {
                assert!(o.contains(".128"), "{name}: {o} is not a 128-bit access");
            }
        }
    }
}

#[test]
fn vectorized_rope_rotates_with_128_bit_accesses() {
    // q/k chunks move as 128-bit loads and stores; the other global accesses are the position
    // (one scalar), the inverse-frequency table (64-bit float2) and the qk-norm's pass-through
    // loop (scalar, only with partial rotary). No local memory.
    for (name, global) in vector_kernels("rope") {
        assert!(global.iter().any(|o| o.starts_with("LDG.E.128")), "{name}: no 128-bit load: {global:?}");
        assert!(global.iter().any(|o| o.starts_with("STG.E.128")), "{name}: no 128-bit store: {global:?}");
    }
    for (name, ops) in per_function(&sass("rope")) {
        assert!(!ops.iter().any(|o| o.starts_with("LDL") || o.starts_with("STL")), "{name} uses local memory");
    }
}

#[test]
fn attention_runs_on_tensor_cores() {
    // bf16/f16 kernels (64-key tiles, and 32-key tiles at head_dim 96 and 128): HMMA (mma.sync),
    // LDSM and LDSM.MT (ldmatrix and .trans), LDGSTS (cp.async); f32 kernels stay on the SIMT path.
    let funcs: Vec<_> = per_function(&sass("attention")).into_iter().filter(|f| f.0 != "attention_plan").collect();
    assert_listed("attention", &funcs, |n| n != "attention_plan");
    for (name, ops) in &funcs {
        let has = |prefix: &str| ops.iter().any(|o| o.starts_with(prefix));
        if name.ends_with("_f32") {
            assert!(!has("HMMA"), "{name} should not use tensor cores");
            continue;
        }
        let hmma = if name.ends_with("_bf16") { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
        assert!(has(hmma), "{name}: no {hmma}");
        assert!(has("LDSM.16.M88.4") && has("LDSM.16.MT88.4"), "{name}: no ldmatrix x4 / x4.trans");
        assert!(has("LDGSTS.E.BYPASS.128"), "{name}: no 16-byte cp.async");
        // Local memory only for the budgeted loop-invariant spills (check_spills).
        let local = ops.iter().filter(|o| o.starts_with("LDL") || o.starts_with("STL")).count();
        if name.starts_with("attention_hd256") || name.starts_with("attention_hd32") {
            assert_eq!(local, 0, "{name} uses local memory");
        } else {
            // 4-byte accesses: at most the stores and loads ptxas reports within the budget.
            assert!(local <= (2 * ATTENTION_SPILL_BUDGET as usize + 16) / 4, "{name}: {local} local accesses");
        }
    }
}

#[test]
fn attention_backward_runs_on_tensor_cores() {
    // The bf16/f16 gradient kernels at head_dim 64 and 128 (`_mma_`): HMMA (mma.sync), LDSM and
    // LDSM.MT (ldmatrix, .trans for the products whose B operand is the staged tile itself),
    // 16-byte global loads into shared memory, no local memory. The SIMT kernels (every other
    // head dim, and f32) never touch the tensor cores.
    let funcs = per_function(&sass("attention_backward"));
    let mma: Vec<_> = funcs.iter().filter(|f| f.0.contains("_mma_")).cloned().collect();
    assert_listed("attention_backward", &mma, |n| n.contains("_mma_"));
    for (name, ops) in &funcs {
        let has = |prefix: &str| ops.iter().any(|o| o.starts_with(prefix));
        assert!(!has("LDL") && !has("STL"), "{name} uses local memory");
        if !name.contains("_mma_") {
            assert!(!has("HMMA"), "{name} should not use tensor cores");
            continue;
        }
        let hmma = if name.ends_with("_bf16") { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
        assert!(has(hmma), "{name}: no {hmma}");
        assert!(has("LDSM.16.M88.4") && has("LDSM.16.MT88.4"), "{name}: no ldmatrix x4 / x4.trans");
        assert!(has("LDG.E.128") && has("STS.128"), "{name}: tiles not staged in 16-byte accesses");
    }
}

#[test]
fn paged_decode_runs_on_tensor_cores() {
    // bf16/f16 q with same-dtype or fp8 pages (and the 2-stage kernels of 16-bit pages at
    // head_dim 96 and 128): HMMA, LDSM (K) and LDSM.MT (V), 16-byte LDGSTS, no local memory; the
    // f32 kernels stay on the SIMT path.
    let funcs: Vec<_> =
        per_function(&sass("paged_attention")).into_iter().filter(|f| f.0.starts_with("paged_decode_hd")).collect();
    assert_listed("paged_attention", &funcs, |n| n.starts_with("paged_decode_hd"));
    for (name, ops) in &funcs {
        let has = |prefix: &str| ops.iter().any(|o| o.starts_with(prefix));
        assert!(!has("LDL") && !has("STL"), "{name} uses local memory");
        if name.ends_with("_f32") {
            assert!(!has("HMMA"), "{name} should not use tensor cores");
            continue;
        }
        let hmma = if name.contains("_bf16") { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
        assert!(has(hmma), "{name}: no {hmma}");
        assert!(has("LDSM.16.M88.4") && has("LDSM.16.MT88.4"), "{name}: no ldmatrix x4 / x4.trans");
        assert!(has("LDGSTS.E.BYPASS.128"), "{name}: no 16-byte cp.async");
    }
}

#[test]
fn kv_append_moves_128_bits_per_access() {
    // k/v loads and page stores are 128-bit; the only other global accesses are the i64 slot and
    // the error flag's atomic OR.
    let funcs: Vec<_> =
        per_function(&sass("paged_attention")).into_iter().filter(|f| f.0.starts_with("kv_append_")).collect();
    assert_listed("paged_attention", &funcs, |n| n.starts_with("kv_append_"));
    for (name, ops) in &funcs {
        let global: Vec<_> = ops
            .iter()
            .filter(|o| o.starts_with("LDG") || o.starts_with("STG") || o.starts_with("LD.") || o.starts_with("ST."))
            .collect();
        assert!(
            global.iter().any(|o| o.starts_with("LDG") && o.contains(".128")),
            "{name}: no 128-bit load: {global:?}"
        );
        for o in &global {
            assert!(o.contains(".128") || o.as_str() == "LDG.E.64", "{name}: {o} is not a 128-bit access");
        }
        assert!(
            global.iter().all(|o| !o.starts_with("LD.") && !o.starts_with("ST.")),
            "{name}: generic accesses {global:?}"
        );
    }
}

#[test]
fn attention_and_paged_attention_spill_nothing_or_within_budget_at_sm_80() {
    for m in kernel_modules().expect("the device code").filter(|m| m.name == "attention" || m.name == "paged_attention")
    {
        for k in parse_ptxas(m.ptxas_sm80) {
            check_spills(&k, "sm_80");
        }
    }
}

#[test]
fn rope_angle_reduction_is_not_contracted_into_fmas() {
    // kernels/rope.cu reduces the angle in two steps, each of which rounds k (FRND): the first
    // forms a_hi - t_hi from the *rounded* product t_hi = k * (pi/2)_hi, because t_lo carries that
    // product's rounding error; only the second step (k2 in {-1, 0, 1}, exact either way) may fuse
    // r - k2 * (pi/2)_hi into an FMA. Were the first contracted too (0.5 rad error at p = 2^24),
    // each pair would show two FMAs subtracting a multiple of (pi/2)_hi instead of one.
    for (name, ops) in per_function_lines(&sass("rope")) {
        let frnd = ops.iter().filter(|l| l.starts_with("FRND")).count();
        // `FFMA Rd, Ra, C, Rc` with C = +-(pi/2)_hi and a negative product Ra * C.
        let subtractive = ops
            .iter()
            .filter(|l| l.starts_with("FFMA") && l.contains("1.5707963705"))
            .filter(|l| {
                let operands: Vec<&str> = l.split(',').map(str::trim).collect();
                operands.len() >= 4 && (operands[1].starts_with('-') != operands[2].starts_with('-'))
            })
            .count();
        assert!(frnd > 0 && frnd % 2 == 0, "{name}: expected two FRND per rotary pair, found {frnd}");
        assert!(
            subtractive <= frnd / 2,
            "{name}: {subtractive} FMAs subtract k * pi/2 for {} pairs: the first reduction step was contracted",
            frnd / 2
        );
    }
}

/// SASS instruction lines (operands included) per function.
fn per_function_lines(sass: &str) -> Vec<(String, Vec<String>)> {
    let mut v: Vec<(String, Vec<String>)> = Vec::new();
    for line in sass.lines() {
        if let Some(name) = line.trim().strip_prefix("Function : ") {
            v.push((name.trim().to_string(), Vec::new()));
        } else if let (Some(f), Some(code)) = (v.last_mut(), line.split("*/").nth(1)) {
            // Drop a predicate guard (`@P0`, `@!P1`) before the mnemonic.
            let code = code.split_whitespace().skip_while(|w| w.starts_with('@')).collect::<Vec<_>>().join(" ");
            if !code.is_empty() {
                f.1.push(code);
            }
        }
    }
    v
}

#[test]
fn moe_grouped_gemm_runs_on_tensor_cores_with_8_hmma_per_3_ldsm() {
    // bf16/f16: HMMA.16816 (mma.sync), LDSM (ldmatrix x4; .trans for the [k, n] weight layout),
    // 16-byte LDGSTS (cp.async), 128-bit output stores, no local memory. Only the main loop holds
    // HMMA and LDSM, so their counts over the function are the main loop's: per 64-deep stage a
    // prefill warp (32 x 64) issues 4 x (2 A + 4 B) ldmatrix.x4 for 4 x 16 mma (8:3), a decode
    // warp (16 x 16) 4 x (1 + 1) for 4 x 2 (1:1). f32 kernels stay on the SIMT path.
    let funcs: Vec<_> =
        per_function(&sass("moe")).into_iter().filter(|f| f.0.starts_with("moe_grouped_gemm_")).collect();
    assert_listed("moe", &funcs, |n| n.starts_with("moe_grouped_gemm_"));
    for (name, ops) in &funcs {
        let count = |prefix: &str| ops.iter().filter(|o| o.starts_with(prefix)).count();
        let has = |prefix: &str| count(prefix) > 0;
        assert!(!has("LDL") && !has("STL"), "{name} uses local memory");
        if name.ends_with("_f32") {
            assert!(!has("HMMA") && !has("LDSM"), "{name} should not use tensor cores");
            continue;
        }
        let hmma = if name.ends_with("_bf16") { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
        assert!(has(hmma), "{name}: no {hmma}");
        assert!(has("LDSM.16.M88.4"), "{name}: no ldmatrix.x4");
        if name.contains("_kn_") {
            assert!(has("LDSM.16.MT88.4"), "{name}: no ldmatrix.x4.trans for [k, n] weights");
        }
        assert!(has("LDGSTS.E.BYPASS.128"), "{name}: no 16-byte cp.async");
        assert!(has("STG.E.128"), "{name}: no 128-bit output store");
        let (h, l) = (count("HMMA"), count("LDSM"));
        let (want_h, want_l) = if name.contains("_m64_") { (64, 24) } else { (8, 8) };
        assert_eq!((h, l), (want_h, want_l), "{name}: HMMA:LDSM {h}:{l}, expected {want_h}:{want_l}");
    }
}

#[test]
fn moe_gather_and_combine_move_rows_with_128_bit_accesses() {
    // Row data moves in 128-bit loads and stores; the only narrower global accesses are the
    // 32-bit row index and routing weight of each slot.
    for (name, global) in vector_kernels("moe") {
        assert!(global.iter().any(|o| o == "LDG.E.128"), "{name}: no 128-bit load: {global:?}");
        for o in &global {
            assert!(o == "LDG.E.128" || o == "STG.E.128" || o == "LDG.E", "{name}: {o}: {global:?}");
        }
        assert!(global.iter().filter(|o| o.starts_with("STG")).all(|o| o == "STG.E.128"), "{name}: {global:?}");
    }
}

#[test]
fn every_planned_shared_memory_size_fits_hopper_and_the_readme_says_what_runs_where() {
    use llama_kernels_inspect::smem::{ARCHS, table, totals};
    let all = totals().unwrap();
    assert!(all.len() >= 20, "prefill, decode and MoE GEMM configurations: {}", all.len());
    for (u, total) in &all {
        // Every kernel runs on 9.0; a size no architecture has would be a planner bug.
        assert!(total[0] <= ARCHS[0].max_block_bytes, "{} needs {} bytes on sm_90", u.what, total[0]);
    }
    let t = table().unwrap();
    let page = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/shared-memory.md");
    let doc = std::fs::read_to_string(&page).unwrap();
    assert!(doc.contains(&t), "docs/shared-memory.md's table is stale; it should read:\n{t}");
}

#[test]
fn embedding_backward_moves_table_rows_with_128_bit_accesses() {
    // The 4-element path: the f32 table rows are stored (and, when adding, loaded) 128 bits at a
    // time; the gradient rows come in 64-bit (f16, bf16) or 128-bit (f32) loads; the rest are the
    // sorted keys (64-bit) of the run.
    let kernels: Vec<_> = vector_kernels("embedding").into_iter().filter(|(n, _)| n.contains("backward")).collect();
    assert_eq!(kernels.len(), 3);
    for (name, global) in kernels {
        let (loads, stores): (Vec<&String>, Vec<&String>) = global.iter().partition(|o| o.starts_with("LDG"));
        assert!(!stores.is_empty() && stores.iter().all(|o| o.contains(".128")), "{name}: {stores:?}");
        assert!(loads.iter().all(|o| o.contains(".64") || o.contains(".128") || **o == "LDG.E"), "{name}: {loads:?}");
        assert!(!loads.iter().any(|o| o.contains(".U16") || o.contains(".U8")), "{name}: narrow loads {loads:?}");
    }
}

#[test]
fn embedding_copies_rows_with_128_bit_accesses() {
    // The 16-byte path: every store is 128-bit; the loads are the 128-bit row vectors and the
    // 32-bit ids of the LLK_EMBEDDING_ROWS tokens a thread looks up per step.
    let ids = llama_kernels::dev::geometry::params::LLK_EMBEDDING_ROWS as usize;
    for (name, global) in vector_kernels("embedding").into_iter().filter(|(n, _)| !n.contains("backward")) {
        let (loads, stores): (Vec<&String>, Vec<&String>) = global.iter().partition(|o| o.starts_with("LDG"));
        assert!(!stores.is_empty() && stores.iter().all(|o| o.contains(".128")), "{name}: {stores:?}");
        assert!(loads.iter().any(|o| o.contains(".128")), "{name}: no 128-bit load in {loads:?}");
        let id_loads: Vec<_> = loads.iter().filter(|o| !o.contains(".128")).collect();
        assert!(id_loads.len() <= ids && id_loads.iter().all(|o| **o == "LDG.E"), "{name}: {loads:?}");
    }
}

#[test]
fn the_hopper_selftests_compile_to_bulk_and_tensor_copies_transaction_barriers_and_named_barriers_at_sm_90() {
    // What the emulator models must be what the GPU runs: the selftest pipeline's PTX becomes
    // the bulk-copy unit (UBLKCP), transaction-count arrivals and phase checks (SYNCS), and the
    // async-proxy fence of the wgmma test (FENCE.VIEW.ASYNC.S); no trap stub.
    let funcs = per_function(&sass("selftest"));
    let ops = |name: &str| funcs.iter().find(|(n, _)| n == name).map(|(_, o)| o.clone()).unwrap_or_default();
    let pipeline = ops("selftest_mbarrier");
    for want in ["UBLKCP.S.G", "SYNCS.ARRIVE.TRANS64.A1T0", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "SYNCS.EXCH.64"] {
        assert!(pipeline.iter().any(|o| o == want), "selftest_mbarrier lacks {want}");
    }
    assert!(!pipeline.iter().any(|o| o == "BPT.TRAP"), "selftest_mbarrier traps at sm_90");
    assert!(ops("selftest_wgmma").iter().any(|o| o == "FENCE.VIEW.ASYNC.S"), "selftest_wgmma lacks the proxy fence");
    // The warp-specialization test: named barriers (BAR.ARV / BAR.SYNC with an id) and
    // elect.sync (setmaxnreg needs sm_90a, which the prebuilt sm_90 code is not).
    let ws = ops("selftest_warp_specialize");
    for want in ["BAR.ARV", "BAR.SYNC.DEFER_BLOCKING", "ELECT"] {
        assert!(ws.iter().any(|o| o == want), "selftest_warp_specialize lacks {want}");
    }
    // The tensor-copy test: one TMA load per rank (UTMALDG.1D .. .5D), completing on SYNCS.
    let tma = ops("selftest_tma");
    for rank in 1..=5 {
        let want = format!("UTMALDG.{rank}D");
        assert!(tma.contains(&want), "selftest_tma lacks {want}");
    }
    assert!(tma.iter().any(|o| o == "SYNCS.PHASECHK.TRANS64.TRYWAIT"), "selftest_tma lacks the barrier wait");
    assert!(!tma.iter().any(|o| o == "BPT.TRAP" || o.starts_with("LDL")), "selftest_tma traps or uses local memory");
}

#[test]
fn the_hopper_attention_kernel_runs_on_wgmma_fed_by_tma_in_warp_specialized_warpgroups() {
    // The sm_90 slot of attention_sm90 is built for sm_90a: every kernel issues its matrix
    // products as HGMMA (64 x keys for S, 64 x head_dim for O), loads by TMA (UTMALDG.3D),
    // synchronizes on transaction barriers (SYNCS), ping-pongs on named barriers, reallocates
    // registers (USETMAXREG) and keeps everything in registers (no local memory).
    let report =
        PathBuf::from(llama_kernels::dev::build::KERNEL_BUILD_DIR).join("sm_90").join("attention_sm90.ptxas.txt");
    let report = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{}: {e}", report.display()));
    assert!(!report.contains("C7518"), "ptxas serializes the wgmma:\n{report}");
    for (name, ops) in per_function(&sass("attention_sm90")) {
        let d =
            ["hd64", "hd128", "hd256"].iter().position(|h| name.contains(&format!("{h}_"))).map(|i| 64 << i).unwrap();
        let keys = if d <= 128 { 128 } else { 64 };
        // f16 operands are HGMMA's default: no type suffix.
        let dtype = if name.ends_with("bf16") { ".BF16" } else { "" };
        let has = |want: &str| ops.iter().any(|o| o == want);
        for want in [
            format!("HGMMA.64x{keys}x16.F32{dtype}"),
            format!("HGMMA.64x{d}x16.F32{dtype}"),
            "UTMALDG.3D".to_string(),
            "SYNCS.ARRIVE.TRANS64".to_string(),
            "SYNCS.PHASECHK.TRANS64.TRYWAIT".to_string(),
            "BAR.ARV".to_string(),
            "USETMAXREG.TRY_ALLOC.CTAPOOL".to_string(),
            "USETMAXREG.DEALLOC.CTAPOOL".to_string(),
        ] {
            assert!(has(&want), "{name} lacks {want}");
        }
        assert!(!ops.iter().any(|o| o.starts_with("HMMA")), "{name} uses mma.sync");
        // Not serialized by ptxas (a wait behind every HGMMA): the S and P V groups overlap.
        let waits = ops.iter().filter(|o| *o == "WARPGROUP.DEPBAR.LE").count();
        let hgmma = ops.iter().filter(|o| o.starts_with("HGMMA")).count();
        assert!(waits <= 5 && hgmma >= 4 * waits, "{name}: {waits} wgmma waits for {hgmma} HGMMA");
        assert!(!ops.iter().any(|o| o.starts_with("LDL") || o.starts_with("STL")), "{name} uses local memory");
        assert!(!has("BPT.TRAP"), "{name} traps at sm_90");
    }
    // The overlap inside a warpgroup survives ptxas: in the main loop's one partial wait (S done,
    // the P V behind it still running) and the full wait after it lie the tile's exponentials
    // (keys / 2 MUFU.EX2 per thread), and ptxas injected no wait of its own (its C7517 note).
    assert!(!report.contains("C7517"), "ptxas injects a wgmma wait:\n{report}");
    for (name, lines) in per_function_lines(&sass("attention_sm90")) {
        let keys = if name.contains("hd256_") { 64 } else { 128 };
        let partial: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("WARPGROUP.DEPBAR.LE gsb0, 0x1"))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(partial.len(), 1, "{name}: {} partial wgmma waits", partial.len());
        let overlapped = lines[partial[0] + 1..]
            .iter()
            .take_while(|l| !l.starts_with("WARPGROUP.DEPBAR"))
            .filter(|l| l.starts_with("MUFU.EX2"))
            .count();
        assert!(overlapped >= keys / 2, "{name}: {overlapped} exponentials run beside the P V, not {}", keys / 2);
    }
}

#[test]
fn sampling_histograms_add_without_a_compare_and_swap_loop() {
    // A 64-bit shared-memory add compiles to a compare-and-swap loop (ATOMS.CAS / ATOMS.CAST.SPIN
    // and a retry branch), which a row's few crowded bins keep retrying; sampling.cu adds the
    // mass as two native 32-bit adds. Every listed sampling kernel, none with a CAS.
    let funcs = per_function(&sass("sampling"));
    assert_listed("sampling", &funcs, |_| true);
    let mut native = 0;
    for (name, ops) in &funcs {
        let cas: Vec<_> = ops.iter().filter(|o| o.starts_with("ATOMS.CAS")).collect();
        assert!(cas.is_empty(), "{name}: a compare-and-swap loop on shared memory: {cas:?}");
        native += ops.iter().filter(|o| o.starts_with("ATOMS.ADD")).count();
    }
    assert!(native > 0, "no native shared-memory add in the sampling kernels");
}

#[test]
fn the_hopper_register_split_is_exactly_the_launch_pool() {
    // setmaxnreg moves registers within the pool the block launched with: the consumers' raise
    // waits until the producer's release covers it. ptxas's count must be the one the split
    // (params.h) was sized for, for every Hopper prefill kernel.
    use llama_kernels::dev::geometry::params::{
        LLK_ATTN_SM90_REGS, LLK_ATTN_SM90_REGS_CONSUMER, LLK_ATTN_SM90_REGS_PRODUCER, LLK_ATTN_SM90_THREADS,
    };
    assert_eq!(
        128 * LLK_ATTN_SM90_REGS_PRODUCER + 256 * LLK_ATTN_SM90_REGS_CONSUMER,
        LLK_ATTN_SM90_THREADS * LLK_ATTN_SM90_REGS
    );
    let m = kernel_modules().expect("the device code").find(|m| m.name == "attention_sm90").expect("attention_sm90");
    let kernels = parse_ptxas(m.ptxas_sm90);
    let want = listed("attention_sm90", |_| true);
    let found: BTreeSet<String> = kernels.iter().map(|k| k.name.clone()).collect();
    assert_eq!(found, want, "the ptxas report's kernels are the listed ones");
    for k in &kernels {
        assert_eq!(
            k.registers, LLK_ATTN_SM90_REGS,
            "{}: ptxas uses {} registers, the split needs {}",
            k.name, k.registers, LLK_ATTN_SM90_REGS
        );
    }
}
