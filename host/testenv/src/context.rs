//! The per-test entry point: one control plane per test binary, a fresh namespace and a client
//! per test, and the components' logs printed when the test fails.

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::control_plane::{ControlPlane, Options};

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control plane shared by every test of this test binary, started on first use. Panics with
/// the failing component's log if it cannot start.
pub fn shared() -> &'static ControlPlane {
    let started = SHARED.get_or_init(|| {
        // Start on a thread with its own runtime: the caller may be inside any runtime, and the
        // control plane must not depend on a test's runtime staying alive.
        std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("failed to build a tokio runtime: {e}"))?;
            rt.block_on(start_with_fresh_ports())
        })
        .join()
        .unwrap_or_else(|_| Err("the control plane start-up thread panicked".to_owned()))
    });
    match started {
        Ok(cp) => cp,
        Err(e) => panic!("{e}"),
    }
}

/// What one test needs: the shared control plane, an admin client bound to the test's runtime,
/// and a namespace of its own. When the test panics, dropping it prints every component's log.
pub struct TestContext {
    /// The shared control plane.
    pub control_plane: &'static ControlPlane,
    /// A cluster-admin client for this test's runtime.
    pub client: Client,
    /// A namespace created for this test, with its `default` ServiceAccount in place.
    pub namespace: String,
}

impl TestContext {
    /// Starts the shared control plane if needed and creates a namespace named after `test`.
    pub async fn new(test: &str) -> Self {
        let control_plane = shared();
        let client = control_plane.client().await.expect("admin client");
        let namespace = unique_name(test);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("failed to create namespace {namespace}: {e}"));
        let ctx = Self {
            control_plane,
            client,
            namespace,
        };
        ctx.wait_for_default_service_account().await;
        ctx
    }

    /// An `Api` for a namespaced kind in this test's namespace.
    pub fn namespaced<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Pods are refused until the controller manager has created the namespace's `default`
    /// ServiceAccount, so wait for it (a minute: a controller manager that started beside a
    /// Rust build on two cores has taken more than 30 s to elect itself and sync).
    async fn wait_for_default_service_account(&self) {
        let sas: Api<ServiceAccount> = self.namespaced();
        for _ in 0..600 {
            if sas.get_opt("default").await.ok().flatten().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no default service account in {} after 60s", self.namespace);
    }
}

impl std::fmt::Debug for TestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestContext")
            .field("api_url", &self.control_plane.api_url())
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Drop for TestContext {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "\n===== control plane logs for failed test (namespace {}) =====\n{}",
                self.namespace,
                self.control_plane.logs(60)
            );
        }
    }
}

/// `<test>-<random>` cut to a valid DNS label.
pub(crate) fn unique_name(test: &str) -> String {
    let mut base: String = test
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(50);
    let base = base.trim_matches('-');
    let suffix: u32 = rand::random::<u32>() % 1_000_000;
    format!("{base}-{suffix:06}")
}

/// Starts the control plane, again with new ports when a component lost its port to another
/// process between the moment it was found free and the moment the component bound it (the
/// machine runs other servers and tests that pick free ports too): at most three times.
async fn start_with_fresh_ports() -> Result<ControlPlane, String> {
    let mut tries = 0;
    loop {
        tries += 1;
        match ControlPlane::start(Options::default()).await {
            Ok(cp) => return Ok(cp),
            Err(e) => {
                let message = e.to_string();
                if tries >= 3 || !message.contains("address already in use") {
                    return Err(message);
                }
                eprintln!(
                    "control plane: a port was taken while starting; trying again with new ports ({tries} of 3)"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_valid_dns_labels() {
        let name =
            unique_name("Scheduler_binds::A_Tolerating_Pod_to_the_tainted_node_and_more_words");
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert!(!name.starts_with('-') && !name.ends_with('-'), "{name}");
        assert_ne!(unique_name("x"), unique_name("x"));
    }
}
