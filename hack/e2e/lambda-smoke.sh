#!/usr/bin/env bash
# Real Lambda Cloud smoke test: rents one A10 instance, falling back to one A100 only when no
# A10 has capacity (other instance types are refused), waits until it is active, finds it by
# name, terminates it and checks for leftovers. Spends money: gated by LAMBDA_E2E=1.
#
#   export LAMBDA_E2E=1
#   export LAMBDA_API_KEY=...
#   export LAMBDA_E2E_SSH_KEY_NAMES=public-key-dev
#   hack/e2e/lambda-smoke.sh
#
# The first name in LAMBDA_E2E_SSH_KEY_NAMES is the one SSH key each launch carries.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_gate LAMBDA_E2E "Lambda Cloud instance"
require_var LAMBDA_API_KEY "a Lambda Cloud API key"
require_var LAMBDA_E2E_SSH_KEY_NAMES "the name of an SSH key registered in the Lambda account"

build_binary
smoke --provider lambda --gpu A10 --gpu A100 --gpu-count 1 --capacity on-demand
echo "lambda smoke passed: nothing left behind" >&2
