#!/usr/bin/env python3
"""Writes an independent decoding of a GGUF file's tensors for tests/gguf.rs.

Usage: python3 scripts/gguf_reference.py MODEL.gguf OUT_DIR [TENSOR ...]

Decodes each named tensor (default: the embedding, one attention weight, one norm) with the
`gguf` package from PyPI (llama.cpp's own Python reader, whose numpy `dequantize` mirrors
llama.cpp's `dequantize_row_*`) and writes OUT_DIR/<name>.f32 (little-endian f32, row-major).
Then `LLK_TEST_GGUF=MODEL.gguf LLK_TEST_GGUF_REF=OUT_DIR cargo test --test gguf` compares the
crate's decoding with it bit for bit.
"""
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

path, out = sys.argv[1], sys.argv[2]
names = sys.argv[3:] or ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight"]
reader = gguf.GGUFReader(path)
by_name = {t.name: t for t in reader.tensors}
for name in names:
    t = by_name[name]
    values = dequantize(t.data, t.tensor_type).astype("<f4").reshape(-1)
    values.tofile(f"{out}/{name}.f32")
    print(f"{name}: {t.tensor_type.name} {list(reversed([int(d) for d in t.shape]))} -> {out}/{name}.f32")
