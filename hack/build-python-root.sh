#!/usr/bin/env bash
# Build a Debian root file system with Python 3 (the base of the Slinky image) and cache it as a
# zstd tarball. There is no base-image registry here, so the image starts from Debian packages.
# bookworm's Python 3.11 is the version the project targets (requires-python >= 3.11).
set -euo pipefail

CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${PYTHON_SUITE:-bookworm}"
TARBALL="$CACHE/python-root-$SUITE.tar.zst"
PACKAGES="python3 python3-venv tini"
# The image runs as this unprivileged user; a fixed uid lets pods say runAsNonRoot/runAsUser.
USER_ID=65532
STAMP="$SUITE|$PACKAGES|$USER_ID|v2"

if [ -f "$TARBALL" ] && [ "$(cat "$TARBALL.stamp" 2>/dev/null)" = "$STAMP" ]; then
  echo "python root: cached ($TARBALL)"
  exit 0
fi

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v zstd >/dev/null || need+=(zstd)
if [ ${#need[@]} -gt 0 ]; then
  echo "python root: installing host packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE"
root=$(mktemp -d "$CACHE/python-root-build.XXXXXX")
cleanup() {
  for m in dev/pts dev sys proc; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT

echo "python root: debootstrap $SUITE (a few minutes)"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" > "$CACHE/python-debootstrap.log" 2>&1 || {
  tail -30 "$CACHE/python-debootstrap.log" >&2; exit 1; }

printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$root/proc"
# rslave: on a host whose / is shared (systemd), unmounting $root/dev/pts in cleanup would
# otherwise propagate to the host and unmount its /dev/pts.
mount --rbind /sys "$root/sys"
mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"

echo "python root: apt-get install $PACKAGES"
chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
  "apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES && apt-get clean" \
  > "$CACHE/python-root-apt.log" 2>&1 || { tail -30 "$CACHE/python-root-apt.log" >&2; exit 1; }
chroot "$root" sh -c "getent group slinky >/dev/null || groupadd --gid $USER_ID slinky
  id slinky >/dev/null 2>&1 || useradd --uid $USER_ID --gid $USER_ID --no-create-home \
    --home-dir /nonexistent --shell /usr/sbin/nologin slinky"

for m in dev sys proc; do umount -l "$root/$m"; done
# What a container image does not need: package indexes, docs, man pages, translations, logs,
# and the build host's resolver (the kubelet mounts its own /etc/resolv.conf).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/var/log/* "$root"/etc/resolv.conf "$root"/usr/sbin/policy-rc.d
chmod 755 "$root"
echo "python root: packing"
tar -C "$root" --numeric-owner -cf - . | zstd -q -T0 -10 -o "$TARBALL.tmp" -f
mv -f "$TARBALL.tmp" "$TARBALL"
echo "$STAMP" > "$TARBALL.stamp"
echo "python root: done ($(du -h "$TARBALL" | cut -f1))"
