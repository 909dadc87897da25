#!/usr/bin/env bash
# Build what a cgroup v2 node of the test bed boots in QEMU (software emulation, TCG): Debian
# trixie's kernel (uncompressed, booted through its PVH entry), a busybox initramfs that loads
# the virtio disk and ext4 modules and switches to the root disk, and that root disk: an ext4
# image made with `mke2fs -d` (no loop mount) from an mmdebstrap'ed trixie holding iproute2,
# nftables, mount, kmod, tini, the kernel's modules, containerd and the CNI plugins (the sid
# packages build-node.sh unpacked), kubelet, kube-proxy and runc (build-kube.sh, build-node.sh)
# and the guest's init (guest-init.sh next to this script). Each guest boots a copy-on-write
# qcow2 overlay of that image, made by the test bed (slinky_testbed.guests), which also builds
# the second disk: a containerd root holding the test bed's images.
# Everything lands under $SLINKY_CACHE/guest (default ~/.cache/slinky/guest); a warm run
# rebuilds nothing.
set -euo pipefail

KERNEL_PACKAGE="${KERNEL_PACKAGE:-linux-image-6.12.117+deb13-amd64}"
KERNEL_VERSION="${KERNEL_VERSION:-6.12.117-1}"
SUITE="${GUEST_SUITE:-trixie}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# crun: the runtime of the guests' second containerd handler (slinky_testbed.guests), which
# hands a user-namespaced container its cgroup (runc with the cgroupfs driver leaves it the
# host root's).
PACKAGES="iproute2,nftables,conntrack,mount,util-linux,kmod,procps,iputils-ping,tini,libseccomp2,crun"
CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
BIN="$CACHE/bin"
NODE="$CACHE/node"
G="$CACHE/guest"
HERE="$(cd "$(dirname "$0")" && pwd)"
NICE="nice -n 19"
mkdir -p "$G"

stamp_ok() { [ -e "$1" ] && [ "$(cat "$1.version" 2>/dev/null)" = "$2" ]; }
now() { date +%s; }

host_packages() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  command -v qemu-img >/dev/null || need+=(qemu-utils)
  [ -x /bin/busybox ] && /bin/busybox --list | grep -qx switch_root || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
  command -v xz >/dev/null || need+=(xz-utils)
  command -v zstd >/dev/null || need+=(zstd)
  command -v depmod >/dev/null || need+=(kmod)
  command -v mke2fs >/dev/null || need+=(e2fsprogs)
  [ ${#need[@]} -eq 0 ] && return
  echo "guest: installing host packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $NICE apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
}

kernel() {
  # The kernel package unpacked; vmlinux is the ELF inside Debian's XZ-compressed bzImage:
  # QEMU starts it through its PVH entry, which spares TCG the emulated decompression.
  local want="$KERNEL_PACKAGE=$KERNEL_VERSION"
  stamp_ok "$G/kernel" "$want" && { echo "guest kernel $KERNEL_PACKAGE: cached"; return; }
  local t0; t0=$(now)
  local apt="$CACHE/build/apt-guest"
  rm -rf "$apt" "$G/kernel.tmp"
  mkdir -p "$apt"/{lists/partial,archives/partial,parts,prefs,debs} "$G/kernel.tmp"
  touch "$apt/status"
  echo "deb $MIRROR $SUITE main" > "$apt/sources.list"
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
  echo "guest kernel: apt-get download $want"
  APT_CONFIG="$apt/apt.conf" apt-get update -qq
  (cd "$apt/debs" && APT_CONFIG="$apt/apt.conf" apt-get download -qq "$want")
  dpkg-deb -x "$apt"/debs/*.deb "$G/kernel.tmp"
  local kv; kv=$(ls "$G/kernel.tmp/usr/lib/modules")
  depmod -b "$G/kernel.tmp/usr" "$kv"
  # trixie's bzImage holds a zstd frame (bookworm's an XZ stream).
  local vz="$G/kernel.tmp/boot/vmlinuz-$kv" off
  off=$(LC_ALL=C grep -aboP '\x28\xb5\x2f\xfd' "$vz" | awk -F: 'NR==1{print $1}' || true)
  [ -n "$off" ] || { echo "no zstd frame in $vz" >&2; exit 1; }
  tail -c +$((off + 1)) "$vz" | zstd -dcq > "$G/kernel.tmp/vmlinux" 2>/dev/null || true
  [ "$(head -c4 "$G/kernel.tmp/vmlinux" | tail -c3)" = ELF ] || { echo "no ELF kernel in $vz" >&2; exit 1; }
  echo "$kv" > "$G/kernel.tmp/release"
  rm -rf "$G/kernel" && mv "$G/kernel.tmp" "$G/kernel"
  echo "$want" > "$G/kernel.version"
  rm -rf "$apt"
  echo "guest kernel $kv: done in $(( $(now) - t0 ))s"
}

# The initramfs: busybox, the modules the root disk needs (decompressed: busybox's insmod
# takes plain .ko), and an /init that mounts /dev/vda and hands over to tini + guest-init.
INITRD_MODULES="virtio_pci virtio_blk ext4"

initrd() {
  local kv; kv=$(cat "$G/kernel/release")
  local want; want="$kv $INITRD_MODULES $(sha1sum < "$0" | cut -c1-12)"
  stamp_ok "$G/initrd.gz" "$want" && { echo "guest initramfs: cached"; return; }
  local i="$CACHE/build/guest-initrd"
  rm -rf "$i" && mkdir -p "$i"/{bin,proc,sys,dev,newroot,mods}
  cp /bin/busybox "$i/bin/"
  for a in sh mount umount cat sleep insmod switch_root; do ln -s busybox "$i/bin/$a"; done
  for m in $INITRD_MODULES; do
    modprobe -d "$G/kernel/usr" -S "$kv" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!s[$0]++' | while read -r f; do
    local name; name=$(basename "$f" .xz)
    xz -dc "$f" > "$i/mods/$name"
    echo "$name" >> "$i/mods/order"
  done
  cat > "$i/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null; done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
mount -t ext4 -o rw /dev/vda /newroot || { echo "slinky-initramfs: cannot mount /dev/vda"; exit 1; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /usr/bin/tini -- /sbin/slinky-init
EOF
  chmod +x "$i/init"
  (cd "$i" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$G/initrd.gz.tmp")
  mv -f "$G/initrd.gz.tmp" "$G/initrd.gz"
  echo "$want" > "$G/initrd.gz.version"
  rm -rf "$i"
  echo "guest initramfs: done"
}

debian() {
  # The Debian part of the root, as a tarball: rebuilt only when the suite or packages change.
  local want="$SUITE $PACKAGES"
  stamp_ok "$G/debian.tar" "$want" && { echo "guest Debian $SUITE: cached"; return; }
  local t0; t0=$(now)
  echo "guest Debian $SUITE: mmdebstrap (niced) with $PACKAGES"
  $NICE mmdebstrap --quiet --format=tar --variant=essential --include="$PACKAGES" \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --dpkgopt='path-exclude=/usr/share/{doc,man,locale,info}/*' \
    "$SUITE" "$G/debian.tar.tmp" "$MIRROR"
  mv -f "$G/debian.tar.tmp" "$G/debian.tar"
  echo "$want" > "$G/debian.tar.version"
  echo "guest Debian $SUITE: done in $(( $(now) - t0 ))s"
}

rootfs() {
  local kv; kv=$(cat "$G/kernel/release")
  local want
  want="$(cat "$G/debian.tar.version") kernel $kv $(cat "$NODE/sid.version") runc $(cat "$BIN/runc.version")"
  want="$want kube $(cat "$BIN/.kubelet.version") init $(sha1sum < "$HERE/guest-init.sh" | cut -c1-12)"
  stamp_ok "$G/root.img" "$want" && { echo "guest root disk: cached"; return; }
  local t0; t0=$(now)
  local r="$CACHE/build/guest-root"
  rm -rf "$r" && mkdir -p "$r"
  tar -C "$r" -xf "$G/debian.tar"
  mkdir -p "$r/usr/local/bin" "$r/opt/cni/bin" "$r/usr/lib/modules" "$r/etc/slinky" \
    "$r/var/log/slinky" "$r/var/lib/containerd" "$r/var/lib/kubelet" "$r/etc/cni/net.d"
  for b in kubelet kube-proxy runc; do cp -L "$BIN/$b" "$r/usr/local/bin/"; done
  for b in containerd containerd-shim-runc-v2 ctr; do cp -L "$NODE/sid/usr/bin/$b" "$r/usr/local/bin/"; done
  cp -a "$NODE/sid/usr/lib/cni/." "$r/opt/cni/bin/"
  cp -a "$G/kernel/usr/lib/modules/$kv" "$r/usr/lib/modules/"
  install -m 0755 "$HERE/guest-init.sh" "$r/sbin/slinky-init"
  rm -rf "$r"/var/cache/apt/* "$r"/var/lib/apt/lists/*
  # Room for the kubelet's and containerd's state, pod logs and emptyDirs (images live on the
  # second disk); the file is sparse, and each guest writes only into its qcow2 overlay.
  local used; used=$(du -sm "$r" | cut -f1)
  rm -f "$G/root.img.tmp"
  truncate -s "$(( used + 2048 ))M" "$G/root.img.tmp"
  mke2fs -q -t ext4 -L slinky-root -d "$r" -E root_owner=0:0 "$G/root.img.tmp"
  mv -f "$G/root.img.tmp" "$G/root.img"
  echo "$want" > "$G/root.img.version"
  rm -rf "$r"
  echo "guest root disk: done in $(( $(now) - t0 ))s ($(du -h --apparent-size "$G/root.img" | cut -f1) apparent, $(du -h "$G/root.img" | cut -f1) used)"
}

for f in "$BIN/kubelet" "$BIN/kube-proxy" "$BIN/runc" "$NODE/sid.version"; do
  [ -e "$f" ] || { echo "guest: $f is missing: run build-kube.sh and build-node.sh first" >&2; exit 1; }
done
host_packages
kernel
initrd
debian
rootfs
