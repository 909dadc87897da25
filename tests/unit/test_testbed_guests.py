"""The pure pieces of the test bed's cgroup v2 nodes (QEMU guests): addresses, configuration
files, QEMU's command line, the images disk's key."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from slinky_testbed import bed, guests, nodes

NAMES = nodes.Names("slkabcdef", 77)


def test_guest_addresses_are_inside_the_beds_network_and_clear_of_the_host_nodes() -> None:
    nets = [guests.GuestNet(77, j) for j in range(guests.MAX_GUESTS)]
    bed = ipaddress.ip_network(NAMES.cidr)
    host_nodes = [ipaddress.ip_network(NAMES.node_subnet(i)) for i in range(100)]
    taken = [ipaddress.ip_network("10.77.0.0/24"), *host_nodes]  # the veth's /24
    for net in nets:
        link = ipaddress.ip_interface(f"{net.ip}/{net.link_prefix}").network
        assert ipaddress.ip_interface(f"{net.ns_ip}/{net.link_prefix}").network == link
        assert net.ip != net.ns_ip
        pods = ipaddress.ip_network(net.pod_subnet)
        assert ipaddress.ip_address(net.pod_gateway) in pods
        for own in (link, pods):
            assert own.subnet_of(bed)  # type: ignore[arg-type]
            assert not any(own.overlaps(t) for t in taken)
            taken.append(own)
        assert len(net.tap) <= 15
    assert len({n.mac for n in nets}) == len(nets)
    assert (nets[1].ip, nets[1].ns_ip, nets[1].pod_subnet) == (
        "10.77.250.6",
        "10.77.250.5",
        "10.77.129.0/24",
    )


def test_a_guest_index_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(guests.GuestError, match="index 32 out of range"):
        guests.GuestNet(77, guests.MAX_GUESTS)


def test_the_guest_env_is_shell_that_names_the_node_and_its_labels(tmp_path: Path) -> None:
    net = guests.GuestNet(77, 0)
    env = tmp_path / "guest.env"
    env.write_text(guests.guest_env("v2-0", net))
    out = os.popen(f". {shlex.quote(str(env))}; echo $NODE_NAME $NODE_IP/$LINK_PREFIX "
                   "$GATEWAY $NODE_LABELS").read().split()  # fmt: skip
    assert out == [
        "v2-0",
        "10.77.250.2/30",
        "10.77.250.1",
        "testbed.slinky.slurm.net/kubelet=qemu,testbed.slinky.slurm.net/cgroup=v2",
    ]


def test_the_guest_kubelet_keeps_its_cgroup_defaults() -> None:
    """failCgroupV1 left true (the default: cgroup v1 refused), the whole hierarchy its own,
    cgroupfs since the guest runs no systemd; it serves on the guest's address."""
    config = yaml.safe_load(guests.kubelet_config(guests.GuestNet(77, 0)))
    assert "failCgroupV1" not in config and "cgroupRoot" not in config
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["address"] == config["healthzBindAddress"] == "10.77.250.2"
    assert config["clusterDNS"] == [nodes.DNS_SERVICE_IP]
    assert config["containerRuntimeEndpoint"] == "unix:///run/containerd/containerd.sock"
    assert config["authentication"]["x509"]["clientCAFile"] == "/etc/slinky/ca.crt"


def test_the_guest_kube_proxy_serves_the_guest_and_knows_the_beds_pods() -> None:
    config = yaml.safe_load(guests.kube_proxy_config(NAMES, guests.GuestNet(77, 1), "v2-1"))
    assert config["mode"] == "nftables"
    assert config["hostnameOverride"] == "v2-1"
    assert config["bindAddress"] == "10.77.250.6"
    assert config["clusterCIDR"] == "10.77.0.0/16"


def test_the_guest_containerd_uses_the_guests_paths_only() -> None:
    text = guests.containerd_config()
    assert 'root = "/var/lib/containerd"' in text
    assert 'address = "/run/containerd/containerd.sock"' in text
    assert 'BinaryName = "/usr/local/bin/runc"' in text
    assert 'conf_dir = "/etc/slinky/cni"' in text
    assert 'bin_dirs = ["/opt/cni/bin"]' in text
    assert str(Path.home()) not in text


def test_the_guest_cni_bridges_its_own_pod_subnet() -> None:
    plugin = json.loads(guests.cni_config(guests.GuestNet(77, 2)))["plugins"][0]
    assert plugin["bridge"] == "cni0"
    assert plugin["ipMasq"] is False
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.77.130.0/24", "gateway": "10.77.130.1"}]]


def test_the_host_nodes_cni_configuration_is_unchanged_by_the_shared_helper() -> None:
    plugin = json.loads(nodes.cni_config(NAMES, 1, Path("/n")))["plugins"][0]
    assert plugin["bridge"] == "br1"
    assert plugin["ipam"]["dataDir"] == "/n/cni-ipam"
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.77.2.0/24", "gateway": "10.77.2.1"}]]


def test_the_guest_kubeconfig_embeds_everything() -> None:
    text = guests.kubeconfig("https://10.77.0.1:6443", b"CA", b"CRT", b"KEY", "system:node:v2-0")
    config = yaml.safe_load(text)
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    assert cluster["server"] == "https://10.77.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    assert base64.b64decode(user["client-certificate-data"]) == b"CRT"
    assert base64.b64decode(user["client-key-data"]) == b"KEY"
    assert config["contexts"][0]["context"]["user"] == "system:node:v2-0"


def test_qemu_runs_the_guest_emulated_on_its_tap_with_no_default_devices() -> None:
    files = guests.GuestFiles(Path("/bed/nodes/v2-0"), Path("/bed/logs"))
    argv = guests.qemu_argv("v2-0", guests.GuestNet(77, 0), files, memory_mib=1024, cpus=1)
    line = " ".join(argv)
    assert argv[0] == "qemu-system-x86_64"
    for flag in ("-nodefaults", "-nographic", "-no-reboot"):
        assert flag in argv
    assert "-accel tcg,thread=single" in line and "-enable-kvm" not in line
    assert "-m 1024 " in line and "-smp 1 " in line
    assert "tap,id=n0,ifname=v2t0,script=no,downscript=no" in argv
    assert "virtio-net-pci,netdev=n0,mac=52:54:00:4d:00:02" in argv
    assert "file:/bed/logs/v2-0-console.log" in argv
    assert "if=virtio,file=/bed/nodes/v2-0/root.qcow2,format=qcow2,cache=unsafe" in argv
    assert "if=virtio,file=/bed/nodes/v2-0/images.qcow2,format=qcow2,cache=unsafe" in argv
    assert "local,id=config,path=/bed/nodes/v2-0/config,security_model=none,readonly=on" in argv
    assert "local,id=logs,path=/bed/logs/v2-0,security_model=none" in argv


@pytest.mark.parametrize(
    ("memory", "cpus", "message"),
    [(256, 1, "memory 256 MiB"), (1536, 0, "vCPUs 0"), (1536, 8, "vCPUs 8")],
)
def test_qemu_refuses_a_guest_size_naming_the_value(memory: int, cpus: int, message: str) -> None:
    files = guests.GuestFiles(Path("/b/n"), Path("/b/l"))
    with pytest.raises(guests.GuestError, match=message):
        guests.qemu_argv("v2-0", guests.GuestNet(77, 0), files, memory_mib=memory, cpus=cpus)


def test_the_images_disk_key_changes_with_an_archive(tmp_path: Path) -> None:
    archive = tmp_path / "slurm.oci.tar"
    archive.write_bytes(b"one")
    before = guests.images_stamp([archive])
    assert guests.images_stamp([archive]) == before
    archive.write_bytes(b"other")
    os.utime(archive, ns=(1, 1))
    assert guests.images_stamp([archive]) != before


def test_v2_nodes_without_a_real_node_are_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(
        bed.TestbedError, match=r"2 v2 nodes asked for with no real node.*--nodes 1"
    ):
        bed.Testbed(tmp_path / "bed").up(real_nodes=0, v2_nodes=2, log=lambda _m: None)


def test_the_guest_containerd_has_a_handler_delegating_the_cgroup_to_a_user_namespace() -> None:
    """runc stays the default; the second handler runs crun with containerd's cgroup_writable
    (docs/isolation.md, "What slurmd needs on cgroup v2")."""
    cri = tomllib.loads(guests.containerd_config())["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["BinaryName"] == "/usr/local/bin/runc"
    assert "cgroup_writable" not in runtimes["runc"]
    delegated = runtimes[guests.CGROUP_WRITABLE_HANDLER]
    assert guests.CGROUP_WRITABLE_HANDLER == "delegated-cgroup"
    assert delegated["cgroup_writable"] is True
    assert delegated["runtime_type"] == "io.containerd.runc.v2"
    assert delegated["options"] == {"BinaryName": "/usr/bin/crun", "SystemdCgroup": False}


def test_the_guest_root_disk_holds_crun_and_its_stamp_follows_the_package_list() -> None:
    """build-guest.sh installs Debian's crun (the handler's binary) and rebuilds the root disk
    when its package list changes: the list is in the Debian tarball's stamp, which is in the
    root disk's."""
    script = (Path(__file__).parents[2] / "hack" / "build-guest.sh").read_text()
    packages = next(ln for ln in script.splitlines() if ln.startswith("PACKAGES="))
    assert "crun" in packages.split('"')[1].split(",")
    assert 'local want="$SUITE $PACKAGES"' in script
    assert 'want="$(cat "$G/debian.tar.version")' in script
