"""An OCI bundle for `srun --container` in a slurmd pod: a busybox root file system and the
rootless config.json of `crun spec --rootless`, changed for a pod: /proc is a bind mount of
the pod's own (the runtime masks parts of it, and the kernel then refuses a new procfs mount
to a user namespace) and so there is no pid namespace; the pod's network (Slurm's containers
run in the host's) and so /sys a read-only bind mount of the pod's too; the user's own uid
and gid mapped to themselves (Slurm runs the step as the job's user).
Usage: python3 oci_bundle.py DIR"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

bundle = Path(sys.argv[1])
shutil.rmtree(bundle, ignore_errors=True)
(bundle / "rootfs/bin").mkdir(parents=True)
shutil.copy("/bin/busybox", bundle / "rootfs/bin/busybox")
for applet in ("sh", "cat", "nproc", "id", "ls", "sed"):
    (bundle / "rootfs/bin" / applet).symlink_to("busybox")
# Slurm names the step's program by its path on the node (/usr/bin/sh in the Slurm image).
(bundle / "rootfs/usr").mkdir()
(bundle / "rootfs/usr/bin").symlink_to("../bin")
subprocess.run(["crun", "spec", "--rootless"], cwd=bundle, check=True)
config = json.loads((bundle / "config.json").read_text())
config["process"]["terminal"] = False
linux = config["linux"]
# Slurm runs the step as the job's user inside the container: map that uid and gid to
# themselves (a rootless runtime can map only its own ids without /etc/subuid ranges).
uid, gid = os.getuid(), os.getgid()
linux["uidMappings"] = [{"containerID": uid, "hostID": uid, "size": 1}]
linux["gidMappings"] = [{"containerID": gid, "hostID": gid, "size": 1}]
config["process"]["user"] = {"uid": uid, "gid": gid}
# No cgroup namespace either: /proc/self/cgroup then names the step's cgroup by its path in
# the pod (the e2e test reads the job's memory limit through it).
linux["namespaces"] = [
    ns for ns in linux["namespaces"] if ns["type"] not in ("pid", "network", "cgroup")
]
mounts = [m for m in config["mounts"] if not m["destination"].startswith(("/proc", "/sys"))]
config["mounts"] = [
    {"destination": "/proc", "type": "bind", "source": "/proc", "options": ["rbind"]},
    *mounts,
    {
        "destination": "/sys",
        "type": "bind",
        "source": "/sys",
        "options": ["rbind", "nosuid", "noexec", "nodev", "ro"],
    },
]
(bundle / "config.json").write_text(json.dumps(config, indent=1))
print(f"bundle {bundle}: namespaces {[ns['type'] for ns in linux['namespaces']]}")
