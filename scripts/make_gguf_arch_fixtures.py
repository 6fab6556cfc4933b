#!/usr/bin/env python3
"""Whole-model GGUF fixtures of the two architectures the loader reads, with Hugging Face
transformers as the reference (run through `scripts/make_hf_fixtures.sh --arch`).

For each model below the script builds a tiny random model in transformers (weights rounded to
f16, so the safetensors and GGUF copies hold the same numbers), saves it as a Hugging Face
checkpoint (config.json + model.safetensors, f16), converts it to GGUF the way llama.cpp's
`convert_hf_to_gguf.py` does, and records transformers' f32 logits for a fixed prompt:

  llama31/   architecture `llama`, Llama 3.1 rope_scaling (factor 8, low 1, high 4, 8192):
             q/k rows permuted for llama.cpp's interleaved RoPE (LlamaModel.permute),
             `rope_freqs.weight` computed as the converter does (torch.float32 inverse
             frequencies, Python arithmetic), 2 layers, 2 q / 1 kv heads of 64, 160 prompt tokens
             (at those positions the scaled pairs' angles differ by up to 0.5 rad from unscaled)
  llama4/    architecture `llama4`, Llama 4 Scout rope_scaling (16, 1, 1, 8192), in llama.cpp's
             fixed Llama 4 layout: layers 0-2 RoPE + chunked attention (8192) + qk norm, layer 3
             NoPE + global attention + temperature tuning (floor 8192, scale 0.1); MoE (4 experts,
             top 2, shared expert) on layers 1 and 3 (interleave_moe_layer_step 2), dense FFN on
             0 and 2; expert tensors split and transposed as Llama4Model.modify_tensors does,
             q/k not permuted; 40 prompt tokens

  llama31_q5/ llama4_q5/  the same architectures, wider (hidden 256, so that the K-quant super-
             blocks of 256 fit) and stored in the 5-bit types and Q8_0 (Q5_0, Q5_1, Q5_K; the
             gguf package quantizes Q5_0, Q5_1 and Q8_0, and Q5_K is quantized here, block by
             block, by a plain min/max rule), GGUF only: the reference is transformers on the
             values the gguf package dequantizes from the stored blocks.

Every file carries a small byte-level BPE vocabulary (64 tokens, 7 merges, llama.cpp's `gpt2`
model with the `llama-bpe` pre-tokenizer), so `generate` runs on it.

Tensor names come from the gguf package's own map (gguf.get_tensor_name_map), as the converter
uses them. Each folder gets reference.json:

  versions        torch, transformers, gguf, numpy, Python
  prompt          the token ids fed (from 0, one sequence)
  logits          transformers' f32 logits at every position, [tokens, vocab] (little-endian f32,
                  base64), eager attention on the CPU
  logits_unscaled (llama31) the same model with rope_scaling removed: the control the test uses
                  to show its bound can fail
  transformers_gguf  what transformers' own GGUF loader does with the file (it has no llama4)

Usage: scripts/make_hf_fixtures.sh --arch
"""

import argparse
import base64
import json
import math
import os
import platform

import numpy as np
import torch

VOCAB = 64


def b64_f32(values):
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")


def init_weights(model, generator):
    """Weights of order 1 / sqrt(fan_in), rounded to f16 (norms around 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 0.5 + torch.rand(p.shape, generator=generator)
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                v = torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5  # used as x @ W
            elif p.dim() == 2:
                v = torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5
            else:
                v = 0.1 * torch.randn(p.shape, generator=generator)
            p.copy_(v.half().float())


def save_checkpoint(model, out):
    from safetensors.torch import save_file

    model.config.save_pretrained(out)
    sd = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return sd


def permute(weights, n_head, n_head_kv):
    """llama.cpp's LlamaModel.permute: rows of each head reordered for interleaved RoPE."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def rope_factors(theta, dim, rope_scaling, old_context_len=8192):
    """llama.cpp's LlamaModel.generate_extra_tensors for rope_type llama3 (its arithmetic)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope_scaling["factor"]
    low_freq_factor = rope_scaling["low_freq_factor"]
    high_freq_factor = rope_scaling["high_freq_factor"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def common_metadata(w, cfg):
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(1)  # MOSTLY_F16


# A 64-token byte-level vocabulary: letters, a few digits and marks, the space as GPT-2's "Ġ",
# and seven merged pairs; "." ends a sentence (the end-of-sequence id).
TOKENS = (
    [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    + ["\u0120", ",", ".", "0", "1"]
    + ["th", "he", "in", "er", "an", "\u0120t", "\u0120a"]
)
MERGES = ["t h", "h e", "i n", "e r", "a n", "\u0120 t", "\u0120 a"]
assert len(TOKENS) == VOCAB
EOS = TOKENS.index(".")


def add_tokenizer(w):
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(TOKENS)
    w.add_token_types([1] * len(TOKENS))
    w.add_token_merges(MERGES)
    w.add_eos_token_id(EOS)
    w.add_add_bos_token(False)


def quantize_q5_k(x):
    """Q5_K blocks of `x` ([rows, cols], cols a multiple of 256) by a plain min/max rule: per
    32-element sub-block a scale and minimum, 6 bits each against the super-block's f16 d and
    dmin, values rounded to 0..31. Returns the raw bytes, [rows, cols / 256 * 176] uint8."""
    rows, cols = x.shape
    blocks = x.reshape(-1, 8, 32).astype(np.float64)
    lo = np.minimum(blocks.min(axis=2), 0.0)
    span = np.maximum(blocks.max(axis=2) - lo, 1e-8) / 31.0
    d = np.maximum(span.max(axis=1) / 63.0, 2.0**-14).astype(np.float16)
    dmin = np.maximum((-lo).max(axis=1) / 63.0, 2.0**-14).astype(np.float16)
    sc = np.clip(np.round(span / d.astype(np.float64)[:, None]), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / dmin.astype(np.float64)[:, None]), 0, 63).astype(np.uint8)
    d1 = d.astype(np.float32)[:, None] * sc.astype(np.float32)
    m1 = dmin.astype(np.float32)[:, None] * mn.astype(np.float32)
    q = np.clip(np.round((blocks + m1[:, :, None]) / d1[:, :, None]), 0, 31).astype(np.uint8)
    out = np.zeros((blocks.shape[0], 176), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    for j in range(4):  # get_scale_min_k4's packing
        out[:, 4 + j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        out[:, 8 + j] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        out[:, 12 + j] = (sc[:, j + 4] & 15) | ((mn[:, j + 4] & 15) << 4)
    for g in range(4):  # sub-blocks 2g (low nibbles, qh bit 2g) and 2g + 1 (high, bit 2g + 1)
        a, b = q[:, 2 * g, :], q[:, 2 * g + 1, :]
        out[:, 48 + 32 * g : 80 + 32 * g] = (a & 15) | ((b & 15) << 4)
        out[:, 16:48] |= ((a >> 4) << (2 * g)) | ((b >> 4) << (2 * g + 1))
    return out.reshape(rows, cols // 256 * 176)


def quantize(t, qtype):
    """`t` (float, any rank) in `qtype`: (raw blocks, the values the gguf package decodes)."""
    import gguf
    from gguf.quants import dequantize

    a = t.detach().float().numpy()
    if qtype == gguf.GGMLQuantizationType.Q5_K:
        raw = quantize_q5_k(a.reshape(-1, a.shape[-1])).reshape(*a.shape[:-1], -1)
    else:
        raw = gguf.quants.quantize(a, qtype)
    values = dequantize(raw, qtype).reshape(a.shape)
    return raw, torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def write_gguf(path, arch, cfg, tensors, extra_metadata):
    import gguf

    w = gguf.GGUFWriter(path, arch)
    common_metadata(w, cfg)
    extra_metadata(w)
    add_tokenizer(w)
    for name, t in tensors:
        if isinstance(t, tuple):  # (raw blocks, type): already quantized
            raw, qtype = t
            w.add_tensor(name, raw, raw_dtype=qtype)
            continue
        a = t.detach().float().numpy()
        # As the converter writes an F16 model: 1-D tensors (norms, rope_freqs) stay f32.
        w.add_tensor(name, a.astype(np.float32 if a.ndim == 1 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_name(tmap, hf):
    name = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
    assert name is not None, f"the gguf package has no name for {hf}"
    return name


@torch.no_grad()
def logits_of(model, ids):
    model.eval()
    return model(input_ids=torch.tensor([ids])).logits[0].float()


def transformers_gguf(folder, name):
    from transformers import AutoModelForCausalLM

    try:
        AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        return "loads"
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def llama31_config(quant):
    from transformers import LlamaConfig

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    wide = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2)
    narrow = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1)
    common = dict(
        vocab_size=VOCAB, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        tie_word_embeddings=False, attn_implementation="eager", **(wide if quant else narrow),
    )
    return LlamaConfig(rope_scaling=scaling, **common), LlamaConfig(rope_scaling=None, **common)


def llama4_config(quant):
    from transformers import Llama4TextConfig

    layers = 4
    sizes = dict(hidden_size=256, intermediate_size=32, intermediate_size_mlp=64) if quant else dict(
        hidden_size=64, intermediate_size=32, intermediate_size_mlp=64)
    return Llama4TextConfig(
        vocab_size=VOCAB, num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
        num_local_experts=4, num_experts_per_tok=2, interleave_moe_layer_step=2, moe_layers=[1, 3],
        # llama.cpp's fixed Llama 4 layout (llama-model.cpp, LLM_ARCH_LLAMA4)
        no_rope_layers=[int((i + 1) % 4 != 0) for i in range(layers)],
        layer_types=["chunked_attention" if (i + 1) % 4 != 0 else "full_attention" for i in range(layers)],
        attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
        use_qk_norm=True, tie_word_embeddings=False, attn_implementation="eager", **sizes,
    )


def to_gguf(arch, cfg, sd):
    """The converter's tensors of state dict `sd`: [(GGUF name, tensor, how to map the GGUF
    tensor's values back to `sd`: (HF name, function) or None when it is a split part)]."""
    import gguf

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.LLAMA4,
                                    cfg.num_hidden_layers)
    out = []
    for hf, t in sd.items():
        t = t.float()
        if arch == "llama" and hf.endswith("q_proj.weight"):  # LlamaModel.modify_tensors
            out.append((gguf_name(tmap, hf), permute(t, cfg.num_attention_heads, cfg.num_attention_heads), hf))
        elif arch == "llama" and hf.endswith("k_proj.weight"):
            out.append((gguf_name(tmap, hf), permute(t, cfg.num_attention_heads, cfg.num_key_value_heads), hf))
        elif hf.endswith("experts.gate_up_proj"):  # Llama4Model.modify_tensors
            half = t.shape[-1] // 2
            gate, up = t.transpose(-1, -2).split(half, dim=-2)
            out.append((gguf_name(tmap, hf.replace("gate_up_proj", "gate_proj.weight")), gate, hf))
            out.append((gguf_name(tmap, hf.replace("gate_up_proj", "up_proj.weight")), up, hf))
        elif hf.endswith("experts.down_proj"):
            out.append((gguf_name(tmap, hf + ".weight"), t.transpose(-1, -2), hf))
        else:
            out.append((gguf_name(tmap, hf), t, hf))
    return out


def from_gguf_values(arch, cfg, hf, parts):
    """The HF tensor `hf` from the values of its GGUF tensor(s) `parts` (inverse of to_gguf)."""
    if arch == "llama" and (hf.endswith("q_proj.weight") or hf.endswith("k_proj.weight")):
        heads = cfg.num_attention_heads if hf.endswith("q_proj.weight") else cfg.num_key_value_heads
        t = parts[0]
        return t.reshape(heads, t.shape[0] // heads // 2, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
    if hf.endswith("experts.gate_up_proj"):
        return torch.cat(parts, dim=-2).transpose(-1, -2).contiguous()
    if hf.endswith("experts.down_proj"):
        return parts[0].transpose(-1, -2).contiguous()
    return parts[0]


# The 5-bit fixtures' types, by GGUF tensor kind (norms, the router and rope_freqs stay f32/f16).
Q5_TYPES = {
    "attn_q": "Q5_0", "attn_k": "Q5_1", "attn_v": "Q5_K", "attn_output": "Q5_K",
    "ffn_gate": "Q5_K", "ffn_up": "Q5_1", "ffn_down": "Q5_0",
    "ffn_gate_exps": "Q5_K", "ffn_up_exps": "Q8_0", "ffn_down_exps": "Q5_0",
    "ffn_gate_shexp": "Q5_1", "ffn_up_shexp": "Q5_0", "ffn_down_shexp": "Q5_0",
    "output": "Q5_K", "token_embd": "Q8_0",
}


def q5_type(name, t):
    import gguf

    kind = name.split(".")[-2]
    qtype = Q5_TYPES.get(kind)
    if qtype is None:
        return None
    qtype = getattr(gguf.GGMLQuantizationType, qtype)
    block = 256 if qtype == gguf.GGMLQuantizationType.Q5_K else 32
    if t.shape[-1] % block:  # llama.cpp falls back to a type whose block fits
        qtype = gguf.GGMLQuantizationType.Q5_0
    return qtype


def make(arch, out, generator, quant):
    """One fixture folder (see the module docs); returns its reference.json fields."""
    import gguf

    if arch == "llama":
        from transformers import LlamaForCausalLM as Model

        cfg, plain_cfg = llama31_config(quant)
        prompt_len = 160
    else:
        from transformers import Llama4ForCausalLM as Model

        cfg, plain_cfg = llama4_config(quant), None
        prompt_len = 40
    model = Model(cfg)
    init_weights(model, generator)
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().half().float() for k, v in model.state_dict().items()}
    if not quant:
        save_checkpoint(model, out)
    tensors = to_gguf(arch, cfg, sd)
    if quant:
        # Store the 5-bit types; the reference model gets the values the gguf package decodes.
        stored, decoded = [], {}
        for name, t, hf in tensors:
            qtype = q5_type(name, t)
            if qtype is None:
                stored.append((name, t))
                decoded.setdefault(hf, []).append(t)
                continue
            if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
                # Quantize in Hugging Face's row order and permute the blocks' rows, as
                # quantizing the permuted tensor would (blocks lie within rows).
                heads = cfg.num_attention_heads if name.endswith("attn_q.weight") else cfg.num_key_value_heads
                raw, _ = quantize(sd[hf], qtype)
                raw = permute(raw, heads, heads)
                values = torch.from_numpy(np.ascontiguousarray(
                    gguf.quants.dequantize(raw, qtype).reshape(t.shape), dtype=np.float32))
            else:
                raw, values = quantize(t, qtype)
            stored.append((name, (raw, qtype)))
            decoded.setdefault(hf, []).append(values)
        model.load_state_dict({hf: from_gguf_values(arch, cfg, hf, parts) for hf, parts in decoded.items()})
        tensors = stored
    else:
        tensors = [(name, t) for name, t, _ in tensors]
    ids = torch.randint(0, VOCAB, (prompt_len,), generator=generator).tolist()
    logits = logits_of(model, ids)
    tensors.append(("rope_freqs.weight", rope_factors(cfg.rope_theta, cfg.head_dim, cfg.rope_scaling)))

    def meta(w):
        if arch == "llama":
            w.add_feed_forward_length(cfg.intermediate_size)
        else:
            w.add_feed_forward_length(cfg.intermediate_size_mlp)
            w.add_expert_feed_forward_length(cfg.intermediate_size)
            w.add_expert_count(cfg.num_local_experts)
            w.add_expert_used_count(cfg.num_experts_per_tok)
            w.add_interleave_moe_layer_step(cfg.interleave_moe_layer_step)

    write_gguf(os.path.join(out, "model.gguf"), arch, cfg, tensors, meta)
    ref = {
        "prompt": ids,
        "logits": {"shape": list(logits.shape), "f32_le": b64_f32(logits.numpy())},
        "types": sorted({gguf.GGMLQuantizationType(t[1]).name for _, t in tensors if isinstance(t, tuple)}),
    }
    if plain_cfg is not None and not quant:
        plain = Model(plain_cfg)
        plain.load_state_dict(model.state_dict())
        unscaled = logits_of(plain, ids)
        ref["logits_unscaled"] = {"shape": list(unscaled.shape), "f32_le": b64_f32(unscaled.numpy())}
    ref["transformers_gguf"] = transformers_gguf(out, "model.gguf")
    return ref


def main():
    import transformers
    from importlib.metadata import version

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="output folder (tests/fixtures/gguf_arch)")
    args = ap.parse_args()
    torch.manual_seed(0)
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": version("gguf"),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    for name, arch, quant, seed in [
        ("llama31", "llama", False, 31),
        ("llama4", "llama4", False, 4),
        ("llama31_q5", "llama", True, 315),
        ("llama4_q5", "llama4", True, 45),
    ]:
        folder = os.path.join(args.out, name)
        ref = make(arch, folder, torch.Generator().manual_seed(seed), quant)
        ref = {"made_by": "scripts/make_hf_fixtures.sh --arch (scripts/make_gguf_arch_fixtures.py)",
               "versions": versions, **ref}
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        print(f"{name}: transformers' GGUF loader: {ref['transformers_gguf']}")
        print(f"{name}: wrote {sorted(os.listdir(folder))}")


if __name__ == "__main__":
    main()
