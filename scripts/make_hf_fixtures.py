#!/usr/bin/env python3
"""Hugging Face reference fixtures for the block composer (run through make_hf_fixtures.sh).

Builds small decoder layers with Hugging Face transformers itself (pinned, PyTorch on the CPU,
f32, eager attention), with seeded random weights, runs them on seeded random hidden states, and
writes for each model a checkpoint directory the Rust loader reads like any other:

  tests/fixtures/hf/llama3/   config.json (flat LlamaConfig), model.safetensors
                              (model.layers.0.*), io.safetensors
  tests/fixtures/hf/llama4/   config.json (multimodal form: text_config nested), two shards
                              and model.safetensors.index.json (language_model.model.layers.N.*),
                              io.safetensors

io.safetensors holds, per layer N, `layers.N.input` and `layers.N.output`: [batch, seq, hidden]
f32, the decoder layer's input and output for a batch of sequences that all start at position 0
(Hugging Face's own RoPE module, masks built exactly as transformers builds them: causal, or
chunked causal on Llama 4 RoPE layers; cache_position = the absolute positions, which is what
Llama 4's temperature tuning reads).

Llama 4 layers: 0 RoPE + dense, 1 RoPE + MoE (top-2 of 4), 2 NoPE + dense, 3 NoPE + MoE.
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file

SEQ = 12
BATCH = 2


def init_weights(module, generator):
    """Weights of order 1 / sqrt(fan_in) (Hugging Face's 0.02 init makes every output ~0)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("layernorm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=generator))
            elif name.endswith("experts.gate_up_proj"):  # [E, hidden, 2I], used as x @ W
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)
            elif name.endswith("experts.down_proj"):  # [E, I, hidden]
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)
            elif p.dim() == 2:  # nn.Linear [out, in]
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))


def mask(seq, chunk=None):
    """[1, 1, seq, seq] additive mask: causal, or chunked causal (keys in the query's chunk)."""
    q = torch.arange(seq)[:, None]
    k = torch.arange(seq)[None, :]
    allowed = k <= q
    if chunk is not None:
        allowed &= (k // chunk) == (q // chunk)
    m = torch.zeros(seq, seq)
    m[~allowed] = torch.finfo(torch.float32).min
    return m[None, None]


def llama3(out, generator):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        max_position_embeddings=131072,
        vocab_size=32,
        torch_dtype="float32",
    )
    cfg._attn_implementation = "eager"
    layer = LlamaDecoderLayer(cfg, 0).eval()
    init_weights(layer, generator)
    rotary = LlamaRotaryEmbedding(cfg)
    x = torch.randn(BATCH, SEQ, cfg.hidden_size, generator=generator)
    pos = torch.arange(SEQ)[None].expand(BATCH, SEQ)
    with torch.no_grad():
        cos_sin = rotary(x, pos)
        y = layer(x, attention_mask=mask(SEQ), position_ids=pos, position_embeddings=cos_sin,
                  cache_position=torch.arange(SEQ))
        y = y[0] if isinstance(y, tuple) else y
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(cfg.to_json_string())
    save_file({f"model.layers.0.{k}": v.contiguous() for k, v in layer.state_dict().items()},
              os.path.join(out, "model.safetensors"))
    save_file({"layers.0.input": x.contiguous(), "layers.0.output": y.contiguous()},
              os.path.join(out, "io.safetensors"))


def llama4(out, generator):
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextDecoderLayer, Llama4TextRotaryEmbedding

    cfg = Llama4TextConfig(
        hidden_size=128,
        intermediate_size=64,
        intermediate_size_mlp=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 16.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
        no_rope_layers=[1, 1, 0, 0],
        attention_chunk_size=4,
        use_qk_norm=True,
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.1,
        num_local_experts=4,
        num_experts_per_tok=2,
        interleave_moe_layer_step=2,
        vocab_size=32,
        max_position_embeddings=131072,
        torch_dtype="float32",
    )
    cfg._attn_implementation = "eager"
    rotary = Llama4TextRotaryEmbedding(cfg)
    pos = torch.arange(SEQ)[None].expand(BATCH, SEQ)
    shards = [{}, {}]
    io = {}
    x = torch.randn(BATCH, SEQ, cfg.hidden_size, generator=generator)
    for i in range(cfg.num_hidden_layers):
        layer = Llama4TextDecoderLayer(cfg, i).eval()
        init_weights(layer, generator)
        chunked = cfg.layer_types[i] == "chunked_attention"
        with torch.no_grad():
            freqs = rotary(x, pos)
            y = layer(x, attention_mask=mask(SEQ, cfg.attention_chunk_size if chunked else None),
                      position_ids=pos, position_embeddings=freqs, cache_position=torch.arange(SEQ))
            y = y[0] if isinstance(y, tuple) else y
        for k, v in layer.state_dict().items():
            shards[i // 2][f"language_model.model.layers.{i}.{k}"] = v.contiguous()
        io[f"layers.{i}.input"] = x.contiguous()
        io[f"layers.{i}.output"] = y.contiguous()
        x = torch.randn(BATCH, SEQ, cfg.hidden_size, generator=generator)  # fresh input per layer
    os.makedirs(out, exist_ok=True)
    config = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
              "text_config": json.loads(cfg.to_json_string())}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    weight_map = {}
    for s, tensors in enumerate(shards):
        name = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, os.path.join(out, name))
        weight_map.update({k: name for k in tensors})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    save_file(io, os.path.join(out, "io.safetensors"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/hf")
    args = ap.parse_args()
    import transformers

    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    llama3(os.path.join(args.out, "llama3"), torch.Generator().manual_seed(1))
    llama4(os.path.join(args.out, "llama4"), torch.Generator().manual_seed(2))
    with open(os.path.join(args.out, "VERSIONS"), "w") as f:
        f.write(f"torch {torch.__version__}\ntransformers {transformers.__version__}\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
