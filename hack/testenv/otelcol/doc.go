// Command otelcol is a minimal OpenTelemetry Collector for integration tests: the OTLP receiver
// (gRPC and HTTP), the batch processor and the file exporter, and nothing else. main.go is what
// the OpenTelemetry Collector Builder would generate for that list of components, written by hand
// so that it builds from the Go module proxy with `go build`; go.mod pins one release of the
// collector core (go.opentelemetry.io/collector) and of the contrib file exporter
// (github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter) that requires
// it.
//
// Update go.sum with `go mod tidy -e`: the file exporter's own tests import a contrib module
// (extension/encoding/otlpencodingextension) whose source the proxy does not serve, which plain
// `go mod tidy` reports as an error although the collector never builds it.
package main
