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
    pub(crate) fn server_config(
        &self,
        client_ca: Option<&str>,
    ) -> Result<Arc<ServerConfig>, TlsError> {
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
    /// Starts accepting on `tcp` with `config`; the accept task ends when the listener is
    /// dropped. `server` names the server in logs ("callback", "kubelet").
    pub fn new(
        tcp: TcpListener,
        config: Arc<ServerConfig>,
        server: &'static str,
    ) -> Result<Self, TlsError> {
        let local = tcp
            .local_addr()
            .map_err(|e| TlsError::Bind(format!("failed to read the bound address: {e}")))?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, acceptor, tx, server));
        Ok(Self { ready, local })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    server: &'static str,
) {
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
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
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
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
