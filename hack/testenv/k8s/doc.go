// Package k8s is a wrapper module whose only purpose is to pin one Kubernetes release and the
// published versions of its staging modules, so that kube-apiserver, kube-scheduler and
// kube-controller-manager can be built from the Go module proxy with `go build`.
// The binaries are listed as `tool` directives in go.mod.
package k8s
