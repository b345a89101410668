//! Stale registry credentials: the ones a rental made at a provider (RunPod) named by its
//! external name, whose pod was deleted behind the adapter's back or whose create failed after
//! the credential was made. A credential is stale when its name carries our prefix, no binding
//! carries the name, no live instance listed in the same sweep does, and this sweeper first saw
//! it at least the grace period before the binding list (so, as for instances without a
//! creation time, a credential always survives the sweep that first sees it).
//!
//! Not for instances (see the parent module); a credential is never judged without a
//! successful binding list, since the parent returns before sweeping when that fails.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use neocloud_core::ProviderId;
use neocloud_providers::Provider;

use super::{SweepFailure, SweepReport, SweptInstance, age_at};

/// When each credential was first seen, by provider and id.
pub(super) type Seen = HashMap<(ProviderId, String), DateTime<Utc>>;

/// What the sweep of one provider's instances leaves for its credentials.
pub(super) struct Context<'a> {
    pub prefix: &'a str,
    pub bound: &'a HashSet<String>,
    /// Names of the live instances listed in this sweep.
    pub live: HashSet<String>,
    pub listed_at: DateTime<Utc>,
    pub grace: std::time::Duration,
    pub dry_run: bool,
}

/// Whether a credential named `name`, first seen at `seen`, is stale. Pure.
pub(super) fn stale(name: &str, seen: DateTime<Utc>, cx: &Context<'_>) -> bool {
    name.starts_with(cx.prefix)
        && !cx.bound.contains(name)
        && !cx.live.contains(name)
        && age_at(seen, cx.listed_at).is_some_and(|age| age >= cx.grace)
}

/// Lists `provider`'s credentials under the prefix and deletes (or, in a dry run, reports) the
/// stale ones, recording what it did in `report`.
pub(super) async fn sweep(
    provider: &dyn Provider,
    cx: &Context<'_>,
    seen: &std::sync::Mutex<Seen>,
    report: &mut SweepReport,
) {
    let listed = match provider.list_credentials(cx.prefix).await {
        Ok(listed) => listed,
        Err(error) => {
            let (provider, instance) = (provider.id(), None);
            report.failures.push(SweepFailure {
                provider,
                instance,
                error,
            });
            return;
        }
    };
    let firsts = remember(seen, provider.id(), &listed, Utc::now());
    for ((id, name), first) in listed.into_iter().zip(firsts) {
        if !stale(&name, first, cx) {
            continue;
        }
        let entry = SweptInstance {
            provider: provider.id(),
            id,
            external_name: name,
            age: age_at(first, cx.listed_at),
        };
        if cx.dry_run {
            report.credentials_would_delete.push(entry);
            continue;
        }
        match provider.delete_credential(&entry.id).await {
            Ok(()) => report.credentials_deleted.push(entry),
            Err(error) => report.failures.push(SweepFailure {
                provider: entry.provider,
                instance: Some(entry),
                error,
            }),
        }
    }
}

/// When each listed credential was first seen (`now` for new ones), forgetting the provider's
/// credentials no longer listed.
fn remember(
    seen: &std::sync::Mutex<Seen>,
    provider: ProviderId,
    listed: &[(String, String)],
    now: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let mut seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ids: HashSet<&str> = listed.iter().map(|(id, _)| id.as_str()).collect();
    seen.retain(|(p, id), _| *p != provider || ids.contains(id.as_str()));
    listed
        .iter()
        .map(|(id, _)| *seen.entry((provider, id.clone())).or_insert(now))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    fn cx<'a>(bound: &'a HashSet<String>, live: &[&str]) -> Context<'a> {
        Context {
            prefix: "ncn-test-",
            bound,
            live: live.iter().map(|s| (*s).to_owned()).collect(),
            listed_at: at(100),
            grace: std::time::Duration::from_secs(10),
            dry_run: false,
        }
    }

    #[test]
    fn a_credential_without_binding_or_instance_past_the_grace_period_is_stale() {
        let bound = HashSet::new();
        assert!(stale("ncn-test-a", at(0), &cx(&bound, &[])));
    }

    #[test]
    fn a_credential_that_is_bound_live_young_or_not_ours_is_kept() {
        let bound: HashSet<String> = ["ncn-test-a".to_owned()].into();
        assert!(!stale("ncn-test-a", at(0), &cx(&bound, &[])));
        assert!(!stale("ncn-test-b", at(0), &cx(&bound, &["ncn-test-b"])));
        assert!(!stale("ncn-test-c", at(95), &cx(&bound, &[])));
        assert!(!stale("ncn-test-d", at(200), &cx(&bound, &[])));
        assert!(!stale("someone-else", at(0), &cx(&bound, &[])));
    }
}
