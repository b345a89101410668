//! `neocloud-node`: the binary. It wires configuration, the Kubernetes virtual node, the broker,
//! the providers and the policy engines together, and hosts the operator CLI.
//!
//! It is not where decisions are made: placement, fallback and pricing live in the broker and the
//! policy engines, cloud APIs in the providers.

use anyhow::Context;
use clap::{Parser, Subcommand};

mod cli;

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
    /// Print the configuration file's reference (Markdown) or its JSON Schema.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Check, evaluate or benchmark a Wasm policy component.
    Policy {
        #[command(flatten)]
        cache: cli::policy::CacheArgs,
        #[command(subcommand)]
        command: cli::policy::PolicyCommand,
    },
    /// Provider checks: `provider smoke --provider runpod|lambda|vast|fake`.
    Provider {
        #[command(subcommand)]
        command: cli::provider::ProviderCommand,
    },
    /// Report what the rentals cost, from the bindings in the cluster.
    Cost {
        #[command(subcommand)]
        command: cli::cost::CostCommand,
    },
    /// Carry a burst Pod's ports from the cluster network to its workload (what the node runs
    /// in each relay Pod it makes).
    Relay(cli::relay::RelayArgs),
}

/// `neocloud-node config ...`.
#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Every setting with its type, default and description, as docs/CONFIGURATION.md has it.
    Reference,
    /// The file's JSON Schema (draft 2020-12), for an editor's YAML language server.
    Schema,
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
/// (many errors print their source in their own message), on one line: a cause that spans lines
/// (a parser's pretty-printed bytes) has its lines joined by spaces.
fn one_message(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let lines = cause.to_string();
        let text = lines
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
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

/// The log lines' layer, beneath which the exported spans' layer sits.
type Logs = tracing_subscriber::layer::Layered<
    tracing_subscriber::filter::Filtered<
        tracing_subscriber::fmt::Layer<
            tracing_subscriber::Registry,
            tracing_subscriber::fmt::format::DefaultFields,
            tracing_subscriber::fmt::format::Format,
            fn() -> std::io::Stderr,
        >,
        tracing_subscriber::EnvFilter,
        tracing_subscriber::Registry,
    >,
    tracing_subscriber::Registry,
>;

/// Log lines through `filter`, and the spans of `spans` when an exporter asked for them.
///
/// Without an exporter the span layer is left out rather than added as `None`: a `None` layer
/// has an interest in every callsite, so every span of every crate (kube-runtime's per
/// reconcile, the HTTP client's per request) was created and entered only to be filtered out,
/// about a fifth of the node's CPU under load.
fn subscriber<L>(
    filter: tracing_subscriber::EnvFilter,
    spans: Option<L>,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    L: tracing_subscriber::Layer<Logs> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let stderr: fn() -> std::io::Stderr = std::io::stderr;
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(stderr)
        .with_ansi(colour())
        .with_filter(filter);
    let logged = tracing_subscriber::registry().with(logs);
    match spans {
        Some(spans) => Box::new(logged.with(spans)),
        None => Box::new(logged),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let run_config = match &cli.command {
        Command::Run { config } => Some(neocloud_node::run::RunConfig::from_file(config)?),
        _ => None,
    };
    // The exported spans are not log lines.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into())
        .add_directive(format!("{}=off", neocloud_node::telemetry::TARGET).parse()?);
    let cluster = run_config.as_ref().and_then(|c| c.cluster_id.clone());
    let (telemetry, spans) = match &run_config {
        Some(_) => neocloud_node::telemetry::start(cluster.as_deref())?,
        None => (None, None),
    };
    tracing::subscriber::set_global_default(subscriber(filter, spans))?;
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
        Command::Config { command } => match command {
            ConfigCommand::Reference => neocloud_node::run::config_reference::markdown(),
            ConfigCommand::Schema => {
                let schema = neocloud_node::run::config_reference::schema();
                serde_json::to_string_pretty(&schema)? + "\n"
            }
        },
        Command::Policy { command, cache } => cli::policy::run(command, &cache)?,
        Command::Provider { command } => runtime()?.block_on(cli::provider::run(command))?,
        Command::Cost { command } => runtime()?.block_on(cli::cost::run(command))?,
        Command::Relay(args) => {
            runtime()?.block_on(cli::relay::run(args))?;
            String::new()
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_that_spans_lines_is_said_on_one_line() {
        let error = anyhow::anyhow!("bad magic number - expected=[\n    0x0,\n    0x61,\n]")
            .context("failed to compile policy x.wasm");
        assert_eq!(
            one_message(&error),
            "failed to compile policy x.wasm: bad magic number - expected=[ 0x0, 0x61, ]"
        );
    }

    /// The node's own subscriber without an exporter creates no span its log filter leaves
    /// out: kube-runtime's per-reconcile span and the HTTP client's per-request one were created
    /// and entered on every poll while an absent exporter layer was still in the stack.
    #[test]
    fn spans_the_log_filter_leaves_out_are_not_created() {
        use tracing_subscriber::Layer as _;
        let filter = tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER);
        let none: Option<tracing_subscriber::layer::Identity> = None;
        tracing::subscriber::with_default(subscriber(filter, none), || {
            let reconcile =
                tracing::info_span!(target: "kube_runtime::controller", "reconciling object");
            let http = tracing::debug_span!(target: "kube_client::client::builder", "HTTP");
            let ours = tracing::info_span!(target: "neocloud_node::reconcile", "kept");
            assert!(reconcile.is_disabled(), "kube-runtime's span was created");
            assert!(http.is_disabled(), "the HTTP client's span was created");
            assert!(
                !ours.is_disabled(),
                "an info span the filter keeps was not created"
            );
        });
        // With an exporter, the exported target's spans are created (for the exporter) and the
        // others the log filter leaves out still are not. (One test: callsite interest is
        // global, and two subscribers in parallel tests would see each other's.)
        let filter = tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)
            .add_directive("neocloud_telemetry=off".parse().unwrap());
        let exported = tracing_subscriber::layer::Identity::new().with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("neocloud_telemetry", tracing::Level::TRACE),
        );
        tracing::subscriber::with_default(subscriber(filter, Some(exported)), || {
            let placed = tracing::info_span!(target: "neocloud_telemetry", "place pod");
            let reconcile =
                tracing::info_span!(target: "kube_runtime::controller", "reconciling object");
            assert!(!placed.is_disabled(), "the exported span was not created");
            assert!(reconcile.is_disabled(), "kube-runtime's span was created");
        });
    }
}
