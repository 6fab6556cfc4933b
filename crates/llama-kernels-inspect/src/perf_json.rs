//! The static performance report as JSON (`llama-kernels info --perf --json`): the same kernels,
//! predictions and calibration rows as [`super::perf::report`], with the numbers as numbers.
//! Predictions of a model, not measurements; `"measured": false` says so in the document.

use super::perf::{KernelPerf, Region, SPECS, Workload, analyze, calibration, memory_calibration};
use serde_json::{Value, json};

fn kernel_json(k: &KernelPerf) -> Value {
    let r = &k.resources;
    let mut v = json!({
        "module": k.spec.module,
        "kernel": k.spec.kernel,
        "shape": k.spec.shape,
        "bound": k.bound,
        "predicted": { "value": k.predicted_value, "unit": k.predicted_unit, "text": k.predicted },
        "resources": {
            "registers": r.registers,
            "static_smem_bytes": r.smem_bytes,
            "dynamic_smem_bytes": k.dyn_smem,
            "spill_store_bytes": r.spill_stores,
            "spill_load_bytes": r.spill_loads,
            "stack_bytes": r.stack_bytes,
        },
        "threads_per_block": k.spec.threads,
        "blocks_per_sm": k.blocks_per_sm,
        "warps_per_sm": k.warps_per_sm,
        "region_instructions": k.mix.total,
    });
    if let Region::MatrixLoop = k.spec.region {
        v["predicted_tflops"] = json!(k.predicted_value);
        v["predicted_loop_tflops"] = json!(k.predicted_loop_tflops);
        v["issue_slots_per_hmma"] = json!(k.slots_per_hmma);
        v["smem_bytes_per_hmma"] = json!(k.smem_bytes_per_hmma);
    } else {
        v["predicted_fraction_of_copy"] = json!(k.predicted_value);
        v["issue_slots_per_element"] = json!(k.slots_per_elem);
        v["loads_in_flight_128"] = json!(k.loads_in_flight);
        if let Some(m) = &k.memory {
            v["memory_model"] = json!({
                "steady_fraction_of_copy": m.steady_fraction,
                "seconds": m.seconds,
                "dram_seconds": m.t_dram,
                "latency_seconds": m.t_latency,
                "issue_seconds": m.t_issue,
                "launch_seconds": m.t_launch,
                "latency_cover": m.cover,
            });
        }
    }
    v
}

/// One attention calibration row: a peer's published H100 figure against the `kind` model.
fn attention_row(kind: &str, peer: &str, w: &Workload, published: f64, predicted: f64, source: &str) -> Value {
    json!({
        "peer": peer,
        "kind": kind,
        "workload": format!(
            "batch {} x {} heads, seq {}, head_dim {}, {}",
            w.batch,
            w.heads,
            w.seq,
            w.head_dim,
            if w.causal { "causal" } else { "non-causal" }
        ),
        "gpu": "H100 SXM",
        "unit": "TFLOP/s",
        "published": published,
        "predicted": predicted,
        "error": (predicted - published) / published,
        "source": source,
    })
}

/// The report as a JSON value: `kernels` (one object per kernel, or `{kernel, error}` for one
/// that cannot be analyzed), `calibration` (every peer's published figures against the model)
/// and `calibration_errors` (a fixture that cannot be read).
pub fn report_json() -> Value {
    let kernels: Vec<Value> = SPECS
        .iter()
        .map(|spec| match analyze(spec) {
            Ok(k) => kernel_json(&k),
            Err(e) => json!({ "module": spec.module, "kernel": spec.kernel, "error": e }),
        })
        .collect();
    let (mut rows, mut errors) = (Vec::new(), Vec::new());
    match calibration() {
        Ok(cal) => {
            rows.extend(cal.iter().map(|r| {
                attention_row("matrix", &r.peer, &r.workload, r.published_tflops, r.predicted.tflops, &r.source)
            }))
        }
        Err(e) => errors.push(e),
    }
    match super::hopper_report::wgmma_calibration() {
        Ok(cal) => rows.extend(cal.iter().map(|r| {
            let mut row =
                attention_row("wgmma", &r.peer, &r.workload, r.published_tflops, r.predicted_tflops, &r.source);
            row["fitted"] = Value::Bool(r.fitted);
            row
        })),
        Err(e) => errors.push(e),
    }
    match memory_calibration() {
        Ok(cal) => rows.extend(cal.iter().map(|r| {
            json!({
                "peer": r.peer,
                "kind": "memory",
                "workload": r.workload,
                "gpu": r.gpu.name,
                "unit": "GB/s",
                "published": r.published_gbps,
                "predicted": r.predicted.gbps,
                "error": r.error,
                "bound": r.predicted.bound,
                "source": r.source,
            })
        })),
        Err(e) => errors.push(e),
    }
    json!({
        "report": "static performance report: sm_90 SASS against an H200 resource model",
        "measured": false,
        "note": "predictions of a model, not measurements; no GPU measurement of these kernels exists",
        "gpu": "H200 SXM",
        "kernels": kernels,
        "calibration": rows,
        "calibration_errors": errors,
        "hopper": hopper_json(),
        "coverage": coverage_json(),
        "packed": packed_json(),
        "layers": layers_json(),
        "shared_memory": super::smem::json().unwrap_or_else(|e| json!({ "error": e.to_string() })),
    })
}

/// The Hopper prefill kernels under the wgmma model: per kernel its tile's terms, its main-loop
/// TFLOP/s, and its predictions at the FA3 paper's launches (16k tokens, hidden 2048), next to
/// FA3's published figure and, at hd128, the mma.sync kernel's prediction.
fn hopper_json() -> Value {
    use super::attention_model::predict_launch;
    use super::hopper_report::{PAPER_SEQS, fa3_kernels, fa3_published, our_hopper_kernels, paper_workload};
    let (kernels, peers) = match (our_hopper_kernels(), fa3_kernels()) {
        (Ok(k), Ok(p)) => (k, p),
        (Err(e), _) | (_, Err(e)) => return json!({ "error": e }),
    };
    let mma = super::perf::prefill_attention_model().ok();
    let rows: Vec<Value> = kernels
        .iter()
        .map(|k| {
            let d = k.model.head_dim;
            let t = k.model.tile(&k.model.unmasked);
            let mut launches = Vec::new();
            for causal in [false, true] {
                for seq in PAPER_SEQS {
                    let w = paper_workload(seq, d, causal);
                    let fa3 = fa3_published(&peers, d, causal, seq);
                    let mma_sync = mma.as_ref().filter(|_| d == 128).map(|(m, b)| predict_launch(m, &w, *b).tflops);
                    launches.push(json!({
                        "seq": seq, "batch": w.batch, "heads": w.heads, "causal": causal,
                        "tflops": k.model.predict(&w).tflops,
                        "fa3_published_h100": fa3,
                        "mma_sync_predicted": mma_sync,
                    }));
                }
            }
            json!({
                "kernel": k.name,
                "head_dim": d,
                "keys": k.model.keys,
                "hot_path": { "total": k.model.unmasked.total, "hgmma": k.model.unmasked.hgmma, "mufu": k.model.unmasked.mufu },
                "tile_clk": { "gemm": t.gemm_clk, "chain": t.chain_clk, "issue": t.issue_clk, "smem": t.smem_clk, "tile": t.tile_clk },
                "bound": t.bound,
                "loop_tflops": k.model.loop_tflops(),
                "launches": launches,
            })
        })
        .collect();
    json!({ "exposed_chain": super::h200::WGMMA_EXPOSED_CHAIN, "clock_ghz": super::h200::CLOCK_GHZ, "kernels": rows })
}

/// The packed linear kernels (`qlinear_model`): the decode GEMV at Llama 3 8B's projections at 1
/// and 16 rows, the prefill GEMM's loop next to the dense mma.sync GEMM, and the crossover.
fn packed_json() -> Value {
    use super::qlinear_model::{
        SHAPES, gemm_crossover_rows, mma_gemv_and_gemm_slots, predict_dense_peer, predict_gemm, predict_gemv,
        predict_mma_gemv,
    };
    use llama_kernels::ops::qlinear::{MAX_MMA_GEMV_ROWS, has_mma_gemv};
    use llama_kernels::spec::quant::QuantFormat;
    let gemv_json = |g: &super::qlinear_model::GemvPrediction| {
        json!({
            "kernel": g.kernel,
            "shape": g.shape,
            "rows": g.rows,
            "split": g.split,
            "bits_per_weight": g.bits_per_weight,
            "warps_per_sm": g.warps_per_sm,
            "bytes_in_flight_per_thread": g.bytes_in_flight_per_thread,
            "issue_slots_per_iteration": g.slots_per_iteration,
            "bound": g.memory.bound,
            "steady_fraction_of_copy": g.memory.steady_fraction,
            "predicted_fraction_of_copy": g.memory.fraction_of_copy,
            "latency_cover": g.memory.cover,
        })
    };
    let mut mma_gemv = Vec::new();
    for format in QuantFormat::ALL.into_iter().filter(|&f| has_mma_gemv(f, llama_kernels::DType::BF16)) {
        for &(shape, out, inp) in &SHAPES {
            mma_gemv.push(match predict_mma_gemv(format, shape, out, inp, 1) {
                Ok(g) => gemv_json(&g),
                Err(e) => json!({ "kernel": format!("qmmv_{}_bf16", format.name()), "error": e }),
            });
        }
        let (gemv_slots, gemm_slots) = mma_gemv_and_gemm_slots(format).unwrap_or((f64::NAN, f64::NAN));
        mma_gemv.push(json!({
            "format": format.name(),
            "issue_slots_per_1024_weights": gemv_slots,
            "gemm_issue_slots_per_1024_weights": gemm_slots,
        }));
    }
    let mut gemv = Vec::new();
    for format in QuantFormat::ALL {
        for &(shape, out, inp) in &SHAPES {
            for rows in [1, 16] {
                gemv.push(match predict_gemv(format, shape, out, inp, rows) {
                    Ok(g) => gemv_json(&g),
                    Err(e) => json!({ "kernel": format!("qgemv_{}_bf16", format.name()), "error": e }),
                });
            }
        }
    }
    let dense = predict_dense_peer();
    let mut gemm = Vec::new();
    for r in std::iter::once(dense.clone()).chain(QuantFormat::ALL.iter().map(|&f| predict_gemm(f))) {
        gemm.push(match r {
            Ok(p) => json!({
                "kernel": p.kernel,
                "registers": p.registers,
                "blocks_per_sm": p.blocks_per_sm,
                "hmma_per_loop": p.hmma,
                "issue_slots_per_hmma": p.slots_per_hmma,
                "smem_bytes_per_hmma": p.smem_bytes_per_hmma,
                "bound": p.bound,
                "tflops": p.tflops,
                "fraction_of_dense": dense.as_ref().map(|d| p.tflops / d.tflops).ok(),
            }),
            Err(e) => json!({ "error": e }),
        });
    }
    let crossover: Vec<Value> = QuantFormat::ALL
        .iter()
        .map(|&f| match gemm_crossover_rows(f) {
            Ok(r) => json!({ "format": f.name(), "rows": r }),
            Err(e) => json!({ "format": f.name(), "error": e }),
        })
        .collect();
    json!({
        "gemv": gemv,
        "gemm": gemm,
        "gemm_crossover_rows": crossover,
        "gemm_from_rows": llama_kernels::ops::qlinear::GEMM_FROM_ROWS,
        "mma_gemv": mma_gemv,
        "gemm_from_rows_after_mma_gemv": MAX_MMA_GEMV_ROWS + 1,
    })
}

/// The covered kernels (decode attention, kv_append, MoE): `{kernel, error}` for one that
/// cannot be analyzed.
fn coverage_json() -> Vec<Value> {
    super::coverage::coverage()
        .into_iter()
        .map(|r| match r {
            Ok(c) => json!({
                "group": c.group,
                "module": c.module,
                "kernel": c.kernel,
                "shape": c.shape,
                "bound": c.bound,
                "registers": c.registers,
                "blocks_per_sm": c.blocks_per_sm,
                "grid_blocks": c.grid_blocks,
                "splits": c.splits,
                "seconds": c.seconds,
                "body_seconds": c.body_seconds,
                "tensor_seconds": c.t_tensor,
                "predicted_fraction_of_copy": c.fraction_of_copy,
                "steady_fraction_of_copy": c.steady_fraction,
                "latency_cover": c.memory.cover,
                "tflops": c.tflops,
            }),
            Err(e) => json!({ "error": e }),
        })
        .collect()
}

/// Whole-layer and step predictions of every model and phase.
fn layers_json() -> Value {
    use super::layer_model::{
        CUBLAS_TFLOPS, LAUNCH_EAGER_US, LAUNCH_GRAPH_US, LLAMA3_8B, LLAMA3_70B, PACKED_FORMATS, PEER_FIGURES, PHASES,
        Phase, Weights, layer_predictions, predict_step_with,
    };
    let attn = match super::perf::prefill_attention_model() {
        Ok(a) => a,
        Err(e) => return json!({ "measured": false, "error": e }),
    };
    let steps: Vec<Value> = layer_predictions(&attn)
        .into_iter()
        .map(|(m, p, r)| {
            let phase = match p {
                Phase::Decode { batch, context } => json!({ "kind": "decode", "batch": batch, "context": context }),
                Phase::Prefill { tokens } => json!({ "kind": "prefill", "tokens": tokens }),
            };
            match r {
                Ok(sp) => json!({
                    "model": m.name,
                    "phase": phase,
                    "layer_seconds_eager": sp.layer_eager,
                    "layer_seconds_graph": sp.layer_graph,
                    "step_seconds_eager": sp.step_eager,
                    "step_seconds_graph": sp.step_graph,
                    "tokens_per_s_eager": sp.tokens_per_s_eager,
                    "tokens_per_s_graph": sp.tokens_per_s_graph,
                    "launches_per_step": sp.launches_per_step,
                    "memory_bytes": sp.memory_bytes,
                    "fits_one_h200": sp.fits,
                    "batch1_decode_ceiling_tokens_per_s": m.decode_ceiling(),
                    "stages": sp.stages.iter().map(|s| json!({
                        "name": s.name,
                        "by": s.by,
                        "bound": s.bound,
                        "launches": s.launches,
                        "per_step": s.per_step,
                        "body_seconds": s.body,
                        "seconds_eager": s.eager,
                        "seconds_graph": s.graph,
                        "weight_stage": s.weight_stage,
                        "share_of_graph_step": s.share,
                    })).collect::<Vec<Value>>(),
                }),
                Err(e) => json!({ "model": m.name, "phase": phase, "error": e }),
            }
        })
        .collect();
    // Batch-1 decode of the dense models with packed projections and LM head.
    let packed: Vec<Value> = [LLAMA3_8B, LLAMA3_70B]
        .iter()
        .flat_map(|m| PACKED_FORMATS.iter().map(move |&f| (m, f)))
        .map(|(m, f)| match predict_step_with(m, PHASES[0], &attn, Weights::Packed(f)) {
            Ok(sp) => json!({
                "model": m.name,
                "format": f.name(),
                "batch": 1,
                "step_seconds_graph": sp.step_graph,
                "tokens_per_s_graph": sp.tokens_per_s_graph,
                "memory_bytes": sp.memory_bytes,
            }),
            Err(e) => json!({ "model": m.name, "format": f.name(), "error": e }),
        })
        .collect();
    json!({
        "measured": false,
        "assumptions": {
            "cublas_tflops": CUBLAS_TFLOPS,
            "launch_us_eager": LAUNCH_EAGER_US,
            "launch_us_graph": LAUNCH_GRAPH_US,
            "copy_bytes_per_s": super::h200::COPY_BYTES_PER_S,
        },
        "steps": steps,
        "packed_decode": packed,
        "peers": PEER_FIGURES.iter().map(|(what, source)| json!({ "what": what, "source": source })).collect::<Vec<Value>>(),
    })
}

/// [`report_json`] pretty-printed.
pub fn report_json_text() -> String {
    serde_json::to_string_pretty(&report_json()).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
