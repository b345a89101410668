#!/usr/bin/env bash
# make run-local: the whole product on this machine with one command. Builds what is missing
# (the control plane from the Go module proxy, the three Rust binaries), starts the local control
# plane, the cloud simulators and the node, applies the sample Pods and policies, and shows a
# live summary of Pods, bindings, spend and decisions until interrupted (Ctrl-C stops it all).
#
#   NEOCLOUD_LOCAL_DIR   where logs and state go (default ~/.cache/neocloud-local)
#   NEOCLOUD_LOCAL_ONCE  print one summary and stop (used by tests)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${NEOCLOUD_LOCAL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-local}
mkdir -p "$dir"
start=$(date +%s)
step() { printf '\n== run-local [%4ss] %s\n' "$(( $(date +%s) - start ))" "$*" >&2; }
fail() { printf 'run-local: %s\n' "$*" >&2; exit 1; }

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
# Ctrl-C (or a TERM) is how a user stops it: stop everything, say so once, and exit 0, instead of
# going on with the summary loop against a control plane that is gone.
stop() {
  trap - EXIT INT TERM
  printf '\nrun-local: stopping the node, the simulators and the control plane\n' >&2
  cleanup
  exit 0
}
trap cleanup EXIT
trap stop INT TERM

step "control plane binaries (first run: 10-15 minutes on 2 cores; cached afterwards)"
bash hack/testenv/build.sh >/dev/null
bin=$(bash hack/testenv/build.sh --print)
kubectl="$bin/kubectl"

step "building neocloud-node, neocloud-cloudsim and neocloud-testenv (first run: several minutes)"
cargo build -p neocloud-node -p neocloud-cloudsim -p neocloud-testenv --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

step "starting the control plane (logs: $dir/testenv.log)"
rm -f "$dir/kubeconfig.path"
"$target/debug/neocloud-testenv" up --ready-file "$dir/kubeconfig.path" >"$dir/testenv.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
  [ -s "$dir/kubeconfig.path" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { tail -n 40 "$dir/testenv.log" >&2; fail "the control plane did not start"; }
  sleep 1
done
[ -s "$dir/kubeconfig.path" ] || fail "the control plane was not ready after 120 s (see $dir/testenv.log)"
export KUBECONFIG
KUBECONFIG=$(cat "$dir/kubeconfig.path")

step "starting the cloud simulators on 127.0.0.1:18081-18083 (logs: $dir/cloudsim.log)"
"$target/debug/neocloud-cloudsim" --config hack/local/cloudsim.yaml >"$dir/cloudsim.log" 2>&1 &
pids+=($!)

step "starting the node (logs: $dir/node.log; metrics: http://127.0.0.1:18080/metrics)"
RUNPOD_API_KEY=local-sim-key RUNPOD_API_BASE_URL=http://127.0.0.1:18081 \
LAMBDA_API_KEY=local-sim-key LAMBDA_API_BASE_URL=http://127.0.0.1:18082/api/v1 LAMBDA_SSH_KEY_NAME=local-ssh-key \
VAST_API_KEY=local-sim-key VAST_API_BASE_URL=http://127.0.0.1:18083 \
  "$target/debug/neocloud-node" run --config hack/local/node.yaml >"$dir/node.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
  curl -fsS http://127.0.0.1:18080/readyz >/dev/null 2>&1 && break
  kill -0 "${pids[2]}" 2>/dev/null || { tail -n 40 "$dir/node.log" >&2; fail "the node exited"; }
  sleep 1
done
curl -fsS http://127.0.0.1:18080/readyz >/dev/null || fail "the node was not ready after 60 s (see $dir/node.log)"

step "applying the samples (config/samples)"
# The controller manager creates the default ServiceAccount moments after start; Pods need it.
for _ in $(seq 1 60); do
  "$kubectl" get serviceaccount default >/dev/null 2>&1 && break
  sleep 1
done
"$kubectl" apply -k config/samples
# The Wasm policy sample reads its component from a ConfigMap built from source.
[ -f policies/build/placement-c.wasm ] || make -s policies >/dev/null
"$kubectl" create namespace aibrix-system --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
"$kubectl" -n aibrix-system create configmap neocloud-placement-c \
  --from-file=placement.wasm=policies/build/placement-c.wasm --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
"$kubectl" apply -f config/samples/burstpolicy-wasm.yaml

cat >&2 <<MSG

The control plane, simulators and node are running. In another shell:
  export KUBECONFIG=$KUBECONFIG
  $kubectl get pods,cloudpodbindings -o wide
Ctrl-C stops everything.
MSG

summary() {
  printf '\n---- %s\n' "$(date +%T)"
  "$kubectl" get pods -o wide 2>&1 | cut -c1-140
  "$kubectl" get cloudpodbindings 2>&1
  curl -fsS http://127.0.0.1:18080/metrics 2>/dev/null | grep -E '^neocloud_(burn_rate|rentals_total)' || true
  "$kubectl" get events --field-selector reason=Rented -o custom-columns=POD:.involvedObject.name,DECISION:.message --no-headers 2>/dev/null |
    cut -c1-160 | tail -n 5
}
if [ -n "${NEOCLOUD_LOCAL_ONCE:-}" ]; then
  for _ in $(seq 1 90); do
    running=$("$kubectl" get pods --no-headers 2>/dev/null | grep -c ' Running ' || true)
    [ "$running" -ge 4 ] && break
    sleep 1
  done
  summary
  loaded=$("$kubectl" get burstpolicies -o jsonpath='{range .items[*]}{.metadata.name}={.status.loaded} {end}')
  printf 'policies: %s\n' "$loaded"
  case "$loaded" in *"reliable-per-dollar=true"*"memory-per-dollar=true"*|*"memory-per-dollar=true"*"reliable-per-dollar=true"*) ;;
    *) fail "the sample policies did not both load: $loaded" ;;
  esac
  [ "$running" -ge 4 ] || fail "only $running of the 4 sample Pods are Running after 90 s (see $dir/node.log)"
  exit 0
fi
while true; do
  summary
  sleep 5
done
