use std::sync::Arc;

use axum::http::StatusCode;
use futures::StreamExt;

use super::*;

/// A source whose one Pod `ns/job` (container `main`) is placed on `provider` as `instance`,
/// not run by the runner, reading provider logs with `read`.
fn source(provider: &str, instance: Option<&str>, read: Option<ProviderLogs>) -> CallbackLogSource {
    let placement = PodPlacement {
        uid: "uid-1".into(),
        provider: Some(provider.into()),
        containers: vec!["main".into()],
        runner: false,
        instance: None,
    }
    .with_instance(instance.map(str::to_owned));
    let lookup: PodLookup = Arc::new(move |ns: &str, name: &str| {
        (ns == "ns" && name == "job").then(|| placement.clone())
    });
    let source = CallbackLogSource::new(lookup, None, Vec::<String>::new());
    match read {
        Some(read) => source.with_provider_logs(read),
        None => source,
    }
}

fn job() -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: "job".into(),
    }
}

/// Answers `gpu-west/job` with two lines, after recording what it was asked.
fn remote(asked: Arc<std::sync::Mutex<Vec<(String, String, LogOptions)>>>) -> ProviderLogs {
    Arc::new(move |provider: &str, instance: &str, opts: LogOptions| {
        asked
            .lock()
            .unwrap()
            .push((provider.to_owned(), instance.to_owned(), opts));
        let known = instance == "gpu-west/job";
        Box::pin(async move {
            if !known {
                return Err("pods \"job\" not found".to_owned());
            }
            let lines = [Bytes::from_static(b"one\n"), Bytes::from_static(b"two\n")];
            Ok(Some(futures::stream::iter(lines).boxed()))
        })
    })
}

/// Why a source refuses the log of `ns/job`'s `container`.
trait Refusal {
    async fn refusal(&self, container: &str) -> LogError;
}

impl Refusal for CallbackLogSource {
    async fn refusal(&self, container: &str) -> LogError {
        match self.logs(&job(), container, LogOptions::default()).await {
            Err(e) => e,
            Ok(_) => panic!("a log for {container}"),
        }
    }
}

#[tokio::test]
async fn a_pod_the_runner_does_not_run_reads_its_log_from_its_provider() {
    let asked = Arc::default();
    let s = source(
        "kube",
        Some("gpu-west/job"),
        Some(remote(Arc::clone(&asked))),
    );
    let opts = LogOptions {
        follow: true,
        tail_lines: Some(5),
        ..LogOptions::default()
    };
    let stream = s.logs(&job(), "main", opts).await.unwrap();
    let text: Vec<Bytes> = stream.collect().await;
    assert_eq!(text.concat(), b"one\ntwo\n");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        [("kube".to_owned(), "gpu-west/job".to_owned(), opts)]
    );
}

#[tokio::test]
async fn without_a_provider_log_api_or_an_instance_there_is_no_log_and_failures_are_named() {
    let asked = Arc::default();
    // A cloud without a log API (no reader), and a Pod not rented yet (no instance).
    let e = source("runpod", Some("i-1"), None).refusal("main").await;
    assert_eq!(
        e,
        LogError::NoLogApi {
            provider: "runpod".into()
        }
    );
    let e = source("kube", None, Some(remote(Arc::clone(&asked))))
        .refusal("main")
        .await;
    assert!(matches!(e, LogError::NoLogApi { .. }), "{e}");
    // The provider answers that it has no log API.
    let none: ProviderLogs =
        Arc::new(|_: &str, _: &str, _: LogOptions| Box::pin(async { Ok(None) }));
    let e = source("lambda", Some("i-2"), Some(none))
        .refusal("main")
        .await;
    assert_eq!(
        e,
        LogError::NoLogApi {
            provider: "lambda".into()
        }
    );
    // The provider fails: a 500 naming the Pod and the reason.
    let e = source("kube", Some("gpu-west/gone"), Some(remote(asked)))
        .refusal("main")
        .await;
    assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(e.to_string().contains("not found"), "{e}");
    // A container the Pod does not have is refused before any provider is asked.
    let e = source("kube", Some("gpu-west/job"), None)
        .refusal("sidecar")
        .await;
    assert!(matches!(e, LogError::ContainerNotFound { .. }), "{e}");
}

/// Opens a duplex stream per session, counting the calls.
fn sessions(calls: Arc<std::sync::atomic::AtomicUsize>) -> ProviderSessions {
    Arc::new(move |_: &str, _: &str, _| {
        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            let (ours, _theirs) = tokio::io::duplex(64);
            Ok(Some(Box::new(ours) as SessionIo))
        })
    })
}

#[tokio::test]
async fn a_pod_its_provider_serves_has_a_limit_of_open_sessions_freed_when_one_closes() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let source = source("kube", Some("gpu-west/job"), None)
        .with_provider_sessions(sessions(calls.clone()))
        .with_max_provider_sessions(2);
    let forward = || SessionRequest::PortForward { port: 80 };
    let first = source.open_session(&job(), None, forward()).await;
    let second = source.open_session(&job(), None, forward()).await;
    assert!(first.is_ok() && second.is_ok());
    let refused = source.open_session(&job(), None, forward()).await.err();
    let limit = LogError::TooManySessions {
        pod: job(),
        limit: 2,
    };
    assert_eq!(refused, Some(limit.clone()));
    assert_eq!(limit.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the provider was asked past the limit"
    );
    assert_eq!(source.provider_open.open(&job()), 2);
    drop(first);
    assert_eq!(source.provider_open.open(&job()), 1);
    assert!(source.open_session(&job(), None, forward()).await.is_ok());
}

#[tokio::test]
async fn a_cloud_pod_on_a_node_without_a_runner_is_refused_naming_the_missing_runner() {
    let clouds = ["lambda", "runpod", "vast"].map(str::to_owned);
    let s = source("lambda", Some("i-1"), None).with_runnerless_providers(clouds);
    let e = s.refusal("main").await;
    assert_eq!(
        e,
        LogError::NoRunnerConfigured {
            pod: job(),
            what: "logs"
        }
    );
    assert_eq!(
        e.to_string(),
        "logs are not available for pod ns/job: no runner configured for this node; see \
         docs/RUNNER.md for its `runner:` section"
    );
    // Logs say it in a 400 (whose body the API server passes on); sessions in a 503.
    assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    assert_eq!(e.stream_status(), StatusCode::SERVICE_UNAVAILABLE);
    let exec = SessionRequest::Exec {
        command: vec!["true".into()],
        tty: false,
        stdin: false,
    };
    let refused = s.open_session(&job(), Some("main"), exec).await.err();
    assert_eq!(
        refused,
        Some(LogError::NoRunnerConfigured {
            pod: job(),
            what: "exec"
        })
    );
    let refused = s.check_session(&job(), None, "port-forward").err();
    assert_eq!(
        refused,
        Some(LogError::NoRunnerConfigured {
            pod: job(),
            what: "port-forward"
        })
    );
    // An unknown Pod is a 404 for a session; a provider outside the list keeps its own words.
    let other = PodRef {
        namespace: "ns".into(),
        name: "other".into(),
    };
    let unknown = s.check_session(&other, None, "exec").expect_err("not here");
    assert_eq!(unknown.stream_status(), StatusCode::NOT_FOUND);
    let e = source("fake", Some("i-1"), None)
        .with_runnerless_providers(["lambda".to_owned()])
        .refusal("main")
        .await;
    assert!(matches!(e, LogError::NoLogApi { .. }), "{e}");
    let sidecar = s.check_session(&job(), Some("sidecar"), "exec");
    assert_eq!(
        sidecar.expect_err("no such container").stream_status(),
        StatusCode::NOT_FOUND
    );
    let fake = source("fake", Some("i-1"), None);
    assert!(fake.check_session(&job(), None, "port-forward").is_ok());
    // Known session providers: a Pod elsewhere that the runner does not run is refused at once.
    let fake = fake.with_session_providers(["kube".to_owned()]);
    let e = fake
        .check_session(&job(), None, "port-forward")
        .expect_err("no session API");
    assert_eq!(e.stream_status(), StatusCode::BAD_REQUEST);
    assert!(
        e.to_string()
            .contains("it runs on fake without the node's runner"),
        "{e}"
    );
    let kube =
        source("kube", Some("gpu-west/job"), None).with_session_providers(["kube".to_owned()]);
    assert!(kube.check_session(&job(), Some("main"), "exec").is_ok());
}
