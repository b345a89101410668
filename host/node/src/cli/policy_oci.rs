//! `neocloud-node policy push|pull|sign|verify|keygen`: distributing a Wasm policy through an
//! OCI registry. `push` stores a component and prints the reference by digest a `BurstPolicy`
//! names; `pull` fetches one by digest; `sign` adds a cosign-format signature; `verify` checks
//! one against public keys; `keygen` writes a P-256 key pair in PEM. Each prints JSON and fails
//! with the reason (unreachable registry, refused credentials, no such digest, no valid
//! signature) and a non-zero exit.
//!
//! Not the node's loading of an `oci:` source (see `policies::oci`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use neocloud_oci::{OciClient, OciOptions, PolicyRef, PublicKey, RegistryCredentials, SigningKey};
use serde_json::{Value, json};

/// How to reach the registry.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// A PEM CA certificate the registry's TLS certificate chains to (a private registry).
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Option<PathBuf>,
    /// The registry user; its password comes from `NEOCLOUD_REGISTRY_PASSWORD` or
    /// `--password-stdin`.
    #[arg(long, env = "NEOCLOUD_REGISTRY_USERNAME")]
    pub username: Option<String>,
    /// Read the password from the first line of standard input.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
}

/// The OCI commands.
#[derive(Debug, clap::Subcommand)]
pub enum OciCommand {
    /// Store a component in a registry (`<registry>/<repository>[:<tag>]`) and print the
    /// reference by digest a BurstPolicy's `spec.wasm.oci` names. A component the node would
    /// not load (not a component, no policy role) is refused before anything is sent.
    Push {
        /// The component (.wasm).
        file: PathBuf,
        /// Where to store it.
        reference: String,
        /// Print only the reference by digest (for scripts) instead of JSON.
        #[arg(short, long)]
        quiet: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Fetch a component by digest (`<registry>/<repository>@sha256:<digest>`) into a file,
    /// every byte checked against its digest.
    Pull {
        reference: String,
        /// Where to write the component.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Sign a pushed component (by digest) with a PEM P-256 private key, in cosign's format.
    Sign {
        reference: String,
        /// The private key (PKCS#8 or SEC1 PEM).
        #[arg(long)]
        key: PathBuf,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Check that a pushed component (by digest) is signed by one of the given public keys.
    Verify {
        reference: String,
        /// A PEM public key (repeatable); a signature by any one is enough.
        #[arg(long, required = true)]
        key: Vec<PathBuf>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Write a new P-256 key pair: `<prefix>.key` (PKCS#8, mode 0600) and `<prefix>.pub`.
    Keygen {
        /// The path prefix of the two files.
        #[arg(long, default_value = "policy")]
        prefix: PathBuf,
    },
}

/// Runs `command` and returns its JSON output, or a string that is the whole output.
/// `push` loads the component first, with `cache`.
pub fn run(command: OciCommand, cache: &crate::cli::policy::CacheArgs) -> anyhow::Result<Value> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(command, cache))
}

async fn run_async(
    command: OciCommand,
    cache: &crate::cli::policy::CacheArgs,
) -> anyhow::Result<Value> {
    match command {
        OciCommand::Push {
            file,
            reference,
            quiet,
            registry,
        } => {
            let target = PolicyRef::parse(&reference)?;
            let bytes = read(&file)?;
            // What the node would refuse to load is not pushed.
            crate::cli::policy::load(cache, &file).map_err(|e| {
                anyhow::anyhow!("{e}; nothing was pushed (`policy check` tells what is wrong)")
            })?;
            let pushed = client(&registry)?.push(&target, &bytes).await?;
            if quiet {
                return Ok(Value::String(pushed.reference.to_string()));
            }
            Ok(json!({
                "reference": pushed.reference.to_string(),
                "digest": pushed.digest,
                "componentDigest": pushed.component_digest,
                "size": bytes.len(),
            }))
        }
        OciCommand::Pull {
            reference,
            output,
            registry,
        } => {
            let pinned = PolicyRef::pinned(&reference)?;
            let pulled = client(&registry)?.pull(&pinned).await?;
            std::fs::write(&output, &pulled.bytes)
                .with_context(|| format!("failed to write {}", output.display()))?;
            Ok(json!({
                "reference": pinned.to_string(),
                "digest": pulled.digest,
                "componentDigest": pulled.component_digest,
                "size": pulled.bytes.len(),
                "file": output,
            }))
        }
        OciCommand::Sign {
            reference,
            key,
            registry,
        } => {
            let pinned = PolicyRef::pinned(&reference)?;
            let key = SigningKey::from_pem(&key.display().to_string(), &read_text(&key)?)?;
            let signature = client(&registry)?.sign(&pinned, &key).await?;
            Ok(json!({
                "reference": pinned.to_string(),
                "signature": signature.to_string(),
                "key": key.public_key().id(),
            }))
        }
        OciCommand::Verify {
            reference,
            key,
            registry,
        } => {
            let pinned = PolicyRef::pinned(&reference)?;
            let keys = key
                .iter()
                .map(|path| {
                    let what = path.display().to_string();
                    Ok(PublicKey::from_pem(&what, &read_text(path)?)?)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let verified = client(&registry)?.verify(&pinned, &keys).await?;
            Ok(json!({
                "reference": pinned.to_string(),
                "verified": true,
                "key": verified.key_id,
            }))
        }
        OciCommand::Keygen { prefix } => keygen(&prefix),
    }
}

fn keygen(prefix: &Path) -> anyhow::Result<Value> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let key = SigningKey::generate();
    let (private, public) = (prefix.with_extension("key"), prefix.with_extension("pub"));
    for path in [&private, &public] {
        if path.exists() {
            anyhow::bail!("{} exists; keygen does not overwrite a key", path.display());
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&private)
        .and_then(|mut f| f.write_all(key.to_pem().as_bytes()))
        .with_context(|| format!("failed to write {}", private.display()))?;
    std::fs::write(&public, key.public_key().to_pem())
        .with_context(|| format!("failed to write {}", public.display()))?;
    Ok(json!({
        "privateKey": private,
        "publicKey": public,
        "key": key.public_key().id(),
    }))
}

fn client(args: &RegistryArgs) -> anyhow::Result<OciClient> {
    let ca_pem = args.registry_ca.as_deref().map(read_text).transpose()?;
    let credentials = match &args.username {
        Some(username) => Some(RegistryCredentials {
            username: username.clone(),
            password: password(args.password_stdin)?,
        }),
        None => None,
    };
    Ok(OciClient::new(OciOptions {
        ca_pem,
        credentials,
        ..OciOptions::default()
    })?)
}

fn password(from_stdin: bool) -> anyhow::Result<String> {
    if from_stdin {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .context("failed to read the password from standard input")?;
        return Ok(line.trim_end_matches(['\r', '\n']).to_owned());
    }
    std::env::var("NEOCLOUD_REGISTRY_PASSWORD").map_err(|_| {
        anyhow::anyhow!(
            "--username needs a password: set NEOCLOUD_REGISTRY_PASSWORD or pass --password-stdin"
        )
    })
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))
}
