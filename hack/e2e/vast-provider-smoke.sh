#!/usr/bin/env bash
# Real Vast.ai provider smoke test: exercises the adapter directly (offer search with the
# price/reliability constraints, deterministic create by label, readiness, paginated listing,
# deletion and a final lookup). Spends money: gated by VAST_E2E=1.
#
#   export VAST_API_KEY=...
#   VAST_E2E=1 hack/e2e/vast-provider-smoke.sh
#
# Defaults: one verified GTX 1070, 20 GiB disk, reliability >= 0.95, at most $0.10/hour.
# Overrides: VAST_E2E_GPU_TYPE, VAST_E2E_DISK_GB, VAST_E2E_MIN_RELIABILITY, VAST_E2E_MAX_PRICE.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_gate VAST_E2E "Vast.ai instance"
require_var VAST_API_KEY "a Vast.ai API key"

build_binary
smoke --provider vast \
  --gpu "${VAST_E2E_GPU_TYPE:-GTX 1070}" --gpu-count 1 --capacity on-demand --verified \
  --disk-gb "${VAST_E2E_DISK_GB:-20}" \
  --min-reliability "${VAST_E2E_MIN_RELIABILITY:-0.95}" \
  --max-price "${VAST_E2E_MAX_PRICE:-0.10}"
echo "vast provider smoke passed: nothing left behind" >&2
