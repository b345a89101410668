//! A real worker node for the test control plane: a kubelet built from the Go module proxy at the
//! control plane's version (`hack/testenv/build-kubelet.sh`), Debian's containerd and runc, and a
//! bridge CNI network, all in a network namespace the harness creates, so that nothing they do
//! to the network leaves that namespace.
//!
//! - The namespace is joined to the host by a veth pair on a /30 of `10.250.0.0/16`; the node's
//!   InternalIP is its end (a kubelet refuses a loopback node IP), which is how the API server
//!   reaches the kubelet API (logs, exec, port-forward).
//! - The kubelet reaches the API server through a forwarder listening on the host's end of the
//!   pair (the API server listens on loopback only), with the server name `127.0.0.1` its
//!   certificate is for.
//! - Processes are started with `nsenter --net`, not `ip netns exec`: the latter remounts `/sys`
//!   in a new mount namespace, which hides the cgroup hierarchies from the kubelet and runc.
//! - containerd has its own root, state and socket, the `native` snapshotter (no overlay mounts)
//!   and `restrict_oom_score_adj` (the sandbox lacks `CAP_SYS_RESOURCE`); nothing can be pulled,
//!   so its sandbox ("pause") image and test images are made from Debian's static busybox and
//!   imported (`ctr images import`).
//! - The bridge is the Pods' gateway and masquerades what leaves the Pod network; kube-proxy
//!   (iptables mode, from the same build) routes Service addresses, the `kubernetes` Service
//!   included, whose endpoint the harness points at the forwarder: Pods reach the API server
//!   in-cluster, as `KUBERNETES_SERVICE_HOST`, with their ServiceAccount.
//! - The kubelet uses the cgroupfs driver under a cgroup of its own in every hierarchy, is
//!   `system:node:<name>` in `system:nodes` by a certificate from the control plane's CA, and
//!   authenticates the API server by that CA.
//!
//! The kubelet changes host sysctls (`kernel.panic`, `kernel.panic_on_oops`,
//! `vm.overcommit_memory`); its, kube-proxy's and the bridge's iptables chains and IP forwarding
//! are the namespace's own. Dropping the node stops
//! the kubelet, kills every container process and shim, stops containerd, unmounts what they
//! mounted, removes the cgroups and the namespace, restores the sysctls and removes its
//! directory (`NEOCLOUD_TESTENV_KEEP=1` keeps it); [`Leftovers::of`] says what, if anything,
//! is left, and [`WorkerNode::leftovers_after`] also compares the host's iptables rules with
//! those it had when the node started. Not for production use.
//!
//! Here: [`WorkerNode`], its start, namespace, network and cgroups, and what a test asks of it.
//! By concern: `components` (containerd, the kubelet, kube-proxy), `image` (images for a
//! containerd that can pull nothing), `forwarder` (the host's TCP forwarders), `host` (what the
//! node reads of the host), `teardown` (the drop, and [`Leftovers`]).

mod components;
mod forwarder;
mod host;
mod image;
mod teardown;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::docker::{BUSYBOX, on_path};
use crate::process::Supervised;
use crate::{ControlPlane, Error, binaries, readiness};
use forwarder::Forwarder;
use host::{cgroup_hierarchies, host_iptables_rules, ip, read_sysctl};

pub use teardown::Leftovers;

/// The kubelet binary's override: the binary or its directory.
pub const BIN_ENV: &str = "NEOCLOUD_KUBELET_BIN";

/// The sandbox ("pause") image every Pod's sandbox runs.
pub const PAUSE_IMAGE: &str = "neocloud.invalid/pause:1";

/// How long the node may take to register and become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The host sysctls the kubelet sets, restored when the node is dropped.
const SYSCTLS: [&str; 3] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
];

/// Where Debian's containernetworking-plugins are.
const CNI_BIN: &str = "/usr/lib/cni";

/// A running worker node. Dropping it tears it down.
#[derive(Debug)]
pub struct WorkerNode {
    name: String,
    dir: PathBuf,
    netns: String,
    node_ip: Ipv4Addr,
    cgroup: String,
    sysctls: Vec<(String, String)>,
    /// The host's iptables rules when the node started.
    host_rules: Vec<String>,
    containerd: Option<Supervised>,
    kubelet: Option<Supervised>,
    kube_proxy: Option<Supervised>,
    forwarder: Option<Forwarder>,
    exposed: Vec<Forwarder>,
    keep_dir: bool,
}

/// A program the node needs, and the Debian package that has it.
fn program(name: &str, package: &str) -> Result<PathBuf, Error> {
    on_path(name, &[CNI_BIN]).ok_or_else(|| Error::MissingProgram {
        program: name.to_owned(),
        package: package.to_owned(),
    })
}

/// The kubelet binary: `$NEOCLOUD_KUBELET_BIN` (the binary or its directory) if set, else
/// `kubelet` in the cache directory that `hack/testenv/build-kubelet.sh --print` names.
pub fn locate() -> Result<PathBuf, Error> {
    binaries::tool(BIN_ENV, "kubelet", "build-kubelet.sh", "kubelet")
}

impl WorkerNode {
    /// Starts a worker node `name` for `cp` and waits until its Node is Ready.
    pub async fn start(cp: &ControlPlane, name: &str) -> Result<WorkerNode, Error> {
        let kubelet = locate()?;
        let containerd = program("containerd", "containerd")?;
        program("runc", "runc")?;
        program("bridge", "containernetworking-plugins")?;
        let nsenter = program("nsenter", "util-linux")?;
        program("ctr", "containerd")?;
        if !Path::new(BUSYBOX).is_file() {
            return Err(Error::MissingProgram {
                program: BUSYBOX.into(),
                package: "busybox-static".into(),
            });
        }
        let keep_dir = std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("neocloud-worker-")
            .tempdir()
            .map_err(|e| Error::io("create the worker's directory", e))?
            .keep();
        let id: u32 = rand::random::<u32>() & 0xff_ffff;
        let subnet = (id % 250 + 1) as u8;
        let sysctls = SYSCTLS
            .iter()
            .map(|s| Ok((s.to_string(), read_sysctl(s)?)))
            .collect::<Result<Vec<_>, Error>>()?;
        let mut node = WorkerNode {
            name: name.to_owned(),
            dir,
            netns: format!("ncw-{id:06x}"),
            node_ip: Ipv4Addr::new(10, 250, subnet, 2),
            cgroup: format!("neocloud-worker-{id:06x}"),
            sysctls,
            host_rules: host_iptables_rules(),
            containerd: None,
            kubelet: None,
            kube_proxy: None,
            forwarder: None,
            exposed: Vec::new(),
            keep_dir,
        };
        // From here on, a failure tears down what was made (Drop).
        node.network(id, subnet)?;
        node.cgroups()?;
        let api_port = cp
            .api_url()
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
            .ok_or_else(|| {
                Error::io(
                    "read the API server's port",
                    std::io::Error::other(cp.api_url().to_owned()),
                )
            })?;
        node.forwarder = Some(Forwarder::start(
            Ipv4Addr::new(10, 250, subnet, 1),
            api_port,
        )?);
        node.start_containerd(&nsenter, &containerd, subnet).await?;
        node.import_busybox(
            PAUSE_IMAGE,
            &[
                "/bin/sh",
                "-c",
                "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done",
            ],
        )?;
        node.start_kubelet(cp, &nsenter, &kubelet)?;
        node.start_kube_proxy(cp, &nsenter, &kubelet.with_file_name("kube-proxy"), subnet)
            .await?;
        node.wait_ready(cp).await?;
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's InternalIP (its end of the veth pair).
    pub fn node_ip(&self) -> Ipv4Addr {
        self.node_ip
    }

    /// The node's directory (containerd's root and state, the kubelet's root, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The network namespace's name.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The cgroup (under every hierarchy) the node's Pods run in.
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }

    /// The last `lines` lines of the kubelet's and containerd's logs.
    pub fn logs(&self, lines: usize) -> String {
        [&self.kubelet, &self.kube_proxy, &self.containerd]
            .into_iter()
            .flatten()
            .map(|c| format!("----- {} -----\n{}\n", c.name(), c.log_tail(lines)))
            .collect()
    }

    /// `ctr` talking to the node's containerd, in the Kubernetes namespace.
    pub fn ctr(&self) -> Command {
        let mut ctr = Command::new("ctr");
        ctr.arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"]);
        ctr
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    fn network(&self, id: u32, subnet: u8) -> Result<(), Error> {
        let (host_if, node_if) = (format!("ncwh{id:06x}"), format!("ncwn{id:06x}"));
        let ns = self.netns.as_str();
        ip(&["netns", "add", ns])?;
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &node_if,
        ])?;
        ip(&["link", "set", &node_if, "netns", ns])?;
        ip(&[
            "addr",
            "add",
            &format!("10.250.{subnet}.1/30"),
            "dev",
            &host_if,
        ])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/30", self.node_ip),
            "dev",
            &node_if,
        ])?;
        ip(&["-n", ns, "link", "set", &node_if, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    fn cgroups(&self) -> Result<(), Error> {
        for hierarchy in cgroup_hierarchies() {
            let dir = hierarchy.join(&self.cgroup);
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::io(format!("create cgroup {}", dir.display()), e))?;
            // A v1 cpuset cgroup starts with no CPUs and no memory nodes.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(hierarchy.join(file))
                    && dir.join(file).exists()
                {
                    std::fs::write(dir.join(file), value.trim())
                        .map_err(|e| Error::io(format!("write {}", dir.join(file).display()), e))?;
                }
            }
        }
        Ok(())
    }

    /// Where the API server is reached from the node's namespace and its Pods: the forwarder on
    /// the host's end of the veth pair.
    pub fn api_address(&self) -> std::net::SocketAddrV4 {
        std::net::SocketAddrV4::new(
            self.host_ip(),
            self.forwarder.as_ref().map_or(0, |f| f.port),
        )
    }

    /// The host's end of the veth pair: the one address of this machine the node's Pods reach
    /// (a server a test starts for them listens here).
    pub fn host_ip(&self) -> Ipv4Addr {
        let [a, b, c, _] = self.node_ip.octets();
        Ipv4Addr::new(a, b, c, 1)
    }

    /// Routes this host's traffic for the node's Pod network (`10.251.<n>.0/24`) through the
    /// node's end of the veth pair, so that a process here (the virtual node under test, dialling
    /// an endpoint from inside the cluster as it would in a Pod) reaches the node's Pods at their
    /// IPs. The route goes with the veth pair when the node is dropped.
    pub fn route_pod_network(&self) -> Result<(), Error> {
        let [_, _, subnet, _] = self.node_ip.octets();
        ip(&[
            "route",
            "replace",
            &format!("10.251.{subnet}.0/24"),
            "via",
            &self.node_ip.to_string(),
        ])
    }

    /// Makes a server listening on loopback `port` (a cloud simulator a test started) reachable
    /// from the node's Pods, at the returned address on the host's end of the veth pair. Lasts
    /// as long as the node.
    pub fn expose(&mut self, port: u16) -> Result<std::net::SocketAddrV4, Error> {
        let forwarder = Forwarder::start(self.host_ip(), port)?;
        let address = std::net::SocketAddrV4::new(self.host_ip(), forwarder.port);
        self.exposed.push(forwarder);
        Ok(address)
    }

    async fn wait_ready(&mut self, cp: &ControlPlane) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(cp.client().await?);
        let name = self.name.clone();
        let Some(kubelet) = self.kubelet.as_mut() else {
            return Ok(());
        };
        readiness::wait_until_ready(kubelet, READY_TIMEOUT, || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move {
                let node = nodes
                    .get_opt(&name)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("not registered yet")?;
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Ready");
                match ready {
                    Some(c) if c.status == "True" => Ok(()),
                    Some(c) => Err(format!(
                        "Ready is {}: {}",
                        c.status,
                        c.message.unwrap_or_default()
                    )),
                    None => Err("no Ready condition yet".to_owned()),
                }
            }
        })
        .await
    }

    /// The network namespaces containerd made for the node's Pod sandboxes (CNI pins them under
    /// `/run/netns/cni-*`, outside the node's directory), from its containers' specs.
    pub fn pod_netns(&self) -> Vec<PathBuf> {
        let Ok(out) = self.ctr().args(["containers", "ls", "-q"]).output() else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|id| {
                self.ctr()
                    .args(["containers", "info", id.trim()])
                    .output()
                    .ok()
            })
            .filter_map(|info| serde_json::from_slice::<serde_json::Value>(&info.stdout).ok())
            .flat_map(|info| {
                info["Spec"]["linux"]["namespaces"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|ns| ns["type"] == "network")
            .filter_map(|ns| ns["path"].as_str().map(PathBuf::from))
            .filter(|p| p.starts_with("/var/run/netns") || p.starts_with("/run/netns"))
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }
}
