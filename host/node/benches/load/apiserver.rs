//! The API server's own count of the requests it served (`apiserver_request_total`), read from
//! its `/metrics` before and after a phase, so a phase's requests can be reported per verb and
//! resource. The counter has no client label: it counts every client (the load bench's own
//! creates and deletes, the scheduler, the controller manager), so the bench subtracts what it
//! sent itself and reports the rest next to it.

use std::collections::BTreeMap;

use kube::Client;

/// Requests served, by `VERB resource[/subresource]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests(pub BTreeMap<String, f64>);

impl Requests {
    /// The counter as the API server reports it now.
    pub async fn read(client: &Client) -> Requests {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = client
            .request_text(req)
            .await
            .expect("the API server's /metrics (the admin client may read it)");
        Requests::parse(&text)
    }

    /// Sums `apiserver_request_total` samples by verb, resource and subresource. WATCH and
    /// long-running requests are counted once when they start.
    pub fn parse(text: &str) -> Requests {
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split("\",")
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_owned())
                    .unwrap_or_default()
            };
            let (resource, sub) = (label("resource"), label("subresource"));
            if resource.is_empty() {
                continue;
            }
            let key = if sub.is_empty() {
                format!("{} {resource}", label("verb"))
            } else {
                format!("{} {resource}/{sub}", label("verb"))
            };
            *out.entry(key).or_insert(0.0) += value;
        }
        Requests(out)
    }

    /// What was served between `before` and `self`, without `sent` (the bench's own).
    pub fn since(&self, before: &Requests, sent: &[(&str, f64)]) -> Requests {
        let mut out = BTreeMap::new();
        for (k, v) in &self.0 {
            let mut d = v - before.0.get(k).copied().unwrap_or(0.0);
            if let Some((_, own)) = sent.iter().find(|(key, _)| key == k) {
                d -= own;
            }
            if d > 0.0 {
                out.insert(k.clone(), d);
            }
        }
        Requests(out)
    }

    /// All requests.
    pub fn total(&self) -> f64 {
        self.0.values().sum()
    }

    /// `PATCH pods/status 1.00, POST events 2.00, ...` per Pod, largest first.
    pub fn per_pod(&self, pods: usize) -> String {
        let mut v: Vec<_> = self.0.iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(a.1));
        v.iter()
            .filter(|(_, n)| **n / pods as f64 >= 0.01)
            .map(|(k, n)| format!("{k} {:.2}", **n / pods as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
