"""The README's five-minute tour, run as written: the block after the `<!-- tour: ... -->`
marker is a bash script (`set -euo pipefail`) run from the repository's root, on a `make dev`
environment of its own (DEV_DIR: a test bed directory per xdist worker)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from slinky_testbed.bed import Testbed
from tests.e2e.workers import worker_bed_dir

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- tour:"


def tour_script(readme: str) -> str:
    """The first ```sh block after the tour marker."""
    after = readme[readme.index(MARKER) :]
    match = re.search(r"```sh\n(.*?)```", after, re.S)
    assert match is not None, "README: no ```sh block after the tour marker"
    return match.group(1)


def test_the_readme_has_one_tour_starting_with_make_dev_and_ending_with_dev_down() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme.count(MARKER) == 1
    lines = [ln for ln in tour_script(readme).splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "make dev" and lines[-1] == "make dev-down"


# Where the tour's HPA has taken batch to 0 replicas (the field is the HPA's now), the test
# runs `make dev` once more: it must succeed within 2 minutes and change nothing (every
# documented command is idempotent): no release upgraded, nothing applied found changed
# (`kept ...`), the HPA's 0 replicas kept.
NODESET = "slurm-compute-batch"
HPA_SCALED = f"kubectl -n slurm wait nodeset/{NODESET} --for=jsonpath='{{.status.replicas}}'=0"
AGAIN = f"""
t0=$SECONDS
again=$(make dev 2>&1) || {{ echo "$again"; exit 1; }}
echo "make dev again took $((SECONDS - t0)) s"
test $((SECONDS - t0)) -lt 120
if grep -E '^(helm upgrade|kept )' <<<"$again"; then exit 1; fi
test "$(kubectl -n slurm get nodeset {NODESET} -o jsonpath='{{.spec.replicas}}')" = 0
echo "make dev again: no release upgraded, NodeSet batch kept the HPA's 0 replicas"
"""


def with_make_dev_again(script: str) -> str:
    """The tour with a second `make dev` right after the HPA has scaled compute to 0."""
    at = script.index(HPA_SCALED)
    end = script.index("\n", at)
    return script[:end] + AGAIN + script[end:]


@pytest.mark.longest
@pytest.mark.timeout(900)
def test_the_readme_tour_runs_as_written() -> None:
    script = with_make_dev_again(tour_script((REPO / "README.md").read_text()))
    bed_dir = worker_bed_dir("SLINKY_TOUR_TESTBED_DIR", "tour")
    env = {**os.environ, "DEV_DIR": str(bed_dir)}
    env.pop("KUBECONFIG", None)
    try:
        done = subprocess.run(
            ["bash", "-xc", f"set -euo pipefail\n{script}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=840,
            check=False,
        )
        assert done.returncode == 0, (
            f"the tour failed (exit {done.returncode})\n--- stdout:\n{done.stdout[-6000:]}\n"
            f"--- stderr:\n{done.stderr[-6000:]}"
        )
        # What the tour shows is what it says.
        out = done.stdout
        print("\n".join(ln for ln in out.splitlines() if ln.startswith("make dev again")))
        assert "hello from a pod Slurm placed" in out
        assert f"NodeSet slurm/{NODESET} (partition batch" in out  # kubectl slinky
        assert "make dev again: no release upgraded" in out
        # sacct: the 2-node job COMPLETED, the memory hog OUT_OF_MEMORY, both dana's.
        assert re.search(r"^\d+\s+dana\s+physics\s+COMPLETED\s+0:0\s", out, re.M), out
        assert re.search(r"^\d+\s+dana\s+physics\s+OUT_OF_MEMORY\s", out, re.M), out
        # The SSH login: dana from the directory, her job's output in her shared home.
        assert "uid=5001(dana) gid=5001(dana) groups=5001(dana),6000(ldapusers)" in out, out
        assert re.search(r"^dana\nslurm-compute-batch-\d\n", out, re.M), out
        assert re.search(r"slurm-bridge/gang\s+RUNNING\s+2\s", out), out
    finally:
        bed = Testbed(bed_dir)
        if bed.status_lines(only_running=True):
            bed.down(log=lambda line: None)
