//! A BurstPolicy's `spec.egress`: the patterns (`service.namespace:port`, each part `*` or a
//! value) that the destinations of `cloud.aibrix.ai/egress` must match for Pods in the
//! namespaces the policy governs. Checked when the policy loads (a bad pattern is a load error
//! naming it) and matched when a Pod is admitted.
//!
//! Not the parsing of the Pod's annotation (`neocloud_core::translate::egress`).

use neocloud_core::translate::EgressDestination;

use neocloud_api::{EgressRules, PolicyError};

/// One part of a pattern: anything, or exactly this.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part<T> {
    Any,
    Is(T),
}

impl<T: PartialEq> Part<T> {
    fn matches(&self, value: &T) -> bool {
        match self {
            Part::Any => true,
            Part::Is(v) => v == value,
        }
    }
}

/// One pattern: service, namespace, port.
type Pattern = (Part<String>, Part<String>, Part<u16>);

/// A checked `spec.egress`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressLimit {
    /// The Pod namespaces it governs; `None` for every one.
    namespaces: Option<Vec<String>>,
    allowed: Vec<Pattern>,
}

impl EgressLimit {
    /// Checks `rules`, naming each bad pattern or namespace.
    pub fn check(rules: &EgressRules) -> Result<Self, Vec<PolicyError>> {
        let mut errors = Vec::new();
        let error = |field: String, message: String| PolicyError {
            field,
            message,
            line: None,
            column: None,
        };
        if rules.namespaces.is_empty() {
            let message = "list the namespaces the rules govern (\"*\" for every one)".to_owned();
            errors.push(error("spec.egress.namespaces".into(), message));
        }
        let mut allowed = Vec::new();
        for (i, pattern) in rules.allowed.iter().enumerate() {
            match parse(pattern) {
                Ok(p) => allowed.push(p),
                Err(why) => errors.push(error(format!("spec.egress.allowed[{i}]"), why)),
            }
        }
        let every = rules.namespaces.iter().any(|n| n == "*");
        let namespaces = (!every).then(|| rules.namespaces.clone());
        if errors.is_empty() {
            Ok(Self {
                namespaces,
                allowed,
            })
        } else {
            Err(errors)
        }
    }

    /// Whether Pods in `namespace` are governed.
    pub fn governs(&self, namespace: &str) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|ns| ns.iter().any(|n| n == namespace))
    }

    /// Whether `d` matches one of the patterns.
    pub fn allows(&self, d: &EgressDestination) -> bool {
        (self.allowed.iter())
            .any(|(s, n, p)| s.matches(&d.service) && n.matches(&d.namespace) && p.matches(&d.port))
    }
}

fn parse(pattern: &str) -> Result<Pattern, String> {
    let shape = || format!("{pattern:?} is not service.namespace:port (each part may be *)");
    let (host, port) = pattern.rsplit_once(':').ok_or_else(shape)?;
    let (service, namespace) = host.split_once('.').ok_or_else(shape)?;
    let text = |v: &str| match v {
        "*" => Ok(Part::Any),
        _ if !v.is_empty() && !v.contains(['.', ':', '*']) => Ok(Part::Is(v.to_owned())),
        _ => Err(shape()),
    };
    let port = match port {
        "*" => Part::Any,
        p => Part::Is(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(shape)?),
    };
    Ok((text(service)?, text(namespace)?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(namespaces: &[&str], allowed: &[&str]) -> EgressRules {
        EgressRules {
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            allowed: allowed.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn dest(s: &str) -> EgressDestination {
        neocloud_core::translate::parse_egress(s).unwrap().remove(0)
    }

    #[test]
    fn patterns_match_each_part_exactly_or_any() {
        let limit =
            EgressLimit::check(&rules(&["team-a"], &["registry.ml:8080", "*.shared:*"])).unwrap();
        assert!(limit.governs("team-a") && !limit.governs("team-b"));
        assert!(limit.allows(&dest("registry.ml:8080")));
        assert!(!limit.allows(&dest("registry.ml:9090")));
        assert!(!limit.allows(&dest("vault.ml:8080")));
        assert!(limit.allows(&dest("cache.shared:6379")));
        let every = EgressLimit::check(&rules(&["*"], &[])).unwrap();
        assert!(every.governs("anything"));
        assert!(
            !every.allows(&dest("registry.ml:8080")),
            "empty allows nothing"
        );
    }

    #[test]
    fn bad_patterns_and_missing_namespaces_are_load_errors_naming_the_field() {
        let errors =
            EgressLimit::check(&rules(&[], &["ok.ns:1", "registry:80", "a.b:0", "a*.b:1"]))
                .unwrap_err();
        let said: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        assert_eq!(
            said,
            [
                "spec.egress.namespaces: list the namespaces the rules govern (\"*\" for every one)",
                "spec.egress.allowed[1]: \"registry:80\" is not service.namespace:port (each part may be *)",
                "spec.egress.allowed[2]: \"a.b:0\" is not service.namespace:port (each part may be *)",
                "spec.egress.allowed[3]: \"a*.b:1\" is not service.namespace:port (each part may be *)",
            ]
        );
    }
}
