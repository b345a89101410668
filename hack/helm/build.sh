#!/usr/bin/env bash
# Builds helm from the Go module proxy into a cache outside the repository, keyed by version, for
# the chart test (host/node/tests/helm.rs) and for rendering deploy/helm/neocloud-node by hand.
#
# Prints the path of the helm binary on its last line of stdout. Progress goes to stderr. Skips
# the build when the binary is already present. Fails loudly (non-zero, with the step that
# failed) on any error.
#
#   hack/helm/build.sh            build if missing, print the binary's path
#   hack/helm/build.sh --print    print the binary's path without building
set -euo pipefail

HELM_VERSION=v3.21.4
cache_root=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
dir="$cache_root/helm-$HELM_VERSION"
helm="$dir/helm"

if [ "${1:-}" = "--print" ]; then
  echo "$helm"
  exit 0
fi

log() { printf 'helm: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if [ -x "$helm" ]; then
  log "helm $HELM_VERSION is cached in $dir"
  echo "$helm"
  exit 0
fi

command -v go >/dev/null || fail "go is not on PATH; install Go 1.25 or newer"
log "building helm $HELM_VERSION into $dir (a cold build takes a few minutes on 2 cores)"
tmp="$dir.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
# As helm's own Makefile does: stamp the version, and the Kubernetes version of the client-go it
# builds against (v0.36 for helm v3.21) as the default for `helm template` and `helm lint`;
# unstamped, helm assumes Kubernetes 1.20.
K8S_MAJOR=1 K8S_MINOR=36
ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in pkg/lint/rules pkg/chartutil; do
  ld="$ld -X helm.sh/helm/v3/$pkg.k8sVersionMajor=$K8S_MAJOR"
  ld="$ld -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$K8S_MINOR"
done
GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -gcflags=all=-dwarf=false -ldflags "$ld" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
  || fail "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
[ -x "$tmp/helm" ] || fail "helm was not produced by the build"
"$tmp/helm" version --short >&2 || fail "helm does not run"
mkdir -p "$dir"
mv "$tmp/helm" "$helm"
log "helm ready in $dir after $(( $(date +%s) - start ))s"
echo "$helm"
