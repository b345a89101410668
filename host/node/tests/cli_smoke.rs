//! `neocloud-node provider smoke` as CI runs it: the real binary against each simulator over
//! HTTP, configured only through the specification's environment variables; it must pass and
//! leave nothing live in the simulator's ledger. Bad flags are refused by name.

use std::process::Command;

use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};

fn fast() -> CloudSimConfig {
    CloudSimConfig {
        runpod: SimConfig::fast(),
        lambda: SimConfig::fast(),
        vast: SimConfig::fast(),
    }
}

fn smoke(sims: &CloudSim, provider: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args([
            "provider",
            "smoke",
            "--provider",
            provider,
            "--ready-timeout-secs",
            "30",
        ])
        .args(extra)
        .env("RUNPOD_API_KEY", sims.runpod.api_key())
        .env("RUNPOD_API_BASE_URL", sims.runpod.base_url())
        .env("LAMBDA_API_KEY", sims.lambda.api_key())
        .env("LAMBDA_API_BASE_URL", sims.lambda.base_url())
        .env("LAMBDA_SSH_KEY_NAME", "sim-ssh-key")
        .env("VAST_API_KEY", sims.vast.api_key())
        .env("VAST_API_BASE_URL", sims.vast.base_url())
        .output()
        .expect("run neocloud-node")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_smoke_command_passes_against_every_simulator_and_leaves_nothing() {
    let sims = CloudSim::start(fast()).await.unwrap();
    for provider in ["runpod", "lambda", "vast", "fake"] {
        let out = tokio::task::block_in_place(|| smoke(&sims, provider, &[]));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "smoke on {provider} failed:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains(&format!("smoke passed on {provider}")),
            "{stdout}"
        );
    }
    let ledger = sims.ledger();
    assert!(
        ledger.live().is_empty(),
        "instances left live: {:?}",
        ledger.live()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_smoke_flags_are_refused_by_name_and_nothing_is_rented() {
    let sims = CloudSim::start(fast()).await.unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["--capacity", "sometimes"],
            "--capacity: \"sometimes\" is not on-demand or spot",
        ),
        (
            &["--max-price", "-1"],
            "--max-price: -1 is not a positive price",
        ),
        (
            &["--min-reliability", "1.5"],
            "--min-reliability: 1.5 is not between 0 and 1",
        ),
    ];
    for (flags, message) in cases {
        let out = tokio::task::block_in_place(|| smoke(&sims, "vast", flags));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
    }
    assert!(
        sims.ledger().entries.is_empty(),
        "a refused smoke rented something"
    );
}
