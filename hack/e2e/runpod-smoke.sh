#!/usr/bin/env bash
# Real RunPod smoke test: rents one NVIDIA A40 pod (on demand), waits until it runs, finds it by
# name, deletes it and checks RunPod for leftovers by name. Spends money: gated by RUNPOD_E2E=1.
#
#   export RUNPOD_API_KEY=...
#   RUNPOD_E2E=1 hack/e2e/runpod-smoke.sh
#   RUNPOD_E2E=1 RUNPOD_E2E_CAPACITY_CHECK=1 hack/e2e/runpod-smoke.sh
#
# RUNPOD_E2E_CAPACITY_CHECK=1 also requests an A40 as COMMUNITY + spot: a refusal must be
# classified as capacity; if capacity exists, the pod is created and deleted like the first.
# Overrides: RUNPOD_E2E_GPU_TYPE (NVIDIA A40), RUNPOD_E2E_GPU_COUNT (1), RUNPOD_API_BASE_URL.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_gate RUNPOD_E2E "RunPod pod"
require_var RUNPOD_API_KEY "a RunPod API key"
GPU="${RUNPOD_E2E_GPU_TYPE:-NVIDIA A40}"
COUNT="${RUNPOD_E2E_GPU_COUNT:-1}"

build_binary
smoke --provider runpod --gpu "${GPU}" --gpu-count "${COUNT}" --capacity on-demand

if [[ "${RUNPOD_E2E_CAPACITY_CHECK:-}" == "1" ]]; then
  smoke --provider runpod --gpu "${GPU}" --gpu-count "${COUNT}" --capacity spot \
    --runpod-cloud COMMUNITY --accept-capacity-refusal
fi
echo "runpod smoke passed: nothing left behind" >&2
