"""`slinky testbed up`'s last line is a command that works as printed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from slinky_testbed import cli


def test_the_env_hint_runs_as_printed_from_any_directory_without_the_venv_on_path(
    tmp_path: Path,
) -> None:
    bed = tmp_path / "a bed"  # a space: every word must be quoted
    bed.mkdir()
    ports = {"slurmrestd": 1, "etcd": 2, "slurmctld": 3}
    (bed / "state.json").write_text(json.dumps({"ports": ports, "slurm_token": "t"}))
    hint = cli.env_hint(bed)
    assert hint.startswith('eval "$(')
    done = subprocess.run(
        ["bash", "-c", f'set -e\n{hint}\necho "KUBECONFIG=$KUBECONFIG"'],
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},  # neither .venv/bin nor `slinky`
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"KUBECONFIG={bed / 'kubeconfig'}" in done.stdout.splitlines(), done
