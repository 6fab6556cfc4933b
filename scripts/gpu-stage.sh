#!/usr/bin/env bash
# Builds, here (no GPU needed), everything the GPU machine runs, and stages it in target/gpu-stage:
#   bin.tar.xz the llama-kernels binary, the GPU-relevant test binaries and the bench binaries
#   gpu-run.sh torch_compare.py
# Then, with the device tool, one call runs it all (see README "Running on a GPU"):
#   run(command="bash target/gpu-stage/gpu-run.sh", carry=["target/gpu-stage"], timeout_s=540)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh >/dev/null
stage=target/gpu-stage
rm -rf "$stage"
mkdir -p "$stage/bin"

# Test binaries that exercise kernels (static checks and the params mirror read this checkout's
# build folders and sources, and run in CI instead).
gpu_tests="rms_norm emulator rope swiglu attention paged_attention moe ptx_wrappers devices_and_tensors interop gpu_graph linear block"
cargo build --release --bin llama-kernels
cp target/release/llama-kernels "$stage/bin/"
cargo test --release --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
wanted = set(sys.argv[1].split())
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"] \
       and m["target"]["name"] in wanted:
        print(m["target"]["name"], m["executable"])
' "$gpu_tests" | while read -r name exe; do cp "$exe" "$stage/bin/test-$name"; done
cargo bench --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["bench"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" "$stage/bin/bench-$name"; done
strip "$stage"/bin/* 2>/dev/null || true
ls -la "$stage/bin"
# Every binary embeds the same PTX: compressed, the stage fits the device tool's 64 MiB carry limit
# with room to spare. gpu-run.sh unpacks it.
tar -C "$stage" -cf - bin | xz -T0 -6 > "$stage/bin.tar.xz"
rm -rf "$stage/bin"
cp scripts/gpu-run.sh scripts/torch_compare.py "$stage/"
# compute-sanitizer (memcheck, racecheck, synccheck) from NVIDIA's PyPI wheel, pinned to the
# driver's CUDA 13.0; the GPU machine has no network. Optional: gpu-run.sh says when it is missing.
python3 -m pip download --quiet --no-deps --dest "$stage" nvidia-cuda-sanitizer-api==13.0.85 ||
  echo "gpu-stage: could not fetch the compute-sanitizer wheel; the sanitizer step will be skipped"
du -sh "$stage"
