"""Container images built here, without a registry or a daemon.

Each image is an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/...`) written as
one tar archive that `ctr -n k8s.io images import` accepts. The index entry names the image
(`io.containerd.image.name` and `org.opencontainers.image.ref.name` both carry the full
reference), so the import needs no `--base-name` and pods find it with
`imagePullPolicy: IfNotPresent`.

- Slurm image: the cached Debian sid root holding Slurm (`hack/build-slurm-root.sh`) used as
  it is as one zstd layer, plus a small layer with a static init (tini), an entrypoint that
  prepares the runtime directories and execs the daemon it is given, and those directories.
- Slurm HPC image (`slurm-hpc`): the Slurm image's two layers plus one zstd layer holding MPI,
  hpcc, CPU PyTorch and job container runtimes (`hack/build-hpc-layer.sh`), for the compute
  and login pods of HPC/AI NodeSets; the Slurm image stays lean for every other role.
- Slinky image: a Debian root with Python (`hack/build-python-root.sh`) as a zstd layer, a
  layer with a venv holding the dependencies locked in `images/slinky/requirements.lock`, and
  a layer with the slinky wheel (never the test bed package), installed in an overlay over
  the unpacked lower layers so the overlay's upper directory is exactly that layer.

`make images` runs `python -m slinky_testbed.images build`; a stamp of the inputs' hashes
makes a second run with unchanged inputs a no-op. `built()` tells the test bed what to import.
This module uses only the standard library (plus the `zstd`, `tar`, `chroot` and `mount`
commands; it needs root).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from slinky_testbed import paths

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
# containerd's importer reads this annotation first; ctr 2.1 also takes a full reference from
# ref.name alone (checked), but setting both names the image for any OCI-layout importer.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"

# Bump when the way images are assembled changes, so cached archives get rebuilt.
BUILDER_VERSION = "4"
SLURM_REPO = "localhost/slinky/slurm"
SLURM_HPC_REPO = "localhost/slinky/slurm-hpc"
SLINKY_REPO = "localhost/slinky/slinky"
VENV = "/opt/slinky"
SLINKY_UID = 65532
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_CHUNK = 1 << 20


class ImagesNotBuilt(RuntimeError):
    """The image archives are missing: run `make images`."""


# ---------------------------------------------------------------------------------------------
# OCI image layout: pure pieces


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> bytes:
    """JSON with sorted keys and no spaces: the same object always gets the same digest."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Layer:
    """A layer blob as stored: its file, media type, digest and the digest of its tar."""

    path: Path
    media_type: str
    digest: str
    size: int
    diff_id: str
    comment: str = ""


@dataclass(frozen=True)
class ImageConfig:
    """What a container of the image runs (the OCI config's `config` object)."""

    entrypoint: Sequence[str]
    cmd: Sequence[str] = ()
    env: Sequence[str] = (f"PATH={STANDARD_PATH}",)
    working_dir: str = "/"
    user: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


def config_document(cfg: ImageConfig, layers: Sequence[Layer]) -> dict[str, Any]:
    """The OCI image config: platform, run settings and the layers' uncompressed digests."""
    run: dict[str, Any] = {
        "Entrypoint": list(cfg.entrypoint),
        "Env": list(cfg.env),
        "WorkingDir": cfg.working_dir,
    }
    if cfg.cmd:
        run["Cmd"] = list(cfg.cmd)
    if cfg.user:
        run["User"] = cfg.user
    if cfg.labels:
        run["Labels"] = dict(cfg.labels)
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created_by": layer.comment or "layer"} for layer in layers],
    }


def descriptor(media_type: str, digest: str, size: int, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": size, **extra}


def manifest_document(config: bytes, layers: Sequence[Layer]) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": descriptor(MEDIA_CONFIG, sha256_digest(config), len(config)),
        "layers": [descriptor(x.media_type, x.digest, x.size) for x in layers],
    }


def index_document(manifest: bytes, ref: str) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            descriptor(
                MEDIA_MANIFEST,
                sha256_digest(manifest),
                len(manifest),
                platform={"architecture": "amd64", "os": "linux"},
                annotations={ANNOTATION_CONTAINERD_NAME: ref, ANNOTATION_REF_NAME: ref},
            )
        ],
    }


def check_ref(ref: str) -> None:
    """Refuse references containerd would reject or rename (they must be fully qualified)."""
    if not re.fullmatch(
        r"[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+:[\w][\w.-]{0,127}", ref
    ):
        raise ValueError(f"image reference {ref!r} is not of the form host/path:tag")


def write_layout(archive: Path, ref: str, cfg: ImageConfig, layers: Sequence[Layer]) -> str:
    """Write the OCI image layout of one image as a tar; returns the manifest digest."""
    check_ref(ref)
    config = canonical_json(config_document(cfg, layers))
    manifest = canonical_json(manifest_document(config, layers))
    index = canonical_json(index_document(manifest, ref))
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
        _add_bytes(tar, "index.json", index)
        _add_dir(tar, "blobs")
        _add_dir(tar, "blobs/sha256")
        _add_bytes(tar, _blob_name(sha256_digest(manifest)), manifest)
        _add_bytes(tar, _blob_name(sha256_digest(config)), config)
        seen: set[str] = set()
        for layer in layers:
            if layer.digest in seen:
                continue
            seen.add(layer.digest)
            info = tarfile.TarInfo(_blob_name(layer.digest))
            info.size = layer.size
            info.mode = 0o644
            with layer.path.open("rb") as f:
                tar.addfile(info, f)
    tmp.replace(archive)
    return sha256_digest(manifest)


def _blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755, uid: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.uid = info.gid = uid
    tar.addfile(info)


# ---------------------------------------------------------------------------------------------
# Layers


def _hash_stream(stream: IO[bytes]) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    while chunk := stream.read(_CHUNK):
        h.update(chunk)
        size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def zstd_layer(path: Path, comment: str) -> Layer:
    """A zstd-compressed tar used as it is; its diff_id is the digest of the decompressed tar."""
    with path.open("rb") as f:
        digest, size = _hash_stream(f)
    with subprocess.Popen(["zstd", "-dc", str(path)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        diff_id, _ = _hash_stream(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"zstd -dc {path} failed with exit code {proc.returncode}")
    return Layer(path, MEDIA_LAYER_ZSTD, digest, size, diff_id, comment)


def gzip_layer(tar_path: Path, out: Path, comment: str) -> Layer:
    """Compress an uncompressed layer tar with gzip (mtime 0: same input, same digest)."""
    with tar_path.open("rb") as f:
        diff_id, _ = _hash_stream(f)
    with (
        tar_path.open("rb") as src,
        out.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz,
    ):
        shutil.copyfileobj(src, gz, _CHUNK)
    with out.open("rb") as f:
        digest, size = _hash_stream(f)
    return Layer(out, MEDIA_LAYER_GZIP, digest, size, diff_id, comment)


@dataclass(frozen=True)
class Entry:
    """One member of a layer built in memory: a directory (data None) or a regular file."""

    name: str
    mode: int
    data: bytes | None = None
    uid: int = 0
    gid: int = 0


def write_entries_tar(out: Path, entries: Iterable[Entry]) -> None:
    """A deterministic layer tar: fixed mtime, numeric owners, in the order given."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mode = e.mode
            info.uid, info.gid = e.uid, e.gid
            if e.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))


def write_tree_tar(out: Path, root: Path, members: Iterable[str]) -> None:
    """A layer tar of the given paths (relative to `root`), owners kept as numeric ids."""

    def numeric(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uname = info.gname = ""
        return info

    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(members):
            tar.add(root / rel, arcname=rel, recursive=False, filter=numeric)


def tree_snapshot(root: Path, top: str) -> dict[str, tuple[int, int, int]]:
    """Path (relative to `root`) -> (mode, size, mtime_ns) of everything under `root/top`."""
    snap: dict[str, tuple[int, int, int]] = {}
    base = root / top.lstrip("/")
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            snap[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    st = base.lstat()
    snap[str(base.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return snap


# ---------------------------------------------------------------------------------------------
# Inputs and caching


def images_dir() -> Path:
    return paths.cache_dir() / "images"


def python_root_tarball() -> Path:
    """The zstd tarball of the Debian root with Python (`hack/build-python-root.sh`)."""
    return paths.cache_dir() / "python-root-bookworm.tar.zst"


def hpc_layer_tarball() -> Path:
    """The zstd tarball of the slurm-hpc image's own layer (`hack/build-hpc-layer.sh`)."""
    return paths.cache_dir() / "slurm-hpc-layer-sid.tar.zst"


def repo_dir() -> Path:
    return paths.hack_dir().parent


def slurm_entrypoint() -> Path:
    """The Slurm image's entrypoint script (shared with images/slurm/Containerfile)."""
    return repo_dir() / "images/slurm/slurm-entrypoint"


def lock_file() -> Path:
    """The Slinky image's locked dependency versions (shared with its Containerfile)."""
    return repo_dir() / "images/slinky/requirements.lock"


def file_fingerprint(path: Path) -> str:
    """Identity of a big cached input without reading it: its stamp, size and mtime."""
    st = path.stat()
    stamp = path.with_name(path.name + ".stamp")
    tag = stamp.read_text().strip() if stamp.exists() else ""
    return f"{path.name}|{st.st_size}|{st.st_mtime_ns}|{tag}"


def tree_hash(root: Path, skip: Callable[[Path], bool]) -> str:
    """Digest of the names and contents of all files under `root` (sorted walk)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not skip(Path(dirpath) / d))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if skip(p):
                continue
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def _not_source(p: Path) -> bool:
    return p.name == "__pycache__" or p.suffix == ".pyc" or p.name.endswith(".egg-info")


def inputs_key(parts: Mapping[str, str]) -> str:
    return hashlib.sha256(canonical_json(dict(parts))).hexdigest()


def project_version(pyproject: Path) -> str:
    with pyproject.open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def dpkg_versions(status: str, packages: Iterable[str]) -> dict[str, str]:
    """Versions of the given packages in a dpkg status file (those installed)."""
    wanted = set(packages)
    found: dict[str, str] = {}
    for para in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in para.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Package") in wanted:
            found[fields["Package"]] = fields.get("Version", "")
    return found


def slurm_tag(version: str) -> str:
    """`26.05.5-1` -> `26.05`: the tag names the Slurm release, not the Debian revision."""
    m = re.match(r"(\d+)\.(\d+)\.", version)
    if not m:
        raise ValueError(f"unexpected Slurm package version {version!r}")
    return f"{m.group(1)}.{m.group(2)}"


def passwd_ids(passwd: str, user: str) -> tuple[int, int]:
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise KeyError(f"user {user!r} not in /etc/passwd of the root")


def _tar_member(tarball: Path, member: str) -> bytes:
    return subprocess.run(
        ["tar", "--zstd", "-xOf", str(tarball), member], check=True, capture_output=True
    ).stdout


# ---------------------------------------------------------------------------------------------
# Image builds


@dataclass(frozen=True)
class BuiltImage:
    """One image archive: its short name, full reference, archive path and manifest digest."""

    name: str
    ref: str
    archive: Path
    digest: str
    size: int

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ref": self.ref,
            "archive": str(self.archive),
            "digest": self.digest,
            "size": self.size,
        }


def _cached(name: str, key: str, out_dir: Path) -> BuiltImage | None:
    stamp = out_dir / f"{name}.stamp.json"
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    archive = Path(data.get("archive", ""))
    if data.get("key") != key or not archive.is_file():
        return None
    return BuiltImage(name, data["ref"], archive, data["digest"], int(data["size"]))


def _record(image: BuiltImage, key: str, out_dir: Path) -> None:
    stamp = out_dir / f"{image.name}.stamp.json"
    stamp.write_text(json.dumps({"key": key, **image.as_json()}, indent=1) + "\n")


def _slurm_inputs() -> tuple[Path, Path]:
    root = paths.slurm_root_tarball()
    pyroot = python_root_tarball()
    for t in (root, pyroot):
        if not t.is_file():
            raise ImagesNotBuilt(f"{t} missing: run `make testbed-build` and `make images`")
    return root, pyroot


def _slurm_key(root: Path, pyroot: Path) -> dict[str, str]:
    return {
        "builder": BUILDER_VERSION,
        "root": file_fingerprint(root),
        "tini-from": file_fingerprint(pyroot),
        "entrypoint": slurm_entrypoint().read_text(),
    }


def _slurm_layers(root: Path, pyroot: Path, out_dir: Path, work: Path) -> tuple[str, list[Layer]]:
    """The Slurm package version and the Slurm image's layers: the root as it is, and a small
    layer with tini, the entrypoint and the runtime directories (the same bytes every time, so
    the slurm-hpc image shares both layers with the Slurm image)."""
    status = _tar_member(root, "./var/lib/dpkg/status").decode()
    version = dpkg_versions(status, ["slurmd"]).get("slurmd")
    if not version:
        raise RuntimeError(f"{root} has no slurmd package")
    slurm_uid, slurm_gid = passwd_ids(_tar_member(root, "./etc/passwd").decode(), "slurm")
    # tini-static from the Debian root we build anyway: one static binary, any glibc.
    tini = _tar_member(pyroot, "./usr/bin/tini-static")
    entries = [
        Entry("usr", 0o755),
        Entry("usr/bin", 0o755),
        Entry("usr/bin/tini", 0o755, tini),
        Entry("usr/local", 0o755),
        Entry("usr/local/bin", 0o755),
        Entry("usr/local/bin/slurm-entrypoint", 0o755, slurm_entrypoint().read_bytes()),
        Entry("run", 0o755),
        Entry("run/slurm", 0o755),
        Entry("run/slurmctld", 0o755, uid=slurm_uid, gid=slurm_gid),
        Entry("var", 0o755),
        Entry("var/spool", 0o755),
        Entry("var/spool/slurmd", 0o755),
        Entry("var/spool/slurmctld", 0o755, uid=slurm_uid, gid=slurm_gid),
        Entry("var/log", 0o755),
        Entry("var/log/slurm", 0o755),
    ]
    write_entries_tar(work / "extra.tar", entries)
    extra = gzip_layer(work / "extra.tar", work / "extra.tar.gz", "tini, entrypoint, runtime dirs")
    base = _cached_zstd_layer(root, f"Debian sid root with Slurm {version}", out_dir)
    return version, [base, extra]


def slurm_image_config(title: str, version: str) -> ImageConfig:
    """What a container of the Slurm image (or the slurm-hpc image) runs."""
    return ImageConfig(
        entrypoint=["/usr/bin/tini", "--", "/usr/local/bin/slurm-entrypoint"],
        labels={
            "org.opencontainers.image.title": title,
            "org.opencontainers.image.version": version,
        },
    )


def build_slurm(out_dir: Path, log: Callable[[str], None]) -> BuiltImage:
    return _build_slurm_image("slurm", SLURM_REPO, None, out_dir, log)


def build_slurm_hpc(out_dir: Path, log: Callable[[str], None]) -> BuiltImage:
    """The Slurm image's layers plus the HPC layer (MPI, hpcc, PyTorch, container runtimes)."""
    hpc = hpc_layer_tarball()
    if not hpc.is_file():
        raise ImagesNotBuilt(f"{hpc} missing: run `make images` (hack/build-hpc-layer.sh)")
    return _build_slurm_image("slurm-hpc", SLURM_HPC_REPO, hpc, out_dir, log)


def _build_slurm_image(
    name: str, repo: str, extra: Path | None, out_dir: Path, log: Callable[[str], None]
) -> BuiltImage:
    """The Slurm image's layers, plus the layer tarball `extra` if given (the HPC layer),
    as `<out_dir>/<name>.oci.tar`; cached by the inputs' fingerprints."""
    root, pyroot = _slurm_inputs()
    inputs = _slurm_key(root, pyroot)
    if extra is not None:
        inputs = {**inputs, "hpc": file_fingerprint(extra)}
    key = inputs_key(inputs)
    if (hit := _cached(name, key, out_dir)) is not None:
        log(f"{name} image: cached ({hit.ref})")
        return hit
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        version, layers = _slurm_layers(root, pyroot, out_dir, Path(tmp))
        if extra is not None:
            what = "MPI, hpcc, PyTorch (CPU), crun, apptainer"
            layers.append(_cached_zstd_layer(extra, what, out_dir))
        ref = f"{repo}:{slurm_tag(version)}"
        archive = out_dir / f"{name}.oci.tar"
        digest = write_layout(archive, ref, slurm_image_config(name, version), layers)
    image = BuiltImage(name, ref, archive, digest, sum(x.size for x in layers))
    _record(image, key, out_dir)
    log(f"{name} image: built {ref} in {time.monotonic() - t0:.1f}s ({image.size >> 20} MiB)")
    return image


def _run(argv: Sequence[str], what: str) -> None:
    proc = subprocess.run(list(argv), check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {proc.stderr[-2000:]}")


# Where the base gets Debian's bundled pip unpacked and compiled: outside the venv, so in no
# layer. Run from its zip, pip recompiles all its modules on every start (tens of seconds).
BUILD_PIP = "/opt/build-pip"


def _unpack_root_pip(root: Path) -> None:
    wheels = sorted((root / "usr/share/python-wheels").glob("pip-*.whl"))
    if not wheels:
        raise RuntimeError("the Python root has no pip wheel (python3-venv missing?)")
    with zipfile.ZipFile(wheels[-1]) as whl:
        whl.extractall(root / BUILD_PIP.lstrip("/"))
    _run(["chroot", str(root), "python3", "-m", "compileall", "-q", BUILD_PIP], "compiling pip")


def _root_pip(root: Path, *args: str) -> None:
    """Run the root's own pip (Debian's bundled one) with the venv's Python, offline."""
    python = ["chroot", str(root), "env", f"PYTHONPATH={BUILD_PIP}", f"{VENV}/bin/python"]
    _run([*python, "-m", "pip", "--disable-pip-version-check", *args], f"pip {args[0]}")


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def wheel_pin(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel file name."""
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) < 5:
        raise ValueError(f"not a wheel file name: {filename!r}")
    return re.sub(r"[-_.]+", "-", parts[0]).lower(), parts[1]


def lock_text(wheels: Iterable[str]) -> str:
    pins = sorted(wheel_pin(w) for w in wheels)
    header = (
        "# The Slinky image's dependencies at exact versions, for `make images` and\n"
        "# images/slinky/Containerfile. Regenerate: python -m slinky_testbed.images lock\n"
    )
    return header + "".join(f"{n}=={v}\n" for n, v in pins)


def _fetch(args: Sequence[str], dest: Path) -> list[Path]:
    """`pip download` of wheels into `dest`: from the cache's wheelhouse when it has them all
    (no index query), else from the package index (through pip's own cache) into the house."""
    house = images_dir() / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    fetch = _pip("download", "-q", "--only-binary=:all:", *args)
    offline = [*fetch, "--no-index", "--find-links", str(house), "-d", str(dest)]
    if subprocess.run(offline, check=False, capture_output=True).returncode != 0:
        _run([*fetch, "-d", str(house)], "downloading wheels (is the lock current?)")
        for ours in house.glob("slinky-*.whl"):
            ours.unlink()  # the house keeps dependencies only
        _run(offline, "collecting wheels")
    return sorted(dest.glob("*.whl"))


def _build_env(pyproject: Path) -> Path:
    """A venv with the build backend pinned in `build-system.requires`, kept in the cache so a
    wheel build skips creating pip's isolated build environment every time."""
    with pyproject.open("rb") as f:
        requires = [str(r) for r in tomllib.load(f)["build-system"]["requires"]]
    env = images_dir() / "build-env"
    stamp = env / ".requires"
    if not stamp.is_file() or stamp.read_text() != "\n".join(requires):
        shutil.rmtree(env, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(env)], "creating the build venv")
        _run([str(env / "bin/python"), "-m", "pip", "install", "-q", *requires], "build backend")
        stamp.write_text("\n".join(requires))
    return env


def build_wheel(repo: Path, dest: Path, work: Path) -> Path:
    """The slinky wheel, built from a clean copy of the sources (a `build/` left in the
    repository would otherwise put deleted modules back into the wheel)."""
    src = work / "source"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(repo / "src", src / "src", ignore=ignore)
    env = _build_env(repo / "pyproject.toml")
    pip = [str(env / "bin/python"), "-m", "pip", "--disable-pip-version-check"]
    _run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(src)],
        "building the slinky wheel",
    )
    (wheel,) = dest.glob("slinky-*.whl")
    return wheel


def lock() -> Path:
    """Write the lock from what the project's pins resolve to now (within the dev venv's)."""
    frozen = subprocess.run(
        _pip("freeze", "--exclude-editable"), check=True, capture_output=True, text=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "venv.txt").write_text(frozen)
        wheel = build_wheel(repo_dir(), work / "wheel", work)
        deps = _fetch([str(wheel), "-c", str(work / "venv.txt")], work / "deps")
        lock_file().write_text(lock_text(p.name for p in deps if p.name != wheel.name))
    return lock_file()


def _cached_zstd_layer(path: Path, comment: str, out_dir: Path) -> Layer:
    """`zstd_layer`, remembered per tarball identity (decompressing to hash takes seconds)."""
    meta = out_dir / f"{path.name}.layer.json"
    ident = file_fingerprint(path)
    try:
        data = json.loads(meta.read_text())
        if data.pop("ident") == ident:
            return Layer(path=path, **data)
    except (OSError, ValueError, KeyError):
        pass
    layer = zstd_layer(path, comment)
    fields = {k: v for k, v in layer.__dict__.items() if k != "path"}
    meta.write_text(json.dumps({"ident": ident, **fields}) + "\n")
    return layer


def _slinky_base(pyroot: Path, lock: str, out_dir: Path) -> tuple[Path, Layer]:
    """The Python root with the locked dependencies in the venv, kept unpacked in the cache
    (the lower layer the wheel gets installed over), and the layer holding that venv."""
    key = inputs_key({"builder": BUILDER_VERSION, "base": file_fingerprint(pyroot), "lock": lock})
    base = out_dir / "slinky-base"
    done = out_dir / "slinky-base.key"
    blob = out_dir / "slinky-deps.tar.gz"
    meta = out_dir / "slinky-deps.json"
    if done.is_file() and done.read_text() == key and blob.is_file() and meta.is_file():
        return base, Layer(path=blob, **json.loads(meta.read_text()))
    done.unlink(missing_ok=True)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    _run(["tar", "--zstd", "-xpf", str(pyroot), "-C", str(base)], "unpacking the Python root")
    deps = _fetch(["--no-deps", "-r", str(lock_file())], base / "tmp/wheels")
    _run(["chroot", str(base), "python3", "-m", "venv", "--without-pip", VENV], "creating the venv")
    _unpack_root_pip(base)
    _root_pip(
        base,
        "install",
        "--no-index",
        "--no-deps",
        "--root-user-action=ignore",
        *(f"/tmp/wheels/{p.name}" for p in deps),
    )
    shutil.rmtree(base / "tmp/wheels")
    tar = out_dir / "slinky-deps.tar"
    write_tree_tar(tar, base, tree_snapshot(base, VENV))
    layer = gzip_layer(tar, blob, f"venv {VENV} with {len(deps)} locked dependencies")
    tar.unlink()
    fields = {k: v for k, v in layer.__dict__.items() if k != "path"}
    meta.write_text(json.dumps(fields) + "\n")
    done.write_text(key)
    return base, layer


def _app_layer(base: Path, wheel: Path, work: Path) -> Layer:
    """Install the wheel into the venv in an overlay over `base`: the overlay's upper
    directory then holds exactly what the layer must (new and changed files)."""
    upper, scratch, merged = work / "upper", work / "overlay-work", work / "merged"
    for d in (upper, scratch, merged):
        d.mkdir()
    opts = f"lowerdir={base},upperdir={upper},workdir={scratch}"
    _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], "mounting an overlay")
    try:
        shutil.copy2(wheel, merged / "tmp" / wheel.name)
        _root_pip(
            merged,
            "install",
            "--no-index",
            "--no-deps",
            "--root-user-action=ignore",
            f"/tmp/{wheel.name}",
        )
        # Every requirement of the wheel must be among the locked dependencies.
        _root_pip(merged, "check")
        (merged / "tmp" / wheel.name).unlink()
    finally:
        _run(["umount", str(merged)], "unmounting the overlay")
    members = tree_snapshot(upper, VENV)
    if whiteouts := [m for m, (mode, _, _) in members.items() if stat.S_ISCHR(mode)]:
        raise RuntimeError(f"installing the wheel removed files: {whiteouts[:5]}")
    write_tree_tar(work / "app.tar", upper, members)
    return gzip_layer(work / "app.tar", work / "app.tar.gz", wheel.name)


def build_slinky(out_dir: Path, log: Callable[[str], None]) -> BuiltImage:
    pyroot = python_root_tarball()
    if not pyroot.is_file():
        raise ImagesNotBuilt(f"{pyroot} missing: run `make images`")
    repo = repo_dir()
    pyproject = repo / "pyproject.toml"
    version = project_version(pyproject)
    ref = f"{SLINKY_REPO}:{version}"
    locked = lock_file().read_text()
    key = inputs_key(
        {
            "builder": BUILDER_VERSION,
            "base": file_fingerprint(pyroot),
            "lock": locked,
            "pyproject": pyproject.read_text(),
            "readme": (repo / "README.md").read_text(),
            "src": tree_hash(repo / "src", _not_source),
        }
    )
    if (hit := _cached("slinky", key, out_dir)) is not None:
        log(f"slinky image: cached ({hit.ref})")
        return hit
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        work = Path(tmp)
        base, deps = _slinky_base(pyroot, locked, out_dir)
        wheel = build_wheel(repo, work / "wheel", work)
        layers = [
            _cached_zstd_layer(pyroot, "Debian bookworm root with python3 and tini", out_dir),
            deps,
            _app_layer(base, wheel, work),
        ]
        cfg = ImageConfig(
            entrypoint=["/usr/bin/tini", "--"],
            cmd=["slurm-operator"],
            env=[f"PATH={VENV}/bin:{STANDARD_PATH}", "PYTHONUNBUFFERED=1"],
            user=f"{SLINKY_UID}:{SLINKY_UID}",
            labels={
                "org.opencontainers.image.title": "slinky",
                "org.opencontainers.image.version": version,
            },
        )
        archive = out_dir / "slinky.oci.tar"
        digest = write_layout(archive, ref, cfg, layers)
    image = BuiltImage("slinky", ref, archive, digest, sum(x.size for x in layers))
    _record(image, key, out_dir)
    log(f"slinky image: built {ref} in {time.monotonic() - t0:.1f}s ({image.size >> 20} MiB)")
    return image


# Every image `make images` builds, by short name, in build order.
BUILDERS: Mapping[str, Callable[[Path, Callable[[str], None]], BuiltImage]] = {
    "slurm": build_slurm,
    "slurm-hpc": build_slurm_hpc,
    "slinky": build_slinky,
}
# Images a test bed imports into its nodes only when asked (`images.json` lists them apart,
# under "on_request"): ~1.6 GiB of containerd root per node that most test beds never run.
ON_REQUEST = frozenset({"slurm-hpc"})


def images_json(images: Sequence[BuiltImage]) -> dict[str, Any]:
    """`images.json`: the images every test bed node imports, and those imported on request."""
    return {
        "images": [i.as_json() for i in images if i.name not in ON_REQUEST],
        "on_request": [i.as_json() for i in images if i.name in ON_REQUEST],
    }


def build(log: Callable[[str], None] = print) -> list[BuiltImage]:
    """Build (or find cached) every image and record them in `images.json`."""
    if os.geteuid() != 0:
        raise RuntimeError("building images needs root (tar keeps owners; chroot; overlay mount)")
    out_dir = images_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    # Several worktrees share this cache: one build at a time (the others then find it cached).
    with (out_dir / ".lock").open("w") as lock_fd:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        images = [builder(out_dir, log) for builder in BUILDERS.values()]
        index = out_dir / "images.json"
        tmp = index.with_name("images.json.tmp")
        tmp.write_text(json.dumps(images_json(images), indent=1) + "\n")
        tmp.replace(index)
    return images


def built(*, on_request: bool = False) -> list[BuiltImage]:
    """The images `make images` built, as recorded in `images.json` (with `on_request`, those
    a test bed imports only when asked too)."""
    index = images_dir() / "images.json"
    try:
        data = json.loads(index.read_text())
    except FileNotFoundError:
        raise ImagesNotBuilt(f"{index} missing: run `make images`") from None
    listed = data["images"] + (data.get("on_request", []) if on_request else [])
    images = [
        BuiltImage(d["name"], d["ref"], Path(d["archive"]), d["digest"], int(d["size"]))
        for d in listed
    ]
    for i in images:
        if not i.archive.is_file():
            raise ImagesNotBuilt(f"{i.archive} missing: run `make images`")
    return images


def image(name: str) -> BuiltImage:
    """A built image by short name (one of `BUILDERS`)."""
    have = built(on_request=True)
    for i in have:
        if i.name == name:
            return i
    names = ", ".join(i.name for i in have) or "none"
    raise KeyError(f"no image named {name!r} in images.json (have: {names})")


def ref(name: str) -> str:
    """The full reference of a built image by short name (one of `BUILDERS`)."""
    return image(name).ref


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m slinky_testbed.images")
    p.add_argument("cmd", choices=["build", "list", "lock"])
    args = p.parse_args(argv)
    if args.cmd == "lock":
        print(f"wrote {lock()}")
        return
    try:
        images = build() if args.cmd == "build" else built(on_request=True)
    except (ImagesNotBuilt, RuntimeError) as e:
        sys.exit(f"images: {e}")
    for i in images:
        print(f"{i.ref}\t{i.archive}\t{i.digest}\t{i.size >> 20} MiB")


if __name__ == "__main__":
    main()
