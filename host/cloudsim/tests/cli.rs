//! The `neocloud-cloudsim` binary: serves the three simulators from a config file until stopped,
//! and refuses a config it cannot read with one line naming the file.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_binary_serves_the_three_simulators_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloudsim.yaml");
    std::fs::write(
        &config,
        "runpod: {api_key: k}\nlambda: {api_key: k}\nvast: {api_key: k}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_neocloud-cloudsim"))
        .arg("--config")
        .arg(&config)
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ready = None;
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.contains("cloud simulators ready") {
            ready = Some(line);
            break;
        }
        assert!(Instant::now() < deadline, "no ready line within 30 s");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let ready = ready.expect("the simulators said they were ready");
    for name in [
        "runpod=http://127.0.0.1:",
        "lambda=http://127.0.0.1:",
        "vast=http://127.0.0.1:",
    ] {
        assert!(ready.contains(name), "{name} missing from {ready}");
    }
}

#[test]
fn a_missing_config_file_is_one_line_naming_it_and_exit_code_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_neocloud-cloudsim"))
        .args(["--config", "/nonexistent/cloudsim.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: failed to read simulator config /nonexistent/cloudsim.yaml"),
        "{stderr}"
    );
}
