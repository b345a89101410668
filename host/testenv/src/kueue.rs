//! Kueue (`sigs.k8s.io/kueue`) against a test control plane, webhooks included, for tests of
//! queueing, admission and the ProvisioningRequest admission check. Built from the Go module
//! proxy by `hack/testenv/build-kueue.sh`, which also copies Kueue's CRDs, the ProvisioningRequest
//! CRD and Kueue's webhook manifests beside the binary.
//!
//! [`Kueue::start`] installs the CRDs (and waits until they are Established), creates the
//! `kueue-system` namespace and the webhook configurations (each webhook called at
//! `https://127.0.0.1:<port><path>` with the control plane's CA: no Service routing exists
//! here), writes a `config.kueue.x-k8s.io/v1beta2` Configuration (no internal certificate
//! management, no leader election, loopback ports, the [`FRAMEWORKS`] integrations) and runs the
//! manager as the cluster administrator. It returns once the manager is ready and a dry-run
//! create through the API server has reached its webhooks.
//!
//! Run it on a control plane of its own ([`crate::ControlPlane::start`], not the shared one of
//! [`crate::TestContext`]): its webhooks intercept every Job and refuse them (failure policy
//! Fail) once the manager is gone.
//!
//! The manager reads its metrics serving certificate from the fixed path
//! `/etc/kueue/metrics/certs` when internal certificate management is off, so it runs in a
//! mount namespace of its own where a read-only overlay adds that directory to `/etc`. That
//! needs root (as the worker node does); nothing on the machine's `/etc` changes.
//!
//! It is not a production install: no RBAC of Kueue's own, no visibility API server, no
//! MultiKueue clusters, no Pods integration.

mod manifests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::process::Supervised;
use crate::{ControlPlane, Error, binaries, readiness, write_file};
use manifests::{Endpoint, Manifests};

/// The environment variable that overrides where the kueue binary is: the binary itself, or a
/// directory holding `kueue` (and, beside it, the `crds` and `webhook` directories).
pub const BIN_ENV: &str = "NEOCLOUD_KUEUE_BIN";

/// Kueue's namespace (its Configuration's `namespace`).
pub const NAMESPACE: &str = "kueue-system";

/// The job integrations the rig enables. Only their webhooks (and Kueue's own) are installed.
pub const FRAMEWORKS: [&str; 1] = ["batch/job"];

/// The API groups whose webhooks are installed: Kueue's own and those of [`FRAMEWORKS`].
const WEBHOOK_GROUPS: [&str; 2] = ["kueue.x-k8s.io", "batch"];

/// The label that puts a Job in a LocalQueue.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// The `controllerName` of Kueue's built-in ProvisioningRequest admission check.
pub const PROVISIONING_REQUEST_CONTROLLER: &str = "kueue.x-k8s.io/provisioning-request";

/// How long the manager may take to be ready and to answer its webhooks (on two shared cores a
/// cold start has to list every watched kind first).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs "$@" after mounting, over `/etc`, a read-only overlay of the directory $1 on `/etc`
/// (in the private mount namespace `unshare` made for it). The paths are arguments, never text
/// of the script.
const WITH_ETC_OVERLAY: &str =
    r#"etc=$1; shift; mount -t overlay overlay -o "lowerdir=$etc:/etc" /etc && exec "$@""#;

/// A kind of Kueue's API (`kueue.x-k8s.io/v1beta2`): `kind` and its `plural`.
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The ProvisioningRequest kind (`autoscaling.x-k8s.io/v1`).
pub fn provisioning_request_resource() -> ApiResource {
    ApiResource {
        group: "autoscaling.x-k8s.io".into(),
        version: "v1".into(),
        api_version: "autoscaling.x-k8s.io/v1".into(),
        kind: "ProvisioningRequest".into(),
        plural: "provisioningrequests".into(),
    }
}

/// Installs only the ProvisioningRequest CRD (from the same cache as Kueue's binary), for tests
/// that make requests themselves, as any ProvisioningRequest client does, without Kueue.
pub async fn install_provisioning_request_crd(control_plane: &ControlPlane) -> Result<(), Error> {
    let bin = locate()?;
    let files = bin.parent().unwrap_or(Path::new("."));
    let path = files.join("crds/autoscaling.x-k8s.io_provisioningrequests.yaml");
    manifests::install_crd(&control_plane.client().await?, &path).await
}

/// A running Kueue manager. Dropping it stops the process, and its supervisor then removes the
/// manager's directory (kept when the control plane keeps its own); what it installed stays on
/// the control plane.
#[derive(Debug)]
pub struct Kueue {
    process: Supervised,
    log: PathBuf,
}

/// The loopback ports of one manager.
struct Ports {
    webhook: u16,
    metrics: u16,
    health: u16,
}

impl Kueue {
    /// Installs Kueue on `control_plane` and starts its manager; returns once it is ready and
    /// its webhooks answer.
    pub async fn start(control_plane: &ControlPlane) -> Result<Self, Error> {
        let bin = locate()?;
        // Removed on an early return; once the manager runs, its supervisor removes it.
        let workdir = tempfile::Builder::new()
            .prefix("neocloud-kueue-")
            .tempdir()
            .map_err(|e| Error::io("create the kueue directory", e))?;
        let dir = workdir.path().to_owned();
        let ports = Ports {
            webhook: readiness::free_port()?,
            metrics: readiness::free_port()?,
            health: readiness::free_port()?,
        };
        let endpoint = Endpoint {
            port: ports.webhook,
            ca_pem: control_plane.ca_pem(),
        };
        let files = bin.parent().unwrap_or(Path::new("."));
        let manifests = Manifests::read(files, &endpoint, &WEBHOOK_GROUPS)?;
        let client = control_plane.client().await?;
        manifests.install(&client).await?;
        create_namespace(&client).await?;
        write_certs(control_plane, &dir)?;
        let config = dir.join("config.yaml");
        write_file(&config, &configuration(&dir, &ports)?)?;

        let args = unshare_args(&dir, &bin, &config, &control_plane.admin_kubeconfig())?;
        let cleanup = (!control_plane.keep_dir()).then_some(dir.as_path());
        let unshare = Path::new("unshare");
        let log = dir.join("kueue.log");
        let process = Supervised::spawn("kueue", unshare, &args, &log, cleanup)?;
        let _ = workdir.keep();
        let mut kueue = Self { process, log };
        kueue.wait_ready(&client, ports.health).await?;
        Ok(kueue)
    }

    /// Waits until `/readyz` answers 200 and a dry-run create of a ResourceFlavor has passed
    /// Kueue's webhooks (the API server reached them over TLS).
    async fn wait_ready(&mut self, client: &Client, health: u16) -> Result<(), Error> {
        let flavors: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &resource("ResourceFlavor", "resourceflavors"),
        );
        let probe = DynamicObject::new(
            "neocloud-testenv-webhook-probe",
            &resource("ResourceFlavor", "resourceflavors"),
        );
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        readiness::wait_until_ready(&mut self.process, READY_TIMEOUT, || {
            let (flavors, probe, dry_run) = (flavors.clone(), probe.clone(), dry_run.clone());
            async move {
                match readiness::http_get(health, "/readyz").await? {
                    (200, _) => {}
                    (status, body) => return Err(format!("GET /readyz answered {status}: {body}")),
                }
                match flavors.create(&dry_run, &probe).await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!("a dry-run ResourceFlavor create failed: {e}")),
                }
            }
        })
        .await
    }

    /// The manager's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the manager's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// The arguments of `unshare` that run the manager `bin` with `config` and `kubeconfig` in a
/// mount namespace of its own, `<dir>/etc` overlaid on `/etc`.
fn unshare_args(
    dir: &Path,
    bin: &Path,
    config: &Path,
    kubeconfig: &Path,
) -> Result<Vec<String>, Error> {
    let mut args: Vec<String> = ["--mount", "--propagation", "private", "--", "sh", "-c"]
        .map(String::from)
        .into();
    args.push(WITH_ETC_OVERLAY.into());
    args.push("kueue-etc-overlay".into());
    args.push(path_arg(&dir.join("etc"))?);
    args.push(path_arg(bin)?);
    args.push(format!("--config={}", path_arg(config)?));
    args.push(format!("--kubeconfig={}", path_arg(kubeconfig)?));
    Ok(args)
}

/// Kueue's Configuration: webhooks served from `<dir>/webhook-certs` on loopback, metrics and
/// probes on loopback, no leader election, no internal certificate management, the
/// [`FRAMEWORKS`] integrations, no visibility API server.
fn configuration(dir: &Path, ports: &Ports) -> Result<String, Error> {
    let config = json!({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{}", ports.health)},
        "metrics": {"bindAddress": format!("127.0.0.1:{}", ports.metrics)},
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": dir.join("webhook-certs")},
        "leaderElection": {"leaderElect": false},
        "internalCertManagement": {"enable": false},
        "manageJobsWithoutQueueName": false,
        "integrations": {"frameworks": FRAMEWORKS},
        // An aggregated API server of its own (port 8082 by default) that no test uses.
        "featureGates": {"VisibilityOnDemand": false},
    });
    serde_yaml::to_string(&config)
        .map_err(|e| Error::io("render the kueue configuration", std::io::Error::other(e)))
}

/// The webhook serving certificate (for 127.0.0.1, from the control plane's CA) in
/// `<dir>/webhook-certs`, and the metrics one where the overlay puts it at
/// `/etc/kueue/metrics/certs`.
fn write_certs(control_plane: &ControlPlane, dir: &Path) -> Result<(), Error> {
    for (certs, name) in [
        (dir.join("webhook-certs"), "kueue-webhook"),
        (dir.join("etc/kueue/metrics/certs"), "kueue-metrics"),
    ] {
        std::fs::create_dir_all(&certs)
            .map_err(|e| Error::io(format!("create {}", certs.display()), e))?;
        let pair = control_plane.pki().serving(name)?;
        write_file(&certs.join("tls.crt"), &pair.cert_pem)?;
        write_file(&certs.join("tls.key"), &pair.key_pem)?;
    }
    Ok(())
}

/// Creates (or keeps) the `kueue-system` namespace.
async fn create_namespace(client: &Client) -> Result<(), Error> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))
        .map_err(kube::Error::SerdeError)?;
    let params = PatchParams::apply("neocloud-testenv").force();
    Api::<Namespace>::all(client.clone())
        .patch(NAMESPACE, &params, &Patch::Apply(&namespace))
        .await?;
    Ok(())
}

/// `path` as an argument; refuses a path that is not UTF-8 or that would split the overlay's
/// `lowerdir` list (`:` and `,` separate its entries).
fn path_arg(path: &Path) -> Result<String, Error> {
    match path.to_str() {
        Some(p) if !p.contains([':', ',']) => Ok(p.to_owned()),
        _ => Err(Error::io(
            "pass a path to kueue",
            std::io::Error::other(format!("unusable path {}", path.display())),
        )),
    }
}

/// The kueue binary: `$NEOCLOUD_KUEUE_BIN` (the binary or its directory) if set, else `kueue` in
/// the cache directory that `hack/testenv/build-kueue.sh --print` names for the pinned version.
pub fn locate() -> Result<PathBuf, Error> {
    binaries::tool(BIN_ENV, "kueue", "build-kueue.sh", "kueue")
}
