//! KWOK (`sigs.k8s.io/kwok`) as the kubelets of a control plane's fake nodes: the remote GPU
//! clusters of the `kube` provider's tests. Built from the Go module proxy by
//! `hack/testenv/build-kwok.sh`.
//!
//! [`Kwok::start`] runs the `kwok` controller against a [`ControlPlane`] with the stages in
//! `kwok-stages.yaml`: it manages only the nodes annotated `kwok.x-k8s.io/node: fake` (made by
//! [`fake_gpu_node`]), makes them Ready and renews their leases, moves the Pods bound to them to
//! Running with a Pod IP, ends a Pod with the exit code a test writes in
//! [`EXIT_CODE_ANNOTATION`], holds a Pod of [`MISSING_IMAGE`] in `ErrImagePull`, and removes Pods marked for deletion. Its server is the nodes' kubelet API (HTTPS, on the port the
//! nodes advertise, at 127.0.0.1): the API server's `pods/log` requests reach it, and it answers
//! them from one container log file in the CRI format ([`Kwok::write_log`]), through the
//! kubelet's own log reader (follow, tail, since and timestamps behave as a kubelet's do).
//! `exec` in any container runs the command on this machine, in kwok's directory (KWOK's local
//! exec: a non-zero exit reaches the caller as an error naming `exit status N`, not as a
//! kubelet's exit code); `port-forward` to [`ECHO_PORT`] echoes, other ports refuse.
//!
//! Dropping it kills the process and removes its directory (`NEOCLOUD_TESTENV_KEEP=1` keeps it).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use serde_json::{Value, json};

use crate::process::Supervised;
use crate::{ControlPlane, Error, binaries, readiness, write_file};

/// The environment variable that overrides where the kwok binary is: the binary itself, or a
/// directory holding `kwok`.
pub const BIN_ENV: &str = "NEOCLOUD_KWOK_BIN";

/// The annotation that hands a node to KWOK, and its value.
pub const NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// On a running Pod: its containers exit with this code (`"0"`, `"3"`), as its workload would.
pub const EXIT_CODE_ANNOTATION: &str = "kwok.neocloud.test/exit-code";

/// The image no Pod can pull: its Pods stay Pending, their container waiting in `ErrImagePull`.
pub const MISSING_IMAGE: &str = "registry.invalid/no-such-image:1";

/// The port of every fake Pod that echoes what it receives (`kubectl port-forward` reaches a
/// `cat` KWOK runs for each connection); no other port answers.
pub const ECHO_PORT: u16 = 7;

/// The stages: what KWOK does to nodes and Pods (see the file's header).
const STAGES: &str = include_str!("kwok-stages.yaml");

/// How long kwok may take to answer `GET /healthz` after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running kwok controller. Dropping it stops the process and removes its directory.
#[derive(Debug)]
pub struct Kwok {
    process: Supervised,
    dir: PathBuf,
    port: u16,
    keep_dir: bool,
}

impl Kwok {
    /// Starts kwok against `control_plane` (as its admin) and waits until its server answers.
    pub async fn start(control_plane: &ControlPlane) -> Result<Self, Error> {
        let bin = locate()?;
        let keep_dir = std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("neocloud-kwok-")
            .tempdir()
            .map_err(|e| Error::io("create the kwok directory", e))?
            .keep();
        let port = readiness::free_port()?;
        let logs = dir.join("container.log");
        write_file(&logs, "")?;
        write_file(&dir.join("stages.yaml"), STAGES)?;
        let debugging = [
            json!({
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterLogs",
                "metadata": {"name": "every-container"},
                "spec": {"logs": [{"logsFile": logs, "follow": true}]},
            }),
            json!({
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterExec",
                "metadata": {"name": "every-container"},
                "spec": {"execs": [{"local": {"workDir": dir}}]},
            }),
            json!({
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterPortForward",
                "metadata": {"name": "echo"},
                "spec": {"forwards": [{"ports": [ECHO_PORT], "command": ["cat"]}]},
            }),
        ];
        let mut yaml = String::new();
        for doc in debugging {
            let text = serde_yaml::to_string(&doc)
                .map_err(|e| Error::io("render the kwok config", std::io::Error::other(e)))?;
            yaml.push_str("---\n");
            yaml.push_str(&text);
        }
        write_file(&dir.join("debugging.yaml"), &yaml)?;
        let (key, value) = NODE_ANNOTATION;
        let args: Vec<String> = vec![
            "--config".into(),
            dir.join("stages.yaml").display().to_string(),
            "--config".into(),
            dir.join("debugging.yaml").display().to_string(),
            "--kubeconfig".into(),
            control_plane.admin_kubeconfig().display().to_string(),
            format!("--manage-nodes-with-annotation-selector={key}={value}"),
            "--node-ip=127.0.0.1".into(),
            format!("--node-port={port}"),
            format!("--server-address=127.0.0.1:{port}"),
            "--cidr=10.20.0.0/16".into(),
            // Renewed every quarter of it (2 s): well inside the control plane's node monitor
            // grace period (10 s), so no node is ever marked NotReady and tainted.
            "--node-lease-duration-seconds=8".into(),
        ];
        let cleanup = (!keep_dir).then_some(dir.as_path());
        let mut process = Supervised::spawn("kwok", &bin, &args, &dir.join("kwok.log"), cleanup)?;
        let ready = readiness::wait_until_ready(&mut process, READY_TIMEOUT, || async move {
            match readiness::http_get(port, "/healthz").await {
                Ok((200, _)) => Ok(()),
                Ok((status, body)) => Err(format!("GET /healthz answered {status}: {body}")),
                Err(e) => Err(e),
            }
        })
        .await;
        let kwok = Self {
            process,
            dir,
            port,
            keep_dir,
        };
        ready.map(|()| kwok)
    }

    /// The port of the nodes' kubelet API (kwok's server), which they advertise.
    pub fn kubelet_port(&self) -> u16 {
        self.port
    }

    /// Appends `line` to every container's log, as the container runtime writes it: a CRI log
    /// line (`<RFC 3339 time> stdout F <line>`) stamped `time`.
    pub fn write_log(&self, time: &str, line: &str) -> Result<(), Error> {
        let path = self.dir.join("container.log");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        writeln!(file, "{time} stdout F {line}")
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    }

    /// The last `lines` lines of kwok's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Kills kwok: the nodes' kubelets are gone (their Pods stay as they were).
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

impl Drop for Kwok {
    fn drop(&mut self) {
        self.process.stop();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Creates node `name` for KWOK to run, with `labels` (such as GPU feature discovery's) and
/// `allocatable` (also its capacity), e.g. `{"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}`.
/// KWOK makes it Ready with its address and kubelet port.
pub async fn fake_gpu_node(
    client: &Client,
    name: &str,
    labels: Value,
    allocatable: Value,
) -> Result<Node, kube::Error> {
    let (key, value) = NODE_ANNOTATION;
    let metadata = json!({"name": name, "labels": labels, "annotations": {key: value}});
    // Created with it: every version of the node KWOK sees carries this allocatable, so its
    // Ready stage writes it back rather than its default (see `create_with_status`).
    let status = json!({"capacity": allocatable, "allocatable": allocatable});
    crate::nodes::create_with_status(client, metadata, status).await
}

/// The kwok binary: `$NEOCLOUD_KWOK_BIN` (the binary or its directory) if set, else `kwok` in
/// the cache directory that `hack/testenv/build-kwok.sh --print` names for the pinned version.
pub fn locate() -> Result<PathBuf, Error> {
    binaries::tool(BIN_ENV, "kwok", "build-kwok.sh", "kwok")
}
