#!/usr/bin/env python3
"""Times PyTorch on the shapes our benches use, and prints our/their ratios.

Run by scripts/gpu-run.sh on the GPU machine, after the benches wrote their summary tables:

    python3 torch_compare.py --ours out/bench-*.txt

Our times come from the benches' summary rows ("<op> <dtype> <shape>  <time us> ..."; for
benches/layer.rs "<model> prefill <tokens>" and "<model> decode b<batch> ctx<context>"); theirs
are measured here with CUDA events (mean over many launches after a warm-up), the same way. A
ratio above 1 means we are faster. torch.compile is timed only on the large shapes that the speed
targets name, and skipped (with a note) when it fails or exceeds its time budget.

Sections (--only): rms_norm, rope, swiglu, attention, decode, moe, layer (Hugging Face
transformers' LlamaDecoderLayer / Llama4TextDecoderLayer; skipped with a note where transformers
is not installed), qlinear (F.linear in bf16 on benches/qlinear.rs's shapes, next to our
cuBLAS row and each packed format's row), and qlora (peft + bitsandbytes QLoRA training steps
next to benches/train.rs's rows).
"""
import argparse
import inspect
import re
import sys
import time

COMPILE_BUDGET_S = 90.0
# --cpu-smoke: run every code path on the CPU with tiny shapes and wall-clock timing, to check the
# script itself on a machine without a GPU. Its numbers mean nothing and are labelled so.
SMOKE = False
DEVICE = "cuda"
SMOKE_MAX_TOKENS = 64


def skip(tokens):
    return SMOKE and tokens > SMOKE_MAX_TOKENS


def cuda_time_us(torch, fn, iters=100):
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1000.0 / iters


class Compiler:
    """torch.compile with an overall time budget."""

    def __init__(self, torch):
        self.torch = torch
        self.spent = 0.0
        self.note = None

    def compile(self, fn):
        if SMOKE:
            self.note = "torch.compile not run in --cpu-smoke mode"
            return None
        if self.spent > COMPILE_BUDGET_S:
            self.note = f"torch.compile skipped after {self.spent:.0f} s of compiling"
            return None
        try:
            t0 = time.time()
            cfn = self.torch.compile(fn, dynamic=False)
            self.spent += time.time() - t0
            return cfn
        except Exception as e:  # noqa: BLE001 - any failure means "not measured"
            self.note = f"torch.compile failed: {e}"
            return None

    def time(self, fn, *args):
        cfn = self.compile(fn)
        if cfn is None:
            return None
        t0 = time.time()
        try:
            cfn(*args)  # compiles
        except Exception as e:  # noqa: BLE001
            self.note = f"torch.compile failed: {e}"
            return None
        self.spent += time.time() - t0
        return cuda_time_us(self.torch, lambda: cfn(*args))


def dtype_of(torch, name):
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def rms_norm_section(torch, compiler):
    F = torch.nn.functional
    rows = []
    for op in ["rms_norm", "fused_add_rms_norm"]:
        for dname in ["bf16", "f16", "f32"]:
            dt = dtype_of(torch, dname)
            for hidden in [4096, 8192]:
                for tokens in [1, 16, 512, 4096, 16384]:
                    if skip(tokens):
                        continue
                    x = torch.randn(tokens, hidden, device=DEVICE, dtype=dt)
                    r = torch.randn(tokens, hidden, device=DEVICE, dtype=dt)
                    w = torch.rand(hidden, device=DEVICE, dtype=dt) + 0.5
                    if op == "rms_norm":
                        def eager(x=x, w=w, hidden=hidden):
                            return F.rms_norm(x, (hidden,), w, 1e-5)
                    else:
                        def eager(x=x, r=r, w=w, hidden=hidden):
                            s = x + r
                            return s, F.rms_norm(s, (hidden,), w, 1e-5)
                    theirs = {"torch eager": cuda_time_us(torch, eager)}
                    if dname == "bf16" and tokens >= 4096:
                        if op == "rms_norm":
                            def f(x, w, hidden=hidden):
                                return F.rms_norm(x, (hidden,), w, 1e-5)
                            args = (x, w)
                        else:
                            def f(x, r, w, hidden=hidden):
                                s = x + r
                                return s, F.rms_norm(s, (hidden,), w, 1e-5)
                            args = (x, r, w)
                        c = compiler.time(f, *args)
                        if c is not None:
                            theirs["torch.compile"] = c
                    rows.append((f"{op} {dname} {tokens}x{hidden}", theirs))
                    del x, r, w
    return rows


def rope_section(torch, compiler):
    """Hugging Face's formulations: rotate_half (Llama 3) and the complex form + qk L2 norm
    (Llama 4), with cos/sin precomputed once as HF does per forward."""
    rows = []

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def llama3(q, k, cos, sin):
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def l2norm(x, eps=1e-5):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)

    def llama4(q, k, freqs_cis):
        q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        k_ = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
        qo = torch.view_as_real(q_ * freqs_cis).flatten(-2).type_as(q)
        ko = torch.view_as_real(k_ * freqs_cis).flatten(-2).type_as(k)
        return l2norm(qo), l2norm(ko)

    dt = torch.bfloat16
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, device=DEVICE, dtype=torch.float32) / 128))
    for model, qh, kh, token_counts in [("llama3", 32, 8, [1, 16, 512, 4096, 16384]), ("llama4", 40, 8, [4096])]:
        for tokens in token_counts:
            if skip(tokens):
                continue
            q = torch.randn(tokens, qh, 128, device=DEVICE, dtype=dt)
            k = torch.randn(tokens, kh, 128, device=DEVICE, dtype=dt)
            freqs = torch.outer(torch.arange(tokens, device=DEVICE, dtype=torch.float32), inv_freq)
            if model == "llama3":
                emb = torch.cat((freqs, freqs), dim=-1)
                cos, sin = emb.cos().to(dt)[:, None, :], emb.sin().to(dt)[:, None, :]
                fn, args = llama3, (q, k, cos, sin)
                name = f"rope bf16 {tokens}x({qh}+{kh})x128"
            else:
                fc = torch.polar(torch.ones_like(freqs), freqs)[:, None, :]
                fn, args = llama4, (q, k, fc)
                name = f"rope bf16 {tokens}x({qh}+{kh})x128 llama4"
            theirs = {"torch eager": cuda_time_us(torch, lambda: fn(*args))}
            if tokens >= 4096:
                c = compiler.time(fn, *args)
                if c is not None:
                    theirs["torch.compile"] = c
            rows.append((name, theirs))
    return rows


def swiglu_section(torch, compiler):
    F = torch.nn.functional
    rows = []
    d = 14336

    def packed(gu):
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    def separate(g, u):
        return F.silu(g) * u

    for dname in ["bf16", "f16", "f32"]:
        dt = dtype_of(torch, dname)
        for form in ["packed", "separate"]:
            for tokens in [1, 16, 512, 4096, 16384]:
                if (dname != "bf16" and tokens != 4096) or skip(tokens):
                    continue
                if form == "packed":
                    fn, args = packed, (torch.randn(tokens, 2 * d, device=DEVICE, dtype=dt),)
                else:
                    fn, args = separate, (torch.randn(tokens, d, device=DEVICE, dtype=dt), torch.randn(tokens, d, device=DEVICE, dtype=dt))
                theirs = {"torch eager": cuda_time_us(torch, lambda: fn(*args))}
                if dname == "bf16" and tokens >= 4096:
                    c = compiler.time(fn, *args)
                    if c is not None:
                        theirs["torch.compile"] = c
                rows.append((f"swiglu {dname} {tokens}x{d} {form}", theirs))
                del args
    return rows


def attention_section(torch, compiler):
    """scaled_dot_product_attention on the same shapes, [batch, heads, seq, head_dim] bf16, with
    enable_gqa and on K/V expanded to the q heads, through each backend that accepts them (cuDNN
    among them), and FlashAttention-3 (flash_attn_interface) when the machine has it."""
    F = torch.nn.functional
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print("note: torch.nn.attention.sdpa_kernel missing; attention not compared")
        return []
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    try:
        import flash_attn_interface as fa3  # FlashAttention-3 (its hopper/ build), when the image has it
    except ImportError:
        fa3 = None
        print("note: flash_attn_interface (FlashAttention-3) missing; attention compared without it")
    shapes = []
    for causal in [True, False]:
        for seq in [512, 1024, 2048, 4096, 8192, 16384]:
            m = "causal" if causal else "full"
            shapes.append((f"attention bf16 {m} b{16384 // seq}xs{seq} 32/8x128", 16384 // seq, seq, 32, 8, 128, causal))
    for seq in [2048, 8192]:
        shapes.append((f"attention bf16 causal b{16384 // seq}xs{seq} 32/8x64", 16384 // seq, seq, 32, 8, 64, True))
    rows = []
    for name, b, s, hq, hk, d, causal in shapes:
        if SMOKE:
            if s != 512:
                continue
            b = 1
        q = torch.randn(b, hq, s, d, device=DEVICE, dtype=torch.bfloat16)
        k = torch.randn(b, hk, s, d, device=DEVICE, dtype=torch.bfloat16)
        v = torch.randn(b, hk, s, d, device=DEVICE, dtype=torch.bfloat16)
        ke, ve = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
        theirs = {}
        for bname, backend in backends:
            for label, kk, vv, gqa in [(f"sdpa {bname} gqa", k, v, True), (f"sdpa {bname} expanded", ke, ve, False)]:
                try:
                    with sdpa_kernel(backend):
                        theirs[label] = cuda_time_us(
                            torch, lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa), iters=10
                        )
                except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is skipped
                    print(f"note: {name}: {label} unavailable ({str(e).splitlines()[0][:100]})")
        if fa3 is not None:
            # FlashAttention-3 takes [batch, seq, heads, head_dim] and GQA as it is.
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            try:
                theirs["fa3 gqa"] = cuda_time_us(torch, lambda: fa3.flash_attn_func(qt, kt, vt, causal=causal), iters=10)
            except Exception as e:  # noqa: BLE001
                print(f"note: {name}: fa3 unavailable ({str(e).splitlines()[0][:100]})")
            del qt, kt, vt
        rows.append((name, theirs))
        del q, k, v, ke, ve
    return rows


def decode_section(torch, compiler):
    """Decode (one query token per sequence) with scaled_dot_product_attention on an equivalent
    contiguous cache [batch, 8, seq, 128] bf16 (enable_gqa), through each backend that accepts it,
    and FlashInfer's paged decode (page size 16, NHD) when the machine has flashinfer. Names match
    benches/decode.rs (bf16 pages; our fp8 rows have no PyTorch counterpart)."""
    F = torch.nn.functional
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print("note: torch.nn.attention.sdpa_kernel missing; decode not compared")
        return []
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    try:
        import flashinfer  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed (the usual case)
        flashinfer = None
        print("note: flashinfer not installed; its decode is not compared")
    rows = []
    for hq in [32, 64]:
        for b, s in [(1, 131072), (16, 8192), (64, 4096), (256, 1024)]:
            name = f"paged_decode bf16 b{b}xs{s} {hq}/8x128"
            if SMOKE:
                b, s = 1, 64
            q = torch.randn(b, hq, 1, 128, device=DEVICE, dtype=torch.bfloat16)
            k = torch.randn(b, 8, s, 128, device=DEVICE, dtype=torch.bfloat16)
            v = torch.randn(b, 8, s, 128, device=DEVICE, dtype=torch.bfloat16)
            theirs = {}
            for bname, backend in backends:
                try:
                    with sdpa_kernel(backend):
                        theirs[f"sdpa {bname} gqa"] = cuda_time_us(
                            torch, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), iters=20
                        )
                except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is skipped
                    print(f"note: {name}: sdpa {bname} unavailable ({str(e).splitlines()[0][:100]})")
            del k, v
            if flashinfer is not None and not SMOKE:
                try:
                    pages = (s + 15) // 16
                    cache = torch.randn(b * pages, 2, 16, 8, 128, device=DEVICE, dtype=torch.bfloat16)
                    indptr = torch.arange(b + 1, device=DEVICE, dtype=torch.int32) * pages
                    indices = torch.randperm(b * pages, device=DEVICE).to(torch.int32)
                    last = torch.full((b,), (s - 1) % 16 + 1, device=DEVICE, dtype=torch.int32)
                    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=DEVICE)
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
                    w.plan(indptr, indices, last, hq, 8, 128, 16, data_type=torch.bfloat16)
                    qf = q.reshape(b, hq, 128)
                    theirs["flashinfer decode"] = cuda_time_us(torch, lambda: w.run(qf, cache), iters=20)
                    del cache
                except Exception as e:  # noqa: BLE001 - API differences between versions
                    print(f"note: {name}: flashinfer unavailable ({str(e).splitlines()[0][:100]})")
            rows.append((name, theirs))
            del q
    return rows


def moe_section(torch, compiler):
    """Hugging Face's Llama4TextMoe (router top-k + sigmoid, input scaled, bmm over every expert,
    shared expert) and Mixtral's sparse MoE block (softmax top-2, a loop over the hit experts with
    index_add_), written out here from transformers' modeling code so that no transformers
    install is needed, on the shapes of benches/moe.rs (`moe_ffn bf16 <tokens>x<hidden> <layer>`)."""
    F = torch.nn.functional
    dt = torch.bfloat16
    rows = []

    def llama4(x, router, gate_up, down, sg, su, sd, k):
        e = router.shape[0]
        h = x.shape[-1]
        logits = x @ router.t()
        top_value, top_index = torch.topk(logits, k, dim=1)
        scores = torch.full_like(logits, float("-inf")).scatter_(1, top_index, top_value).transpose(0, 1)
        scores = torch.sigmoid(scores.float()).to(scores.dtype)
        routed_in = x.repeat(e, 1) * scores.reshape(-1, 1)
        hs = routed_in.view(e, -1, h)
        g, u = torch.bmm(hs, gate_up).chunk(2, dim=-1)
        routed_out = torch.bmm(u * F.silu(g), down).view(-1, h)
        out = (F.silu(x @ sg.t()) * (x @ su.t())) @ sd.t()
        return out + routed_out.reshape(e, -1, h).sum(dim=0)

    def mixtral(x, gate, w1, w3, w2, k):
        e = gate.shape[0]
        t, h = x.shape
        logits = x @ gate.t()
        rw = F.softmax(logits, dim=1, dtype=torch.float)
        rw, sel = torch.topk(rw, k, dim=-1)
        rw = (rw / rw.sum(dim=-1, keepdim=True)).to(x.dtype)
        final = torch.zeros((t, h), dtype=x.dtype, device=x.device)
        mask = F.one_hot(sel, num_classes=e).permute(2, 1, 0)
        for ei in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            idx, top_x = torch.where(mask[ei].squeeze(0))
            cur = x[None, top_x].reshape(-1, h)
            y = ((F.silu(cur @ w1[ei].squeeze(0).t()) * (cur @ w3[ei].squeeze(0).t())) @ w2[ei].squeeze(0).t()) * rw[top_x, idx, None]
            final.index_add_(0, top_x, y.to(x.dtype))
        return final

    layers = [("scout", 5120, 8192, 16, 1, 8192), ("mixtral", 4096, 14336, 8, 2, 0)]
    for name, h, i, e, k, si in layers:
        if SMOKE:
            h, i, si = 64, 128, (128 if si else 0)
        std = h ** -0.5
        r = lambda *shape: torch.randn(*shape, device=DEVICE, dtype=dt) * std
        try:
            if name == "scout":
                w = (r(e, h), r(e, h, 2 * i), r(e, i, h), r(si, h), r(si, h), r(h, si))
                fn = lambda x, w=w, k=k: llama4(x, *w, k)
            else:
                w = (r(e, h), r(e, i, h), r(e, i, h), r(e, h, i))
                fn = lambda x, w=w, k=k: mixtral(x, *w, k)
            for tokens in [1, 8, 512, 4096]:
                if skip(tokens):
                    continue
                x = torch.randn(tokens, h, device=DEVICE, dtype=dt)
                theirs = {"torch eager (HF)": cuda_time_us(torch, lambda: fn(x), iters=10)}
                if tokens >= 4096:
                    c = compiler.time(fn, x)
                    if c is not None:
                        theirs["torch.compile (HF)"] = c
                rows.append((f"moe_ffn bf16 {tokens}x{h} {name}", theirs))
                del x
            del w
        except Exception as ex:  # noqa: BLE001 - out of memory or a torch version without an op
            print(f"note: moe {name} not compared: {str(ex).splitlines()[0][:120]}")
    return rows


def layer_section(torch, compiler):
    """One Hugging Face decoder layer (transformers' LlamaDecoderLayer and Llama4TextDecoderLayer,
    random weights, bf16, sdpa attention) on the cases of benches/layer.rs: a prefill of one
    sequence of T tokens from position 0 (no cache, attention_mask None = causal; Llama 4's 8192
    chunk is longer than every sequence here, so chunked = causal), and one decode step of B
    sequences that each have 4096 cached tokens. The rotary embedding (cos/sin or freqs_cis) is
    computed once outside the timing, as HF computes it once per model forward for all layers.

    Decode is timed with two caches: "torch eager (HF)" uses transformers' DynamicCache, whose
    update concatenates the new token to the cached K/V (a copy of the whole cache per step, as
    HF's default decode does); the layer's K/V are reset to the 4096 cached tokens after every
    call, so the context stays 4096 + 1 (no growth). "torch eager static kv" passes a cache that
    writes the new token in place into a preallocated [B, kv_heads, 4096 + 1, head_dim] buffer,
    like ours. torch.compile is timed on the prefill of 4096 (the large shape, as in the other
    sections)."""
    try:
        import transformers
        from transformers import LlamaConfig
        from transformers.models.llama import modeling_llama
        from transformers.models.llama4 import modeling_llama4
        from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
    except Exception as e:  # noqa: BLE001 - not installed, or a version without Llama 4
        print(f"note: transformers not usable ({str(e).splitlines()[0][:100]}); layer not compared")
        return []
    try:
        from transformers import DynamicCache
    except ImportError:
        DynamicCache = None
    print(f"layer: transformers {transformers.__version__}")
    dt = torch.bfloat16

    class StaticKV:
        """A one-layer cache of `ctx` tokens and a slot for the new one, written in place; the
        methods the HF attention calls (update, get_seq_length)."""

        def __init__(self, k, v):
            self.ctx = k.shape[2]
            self.k = torch.cat([k, k[:, :, :1]], dim=2)
            self.v = torch.cat([v, v[:, :, :1]], dim=2)

        def update(self, key_states, value_states, *args, **kwargs):
            self.k[:, :, self.ctx:].copy_(key_states)
            self.v[:, :, self.ctx:].copy_(value_states)
            return self.k, self.v

        def get_seq_length(self, *args, **kwargs):
            return self.ctx

    def dynamic_cache(k, v):
        """A DynamicCache holding k/v for layer 0, and a function that drops what a step added."""
        if DynamicCache is None:
            raise RuntimeError("transformers has no DynamicCache")
        cache = DynamicCache()
        cache.update(k, v, 0)
        layers = getattr(cache, "layers", None)
        if layers and hasattr(layers[0], "keys"):
            lay = layers[0]
            k0, v0 = lay.keys, lay.values

            def reset():
                lay.keys, lay.values = k0, v0
        elif hasattr(cache, "key_cache"):  # older transformers: lists of tensors per layer
            k0, v0 = cache.key_cache[0], cache.value_cache[0]

            def reset():
                cache.key_cache[0], cache.value_cache[0] = k0, v0
        else:
            raise RuntimeError("DynamicCache keeps its tensors where this script does not look")
        return cache, reset

    def config(cls, attn, **kw):
        try:
            return cls(attn_implementation=attn, **kw)
        except Exception:  # noqa: BLE001 - a version that does not take it in the constructor
            c = cls(**kw)
            c._attn_implementation = attn
            return c

    if SMOKE:
        dims3 = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512)
        dims4 = dict(dims3, intermediate_size_mlp=512, num_local_experts=4)
    else:
        dims3 = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336)
        dims4 = dict(
            hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
            intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16,
        )
    llama3 = dict(
        dims3, num_hidden_layers=1, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
    )
    # benches/layer.rs's Llama 4 config: layer 0 of [1, 1, 1, 0] uses RoPE, layer 3 is NoPE. Here a
    # one-layer config whose no_rope_layers entry (1 = RoPE, 0 = NoPE) and moe_layers pick the kind.
    llama4 = dict(
        dims4, num_hidden_layers=1, num_experts_per_tok=1, interleave_moe_layer_step=1, rms_norm_eps=1e-5,
        rope_theta=500000.0, attention_chunk_size=8192, use_qk_norm=True, attn_temperature_tuning=True,
        rope_scaling={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192},
    )
    models = [
        ("llama3-8b", LlamaConfig, llama3, modeling_llama.LlamaDecoderLayer, modeling_llama.LlamaRotaryEmbedding),
        ("llama4 rope", Llama4TextConfig, dict(llama4, no_rope_layers=[1], moe_layers=[]),
         modeling_llama4.Llama4TextDecoderLayer, modeling_llama4.Llama4TextRotaryEmbedding),
        ("llama4 nope", Llama4TextConfig, dict(llama4, no_rope_layers=[0], moe_layers=[]),
         modeling_llama4.Llama4TextDecoderLayer, modeling_llama4.Llama4TextRotaryEmbedding),
        ("llama4-scout moe", Llama4TextConfig, dict(llama4, no_rope_layers=[1], moe_layers=[0]),
         modeling_llama4.Llama4TextDecoderLayer, modeling_llama4.Llama4TextRotaryEmbedding),
    ]
    context = 64 if SMOKE else 4096
    rows = []
    for name, cfg_cls, cfg_kw, layer_cls, rope_cls in models:
        cases = [(f"{name} prefill {t}", t, None) for t in [512, 4096]]
        cases += [(f"{name} decode b{b} ctx4096", b, b) for b in [1, 32, 128]]
        try:
            cfg = None
            for attn in ["sdpa", "eager"]:
                try:
                    cfg = config(cfg_cls, attn, **cfg_kw)
                    break
                except Exception as e:  # noqa: BLE001 - sdpa refused: try eager
                    print(f"note: layer {name}: attn_implementation {attn} refused ({str(e).splitlines()[0][:100]})")
            if cfg is None:
                raise RuntimeError("no attention implementation accepted")
            torch.manual_seed(0)
            with torch.device(DEVICE):
                layer = layer_cls(cfg, 0)
            layer = layer.to(dt).eval()
            with torch.no_grad():
                # Some weights (Llama 4's experts) start as torch.empty/zeros: draw them all.
                for p in layer.parameters():
                    if p.dim() >= 2:
                        p.normal_(0.0, 0.02)
            rope = rope_cls(cfg).to(DEVICE)
            params = inspect.signature(layer.forward).parameters
            cache_arg = "past_key_values" if "past_key_values" in params else "past_key_value"
        except Exception as ex:  # noqa: BLE001 - out of memory, or a transformers version that differs
            for case, _, _ in cases:
                print(f"note: layer {case}: not timed: {str(ex).splitlines()[0][:120]}")
            continue
        hq, hk, hd, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        for case, tokens, batch in cases:
            try:
                with torch.no_grad():
                    if batch is None:
                        if skip(tokens):
                            if tokens > 512:
                                continue
                            tokens = SMOKE_MAX_TOKENS
                        h = torch.randn(1, tokens, hidden, device=DEVICE, dtype=dt)
                        pos = torch.arange(tokens, device=DEVICE)
                        kw = {"attention_mask": None, "position_embeddings": rope(h, pos[None])}
                        if "position_ids" in params:
                            kw["position_ids"] = pos[None]
                        if "cache_position" in params:  # transformers 4.x (Llama 4 NoPE's temperature tuning)
                            kw["cache_position"] = pos
                        if "use_cache" in params:
                            kw["use_cache"] = False

                        def f(h, kw=kw):
                            return layer(h, **kw)

                        theirs = {"torch eager (HF)": cuda_time_us(torch, lambda: f(h), iters=20)}
                        if tokens >= 4096:
                            c = compiler.time(f, h)
                            if c is not None:
                                theirs["torch.compile (HF)"] = c
                    else:
                        b = min(batch, 2) if SMOKE else batch
                        h = torch.randn(b, 1, hidden, device=DEVICE, dtype=dt)
                        k = torch.randn(b, hk, context, hd, device=DEVICE, dtype=dt)
                        v = torch.randn(b, hk, context, hd, device=DEVICE, dtype=dt)
                        pos = torch.full((b, 1), context, device=DEVICE, dtype=torch.long)
                        base = {"attention_mask": None, "position_embeddings": rope(h, pos)}
                        if "position_ids" in params:
                            base["position_ids"] = pos
                        if "cache_position" in params:
                            base["cache_position"] = torch.tensor([context], device=DEVICE)
                        if "use_cache" in params:
                            base["use_cache"] = True
                        theirs = {}
                        try:
                            cache, reset = dynamic_cache(k, v)
                            kw = dict(base, **{cache_arg: cache})

                            def step(kw=kw, reset=reset):
                                out = layer(h, **kw)
                                reset()
                                return out

                            theirs["torch eager (HF)"] = cuda_time_us(torch, step, iters=20)
                            del cache, kw
                        except Exception as ex:  # noqa: BLE001 - the static cache below may still work
                            print(f"note: layer {case}: DynamicCache not timed: {str(ex).splitlines()[0][:120]}")
                        skv = StaticKV(k, v)
                        del k, v
                        kw = dict(base, **{cache_arg: skv})
                        theirs["torch eager static kv"] = cuda_time_us(torch, lambda: layer(h, **kw), iters=20)
                        del skv, kw
                rows.append((case, theirs))
            except Exception as ex:  # noqa: BLE001 - out of memory, or a transformers version that differs
                print(f"note: layer {case}: not timed: {str(ex).splitlines()[0][:120]}")
        del layer, rope
        if not SMOKE:
            torch.cuda.empty_cache()
    return rows


def cuda_time_cold_us(torch, fn, iters=20):
    """Mean time of one call of `fn`, each call timed alone after a 256 MiB device copy that
    evicts the L2, as benches/common times working sets that would fit in it."""
    if SMOKE:
        return cuda_time_us(torch, fn)
    a = torch.empty(128 * 1024 * 1024, device=DEVICE, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        b.copy_(a)
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        events.append((start, stop))
    torch.cuda.synchronize()
    del a, b
    return sum(s.elapsed_time(e) for s, e in events) * 1000.0 / iters


# benches/common's L2_FLUSH_BELOW_BYTES: working sets below it are timed cold.
L2_FLUSH_BELOW_BYTES = 120e6
QLINEAR_FORMATS = ["q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "nf4"]


def qlinear_section(torch, compiler):
    """torch.nn.functional.linear in bf16 (cuBLAS through PyTorch) on benches/qlinear.rs's Llama 3
    8B projection shapes. Each time is listed under our dense row (`linear bf16 b<batch> <out>x<in>
    <name>`, our cuBLAS call: a ratio near 1 says the two harnesses agree) and under each packed
    format's row (`qlinear-<format> ...`: the ratio is the packed kernel's speedup over PyTorch's
    bf16 product). Timed cold (after an L2 flush) where the working set would fit in the L2, as
    ours are."""
    F = torch.nn.functional
    rows = []
    shapes = [("q_o_proj", 4096, 4096), ("gate_up_proj", 14336, 4096), ("down_proj", 4096, 14336), ("lm_head", 128256, 4096)]
    for label, out, inp in shapes:
        o, i = (256, 128) if SMOKE else (out, inp)
        w = torch.randn(o, i, device=DEVICE, dtype=torch.bfloat16) * i ** -0.5
        for b in [1, 4, 16, 64, 512]:
            if skip(b):
                continue
            x = torch.randn(b, i, device=DEVICE, dtype=torch.bfloat16)
            working_set = 2 * (o * i + b * (o + i))
            if working_set < L2_FLUSH_BELOW_BYTES:
                t = cuda_time_cold_us(torch, lambda: F.linear(x, w))
            else:
                t = cuda_time_us(torch, lambda: F.linear(x, w), iters=20)
            shape = f"b{b} {out}x{inp} {label}"
            rows.append((f"linear bf16 {shape}", {"torch F.linear": t}))
            for f in QLINEAR_FORMATS:
                rows.append((f"qlinear-{f} bf16 {shape}", {"torch F.linear bf16": t}))
            del x
        del w
        if not SMOKE:
            torch.cuda.empty_cache()
    return rows


def qlora_section(torch, compiler):
    """peft + bitsandbytes QLoRA training steps, as benches/train.rs times ours: Llama 3 8B's first
    2 layers with random weights, the base loaded in NF4 (double quantization, bf16 compute),
    LoRA r 16 / alpha 32 / dropout 0.05 on the seven projections, FlashAttention-2 where
    flash_attn is installed (else SDPA); micro-batches of 1 x 2048 and 2 x 2048 tokens. A step is
    forward, loss, backward and torch.optim.AdamW on the adapters (mean of 3 after 5 warm-up
    steps, CUDA events). Skipped, with a note, without transformers, peft or bitsandbytes."""
    rows = []
    try:
        import tempfile

        import bitsandbytes  # noqa: F401
        import peft  # noqa: F401
        from peft import LoraConfig, get_peft_model
        from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"note: qlora section skipped ({e})")
        return rows
    try:
        import flash_attn  # noqa: F401
        attn = "flash_attention_2"
    except ImportError:
        attn = "sdpa"
    if SMOKE:
        dims = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    else:
        dims = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)
    cfg = LlamaConfig(num_hidden_layers=2, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, **dims)
    try:
        return qlora_rows(torch, cfg, attn, tempfile, LoraConfig, get_peft_model, BitsAndBytesConfig, LlamaForCausalLM)
    except Exception as e:  # a missing backend or too little memory: a note, not a failed run
        print(f"note: qlora section failed ({type(e).__name__}: {e})")
        return rows


def qlora_rows(torch, cfg, attn, tempfile, LoraConfig, get_peft_model, BitsAndBytesConfig, LlamaForCausalLM):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
        model = LlamaForCausalLM.from_pretrained(tmp, quantization_config=bnb, dtype=torch.bfloat16,
                                                 device_map=DEVICE, attn_implementation=attn)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    seq = 32 if SMOKE else 2048
    for batch in [1, 2]:
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=DEVICE)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        t = cuda_time_us(torch, step, iters=3)
        rows.append((f"qlora-nf4-step bf16 {batch}x2048 llama3-8b-2l", {f"peft+bnb+{attn}": t}))
    del model, opt
    if not SMOKE:
        torch.cuda.empty_cache()
    return rows


SECTIONS = {
    "rms_norm": rms_norm_section,
    "rope": rope_section,
    "swiglu": swiglu_section,
    "attention": attention_section,
    "decode": decode_section,
    "moe": moe_section,
    "layer": layer_section,
    "qlinear": qlinear_section,
    "qlora": qlora_section,
}
ROW = re.compile(r"^(\S+ (?:bf16|f16|f32) \S+(?: \S+)*?)\s{2,}([0-9.]+)\s")
# benches/layer.rs's summary rows ("<model> prefill 512   <us/layer> <tokens/s> ..."), which carry
# no dtype; its share-of-time rows ("<model> ...  <total> us: ...") are not matched.
LAYER_ROW = re.compile(
    r"^((?:llama3-8b|llama4 rope|llama4 nope|llama4-scout moe) (?:prefill \d+|decode b\d+ ctx\d+))\s+([0-9.]+)\s+[0-9]+\s"
)


def parse_ours(paths):
    ours = {}
    for p in paths:
        try:
            text = open(p, encoding="utf-8", errors="replace").read()
        except OSError as e:
            print(f"note: cannot read {p}: {e}")
            continue
        for line in text.splitlines():
            m = ROW.match(line) or LAYER_ROW.match(line)
            if m:
                ours[m.group(1).strip()] = float(m.group(2))
    return ours


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", nargs="*", default=[], help="bench outputs with summary tables")
    ap.add_argument("--only", nargs="*", default=list(SECTIONS), help="sections to run")
    ap.add_argument("--cpu-smoke", action="store_true", help="check this script on a CPU (tiny shapes, meaningless times)")
    a = ap.parse_args()
    global SMOKE, DEVICE
    try:
        import torch
    except ImportError:
        print("torch is not installed here: no PyTorch comparison")
        return 1
    if a.cpu_smoke:
        SMOKE, DEVICE = True, "cpu"
        print(f"torch {torch.__version__} on the CPU: --cpu-smoke, times are not measurements")
    elif not torch.cuda.is_available():
        print("torch sees no GPU: no PyTorch comparison")
        return 1
    else:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    ours = parse_ours(a.ours)
    compiler = Compiler(torch)
    results = []
    for name in a.only:
        t0 = time.time()
        rows = SECTIONS[name](torch, compiler)
        print(f"{name}: {len(rows)} shapes timed in {time.time() - t0:.0f} s")
        results.extend(rows)
    if compiler.note:
        print("note:", compiler.note)

    print("\nOur time vs PyTorch (CUDA events, mean per call; ratio = theirs / ours, > 1 means faster)")
    print(f"{'case':<52} {'ours us':>10}  {'impl':<22} {'theirs us':>10} {'ratio':>7}")
    for case, theirs in results:
        mine = ours.get(case)
        for impl, t in theirs.items():
            ratio = f"{t / mine:7.2f}" if mine else "      -"
            mine_s = f"{mine:10.2f}" if mine else "         -"
            print(f"{case:<52} {mine_s}  {impl:<22} {t:10.2f} {ratio}")
        # The fastest PyTorch implementation of the case, for the headline comparison.
        if mine and theirs:
            best_impl, best = min(theirs.items(), key=lambda kv: kv[1])
            print(f"{'':<52} {'':>10}  {'-> best: ' + best_impl:<22} {best:10.2f} {best / mine:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
