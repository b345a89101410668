#!/usr/bin/env bash
# Builds the real OpenTelemetry Collector used by integration tests: a minimal `otelcol` (OTLP
# receiver, batch processor, file exporter; hack/testenv/otelcol/main.go), from the Go module
# proxy, into a cache outside the repository keyed by version and by the module's go.sum and
# sources (see go-tool.sh).
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Skips the build when the binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build-otelcol.sh            build if missing, print the bin directory
#   hack/testenv/build-otelcol.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=go-tool.sh
. "$here/go-tool.sh"
name=otelcol
module="$here/otelcol"
pin=go.opentelemetry.io/collector/otelcol
hashed=("$module/go.mod" "$module/go.sum" "$module"/*.go)
package=.
what="the collector"
check() {
  "$1" --version >&2 || fail "otelcol does not run"
  "$1" components >/dev/null || fail "otelcol does not list its components"
}
go_tool "$@"
