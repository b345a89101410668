//! The `cloud.aibrix.ai/egress` annotation: the in-cluster destinations a Pod's workload may
//! reach, `name.namespace:port` each, comma-separated. Parsed strictly: every entry must be a
//! DNS-1035 Service name, a DNS-1123 namespace and a port 1-65535, at most
//! [`MAX_EGRESS_DESTINATIONS`] of them, none twice; a bad entry refuses the Pod naming it.
//!
//! Not for deciding whether the Pod may have egress (the node: only Pods its runner runs) nor
//! whether a policy allows a destination (the node's policies).

use std::collections::BTreeMap;
use std::fmt;

use super::ANNOTATION_PREFIX;

/// The annotation's name after the prefix.
pub const EGRESS_ANNOTATION: &str = "egress";

/// The most destinations one Pod may name.
pub const MAX_EGRESS_DESTINATIONS: usize = 32;

/// One destination: port `port` of Service `service` in `namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressDestination {
    /// The Service's name (DNS-1035 label).
    pub service: String,
    /// Its namespace (DNS-1123 label).
    pub namespace: String,
    /// The Service's port.
    pub port: u16,
}

impl fmt::Display for EgressDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}:{}", self.service, self.namespace, self.port)
    }
}

/// Parses the annotation's value, or says which entry is wrong and why.
pub fn parse_egress(value: &str) -> Result<Vec<EgressDestination>, String> {
    let entries: Vec<&str> = value.split(',').map(str::trim).collect();
    if entries.len() > MAX_EGRESS_DESTINATIONS {
        return Err(format!(
            "{} destinations are named; at most {MAX_EGRESS_DESTINATIONS} are allowed",
            entries.len()
        ));
    }
    let mut out: Vec<EgressDestination> = Vec::with_capacity(entries.len());
    for entry in entries {
        let destination = parse_entry(entry).map_err(|why| format!("entry {entry:?}: {why}"))?;
        if out.contains(&destination) {
            return Err(format!("entry {entry:?} is named twice"));
        }
        out.push(destination);
    }
    Ok(out)
}

fn parse_entry(entry: &str) -> Result<EgressDestination, String> {
    let shape = "is not name.namespace:port";
    let (host, port) = entry.rsplit_once(':').ok_or(shape)?;
    let (service, namespace) = host.split_once('.').ok_or(shape)?;
    if !is_dns_label(service) || !service.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(format!(
            "{service:?} is not a Service name (a DNS-1035 label: lower-case letters, digits \
             and '-', starting with a letter, at most 63)"
        ));
    }
    if !is_dns_label(namespace) {
        return Err(format!(
            "{namespace:?} is not a namespace (a DNS-1123 label: lower-case letters, digits \
             and '-', at most 63)"
        ));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{port:?} is not a port (1-65535)"))?;
    Ok(EgressDestination {
        service: service.to_owned(),
        namespace: namespace.to_owned(),
        port,
    })
}

/// Whether `s` is an RFC 1123 label: lower-case alphanumerics and `-`, at most 63, starting and
/// ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The destinations `pod` names (none when it has no annotation, or an unparsable one, which
/// [`translate_pod`](super::translate_pod) refuses).
pub fn egress(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<EgressDestination> {
    egress_value(pod.metadata.annotations.as_ref())
        .and_then(|v| parse_egress(v).ok())
        .unwrap_or_default()
}

fn egress_value(annotations: Option<&BTreeMap<String, String>>) -> Option<&String> {
    annotations?.get(&format!("{ANNOTATION_PREFIX}{EGRESS_ANNOTATION}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_service_ports_is_parsed_in_order() {
        let got = parse_egress("registry.ml:8080, kv-index.cache:6379").unwrap();
        let names: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["registry.ml:8080", "kv-index.cache:6379"]);
    }

    #[test]
    fn each_bad_entry_is_named_with_why() {
        let cases = [
            (
                "registry.ml",
                "entry \"registry.ml\": is not name.namespace:port",
            ),
            (
                "registry:80",
                "entry \"registry:80\": is not name.namespace:port",
            ),
            ("Registry.ml:80", "\"Registry\" is not a Service name"),
            ("1reg.ml:80", "\"1reg\" is not a Service name"),
            ("reg.ml.svc:80", "\"ml.svc\" is not a namespace"),
            ("reg.-ml:80", "\"-ml\" is not a namespace"),
            ("reg.ml:0", "\"0\" is not a port (1-65535)"),
            ("reg.ml:65536", "\"65536\" is not a port (1-65535)"),
            ("reg.ml:http", "\"http\" is not a port (1-65535)"),
            ("a.b:1,,c.d:2", "entry \"\": is not name.namespace:port"),
            ("a.b:1, a.b:1", "entry \"a.b:1\" is named twice"),
            ("", "entry \"\": is not name.namespace:port"),
        ];
        for (value, want) in cases {
            let err = parse_egress(value).expect_err(value);
            assert!(err.contains(want), "{value}: {err}");
        }
    }

    #[test]
    fn more_than_the_bound_is_refused_with_the_bound_named() {
        let many: Vec<String> = (1..=33).map(|p| format!("s.n:{p}")).collect();
        let err = parse_egress(&many.join(",")).unwrap_err();
        assert_eq!(err, "33 destinations are named; at most 32 are allowed");
        assert_eq!(parse_egress(&many[..32].join(",")).unwrap().len(), 32);
    }
}
