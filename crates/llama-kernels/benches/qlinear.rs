//! Packed linear layers (`ops::qlinear`) on Llama 3 8B projection shapes, next to the dense bf16
//! product (`ops::linear`, cuBLAS) at the same shape: out x in = 4096 x 4096 (q and o
//! projections), 14336 x 4096 (gate, up), 4096 x 14336 (down) and 128256 x 4096 (the LM head),
//! at 1, 4, 16, 64 and 512 activation rows, for every format (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K,
//! NF4), bf16 activations and output.
//!
//! Up to [`MAX_GEMV_ROWS`] (16) rows run the GEMV, which streams the packed weight once; more run
//! the dequantize-and-GEMM path (bands of the weight dequantized to bf16, then cuBLAS). Bytes
//! counted per call: the packed planes (values, Q6_K's high bits, the block headers, row padding:
//! `QWeight::bytes`), the activations read and the output written; for the dense product the
//! bf16 weight instead of the planes. That is the least a product must move, so for the
//! dequantize-and-GEMM path (which also writes and reads the dense band) GB/s is effective, not
//! what the memory system carried. Printed: GPU time (CUDA events; working sets under the L2
//! size are timed cold, after an L2 flush), GB/s, its fraction of the device-to-device copy
//! bandwidth measured in the same run, TFLOP/s, and the speedup over cuBLAS bf16 at that shape.
//!
//! Weights are random: the packed planes are drawn directly (random value bytes; block headers
//! with scales of a trained layer's size, as `dev::verify::qlinear::random_packed` draws them),
//! in parallel, so that a 128256 x 4096 weight takes well under a second per format. Drawing one
//! value at a time as `random_packed` does took 0.03-0.09 s per 4096 x 4096 GGUF format and 1.0 s
//! for NF4 (normal values through `PackedWeight::quantize_nf4`) on a loaded 2-core machine, so
//! about 30 s for an NF4 LM head; the parallel draw took 0.004-0.025 s there
//! (`LLK_QLINEAR_TIME_GENERATORS=1` prints both, on a machine without a GPU).
//! The dense weight is the Q8_0 weight dequantized on the device. Every case's first output row
//! is checked on four weight rows against the host's dequantization (`PackedWeight::
//! dequantize_chunk`); a mismatch is printed and the bench exits non-zero after the tables.
//!
//! Without a GPU this prints the shapes and the bytes each case reads, and exits 0.

mod common;

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use llama_kernels::dev::testing::Rng;
use llama_kernels::ops::linear::linear;
use llama_kernels::ops::qlinear::{self, MAX_GEMV_ROWS, QScratch, QWeight, qlinear};
use llama_kernels::spec::quant::{NF4_CODE, PackedWeight, QuantFormat, QuantLayout};
use llama_kernels::{DType, Result, Tensor};

/// (name, out, in).
const SHAPES: [(&str, usize, usize); 4] =
    [("q_o_proj", 4096, 4096), ("gate_up_proj", 14336, 4096), ("down_proj", 4096, 14336), ("lm_head", 128256, 4096)];
const BATCHES: [usize; 5] = [1, 4, 16, 64, 512];

fn case_name(kind: &str, batch: usize, (label, out, inp): (&str, usize, usize)) -> String {
    format!("{kind} bf16 b{batch} {out}x{inp} {label}")
}

fn layout(format: QuantFormat, rows: usize, cols: usize) -> QuantLayout {
    QuantLayout::new(format, format.default_block(), rows, cols).expect("layout")
}

fn io_bytes(batch: usize, out: usize, inp: usize) -> usize {
    2 * batch * (out + inp)
}

/// One block header of `format` with scales of a trained layer's size (`scale` is about
/// 1/(16 sqrt(in))), as `random_packed` draws them.
fn header(format: QuantFormat, rng: &mut Rng, scale: f64, h: &mut [u8]) {
    let f16 = |rng: &mut Rng, s: f64| half::f16::from_f64((rng.uniform() * 0.9 + 0.1) * s).to_le_bytes();
    match format {
        QuantFormat::Q8_0 => h.copy_from_slice(&f16(rng, scale / 8.0)),
        QuantFormat::Q4_0 => h.copy_from_slice(&f16(rng, scale)),
        QuantFormat::Q5_0 => h.copy_from_slice(&f16(rng, scale / 2.0)),
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
            let s = if format == QuantFormat::Q4_1 { scale } else { scale / 2.0 };
            h[..2].copy_from_slice(&f16(rng, s));
            h[2..4].copy_from_slice(&(-half::f16::from_f64(8.0 * scale * rng.uniform())).to_le_bytes());
        }
        QuantFormat::Q4_K | QuantFormat::Q5_K => {
            let s = if format == QuantFormat::Q4_K { scale } else { scale / 2.0 };
            h[..2].copy_from_slice(&f16(rng, s / 32.0));
            h[2..4].copy_from_slice(&f16(rng, scale / 4.0));
            common::random_bytes(rng, &mut h[4..16]);
        }
        QuantFormat::Q6_K => {
            common::random_bytes(rng, &mut h[..16]);
            h[16..18].copy_from_slice(&f16(rng, scale / 256.0));
        }
        // The absmax of 64 normal values of standard deviation 1/sqrt(in): about 2.5/sqrt(in).
        QuantFormat::NF4 => h.copy_from_slice(&(((rng.uniform() * 0.5 + 0.75) * 40.0 * scale) as f32).to_le_bytes()),
    }
}

/// A random `[rows, cols]` weight of `format`, its planes drawn directly and in parallel.
fn fast_packed(format: QuantFormat, rows: usize, cols: usize, seed: u64) -> PackedWeight {
    let layout = layout(format, rows, cols);
    let mut bytes = vec![0u8; layout.total_bytes()];
    let (values, meta) = bytes.split_at_mut(layout.planes()[2]);
    common::par_fill(values, 1, seed, common::random_bytes);
    let (row_bytes, blocks, mb) = (layout.meta_row_bytes(), cols / layout.block(), format.meta_bytes());
    let scale = 1.0 / (16.0 * (cols as f64).sqrt());
    common::par_fill(meta, row_bytes, seed ^ 0x3e7a, |rng, rows| {
        for row in rows.chunks_exact_mut(row_bytes) {
            for b in 0..blocks {
                header(format, rng, scale, &mut row[b * mb..][..mb]);
            }
        }
    });
    PackedWeight::new(layout, bytes, NF4_CODE).expect("the bytes fit the layout")
}

/// Output row 0 against the host: weight rows `rows` of `w` (dequantized on the host, rounded to
/// bf16 when `rounded`, as the dequantize-and-GEMM path and the dense weight are) times `x0`.
fn check(w: &PackedWeight, x0: &[f64], y0: &[f64], rounded: bool) -> std::result::Result<(), String> {
    let l = w.layout();
    for r in [0, 1, l.rows() / 2, l.rows() - 1] {
        let (mut dot, mut abs) = (0.0f64, 0.0f64);
        for c in 0..l.cols() / 32 {
            for (i, v) in w.dequantize_chunk(r, c).iter().enumerate() {
                let v = if rounded { f64::from(half::bf16::from_f32(*v).to_f32()) } else { f64::from(*v) };
                dot += v * x0[c * 32 + i];
                abs += (v * x0[c * 32 + i]).abs();
            }
        }
        let tol = 0.01 * dot.abs() + 2e-4 * abs + 1e-6;
        let err = (y0[r] - dot).abs();
        if err.is_nan() || err > tol {
            return Err(format!("row {r}: got {}, expected {dot} (tolerance {tol:.3e})", y0[r]));
        }
    }
    Ok(())
}

struct Measured {
    name: String,
    shape: (&'static str, usize, usize),
    batch: usize,
    format: Option<QuantFormat>,
    us: f64,
    bytes: f64,
}

fn no_gpu() {
    println!("\nBytes each case reads (packed planes or bf16 weight, plus activations and output), at batch 1:");
    for shape @ (_, out, inp) in SHAPES {
        println!(
            "{:<52} {:>12} bytes (16.00 bits/weight)",
            case_name("linear", 1, shape),
            2 * out * inp + io_bytes(1, out, inp)
        );
        for format in QuantFormat::ALL {
            let l = layout(format, out, inp);
            println!(
                "{:<52} {:>12} bytes ({:.2} bits/weight)",
                case_name(&format!("qlinear-{format}"), 1, shape),
                l.total_bytes() + io_bytes(1, out, inp),
                l.bits_per_weight()
            );
        }
    }
    println!("batches {BATCHES:?}: the GEMV up to {MAX_GEMV_ROWS} rows, dequantize + cuBLAS above");
    if std::env::var_os("LLK_QLINEAR_TIME_GENERATORS").is_some() {
        time_generators();
    }
}

/// The weight generators on one 4096 x 4096 weight per format: one value at a time as
/// `dev::verify::qlinear::random_packed` draws them (GGUF blocks byte by byte, then
/// `PackedWeight::from_gguf_blocks`; NF4 normal values through `PackedWeight::quantize_nf4`),
/// against [`fast_packed`].
fn time_generators() {
    let (rows, cols) = (4096, 4096);
    println!(
        "
Generators on {rows}x{cols} (the LM head is {:.0}x larger):",
        128256.0 / rows as f64
    );
    for format in QuantFormat::ALL {
        let mut rng = Rng::new(1);
        let t0 = Instant::now();
        let slow = if format == QuantFormat::NF4 {
            let data: Vec<f32> =
                rng.normal_vec(rows * cols, 1.0 / 64.0, DType::F32).iter().map(|&v| v as f32).collect();
            PackedWeight::quantize_nf4(rows, cols, 64, &data)
        } else {
            let block_bytes = format.gguf_block_bytes().unwrap_or(0);
            let raw: Vec<u8> =
                (0..rows * cols / format.default_block() * block_bytes).map(|_| rng.below(256) as u8).collect();
            PackedWeight::from_gguf_blocks(format, rows, cols, &raw)
        };
        let slow_s = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let fast = fast_packed(format, rows, cols, 1);
        let fast_s = t0.elapsed().as_secs_f64();
        assert_eq!(slow.map(|w| *w.layout()).ok(), Some(*fast.layout()));
        println!("  {format}: one value at a time {slow_s:.2} s, fast_packed {fast_s:.3} s");
    }
}

fn main() {
    let Some(device) = common::gpu_or_explain("qlinear bench") else {
        no_gpu();
        return;
    };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    // 140 cases: shorter criterion runs than the other benches (the summary table below is
    // timed separately, with CUDA events).
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(300))
        .sample_size(10)
        .configure_from_args();
    let mut group = c.benchmark_group("qlinear");
    let mut rows: Vec<Measured> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let max_batch = *BATCHES.iter().max().expect("batches");
    for (si, shape) in SHAPES.into_iter().enumerate() {
        let (_, out, inp) = shape;
        let mut rng = Rng::new(0x9_11ea ^ si as u64);
        let x_all = Tensor::from_f64(
            &device,
            DType::BF16,
            &rng.normal_vec(max_batch * inp, 1.0, DType::BF16),
            &[max_batch, inp],
        )
        .expect("x");
        let y_all = Tensor::zeros(&device, DType::BF16, &[max_batch, out]).expect("y");
        let x0 = x_all.narrow(0, 0, 1).and_then(|t| t.to_f64_vec()).expect("x row 0");
        for (fi, format) in QuantFormat::ALL.into_iter().enumerate() {
            let t0 = Instant::now();
            let packed = fast_packed(format, out, inp, 0xbe_0c ^ (si * 16 + fi) as u64);
            let gen_s = t0.elapsed().as_secs_f64();
            let w = QWeight::new(&device, &packed).expect("upload");
            let scratch = QScratch::new(&device, DType::BF16, &[&w]).expect("scratch");
            device.synchronize().expect("sync");
            println!(
                "{out}x{inp} {format}: {:.1} MB packed ({:.2} bits/weight), drawn in {gen_s:.2} s, uploaded in {:.2} s",
                w.bytes() as f64 / 1e6,
                w.layout().bits_per_weight(),
                t0.elapsed().as_secs_f64() - gen_s
            );
            if fi == 0 {
                // The dense bf16 weight: the first (Q8_0) weight dequantized on the device.
                let d = qlinear::dequantize(&w, DType::BF16).expect("dense weight");
                for &batch in &BATCHES {
                    let (x, y) = (x_all.narrow(0, 0, batch).expect("x"), y_all.narrow(0, 0, batch).expect("y"));
                    let mut run = || linear(&x, &d, None, &y);
                    let bytes = (2 * out * inp + io_bytes(batch, out, inp)) as f64;
                    let name = case_name("linear", batch, shape);
                    group.throughput(Throughput::Bytes(bytes as u64));
                    group.bench_function(BenchmarkId::from_parameter(&name), |b| {
                        b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
                    });
                    let us = common::summary_time_us(&device, 20, bytes, &mut run);
                    let y0 = y.narrow(0, 0, 1).and_then(|t| t.to_f64_vec()).expect("y row 0");
                    if let Err(e) = check(&packed, &x0, &y0, true) {
                        failures.push(format!("{name}: {e}"));
                    }
                    rows.push(Measured { name, shape, batch, format: None, us, bytes });
                }
            }
            for &batch in &BATCHES {
                let (x, y) = (x_all.narrow(0, 0, batch).expect("x"), y_all.narrow(0, 0, batch).expect("y"));
                let mut run = || -> Result<()> { qlinear(&x, &w, &y, Some(&scratch)) };
                let bytes = (w.bytes() + io_bytes(batch, out, inp)) as f64;
                let name = case_name(&format!("qlinear-{format}"), batch, shape);
                group.throughput(Throughput::Bytes(bytes as u64));
                group.bench_function(BenchmarkId::from_parameter(&name), |b| {
                    b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
                });
                let us = common::summary_time_us(&device, 20, bytes, &mut run);
                let y0 = y.narrow(0, 0, 1).and_then(|t| t.to_f64_vec()).expect("y row 0");
                if let Err(e) = check(&packed, &x0, &y0, batch > MAX_GEMV_ROWS) {
                    failures.push(format!("{name}: {e}"));
                }
                rows.push(Measured { name, shape, batch, format: Some(format), us, bytes });
            }
        }
    }
    group.finish();

    println!(
        "\nqlinear summary (CUDA events; bytes = packed planes or bf16 weight + activations + output; \
         vs bf16 = cuBLAS bf16 time / this time; GEMV up to {MAX_GEMV_ROWS} rows, dequantize + cuBLAS above)"
    );
    println!(
        "{:<48} {:>10} {:>12} {:>9} {:>7} {:>8} {:>8}",
        "case", "time us", "bytes", "GB/s", "% copy", "TFLOP/s", "vs bf16"
    );
    for shape in SHAPES {
        for &batch in &BATCHES {
            let dense_us =
                rows.iter().find(|r| r.shape == shape && r.batch == batch && r.format.is_none()).map(|r| r.us);
            for r in rows.iter().filter(|r| r.shape == shape && r.batch == batch) {
                let gbs = r.bytes / (r.us * 1e-6) / 1e9;
                let flops = 2.0 * (batch * shape.1 * shape.2) as f64;
                let speedup = dense_us.map_or(String::from("-"), |d| format!("{:.2}x", d / r.us));
                println!(
                    "{:<48} {:>10.2} {:>12.0} {:>9.0} {:>6.1}% {:>8.1} {:>8}",
                    r.name,
                    r.us,
                    r.bytes,
                    gbs,
                    100.0 * gbs / copy_gbs,
                    flops / (r.us * 1e-6) / 1e12,
                    speedup
                );
            }
        }
    }
    println!("\nBest format per shape and batch (speedup over cuBLAS bf16)");
    for shape in SHAPES {
        let line: Vec<String> = BATCHES
            .iter()
            .filter_map(|&batch| {
                let dense = rows.iter().find(|r| r.shape == shape && r.batch == batch && r.format.is_none())?;
                let best = rows
                    .iter()
                    .filter(|r| r.shape == shape && r.batch == batch && r.format.is_some())
                    .min_by(|a, b| a.us.total_cmp(&b.us))?;
                Some(format!("b{batch} {} {:.2}x", best.format.map_or("-", QuantFormat::name), dense.us / best.us))
            })
            .collect();
        println!("{:<20} {}", format!("{}x{} {}", shape.1, shape.2, shape.0), line.join(", "));
    }
    if failures.is_empty() {
        println!("\ncheck: every case's output row 0 matches the host on 4 weight rows");
    } else {
        println!("\ncheck FAILED in {} cases:", failures.len());
        for f in &failures {
            println!("  {f}");
        }
        std::process::exit(1);
    }
}
