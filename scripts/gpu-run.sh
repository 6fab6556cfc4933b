#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-stage.sh staged the
# binaries here. One call: GPU tests, verify at full size, the benches, then PyTorch on the same
# shapes, with our/their ratios printed last. Everything is also written to $OUT/ (returned).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-/tmp/llk-out}"
stage=/tmp/llk-stage
rm -rf "$stage" && mkdir -p "$stage"
tar -C "$stage" -xJf "$here/bin.tar.xz" || { echo "gpu-run: cannot unpack $here/bin.tar.xz"; exit 1; }
cp "$here/torch_compare.py" "$stage/"
mkdir -p "$out"
log="$out/gpu-run.txt"
exec > >(tee "$log") 2>&1

echo "== machine"; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true

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
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cudarc (CUDA 13.0 bindings) looks for libcublas.so or libcublas.so.13. If the torch wheels only
# ship cuBLAS 12 (libcublas.so.12; cublasGemmEx has the same ABI), expose it under the plain name.
if ! ls ${libs//:/\/libcublas.so.13 }/libcublas.so.13 >/dev/null 2>&1; then
  cublas12=$(ls ${libs//:/\/libcublas.so.12 }/libcublas.so.12 2>/dev/null | head -n 1 || true)
  if [[ -n "$cublas12" ]]; then
    shim=$(mktemp -d); ln -s "$cublas12" "$shim/libcublas.so"
    export LD_LIBRARY_PATH="$shim:$LD_LIBRARY_PATH"
    echo "note: cuBLAS 13 not found; using $cublas12 as libcublas.so"
  fi
fi

status=0
echo; echo "== tests (CUDA runs automatically next to the emulated target)"
for t in "$stage"/bin/test-*; do
  echo "-- $(basename "$t")"
  "$t" --test-threads=1 || status=1
done

echo; echo "== compute-sanitizer (memcheck, racecheck, synccheck) on every op (verify --quick)"
san_whl=$(ls "$here"/nvidia_cuda_sanitizer_api-*.whl 2>/dev/null | head -n 1)
if [[ -n "$san_whl" ]]; then
  $py -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$san_whl" "$stage/san"
  san=$(find "$stage/san" -name compute-sanitizer -type f | head -n 1)
  chmod +x "$san" 2>/dev/null || true
  for tool in memcheck racecheck synccheck; do
    if "$san" --tool "$tool" --error-exitcode 3 --print-limit 20 \
         "$stage/bin/llama-kernels" verify --target cuda --quick > "$out/sanitizer-$tool.txt" 2>&1; then
      echo "compute-sanitizer $tool: clean ($(grep -c '' "$out/sanitizer-$tool.txt") lines of output)"
    else
      echo "compute-sanitizer $tool: FAILED (exit $?), see sanitizer-$tool.txt:"; tail -n 20 "$out/sanitizer-$tool.txt"
      status=1
    fi
  done
else
  echo "compute-sanitizer: not available (the stage has no sanitizer wheel)"
fi

echo; echo "== verify at full size"
"$stage/bin/llama-kernels" info || status=1
# The static model next to the driver's occupancy of the same kernels (two attention blocks per SM?).
"$stage/bin/llama-kernels" info --perf || status=1
"$stage/bin/llama-kernels" verify --target cuda --full || status=1

echo; echo "== benches"
for b in "$stage"/bin/bench-*; do
  echo "-- $(basename "$b")"
  # --noplot: no gnuplot there; criterion's statistics and our summary tables are printed.
  "$b" --bench --noplot 2>&1 | tee "$out/$(basename "$b").txt" || status=1
done

echo; echo "== PyTorch on the same shapes, and our/their ratios"
$py "$stage/torch_compare.py" --ours "$out"/bench-*.txt || status=1

echo; echo "gpu-run finished with status $status"
exit $status
