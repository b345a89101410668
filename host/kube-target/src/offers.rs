//! Offers from a remote cluster's free GPUs, priced by its chargeback table: one on-demand offer
//! per GPU product that some single node can still hold the asked count of.
//!
//! Pure. Offer ids are `<cluster>/<product>`, regions the cluster's name.

use std::collections::BTreeMap;

use neocloud_core::{GpuModel, Offer, OfferCapacity, OfferQuery, ProviderId};

use crate::capacity::NodeGpus;
use crate::config::RemoteCluster;

/// The price of one GPU-hour of `product`: the table's entry for that exact label (ignoring
/// case), else the first entry whose name means the same GPU model (`A100` covers every A100).
pub fn price_per_gpu_hour(
    prices: &BTreeMap<String, f64>,
    product: &str,
    memory_gib: Option<u32>,
) -> Option<f64> {
    if let Some((_, p)) = prices.iter().find(|(k, _)| k.eq_ignore_ascii_case(product)) {
        return Some(*p);
    }
    let model = GpuModel::from_provider(product, memory_gib);
    prices
        .iter()
        .find(|(k, _)| {
            GpuModel::accepted_by_name(k)
                .iter()
                .any(|m| m.is_known() && m.accepts(&model))
        })
        .map(|(_, p)| *p)
}

/// The offer id of a product on a cluster.
pub fn offer_id(cluster: &str, product: &str) -> String {
    format!("{cluster}/{product}")
}

/// The cluster and product an offer id names.
pub fn parse_offer_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('/')
        .filter(|(c, p)| !c.is_empty() && !p.is_empty())
}

/// Free GPUs of each product: the most any one node has (a Pod lands on one node), and the
/// memory its label gives.
pub fn largest_free_by_product(free: &[NodeGpus]) -> BTreeMap<&str, (u32, Option<u32>)> {
    let mut out: BTreeMap<&str, (u32, Option<u32>)> = BTreeMap::new();
    for n in free {
        let entry = out.entry(n.product.as_str()).or_insert((0, n.memory_gib));
        if n.free > entry.0 {
            *entry = (n.free, n.memory_gib.or(entry.1));
        }
    }
    out
}

/// The cluster's offers for `query`: for each priced product with a node that has
/// `query.gpu_count` (at least 1) GPUs free, one on-demand offer of that many GPUs.
pub fn offers(cluster: &RemoteCluster, free: &[NodeGpus], query: &OfferQuery) -> Vec<Offer> {
    let wanted = query.gpu_count.max(1);
    largest_free_by_product(free)
        .into_iter()
        .filter(|(_, (most, _))| *most >= wanted)
        .filter_map(|(product, (_, memory_gib))| {
            let per_gpu = price_per_gpu_hour(&cluster.gpu_prices, product, memory_gib)?;
            Some(Offer {
                provider: ProviderId::Kube,
                id: offer_id(&cluster.name, product),
                gpu: GpuModel::from_provider(product, memory_gib),
                gpu_count: wanted,
                price_per_hour: per_gpu * f64::from(wanted) + cluster.surcharge_per_hour,
                capacity: OfferCapacity::OnDemand,
                region: cluster.name.clone(),
                reliability: None,
                verified: true,
                disk_gib: None,
                machine_id: None,
                runpod_cloud: None,
                expires_at: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KubeconfigSource;

    fn cluster(prices: &[(&str, f64)], surcharge: f64) -> RemoteCluster {
        RemoteCluster {
            name: "gpu-west".into(),
            namespace: "burst".into(),
            kubeconfig: KubeconfigSource {
                secret: None,
                key: None,
                path: Some("/k".into()),
            },
            gpu_prices: prices.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            surcharge_per_hour: surcharge,
            allow_insecure_skip_tls_verify: false,
        }
    }

    fn free(node: &str, product: &str, free: u32) -> NodeGpus {
        NodeGpus {
            node: node.into(),
            product: product.into(),
            memory_gib: Some(80),
            free,
        }
    }

    #[test]
    fn prices_match_the_label_exactly_or_by_model() {
        let table: BTreeMap<String, f64> = [
            ("nvidia-a100-sxm4-80gb".to_owned(), 2.0),
            ("H100".to_owned(), 3.0),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            price_per_gpu_hour(&table, "NVIDIA-A100-SXM4-80GB", Some(80)),
            Some(2.0)
        );
        assert_eq!(
            price_per_gpu_hour(&table, "NVIDIA-H100-80GB-HBM3", Some(80)),
            Some(3.0)
        );
        assert_eq!(price_per_gpu_hour(&table, "NVIDIA-L4", Some(24)), None);
    }

    #[test]
    fn one_offer_per_product_that_one_node_can_hold() {
        let c = cluster(&[("NVIDIA-A100-SXM4-80GB", 2.0), ("NVIDIA-L4", 0.5)], 0.25);
        let free = [
            free("n1", "NVIDIA-A100-SXM4-80GB", 1),
            free("n2", "NVIDIA-A100-SXM4-80GB", 2),
            free("n3", "NVIDIA-L4", 1),
            free("n4", "NVIDIA-T4", 8),
        ];
        let query = OfferQuery {
            gpu_count: 2,
            ..OfferQuery::default()
        };
        let offers = offers(&c, &free, &query);
        assert_eq!(offers.len(), 1, "{offers:?}");
        let o = &offers[0];
        assert_eq!(o.id, "gpu-west/NVIDIA-A100-SXM4-80GB");
        assert_eq!(o.region, "gpu-west");
        assert_eq!(o.gpu_count, 2);
        assert!((o.price_per_hour - 4.25).abs() < 1e-9);
        assert!(o.gpu.is_known(), "{:?}", o.gpu);
        assert_eq!(
            parse_offer_id(&o.id),
            Some(("gpu-west", "NVIDIA-A100-SXM4-80GB"))
        );
        assert_eq!(parse_offer_id("nope"), None);
    }
}
