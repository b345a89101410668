#!/usr/bin/env python3
"""Builds the node's container image without a container daemon or network access.

The output is an OCI image layout (a directory) and the same layout as one tarball, which
`ctr images import`, `podman load`, `skopeo copy oci-archive:` and Docker 25+ `docker load` read.
The image holds one layer with exactly what the binary needs: the binary at
/usr/local/bin/neocloud-node (the Dockerfile's path), the shared libraries `ldd` names for it
(copied from this machine), an /etc/passwd and /etc/group with the non-root user 65532
(distroless's `nonroot`), /etc/nsswitch.conf, an empty /tmp and the policy directory
/etc/neocloud-node/policies. It runs as 65532:65532 with the Dockerfile's entrypoint and command.

The digest is reproducible: every timestamp is SOURCE_DATE_EPOCH (default 0), every file is
owned by root with a fixed mode, entries are sorted, and gzip carries no name or time. The same
binary, libraries and arguments give the same manifest digest.

Usage:
  hack/image/build.py --binary target/release/neocloud-node --out target/image \\
      --ref ghcr.io/aibrix/neocloud-node:v0.1.0
Prints the manifest digest on the last line of stdout; writes <out>/layout/ and <out>/image.tar.

Not a general image builder: one layer, linux/amd64, no base image.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile

BINARY_PATH = "usr/local/bin/neocloud-node"
USER = "65532:65532"
PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
GROUP = "root:x:0:\nnonroot:x:65532:\n"
NSSWITCH = "hosts: files dns\n"


def fail(message):
    print(f"image: {message}", file=sys.stderr)
    sys.exit(1)


def shared_libraries(binary):
    """The absolute paths of the libraries the dynamic loader maps for `binary`, loader included."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if out.returncode != 0:
        if "not a dynamic executable" in out.stdout + out.stderr:
            return []
        fail(f"ldd {binary} failed: {out.stderr.strip()}")
    libraries = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            fail(f"{binary} needs a library this machine does not have: {line}")
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            libraries.append(match.group(1))
    return sorted(set(libraries))


class Layer:
    """A deterministic tar: sorted paths, root-owned, fixed modes and times."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.entries = {}

    def directory(self, path, mode=0o755):
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in self.entries:
                self.entries[sub] = ("dir", None, 0o755)
        self.entries[path.strip("/")] = ("dir", None, mode)

    def file(self, path, data, mode=0o644):
        path = path.strip("/")
        parent = os.path.dirname(path)
        if parent:
            self.directory(parent)
        self.entries[path] = ("file", data, mode)

    def tar(self):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                kind, data, mode = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mtime = self.epoch
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = mode
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_blob(layout, data):
    d = digest(data)
    path = os.path.join(layout, "blobs", "sha256", d.split(":", 1)[1])
    with open(path, "wb") as f:
        f.write(data)
    return d


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True, help="the neocloud-node binary to ship")
    parser.add_argument("--out", required=True, help="directory for layout/ and image.tar")
    parser.add_argument("--ref", default="ghcr.io/aibrix/neocloud-node:dev", help="image reference")
    parser.add_argument("--version", default=None, help="the image's version label (default: the tag)")
    args = parser.parse_args()

    if not os.path.isfile(args.binary) or not os.access(args.binary, os.X_OK):
        fail(f"--binary {args.binary} is not an executable file; build it first "
             "(cargo build --release -p neocloud-node)")
    if ":" not in args.ref.rsplit("/", 1)[-1]:
        fail(f"--ref {args.ref} has no tag; write <repository>:<tag>")
    tag = args.ref.rsplit(":", 1)[1]
    version = args.version or tag
    epoch_text = os.environ.get("SOURCE_DATE_EPOCH", "0")
    if not epoch_text.isdigit():
        fail(f"SOURCE_DATE_EPOCH={epoch_text!r} is not a number of seconds")
    epoch = int(epoch_text)

    layer = Layer(epoch)
    with open(args.binary, "rb") as f:
        layer.file(BINARY_PATH, f.read(), 0o755)
    libraries = shared_libraries(args.binary)
    for library in libraries:
        with open(os.path.realpath(library), "rb") as f:
            layer.file(library, f.read(), 0o755)
    layer.file("etc/passwd", PASSWD.encode())
    layer.file("etc/group", GROUP.encode())
    layer.file("etc/nsswitch.conf", NSSWITCH.encode())
    layer.directory("tmp", 0o1777)
    layer.directory("home/nonroot", 0o755)
    layer.directory("etc/neocloud-node/policies", 0o755)
    tar = layer.tar()
    compressed = gzip.compress(tar, compresslevel=6, mtime=0)

    layout = os.path.join(args.out, "layout")
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    for name in os.listdir(os.path.join(layout, "blobs", "sha256")):
        os.remove(os.path.join(layout, "blobs", "sha256", name))
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": USER,
            "Entrypoint": ["/usr/local/bin/neocloud-node"],
            "Cmd": ["run", "--config", "/etc/neocloud-node/node.yaml"],
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "ExposedPorts": {"8080/tcp": {}, "10250/tcp": {}},
            "WorkingDir": "/",
            "Labels": {
                "org.opencontainers.image.source": "https://github.com/aibrix/neocloud-node",
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.licenses": "Apache-2.0",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(tar)]},
        "history": [{"created": created, "created_by": "hack/image/build.py"}],
    }
    config_bytes = canonical(config)
    layer_digest = write_blob(layout, compressed)
    config_digest = write_blob(layout, config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": len(compressed)}],
    }
    manifest_bytes = canonical(manifest)
    manifest_digest = write_blob(layout, manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "org.opencontainers.image.ref.name": tag,
                "io.containerd.image.name": args.ref,
            },
        }],
    }
    with open(os.path.join(layout, "index.json"), "wb") as f:
        f.write(canonical(index))
    with open(os.path.join(layout, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))

    archive = Layer(epoch)
    for root, _, files in os.walk(layout):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                archive.file(os.path.relpath(full, layout), f.read())
    with open(os.path.join(args.out, "image.tar"), "wb") as f:
        f.write(archive.tar())

    print(f"image: {args.ref}: {len(libraries)} shared libraries, layer {len(compressed)} bytes "
          f"gzipped", file=sys.stderr)
    print(manifest_digest)


if __name__ == "__main__":
    main()
