#!/usr/bin/env bash
# Builds the real OCI registry used by integration tests: the CNCF distribution registry
# (github.com/distribution/distribution/v3, command `registry`), from the Go module proxy, into a
# cache outside the repository keyed by version and by the wrapper module's go.sum.
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Skips the build when the binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build-registry.sh            build if missing, print the bin directory
#   hack/testenv/build-registry.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
module="$here/registry"
# The pinned version of a module: its require line, in a block or alone.
pinned() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2} $1=="require" && $2==m {print $3}' "$2" | head -n1; }
REGISTRY_VERSION=$(pinned github.com/distribution/distribution/v3 "$module/go.mod")
if [ -z "$REGISTRY_VERSION" ]; then
  echo "testenv: cannot read the pinned version from $module/go.mod" >&2
  exit 1
fi
sum=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)
cache_root=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
bin="$cache_root/registry-$REGISTRY_VERSION-$sum/bin"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

log() { printf 'testenv: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if [ -x "$bin/registry" ]; then
  log "registry $REGISTRY_VERSION is cached in $bin"
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || fail "go is not on PATH; install Go 1.26 or newer"
log "building registry (distribution $REGISTRY_VERSION) into $bin"
log "a cold build takes 1-2 minutes on 2 cores; later runs reuse the cache"
tmp="$bin.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=readonly

start=$(date +%s)
log "[1/1] registry $REGISTRY_VERSION"
(cd "$module" && go build -trimpath -ldflags '-s -w' -o "$tmp/registry" \
  github.com/distribution/distribution/v3/cmd/registry) \
  || fail "go build of distribution $REGISTRY_VERSION in $module"

[ -x "$tmp/registry" ] || fail "registry was not produced by the build"
"$tmp/registry" --version >&2 || fail "registry does not run"
mkdir -p "$bin"
mv "$tmp"/* "$bin/"
log "registry ready in $bin after $(( $(date +%s) - start ))s"
echo "$bin"
