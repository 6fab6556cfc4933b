#!/usr/bin/env bash
# The long run of the randomized differential tests (tests/properties.rs): every op on random
# shapes, strides, offsets, dtypes and in-place/view combinations against the f64 reference, on the
# emulated target. `cargo test` runs 24 cases per property; this runs $1 (default 2000).
# A failure is recorded under proptest-regressions/ and replayed first by every later run:
# commit that file and add a named regression test for it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh >/dev/null
LLK_PROPTEST_CASES="${1:-2000}" cargo test --release --test properties -- --nocapture
