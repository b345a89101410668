#!/usr/bin/env bash
# Builds KWOK's controller (sigs.k8s.io/kwok, command `kwok`) from the Go module proxy, into a
# cache outside the repository keyed by version and by the wrapper module's go.sum (see
# go-tool.sh). The integration tests of the `kube` provider run it against a second control
# plane, where it plays the kubelets of the remote cluster's GPU nodes: it marks them Ready,
# moves their Pods through the stages in host/testenv/src/kwok-stages.yaml and serves their logs.
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Skips the build when the binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build-kwok.sh            build if missing, print the bin directory
#   hack/testenv/build-kwok.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=go-tool.sh
. "$here/go-tool.sh"
name=kwok
module="$here/kwok"
pin=sigs.k8s.io/kwok
hashed=("$module/go.mod" "$module/go.sum")
package=sigs.k8s.io/kwok/cmd/kwok
what=kwok
check() { "$1" --version >&2 || fail "kwok does not run"; }
go_tool "$@"
