//! SASS checks of the packed-weight kernels (kernels/qlinear.cu, kernels/qmmv.cu): the GEMVs
//! stream packed weights in 128-bit loads, NF4 looks its code book up in shared memory, and the
//! GEMMs (forward and input gradient) run on tensor cores from dequantized shared tiles.

use super::*;

#[test]
fn packed_gemv_streams_weights_with_128_bit_loads_and_no_local_memory() {
    // Every qgemv kernel reads its packed values with 128-bit read-only loads (LDG.E.128.CONSTANT:
    // one per chunk, two for Q8_0), Q6_K its high bits with one 64-bit load, and uses no local
    // memory; the dequantize kernels store 128-bit vectors and use no local memory.
    let funcs = per_function(&sass("qlinear"));
    let gemv: Vec<_> = funcs.iter().filter(|(n, _)| n.starts_with("qgemv_")).cloned().collect();
    assert_listed("qlinear", &gemv, |n| n.starts_with("qgemv_"));
    for (name, ops) in &gemv {
        assert!(ops.iter().any(|o| o == "LDG.E.128.CONSTANT"), "{name}: no 128-bit read-only weight load");
        assert!(!ops.iter().any(|o| o.starts_with("LDL") || o.starts_with("STL")), "{name}: local memory");
        if name.contains("q6_k") {
            assert!(ops.iter().any(|o| o == "LDG.E.64.CONSTANT"), "{name}: no 64-bit load of the high bits");
        }
    }
    for (name, ops) in funcs.iter().filter(|(n, _)| n.starts_with("qdequant_")) {
        assert!(ops.iter().any(|o| o == "STG.E.128"), "{name}: no 128-bit store");
        assert!(!ops.iter().any(|o| o.starts_with("LDL") || o.starts_with("STL")), "{name}: local memory");
    }
}

#[test]
fn nf4_kernels_look_their_code_book_up_in_shared_memory() {
    // An indexed read of the params (LDC c[0x0][Rn]) serializes a warp over its distinct
    // indexes: every NF4 kernel (GEMV, GEMM, dequantize, embedding) reads its code book that way
    // once per block, to stage it in shared memory, and looks values up there (LDS).
    for module in ["qlinear", "embedding"] {
        let nf4: Vec<_> = per_function_lines(&sass(module)).into_iter().filter(|(n, _)| n.contains("_nf4_")).collect();
        assert_listed(module, &nf4, |n| n.contains("_nf4_"));
        for (name, lines) in nf4 {
            let by_register = |l: &&String| l.starts_with("LDC") && l.contains("c[0x0][R") && !l.contains("c[0x0][RZ");
            let indexed = lines.iter().filter(by_register).count();
            assert!(indexed <= 1, "{name}: {indexed} indexed constant loads");
            assert!(lines.iter().any(|l| l.starts_with("LDS")), "{name}: no shared-memory lookup");
        }
    }
}

#[test]
fn tensor_core_gemv_streams_packed_weights_into_mma_without_local_memory() {
    // Every qmmv kernel (Q4_0, Q4_1, Q4_K, Q6_K, NF4; bf16, f16): the packed values by 128-bit
    // read-only loads (two per lane and group: rows g and g + 8), mma.sync of its dtype, the
    // values turned into 16-bit floats by byte permutes (PRMT), the quad's transpose through
    // shared memory (STS, then LDS.128), and no local memory. NF4 looks its code book up in
    // registers: no indexed constant load (LDC c[0x0][Rn]), which would serialize the warp.
    let funcs = per_function(&sass("qmmv"));
    let mmv: Vec<_> = funcs.iter().filter(|(n, _)| n.starts_with("qmmv_")).cloned().collect();
    assert_listed("qmmv", &mmv, |n| n.starts_with("qmmv_"));
    for (name, lines) in per_function_lines(&sass("qmmv")).into_iter().filter(|(n, _)| n.contains("_nf4_")) {
        let by_register = |l: &&String| l.starts_with("LDC") && l.contains("c[0x0][R") && !l.contains("c[0x0][RZ");
        assert_eq!(lines.iter().filter(by_register).count(), 0, "{name}: an indexed constant load");
        let prmt = lines.iter().filter(|l| l.starts_with("PRMT")).count();
        assert!(prmt >= 128, "{name}: {prmt} byte permutes; the register lookup needs 16 per word of nibbles");
    }
    for (name, ops) in mmv {
        let hmma = if name.ends_with("_bf16") { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
        let has = |op: &str| ops.iter().any(|o| o == op);
        assert!(has(hmma), "{name}: no {hmma}");
        assert!(ops.iter().filter(|o| *o == "LDG.E.128.CONSTANT").count() >= 2, "{name}: no 128-bit weight loads");
        assert!(has("PRMT") && has("LDS.128"), "{name}: no byte permute or 128-bit shared load");
        assert!(!ops.iter().any(|o| o.starts_with("LDL") || o.starts_with("STL")), "{name}: local memory");
    }
}

#[test]
fn packed_gemm_runs_on_tensor_cores_from_dequantized_shared_tiles() {
    // Every qgemm kernel (bf16, f16; each format; y = x W^T and the input gradient dx = dy W):
    // mma.sync (HMMA.16816 of its dtype) fed by ldmatrix.x4 from shared memory, activations by
    // 16-byte cp.async (LDGSTS), the packed
    // weights by 128-bit read-only loads, the dequantized tile stored with 128-bit shared stores,
    // and no local memory.
    let funcs = per_function(&sass("qlinear"));
    let gemm: Vec<_> = funcs.iter().filter(|(n, _)| n.starts_with("qgemm_")).cloned().collect();
    assert_listed("qlinear", &gemm, |n| n.starts_with("qgemm_"));
    for (name, ops) in &gemm {
        let hmma = if name.ends_with("_bf16") { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
        let has = |op: &str| ops.iter().any(|o| o == op);
        assert!(has(hmma), "{name}: no {hmma}");
        assert!(has("LDSM.16.M88.4"), "{name}: no ldmatrix.x4");
        // The input gradient (qgemm_dx_) reads its [k][n] weight tile with ldmatrix.trans.
        assert_eq!(has("LDSM.16.MT88.4"), name.starts_with("qgemm_dx_"), "{name}: ldmatrix.trans where W is [k][n]");
        // 16-byte copies; the input gradient's may end inside dy's row (.ZFILL: partial copies).
        assert!(ops.iter().any(|o| o.starts_with("LDGSTS") && o.contains(".128")), "{name}: no 16-byte cp.async");
        assert!(has("LDG.E.128.CONSTANT"), "{name}: no 128-bit read-only weight load");
        assert!(has("STS.128"), "{name}: no 128-bit shared store of the dequantized tile");
        assert!(!ops.iter().any(|o| o.starts_with("LDL") || o.starts_with("STL")), "{name}: local memory");
    }
}
