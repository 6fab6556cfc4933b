#!/usr/bin/env bash
# Installs the project's pinned CUDA toolchain (nvcc, ptxas, headers, cuobjdump) and libclang
# into ./.toolchain, a git-ignored, project-local folder. No GPU, no root, no system CUDA needed.
#
# Then fetches the test model (scripts/fetch-model.sh).
#
# Idempotent: a stamp file records the pinned set; when it matches, this exits in milliseconds.
# A user with a normal CUDA install (/usr/local/cuda, or NVCC / CUDA_HOME set) does not need it:
# build.rs looks there first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.toolchain/python"
stamp="$root/.toolchain/installed.txt"

# nvcc and its parts are pinned to CUDA 13.0: a newer NVVM emits PTX that driver 580 (CUDA 13.0)
# rejects. cuobjdump/nvdisasm only read SASS, and PyPI has no 13.0 builds of them.
# libclang is only used to regenerate (and check) the bindgen mirror of kernels/params.h.
pins=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-cuobjdump==13.2.78
  nvidia-cuda-nvdisasm==13.2.78
  libclang==18.1.1
)
want="$(printf '%s\n' "${pins[@]}")"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$dest/nvidia/cu13/bin/nvcc" ]]; then
  echo "setup: toolchain already installed in .toolchain (nvcc 13.0.88)"
  exec "$root/scripts/fetch-model.sh"
fi

python3 -m pip --version >/dev/null 2>&1 || { echo "setup: python3 with pip is required" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
echo "setup: installing ${#pins[@]} pinned wheels into .toolchain ..."
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$dest" "${pins[@]}"
"$dest/nvidia/cu13/bin/nvcc" --version | tail -n 2
printf '%s\n' "${pins[@]}" >"$stamp"
echo "setup: toolchain done"
exec "$root/scripts/fetch-model.sh"
