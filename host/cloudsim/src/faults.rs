//! Fault injection: rules that make the next N requests to a route (or every route) fail in a
//! chosen way. Rules come from scenario files (`faults:` in [`crate::SimConfig`]), from the
//! admin HTTP API (`POST /_admin/faults`) or from the Rust API.
//!
//! Not where faults are acted on: the request middleware in `server` applies the generic ones
//! and hands the rest to the provider handlers.

use serde::{Deserialize, Serialize};

/// What goes wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultKind {
    /// The provider's "no capacity" error, even though the market has capacity.
    CapacityExhausted,
    /// 429 with `Retry-After` and the provider's rate-limit body.
    RateLimited {
        /// Seconds in the `Retry-After` header.
        retry_after_secs: u64,
    },
    /// A 5xx with the provider's error body; nothing is created.
    ServerError {
        /// The status code (500..=599).
        status: u16,
    },
    /// The request is carried out (the instance is created) and then the connection is closed
    /// without a response.
    LostResponse,
    /// The request is carried out (the instance is created) and then a 5xx is returned.
    ErrorAfterCreate {
        /// The status code (500..=599).
        status: u16,
    },
    /// The response is delayed.
    Slow {
        /// Delay in milliseconds before the request is handled.
        delay_ms: u64,
    },
    /// The offer being rented disappears from the market just before the rental (Vast: 404/410
    /// `no_such_ask`; RunPod and Lambda: their capacity error).
    OfferVanishes,
    /// The spot bid is treated as below the market (Vast: a stopped instance is created and the
    /// error carries `new_contract`; RunPod GraphQL: an error with HTTP 200).
    BidTooLow,
}

/// A fault and where and how often it applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// `"METHOD /path/{template}"` or `"/path/{template}"` as routed (e.g. `"POST /v2/pods"`,
    /// `"PUT /api/v0/asks/{id}/"`); `None` matches every provider route.
    #[serde(default)]
    pub route: Option<String>,
    /// How many matching requests it applies to; `None` until cleared.
    #[serde(default)]
    pub count: Option<u32>,
    /// What goes wrong.
    pub fault: FaultKind,
}

impl FaultRule {
    /// A rule for the next `count` requests to `route`.
    pub fn next(route: &str, count: u32, fault: FaultKind) -> Self {
        Self {
            route: Some(route.to_string()),
            count: Some(count),
            fault,
        }
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        let Some(route) = &self.route else {
            return true;
        };
        let (want_method, want_path) = match route.split_once(' ') {
            Some((m, p)) => (Some(m), p),
            None => (None, route.as_str()),
        };
        let method_ok = want_method.is_none_or(|m| m.eq_ignore_ascii_case(method));
        method_ok && want_path.trim_end_matches('/') == path.trim_end_matches('/')
    }
}

/// An armed rule with its id and remaining count.
#[derive(Debug, Clone, Serialize)]
pub struct ArmedFault {
    /// Id for listing.
    pub id: u64,
    /// The rule; `count` is what remains.
    #[serde(flatten)]
    pub rule: FaultRule,
    /// How many requests it has hit.
    pub hits: u64,
}

/// The armed faults of one simulator.
#[derive(Debug, Default)]
pub struct Faults {
    next_id: u64,
    armed: Vec<ArmedFault>,
}

impl Faults {
    /// Arms a rule and returns its id.
    pub fn add(&mut self, rule: FaultRule) -> u64 {
        self.next_id += 1;
        self.armed.push(ArmedFault {
            id: self.next_id,
            rule,
            hits: 0,
        });
        self.next_id
    }

    /// Disarms one rule; false if it is not armed (spent or never added).
    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.armed.len();
        self.armed.retain(|a| a.id != id);
        self.armed.len() != before
    }

    /// Disarms everything.
    pub fn clear(&mut self) {
        self.armed.clear();
    }

    /// The armed rules.
    pub fn list(&self) -> Vec<ArmedFault> {
        self.armed.clone()
    }

    /// Takes the first rule matching a request, counting it down.
    pub fn take(&mut self, method: &str, path: &str) -> Option<FaultKind> {
        let index = self
            .armed
            .iter()
            .position(|a| a.rule.matches(method, path))?;
        let armed = &mut self.armed[index];
        armed.hits += 1;
        let fault = armed.rule.fault.clone();
        if let Some(count) = armed.rule.count.as_mut() {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.armed.remove(index);
            }
        }
        Some(fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counted_rule_applies_to_exactly_that_many_matching_requests() {
        let mut faults = Faults::default();
        faults.add(FaultRule::next(
            "POST /v2/pods",
            2,
            FaultKind::CapacityExhausted,
        ));
        assert_eq!(faults.take("GET", "/v2/pods"), None);
        assert_eq!(
            faults.take("POST", "/v2/pods"),
            Some(FaultKind::CapacityExhausted)
        );
        assert_eq!(
            faults.take("post", "/v2/pods/"),
            Some(FaultKind::CapacityExhausted)
        );
        assert_eq!(faults.take("POST", "/v2/pods"), None);
    }

    #[test]
    fn a_rule_without_route_or_count_matches_everything_until_cleared() {
        let mut faults = Faults::default();
        let rule = FaultRule {
            route: None,
            count: None,
            fault: FaultKind::LostResponse,
        };
        faults.add(rule);
        for _ in 0..3 {
            assert_eq!(faults.take("DELETE", "/x"), Some(FaultKind::LostResponse));
        }
        faults.clear();
        assert_eq!(faults.take("DELETE", "/x"), None);
    }

    #[test]
    fn rules_parse_from_yaml_scenarios_and_reject_unknown_fields() {
        let yaml = "route: PUT /api/v0/asks/{id}/\ncount: 1\nfault: {kind: rate_limited, retry_after_secs: 3}\n";
        let rule: FaultRule = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(
            rule.fault,
            FaultKind::RateLimited {
                retry_after_secs: 3
            }
        );
        let bad = "fault: {kind: slow, delay_ms: 5, bogus: 1}\n";
        assert!(serde_yaml::from_str::<FaultRule>(bad).is_err());
    }
}
