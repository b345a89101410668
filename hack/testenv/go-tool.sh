# Shared by build-otelcol.sh, build-kwok.sh, build-kubelet.sh and build-kueue.sh (sourced, not run): builds one
# Go tool from its wrapper module under hack/testenv/<dir> with the Go module proxy, into a cache
# outside the repository keyed by the pinned version and a hash of `hashed` (the module's go.mod,
# go.sum and whatever else shapes the binary). The caller sets:
#
#   name     the binary, and the cache directory's prefix (otelcol, kwok)
#   module   the wrapper module's directory
#   pin      the module whose pinned version names the cache (github.com/.../v3)
#   hashed   the files whose hash keys the cache
#   package  what `go build` builds in $module (a package path, or `.`)
#   what     how failures name the build ("the collector")
#   check()  runs the built binary ($1) and fails if it does not work
#   ldflags  (optional) the linker flags; '-s -w' when unset
#   cold     (optional) how long a cold build takes on 2 cores; '1-2 minutes' when unset
#   extra    (optional) an array of further packages of $module, each built beside $name under
#            its last path element (the worker node's kube-proxy beside the kubelet)
#   files()  (optional) copies further files the tool needs into the directory given as $1
#            before it is published beside the binary (Kueue's CRDs and webhook manifests)
#
# and calls `go_tool "$@"`. Prints the bin directory on the last line of stdout (`--print`:
# without building); progress goes to stderr; skips the build when the binary is cached; fails
# loudly, naming the step.

# The pinned version of a module: its require line, in a block or alone.
pinned() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2} $1=="require" && $2==m {print $3}' "$2" | head -n1; }
log() { printf 'testenv: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

go_tool() {
  local version sum cache_root bin tmp start
  version=$(pinned "$pin" "$module/go.mod")
  if [ -z "$version" ]; then
    echo "testenv: cannot read the pinned version from $module/go.mod" >&2
    exit 1
  fi
  sum=$(cat "${hashed[@]}" | sha256sum | cut -c1-12)
  cache_root=${NEOCLOUD_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neocloud-testenv}
  bin="$cache_root/$name-$version-$sum/bin"

  if [ "${1:-}" = "--print" ]; then
    echo "$bin"
    exit 0
  fi
  if [ -x "$bin/$name" ]; then
    log "$name $version is cached in $bin"
    echo "$bin"
    exit 0
  fi

  command -v go >/dev/null || fail "go is not on PATH; install Go 1.26 or newer"
  log "building $name ($what $version) into $bin"
  log "a cold build takes ${cold:-1-2 minutes} on 2 cores; later runs reuse the cache"
  tmp="$bin.tmp.$$"
  mkdir -p "$tmp"
  # shellcheck disable=SC2064 # the path is fixed now
  trap "rm -rf '$tmp'" EXIT
  # Every Go build here passes -gcflags=all=-dwarf=false: the linker strips DWARF anyway (-s -w),
  # and not generating it saved 12 % of a cold compile (etcd: 110 to 96 s of CPU). The kubelet
  # and the control plane must pass the same flags to share compiled packages.
  export CGO_ENABLED=0 GOFLAGS=-mod=readonly

  start=$(date +%s)
  log "[1/1] $name $version"
  (cd "$module" && go build -trimpath -gcflags=all=-dwarf=false -ldflags "${ldflags:--s -w}" -o "$tmp/$name" "$package") \
    || fail "go build of $what $version in $module"
  [ -x "$tmp/$name" ] || fail "$name was not produced by the build"
  local p
  for p in ${extra[@]+"${extra[@]}"}; do
    log "[+] ${p##*/} $version"
    (cd "$module" && go build -trimpath -gcflags=all=-dwarf=false -ldflags "${ldflags:--s -w}" -o "$tmp/${p##*/}" "$p") \
      || fail "go build of $p ($what $version) in $module"
  done
  if declare -F files >/dev/null; then
    files "$tmp" || fail "copying the files that $what needs"
  fi
  check "$tmp/$name"
  mkdir -p "$bin"
  mv "$tmp"/* "$bin/"
  log "$name ready in $bin after $(( $(date +%s) - start ))s"
  echo "$bin"
}
