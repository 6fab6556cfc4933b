//! LoRA adapters in peft's format: written and read back exactly, peft's names and config
//! fields, a peft-made adapter read (the fixture from scripts/make_peft_fixtures.py), and every
//! malformed adapter a named error with nothing written on a failed save.

use std::path::{Path, PathBuf};

use llama_kernels::DType;
use llama_kernels::spec::lora::LoraConfig;
use llama_kernels::spec::weights::HostTensor;
use llama_model::Error;
use llama_model::formats::ModelConfig;
use llama_model::formats::checkpoint::write_safetensors;
use llama_model::formats::peft::{Adapter, AdapterConfig, CONFIG_FILE, Projection, WEIGHTS_FILE};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama3")
}

fn model() -> ModelConfig {
    ModelConfig::from_file(&fixture_dir().join("config.json")).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llk-peft-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn qlora() -> AdapterConfig {
    AdapterConfig::new(LoraConfig::QLORA, &Projection::ALL, Some("tiny-llama".into())).unwrap()
}

#[test]
fn an_adapter_is_written_in_peft_format_and_read_back_exactly() {
    let model = model();
    let mut adapter = Adapter::init(qlora(), &model, 7).unwrap();
    // peft's initialization: A within 1/sqrt(in), not constant; B zero.
    for (&(_, p), pair) in &adapter.weights {
        let bound = 1.0 / (pair.a.shape[1] as f32).sqrt();
        assert!(pair.a.data.iter().all(|v| v.abs() <= bound), "{p:?}");
        assert!(pair.a.data.iter().any(|&v| v != pair.a.data[0]), "{p:?}");
        assert!(pair.b.data.iter().all(|&v| v == 0.0), "{p:?}");
    }
    // A trained B, so the round trip covers both matrices.
    for (i, pair) in adapter.weights.values_mut().enumerate() {
        pair.b.data.iter_mut().enumerate().for_each(|(j, v)| *v = ((i * 31 + j) % 17) as f32 * 0.125 - 1.0);
    }
    let dir = scratch("roundtrip").join("adapter");
    adapter.save(&dir).unwrap();
    assert!(dir.join(CONFIG_FILE).is_file() && dir.join(WEIGHTS_FILE).is_file());
    let back = Adapter::load(&dir, &model, DType::F32).unwrap();
    assert_eq!(back, adapter);
    // peft's names and config fields.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap()).unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], 16);
    assert_eq!(config["lora_alpha"], 32.0);
    assert_eq!(config["target_modules"].as_array().unwrap().len(), 7);
    let bytes = std::fs::read(dir.join(WEIGHTS_FILE)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let q = st.tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").unwrap();
    assert_eq!(q.shape(), [16, 128]);
    let down = st.tensor("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight").unwrap();
    assert_eq!(down.shape(), [128, 16]);
    assert_eq!(st.len(), 14);
    // Saving over an existing adapter replaces its files.
    adapter.weights.values_mut().next().unwrap().a.data[0] = 0.5;
    adapter.save(&dir).unwrap();
    assert_eq!(Adapter::load(&dir, &model, DType::F32).unwrap(), adapter);
    // Rounded to the run dtype on load.
    let bf = Adapter::load(&dir, &model, DType::BF16).unwrap();
    let (&key, pair) = bf.weights.iter().next().unwrap();
    let want: Vec<f32> = adapter.weights[&key]
        .a
        .data
        .iter()
        .map(|&v| llama_kernels::dtype::round_to(DType::BF16, f64::from(v)) as f32)
        .collect();
    assert_eq!(pair.a.data, want);
}

#[test]
fn configs_peft_writes_are_read() {
    let path = Path::new("adapter_config.json");
    let text = r#"{"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
        "target_modules": ["v_proj", "q_proj"], "bias": "none", "use_rslora": true, "use_dora": false,
        "fan_in_fan_out": false, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": null,
        "layers_to_transform": null, "base_model_name_or_path": "meta-llama/Llama-3.1-8B"}"#;
    let c = AdapterConfig::from_json(text, path).unwrap();
    assert_eq!(c.lora, LoraConfig { r: 8, alpha: 16.0, dropout: 0.1, rslora: true });
    assert_eq!(c.targets, [Projection::Q, Projection::V]);
    assert_eq!(c.base_model.as_deref(), Some("meta-llama/Llama-3.1-8B"));
    let all = AdapterConfig::from_json(
        r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": "all-linear"}"#,
        path,
    )
    .unwrap();
    assert_eq!(all.targets, Projection::ALL);
    // The config we write reads back as itself.
    assert_eq!(AdapterConfig::from_json(&qlora().to_json().to_string(), path).unwrap(), qlora());
}

#[test]
fn malformed_adapters_are_named_errors() {
    let path = Path::new("adapter_config.json");
    let base = r#""peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]"#;
    let parse = |extra: &str| AdapterConfig::from_json(&format!("{{{base}{extra}}}"), path);
    let unsupported = |r: llama_model::Result<AdapterConfig>| matches!(r, Err(Error::Unsupported { .. }));
    assert!(parse("").is_ok());
    assert!(unsupported(parse(r#", "use_dora": true"#)));
    assert!(unsupported(parse(r#", "rank_pattern": {"q_proj": 8}"#)));
    assert!(unsupported(parse(r#", "modules_to_save": ["lm_head"]"#)));
    assert!(unsupported(parse(r#", "bias": "all""#)));
    assert!(unsupported(parse(r#", "fan_in_fan_out": true"#)));
    assert!(unsupported(AdapterConfig::from_json(
        r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ".*proj"}"#,
        path
    )));
    assert!(unsupported(AdapterConfig::from_json(
        r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["lm_head"]}"#,
        path
    )));
    let config_err = |r: llama_model::Result<AdapterConfig>| matches!(r, Err(Error::Config { .. }));
    assert!(config_err(AdapterConfig::from_json("{not json", path)));
    assert!(config_err(AdapterConfig::from_json(r#"{"peft_type": "IA3", "r": 4}"#, path)));
    assert!(config_err(AdapterConfig::from_json(
        r#"{"peft_type": "LORA", "lora_alpha": 8, "target_modules": ["q_proj"]}"#,
        path
    )));
    // r = 0 and a dropout of 1 fail LoraConfig's own check.
    let zero = AdapterConfig::from_json(
        r#"{"peft_type": "LORA", "r": 0, "lora_alpha": 8, "target_modules": ["q_proj"]}"#,
        path,
    );
    assert!(matches!(zero, Err(Error::Kernel(llama_kernels::Error::InvalidArgument { .. }))));
    assert!(parse(r#", "lora_dropout": 1.0"#).is_err());

    // Weights that do not fit the model.
    let model = model();
    let dir = scratch("bad");
    let cfg = AdapterConfig::new(LoraConfig { r: 4, alpha: 8.0, dropout: 0.0, rslora: false }, &[Projection::Q], None)
        .unwrap();
    std::fs::write(dir.join(CONFIG_FILE), cfg.to_json().to_string()).unwrap();
    let names = Projection::Q.tensor_names(0);
    let t = |shape: &[usize]| HostTensor::new(shape, vec![0.25; shape.iter().product()]).unwrap();
    let (a, b, wrong, extra) = (t(&[4, 128]), t(&[128, 4]), t(&[4, 127]), t(&[4, 128]));
    let write =
        |tensors: &[(String, &HostTensor)]| write_safetensors(&dir.join(WEIGHTS_FILE), tensors, DType::F32).unwrap();
    let checkpoint_err = |r: llama_model::Result<Adapter>| matches!(r, Err(Error::Checkpoint { .. }));
    write(&[(names[0].clone(), &a), (names[1].clone(), &b)]);
    assert!(Adapter::load(&dir, &model, DType::F32).is_ok());
    write(&[(names[0].clone(), &wrong), (names[1].clone(), &b)]);
    assert!(checkpoint_err(Adapter::load(&dir, &model, DType::F32)), "a wrong shape");
    write(&[(names[0].clone(), &a)]);
    assert!(checkpoint_err(Adapter::load(&dir, &model, DType::F32)), "B missing");
    let k = Projection::K.tensor_names(0);
    write(&[(names[0].clone(), &a), (names[1].clone(), &b), (k[0].clone(), &extra)]);
    assert!(checkpoint_err(Adapter::load(&dir, &model, DType::F32)), "a tensor the config does not target");
    std::fs::write(dir.join(WEIGHTS_FILE), b"\x10\0\0\0\0\0\0\0{}").unwrap();
    assert!(matches!(Adapter::load(&dir, &model, DType::F32), Err(Error::Io { .. })), "a truncated file");
    std::fs::remove_file(dir.join(WEIGHTS_FILE)).unwrap();
    assert!(matches!(Adapter::load(&dir, &model, DType::F32), Err(Error::Io { .. })), "no weights file");

    // A failed save leaves nothing under the target's name.
    let adapter = Adapter::init(cfg, &model, 1).unwrap();
    let missing_parent = dir.join("no/such/dir/adapter");
    assert!(adapter.save(&missing_parent).is_err());
    assert!(!missing_parent.exists() && !dir.join("no").exists());
}
