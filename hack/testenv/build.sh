#!/usr/bin/env bash
# Builds the real control plane used by integration tests: etcd and kube-apiserver,
# kube-scheduler, kube-controller-manager and kubectl, from the Go module proxy, into a cache outside the
# repository keyed by version and by the wrapper modules' go.sum.
#
# Prints the directory holding the binaries on its last line of stdout. Progress goes to stderr.
# Skips the build when every binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build.sh            build if missing, print the bin directory
#   hack/testenv/build.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The pinned version of a module: its require line, in a block or alone.
pinned() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2} $1=="require" && $2==m {print $3}' "$2" | head -n1; }
K8S_VERSION=$(pinned k8s.io/kubernetes "$here/k8s/go.mod")
ETCD_VERSION=$(pinned go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")
if [ -z "$K8S_VERSION" ] || [ -z "$ETCD_VERSION" ]; then
  echo "testenv: cannot read the pinned versions from $here/{k8s,etcd}/go.mod" >&2
  exit 1
fi
sum=$(cat "$here/k8s/go.mod" "$here/k8s/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" \
  "$here/etcd/main.go" | sha256sum | cut -c1-12)
cache_root=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
bin="$cache_root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-$sum/bin"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

log() { printf 'testenv: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

want=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl)
missing=()
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  log "control plane $K8S_VERSION with etcd $ETCD_VERSION is cached in $bin"
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || fail "go is not on PATH; install Go 1.25 or newer"
log "building ${missing[*]} (kubernetes $K8S_VERSION, etcd $ETCD_VERSION) into $bin"
log "a cold build takes 15-30 minutes on 2 cores; later runs reuse the cache"
tmp="$bin.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
# Every Go build here passes -gcflags=all=-dwarf=false: the linker strips DWARF anyway (-s -w),
# and not generating it saved 12 % of a cold compile (etcd: 110 to 96 s of CPU). The kubelet
# and the control plane must pass the same flags to share compiled packages.
export CGO_ENABLED=0 GOFLAGS=-mod=readonly

start=$(date +%s)
log "[1/2] etcd $ETCD_VERSION"
(cd "$here/etcd" && go build -trimpath -gcflags=all=-dwarf=false -ldflags '-s -w' -o "$tmp/etcd" .) \
  || fail "go build of etcd $ETCD_VERSION in $here/etcd"
log "      etcd built in $(( $(date +%s) - start ))s"

minor=$(echo "$K8S_VERSION" | cut -d. -f2)
ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
ld="$ld -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
ld="$ld -X k8s.io/component-base/version.gitTreeState=clean"
k8s_start=$(date +%s)
log "[2/2] kube-apiserver, kube-scheduler, kube-controller-manager, kubectl $K8S_VERSION"
(cd "$here/k8s" && go build -trimpath -gcflags=all=-dwarf=false -ldflags "$ld" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl) \
  || fail "go build of kubernetes $K8S_VERSION in $here/k8s"
log "      kubernetes binaries built in $(( $(date +%s) - k8s_start ))s"

for b in "${want[@]}"; do
  [ -x "$tmp/$b" ] || fail "$b was not produced by the build"
done
"$tmp/kube-apiserver" --version >&2 || fail "kube-apiserver does not run"
"$tmp/etcd" --version >&2 || fail "etcd does not run"
mkdir -p "$bin"
mv "$tmp"/* "$bin/"
log "control plane ready in $bin after $(( $(date +%s) - start ))s"
echo "$bin"
