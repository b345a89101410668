//! Installing the node's CustomResourceDefinitions (the types are `neocloud-api`'s) on the API
//! server, and waiting until each is Established so objects of its kind can be created at once.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Applies every CRD (server-side, as `field_manager`) and waits until each is Established, so
/// objects of its kind can be created at once. Fails after `timeout`.
pub async fn install(
    client: &kube::Client,
    field_manager: &str,
    timeout: std::time::Duration,
) -> Result<(), kube::Error> {
    use kube::ResourceExt;
    use kube::api::{Api, Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(field_manager).force();
    let deadline = tokio::time::Instant::now() + timeout;
    for crd in neocloud_api::all() {
        let name = crd.name_any();
        crds.patch(&name, &pp, &Patch::Apply(&crd)).await?;
        loop {
            let got = crds.get(&name).await?;
            let conds = got.status.and_then(|s| s.conditions).unwrap_or_default();
            if conds
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(kube::Error::Service(
                    format!("CRD {name} was not Established within {timeout:?}").into(),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
