use std::os::unix::fs::PermissionsExt;

use super::*;
use neocloud_protocol::EnvVar;

fn docker(network: &str) -> DockerOptions {
    DockerOptions {
        network: network.into(),
        gpus: Some("all".into()),
        mounts: Vec::new(),
        loopback_hosts: Vec::new(),
    }
}

fn workload() -> Workload {
    Workload {
        image: "ghcr.io/example/train:1".into(),
        command: vec!["python".into(), "-u".into()],
        args: vec!["train.py".into()],
        env: vec![EnvVar::new("HF_TOKEN", "hf_secret_value")],
        working_dir: Some("/work".into()),
        files: Vec::new(),
        restart_policy: None,
        probes: None,
        registry_login: None,
        egress: Vec::new(),
    }
}

#[test]
fn docker_args_use_all_gpus_and_keep_env_values_off_the_command_line() {
    let args = docker_args(
        &workload(),
        Path::new("/tmp/x.env"),
        &docker("host"),
        "neocloud-uid-1",
    );
    assert_eq!(&args[..3], ["run", "--rm", "--gpus=all"]);
    let joined = args.join(" ");
    assert!(
        joined.contains("--name=neocloud-uid-1 --network=host --env-file=/tmp/x.env"),
        "{joined}"
    );
    assert!(!joined.contains("hf_secret_value"));
    assert!(
        joined.ends_with("--entrypoint=python -- ghcr.io/example/train:1 -u train.py"),
        "{joined}"
    );
    assert!(joined.contains("--workdir=/work"));
}

#[test]
fn docker_args_without_command_keep_the_image_entrypoint() {
    let mut w = workload();
    w.command.clear();
    let args = docker_args(
        &w,
        Path::new("/tmp/x.env"),
        &docker("bridge"),
        "neocloud-uid-1",
    );
    assert!(!args.iter().any(|a| a.starts_with("--entrypoint")));
    assert!(args.contains(&"--network=bridge".to_string()));
    assert_eq!(
        args[args.len() - 3..],
        ["--", "ghcr.io/example/train:1", "train.py"]
    );
}

#[test]
fn nothing_from_the_pod_is_read_as_a_docker_option() {
    let w = Workload {
        image: "--privileged".into(),
        command: vec!["--volume=/:/host".into()],
        args: vec!["ubuntu".into(), "sh".into()],
        env: vec![],
        working_dir: Some("--pid=host".into()),
        files: vec![],
        restart_policy: None,
        probes: None,
        registry_login: None,
        egress: Vec::new(),
    };
    let args = docker_args(
        &w,
        Path::new("/tmp/x.env"),
        &docker("host"),
        "neocloud-uid-1",
    );
    let end = args.iter().position(|a| a == "--").expect("options end");
    // Before `--` every option carries its value in the same word; after it, only operands.
    for a in &args[2..end] {
        assert!(a.starts_with("--") && a.contains('='), "{a}");
    }
    assert!(args[..end].contains(&"--workdir=--pid=host".to_string()));
    assert!(args[..end].contains(&"--entrypoint=--volume=/:/host".to_string()));
    assert_eq!(args[end + 1..], ["--privileged", "ubuntu", "sh"]);
}

#[test]
fn env_file_is_private_and_removed_when_dropped() {
    let file = EnvFile::write(&workload()).expect("env file");
    let path = file.path().to_path_buf();
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).expect("read");
    assert_eq!(text, "HF_TOKEN=hf_secret_value\n");
    drop(file);
    assert!(!path.exists());
}

#[test]
fn env_values_with_newlines_are_refused_for_docker() {
    let mut w = workload();
    w.env = vec![EnvVar::new("KEY", "line1\nline2")];
    let err = EnvFile::write(&w).expect_err("newline");
    assert!(!err.to_string().contains("line1"), "{err}");
}

#[tokio::test]
async fn process_executor_pipes_both_streams_with_env() {
    let w = Workload {
        command: vec!["sh".into(), "-c".into()],
        args: vec!["echo \"out $GREETING\"; echo err >&2; exit 4".into()],
        env: vec![EnvVar::new("GREETING", "hi")],
        ..Workload::default()
    };
    let (tx, mut rx) = mpsc::channel(16);
    let mut started =
        start(ExecutorKind::Process, &w, &docker("host"), "c", &tx, 0).expect("start");
    drop(tx);
    let status = started.child.wait().await.expect("wait");
    assert_eq!(status.code(), Some(4));
    let mut got = Vec::new();
    while let Some(record) = rx.recv().await {
        got.push((record.stream, record.line));
    }
    got.sort_by_key(|(stream, _)| *stream == LogStream::Stderr);
    assert_eq!(
        got,
        [
            (LogStream::Stdout, "out hi".to_string()),
            (LogStream::Stderr, "err".to_string())
        ]
    );
}

#[tokio::test]
async fn long_lines_are_split_into_bounded_records() {
    let data = vec![b'x'; MAX_LINE + 10];
    let mut reader = BufReader::new(&data[..]);
    let mut line = Vec::new();
    assert!(read_line(&mut reader, &mut line).await.expect("read"));
    assert_eq!(line.len(), MAX_LINE);
    line.clear();
    assert!(read_line(&mut reader, &mut line).await.expect("read"));
    assert_eq!(line.len(), 10);
    line.clear();
    assert!(!read_line(&mut reader, &mut line).await.expect("read"));
}

#[test]
fn missing_command_is_an_error() {
    let (tx, _rx) = mpsc::channel(1);
    let err = start(
        ExecutorKind::Process,
        &Workload::default(),
        &docker("host"),
        "c",
        &tx,
        0,
    )
    .expect_err("none");
    assert!(matches!(err, RunnerError::NoCommand));
}

#[tokio::test]
async fn the_workload_never_sees_the_runner_s_bootstrap_token_or_credential() {
    // Set on the workload itself, the strongest case: env_remove applies to inherited and
    // explicit variables alike, so the runner's own values cannot reach the process either.
    let w = Workload {
        command: vec!["sh".into(), "-c".into()],
        args: vec![format!(
            "echo \"${{{BOOTSTRAP_TOKEN_ENV}:-none}} ${{{CREDENTIAL_ENV}:-none}} $KEPT\""
        )],
        env: vec![
            EnvVar::new(BOOTSTRAP_TOKEN_ENV, "bootstrap-secret"),
            EnvVar::new(CREDENTIAL_ENV, "ncr1:k:uid:mac"),
            EnvVar::new("KEPT", "kept"),
        ],
        ..Workload::default()
    };
    let (tx, mut rx) = mpsc::channel(4);
    let mut started =
        start(ExecutorKind::Process, &w, &docker("host"), "c", &tx, 0).expect("start");
    drop(tx);
    started.child.wait().await.expect("wait");
    let line = rx.recv().await.expect("a line").line;
    assert_eq!(line, "none none kept");
}

#[test]
fn container_names_come_from_the_binding_and_are_valid_for_docker() {
    let name = container_name("spiffe://neocloud.local/neocloud/binding/0b1c-2d3e");
    assert_eq!(name, "neocloud-0b1c-2d3e");
    assert_eq!(container_name("spiffe://x/binding/a b;c"), "neocloud-abc");
    assert_eq!(container_name(""), "neocloud-workload");
}

#[test]
fn without_gpus_docker_is_not_asked_for_any() {
    let none = DockerOptions {
        network: "host".into(),
        gpus: None,
        mounts: Vec::new(),
        loopback_hosts: Vec::new(),
    };
    let args = docker_args(
        &workload(),
        Path::new("/tmp/x.env"),
        &none,
        "neocloud-uid-1",
    );
    assert!(!args.iter().any(|a| a.starts_with("--gpus")), "{args:?}");
}

#[test]
fn gpu_requests_are_checked_naming_the_value() {
    for ok in ["all", "none", "2", "device=0,1", "device=GPU-3a1b:0"] {
        assert_eq!(crate::parse_gpus(ok).as_deref(), Ok(ok));
    }
    for bad in [
        "",
        "-1",
        "all --privileged",
        "device=",
        "two",
        "device=0 --pid=host",
    ] {
        let e = crate::parse_gpus(bad).unwrap_err();
        assert!(e.contains(&format!("{bad:?}")), "{e}");
    }
}

#[test]
fn docker_args_bind_mount_the_runner_s_file_directories_read_only() {
    let options = DockerOptions {
        mounts: vec![(PathBuf::from("/tmp/neocloud-files-c/0"), "/etc/vllm".into())],
        ..docker("host")
    };
    let args = docker_args(&workload(), Path::new("/tmp/x.env"), &options, "c");
    let image = args.iter().position(|a| a == "--").expect("--");
    let at = args
        .iter()
        .position(|a| {
            a == "--mount=type=bind,source=/tmp/neocloud-files-c/0,target=/etc/vllm,readonly"
        })
        .unwrap_or_else(|| panic!("{args:?}"));
    assert!(
        at < image,
        "an option of docker's, before the image: {args:?}"
    );
}

#[test]
fn egress_names_resolve_to_the_loopback_in_the_container() {
    let options = DockerOptions {
        loopback_hosts: vec!["registry.ml.svc".into(), "registry.ml".into()],
        ..docker("host")
    };
    let args = docker_args(&workload(), Path::new("/tmp/x.env"), &options, "c");
    let image = args.iter().position(|a| a == "--").expect("--");
    for want in [
        "--add-host=registry.ml.svc:127.0.0.1",
        "--add-host=registry.ml:127.0.0.1",
    ] {
        let at = args.iter().position(|a| a == want);
        assert!(
            at.is_some_and(|at| at < image),
            "{want} before the image: {args:?}"
        );
    }
}
