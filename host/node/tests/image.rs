//! The container image `make image` builds without a daemon (`hack/image/build.py`), checked as
//! a runtime would see it: an OCI layout whose index, manifest and config agree with their
//! digests; the Dockerfile's entrypoint, command and non-root user; a layer with only the binary,
//! its shared libraries and a few files, all root-owned; the same digest for the same inputs;
//! and the binary running from the extracted layer alone, as user 65532, in a chroot.
//!
//! Built from the test binary's `neocloud-node` (debug) to keep the test fast; `make image` ships
//! the release build through the same script.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn build(out: &Path, reference: &str, epoch: &str) -> Output {
    Command::new("python3")
        .arg(repo().join("hack/image/build.py"))
        .args(["--binary", env!("CARGO_BIN_EXE_neocloud-node")])
        .arg("--out")
        .arg(out)
        .args(["--ref", reference])
        .env("SOURCE_DATE_EPOCH", epoch)
        .output()
        .expect("python3")
}

fn digest_of(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().unwrap_or_default().to_owned()
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let bytes = std::fs::read(layout.join("blobs/sha256").join(hex)).expect("blob");
    assert_eq!(
        neocloud_oci::sha256_digest(&bytes),
        digest,
        "blob matches its digest"
    );
    bytes
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("json")
}

/// The Dockerfile's `ENTRYPOINT` or `CMD` array.
fn dockerfile(instruction: &str) -> Value {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{instruction} ")))
        .unwrap_or_else(|| panic!("the Dockerfile has no {instruction}"));
    serde_json::from_str(line).unwrap()
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_image_is_reproducible_non_root_and_runs_from_its_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let reference = "ghcr.io/aibrix/neocloud-node:v0.0.0-test";
    let first = digest_of(&build(&a, reference, "0"));
    let second = digest_of(&build(&b, reference, "0"));
    assert!(first.starts_with("sha256:") && first.len() == 71, "{first}");
    assert_eq!(first, second, "same inputs, same digest");
    assert_eq!(
        std::fs::read(a.join("image.tar")).unwrap(),
        std::fs::read(b.join("image.tar")).unwrap(),
        "the tarball is byte for byte the same"
    );
    let later = digest_of(&build(&dir.path().join("c"), reference, "1700000000"));
    assert_ne!(later, first, "the timestamps are inputs");

    let layout = a.join("layout");
    assert_eq!(
        json(&std::fs::read(layout.join("oci-layout")).unwrap())["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json(&std::fs::read(layout.join("index.json")).unwrap());
    let entry = &index["manifests"][0];
    assert_eq!(entry["digest"], first.as_str());
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        "v0.0.0-test"
    );
    let manifest = json(&blob(&layout, &first));
    let config = json(&blob(
        &layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["config"]["Entrypoint"], dockerfile("ENTRYPOINT"));
    assert_eq!(config["config"]["Cmd"], dockerfile("CMD"));
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
    let layer = blob(&layout, layer_digest);
    let diff_id = neocloud_oci::sha256_digest(&flate(&layer));
    assert_eq!(config["rootfs"]["diff_ids"][0], diff_id.as_str());

    // Every entry root-owned; only the binary, its libraries and the image's own files.
    let layer_file = dir.path().join("layer.tar.gz");
    std::fs::write(&layer_file, &layer).unwrap();
    let listing = run(Command::new("tar")
        .args(["--numeric-owner", "-tvzf"])
        .arg(&layer_file));
    for line in listing.lines() {
        assert!(line.contains(" 0/0 "), "root-owned: {line}");
        let path = line.split_whitespace().last().unwrap();
        let allowed = path.starts_with("usr/local/bin")
            || path.starts_with("lib")
            || path.starts_with("etc")
            || path.starts_with("usr")
            || ["tmp/", "home/", "home/nonroot/"].contains(&path);
        assert!(allowed, "unexpected {path} in the image");
    }
    assert!(
        listing.contains("-rwxr-xr-x 0/0") && listing.contains("usr/local/bin/neocloud-node"),
        "{listing}"
    );
    assert!(
        listing.contains("drwxrwxrwt 0/0"),
        "/tmp is sticky: {listing}"
    );

    // Run from the layer alone, as the image's user.
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&layer_file)
        .arg("-C")
        .arg(&rootfs));
    let guest = repo().join("policies/build/placement-c.wasm");
    std::fs::copy(
        &guest,
        rootfs.join("etc/neocloud-node/policies/placement-c.wasm"),
    )
    .expect("placement-c.wasm (make policies)");
    let chroot = |args: &[&str]| {
        run(Command::new("chroot")
            .arg("--userspec=65532:65532")
            .arg(&rootfs)
            .arg("/usr/local/bin/neocloud-node")
            .args(args))
    };
    assert_eq!(
        chroot(&["version"]).trim(),
        format!("neocloud-node {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(chroot(&["crds"]).contains("kind: CustomResourceDefinition"));
    let check = chroot(&[
        "policy",
        "check",
        "/etc/neocloud-node/policies/placement-c.wasm",
    ]);
    assert!(check.contains("\"placement\""), "{check}");
}

#[test]
fn bad_arguments_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(repo().join("hack/image/build.py"))
        .args(["--binary", "/nonexistent/neocloud-node", "--ref", "x:y"])
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--binary /nonexistent/neocloud-node is not an executable file"),
        "{stderr}"
    );
    let out = build(dir.path(), "ghcr.io/aibrix/neocloud-node", "0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("has no tag"),
        "{stderr}"
    );
    let out = build(dir.path(), "ghcr.io/aibrix/neocloud-node:t", "yesterday");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("SOURCE_DATE_EPOCH='yesterday'"),
        "{stderr}"
    );
}

/// The uncompressed bytes of a gzip stream, through the system's `gzip`.
fn flate(gz: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    let mut stdin = child.stdin.take().unwrap();
    let data = gz.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success());
    out.stdout
}
