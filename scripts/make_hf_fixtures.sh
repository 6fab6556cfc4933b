#!/usr/bin/env bash
# Regenerates tests/fixtures/hf with Hugging Face transformers itself (the independent reference
# of the block composer and of the GGUF loader): installs the pinned PyTorch, transformers, gguf
# and accelerate from PyPI into a project-local folder (never globally), then runs, on the CPU,
#
#   scripts/make_hf_fixtures.sh              # make_hf_fixtures.py -> crates/llama-model/tests/fixtures/hf/{llama3,llama4}
#   scripts/make_hf_fixtures.sh --gguf       # make_gguf_hf_fixture.py -> crates/llama-model/tests/fixtures/hf/smollm2_gguf
#                                            # (needs the test model: scripts/setup.sh)
#   scripts/make_hf_fixtures.sh --arch       # make_gguf_arch_fixtures.py -> crates/llama-model/tests/fixtures/gguf_arch
#                                            # (llama 3.1 and llama4 GGUF files and their references)
#   HF_ENV=/tmp/hf-python scripts/make_hf_fixtures.sh   # env elsewhere (default .toolchain/hf-python, git-ignored)
#
# The PyPI torch wheel pulls its CUDA libraries (several GB); nothing here needs a GPU.
# Remaining arguments go to the Python script.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${HF_ENV:-$root/.toolchain/hf-python}"
# gguf and accelerate: transformers needs both to load a GGUF file (from_pretrained(..., gguf_file=...)).
pins=(torch==2.9.0 transformers==4.57.1 gguf==0.17.1 accelerate==1.11.0)
stamp="$env_dir/installed.txt"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "${pins[*]}" ]]; then
  echo "make_hf_fixtures: installing ${pins[*]} into $env_dir ..."
  mkdir -p "$env_dir"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$env_dir" "${pins[@]}"
  echo "${pins[*]}" >"$stamp"
fi
cd "$root"
if [[ "${1:-}" == "--gguf" ]]; then
  shift
  out=crates/llama-model/tests/fixtures/hf/smollm2_gguf
  PYTHONPATH="$env_dir" python3 scripts/make_gguf_hf_fixture.py \
    --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --out "$out" "$@"
elif [[ "${1:-}" == "--arch" ]]; then
  shift
  out=crates/llama-model/tests/fixtures/gguf_arch
  PYTHONPATH="$env_dir" python3 scripts/make_gguf_arch_fixtures.py --out "$out" "$@"
else
  out=crates/llama-model/tests/fixtures/hf
  PYTHONPATH="$env_dir" python3 scripts/make_hf_fixtures.py --out "$out" "$@"
fi
du -sh "$out"
