#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-stage.sh staged the
# binaries here. One call: GPU tests, compute-sanitizer, verify at full size, the benches, then
# PyTorch on the same shapes, with our/their ratios printed last. Everything is also written to
# $OUT/ (returned).
#
# The binaries read their device code from LLK_DEVICE_CODE_DIR, which this script points at the
# unpacked device-code.tar.xz after checking every file with sha256sum.
#
# On a machine without a GPU (a dry run: OUT=/tmp/llk-out bash target/gpu-stage/gpu-run.sh) every
# step still runs or says why it skips: the tests run their emulated cases (their CUDA cases say
# that they skip), the benches say that there is nothing to measure, and the steps that need a GPU
# are skipped. The last line counts the steps run, skipped and failed.
#
# A part of it, to fit a device budget (the whole script takes longer than one device call):
#   LLK_GPU_STEPS="tests sanitizer verify benches torch"   the sections to run (default: all)
#   LLK_GPU_BENCHES="qlinear model"                        the benches, in this order (default:
#                                                          every staged bench, by name); torch
#                                                          then compares only their sections
# e.g. run(command="LLK_GPU_STEPS='benches torch' LLK_GPU_BENCHES='qlinear model' bash target/gpu-stage/gpu-run.sh", ...)
#
# The Hopper prefill kernel runs only with LLK_ATTENTION_SM90=1 (CUDA picks mma.sync otherwise):
# every section that touches attention runs a second time with it set, as a "hopper step" under
# its own time limit (LLK_HOPPER_STEP_LIMIT_S, default 300 s; timeout -s KILL), so that a
# barrier deadlock, which would spin until the device call ends, fails that step by name and the
# rest still runs. A dry run lists each hopper step with its variable and limit.
# Each bench's wall time is printed after it. benches/model.rs times the real SmolLM2 GGUF when
# LLK_MODEL names it or it lies in .cache/models/ (it is 98 MB, over what one device call
# carries), else SmolLM2's shapes with random weights.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-/tmp/llk-out}"
stage=/tmp/llk-stage
mkdir -p "$out"
log="$out/gpu-run.txt"
exec > >(tee "$log") 2>&1

steps="${LLK_GPU_STEPS:-tests sanitizer verify benches torch}"
want() { [[ " $steps " == *" $1 "* ]]; }
ran=0 skipped=0 failed=0
step_ok() { ran=$((ran + 1)); }
step_failed() { ran=$((ran + 1)); failed=$((failed + 1)); echo "FAILED: $1"; }
step_skip() { skipped=$((skipped + 1)); echo "skipped: $1"; }
summary() {
  echo
  echo "gpu-run: $ran steps run, $skipped skipped, $failed failed$1"
}
hopper_limit="${LLK_HOPPER_STEP_LIMIT_S:-300}"
# hopper_step NAME COMMAND...: COMMAND with LLK_ATTENTION_SM90=1 under the step's time limit; a
# kill (exit 137) is reported as a hang. Without a GPU the step is listed, not run.
hopper_step() {
  local name=$1; shift
  if [[ $gpu == 0 ]]; then
    step_skip "hopper step '$name' (needs a GPU): LLK_ATTENTION_SM90=1 timeout -s KILL ${hopper_limit}s $*"
    return
  fi
  echo "-- hopper step '$name': LLK_ATTENTION_SM90=1, at most ${hopper_limit} s"
  LLK_ATTENTION_SM90=1 timeout -s KILL "$hopper_limit" "$@"
  local rc=$?
  if [[ $rc == 0 ]]; then
    step_ok
  elif [[ $rc == 137 ]]; then
    step_failed "hopper step '$name': killed after ${hopper_limit} s (a hang: an mbarrier or named-barrier deadlock?)"
  else
    step_failed "hopper step '$name' (exit $rc)"
  fi
}

echo "== stage"
rm -rf "$stage" && mkdir -p "$stage"
if ! tar -C "$stage" -xJf "$here/bin.tar.xz"; then
  step_failed "cannot unpack $here/bin.tar.xz"; summary " (nothing to run)"; exit 1
fi
if ! { mkdir -p "$stage/device-code" && tar -C "$stage/device-code" -xJf "$here/device-code.tar.xz"; }; then
  step_failed "cannot unpack $here/device-code.tar.xz"; summary " (nothing to run)"; exit 1
fi
if (cd "$stage/device-code" && sha256sum --quiet -c device-code.sha256); then
  echo "device code: $(grep -c '' "$stage/device-code/device-code.sha256") files, every sha256 matches"
  step_ok
else
  step_failed "the staged device code does not match its device-code.sha256"; summary ""; exit 1
fi
export LLK_DEVICE_CODE_DIR="$stage/device-code"
cp "$here/torch_compare.py" "$stage/"

echo; echo "== machine"; date -u
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 &&
   nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv; then
  gpu=1
  step_ok
else
  step_skip "nvidia-smi: no GPU here (dry run): the tests run on the emulated target, GPU-only steps skip"
fi

# cuBLAS (and the CUDA runtime pieces torch ships) live inside the torch wheels on that machine.
py=python3
libs=$($py - <<'PY' 2>/dev/null
import glob, os, site
dirs = set()
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for p in glob.glob(os.path.join(sp, "nvidia", "*", "lib")) + glob.glob(os.path.join(sp, "torch", "lib")):
        dirs.add(p)
print(":".join(sorted(dirs)))
PY
)
if [[ -n "$libs" ]]; then
  export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# cudarc (CUDA 13.0 bindings) looks for libcublas.so or libcublas.so.13. If the torch wheels only
# ship cuBLAS 12 (libcublas.so.12; cublasGemmEx has the same ABI), expose it under the plain name.
if [[ -n "$libs" ]] && ! ls ${libs//:/\/libcublas.so.13 }/libcublas.so.13 >/dev/null 2>&1; then
  cublas12=$(ls ${libs//:/\/libcublas.so.12 }/libcublas.so.12 2>/dev/null | head -n 1 || true)
  if [[ -n "$cublas12" ]]; then
    shim=$(mktemp -d); ln -s "$cublas12" "$shim/libcublas.so"
    export LD_LIBRARY_PATH="$shim:$LD_LIBRARY_PATH"
    echo "note: cuBLAS 13 not found; using $cublas12 as libcublas.so"
  fi
fi

echo; echo "== tests (CUDA runs automatically next to the emulated target)"
if ! want tests; then
  step_skip "tests: not in LLK_GPU_STEPS"
else
  if [[ $gpu == 1 ]]; then threads=(--test-threads=1); else
    threads=(); echo "no GPU: emulated cases only (each CUDA case says that it skips)"
  fi
  for t in "$stage"/bin/test-*; do
    echo "-- $(basename "$t")"
    if "$t" "${threads[@]}"; then step_ok; else step_failed "$(basename "$t")"; fi
  done
  # The Hopper prefill kernel against the reference: every attention test again, among them the
  # cases that wrap its K/V ring at head_dim 256 and 128 (listed here).
  if [[ -x "$stage/bin/test-kernels" ]]; then
    echo "Hopper hardware cases: $("$stage/bin/test-kernels" --list attention:: 2>/dev/null | grep -o 'attention::[a-z0-9_]*hopper[a-z0-9_]*' | tr '\n' ' ')"
    hopper_step "test-kernels attention::" "$stage/bin/test-kernels" attention:: "${threads[@]}"
  fi
fi

echo; echo "== compute-sanitizer (memcheck, racecheck, synccheck) on every op (verify --quick)"
san_whl=$(ls "$here"/nvidia_cuda_sanitizer_api-*.whl 2>/dev/null | head -n 1)
if ! want sanitizer; then
  step_skip "compute-sanitizer: not in LLK_GPU_STEPS"
elif [[ $gpu == 0 ]]; then
  step_skip "compute-sanitizer: needs a GPU"
  for tool in memcheck racecheck synccheck; do
    hopper_step "compute-sanitizer $tool" compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 20 \
      --log-file "$out/sanitizer-$tool-sm90.txt" "$stage/bin/llama-kernels" verify --target cuda --quick
  done
elif [[ -z "$san_whl" ]]; then
  step_skip "compute-sanitizer: not available (the stage has no sanitizer wheel)"
else
  $py -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$san_whl" "$stage/san"
  san=$(find "$stage/san" -name compute-sanitizer -type f | head -n 1)
  chmod +x "$san" 2>/dev/null || true
  for tool in memcheck racecheck synccheck; do
    if "$san" --tool "$tool" --error-exitcode 3 --print-limit 20 \
         "$stage/bin/llama-kernels" verify --target cuda --quick > "$out/sanitizer-$tool.txt" 2>&1; then
      echo "compute-sanitizer $tool: clean ($(grep -c '' "$out/sanitizer-$tool.txt") lines of output)"
      step_ok
    else
      echo "compute-sanitizer $tool: FAILED (exit $?), see sanitizer-$tool.txt:"; tail -n 20 "$out/sanitizer-$tool.txt"
      step_failed "compute-sanitizer $tool"
    fi
    hopper_step "compute-sanitizer $tool" "$san" --tool "$tool" --error-exitcode 3 --print-limit 20 \
      --log-file "$out/sanitizer-$tool-sm90.txt" "$stage/bin/llama-kernels" verify --target cuda --quick
  done
fi

echo; echo "== verify"
if "$stage/bin/llama-kernels" info; then step_ok; else step_failed "llama-kernels info"; fi
# The static model next to the driver's occupancy of the same kernels (two attention blocks per SM?).
if ! want verify; then
  step_skip "info --perf and verify: not in LLK_GPU_STEPS"
else
  if "$stage/bin/llama-kernels" info --perf; then step_ok; else step_failed "llama-kernels info --perf"; fi
  if [[ $gpu == 1 ]]; then
    if "$stage/bin/llama-kernels" verify --target cuda --full; then step_ok; else step_failed "verify --target cuda --full"; fi
    hopper_step "verify --target cuda --full" "$stage/bin/llama-kernels" verify --target cuda --full
  else
    hopper_step "verify --target cuda --full" "$stage/bin/llama-kernels" verify --target cuda --full
    echo "no GPU: verify --target emulated --quick instead of verify --target cuda --full"
    if "$stage/bin/llama-kernels" verify --target emulated --quick; then step_ok; else step_failed "verify --target emulated"; fi
  fi
fi

echo; echo "== benches"
# The real SmolLM2 GGUF for benches/model.rs, if it came along (else it times random weights).
if [[ -z "${LLK_MODEL:-}" ]]; then
  for m in "$PWD/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$here/SmolLM2-135M-Instruct.Q4_1.gguf"; do
    if [[ -f $m ]]; then export LLK_MODEL="$m"; echo "LLK_MODEL=$m"; break; fi
  done
fi
if [[ -n "${LLK_GPU_BENCHES:-}" ]]; then
  benches=()
  for name in $LLK_GPU_BENCHES; do benches+=("$stage/bin/bench-$name"); done
else
  benches=("$stage"/bin/bench-*)
fi
if ! want benches; then
  step_skip "benches: not in LLK_GPU_STEPS"
  benches=()
fi
for b in "${benches[@]}"; do
  echo "-- $(basename "$b")"
  if [[ ! -x $b ]]; then step_failed "$(basename "$b") is not staged"; continue; fi
  t0=$SECONDS
  # --noplot: no gnuplot there; criterion's statistics and our summary tables are printed.
  # Without a GPU each bench says that it has nothing to measure.
  if "$b" --bench --noplot 2>&1 | tee "$out/$(basename "$b").txt"; then step_ok; else step_failed "$(basename "$b")"; fi
  echo "-- $(basename "$b"): $((SECONDS - t0)) s"
  if [[ $(basename "$b") == bench-attention ]]; then
    # The bench checks each shape's output against the reference before it times it.
    hopper_step "bench-attention" bash -c 'set -o pipefail; "$1" --bench --noplot 2>&1 | tee "$2"' _ "$b" "$out/bench-attention-sm90.txt"
  fi
done

echo; echo "== PyTorch on the same shapes, and our/their ratios"
# torch_compare.py's sections: those of the benches run (all when LLK_GPU_BENCHES is unset).
sections=(rms_norm rope swiglu attention decode moe layer qlinear)
only=()
if [[ -n "${LLK_GPU_BENCHES:-}" ]]; then
  for s in "${sections[@]}"; do [[ " $LLK_GPU_BENCHES " == *" $s "* ]] && only+=("$s"); done
fi
if ! want torch; then
  step_skip "torch_compare.py: not in LLK_GPU_STEPS"
elif [[ -n "${LLK_GPU_BENCHES:-}" && ${#only[@]} -eq 0 ]]; then
  step_skip "torch_compare.py: no section for the benches run ($LLK_GPU_BENCHES)"
elif ! $py -c 'import torch' >/dev/null 2>&1; then
  step_skip "torch_compare.py: PyTorch is not installed here"
elif [[ $gpu == 0 ]]; then
  echo "no GPU: torch_compare.py --cpu-smoke (checks the script; its times mean nothing)"
  if $py "$stage/torch_compare.py" --cpu-smoke ${only[@]+--only "${only[@]}"}; then step_ok; else step_failed "torch_compare.py --cpu-smoke"; fi
else
  if $py "$stage/torch_compare.py" ${only[@]+--only "${only[@]}"} --ours "$out"/bench-*.txt; then step_ok; else step_failed "torch_compare.py"; fi
fi

summary "$([[ $gpu == 0 ]] && echo " (no GPU: a dry run)")"
[[ $failed == 0 ]]
