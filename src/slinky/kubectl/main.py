"""`kubectl-slinky`: kubectl finds it on PATH as the plugin `kubectl slinky`.

    kubectl slinky status [CLUSTER|NODESET] [-n NS | -A] [-o json]
    kubectl slinky plan scale NODESET REPLICAS
    kubectl slinky plan rollout NODESET [-f NEW_NODESET.yaml]
    kubectl slinky plan delete NODESET
    kubectl slinky why POD | nodeset/NAME

Flags as kubectl's: `--kubeconfig` (default $KUBECONFIG), `-n/--namespace` (default: the
context's namespace, else default), `-A/--all-namespaces`, `-o/--output json`. Slurm is read
through each Cluster's `spec.server` with the credentials its Secret holds; where that
address is only reachable inside the cluster, `kubectl port-forward` it and pass
`--slurm-server=http://127.0.0.1:6820`. Exit status: 0, 1 on an error (said on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from slinky.kube import rest
from slinky.kubectl import plan, render, status, why
from slinky.kubectl.world import World, gather
from slinky.types import JSON


def _common(defaults: bool) -> argparse.ArgumentParser:
    """kubectl's flags; given before or after the subcommand. The subcommands' copies have
    no defaults of their own, so a flag before the subcommand is not overwritten."""

    def d(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", default=d(None), help="kubeconfig file (default $KUBECONFIG)"
    )
    common.add_argument(
        "-n", "--namespace", default=d(None), help="namespace (default: the context's)"
    )
    common.add_argument(
        "-A", "--all-namespaces", action="store_true", default=d(False), help="every namespace"
    )
    common.add_argument("-o", "--output", choices=["text", "json"], default=d("text"))
    common.add_argument(
        "--no-color", action="store_true", default=d(False), help="no colour even on a terminal"
    )
    common.add_argument(
        "--slurm-server",
        default=d(None),
        help="slurmrestd URL to use instead of the Cluster's spec.server (one Cluster only)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    top, common = _common(True), _common(False)
    p = argparse.ArgumentParser(
        prog="kubectl slinky",
        description="Slurm on Kubernetes, joined: status, plans and explanations",
        parents=[top],
    )
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", parents=[common], help="NodeSets, pods, Slurm nodes, jobs")
    st.add_argument("name", nargs="?", help="a Cluster or NodeSet")
    pl = sub.add_parser("plan", parents=[common], help="what a change would drain, and when")
    kinds = pl.add_subparsers(dest="plan", required=True)
    sc = kinds.add_parser("scale", parents=[common], help="scale a NodeSet to REPLICAS")
    sc.add_argument("nodeset")
    sc.add_argument("replicas", type=int)
    ro = kinds.add_parser("rollout", parents=[common], help="replace pods not at the revision")
    ro.add_argument("nodeset")
    ro.add_argument(
        "-f", "--filename", default=None, help="the NodeSet as it would be (default: as it is)"
    )
    de = kinds.add_parser("delete", parents=[common], help="delete a NodeSet")
    de.add_argument("nodeset")
    wh = sub.add_parser("why", parents=[common], help="why a pod or NodeSet is as it is")
    wh.add_argument("name", help="POD, pod/POD or nodeset/NAME")
    return p


def namespace_of(args: argparse.Namespace, kube: rest.Kube) -> str | None:
    if args.all_namespaces:
        return None
    if args.namespace:
        return str(args.namespace)
    return str(getattr(kube.config, "namespace", None) or "default")


async def run(args: argparse.Namespace) -> tuple[JSON, str]:
    """The answer as data, and as text."""
    style = render.Style.detect(no_color=args.no_color)
    kube = rest.Kube.from_kubeconfig(args.kubeconfig)
    try:
        ns = namespace_of(args, kube)
        world = await gather(kube, ns, slurm_server=args.slurm_server)
        if args.command == "status":
            data = status.build(world, args.name)
            return data, status.text(data, style)
        if args.command == "plan":
            data = make_plan(world, args)
            return data, plan.text(data, style)
        data = await explain(kube, world, args.name)
        return data, why.text(data, style)
    finally:
        await kube.close()


def make_plan(world: World, args: argparse.Namespace) -> JSON:
    if args.plan == "scale":
        if args.replicas < 0:
            raise plan.PlanError("REPLICAS: must be 0 or more")
        return plan.plan_scale(world, args.nodeset, args.replicas)
    if args.plan == "delete":
        return plan.plan_delete(world, args.nodeset)
    new = None
    if args.filename:
        try:
            new = yaml.safe_load(Path(args.filename).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise plan.PlanError(f"-f {args.filename}: {e}") from None
        if not isinstance(new, dict) or new.get("kind") != "NodeSet":
            raise plan.PlanError(f"-f {args.filename}: not a NodeSet manifest")
    return plan.plan_rollout(world, args.nodeset, new)


async def explain(kube: rest.Kube, world: World, name: str) -> JSON:
    kind, _, bare = name.rpartition("/")
    kind = kind.lower()
    ns = world.namespace or "default"
    if kind in ("nodeset", "nodesets", "nodeset.slinky.slurm.net"):
        found = [n for n in world.nodesets if n["metadata"]["name"] == bare]
        if not found:
            raise why.WhyError(f"no NodeSet named {bare!r} in namespace {ns}")
        nodeset = found[0]
        events = await why.events_about(kube, nodeset["metadata"]["namespace"], bare)
        return why.explain_nodeset(world, nodeset, events)
    if kind not in ("", "pod", "pods", "po"):
        raise why.WhyError(f"{name}: say POD, pod/POD or nodeset/NAME")
    try:
        pod = await kube.get(rest.PODS, bare, ns)
    except rest.ApiError as e:
        raise why.WhyError(f"pod {ns}/{bare}: {e.message or e}") from None
    events = await why.events_about(kube, ns, bare)
    return why.explain_pod(world, pod, events)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        data, text = asyncio.run(run(args))
    except (
        status.NotFound,
        plan.PlanError,
        why.WhyError,
        rest.ApiError,
        ValueError,
        OSError,  # rest.TransportError among them
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        json.dump(data, sys.stdout, indent=2, sort_keys=True, default=_plain)
        print()
    else:
        print(text)
    return 0


def _plain(value: Any) -> Any:
    return str(value)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
