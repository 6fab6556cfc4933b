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
  rope               transformers' Llama rotate_half (half-split) or Llama 4's complex
                     multiply (interleaved), then optionally Llama 4's L2 norm
                     (x * rsqrt(mean(x^2) + eps) over the head); grad of the input
  cross_entropy      torch.nn.functional.cross_entropy with ignore_index -100, mean or sum;
                     the loss and the grad of the logits
  attention          torch.nn.functional.scaled_dot_product_attention over a varlen batch (one
                     call per sequence, enable_gqa), with an explicit bottom-right causal or
                     Llama 4 chunked mask and Llama 4's temperature applied to q (as
                     transformers' Llama 4 does); the output and the grads of q, k and v
  adamw              three steps of torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW on two
                     tensors with given gradients and learning rates; the parameters after each

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


def case_rope(g, tokens, heads, head_dim, layout, norm):
    theta = 500000.0
    x = torch.randn(tokens, heads, head_dim, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(tokens, heads, head_dim, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 8191, 131071][:tokens], dtype=torch.int64)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[:, None].double() * inv_freq[None, :]  # [tokens, head_dim / 2]
    if layout == "half_split":
        cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
        sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
        y = x * cos + torch.cat([-x2, x1], -1) * sin
    else:
        xc = torch.view_as_complex(x.reshape(tokens, heads, head_dim // 2, 2))
        y = torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)[:, None, :]).flatten(2)
    if norm:
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + EPS)
    y.backward(dy)
    return {"op": "rope", "tokens": tokens, "heads": heads, "head_dim": head_dim, "layout": layout,
            "theta": theta, "qk_norm_eps": EPS if norm else None, "positions": positions.tolist(),
            "x": b64(x), "dy": b64(dy), "dx": b64(x.grad)}


def case_cross_entropy(g, rows, vocab, reduction):
    logits = (3.0 * torch.randn(rows, vocab, generator=g, dtype=torch.float64)).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[1::3] = -100
    loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction=reduction)
    loss.backward()
    return {"op": "cross_entropy", "rows": rows, "vocab": vocab, "reduction": reduction,
            "labels": labels.tolist(), "logits": b64(logits), "loss": loss.item(), "dlogits": b64(logits.grad)}


def case_adamw(g):
    shapes = [(3, 5), (7,)]
    params = [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    steps = []
    for lr in [1e-3, 5e-4, 2e-3]:
        for group in opt.param_groups:
            group["lr"] = lr
        grads = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        opt.step()
        steps.append({"lr": lr, "grads": [b64(gr) for gr in grads], "norm": norm.item(),
                      "params": [b64(p) for p in params]})
    return {"op": "adamw", "shapes": [list(s) for s in shapes], "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
            "weight_decay": 0.1, "max_norm": 1.0, "init": None, "steps": steps}


def attention_mask(mask, chunk, q_len, k_len):
    pos = torch.arange(k_len - q_len, k_len).unsqueeze(1)  # bottom-right: query i at k_len - q_len + i
    key = torch.arange(k_len).unsqueeze(0)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool)
    if mask != "none":
        allowed &= key <= pos
    if mask == "chunked":
        allowed &= key >= torch.div(pos.clamp(min=0), chunk, rounding_mode="floor") * chunk
    return allowed


def case_attention(g, seqlens, q_heads, kv_heads, d, mask, chunk=0, scale=None, temperature=None):
    tq, tk = sum(s[0] for s in seqlens), sum(s[1] for s in seqlens)
    q = torch.randn(tq, q_heads, d, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(tk, kv_heads, d, generator=g, dtype=torch.float64).requires_grad_()
    v = torch.randn(tk, kv_heads, d, generator=g, dtype=torch.float64).requires_grad_()
    dout = torch.randn(tq, q_heads, d, generator=g, dtype=torch.float64)
    outs, q0, k0 = [], 0, 0
    for ql, kl in seqlens:
        qs, ks, vs = q[q0:q0 + ql], k[k0:k0 + kl], v[k0:k0 + kl]
        if temperature is not None:
            floor_scale, attn_scale = temperature
            pos = torch.arange(kl - ql, kl, dtype=torch.float64).clamp(min=0)
            t = torch.log(torch.floor((pos + 1.0) / floor_scale) + 1.0) * attn_scale + 1.0
            qs = qs * t[:, None, None]
        allowed = attention_mask(mask, chunk, ql, kl)
        o = torch.nn.functional.scaled_dot_product_attention(
            qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), attn_mask=allowed, scale=scale,
            enable_gqa=True).transpose(0, 1)
        outs.append(o)
        q0, k0 = q0 + ql, k0 + kl
    out = torch.cat(outs)
    (out * dout).sum().backward()
    cu_q = [0] + list(np.cumsum([s[0] for s in seqlens]).tolist())
    cu_k = [0] + list(np.cumsum([s[1] for s in seqlens]).tolist())
    return {"op": "attention", "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "q_heads": q_heads,
            "kv_heads": kv_heads, "head_dim": d, "mask": mask, "chunk_size": chunk, "scale": scale,
            "temperature": list(temperature) if temperature else None,
            "q": b64(q), "k": b64(k), "v": b64(v), "d_out": b64(dout), "out": b64(out),
            "dq": b64(q.grad), "dk": b64(k.grad), "dv": b64(v.grad)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(35)
    cases = [case_rms_norm(g, r, h) for r, h in [(1, 64), (5, 256), (3, 100)]]
    cases += [case_fused(g, r, h) for r, h in [(4, 128), (2, 96)]]
    cases += [case_swiglu(g, t, d) for t, d in [(3, 64), (2, 100)]]
    cases += [case_rope(g, 5, 2, 64, layout, norm) for layout in ["half_split", "interleaved"] for norm in [False, True]]
    cases += [case_cross_entropy(g, r, v, red) for r, v, red in [(7, 50, "mean"), (4, 300, "sum")]]
    init_state = g.get_state()
    adamw = case_adamw(g)
    g.set_state(init_state)  # the initial parameters: the same draws again
    adamw["init"] = [b64(torch.randn(*s, generator=g, dtype=torch.float64)) for s in adamw["shapes"]]
    cases.append(adamw)
    # The options are exact in f32 (the public API's type). Every query of these sequences
    # attends at least one key (SDPA's softmax over an all-False
    # row is NaN; the kernels' convention there, zeros, is tested against the f64 reference).
    cases.append(case_attention(g, [(5, 9), (7, 7)], 4, 2, 32, "causal"))
    cases.append(case_attention(g, [(10, 12)], 2, 1, 32, "chunked", chunk=4, scale=0.25, temperature=(4.0, 0.125)))
    cases.append(case_attention(g, [(6, 11), (3, 3)], 3, 1, 64, "none"))
    out = {"made_by": "scripts/make_autograd_fixtures.py", "torch": torch.__version__,
           "numpy": np.__version__, "python": platform.python_version(), "cases": cases}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
