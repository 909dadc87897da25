"""Real Kubernetes nodes for the test bed: per node a containerd, a CNI bridge and a kubelet;
per test bed one kube-proxy (nftables mode) and one CoreDNS.

Everything of one test bed lives in its own network namespace (`Names.netns`), joined to the
host by one veth pair: the host side carries the address the apiserver and slurmctld serve pods
on, and the namespace routes nothing else, so no pod packet can leave the machine. Node
bridges, pod veths, kube-proxy's nft tables and the forwarding sysctl stay inside that
namespace, so a second test bed beside this one never collides with it, and deleting the
namespace takes all of them away. Every process a node starts (containerd, its shims, the
containers, the kubelet) lives in cgroups named after the test bed, which is how `cleanup`
finds what a killed run left behind: by PID from our own cgroups, never by process name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from slinky_testbed import paths, procs

SERVICE_CIDR = "10.0.0.0/24"
DNS_SERVICE_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
REAL_NODE_LABEL_VALUE = "real"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The second octet of the /16 a test bed's pods and nodes live in is picked from this range.
OCTETS = range(64, 192)
NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "runc")


class NodesError(RuntimeError):
    """A real node could not be set up; the message says what failed."""


@dataclass(frozen=True)
class Names:
    """Every host-wide name and address of one test bed's nodes, derived from its directory
    (names) and from the octet chosen at `up` (addresses)."""

    tag: str
    octet: int

    @classmethod
    def for_dir(cls, state_dir: Path, octet: int = 0) -> Names:
        digest = hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:6]
        return cls(f"slk{digest}", octet)

    @property
    def netns(self) -> str:
        return self.tag

    @property
    def host_veth(self) -> str:
        return f"{self.tag}h"  # 10 characters: interface names stop at 15

    @property
    def host_ip(self) -> str:
        """The host side of the veth: the apiserver and slurmctld are served here."""
        return f"10.{self.octet}.0.1"

    @property
    def ns_ip(self) -> str:
        """The namespace side of the veth: CoreDNS listens here."""
        return f"10.{self.octet}.0.2"

    @property
    def cidr(self) -> str:
        return f"10.{self.octet}.0.0/16"

    def node_ip(self, index: int) -> str:
        return f"10.{self.octet}.{index + 1}.1"

    def node_subnet(self, index: int) -> str:
        return f"10.{self.octet}.{index + 1}.0/24"

    def bridge(self, index: int) -> str:
        return f"br{index}"  # inside the test bed's namespace: no clash with the host's

    @property
    def cgroup_system(self) -> str:
        """Node daemons (containerd and its shims, kubelets, kube-proxy, CoreDNS)."""
        return f"{self.tag}-system"

    def cgroup_node(self, index: int) -> str:
        """The kubelet's cgroupRoot: every pod of node `index`."""
        return f"{self.tag}-node{index}"


def node_name(index: int) -> str:
    return f"node-{index}"


# ---------------------------------------------------------------- small helpers


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise NodesError(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def in_netns(names: Names, *argv: str) -> list[str]:
    """argv run inside the test bed's network namespace and nothing else (the mount namespace
    stays the host's, so the kubelet's mounts are the ones containerd sees)."""
    return ["nsenter", f"--net=/run/netns/{names.netns}", "--", *argv]


def _v1_controllers() -> list[Path]:
    """The mounted cgroup v1 hierarchies (this machine runs a hybrid layout)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")
        if len(fields) == 2 and fields[1].startswith("cgroup "):
            out.append(Path(line.split()[4]))
    return sorted(out)


def _cgroups_of(names: Names) -> Iterator[Path]:
    """Every cgroup directory (all hierarchies) named after this test bed, deepest first."""
    for ctrl in _v1_controllers():
        for top in sorted(ctrl.glob(f"{names.tag}-*")):
            if top.is_dir():
                yield from sorted(
                    (d for d in top.rglob("*") if d.is_dir()),
                    key=lambda d: len(d.parts),
                    reverse=True,
                )
                yield top


def make_cgroup(name: str) -> None:
    """Create /<name> in every v1 hierarchy; cpuset needs cpus and mems before it takes tasks."""
    for ctrl in _v1_controllers():
        path = ctrl / name
        path.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (path / f).exists() and not (path / f).read_text().strip():
                (path / f).write_text((ctrl / f).read_text())


def node_daemon(names: Names, *argv: str) -> list[str]:
    """argv as a node daemon: moved into the test bed's system cgroup (in every hierarchy, so
    its children, e.g. containerd's shims, are found there later), then run inside the test
    bed's network namespace. The shell and nsenter exec, so the PID stays the daemon's."""
    files = " ".join(
        shlex.quote(str(ctrl / names.cgroup_system / "cgroup.procs")) for ctrl in _v1_controllers()
    )
    script = f'for f in {files}; do echo $$ > "$f"; done; exec "$@"'
    return ["sh", "-c", script, "sh", *in_netns(names, *argv)]


def _pids_in_cgroups(names: Names) -> set[int]:
    pids: set[int] = set()
    for d in _cgroups_of(names):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    pids.discard(os.getpid())
    return pids


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first (mountinfo escapes spaces as \\040)."""
    prefix = str(root)
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            out.append(point)
    return sorted(set(out), key=lambda p: p.count("/"), reverse=True)


def _links() -> set[str]:
    return {
        line.split(":")[1].strip().split("@")[0]
        for line in _run("ip", "-o", "link").stdout.splitlines()
    }


def leftovers(names: Names, nodes_dir: Path) -> list[str]:
    """What of this test bed's nodes still exists on the host (empty after a clean `down`)."""
    out = []
    if Path(f"/run/netns/{names.netns}").exists():
        out.append(f"netns {names.netns}")
    if names.host_veth in _links():
        out.append(f"link {names.host_veth}")
    out += [f"cgroup {d}" for d in _cgroups_of(names)]
    out += [f"mount {m}" for m in _mounts_under(nodes_dir)]
    out += [f"pid {p}" for p in sorted(_pids_in_cgroups(names))]
    return out


def cleanup(names: Names, nodes_dir: Path, *, log: Callable[[str], None]) -> None:
    """Remove everything of this test bed's nodes, from names alone (works after a SIGKILL of
    the run that made them): processes in our cgroups, mounts under the nodes directory, the
    network namespace (with its bridges, veths and nft tables), the host veth and the cgroups."""
    deadline = time.monotonic() + 30
    while pids := _pids_in_cgroups(names):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        procs.reap()  # our own children (containerd, kubelets) would stay as zombies
        if time.monotonic() > deadline:
            raise NodesError(f"processes in cgroups {names.tag}-* survive SIGKILL: {sorted(pids)}")
        time.sleep(0.1)
    for point in _mounts_under(nodes_dir):
        if _run("umount", point, check=False).returncode != 0:
            _run("umount", "-l", point, check=False)
    if Path(f"/run/netns/{names.netns}").exists():
        _run("ip", "netns", "delete", names.netns)
    if names.host_veth in _links():
        _run("ip", "link", "delete", names.host_veth, check=False)
    for d in _cgroups_of(names):
        deadline = time.monotonic() + 10
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise NodesError(f"cannot remove cgroup {d}: {e}") from e
                time.sleep(0.1)
    if nodes_dir.exists():
        _run("rm", "-rf", "--one-file-system", str(nodes_dir))
    log(f"real nodes of {names.tag} cleaned up")


# ---------------------------------------------------------------- network


@contextlib.contextmanager
def network_lock() -> Iterator[None]:
    """Held while a test bed picks its 10.X.0.0/16 and sets it up (one host-wide lock file)."""
    path = paths.cache_dir() / "testbeds" / ".network.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# Kubelets bind this path whatever their --root-dir; see Testbed._start_kubelet.
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
DEVICE_PLUGIN_RACE = "device-plugins/kubelet.sock: bind: address already in use"


@contextlib.contextmanager
def kubelet_start_lock() -> Iterator[None]:
    """Held while one kubelet of any test bed on the host starts."""
    path = paths.cache_dir() / "testbeds" / ".kubelet-start.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def device_plugin_socket_mtime() -> int | None:
    try:
        return DEVICE_PLUGIN_SOCKET.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def pick_octet(names: Names) -> int:
    """The second octet of a 10.X.0.0/16 no route or address of this host uses yet, starting
    from one derived from the test bed's name so the same test bed usually gets the same."""
    used: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for line in _run("ip", "-4", "-o", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        dst = words[1] if words[0] in ("local", "broadcast", "unreachable") else words[0]
        with contextlib.suppress(ValueError):
            used.add(ipaddress.ip_network(dst, strict=False))
    start = int(names.tag[3:], 16) % len(OCTETS)
    for k in range(len(OCTETS)):
        octet = OCTETS[(start + k) % len(OCTETS)]
        net = ipaddress.ip_network(f"10.{octet}.0.0/16")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return octet
    raise NodesError("no free 10.X.0.0/16 for the test bed's pod network")


# Every kubelet (cAdvisor) and containerd holds inotify instances; Debian's default of 128
# per user runs out with a few test beds side by side ("inotify_init: too many open files").
INOTIFY_FLOORS = {"max_user_instances": 8192, "max_user_watches": 524288}


def raise_inotify_limits() -> None:
    """Raise the host's inotify limits to the floors above; never lower them."""
    for key, floor in INOTIFY_FLOORS.items():
        path = Path("/proc/sys/fs/inotify") / key
        if int(path.read_text()) < floor:
            path.write_text(str(floor))


def setup_network(names: Names, count: int) -> None:
    """The namespace, the veth to the host, one bridge per node and the service route."""
    raise_inotify_limits()
    ns = names.netns
    _run("ip", "netns", "add", ns)
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _run("ip", "link", "add", names.host_veth, "type", "veth", "peer", "name", "host0", "netns", ns)
    _run("ip", "addr", "add", f"{names.host_ip}/24", "dev", names.host_veth)
    _run("ip", "link", "set", names.host_veth, "up")
    _run("ip", "-n", ns, "addr", "add", f"{names.ns_ip}/24", "dev", "host0")
    _run("ip", "-n", ns, "link", "set", "host0", "up")
    # The host reaches nodes and pods through the namespace (apiserver -> kubelet,
    # slurmctld -> slurmd); the namespace has no default route at all.
    _run("ip", "route", "add", names.cidr, "via", names.ns_ip, "dev", names.host_veth)
    for i in range(count):
        br = names.bridge(i)
        _run("ip", "-n", ns, "link", "add", br, "type", "bridge")
        _run("ip", "-n", ns, "addr", "add", f"{names.node_ip(i)}/24", "dev", br)
        _run("ip", "-n", ns, "link", "set", br, "up")
    # ClusterIPs exist only as kube-proxy's DNAT rules; locally originated traffic (hostNetwork
    # pods, the kubelet) needs a route before those rules see it, and it must stay local.
    _run("ip", "-n", ns, "link", "add", "svc0", "type", "bridge")  # no dummy module here
    _run("ip", "-n", ns, "link", "set", "svc0", "up")
    _run("ip", "-n", ns, "route", "add", SERVICE_CIDR, "dev", "svc0")
    # Forwarding between the node bridges, inside the namespace only (the host's stays off).
    _run(*in_netns(names, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"))


# ---------------------------------------------------------------- configuration files


def containerd_config(
    node_dir: Path,
    root: Path,
    cni_bin: Path,
    *,
    cni_conf: Path | None = None,
    runc: Path | None = None,
) -> str:
    """containerd of one node. Its `root` (images, snapshots) outlives the node so that the next
    `up` need not import and unpack the images again; its state goes with the node. A v2 node's
    guest (slinky_testbed.guests) gives its own CNI configuration directory and runc."""
    d = node_dir / "containerd"
    return f"""version = 3
root = "{root}"
state = "{d / "state"}"
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{d / "containerd.sock"}"

[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # No CAP_SYS_RESOURCE in this VM: runc cannot lower oom_score_adj below the parent's.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc or paths.bin_dir() / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf or node_dir / "cni"}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(names: Names, index: int, node_dir: Path) -> str:
    return bridge_cni_config(
        names.bridge(index), names.node_subnet(index), names.node_ip(index), node_dir / "cni-ipam"
    )


def bridge_cni_config(bridge: str, subnet: str, gateway: str, ipam_dir: Path) -> str:
    """The bridge CNI plugin on `bridge`, pod addresses from `subnet`, `gateway` the node's."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "testbed",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": True,
                    # Never rewrite pod traffic to look like the host's: it stays inside.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(ipam_dir),
                        "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "loopback"},
            ],
        },
        indent=2,
    )


def kubelet_config(names: Names, index: int, node_dir: Path, ca: Path, dns_ip: str) -> str:
    ip = names.node_ip(index)
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": ip,
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        # cgroup v1 (hybrid) here, and no systemd: cgroupfs under a root of our own.
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{names.cgroup_node(index)}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node_dir / 'containerd' / 'containerd.sock'}",
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # Pods with dnsPolicy Default (and the kubelet's own view) get the test bed's DNS, not
        # the machine's resolver: no query may leave the machine.
        "resolvConf": str(node_dir / "resolv.conf"),
        "podLogsDir": str(node_dir / "pod-logs"),
        # Images cannot be pulled again here: never garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "0s",
        "httpCheckFrequency": "0s",
        "maxPods": 110,
        "containerLogMaxSize": "1Mi",
        "shutdownGracePeriod": "0s",
    }
    (node_dir / "resolv.conf").write_text(f"nameserver {dns_ip}\n")
    return yaml.safe_dump(config)


def kube_proxy_config(names: Names, kubeconfig: Path, hostname: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": hostname,
            "bindAddress": names.ns_ip,
            "healthzBindAddress": f"{names.ns_ip}:10256",
            "metricsBindAddress": f"{names.ns_ip}:10249",
            "clusterCIDR": names.cidr,
            # 0 = leave the host-wide conntrack sysctls alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "nodePortAddresses": [f"{names.ns_ip}/32"],
        }
    )


def corefile(names: Names, kubeconfig: Path) -> str:
    """Cluster names only; everything else is NXDOMAIN at once (no forwarder)."""
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {names.ns_ip}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} slinky-testbed
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
.:53 {{
    bind {names.ns_ip}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


# ---------------------------------------------------------------- images


def image_archives() -> list[Path]:
    """The pause image and every image `make images` built (if it ran)."""
    out = [paths.cache_dir() / "node" / "pause.oci.tar"]
    index = paths.cache_dir() / "images" / "images.json"
    if index.exists():
        for img in json.loads(index.read_text()).get("images", []):
            archive = Path(img["archive"])
            if archive.exists():
                out.append(archive)
    return out


def import_images(socket: Path, archives: list[Path], stamp: Path) -> bool:
    """Import the archives unless `stamp` says this containerd root already holds exactly
    these (same paths, sizes and times). Returns whether it imported."""
    want = json.dumps([[str(a), a.stat().st_size, a.stat().st_mtime_ns] for a in archives])
    if stamp.exists() and stamp.read_text() == want:
        return False
    stamp.unlink(missing_ok=True)
    for archive in archives:
        _run(
            str(paths.bin_dir() / "ctr"),
            "--address",
            str(socket),
            "--namespace",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            "overlayfs",
            str(archive),
        )
    stamp.write_text(want)
    return True


def check_binaries() -> list[str]:
    """Node binaries that `slinky testbed build` has not made yet."""
    missing = [b for b in NODE_BINARIES if not (paths.bin_dir() / b).exists()]
    missing += [b for b in ("coredns",) if not (paths.bin_dir() / b).exists()]
    if not (paths.cache_dir() / "node" / "pause.oci.tar").exists():
        missing.append("pause image")
    if not shutil.which("nft"):
        missing.append("nft (apt-get install nftables)")
    return missing


def cni_bin_dir() -> Path:
    return paths.cache_dir() / "node" / "sid" / "usr" / "lib" / "cni"


def image_ref(name: str) -> str:
    """The reference `make images` gave image `name` (e.g. "slurm", "slinky")."""
    index = paths.cache_dir() / "images" / "images.json"
    if index.exists():
        for img in json.loads(index.read_text()).get("images", []):
            if img.get("name") == name:
                return str(img["ref"])
    raise NodesError(f"image {name!r} is not built: run `make images`")


# ---------------------------------------------------------------- faults (chaos soak)
# A node cut off from the rest of the test bed, and a node lost for good. Both act inside
# this test bed's own namespace and cgroups only.

CUT_TABLE_PREFIX = "slinky-cut-"
UNIFIED_ROOT = CGROUP_ROOT / "unified"


def cut_table(index: int) -> str:
    return f"{CUT_TABLE_PREFIX}{index}"


def cut_cgroup(names: Names, index: int) -> Path:
    """The cgroup v2 group a cut node's kubelet sits in while cut (its new sockets are
    dropped by it: the kubelet's own address is the namespace's, shared by every kubelet)."""
    return UNIFIED_ROOT / f"{names.tag}-cut{index}"


def _socket_ports(names: Names, pid: int) -> list[int]:
    """Local ports of the established TCP sockets of process `pid` towards the host side
    (the apiserver, slurmctld, slurmrestd), as `ss` lists them inside the namespace."""
    listed = _run(*in_netns(names, "ss", "-tnpH", "state", "established"), check=False).stdout
    out = []
    for line in listed.splitlines():
        fields = line.split()
        if f"pid={pid}," not in line or len(fields) < 4:
            continue
        local, peer = fields[-3], fields[-2]
        if peer.rsplit(":", 1)[0] == names.host_ip:
            out.append(int(local.rsplit(":", 1)[1]))
    return sorted(set(out))


def cut_rules(names: Names, index: int, kubelet_ports: list[int], cgroup: str) -> str:
    """nft rules (one table of its own) that cut node `index` off: its pods from anything
    outside their node, its node address (the apiserver calling the kubelet) from anything
    outside, and its kubelet's connections to the host side (the sockets it holds by port,
    new ones by cgroup). What stays inside the node (the kubelet probing its own pods) is
    untouched."""
    subnet, ip = names.node_subnet(index), names.node_ip(index)
    ports = ", ".join(str(p) for p in kubelet_ports)
    kubelet = (
        [
            f"    ip daddr {names.host_ip} tcp sport {{ {ports} }} drop",
        ]
        if kubelet_ports
        else []
    )
    kubelet_in = (
        [f"    ip saddr {names.host_ip} tcp dport {{ {ports} }} drop"] if kubelet_ports else []
    )
    return "\n".join(
        [
            f"table inet {cut_table(index)} {{",
            "  chain forward {",
            "    type filter hook forward priority -10; policy accept;",
            f"    ip saddr {subnet} ip daddr != {subnet} drop",
            f"    ip daddr {subnet} ip saddr != {subnet} drop",
            "  }",
            "  chain input {",
            "    type filter hook input priority -10; policy accept;",
            f"    ip daddr {ip} ip saddr != {subnet} drop",
            *kubelet_in,
            "  }",
            "  chain output {",
            "    type filter hook output priority -10; policy accept;",
            f"    ip saddr {ip} ip daddr != {subnet} drop",
            *kubelet,
            f'    ip daddr != {subnet} socket cgroupv2 level 1 "{cgroup}" drop',
            "  }",
            "}",
            "",
        ]
    )


def cut_node(names: Names, index: int, kubelet_pid: int) -> list[int]:
    """Cut real node `index` off from slurmctld, the apiserver and the other nodes (see
    `cut_rules`); returns the kubelet's socket ports it dropped. `restore_node` undoes it."""
    group = cut_cgroup(names, index)
    group.mkdir(exist_ok=True)
    ports = _socket_ports(names, kubelet_pid)
    rules = cut_rules(names, index, ports, f"unified/{group.name}")
    r = subprocess.run(
        in_netns(names, "nft", "-f", "-"), input=rules, capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        raise NodesError(f"nft refused the cut of node {index}: {r.stderr.strip()}")
    (group / "cgroup.procs").write_text(str(kubelet_pid))
    return ports


def restore_node(names: Names, index: int) -> None:
    """Undo `cut_node`: the table goes, the kubelet back to the cgroup v2 root."""
    _run(*in_netns(names, "nft", "delete", "table", "inet", cut_table(index)), check=False)
    group = cut_cgroup(names, index)
    if not group.exists():
        return
    for pid in (group / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):
            (UNIFIED_ROOT / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        group.rmdir()


def cut_nodes(names: Names) -> list[int]:
    """Indexes of the nodes cut off now (their tables exist)."""
    listed = _run(*in_netns(names, "nft", "list", "tables"), check=False).stdout
    return sorted(
        int(w[len(CUT_TABLE_PREFIX) :])
        for w in listed.split()
        if w.startswith(CUT_TABLE_PREFIX) and w[len(CUT_TABLE_PREFIX) :].isdigit()
    )


def node_processes(names: Names, index: int, node_dir: Path) -> set[int]:
    """Every process of real node `index` but its kubelet and containerd: its pods'
    processes (its cgroup root) and containerd's shims for it (found by its socket)."""
    pids: set[int] = set()
    for ctrl in _v1_controllers():
        top = ctrl / names.cgroup_node(index)
        if top.is_dir():
            for d in [top, *(d for d in top.rglob("*") if d.is_dir())]:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    sock = str(node_dir / "containerd" / "containerd.sock")
    for pid in _pids_in_cgroups(names):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(a.decode(errors="replace") == sock for a in argv):
                pids.add(pid)
    pids.discard(os.getpid())
    return pids


def wipe_node_state(node_dir: Path) -> None:
    """What a replacement machine would not have: the dead node's mounts (pod volumes,
    network namespaces), kubelet and containerd state, pod addresses and logs. Its
    configuration files and the images (containerd's root, outside) stay."""
    for point in _mounts_under(node_dir):
        if _run("umount", point, check=False).returncode != 0:
            _run("umount", "-l", point, check=False)
    for sub in ("kubelet", "containerd", "cni-ipam", "pod-logs"):
        path = node_dir / sub
        if path.exists():
            _run("rm", "-rf", "--one-file-system", str(path))
    (node_dir / "containerd").mkdir()
