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

COMPILE_BUDGET_S = 150.0


def cuda_time_us(torch, fn, iters=100):
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
                    x = torch.randn(tokens, hidden, device="cuda", dtype=dt)
                    r = torch.randn(tokens, hidden, device="cuda", dtype=dt)
                    w = torch.rand(hidden, device="cuda", dtype=dt) + 0.5
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


SECTIONS = {"rms_norm": rms_norm_section}
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
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed here: no PyTorch comparison")
        return 1
    if not torch.cuda.is_available():
        print("torch sees no GPU: no PyTorch comparison")
        return 1
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
    print(f"{'case':<44} {'ours us':>9}  {'impl':<15} {'theirs us':>10} {'ratio':>7}")
    for case, theirs in results:
        mine = ours.get(case)
        for impl, t in theirs.items():
            ratio = f"{t / mine:7.2f}" if mine else "      -"
            mine_s = f"{mine:9.2f}" if mine else "        -"
            print(f"{case:<44} {mine_s}  {impl:<15} {t:10.2f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
