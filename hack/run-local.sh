#!/usr/bin/env bash
# make run-local: the whole product on this machine with one command. Builds what is missing
# (the control plane from the Go module proxy, the four Rust binaries), starts the local control
# plane, the cloud simulators (which run the runner for each instance, as a VM or container
# would) and the node, applies the sample Pods and policies, and shows a live summary of Pods,
# bindings, spend and decisions until interrupted (Ctrl-C stops it all).
#
#   NEOCLOUD_LOCAL_DIR   where logs and state go (default ~/.cache/neocloud-local)
#   NEOCLOUD_LOCAL_ONCE  print one summary, check what the Quickstart shows (kubectl logs, exec
#                        and its exit code, port-forward, the fake sample Succeeded), and stop;
#                        exits non-zero naming what failed (CI runs this)
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

# Every binary of the workspace, not only the four used here: with the whole workspace in the build
# its crates get the features the test build gives them (neocloud-replay's paused tokio clock), so
# after `make test` nothing is rebuilt; the four alone would rebuild tokio and all above it.
step "building the workspace's binaries: neocloud-node, neocloud-cloudsim, neocloud-runner, neocloud-testenv and the rest (first run: several minutes)"
cargo build --workspace --bins
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
# They run `neocloud-runner` from PATH for each instance: the one just built.
PATH="$target/debug:$PATH" \
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
  export KUBECONFIG=$KUBECONFIG PATH=$bin:\$PATH
  kubectl get pods,cloudpodbindings -o wide
  kubectl logs -f neocloud-node-vast-sample
  kubectl exec -it neocloud-node-runpod-sample -- sh
  kubectl port-forward pod/neocloud-node-vast-sample 18088 & curl http://127.0.0.1:18088/
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
# Polls `what` (a command) up to `seconds` times, a second apart, until its output contains
# `want`; prints the last output.
until_contains() {
  local seconds=$1 want=$2 out=""
  shift 2
  for _ in $(seq 1 "$seconds"); do
    out=$("$@" 2>&1 || true)
    case "$out" in *"$want"*) break ;; esac
    sleep 1
  done
  printf '%s' "$out"
}

# What the Quickstart shows, on the samples the runner runs: fails naming the command.
check_quickstart() {
  local vast=neocloud-node-vast-sample runpod=neocloud-node-runpod-sample out code=0
  out=$(until_contains 30 "Serving HTTP on 127.0.0.1 port 18088" "$kubectl" logs "$vast")
  case "$out" in *"Serving HTTP on 127.0.0.1 port 18088"*) ;; *) fail "kubectl logs $vast: $out" ;; esac
  printf 'kubectl logs %s: %s\n' "$vast" "$(printf '%s\n' "$out" | head -n 1)"

  out=$("$kubectl" exec "$runpod" -- sh -c 'echo "hello from the runner"; exit 3' 2>&1) || code=$?
  case "$code:$out" in 3:*"hello from the runner"*) ;;
    *) fail "kubectl exec $runpod: exit code $code (want 3): $out" ;; esac
  printf 'kubectl exec %s: exit code %s\n' "$runpod" "$code"

  "$kubectl" port-forward "pod/$vast" 18089:18088 >"$dir/port-forward.log" 2>&1 &
  local forward=$!
  pids+=("$forward")
  out=$(until_contains 30 "Directory listing" curl -fsS --max-time 10 http://127.0.0.1:18089/)
  kill "$forward" 2>/dev/null || true
  case "$out" in *"Directory listing"*) ;;
    *) fail "GET http://127.0.0.1:18089/ through kubectl port-forward: $out $(cat "$dir/port-forward.log")" ;; esac
  printf 'kubectl port-forward %s: GET / answered\n' "$vast"

  out=$(until_contains 90 Succeeded "$kubectl" get pod neocloud-node-fake-smoke -o 'jsonpath={.status.phase}')
  [ "$out" = Succeeded ] || fail "the fake sample is ${out:-unknown}, not Succeeded (see $dir/node.log)"
  printf 'neocloud-node-fake-smoke: %s\n' "$out"
}

if [ -n "${NEOCLOUD_LOCAL_ONCE:-}" ]; then
  # The three cloud samples Running (the fake one may have completed already).
  clouds=(neocloud-node-runpod-sample neocloud-node-lambda-sample neocloud-node-vast-sample)
  for _ in $(seq 1 120); do
    running=$("$kubectl" get pods "${clouds[@]}" --no-headers 2>/dev/null | grep -c ' Running ' || true)
    [ "$running" -ge 3 ] && break
    sleep 1
  done
  summary
  loaded=$("$kubectl" get burstpolicies -o jsonpath='{range .items[*]}{.metadata.name}={.status.loaded} {end}')
  printf 'policies: %s\n' "$loaded"
  case "$loaded" in *"reliable-per-dollar=true"*"memory-per-dollar=true"*|*"memory-per-dollar=true"*"reliable-per-dollar=true"*) ;;
    *) fail "the sample policies did not both load: $loaded" ;;
  esac
  [ "$running" -ge 3 ] || fail "only $running of the 3 cloud sample Pods are Running after 120 s (see $dir/node.log)"
  check_quickstart
  exit 0
fi
while true; do
  summary
  sleep 5
done
