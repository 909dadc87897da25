"""`make dev` applies its samples again without taking fields others manage (pure parts)."""

from __future__ import annotations

from typing import Any

from slinky_testbed import dev


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
