//! The `neocloud-runner` binary's command line: what cloud-init gets back when the `user_data`
//! it was given is wrong. Errors come before anything is sent and name the flag and value.
//! (The runner against a real callback server is tested in `host/node/tests/runner.rs`.)

use std::process::{Command, Output};

fn runner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_neocloud-runner"))
        .args(args)
        .env_remove("NEOCLOUD_BOOTSTRAP_TOKEN")
        .env_remove("NEOCLOUD_RUNNER_CREDENTIAL")
        .output()
        .expect("run neocloud-runner")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_plain_http_callback_url_is_refused_with_the_url_in_one_line() {
    let out = runner(&[
        "--callback-url",
        "http://127.0.0.1:9",
        "--ca-pem-base64",
        "UEVN",
        "--bootstrap-token",
        "t",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.starts_with(
            "error: invalid callback URL \"http://127.0.0.1:9\": the callback URL must use https"
        ),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
}

#[test]
fn an_unknown_executor_is_refused_naming_the_value() {
    let out = runner(&[
        "--callback-url",
        "https://n:1",
        "--ca-pem-base64",
        "UEVN",
        "--bootstrap-token",
        "t",
        "--executor",
        "podman",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("--executor"), "{text}");
    assert!(
        text.contains("invalid executor \"podman\": expected docker or process"),
        "{text}"
    );
}

#[test]
fn a_runner_without_a_ca_to_trust_does_not_start() {
    let out = runner(&["--callback-url", "https://n:1", "--bootstrap-token", "t"]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("--ca-file"), "{text}");
}

#[test]
fn a_ca_that_is_not_base64_is_refused_naming_the_flag() {
    let out = runner(&[
        "--callback-url",
        "https://n:1",
        "--ca-pem-base64",
        "not base64!",
        "--bootstrap-token",
        "t",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(text.contains("--ca-pem-base64 is not base64"), "{text}");
}
