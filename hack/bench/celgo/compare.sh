#!/usr/bin/env bash
# Runs the CEL benchmark of neocloud-policy (criterion) and the same expressions over the same
# 1,000 offers with cel-go, one after the other, so both figures come from the same machine state.
#
#   hack/bench/celgo/compare.sh            # from the repository root
#   MEASURE=10 hack/bench/celgo/compare.sh # longer criterion measurement, seconds
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
measure="${MEASURE:-3}"

echo "== neocloud-policy (cel crate 0.15 + typed fast path) ==" >&2
(cd "${root}" && cargo bench -p neocloud-policy --bench cel -- \
    --warm-up-time 1 --measurement-time "${measure}" --noplot 'cel_')

echo "== cel-go $(cd "${root}/hack/bench/celgo" && go list -m -f '{{.Version}}' github.com/google/cel-go) ==" >&2
(cd "${root}/hack/bench/celgo" && go run .)
