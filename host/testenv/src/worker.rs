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

use std::io::Write as _;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::docker::{BUSYBOX, busybox_rootfs, on_path, run};
use crate::process::Supervised;
use crate::{ControlPlane, Error, binaries, readiness, write_file};

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

fn ip(args: &[&str]) -> Result<(), Error> {
    run(Command::new("ip").args(args))
}

fn read_sysctl(name: &str) -> Result<String, Error> {
    let path = Path::new("/proc/sys").join(name);
    std::fs::read_to_string(&path)
        .map(|v| v.trim().to_owned())
        .map_err(|e| Error::io(format!("read {}", path.display()), e))
}

/// The mount points of the cgroup v1 hierarchies, or the cgroup v2 root.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let (fields, rest) = line.split_once(" - ")?;
            let fstype = rest.split_whitespace().next()?;
            let point = fields.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(point))
        })
        .collect()
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Every directory of a cgroup subtree, deepest first.
fn subtree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        out.push(dir);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let line = String::from_utf8_lossy(&raw).replace('\0', " ");
            line.contains(needle).then_some((pid, line))
        })
        .collect()
}

/// A TCP forwarder from the host's end of the veth pair to a server on loopback (the API
/// server, or one a test exposes to the node's Pods).
#[derive(Debug)]
struct Forwarder {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    fn start(listen: Ipv4Addr, target: u16) -> Result<Forwarder, Error> {
        let listener = TcpListener::bind((listen, 0))
            .map_err(|e| Error::io(format!("listen on {listen} for the worker node"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("make the forwarder's listener non-blocking", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("read the forwarder's port", e))?
            .port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("worker-forwarder".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((inbound, _)) => {
                            let _ = inbound.set_nonblocking(false);
                            if let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) {
                                pipe(inbound, outbound);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
            .map_err(|e| Error::io("start the forwarder", e))?;
        Ok(Forwarder {
            port,
            stop,
            thread: Some(thread),
        })
    }
}

/// Copies both ways until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    };
    if let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) {
        copy(a, b2);
        copy(b, a2);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes an OCI image layout archive holding `rootfs` as one layer, named `reference`.
fn oci_archive(
    rootfs: &Path,
    entrypoint: &[&str],
    reference: &str,
    out: &Path,
) -> Result<(), Error> {
    use sha2::{Digest, Sha256};
    let work = out.with_extension("layout");
    let blobs = work.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| Error::io("create the image layout", e))?;
    let layer = work.join("layer.tar");
    run(Command::new("tar")
        .arg("--sort=name")
        .arg("--mtime=@0")
        .arg("--owner=0")
        .arg("--group=0")
        .arg("-C")
        .arg(rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."))?;
    let bytes = std::fs::read(&layer).map_err(|e| Error::io("read the image layer", e))?;
    let blob = |data: &[u8]| -> Result<(String, usize), Error> {
        let digest = hex::encode(Sha256::digest(data));
        std::fs::write(blobs.join(&digest), data)
            .map_err(|e| Error::io("write an image blob", e))?;
        Ok((format!("sha256:{digest}"), data.len()))
    };
    let (layer_digest, layer_size) = blob(&bytes)?;
    std::fs::remove_file(&layer).map_err(|e| Error::io("remove the layer tar", e))?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = blob(config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = blob(manifest.to_string().as_bytes())?;
    let tag = reference.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"io.containerd.image.name": reference,
                            "org.opencontainers.image.ref.name": tag},
        }],
    });
    write_file(&work.join("index.json"), &index.to_string())?;
    write_file(
        &work.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    run(Command::new("tar")
        .arg("-C")
        .arg(&work)
        .arg("-cf")
        .arg(out)
        .args(["oci-layout", "index.json", "blobs"]))?;
    std::fs::remove_dir_all(&work).map_err(|e| Error::io("remove the image layout", e))
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

    /// Imports image `reference` into the node's containerd: a root filesystem with only
    /// Debian's static busybox (as `/bin/sh`, `echo`, `sleep`, `cat`, `env`, `hostname`, `ip`,
    /// `wget`, `nc`, `od`) and this entrypoint. Pods must use `imagePullPolicy: Never` or
    /// `IfNotPresent`: nothing can be pulled.
    pub fn import_busybox(&self, reference: &str, entrypoint: &[&str]) -> Result<(), Error> {
        let slug: String = reference
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let rootfs = self.dir.join(format!("image-{slug}"));
        busybox_rootfs(
            &rootfs,
            &[
                "sh", "echo", "sleep", "cat", "env", "hostname", "ip", "wget", "nc",
            ],
        )?;
        let archive = self.dir.join(format!("image-{slug}.tar"));
        oci_archive(&rootfs, entrypoint, reference, &archive)?;
        run(self.ctr().args(["images", "import"]).arg(&archive))?;
        std::fs::remove_file(&archive).map_err(|e| Error::io("remove the image archive", e))?;
        std::fs::remove_dir_all(&rootfs).map_err(|e| Error::io("remove the image's root", e))
    }

    /// Imports an OCI image archive (an OCI layout as one tarball, as `make image` writes
    /// `target/image/image.tar`) into the node's containerd, under the names its index carries.
    pub fn import_archive(&self, archive: &Path) -> Result<(), Error> {
        if !archive.is_file() {
            return Err(Error::io(
                format!("import {}", archive.display()),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
        run(self.ctr().args(["images", "import"]).arg(archive))
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

    async fn start_containerd(
        &mut self,
        nsenter: &Path,
        containerd: &Path,
        subnet: u8,
    ) -> Result<(), Error> {
        let base = self.dir.join("containerd");
        let cni = base.join("cni");
        std::fs::create_dir_all(&cni).map_err(|e| Error::io("create containerd's directory", e))?;
        let p = |name: &str| base.join(name).display().to_string();
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni}"
"#,
            root = p("root"),
            state = p("state"),
            socket = self.socket().display(),
            cni = cni.display(),
        );
        write_file(&base.join("config.toml"), &config)?;
        // The bridge is the Pods' gateway (the plugin turns IP forwarding on in the node's
        // namespace only) and masquerades what leaves the Pod network as the node's address, so
        // the host answers Pods without a route to them: Pods reach each other, the node, and
        // through kube-proxy's rules the API server and Services.
        let network = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "neocloud-worker",
            "plugins": [
                {"type": "bridge", "bridge": "ncbr0", "isDefaultGateway": true, "ipMasq": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": format!("10.251.{subnet}.0/24")}]],
                          "dataDir": p("ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        write_file(&cni.join("10-bridge.conflist"), &network.to_string())?;
        let args = vec![
            format!("--net=/run/netns/{}", self.netns),
            containerd.display().to_string(),
            "--config".into(),
            base.join("config.toml").display().to_string(),
        ];
        let mut process = Supervised::spawn(
            "containerd",
            nsenter,
            &args,
            &self.dir.join("containerd.log"),
            None,
        )?;
        let mut version = self.ctr();
        version.arg("version");
        let ready = readiness::wait_until_ready(&mut process, Duration::from_secs(30), || {
            let out = version.output();
            async move {
                let out = out.map_err(|e| e.to_string())?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
                }
            }
        })
        .await;
        self.containerd = Some(process);
        ready
    }

    /// A kubeconfig for `user` in `groups` (a client certificate from the control plane's CA)
    /// that reaches the API server from the node's namespace, through the forwarder.
    fn kubeconfig_as(
        &self,
        cp: &ControlPlane,
        user: &str,
        groups: &[&str],
        file: &str,
    ) -> Result<PathBuf, Error> {
        let issued = cp.kubeconfig_as(user, groups)?;
        let text = std::fs::read_to_string(&issued)
            .map_err(|e| Error::io(format!("read {}", issued.display()), e))?;
        let mut doc: serde_yaml::Value =
            serde_yaml::from_str(&text).map_err(|e| Error::Kubeconfig {
                path: issued.clone(),
                message: e.to_string(),
            })?;
        if let Some(cluster) = doc
            .get_mut("clusters")
            .and_then(|c| c.get_mut(0))
            .and_then(|c| c.get_mut("cluster"))
            .and_then(|c| c.as_mapping_mut())
        {
            cluster.insert(
                "server".into(),
                format!("https://{}", self.api_address()).into(),
            );
            cluster.insert("tls-server-name".into(), "127.0.0.1".into());
        }
        let kubeconfig = self.dir.join(format!("{file}.kubeconfig"));
        let yaml = serde_yaml::to_string(&doc).map_err(|e| Error::Kubeconfig {
            path: kubeconfig.clone(),
            message: e.to_string(),
        })?;
        write_file(&kubeconfig, &yaml)?;
        Ok(kubeconfig)
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

    fn start_kubelet(
        &mut self,
        cp: &ControlPlane,
        nsenter: &Path,
        kubelet: &Path,
    ) -> Result<(), Error> {
        let kubeconfig = self.kubeconfig_as(
            cp,
            &format!("system:node:{}", self.name),
            &["system:nodes"],
            "kubelet",
        )?;
        let root = self.dir.join("kubelet");
        std::fs::create_dir_all(&root).map_err(|e| Error::io("create the kubelet's root", e))?;
        let config = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // The machines have cgroup v1 hierarchies and may have swap.
            "failCgroupV1": false,
            "failSwapOn": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", self.cgroup),
            "rotateCertificates": false,
            "serverTLSBootstrap": false,
            "authentication": {
                "x509": {"clientCAFile": cp.ca_file().display().to_string()},
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": format!("unix://{}", self.socket().display()),
            "address": self.node_ip.to_string(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "enforceNodeAllocatable": [],
            // The disk is shared and may be full-ish: never evict or collect images here.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "localStorageCapacityIsolation": false,
            "resolvConf": "",
        });
        let config_path = self.dir.join("kubelet.yaml");
        write_file(&config_path, &config.to_string())?;
        let args = vec![
            format!("--net=/run/netns/{}", self.netns),
            kubelet.display().to_string(),
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", root.display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.node_ip),
        ];
        self.kubelet = Some(Supervised::spawn(
            "kubelet",
            nsenter,
            &args,
            &self.dir.join("kubelet.log"),
            None,
        )?);
        Ok(())
    }

    /// Starts kube-proxy (iptables mode, as `system:kube-proxy`) in the node's namespace, after
    /// publishing the `kubernetes` Service's endpoint as the forwarder's address: the control
    /// plane's API server listens on loopback and reconciles no endpoints of its own
    /// (`--endpoint-reconciler-type=none`), so this is what makes the in-cluster address
    /// (`KUBERNETES_SERVICE_HOST`, 10.0.0.1:443) reach it from a Pod. One worker node per
    /// control plane: a second one would point that endpoint at itself.
    async fn start_kube_proxy(
        &mut self,
        cp: &ControlPlane,
        nsenter: &Path,
        kube_proxy: &Path,
        subnet: u8,
    ) -> Result<(), Error> {
        if !kube_proxy.is_file() {
            return Err(Error::MissingTool {
                tool: "kube-proxy".into(),
                path: kube_proxy.to_path_buf(),
                script: "build-kubelet.sh".into(),
                env: BIN_ENV.into(),
            });
        }
        self.publish_api_endpoint(cp).await?;
        let kubeconfig = self.kubeconfig_as(cp, "system:kube-proxy", &[], "kube-proxy")?;
        let healthz = std::net::SocketAddrV4::new(self.node_ip, 10256);
        let config = serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig.display().to_string()},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": format!("10.251.{subnet}.0/24"),
            "healthzBindAddress": healthz.to_string(),
            "metricsBindAddress": format!("{}:10249", self.node_ip),
            // Zeros leave the host-wide conntrack settings alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s", "udpTimeout": "0s", "udpStreamTimeout": "0s"},
            // Pod to Service to a Pod on the same bridge needs the reply to come back through the
            // node (no br_netfilter here): masquerade every Service connection.
            "iptables": {"localhostNodePorts": false, "masqueradeAll": true},
        });
        let config_path = self.dir.join("kube-proxy.yaml");
        write_file(&config_path, &config.to_string())?;
        let args = vec![
            format!("--net=/run/netns/{}", self.netns),
            kube_proxy.display().to_string(),
            format!("--config={}", config_path.display()),
        ];
        let mut process = Supervised::spawn(
            "kube-proxy",
            nsenter,
            &args,
            &self.dir.join("kube-proxy.log"),
            None,
        )?;
        let ready = readiness::wait_until_ready(&mut process, Duration::from_secs(60), || async {
            let probe = readiness::http_get_at(healthz.into(), "/healthz");
            match tokio::time::timeout(Duration::from_secs(2), probe).await {
                Ok(Ok((200, _))) => Ok(()),
                Ok(Ok((code, _))) => Err(format!("/healthz answered {code}")),
                Ok(Err(e)) => Err(e),
                Err(_) => Err("/healthz did not answer within 2 s".to_owned()),
            }
        })
        .await;
        self.kube_proxy = Some(process);
        ready
    }

    /// Points the `kubernetes` Service (default namespace) at the forwarder.
    async fn publish_api_endpoint(&self, cp: &ControlPlane) -> Result<(), Error> {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::api::{Patch, PatchParams};
        let slices: Api<EndpointSlice> = Api::namespaced(cp.client().await?, "default");
        let address = self.api_address();
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default", "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "neocloud-testenv",
            }},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address.ip().to_string()], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": address.port(), "protocol": "TCP"}],
        }))
        .map_err(|e| {
            Error::io(
                "build the kubernetes EndpointSlice",
                std::io::Error::other(e),
            )
        })?;
        slices
            .patch(
                "kubernetes",
                &PatchParams::apply("neocloud-testenv").force(),
                &Patch::Apply(&slice),
            )
            .await?;
        Ok(())
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

    /// Kills every process in the node's cgroups (its containers) and every containerd shim of
    /// this node.
    fn kill_workloads(&self) {
        let socket = self.socket().display().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut pids: Vec<i32> = cgroup_hierarchies()
                .iter()
                .flat_map(|h| subtree(&h.join(&self.cgroup)))
                .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
                .flat_map(|procs| {
                    procs
                        .lines()
                        .filter_map(|l| l.trim().parse::<i32>().ok())
                        .collect::<Vec<_>>()
                })
                .collect();
            pids.extend(
                processes_mentioning(&socket)
                    .into_iter()
                    .map(|(pid, _)| pid),
            );
            pids.sort_unstable();
            pids.dedup();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
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

    fn teardown(&mut self) {
        // Asked while containerd still answers: the kubelet removes a Pod's namespace only when
        // it removes the Pod's sandbox, which it does not do for Pods left running.
        let pod_netns = self.pod_netns();
        if let Some(mut kube_proxy) = self.kube_proxy.take() {
            kube_proxy.stop();
        }
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
        self.kill_workloads();
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop();
        }
        self.kill_workloads();
        for point in mounts_under(&self.dir) {
            let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
        }
        for hierarchy in cgroup_hierarchies() {
            for dir in subtree(&hierarchy.join(&self.cgroup)) {
                let _ = std::fs::remove_dir(&dir);
            }
        }
        for path in pod_netns {
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&path);
        }
        let _ = ip(&["netns", "del", &self.netns]);
        for (name, value) in &self.sysctls {
            let path = Path::new("/proc/sys").join(name);
            if let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(&path) {
                let _ = writeln!(file, "{value}");
            }
        }
        self.forwarder.take();
        self.exposed.clear();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// What the node left behind, once dropped (for tests of the harness itself).
    pub fn leftovers_after(self) -> Leftovers {
        let (dir, netns, cgroup) = (self.dir.clone(), self.netns.clone(), self.cgroup.clone());
        let sysctls = self.sysctls.clone();
        let host_rules = self.host_rules.clone();
        let pod_netns = self.pod_netns();
        drop(self);
        let mut left = Leftovers::of(&dir, &netns, &cgroup, &sysctls);
        for rule in host_iptables_rules() {
            if !host_rules.contains(&rule) {
                left.0.push(format!("host iptables rule {rule}"));
            }
        }
        for path in pod_netns {
            if path.exists() {
                left.0
                    .push(format!("Pod network namespace {}", path.display()));
            }
        }
        left
    }
}

impl Drop for WorkerNode {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The host's IPv4 and IPv6 rules and chains in every table (`iptables -t T -S`), one line each
/// prefixed with the command and table; a table the kernel lacks reads as empty. The kubelet's,
/// kube-proxy's and the bridge plugin's rules belong in the node's namespace, never here.
fn host_iptables_rules() -> Vec<String> {
    let mut rules = Vec::new();
    for command in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle", "raw"] {
            let Ok(out) = Command::new(command)
                .args(["-w", "-t", table, "-S"])
                .output()
            else {
                continue;
            };
            if out.status.success() {
                rules.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .map(|line| format!("{command} -t {table} {line}")),
                );
            }
        }
    }
    rules
}

/// What a worker node left behind; empty when it cleaned up after itself.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers(pub Vec<String>);

impl Leftovers {
    /// Everything of a node that should be gone: mounts under its directory, the directory,
    /// processes mentioning it, its cgroups, its network namespace, and sysctls not back to
    /// `sysctls`.
    pub fn of(dir: &Path, netns: &str, cgroup: &str, sysctls: &[(String, String)]) -> Leftovers {
        let mut left = Vec::new();
        for point in mounts_under(dir) {
            left.push(format!("mount {}", point.display()));
        }
        if dir.exists() && std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_none() {
            left.push(format!("directory {}", dir.display()));
        }
        for (pid, line) in processes_mentioning(&dir.display().to_string()) {
            left.push(format!("process {pid}: {line}"));
        }
        for hierarchy in cgroup_hierarchies() {
            let path = hierarchy.join(cgroup);
            if path.exists() {
                left.push(format!("cgroup {}", path.display()));
            }
        }
        if Path::new("/run/netns").join(netns).exists() {
            left.push(format!("network namespace {netns}"));
        }
        for (name, value) in sysctls {
            if let Ok(now) = read_sysctl(name)
                && &now != value
            {
                left.push(format!("sysctl {name} is {now}, was {value}"));
            }
        }
        Leftovers(left)
    }
}
