#!/usr/bin/env bash
# Builds every guest policy from source into policies/build/ (gitignored):
#
#   placement-c.wasm           C placement policy (clang + wasi-libc, wit-bindgen c, wasm-tools)
#   pricing-c.wasm             C pricing policy (imports the log capability)
#   fallback-js.wasm           JavaScript fallback policy (componentize-js, no WASI imports)
#   placement-js.wasm          JavaScript placement policy (same rules as placement-c, for benchmarks)
#   fallback-js-wasi.wasm      JavaScript fallback that imports WASI 0.2 (stdio, clocks, random)
#   fallback-py.wasm           Python fallback policy (componentize-py; same rules as fallback-js)
#   hostile-loop.wasm          hostile guests, all in the placement world: an infinite loop,
#   hostile-memory-bomb.wasm   a memory bomb, unbounded recursion, an immediate trap,
#   hostile-recursion.wasm     and a giant answer
#   hostile-trap.wasm
#   hostile-giant-output.wasm
#   hostile-wrong-world.wasm   a component for another world (hostile:wrong/greeter-world)
#
#   policies/build.sh                 # everything (installs the toolchain on first use)
#   policies/build.sh placement-c     # only the named outputs
#
# The toolchain comes from hack/tools/install-guest-toolchain.sh (idempotent, cached outside the
# repository). Set POLICIES_OUT to write elsewhere.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${repo}/policies"
wit="${repo}/wit/neocloud-policy-0.1.0"
out="${POLICIES_OUT:-${src}/build}"

log() { echo "policies: $*" >&2; }
die() { log "error: $*"; exit 1; }

eval "$("${repo}/hack/tools/install-guest-toolchain.sh" | grep -E '^[A-Z_]+=')"
[[ -n "${WASM_TOOLS:-}" && -n "${WIT_BINDGEN:-}" && -n "${COMPONENTIZE_JS_DIR:-}" \
    && -n "${COMPONENTIZE_PY:-}" ]] \
    || die "the toolchain script did not report its tools"

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
mkdir -p "${out}"

# build_c NAME WIT_DIR WORLD SOURCE: a C guest as a reactor module, then a component.
build_c() {
    local name="$1" wit_dir="$2" world="$3" source="$4"
    local gen="${work}/${name}"
    log "building ${name} (C, world ${world})"
    "${WIT_BINDGEN}" c --world "${world}" --out-dir "${gen}" "${wit_dir}" >/dev/null \
        || die "wit-bindgen c failed for ${name}"
    clang --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Werror -Wno-unused-function \
        -I"${gen}" "${source}" "${gen}"/*.c "${gen}"/*_component_type.o -o "${gen}/core.wasm" \
        || die "clang failed for ${name}"
    "${WASM_TOOLS}" component new "${gen}/core.wasm" -o "${out}/${name}.wasm" \
        || die "wasm-tools component new failed for ${name}"
    "${WASM_TOOLS}" validate "${out}/${name}.wasm" || die "${name}.wasm does not validate"
}

# build_js NAME WORLD SOURCE: a JavaScript guest through componentize-js's Node API.
build_js() {
    local name="$1" world="$2" source="$3"
    log "building ${name} (JavaScript, world ${world}; about 15 s)"
    node "${src}/componentize.mjs" "${COMPONENTIZE_JS_DIR}" "${source}" "${wit}" \
        "${world}" "${out}/${name}.wasm" || die "componentize-js failed for ${name}"
    "${WASM_TOOLS}" validate "${out}/${name}.wasm" || die "${name}.wasm does not validate"
}

# build_py NAME WORLD DIR: a Python guest (DIR/app.py) through componentize-py.
build_py() {
    local name="$1" world="$2" dir="$3"
    log "building ${name} (Python, world ${world}; about 10 s)"
    (cd "${dir}" && "${COMPONENTIZE_PY}" -d "${wit}" -w "${world}" componentize app \
        -o "${out}/${name}.wasm" >/dev/null) || die "componentize-py failed for ${name}"
    "${WASM_TOOLS}" validate "${out}/${name}.wasm" || die "${name}.wasm does not validate"
}

build_one() {
    case "$1" in
        placement-c) build_c "$1" "${wit}" placement-policy "${src}/placement-c/placement.c" ;;
        pricing-c) build_c "$1" "${wit}" pricing-policy "${src}/pricing-c/pricing.c" ;;
        fallback-js) build_js "$1" fallback-policy "${src}/fallback-js/fallback.js" ;;
        placement-js) build_js "$1" placement-policy "${src}/placement-js/placement.js" ;;
        fallback-py) build_py "$1" fallback-policy "${src}/fallback-py" ;;
        fallback-js-wasi)
            KEEP_FEATURES=stdio,random,clocks \
                build_js "$1" fallback-policy "${src}/wasi-js/fallback.js" ;;
        hostile-loop) build_c "$1" "${wit}" placement-policy "${src}/hostile/loop.c" ;;
        hostile-memory-bomb) build_c "$1" "${wit}" placement-policy "${src}/hostile/memory_bomb.c" ;;
        hostile-recursion) build_c "$1" "${wit}" placement-policy "${src}/hostile/recursion.c" ;;
        hostile-trap) build_c "$1" "${wit}" placement-policy "${src}/hostile/trap.c" ;;
        hostile-giant-output) build_c "$1" "${wit}" placement-policy "${src}/hostile/giant_output.c" ;;
        hostile-wrong-world)
            build_c "$1" "${src}/hostile/wrong-world/wit" greeter-world \
                "${src}/hostile/wrong-world/greeter.c" ;;
        *) die "unknown guest '$1'" ;;
    esac
}

all=(placement-c pricing-c fallback-js placement-js fallback-js-wasi fallback-py hostile-loop hostile-memory-bomb hostile-recursion
     hostile-trap hostile-giant-output hostile-wrong-world)
for name in "${@:-${all[@]}}"; do
    build_one "${name}"
done
log "built into ${out}:"
(cd "${out}" && ls -l -- *.wasm >&2)
