"""What `helm upgrade` of the slurm chart runs first (a pre-upgrade hook Job) when slurm.conf
changes: an upgrade that changes `ProctrackType` or `TaskPlugin` while jobs run is refused.
Slurm wants slurmctld and every slurmd restarted for those, and the steps of running jobs
are lost; Helm's templates cannot see jobs, this asks Slurm.

The release's slurm.conf now is read from its ConfigMap, the one the upgrade would write
comes in `$NEW_SLURM_CONF`. When the two differ in either option, slurmrestd is asked for
the jobs; any RUNNING, SUSPENDED or COMPLETING refuses the upgrade (exit 1, the jobs and the
ways on named). No answer from Slurm refuses too: it cannot tell.

    python -m slinky.operator.upgradecheck --namespace NS --configmap NAME \\
        --slurmrestd URL --jwt-key FILE [--user slurm]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from slinky.kube import rest
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Job
from slinky.slurm.tokens import MintedToken

# The options that need every Slurm daemon restarted and lose the steps of running jobs.
RESTART_OPTIONS = ("ProctrackType", "TaskPlugin")
BUSY_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING"})
SHOWN = 20
TERMINATION_LOG = "/dev/termination-log"


def options(conf: str, names: Sequence[str] = RESTART_OPTIONS) -> dict[str, str]:
    """The value of each option in slurm.conf text (the last line setting it wins, as in
    Slurm; names are case-insensitive; comments and surrounding spaces left out), "" when
    unset. A list value (`task/cgroup,task/affinity`) is compared as written, spaces out."""
    want = {n.lower(): n for n in names}
    out = dict.fromkeys(names, "")
    for raw in conf.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, eq, value = line.partition("=")
        name = want.get(key.strip().lower())
        if eq and name:
            out[name] = "".join(value.split())
    return out


def changed(old_conf: str, new_conf: str) -> dict[str, tuple[str, str]]:
    """Option -> (old, new) for each restart option the upgrade changes."""
    old, new = options(old_conf), options(new_conf)
    return {k: (old[k], new[k]) for k in RESTART_OPTIONS if old[k].lower() != new[k].lower()}


def busy(jobs: Sequence[Job]) -> list[Job]:
    return [j for j in jobs if BUSY_STATES.intersection(j.state)]


@dataclass
class Verdict:
    ok: bool
    message: str


def verdict(changes: dict[str, tuple[str, str]], jobs: Sequence[Job] | None, why: str) -> Verdict:
    """Whether the upgrade may go on. `jobs` None: Slurm did not answer (`why`)."""
    if not changes:
        return Verdict(True, "ProctrackType and TaskPlugin unchanged: nothing to check")
    what = ", ".join(
        f"{k} {old or '(unset)'} -> {new or '(unset)'}" for k, (old, new) in changes.items()
    )
    remedy = (
        "Slurm restarts slurmctld and every slurmd for this and the steps of running jobs are "
        "lost. Either keep the current value (slurmConfig.jobIsolation, or the line in "
        "slurmConfig.extraSlurmConf) for now, or drain first: set every partition or node "
        "DRAIN (scontrol update nodename=ALL state=drain reason=upgrade), wait until squeue "
        "shows no job running, then upgrade and resume the nodes. Only to go on regardless "
        "(their steps are lost): upgradeCheck.enabled=false"
    )
    if jobs is None:
        return Verdict(
            False,
            f"upgrade refused: it changes {what}, and Slurm could not say whether jobs run "
            f"({why}). {remedy}",
        )
    running = busy(jobs)
    if not running:
        return Verdict(True, f"the upgrade changes {what}; no job runs: it may go on")
    shown = ", ".join(
        f"{j.job_id} ({'/'.join(j.state)}{' on ' + j.nodes if j.nodes else ''})"
        for j in running[:SHOWN]
    )
    more = f" and {len(running) - SHOWN} more" if len(running) > SHOWN else ""
    return Verdict(
        False,
        f"upgrade refused: it changes {what} while {len(running)} job(s) run: {shown}{more}. "
        f"{remedy}",
    )


async def current_conf(kube: rest.Kube, namespace: str, name: str) -> str | None:
    """The release's slurm.conf now; None when its ConfigMap is not there."""
    try:
        cm = await kube.get(rest.CONFIGMAPS, name, namespace)
    except rest.ApiError as e:
        if e.not_found:
            return None
        raise
    return str((cm.get("data") or {}).get("slurm.conf") or "")


async def jobs_of(slurm: SlurmClient) -> tuple[list[Job] | None, str]:
    try:
        jobs, _ = await slurm.list_jobs()
    except errors.SlurmError as e:
        return None, str(e)
    return list(jobs or []), ""


async def run(
    kube: rest.Kube, slurm: SlurmClient, *, namespace: str, configmap: str, new: str
) -> Verdict:
    old = await current_conf(kube, namespace, configmap)
    if old is None:
        return Verdict(True, f"ConfigMap {namespace}/{configmap} not found: nothing to compare")
    changes = changed(old, new)
    if not changes:
        return verdict(changes, [], "")
    jobs, why = await jobs_of(slurm)
    return verdict(changes, jobs, why)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slinky.operator.upgradecheck", description=__doc__)
    p.add_argument("--namespace", required=True)
    p.add_argument("--configmap", required=True, help="the release's slurm.conf ConfigMap")
    p.add_argument("--slurmrestd", required=True, help="slurmrestd's URL")
    p.add_argument("--jwt-key", required=True, help="file of the cluster's JWT key")
    p.add_argument("--user", default="slurm", help="Slurm user of the JWTs")
    p.add_argument("--kubeconfig", default=None)
    args = p.parse_args(argv)
    new = os.environ.get("NEW_SLURM_CONF")
    if new is None:
        print(
            "cannot start: $NEW_SLURM_CONF (the slurm.conf of the upgrade) is not set",
            file=sys.stderr,
        )
        return 2

    async def go() -> Verdict:
        kube = rest.Kube.from_kubeconfig(args.kubeconfig)
        slurm = SlurmClient(args.slurmrestd, MintedToken.from_file(args.jwt_key, user=args.user))
        try:
            return await run(
                kube, slurm, namespace=args.namespace, configmap=args.configmap, new=new
            )
        finally:
            await slurm.close()
            await kube.close()

    try:
        result = asyncio.run(go())
    except (ValueError, OSError, rest.ApiError) as e:
        result = Verdict(False, f"upgrade refused: the check could not run ({e})")
    print(result.message, flush=True)
    if not result.ok:
        try:
            with open(TERMINATION_LOG, "w") as f:
                f.write(result.message)
        except OSError:
            pass
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
