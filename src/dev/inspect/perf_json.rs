//! The static performance report as JSON (`llama-kernels info --perf --json`): the same kernels,
//! predictions and calibration rows as [`super::perf::report`], with the numbers as numbers.
//! Predictions of a model, not measurements; `"measured": false` says so in the document.

use super::perf::{KernelPerf, Region, SPECS, analyze, calibration, memory_calibration};
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
            "dynamic_smem_bytes": k.spec.dyn_smem,
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
        Ok(cal) => rows.extend(cal.iter().map(|r| {
            let w = &r.workload;
            json!({
                "peer": r.peer,
                "kind": "matrix",
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
                "published": r.published_tflops,
                "predicted": r.predicted.tflops,
                "error": r.error,
                "source": r.source,
            })
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
    })
}

/// [`report_json`] pretty-printed.
pub fn report_json_text() -> String {
    serde_json::to_string_pretty(&report_json()).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
