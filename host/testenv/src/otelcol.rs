//! A real OpenTelemetry Collector on loopback: a minimal `otelcol` (the OTLP receiver, the batch
//! processor and the contrib file exporter), built from the Go module proxy by
//! `hack/testenv/build-otelcol.sh`, for tests that export traces and metrics over the same OTLP
//! protocols a node uses against a production collector, and then read what arrived.
//!
//! [`Collector::start`] receives OTLP/HTTP on `127.0.0.1:<free port>` and OTLP/gRPC on another
//! free port, without TLS or authentication, and writes every traces request it receives to
//! [`Collector::traces_file`] and every metrics request to [`Collector::metrics_file`], as JSON
//! lines (one OTLP JSON `Export*ServiceRequest` a line) flushed every 100 ms. The collector's own
//! telemetry is off: it binds no port besides the two receivers (not 8888). It is ready when it
//! logs that every component has started and both receiver ports accept connections; a port
//! that was taken before the collector could bind it is replaced (up to three tries). [`Collector::read_spans`] and [`Collector::read_metrics`]
//! parse the files; [`attributes`] flattens an OTLP attribute list into a map.
//!
//! [`Collector::stop`] kills it and leaves its ports unused, for "the collector is down" cases;
//! its log and the two files stay readable. Dropping it kills the process and removes its
//! temporary directory; a collector that is never dropped (a `static`) stops with the test
//! process, as every [`crate::ControlPlane`] component does. Set `NEOCLOUD_TESTENV_KEEP=1` to keep
//! the directory (configuration, log, traces and metrics).
//!
//! It is not a production collector: no TLS, no authentication, no logs pipeline, no other
//! receivers or exporters, and it never builds the binary (`make testenv` does; this module says
//! so when it is missing).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::process::Supervised;
use crate::{Error, binaries, readiness};

/// The environment variable that overrides where the collector binary is: the binary itself, or
/// a directory holding `otelcol`.
pub const BIN_ENV: &str = "NEOCLOUD_OTELCOL_BIN";

/// How often the file exporter flushes what it received to its file.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// How long the batch processor holds a batch before passing it on.
const BATCH_TIMEOUT: Duration = Duration::from_millis(50);

/// How long the collector may take to open its receiver ports after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the collector logs once every component, receivers last, has started.
const READY_LOG: &str = "Everything is ready";

/// How many times [`Collector::start`] tries fresh ports when one was taken between choosing it
/// and the collector binding it.
const START_ATTEMPTS: usize = 3;

/// The file the traces pipeline writes, in [`Collector::dir`].
const TRACES_FILE: &str = "traces.json";

/// The file the metrics pipeline writes, in [`Collector::dir`].
const METRICS_FILE: &str = "metrics.json";

/// The collector's log (its stdout and stderr), in [`Collector::dir`].
const LOG_FILE: &str = "otelcol.log";

/// A running collector. Dropping it stops the process and removes its directory.
#[derive(Debug)]
pub struct Collector {
    process: Supervised,
    dir: PathBuf,
    http_port: u16,
    grpc_port: u16,
    keep_dir: bool,
}

impl Collector {
    /// Starts a collector on two fresh loopback ports with empty output files, and waits until
    /// it is ready. On failure, stops it and returns an error that carries the end of its log.
    pub async fn start() -> Result<Self, Error> {
        let bin = locate()?;
        let keep_dir = std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("neocloud-otelcol-")
            .tempdir()
            .map_err(|e| Error::io("create the collector directory", e))?
            .keep();
        let mut attempt = 1;
        loop {
            match Self::start_in(&bin, dir.clone(), keep_dir).await {
                Ok(collector) => return Ok(collector),
                // A free port is only free until someone binds it: another test may have.
                Err(Error::Exited { tail, .. })
                    if attempt < START_ATTEMPTS && tail.contains("address already in use") =>
                {
                    attempt += 1;
                }
                Err(e) => {
                    if !keep_dir {
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                    return Err(e);
                }
            }
        }
    }

    async fn start_in(bin: &Path, dir: PathBuf, keep_dir: bool) -> Result<Self, Error> {
        let http_port = readiness::free_port()?;
        let grpc_port = loop {
            let port = readiness::free_port()?;
            if port != http_port {
                break port;
            }
        };
        let config_path = dir.join("config.yaml");
        let yaml = serde_yaml::to_string(&config(&dir, http_port, grpc_port)).map_err(|e| {
            Error::io(
                format!("render {}", config_path.display()),
                std::io::Error::other(e),
            )
        })?;
        std::fs::write(&config_path, yaml)
            .map_err(|e| Error::io(format!("write {}", config_path.display()), e))?;

        let args = vec!["--config".to_owned(), config_path.display().to_string()];
        let cleanup = (!keep_dir).then_some(dir.as_path());
        let log = dir.join(LOG_FILE);
        let mut process = Supervised::spawn("otelcol", bin, &args, &log, cleanup)?;
        readiness::wait_until_ready(&mut process, READY_TIMEOUT, || {
            // The log first: the ports alone could be someone else's, if one was taken.
            let started = std::fs::read_to_string(&log).is_ok_and(|text| text.contains(READY_LOG));
            async move {
                if !started {
                    return Err(format!("no \"{READY_LOG}\" in the log yet"));
                }
                for (protocol, port) in [("OTLP/HTTP", http_port), ("OTLP/gRPC", grpc_port)] {
                    tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .map_err(|e| format!("{protocol} port {port}: {e}"))?;
                }
                Ok(())
            }
        })
        .await?;
        Ok(Self {
            process,
            dir,
            http_port,
            grpc_port,
            keep_dir,
        })
    }

    /// `http://127.0.0.1:<port>`, the OTLP/HTTP receiver: the base URL that an exporter appends
    /// `/v1/traces` or `/v1/metrics` to (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn otlp_http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// `http://127.0.0.1:<port>`, the OTLP/gRPC receiver (plaintext).
    pub fn otlp_grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The file the traces pipeline writes: one OTLP JSON `ExportTraceServiceRequest` a line.
    /// It may not exist before the first request arrives.
    pub fn traces_file(&self) -> PathBuf {
        self.dir.join(TRACES_FILE)
    }

    /// The file the metrics pipeline writes: one OTLP JSON `ExportMetricsServiceRequest` a line.
    /// It may not exist before the first request arrives.
    pub fn metrics_file(&self) -> PathBuf {
        self.dir.join(METRICS_FILE)
    }

    /// The collector's directory: configuration, log, traces and metrics.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every span flushed to [`Self::traces_file`] so far, in the order received: each span's
    /// OTLP JSON object (`traceId`, `spanId`, `name`, `attributes`, ...) with two keys added:
    /// `"resource"`, its resource's attributes flattened by [`attributes`], and `"scope"`, its
    /// instrumentation scope (`name`, `version`). Empty if nothing arrived yet. A span reaches
    /// the file within about [`FLUSH_INTERVAL`] plus the batch timeout of being received, so
    /// poll.
    ///
    /// # Panics
    ///
    /// If a complete line of the file is not JSON (a partly flushed last line is skipped).
    pub fn read_spans(&self) -> Vec<Value> {
        flatten(&self.traces_file(), "resourceSpans", "scopeSpans", "spans")
    }

    /// Every metric flushed to [`Self::metrics_file`] so far, in the order received: each
    /// metric's OTLP JSON object (`name`, `unit`, `sum` or `gauge` or `histogram`, ...) with
    /// `"resource"` and `"scope"` added as in [`Self::read_spans`].
    ///
    /// # Panics
    ///
    /// If a complete line of the file is not JSON (a partly flushed last line is skipped).
    pub fn read_metrics(&self) -> Vec<Value> {
        flatten(
            &self.metrics_file(),
            "resourceMetrics",
            "scopeMetrics",
            "metrics",
        )
    }

    /// Kills the collector and waits until it is gone. Its ports are then refused; nothing else
    /// takes them. Its log and what it flushed to the traces and metrics files stay readable
    /// (data still in its buffers is lost: wait for it before stopping). Stopping twice does
    /// nothing.
    pub fn stop(&mut self) {
        if self.process.exited().is_some() {
            return;
        }
        // The supervisor removes the directory once the process is gone (so that a collector in a
        // `static` leaves nothing behind); put back what a test may still read.
        let saved: Vec<(PathBuf, Vec<u8>)> = if self.keep_dir {
            Vec::new()
        } else {
            [
                self.process.log_path().to_owned(),
                self.traces_file(),
                self.metrics_file(),
            ]
            .into_iter()
            .filter_map(|path| std::fs::read(&path).ok().map(|bytes| (path, bytes)))
            .collect()
        };
        self.process.stop();
        if !self.keep_dir && std::fs::create_dir_all(&self.dir).is_ok() {
            for (path, bytes) in saved {
                let _ = std::fs::write(path, bytes);
            }
        }
    }

    /// The last `lines` lines of the collector's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.process.stop();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The collector's configuration: OTLP in on two loopback ports, a traces and a metrics pipeline
/// through the batch processor to their JSON-lines files, its own telemetry off.
fn config(dir: &Path, http_port: u16, grpc_port: u16) -> Value {
    let file = |name: &str| {
        serde_json::json!({
            "path": dir.join(name),
            "format": "json",
            "flush_interval": format!("{}ms", FLUSH_INTERVAL.as_millis()),
        })
    };
    serde_json::json!({
        "receivers": {
            "otlp": {
                "protocols": {
                    "http": {"endpoint": format!("127.0.0.1:{http_port}")},
                    "grpc": {"endpoint": format!("127.0.0.1:{grpc_port}")},
                },
            },
        },
        "processors": {
            "batch": {"timeout": format!("{}ms", BATCH_TIMEOUT.as_millis())},
        },
        "exporters": {
            "file/traces": file(TRACES_FILE),
            "file/metrics": file(METRICS_FILE),
        },
        "service": {
            // `level: none` turns off the internal metrics and their Prometheus port (8888).
            "telemetry": {
                "metrics": {"level": "none"},
                "logs": {"level": "info"},
            },
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["file/traces"],
                },
                "metrics": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["file/metrics"],
                },
            },
        },
    })
}

/// The items of a JSON-lines file of OTLP export requests (`resourceSpans[].scopeSpans[].spans[]`
/// for traces), each with `"resource"` (flattened attributes) and `"scope"` added.
fn flatten(path: &Path, resources: &str, scopes: &str, items: &str) -> Vec<Value> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    // Only lines the exporter finished: its buffered writer may flush half a line.
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    let mut out = Vec::new();
    for line in complete.lines().filter(|l| !l.trim().is_empty()) {
        let request: Value = serde_json::from_str(line).unwrap_or_else(|e| {
            panic!(
                "{} holds a line that is not JSON ({e}): {line}",
                path.display()
            )
        });
        for resource in array(&request, resources) {
            let resource_attributes =
                Value::Object(resource.get("resource").map(attributes).unwrap_or_default());
            for scope in array(resource, scopes) {
                let scope_object = scope.get("scope").cloned().unwrap_or(Value::Null);
                for item in array(scope, items) {
                    let mut item = item.clone();
                    if let Value::Object(fields) = &mut item {
                        fields.insert("resource".to_owned(), resource_attributes.clone());
                        fields.insert("scope".to_owned(), scope_object.clone());
                    }
                    out.push(item);
                }
            }
        }
    }
    out
}

/// `value[key]` as a slice, empty when it is missing or not an array.
fn array<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The `attributes` list of an OTLP JSON object (a span, a resource, an event, a data point) as a
/// map from each key to its plain JSON value: `stringValue` and `bytesValue` (base64) become
/// strings, `intValue` (a string in OTLP JSON) and `doubleValue` numbers, `boolValue` booleans,
/// `arrayValue` arrays and `kvlistValue` objects, recursively; an empty value is `null`. Empty if
/// there are no attributes.
pub fn attributes(item: &Value) -> Map<String, Value> {
    key_values(array(item, "attributes"))
}

fn key_values(list: &[Value]) -> Map<String, Value> {
    list.iter()
        .filter_map(|kv| {
            let key = kv.get("key")?.as_str()?;
            Some((
                key.to_owned(),
                kv.get("value").map(any_value).unwrap_or(Value::Null),
            ))
        })
        .collect()
}

/// An OTLP JSON `AnyValue` as a plain JSON value.
fn any_value(value: &Value) -> Value {
    let Some((kind, inner)) = value.as_object().and_then(|o| o.iter().next()) else {
        return Value::Null;
    };
    match kind.as_str() {
        "intValue" => match inner {
            Value::String(s) => s
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| inner.clone()),
            other => other.clone(),
        },
        "doubleValue" => match inner {
            // OTLP JSON writes the non-finite doubles as strings ("NaN", "Infinity").
            Value::String(s) => s
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map_or_else(|| inner.clone(), Value::Number),
            other => other.clone(),
        },
        "arrayValue" => Value::Array(array(inner, "values").iter().map(any_value).collect()),
        "kvlistValue" => Value::Object(key_values(array(inner, "values"))),
        _ => inner.clone(),
    }
}

/// The collector binary: `$NEOCLOUD_OTELCOL_BIN` (the binary or its directory) if set, else
/// `otelcol` in the cache directory that `hack/testenv/build-otelcol.sh --print` names for the
/// pinned version. It must exist.
pub fn locate() -> Result<PathBuf, Error> {
    binaries::tool(
        BIN_ENV,
        "otelcol",
        "build-otelcol.sh",
        "OpenTelemetry Collector",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_build_script_names_a_cache_directory_outside_the_repository() {
        let name = binaries::cache_dir_name(&binaries::printed_dir("build-otelcol.sh").unwrap());
        assert!(name.starts_with("otelcol-v0.165.0-"), "{name}");
    }

    #[test]
    fn a_missing_collector_is_named_with_the_command_that_builds_it() {
        let err = Error::MissingTool {
            tool: "OpenTelemetry Collector".into(),
            path: "/x/otelcol".into(),
            script: "build-otelcol.sh".into(),
            env: BIN_ENV.into(),
        };
        let text = err.to_string();
        assert!(text.contains("/x/otelcol"), "{text}");
        assert!(text.contains("make testenv"), "{text}");
        assert!(text.contains(BIN_ENV), "{text}");
    }

    #[test]
    fn attributes_become_plain_json_values() {
        let span = json!({"attributes": [
            {"key": "s", "value": {"stringValue": "x"}},
            {"key": "i", "value": {"intValue": "42"}},
            {"key": "d", "value": {"doubleValue": 0.5}},
            {"key": "b", "value": {"boolValue": true}},
            {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "y"}]}}},
            {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": false}}]}}},
            {"key": "bytes", "value": {"bytesValue": "AQI="}},
            {"key": "empty", "value": {}},
        ]});
        assert_eq!(
            Value::Object(attributes(&span)),
            json!({
                "s": "x", "i": 42, "d": 0.5, "b": true, "a": [1, "y"], "kv": {"k": false},
                "bytes": "AQI=", "empty": null,
            })
        );
        assert!(attributes(&json!({"name": "no attributes"})).is_empty());
    }

    #[test]
    fn spans_carry_their_resource_and_scope_and_half_lines_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRACES_FILE);
        let request = |name: &str, cluster: &str| {
            json!({"resourceSpans": [{
                "resource": {"attributes": [
                    {"key": "k8s.cluster.name", "value": {"stringValue": cluster}},
                ]},
                "scopeSpans": [{"scope": {"name": "lib"}, "spans": [{"name": name}]}],
            }]})
            .to_string()
        };
        let first = request("a", "one");
        let second = request("b", "two");
        std::fs::write(&path, format!("{first}\n{}", &second[..10])).unwrap();
        let spans = flatten(&path, "resourceSpans", "scopeSpans", "spans");
        assert_eq!(
            spans,
            vec![json!({
                "name": "a",
                "resource": {"k8s.cluster.name": "one"},
                "scope": {"name": "lib"},
            })]
        );

        std::fs::write(&path, format!("{first}\n{second}\n")).unwrap();
        let spans = flatten(&path, "resourceSpans", "scopeSpans", "spans");
        let names: Vec<_> = spans.iter().map(|s| s["name"].clone()).collect();
        assert_eq!(names, vec![json!("a"), json!("b")]);
        assert_eq!(spans[1]["resource"]["k8s.cluster.name"], "two");

        let missing = dir.path().join("nothing.json");
        assert!(flatten(&missing, "resourceSpans", "scopeSpans", "spans").is_empty());
    }

    #[test]
    fn the_configuration_binds_only_loopback_and_writes_json_lines() {
        let config = config(Path::new("/d"), 1001, 1002);
        let protocols = &config["receivers"]["otlp"]["protocols"];
        assert_eq!(protocols["http"]["endpoint"], "127.0.0.1:1001");
        assert_eq!(protocols["grpc"]["endpoint"], "127.0.0.1:1002");
        let traces = &config["exporters"]["file/traces"];
        assert_eq!(traces["path"], "/d/traces.json");
        assert_eq!(traces["format"], "json");
        assert_eq!(traces["flush_interval"], "100ms");
        assert_eq!(
            config["exporters"]["file/metrics"]["path"],
            "/d/metrics.json"
        );
        assert_eq!(config["service"]["telemetry"]["metrics"]["level"], "none");
    }
}
