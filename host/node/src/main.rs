//! `neocloud-node`: the binary. It wires configuration, the Kubernetes virtual node, the broker,
//! the providers and the policy engines together, and hosts the operator CLI.
//!
//! It is not where decisions are made: placement, fallback and pricing live in the broker and the
//! policy engines, cloud APIs in the providers.

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Command line of `neocloud-node`.
#[derive(Debug, Parser)]
#[command(name = "neocloud-node", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the virtual node: register it, rent for the Pods bound to it, sweep orphans.
    Run {
        /// The node's configuration (YAML; see examples/node.yaml).
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Print version and build information.
    Version,
    /// Print the CustomResourceDefinitions the node needs, as YAML.
    Crds,
    /// Check, evaluate or benchmark a Wasm policy component.
    Policy {
        #[command(subcommand)]
        command: neocloud_node::policy_cli::PolicyCommand,
    },
    /// Provider checks: `provider smoke --provider runpod|lambda|vast|fake`.
    Provider {
        #[command(subcommand)]
        command: neocloud_node::provider_cli::ProviderCommand,
    },
    /// Report what the rentals cost, from the bindings in the cluster.
    Cost {
        #[command(subcommand)]
        command: neocloud_node::cost_cli::CostCommand,
    },
}

/// Runs the command; a failure is printed once, as one line on stderr, with exit code 1.
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", one_message(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", leaving out a cause the message already shows
/// (many errors print their source in their own message).
fn one_message(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The log filter when `RUST_LOG` is unset: `info`, less kube-runtime's per-reconcile span,
/// whose fields were formatted for every reconcile (about 5 % of the node's CPU under load)
/// while the node's own lines already name the Pod and binding.
const DEFAULT_LOG_FILTER: &str = "info,kube_runtime::controller=warn";

fn run(cli: Cli) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{EnvFilter, Layer as _};
    let run_config = match &cli.command {
        Command::Run { config } => Some(neocloud_node::run::RunConfig::from_file(config)?),
        _ => None,
    };
    // The exported spans are not log lines.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into())
        .add_directive(format!("{}=off", neocloud_node::telemetry::TARGET).parse()?);
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .with_filter(filter);
    let cluster = run_config.as_ref().and_then(|c| c.cluster_id.clone());
    let (telemetry, spans) = match &run_config {
        Some(_) => neocloud_node::telemetry::start(cluster.as_deref())?,
        None => (None, None),
    };
    tracing_subscriber::registry().with(logs).with(spans).init();
    let out = match cli.command {
        Command::Run { .. } => {
            let config = run_config.ok_or_else(|| anyhow::anyhow!("no config"))?;
            let result = runtime()?.block_on(neocloud_node::run::run(config));
            if let Some(telemetry) = telemetry {
                telemetry.shutdown();
            }
            result?;
            String::new()
        }
        Command::Version => format!("neocloud-node {}\n", env!("CARGO_PKG_VERSION")),
        Command::Crds => neocloud_node::crd::to_yaml()?,
        Command::Policy { command } => neocloud_node::policy_cli::run(command)?,
        Command::Provider { command } => {
            runtime()?.block_on(neocloud_node::provider_cli::run(command))?
        }
        Command::Cost { command } => runtime()?.block_on(neocloud_node::cost_cli::run(command))?,
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes())?;
    Ok(())
}

/// Colour codes only for a person at a terminal (and not with `NO_COLOR`), never into a log
/// file or a pipe.
fn colour() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none()
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the tokio runtime")
}
