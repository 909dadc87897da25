"""Image archives built without a registry: digests, layer tars, config, manifest, index."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from slinky_testbed import images
from slinky_testbed.images import Entry, ImageConfig

REPO = Path(__file__).resolve().parents[2]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def small_layer(tmp_path: Path, content: bytes = b"hello\n") -> images.Layer:
    tar = tmp_path / "layer.tar"
    images.write_entries_tar(
        tar, [Entry("etc", 0o755), Entry("etc/greeting", 0o644, content, uid=7, gid=8)]
    )
    return images.gzip_layer(tar, tmp_path / "layer.tar.gz", "greeting")


def test_gzip_layer_digest_is_of_the_blob_and_diff_id_of_the_uncompressed_tar(
    tmp_path: Path,
) -> None:
    layer = small_layer(tmp_path)
    blob = layer.path.read_bytes()
    assert layer.media_type == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert layer.digest == sha(blob)
    assert layer.size == len(blob)
    assert layer.diff_id == sha(gzip.decompress(blob))
    assert layer.diff_id == sha((tmp_path / "layer.tar").read_bytes())


def test_layers_built_from_the_same_entries_have_the_same_digest(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert small_layer(tmp_path / "a").digest == small_layer(tmp_path / "b").digest
    (tmp_path / "c").mkdir()
    assert small_layer(tmp_path / "c", b"other\n").digest != small_layer(tmp_path / "a").digest


def test_layer_entries_keep_modes_and_numeric_owners(tmp_path: Path) -> None:
    layer = small_layer(tmp_path)
    with tarfile.open(layer.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["etc"].isdir() and members["etc"].mode == 0o755
    f = members["etc/greeting"]
    assert (f.mode, f.uid, f.gid, f.uname, f.gname) == (0o644, 7, 8, "", "")


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")
def test_zstd_tarball_is_used_as_is_with_the_digest_of_its_decompressed_tar(
    tmp_path: Path,
) -> None:
    tar = tmp_path / "root.tar"
    images.write_entries_tar(tar, [Entry("bin", 0o755), Entry("bin/x", 0o755, b"#!/bin/sh\n")])
    subprocess.run(["zstd", "-q", str(tar), "-o", str(tmp_path / "root.tar.zst")], check=True)
    layer = images.zstd_layer(tmp_path / "root.tar.zst", "root")
    assert layer.path == tmp_path / "root.tar.zst"
    assert layer.media_type == "application/vnd.oci.image.layer.v1.tar+zstd"
    assert layer.digest == sha((tmp_path / "root.tar.zst").read_bytes())
    assert layer.diff_id == sha(tar.read_bytes())


def test_config_carries_run_settings_and_diff_ids_in_layer_order(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    layers = [small_layer(tmp_path / "1"), small_layer(tmp_path / "2", b"x")]
    cfg = ImageConfig(
        entrypoint=["/usr/bin/tini", "--"],
        cmd=["slurm-operator"],
        env=["PATH=/opt/slinky/bin:/usr/bin", "PYTHONUNBUFFERED=1"],
        working_dir="/work",
        user="65532:65532",
        labels={"org.opencontainers.image.version": "1"},
    )
    doc = images.config_document(cfg, layers)
    assert (doc["architecture"], doc["os"]) == ("amd64", "linux")
    assert doc["rootfs"] == {"type": "layers", "diff_ids": [x.diff_id for x in layers]}
    assert doc["config"] == {
        "Entrypoint": ["/usr/bin/tini", "--"],
        "Cmd": ["slurm-operator"],
        "Env": ["PATH=/opt/slinky/bin:/usr/bin", "PYTHONUNBUFFERED=1"],
        "WorkingDir": "/work",
        "User": "65532:65532",
        "Labels": {"org.opencontainers.image.version": "1"},
    }
    assert len(doc["history"]) == len(layers)


def test_config_leaves_out_unset_cmd_and_user() -> None:
    doc = images.config_document(ImageConfig(entrypoint=["/e"]), [])
    assert "Cmd" not in doc["config"] and "User" not in doc["config"]


def test_manifest_names_config_and_layers_by_digest_size_and_media_type(tmp_path: Path) -> None:
    layer = small_layer(tmp_path)
    config = b'{"x":1}'
    doc = images.manifest_document(config, [layer])
    assert doc["schemaVersion"] == 2
    assert doc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert doc["config"] == {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        "digest": sha(config),
        "size": len(config),
    }
    assert doc["layers"] == [
        {"mediaType": layer.media_type, "digest": layer.digest, "size": layer.size}
    ]


def test_index_names_the_image_so_the_import_keeps_the_full_reference() -> None:
    manifest = b'{"m":1}'
    doc = images.index_document(manifest, "localhost/slinky/slurm:26.05")
    (entry,) = doc["manifests"]
    assert entry["digest"] == sha(manifest) and entry["size"] == len(manifest)
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["annotations"] == {
        "io.containerd.image.name": "localhost/slinky/slurm:26.05",
        "org.opencontainers.image.ref.name": "localhost/slinky/slurm:26.05",
    }


@pytest.mark.parametrize(
    "ref", ["slurm:26.05", "localhost/slinky/slurm", "localhost/Slinky/slurm:1", "x/y:"]
)
def test_references_that_are_not_host_path_tag_are_refused(ref: str) -> None:
    with pytest.raises(ValueError, match="host/path:tag"):
        images.check_ref(ref)


def test_layout_archive_holds_every_blob_under_its_digest(tmp_path: Path) -> None:
    layer = small_layer(tmp_path)
    archive = tmp_path / "img.oci.tar"
    digest = images.write_layout(
        archive, "localhost/t/img:1", ImageConfig(entrypoint=["/bin/sh"]), [layer, layer]
    )
    with tarfile.open(archive) as tar:
        files = {
            m.name: f.read()
            for m in tar.getmembers()
            if m.isfile() and (f := tar.extractfile(m)) is not None
        }
    blobs = {n.removeprefix("blobs/sha256/"): d for n, d in files.items() if n.startswith("blobs/")}
    for name, data in blobs.items():
        assert hashlib.sha256(data).hexdigest() == name
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["digest"] == digest
    manifest = json.loads(blobs[digest.removeprefix("sha256:")])
    config = json.loads(blobs[manifest["config"]["digest"].removeprefix("sha256:")])
    assert config["rootfs"]["diff_ids"] == [layer.diff_id, layer.diff_id]
    assert len(blobs) == 3  # manifest, config, and the layer once although listed twice
    assert (
        gzip.decompress(blobs[layer.digest.removeprefix("sha256:")])
        == (tmp_path / "layer.tar").read_bytes()
    )


def test_tree_snapshot_lists_the_tree_relative_to_the_root(tmp_path: Path) -> None:
    (tmp_path / "opt/v/bin").mkdir(parents=True)
    (tmp_path / "opt/v/bin/x").write_text("x")
    (tmp_path / "opt/v/link").symlink_to("bin/x")
    (tmp_path / "other").write_text("not listed")
    assert sorted(images.tree_snapshot(tmp_path, "/opt/v")) == [
        "opt/v",
        "opt/v/bin",
        "opt/v/bin/x",
        "opt/v/link",
    ]


def test_slurm_tag_names_the_release_not_the_debian_revision() -> None:
    assert images.slurm_tag("26.05.5-1") == "26.05"
    with pytest.raises(ValueError, match="version"):
        images.slurm_tag("weird")


def test_dpkg_status_gives_installed_versions() -> None:
    status = (
        "Package: slurmd\nStatus: install ok installed\nVersion: 26.05.5-1\n"
        "Description: x\n Version: not this\n\nPackage: other\nVersion: 1\n"
    )
    assert images.dpkg_versions(status, ["slurmd", "absent"]) == {"slurmd": "26.05.5-1"}


def test_passwd_ids_by_user_name() -> None:
    passwd = "root:x:0:0::/root:/bin/sh\nslurm:x:64030:64031::/nonexistent:/usr/sbin/nologin\n"
    assert images.passwd_ids(passwd, "slurm") == (64030, 64031)
    with pytest.raises(KeyError, match="restd"):
        images.passwd_ids(passwd, "restd")


def test_slurm_entrypoint_without_a_command_prints_usage() -> None:
    proc = subprocess.run(
        ["sh", str(images.slurm_entrypoint())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "usage: slurm-entrypoint" in proc.stderr


def test_built_images_are_read_from_images_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLINKY_CACHE", str(tmp_path))
    with pytest.raises(images.ImagesNotBuilt, match="make images"):
        images.built()
    (tmp_path / "images").mkdir()
    archive = tmp_path / "images/slurm.oci.tar"
    img = images.BuiltImage("slurm", "localhost/slinky/slurm:26.05", archive, "sha256:ab", 9)
    (tmp_path / "images/images.json").write_text(json.dumps({"images": [img.as_json()]}))
    with pytest.raises(images.ImagesNotBuilt, match=r"slurm\.oci\.tar"):
        images.built()
    archive.write_bytes(b"")
    assert images.built() == [img]
    assert images.ref("slurm") == "localhost/slinky/slurm:26.05"
    with pytest.raises(KeyError, match="slinky"):
        images.ref("slinky")


def test_wheel_file_names_give_normalized_pins() -> None:
    assert images.wheel_pin("lightkube_models-1.36.3.8-py3-none-any.whl") == (
        "lightkube-models",
        "1.36.3.8",
    )
    assert images.wheel_pin("PyYAML-6.0.3-cp311-cp311-manylinux_2_17_x86_64.whl") == (
        "pyyaml",
        "6.0.3",
    )
    with pytest.raises(ValueError, match="wheel"):
        images.wheel_pin("pyyaml-6.0.3.tar.gz")


def test_lock_pins_every_wheel_by_name_and_version_sorted() -> None:
    wheels = ["yarl-1.25.1-cp311-cp311-linux_x86_64.whl", "attrs-26.1.0-py3-none-any.whl"]
    lock = images.lock_text(wheels)
    assert [x for x in lock.splitlines() if not x.startswith("#")] == [
        "attrs==26.1.0",
        "yarl==1.25.1",
    ]


def test_the_checked_in_lock_pins_the_project_dependencies_exactly() -> None:
    import tomllib

    lock = images.lock_file().read_text()
    pinned = dict(line.split("==", 1) for line in lock.splitlines() if "==" in line)
    project = tomllib.loads((images.repo_dir() / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        name, version = dep.split("==")
        assert (
            pinned[images.wheel_pin(f"{name.replace('-', '_')}-{version}-py3-none-any.whl")[0]]
            == version
        )


def _build_script_packages() -> set[str]:
    text = (REPO / "hack/build-slurm-root.sh").read_text()
    m = re.search(r'^PACKAGES="([^"]*)"', text, re.M)
    assert m, "PACKAGES= not found in hack/build-slurm-root.sh"
    return set(m.group(1).replace("\\\n", " ").split())


def _containerfile_packages() -> set[str]:
    text = (REPO / "images/slurm/Containerfile").read_text().replace("\\\n", " ")
    m = re.search(r"apt-get install -y --no-install-recommends (.*?)&&", text)
    assert m, "apt-get install not found in images/slurm/Containerfile"
    return set(m.group(1).split())


def test_the_slurm_containerfile_installs_what_make_images_installs() -> None:
    # etcd runs on the test bed's host (taken out of the same root); tini comes from the
    # Python root in `make images`.
    assert _containerfile_packages() - {"tini"} == _build_script_packages() - {"etcd-server"}


def _shell_words(path: str, pattern: str) -> set[str]:
    text = (REPO / path).read_text().replace("\\\n", " ")
    m = re.search(pattern, text, re.M)
    assert m, f"{pattern!r} not found in {path}"
    return set(m.group(1).split())


def test_the_slurm_hpc_containerfile_installs_what_make_images_installs() -> None:
    script = _shell_words("hack/build-hpc-layer.sh", r'^PACKAGES="([^"]*)"')
    containerfile = _shell_words(
        "images/slurm-hpc/Containerfile", r"apt-get install -y --no-install-recommends (.*?)&&"
    )
    assert containerfile == script
    assert {"openmpi-bin", "mpich", "python3-mpi4py", "hpcc", "python3-torch"} <= script
    assert {"crun", "uidmap", "apptainer"} <= script


def _openmpi_sed(path: str) -> str:
    text = (REPO / path).read_text().replace("\\\n", " ")
    m = re.search(r"sed -i -E '([^']*btl_tcp_if_include[^']*)'", text)
    assert m, f"no sed of btl_tcp_if_include in {path}"
    return m.group(1)


def test_both_hpc_image_builds_drop_debians_loopback_only_openmpi_default(tmp_path: Path) -> None:
    # The end of Debian's /etc/openmpi/openmpi-mca-params.conf: with it, every OpenMPI job
    # across two pods fails ("Unable to find reachable pairing").
    conf = tmp_path / "openmpi-mca-params.conf"
    debian = (
        "# comment\nbtl_base_warn_component_unused=0\n# Silence a warning\nbtl_tcp_if_include=lo\n"
    )
    script = _openmpi_sed("hack/build-hpc-layer.sh")
    assert _openmpi_sed("images/slurm-hpc/Containerfile") == script
    conf.write_text(debian)
    subprocess.run(["sed", "-i", "-E", script, str(conf)], check=True)
    assert conf.read_text() == debian.replace("btl_tcp_if_include=lo\n", "")


def test_the_hpc_image_shares_the_slurm_images_entrypoint_and_every_image_is_built() -> None:
    assert list(images.BUILDERS) == ["slurm", "slurm-hpc", "slinky"]
    hpc, slurm = (
        images.slurm_image_config("slurm-hpc", "1"),
        images.slurm_image_config("slurm", "1"),
    )
    assert hpc.entrypoint == slurm.entrypoint
    assert hpc.labels["org.opencontainers.image.title"] == "slurm-hpc"


def test_the_hpc_image_is_listed_apart_and_found_by_name_only_with_those_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every test bed node imports what images.json lists under "images": the big HPC image is
    # listed under "on_request", so a bed imports it only when a test asks.
    monkeypatch.setenv("SLINKY_CACHE", str(tmp_path))
    (tmp_path / "images").mkdir()
    made = []
    for name in images.BUILDERS:
        archive = tmp_path / f"images/{name}.oci.tar"
        archive.write_bytes(b"")
        made.append(images.BuiltImage(name, f"localhost/slinky/{name}:1", archive, "sha256:a", 1))
    index = images.images_json(made)
    assert [d["name"] for d in index["images"]] == ["slurm", "slinky"]
    assert [d["name"] for d in index["on_request"]] == ["slurm-hpc"]
    (tmp_path / "images/images.json").write_text(json.dumps(index))
    assert [i.name for i in images.built()] == ["slurm", "slinky"]
    assert [i.name for i in images.built(on_request=True)] == ["slurm", "slinky", "slurm-hpc"]
    assert images.ref("slurm-hpc") == "localhost/slinky/slurm-hpc:1"
    assert images.image("slurm-hpc").archive == tmp_path / "images/slurm-hpc.oci.tar"
    with pytest.raises(KeyError, match=r"'slurm-gpu'.*have: slurm, slinky, slurm-hpc"):
        images.ref("slurm-gpu")
    # An images.json written before the HPC image existed still reads.
    (tmp_path / "images/images.json").write_text(json.dumps({"images": index["images"]}))
    assert [i.name for i in images.built(on_request=True)] == ["slurm", "slinky"]
