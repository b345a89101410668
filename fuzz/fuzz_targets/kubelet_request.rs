//! The kubelet API's request parsing, as the server does it: the input is a request target
//! (`/containerLogs/ns/pod/container?tailLines=10&follow=true`), parsed as an `http::Uri`, its
//! path by `parse_path`, its query decoded by axum's `Query` and read by `parse_query`.
//!
//! Properties: no panic; an accepted path is exactly `/containerLogs/{namespace}/{pod}/
//! {container}` with none of them empty or holding a `/`; a refused parameter is named with the
//! value the request gave for it (the first one); accepted options respect the kubelet's
//! bounds (`limitBytes` and `sinceSeconds` at least 1, no `sinceSeconds` with `sinceTime`).
#![no_main]

use axum::extract::Query;
use chrono::{DateTime, Utc};
use http::Uri;
use libfuzzer_sys::fuzz_target;
use neocloud_kubelet::RequestError;
use neocloud_kubelet::request::{parse_path, parse_query};

fuzz_target!(|data: &[u8]| {
    let Ok(uri) = Uri::try_from(data) else {
        return;
    };
    path(uri.path());
    let Ok(Query(pairs)) = Query::<Vec<(String, String)>>::try_from_uri(&uri) else {
        return;
    };
    query(&pairs);
});

fn path(path: &str) {
    match parse_path(path) {
        Ok((pod, container)) => {
            let parts = [&pod.namespace, &pod.name, &container];
            assert!(parts.iter().all(|p| !p.is_empty() && !p.contains('/')));
            let rebuilt = format!("/containerLogs/{}/{}/{container}", pod.namespace, pod.name);
            assert_eq!(rebuilt, path);
        }
        Err(RequestError::NotFound(p) | RequestError::MissingContainer(p)) => assert_eq!(p, path),
        Err(other) => panic!("a path error about a parameter: {other}"),
    }
}

fn query(pairs: &[(String, String)]) {
    let now: DateTime<Utc> = "2026-01-02T03:04:05Z".parse().expect("a time");
    let first = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    match parse_query(pairs, now) {
        Ok(options) => {
            assert!(options.limit_bytes != Some(0), "limitBytes=0 accepted");
            assert!(
                !(first("sinceSeconds").is_some() && first("sinceTime").is_some()),
                "both sinceSeconds and sinceTime accepted"
            );
            if first("sinceSeconds").is_some() {
                assert!(options.since_seconds.is_some_and(|s| s >= 1));
            }
            let follow = first("follow")
                .is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "f" | "0"));
            assert_eq!(options.follow, follow, "follow misread");
        }
        Err(RequestError::Invalid { param, value, .. }) => {
            assert_eq!(first(param), Some(value.as_str()), "{param} misnamed");
        }
        Err(RequestError::Unsupported { param, value, .. }) => {
            let given = first(param).expect("an unsupported parameter that was not given");
            assert!(
                param == "previous" || given == value,
                "{param}={given} reported as {value}"
            );
        }
        Err(other) => panic!("a query error about the path: {other}"),
    }
}
