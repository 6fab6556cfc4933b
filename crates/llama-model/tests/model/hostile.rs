//! Hostile inputs through the public API: chat templates that ask for huge allocations, template
//! output that must match transformers' byte for byte, configuration files of any size, weight
//! files truncated while they are read, and hand-built models that disagree with their config.
//! Each is a named error (or the documented output), never an abort, a signal or a hang.

use std::path::{Path, PathBuf};

use llama_kernels::spec::quant::PackedWeight;
use llama_kernels::spec::weights::HostTensor;
use llama_kernels::{DType, Device, Error as KernelError};
use llama_model::Error;
use llama_model::dev::verify::block::LLAMA3_SMALL;
use llama_model::formats::checkpoint::write_safetensors;
use llama_model::formats::{Checkpoint, ModelConfig};
use llama_model::model::{HostModel, Model, ModelPlan};
use llama_model::text::chat::{ChatTemplate, Message};
use llama_model::text::tokenizer::MAX_CONFIG_BYTES;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llk-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The message of a render that failed by name.
fn render_error(source: &str) -> String {
    let t = ChatTemplate::new(source, None, None).unwrap();
    match t.render(&[Message::user("x")], false) {
        Err(Error::Kernel(KernelError::InvalidArgument { why, .. })) => why,
        other => panic!("{source}: {other:?}"),
    }
}

#[test]
fn templates_cannot_allocate_without_bound() {
    // A width that would need 100 GB (an abort before) and one of 1 GB (1.9 GiB used before).
    for width in ["99999999999", "1000000000", "65537"] {
        let why = render_error(&format!("{{{{ '{{:>{width}}}'.format('x') }}}}"));
        assert!(why.contains("exceeds"), "{width}: {why}");
    }
    assert!(render_error("{{ '{:.99999999f}'.format(1.5) }}").contains("exceeds"));
    // Within the bound, str.format works as Python's.
    let t = ChatTemplate::new("{{ '{:>5}|{:<3}|{:.2f}'.format('ab', 'c', 1.5) }}", None, None).unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "   ab|c  |1.50");
    // Repetition, concatenation and doubling stop at the render's fuel (64 bytes a unit).
    let why = render_error("{% set s = 'x' * 50000000 %}{{ s ~ s ~ s ~ s ~ s ~ s }}");
    assert!(why.contains("fuel"), "{why}");
    let why = render_error(
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    );
    assert!(why.contains("fuel"), "{why}");
    assert!(render_error("{% for i in range(1000000000) %}{% endfor %}").contains("range"));
    let why = render_error("{{ (['x'] * 100000000) | join('abcdefgh') }}");
    assert!(why.contains("fuel") || why.contains("too large"), "{why}");
}

#[test]
fn tojson_writes_what_transformers_writes() {
    // Expected texts from Python 3.11: json.dumps(x, ensure_ascii=False, ...), transformers'
    // replacement of Jinja's tojson.
    let content = "a<b & 'c' \"d\" é\n\t\u{1}";
    let t = ChatTemplate::new("{{ messages[0].content | tojson }}|{{ messages[0] | tojson }}", None, None).unwrap();
    assert_eq!(
        t.render(&[Message::new("ipython", content)], false).unwrap(),
        "\"a<b & 'c' \\\"d\\\" é\\n\\t\\u0001\"|{\"role\": \"ipython\", \"content\": \"a<b & 'c' \\\"d\\\" é\\n\\t\\u0001\"}"
    );
    let t = ChatTemplate::new("{{ {'b': 1.0, 'a': [1, 2.5e-7, none, true], 'c': {}} | tojson(indent=2) }}", None, None)
        .unwrap();
    assert_eq!(
        t.render(&[], false).unwrap(),
        "{\n  \"b\": 1.0,\n  \"a\": [\n    1,\n    2.5e-07,\n    null,\n    true\n  ],\n  \"c\": {}\n}"
    );
    let t = ChatTemplate::new(
        "{{ {'b': 1e16, 'a': []} | tojson(ensure_ascii=true, sort_keys=true) }}{{ 'é😀' | tojson(ensure_ascii=true) }}",
        None,
        None,
    )
    .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "{\"a\": [], \"b\": 1e+16}\"\\u00e9\\ud83d\\ude00\"");
    assert!(render_error("{{ 'x' | tojson(indent=1000) }}").contains("indent"));
}

#[test]
fn json_files_are_read_only_up_to_their_cap() {
    let dir = scratch("json");
    // A sparse file one byte over the cap: refused by size, not parsed.
    let config = dir.join("config.json");
    std::fs::File::create(&config).unwrap().set_len(MAX_CONFIG_BYTES + 1).unwrap();
    match ModelConfig::from_file(&config) {
        Err(Error::Io { why, .. }) => assert!(why.contains("larger than"), "{why}"),
        other => panic!("{other:?}"),
    }
    match HostModel::from_checkpoint(&dir, DType::F32) {
        Err(Error::Io { why, .. }) => assert!(why.contains("larger than"), "{why}"),
        other => panic!("{other:?}"),
    }
    std::fs::write(&config, LLAMA3_SMALL).unwrap();
    let index = dir.join("model.safetensors.index.json");
    std::fs::File::create(&index).unwrap().set_len(MAX_CONFIG_BYTES + 1).unwrap();
    match Checkpoint::open(&dir) {
        Err(Error::Io { path, why }) => assert!(path.ends_with("index.json") && why.contains("larger than"), "{why}"),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A one-tensor checkpoint in `dir`; returns the shard's path.
fn one_tensor_checkpoint(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("config.json"), LLAMA3_SMALL).unwrap();
    let t = HostTensor::new(&[64, 64], (0..4096).map(|i| i as f32 / 64.0).collect()).unwrap();
    let shard = dir.join("model.safetensors");
    write_safetensors(&shard, &[("w".into(), &t)], DType::F32).unwrap();
    shard
}

#[test]
fn a_safetensors_file_truncated_while_open_is_a_named_error() {
    let dir = scratch("truncated");
    let shard = one_tensor_checkpoint(&dir);
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.tensor("w", &[64, 64], DType::F32).unwrap().data[65], 65.0 / 64.0);
    // Another process truncates the file: a mapped read would raise SIGBUS here.
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(len / 2).unwrap();
    match ckpt.tensor("w", &[64, 64], DType::F32) {
        Err(Error::Io { why, .. }) => assert!(why.contains("truncated"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Opened again, the header no longer accounts for the file.
    assert!(matches!(Checkpoint::open(&dir), Err(Error::Io { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hand_built_model_that_disagrees_with_its_config_is_refused() {
    let d = Device::emulated();
    let plan = ModelPlan { slots: 1, max_len: 16, max_tokens: 8 };
    let host = HostModel::random(LLAMA3_SMALL, 96, true, DType::F32, 5).unwrap();
    let (vocab, hidden) = (host.vocab(), host.hidden());
    let packed = |rows: usize| {
        let data: Vec<f32> = (0..rows * hidden).map(|i| ((i % 17) as f32 - 8.0) / 16.0).collect();
        PackedWeight::quantize_nf4(rows, hidden, 64, &data).unwrap()
    };
    // The baseline builds.
    let mut ok = host.clone();
    ok.lm_head_packed = Some(packed(vocab));
    assert!(Model::new(&d, &ok, DType::F32, plan).is_ok());
    // A packed head one row short would leave the last logit unwritten.
    let mut short = host.clone();
    short.lm_head_packed = Some(packed(vocab - 1));
    match Model::new(&d, &short, DType::F32, plan) {
        Err(Error::Checkpoint { tensor, why }) => assert!(tensor == "lm_head" && why.contains("packed"), "{why}"),
        other => panic!("{:?}", other.err()),
    }
    let mut fewer = host.clone();
    fewer.layers.clear();
    assert!(Model::new(&d, &fewer, DType::F32, plan).is_err());
    let mut data = host.clone();
    data.norm.data.pop();
    assert!(matches!(Model::new(&d, &data, DType::F32, plan), Err(Error::Checkpoint { .. })));
    let mut eps = host.clone();
    eps.eps = f32::NAN;
    assert!(matches!(Model::new(&d, &eps, DType::F32, plan), Err(Error::Config { .. })));
    let mut spec = host;
    spec.layers[0].0.rms_norm_eps *= 2.0;
    assert!(matches!(Model::new(&d, &spec, DType::F32, plan), Err(Error::Checkpoint { .. })));
}
