#!/usr/bin/env bash
# Regenerates src/ffi/params.rs and src/ffi/emu_abi.rs from the C headers with bindgen.
# libclang comes from the project toolchain (scripts/setup.sh installs the PyPI `libclang` wheel);
# Debian's libclang-dev works too (set LIBCLANG_PATH, or leave it unset to let bindgen search).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh >/dev/null
cargo run --quiet --manifest-path tools/regen-params/Cargo.toml
