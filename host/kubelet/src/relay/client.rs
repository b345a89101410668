//! The relay process (`neocloud-node relay`), run in the relay Pod beside a burst Pod: it
//! listens on the burst Pod's TCP ports at its own Pod IP and carries each accepted connection to
//! the node as `GET /relay/{uid}/{port}` upgraded to [`RELAY_UPGRADE`], over TLS to the node's
//! kubelet API, whose certificate is pinned (the exact certificate, not a name: the node's
//! certificate is usually self-signed for its address). Then it copies bytes both ways, each
//! side's end passed on as a half-close, until both are done.
//!
//! What it needs is in the relay's Secret, mounted as a directory and read again for each
//! connection, so a new leader's address and certificate reach running relays as the kubelet
//! updates the files: [`TOKEN_FILE`], [`NODE_FILE`] (`host:port`), [`CERT_FILE`] (PEM).
//!
//! Bounds: at most `max_connections` carried at once (a connection beyond it is closed at
//! once), a connect and handshake timeout, and a response head of at most
//! [`MAX_RESPONSE_HEAD`] bytes.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;

use super::RELAY_UPGRADE;

/// The Secret's key (a file in the mounted directory) holding the relay's token.
pub const TOKEN_FILE: &str = "token";
/// The Secret's key holding the node's kubelet API address, `host:port`.
pub const NODE_FILE: &str = "node";
/// The Secret's key holding the node's kubelet API certificate (PEM), pinned.
pub const CERT_FILE: &str = "node.crt";
/// The longest response head the node may answer with.
pub const MAX_RESPONSE_HEAD: usize = 16 * 1024;
/// Bytes copied at a time each way.
const COPY_BUFFER: usize = 64 * 1024;

/// How the relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The burst Pod's uid.
    pub uid: String,
    /// The TCP ports to listen on (the burst Pod's `containerPort`s).
    pub ports: Vec<u16>,
    /// The mounted Secret.
    pub dir: PathBuf,
    /// The address to listen on (every one by default).
    pub listen: IpAddr,
    /// Connections carried at once.
    pub max_connections: usize,
    /// How long dialling the node, the TLS handshake and its answer may take.
    pub connect_timeout: Duration,
}

impl RelayConfig {
    /// Defaults for the relay of `uid` on `ports`, reading its Secret from `dir`.
    pub fn new(uid: impl Into<String>, ports: Vec<u16>, dir: impl Into<PathBuf>) -> Self {
        Self {
            uid: uid.into(),
            ports,
            dir: dir.into(),
            listen: IpAddr::from([0, 0, 0, 0]),
            max_connections: 4096,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the relay cannot run, or one connection could not be carried.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// A port could not be listened on.
    #[error("failed to listen on port {port}: {message}")]
    Bind {
        /// The port.
        port: u16,
        /// Why.
        message: String,
    },
    /// The configuration is unusable.
    #[error("{0}")]
    Config(String),
    /// The node could not be reached or refused the connection.
    #[error("{0}")]
    Node(String),
}

/// Listens on every port, then carries connections until the process ends. Fails at once when a
/// port cannot be listened on, naming it.
pub async fn run(config: RelayConfig) -> Result<(), RelayError> {
    if config.ports.is_empty() || config.ports.len() > super::MAX_PORTS {
        return Err(RelayError::Config(format!(
            "ports: {} given; a relay carries 1 to {}",
            config.ports.len(),
            super::MAX_PORTS
        )));
    }
    if config.max_connections == 0 {
        return Err(RelayError::Config(
            "max connections: 0 would refuse every connection".into(),
        ));
    }
    let mut listeners = Vec::new();
    for &port in &config.ports {
        let listener = TcpListener::bind(SocketAddr::new(config.listen, port))
            .await
            .map_err(|e| RelayError::Bind {
                port,
                message: e.to_string(),
            })?;
        listeners.push((port, listener));
    }
    tracing::info!(uid = %config.uid, ports = ?config.ports, "relay: listening");
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let mut accepting = tokio::task::JoinSet::new();
    for (port, listener) in listeners {
        accepting.spawn(accept(
            port,
            listener,
            Arc::clone(&config),
            Arc::clone(&slots),
        ));
    }
    while accepting.join_next().await.is_some() {}
    Ok(())
}

async fn accept(port: u16, listener: TcpListener, config: Arc<RelayConfig>, slots: Arc<Semaphore>) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!(port, error = %e, "relay: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(port, %peer, max = config.max_connections, "relay: too many connections; closing this one");
            continue;
        };
        let config = Arc::clone(&config);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = carry(client, port, &config).await {
                tracing::warn!(port, %peer, error = %e, "relay: connection not carried");
            }
        });
    }
}

/// Carries one accepted connection to `port` of the burst Pod.
pub async fn carry(
    mut client: TcpStream,
    port: u16,
    config: &RelayConfig,
) -> Result<(), RelayError> {
    let _ = client.set_nodelay(true);
    let timeout = config.connect_timeout;
    let (mut node, leftover) = tokio::time::timeout(timeout, dial(config, port))
        .await
        .map_err(|_| RelayError::Node(format!("the node did not answer within {timeout:?}")))??;
    if !leftover.is_empty() {
        client
            .write_all(&leftover)
            .await
            .map_err(|e| RelayError::Node(format!("failed to write to the client: {e}")))?;
    }
    let copied =
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut node, COPY_BUFFER, COPY_BUFFER)
            .await;
    if let Err(e) = copied {
        tracing::debug!(port, error = %e, "relay: connection ended with an error");
    }
    Ok(())
}

fn read_file(config: &RelayConfig, name: &str) -> Result<String, RelayError> {
    let path = config.dir.join(name);
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| RelayError::Config(format!("failed to read {}: {e}", path.display())))
}

/// Dials the node, upgrades, and returns the connection with the bytes that followed the
/// answer's head.
async fn dial(
    config: &RelayConfig,
    port: u16,
) -> Result<(tokio_rustls::client::TlsStream<TcpStream>, Vec<u8>), RelayError> {
    let token = read_file(config, TOKEN_FILE)?;
    let node = read_file(config, NODE_FILE)?;
    let cert = read_file(config, CERT_FILE)?;
    let tls = pinned_client(cert.as_bytes())?;
    let host = node
        .rsplit_once(':')
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
        .ok_or_else(|| RelayError::Config(format!("{NODE_FILE}: {node:?} is not host:port")))?;
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| RelayError::Config(format!("{NODE_FILE}: {node:?}: {e}")))?;
    let tcp = TcpStream::connect(&node)
        .await
        .map_err(|e| RelayError::Node(format!("failed to connect to the node at {node}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let mut stream = TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| RelayError::Node(format!("TLS with the node at {node} failed: {e}")))?;
    let request = format!(
        "GET {}{}/{port} HTTP/1.1\r\nHost: {node}\r\nAuthorization: Bearer {token}\r\n\
         Connection: Upgrade\r\nUpgrade: {RELAY_UPGRADE}\r\n\r\n",
        super::RELAY_PATH,
        config.uid
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| RelayError::Node(format!("failed to write to the node: {e}")))?;
    let (head, leftover) = read_head(&mut stream).await?;
    let status_line = head.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("101") {
        let body = String::from_utf8_lossy(&leftover[..leftover.len().min(512)]).into_owned();
        return Err(RelayError::Node(format!(
            "the node refused port {port}: {status_line}: {}",
            body.trim()
        )));
    }
    Ok((stream, leftover))
}

/// Reads a response head (through the blank line); the bytes read past it come back too.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(String, Vec<u8>), RelayError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_RESPONSE_HEAD {
            return Err(RelayError::Node(format!(
                "the node's answer has no end of its head within {MAX_RESPONSE_HEAD} bytes"
            )));
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| RelayError::Node(format!("failed to read the node's answer: {e}")))?;
        if n == 0 {
            return Err(RelayError::Node(
                "the node closed the connection before answering".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A TLS client that accepts exactly the certificate in `pem` (its first), whatever its names.
pub fn pinned_client(pem: &[u8]) -> Result<Arc<ClientConfig>, RelayError> {
    let pinned = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or_else(|| RelayError::Config(format!("{CERT_FILE}: no certificate")))?
        .map_err(|e| RelayError::Config(format!("{CERT_FILE}: {e}")))?
        .into_owned();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(Pinned {
        pinned,
        provider: Arc::clone(&provider),
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RelayError::Config(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts the one pinned certificate; the handshake's signatures are still verified with its
/// key, so only the holder of the node's key passes.
#[derive(Debug)]
struct Pinned {
    pinned: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.pinned.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the node presented a certificate other than the pinned one".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Writes the relay's Secret files into `dir` (tests and tools).
pub fn write_secret_dir(
    dir: &std::path::Path,
    token: &str,
    node: &str,
    cert_pem: &str,
) -> std::io::Result<()> {
    std::fs::write(dir.join(TOKEN_FILE), token)?;
    std::fs::write(dir.join(NODE_FILE), node)?;
    std::fs::write(dir.join(CERT_FILE), cert_pem)
}
