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


def write_gguf(path, arch, cfg, tensors, extra_metadata):
    import gguf

    w = gguf.GGUFWriter(path, arch)
    common_metadata(w, cfg)
    extra_metadata(w)
    for name, t in tensors:
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


def llama31(out, generator):
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=131072, tie_word_embeddings=False, attn_implementation="eager",
    )
    cfg = LlamaConfig(rope_scaling=scaling, **common)
    model = LlamaForCausalLM(cfg)
    init_weights(model, generator)
    os.makedirs(out, exist_ok=True)
    sd = save_checkpoint(model, out)
    ids = torch.randint(0, VOCAB, (160,), generator=generator).tolist()
    logits = logits_of(model, ids)
    plain = LlamaForCausalLM(LlamaConfig(rope_scaling=None, **common))
    plain.load_state_dict(model.state_dict())
    unscaled = logits_of(plain, ids)

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    tensors = []
    for hf, t in sd.items():
        t = t.float()
        if hf.endswith("q_proj.weight"):
            t = permute(t, cfg.num_attention_heads, cfg.num_attention_heads)
        elif hf.endswith("k_proj.weight"):
            t = permute(t, cfg.num_attention_heads, cfg.num_key_value_heads)
        tensors.append((gguf_name(tmap, hf), t))
    tensors.append(("rope_freqs.weight", rope_factors(cfg.rope_theta, cfg.head_dim, scaling)))

    def meta(w):
        w.add_feed_forward_length(cfg.intermediate_size)

    path = os.path.join(out, "model.gguf")
    write_gguf(path, "llama", cfg, tensors, meta)
    return {
        "prompt": ids,
        "logits": {"shape": list(logits.shape), "f32_le": b64_f32(logits.numpy())},
        "logits_unscaled": {"shape": list(unscaled.shape), "f32_le": b64_f32(unscaled.numpy())},
        "rope_freqs": [float(x) for x in rope_factors(cfg.rope_theta, cfg.head_dim, scaling)],
        "transformers_gguf": transformers_gguf(out, "model.gguf"),
    }


def llama4(out, generator):
    import gguf
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    layers = 4
    cfg = Llama4TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, intermediate_size_mlp=64,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
        num_local_experts=4, num_experts_per_tok=2, interleave_moe_layer_step=2, moe_layers=[1, 3],
        # llama.cpp's fixed Llama 4 layout (llama-model.cpp, LLM_ARCH_LLAMA4)
        no_rope_layers=[int((i + 1) % 4 != 0) for i in range(layers)],
        layer_types=["chunked_attention" if (i + 1) % 4 != 0 else "full_attention" for i in range(layers)],
        attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
        use_qk_norm=True, tie_word_embeddings=False, attn_implementation="eager",
    )
    model = Llama4ForCausalLM(cfg)
    init_weights(model, generator)
    os.makedirs(out, exist_ok=True)
    sd = save_checkpoint(model, out)
    ids = torch.randint(0, VOCAB, (40,), generator=generator).tolist()
    logits = logits_of(model, ids)

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA4, layers)
    tensors = []
    for hf, t in sd.items():
        t = t.float()
        if hf.endswith("experts.gate_up_proj"):  # Llama4Model.modify_tensors
            half = t.shape[-1] // 2
            gate, up = t.transpose(-1, -2).split(half, dim=-2)
            tensors.append((gguf_name(tmap, hf.replace("gate_up_proj", "gate_proj.weight")), gate))
            tensors.append((gguf_name(tmap, hf.replace("gate_up_proj", "up_proj.weight")), up))
            continue
        if hf.endswith("experts.down_proj"):
            hf, t = hf + ".weight", t.transpose(-1, -2)
        tensors.append((gguf_name(tmap, hf), t))
    tensors.append(("rope_freqs.weight", rope_factors(cfg.rope_theta, cfg.head_dim, cfg.rope_scaling)))

    def meta(w):
        w.add_feed_forward_length(cfg.intermediate_size_mlp)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_interleave_moe_layer_step(cfg.interleave_moe_layer_step)

    path = os.path.join(out, "model.gguf")
    write_gguf(path, "llama4", cfg, tensors, meta)
    return {
        "prompt": ids,
        "logits": {"shape": list(logits.shape), "f32_le": b64_f32(logits.numpy())},
        "transformers_gguf": transformers_gguf(out, "model.gguf"),
    }


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
    for name, make, seed in [("llama31", llama31, 31), ("llama4", llama4, 4)]:
        folder = os.path.join(args.out, name)
        ref = make(folder, torch.Generator().manual_seed(seed))
        ref = {"made_by": "scripts/make_hf_fixtures.sh --arch (scripts/make_gguf_arch_fixtures.py)",
               "versions": versions, **ref}
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        print(f"{name}: transformers' GGUF loader: {ref['transformers_gguf']}")
        print(f"{name}: wrote {sorted(os.listdir(folder))}")


if __name__ == "__main__":
    main()
