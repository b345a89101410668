//! The parameters of a request of the node's class (`spec.parameters`, strings), read strictly:
//! an unknown name or an unreadable value fails the request with a message naming it, never a
//! silent default.

use std::collections::BTreeMap;
use std::time::Duration;

/// Plan and report only: hold nothing (`"true"` or `"false"`).
pub const CHECK_CAPACITY: &str = "checkCapacity";
/// Seconds the booking is kept for the Pods at most; shortens the node's `bookingSeconds`.
pub const VALID_UNTIL_SECONDS: &str = "ValidUntilSeconds";
/// A ceiling in USD per hour on each machine, on top of the Pods' and their policies'.
pub const MAX_PRICE_PER_HOUR: &str = "MaxPricePerHour";

/// The virtual node that answers the request: with several nodes serving the class in one
/// cluster, the others leave it alone.
pub const NODE_NAME: &str = "NodeName";

/// Every name the node reads.
pub const KNOWN: [&str; 4] = [
    CHECK_CAPACITY,
    VALID_UNTIL_SECONDS,
    MAX_PRICE_PER_HOUR,
    NODE_NAME,
];

/// The node a request's parameters name, if they name one (read before anything else: a
/// request for another node is not this node's to answer, even to refuse).
pub fn node_name(map: &BTreeMap<String, String>) -> Option<&str> {
    map.get(NODE_NAME).map(String::as_str)
}

/// What the parameters ask for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters {
    /// Plan and report, hold nothing.
    pub check_capacity: bool,
    /// The booking's longest life.
    pub valid_until: Option<Duration>,
    /// The most one machine may cost per hour.
    pub max_price_per_hour: Option<f64>,
}

/// Reads `spec.parameters`; the error names the parameter and its value.
pub fn parse(map: &BTreeMap<String, String>) -> Result<Parameters, String> {
    let mut p = Parameters::default();
    for (name, value) in map {
        let bad = |what: &str| format!("spec.parameters.{name}: {value:?} is not {what}");
        match name.as_str() {
            CHECK_CAPACITY => {
                p.check_capacity = match value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("\"true\" or \"false\"")),
                }
            }
            VALID_UNTIL_SECONDS => match value.parse::<u64>() {
                Ok(s) if s > 0 => p.valid_until = Some(Duration::from_secs(s)),
                _ => return Err(bad("a positive whole number of seconds")),
            },
            MAX_PRICE_PER_HOUR => match value.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => p.max_price_per_hour = Some(v),
                _ => return Err(bad("a positive number of USD per hour")),
            },
            // Read by `node_name`; a node answers only a request that names it.
            NODE_NAME => {}
            _ => {
                return Err(format!(
                    "spec.parameters.{name}: unknown parameter (the class reads {})",
                    KNOWN.join(", ")
                ));
            }
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn known_parameters_are_read() {
        let p = parse(&map(&[
            ("checkCapacity", "true"),
            ("ValidUntilSeconds", "600"),
            ("MaxPricePerHour", "3.00"),
        ]))
        .unwrap();
        assert!(p.check_capacity);
        assert_eq!(p.valid_until, Some(Duration::from_secs(600)));
        assert_eq!(p.max_price_per_hour, Some(3.0));
        assert_eq!(parse(&BTreeMap::new()).unwrap(), Parameters::default());
        let named = map(&[("NodeName", "gpu-burst")]);
        assert_eq!(parse(&named).unwrap(), Parameters::default());
        assert_eq!(node_name(&named), Some("gpu-burst"));
        assert_eq!(node_name(&BTreeMap::new()), None);
    }

    #[test]
    fn unreadable_values_are_refused_by_name() {
        let e = parse(&map(&[("checkCapacity", "yes")])).unwrap_err();
        assert!(e.contains("spec.parameters.checkCapacity: \"yes\""), "{e}");
        let e = parse(&map(&[("ValidUntilSeconds", "0")])).unwrap_err();
        assert!(e.contains("ValidUntilSeconds"), "{e}");
        let e = parse(&map(&[("MaxPricePerHour", "-1")])).unwrap_err();
        assert!(e.contains("MaxPricePerHour"), "{e}");
    }

    #[test]
    fn an_unknown_parameter_is_refused_with_the_known_ones() {
        let e = parse(&map(&[("noRetry", "true")])).unwrap_err();
        assert!(
            e.contains("spec.parameters.noRetry: unknown parameter") && e.contains("checkCapacity"),
            "{e}"
        );
    }
}
