//! The static performance report's thresholds: the levers each kernel was tuned with, asserted
//! from its sm_90 SASS, so that a change that loses one fails CI without a GPU. The numbers are a
//! model of an H200 (src/inspect/perf.rs), not a measurement. One module per part: kernel levers,
//! calibrations against peers, the packed kernels and layers, the JSON and text report.

mod backward;
mod calibration;
mod json;
mod levers;
mod packed;

use llama_kernels_inspect::perf::{
    SPECS, analyze, calibration, h200, memory_calibration, peer_loop_counts, peer_memory_counts, report,
};
use llama_kernels_inspect::perf_json::report_json_text;

fn kernel(name: &str) -> llama_kernels_inspect::perf::KernelPerf {
    let spec = SPECS.iter().find(|s| s.kernel == name).unwrap_or_else(|| panic!("no spec for {name}"));
    analyze(spec).unwrap_or_else(|e| panic!("{name}: {e}"))
}
