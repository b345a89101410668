//! How each component is started: its certificates, kubeconfig, flags and readiness probe.
//! The flags follow what kwok, controller-runtime's envtest and Kubernetes' own integration
//! framework use, with authorization `Node,RBAC` and the `NodeRestriction` admission plugin so
//! that a virtual node is tested with a real kubelet's permissions.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use crate::control_plane::{ControlPlane, Options, Ports};
use crate::kubeconfig;
use crate::pki::{self, CertPair};
use crate::process::Supervised;
use crate::readiness::{http_get, wait_until_ready};
use crate::{Error, write_file};

const APISERVER_TIMEOUT: Duration = Duration::from_secs(180);
const COMPONENT_TIMEOUT: Duration = Duration::from_secs(90);

/// The user of the API server's client certificate for kubelets (in `system:masters`).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

impl ControlPlane {
    pub(crate) fn write_pki(&self) -> Result<(), Error> {
        let dir = self.dir().join("pki");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        write_file(&dir.join("ca.crt"), &self.pki().ca_pem())?;
        let (sa_key, sa_pub) = pki::service_account_key()?;
        write_file(&dir.join("sa.key"), &sa_key)?;
        write_file(&dir.join("sa.pub"), &sa_pub)?;
        self.write_cert("apiserver", &self.pki().serving("kube-apiserver")?)?;
        self.write_cert(
            "admin",
            &self
                .pki()
                .client("neocloud-testenv-admin", &["system:masters"])?,
        )?;
        self.write_cert(
            "front-proxy-client",
            &self.pki().client("front-proxy-client", &[])?,
        )?;
        // How the API server authenticates to kubelets (`kubectl logs`, exec, port-forward), as
        // kubeadm's apiserver-kubelet-client: a kubelet authorizes it for nodes/proxy.
        self.write_cert(
            "apiserver-kubelet-client",
            &self
                .pki()
                .client(KUBELET_CLIENT_USER, &["system:masters"])?,
        )?;
        let admin = self.cert_paths("admin");
        kubeconfig::write(
            &self.admin_kubeconfig(),
            &self.spec_for(self.api_url(), Some(admin)),
        )?;
        Ok(())
    }

    /// Writes `<name>.crt` and `<name>.key` under `pki/` and returns their paths.
    pub(crate) fn write_cert(
        &self,
        name: &str,
        pair: &CertPair,
    ) -> Result<(PathBuf, PathBuf), Error> {
        let (crt, key) = self.cert_paths(name);
        write_file(&crt, &pair.cert_pem)?;
        write_file(&key, &pair.key_pem)?;
        Ok((crt, key))
    }

    fn cert_paths(&self, name: &str) -> (PathBuf, PathBuf) {
        let dir = self.dir().join("pki");
        (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        )
    }

    pub(crate) async fn start_etcd(&self, bin: &Path, ports: &Ports) -> Result<(), Error> {
        let data = self.dir().join("etcd");
        let client = format!("http://127.0.0.1:{}", ports.etcd_client);
        let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let args = [
            "--name=testenv".to_owned(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=testenv={peer}"),
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        // etcd is the first component up and the last one needed: once it has stopped, its
        // supervisor removes the whole working directory (keys, kubeconfigs, logs, data).
        let cleanup = (!self.keep_dir()).then_some(self.dir());
        let mut etcd = self.spawn(bin, "etcd", &args, cleanup)?;
        let port = ports.etcd_client;
        wait_until_ready(&mut etcd, COMPONENT_TIMEOUT, || async move {
            match http_get(port, "/health").await? {
                (200, body) if body.contains("\"health\":\"true\"") => Ok(()),
                (status, body) => Err(format!("/health answered {status}: {body}")),
            }
        })
        .await?;
        self.adopt(etcd);
        Ok(())
    }

    pub(crate) async fn start_apiserver(
        &self,
        bin: &Path,
        ports: &Ports,
        options: &Options,
    ) -> Result<(), Error> {
        let pki = self.dir().join("pki");
        let p = |f: &str| pki.join(f).display().to_string();
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", ports.apiserver),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--allow-privileged=true".to_owned(),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            "--endpoint-reconciler-type=none".to_owned(),
            "--profiling=false".to_owned(),
            format!("--requestheader-client-ca-file={}", p("ca.crt")),
            "--requestheader-allowed-names=front-proxy-client".to_owned(),
            "--requestheader-username-headers=X-Remote-User".to_owned(),
            "--requestheader-group-headers=X-Remote-Group".to_owned(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
            format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
            format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
            format!(
                "--kubelet-client-certificate={}",
                p("apiserver-kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
            // Virtual nodes in tests serve their kubelet API on 127.0.0.1, their InternalIP.
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
        ];
        args.extend(options.extra_apiserver_args.iter().cloned());
        let mut apiserver = self.spawn(bin, "kube-apiserver", &args, None)?;
        let client = self.client().await?;
        wait_until_ready(&mut apiserver, APISERVER_TIMEOUT, || {
            let client = client.clone();
            async move { apiserver_ready(client).await }
        })
        .await?;
        self.adopt(apiserver);
        Ok(())
    }

    pub(crate) async fn start_scheduler(&self, bin: &Path, ports: &Ports) -> Result<(), Error> {
        let args =
            self.component_args("kube-scheduler", "system:kube-scheduler", ports.scheduler)?;
        let args = [args, vec!["--leader-elect=false".to_owned()]].concat();
        let mut scheduler = self.spawn(bin, "kube-scheduler", &args, None)?;
        self.wait_healthz(&mut scheduler, ports.scheduler).await?;
        self.adopt(scheduler);
        Ok(())
    }

    pub(crate) async fn start_controller_manager(
        &self,
        bin: &Path,
        ports: &Ports,
        options: &Options,
    ) -> Result<(), Error> {
        let name = "kube-controller-manager";
        let mut args = self.component_args(
            name,
            "system:kube-controller-manager",
            ports.controller_manager,
        )?;
        let pki = self.dir().join("pki");
        args.extend([
            "--leader-elect=false".to_owned(),
            // Each controller acts as its own ServiceAccount with its bootstrap role, as in
            // kubeadm clusters; the controller manager's own identity may only mint their tokens.
            "--use-service-account-credentials=true".to_owned(),
            format!("--root-ca-file={}", pki.join("ca.crt").display()),
            format!(
                "--service-account-private-key-file={}",
                pki.join("sa.key").display()
            ),
            "--node-monitor-period=1s".to_owned(),
            format!(
                "--node-monitor-grace-period={}s",
                options.node_monitor_grace_period.as_secs()
            ),
        ]);
        let mut kcm = self.spawn(bin, name, &args, None)?;
        self.wait_healthz(&mut kcm, ports.controller_manager)
            .await?;
        self.adopt(kcm);
        Ok(())
    }

    /// The flags the scheduler and the controller manager share: their own client identity,
    /// delegated authentication and authorization, and a serving certificate from our CA.
    fn component_args(&self, name: &str, user: &str, port: u16) -> Result<Vec<String>, Error> {
        let client = self.write_cert(&format!("{name}-client"), &self.pki().client(user, &[])?)?;
        let (crt, key) = self.write_cert(&format!("{name}-serving"), &self.pki().serving(name)?)?;
        let kc = self.dir().join(format!("{name}.kubeconfig"));
        kubeconfig::write(&kc, &self.spec_for(self.api_url(), Some(client)))?;
        let kc = kc.display().to_string();
        Ok(vec![
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_owned(),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", crt.display()),
            format!("--tls-private-key-file={}", key.display()),
        ])
    }

    async fn wait_healthz(&self, component: &mut Supervised, port: u16) -> Result<(), Error> {
        let kc = self
            .dir()
            .join(format!("{}-probe.kubeconfig", component.name()));
        kubeconfig::write(
            &kc,
            &self.spec_for(&format!("https://127.0.0.1:{port}"), None),
        )?;
        let client = kubeconfig::client(&kc).await?;
        wait_until_ready(component, COMPONENT_TIMEOUT, || {
            let client = client.clone();
            async move {
                let req = http::Request::get("/healthz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                match client.request_text(req).await {
                    Ok(body) if body.trim() == "ok" => Ok(()),
                    Ok(body) => Err(format!("/healthz answered {body}")),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
    }

    fn spawn(
        &self,
        bin: &Path,
        name: &str,
        args: &[String],
        cleanup: Option<&Path>,
    ) -> Result<Supervised, Error> {
        let log = self.dir().join("logs").join(format!("{name}.log"));
        Supervised::spawn(name, &bin.join(name), args, &log, cleanup)
    }
}

/// Ready means `/readyz` says ok and the `default` namespace exists, as Kubernetes' own test
/// server checks.
async fn apiserver_ready(client: kube::Client) -> Result<(), String> {
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let body = client
        .request_text(req)
        .await
        .map_err(|e| format!("/readyz: {e}"))?;
    if body.trim() != "ok" {
        return Err(format!("/readyz answered {body}"));
    }
    Api::<Namespace>::all(client)
        .get("default")
        .await
        .map(|_| ())
        .map_err(|e| format!("namespace default: {e}"))
}
