//! The checks of a probe, as a kubelet makes them: an HTTP GET (a status from 200 to 399
//! passes; `https` without verifying the certificate), a TCP connection, or a command run in
//! the container (exit code 0 passes), each within the probe's timeout. A failure says why in
//! the kubelet's words (`HTTP probe failed with statuscode: 503`, `dial tcp 127.0.0.1:8080:
//! connect: connection refused`), which become the node's `Unhealthy` events.
//!
//! Not when to check or what a run of results means (`probe`).

use std::process::Stdio;
use std::time::Duration;

use neocloud_protocol::{Probe, ProbeAction};

use crate::ExecTarget;

/// Where the workload listens when a probe names no host.
const LOOPBACK: &str = "127.0.0.1";
/// The most of a command's output kept in a failure's message.
const MAX_OUTPUT: usize = 1024;

/// Makes the checks of one workload's probes.
#[derive(Debug, Clone)]
pub struct Checker {
    http: reqwest::Client,
    exec: ExecTarget,
}

impl Checker {
    /// A checker running exec probes at `exec` (the workload's process environment or its
    /// container).
    pub fn new(exec: ExecTarget) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .user_agent("kube-probe/1.34")
            .build()
            .map_err(|e| format!("failed to build the probes' HTTP client: {e}"))?;
        Ok(Self { http, exec })
    }

    /// Makes `probe`'s check once: `Err` says why it failed.
    pub async fn check(&self, probe: &Probe) -> Result<(), String> {
        let timeout = Duration::from_secs(probe.timeout_seconds.max(1).into());
        match &probe.action {
            ProbeAction::HttpGet {
                https,
                host,
                port,
                path,
                headers,
            } => {
                self.http_get(*https, host, *port, path, headers, timeout)
                    .await
            }
            ProbeAction::TcpSocket { host, port } => tcp(host, *port, timeout).await,
            ProbeAction::Exec { command } => self.exec(command, timeout).await,
        }
    }

    async fn http_get(
        &self,
        https: bool,
        host: &str,
        port: u16,
        path: &str,
        headers: &[(String, String)],
        timeout: Duration,
    ) -> Result<(), String> {
        let scheme = if https { "https" } else { "http" };
        let host = if host.is_empty() { LOOPBACK } else { host };
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        let url = format!("{scheme}://{host}:{port}{path}");
        let mut request = self.http.get(&url).timeout(timeout).header("Accept", "*/*");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(|e| {
            let why = if e.is_timeout() {
                "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
                    .to_owned()
            } else if e.is_connect() {
                format!("dial tcp {host}:{port}: connect: {}", root_cause(&e))
            } else {
                root_cause(&e)
            };
            format!("Get \"{url}\": {why}")
        })?;
        let status = response.status().as_u16();
        if (200..400).contains(&status) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {status}"))
        }
    }

    async fn exec(&self, argv: &[String], timeout: Duration) -> Result<(), String> {
        let mut command = self.exec.command(argv, false, false)?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("failed to run {argv:?}: {e}"))?;
        // Only the first MAX_OUTPUT bytes of each stream are kept; the rest is read and
        // dropped, so a chatty command neither grows the runner nor blocks on a full pipe.
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let run = async { tokio::join!(child.wait(), first_bytes(stdout), first_bytes(stderr)) };
        let (status, stdout, stderr) = match tokio::time::timeout(timeout, run).await {
            Err(_) => return Err(format!("command {argv:?} timed out")),
            Ok((Err(e), _, _)) => return Err(format!("failed to run {argv:?}: {e}")),
            Ok((Ok(status), stdout, stderr)) => (status, stdout, stderr),
        };
        if status.success() {
            return Ok(());
        }
        let mut said = String::from_utf8_lossy(&stdout).into_owned();
        said.push_str(&String::from_utf8_lossy(&stderr));
        let said = said.trim();
        if said.is_empty() {
            let code = status.code().unwrap_or(-1);
            Err(format!("command {argv:?} exited with {code}"))
        } else {
            Err(said.chars().take(MAX_OUTPUT).collect())
        }
    }
}

/// The first [`MAX_OUTPUT`] bytes of `stream`, read to its end.
async fn first_bytes(stream: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let Some(mut stream) = stream else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let _ = (&mut stream)
        .take(MAX_OUTPUT as u64)
        .read_to_end(&mut kept)
        .await;
    let _ = tokio::io::copy(&mut stream, &mut tokio::io::sink()).await;
    kept
}

async fn tcp(host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    let host = if host.is_empty() { LOOPBACK } else { host };
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: connect: {}", io_words(&e))),
        Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
    }
}

/// An IO error as Go prints it (`connection refused`), without Rust's `(os error 111)`.
fn io_words(e: &std::io::Error) -> String {
    let text = e.to_string();
    let words = text.split(" (os error").next().unwrap_or(&text);
    words.to_lowercase()
}

/// The innermost cause of an error (for reqwest, the IO error under its wrappers).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    match cause.downcast_ref::<std::io::Error>() {
        Some(io) => io_words(io),
        None => cause.to_string(),
    }
}

#[cfg(test)]
#[path = "probe_check_tests.rs"]
mod tests;
