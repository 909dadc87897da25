"""The host-run environment applies its samples again without taking fields others manage;
`make dev`'s site: what it installs, when it installs again, where Slurm's commands run
(pure parts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slinky_testbed import dev, dev_site
from slinky_testbed.bed import Testbed


def nodeset() -> dict[str, Any]:
    return {
        "apiVersion": "slinky.slurm.net/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": "compute", "namespace": "slurm"},
        "spec": {"clusterName": "slurm", "replicas": 2, "partition": {"enabled": True}},
    }


def test_a_new_nodeset_gets_the_samples_replicas() -> None:
    assert dev.for_reapply(nodeset(), None) == nodeset()


def test_an_existing_nodeset_keeps_the_replicas_the_hpa_or_a_person_set() -> None:
    sample = nodeset()
    applied = dev.for_reapply(sample, {"spec": {"replicas": 0, "clusterName": "slurm"}})
    assert applied["spec"] == {**sample["spec"], "replicas": 0}
    assert sample["spec"]["replicas"] == 2  # the sample itself is left as it was


def test_other_objects_are_applied_as_the_sample_says() -> None:
    hpa = dev.sample_hpa()
    assert dev.for_reapply(hpa, {"spec": {"minReplicas": 3}}) is hpa


def test_conflicts_are_told_from_other_failures() -> None:
    one = (
        'error: Apply failed with 1 conflict: conflict with "horizontal-pod-autoscaler" '
        "using autoscaling/v2: .spec.replicas\n"
        "Please review the fields above--they currently have other managers. Here\n"
    )
    assert dev.conflicting_fields(one) == [".spec.replicas"]
    two = (
        'error: Apply failed with 2 conflicts: conflicts with "kubectl-edit" using '
        "slinky.slurm.net/v1alpha1:\n- .spec.partition.config\n"
        "- .spec.template.metadata.labels.app.kubernetes.io/instance\n"
        "Please review the fields above--they currently have other managers.\n"
    )
    assert dev.conflicting_fields(two) == [
        ".spec.partition.config",
        ".spec.template.metadata.labels.app.kubernetes.io/instance",
    ]
    assert dev.conflicting_fields('Error from server (NotFound): "compute" not found') is None


# ---------------------------------------------------------------- `make dev`'s site


def test_a_release_is_installed_again_only_when_its_chart_or_values_change(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: c\n")
    (chart / "templates" / "a.yaml").write_text("kind: ConfigMap\n")
    first = dev_site.release_digest(chart, {"a": 1, "b": [2]})
    assert dev_site.release_digest(chart, {"b": [2], "a": 1}) == first  # key order is no change
    assert dev_site.release_digest(chart, {"a": 2, "b": [2]}) != first
    (chart / "templates" / "a.yaml").write_text("kind: Secret\n")
    assert dev_site.release_digest(chart, {"a": 1, "b": [2]}) != first


def test_the_dev_site_is_the_charts_site_with_isolation_accounting_login_and_ldap() -> None:
    values = dev_site.slurm_values("ssh-ed25519 AAAA dana")
    assert "jobIsolation" not in values.get("slurmConfig", {})  # the chart's default: cgroup
    assert values["accounting"]["enabled"] and values["accounting"]["mariadb"]["enabled"]
    assert values["accounting"]["users"] == [{"name": "dana", "account": "physics"}]
    assert values["login"] == {
        "enabled": True,
        "authorizedKeys": {"dana": ["ssh-ed25519 AAAA dana"]},
    }
    assert values["sssd"]["enabled"] and values["homes"] == {"existingClaim": "homes"}
    # A job without -p goes to batch, never to the bridge's EXTERNAL nodes (no slurmd there).
    assert values["slurmConfig"]["allPartition"] == {"enabled": False}
    (batch,) = values["compute"]["nodesets"]
    assert batch["partition"]["config"]["Default"] == "YES"
    assert batch["autoscaling"]["enabled"] and batch["autoscaling"]["minReplicas"] == 0
    assert "replicas" not in batch  # the HPA's


def test_the_dev_bridge_runs_its_pods_as_dana_with_an_association() -> None:
    policy = dev_site.bridge_values()["sharedConfig"]["policy"]["namespaces"]["slurm-bridge"]
    assert policy["users"] == ["5001"] and policy["defaultAccount"] == "physics"


def test_slurm_commands_run_through_the_sites_script_once_make_dev_wrote_it(
    tmp_path: Path,
) -> None:
    bed = Testbed(tmp_path)
    sinfo = bed.commands() / "sinfo"
    assert "chroot" in sinfo.read_text()
    (tmp_path / "slurm-commands").write_text("#!/bin/sh\n")
    assert bed.commands() / "sinfo" == sinfo
    assert sinfo.read_text() == f'#!/bin/sh\nexec {tmp_path}/slurm-commands sinfo "$@"\n'
    (tmp_path / "slurm-commands").unlink()  # make dev-down
    assert "chroot" in bed.commands().joinpath("sinfo").read_text()
