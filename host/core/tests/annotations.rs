//! Every `cloud.aibrix.ai/*` annotation with valid and invalid values, and exact messages.

mod common;

use common::pod_with_annotation;
use neocloud_core::{
    CapacityType, GpuModel, ProviderId, RunpodCloudType, WorkloadSpec, translate_pod,
};

fn accepted(name: &str, value: &str) -> WorkloadSpec {
    translate_pod(&pod_with_annotation(name, value))
        .unwrap_or_else(|e| panic!("{name}={value:?} should be accepted: {e}"))
}

fn refusal(name: &str, value: &str) -> String {
    let err = translate_pod(&pod_with_annotation(name, value)).expect_err("should be refused");
    assert_eq!(err.refusals.len(), 1, "{err}");
    err.refusals[0].to_string()
}

fn field(name: &str) -> String {
    format!("metadata.annotations[cloud.aibrix.ai/{name}]")
}

#[test]
fn valid_annotations_are_parsed_into_the_workload() {
    let known = |n: &str, m: u32| GpuModel::Known {
        name: n.to_owned(),
        memory_gib: m,
    };
    let w = accepted("gpu-type", "NVIDIA A40, RTX 4090");
    assert_eq!(
        w.gpu.accepted,
        vec![known("A40", 48), known("RTX 4090", 24)]
    );
    assert_eq!(accepted("max-price", "1.25").max_price_per_hour, Some(1.25));
    assert_eq!(
        accepted("capacity-type", "spot").capacity_type,
        CapacityType::Spot
    );
    assert_eq!(
        accepted("capacity-type", "any").capacity_type,
        CapacityType::Any
    );
    assert_eq!(
        accepted("capacity-type", "on-demand").capacity_type,
        CapacityType::OnDemand
    );
    assert_eq!(
        accepted("regions", "us-east-1, US-KS-2").regions,
        vec!["us-east-1", "US-KS-2"]
    );
    assert_eq!(
        accepted("providers", "vast,runpod").providers,
        vec![ProviderId::Vast, ProviderId::Runpod]
    );
    let expr = "offer.price_per_hour <= 2.0";
    assert_eq!(
        accepted("constraints", expr).constraint.as_deref(),
        Some(expr)
    );
    assert_eq!(
        accepted("rank", "-offer.price_per_hour").rank.as_deref(),
        Some("-offer.price_per_hour")
    );
    assert_eq!(
        accepted("policy", "cheap-first.v1").policy.as_deref(),
        Some("cheap-first.v1")
    );
    assert_eq!(accepted("disk-gb", "80").disk_gib, Some(80));
    assert!(!accepted("vast-verified", "false").hints.vast.verified);
    assert_eq!(
        accepted("vast-machine-id", "4242").hints.vast.machine_id,
        Some(4242)
    );
    assert_eq!(accepted("vast-disk-gb", "50").hints.vast.disk_gib, 50);
    assert_eq!(
        accepted("vast-offer-id", "1234567").hints.vast.offer_id,
        Some(1234567)
    );
    assert_eq!(
        accepted("runpod-cloud-type", "COMMUNITY")
            .hints
            .runpod_cloud_type,
        Some(RunpodCloudType::Community)
    );
    assert_eq!(
        accepted("runpod-cloud-type", "secure")
            .hints
            .runpod_cloud_type,
        Some(RunpodCloudType::Secure)
    );
    assert!(accepted("runner", "false").hints.no_runner);
    assert!(!accepted("runner", "true").hints.no_runner);
}

#[test]
fn a_workload_without_annotations_gets_the_specification_defaults() {
    let w = translate_pod(&common::to_pod(common::minimal_pod())).unwrap();
    assert_eq!(w.capacity_type, CapacityType::OnDemand);
    assert!(w.hints.vast.verified);
    assert_eq!(w.hints.vast.disk_gib, 20);
    assert_eq!(w.hints.vast.min_reliability, 0.95);
    assert_eq!(w.max_price_per_hour, None);
    assert!(w.gpu.accepted.is_empty() && w.providers.is_empty() && w.regions.is_empty());
}

#[test]
fn an_unknown_gpu_type_is_kept_verbatim_and_reported() {
    let w = accepted("gpu-type", "MI300X");
    assert_eq!(w.gpu.unknown_names(), vec!["MI300X"]);
}

#[test]
fn invalid_annotation_values_are_refused_with_the_field_and_value() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "gpu-type",
            "",
            "\"\" is not a comma-separated list of GPU models",
        ),
        (
            "gpu-type",
            "A40,,A10",
            "\"A40,,A10\" is not a comma-separated list of GPU models",
        ),
        (
            "max-price",
            "cheap",
            "\"cheap\" is not a positive price in USD per hour",
        ),
        (
            "max-price",
            "-1",
            "\"-1\" is not a positive price in USD per hour",
        ),
        (
            "max-price",
            "0",
            "\"0\" is not a positive price in USD per hour",
        ),
        (
            "max-price",
            "NaN",
            "\"NaN\" is not a positive price in USD per hour",
        ),
        (
            "max-price",
            "inf",
            "\"inf\" is not a positive price in USD per hour",
        ),
        ("runner", "off", "\"off\" is not true or false"),
        (
            "capacity-type",
            "cheap",
            "\"cheap\" is not one of on-demand, spot, any",
        ),
        (
            "capacity-type",
            "Spot",
            "\"Spot\" is not one of on-demand, spot, any",
        ),
        (
            "regions",
            "us east",
            "\"us east\" is not a comma-separated list of regions",
        ),
        (
            "regions",
            "us-east-1,",
            "\"us-east-1,\" is not a comma-separated list of regions",
        ),
        (
            "providers",
            "aws",
            "\"aws\" is not a known provider (expected one of runpod, lambda, vast, kube, fake)",
        ),
        ("providers", "vast,vast", "\"vast,vast\" names vast twice"),
        (
            "providers",
            "",
            "\"\" is not a comma-separated list of providers",
        ),
        ("constraints", " ", "an empty expression is not allowed"),
        ("rank", "", "an empty expression is not allowed"),
        (
            "policy",
            "Bad_Name",
            "\"Bad_Name\" is not a valid policy name (a DNS-1123 subdomain)",
        ),
        (
            "policy",
            "-x",
            "\"-x\" is not a valid policy name (a DNS-1123 subdomain)",
        ),
        (
            "disk-gb",
            "ten",
            "\"ten\" is not a positive whole number of GiB",
        ),
        (
            "disk-gb",
            "0",
            "\"0\" is not a positive whole number of GiB",
        ),
        (
            "disk-gb",
            "1.5",
            "\"1.5\" is not a positive whole number of GiB",
        ),
        ("vast-verified", "yes", "\"yes\" is not true or false"),
        (
            "vast-machine-id",
            "m-1",
            "\"m-1\" is not a machine id (a whole number)",
        ),
        (
            "vast-disk-gb",
            "-20",
            "\"-20\" is not a positive whole number of GiB",
        ),
        (
            "vast-offer-id",
            "abc",
            "\"abc\" is not an offer id (a whole number)",
        ),
        (
            "runpod-cloud-type",
            "cheap",
            "\"cheap\" is not one of SECURE, COMMUNITY, ALL",
        ),
    ];
    for (name, value, reason) in cases {
        assert_eq!(
            refusal(name, value),
            format!("{}: {reason}", field(name)),
            "{name}={value:?}"
        );
    }
}

#[test]
fn an_expression_longer_than_the_limit_is_refused() {
    let long = "1 < 2 && ".repeat(500) + "true";
    let expected = format!(
        "{}: the expression is {} bytes long; at most 4096 are allowed",
        field("constraints"),
        long.len()
    );
    assert_eq!(refusal("constraints", &long), expected);
}

#[test]
fn an_unknown_annotation_under_the_prefix_is_refused_so_typos_are_not_ignored() {
    let message = refusal("max-prize", "1.0");
    assert!(
        message.starts_with(&format!(
            "{}: unknown annotation; known ones are gpu-type, max-price",
            field("max-prize")
        )),
        "{message}"
    );
}

#[test]
fn annotations_outside_the_prefix_are_ignored() {
    let mut pod = common::minimal_pod();
    pod["metadata"]["annotations"] = serde_json::json!({"example.com/anything": "x"});
    assert!(translate_pod(&common::to_pod(pod)).is_ok());
}

#[test]
fn egress_names_destinations_and_a_bad_entry_refuses_the_pod_naming_it() {
    let pod = pod_with_annotation("egress", "registry.ml:8080,kv.cache:6379");
    translate_pod(&pod).expect("accepted");
    let named: Vec<String> = neocloud_core::translate::egress(&pod)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(named, ["registry.ml:8080", "kv.cache:6379"]);
    assert_eq!(
        refusal("egress", "registry.ml:8080, registry:80"),
        format!(
            "{}: entry \"registry:80\": is not name.namespace:port",
            field("egress")
        )
    );
}
