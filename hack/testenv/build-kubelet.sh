#!/usr/bin/env bash
# Builds the kubelet (k8s.io/kubernetes/cmd/kubelet) and kube-proxy at the control plane's Kubernetes version
# from the Go module proxy, into a cache outside the repository keyed by version and by the
# wrapper module's go.sum (see go-tool.sh). The test rig's optional worker node runs it beside
# Debian's containerd and runc, in a network namespace of its own (neocloud_testenv::WorkerNode).
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Skips the build when the binary is already present. Fails loudly (non-zero, with the step
# that failed) on any error.
#
#   hack/testenv/build-kubelet.sh            build if missing, print the bin directory
#   hack/testenv/build-kubelet.sh --print    print the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=go-tool.sh
. "$here/go-tool.sh"
name=kubelet
module="$here/kubelet"
pin=k8s.io/kubernetes
hashed=("$module/go.mod" "$module/go.sum")
package=k8s.io/kubernetes/cmd/kubelet
# kube-proxy routes Service addresses in the worker's namespace (the Pods' in-cluster API server
# address among them), as on any real node.
extra=(k8s.io/kubernetes/cmd/kube-proxy)
what=kubernetes
version=$(pinned "$pin" "$module/go.mod")
control_plane=$(pinned "$pin" "$here/k8s/go.mod")
[ "$version" = "$control_plane" ] \
  || fail "the kubelet pins kubernetes $version, the control plane $control_plane: pin the same release"
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
ldflags="$ldflags -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
ldflags="$ldflags -X k8s.io/component-base/version.gitTreeState=clean"
check() {
  "$1" --version >&2 || fail "the kubelet does not run"
  "$(dirname "$1")/kube-proxy" --version >&2 || fail "kube-proxy does not run"
}
go_tool "$@"
