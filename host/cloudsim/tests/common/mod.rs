//! Helpers shared by the HTTP tests: a client, JSON responses, and waiting for a status.

#![allow(dead_code)]

use std::time::Duration;

use reqwest::{RequestBuilder, StatusCode};
use serde_json::Value;

/// A client with a short timeout so that a hung simulator fails the test.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Sends a request and returns its status and JSON body (`Null` if empty or not JSON).
pub async fn call(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("request reaches the simulator");
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Polls `read` until `done` holds on its result or 5 seconds pass; returns every value seen.
pub async fn poll_until<F, Fut>(mut read: F, done: impl Fn(&Value) -> bool) -> Vec<Value>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let mut seen = Vec::new();
    for _ in 0..100 {
        let value = read().await;
        let finished = done(&value);
        seen.push(value);
        if finished {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "condition not reached; last values: {:?}",
        seen.iter().rev().take(3).collect::<Vec<_>>()
    );
}

/// The distinct values in order of first appearance.
pub fn distinct(values: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for value in values {
        if out.last() != Some(&value) {
            out.push(value);
        }
    }
    out
}

/// A config whose state changes are slow enough (300 ms each) to observe every status by
/// polling, even on a loaded machine.
pub fn observable() -> neocloud_cloudsim::SimConfig {
    let timing = neocloud_cloudsim::Timing {
        provisioning_ms: 300,
        starting_ms: 300,
        terminating_ms: 300,
    };
    neocloud_cloudsim::SimConfig {
        timing,
        ..neocloud_cloudsim::SimConfig::fast()
    }
}

/// A stand-in runner for the container start commands: records its pid, its arguments (one a
/// line), the value of `NEOCLOUD_BOOTSTRAP_TOKEN` and its whole environment in `dir`, then
/// sleeps until killed. `args` is written last.
pub fn fake_container_runner(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("fake-runner");
    let body = format!(
        "#!/bin/sh\necho $$ > {dir}/pid\nprintf '%s\\n' \"$NEOCLOUD_BOOTSTRAP_TOKEN\" > {dir}/token\n\
         env > {dir}/env\nprintf '%s\\n' \"$@\" > {dir}/args.tmp && mv {dir}/args.tmp {dir}/args\n\
         exec sleep 30\n",
        dir = dir.display()
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// A container start script as the node writes it: download and verify the runner, then exec
/// it with `args`.
pub fn runner_script(args: &[&str]) -> String {
    let runner = "/usr/local/bin/neocloud-runner";
    let exec = shlex::try_join(std::iter::once(runner).chain(args.iter().copied())).unwrap();
    format!(
        "set -eu\ncurl -fsSL -o {runner} https://node:8443/runner\n\
         echo 'deadbeef  {runner}' | sha256sum -c -\nchmod 0755 {runner}\nexec {exec}\n"
    )
}

/// Waits up to 5 seconds for `path` to exist (or not).
pub async fn wait_for_path(path: &std::path::Path, present: bool) -> bool {
    for _ in 0..100 {
        if path.exists() == present {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// What a fake container runner recorded: its `/proc` directory, arguments, token and
/// environment (`NAME=VALUE` lines).
pub fn recorded_runner(dir: &std::path::Path) -> (std::path::PathBuf, Vec<String>, String, String) {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let proc_dir = std::path::PathBuf::from(format!("/proc/{}", read("pid").trim()));
    let args = read("args").lines().map(str::to_owned).collect();
    (
        proc_dir,
        args,
        read("token").trim_end().to_owned(),
        read("env"),
    )
}
