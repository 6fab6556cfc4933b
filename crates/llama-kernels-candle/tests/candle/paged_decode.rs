use candle::{DType, Device, Tensor};
use llama_kernels_candle::llama_kernels::DType as KDType;
use llama_kernels_candle::{
    AttentionMask, AttentionOptions, KvScales, PagedDecodeOptions, PagedKvCache, PagedKvConfig, unfused,
};

use crate::common::{check, rand};

#[test]
fn decode_over_appended_pages_matches_candle_unfused_attention() {
    let (kv_heads, q_heads, d, page_size) = (2, 4, 64, 16);
    for (dtype, kdtype, tol) in [(DType::BF16, KDType::BF16, 1.2e-2), (DType::F32, KDType::F32, 2e-6)] {
        let config = PagedKvConfig {
            num_pages: 8,
            page_size,
            kv_heads,
            head_dim: d,
            dtype: kdtype,
            scales: KvScales::default(),
        };
        let cache = PagedKvCache::new(&Device::Cpu, &config).unwrap();
        // Two sequences of 21 and 7 keys, on pages [5, 2] and [7].
        let lens = [21usize, 7];
        let tables: [&[i64]; 2] = [&[5, 2], &[7]];
        let mut keys = Vec::new();
        for (s, (&len, pages)) in lens.iter().zip(tables).enumerate() {
            let k = rand(10 + s as u64, &[len, kv_heads, d], dtype, 1.0);
            let v = rand(20 + s as u64, &[len, kv_heads, d], dtype, 1.0);
            let slots: Vec<i64> =
                (0..len).map(|j| pages[j / page_size] * page_size as i64 + (j % page_size) as i64).collect();
            cache.append(&k, &v, &Tensor::new(slots.as_slice(), &Device::Cpu).unwrap()).unwrap();
            keys.push((k, v));
        }
        cache.check_errors().unwrap();
        let q = rand(30, &[2, q_heads, d], dtype, 1.0); // one new query per sequence
        let block_table = Tensor::new(&[[5i32, 2], [7, 0]], &Device::Cpu).unwrap();
        let seq_lens = Tensor::new(&[21i32, 7], &Device::Cpu).unwrap();
        let out = cache.decode(&q, &block_table, &seq_lens, &PagedDecodeOptions::default()).unwrap();
        for (s, (k, v)) in keys.iter().enumerate() {
            let f64_of = |t: &Tensor| t.to_dtype(DType::F64).unwrap().unsqueeze(0).unwrap();
            let qs = q.narrow(0, s, 1).unwrap();
            let causal = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
            let want = unfused::attention(&f64_of(&qs), &f64_of(k), &f64_of(v), &causal).unwrap();
            check(
                &format!("paged decode {dtype:?} sequence {s}"),
                &out.narrow(0, s, 1).unwrap(),
                &want.squeeze(0).unwrap(),
                tol,
            );
        }
        // A slot outside the pools is reported, not written.
        let k = rand(40, &[1, kv_heads, d], dtype, 1.0);
        cache.append(&k, &k, &Tensor::new(&[10_000i64], &Device::Cpu).unwrap()).unwrap();
        assert!(cache.check_errors().unwrap_err().to_string().contains("kv_append"));
        let bad_table = Tensor::new(&[[5i32, 99], [7, 0]], &Device::Cpu).unwrap();
        assert!(cache.decode(&q, &bad_table, &seq_lens, &Default::default()).is_err());
    }
}
