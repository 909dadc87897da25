#!/usr/bin/env bash
# Build the one layer the slurm-hpc image adds to the Slurm image: MPI (OpenMPI with PRRTE and
# PMIx, MPICH, mpi4py), the HPC Challenge benchmark (hpcc), CPU PyTorch, and job container
# runtimes (crun with uidmap for Slurm's --container, apptainer). The packages are installed
# with apt in an overlay over the cached Slurm root (hack/build-slurm-root.sh), so the overlay's
# upper directory is exactly the layer; cached as a zstd tarball by a stamp of the base root and
# the package list. images/slurm-hpc/Containerfile describes the same image.
set -euo pipefail

CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
SUITE="${SLURM_SUITE:-sid}"
BASE="$CACHE/slurm-root-$SUITE.tar.zst"
TARBALL="$CACHE/slurm-hpc-layer-$SUITE.tar.zst"
PACKAGES="openmpi-bin python3-mpi4py mpich hpcc python3-torch crun uidmap apptainer squashfs-tools \
busybox-static"
[ -f "$BASE" ] || { echo "hpc layer: $BASE missing: run hack/build-slurm-root.sh" >&2; exit 1; }
STAMP="$(cat "$BASE.stamp")|$(stat -c %s.%Y "$BASE")|$PACKAGES|v2"

if [ -f "$TARBALL" ] && [ "$(cat "$TARBALL.stamp" 2>/dev/null)" = "$STAMP" ]; then
  echo "hpc layer: cached ($TARBALL)"
  exit 0
fi

work=$(mktemp -d "$CACHE/slurm-hpc-build.XXXXXX")
lower="$work/lower" upper="$work/upper" merged="$work/merged"
cleanup() {
  for m in dev sys proc; do umount -l "$merged/$m" 2>/dev/null || true; done
  umount -l "$merged" 2>/dev/null || true
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
mkdir -p "$lower" "$upper" "$merged" "$work/ovl"
t0=$(date +%s)
tar -C "$lower" --zstd -xpf "$BASE"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work/ovl" "$merged"
# The Slurm root has the resolv.conf of its build (a container gets its own mounted over it).
[ -e "$merged/etc/resolv.conf" ] || cp /etc/resolv.conf "$merged/etc/resolv.conf"
mount -t proc proc "$merged/proc"
mount --rbind /sys "$merged/sys"
mount --make-rslave "$merged/sys"
mount --rbind /dev "$merged/dev"
mount --make-rslave "$merged/dev"

# No manuals, documentation (but the copyright files) or translations: jobs do not read them.
cat > "$merged/etc/dpkg/dpkg.cfg.d/90slinky-nodoc" <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
EOF
echo "hpc layer: apt-get install $PACKAGES"
chroot "$merged" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
  "apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES && apt-get clean" \
  > "$CACHE/slurm-hpc-apt.log" 2>&1 || { tail -30 "$CACHE/slurm-hpc-apt.log" >&2; exit 1; }
# Debian's OpenMPI confines its TCP transport to the loopback interface ("silence a warning when
# testing locally"): every job across two nodes then fails with "Unable to find reachable
# pairing". OpenMPI's own default (every interface but loopback) is the one pods need.
sed -i -E '/^[[:space:]]*btl_tcp_if_include[[:space:]]*=[[:space:]]*lo[[:space:]]*$/d' \
  "$merged/etc/openmpi/openmpi-mca-params.conf"
if grep -q '^[[:space:]]*btl_tcp_if_include' "$merged/etc/openmpi/openmpi-mca-params.conf"; then
  echo "hpc layer: btl_tcp_if_include is still set in openmpi-mca-params.conf" >&2; exit 1
fi
rm -rf "$merged"/var/lib/apt/lists/* "$merged"/var/cache/apt/*.bin "$merged"/var/cache/debconf/*-old \
  "$merged"/var/lib/dpkg/*-old "$merged"/var/log/apt/* "$merged"/var/log/dpkg.log
for m in dev sys proc; do umount -l "$merged/$m"; done
umount "$merged"

# The upper directory as an OCI layer: overlayfs marks a removed file with a 0:0 character
# device and a directory replaced as a whole with an opaque attribute; OCI layers say both with
# .wh. files.
find "$upper" -type c | while read -r f; do
  rm -f "$f"
  touch "$(dirname "$f")/.wh.$(basename "$f")"
done
python3 - "$upper" <<'PY'
import os, sys
for d, _, _ in os.walk(sys.argv[1]):
    try:
        opaque = os.getxattr(d, "trusted.overlay.opaque") == b"y"
    except OSError:
        opaque = False
    if opaque:
        open(os.path.join(d, ".wh..wh..opq"), "w").close()
PY
# Mount points the chroot needed are the lower's: nothing of them belongs in the layer.
rmdir "$upper/proc" "$upper/sys" "$upper/dev" 2>/dev/null || true
echo "hpc layer: packing ($(du -sh "$upper" | cut -f1) installed)"
tar -C "$upper" --numeric-owner --xattrs-exclude='trusted.*' -cf - . | zstd -q -T0 -10 -o "$TARBALL.tmp" -f
mv -f "$TARBALL.tmp" "$TARBALL"
echo "$STAMP" > "$TARBALL.stamp"
echo "hpc layer: done in $(( $(date +%s) - t0 )) s ($(du -h "$TARBALL" | cut -f1))"
