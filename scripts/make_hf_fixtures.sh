#!/usr/bin/env bash
# Regenerates tests/fixtures/hf with Hugging Face transformers itself (the independent reference
# of the block composer): installs the pinned PyTorch and transformers from PyPI into a
# project-local folder (never globally), then runs scripts/make_hf_fixtures.py on the CPU.
#
#   scripts/make_hf_fixtures.sh              # env in .toolchain/hf-python (git-ignored)
#   HF_ENV=/tmp/hf-python scripts/make_hf_fixtures.sh
#
# The PyPI torch wheel pulls its CUDA libraries (several GB); nothing here needs a GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${HF_ENV:-$root/.toolchain/hf-python}"
pins=(torch==2.9.0 transformers==4.57.1)
stamp="$env_dir/installed.txt"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "${pins[*]}" ]]; then
  echo "make_hf_fixtures: installing ${pins[*]} into $env_dir ..."
  mkdir -p "$env_dir"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$env_dir" "${pins[@]}"
  echo "${pins[*]}" >"$stamp"
fi
cd "$root"
PYTHONPATH="$env_dir" python3 scripts/make_hf_fixtures.py --out tests/fixtures/hf "$@"
du -sh tests/fixtures/hf
