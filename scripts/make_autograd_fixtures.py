#!/usr/bin/env python3
"""PyTorch autograd in float64 as the independent reference of the backward ops.

Each case draws seeded inputs, runs the op's forward as transformers / Liger write it in float64,
and records torch.autograd's gradients; crates/llama-kernels/tests/kernels/backward_autograd.rs
feeds the same inputs through the public ops in f32 and compares. Values are stored exactly
(float64 little-endian, base64).

  rms_norm           LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w; grads of x and w
  fused_add_rms_norm s = x + residual; y = rms_norm(s); loss also reads s through the residual
                     stream (dot with a second upstream gradient, d_residual): grads of x,
                     residual and w
  swiglu             silu(gate) * up (torch.nn.functional.silu); grads of gate and up

Usage: PYTHONPATH=.toolchain/hf-python python3 scripts/make_autograd_fixtures.py \\
           --out crates/llama-kernels/tests/fixtures/autograd/autograd.json
       (the pinned torch of scripts/make_hf_fixtures.sh; CPU)
"""

import argparse
import base64
import json
import platform

import numpy as np
import torch

EPS = 1e-5


def b64(t):
    return base64.b64encode(np.ascontiguousarray(t.detach().numpy(), dtype="<f8").tobytes()).decode("ascii")


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def case_rms_norm(g, rows, hidden):
    x = torch.randn(rows, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    w = (0.5 + torch.rand(hidden, generator=g, dtype=torch.float64)).requires_grad_()
    dy = torch.randn(rows, hidden, generator=g, dtype=torch.float64)
    y = rms_norm(x, w)
    y.backward(dy)
    return {"op": "rms_norm", "rows": rows, "hidden": hidden, "eps": EPS,
            "x": b64(x), "w": b64(w), "dy": b64(dy), "dx": b64(x.grad), "dw": b64(w.grad)}


def case_fused(g, rows, hidden):
    x = torch.randn(rows, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    res = torch.randn(rows, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    w = (0.5 + torch.rand(hidden, generator=g, dtype=torch.float64)).requires_grad_()
    dy = torch.randn(rows, hidden, generator=g, dtype=torch.float64)
    d_res = torch.randn(rows, hidden, generator=g, dtype=torch.float64)
    s = x + res
    y = rms_norm(s, w)
    loss = (y * dy).sum() + (s * d_res).sum()
    loss.backward()
    return {"op": "fused_add_rms_norm", "rows": rows, "hidden": hidden, "eps": EPS,
            "x": b64(x), "residual": b64(res), "w": b64(w), "dy": b64(dy), "d_residual": b64(d_res),
            "dx": b64(x.grad), "dresidual": b64(res.grad), "dw": b64(w.grad)}


def case_swiglu(g, tokens, d):
    gate = (3.0 * torch.randn(tokens, d, generator=g, dtype=torch.float64)).requires_grad_()
    up = torch.randn(tokens, d, generator=g, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(tokens, d, generator=g, dtype=torch.float64)
    (torch.nn.functional.silu(gate) * up).backward(d_out)
    return {"op": "swiglu", "tokens": tokens, "d": d, "gate": b64(gate), "up": b64(up), "d_out": b64(d_out),
            "d_gate": b64(gate.grad), "d_up": b64(up.grad)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(35)
    cases = [case_rms_norm(g, r, h) for r, h in [(1, 64), (5, 256), (3, 100)]]
    cases += [case_fused(g, r, h) for r, h in [(4, 128), (2, 96)]]
    cases += [case_swiglu(g, t, d) for t, d in [(3, 64), (2, 100)]]
    out = {"made_by": "scripts/make_autograd_fixtures.py", "torch": torch.__version__,
           "numpy": np.__version__, "python": platform.python_version(), "cases": cases}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
