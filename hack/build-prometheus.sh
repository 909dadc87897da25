#!/usr/bin/env bash
# Fetch Prometheus and promtool for the test bed: Debian sid's packages, downloaded with a
# private apt configuration (the host's apt state stays untouched) and unpacked; the two
# binaries are Go programs needing only glibc >= 2.34, so they run on the host as they are.
# They land in $SLINKY_CACHE/bin (default ~/.cache/slinky/bin) with a version stamp; a warm
# run is a stamp check only. Debian's build has no web UI (the HTTP API is all we use).
set -euo pipefail

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-3.5.3+ds1-6}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
BIN="$CACHE/bin"
STAMP="prometheus=$PROMETHEUS_VERSION promtool=$PROMETHEUS_VERSION"

stamp_ok() { [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ] \
  && [ "$(cat "$BIN/prometheus.version" 2>/dev/null)" = "$STAMP" ]; }

stamp_ok && { echo "prometheus $PROMETHEUS_VERSION: cached"; exit 0; }

mkdir -p "$BIN" "$CACHE/build"
# Worktrees share the cache: one fetch at a time, and the next one finds the stamp.
exec 9>"$CACHE/build/prometheus.lock"
flock 9
stamp_ok && { echo "prometheus $PROMETHEUS_VERSION: cached"; exit 0; }

t0=$(date +%s)
apt="$CACHE/build/apt-sid-prometheus"
rm -rf "$apt"
trap 'rm -rf "$apt"' EXIT
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
echo "prometheus $PROMETHEUS_VERSION: apt-get download from sid"
APT_CONFIG="$apt/apt.conf" apt-get update -qq
(cd "$apt/debs" && APT_CONFIG="$apt/apt.conf" apt-get download -qq \
  "prometheus=$PROMETHEUS_VERSION" "promtool=$PROMETHEUS_VERSION") || {
  echo "prometheus: version $PROMETHEUS_VERSION is not in sid any more;" \
    "set PROMETHEUS_VERSION to the one \`apt-cache policy prometheus\` offers there" >&2
  exit 1
}
for deb in "$apt"/debs/*.deb; do dpkg-deb -x "$deb" "$apt/root"; done
for b in prometheus promtool; do
  install -m 0755 "$apt/root/usr/bin/$b" "$BIN/$b.tmp"
  mv -f "$BIN/$b.tmp" "$BIN/$b"
done
"$BIN/prometheus" --version >/dev/null
"$BIN/promtool" --version >/dev/null
echo "$STAMP" > "$BIN/prometheus.version"
echo "prometheus $PROMETHEUS_VERSION: done in $(( $(date +%s) - t0 ))s"
