//! Where a policy's bytes come from (a file, bytes from a ConfigMap, or an HTTP(S) URL pinned by
//! sha256) and the digest check that refuses anything that does not match.
//!
//! Not for compiling (see [`super::engine`]). URL fetching is a plain blocking request with a
//! timeout and a size cap; call it off any async runtime's worker threads.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::error::WasmError;

/// Largest component accepted from any source.
pub const MAX_COMPONENT_BYTES: u64 = 64 << 20;
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a policy component comes from. `sha256` is lower-case hex; when given, a mismatch
/// refuses to load. A URL must carry one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    File {
        path: PathBuf,
        sha256: Option<String>,
    },
    Bytes {
        /// Where the bytes came from, for errors (e.g. `configmap default/placement`).
        name: String,
        bytes: Vec<u8>,
        sha256: Option<String>,
    },
    Url {
        url: String,
        sha256: String,
    },
}

impl PolicySource {
    /// A file with no pinned digest.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::File {
            path: path.into(),
            sha256: None,
        }
    }

    /// Bytes with no pinned digest.
    pub fn bytes(name: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self::Bytes {
            name: name.into(),
            bytes,
            sha256: None,
        }
    }

    fn name(&self) -> String {
        match self {
            Self::File { path, .. } => path.display().to_string(),
            Self::Bytes { name, .. } => name.clone(),
            Self::Url { url, .. } => url.clone(),
        }
    }

    fn pinned(&self) -> Option<&str> {
        match self {
            Self::File { sha256, .. } | Self::Bytes { sha256, .. } => sha256.as_deref(),
            Self::Url { sha256, .. } => Some(sha256),
        }
    }
}

/// A component's bytes with their verified digest.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub(crate) bytes: Vec<u8>,
    pub(crate) digest: String,
}

/// The lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn read(source: &PolicySource) -> Result<Loaded, WasmError> {
    if let PolicySource::Url { url, sha256 } = source
        && sha256.trim().is_empty()
    {
        return Err(WasmError::MissingDigest { url: url.clone() });
    }
    let bytes = match source {
        PolicySource::File { path, .. } => read_file(path)?,
        PolicySource::Bytes { bytes, .. } => bytes.clone(),
        PolicySource::Url { url, .. } => fetch(url)?,
    };
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(WasmError::TooLarge {
            source_name: source.name(),
            size: bytes.len() as u64,
            max: MAX_COMPONENT_BYTES,
        });
    }
    let digest = sha256_hex(&bytes);
    if let Some(expected) = source.pinned()
        && !expected.trim().eq_ignore_ascii_case(&digest)
    {
        return Err(WasmError::DigestMismatch {
            source_name: source.name(),
            expected: expected.trim().to_ascii_lowercase(),
            actual: digest,
        });
    }
    Ok(Loaded { bytes, digest })
}

/// Reads at most one byte more than [`MAX_COMPONENT_BYTES`], so that a path to something
/// endless (`/dev/zero`, a FIFO fed forever) or huge is refused by `read` with the limit named,
/// never read whole into memory.
fn read_file(path: &std::path::Path) -> Result<Vec<u8>, WasmError> {
    let failed = |error| WasmError::Read {
        path: path.display().to_string(),
        error,
    };
    let file = std::fs::File::open(path).map_err(failed)?;
    let mut bytes = Vec::new();
    file.take(MAX_COMPONENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    Ok(bytes)
}

fn fetch(url: &str) -> Result<Vec<u8>, WasmError> {
    let failed = |message: String| WasmError::Fetch {
        url: url.to_owned(),
        message,
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(failed("only http and https urls are supported".into()));
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(FETCH_TIMEOUT))
        .build()
        .into();
    let response = agent.get(url).call().map_err(|e| failed(e.to_string()))?;
    let mut bytes = Vec::new();
    response
        .into_body()
        .into_reader()
        .take(MAX_COMPONENT_BYTES + 1) // one byte more, so `read` reports it as too large
        .read_to_end(&mut bytes)
        .map_err(|e| failed(format!("reading the body: {e}")))?;
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(failed(format!(
            "body is larger than {MAX_COMPONENT_BYTES} bytes"
        )));
    }
    Ok(bytes)
}
