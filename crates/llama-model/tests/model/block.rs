//! The block composer: configs (flat, nested, both rope forms, named errors), checkpoints (one
//! file, sharded, partial directories, named errors), layers against the f64 reference composer
//! stage by stage (prefill, chunked prefill, decode), planned steps that allocate nothing and
//! never wait, schedule independence, the paged cache (a shared pool, page reuse, exhaustion and
//! stale steps by name), and MoE workspace errors.

use crate::common;

use std::path::PathBuf;

use llama_kernels::ops::attention::AttentionMask;
use llama_kernels::ops::rope::RopeLayout;
use llama_kernels::{DType, Device, Error as KernelError, Tensor};
use llama_model::Checkpoint;
use llama_model::Error;
use llama_model::block::{DecoderLayer, HostLayerWeights, HostTensor, KvCache, KvCacheConfig, LayerWorkspace};
use llama_model::dev::verify::block::{LLAMA3_SMALL, LLAMA4_SMALL, check_layer, schedule};
use llama_model::formats::checkpoint::write_safetensors;
use llama_model::formats::config::{FfnSpec, ModelConfig};

fn config_err(json: &str) -> (String, String) {
    match ModelConfig::from_json(json) {
        Err(Error::Config { field, why }) => (field, why),
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn llama_config_flat_with_older_rope_keys() {
    let c = ModelConfig::from_json(LLAMA3_SMALL).unwrap();
    let s = c.layer(0).unwrap();
    assert_eq!((s.hidden, s.q_heads, s.kv_heads, s.head_dim), (256, 4, 2, 64));
    let rope = s.rope.unwrap();
    assert_eq!(rope.layout, RopeLayout::HalfSplit);
    assert_eq!(rope.theta, 500_000.0);
    assert_eq!(rope.scaling.unwrap().factor, 8.0);
    assert_eq!(s.mask, AttentionMask::Causal);
    assert_eq!(s.ffn, FfnSpec::Dense { intermediate: 512, bias: false });
}

#[test]
fn llama_config_with_newer_rope_parameters() {
    let json = r#"{"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8,
        "intermediate_size": 1024, "num_hidden_layers": 2,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;
    let s = ModelConfig::from_json(json).unwrap().layer(1).unwrap();
    assert_eq!((s.kv_heads, s.head_dim), (8, 64)); // Hugging Face defaults
    let rope = s.rope.unwrap();
    assert_eq!(rope.theta, 500_000.0);
    assert_eq!(rope.scaling.unwrap().factor, 32.0);
    assert!((s.rms_norm_eps - 1e-6).abs() < 1e-12);
}

#[test]
fn llama4_config_nested_with_per_layer_kinds() {
    let c = ModelConfig::from_json(LLAMA4_SMALL).unwrap();
    let l: Vec<_> = (0..4).map(|i| c.layer(i).unwrap()).collect();
    assert_eq!(l[0].rope.unwrap().layout, RopeLayout::Interleaved);
    assert!(l[0].rope.unwrap().qk_norm_eps.is_some());
    assert_eq!(l[0].mask, AttentionMask::ChunkedCausal { chunk_size: 16 });
    assert!(l[0].temperature.is_none());
    assert_eq!(l[0].ffn, FfnSpec::Dense { intermediate: 512, bias: false });
    assert_eq!(l[1].ffn, FfnSpec::Moe { experts: 4, top_k: 1, intermediate: 256 });
    assert!(l[2].rope.is_none() && l[2].temperature.is_some());
    assert_eq!(l[2].mask, AttentionMask::Causal);
    assert!(l[3].is_moe() && l[3].rope.is_none());
}

#[test]
fn llama4_config_defaults_follow_transformers() {
    // No no_rope_layers: every 4th layer is NoPE; no moe_layers: every layer with step 1.
    let json = r#"{"model_type": "llama4_text", "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 128, "num_hidden_layers": 8,
        "attention_chunk_size": 8192, "rope_scaling": null}"#;
    let c = ModelConfig::from_json(json).unwrap();
    let nope: Vec<usize> = (0..8).filter(|&i| c.layer(i).unwrap().rope.is_none()).collect();
    assert_eq!(nope, vec![3, 7]);
    assert!((0..8).all(|i| c.layer(i).unwrap().is_moe()));
    let l0 = c.layer(0).unwrap();
    assert_eq!(l0.ffn, FfnSpec::Moe { experts: 16, top_k: 1, intermediate: 128 });
    assert_eq!(l0.rope.unwrap().theta, 500_000.0);
    assert!(l0.rope.unwrap().scaling.is_none());
}

#[test]
fn config_errors_name_the_field() {
    let (f, _) = config_err(
        r#"{"model_type": "llama", "num_attention_heads": 4, "intermediate_size": 8, "num_hidden_layers": 1}"#,
    );
    assert_eq!(f, "hidden_size");
    let (f, _) =
        config_err(r#"{"model_type": "llama4", "text_config": {"model_type": "llama4_text", "hidden_size": "big"}}"#);
    assert_eq!(f, "text_config.hidden_size");
    let (f, why) = config_err(
        r#"{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 8,
            "num_hidden_layers": 1, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#,
    );
    assert_eq!((f.as_str(), why.contains("yarn")), ("rope_scaling.rope_type", true));
    let (f, _) = config_err(
        r#"{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 6, "num_key_value_heads": 4,
            "intermediate_size": 8, "num_hidden_layers": 1}"#,
    );
    assert_eq!(f, "num_key_value_heads");
    let (f, why) = config_err(
        r#"{"model_type": "llama", "hidden_size": 640, "num_attention_heads": 8, "intermediate_size": 8, "num_hidden_layers": 1}"#,
    );
    assert_eq!(f, "head_dim", "{why}");
    let (f, _) = config_err(r#"{"model_type": "gpt2"}"#);
    assert_eq!(f, "model_type");
    let (f, _) = config_err(r#"{"hidden_size": 4}"#);
    assert_eq!(f, "model_type");
    let (f, _) = config_err(
        r#"{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 8,
            "num_hidden_layers": 1, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}"#,
    );
    assert_eq!(f, "rope_scaling.low_freq_factor");
    let (f, _) = config_err(
        r#"{"model_type": "llama4_text", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64,
            "intermediate_size": 8, "num_hidden_layers": 2, "no_rope_layers": [1, 1, 0]}"#,
    );
    assert_eq!(f, "no_rope_layers");
    assert!(matches!(ModelConfig::from_json(LLAMA3_SMALL).unwrap().layer(3), Err(Error::Config { .. })));
}

/// A fresh directory under the system temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a checkpoint of the built-in Llama 4 config's layers `layers`, one shard per layer,
/// under the multimodal `language_model.` prefix; returns the weights.
fn write_llama4(dir: &std::path::Path, layers: &[usize], with_index: bool) -> Vec<HostLayerWeights> {
    std::fs::write(dir.join("config.json"), LLAMA4_SMALL).unwrap();
    let cfg = ModelConfig::from_json(LLAMA4_SMALL).unwrap();
    let mut map = serde_json::Map::new();
    let mut out = Vec::new();
    for &i in layers {
        let spec = cfg.layer(i).unwrap();
        let w = HostLayerWeights::random(&spec, DType::BF16, 3);
        let named: Vec<(String, &HostTensor)> =
            w.named(&spec).into_iter().map(|(n, t)| (format!("language_model.model.layers.{i}.{n}"), t)).collect();
        let file = format!("model-{:05}-of-00004.safetensors", i + 1);
        write_safetensors(&dir.join(&file), &named, DType::BF16).unwrap();
        for (n, _) in &named {
            map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
        out.push(w);
    }
    if with_index {
        let index = serde_json::json!({ "metadata": {}, "weight_map": map });
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
    out
}

#[test]
fn sharded_checkpoint_loads_by_hugging_face_names() {
    let dir = temp_dir("sharded");
    let written = write_llama4(&dir, &[0, 1, 2, 3], true);
    let ckpt = Checkpoint::open(&dir).unwrap();
    for (i, written) in written.iter().enumerate() {
        let (spec, w) = ckpt.layer(i, DType::BF16).unwrap();
        assert_eq!(spec.index, i);
        assert_eq!(&w, written, "layer {i} round trip");
    }
    // Converted once to another dtype: every value rounded to f16.
    let (_, w16) = ckpt.layer(0, DType::F16).unwrap();
    assert!(w16.q_proj.data.iter().all(|&v| half::f16::from_f32(v).to_f32() == v));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_with_only_some_layers_works_for_those() {
    // Shards of layers 1 and 3 are absent although the index lists them.
    let dir = temp_dir("partial");
    write_llama4(&dir, &[0, 1, 2, 3], true);
    std::fs::remove_file(dir.join("model-00002-of-00004.safetensors")).unwrap();
    std::fs::remove_file(dir.join("model-00004-of-00004.safetensors")).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert!(ckpt.layer(0, DType::BF16).is_ok());
    assert!(ckpt.layer(2, DType::BF16).is_ok());
    match ckpt.layer(1, DType::BF16) {
        Err(Error::Checkpoint { tensor, why }) => {
            assert!(tensor.starts_with("language_model.model.layers.1."), "{tensor}");
            assert!(why.contains("model-00002-of-00004.safetensors"), "{why}");
        }
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
    // Without an index: only the files present are scanned.
    let dir2 = temp_dir("partial-noindex");
    write_llama4(&dir2, &[2], false);
    let ckpt = Checkpoint::open(&dir2).unwrap();
    assert!(ckpt.layer(2, DType::BF16).is_ok());
    assert!(matches!(ckpt.layer(0, DType::BF16), Err(Error::Checkpoint { .. })));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

#[test]
fn checkpoint_errors_name_the_tensor() {
    let dir = temp_dir("bad");
    std::fs::write(dir.join("config.json"), LLAMA3_SMALL).unwrap();
    let spec = ModelConfig::from_json(LLAMA3_SMALL).unwrap().layer(0).unwrap();
    let w = HostLayerWeights::random(&spec, DType::F32, 1);
    let mut named: Vec<(String, HostTensor)> =
        w.named(&spec).into_iter().map(|(n, t)| (format!("model.layers.0.{n}"), t.clone())).collect();
    let write = |named: &[(String, HostTensor)]| {
        let refs: Vec<(String, &HostTensor)> = named.iter().map(|(n, t)| (n.clone(), t)).collect();
        write_safetensors(&dir.join("model.safetensors"), &refs, DType::F32).unwrap();
    };
    // A missing tensor.
    let saved = named.remove(3);
    write(&named);
    match Checkpoint::open(&dir).unwrap().layer(0, DType::BF16) {
        Err(Error::Checkpoint { tensor, .. }) => assert_eq!(tensor, saved.0),
        other => panic!("{other:?}"),
    }
    // A shape that disagrees with the config.
    named.insert(3, (saved.0.clone(), HostTensor::new(&[3], vec![0.0; 3]).unwrap()));
    write(&named);
    match Checkpoint::open(&dir).unwrap().layer(0, DType::BF16) {
        Err(Error::Checkpoint { tensor, why }) => {
            assert_eq!(tensor, saved.0);
            assert!(why.contains("shape"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // A dtype that cannot be converted (I32 bytes).
    named[3] = saved;
    write(&named);
    {
        let bytes = vec![0u8; 256 * 4];
        let v = safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![256], &bytes).unwrap();
        let file = safetensors::tensor::serialize(vec![("model.layers.0.input_layernorm.weight".to_string(), v)], None)
            .unwrap();
        std::fs::write(dir.join("model.safetensors"), file).unwrap();
    }
    match Checkpoint::open(&dir).unwrap().layer(0, DType::BF16) {
        Err(Error::Checkpoint { tensor, why }) => {
            assert_eq!(tensor, "model.layers.0.input_layernorm.weight");
            assert!(why.contains("I32"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // No layer tensors under any known prefix.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    write_safetensors(&dir.join("other.safetensors"), &[("lm_head.weight".to_string(), &w.input_norm)], DType::F32)
        .unwrap();
    match Checkpoint::open(&dir).unwrap().layer(0, DType::BF16) {
        Err(Error::Checkpoint { tensor, why }) => {
            assert_eq!(tensor, "model.layers.0.input_layernorm.weight");
            assert!(why.contains("language_model"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // A missing config.json.
    std::fs::remove_file(dir.join("config.json")).unwrap();
    assert!(matches!(Checkpoint::open(&dir), Err(Error::Io { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}

fn built_in(json: &str, index: usize, dtype: DType) -> (llama_model::block::LayerSpec, HostLayerWeights) {
    let spec = ModelConfig::from_json(json).unwrap().layer(index).unwrap();
    let w = HostLayerWeights::random(&spec, dtype, 11);
    (spec, w)
}

#[test]
fn layers_match_the_reference_stage_by_stage() {
    // Prefill, chunked prefill after a cached prefix, decode: every stage within tolerance.
    for device in common::devices() {
        for (json, index, dtype) in [
            (LLAMA3_SMALL, 0, DType::F32),
            (LLAMA3_SMALL, 0, DType::F16),
            (LLAMA4_SMALL, 0, DType::BF16),
            (LLAMA4_SMALL, 1, DType::BF16),
            (LLAMA4_SMALL, 2, DType::F32),
            (LLAMA4_SMALL, 3, DType::F32),
        ] {
            let (spec, w) = built_in(json, index, dtype);
            let rows = check_layer(&device, dtype, spec, &w, &schedule(2), 1).unwrap();
            for r in &rows {
                assert!(r.pass, "{} {} {}: {:?}", r.model, r.stage, dtype, r.comparison);
            }
            assert!(rows.iter().any(|r| r.stage.ends_with("e2e")));
            // An MoE layer checks its device MoE stages too (nothing is skipped).
            if spec.is_moe() {
                for stage in ["router", "routing", "route_weights", "shared", "output"] {
                    assert!(rows.iter().any(|r| r.stage == stage && r.comparison.is_some()), "{stage} not checked");
                }
            }
        }
    }
}

#[test]
fn the_stage_checks_catch_a_wrong_layer() {
    // The device layer gets other weights than the reference: the first stage downstream of
    // the difference fails (the check can fail).
    let d = Device::emulated();
    let (spec, w) = built_in(LLAMA3_SMALL, 0, DType::BF16);
    let mut wrong = w.clone();
    wrong.o_proj.data[5] += 0.5;
    let layer_rows = {
        // check_layer uploads what it is given to the device and to the reference alike; emulate
        // a wrong device layer by comparing a forward of `wrong` with the reference of `w`.
        let layer = DecoderLayer::new(&d, DType::BF16, spec, &wrong).unwrap();
        let mut cache = KvCache::for_layers(&d, DType::BF16, &[spec], 1, 8).unwrap();
        let mut ws = LayerWorkspace::plan(&d, DType::BF16, &[spec], 8, &cache).unwrap();
        let step = ws.begin_step(&mut cache, &[(0, 4)]).unwrap();
        let x: Vec<f64> = (0..4 * spec.hidden).map(|i| ((i * 7919) % 13) as f64 / 13.0 - 0.5).collect();
        let hidden = Tensor::from_f64(&d, DType::BF16, &x, &[4, spec.hidden]).unwrap();
        let tr = layer.forward_traced(&mut ws, &cache, 0, &step, &hidden).unwrap();
        cache.commit(&step).unwrap();
        let rl = llama_kernels::reference::block::RefLayer::new(spec, &w).unwrap();
        let expected = llama_kernels::reference::block::o_proj(&rl, tr.get("attention").unwrap()).unwrap();
        llama_kernels::dev::testing::compare(
            tr.get("o_proj").unwrap(),
            &expected,
            llama_kernels::dev::testing::Tolerance::rounded_output(DType::BF16),
        )
    };
    assert!(!layer_rows.pass);
}

#[test]
fn a_planned_step_allocates_nothing_and_never_waits() {
    for d in common::devices() {
        // Llama 3 (dense, dense); Llama 4 (dense + RoPE, MoE + RoPE, dense + NoPE, MoE + NoPE).
        let stack = |json: &str, indices: &[usize]| {
            let specs: Vec<_> = indices.iter().map(|&i| built_in(json, i, DType::BF16)).collect();
            let layers: Vec<_> =
                specs.iter().map(|(s, w)| DecoderLayer::new(&d, DType::BF16, *s, w).unwrap()).collect();
            (specs.into_iter().map(|x| x.0).collect::<Vec<_>>(), layers)
        };
        for (specs, layers) in [stack(LLAMA3_SMALL, &[0, 0]), stack(LLAMA4_SMALL, &[0, 1, 2, 3])] {
            let spec = specs[0];
            let mut cache = KvCache::for_layers(&d, DType::BF16, &specs, 4, 32).unwrap();
            let mut ws = LayerWorkspace::plan(&d, DType::BF16, &specs, 32, &cache).unwrap();
            let hidden = Tensor::zeros(&d, DType::BF16, &[32, spec.hidden]).unwrap();
            let before = d.counters();
            for batch in [vec![(0, 9), (2, 5)], vec![(0, 1), (1, 12), (2, 1)], vec![(0, 1), (1, 1), (2, 1)]] {
                let step = ws.begin_step(&mut cache, &batch).unwrap();
                let h = hidden.narrow(0, 0, step.tokens).unwrap();
                for (i, layer) in layers.iter().enumerate() {
                    layer.forward(&mut ws, &cache, i, &step, &h).unwrap();
                }
                cache.commit(&step).unwrap();
            }
            let after = d.counters();
            assert_eq!(after.allocations, before.allocations, "a planned step allocated");
            assert_eq!(after.synchronizations, before.synchronizations, "a planned step waited on the host");
            assert_eq!(after.pageable_uploads, before.pageable_uploads);
            assert_eq!(after.downloads, before.downloads);
            assert_eq!(after.pinned_uploads - before.pinned_uploads, 3, "one pinned upload per step");
            assert_eq!(cache.lens(), &[11, 13, 7, 0]);
        }
    }
}

#[test]
fn layer_outputs_do_not_depend_on_the_schedule() {
    // An MoE layer: attention, routing, the permutation and the grouped GEMMs all run.
    let (spec, w) = built_in(LLAMA4_SMALL, 1, DType::BF16);
    let mut outputs = Vec::new();
    for d in common::schedule_devices().iter().take(2) {
        let layer = DecoderLayer::new(d, DType::BF16, spec, &w).unwrap();
        let mut cache = KvCache::for_layers(d, DType::BF16, &[spec], 2, 24).unwrap();
        let mut ws = LayerWorkspace::plan(d, DType::BF16, &[spec], 24, &cache).unwrap();
        let mut out = Vec::new();
        for batch in [vec![(0, 17), (1, 5)], vec![(0, 1), (1, 1)]] {
            let step = ws.begin_step(&mut cache, &batch).unwrap();
            let x: Vec<f64> = (0..step.tokens * spec.hidden).map(|i| ((i * 37) % 101) as f64 / 50.0 - 1.0).collect();
            let hidden = Tensor::from_f64(d, DType::BF16, &x, &[step.tokens, spec.hidden]).unwrap();
            layer.forward(&mut ws, &cache, 0, &step, &hidden).unwrap();
            cache.commit(&step).unwrap();
            out.push(hidden.to_f64_vec().unwrap());
        }
        outputs.push(out);
    }
    assert!(common::bitwise_equal(&outputs[0], &outputs[1]), "schedules disagree");
}

#[test]
fn a_workspace_not_planned_for_a_layers_moe_is_a_named_error_before_launching() {
    let d = Device::emulated();
    let (dense, _) = built_in(LLAMA4_SMALL, 0, DType::BF16);
    let (spec, w) = built_in(LLAMA4_SMALL, 1, DType::BF16);
    let layer = DecoderLayer::new(&d, DType::BF16, spec, &w).unwrap();
    let mut cache = KvCache::for_layers(&d, DType::BF16, &[spec], 1, 8).unwrap();
    // Planned for the dense layer only: no MoE buffers.
    let mut ws = LayerWorkspace::plan(&d, DType::BF16, &[dense], 8, &cache).unwrap();
    let step = ws.begin_step(&mut cache, &[(0, 3)]).unwrap();
    let hidden = Tensor::zeros(&d, DType::BF16, &[3, spec.hidden]).unwrap();
    let before = d.counters().launches;
    match layer.forward(&mut ws, &cache, 0, &step, &hidden) {
        Err(Error::Kernel(KernelError::InvalidArgument { name, .. })) => assert_eq!(name, "workspace"),
        other => panic!("expected InvalidArgument(workspace), got {other:?}"),
    }
    assert_eq!(d.counters().launches, before);
    // MoE layers of one workspace must agree on their shape.
    let mut other = spec;
    if let llama_model::block::FfnSpec::Moe { experts, top_k, intermediate } = spec.ffn {
        other.ffn = llama_model::block::FfnSpec::Moe { experts: experts * 2, top_k, intermediate };
    }
    match LayerWorkspace::plan(&d, DType::BF16, &[spec, other], 8, &cache) {
        Err(Error::Kernel(KernelError::InvalidArgument { name, .. })) => assert_eq!(name, "specs"),
        other => panic!("expected InvalidArgument(specs), got {other:?}"),
    }
}

#[test]
fn step_validation_errors_are_named() {
    let d = Device::emulated();
    let (spec, w) = built_in(LLAMA3_SMALL, 0, DType::BF16);
    let layer = DecoderLayer::new(&d, DType::BF16, spec, &w).unwrap();
    let mut cache = KvCache::for_layers(&d, DType::BF16, &[spec], 2, 8).unwrap();
    let mut ws = LayerWorkspace::plan(&d, DType::BF16, &[spec], 8, &cache).unwrap();
    fn name<T>(r: llama_model::Result<T>) -> &'static str {
        match r {
            Err(Error::Kernel(KernelError::InvalidArgument { name, .. })) => name,
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("accepted"),
        }
    }
    assert_eq!(name(ws.begin_step(&mut cache, &[(2, 1)])), "slot");
    assert_eq!(name(ws.begin_step(&mut cache, &[(1, 1), (0, 1)])), "slot");
    assert_eq!(name(ws.begin_step(&mut cache, &[(0, 0)])), "new tokens");
    assert_eq!(name(ws.begin_step(&mut cache, &[(0, 9)])), "new tokens");
    assert_eq!(name(ws.begin_step(&mut cache, &[(0, 5), (1, 5)])), "tokens");
    assert_eq!(name(ws.begin_step(&mut cache, &[])), "batch");
    // A stale step, a committed step, a hidden tensor of the wrong shape.
    let old = ws.begin_step(&mut cache, &[(0, 2)]).unwrap();
    let step = ws.begin_step(&mut cache, &[(0, 2)]).unwrap();
    let hidden = Tensor::zeros(&d, DType::BF16, &[2, spec.hidden]).unwrap();
    assert_eq!(name(layer.forward(&mut ws, &cache, 0, &old, &hidden)), "step");
    let wrong = Tensor::zeros(&d, DType::BF16, &[3, spec.hidden]).unwrap();
    assert!(matches!(
        layer.forward(&mut ws, &cache, 0, &step, &wrong),
        Err(Error::Kernel(KernelError::ShapeMismatch { what: "hidden", .. }))
    ));
    assert_eq!(name(layer.forward(&mut ws, &cache, 1, &step, &hidden)), "cache layer");
    layer.forward(&mut ws, &cache, 0, &step, &hidden).unwrap();
    cache.commit(&step).unwrap();
    assert_eq!(name(cache.commit(&step)), "step");
    assert_eq!(name(layer.forward(&mut ws, &cache, 0, &step, &hidden)), "step");
    // A cache of another dtype.
    let mut c32 = KvCache::for_layers(&d, DType::F32, &[spec], 2, 8).unwrap();
    assert!(matches!(ws.begin_step(&mut c32, &[(0, 1)]), Err(Error::Kernel(KernelError::DTypeMismatch { .. }))));
}

#[test]
fn a_small_page_pool_is_shared_reused_and_exhausted_by_name() {
    // 3 slots of up to 64 tokens share 5 pages of 16 (a full-size cache would hold 12).
    let d = Device::emulated();
    let (spec, w) = built_in(LLAMA4_SMALL, 0, DType::BF16);
    let layer = DecoderLayer::new(&d, DType::BF16, spec, &w).unwrap();
    let config = KvCacheConfig { slots: 3, max_len: 64, page_size: 16, num_pages: Some(5) };
    let mut cache = KvCache::for_layers_with(&d, DType::BF16, &[spec], &config).unwrap();
    let mut ws = LayerWorkspace::plan(&d, DType::BF16, &[spec], 40, &cache).unwrap();
    let input = |tokens: usize, seed: usize| -> Tensor {
        let x: Vec<f64> = (0..tokens * spec.hidden).map(|i| (((i + seed) * 7919) % 29) as f64 / 29.0 - 0.5).collect();
        Tensor::from_f64(&d, DType::BF16, &x, &[tokens, spec.hidden]).unwrap()
    };
    let step = ws.begin_step(&mut cache, &[(0, 20), (1, 17)]).unwrap();
    layer.forward(&mut ws, &cache, 0, &step, &input(37, 1)).unwrap();
    cache.commit(&step).unwrap();
    assert_eq!((cache.pages(0), cache.pages(1), cache.free_pages()), (&[0, 1][..], &[2, 3][..], 1));

    // Slot 2 needs 3 pages, 1 is free: a named error, and nothing changes.
    match ws.begin_step(&mut cache, &[(2, 33)]) {
        Err(Error::Kernel(KernelError::InvalidArgument { name, why, .. })) => assert_eq!(name, "num_pages", "{why}"),
        other => panic!("expected an exhausted pool, got {other:?}"),
    }
    assert_eq!((cache.free_pages(), cache.lens()), (1, &[20, 17, 0][..]));

    // A step planned before a clear is stale.
    let stale = ws.begin_step(&mut cache, &[(1, 1)]).unwrap();
    cache.clear(0);
    match layer.forward(&mut ws, &cache, 0, &stale, &input(1, 2)) {
        Err(Error::Kernel(KernelError::InvalidArgument { name, .. })) => assert_eq!(name, "step"),
        other => panic!("expected a stale step, got {other:?}"),
    }

    // Clearing slot 0 returned its pages: slot 2 now gets pages 0, 1 and 4 (not contiguous),
    // and computes exactly what it computes on a fresh cache with pages 0, 1, 2.
    let step = ws.begin_step(&mut cache, &[(2, 33)]).unwrap();
    let x = input(33, 3);
    layer.forward(&mut ws, &cache, 0, &step, &x).unwrap();
    cache.commit(&step).unwrap();
    assert_eq!(cache.pages(2), &[0, 1, 4]);
    let mut fresh = KvCache::for_layers(&d, DType::BF16, &[spec], 3, 64).unwrap();
    let mut ws2 = LayerWorkspace::plan(&d, DType::BF16, &[spec], 40, &fresh).unwrap();
    let step2 = ws2.begin_step(&mut fresh, &[(2, 33)]).unwrap();
    let x2 = input(33, 3);
    layer.forward(&mut ws2, &fresh, 0, &step2, &x2).unwrap();
    assert!(common::bitwise_equal(&[x.to_f64_vec().unwrap()], &[x2.to_f64_vec().unwrap()]));
    // And a decode step on the scattered pages (the split-KV decode kernel) agrees too.
    fresh.commit(&step2).unwrap();
    let (y, y2) = (input(1, 4), input(1, 4));
    let s = ws.begin_step(&mut cache, &[(2, 1)]).unwrap();
    layer.forward(&mut ws, &cache, 0, &s, &y).unwrap();
    let s2 = ws2.begin_step(&mut fresh, &[(2, 1)]).unwrap();
    layer.forward(&mut ws2, &fresh, 0, &s2, &y2).unwrap();
    assert!(common::bitwise_equal(&[y.to_f64_vec().unwrap()], &[y2.to_f64_vec().unwrap()]));
}

// ------------------------------------------------------------------------------------ hostile input

/// `Checkpoint::open` on another thread, failing the test (instead of hanging it) if the call
/// does not return within 20 s: a loader that opens a FIFO blocks forever.
fn open_within_20s(dir: &std::path::Path) -> llama_model::Result<Checkpoint> {
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(Checkpoint::open(&dir));
    });
    rx.recv_timeout(std::time::Duration::from_secs(20)).expect("Checkpoint::open did not return within 20 s")
}

#[test]
fn the_loader_never_opens_files_outside_the_checkpoint() {
    let root = temp_dir("escape");
    let (dir, outside) = (root.join("ckpt"), root.join("outside"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    write_llama4(&outside, &[0], false);
    let shard = "model-00001-of-00004.safetensors";
    std::fs::write(dir.join("config.json"), LLAMA4_SMALL).unwrap();
    let tensor = "language_model.model.layers.0.input_layernorm.weight";
    let escapes = [
        format!("../outside/{shard}"),
        outside.join(shard).display().to_string(),
        "/etc/passwd".into(),
        "/dev/zero".into(),
        "sub/x.safetensors".into(),
        "..".into(),
        ".".into(),
        String::new(),
    ];
    for name in escapes {
        let index = serde_json::json!({ "metadata": {}, "weight_map": { tensor: name } });
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        match open_within_20s(&dir) {
            Err(Error::Io { why, .. }) => assert!(why.contains("plain file name"), "{name}: {why}"),
            other => panic!("shard `{name}` was accepted: {other:?}"),
        }
    }
    // A shard that is a symlink inside the directory (as in the Hugging Face cache) still loads.
    std::fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
    std::os::unix::fs::symlink(outside.join(shard), dir.join(shard)).unwrap();
    let ckpt = open_within_20s(&dir).unwrap();
    ckpt.layer(0, DType::BF16).unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn only_regular_files_are_opened() {
    let dir = temp_dir("fifo");
    std::fs::write(dir.join("config.json"), LLAMA3_SMALL).unwrap();
    // A FIFO under a shard's name (opening it for reading would block until a writer comes).
    let fifo = dir.join("model.safetensors");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("note: mkfifo unavailable; FIFO case not run");
    } else {
        match open_within_20s(&dir) {
            Err(Error::Io { why, .. }) => assert!(why.contains("not a regular file"), "{why}"),
            other => panic!("a FIFO shard was accepted: {other:?}"),
        }
        std::fs::remove_file(&fifo).unwrap();
    }
    // A directory under a shard's name, and an index that is a directory.
    std::fs::create_dir(dir.join("x.safetensors")).unwrap();
    assert!(matches!(open_within_20s(&dir), Err(Error::Io { why, .. }) if why.contains("not a regular file")));
    std::fs::remove_dir(dir.join("x.safetensors")).unwrap();
    std::fs::create_dir(dir.join("model.safetensors.index.json")).unwrap();
    assert!(matches!(open_within_20s(&dir), Err(Error::Io { why, .. }) if why.contains("not a regular file")));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sizes_from_a_config_are_bounded_before_anything_is_allocated() {
    // 10^12 layers (allocated per-layer flags), 2^58 heads (wrapped qkv_dim to 0 in release).
    let (f, why) = config_err(
        r#"{"model_type": "llama4_text", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64,
            "intermediate_size": 8, "num_hidden_layers": 1000000000000}"#,
    );
    assert_eq!(f, "num_hidden_layers", "{why}");
    let (f, why) = config_err(
        r#"{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 288230376151711744,
            "num_key_value_heads": 288230376151711744, "head_dim": 64, "intermediate_size": 8, "num_hidden_layers": 1}"#,
    );
    assert_eq!(f, "num_attention_heads", "{why}");
    for key in ["hidden_size", "intermediate_size"] {
        let json = format!(
            r#"{{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 8,
                "num_hidden_layers": 1, "{key}": 4611686018427387904}}"#
        );
        assert_eq!(config_err(&json).0, key);
    }
    let (f, _) = config_err(
        r#"{"model_type": "llama4_text", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64,
            "intermediate_size": 8, "num_hidden_layers": 2, "num_local_experts": 100000}"#,
    );
    assert_eq!(f, "num_local_experts");
    // A spec built by hand gets the same bounds.
    let (spec, w) = built_in(LLAMA3_SMALL, 0, DType::BF16);
    let d = Device::emulated();
    let huge = llama_model::block::LayerSpec { q_heads: 1 << 58, kv_heads: 1 << 58, ..spec };
    assert!(matches!(
        DecoderLayer::new(&d, DType::BF16, huge, &w),
        Err(Error::Kernel(KernelError::InvalidArgument { name: "q_heads", .. }))
    ));
    assert!(matches!(
        KvCache::for_layers(&d, DType::BF16, &[huge], 1, 8),
        Err(Error::Kernel(KernelError::InvalidArgument { name: "q_heads", .. }))
    ));
}

#[test]
fn cache_sizes_from_a_caller_are_bounded() {
    let d = Device::emulated();
    for slots in [1usize << 40, usize::MAX] {
        let config = KvCacheConfig { slots, max_len: 16, page_size: 16, num_pages: Some(4) };
        let r = KvCache::with_config(&d, DType::BF16, 1, 2, 64, &config);
        assert!(matches!(r, Err(Error::Kernel(KernelError::InvalidArgument { name: "slots", .. }))), "{slots}: {r:?}");
        let r = KvCache::new(&d, DType::BF16, 1, 2, 64, slots, 16);
        assert!(matches!(r, Err(Error::Kernel(KernelError::InvalidArgument { .. }))), "{slots}: {r:?}");
    }
    let r = KvCache::new(&d, DType::BF16, 1, 2, 64, 1, 1 << 40);
    assert!(matches!(r, Err(Error::Kernel(KernelError::InvalidArgument { name: "max_len", .. }))), "{r:?}");
    let r = KvCache::new(&d, DType::BF16, 1 << 40, 2, 64, 1, 16);
    assert!(matches!(r, Err(Error::Kernel(KernelError::InvalidArgument { name: "layers", .. }))), "{r:?}");
}

#[test]
fn a_step_that_overflows_fails_before_changing_the_cache() {
    let d = Device::emulated();
    let (spec, _) = built_in(LLAMA3_SMALL, 0, DType::BF16);
    let mut cache = KvCache::for_layers(&d, DType::BF16, &[spec], 2, 64).unwrap();
    let mut ws = LayerWorkspace::plan(&d, DType::BF16, &[spec], 16, &cache).unwrap();
    let step = ws.begin_step(&mut cache, &[(0, 3)]).unwrap();
    cache.commit(&step).unwrap();
    let before = (cache.free_pages(), cache.pages(0).to_vec(), cache.pages(1).to_vec(), cache.lens().to_vec());
    for batch in [vec![(0, usize::MAX)], vec![(0, usize::MAX - 2)], vec![(0, 1), (1, usize::MAX)]] {
        match ws.begin_step(&mut cache, &batch) {
            Err(Error::Kernel(KernelError::InvalidArgument { name, .. })) => {
                assert!(name == "new tokens" || name == "tokens", "{name}")
            }
            other => panic!("{batch:?}: {other:?}"),
        }
        let after = (cache.free_pages(), cache.pages(0).to_vec(), cache.pages(1).to_vec(), cache.lens().to_vec());
        assert_eq!(after, before, "{batch:?} changed the cache");
    }
}

#[test]
fn a_cache_of_another_dtype_is_named_with_both_dtypes() {
    let d = Device::emulated();
    let (spec, w) = built_in(LLAMA3_SMALL, 0, DType::F32);
    let layer = DecoderLayer::new(&d, DType::F32, spec, &w).unwrap();
    let mut c32 = KvCache::for_layers(&d, DType::F32, &[spec], 1, 8).unwrap();
    let mut ws32 = LayerWorkspace::plan(&d, DType::F32, &[spec], 8, &c32).unwrap();
    let c16 = KvCache::for_layers(&d, DType::BF16, &[spec], 1, 8).unwrap();
    // A step of the f32 workspace and cache, run against the bf16 cache: the message said
    // "workspace or cache has dtype f32, expected f32".
    let step = ws32.begin_step(&mut c32, &[(0, 1)]).unwrap();
    let hidden = Tensor::zeros(&d, DType::F32, &[1, spec.hidden]).unwrap();
    match layer.forward(&mut ws32, &c16, 0, &step, &hidden) {
        Err(Error::Kernel(KernelError::DTypeMismatch {
            what: "cache",
            got: DType::BF16,
            expected: DType::F32,
            ..
        })) => {}
        other => panic!("{other:?}"),
    }
}
