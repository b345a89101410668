#!/usr/bin/env bash
# Builds vkbench, the virtual-kubelet baseline of the load benchmark (host/node/benches/load.rs),
# into a cache outside the repository keyed by the virtual-kubelet version and by go.sum.
#
# Prints the binary's path on its last line of stdout. Progress goes to stderr. Skips the build
# when the binary is already present. Fails loudly (non-zero, with the step that failed).
#
#   hack/vkbench/build.sh            build if missing, print the binary's path
#   hack/vkbench/build.sh --print    print the binary's path without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VK_VERSION=$(awk '$1=="github.com/virtual-kubelet/virtual-kubelet" && $2 ~ /^v/ {print $2}' \
  "$here/go.mod" | head -n1)
if [ -z "$VK_VERSION" ]; then
  echo "vkbench: cannot read the virtual-kubelet version from $here/go.mod" >&2
  exit 1
fi
sum=$(sha256sum "$here/go.sum" | cut -c1-12)
cache_root=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
dir="$cache_root/vkbench-$VK_VERSION-$sum"
bin="$dir/vkbench"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

log() { printf 'vkbench: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

# The sources are not in the key, so a binary older than any of them is rebuilt.
if [ -x "$bin" ] && [ -z "$(find "$here" -name '*.go' -newer "$bin")" ]; then
  log "virtual-kubelet $VK_VERSION baseline is cached in $bin"
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || fail "go is not on PATH; install Go 1.26 or newer"
log "building vkbench (virtual-kubelet $VK_VERSION) into $bin"
log "a cold build takes 2-4 minutes on 2 cores; later runs reuse the cache"
mkdir -p "$dir"
tmp="$bin.tmp.$$"
trap 'rm -f "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
start=$(date +%s)
(cd "$here" && go build -trimpath -gcflags=all=-dwarf=false -ldflags '-s -w' -o "$tmp" .) \
  || fail "go build of vkbench in $here"
[ -x "$tmp" ] || fail "vkbench was not produced by the build"
"$tmp" -h >/dev/null 2>&1 || [ $? -eq 2 ] || fail "vkbench does not run"
mv "$tmp" "$bin"
log "vkbench ready in $bin after $(( $(date +%s) - start ))s"
echo "$bin"
