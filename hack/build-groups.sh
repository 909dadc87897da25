#!/usr/bin/env bash
# Build the JobSet and LeaderWorkerSet controllers of pinned releases from the Go module proxy
# (one go.mod requiring both, so the dependencies they share compile once), and copy out the
# CRDs and webhook manifests of the same releases. The slurm-bridge e2e tests run both
# controllers against the test bed's apiserver, so the pods in the gang tests are made by the
# controllers users run.
#
# Binaries land in $SLINKY_CACHE/bin (jobset-controller, lws-controller, each with a version
# stamp), manifests in $SLINKY_CACHE/groups/<name>-<version>/; a warm run rebuilds nothing.
set -euo pipefail

JOBSET_VERSION="${JOBSET_VERSION:-v0.11.0}"
LWS_VERSION="${LWS_VERSION:-v0.8.0}"
CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
BIN="$CACHE/bin"
mkdir -p "$BIN"

export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -trimpath"

stamp_ok() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]; }

module_dir() { # module@version -> its directory in the module cache
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

manifests() { # name version module-dir crd-file webhook-dir
  local out="$CACHE/groups/$1-$2"
  [ -s "$out/crd.yaml" ] && [ -s "$out/webhooks.yaml" ] && return
  mkdir -p "$out"
  cp "$3/$4" "$out/crd.yaml.tmp"
  cp "$3/$5/manifests.yaml" "$out/webhooks.yaml.tmp"
  chmod u+w "$out"/*.tmp
  mv -f "$out/crd.yaml.tmp" "$out/crd.yaml"
  mv -f "$out/webhooks.yaml.tmp" "$out/webhooks.yaml"
}

jobset_dir=$(module_dir "sigs.k8s.io/jobset@$JOBSET_VERSION")
lws_dir=$(module_dir "sigs.k8s.io/lws@$LWS_VERSION")
manifests jobset "$JOBSET_VERSION" "$jobset_dir" config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml config/components/webhook
manifests lws "$LWS_VERSION" "$lws_dir" config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml config/webhook

if stamp_ok jobset-controller "$JOBSET_VERSION" && stamp_ok lws-controller "$LWS_VERSION"; then
  echo "jobset $JOBSET_VERSION, lws $LWS_VERSION: cached"
  exit 0
fi

work="$CACHE/build/groups-jobset-$JOBSET_VERSION-lws-$LWS_VERSION"
mkdir -p "$work"
cd "$work"
cat > go.mod <<EOF
module slinky.local/groupsbuild

go 1.25.0

require (
	sigs.k8s.io/jobset $JOBSET_VERSION
	sigs.k8s.io/lws $LWS_VERSION
)
EOF
cat > tools.go <<'GO'
//go:build tools

package groupsbuild

import (
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/lws/cmd"
)
GO
echo "jobset $JOBSET_VERSION, lws $LWS_VERSION: resolving modules"
go mod tidy -e >/dev/null 2>&1 || true
go get "sigs.k8s.io/jobset@$JOBSET_VERSION" "sigs.k8s.io/lws@$LWS_VERSION" >/dev/null
echo "jobset $JOBSET_VERSION, lws $LWS_VERSION: building (a few minutes cold on 2 cores)"
mkdir -p out
go build -ldflags "-s -w" -o out/jobset-controller sigs.k8s.io/jobset
go build -ldflags "-s -w" -o out/lws-controller sigs.k8s.io/lws/cmd
mv -f out/jobset-controller "$BIN/jobset-controller"
echo "$JOBSET_VERSION" > "$BIN/.jobset-controller.version"
mv -f out/lws-controller "$BIN/lws-controller"
echo "$LWS_VERSION" > "$BIN/.lws-controller.version"
