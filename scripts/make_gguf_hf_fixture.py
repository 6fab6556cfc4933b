#!/usr/bin/env python3
"""Hugging Face reference for the GGUF loader (run through `scripts/make_hf_fixtures.sh --gguf`).

llama.cpp's converter permutes the rows of every q and k head of a Llama checkpoint for its
interleaved RoPE; a GGUF loader has to undo that to get back Hugging Face's half-split model.
The independent reference is transformers itself: `AutoModelForCausalLM.from_pretrained(dir,
gguf_file=name, torch_dtype=torch.float32)` dequantizes the file with the `gguf` package and
reverse-permutes q and k with its own code (`modeling_gguf_pytorch_utils`). This script loads the
test model that way (pinned torch, transformers and gguf, on the CPU, f32, eager attention) and
writes tests/fixtures/hf/smollm2_gguf/fixture.json (read by tests/gguf_hf.rs):

  versions   torch, transformers, gguf, numpy and Python versions, and the GGUF file's name,
             size and sha256 (the test checks the file it loads against them)
  rows       rows of the loaded state dict, exact f32 (little-endian bytes, base64): layers 0 and
             29, q_proj rows 0 1 31 32 33 63 64 100 and k_proj rows 0 1 32 63 64 191 (they straddle
             the half-split pairs: row a*32+b of a head is GGUF row 2b+a, so a wrong or missing
             permutation moves them; 0 and 63 of each head are fixed points, kept as controls),
             plus v_proj row 0 (never permuted)
  prompt     the text "The capital of France is" and the ids the GGUF's own tokenizer (as
             transformers converts it) gives it, without special tokens (the file's
             add_bos_token is false); the ids are what the test feeds
  logits     the model's f32 logits at the last position (all 49152, f32 little-endian, base64),
             the argmax and the gap between the top two logits at every position

Usage: scripts/make_hf_fixtures.sh --gguf    (installs the pinned env, then runs this with
       --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/fixtures/hf/smollm2_gguf)
"""

import argparse
import base64
import hashlib
import json
import os
import platform

import numpy as np
import torch

PROMPT = "The capital of France is"
LAYERS = [0, 29]
ROWS = {
    "q_proj": [0, 1, 31, 32, 33, 63, 64, 100],
    "k_proj": [0, 1, 32, 63, 64, 191],
    "v_proj": [0],
}


def b64_f32(values):
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    import transformers
    from importlib.metadata import version
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the GGUF file")
    ap.add_argument("--out", required=True, help="output folder")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    folder, name = os.path.split(os.path.abspath(args.model))

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # No special tokens: the file says tokenizer.ggml.add_bos_token = false (llama.cpp adds none),
    # but transformers' converted tokenizer would prepend bos id 1 by default.
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152), cfg
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (9, 3), cfg
    assert cfg.tie_word_embeddings, "SmolLM2's GGUF has no output.weight: the head is the embedding"
    sd = model.state_dict()
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)

    rows = []
    for layer in LAYERS:
        for proj, which in ROWS.items():
            key = f"model.layers.{layer}.self_attn.{proj}.weight"
            w = sd[key]
            assert w.dtype == torch.float32, (key, w.dtype)
            picked = w[which].numpy()
            rows.append({"tensor": key, "shape": list(w.shape), "rows": which, "f32_le": b64_f32(picked)})

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    top2 = torch.topk(logits, 2, dim=-1).values
    out = {
        "made_by": "scripts/make_hf_fixtures.sh --gguf (scripts/make_gguf_hf_fixture.py)",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": version("gguf"),
            "numpy": np.__version__,
            "python": platform.python_version(),
            "model_file": name,
            "model_bytes": os.path.getsize(args.model),
            "model_sha256": sha256(args.model),
        },
        "load": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32, "
        "attn_implementation='eager'), CPU",
        "rows": rows,
        "prompt": {"text": PROMPT, "ids": ids, "special_tokens": "none (add_special_tokens=False)"},
        "logits": {
            "vocab": int(logits.shape[1]),
            "last_f32_le": b64_f32(logits[-1].numpy()),
            "argmax": [int(i) for i in logits.argmax(dim=-1)],
            "top2_gap": [float(a - b) for a, b in top2.tolist()],
        },
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fixture.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, gguf {version('gguf')}")
    print(f"prompt ids {ids}; argmax {out['logits']['argmax']} ({tok.decode(out['logits']['argmax'])!r})")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
