#!/usr/bin/env python3
"""Writes tests/fixtures/nf4/bnb_nf4.json: NF4 weights quantized, serialized and dequantized by
bitsandbytes itself, for tests/nf4.rs.

Usage (bitsandbytes 0.49.2 from PyPI; torch 2.9.0 (+cu128 wheel, run on the CPU) and
transformers 4.57.1 are in the project's hf-python environment; no GPU):

    pip install --target .toolchain/hf-python --no-deps bitsandbytes==0.49.2
    PYTHONPATH=.toolchain/hf-python python3 scripts/make_nf4_fixtures.py tests/fixtures/nf4/bnb_nf4.json

Made with bitsandbytes 0.49.2, torch 2.9.0+cu128, numpy 2.4.6, Python 3.11, on an x86-64 CPU
with AVX-512 (bitsandbytes' CPU backend: `libbitsandbytes_cpu.so` for `quantize_blockwise`,
`dequantize_blockwise` and `dequantize_4bit`; its `default` torch backend for `quantize_4bit`).
Nothing here is reimplemented: every byte and every float comes out of bitsandbytes.

Method, per case (seeded `torch.randn` weights `[rows, cols]` in f32, times a per-row scale so
the blocks' absmax values spread):

1. `bnb.nn.Linear4bit(cols, rows, quant_type="nf4", compress_statistics=..., blocksize)` gets
   the weight as a `Params4bit`, quantized by `.to("cpu")` (which calls
   `bitsandbytes.functional.quantize_4bit`). Its `state_dict()` is exactly what
   transformers' `save_pretrained` writes for the layer: `weight` (uint8 `[n / 2, 1]`, element
   2j in the high nibble of byte j, the flattened weight), and the packed quant state
   (`QuantState.as_dict(packed=True)`): `weight.absmax`, `weight.quant_map` and, with
   double quantization, `weight.nested_absmax` and `weight.nested_quant_map`, plus
   `weight.quant_state.bitsandbytes__nf4`, a uint8 tensor holding the UTF-8 JSON of the
   non-tensor fields (`quant_type`, `blocksize`, `dtype`, `shape`, and `nested_blocksize`,
   `nested_dtype`, `nested_offset`). Every tensor is recorded (`tensors`: safetensors dtype
   name, shape, little-endian bytes in hex), so the Rust test writes a checkpoint under
   these very names.
2. `dequantized`: `bitsandbytes.functional.dequantize_4bit(weight, quant_state)` as f32 bits
   (one f32 product `code[q] * absmax` per element on every backend: CPU, default, CUDA).
3. With double quantization, `resolved_absmax`: the f32 absmax bitsandbytes computes inside
   `dequantize_4bit` before the 4-bit step: `dequantize_blockwise(absmax_codes, state2)`
   (`nested_quant_map[code] * nested_absmax[i // nested_blocksize]`, f32) and then
   `+= offset` (f32), in that order.
4. Checks made here: the state reloaded through `QuantState.from_dict` (the loader path,
   `nested_offset` through JSON) dequantizes to the same bits; `quant_map` equals
   `get_4bit_type("nf4")`.

The last case has 272 blocks, so its absmax codes span two nested blocks of 256 (the second
partial): it uses blocksize 32 (which bitsandbytes allows for 4-bit) to keep the file small.
"""
import json
import sys

import bitsandbytes as bnb
import bitsandbytes.functional as F
import numpy as np
import torch
from bitsandbytes.utils import unpack_tensor_to_dict

ST_DTYPE = {torch.uint8: "U8", torch.float32: "F32"}

# (rows, cols, blocksize, compress_statistics, seed)
CASES = [
    (8, 256, 64, False, 1),
    (8, 256, 64, True, 2),
    (3, 512, 128, False, 3),
    (3, 512, 128, True, 4),
    (17, 512, 32, True, 5),
]


def tensor_entry(t):
    t = t.detach().contiguous().cpu()
    return {
        "dtype": ST_DTYPE[t.dtype],
        "shape": list(t.shape),
        "hex": t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes().hex(),
    }


def f32_hex(t):
    assert t.dtype == torch.float32
    return t.detach().contiguous().cpu().numpy().astype("<f4").tobytes().hex()


def case(rows, cols, blocksize, nested, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g, dtype=torch.float32)
    w *= torch.exp(torch.randn(rows, 1, generator=g)) * 0.05
    layer = bnb.nn.Linear4bit(
        cols,
        rows,
        bias=False,
        compute_dtype=torch.float32,
        compress_statistics=nested,
        quant_type="nf4",
    )
    layer.weight = bnb.nn.Params4bit(
        w.clone(), requires_grad=False, quant_type="nf4", compress_statistics=nested, blocksize=blocksize
    )
    layer = layer.to("cpu")
    assert layer.weight.bnb_quantized
    qs = layer.weight.quant_state
    sd = layer.state_dict()
    tensors = {k: tensor_entry(v) for k, v in sd.items()}

    deq = F.dequantize_4bit(layer.weight.data, qs)
    assert deq.dtype == torch.float32 and list(deq.shape) == [rows, cols]

    # The loader's path: the state rebuilt from the saved tensors (offset through JSON).
    qs_dict = {k[len("weight."):]: v for k, v in sd.items() if k != "weight"}
    reloaded = F.QuantState.from_dict(qs_dict, device=torch.device("cpu"))
    deq2 = F.dequantize_4bit(sd["weight"], reloaded)
    assert torch.equal(deq.view(torch.int32), deq2.view(torch.int32)), "reload changed the bits"
    assert torch.equal(sd["weight.quant_map"], F.get_4bit_type("nf4", device="cpu"))

    out = {
        "name": f"nf4_{rows}x{cols}_b{blocksize}{'_nested' if nested else ''}",
        "rows": rows,
        "cols": cols,
        "blocksize": blocksize,
        "compress_statistics": nested,
        "seed": seed,
        "tensors": tensors,
        "quant_state": unpack_tensor_to_dict(sd["weight.quant_state.bitsandbytes__nf4"]),
        "dequantized": f32_hex(deq.reshape(-1)),
    }
    if nested:
        # Exactly the two statements of bitsandbytes.functional.dequantize_4bit.
        absmax = F.dequantize_blockwise(qs.absmax, qs.state2)
        absmax += qs.offset
        assert absmax.dtype == torch.float32
        out["resolved_absmax"] = f32_hex(absmax)
        out["nested_blocks"] = int(qs.state2.absmax.numel())
    return out


def main():
    cases = [case(*c) for c in CASES]
    doc = {
        "generator": "scripts/make_nf4_fixtures.py",
        "versions": {
            "bitsandbytes": bnb.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "cases": cases,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print([c["name"] for c in cases], "written to", sys.argv[1])


if __name__ == "__main__":
    main()
