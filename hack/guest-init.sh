#!/bin/sh
# The init of a test bed's cgroup v2 node (a QEMU guest, see build-guest.sh); tini is PID 1
# and reaps what containerd's shims leave. No systemd: this mounts the kernel file systems and
# cgroup2 with every controller enabled below the root, loads the modules containerd, the
# kubelet, kube-proxy and the bridge CNI need, brings up eth0 from the configuration the host
# shares read-only over 9p (tag "config", at /etc/slinky), mounts the containerd root disk
# (/dev/vdb) and starts containerd, the kubelet and kube-proxy, their logs on the host's 9p
# share (tag "logs"). Any failure ends the guest: tini exits, the kernel panics, QEMU stops.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
say() { echo "slinky-init: $* (uptime $(cut -d' ' -f1 /proc/uptime)s)"; }
fail() {
  say "FAILED: $*"
  exit 1
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || fail "mount cgroup2"
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount --make-rshared /
for m in 9pnet_virtio 9p virtio_net; do modprobe "$m" || fail "modprobe $m"; done
mount -t 9p -o ro,trans=virtio,version=9p2000.L config /etc/slinky || fail "mount the config share"
mount -t 9p -o trans=virtio,version=9p2000.L logs /var/log/slinky || fail "mount the logs share"
# NODE_NAME NODE_IP LINK_PREFIX GATEWAY NODE_LABELS
. /etc/slinky/guest.env
say "$NODE_NAME: controllers $(cat /sys/fs/cgroup/cgroup.controllers)"

for m in overlay bridge br_netfilter veth nf_conntrack nf_nat nf_tables nft_ct nft_nat \
  nft_chain_nat nft_masq nft_fib_inet nft_reject_inet; do
  modprobe "$m" || fail "modprobe $m"
done
echo "$NODE_NAME" > /proc/sys/kernel/hostname
tr -d - < /proc/sys/kernel/random/uuid > /etc/machine-id # the kubelet reports it
printf '127.0.0.1 localhost\n%s %s\n' "$NODE_IP" "$NODE_NAME" > /etc/hosts
cp /etc/slinky/resolv.conf /etc/resolv.conf
ip link set lo up
ip addr add "$NODE_IP/$LINK_PREFIX" dev eth0 || fail "address $NODE_IP on eth0"
ip link set eth0 up
ip route add default via "$GATEWAY" || fail "default route via $GATEWAY"
echo 1 > /proc/sys/net/ipv4/ip_forward
echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
swapoff -a 2>/dev/null
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || fail "enable cgroup controller $c"
done

mount -t ext4 /dev/vdb /var/lib/containerd || fail "mount the containerd root /dev/vdb"
containerd --config /etc/slinky/containerd.toml > /var/log/slinky/containerd.log 2>&1 &
n=0
while [ ! -S /run/containerd/containerd.sock ]; do
  n=$((n + 1))
  [ $n -gt 600 ] && fail "containerd did not make its socket in 60s"
  sleep 0.1
done
say "containerd up"
kubelet --config=/etc/slinky/kubelet.yaml --kubeconfig=/etc/slinky/kubelet.kubeconfig \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --node-labels="$NODE_LABELS" \
  --root-dir=/var/lib/kubelet --cert-dir=/var/lib/kubelet/pki --v=1 \
  > /var/log/slinky/kubelet.log 2>&1 &
kube-proxy --config=/etc/slinky/kube-proxy.yaml > /var/log/slinky/kube-proxy.log 2>&1 &
say "kubelet and kube-proxy started"
wait
fail "containerd, the kubelet and kube-proxy all exited"
