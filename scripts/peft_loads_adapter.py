#!/usr/bin/env python3
"""Checks that peft reads an adapter `llama-kernels finetune` wrote for the test model.

Builds SmolLM2-135M-Instruct's architecture (random weights: only the module names and shapes
matter), loads the adapter with PeftModel.from_pretrained, and compares every lora_A / lora_B
tensor peft holds with the file's.

Usage: cargo run --release -- finetune --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
           --data crates/llama-model/tests/fixtures/train/chat.jsonl --out /tmp/adapter --steps 1
       PYTHONPATH=.toolchain/hf-python python3 scripts/peft_loads_adapter.py /tmp/adapter
       (torch 2.9.0, transformers 4.57.1, peft 0.17.1; CPU)
"""

import sys

import peft
from peft import PeftModel
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    adapter = sys.argv[1]
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    model = PeftModel.from_pretrained(LlamaForCausalLM(cfg), adapter)
    ours = load_file(f"{adapter}/adapter_model.safetensors")
    held = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    if set(held) != set(ours):
        sys.exit(f"peft holds {len(held)} adapter tensors, the file {len(ours)}")
    worst = max((held[k] - ours[k]).abs().max().item() for k in ours)
    c = model.peft_config["default"]
    print(f"peft {peft.__version__} loaded {len(ours)} tensors (r {c.r}, alpha {c.lora_alpha}, "
          f"targets {sorted(c.target_modules)}); largest difference from the file: {worst}")
    if worst != 0.0:
        sys.exit("the values differ")


if __name__ == "__main__":
    main()
