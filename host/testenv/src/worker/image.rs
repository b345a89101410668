//! Images for a worker node's containerd, which can pull nothing: the busybox images tests run
//! and the sandbox ("pause") image, made from Debian's static busybox as OCI layout archives, and
//! archives a test built (`make image`), imported with `ctr`.
//!
//! Not the containerd process (`components`).

use std::path::Path;
use std::process::Command;

use super::WorkerNode;
use crate::docker::{busybox_rootfs, run};
use crate::{Error, write_file};

impl WorkerNode {
    /// Imports image `reference` into the node's containerd: a root filesystem with only
    /// Debian's static busybox (as `/bin/sh`, `echo`, `sleep`, `cat`, `env`, `hostname`, `ip`,
    /// `wget`, `nc`, `od`) and this entrypoint. Pods must use `imagePullPolicy: Never` or
    /// `IfNotPresent`: nothing can be pulled.
    pub fn import_busybox(&self, reference: &str, entrypoint: &[&str]) -> Result<(), Error> {
        let slug: String = reference
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let rootfs = self.dir.join(format!("image-{slug}"));
        busybox_rootfs(
            &rootfs,
            &[
                "sh", "echo", "sleep", "cat", "env", "hostname", "ip", "wget", "nc",
            ],
        )?;
        let archive = self.dir.join(format!("image-{slug}.tar"));
        oci_archive(&rootfs, entrypoint, reference, &archive)?;
        run(self.ctr().args(["images", "import"]).arg(&archive))?;
        std::fs::remove_file(&archive).map_err(|e| Error::io("remove the image archive", e))?;
        std::fs::remove_dir_all(&rootfs).map_err(|e| Error::io("remove the image's root", e))
    }

    /// Imports an OCI image archive (an OCI layout as one tarball, as `make image` writes
    /// `target/image/image.tar`) into the node's containerd, under the names its index carries.
    pub fn import_archive(&self, archive: &Path) -> Result<(), Error> {
        if !archive.is_file() {
            return Err(Error::io(
                format!("import {}", archive.display()),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
        run(self.ctr().args(["images", "import"]).arg(archive))
    }
}

/// Writes an OCI image layout archive holding `rootfs` as one layer, named `reference`.
pub(super) fn oci_archive(
    rootfs: &Path,
    entrypoint: &[&str],
    reference: &str,
    out: &Path,
) -> Result<(), Error> {
    use sha2::{Digest, Sha256};
    let work = out.with_extension("layout");
    let blobs = work.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| Error::io("create the image layout", e))?;
    let layer = work.join("layer.tar");
    run(Command::new("tar")
        .arg("--sort=name")
        .arg("--mtime=@0")
        .arg("--owner=0")
        .arg("--group=0")
        .arg("-C")
        .arg(rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."))?;
    let bytes = std::fs::read(&layer).map_err(|e| Error::io("read the image layer", e))?;
    let blob = |data: &[u8]| -> Result<(String, usize), Error> {
        let digest = hex::encode(Sha256::digest(data));
        std::fs::write(blobs.join(&digest), data)
            .map_err(|e| Error::io("write an image blob", e))?;
        Ok((format!("sha256:{digest}"), data.len()))
    };
    let (layer_digest, layer_size) = blob(&bytes)?;
    std::fs::remove_file(&layer).map_err(|e| Error::io("remove the layer tar", e))?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = blob(config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = blob(manifest.to_string().as_bytes())?;
    let tag = reference.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"io.containerd.image.name": reference,
                            "org.opencontainers.image.ref.name": tag},
        }],
    });
    write_file(&work.join("index.json"), &index.to_string())?;
    write_file(
        &work.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    run(Command::new("tar")
        .arg("-C")
        .arg(&work)
        .arg("-cf")
        .arg(out)
        .args(["oci-layout", "index.json", "blobs"]))?;
    std::fs::remove_dir_all(&work).map_err(|e| Error::io("remove the image layout", e))
}
