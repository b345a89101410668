#!/usr/bin/env bash
# Installs everything `policies/build.sh` needs to build the guest policies from source, and
# prints `NAME=path` lines for the tools it installed (last lines of stdout). Idempotent: a second
# run only checks what is already there. Fails loudly on the first thing it cannot install.
#
#   hack/tools/install-guest-toolchain.sh          # install (or reuse) and print tool paths
#   eval "$(hack/tools/install-guest-toolchain.sh)"  # export WASM_TOOLS, WIT_BINDGEN, COMPONENTIZE_JS_DIR,
#                                                    # COMPONENTIZE_PY
#
# What it installs:
#   - Debian packages clang, lld, wasi-libc, libclang-rt-dev-wasm32 (apt-get, only if missing)
#   - wit-bindgen-cli (cargo install --locked --debug, the C generator only) into the tools cache,
#     keyed by version
#   - wasm-tools, through hack/tools/install-wasm-tools.sh
#   - @bytecodealliance/componentize-js (npm) into the tools cache, keyed by version
#   - componentize-py (PyPI; its wheel carries the Python runtime) into a virtualenv in the tools
#     cache, keyed by version
#
# Environment:
#   WIT_BINDGEN_VERSION     default 0.63.0 (builds with Rust 1.95)
#   COMPONENTIZE_JS_VERSION default 0.23.0
#   COMPONENTIZE_PY_VERSION default 0.25.1
#   NEOCLOUD_TOOLS_DIR      cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv/tools)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wit_bindgen_version="${WIT_BINDGEN_VERSION:-0.63.0}"
cjs_version="${COMPONENTIZE_JS_VERSION:-0.23.0}"
cpy_version="${COMPONENTIZE_PY_VERSION:-0.25.1}"
cache_root="${NEOCLOUD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv/tools}"

log() { echo "install-guest-toolchain: $*" >&2; }
die() { log "error: $*"; exit 1; }

install_apt_packages() {
    local missing=()
    for pkg in clang lld wasi-libc libclang-rt-dev-wasm32; do
        dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("${pkg}")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "debian packages already installed"
        return
    fi
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and apt-get is not available"
    local sudo=""
    [[ "$(id -u)" -eq 0 ]] || sudo="sudo"
    log "installing debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive ${sudo} apt-get install -y --no-install-recommends "${missing[@]}" >&2 \
        || die "apt-get install ${missing[*]} failed (run apt-get update first?)"
}

install_wit_bindgen() {
    local root="${cache_root}/wit-bindgen-${wit_bindgen_version}"
    local bin="${root}/bin/wit-bindgen"
    if [[ -x "${bin}" ]] && "${bin}" --version 2>/dev/null | grep -q " ${wit_bindgen_version}"; then
        log "wit-bindgen ${wit_bindgen_version} already installed at ${bin}"
    else
        mkdir -p "${root}"
        log "installing wit-bindgen-cli ${wit_bindgen_version} into ${root} (a few minutes)"
        # Unoptimised (--debug, no debug info): it generates a few kilobytes of C in
        # milliseconds either way, and the optimised build took 171 s of a cold CI run on two
        # cores (about 330 s of CPU) against 72 s (134 s of CPU).
        CARGO_PROFILE_DEV_DEBUG=false CARGO_INSTALL_ROOT="${root}" cargo install --debug --locked \
            --version "=${wit_bindgen_version}" --no-default-features --features c wit-bindgen-cli >&2 \
            || die "cargo install of wit-bindgen-cli ${wit_bindgen_version} failed"
        [[ -x "${bin}" ]] || die "cargo install finished but ${bin} is missing"
    fi
    WIT_BINDGEN="${bin}"
}

install_componentize_js() {
    local root="${cache_root}/componentize-js-${cjs_version}"
    local marker="${root}/node_modules/@bytecodealliance/componentize-js/package.json"
    command -v node >/dev/null 2>&1 || die "node not found on PATH; install Node.js 20 or newer"
    if [[ -f "${marker}" ]] && grep -q "\"version\": \"${cjs_version}\"" "${marker}"; then
        log "componentize-js ${cjs_version} already installed in ${root}"
    else
        mkdir -p "${root}"
        log "installing @bytecodealliance/componentize-js@${cjs_version} into ${root}"
        (cd "${root}" && [[ -f package.json ]] || echo '{"private":true}' >"${root}/package.json")
        npm install --prefix "${root}" --no-audit --no-fund --loglevel=error \
            "@bytecodealliance/componentize-js@${cjs_version}" >&2 \
            || die "npm install of componentize-js ${cjs_version} failed"
        [[ -f "${marker}" ]] || die "npm install finished but ${marker} is missing"
    fi
    COMPONENTIZE_JS_DIR="${root}"
}

install_componentize_py() {
    local root="${cache_root}/componentize-py-${cpy_version}"
    local bin="${root}/bin/componentize-py"
    if [[ -x "${bin}" ]] && "${bin}" --version 2>/dev/null | grep -q " ${cpy_version}$"; then
        log "componentize-py ${cpy_version} already installed at ${bin}"
    else
        command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH"
        rm -rf "${root}"
        log "installing componentize-py ${cpy_version} into ${root}"
        python3 -m venv "${root}" >&2 || die "python3 -m venv failed (install python3-venv?)"
        "${root}/bin/pip" install --quiet --disable-pip-version-check \
            "componentize-py==${cpy_version}" >&2 \
            || die "pip install of componentize-py ${cpy_version} failed"
        [[ -x "${bin}" ]] || die "pip install finished but ${bin} is missing"
    fi
    COMPONENTIZE_PY="${bin}"
}

command -v cargo >/dev/null 2>&1 || die "cargo not found on PATH; install the Rust toolchain first"
install_apt_packages
install_wit_bindgen
WASM_TOOLS="$("${here}/install-wasm-tools.sh" | tail -n1)" || die "installing wasm-tools failed"
install_componentize_js
install_componentize_py
log "toolchain ready"
echo "WASM_TOOLS=${WASM_TOOLS}"
echo "WIT_BINDGEN=${WIT_BINDGEN}"
echo "COMPONENTIZE_JS_DIR=${COMPONENTIZE_JS_DIR}"
echo "COMPONENTIZE_PY=${COMPONENTIZE_PY}"
