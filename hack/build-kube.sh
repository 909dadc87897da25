#!/usr/bin/env bash
# Build Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
# kubectl) of one pinned release from the Go module proxy, plus kwok and helm.
# Everything lands in $SLINKY_CACHE/bin (default ~/.cache/slinky/bin); a warm run rebuilds nothing.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
BIN="$CACHE/bin"
KUBE_BINS="kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy"
mkdir -p "$BIN"

export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -trimpath"

stamp_ok() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]; }

build_kube() {
  local need=0
  for b in $KUBE_BINS; do
    stamp_ok "$b" "$KUBE_VERSION" || need=1
  done
  [ $need = 1 ] || { echo "kube $KUBE_VERSION: cached"; return; }
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local staging="v0.${KUBE_VERSION#v1.}"
  local work="$CACHE/build/kube-$KUBE_VERSION"
  mkdir -p "$work"
  cd "$work"
  echo "kube $KUBE_VERSION: resolving module"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  {
    echo "module slinky.local/kubebuild"
    echo
    grep -E '^go [0-9]' "$gomod"
    grep -E '^godebug ' "$gomod" || true
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    grep -E '=> \./staging/src/' "$gomod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package kubebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  echo "kube $KUBE_VERSION: go mod tidy"
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
  local ld=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "kube $KUBE_VERSION: building (10-25 min cold on 2 cores)"
  mkdir -p out
  go build -tags selinux,notest,grpcnotrace -ldflags "-s -w $ld" -o out/ \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy
  for b in $KUBE_BINS; do
    mv -f "out/$b" "$BIN/$b"
    echo "$KUBE_VERSION" > "$BIN/.$b.version"
  done
}

build_go_tool() { # name module version
  local name=$1 mod=$2 ver=$3
  stamp_ok "$name" "$ver" && { echo "$name $ver: cached"; return; }
  echo "$name $ver: building"
  GOBIN="$BIN" go install -ldflags "-s -w" "$mod@$ver"
  echo "$ver" > "$BIN/.$name.version"
}

kwok_stages() {
  # kwok needs stage definitions for node heartbeats and the pod lifecycle; they ship in its module.
  local out="$CACHE/kwok-stages.yaml"
  [ -s "$out" ] && [ "$(cat "$out.version" 2>/dev/null)" = "$KWOK_VERSION" ] && return
  local dir
  dir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  : > "$out.tmp"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [ -f "$dir/kustomize/stage/$f" ] || { echo "kwok stage $f missing in $dir" >&2; exit 1; }
    { echo "---"; cat "$dir/kustomize/stage/$f"; } >> "$out.tmp"
  done
  mv -f "$out.tmp" "$out"
  echo "$KWOK_VERSION" > "$out.version"
}

what="${1:-all}"
case "$what" in
  kube) build_kube ;;
  tools)
    build_go_tool kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
    kwok_stages
    build_go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
  all)
    build_go_tool kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
    kwok_stages
    build_go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
    build_kube ;;
  *) echo "usage: $0 [all|kube|tools]" >&2; exit 2 ;;
esac
