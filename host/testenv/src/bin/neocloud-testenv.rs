//! `neocloud-testenv up`: the test control plane as a long-running process, for local runs
//! (`make run-local`). It starts etcd, kube-apiserver, kube-scheduler and
//! kube-controller-manager on loopback, prints the admin kubeconfig's path (and writes it to
//! `--ready-file` once everything is ready), and stops them all on SIGINT or SIGTERM.

use std::io::Write;
use std::process::ExitCode;

use neocloud_testenv::{ControlPlane, Options};

const USAGE: &str = "usage: neocloud-testenv up [--ready-file PATH]";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ready_file = match args.as_slice() {
        [up] if up == "up" => None,
        [up, flag, path] if up == "up" && flag == "--ready-file" => Some(path.clone()),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
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
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("neocloud-testenv: cannot watch SIGTERM: {e}");
            cp.stop();
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    cp.stop();
    ExitCode::SUCCESS
}
