use std::sync::Arc;

use axum::http::StatusCode;
use futures::StreamExt;

use super::*;

/// What the tests' provider was asked for: provider, instance and options.
type Asked = Arc<std::sync::Mutex<Vec<(String, String, LogOptions)>>>;

/// The tests' node: one Pod `ns/job` (container `main`) placed as `placement`, not run by the
/// runner. Its provider answers logs when `asked` is set (two lines for `gpu-west/job`, "not
/// found" for any other instance, recording each call there), and opens sessions when
/// `sessions` is set (a duplex stream each, counted there).
struct Node {
    placement: PodPlacement,
    asked: Option<Asked>,
    sessions: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

#[async_trait]
impl NodePods for Node {
    fn find(&self, namespace: &str, name: &str) -> Option<PodPlacement> {
        (namespace == "ns" && name == "job").then(|| self.placement.clone())
    }

    async fn provider_logs(
        &self,
        provider: ProviderId,
        instance: &str,
        opts: LogOptions,
    ) -> Result<Option<BoxStream<'static, Bytes>>, String> {
        let Some(asked) = &self.asked else {
            return Ok(None);
        };
        let call = (provider.to_string(), instance.to_owned(), opts);
        asked.lock().unwrap().push(call);
        if instance != "gpu-west/job" {
            return Err("pods \"job\" not found".to_owned());
        }
        let lines = [Bytes::from_static(b"one\n"), Bytes::from_static(b"two\n")];
        Ok(Some(futures::stream::iter(lines).boxed()))
    }

    async fn provider_session(
        &self,
        _: ProviderId,
        _: &str,
        _: SessionRequest,
    ) -> Result<Option<SessionIo>, String> {
        let Some(calls) = &self.sessions else {
            return Ok(None);
        };
        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (ours, _theirs) = tokio::io::duplex(64);
        Ok(Some(Box::new(ours) as SessionIo))
    }
}

/// A source on the tests' node whose Pod is placed on `provider` as `instance`, its provider
/// reading logs into `asked` when set.
fn source(provider: &str, instance: Option<&str>, asked: Option<Asked>) -> NodeWorkloads {
    node_source(provider, instance, asked, None)
}

fn node_source(
    provider: &str,
    instance: Option<&str>,
    asked: Option<Asked>,
    sessions: Option<Arc<std::sync::atomic::AtomicUsize>>,
) -> NodeWorkloads {
    let placement = PodPlacement {
        uid: "uid-1".into(),
        provider: Some(provider.parse().expect("a provider")),
        containers: vec!["main".into()],
        runner: false,
        instance: None,
    }
    .with_instance(instance.map(str::to_owned));
    let node = Node {
        placement,
        asked,
        sessions,
    };
    NodeWorkloads::new(Arc::new(node), None, [])
}

fn job() -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: "job".into(),
    }
}

/// Why a source refuses the log of `ns/job`'s `container`.
trait Refusal {
    async fn refusal(&self, container: &str) -> LogError;
}

impl Refusal for NodeWorkloads {
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
    let s = source("kube", Some("gpu-west/job"), Some(Arc::clone(&asked)));
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
    let e = source("kube", None, Some(Arc::clone(&asked)))
        .refusal("main")
        .await;
    assert!(matches!(e, LogError::NoLogApi { .. }), "{e}");
    // The provider answers that it has no log API.
    let e = source("lambda", Some("i-2"), None).refusal("main").await;
    assert_eq!(
        e,
        LogError::NoLogApi {
            provider: "lambda".into()
        }
    );
    // The provider fails: a 500 naming the Pod and the reason.
    let e = source("kube", Some("gpu-west/gone"), Some(asked))
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

#[tokio::test]
async fn a_pod_its_provider_serves_has_a_limit_of_open_sessions_freed_when_one_closes() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let source = node_source("kube", Some("gpu-west/job"), None, Some(calls.clone()))
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
    let clouds = [ProviderId::Lambda, ProviderId::Runpod, ProviderId::Vast];
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
        .with_runnerless_providers([ProviderId::Lambda])
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
    let fake = fake.with_session_providers([ProviderId::Kube]);
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
        source("kube", Some("gpu-west/job"), None).with_session_providers([ProviderId::Kube]);
    assert!(kube.check_session(&job(), Some("main"), "exec").is_ok());
}
