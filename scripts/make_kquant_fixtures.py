#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/kquants.json: random Q4_K, Q5_K and Q6_K super-blocks and their
decoding by the `gguf` package from PyPI (llama.cpp's own Python reader; its numpy
`dequantize_blocks` mirrors llama.cpp's `dequantize_row_q*_K`).

Usage: pip install --target /tmp/pygguf gguf
       PYTHONPATH=/tmp/pygguf python3 scripts/make_kquant_fixtures.py tests/fixtures/gguf/kquants.json

Blocks are random bytes from a fixed seed, except the f16 scales, which are drawn finite
(|d| < 2^-4, as quantized weights have), so every decoded value is finite.
"""
import json
import sys

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(20261202)
# (type, bytes per block, byte offsets of its f16 scales)
layouts = [(T.Q4_K, 144, [0, 2]), (T.Q5_K, 176, [0, 2]), (T.Q6_K, 210, [208])]
out = {}
for ty, size, halves in layouts:
    blocks = rng.integers(0, 256, size=(4, size), dtype=np.uint8)
    for off in halves:
        h = (rng.standard_normal(4) * 0.01).astype(np.float16).view(np.uint8).reshape(4, 2)
        blocks[:, off:off + 2] = h
    values = dequantize(blocks.reshape(-1), ty).astype("<f4").reshape(-1)
    assert np.isfinite(values).all()
    out[ty.name] = {"blocks": blocks.tobytes().hex(), "values": values.tobytes().hex()}
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print({k: len(v["values"]) // 8 for k, v in out.items()}, "values written to", sys.argv[1])
