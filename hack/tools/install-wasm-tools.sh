#!/usr/bin/env bash
# Installs a pinned wasm-tools into a cache outside the repository, keyed by version, and prints
# the path of the binary on its last line. Idempotent: a second run only checks the cached binary.
# Only the subcommands the repository uses (`component new`, `validate`) are built: the default
# features (smith, mutate, shrink, compose, ...) triple a cold build on two cores.
#
#   hack/tools/install-wasm-tools.sh            # install (or reuse) and print the binary path
#   WASM_TOOLS="$(hack/tools/install-wasm-tools.sh | tail -n1)"
#
# Environment:
#   WASM_TOOLS_VERSION  version to install (default below; 1.263.0 builds with Rust 1.95)
#   NEOCLOUD_TOOLS_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv/tools)
set -euo pipefail

version="${WASM_TOOLS_VERSION:-1.263.0}"
cache_root="${NEOCLOUD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv/tools}"
root="${cache_root}/wasm-tools-${version}"
bin="${root}/bin/wasm-tools"

log() { echo "install-wasm-tools: $*" >&2; }
die() { log "error: $*"; exit 1; }

command -v cargo >/dev/null 2>&1 || die "cargo not found on PATH; install the Rust toolchain first"

if [[ -x "${bin}" ]]; then
    have="$("${bin}" --version 2>/dev/null | awk '{print $2}')" || have=""
    if [[ "${have}" == "${version}" ]]; then
        log "wasm-tools ${version} already installed at ${bin}"
        echo "${bin}"
        exit 0
    fi
    log "cached binary at ${bin} reports '${have}', expected ${version}; reinstalling"
fi

mkdir -p "${root}"
log "installing wasm-tools ${version} into ${root} (cargo install --locked; this takes a few minutes)"
if ! CARGO_INSTALL_ROOT="${root}" cargo install --locked --version "=${version}" \
    --no-default-features --features component,validate wasm-tools >&2; then
    rmdir "${root}" 2>/dev/null || true
    die "cargo install of wasm-tools ${version} failed (see the cargo output above)"
fi

[[ -x "${bin}" ]] || die "cargo install finished but ${bin} is missing"
got="$("${bin}" --version | awk '{print $2}')"
[[ "${got}" == "${version}" ]] || die "installed binary reports version '${got}', expected ${version}"
log "installed wasm-tools ${got} at ${bin}"
echo "${bin}"
