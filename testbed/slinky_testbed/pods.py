"""What a slurmd pod on the test bed's real nodes looks like: a container from the Slurm image,
truly configless (`--conf-server` to slurmctld at the address pods reach), with nothing
mounted but auth/slurm's shared key. Used by `make dev` and the e2e tests alike."""

from __future__ import annotations

import base64
from typing import Any

from slinky_testbed import nodes
from slinky_testbed.bed import Testbed

JSON = dict[str, Any]
SLURM_KEY_SECRET = "slurm-key"
# The image's entrypoint: tini (PID 1, reaps slurmstepd's zombies) runs the script that makes
# Slurm's runtime directories, then the daemon. Spelled out because the operator sets
# `command` when a slurmd container has none, which would drop both.
SLURM_ENTRYPOINT = ["/usr/bin/tini", "--", "/usr/local/bin/slurm-entrypoint"]


def slurm_key_secret(testbed: Testbed, namespace: str | None = None) -> JSON:
    """The Secret slurmd containers mount: auth/slurm's shared key, nothing else."""
    key = (testbed.root / "etc" / "slurm" / "slurm.key").read_bytes()
    meta: JSON = {"name": SLURM_KEY_SECRET}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "data": {"slurm.key": base64.b64encode(key).decode()},
    }


def slurmd_pod_spec(args: list[str], *, grace_s: int = 10) -> JSON:
    """Pod spec of one slurmd container (`args` follow `slurmd`) with the key mounted."""
    return {
        "terminationGracePeriodSeconds": grace_s,
        "containers": [
            {
                "name": "slurmd",
                "image": nodes.image_ref("slurm"),
                "imagePullPolicy": "IfNotPresent",
                "command": [*SLURM_ENTRYPOINT, "slurmd"],
                "args": args,
                "volumeMounts": [
                    {
                        "name": "slurm-key",
                        "mountPath": "/etc/slurm/slurm.key",
                        "subPath": "slurm.key",
                    }
                ],
            }
        ],
        "volumes": [
            {
                "name": "slurm-key",
                "secret": {"secretName": SLURM_KEY_SECRET, "defaultMode": 0o600},
            }
        ],
    }
