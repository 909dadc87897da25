"""Pure pieces of the real nodes: names derived from the test bed directory, and the
configuration each daemon gets (network safety lives in these values)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from slinky_testbed import nodes, slurmconf


def test_names_follow_the_directory_and_fit_interface_limits(tmp_path: Path) -> None:
    a = nodes.Names.for_dir(tmp_path / "a", 70)
    b = nodes.Names.for_dir(tmp_path / "b", 71)
    assert a.tag != b.tag
    assert nodes.Names.for_dir(tmp_path / "a").tag == a.tag  # stable across runs
    assert len(a.host_veth) <= 15
    assert (a.host_ip, a.ns_ip, a.cidr) == ("10.70.0.1", "10.70.0.2", "10.70.0.0/16")
    assert (a.node_ip(0), a.node_subnet(1)) == ("10.70.1.1", "10.70.2.0/24")
    assert a.cgroup_node(0).startswith(a.tag + "-") and a.cgroup_system.startswith(a.tag + "-")


def test_cni_never_masquerades_and_keeps_its_own_allocations(tmp_path: Path) -> None:
    names = nodes.Names("slkabc", 80)
    conf = json.loads(nodes.cni_config(names, 1, tmp_path))
    bridge = conf["plugins"][0]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "cni-ipam")
    assert bridge["ipam"]["ranges"][0][0] == {"subnet": "10.80.2.0/24", "gateway": "10.80.2.1"}


def test_kubelet_uses_its_own_cgroup_root_and_the_test_bed_dns(tmp_path: Path) -> None:
    names = nodes.Names("slkabc", 80)
    conf = yaml.safe_load(
        nodes.kubelet_config(names, 0, tmp_path, tmp_path / "ca.crt", "10.80.0.2")
    )
    assert conf["cgroupRoot"] == "/slkabc-node0"
    assert (conf["cgroupDriver"], conf["failCgroupV1"]) == ("cgroupfs", False)
    assert conf["address"] == "10.80.1.1"
    assert conf["clusterDNS"] == [nodes.DNS_SERVICE_IP]
    assert (tmp_path / "resolv.conf").read_text() == "nameserver 10.80.0.2\n"
    assert conf["imageGCHighThresholdPercent"] == 100  # images cannot be pulled again here


def test_kube_proxy_leaves_host_conntrack_alone() -> None:
    conf = yaml.safe_load(nodes.kube_proxy_config(nodes.Names("slkabc", 80), Path("/k"), "n"))
    assert conf["mode"] == "nftables"
    assert set(conf["conntrack"].values()) <= {0, "0s"}


def test_coredns_has_no_forwarder() -> None:
    text = nodes.corefile(nodes.Names("slkabc", 80), Path("/k"))
    assert "forward" not in text
    assert "rcode NXDOMAIN" in text


def test_containerd_restricts_oom_score_adj_and_keeps_netns_in_its_state(tmp_path: Path) -> None:
    text = nodes.containerd_config(tmp_path, tmp_path / "root", Path("/cni"))
    assert "restrict_oom_score_adj = true" in text
    assert "netns_mounts_under_state_dir = true" in text
    assert f'address = "{tmp_path}/containerd/containerd.sock"' in text
    assert f'root = "{tmp_path}/root"' in text


def test_slurmctld_host_names_the_pod_reachable_address() -> None:
    conf = slurmconf.slurm_conf(ctld_port=1, slurmd_port=2, ctld_addr="10.80.0.1")
    assert "SlurmctldHost=localhost(10.80.0.1)" in conf.splitlines()
    assert "SlurmctldParameters=enable_configless" in conf.splitlines()
