#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/spm_bpe.json: a tiny SentencePiece BPE vocabulary as a GGUF
carries it, and SentencePiece's own encodings and decodings of test strings.

Usage (sentencepiece 0.2.3 from PyPI, a CPU wheel; nothing else):

    pip install --target /tmp/spmpy sentencepiece==0.2.3
    PYTHONPATH=/tmp/spmpy python3 scripts/make_spm_fixtures.py tests/fixtures/tokenizer/spm_bpe.json

Method (independent of this crate and of the Hugging Face `tokenizers` library):

1. A BPE model is trained in memory on the corpus below (built deterministically: English,
   accented Latin, Japanese and Chinese, emoji, digits, runs of spaces and tabs, a little code),
   with Llama's SentencePiece settings: `model_type=bpe`, `byte_fallback`, identity
   normalization (no NFKC), `remove_extra_whitespaces=False` (runs of spaces are kept),
   `add_dummy_prefix`, `split_digits`, `allow_whitespace_only_pieces`, `<unk>`/`<s>`/`</s>` at
   ids 0/1/2 and no padding piece. `character_coverage=0.9995` leaves the rarest training
   characters out of the vocabulary, so byte fallback also covers some of those.
2. The GGUF metadata is what llama.cpp's convert_hf_to_gguf.py (`_create_vocab_sentencepiece`)
   writes for such a model: `tokens` = the pieces in id order, `scores` = their scores,
   `token_type` = 2 (unknown) for `<unk>`, 3 (control) for `<s>` and `</s>`, 5 for unused,
   6 (byte) for `<0xNN>`, 1 (normal) otherwise; the BOS/EOS/unknown ids; `add_bos_token` true
   and `add_eos_token` false, as Llama 2's tokenizer_config.json says. No `merges` (llama.cpp
   writes none for SentencePiece models) and no `add_space_prefix` (the default, true).
3. Each case's `ids` are `SentencePieceProcessor.encode(text)` (no BOS), `decoded` is
   `decode(ids)`. Some texts use characters absent from the vocabulary (Greek, Cyrillic, Hebrew,
   Korean, Thai, symbols, newlines: training reads lines, so "\\n" is never a piece), so
   encodings include `<0xNN>` byte pieces. `literal` marks texts that spell a control token
   (`<s>`): SentencePiece encodes it as text, as `Tokenizer::encode_literal` does.
4. `decode_cases` are id sequences SentencePiece decodes in ways where llama.cpp and Hugging Face
   may differ (control and unknown ids, a leading byte-piece space, invalid UTF-8); the Rust
   test states what this crate gives for each.
"""
import io
import json
import sys

import sentencepiece as spm

TRAINER = dict(
    model_type="bpe",
    vocab_size=800,
    byte_fallback=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=True,
    split_digits=True,
    split_by_whitespace=True,
    allow_whitespace_only_pieces=True,
    character_coverage=0.9995,
    max_sentencepiece_length=16,
    hard_vocab_limit=False,
    unk_id=0,
    bos_id=1,
    eos_id=2,
    pad_id=-1,
    num_threads=1,
    minloglevel=2,
)


class Lcg:
    """A fixed pseudo-random sequence (no dependence on Python's `random` across versions)."""

    def __init__(self, seed):
        self.x = seed

    def next(self, n):
        self.x = (self.x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.x >> 33) % n


def corpus():
    rng = Lcg(20261202)
    words = (
        "the of and to in is that it for on with as was by at from this are be or an which have "
        "not had but were they one all their there been has when who will more no if out so what "
        "model token tokenizer piece pieces merge merges text byte bytes vocabulary score kernel "
        "layer attention cache prompt reply stream decode encode space spaces tab line number "
        "quick brown fox jumps over lazy dog Llama Mistral TinyLlama SentencePiece GPU CPU Rust"
    ).split()
    accented = "café naïve résumé déjà façade über straße Ünïcödé señor jalapeño crème brûlée garçon".split()
    cjk = ["日本語のテキストです。", "東京と京都に行きました。", "中文测试，北京和上海。", "我们喜欢学习语言模型。", "ひらがなとカタカナ"]
    emoji = ["🦀", "🚀", "😀", "👍", "🎉", "❤️", "🦀🦀"]
    lines = []
    for i in range(1500):
        n = 4 + rng.next(10)
        sentence = []
        for _ in range(n):
            r = rng.next(20)
            if r < 14:
                w = words[rng.next(len(words))]
            elif r < 16:
                w = accented[rng.next(len(accented))]
            elif r < 17:
                w = emoji[rng.next(len(emoji))]
            elif r < 19:
                w = str(rng.next(100000))
            else:
                w = cjk[rng.next(len(cjk))]
            sentence.append(w)
        sep = ["  ", "   ", "\t", "    "][rng.next(4)] if rng.next(5) == 0 else " "
        text = sep.join(sentence)
        if rng.next(4) == 0:
            text = text.capitalize() + "."
        if rng.next(6) == 0:
            text = "    " * (1 + rng.next(2)) + text
        lines.append(text)
    lines += [
        "fn main() {    println!(\"hello, world\");    }",
        "for i in range(10):    x = i * 2  # a comment",
        "0123456789 3.14159 2024-06-01 12:30:00 $42.50 100%",
    ] * 20
    return lines


CASES = [
    "",
    "Hello world",
    " Hello",
    "Hello ",
    "  two leading spaces",
    "multiple   spaces    inside  text",
    " ",
    "   ",
    "tabs\tand\t\ttabs",
    "\t",
    "line one\nline two\n\nline four",
    "trailing newline\n",
    "windows\r\nline",
    "Café naïve résumé à la carte",
    "e\u0301 combining accent and ﬁ ligature",
    "Ｆｕｌｌｗｉｄｔｈ stays as it is",
    "日本語のテキストと中文测试",
    "ひらがなとカタカナ、東京。",
    "한국어 텍스트",
    "Ελληνικά και русский текст",
    "עברית ภาษาไทย",
    "🦀 rust 🚀 launch",
    "😀😃😄 three faces",
    "👨‍💻 and 🏳️‍🌈 sequences",
    "1234567890",
    "pi is 3.14159, e is 2.71828",
    "2024-06-01 12:30:00",
    "Price: €42.50 (≈ $45) ± 5%",
    "Math: x² + y² = z², ∑ ∫ ℝ",
    "fn main() {\n    println!(\"hi\");\n}",
    "        eight spaces of indent",
    "A  B   C    D     E",
    "end with spaces   ",
    "MiXeD CaSe WoRdS",
    "the the the the the the",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "x",
    "\u00a0non-breaking space",
    "\u2581already\u2581escaped spaces",
    "<s>literal</s> control text",
    "Z\u0364\u0354a\u0308l\u036eg\u030co\u0319",
    "nul\u0000byte and \u007f delete",
]


def gguf_metadata(sp):
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_unused(i):
            t = 5
        elif sp.is_byte(i):
            t = 6
        else:
            t = 1
        types.append(t)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }


def layout(value, depth=0):
    """JSON with one line per metadata key, case and decode case (reviewable diffs)."""
    dump = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    if not isinstance(value, dict) or depth == 2:
        return dump(value)
    pad = " " * (depth + 1)
    lines = []
    for key, v in value.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            text = "[\n" + ",\n".join(pad + " " + dump(x) for x in v) + "\n" + pad + "]"
        else:
            text = layout(v, depth + 1)
        lines.append(f"{pad}{dump(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n" + " " * depth + "}" + ("\n" if depth == 0 else "")


def main(out_path):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=model, **TRAINER)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    meta = gguf_metadata(sp)
    byte_ids = [sp.piece_to_id(f"<0x{b:02X}>") for b in range(256)]
    assert all(sp.is_byte(i) for i in byte_ids)

    cases = []
    for text in CASES:
        ids = sp.encode(text)
        decoded = sp.decode(ids)
        # Control ids decode to nothing in SentencePiece, before and after.
        assert sp.decode([sp.bos_id()] + ids + [sp.eos_id()]) == decoded
        case = {"text": text, "ids": ids, "decoded": decoded}
        if "<s>" in text or "</s>" in text:
            case["literal"] = True
        cases.append(case)
    assert any(byte_ids[0] <= i <= byte_ids[-1] for c in cases for i in c["ids"]), "byte fallback is exercised"

    the = sp.piece_to_id("\u2581the")
    assert not sp.is_unknown(the)
    raw = [
        ("control ids only", [sp.bos_id(), sp.eos_id()]),
        ("unknown id", [sp.unk_id()]),
        ("unknown id first", [sp.unk_id(), the]),
        ("a byte-piece space first", [byte_ids[0x20], the]),
        ("a byte-piece space alone", [byte_ids[0x20]]),
        ("a euro sign in byte pieces", [byte_ids[0xE2], byte_ids[0x82], byte_ids[0xAC], the]),
        ("a truncated emoji", [byte_ids[0xF0], byte_ids[0x9F], the]),
        ("a stray continuation byte", [the, byte_ids[0x80], the]),
        ("two pieces with a leading space", [the, the]),
    ]
    decode_cases = [{"name": name, "ids": ids, "sentencepiece": sp.decode(ids)} for name, ids in raw]

    out = {
        "generator": "scripts/make_spm_fixtures.py",
        "sentencepiece_version": spm.__version__,
        "trainer": TRAINER,
        "vocab_size": sp.get_piece_size(),
        "metadata": meta,
        "cases": cases,
        "decode_cases": decode_cases,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(layout(out))
    n_bytes = sum(1 for c in cases for i in c["ids"] if sp.is_byte(i))
    print(f"{sp.get_piece_size()} pieces, {len(cases)} cases ({n_bytes} byte pieces), "
          f"{len(decode_cases)} decode cases written to {out_path}")


if __name__ == "__main__":
    main(sys.argv[1])
