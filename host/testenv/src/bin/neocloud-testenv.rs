//! `neocloud-testenv`: test infrastructure as long-running processes, for local runs.
//!
//! - `up`: the test control plane (`make run-local`). It starts etcd, kube-apiserver,
//!   kube-scheduler and kube-controller-manager on loopback, prints the admin kubeconfig's path
//!   (and writes it to `--ready-file` once everything is ready).
//! - `registry`: the OCI registry the tests use (`make registry`), with TLS from a fresh CA and
//!   one user with a random password. It prints the `export` lines that docs/POLICIES.md's
//!   registry steps read (and writes them to `--env-file`, for `source`).
//!
//! Both stop what they started on SIGINT or SIGTERM.

use std::io::Write;
use std::process::ExitCode;

use neocloud_testenv::{ControlPlane, Options, Registry};

const USAGE: &str = "usage: neocloud-testenv up [--ready-file PATH]\n       \
                     neocloud-testenv registry [--port PORT] [--env-file PATH]";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, flags)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let flags = match parse_flags(flags) {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("neocloud-testenv: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match command.as_str() {
        "up" if flags.port.is_none() && flags.env_file.is_none() => up(flags.ready_file).await,
        "registry" if flags.ready_file.is_none() => registry(flags.port, flags.env_file).await,
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

#[derive(Default)]
struct Flags {
    ready_file: Option<String>,
    env_file: Option<String>,
    port: Option<u16>,
}

fn parse_flags(args: &[String]) -> Result<Flags, String> {
    let mut flags = Flags::default();
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .clone();
        match flag.as_str() {
            "--ready-file" => flags.ready_file = Some(value),
            "--env-file" => flags.env_file = Some(value),
            "--port" => {
                let port = value
                    .parse()
                    .map_err(|_| format!("--port: {value:?} is not a port number"))?;
                flags.port = Some(port);
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(flags)
}

async fn up(ready_file: Option<String>) -> ExitCode {
    let cp = match ControlPlane::start(Options::default()).await {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("neocloud-testenv: the control plane did not start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let kubeconfig = cp.admin_kubeconfig();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "kubeconfig: {}", kubeconfig.display());
    let _ = writeln!(out, "api server: {}", cp.api_url());
    drop(out);
    if let Some(path) = ready_file
        && let Err(e) = std::fs::write(&path, kubeconfig.display().to_string())
    {
        eprintln!("neocloud-testenv: --ready-file {path}: {e}");
        cp.stop();
        return ExitCode::FAILURE;
    }
    let outcome = until_stopped().await;
    cp.stop();
    outcome
}

async fn registry(port: Option<u16>, env_file: Option<String>) -> ExitCode {
    let started = match port {
        Some(port) => Registry::start_on(port).await,
        None => Registry::start().await,
    };
    let mut registry = match started {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("neocloud-testenv: the registry did not start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exports = registry_exports(&registry);
    if let Some(path) = &env_file
        && let Err(e) = std::fs::write(path, &exports)
    {
        eprintln!("neocloud-testenv: --env-file {path}: {e}");
        registry.stop();
        return ExitCode::FAILURE;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "# The registry runs until Ctrl-C (its storage is removed then). Export:"
    );
    let _ = write!(out, "{exports}");
    let _ = out.flush();
    drop(out);
    let outcome = until_stopped().await;
    registry.stop();
    outcome
}

/// `export NAME='value'` lines for docs/POLICIES.md's registry steps. The values are a host and
/// port, a temporary path, a fixed user name and an alphanumeric password: none holds a quote.
fn registry_exports(registry: &Registry) -> String {
    let vars = [
        ("REGISTRY", registry.host()),
        ("REGISTRY_CA", registry.ca_file().display().to_string()),
        ("NEOCLOUD_REGISTRY_USERNAME", registry.username().to_owned()),
        ("NEOCLOUD_REGISTRY_PASSWORD", registry.password().to_owned()),
    ];
    vars.iter()
        .map(|(name, value)| format!("export {name}='{value}'\n"))
        .collect()
}

/// Waits for SIGINT or SIGTERM.
async fn until_stopped() -> ExitCode {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("neocloud-testenv: cannot watch SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    ExitCode::SUCCESS
}
