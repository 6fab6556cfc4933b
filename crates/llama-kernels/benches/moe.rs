//! MoE on Llama 4 shapes (Scout: 16 experts, Maverick: 128; hidden 5120, expert intermediate
//! 8192, top-1, shared expert) and Mixtral 8x7B (8 experts, hidden 4096, intermediate 14336,
//! top-2): CUDA-event times of each stage and of the whole layer.
//!
//! * Routing: 4096 tokens x 128 experts in every mode (target: <= 10 us).
//! * Align, gather and combine at 4096 tokens, hidden 5120: bytes moved and the fraction of the
//!   device-to-device copy bandwidth measured in the same run (target: >= 85%).
//! * Grouped GEMM at 4096 tokens (gate_up + SwiGLU, then down), TFLOP/s next to cuBLAS's dense
//!   bf16 GEMM on the same total FLOPs (the same M, N, K, one matrix), measured in the same run
//!   (target: >= 70% of cuBLAS).
//! * Decode (1-8 tokens): the expert GEMMs' time against the bytes of the experts actually chosen
//!   (target: >= 70% of copy bandwidth).
//! * The whole layer (router, route, align, gather, two grouped GEMMs, shared expert, combine).
//!
//! Routing is random and uniform over the experts (seeded). Weights are zero-filled device
//! memory (uploading gigabytes of random values would dominate the run), the same for cuBLAS.
//! Without a GPU this prints why and exits 0.

mod common;

use std::collections::HashSet;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use llama_kernels::dev::testing::Rng;
use llama_kernels::ops::moe::{self, ExpertWeights, GemmGroups, MoeAlign, MoeFfnConfig, MoeRouting, WeightLayout};
use llama_kernels::ops::moe::{GateUpTensors, MoeFfn, MoeFfnWeights, SharedExpertTensors};
use llama_kernels::{DType, Device, Tensor};

fn random_ids(tokens: usize, experts: usize, k: usize, seed: u64) -> Vec<i32> {
    let mut rng = Rng::new(seed);
    let mut ids = Vec::with_capacity(tokens * k);
    for _ in 0..tokens {
        let mut chosen = Vec::with_capacity(k);
        while chosen.len() < k {
            let e = rng.below(experts as u64) as i32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        ids.extend(chosen);
    }
    ids
}

fn zeros(device: &Device, dtype: DType, shape: &[usize]) -> Tensor {
    Tensor::zeros(device, dtype, shape).expect("alloc")
}

/// cuBLAS `Y[m, n] = X[m, k] W[k, n]` (row-major) in bf16 with f32 compute: mean time in us.
fn cublas_us(device: &Device, m: usize, n: usize, k: usize) -> Option<f64> {
    let stream = device.cuda_stream()?.clone();
    let blas = CudaBlas::new(stream.clone()).ok()?;
    let x = stream.alloc_zeros::<half::bf16>(m * k).ok()?;
    let w = stream.alloc_zeros::<half::bf16>(k * n).ok()?;
    let mut y = stream.alloc_zeros::<half::bf16>(m * n).ok()?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: half::bf16::ONE,
        lda: n as i32,
        ldb: k as i32,
        beta: half::bf16::ZERO,
        ldc: n as i32,
    };
    // Column-major: Y^T = W^T X^T, which is row-major Y = X W.
    let mut run = || -> llama_kernels::Result<()> {
        // SAFETY: x, w and y hold m k, k n and m n bf16 elements on this stream; the config
        // addresses exactly those (leading dimensions n, k, n).
        unsafe { blas.gemm(cfg, &w, &x, &mut y) }
            .map_err(|e| llama_kernels::Error::InvalidView { what: "cublas", why: format!("{e:?}") })
    };
    Some(common::gpu_time_us(device, 20, &mut run))
}

struct Layer {
    name: &'static str,
    hidden: usize,
    inter: usize,
    experts: usize,
    top_k: usize,
    shared: usize,
    layout: WeightLayout,
    routing: MoeRouting,
    weights_on_input: bool,
}

const SCOUT: Layer = Layer {
    name: "scout",
    hidden: 5120,
    inter: 8192,
    experts: 16,
    top_k: 1,
    shared: 8192,
    layout: WeightLayout::InOut,
    routing: MoeRouting::Llama4,
    weights_on_input: true,
};
const MAVERICK: Layer = Layer { name: "maverick", experts: 128, ..SCOUT };
const MIXTRAL: Layer = Layer {
    name: "mixtral",
    hidden: 4096,
    inter: 14336,
    experts: 8,
    top_k: 2,
    shared: 0,
    layout: WeightLayout::OutIn,
    routing: MoeRouting::Softmax { renormalize: true },
    weights_on_input: false,
};

fn main() {
    let Some(device) = common::gpu_or_explain("moe bench") else { return };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let dt = DType::BF16;
    let mut mem_rows = Vec::new();
    let mut flop_rows = Vec::new();

    // ---------------------------------------------------------------- routing
    let tokens = 4096;
    for (experts, k, routing, label) in [
        (128, 1, MoeRouting::Llama4, "llama4"),
        (128, 8, MoeRouting::Softmax { renormalize: true }, "softmax"),
        (
            128,
            8,
            MoeRouting::Grouped { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 },
            "grouped",
        ),
        (
            256,
            8,
            MoeRouting::Grouped { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 },
            "grouped",
        ),
    ] {
        let mut rng = Rng::new(1);
        let logits = Tensor::from_f64(&device, dt, &rng.normal_vec(tokens * experts, 1.0, dt), &[tokens, experts])
            .expect("upload");
        let bias = matches!(routing, MoeRouting::Grouped { .. }).then(|| zeros(&device, DType::F32, &[experts]));
        let ids = zeros(&device, DType::I32, &[tokens, k]);
        let w = zeros(&device, DType::F32, &[tokens, k]);
        let us = common::gpu_time_us(&device, 200, || moe::moe_route(&logits, bias.as_ref(), routing, &ids, &w));
        let bytes = (tokens * experts * 2 + tokens * k * 8) as f64;
        mem_rows.push(common::Row {
            name: format!("moe_route bf16 {tokens}x{experts} k{k} {label}"),
            us,
            bytes,
            flops: 0.0,
        });
    }

    // ---------------------------------------------------------------- align, gather, combine
    let hidden = 5120;
    for (experts, k) in [(16, 1), (128, 1), (128, 8)] {
        let slots = tokens * k;
        let ids = Tensor::from_slice(&device, &random_ids(tokens, experts, k, 2), &[tokens, k]).expect("upload");
        let w = zeros(&device, DType::F32, &[tokens, k]);
        let mut align = MoeAlign::plan(&device, experts, slots).expect("plan");
        let bm = moe::preferred_block_m(slots, experts);
        let us = common::gpu_time_us(&device, 200, || align.align(&ids, bm));
        mem_rows.push(common::Row {
            name: format!("moe_align i32 {tokens}x{k} E{experts}"),
            us,
            bytes: (slots * 4 * 3) as f64,
            flops: 0.0,
        });
        let rows = moe::padded_rows(slots, experts, bm).unwrap();
        let x = zeros(&device, dt, &[tokens, hidden]);
        let xp = zeros(&device, dt, &[rows, hidden]);
        let out = zeros(&device, dt, &[tokens, hidden]);
        let shared = zeros(&device, dt, &[tokens, hidden]);
        let us = common::gpu_time_us(&device, 100, || moe::moe_gather(&x, &align, Some(&w), &xp));
        mem_rows.push(common::Row {
            name: format!("moe_gather bf16 {tokens}x{hidden} E{experts} k{k}"),
            us,
            bytes: (2 * slots * hidden * 2) as f64,
            flops: 0.0,
        });
        let us =
            common::gpu_time_us(&device, 100, || moe::moe_combine(&xp, &align, Some(&w), Some(&shared), None, &out));
        mem_rows.push(common::Row {
            name: format!("moe_combine bf16 {tokens}x{hidden} E{experts} k{k} +shared"),
            us,
            bytes: ((slots + 2 * tokens) * hidden * 2) as f64,
            flops: 0.0,
        });
    }

    // ---------------------------------------------------------------- grouped GEMM, prefill and decode
    for layer in [SCOUT, MAVERICK] {
        let (h, i, e) = (layer.hidden, layer.inter, layer.experts);
        let gate_up = zeros(&device, dt, &[e, h, 2 * i]);
        let down = zeros(&device, dt, &[e, i, h]);
        for tokens in [1usize, 2, 4, 8, 512, 4096] {
            let slots = tokens * layer.top_k;
            let id_vec = random_ids(tokens, e, layer.top_k, 3);
            let ids = Tensor::from_slice(&device, &id_vec, &[tokens, layer.top_k]).expect("upload");
            let bm = moe::preferred_block_m(slots, e);
            let mut align = MoeAlign::plan(&device, e, slots).expect("plan");
            align.align(&ids, bm).expect("align");
            let rows = moe::padded_rows(slots, e, bm).unwrap();
            let xp = zeros(&device, dt, &[rows, h]);
            let hbuf = zeros(&device, dt, &[rows, i]);
            let y = zeros(&device, dt, &[rows, h]);
            let groups = GemmGroups::Experts(&align);
            let us1 = common::gpu_time_us(&device, 20, || {
                moe::moe_grouped_gemm(&xp, layer.layout, ExpertWeights::SwiGluPacked(&gate_up), groups, &hbuf)
            });
            let us2 = common::gpu_time_us(&device, 20, || {
                moe::moe_grouped_gemm(&hbuf, layer.layout, ExpertWeights::Plain(&down), groups, &y)
            });
            let f1 = 2.0 * (slots * h * 2 * i) as f64;
            let f2 = 2.0 * (slots * i * h) as f64;
            if tokens >= 512 {
                flop_rows.push(common::Row {
                    name: format!("moe_gemm bf16 {tokens}t {} gate_up+swiglu", layer.name),
                    us: us1,
                    bytes: 0.0,
                    flops: f1,
                });
                flop_rows.push(common::Row {
                    name: format!("moe_gemm bf16 {tokens}t {} down", layer.name),
                    us: us2,
                    bytes: 0.0,
                    flops: f2,
                });
                if let (Some(c1), Some(c2)) = (cublas_us(&device, slots, 2 * i, h), cublas_us(&device, slots, h, i)) {
                    flop_rows.push(common::Row {
                        name: format!("cublas bf16 {slots}x{}x{h} (dense, same flops)", 2 * i),
                        us: c1,
                        bytes: 0.0,
                        flops: f1,
                    });
                    flop_rows.push(common::Row {
                        name: format!("cublas bf16 {slots}x{h}x{i} (dense, same flops)",),
                        us: c2,
                        bytes: 0.0,
                        flops: f2,
                    });
                    println!(
                        "{} {tokens} tokens: grouped GEMMs {:.1} us, cuBLAS dense {:.1} us: {:.0}% of cuBLAS throughput",
                        layer.name,
                        us1 + us2,
                        c1 + c2,
                        100.0 * (c1 + c2) / (us1 + us2)
                    );
                }
            } else {
                // Decode: the bytes of the experts chosen (their gate_up and down weights).
                let chosen: HashSet<i32> = id_vec.iter().copied().collect();
                let bytes = (chosen.len() * 3 * h * i * 2) as f64;
                mem_rows.push(common::Row {
                    name: format!("moe_gemm bf16 {tokens}t {} decode ({} experts)", layer.name, chosen.len()),
                    us: us1 + us2,
                    bytes,
                    flops: 0.0,
                });
            }
        }
    }

    // ---------------------------------------------------------------- the whole layer
    for layer in [SCOUT, MIXTRAL] {
        let (h, i, e) = (layer.hidden, layer.inter, layer.experts);
        let io = |out: usize, inp: usize| match layer.layout {
            WeightLayout::InOut => vec![e, inp, out],
            WeightLayout::OutIn => vec![e, out, inp],
        };
        // Random router weights: zero logits would send every token to expert 0.
        let mut rng = Rng::new(4);
        let router = Tensor::from_f64(&device, dt, &rng.normal_vec(e * h, 0.02, dt), &[e, h]).expect("upload");
        let weights = MoeFfnWeights {
            router,
            router_bias: None,
            layout: layer.layout,
            gate_up: GateUpTensors::Packed(zeros(&device, dt, &io(2 * i, h))),
            down: zeros(&device, dt, &io(h, i)),
            shared: (layer.shared > 0).then(|| SharedExpertTensors {
                gate: zeros(&device, dt, &[layer.shared, h]),
                up: zeros(&device, dt, &[layer.shared, h]),
                down: zeros(&device, dt, &[h, layer.shared]),
            }),
        };
        let config = MoeFfnConfig {
            hidden: h,
            intermediate: i,
            experts: e,
            top_k: layer.top_k,
            routing: layer.routing,
            weights_on_input: layer.weights_on_input,
        };
        let mut ffn = MoeFfn::plan(&device, config, weights, 4096).expect("plan");
        for tokens in [1usize, 8, 512, 4096] {
            let x = Tensor::from_f64(&device, dt, &rng.normal_vec(tokens * h, 1.0, dt), &[tokens, h]).expect("upload");
            let out = zeros(&device, dt, &[tokens, h]);
            let us = common::gpu_time_us(&device, 20, || ffn.forward(&x, None, &out));
            let shared_flops = 2.0 * (tokens * 3 * h * layer.shared) as f64;
            let flops = 2.0 * (tokens * layer.top_k * 3 * h * i) as f64 + shared_flops;
            flop_rows.push(common::Row {
                name: format!("moe_ffn bf16 {tokens}x{h} {}", layer.name),
                us,
                bytes: 0.0,
                flops,
            });
        }
    }

    common::print_memory_table("MoE memory-bound stages (CUDA events)", &mem_rows, copy_gbs);
    common::print_flops_table("MoE GEMMs and layers (CUDA events)", &flop_rows);
}
