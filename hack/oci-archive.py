#!/usr/bin/env python3
"""Pack a directory as a one-layer OCI image archive (an OCI image layout in a tar), without a
registry or a daemon; `ctr images import` reads it. Standard library only: it runs before the
project's virtualenv exists."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _layer(rootfs: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(rootfs.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0  # reproducible: same input, same digest
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _blob(out: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", len(data)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tag", required=True, help="full image reference, e.g. registry/name:tag")
    p.add_argument("--rootfs", type=Path, required=True)
    p.add_argument("--entrypoint", action="append", default=[])
    p.add_argument("--user", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    layer = _layer(args.rootfs)
    with tarfile.open(args.out, "w") as out:
        layer_digest, layer_size = _blob(out, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": args.entrypoint, "User": args.user},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
        config_digest, config_size = _blob(out, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": layer_size,
                }
            ],
        }
        manifest_digest, manifest_size = _blob(out, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": args.tag,
                        "org.opencontainers.image.ref.name": args.tag,
                    },
                }
            ],
        }
        for name, doc in (
            ("oci-layout", {"imageLayoutVersion": "1.0.0"}),
            ("index.json", index),
        ):
            data = json.dumps(doc, sort_keys=True).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
