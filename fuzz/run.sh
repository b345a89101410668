#!/usr/bin/env bash
# Builds and runs the fuzz targets of fuzz/ (cargo fuzz, nightly from fuzz/rust-toolchain.toml),
# one target at a time, with libFuzzer's default of one job.
#
#   fuzz/run.sh run SECONDS [TARGET...]   fuzz each target for SECONDS, growing the corpus kept
#                                         in ~/.cache/neocloud-testenv/fuzz-corpus/<target>
#   fuzz/run.sh smoke SECONDS             replay each target's seeds (fuzz/corpus/<target>) and
#                                         crash regressions (fuzz/regressions/<target>), then fuzz
#                                         it for SECONDS from a scratch corpus (what CI runs); the
#                                         smoke builds without optimisations (--dev): a cold
#                                         optimised build of wasmtime, cranelift and k8s-openapi
#                                         takes most of CI's budget, and a 20 s run needs no speed
#   fuzz/run.sh build                     build every target
#   fuzz/run.sh smoke-build               build every target as the smoke does (--dev), without
#                                         running any: .ci/run builds them beside the workspace
#
# cargo-fuzz is taken from PATH, or installed once into a cache keyed by its version. The build
# goes to ~/.cache/neocloud-testenv/fuzz-target so later runs are incremental. A crash, a leak,
# a timeout or an out-of-memory input fails the run (non-zero) and leaves the input in
# fuzz/artifacts/<target>/.
set -euo pipefail

fuzz_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
CARGO_FUZZ_VERSION=0.13.2
target_dir=${FUZZ_TARGET_DIR:-$cache/fuzz-target}
# The workspace forbids unsafe code, so AddressSanitizer would only slow the runs down; panics,
# overflow checks (debug assertions are on), timeouts and memory use are what the targets catch.
build_flags=(--sanitizer none --target-dir "$target_dir")
libfuzzer_flags=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)

log() { printf 'fuzz: %s\n' "$*" >&2; }

# Every change to the workspace leaves the previous build's artifacts behind in the cached target
# directory, and the disk is shared with the rest of CI: past FUZZ_TARGET_MAX_GB (default 6) the
# directory is dropped and rebuilt. Incremental state would only add to it (each run is one build).
export CARGO_INCREMENTAL=0
prune_target_dir() {
  local max_gb=${FUZZ_TARGET_MAX_GB:-6} kb
  [ -d "$target_dir" ] || return 0
  kb=$(du -sk "$target_dir" | cut -f1)
  if [ "$kb" -gt $(( max_gb * 1024 * 1024 )) ]; then
    log "$target_dir holds $(( kb / 1024 / 1024 )) GB (over ${max_gb}): dropping it"
    rm -rf "$target_dir"
  fi
}

cargo_fuzz() {
  if ! command -v cargo-fuzz >/dev/null; then
    local root="$cache/cargo-fuzz-$CARGO_FUZZ_VERSION"
    if [ ! -x "$root/bin/cargo-fuzz" ]; then
      log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $root"
      # Unoptimised, without debug info: it only drives cargo (17 s to build on two cores, 34 s
      # optimised).
      CARGO_PROFILE_DEV_DEBUG=false cargo install --debug --quiet --root "$root" cargo-fuzz \
        --version "$CARGO_FUZZ_VERSION" --locked
    fi
    export PATH="$root/bin:$PATH"
  fi
  (cd "$fuzz_dir" && cargo fuzz "$@")
}

targets() { cargo_fuzz list; }

run_one() {
  local target=$1 seconds=$2 corpus=$3
  shift 3
  mkdir -p "$corpus" "$fuzz_dir/regressions/$target"
  log "$target: ${seconds}s, corpus $corpus"
  cargo_fuzz run "${build_flags[@]}" "$@" "$target" "$corpus" \
    "$fuzz_dir/corpus/$target" "$fuzz_dir/regressions/$target" \
    -- "${libfuzzer_flags[@]}" -max_total_time="$seconds"
}

mode=${1:-}
case "$mode" in
  build)
    cargo_fuzz build "${build_flags[@]}"
    ;;
  run)
    seconds=${2:?seconds}
    shift 2
    list=("$@")
    [ ${#list[@]} -gt 0 ] || mapfile -t list < <(targets)
    cargo_fuzz build "${build_flags[@]}"
    for t in "${list[@]}"; do
      run_one "$t" "$seconds" "$cache/fuzz-corpus/$t"
      log "$t: corpus $(find "$cache/fuzz-corpus/$t" -type f | wc -l) files, $(du -sb "$cache/fuzz-corpus/$t" | cut -f1) bytes"
    done
    ;;
  smoke-build)
    start=$(date +%s)
    prune_target_dir
    cargo_fuzz build "${build_flags[@]}" --dev
    log "built in $(( $(date +%s) - start ))s"
    ;;
  smoke)
    seconds=${2:?seconds}
    start=$(date +%s)
    prune_target_dir
    cargo_fuzz build "${build_flags[@]}" --dev
    log "built in $(( $(date +%s) - start ))s"
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    mapfile -t list < <(targets)
    for t in "${list[@]}"; do
      run_one "$t" "$seconds" "$scratch/$t" --dev
    done
    log "smoke of ${#list[@]} targets done in $(( $(date +%s) - start ))s"
    ;;
  *)
    sed -n '2,18p' "${BASH_SOURCE[0]}" >&2
    exit 2
    ;;
esac
