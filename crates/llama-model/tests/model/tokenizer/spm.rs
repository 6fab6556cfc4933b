//! SentencePiece vocabularies (`tokenizer.ggml.model` = `llama`), checked against the
//! `sentencepiece` library: `tests/fixtures/tokenizer/spm_bpe.json`, made by
//! `scripts/make_spm_fixtures.py` (a tiny BPE model trained with Llama's settings, the GGUF
//! metadata llama.cpp's converter writes for it, and sentencepiece's own ids and decodes).

use std::collections::BTreeMap;

use llama_model::Error;
use llama_model::formats::gguf::GgufValue;
use llama_model::text::stop::StopIds;
use llama_model::text::tokenizer::Tokenizer;

use super::{config_field, ids_of};

const SPM_FIXTURE: &str = include_str!("../../fixtures/tokenizer/spm_bpe.json");

fn fixture() -> serde_json::Value {
    serde_json::from_str(SPM_FIXTURE).expect("fixture JSON")
}

/// A JSON value as the GGUF reader gives it (integers as U64/I64, other numbers as F64).
fn gguf_value(v: &serde_json::Value) -> GgufValue {
    match v {
        serde_json::Value::Bool(b) => GgufValue::Bool(*b),
        serde_json::Value::String(s) => GgufValue::Str(s.clone()),
        serde_json::Value::Array(items) => GgufValue::Array(items.iter().map(gguf_value).collect()),
        serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => GgufValue::U64(u),
            (None, Some(i)) => GgufValue::I64(i),
            _ => GgufValue::F64(n.as_f64().expect("number")),
        },
        other => panic!("no GGUF value for {other}"),
    }
}

/// The fixture's GGUF metadata.
fn spm_meta() -> BTreeMap<String, GgufValue> {
    fixture()["metadata"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), gguf_value(v))).collect()
}

fn stream_all(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut stream = tok.stream(skip_special);
    let mut text: String = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    text.push_str(&stream.finish());
    text
}

#[test]
fn spm_ids_and_decodes_match_sentencepiece() {
    let fx = fixture();
    let tok = Tokenizer::from_gguf_metadata(&spm_meta()).unwrap();
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    let (bos, eos) = (tok.bos_token_id().unwrap(), tok.eos_token_id().unwrap());
    assert_eq!((bos, eos, tok.id_to_token(0).as_deref()), (1, 2, Some("<unk>")));
    assert!(tok.prepends_bos() && !tok.appends_eos() && tok.strips_leading_space());
    let cases = fx["cases"].as_array().unwrap();
    let mut mismatches = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        let decoded = case["decoded"].as_str().unwrap();
        // SentencePiece reads `<s>` in a text as text: so does encode_literal; encode gives BOS.
        let literal = case.get("literal").is_some();
        let ids = if literal { tok.encode_literal(text, false) } else { tok.encode(text, false) }.unwrap();
        if literal {
            assert!(tok.encode(text, false).unwrap().contains(&bos), "{text:?}: `<s>` is BOS for encode");
        }
        let with_bos = if literal { tok.encode_literal(text, true) } else { tok.encode(text, true) }.unwrap();
        let decode = tok.decode(&want, false).unwrap();
        // Control ids around the text are dropped when skipping specials, as SentencePiece does.
        let framed: Vec<u32> = [bos].into_iter().chain(want.iter().copied()).chain([eos]).collect();
        let checks = [
            (ids == want, "encode"),
            (with_bos == framed[..framed.len() - 1], "encode with BOS"),
            (decode == decoded, "decode"),
            (tok.decode(&framed, true).unwrap() == decoded, "decode of <s> ids </s>, skipping specials"),
            (stream_all(&tok, &want, false) == decode, "streamed"),
            (stream_all(&tok, &framed, true) == decoded, "streamed with <s> </s>, skipping specials"),
        ];
        for (ok, what) in checks {
            if !ok {
                mismatches.push(format!("{text:?}: {what} (ids {ids:?}, want {want:?}, decode {decode:?})"));
            }
        }
    }
    let failed: std::collections::BTreeSet<&str> =
        mismatches.iter().map(|m| m.split(": ").next().unwrap_or_default()).collect();
    eprintln!("{} of {} sentencepiece cases match exactly", cases.len() - failed.len(), cases.len());
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    // Byte fallback was exercised, and each id's bytes are what the module docs say.
    assert!(cases.iter().flat_map(|c| ids_of(&c["ids"])).any(|id| tok.id_to_token(id).unwrap().starts_with("<0x")));
    assert_eq!(tok.token_bytes(tok.token_to_id("<0x0A>").unwrap()).unwrap(), b"\n");
    assert_eq!(tok.token_bytes(tok.token_to_id("\u{2581}the").unwrap()).unwrap(), b" the");
    assert_eq!(tok.token_bytes(bos).unwrap(), b"<s>");
    assert!(tok.is_special(bos) && tok.is_special(0) && !tok.is_special(tok.token_to_id("<0x0A>").unwrap()));
    // Text after a control token gets its own dummy prefix (llama.cpp, Hugging Face legacy).
    let the = tok.encode("the", false).unwrap();
    assert_eq!(tok.encode("<s>the", false).unwrap(), [&[bos][..], &the].concat());
    // The stop ids include the EOS.
    assert!(StopIds::from_gguf_metadata(&spm_meta(), &tok).unwrap().contains(eos));
}

#[test]
fn spm_decode_edge_cases_are_as_documented() {
    let tok = Tokenizer::from_gguf_metadata(&spm_meta()).unwrap();
    // (sentencepiece's decode, this crate's decode without and with skip_special_tokens)
    let ours: BTreeMap<&str, (&str, &str)> = [
        ("control ids only", ("<s></s>", "")),
        ("unknown id", ("<unk>", "")),                  // sentencepiece: " ⁇ "
        ("unknown id first", ("<unk> the", "the")),     // sentencepiece: " ⁇  the"
        ("a byte-piece space first", (" the", " the")), // sentencepiece keeps both: "  the"
        ("a byte-piece space alone", ("", "")),         // sentencepiece: " "
        ("a euro sign in byte pieces", ("€ the", "€ the")),
        ("a truncated emoji", ("\u{fffd} the", "\u{fffd} the")), // sentencepiece: one U+FFFD per byte
        ("a stray continuation byte", ("the\u{fffd} the", "the\u{fffd} the")),
        ("two pieces with a leading space", ("the the", "the the")),
    ]
    .into_iter()
    .collect();
    let fx = fixture();
    let cases = fx["decode_cases"].as_array().unwrap();
    assert_eq!(cases.len(), ours.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        let spm = case["sentencepiece"].as_str().unwrap();
        let &(plain, skipped) = ours.get(name).unwrap_or_else(|| panic!("no expectation for {name:?}"));
        assert_eq!(tok.decode(&ids, false).unwrap(), plain, "{name}");
        assert_eq!(tok.decode(&ids, true).unwrap(), skipped, "{name}");
        assert_eq!(stream_all(&tok, &ids, false), plain, "{name} streamed");
        assert_eq!(stream_all(&tok, &ids, true), skipped, "{name} streamed, skipping specials");
        // Where sentencepiece differs, it is only by the documented rules.
        let same =
            !matches!(name, n if n.starts_with("unknown") || n.starts_with("a byte-piece") || n == "a truncated emoji");
        assert_eq!(same, skipped == spm, "{name}: sentencepiece gives {spm:?}, this crate {skipped:?}");
        if name == "a truncated emoji" {
            assert_eq!(spm, "\u{fffd}\u{fffd} the");
        }
    }
}

fn with(mut meta: BTreeMap<String, GgufValue>, key: &str, value: Option<GgufValue>) -> BTreeMap<String, GgufValue> {
    match value {
        Some(v) => meta.insert(key.to_string(), v),
        None => meta.remove(key),
    };
    meta
}

#[test]
fn spm_options_merges_and_prefix() {
    let meta = spm_meta();
    let tok = Tokenizer::from_gguf_metadata(&meta).unwrap();
    let the = tok.token_to_id("\u{2581}the").unwrap();
    // add_space_prefix = false: no dummy `▁`, and decoding keeps every space.
    let bare = Tokenizer::from_gguf_metadata(&with(
        meta.clone(),
        "tokenizer.ggml.add_space_prefix",
        Some(GgufValue::Bool(false)),
    ))
    .unwrap();
    assert!(!bare.strips_leading_space());
    assert_eq!(bare.encode(" the", false).unwrap(), vec![the]);
    assert_ne!(bare.encode("the", false).unwrap()[0], the);
    assert_eq!(bare.decode(&[the], false).unwrap(), " the");
    assert_eq!(stream_all(&bare, &[the, the], false), " the the");
    // add_eos_token appends EOS; add_bos_token = false prepends nothing.
    let eos = Tokenizer::from_gguf_metadata(&with(
        with(meta.clone(), "tokenizer.ggml.add_eos_token", Some(GgufValue::Bool(true))),
        "tokenizer.ggml.add_bos_token",
        Some(GgufValue::Bool(false)),
    ))
    .unwrap();
    assert_eq!(eos.encode("the", true).unwrap(), vec![the, 2]);
    // Merges from the metadata replace the derived ones: with `t h` alone, "the" is three pieces.
    let merges = GgufValue::Array(vec![GgufValue::Str("t h".into())]);
    let given = Tokenizer::from_gguf_metadata(&with(meta.clone(), "tokenizer.ggml.merges", Some(merges))).unwrap();
    let id = |t: &str| given.token_to_id(t).unwrap();
    assert_eq!(given.encode("the", false).unwrap(), vec![id("\u{2581}"), id("th"), id("e")]);
    // Scores are optional when merges are given.
    let merges = GgufValue::Array(vec![GgufValue::Str("t h".into())]);
    let no_scores = with(with(meta.clone(), "tokenizer.ggml.merges", Some(merges)), "tokenizer.ggml.scores", None);
    assert!(Tokenizer::from_gguf_metadata(&no_scores).is_ok());
    // Absent ids take llama.cpp's defaults where those tokens have the right types.
    let mut defaults = meta.clone();
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"] {
        defaults.remove(key);
    }
    let tok = Tokenizer::from_gguf_metadata(&defaults).unwrap();
    assert_eq!((tok.bos_token_id(), tok.eos_token_id()), (Some(1), Some(2)));
    assert!(StopIds::from_gguf_metadata(&defaults, &tok).unwrap().contains(2));
}

#[test]
fn spm_malformed_metadata_is_refused_by_name() {
    let meta = spm_meta();
    let refused = |m: &BTreeMap<String, GgufValue>| config_field(Tokenizer::from_gguf_metadata(m).unwrap_err());
    let scores = |f: &dyn Fn(&mut Vec<GgufValue>)| {
        let GgufValue::Array(mut items) = meta["tokenizer.ggml.scores"].clone() else { unreachable!() };
        f(&mut items);
        with(meta.clone(), "tokenizer.ggml.scores", Some(GgufValue::Array(items)))
    };

    let (field, why) = refused(&scores(&|s| {
        s.pop();
    }));
    assert_eq!(field, "tokenizer.ggml.scores");
    assert!(why.contains("799 entries for 800 tokens"), "{why}");
    let (field, why) = refused(&scores(&|s| s[300] = GgufValue::F64(f64::NAN)));
    assert_eq!(field, "tokenizer.ggml.scores");
    assert!(why.contains("token 300") && why.contains("NaN"), "{why}");
    let (_, why) = refused(&scores(&|s| s[7] = GgufValue::Str("-1".into())));
    assert!(why.contains("token 7") && why.contains("expected a number"), "{why}");
    let (field, why) = refused(&with(meta.clone(), "tokenizer.ggml.scores", None));
    assert_eq!(field, "tokenizer.ggml.scores");
    assert!(why.contains("missing") && why.contains("merges"), "{why}");
    let (field, _) = refused(&with(meta.clone(), "tokenizer.ggml.scores", Some(GgufValue::F64(0.0))));
    assert_eq!(field, "tokenizer.ggml.scores");

    // A byte-typed token must be spelled <0xNN>.
    let GgufValue::Array(mut tokens) = meta["tokenizer.ggml.tokens"].clone() else { unreachable!() };
    tokens[3 + 0x41] = GgufValue::Str("<0xZZ>".into());
    let (field, why) = refused(&with(meta.clone(), "tokenizer.ggml.tokens", Some(GgufValue::Array(tokens))));
    assert_eq!(field, "tokenizer.ggml.tokens");
    assert!(why.contains("token 68") && why.contains("byte type"), "{why}");

    // Without every byte token and without an unknown token, text could be dropped.
    let GgufValue::Array(mut tokens) = meta["tokenizer.ggml.tokens"].clone() else { unreachable!() };
    tokens[3 + 0x41] = GgufValue::Str("A-not-a-byte".into());
    let GgufValue::Array(mut types) = meta["tokenizer.ggml.token_type"].clone() else { unreachable!() };
    types[3 + 0x41] = GgufValue::I64(1);
    types[0] = GgufValue::I64(1);
    let m = with(
        with(meta.clone(), "tokenizer.ggml.tokens", Some(GgufValue::Array(tokens))),
        "tokenizer.ggml.token_type",
        Some(GgufValue::Array(types)),
    );
    let (field, why) = refused(&with(m.clone(), "tokenizer.ggml.unknown_token_id", None));
    assert_eq!(field, "tokenizer.ggml.unknown_token_id");
    assert!(why.contains("1 of the 256 byte tokens"), "{why}");
    // With the unknown token named, such a vocabulary builds.
    assert!(Tokenizer::from_gguf_metadata(&m).is_ok());

    let (field, why) = refused(&with(
        with(meta.clone(), "tokenizer.ggml.add_eos_token", Some(GgufValue::Bool(true))),
        "tokenizer.ggml.eos_token_id",
        Some(GgufValue::U64(1 << 40)),
    ));
    assert_eq!(field, "tokenizer.ggml.eos_token_id");
    assert!(why.contains("outside the vocabulary"), "{why}");
    let (field, why) = refused(&with(meta.clone(), "tokenizer.ggml.add_space_prefix", Some(GgufValue::U64(1))));
    assert_eq!(field, "tokenizer.ggml.add_space_prefix");
    assert!(why.contains("expected a boolean"), "{why}");

    // Deriving merges is bounded: tokens of 4096 characters cost 16 MB each.
    let mut m = meta.clone();
    let long: Vec<GgufValue> =
        (0..20).map(|i| GgufValue::Str(format!("{}{}", "a".repeat(4095), char::from(b'A' + i)))).collect();
    let extend = |key: &str, extra: Vec<GgufValue>, m: &mut BTreeMap<String, GgufValue>| {
        let Some(GgufValue::Array(items)) = m.get_mut(key) else { unreachable!() };
        items.extend(extra);
    };
    extend("tokenizer.ggml.tokens", long, &mut m);
    extend("tokenizer.ggml.scores", vec![GgufValue::F64(-1e6); 20], &mut m);
    extend("tokenizer.ggml.token_type", vec![GgufValue::I64(1); 20], &mut m);
    let (field, why) = refused(&m);
    assert_eq!(field, "tokenizer.ggml.scores");
    assert!(why.contains("deriving merges") && why.contains("give tokenizer.ggml.merges"), "{why}");
    assert!(matches!(Tokenizer::from_gguf_metadata(&m), Err(Error::Config { .. })));
}
