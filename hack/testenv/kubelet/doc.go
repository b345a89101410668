// Package kubelet is a wrapper module whose only purpose is to pin the kubelet of the control
// plane's Kubernetes release and the published versions of its staging modules, so that the
// test rig's worker node can run a real kubelet built from the Go module proxy.
// The binary is the `tool` directive in go.mod.
package kubelet
