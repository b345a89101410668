// Package kueue pins Kueue (sigs.k8s.io/kueue) for the integration tests: its manager admits
// Jobs by quota and runs the ProvisioningRequest admission check against the test control
// plane. It is built by hack/testenv/build-kueue.sh; nothing imports this package.
package kueue
