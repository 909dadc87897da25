"""cgroup v2 Kubernetes nodes of the test bed, each in a QEMU guest (software emulation, TCG).

This host runs cgroup v1 and can never give a cgroup2 hierarchy the memory controller, so a
node whose kubelet, containerd and runc see the unified hierarchy needs its own kernel: Debian
trixie's, booted by QEMU from what `hack/build-guest.sh` caches under ~/.cache/slinky/guest
(kernel, initramfs, a root disk image). Each guest boots copy-on-write qcow2 overlays of that
root disk and of a second disk holding a containerd root with the test bed's images already
imported (`ensure_images_disk`, rebuilt when the images change), so no guest imports anything.

Network: per guest a tap device in the test bed's network namespace, a /30 between the
namespace and the guest's eth0 (the guest's node address), and the guest's pod /24 routed in
the namespace through the guest. The guest's default route points into the namespace, which
has no way out. kube-proxy runs in the guest too. The host passes each guest its configuration
(addresses, kubelet and kube-proxy configuration, certificates) over a read-only 9p share, and
the guest writes its daemons' logs to a second 9p share in the test bed's logs directory.

QEMU runs as a node daemon (`nodes.node_daemon`): in the test bed's system cgroup and network
namespace, recorded by PID and start time like every other process, so `down` stops exactly
it and `nodes.cleanup` finds a killed test bed's guests by PID from that cgroup.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from slinky_testbed import nodes, paths, pki

# Label of every v2 node (tests select them by it); the kubelet label says what runs the node.
CGROUP_LABEL = "testbed.slinky.slurm.net/cgroup"
CGROUP_LABEL_VALUE = "v2"
KUBELET_LABEL_VALUE = "qemu"
DEFAULT_MEMORY_MIB = 1536
# The kubelet's podPidsLimit on the guests.
POD_PIDS_LIMIT = 1024
DEFAULT_CPUS = 2
# Boot under TCG plus a kubelet's first registration: ~1 min on a quiet machine.
READY_TIMEOUT_S = 300.0
# Third octets inside the test bed's 10.X.0.0/16: the guests' /30 links, and their pod /24s
# (real host nodes use 1..count, far below).
LINK_OCTET = 250
POD_OCTET_BASE = 128
MAX_GUESTS = 32
# Paths inside the guest (see hack/guest-init.sh).
CONFIG = Path("/etc/slinky")
GUEST_RUNC = Path("/usr/local/bin/runc")
GUEST_CNI_BIN = Path("/opt/cni/bin")
GUEST_CONTAINERD_ROOT = Path("/var/lib/containerd")
# The guests' containerd runtime handler whose containers get a writable cgroup, delegated to
# the pod's user namespace (crun, Debian's package on the root disk).
CGROUP_WRITABLE_HANDLER = "delegated-cgroup"
GUEST_CRUN = Path("/usr/bin/crun")


class GuestError(RuntimeError):
    """A v2 node could not be built or started; the message says what failed."""


def guest_name(index: int) -> str:
    return f"v2-{index}"


@dataclass(frozen=True)
class GuestNet:
    """Addresses and names of guest `index` in the test bed whose 10.`octet`.0.0/16 it is."""

    octet: int
    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < MAX_GUESTS:
            raise GuestError(f"v2 node index {self.index} out of range 0..{MAX_GUESTS - 1}")

    @property
    def tap(self) -> str:
        return f"v2t{self.index}"  # in the test bed's namespace

    @property
    def ns_ip(self) -> str:
        """The namespace's end of the /30: the guest's default gateway."""
        return f"10.{self.octet}.{LINK_OCTET}.{4 * self.index + 1}"

    @property
    def ip(self) -> str:
        """The guest's eth0: its node address (InternalIP, kubelet, kube-proxy)."""
        return f"10.{self.octet}.{LINK_OCTET}.{4 * self.index + 2}"

    @property
    def link_prefix(self) -> int:
        return 30

    @property
    def pod_subnet(self) -> str:
        return f"10.{self.octet}.{POD_OCTET_BASE + self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        """The guest's CNI bridge (cni0)."""
        return f"10.{self.octet}.{POD_OCTET_BASE + self.index}.1"

    @property
    def mac(self) -> str:
        return f"52:54:00:{self.octet:02x}:{self.index:02x}:02"


# ---------------------------------------------------------------- what the build made


def cache_dir() -> Path:
    return paths.cache_dir() / "guest"


def kernel() -> Path:
    return cache_dir() / "kernel" / "vmlinux"


def initrd() -> Path:
    return cache_dir() / "initrd.gz"


def root_image() -> Path:
    return cache_dir() / "root.img"


def images_image() -> Path:
    return cache_dir() / "images.img"


def check_built() -> list[str]:
    """What `slinky testbed build` (hack/build-guest.sh) has not made yet, and host tools."""
    missing = [str(p) for p in (kernel(), initrd(), root_image()) if not p.exists()]
    missing += [t for t in ("qemu-system-x86_64", "qemu-img", "mke2fs") if not shutil.which(t)]
    if not Path("/dev/net/tun").exists():
        missing.append("/dev/net/tun")
    return missing


# ---------------------------------------------------------------- configuration (pure)


def guest_env(name: str, net: GuestNet) -> str:
    """/etc/slinky/guest.env, sourced by the guest's init."""
    from slinky_testbed import kubeapi  # lightkube: only where a test bed starts

    labels = f"{kubeapi.KUBELET_LABEL}={KUBELET_LABEL_VALUE},{CGROUP_LABEL}={CGROUP_LABEL_VALUE}"
    values = {
        "NODE_NAME": name,
        "NODE_IP": net.ip,
        "LINK_PREFIX": str(net.link_prefix),
        "GATEWAY": net.ns_ip,
        "NODE_LABELS": labels,
    }
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def kubelet_config(net: GuestNet) -> str:
    """The guest's kubelet: its defaults for cgroups (cgroup v2 required, `failCgroupV1`
    left true; cgroupRoot /), the cgroupfs driver since no systemd runs in the guest."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": net.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": net.ip,
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(CONFIG / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "clusterDNS": [nodes.DNS_SERVICE_IP],
        "clusterDomain": nodes.CLUSTER_DOMAIN,
        "resolvConf": str(CONFIG / "resolv.conf"),
        # Images come on the guest's second disk and cannot be pulled: never collect them.
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
        # A pod's processes and threads together, its jobs' included (Slurm has no per-job
        # pids limit): a fork bomb in one pod cannot exhaust the guest's PIDs.
        "podPidsLimit": POD_PIDS_LIMIT,
        "containerLogMaxSize": "1Mi",
        "shutdownGracePeriod": "0s",
    }
    return yaml.safe_dump(config)


def kube_proxy_config(names: nodes.Names, net: GuestNet, name: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(CONFIG / "kube-proxy.kubeconfig")},
            "hostnameOverride": name,
            "bindAddress": net.ip,
            "healthzBindAddress": f"{net.ip}:10256",
            "metricsBindAddress": f"{net.ip}:10249",
            "clusterCIDR": names.cidr,
            "nodePortAddresses": [f"{net.ip}/32"],
        }
    )


def containerd_config() -> str:
    """The guest's containerd: socket and state under /run/containerd, its root the second
    disk (images already there), runc and the CNI plugins from the root disk. A second runtime
    handler, CGROUP_WRITABLE_HANDLER, runs crun with containerd 2.1's `cgroup_writable`: the
    container's /sys/fs/cgroup is mounted read-write and, in a pod with its own user namespace
    (hostUsers: false), crun makes the namespace's root the owner of the container's cgroup (a
    delegated subtree; the resource files, the pod's limits, stay the host's). runc with the
    cgroupfs driver mounts it read-write but keeps it the host's (measured: docs/isolation.md,
    "What slurmd needs on cgroup v2"). A pod asks for it with a RuntimeClass of that handler."""
    return (
        nodes.containerd_config(
            Path("/run"),
            GUEST_CONTAINERD_ROOT,
            GUEST_CNI_BIN,
            cni_conf=CONFIG / "cni",
            runc=GUEST_RUNC,
        )
        + f"""
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{CGROUP_WRITABLE_HANDLER}]
  runtime_type = "io.containerd.runc.v2"
  cgroup_writable = true
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{CGROUP_WRITABLE_HANDLER}.options]
    BinaryName = "{GUEST_CRUN}"
    SystemdCgroup = false
"""
    )


def cni_config(net: GuestNet) -> str:
    return nodes.bridge_cni_config("cni0", net.pod_subnet, net.pod_gateway, Path("/var/lib/cni"))


def kubeconfig(server: str, ca: bytes, cert: bytes, key: bytes, user: str) -> str:
    """A kubeconfig with everything embedded (the guest sees none of the host's paths)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "slinky-testbed",
            "clusters": [
                {
                    "name": "slinky-testbed",
                    "cluster": {"server": server, "certificate-authority-data": b64(ca)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
                }
            ],
            "contexts": [
                {"name": "slinky-testbed", "context": {"cluster": "slinky-testbed", "user": user}}
            ],
        }
    )


@dataclass(frozen=True)
class GuestFiles:
    """Where one guest's files are on the host."""

    node_dir: Path  # overlays, configuration share
    logs: Path  # the bed's logs directory

    @property
    def config(self) -> Path:
        return self.node_dir / "config"

    @property
    def root_disk(self) -> Path:
        return self.node_dir / "root.qcow2"

    @property
    def images_disk(self) -> Path:
        return self.node_dir / "images.qcow2"

    def log_share(self, name: str) -> Path:
        return self.logs / name

    def console(self, name: str) -> Path:
        return self.logs / f"{name}-console.log"


def qemu_argv(
    name: str,
    net: GuestNet,
    files: GuestFiles,
    *,
    memory_mib: int = DEFAULT_MEMORY_MIB,
    cpus: int = DEFAULT_CPUS,
) -> list[str]:
    if memory_mib < 512:
        raise GuestError(f"v2 node memory {memory_mib} MiB: give at least 512")
    if not 1 <= cpus <= 4:
        raise GuestError(f"v2 node vCPUs {cpus}: give 1 to 4")

    def share(tag: str, path: Path, *, readonly: bool) -> list[str]:
        ro = ",readonly=on" if readonly else ""
        return [
            "-fsdev",
            f"local,id={tag},path={path},security_model=none{ro}",
            "-device",
            f"virtio-9p-pci,fsdev={tag},mount_tag={tag}",
        ]

    return [
        "qemu-system-x86_64",
        "-name",
        name,
        "-accel",
        # One host thread for all vCPUs: with one per vCPU (thread=multi) this QEMU (7.2) let
        # one vCPU run kernel code another was patching (an int3 Oops in
        # hrtimer_start_range_ns at boot, 1 boot in 10 here; none in 12 with thread=single).
        "tcg,thread=single,tb-size=256",
        "-cpu",
        "max",
        "-smp",
        str(cpus),
        "-m",
        str(memory_mib),
        "-nodefaults",
        "-nographic",
        "-no-reboot",
        "-serial",
        f"file:{files.console(name)}",
        "-rtc",
        "base=utc,clock=host",
        "-kernel",
        str(kernel()),
        "-initrd",
        str(initrd()),
        "-append",
        "console=ttyS0 panic=-1 quiet",
        "-drive",
        f"if=virtio,file={files.root_disk},format=qcow2,cache=unsafe",
        "-drive",
        f"if=virtio,file={files.images_disk},format=qcow2,cache=unsafe",
        *share("config", files.config, readonly=True),
        *share("logs", files.log_share(name), readonly=False),
        "-netdev",
        f"tap,id=n0,ifname={net.tap},script=no,downscript=no",
        "-device",
        f"virtio-net-pci,netdev=n0,mac={net.mac}",
    ]


# ---------------------------------------------------------------- host side


def _run(*argv: str) -> None:
    r = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise GuestError(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}")


def setup_network(names: nodes.Names, count: int) -> None:
    """Per guest a tap in the namespace with the namespace's end of the /30, and the route to
    the guest's pods through the guest (the host already routes 10.X.0.0/16 to the namespace)."""
    ns = names.netns
    for j in range(count):
        net = GuestNet(names.octet, j)
        _run("ip", "-n", ns, "tuntap", "add", "dev", net.tap, "mode", "tap")
        _run("ip", "-n", ns, "addr", "add", f"{net.ns_ip}/{net.link_prefix}", "dev", net.tap)
        _run("ip", "-n", ns, "link", "set", net.tap, "up")
        _run("ip", "-n", ns, "route", "add", net.pod_subnet, "via", net.ip, "dev", net.tap)


def write_config(
    files: GuestFiles,
    name: str,
    net: GuestNet,
    names: nodes.Names,
    *,
    pki_dir: Path,
    server: str,
) -> None:
    """The guest's read-only configuration share, its overlays and its log share."""
    cfg = files.config
    (cfg / "cni").mkdir(parents=True)
    cfg.chmod(0o700)  # client keys
    files.log_share(name).mkdir(parents=True, exist_ok=True)
    ca = (pki_dir / "ca.crt").read_bytes()
    crt, key = pki.client_cert(
        pki_dir, f"kubelet-{name}", user=f"system:node:{name}", group="system:nodes"
    )
    pcrt, pkey = pki.client_cert(pki_dir, "kube-proxy", user="system:kube-proxy", group="testbed")
    texts = {
        "guest.env": guest_env(name, net),
        "ca.crt": ca.decode(),
        "kubelet.yaml": kubelet_config(net),
        "kubelet.kubeconfig": kubeconfig(
            server, ca, crt.read_bytes(), key.read_bytes(), f"system:node:{name}"
        ),
        "kube-proxy.yaml": kube_proxy_config(names, net, name),
        "kube-proxy.kubeconfig": kubeconfig(
            server, ca, pcrt.read_bytes(), pkey.read_bytes(), "system:kube-proxy"
        ),
        "containerd.toml": containerd_config(),
        "cni/10-testbed.conflist": cni_config(net),
        # Pods with dnsPolicy Default get the test bed's CoreDNS, never the machine's resolver.
        "resolv.conf": f"nameserver {names.ns_ip}\n",
    }
    for rel, text in texts.items():
        (cfg / rel).write_text(text)
    for disk, base in ((files.root_disk, root_image()), (files.images_disk, images_image())):
        _run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "raw", str(disk))


def start(
    *,
    names: nodes.Names,
    guests: Sequence[str],
    nodes_dir: Path,
    logs: Path,
    pki_dir: Path,
    server: str,
    spawn: Callable[[str, list[str]], None],
    memory_mib: int = DEFAULT_MEMORY_MIB,
    cpus: int = DEFAULT_CPUS,
) -> None:
    """Write each guest's configuration and overlays, then start its QEMU through `spawn`
    (the test bed's, which records PID and start time) as a node daemon."""
    for j, name in enumerate(guests):
        net = GuestNet(names.octet, j)
        files = GuestFiles(nodes_dir / name, logs)
        write_config(files, name, net, names, pki_dir=pki_dir, server=server)
        argv = qemu_argv(name, net, files, memory_mib=memory_mib, cpus=cpus)
        spawn(f"qemu-{name}", nodes.node_daemon(names, *argv))


def failure_report(name: str, logs: Path, lines: int = 30) -> str:
    """The end of a guest's console and of its kubelet's log, for an error message."""
    out = []
    for path in (logs / f"{name}-console.log", logs / name / "kubelet.log"):
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- last {len(tail)} lines of {path}:\n" + "\n".join(tail))
        else:
            out.append(f"(no log at {path})")
    return "\n".join(out)


# ---------------------------------------------------------------- the images disk


def images_stamp(archives: Sequence[Path]) -> str:
    """What the images disk was made from (paths, sizes, times): the same key the host
    nodes' imports use."""
    return json.dumps([[str(a), a.stat().st_size, a.stat().st_mtime_ns] for a in archives])


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    path = cache_dir() / ".images.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure_images_disk(log: Callable[[str], None]) -> bool:
    """The ext4 image of a containerd root holding the pause image and every image `make
    images` built, made on the host (a containerd of its own on a temporary root imports the
    archives, then `mke2fs -d` packs that root). Rebuilt only when the archives change;
    returns whether it built."""
    archives = nodes.image_archives()
    want = images_stamp(archives)
    stamp = images_image().with_suffix(".stamp")
    with _build_lock():
        if images_image().exists() and stamp.exists() and stamp.read_text() == want:
            return False
        t0 = time.monotonic()
        work = paths.cache_dir() / "build" / "guest-images"
        if work.exists():
            _run("rm", "-rf", "--one-file-system", str(work))
        (work / "node" / "containerd").mkdir(parents=True)
        root = work / "root"
        root.mkdir()
        config = work / "containerd.toml"
        config.write_text(nodes.containerd_config(work / "node", root, nodes.cni_bin_dir()))
        sock = work / "node" / "containerd" / "containerd.sock"
        with (work / "containerd.log").open("wb") as logf:
            proc = subprocess.Popen(
                [str(paths.bin_dir() / "containerd"), "--config", str(config)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            while not sock.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise GuestError(
                        "containerd for the guests' images disk did not start: "
                        + (work / "containerd.log").read_text(errors="replace")[-2000:]
                    )
                time.sleep(0.1)
            nodes.import_images(sock, archives, work / "imported")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        used_mib = int(subprocess.run(
            ["du", "-sm", str(root)], capture_output=True, text=True, check=True
        ).stdout.split()[0])  # fmt: skip
        tmp = images_image().with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        # Room for the containers' writable layers; the file is sparse and each guest writes
        # only into its own overlay.
        _run(
            "mke2fs", "-q", "-t", "ext4", "-L", "slinky-images", "-d", str(root),
            "-E", "root_owner=0:0", str(tmp), f"{used_mib + 1024}M",
        )  # fmt: skip
        tmp.replace(images_image())
        stamp.write_text(want)
        _run("rm", "-rf", "--one-file-system", str(work))
        log(
            f"v2 nodes: images disk of {len(archives)} images built in "
            f"{time.monotonic() - t0:.0f}s ({used_mib} MiB)"
        )
        return True
