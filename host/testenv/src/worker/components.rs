//! A worker node's components, each started in its network namespace under supervision:
//! containerd, the kubelet (with a kubeconfig from the control plane's CA) and kube-proxy, and
//! the `kubernetes` Service's endpoint that makes the API server reachable in-cluster.
//!
//! Not the namespace, the network or the cgroups they run in (the parent module), and not
//! their teardown (`teardown`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;

use super::{BIN_ENV, CNI_BIN, PAUSE_IMAGE, WorkerNode};
use crate::process::Supervised;
use crate::{ControlPlane, Error, readiness, write_file};

impl WorkerNode {
    pub(super) async fn start_containerd(
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
    pub(super) fn kubeconfig_as(
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

    pub(super) fn start_kubelet(
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
            // The kubelet renews its Lease every quarter of this (5 s, not the default 10 s):
            // the test control plane's node-monitor grace period is 10 s, so a renewal every 10
            // s let a late one mark the node unreachable for a moment, and a scheduler that ran
            // then sent every Pod elsewhere (the in_cluster trainers all went to the virtual
            // node once in five runs).
            "nodeLeaseDurationSeconds": 20,
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
    pub(super) async fn start_kube_proxy(
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
    pub(super) async fn publish_api_endpoint(&self, cp: &ControlPlane) -> Result<(), Error> {
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
}
