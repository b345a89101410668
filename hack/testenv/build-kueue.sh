#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue, command `kueue`) from the Go module proxy, into a
# cache outside the repository keyed by version and by the wrapper module's go.sum (see
# go-tool.sh). Beside the binary it copies what installing Kueue needs, all from the same module
# versions: Kueue's CRDs (crds/kueue.x-k8s.io_*.yaml), the ProvisioningRequest CRD of
# k8s.io/autoscaler/cluster-autoscaler/apis (crds/autoscaling.x-k8s.io_provisioningrequests.yaml)
# and Kueue's webhook configurations (webhook/manifests.yaml). neocloud_testenv::Kueue installs
# them on a test control plane and runs the manager against it.
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Skips the build when the binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build-kueue.sh            build if missing, print the bin directory
#   hack/testenv/build-kueue.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=go-tool.sh
. "$here/go-tool.sh"
name=kueue
module="$here/kueue"
pin=sigs.k8s.io/kueue
# The script too: its files() decides what lies beside the binary.
hashed=("$module/go.mod" "$module/go.sum" "$here/build-kueue.sh")
package=sigs.k8s.io/kueue/cmd/kueue
what=kueue
cold="about 7 minutes (6.5 measured beside other builds)"
version=$(pinned "$pin" "$module/go.mod")
ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
# The source directory of a module of the wrapper's build list (downloaded first if need be).
module_dir() {
  (cd "$module" && go mod download "$1" && go list -m -f '{{.Dir}}' "$1")
}
files() {
  local kueue autoscaler
  kueue=$(module_dir sigs.k8s.io/kueue) || return 1
  autoscaler=$(module_dir k8s.io/autoscaler/cluster-autoscaler/apis) || return 1
  mkdir -p "$1/crds" "$1/webhook"
  cp "$kueue"/config/components/crd/bases/*.yaml "$1/crds/"
  cp "$autoscaler/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml" "$1/crds/"
  cp "$kueue/config/components/webhook/manifests.yaml" "$1/webhook/"
  chmod -R u+w "$1/crds" "$1/webhook"
}
check() {
  "$1" --help >/dev/null 2>&1 || fail "kueue does not run"
  [ -s "$(dirname "$1")/crds/autoscaling.x-k8s.io_provisioningrequests.yaml" ] \
    || fail "the ProvisioningRequest CRD was not copied"
}
go_tool "$@"
