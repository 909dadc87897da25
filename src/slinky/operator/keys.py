"""What the slurm chart runs before every install and upgrade (a pre-install,pre-upgrade hook
Job; a PreSync hook under Argo CD): each key Secret the release reads (slurm.key, the JWT
key, the chart's MariaDB password, sshd's host key) is made when it is missing and never
touched when it is there. No key is ever written into a rendered manifest, so two renders
of the chart (`helm template`, as Argo CD renders) are the same bytes and an apply of them
never re-keys a running cluster.

A Secret listed with --guard is not made anew while the StatefulSet named by --controller
exists: that slurm.key is gone while slurmctld and slurmd still run on it, and a new one
would cut every slurmd off slurmctld (their jobs would die). The Job then fails saying so;
restore the Secret, or pass --regenerate (the chart's slurmKey.regenerate) once.

    python -m slinky.operator.keys --namespace NS [--controller NAME] [--guard SECRET]
        [--bytes SECRET/KEY=SIZE] [--alnum SECRET/KEY=SIZE] [--file SECRET/KEY=PATH]
        [--label K=V] [--regenerate] [--kubeconfig=...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import os
import secrets
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slinky.kube import rest
from slinky.types import JSON

STATEFULSETS = rest.Resource("apps", "v1", "statefulsets", "StatefulSet")
ALNUM = string.ascii_letters + string.digits
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class Api(Protocol):
    async def get(self, res: rest.Resource, name: str, namespace: str | None = None) -> JSON: ...

    async def create(self, res: rest.Resource, obj: JSON, namespace: str | None = None) -> JSON: ...

    async def patch(
        self, res: rest.Resource, name: str, patch: JSON, namespace: str | None = None
    ) -> JSON: ...


@dataclass(frozen=True)
class Key:
    """One key of one Secret and how its value is made: `bytes` (random bytes), `alnum`
    (letters and digits) or `file` (the bytes of a file another container wrote)."""

    secret: str
    key: str
    make: str
    arg: str

    def value(self) -> bytes:
        if self.make == "bytes":
            return secrets.token_bytes(int(self.arg))
        if self.make == "alnum":
            return "".join(secrets.choice(ALNUM) for _ in range(int(self.arg))).encode()
        return Path(self.arg).read_bytes()


# A Secret an earlier chart version rendered is in the release's manifest: the first upgrade
# to a chart that renders it no more would delete it (Helm deletes what left the manifest
# unless the live object says keep; Argo CD prunes it unless told not to). Only these
# annotations are added; the data is never touched.
ADOPT = {"helm.sh/resource-policy": "keep", "argocd.argoproj.io/sync-options": "Prune=false"}


class Refused(Exception):
    """A Secret that may not be made (or is there without its key): the hook fails."""


def parse_key(make: str, text: str) -> Key:
    """SECRET/KEY=ARG, e.g. slurm-slurm-key/slurm.key=1024."""
    where, sep, arg = text.partition("=")
    secret, slash, key = where.partition("/")
    if not (sep and slash and secret and key and arg):
        raise argparse.ArgumentTypeError(f"--{make} {text!r}: expected SECRET/KEY=VALUE")
    if make != "file" and not (arg.isdigit() and int(arg) > 0):
        raise argparse.ArgumentTypeError(f"--{make} {text!r}: the size must be a positive number")
    return Key(secret, key, make, arg)


async def _get(kube: Api, res: rest.Resource, name: str, namespace: str) -> JSON | None:
    try:
        return await kube.get(res, name, namespace)
    except rest.ApiError as e:
        if e.not_found:
            return None
        raise


async def ensure(
    kube: Api,
    namespace: str,
    keys: list[Key],
    *,
    labels: dict[str, str] | None = None,
    guard: frozenset[str] = frozenset(),
    controller: str = "",
    regenerate: bool = False,
) -> list[str]:
    """Makes each missing Secret (all its keys at once); one that exists is left as it is.
    Returns what was done, a line per Secret; raises Refused naming the Secret."""
    by_secret: dict[str, list[Key]] = {}
    for k in keys:
        by_secret.setdefault(k.secret, []).append(k)
    done: list[str] = []
    for name, wanted in by_secret.items():
        old = await _get(kube, rest.SECRETS, name, namespace)
        guarded = old is None and name in guard and controller and not regenerate
        if guarded and await _get(kube, STATEFULSETS, controller, namespace) is not None:
            raise Refused(
                f"Secret {namespace}/{name} (key {wanted[0].key}) is gone while "
                f"slurmctld (StatefulSet {controller}) and its slurmd pods run on the old "
                "key: a new key would cut every running slurmd off slurmctld and their "
                "jobs would die. Restore the Secret, or set the slurm chart's "
                "slurmKey.regenerate=true (--regenerate) for one install to make a new "
                "key knowingly (then restart slurmctld, slurmrestd, slurmdbd, the login "
                "pods and every NodeSet's pods; jobs running on the old key are lost)"
            )
        if old is None:
            data = {k.key: base64.b64encode(k.value()).decode() for k in wanted}
            obj: JSON = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "labels": dict(labels or {})},
                "type": "Opaque",
                "data": data,
            }
            try:
                await kube.create(rest.SECRETS, obj, namespace)
            except rest.ApiError as e:
                if not e.conflict:
                    raise
                # Made meanwhile (another run of the hook): theirs is kept, like any other.
                old = await kube.get(rest.SECRETS, name, namespace)
            else:
                done.append(f"made Secret {namespace}/{name} ({', '.join(sorted(data))})")
                continue
        have = old.get("data") or {}
        missing = [k.key for k in wanted if not have.get(k.key)]
        if missing:
            raise Refused(
                f"Secret {namespace}/{name} exists without key {', '.join(missing)}: it is "
                "never changed here. Add the key to it, or delete it to have it made"
            )
        notes = (old.get("metadata") or {}).get("annotations") or {}
        earlier = "meta.helm.sh/release-name" in notes
        if earlier and any(notes.get(k) != v for k, v in ADOPT.items()):
            await kube.patch(rest.SECRETS, name, {"metadata": {"annotations": ADOPT}}, namespace)
            done.append(f"kept Secret {namespace}/{name} (an earlier chart's: marked keep)")
            continue
        done.append(f"kept Secret {namespace}/{name}")
    return done


def _label(text: str) -> tuple[str, str]:
    k, sep, v = text.partition("=")
    if not (sep and k):
        raise argparse.ArgumentTypeError(f"--label {text!r}: expected KEY=VALUE")
    return k, v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slinky.operator.keys",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--namespace", default="", help="default: the pod's own namespace")
    for make, what in (
        ("bytes", "SIZE random bytes"),
        ("alnum", "SIZE random letters and digits"),
        ("file", "the content of file PATH"),
    ):
        p.add_argument(
            f"--{make}",
            dest="keys",
            action="append",
            default=[],
            type=functools.partial(parse_key, make),
            metavar="SECRET/KEY=" + ("PATH" if make == "file" else "SIZE"),
            help=f"key KEY of Secret SECRET: {what}",
        )
    p.add_argument(
        "--guard",
        action="append",
        default=[],
        metavar="SECRET",
        help="a Secret not made anew while --controller exists",
    )
    p.add_argument("--controller", default="", help="slurmctld's StatefulSet")
    p.add_argument("--regenerate", action="store_true", help="make a guarded Secret anyway")
    p.add_argument("--label", action="append", default=[], type=_label, help="K=V on made Secrets")
    p.add_argument("--kubeconfig", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    namespace = args.namespace
    if not namespace:
        try:
            namespace = NAMESPACE_FILE.read_text().strip()
        except OSError:
            namespace = os.environ.get("NAMESPACE", "")
    if not namespace:
        print("cannot start: no --namespace (and not in a pod)", file=sys.stderr)
        return 2

    async def go() -> int:
        try:
            kube = rest.Kube.from_kubeconfig(args.kubeconfig)
        except ValueError as e:
            print(f"cannot start: {e}", file=sys.stderr)
            return 2
        try:
            done = await ensure(
                kube,
                namespace,
                args.keys,
                labels=dict(args.label),
                guard=frozenset(args.guard),
                controller=args.controller,
                regenerate=args.regenerate,
            )
        except Refused as e:
            print(f"refused: {e}", file=sys.stderr, flush=True)
            return 1
        finally:
            await kube.close()
        for line in done:
            print(line, flush=True)
        return 0

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
