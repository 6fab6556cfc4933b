#!/usr/bin/env python3
"""peft + transformers in float64 as the independent reference of LoRA training.

Builds a tiny Llama 3 (2 layers, hidden 128, 4 q / 2 kv heads of 32, random weights, stored as float32 so every value is exact in
f32 and f64), wraps it with peft's LoRA on all seven projections (r 4, alpha 8, no dropout: a
dropout mask cannot be shared between two generators), draws A and B at random (B away from
peft's zero initialization, so every gradient is non-trivial) and saves:

  base/config.json, base/model.safetensors     the base model (LlamaForCausalLM.save_pretrained)
  adapter/adapter_config.json,
  adapter/adapter_model.safetensors            the adapter as PeftModel.save_pretrained writes it
  reference.json                               a packed batch of two examples (labels -100 on a
                                               prompt), the mean loss over their labelled tokens,
                                               every lora_A / lora_B gradient (float64, base64),
                                               and the losses of three AdamW steps on that batch;
                                               under "qlora", the loss and gradients of the same
                                               adapter on the NF4 base (float32)
  base_nf4/config.json, base_nf4/model.safetensors
                                               QLoRA's base: the base loaded with peft's recipe,
                                               BitsAndBytesConfig(load_in_4bit, nf4, double
                                               quantization, compute dtype float32) by
                                               bitsandbytes 0.49.2 on the CPU, and saved

The loss is LlamaForCausalLM's: logits of every token, shifted labels, cross-entropy with
ignore_index -100, the mean over both examples' labelled tokens (each example runs on its own,
as a packed batch with per-example attention does).

Usage: PYTHONPATH=.toolchain/hf-python python3 scripts/make_peft_fixtures.py \\
           --out crates/llama-model/tests/fixtures/peft
       (pinned: torch 2.9.0, transformers 4.57.1, peft 0.17.1, bitsandbytes 0.49.2 installed with
       --no-deps; CPU)
"""

import argparse
import base64
import json
import os
import platform

import numpy as np
import torch
import transformers
import peft
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def b64(t):
    return base64.b64encode(np.ascontiguousarray(t.detach().numpy(), dtype="<f8").tobytes()).decode("ascii")


def loss_of(model, examples):
    """Mean cross-entropy over the labelled tokens of every example (each run on its own)."""
    total, count = 0.0, 0
    for ids, labels in examples:
        logits = model(input_ids=torch.tensor([ids])).logits[0]
        shifted = torch.tensor(labels[1:] + [-100])
        total = total + torch.nn.functional.cross_entropy(logits, shifted, ignore_index=-100, reduction="sum")
        count += int((shifted != -100).sum())
    return total / count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(1234)
    cfg = LlamaConfig(
        vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        torch_dtype="float32",
    )
    base = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 / p.shape[-1] ** 0.5 if p.dim() == 2 else 1.0))
    os.makedirs(args.out, exist_ok=True)
    base.save_pretrained(os.path.join(args.out, "base"), safe_serialization=True)

    lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, lcfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.copy_((torch.rand_like(p) * 2 - 1) / p.shape[1] ** 0.5)
            elif "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    model.save_pretrained(os.path.join(args.out, "adapter"))

    # Everything in float64 from the saved (float32) values.
    model = model.to(torch.float64)
    g = torch.Generator().manual_seed(99)
    ids0 = torch.randint(0, cfg.vocab_size, (9,), generator=g).tolist()
    ids1 = torch.randint(0, cfg.vocab_size, (6,), generator=g).tolist()
    # Example 0 trains on its last 5 tokens only (a prompt of 4), example 1 on every token.
    examples = [(ids0, [-100] * 4 + ids0[4:]), (ids1, list(ids1))]
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    for p in model.parameters():
        p.requires_grad_(False)
    for p in lora.values():
        p.requires_grad_(True)
    loss = loss_of(model, examples)
    loss.backward()
    # peft's parameter names carry the adapter name; the saved file does not.
    grads = {n.replace(".default", ""): b64(p.grad) for n, p in lora.items()}

    lr, steps = 1e-2, 3
    opt = torch.optim.AdamW(list(lora.values()), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        step_loss = loss_of(model, examples)
        losses.append(float(step_loss))
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(list(lora.values()), max_norm=1.0)
        opt.step()
    losses.append(float(loss_of(model, examples)))

    # QLoRA: the same adapter on the base quantized by bitsandbytes (NF4, double quantization),
    # in float32 on the CPU.
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.float32)
    q = AutoModelForCausalLM.from_pretrained(os.path.join(args.out, "base"), quantization_config=bnb,
                                             device_map="cpu", dtype=torch.float32)
    q.save_pretrained(os.path.join(args.out, "base_nf4"))
    os.remove(os.path.join(args.out, "base_nf4", "generation_config.json"))
    # The products as bitsandbytes computes them on a GPU for more than one row: the weight
    # dequantized (dequantize_4bit) to the compute dtype, then a plain GEMM. (Its CPU fallback in
    # 0.49.2, without the `kernels` package, differs from that by about 4e-3 relative, more than
    # a float32 reference allows.)
    import bitsandbytes.functional as bnbf
    for layer in q.model.layers:
        for parent, names in [(layer.self_attn, ["q_proj", "k_proj", "v_proj", "o_proj"]),
                              (layer.mlp, ["gate_proj", "up_proj", "down_proj"])]:
            for name in names:
                m4 = getattr(parent, name)
                dense = torch.nn.Linear(m4.in_features, m4.out_features, bias=False, dtype=torch.float32)
                with torch.no_grad():
                    dense.weight.copy_(bnbf.dequantize_4bit(m4.weight.data, m4.weight.quant_state))
                setattr(parent, name, dense)
    q = PeftModel.from_pretrained(q, os.path.join(args.out, "adapter"), is_trainable=True)
    qlora = {n: p for n, p in q.named_parameters() if "lora_" in n}
    q_loss = loss_of(q, examples)
    q_loss.backward()
    q_grads = {n.replace(".default", ""): b64(p.grad.double()) for n, p in qlora.items()}

    ref = {
        "made_by": "scripts/make_peft_fixtures.py",
        "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
        "numpy": np.__version__, "python": platform.python_version(),
        "examples": [{"ids": e[0], "labels": e[1]} for e in examples],
        "loss": float(loss), "grads": grads,
        "adamw": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "max_grad_norm": 1.0},
        "losses": losses,
        "qlora": {"bitsandbytes": __import__("bitsandbytes").__version__, "loss": float(q_loss), "grads": q_grads},
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"loss {float(loss):.6f}; losses over {steps} AdamW steps: {losses}; QLoRA loss {float(q_loss):.6f}")


if __name__ == "__main__":
    main()
