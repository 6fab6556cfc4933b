#!/usr/bin/env python3
"""Writes crates/llama-model/tests/fixtures/gguf/quants.json: random blocks of the quantized types
the GGUF reader decodes (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS), 1024 values
of each, and their decoding by the `gguf` package from PyPI (llama.cpp's own Python reader; its
numpy `dequantize_blocks` mirrors llama.cpp's `dequantize_row_*`).

Usage: pip install --target /tmp/pygguf gguf==0.17.1
       PYTHONPATH=/tmp/pygguf python3 scripts/make_quant_fixtures.py crates/llama-model/tests/fixtures/gguf/quants.json

Blocks are random bytes from a fixed seed, except the f16 scales, which are drawn finite
(|d| < 2^-4, as quantized weights have), so every decoded value is finite.
"""
import json
import sys

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(20261202)
# (type, values per block, bytes per block, byte offsets of its f16 scales); the first three as
# this script first wrote them (the same draws), the others after.
layouts = [
    (T.Q4_K, 256, 144, [0, 2]), (T.Q5_K, 256, 176, [0, 2]), (T.Q6_K, 256, 210, [208]),
    (T.Q5_0, 32, 22, [0]), (T.Q5_1, 32, 24, [0, 2]), (T.Q2_K, 256, 84, [80, 82]),
    (T.Q3_K, 256, 110, [108]), (T.IQ4_NL, 32, 18, [0]), (T.IQ4_XS, 256, 136, [0]),
]
out = {}
for ty, per_block, size, halves in layouts:
    n = 1024 // per_block
    blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in halves:
        h = (rng.standard_normal(n) * 0.01).astype(np.float16).view(np.uint8).reshape(n, 2)
        blocks[:, off:off + 2] = h
    values = dequantize(blocks.reshape(-1), ty).astype("<f4").reshape(-1)
    assert np.isfinite(values).all()
    out[ty.name] = {"blocks": blocks.tobytes().hex(), "values": values.tobytes().hex()}
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print({k: len(v["values"]) // 8 for k, v in out.items()}, "values written to", sys.argv[1])
