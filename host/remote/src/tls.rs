//! TLS of the node's HTTPS servers (the runner callback and the kubelet API): a certificate and
//! key (from files, or self-signed for the node's advertised names when none is configured), an
//! optional client CA whose certificates are verified during the handshake, and an axum
//! [`Listener`] that completes TLS handshakes off the accept loop, so a slow or hostile client
//! cannot stall other connections.
//!
//! Not authentication or authorization: each server decides what a verified client certificate,
//! a token or nothing at all allows.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Errors of TLS set-up. Messages never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificates or keys could not be made, read or loaded.
    #[error("{0}")]
    Material(String),
    /// The listening socket could not be used.
    #[error("{0}")]
    Bind(String),
}

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most handshakes in progress at once on one server. A connection accepted beyond it is closed
/// at once: a flood of idle connections costs at most this many pending handshakes (each held
/// for at most [`HANDSHAKE_TIMEOUT`]) and never takes the file descriptors and memory of the
/// node, while a client that completes its handshake is served beside them.
const MAX_PENDING_HANDSHAKES: usize = 1024;

/// The server's certificate chain and key, in PEM.
#[derive(Clone)]
pub struct TlsMaterial {
    cert_pem: String,
    key_pem: String,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("cert_pem", &format!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl TlsMaterial {
    /// A fresh self-signed certificate for `names` (DNS names or IP addresses), which clients
    /// then trust directly (runners with `--ca-pem-base64`).
    pub fn self_signed(names: &[String]) -> Result<Self, TlsError> {
        let certified = rcgen::generate_simple_self_signed(names.to_vec())
            .map_err(|e| TlsError::Material(format!("failed to generate a certificate: {e}")))?;
        Ok(Self {
            cert_pem: certified.cert.pem(),
            key_pem: certified.signing_key.serialize_pem(),
        })
    }

    /// A certificate chain and key read from PEM files.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .map_err(|e| TlsError::Material(format!("failed to read {}: {e}", path.display())))
        };
        Ok(Self {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        })
    }

    /// A certificate chain and key given in PEM (for example, read from a Secret).
    pub fn from_pem(cert_pem: impl Into<String>, key_pem: impl Into<String>) -> Self {
        Self {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
        }
    }

    /// The certificate (chain) in PEM: what a client must trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The private key in PEM, for the one place that stores it.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Checks that the certificate and key parse and belong together.
    pub fn check(&self) -> Result<(), TlsError> {
        self.server_config(None).map(|_| ())
    }

    /// A server configuration for HTTP/1.1. With `client_ca` (PEM, one or more certificates),
    /// a client certificate is optional but, when presented, must chain to one of them or the
    /// handshake fails; without it, no client certificate is asked for.
    pub fn server_config(&self, client_ca: Option<&str>) -> Result<Arc<ServerConfig>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Material(format!("failed to parse the certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|_| TlsError::Material("failed to parse the private key".into()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Material(format!("failed to configure TLS: {e}")))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(pem) => builder.with_client_cert_verifier(optional_client_certs(pem, provider)?),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Material(format!("failed to load the certificate: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A verifier that accepts clients without a certificate and those whose certificate chains to
/// a certificate in `ca_pem`.
fn optional_client_certs(
    ca_pem: &str,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert =
            cert.map_err(|e| TlsError::Material(format!("failed to parse the client CA: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| TlsError::Material(format!("failed to load the client CA: {e}")))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Material(
            "the client CA holds no certificate".into(),
        ));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Material(format!("failed to configure client certificates: {e}")))
}

/// The peer address of a TLS connection, for `ConnectInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, TlsListener>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// Accepts TCP connections and hands over those whose TLS handshake completed.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `tcp` with `config`, and returns the listener with its accept task,
    /// which ends when the listener is dropped (before that, only by a panic: the server owning
    /// the listener watches it). `server` names the server in logs ("callback", "kubelet").
    pub fn new(
        tcp: TcpListener,
        config: Arc<ServerConfig>,
        server: &'static str,
    ) -> Result<(Self, JoinHandle<()>), TlsError> {
        let local = tcp
            .local_addr()
            .map_err(|e| TlsError::Bind(format!("failed to read the bound address: {e}")))?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(accept_loop(
            tcp,
            acceptor,
            tx,
            server,
            MAX_PENDING_HANDSHAKES,
        ));
        Ok((Self { ready, local }, accepting))
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    server: &'static str,
    max_pending: usize,
) {
    let pending = Arc::new(tokio::sync::Semaphore::new(max_pending));
    let mut shed: u64 = 0;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(server, error = %e, "failed to accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = tx.closed() => return,
        };
        // Sessions and relayed connections carry small interactive writes: without this, a
        // write after another unacknowledged one (the 101 after TLS 1.3's session tickets)
        // waits for the peer's delayed ACK, some 40 ms on Linux.
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&pending).try_acquire_owned() else {
            // Closed by dropping it; said once per thousand so a flood does not flood the log.
            drop(stream);
            if shed.is_multiple_of(1000) {
                tracing::warn!(
                    server,
                    %peer,
                    max_pending,
                    shed = shed + 1,
                    "too many TLS handshakes in progress; closing new connections"
                );
            }
            shed += 1;
            continue;
        };
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(server, %peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(server, %peer, "TLS handshake timed out"),
            }
        });
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept task ended (it panicked): the owning server's watch reports it.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A TLS client of `addr` that trusts only the certificate `cert_pem` and expects the name
/// `127.0.0.1`, as the tests' servers present it. For tests only (the kubelet API's among them);
/// compiled always, not behind a feature: a feature that only the tests turn on gives a test build
/// another `neocloud-remote` than a normal build, and `make run-local` after `make test` would
/// rebuild every crate above it.
#[doc(hidden)]
pub async fn test_connect(
    addr: SocketAddr,
    cert_pem: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    connector.connect(name, tcp).await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Serves `b"ok"` on every handshaken connection of a listener that allows `max_pending`
    /// handshakes at once; returns its address and certificate.
    async fn echo_ok(max_pending: usize) -> (SocketAddr, String) {
        let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let local = tcp.local_addr().expect("addr");
        let acceptor = TlsAcceptor::from(tls.server_config(None).expect("config"));
        let (tx, mut ready) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, acceptor, tx, "test", max_pending));
        tokio::spawn(async move {
            while let Some((mut stream, _)) = ready.recv().await {
                tokio::spawn(async move {
                    let _ = stream.write_all(b"ok").await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        (local, tls.cert_pem().to_owned())
    }

    /// A well-behaved client: handshakes, reads the answer.
    async fn fetch(addr: SocketAddr, cert_pem: &str) -> std::io::Result<Vec<u8>> {
        let mut tls = test_connect(addr, cert_pem).await?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out).await?;
        Ok(out)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_idle_connections_do_not_keep_a_client_from_being_served() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (addr, cert) = echo_ok(MAX_PENDING_HANDSHAKES).await;
        let mut idle = Vec::new();
        for _ in 0..1000 {
            idle.push(TcpStream::connect(addr).await.expect("idle connect"));
        }
        let served = tokio::time::timeout(Duration::from_secs(5), fetch(addr, &cert))
            .await
            .expect("served while 1,000 connections idle")
            .expect("handshake");
        assert_eq!(served, b"ok");
        drop(idle);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_past_the_pending_cap_are_closed_and_later_ones_served() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (addr, cert) = echo_ok(8).await;
        let mut idle = Vec::new();
        for _ in 0..8 {
            idle.push(TcpStream::connect(addr).await.expect("idle connect"));
        }
        // The ninth is accepted and closed at once: reading it ends without an answer.
        let mut ninth = TcpStream::connect(addr).await.expect("connect");
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), ninth.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        // Once the idle ones go, their slots are free again.
        drop(idle);
        let served = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(out) = fetch(addr, &cert).await {
                    return out;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("served once the idle connections closed");
        assert_eq!(served, b"ok");
    }
}
