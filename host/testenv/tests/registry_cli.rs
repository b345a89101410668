//! `neocloud-testenv registry` (what `make registry` runs): it starts the registry, writes the
//! `export` lines docs/POLICIES.md's registry steps read, and those lines are enough to log in
//! over TLS; SIGTERM stops it and removes its directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `export NAME='value'` lines, as a map.
fn parse_exports(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("export "))
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.trim_matches('\'').to_owned()))
        .collect()
}

#[tokio::test]
async fn the_printed_exports_log_in_to_the_registry_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("registry.env");
    let mut child = Command::new(env!("CARGO_BIN_EXE_neocloud-testenv"))
        .arg("registry")
        .arg("--env-file")
        .arg(&env_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !env_file.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("neocloud-testenv registry exited with {status} (make testenv builds it)");
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "no env file after 90 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let vars = parse_exports(&std::fs::read_to_string(&env_file).unwrap());
    let names: Vec<&str> = vars.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "NEOCLOUD_REGISTRY_PASSWORD",
            "NEOCLOUD_REGISTRY_USERNAME",
            "REGISTRY",
            "REGISTRY_CA"
        ]
    );
    let ca = std::fs::read(&vars["REGISTRY_CA"]).unwrap();
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let answer = client
        .get(format!("https://{}/v2/", vars["REGISTRY"]))
        .basic_auth(
            &vars["NEOCLOUD_REGISTRY_USERNAME"],
            Some(&vars["NEOCLOUD_REGISTRY_PASSWORD"]),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);

    // SIGTERM, as Ctrl-C or `kill` would: the registry and its directory go.
    let term = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let registry_dir = PathBuf::from(&vars["REGISTRY_CA"]);
    assert!(
        !registry_dir.parent().unwrap().exists(),
        "the registry's directory was left behind"
    );
}
