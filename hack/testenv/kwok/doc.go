// Package kwok pins KWOK (sigs.k8s.io/kwok) for the integration tests: its `kwok` controller
// simulates the remote clusters' GPU nodes and their Pods. It is built by
// hack/testenv/build-kwok.sh; nothing imports this package.
package kwok
