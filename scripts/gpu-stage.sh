#!/usr/bin/env bash
# Builds, here (no GPU needed), everything the GPU machine runs, and stages it in target/gpu-stage:
#   bin.tar.xz          the llama-kernels binary, the GPU test binaries and the bench binaries,
#                       built with LLK_DEVICE_CODE_LOCATION=external: each carries the emulated
#                       kernels and only the size and SHA-256 of each device-code file
#   device-code.tar.xz  the device code, once: sm_90/ and sm_80/ (the layout of a build's OUT_DIR)
#                       and device-code.sha256; gpu-run.sh unpacks it, checks it with sha256sum and
#                       points LLK_DEVICE_CODE_DIR at it
#   the compute-sanitizer wheel (pinned, with its hash and size, in scripts/gpu-stage-wheel.txt),
#   gpu-run.sh, torch_compare.py
# Then, with the device tool, one call runs it all (see README "Running on a GPU"):
#   run(command="bash target/gpu-stage/gpu-run.sh", carry=["target/gpu-stage"], timeout_s=540)
#
# The device tool carries at most 64 MiB. The stage must stay under STAGE_BUDGET (60 MiB), every
# binary (stripped) under BINARY_BUDGET, and bin.tar.xz under BINARY_XZ_BUDGET per binary; the
# script fails, naming the sizes, when it does not.
#
#   scripts/gpu-stage.sh                       build and stage
#   scripts/gpu-stage.sh --dry-run             build nothing: list what a stage holds and check the
#                                              budget (device code unpacked from the prebuilt archive,
#                                              the wheel at its pinned size, each binary at
#                                              BINARY_XZ_BUDGET); xtask/tests/gpu_stage.rs runs it
#   scripts/gpu-stage.sh --check-listing FILE  check a listing: lines `<bytes> <path>`; a path
#                                              `archive:member` is inside that archive (not counted
#                                              in the total), bytes `-` means not built
#
# The build is one cargo invocation, in its own target folder (target/gpu-stage-build, so that
# the switch of device-code location does not rebuild the normal target/), with symbols stripped
# at link time. It uses the prebuilt device code when the committed copy is fresh (no nvcc run),
# else compiles the kernels; LLK_DEVICE_CODE, if set, decides instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly MIB=$((1024 * 1024))
readonly STAGE_BUDGET=$((60 * MIB))
readonly BINARY_BUDGET=$((16 * MIB))
readonly BINARY_XZ_BUDGET=$((1 * MIB))
readonly stage=target/gpu-stage
readonly build_dir=target/gpu-stage-build
readonly wheel_pin=scripts/gpu-stage-wheel.txt
# The test binaries that exercise kernels: one per crate (the inspect crate's static checks and
# xtask's repository checks read this checkout's build folders and sources, and run in CI).
readonly gpu_tests="kernels model"
readonly crates="crates/llama-kernels crates/llama-model"
readonly prebuilt=crates/llama-kernels/kernels/prebuilt
# Every bench: they time CUDA events and explain themselves on a machine without a GPU.
benches() { for c in $crates; do sed -n '/^\[\[bench\]\]/,/^name/s/^name = "\(.*\)"/\1/p' "$c/Cargo.toml"; done; }
# Deterministic archives: the dry run's device-code.tar.xz is the staged one, byte for byte.
tar_c() { tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=u+rw,go+r -cf - "$@"; }
xz_device_code() { xz -T0 -1 -c; }
# A large dictionary: the binaries share most of their code, and xz finds it across them.
xz_binaries() { xz -T1 --lzma2=preset=3,dict=64MiB -c; }

# check_listing FILE: the budget over a listing; prints a table; exit status 1 if over budget.
check_listing() {
  awk -v stage_budget="$STAGE_BUDGET" -v binary_budget="$BINARY_BUDGET" -v xz_budget="$BINARY_XZ_BUDGET" '
    function mib(b) { return sprintf("%.1f MiB", b / 1048576) }
    NF == 0 || $1 ~ /^#/ { next }
    NF < 2 || ($1 != "-" && $1 !~ /^[0-9]+$/) { printf "gpu-stage: bad listing line %d: %s\n", NR, $0; bad = 1; next }
    {
      path = $2
      if (index(path, ":") > 0) {
        archive = substr(path, 1, index(path, ":") - 1)
        members[archive]++
        if ($1 != "-" && $1 + 0 > binary_budget) {
          printf "gpu-stage: %s is %s, over the %s budget per binary (does it embed the device code?)\n", path, mib($1), mib(binary_budget)
          over = 1
        }
      } else {
        if ($1 == "-") { printf "gpu-stage: %s has no size\n", path; bad = 1; next }
        size[path] = $1; total += $1; files++
      }
    }
    END {
      for (a in members) {
        if (!(a in size)) { printf "gpu-stage: %s holds %d binaries but is not listed\n", a, members[a]; bad = 1; continue }
        if (size[a] > members[a] * xz_budget) {
          printf "gpu-stage: %s is %s for %d binaries, over %s (%s each)\n", a, mib(size[a]), members[a], mib(members[a] * xz_budget), mib(xz_budget)
          over = 1
        }
      }
      if (total > stage_budget) {
        printf "gpu-stage: the stage is %s (%d bytes), over its %s budget (the device tool carries at most 64 MiB)\n", mib(total), total, mib(stage_budget)
        over = 1
      }
      printf "gpu-stage: %d files, %s of %s%s\n", files, mib(total), mib(stage_budget), bad ? ": invalid listing" : over ? ": OVER BUDGET" : ": within budget"
      exit (over || bad) ? 1 : 0
    }' "$1"
}

# The pinned wheel: `name==version`, its sha256 and its size, from the pin file.
wheel_field() { sed -n "s/^$1 //p" "$wheel_pin"; }

dry_run() {
  local listing tmp
  tmp=$(mktemp -d)
  listing="$tmp/listing.txt"
  # The device code as a build from the prebuilt archive stages it (byte-identical to a source
  # build): unpacked from it (LLK_PREBUILT_UNPACKED names a folder that already holds it).
  local dc="${LLK_PREBUILT_UNPACKED:-$tmp/dc}"
  if [[ -z "${LLK_PREBUILT_UNPACKED:-}" ]]; then
    cargo xtask unpack-prebuilt "$dc" >/dev/null || { echo "gpu-stage: cannot unpack the prebuilt device code"; return 1; }
  fi
  awk '$1 == "output" { print $2 "  " $3 }' $prebuilt/manifest.txt | LC_ALL=C sort -k2 >"$tmp/device-code.sha256"
  {
    echo "# gpu-stage --dry-run: nothing built; binaries at BINARY_XZ_BUDGET each"
    echo "$(tar_c -C "$dc" sm_90 sm_80 -C "$tmp" device-code.sha256 | xz_device_code | wc -c) device-code.tar.xz"
    echo "$(wheel_field size) $(wheel_field file)"
    for f in scripts/gpu-run.sh scripts/torch_compare.py; do echo "$(wc -c <"$f") $(basename "$f")"; done
    local n=0 b
    for b in llama-kernels $(printf 'test-%s ' $gpu_tests) $(benches | sed 's/^/bench-/'); do
      echo "- bin.tar.xz:bin/$b"; n=$((n + 1))
    done
    echo "$((n * BINARY_XZ_BUDGET)) bin.tar.xz"
  } >"$listing"
  cat "$listing"
  local rc=0
  check_listing "$listing" || rc=$?
  rm -rf "$tmp"
  return $rc
}

case "${1:-}" in
  --dry-run) dry_run; exit $? ;;
  --check-listing) [[ $# -eq 2 ]] || { echo "usage: $0 --check-listing FILE" >&2; exit 2; }; check_listing "$2"; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--dry-run | --check-listing FILE]" >&2; exit 2 ;;
esac

start=$SECONDS
scripts/setup.sh >/dev/null
if [[ -z "${LLK_DEVICE_CODE:-}" ]]; then
  if cargo xtask regen-kernels --check >/dev/null 2>&1; then
    export LLK_DEVICE_CODE=prebuilt
  else
    echo "gpu-stage: the prebuilt device code is stale (cargo xtask regen-kernels --check): compiling the kernels with nvcc"
    export LLK_DEVICE_CODE=source
  fi
fi
echo "gpu-stage: device code origin ${LLK_DEVICE_CODE}, location external; building in $build_dir"
rm -rf "$stage"
mkdir -p "$stage/bin"

targets=(--bin llama-kernels)
for t in $gpu_tests; do targets+=(--test "$t"); done
for b in $(benches); do targets+=(--bench "$b"); done
json="$build_dir/gpu-stage-build.json"
mkdir -p "$build_dir"
# One invocation builds the binary, the tests (with their harness) and the benches, sharing one
# build of the library. Release settings, symbols stripped by the linker, no debug info.
LLK_DEVICE_CODE_LOCATION=external CARGO_TARGET_DIR="$build_dir" \
  CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
  cargo build --release -p llama-kernels -p llama-model -p llama-kernels-cli "${targets[@]}" --message-format=json-render-diagnostics >"$json"

# Binaries, and the device-code folders of the builds of llama-kernels (one per feature set).
python3 - "$json" "$stage/bin" "$gpu_tests" >"$build_dir/gpu-stage-outputs.txt" <<'PY'
import json, shutil, sys
json_path, dest, tests = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
seen, out_dirs, lib_ids = set(), [], set()
for line in open(json_path):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed":
        out_dirs.append((m["package_id"], m["out_dir"]))
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "llama_kernels" and "lib" in m["target"]["kind"]:
        lib_ids.add(m["package_id"])
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind, name = m["target"]["kind"], m["target"]["name"]
    if kind == ["bin"] and name == "llama-kernels":
        staged = "llama-kernels"
    elif kind == ["test"] and name in tests:
        staged = f"test-{name}"
    elif kind == ["bench"]:
        staged = f"bench-{name}"
    else:
        continue
    if staged in seen:
        sys.exit(f"gpu-stage: {staged} built twice")
    seen.add(staged)
    shutil.copy(m["executable"], f"{dest}/{staged}")
    print("bin", staged)
for package, out_dir in out_dirs:
    if package in lib_ids:
        print("out_dir", out_dir)
PY

# The device code, once: every build of the library must expect the same files.
dc="$build_dir/device-code"
rm -rf "$dc" && mkdir -p "$dc"
n_out=0
while read -r kind out_dir; do
  [[ $kind == out_dir ]] || continue
  n_out=$((n_out + 1))
  list="$out_dir/device-code.sha256"
  [[ -f $list ]] || { echo "gpu-stage: $list is missing: was llama-kernels built with LLK_DEVICE_CODE_LOCATION=external?"; exit 1; }
  if [[ -f $dc/device-code.sha256 ]]; then
    # A second build of the library (another feature set): its files must be among the staged ones.
    if ! (cd "$dc" && sha256sum --quiet -c "$list"); then
      echo "gpu-stage: two builds of llama-kernels expect different device code ($list)"; exit 1
    fi
    LC_ALL=C sort -u -k2 "$dc/device-code.sha256" "$list" -o "$dc/device-code.sha256"
    continue
  fi
  (cd "$out_dir" && sha256sum --quiet -c device-code.sha256) ||
    { echo "gpu-stage: $out_dir does not hold the device code its build listed"; exit 1; }
  while read -r _ f; do mkdir -p "$dc/$(dirname "$f")"; cp "$out_dir/$f" "$dc/$f"; done <"$list"
  cp "$list" "$dc/device-code.sha256"
done <"$build_dir/gpu-stage-outputs.txt"
[[ $n_out -ge 1 ]] || { echo "gpu-stage: cargo reported no build of llama-kernels"; exit 1; }

ls -la "$stage/bin"
listing="$build_dir/gpu-stage-listing.txt"
for b in "$stage"/bin/*; do echo "$(wc -c <"$b") bin.tar.xz:bin/$(basename "$b")"; done >"$listing"
tar_c -C "$dc" sm_90 sm_80 device-code.sha256 | xz_device_code >"$stage/device-code.tar.xz"
tar_c -C "$stage" bin | xz_binaries >"$stage/bin.tar.xz"
rm -rf "$stage/bin"
cp scripts/gpu-run.sh scripts/torch_compare.py "$stage/"
# compute-sanitizer (memcheck, racecheck, synccheck) from NVIDIA's PyPI wheel, pinned to the
# driver's CUDA 13.0 and checked by its hash; the GPU machine has no network. Optional:
# gpu-run.sh says when it is missing.
wheel_req="$build_dir/gpu-stage-wheel.req"
echo "$(wheel_field requirement) --hash=sha256:$(wheel_field sha256)" >"$wheel_req"
python3 -m pip download --quiet --no-deps --require-hashes --dest "$stage" -r "$wheel_req" ||
  echo "gpu-stage: could not fetch the compute-sanitizer wheel; the sanitizer step will be skipped"
for f in "$stage"/*; do echo "$(wc -c <"$f") $(basename "$f")"; done >>"$listing"
cat "$listing"
check_listing "$listing"
echo "gpu-stage: staged in $stage ($(du -sb "$stage" | cut -f1) bytes) in $((SECONDS - start)) s"
