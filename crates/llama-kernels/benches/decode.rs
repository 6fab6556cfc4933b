//! Paged decode attention and kv_append on Llama 3 shapes: 8B (32 q / 8 kv heads x 128) and
//! 70B (64 / 8) at batch 1 x 128k, 16 x 8k, 64 x 4k and 256 x 1k keys per sequence, bf16 and
//! fp8 pages (page size 16, pages in random order), q_len 1; append of a 4096-token prefill
//! chunk and of one decode step (256 tokens) into bf16 and fp8 pages.
//!
//! GPU time from CUDA events. Bytes counted for decode: the K and V of every sequence (what the
//! kernel must read at least), plus q, out and the split partials; the K/V bytes per second are
//! printed as a fraction of the device-to-device copy bandwidth measured in the same run
//! (targets: >= 85% at every point for bf16; fp8 >= 1.7x the bf16 throughput). Append: bytes
//! read (k, v) plus written (pages). Without a GPU this prints the shapes and the bytes each
//! kernel must move, and exits 0.

mod common;

use criterion::{BenchmarkId, Throughput};
use llama_kernels::dev::testing::Rng;
use llama_kernels::ops::attention::DecodeTensors;
use llama_kernels::ops::attention::{
    DecodeShape, KvScales, PagedDecodeOptions, PagedDecodeWorkspace, PagedKvCache, PagedKvConfig,
};
use llama_kernels::{DType, Tensor};

const PAGE: usize = 16;
const D: usize = 128;
const KV_HEADS: usize = 8;

struct Decode {
    name: String,
    batch: usize,
    seq: usize,
    q_heads: usize,
    page_dtype: DType,
}

impl Decode {
    /// Bytes of K and V the kernel must read.
    fn kv_bytes(&self) -> f64 {
        (2 * self.batch * self.seq * KV_HEADS * D * self.page_dtype.size()) as f64
    }
    /// Everything else: q in, out written (bf16).
    fn other_bytes(&self) -> f64 {
        (2 * self.batch * self.q_heads * D * 2) as f64
    }
}

struct Append {
    name: String,
    tokens: usize,
    page_dtype: DType,
}

impl Append {
    fn bytes(&self) -> f64 {
        let elems = (2 * self.tokens * KV_HEADS * D) as f64;
        elems * 2.0 + elems * self.page_dtype.size() as f64 + (self.tokens * 8) as f64
    }
}

fn decode_shapes() -> Vec<Decode> {
    let mut v = Vec::new();
    for (model, q_heads) in [("32/8x128", 32), ("64/8x128", 64)] {
        for (batch, seq) in [(1, 131072), (16, 8192), (64, 4096), (256, 1024)] {
            for page_dtype in [DType::BF16, DType::F8E4M3] {
                let fp8 = if page_dtype == DType::F8E4M3 { " fp8" } else { "" };
                v.push(Decode {
                    name: format!("paged_decode bf16 b{batch}xs{seq} {model}{fp8}"),
                    batch,
                    seq,
                    q_heads,
                    page_dtype,
                });
            }
        }
    }
    v
}

fn append_shapes() -> Vec<Append> {
    let mut v = Vec::new();
    for tokens in [256, 4096] {
        for page_dtype in [DType::BF16, DType::F8E4M3] {
            let fp8 = if page_dtype == DType::F8E4M3 { " fp8" } else { "" };
            v.push(Append { name: format!("kv_append bf16 t{tokens} 8x128{fp8}"), tokens, page_dtype });
        }
    }
    v
}

fn config(num_pages: usize, page_dtype: DType) -> PagedKvConfig {
    let scales = if page_dtype == DType::F8E4M3 { KvScales::per_tensor(0.05, 0.05) } else { KvScales::default() };
    PagedKvConfig { num_pages, page_size: PAGE, kv_heads: KV_HEADS, head_dim: D, dtype: page_dtype, scales }
}

fn main() {
    let Some(device) = common::gpu_or_explain("decode bench") else {
        println!("\nBytes each kernel must move (K/V read for decode; read + written for append):");
        for s in decode_shapes() {
            println!("{:<48} {:>14.0} bytes of K/V (+{:.0} q/out)", s.name, s.kv_bytes(), s.other_bytes());
        }
        for s in append_shapes() {
            println!("{:<48} {:>14.0} bytes", s.name, s.bytes());
        }
        return;
    };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let mut c = common::criterion();
    let mut group = c.benchmark_group("decode");
    let mut rows = Vec::new();
    let mut kv_rows = Vec::new();
    let mut rng = Rng::new(8);
    for s in decode_shapes() {
        let pages_per_seq = s.seq.div_ceil(PAGE);
        let num_pages = s.batch * pages_per_seq;
        let cache = PagedKvCache::new(&device, &config(num_pages, s.page_dtype)).expect("cache");
        // Pages in random order, as a long-running server's pool ends up.
        let mut ids: Vec<i32> = (0..num_pages as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let table = Tensor::from_slice(&device, &ids, &[s.batch, pages_per_seq]).expect("table");
        let lens = Tensor::from_slice(&device, &vec![s.seq as i32; s.batch], &[s.batch]).expect("lens");
        let q = Tensor::zeros(&device, DType::BF16, &[s.batch, s.q_heads, D]).expect("q");
        let out = Tensor::zeros(&device, DType::BF16, &[s.batch, s.q_heads, D]).expect("out");
        let shape = DecodeShape {
            batch: s.batch,
            q_len: 1,
            q_heads: s.q_heads,
            kv_heads: KV_HEADS,
            head_dim: D,
            max_seq_len: s.seq,
            dtype: DType::BF16,
            page_dtype: s.page_dtype,
        };
        let mut ws = PagedDecodeWorkspace::plan(&device, &shape).expect("plan");
        let splits = ws.num_splits();
        let partial = if splits > 1 { (splits * s.batch * s.q_heads * (D + 1) * 4 * 2) as f64 } else { 0.0 };
        let opts = PagedDecodeOptions::default();
        let mut run = || {
            ws.forward(
                DecodeTensors { q: &q, cache: &cache, block_table: &table, seq_lens: &lens, out: &out, lse: None },
                &opts,
            )
        };
        let bytes = s.kv_bytes() + s.other_bytes() + partial;
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(BenchmarkId::from_parameter(&s.name), |b| {
            b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
        });
        let us = common::gpu_time_us(&device, 20, &mut run);
        println!("{}: {splits} splits", s.name);
        kv_rows.push((s.name.clone(), us, s.kv_bytes(), s.page_dtype));
        rows.push(common::Row { name: s.name.clone(), us, bytes, flops: 0.0 });
    }
    for s in append_shapes() {
        let num_pages = s.tokens.div_ceil(PAGE) + 1;
        let cache = PagedKvCache::new(&device, &config(num_pages, s.page_dtype)).expect("cache");
        let k = Tensor::zeros(&device, DType::BF16, &[s.tokens, KV_HEADS, D]).expect("k");
        let v = Tensor::zeros(&device, DType::BF16, &[s.tokens, KV_HEADS, D]).expect("v");
        let slots: Vec<i64> = (0..s.tokens as i64).collect();
        let slots = Tensor::from_slice(&device, &slots, &[s.tokens]).expect("slots");
        let mut run = || cache.append(&k, &v, &slots);
        group.throughput(Throughput::Bytes(s.bytes() as u64));
        group.bench_function(BenchmarkId::from_parameter(&s.name), |b| {
            b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
        });
        let us = common::gpu_time_us(&device, 50, &mut run);
        rows.push(common::Row { name: s.name.clone(), us, bytes: s.bytes(), flops: 0.0 });
    }
    group.finish();
    common::print_memory_table(
        "Decode and append summary (CUDA events; bytes = K/V + q/out + partials, append: read + written)",
        &rows,
        copy_gbs,
    );
    println!(
        "\nK/V bytes read per second as a fraction of copy bandwidth ({copy_gbs:.0} GB/s), and fp8 vs bf16 throughput"
    );
    println!("{:<48} {:>10} {:>9} {:>8} {:>10}", "case", "time us", "KV GB/s", "% copy", "fp8/bf16");
    for (i, (name, us, kv, dtype)) in kv_rows.iter().enumerate() {
        let gbs = kv / (us * 1e-6) / 1e9;
        // Throughput ratio at the same context: bf16 time / fp8 time (the bf16 row precedes).
        let ratio =
            if *dtype == DType::F8E4M3 && i > 0 { format!("{:.2}x", kv_rows[i - 1].1 / us) } else { String::new() };
        println!("{name:<48} {us:>10.2} {gbs:>9.0} {:>7.1}% {ratio:>10}", 100.0 * gbs / copy_gbs);
    }
}
