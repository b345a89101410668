#!/usr/bin/env bash
# Builds the real OpenTelemetry Collector used by integration tests: a minimal `otelcol` (OTLP
# receiver, batch processor, file exporter; hack/testenv/otelcol/main.go), from the Go module
# proxy, into a cache outside the repository keyed by version and by the module's go.sum.
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Skips the build when the binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build-otelcol.sh            build if missing, print the bin directory
#   hack/testenv/build-otelcol.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
module="$here/otelcol"
# The pinned version of a module: its require line, in a block or alone.
pinned() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2} $1=="require" && $2==m {print $3}' "$2" | head -n1; }
OTELCOL_VERSION=$(pinned go.opentelemetry.io/collector/otelcol "$module/go.mod")
if [ -z "$OTELCOL_VERSION" ]; then
  echo "testenv: cannot read the pinned version from $module/go.mod" >&2
  exit 1
fi
sum=$(cat "$module/go.mod" "$module/go.sum" "$module"/*.go | sha256sum | cut -c1-12)
cache_root=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
bin="$cache_root/otelcol-$OTELCOL_VERSION-$sum/bin"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

log() { printf 'testenv: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if [ -x "$bin/otelcol" ]; then
  log "otelcol $OTELCOL_VERSION is cached in $bin"
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || fail "go is not on PATH; install Go 1.26 or newer"
log "building otelcol (collector $OTELCOL_VERSION) into $bin"
log "a cold build takes 1-2 minutes on 2 cores; later runs reuse the cache"
tmp="$bin.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=readonly

start=$(date +%s)
log "[1/1] otelcol $OTELCOL_VERSION"
(cd "$module" && go build -trimpath -ldflags '-s -w' -o "$tmp/otelcol" .) \
  || fail "go build of the collector $OTELCOL_VERSION in $module"

[ -x "$tmp/otelcol" ] || fail "otelcol was not produced by the build"
"$tmp/otelcol" --version >&2 || fail "otelcol does not run"
"$tmp/otelcol" components >/dev/null || fail "otelcol does not list its components"
mkdir -p "$bin"
mv "$tmp"/* "$bin/"
log "otelcol ready in $bin after $(( $(date +%s) - start ))s"
echo "$bin"
