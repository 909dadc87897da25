"""`slinky testbed ...`: build, start, inspect and stop the local test bed."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from slinky_testbed import guests, paths
from slinky_testbed.bed import Testbed, TestbedError


def build() -> None:
    """Build (or find cached) everything the test bed runs."""
    for script in (
        "build-slurm-root.sh",
        "build-kube.sh",
        "build-node.sh",
        "build-prometheus.sh",
        "build-guest.sh",
    ):
        subprocess.run(["bash", str(paths.hack_dir() / script)], check=True)


def env_hint(state_dir: Path) -> str:
    """The line that puts a shell on this test bed, runnable as printed from anywhere: the
    command by its absolute path (the venv's `slinky`, which need not be on PATH), every
    word quoted, the command substitution in double quotes."""
    script = Path(sys.executable).parent / "slinky"
    words = [str(script)] if script.exists() else [sys.executable, "-m", "slinky_testbed.cli"]
    command = shlex.join([*words, "testbed", "--dir", str(state_dir), "env"])
    return f'eval "$({command})"'


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="slinky", description="Slinky developer tools")
    sub = p.add_subparsers(dest="group", required=True)
    tb = sub.add_parser("testbed", help="the local Kubernetes + Slurm test bed")
    tb.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="state directory (default $SLINKY_TESTBED_DIR or ~/.cache/slinky/testbeds/default)",
    )
    cmds = tb.add_subparsers(dest="cmd", required=True)
    cmds.add_parser(
        "build", help="build/cache the binaries (Prometheus included) and the Slurm root"
    )
    up = cmds.add_parser("up", help="start the test bed")
    up.add_argument(
        "--nodes", type=int, default=2, help="real nodes (kubelet + containerd), default 2"
    )
    up.add_argument("--kwok-nodes", type=int, default=0, help="fake nodes for scale tests")
    up.add_argument(
        "--v2-nodes",
        type=int,
        default=0,
        help="cgroup v2 nodes, each a QEMU guest (needs --nodes >= 1), default 0",
    )
    up.add_argument(
        "--v2-memory",
        type=int,
        default=guests.DEFAULT_MEMORY_MIB,
        metavar="MIB",
        help=f"memory of each v2 node's guest, default {guests.DEFAULT_MEMORY_MIB}",
    )
    cmds.add_parser("down", help="stop exactly the processes `up` started")
    cmds.add_parser("status", help="list the test bed's processes")
    cmds.add_parser("env", help="print shell export lines")
    sl = cmds.add_parser("slurm", help="run a Slurm command against the test bed's Slurm")
    sl.add_argument("argv", nargs=argparse.REMAINDER)
    kc = cmds.add_parser("kubectl", help="run kubectl against the test bed")
    kc.add_argument("argv", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)

    bed = Testbed(args.dir)
    try:
        if args.cmd == "build":
            build()
        elif args.cmd == "up":
            bed.up(
                real_nodes=args.nodes,
                kwok_nodes=args.kwok_nodes,
                v2_nodes=args.v2_nodes,
                v2_memory_mib=args.v2_memory,
                log=print,
            )
            print(f"to use it in this shell: {env_hint(bed.dir)}")
        elif args.cmd == "down":
            bed.down(log=print)
        elif args.cmd == "status":
            lines = bed.status_lines()
            print("\n".join(lines) if lines else f"test bed {bed.dir} is down")
            sys.exit(0 if bed.status_lines(only_running=True) else 3)
        elif args.cmd == "env":
            for k, v in bed.env().items():
                print(f"export {k}={shlex.quote(v)}")
            # kubectl, helm, sinfo, squeue, sbatch, ... on this test bed, first on PATH; then
            # this environment's console scripts (kubectl finds `kubectl-slinky` there)
            dirs = [str(bed.commands()), str(Path(sys.executable).parent)]
            print(f'export PATH={":".join(map(shlex.quote, dirs))}:"$PATH"')
        elif args.cmd == "slurm":
            if not args.argv:
                p.error("slurm: give a command, e.g. `slinky testbed slurm sinfo`")
            sys.exit(bed.slurm(args.argv).returncode)
        elif args.cmd == "kubectl":
            kubectl = str(paths.bin_dir() / "kubectl")
            os.execv(kubectl, [kubectl, f"--kubeconfig={bed.kubeconfig}", *args.argv])
    except TestbedError as e:
        print(f"slinky testbed: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
