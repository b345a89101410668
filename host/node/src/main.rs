//! `neocloud-node`: the binary. It wires configuration, the Kubernetes virtual node, the broker,
//! the providers and the policy engines together, and hosts the operator CLI.
//!
//! It is not where decisions are made: placement, fallback and pricing live in the broker and the
//! policy engines, cloud APIs in the providers.

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
    /// Print version and build information.
    Version,
    /// Print the CustomResourceDefinitions the node needs, as YAML.
    Crds,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let out = match cli.command {
        Command::Version => format!("neocloud-node {}\n", env!("CARGO_PKG_VERSION")),
        Command::Crds => neocloud_node::crd::to_yaml()?,
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes())?;
    Ok(())
}
