#!/usr/bin/env bash
# Build or fetch what a real Kubernetes node of the test bed runs besides the kubelet and
# kube-proxy (those come from build-kube.sh): containerd and the CNI plugins (Debian sid
# packages, unpacked), runc (its Go module, with seccomp), CoreDNS (its Go module) and the pause
# image (pause.c from the Kubernetes module, linked statically, packed as an OCI archive).
# Everything lands under $SLINKY_CACHE (default ~/.cache/slinky); a warm run rebuilds nothing.
set -euo pipefail

CONTAINERD_VERSION="${CONTAINERD_VERSION:-2.1.9+ds1-5}"
CNI_VERSION="${CNI_VERSION:-1.9.1+ds1-1}"
RUNC_VERSION="${RUNC_VERSION:-v1.3.6}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
PAUSE_TAG="${PAUSE_TAG:-registry.k8s.io/pause:3.10.1}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
BIN="$CACHE/bin"
NODE="$CACHE/node"
mkdir -p "$BIN" "$NODE"

stamp_ok() { [ -e "$1" ] && [ "$(cat "$1.version" 2>/dev/null)" = "$2" ]; }
now() { date +%s; }

host_packages() {
  # nft for kube-proxy's nftables mode, libseccomp-dev for runc, a static libc for pause.
  local need=()
  command -v nft >/dev/null || need+=(nftables)
  [ -f /usr/include/seccomp.h ] || need+=(libseccomp-dev)
  [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  [ ${#need[@]} -eq 0 ] && return
  echo "node: installing host packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

sid_packages() {
  # containerd 2.1 and CNI plugins 1.9 from sid: they need only glibc >= 2.34, so they run on
  # the host as they are. A private apt configuration leaves the host's apt state untouched.
  local want="containerd=$CONTAINERD_VERSION containernetworking-plugins=$CNI_VERSION"
  stamp_ok "$NODE/sid" "$want" && { echo "containerd, CNI plugins: cached"; return; }
  local t0; t0=$(now)
  local apt="$CACHE/build/apt-sid"
  rm -rf "$apt"
  mkdir -p "$apt"/{lists/partial,archives/partial,parts,prefs,debs}
  touch "$apt/status"
  echo "deb $MIRROR sid main" > "$apt/sources.list"
  cat > "$apt/apt.conf" <<EOF
Dir::State "$apt";
Dir::State::lists "$apt/lists";
Dir::State::status "$apt/status";
Dir::Cache "$apt";
Dir::Cache::archives "$apt/archives";
Dir::Etc::SourceList "$apt/sources.list";
Dir::Etc::SourceParts "$apt/parts";
Dir::Etc::PreferencesParts "$apt/prefs";
Dir::Etc::Parts "$apt/parts";
Acquire::Check-Valid-Until "false";
Acquire::Languages "none";
APT::Architecture "amd64";
APT::Sandbox::User "root";
EOF
  echo "containerd, CNI plugins: apt-get download from sid"
  APT_CONFIG="$apt/apt.conf" apt-get update -qq
  (cd "$apt/debs" && APT_CONFIG="$apt/apt.conf" apt-get download -qq \
    "containerd=$CONTAINERD_VERSION" "containernetworking-plugins=$CNI_VERSION")
  rm -rf "$NODE/sid.tmp"
  for deb in "$apt"/debs/*.deb; do dpkg-deb -x "$deb" "$NODE/sid.tmp"; done
  rm -rf "$NODE/sid" && mv "$NODE/sid.tmp" "$NODE/sid"
  for b in containerd containerd-shim-runc-v2 ctr; do ln -sf "$NODE/sid/usr/bin/$b" "$BIN/$b"; done
  echo "$want" > "$NODE/sid.version"
  rm -rf "$apt"
  echo "containerd, CNI plugins: done in $(( $(now) - t0 ))s"
}

build_runc() {
  stamp_ok "$BIN/runc" "$RUNC_VERSION" && { echo "runc $RUNC_VERSION: cached"; return; }
  local t0; t0=$(now)
  echo "runc $RUNC_VERSION: building (sid's binary wants a newer glibc than the host's)"
  GOTOOLCHAIN=local CGO_ENABLED=1 GOBIN="$BIN" GOFLAGS="-buildvcs=false -trimpath" \
    go install -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
    "github.com/opencontainers/runc@$RUNC_VERSION"
  echo "$RUNC_VERSION" > "$BIN/runc.version"
  echo "runc $RUNC_VERSION: done in $(( $(now) - t0 ))s"
}

# CoreDNS with only the plugins the test bed's Corefile uses (bind, errors, cache, template,
# kubernetes), in CoreDNS's own plugin order: the stock build also compiles every cloud
# provider's SDK, several times the work on a cold cache.
COREDNS_PLUGINS="bind errors cache template kubernetes"
COREDNS_STAMP="$COREDNS_VERSION plugins: $COREDNS_PLUGINS"

build_coredns() {
  stamp_ok "$BIN/coredns" "$COREDNS_STAMP" && { echo "coredns $COREDNS_VERSION: cached"; return; }
  local t0; t0=$(now)
  local work="$CACHE/build/coredns-$COREDNS_VERSION"
  echo "coredns $COREDNS_VERSION: building with plugins $COREDNS_PLUGINS"
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  {
    echo "package main"
    echo
    echo "import ("
    echo '	"github.com/coredns/coredns/core/dnsserver"'
    echo '	"github.com/coredns/coredns/coremain"'
    for p in $COREDNS_PLUGINS; do echo "	_ \"github.com/coredns/coredns/plugin/$p\""; done
    echo ")"
    echo
    echo "func init() {"
    echo "	dnsserver.Directives = []string{$(printf '"%s", ' $COREDNS_PLUGINS)}"
    echo "}"
    echo
    echo "func main() { coremain.Run() }"
  } > main.go
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath"
  go mod init slinky.local/coredns >/dev/null 2>&1
  go get "github.com/coredns/coredns@$COREDNS_VERSION" >/dev/null 2>&1
  go mod tidy >/dev/null 2>&1
  go build -ldflags "-s -w" -o "$BIN/coredns" .
  echo "$COREDNS_STAMP" > "$BIN/coredns.version"
  cd - >/dev/null
  echo "coredns $COREDNS_VERSION: done in $(( $(now) - t0 ))s"
}

build_pause() {
  # The sandbox ("pause") image every pod starts with; containerd looks it up by PAUSE_TAG.
  local out="$NODE/pause.oci.tar"
  stamp_ok "$out" "$KUBE_VERSION $PAUSE_TAG" && { echo "pause: cached"; return; }
  local t0; t0=$(now)
  local dir work
  dir=$(GOTOOLCHAIN=local go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  work="$CACHE/build/pause"
  rm -rf "$work" && mkdir -p "$work/rootfs"
  gcc -Os -static -Wall -Werror -DVERSION="$KUBE_VERSION" \
    -o "$work/rootfs/pause" "$dir/build/pause/linux/pause.c"
  strip "$work/rootfs/pause"
  python3 "$(dirname "$0")/oci-archive.py" --tag "$PAUSE_TAG" --rootfs "$work/rootfs" \
    --entrypoint /pause --user 65535:65535 --out "$out.tmp"
  mv -f "$out.tmp" "$out"
  echo "$KUBE_VERSION $PAUSE_TAG" > "$out.version"
  rm -rf "$work"
  echo "pause: done in $(( $(now) - t0 ))s"
}

host_packages
sid_packages
build_runc
build_pause
build_coredns
