//! `neocloud-node relay`: the process of a burst Pod's relay Pod (see
//! `neocloud_kubelet::relay`). The node writes its arguments into the relay Pod it makes; the
//! rest (token, the node's address and certificate) is read from the mounted Secret.

use std::path::PathBuf;

use neocloud_kubelet::relay::client::{self, RelayConfig};

/// `neocloud-node relay` arguments.
#[derive(Debug, clap::Args)]
pub struct RelayArgs {
    /// The burst Pod's uid.
    #[arg(long, env = "NEOCLOUD_RELAY_POD_UID")]
    pub pod_uid: String,
    /// The TCP ports to carry, comma-separated (the burst Pod's containerPorts).
    #[arg(
        long,
        env = "NEOCLOUD_RELAY_PORTS",
        value_delimiter = ',',
        required = true
    )]
    pub ports: Vec<u16>,
    /// The directory of the relay's Secret (token, node, node.crt).
    #[arg(
        long,
        env = "NEOCLOUD_RELAY_SECRET_DIR",
        default_value = "/etc/neocloud-relay"
    )]
    pub secret_dir: PathBuf,
    /// Connections carried at once; more are closed at once.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
}

/// Runs the relay until the process is stopped.
pub async fn run(args: RelayArgs) -> anyhow::Result<()> {
    let mut config = RelayConfig::new(args.pod_uid, args.ports, args.secret_dir);
    config.max_connections = args.max_connections;
    tokio::select! {
        result = client::run(config) => result?,
        () = neocloud_node::run::terminated() => {}
    }
    Ok(())
}
