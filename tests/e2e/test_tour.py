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


# Where the tour's HPA has taken compute to 0 replicas (the field is the HPA's now), the test
# runs `make dev` once more: it must succeed and change nothing (every documented command is
# idempotent; a forced or conflicting apply of the sample's replicas broke this).
HPA_SCALED = "kubectl -n slurm wait nodeset/compute --for=jsonpath='{.status.replicas}'=0"
AGAIN = """
again=$(make dev 2>&1) || { echo "$again"; exit 1; }
if grep '^kept ' <<<"$again"; then exit 1; fi
test "$(kubectl -n slurm get nodeset compute -o jsonpath='{.spec.replicas}')" = 0
echo "make dev again: NodeSet compute kept the HPA's 0 replicas"
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
        assert "hello from a pod Slurm placed" in done.stdout
        assert "NodeSet slurm/compute (partition compute" in done.stdout  # kubectl slinky
        assert "make dev again: NodeSet compute kept the HPA's 0 replicas" in done.stdout
        assert re.search(r"slurm-bridge/gang\s+RUNNING\s+2\s", done.stdout), done.stdout
    finally:
        bed = Testbed(bed_dir)
        if bed.status_lines(only_running=True):
            bed.down(log=lambda line: None)
