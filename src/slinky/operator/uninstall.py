"""What `helm uninstall` of the operator runs first (a pre-delete hook Job), while the operator
still runs: Clusters and NodeSets carry the operator's finalizer, and only the operator takes
it off (after draining). One that is being deleted (say, its namespace was deleted just
before the uninstall) is waited for here, so the operator finishes it; without this, it
would stay `Terminating` for good once the operator is gone, and the namespace with it.
Those not being deleted are listed in the output, with what to do about them.

    python -m slinky.operator.uninstall [--timeout=1h] [--kubeconfig=...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from slinky.kube import flags, rest
from slinky.operator.resources import CLUSTERS, FINALIZER, NODESETS


async def held(kube: rest.Kube) -> tuple[list[str], list[str]]:
    """(being deleted, staying): 'Kind namespace/name' of the objects with our finalizer.
    An object in a namespace being deleted counts as being deleted: the namespace controller
    deletes it a moment later, maybe after the operator is gone."""
    ending = {
        str(ns["metadata"]["name"])
        for ns in (await kube.list(rest.NAMESPACES))["items"]
        if ns["metadata"].get("deletionTimestamp")
    }
    deleting: list[str] = []
    staying: list[str] = []
    for res in (NODESETS, CLUSTERS):
        for obj in (await kube.list(res))["items"]:
            meta = obj["metadata"]
            if FINALIZER not in (meta.get("finalizers") or []):
                continue
            what = f"{res.kind} {meta.get('namespace')}/{meta['name']}"
            gone = meta.get("deletionTimestamp") or meta.get("namespace") in ending
            (deleting if gone else staying).append(what)
    return deleting, staying


async def run(
    kube: rest.Kube, *, timeout: float, interval: float = 5.0, clock: Any = time.monotonic
) -> int:
    """0 when nothing being deleted is left holding the finalizer, 1 at the timeout."""
    deadline = clock() + timeout
    while True:
        deleting, staying = await held(kube)
        if not deleting:
            break
        if clock() > deadline:
            print(
                f"still being deleted after {timeout:.0f}s (the operator drains them: jobs "
                f"still run): {', '.join(deleting)}. Uninstalling the operator now would leave "
                "them Terminating for good; wait for their jobs, or annotate them "
                "nodeset.slinky.slurm.net/delete-without-drain=true",
                flush=True,
            )
            return 1
        print(f"waiting for the operator to finish: {', '.join(deleting)}", flush=True)
        await asyncio.sleep(interval)
    if staying:
        print(
            f"left in place with the operator's finalizer {FINALIZER}: {', '.join(staying)}. "
            "Delete them while an operator runs; once it is gone, deleting one needs "
            'kubectl patch <kind> <name> --type=merge -p \'{"metadata":{"finalizers":null}}\''
            " (no drain: running jobs are lost)",
            flush=True,
        )
    else:
        print("no Cluster or NodeSet holds the operator's finalizer", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slinky.operator.uninstall", description=__doc__)
    flags.add_duration(p, "--timeout", default="1h", help="how long to wait (Go syntax: 90s, 1h)")
    p.add_argument("--kubeconfig", default=None)
    args = p.parse_args(argv)

    async def go() -> int:
        try:
            kube = rest.Kube.from_kubeconfig(args.kubeconfig)
        except ValueError as e:
            print(f"cannot start: {e}", file=sys.stderr)
            return 2
        try:
            return await run(kube, timeout=args.timeout)
        finally:
            await kube.close()

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
