#!/usr/bin/env bash
# Build a Debian sid root file system holding Slurm 26.05 (slurmctld, slurmd, slurmrestd,
# slurmdbd with its MySQL plugin, sackd, the client commands, the JWT plugin, pam_slurm_adopt),
# what login and compute pods need for users (sshd, SSSD with LDAP, nss extrausers) and the
# test bed's site services (MariaDB, OpenLDAP), plus etcd; cache it as a zstd tarball.
# The host's Debian is too old for Slurm's external jobs and the v0.0.44+ REST API.
set -euo pipefail

CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${SLURM_SUITE:-sid}"
TARBALL="$CACHE/slurm-root-$SUITE.tar.zst"
PACKAGES="slurmctld slurmd slurmrestd slurm-client slurm-wlm-jwt-plugin systemd-standalone-sysusers etcd-server \
slurmdbd slurm-wlm-mysql-plugin sackd libpam-slurm-adopt openssh-server openssh-client \
sssd-ldap libnss-sss libpam-sss libnss-extrausers ca-certificates mariadb-server slapd ldap-utils"
STAMP="$SUITE|$PACKAGES|v2"

install_etcd() {
  # etcd comes from the same sid packages; it runs on the host as it is.
  mkdir -p "$CACHE/bin"
  if [ ! -x "$CACHE/bin/etcd" ] || [ "$(cat "$CACHE/bin/.etcd.version" 2>/dev/null)" != "$STAMP" ]; then
    tar -C "$CACHE/bin" --zstd -xf "$TARBALL" --strip-components=3 ./usr/bin/etcd
    echo "$STAMP" > "$CACHE/bin/.etcd.version"
  fi
}

if [ -f "$TARBALL" ] && [ "$(cat "$TARBALL.stamp" 2>/dev/null)" = "$STAMP" ]; then
  install_etcd
  echo "slurm root: cached ($TARBALL)"
  exit 0
fi

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v zstd >/dev/null || need+=(zstd)
if [ ${#need[@]} -gt 0 ]; then
  echo "slurm root: installing host packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE"
root=$(mktemp -d "$CACHE/slurm-root-build.XXXXXX")
cleanup() {
  for m in dev/pts dev sys proc; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT

echo "slurm root: debootstrap $SUITE (a few minutes)"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 || {
  tail -30 "$CACHE/debootstrap.log" >&2; exit 1; }

echo 'Acquire::Check-Valid-Until "false";' > "$root/etc/apt/apt.conf.d/99slinky-no-valid-until"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
cp /etc/hosts "$root/etc/hosts"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$root/proc"
# rslave: on a host whose / is shared (systemd), unmounting $root/dev/pts in cleanup would
# otherwise propagate to the host and unmount its /dev/pts.
mount --rbind /sys "$root/sys"
mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"

echo "slurm root: apt-get install $PACKAGES"
chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
  "apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES && apt-get clean" \
  > "$CACHE/slurm-root-apt.log" 2>&1 || { tail -30 "$CACHE/slurm-root-apt.log" >&2; exit 1; }
chroot "$root" sh -c 'id restd >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin restd'
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
# Host keys are the site's (a login pod gets them from a Secret): none are baked in, where
# every cluster built from this image would share them. The packages' own databases go too.
rm -f "$root"/etc/ssh/ssh_host_*
rm -rf "$root"/var/lib/mysql/* "$root"/var/lib/ldap/* "$root"/etc/ldap/slapd.d/*
# Users come from the files, then from a ConfigMap the chart mounts at /var/lib/extrausers,
# then from a directory through SSSD (when its sidecar runs).
sed -i -E 's/^(passwd|group|shadow):.*/\1: files extrausers sss/' "$root/etc/nsswitch.conf"
# sshd in a container: no audit rights for pam_loginuid; a first login makes the home.
sed -i -E 's/^session\s+required\s+pam_loginuid.so/session optional pam_loginuid.so/' "$root/etc/pam.d/sshd"
echo 'session optional pam_mkhomedir.so umask=0077' >> "$root/etc/pam.d/sshd"

for m in dev sys proc; do umount -l "$root/$m"; done
chmod 755 "$root"
echo "slurm root: packing"
tar -C "$root" --numeric-owner -cf - . | zstd -q -T0 -10 -o "$TARBALL.tmp" -f
mv -f "$TARBALL.tmp" "$TARBALL"
echo "$STAMP" > "$TARBALL.stamp"
install_etcd
echo "slurm root: done ($(du -h "$TARBALL" | cut -f1))"
