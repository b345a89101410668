#!/usr/bin/env bash
# Builds the real OCI registry used by integration tests: the CNCF distribution registry
# (github.com/distribution/distribution/v3, command `registry`), from the Go module proxy, into a
# cache outside the repository keyed by version and by the wrapper module's go.sum (see
# go-tool.sh).
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Skips the build when the binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build-registry.sh            build if missing, print the bin directory
#   hack/testenv/build-registry.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=go-tool.sh
. "$here/go-tool.sh"
name=registry
module="$here/registry"
pin=github.com/distribution/distribution/v3
hashed=("$module/go.mod" "$module/go.sum")
package=github.com/distribution/distribution/v3/cmd/registry
what=distribution
check() { "$1" --version >&2 || fail "registry does not run"; }
go_tool "$@"
