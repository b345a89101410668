// Package registry is a wrapper module whose only purpose is to pin one release of the CNCF
// distribution registry (github.com/distribution/distribution/v3), so that its `registry` command
// can be built from the Go module proxy with `go build`. The command is listed as a `tool`
// directive in go.mod.
package registry
