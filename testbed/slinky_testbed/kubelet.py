"""The process kubelet: Kubernetes Nodes whose pods are local processes in the Slurm root.

kwok makes pods look Running without running anything; the operator needs the real thing.
Each container of a pod bound to one of our Nodes runs as a process chrooted into the Slurm
root file system, in a UTS namespace of its own whose hostname is the pod's hostname. That
namespace also identifies every process the container started (slurmd's slurmstepd and job
tasks included), so stopping a container stops all of them, as a container runtime would.

A container whose program is `slurmd` gets a unique `Port=` (several slurmd share one host
here), `-N <hostname>` unless it names itself, and `-D` so it stays in the foreground.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from slinky.kube import rest
from slinky_testbed import procs

log = logging.getLogger("slinky_testbed.kubelet")

JSON = dict[str, Any]
CLONE_NEWUTS = 0x04000000
KUBELET_LABEL = "testbed.slinky.slurm.net/kubelet"
LEASE_DURATION_S = 40
HEARTBEAT_S = 10


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _enter_container(root: str, hostname: str, workdir: str) -> None:
    """Runs in the child between fork and exec: own UTS namespace and hostname, chroot."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUTS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)")
    name = hostname.encode()
    if libc.sethostname(name, len(name)) != 0:
        raise OSError(ctypes.get_errno(), "sethostname")
    os.chroot(root)
    os.chdir(workdir or "/")


def uts_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def pids_in_uts_ns(ns: str) -> list[int]:
    """Every process in the UTS namespace `ns` (all that a container started)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and uts_ns(int(entry.name)) == ns:
            out.append(int(entry.name))
    return out


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values."""
    return _VAR_REF.sub(
        lambda m: env.get(m.group(1), m.group(0)), value.replace("$$", "\0")
    ).replace("\0", "$")


def slurmd_argv(argv: list[str], *, hostname: str, port: int) -> list[str]:
    """Make a slurmd command line fit a shared host: foreground, own name, own port."""
    out = list(argv)
    if "-D" not in out:
        out.insert(1, "-D")
    if "-N" not in out and not any(a.startswith("-N") and len(a) > 2 for a in out):
        out[1:1] = ["-N", hostname]
    for i, a in enumerate(out):
        if a == "--conf" and i + 1 < len(out):
            if "Port=" not in out[i + 1]:
                out[i + 1] = f"{out[i + 1]} Port={port}".strip()
            break
        if a.startswith("--conf="):
            if "Port=" not in a:
                out[i] = f"{a} Port={port}"
            break
    else:
        out += ["--conf", f"Port={port}"]
    return out


class Container:
    """One container of a pod: its process and what the status should say about it."""

    def __init__(self, spec: JSON) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.proc: asyncio.subprocess.Process | None = None
        self.ns: str | None = None
        self.restarts = 0
        self.state: JSON = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: JSON = {}
        self.exit_code: int | None = None
        self.ready = False


class PodWorker:
    """Runs one pod from binding to finalization."""

    def __init__(self, kubelet: ProcessKubelet, pod: JSON) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        spec = pod["spec"]
        self.hostname: str = (spec.get("hostname") or self.name)[:63]
        self.containers = [Container(c) for c in spec.get("containers") or []]
        self.init_containers = [Container(c) for c in spec.get("initContainers") or []]
        self.slurmd_port = procs.free_port()
        self.changed = asyncio.Event()
        self.status_lock = asyncio.Lock()
        self.deleted = False
        self.start_time = now_iso()
        self.phase = "Pending"
        self.log_dir = kubelet.state_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.task = asyncio.create_task(self.run(), name=f"pod {self.namespace}/{self.name}")

    def update(self, pod: JSON | None) -> None:
        if pod is None:
            self.deleted = True
        else:
            self.pod = pod
        self.changed.set()

    @property
    def terminating(self) -> bool:
        return self.deleted or bool(self.pod["metadata"].get("deletionTimestamp"))

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            if self.pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                await self._wait_for_deletion()
            else:
                await self._run_pod()
        except asyncio.CancelledError:
            await self._kill_all(grace=2)
            raise
        except Exception:
            log.exception("pod %s/%s: worker failed", self.namespace, self.name)
            await self._kill_all(grace=2)
        finally:
            self.kubelet.workers.pop(self.uid, None)

    async def _run_pod(self) -> None:
        env = await self._base_env()
        await self._patch_status()
        for c in self.init_containers:
            while not self.terminating:
                code = await self._run_to_completion(c, env)
                if code == 0:
                    break
                if self.pod["spec"].get("restartPolicy", "Always") == "Never":
                    self.phase = "Failed"
                    await self._patch_status()
                    await self._wait_for_deletion()
                    return
            if self.terminating:
                await self._finalize()
                return
        runners = [asyncio.create_task(self._run_container(c, env)) for c in self.containers]
        await self._patch_status()
        while not self.terminating:
            if all(r.done() for r in runners):
                codes = [c.exit_code for c in self.containers]
                self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
                await self._patch_status()
                await self._wait_for_deletion()
                return
            self.changed.clear()
            waiter = asyncio.create_task(self.changed.wait())
            await asyncio.wait(
                [waiter, *[r for r in runners if not r.done()]], return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
        for r in runners:
            r.cancel()
        await self._terminate()

    async def _wait_for_deletion(self) -> None:
        while not self.terminating:
            self.changed.clear()
            await self.changed.wait()
        await self._finalize()

    async def _run_container(self, c: Container, env: dict[str, str]) -> None:
        """Start, watch, and restart one container per the pod's restartPolicy."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        backoff = 1.0
        while True:
            started = time.monotonic()
            code = await self._run_to_completion(c, env)
            if self.terminating:
                return
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            c.restarts += 1
            c.state = {"waiting": {"reason": "CrashLoopBackOff" if code else "Completed"}}
            await self._patch_status()
            backoff = 1.0 if time.monotonic() - started > 10 else min(backoff * 2, 10.0)
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), backoff)
            if self.terminating:
                return

    async def _run_to_completion(self, c: Container, env: dict[str, str]) -> int:
        try:
            argv, cenv = self._argv_env(c, env)
        except ValueError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            await self._patch_status()
            return 128
        logf = open(self.log_dir / f"{c.name}.log", "ab")  # noqa: SIM115 - owned by the child
        started_at = now_iso()
        try:
            c.proc = await asyncio.create_subprocess_exec(
                *argv,
                env=cenv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _enter_container(
                    str(self.kubelet.root), self.hostname, c.spec.get("workingDir", "/")
                ),
            )
        except OSError as e:
            logf.close()
            c.exit_code = 128
            c.state = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": str(e),
                    "startedAt": started_at,
                    "finishedAt": now_iso(),
                }
            }
            await self._patch_status()
            return 128
        logf.close()
        c.ns = uts_ns(c.proc.pid)
        self.kubelet.track_pid(c.proc.pid)
        c.state = {"running": {"startedAt": started_at}}
        c.ready = True
        if self.phase == "Pending" and c in self.containers:
            self.phase = "Running"
        await self._patch_status()
        code = await c.proc.wait()
        self.kubelet.untrack_pid(c.proc.pid)
        # Kubernetes reports death by signal N as exit code 128+N.
        code = 128 - code if code < 0 else code
        c.exit_code = code
        c.ready = False
        c.last_state = {}
        c.state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started_at,
                "finishedAt": now_iso(),
            }
        }
        if not self.terminating:
            await self._patch_status()
        return code

    def _argv_env(self, c: Container, base_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        cenv = dict(base_env)
        for e in c.spec.get("env") or []:
            if "value" in e:
                cenv[e["name"]] = expand(str(e["value"]), cenv)
            elif "valueFrom" in e:
                cenv[e["name"]] = self._value_from(e["valueFrom"], e["name"])
        argv = [expand(a, cenv) for a in (c.spec.get("command") or []) + (c.spec.get("args") or [])]
        if not argv:
            raise ValueError(f"container {c.name}: the process kubelet needs an explicit command")
        if os.path.basename(argv[0]) == "slurmd":
            argv = slurmd_argv(argv, hostname=self.hostname, port=self.slurmd_port)
        return argv, cenv

    def _value_from(self, src: JSON, name: str) -> str:
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            meta, spec = self.pod["metadata"], self.pod["spec"]
            simple = {
                "metadata.name": self.name,
                "metadata.namespace": self.namespace,
                "metadata.uid": self.uid,
                "spec.nodeName": spec.get("nodeName", ""),
                "spec.serviceAccountName": spec.get("serviceAccountName", ""),
                "status.podIP": "127.0.0.1",
                "status.hostIP": "127.0.0.1",
            }
            if path in simple:
                return str(simple[path])
            m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if m:
                return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        if "configMapKeyRef" in src or "secretKeyRef" in src:
            ref = src.get("configMapKeyRef") or src["secretKeyRef"]
            data = self.kubelet.cached_refs.get(
                (self.namespace, "secretKeyRef" in src, ref["name"])
            )
            if data is not None and ref["key"] in data:
                return data[ref["key"]]
            if ref.get("optional"):
                return ""
        raise ValueError(f"env {name}: unsupported or unresolved valueFrom {src}")

    async def _base_env(self) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": self.hostname,
            "LANG": "C.UTF-8",
            "POD_NAME": self.name,
            "POD_NAMESPACE": self.namespace,
        }
        for c in (*self.init_containers, *self.containers):
            for e in c.spec.get("env") or []:
                src = e.get("valueFrom") or {}
                for key, secret in (("configMapKeyRef", False), ("secretKeyRef", True)):
                    if key in src:
                        await self.kubelet.fetch_ref(self.namespace, secret, src[key]["name"])
        return env

    # ------------------------------------------------------------ termination

    async def _terminate(self) -> None:
        grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if self.deleted:
            grace = 0
        deadline = time.monotonic() + grace
        running = [c for c in self.containers if c.proc and c.proc.returncode is None]
        env = await self._base_env()
        await asyncio.gather(*(self._pre_stop(c, env, deadline) for c in running))
        await self._kill_all(grace=max(0.0, deadline - time.monotonic()))
        await self._finalize()

    async def _pre_stop(self, c: Container, env: dict[str, str], deadline: float) -> None:
        hook = ((c.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if not hook or not hook.get("command"):
            return
        hook_container = Container(
            {"name": c.name, "command": hook["command"], "env": c.spec.get("env")}
        )
        argv, cenv = self._argv_env(hook_container, env)
        with open(self.log_dir / f"{c.name}.prestop.log", "ab") as logf:
            p = await asyncio.create_subprocess_exec(
                *argv,
                env=cenv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _enter_container(str(self.kubelet.root), self.hostname, "/"),
            )
        self.kubelet.track_pid(p.pid)
        try:
            await asyncio.wait_for(p.wait(), max(0.1, deadline - time.monotonic()))
            log.info(
                "pod %s/%s: preStop of %s exited %s",
                self.namespace,
                self.name,
                c.name,
                p.returncode,
            )
        except TimeoutError:
            log.warning("pod %s/%s: preStop of %s timed out", self.namespace, self.name, c.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            await p.wait()
        finally:
            self.kubelet.untrack_pid(p.pid)

    async def _kill_all(self, *, grace: float) -> None:
        """SIGTERM every process of every container, SIGKILL after `grace` seconds."""
        namespaces = {c.ns for c in (*self.init_containers, *self.containers) if c.ns}
        if not namespaces:
            return
        targets = [pid for ns in namespaces for pid in pids_in_uts_ns(ns)]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not any(pids_in_uts_ns(ns) for ns in namespaces):
                break
            await asyncio.sleep(0.05)
        for ns in namespaces:
            for pid in pids_in_uts_ns(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for c in (*self.init_containers, *self.containers):
            if c.proc:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c.proc.wait(), 5)
                self.kubelet.untrack_pid(c.proc.pid)

    async def _finalize(self) -> None:
        """Remove the pod object: the last step of a deletion, as a kubelet does."""
        if self.deleted:
            return
        with contextlib.suppress(rest.ApiError):
            await self.kubelet.kube.delete(
                rest.PODS, self.name, self.namespace, uid=self.uid, grace_period=0
            )
        self.deleted = True

    # ------------------------------------------------------------ status

    def _container_status(self, c: Container) -> JSON:
        return {
            "name": c.name,
            "image": c.spec.get("image", "process"),
            "imageID": "",
            "containerID": f"process://{c.proc.pid}" if c.proc else "",
            "ready": c.ready,
            "started": "running" in c.state,
            "restartCount": c.restarts,
            "state": c.state,
            "lastState": c.last_state,
        }

    async def _patch_status(self) -> None:
        # Serialized, and computed inside the lock, so the last patch sent is the newest state.
        async with self.status_lock:
            await self._patch_status_locked()

    async def _patch_status_locked(self) -> None:
        if self.terminating:
            return
        ts = now_iso()
        inited = all("terminated" in c.state and c.exit_code == 0 for c in self.init_containers)
        ready = self.phase == "Running" and all(c.ready for c in self.containers)

        def cond(t: str, ok: bool) -> JSON:
            return {"type": t, "status": "True" if ok else "False", "lastTransitionTime": ts}

        status: JSON = {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.start_time,
            "conditions": [
                cond("PodScheduled", True),
                cond("Initialized", inited),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ],
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [
                self._container_status(c) for c in self.init_containers
            ]
        # Keep lastTransitionTime stable for conditions that did not change.
        old = {c["type"]: c for c in (self.pod.get("status") or {}).get("conditions") or []}
        for c in status["conditions"]:
            prev = old.get(c["type"])
            if prev and prev.get("status") == c["status"]:
                c["lastTransitionTime"] = prev.get("lastTransitionTime", ts)
        try:
            # Strategic merge: conditions merge by type, so conditions other controllers
            # set on the pod (as the operator's SlurmNodeState*) survive, as with a kubelet.
            self.pod = await self.kubelet.kube.patch(
                rest.PODS,
                self.name,
                {"status": status},
                self.namespace,
                subresource="status",
                kind="strategic",
            )
        except rest.ApiError as e:
            if e.not_found:
                self.deleted = True
                self.changed.set()
            else:
                log.warning("pod %s/%s: status patch failed: %s", self.namespace, self.name, e)


class ProcessKubelet:
    """Serves several Nodes from one process."""

    def __init__(
        self,
        kube: rest.Kube,
        *,
        nodes: list[str],
        root: Path,
        state_dir: Path,
        cpus: int,
        memory: str,
    ) -> None:
        self.kube = kube
        self.nodes = nodes
        self.root = root
        self.state_dir = state_dir
        self.cpus = cpus
        self.memory = memory
        self.workers: dict[str, PodWorker] = {}
        self.cached_refs: dict[tuple[str, bool, str], dict[str, str]] = {}
        self.pid_dir = state_dir / "pids"
        self.pid_dir.mkdir(parents=True, exist_ok=True)

    def track_pid(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            p = procs.Proc.of(pid)
            (self.pid_dir / str(pid)).write_text(f"{p.pid} {p.started}\n")

    def untrack_pid(self, pid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.pid_dir / str(pid)).unlink()

    async def fetch_ref(self, namespace: str, secret: bool, name: str) -> None:
        import base64

        res = rest.SECRETS if secret else rest.CONFIGMAPS
        try:
            obj = await self.kube.get(res, name, namespace)
        except rest.ApiError:
            return
        data = dict(obj.get("data") or {})
        if secret:
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        self.cached_refs[(namespace, secret, name)] = data

    # ------------------------------------------------------------ nodes

    def _node_status(self) -> JSON:
        ts = now_iso()
        res = {
            "cpu": str(self.cpus),
            "memory": self.memory,
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }
        conds = [
            ("Ready", "True", "KubeletReady", "process kubelet is posting ready status"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
            ("PIDPressure", "False", "KubeletHasSufficientPID", ""),
        ]
        return {
            "capacity": res,
            "allocatable": res,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": ts,
                    "lastTransitionTime": ts,
                }
                for t, s, r, m in conds
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {
                "kubeletVersion": "v0.0.0-process",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "process://1",
                "kernelVersion": os.uname().release,
                "osImage": "Slurm root (Debian sid)",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    async def register(self, name: str) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    KUBELET_LABEL: "process",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
        }
        with contextlib.suppress(rest.ApiError):
            await self.kube.create(rest.NODES, node)
        await self.kube.patch(
            rest.NODES, name, {"status": self._node_status()}, subresource="status"
        )

    async def heartbeat(self, name: str) -> None:
        lease_ns = "kube-node-lease"
        last_status = time.monotonic()
        while True:
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": lease_ns},
                "spec": {
                    "holderIdentity": name,
                    "leaseDurationSeconds": LEASE_DURATION_S,
                    "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                },
            }
            try:
                await self.kube.apply(rest.LEASES, lease, field_manager="process-kubelet")
                if time.monotonic() - last_status > 30:
                    await self.register(name)
                    last_status = time.monotonic()
            except Exception as e:  # keep beating through apiserver restarts
                log.warning("node %s: heartbeat failed: %s", name, e)
            await asyncio.sleep(HEARTBEAT_S)

    # ------------------------------------------------------------ pods

    async def watch_pods(self, node: str) -> None:
        """List+watch the pods bound to `node`, resuming after errors."""
        rv = ""
        while True:
            try:
                if not rv:
                    listed = await self.kube.list(
                        rest.PODS, params={"fieldSelector": f"spec.nodeName={node}"}
                    )
                    rv = listed["metadata"]["resourceVersion"]
                    seen = {p["metadata"]["uid"] for p in listed["items"]}
                    for w in list(self.workers.values()):
                        if w.pod["spec"].get("nodeName") == node and w.uid not in seen:
                            w.update(None)
                    for pod in listed["items"]:
                        self.on_pod(pod)
                async for ev in self.kube.watch(
                    rest.PODS,
                    params={
                        "fieldSelector": f"spec.nodeName={node}",
                        "resourceVersion": rv,
                        "allowWatchBookmarks": True,
                        "timeoutSeconds": 300,
                    },
                ):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] == "BOOKMARK":
                        continue
                    if ev["type"] == "DELETED":
                        gone = self.workers.get(obj["metadata"]["uid"])
                        if gone:
                            gone.update(None)
                    else:
                        self.on_pod(obj)
            except rest.ApiError as e:
                if e.gone:
                    rv = ""
                    continue
                log.warning("node %s: pod watch failed: %s", node, e)
                await asyncio.sleep(1)
            except Exception as e:
                log.warning("node %s: pod watch failed: %s", node, e)
                await asyncio.sleep(1)

    def on_pod(self, pod: JSON) -> None:
        uid = pod["metadata"]["uid"]
        w = self.workers.get(uid)
        if w:
            w.update(pod)
        else:
            self.workers[uid] = PodWorker(self, pod)

    async def run(self) -> None:
        for n in self.nodes:
            await self.register(n)
        tasks = [asyncio.create_task(self.heartbeat(n)) for n in self.nodes]
        tasks += [asyncio.create_task(self.watch_pods(n)) for n in self.nodes]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for t in tasks:
            t.cancel()
        workers = list(self.workers.values())
        for w in workers:
            w.task.cancel()
        await asyncio.gather(*(w.task for w in workers), return_exceptions=True)
        await self.kube.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="process-kubelet", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--root", required=True, type=Path, help="the Slurm root file system")
    p.add_argument("--state-dir", required=True, type=Path)
    p.add_argument("--node", action="append", required=True, help="a Node name to serve (repeat)")
    p.add_argument("--cpus", type=int, default=8)
    p.add_argument("--memory", default="16Gi")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    kube = rest.Kube.from_kubeconfig(args.kubeconfig)
    kubelet = ProcessKubelet(
        kube,
        nodes=args.node,
        root=args.root,
        state_dir=args.state_dir,
        cpus=args.cpus,
        memory=args.memory,
    )
    asyncio.run(kubelet.run())


if __name__ == "__main__":
    main()
