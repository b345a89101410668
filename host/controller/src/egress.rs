//! Where a runner's egress connection goes in the cluster: the Service the Pod named
//! (`cloud.aibrix.ai/egress`), read through the Kubernetes API, and one of its ready endpoints
//! behind the named port, dialled directly. Resolving to an endpoint rather than the
//! Service's clusterIP works wherever the node can reach Pod IPs (as it can from inside the
//! cluster), needs no kube-proxy on the node's own network, and serves headless Services too;
//! it forgoes kube-proxy's session affinity.
//!
//! Not the deciding (the callback dials only what the Pod named) nor the relaying.

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use neocloud_protocol::EgressTarget;
use neocloud_remote::callback::{EgressDialer, SessionIo};
use rand::seq::IndexedRandom;
use tokio::net::TcpStream;

/// Dials a destination's ready endpoint, found through the API server.
pub struct KubeDialer {
    client: Client,
}

impl std::fmt::Debug for KubeDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDialer").finish_non_exhaustive()
    }
}

impl KubeDialer {
    /// A dialer reading Services and EndpointSlices with `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    async fn endpoints(&self, t: &EgressTarget) -> Result<Vec<(String, u16)>, String> {
        let (ns, name) = (&t.namespace, &t.service);
        let services: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let service = services
            .get_opt(name)
            .await
            .map_err(|e| format!("failed to read Service {ns}/{name}: {e}"))?
            .ok_or_else(|| format!("there is no Service {ns}/{name}"))?;
        let port = service_port(&service, t.port)
            .ok_or_else(|| format!("Service {ns}/{name} has no TCP port {}", t.port))?;
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
        let selector = format!("kubernetes.io/service-name={name}");
        let list = slices
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| {
                format!("failed to list the EndpointSlices of Service {ns}/{name}: {e}")
            })?;
        Ok(ready(&list.items, port.name.as_deref()))
    }
}

/// The Service's TCP port `port`.
fn service_port(service: &Service, port: u16) -> Option<&ServicePort> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    ports
        .iter()
        .find(|p| p.port == i32::from(port) && p.protocol.as_deref().unwrap_or("TCP") == "TCP")
}

/// Every ready endpoint address with its port of the slices' port named `name`.
fn ready(slices: &[EndpointSlice], name: Option<&str>) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for slice in slices {
        let port = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == name.unwrap_or("")
                && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        });
        let Some(number) = port
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let conditions = endpoint.conditions.as_ref();
            if conditions.and_then(|c| c.ready) == Some(false) {
                continue;
            }
            let addresses = endpoint.addresses.iter();
            out.extend(addresses.map(|a| (a.clone(), number)));
        }
    }
    out
}

#[async_trait::async_trait]
impl EgressDialer for KubeDialer {
    async fn dial(&self, t: &EgressTarget) -> Result<SessionIo, String> {
        let endpoints = self.endpoints(t).await?;
        let (ip, port) = endpoints.choose(&mut rand::rng()).ok_or_else(|| {
            format!(
                "Service {}/{} has no ready endpoint for port {}",
                t.namespace, t.service, t.port
            )
        })?;
        let socket = TcpStream::connect((ip.as_str(), *port))
            .await
            .map_err(|e| format!("dial tcp {ip}:{port}: {e}"))?;
        Ok(Box::new(socket))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_ready_endpoints_behind_the_named_port_are_candidates() {
        let slices: Vec<EndpointSlice> = serde_json::from_value(json!([
            {"metadata": {"name": "a"}, "addressType": "IPv4",
             "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
             "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                {"addresses": ["10.0.0.3"]}]},
            {"metadata": {"name": "b"}, "addressType": "IPv4",
             "ports": [{"name": "metrics", "port": 9090}],
             "endpoints": [{"addresses": ["10.0.0.4"]}]}
        ]))
        .unwrap();
        assert_eq!(
            ready(&slices, Some("http")),
            [("10.0.0.1".to_owned(), 8080), ("10.0.0.3".to_owned(), 8080)]
        );
        assert!(ready(&slices, None).is_empty());
        let service: Service = serde_json::from_value(json!({"spec": {"ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "http", "port": 80, "targetPort": 8080}]}}))
        .unwrap();
        assert_eq!(
            service_port(&service, 80).and_then(|p| p.name.as_deref()),
            Some("http")
        );
        assert!(
            service_port(&service, 53).is_none(),
            "a UDP port is not carried"
        );
    }
}
