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

/// A port that was free a moment ago on every address, picked at random below the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`), and never the same twice in a process.
///
/// Not a port the kernel hands out for port 0: those are ephemeral ports, which any outgoing
/// connection (the API server's, etcd's, another test binary's) may take as its local port
/// before the component given it listens, and the listen then fails with "Address already in
/// use". Below the range only another listener can take it, which the bind check and the random
/// pick make unlikely, even with test binaries run side by side.
pub fn free_port() -> Result<u16, Error> {
    use rand::Rng;
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let top = ephemeral.saturating_sub(1).max(2048);
    let bottom = top.saturating_sub(12_000).max(1024);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..256 {
        let port = rand::rng().random_range(bottom..=top);
        if given.contains(&port) || TcpListener::bind(("0.0.0.0", port)).is_err() {
            continue;
        }
        given.push(port);
        return Ok(port);
    }
    // The range is crowded: take one the kernel hands out.
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
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "a port given twice");
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let ephemeral: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            ports.iter().all(|p| *p < ephemeral && *p >= 1024),
            "{ports:?}"
        );
        TcpListener::bind(("0.0.0.0", ports[0])).expect("the port is free again");
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
