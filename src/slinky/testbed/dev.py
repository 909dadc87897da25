"""`make dev`: after the test bed is up, say how to use it."""

from __future__ import annotations

import argparse
from pathlib import Path

from slinky.testbed import paths
from slinky.testbed.bed import Testbed


def main() -> None:
    p = argparse.ArgumentParser(prog="slinky-dev")
    p.add_argument("--dir", type=Path, required=True)
    bed = Testbed(p.parse_args().dir)
    env = bed.env()
    print(f"""
Slinky dev test bed is up ({bed.dir}).

  eval "$(make -s dev-env)"                   # KUBECONFIG, SLURM_REST_URL, SLURM_JWT, ...
  {paths.bin_dir()}/kubectl get nodes
  .venv/bin/slinky testbed --dir {bed.dir} slurm sinfo
  .venv/bin/slinky testbed --dir {bed.dir} slurm squeue
  curl -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $SLURM_JWT" \\
       $SLURM_REST_URL/slurm/v0.0.44/nodes

slurmctld for --conf-server: {env["SLURMCTLD_ADDR"]}
Stop it with `make dev-down`.""")


if __name__ == "__main__":
    main()
