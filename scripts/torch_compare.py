#!/usr/bin/env python3
"""Times PyTorch on the shapes our benches use, and prints our/their ratios.

Run by scripts/gpu-run.sh on the GPU machine, after the benches wrote their summary tables:

    python3 torch_compare.py --ours out/bench-*.txt

Our times come from the benches' summary rows ("<op> <dtype> <shape>  <time us> ..."); theirs are
measured here with CUDA events (mean over many launches after a warm-up), the same way. A ratio
above 1 means we are faster. torch.compile is timed only on the large shapes that the speed
targets name, and skipped (with a note) when it fails or exceeds its time budget.
"""
import argparse
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
    enable_gqa and on K/V expanded to the q heads, through each backend that accepts them."""
    F = torch.nn.functional
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print("note: torch.nn.attention.sdpa_kernel missing; attention not compared")
        return []
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
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


SECTIONS = {
    "rms_norm": rms_norm_section,
    "rope": rope_section,
    "swiglu": swiglu_section,
    "attention": attention_section,
    "decode": decode_section,
    "moe": moe_section,
}
ROW = re.compile(r"^(\S+ (?:bf16|f16|f32) \S+(?: \S+)*?)\s{2,}([0-9.]+)\s")


def parse_ours(paths):
    ours = {}
    for p in paths:
        try:
            text = open(p, encoding="utf-8", errors="replace").read()
        except OSError as e:
            print(f"note: cannot read {p}: {e}")
            continue
        for line in text.splitlines():
            m = ROW.match(line)
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
