#!/usr/bin/env bash
# Shared helpers of the real-cloud smoke scripts. These scripts rent paid GPU instances: each
# refuses to run unless its gate variable is set, and CI never runs them (CI runs the same smoke
# command against the simulators instead).
set -euo pipefail

E2E_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
E2E_BIN="${NEOCLOUD_E2E_BIN:-/tmp/neocloud-node-e2e}"

# require_gate VAR WHAT: exit 2 with a reason unless VAR=1.
require_gate() {
  local var="$1" what="$2"
  if [[ "${!var:-}" != "1" ]]; then
    echo "refusing to run: this creates a paid ${what}; set ${var}=1 to spend money" >&2
    exit 2
  fi
}

# require_var VAR HINT: exit 2 unless VAR is set and non-empty (its value is never printed).
require_var() {
  local var="$1" hint="$2"
  if [[ -z "${!var:-}" ]]; then
    echo "refusing to run: ${var} is not set (${hint})" >&2
    exit 2
  fi
}

# build_binary: builds neocloud-node and copies it to $E2E_BIN.
build_binary() {
  echo "building neocloud-node into ${E2E_BIN}" >&2
  (cd "${E2E_ROOT}" && cargo build --release -p neocloud-node)
  install -m 0755 "${E2E_ROOT}/target/release/neocloud-node" "${E2E_BIN}"
}

# smoke ARGS...: runs the provider smoke command; non-zero on failure or any leftover.
smoke() {
  echo "+ neocloud-node provider smoke $*" >&2
  "${E2E_BIN}" provider smoke "$@"
}
