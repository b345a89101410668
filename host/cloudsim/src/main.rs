//! `neocloud-cloudsim --config FILE`: runs the RunPod, Lambda Cloud and Vast.ai simulators until
//! interrupted, for `make run-local` and for trying the node without a cloud account.
//!
//! A development tool, not part of the product: the production `neocloud-node` binary does not
//! carry the simulators.

use clap::Parser;

/// Command line of `neocloud-cloudsim`.
#[derive(Debug, Parser)]
#[command(name = "neocloud-cloudsim", version, about)]
struct Cli {
    /// The simulators' configuration (YAML; see host/cloudsim/cloudsim.example.yaml).
    #[arg(long)]
    config: std::path::PathBuf,
}

/// Runs the simulators; a failure is printed once, as one line on stderr, with exit code 1.
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    match run(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let config = neocloud_cloudsim::CloudSimConfig::from_file(&cli.config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("failed to start the tokio runtime: {e}"))?;
    runtime.block_on(neocloud_cloudsim::serve(config))?;
    Ok(())
}
