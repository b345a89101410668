//! Publishing `events.k8s.io/v1` Events about Pods, with repeats folded into a series as
//! client-go and kube's `Recorder` do. Unlike kube's `Recorder`, which keeps every Event it
//! published (the whole object) for six minutes and scans them all on each publish, this keeps
//! a small key per Event: at 1,000 Pods the full cache was the node's largest allocation.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use serde_json::json;

/// How long a published Event can gain a series (client-go and kube use six minutes).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// Where repeats of one Event are counted.
#[derive(Debug, Clone)]
struct Series {
    name: String,
    count: i32,
    last: Instant,
}

/// Publishes Events as `controller` (the reporting controller) on `instance` (the node).
pub(crate) struct Publisher {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<HashMap<u64, Series>>,
    pruned: Mutex<Instant>,
}

impl Publisher {
    pub(crate) fn new(client: Client, controller: &str, instance: &str) -> Publisher {
        Publisher {
            client,
            controller: controller.to_owned(),
            instance: instance.to_owned(),
            series: Mutex::new(HashMap::new()),
            pruned: Mutex::new(Instant::now()),
        }
    }

    /// Publishes (or counts again) an Event about `regarding`.
    pub(crate) async fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let now = Instant::now();
        self.prune(now);
        let key = key(regarding, warning, reason, note);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let repeat = self.series.lock().get_mut(&key).map(|s| {
            s.count += 1;
            s.last = now;
            (s.name.clone(), s.count)
        });
        if let Some((name, count)) = repeat {
            let patch = json!({"series": EventSeries {
                count,
                last_observed_time: MicroTime(Timestamp::now()),
            }});
            events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            return Ok(());
        }
        let stamp = Timestamp::now();
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            stamp.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            action: Some(reason.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note.to_owned()),
            event_time: Some(MicroTime(stamp)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
            ..Event::default()
        };
        let body = serde_json::to_vec(&event).map_err(kube::Error::SerdeError)?;
        let request =
            kube::core::Request::new(<Event as kube::Resource>::url_path(&(), Some(namespace)))
                .create(&PostParams::default(), body);
        crate::runtime::send_unread(&self.client, request).await?;
        self.series.lock().insert(
            key,
            Series {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    /// Drops series older than the window, at most every few seconds.
    fn prune(&self, now: Instant) {
        let mut pruned = self.pruned.lock();
        if now.duration_since(*pruned) < Duration::from_secs(5) {
            return;
        }
        *pruned = now;
        self.series
            .lock()
            .retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.series.lock().len()
    }
}

fn key(regarding: &ObjectReference, warning: bool, reason: &str, note: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (
        &regarding.uid,
        &regarding.namespace,
        &regarding.name,
        warning,
        reason,
        note,
    )
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn repeats_share_a_key_and_anything_else_does_not() {
        let a = key(&pod("1"), true, "NoOffer", "none fits");
        assert_eq!(a, key(&pod("1"), true, "NoOffer", "none fits"));
        assert_ne!(a, key(&pod("2"), true, "NoOffer", "none fits"));
        assert_ne!(a, key(&pod("1"), false, "NoOffer", "none fits"));
        assert_ne!(a, key(&pod("1"), true, "OverBudget", "none fits"));
        assert_ne!(a, key(&pod("1"), true, "NoOffer", "other"));
    }

    #[tokio::test]
    async fn old_series_are_pruned() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let p = Publisher::new(client, "c", "i");
        let long_ago = Instant::now()
            .checked_sub(SERIES_WINDOW + Duration::from_secs(10))
            .unwrap();
        p.series.lock().insert(
            1,
            Series {
                name: "old".into(),
                count: 1,
                last: long_ago,
            },
        );
        p.series.lock().insert(
            2,
            Series {
                name: "new".into(),
                count: 1,
                last: Instant::now(),
            },
        );
        *p.pruned.lock() = long_ago;
        p.prune(Instant::now());
        assert_eq!(p.tracked(), 1);
        assert_eq!(
            p.series.lock().get(&2).map(|s| s.name.as_str()),
            Some("new")
        );
    }
}
