#!/usr/bin/env bash
# Regenerates kernels/prebuilt/: the PTX (sm_90, sm_80), cubins and `ptxas -v` reports of every
# kernel family, and kernels/prebuilt/manifest.txt (input hashes, nvcc version, exact commands).
# Commit the result with the kernel change. build.rs uses these files when a build finds no nvcc.
#
# It compiles with build.rs's own code (build/device_code.rs, through tools/regen-kernels) and the
# pinned nvcc 13.0 of scripts/setup.sh. Idempotent: when the manifest already matches, it exits in
# about a second and touches nothing.
#   --force   rebuild even if the manifest matches     --check   only say whether it is fresh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh >/dev/null
NVCC="$PWD/.toolchain/python/nvidia/cu13/bin/nvcc" \
  cargo run --quiet --release --manifest-path tools/regen-kernels/Cargo.toml -- "$@"
