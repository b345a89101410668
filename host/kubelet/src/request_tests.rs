use chrono::{DateTime, Utc};

use super::*;

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
        .expect("time")
        .with_timezone(&Utc)
}

fn query(pairs: &[(&str, &str)]) -> Result<LogOptions, RequestError> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    parse_query(&pairs, now())
}

fn refused(pairs: &[(&str, &str)]) -> String {
    query(pairs).expect_err("refused").to_string()
}

#[test]
fn a_log_path_names_namespace_pod_and_container() {
    let (pod, container) = parse_path("/containerLogs/team-a/train-1/main").expect("path");
    assert_eq!(pod.namespace, "team-a");
    assert_eq!(pod.name, "train-1");
    assert_eq!(container, "main");
}

#[test]
fn a_path_without_a_container_is_a_bad_request_and_other_paths_are_not_found() {
    for path in ["/containerLogs/ns/pod", "/containerLogs/ns/pod/"] {
        assert_eq!(
            parse_path(path),
            Err(RequestError::MissingContainer(path.into())),
            "{path}"
        );
    }
    for path in [
        "/containerLogs/",
        "/containerLogs/ns",
        "/containerLogs//pod/main",
        "/containerLogs/ns/pod/main/extra",
        "/exec/ns/pod/main",
        "/containerLogsX/ns/pod/main",
    ] {
        assert_eq!(
            parse_path(path),
            Err(RequestError::NotFound(path.into())),
            "{path}"
        );
    }
}

#[test]
fn no_parameters_read_the_whole_log_once() {
    assert_eq!(query(&[]).expect("options"), LogOptions::default());
}

#[test]
fn every_supported_parameter_reaches_the_options() {
    let opts = query(&[
        ("follow", "true"),
        ("tailLines", "10"),
        ("limitBytes", "500"),
        ("sinceSeconds", "60"),
        ("timestamps", "1"),
        ("previous", "false"),
        ("stream", "All"),
        ("insecureSkipTLSVerifyBackend", "true"),
    ])
    .expect("options");
    assert_eq!(
        opts,
        LogOptions {
            follow: true,
            tail_lines: Some(10),
            limit_bytes: Some(500),
            since_seconds: Some(60),
            timestamps: true,
            previous: false,
        }
    );
    assert!(query(&[("previous", "true")]).expect("options").previous);
}

#[test]
fn booleans_read_as_the_api_server_writes_them() {
    for (value, expected) in [("true", true), ("True", true), ("", true), ("0", false)] {
        let opts = query(&[("follow", value)]).expect("options");
        assert_eq!(opts.follow, expected, "follow={value}");
    }
}

#[test]
fn since_time_becomes_the_seconds_before_now_rounded_up() {
    let opts = query(&[("sinceTime", "2026-01-02T03:03:04.5Z")]).expect("options");
    assert_eq!(opts.since_seconds, Some(61));
    let future = query(&[("sinceTime", "2026-01-02T04:00:00Z")]).expect("options");
    assert_eq!(future.since_seconds, Some(0));
}

#[test]
fn bad_values_are_refused_naming_the_parameter_and_the_value() {
    let cases: &[(&str, &str, &str)] = &[
        ("follow", "yes", "must be true or false"),
        ("timestamps", "maybe", "must be true or false"),
        ("tailLines", "-1", "between 0 and"),
        ("tailLines", "ten", "must be an integer"),
        ("limitBytes", "0", "between 1 and"),
        ("sinceSeconds", "0", "between 1 and"),
        ("sinceSeconds", "1.5", "must be an integer"),
        ("sinceTime", "yesterday", "RFC 3339"),
        ("stream", "Both", "All, Stdout or Stderr"),
    ];
    for (param, value, reason) in cases {
        let message = refused(&[(param, value)]);
        assert!(
            message.contains(param) && message.contains(&format!("{value:?}")),
            "{param}={value}: {message}"
        );
        assert!(message.contains(reason), "{param}={value}: {message}");
    }
}

#[test]
fn numbers_out_of_range_are_refused_naming_the_parameter_and_the_value() {
    let max = i64::MAX.to_string();
    let min = i64::MIN.to_string();
    let huge = "99999999999999999999999999999999999999999";
    for param in ["sinceSeconds", "tailLines", "limitBytes"] {
        for value in [max.as_str(), min.as_str(), "-1", huge, "12abc", "", "0x10"] {
            let message = refused(&[(param, value)]);
            assert!(
                message.contains(param) && message.contains(&format!("{value:?}")),
                "{param}={value}: {message}"
            );
        }
    }
    let opts = query(&[
        ("sinceSeconds", "3153600000"),
        ("tailLines", "1099511627776"),
        ("limitBytes", "1099511627776"),
    ])
    .expect("the largest values are taken");
    assert_eq!(opts.since_seconds, Some(3_153_600_000));
}

#[test]
fn since_seconds_and_since_time_together_are_refused() {
    let message = refused(&[("sinceSeconds", "5"), ("sinceTime", "2026-01-02T03:00:00Z")]);
    assert!(
        message.contains("at most one of sinceTime or sinceSeconds"),
        "{message}"
    );
}

#[test]
fn a_single_stream_is_not_supported() {
    let message = refused(&[("stream", "Stderr")]);
    assert!(
        message.contains("stream=Stderr is not supported"),
        "{message}"
    );
}

#[test]
fn the_first_of_a_repeated_parameter_counts() {
    let opts = query(&[("tailLines", "3"), ("tailLines", "7")]).expect("options");
    assert_eq!(opts.tail_lines, Some(3));
}
