#!/usr/bin/env bash
# Provides the real OCI registry used by integration tests: the CNCF distribution registry as
# Debian ships it (package docker-registry, distribution 2.8, command /usr/bin/docker-registry),
# linked as `registry` into a cache directory outside the repository keyed by the package's
# version. It used to be distribution v3 built from the Go module proxy: the tests use nothing
# 2.8 lacks (OCI manifests and any layer media type, tags, basic auth over TLS, blob deletes), and
# the build was the Go lane's third-longest step on a cold machine (114 s).
#
# Prints the directory holding the binary on its last line of stdout. Progress goes to stderr.
# Installs the package when it is missing (apt-get; as root, or through sudo). Fails loudly
# (non-zero, with the step that failed) on any error.
#
#   hack/testenv/build-registry.sh            install if missing, print the bin directory
#   hack/testenv/build-registry.sh --print    print the bin directory without installing
set -euo pipefail

package=docker-registry
system_bin=/usr/bin/docker-registry
log() { printf 'testenv: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
installed_version() {
  dpkg-query -W -f='${Status} ${Version}' "$package" 2>/dev/null |
    awk '$1 == "install" && $3 == "installed" {print $4}'
}

cache_root=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
version=$(installed_version || true)
bin="$cache_root/registry-debian-${version:-missing}/bin"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

if [ -z "$version" ] || [ ! -x "$system_bin" ]; then
  command -v apt-get >/dev/null || fail "the Debian package $package is missing and apt-get is not available"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  log "installing the Debian package $package"
  # Where systemd runs, the package also starts its own service (port 5000). The tests never use
  # it: each starts its own registry on a free port, with TLS and a login.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$package" >&2 \
    || fail "apt-get install $package (run apt-get update first?)"
  version=$(installed_version)
  [ -n "$version" ] && [ -x "$system_bin" ] || fail "$package installed, but $system_bin is missing"
  bin="$cache_root/registry-debian-$version/bin"
fi

if [ "$(readlink "$bin/registry" 2>/dev/null)" != "$system_bin" ]; then
  mkdir -p "$bin"
  ln -sfn "$system_bin" "$bin/registry"
fi
"$bin/registry" --version >&2 || fail "registry does not run"
log "registry (Debian $package $version) in $bin"
echo "$bin"
