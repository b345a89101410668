//! `neocloud-runner`: the binary cloud-init starts on a rented VM (see docs/RUNNER.md). It runs
//! one workload for the node and exits with the workload's exit code, or with 1 and one line on
//! stderr when it could not get that far.
//!
//! Not the runner's logic: see the library ([`neocloud_runner::run`]).

use clap::Parser;
use neocloud_runner::RunnerArgs;

fn main() -> std::process::ExitCode {
    let args = RunnerArgs::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("failed to start the tokio runtime: {e}")),
    };
    match runtime.block_on(neocloud_runner::run(args)) {
        // The workload's own code, at once: nothing of the run is left to wind down.
        Ok(code) => std::process::exit(code),
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(message: &str) -> std::process::ExitCode {
    eprintln!("error: {message}");
    std::process::ExitCode::FAILURE
}

/// Colour codes only for a person at a terminal (and not with `NO_COLOR`).
fn colour() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none()
}
