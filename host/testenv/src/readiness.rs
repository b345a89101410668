//! Waiting for components to become ready: free loopback ports, a plain HTTP probe for etcd, and
//! a bounded poll loop that notices a component that died while we waited.
//!
//! It does not decide what "ready" means for a component: callers pass the probe.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Error;
use crate::process::Supervised;

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, Error> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("bind a free loopback port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("read a bound port", e))?
        .port();
    Ok(port)
}

/// `GET path` over plain HTTP/1.0 on 127.0.0.1; returns the status code and body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    http_get_at(SocketAddr::from(([127, 0, 0, 1], port)), path).await
}

/// `GET path` over plain HTTP/1.0 at `addr`; returns the status code and body.
pub async fn http_get_at(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("malformed response: {text:.80}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls `probe` until it succeeds, the component exits, or `timeout` passes.
pub async fn wait_until_ready<F, Fut>(
    component: &mut Supervised,
    timeout: Duration,
    mut probe: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    loop {
        if let Some(status) = component.exited() {
            return Err(Error::Exited {
                component: component.name().to_owned(),
                status: status.to_string(),
                log: component.log_path().to_owned(),
                tail: component.log_tail(40),
            });
        }
        let reason = match probe().await {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        if start.elapsed() > timeout {
            return Err(Error::NotReady {
                component: component.name().to_owned(),
                waited: timeout,
                reason,
                log: component.log_path().to_owned(),
                tail: component.log_tail(40),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_loopback_ports() {
        let a = free_port().unwrap();
        let b = free_port().unwrap();
        assert!(a > 0 && b > 0);
        TcpListener::bind(("127.0.0.1", a)).expect("the port is free again");
    }

    #[tokio::test]
    async fn http_get_reads_status_and_body() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.0 503 Service Unavailable\r\n\r\n{\"health\":\"false\"}")
                .await
                .unwrap();
        });
        let (status, body) = http_get(port, "/health").await.unwrap();
        assert_eq!(status, 503);
        assert_eq!(body, "{\"health\":\"false\"}");
    }

    #[tokio::test]
    async fn http_get_to_a_closed_port_is_an_error() {
        let port = free_port().unwrap();
        let err = http_get(port, "/health").await.unwrap_err();
        assert!(err.starts_with("connect:"), "{err}");
    }
}
