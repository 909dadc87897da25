"""The slurm chart's identity boundaries, rendered with the cached helm binary: SSSD takes only
the site's uid range from the directory and checks its certificate with a CA that exists;
slurmdbd.conf holds any database password Slurm's parser can read."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_helm_charts import CHARTS, HELM, helm, one, render_values

JSON = dict[str, Any]

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason=f"{HELM} not built (`make testbed-build` builds it)"
)

SSSD: JSON = {"enabled": True, "uri": "ldaps://ldap.site", "baseDn": "dc=site,dc=org"}


def refused(values: JSON, tmp_path: Path) -> str:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(values))
    out = helm("template", "slurm", str(CHARTS / "slurm"), "-n", "slurm", "-f", str(path),
               check=False)  # fmt: skip
    assert out.returncode != 0, "rendered"
    return out.stderr


def sssd_conf(objs: list[JSON]) -> list[str]:
    return str(one(objs, "ConfigMap", "slurm-sssd")["data"]["sssd.conf"]).splitlines()


def login_spec(objs: list[JSON]) -> JSON:
    return dict(one(objs, "Deployment", "slurm-login")["spec"]["template"]["spec"])


# ---------------------------------------------------------------- SSSD's uid range


def test_sssd_takes_only_the_site_uid_range_by_default(tmp_path: Path) -> None:
    conf = sssd_conf(render_values("slurm", {"sssd": SSSD}, tmp_path))
    # max_id 0 (SSSD's default) would take SlurmUser's 64030 and nobody's 65534.
    assert "min_id = 1000" in conf and "max_id = 59999" in conf


def test_sssd_takes_a_range_above_the_system_band(tmp_path: Path) -> None:
    values = {"sssd": {**SSSD, "minId": 200000, "maxId": 2000000}}
    conf = sssd_conf(render_values("slurm", values, tmp_path))
    assert "min_id = 200000" in conf and "max_id = 2000000" in conf


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ({"minId": 1}, "sssd.minId=1 takes uids of root (0)"),
        ({"minId": 500}, "sssd.minId=500"),
        ({"maxId": 64030}, "SlurmUser's (slurm, 64030)"),
        ({"maxId": 70000}, "sssd.minId=1000..sssd.maxId=70000"),
        ({"minId": 65534, "maxId": 65534}, "nobody's (65534)"),
        ({"minId": 5000, "maxId": 4000}, "sssd.maxId=4000 is below sssd.minId=5000"),
        ({"minId": 0}, "/sssd/minId"),  # the schema: 0 is SSSD's "no limit"
        ({"extraDomainConfig": "max_id = 0\n"}, "sssd.extraDomainConfig sets min_id or max_id"),
        ({"extraDomainConfig": "  min_id=0"}, "sssd.extraDomainConfig sets min_id or max_id"),
    ],
)
def test_a_range_with_root_or_system_uids_is_refused_naming_the_value(
    ids: JSON, message: str, tmp_path: Path
) -> None:
    assert message in refused({"sssd": {**SSSD, **ids}}, tmp_path)


# ---------------------------------------------------------------- SSSD's CA


def test_sssd_checks_the_directory_with_the_images_ca_bundle_by_default(tmp_path: Path) -> None:
    objs = render_values("slurm", {"sssd": SSSD, "login": {"enabled": True}}, tmp_path)
    assert "ldap_tls_cacert = /etc/ssl/certs/ca-certificates.crt" in sssd_conf(objs)
    assert "sssd-ca" not in {v["name"] for v in login_spec(objs)["volumes"]}
    # Plain LDAP without StartTLS checks no certificate: no CA line.
    plain = {**SSSD, "uri": "ldap://ldap.site", "startTls": False}
    conf = sssd_conf(render_values("slurm", {"sssd": plain}, tmp_path))
    assert not [line for line in conf if line.startswith("ldap_tls_cacert")]


@pytest.mark.parametrize(
    ("ca", "volume"),
    [
        (
            {"configMap": "site-ca"},
            {"configMap": {"name": "site-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ),
        (
            {"secret": "site-ca", "key": "root.pem"},
            {"secret": {"secretName": "site-ca", "items": [{"key": "root.pem", "path": "ca.crt"}]}},
        ),
    ],
)
def test_the_sites_ca_is_mounted_in_the_sidecar_and_named_in_sssd_conf(
    ca: JSON, volume: JSON, tmp_path: Path
) -> None:
    values = {"sssd": {**SSSD, "caCert": ca}, "login": {"enabled": True}}
    objs = render_values("slurm", values, tmp_path)
    assert "ldap_tls_cacert = /etc/sssd/ca/ca.crt" in sssd_conf(objs)
    spec = login_spec(objs)
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "sssd")
    assert {"name": "sssd-ca", "mountPath": "/etc/sssd/ca", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    assert next(v for v in spec["volumes"] if v["name"] == "sssd-ca") == {
        "name": "sssd-ca",
        **volume,
    }


def test_a_ca_from_both_a_configmap_and_a_secret_is_refused(tmp_path: Path) -> None:
    values = {"sssd": {**SSSD, "caCert": {"configMap": "a", "secret": "b"}}}
    assert "sssd.caCert: set configMap or secret, not both" in refused(values, tmp_path)


def test_the_slurm_image_installs_a_ca_bundle() -> None:
    # Without ca-certificates, /etc/ssl/certs/ca-certificates.crt does not exist and SSSD's
    # TLS to a publicly signed directory fails with the chart's defaults.
    repo = CHARTS.parent
    assert "ca-certificates" in (repo / "images/slurm/Containerfile").read_text().split()
    assert "ca-certificates" in (repo / "hack/build-slurm-root.sh").read_text().split()


# ---------------------------------------------------------------- the database password

ENTRYPOINT = CHARTS.parent / "images/slurm/slurm-entrypoint"


def slurmdbd_conf_script(tmp_path: Path) -> str:
    """The chart's init container script that writes slurmdbd.conf, writing into tmp_path."""
    values = {"accounting": {"enabled": True, "mariadb": {"enabled": True}}}
    objs = render_values("slurm", values, tmp_path)
    spec = one(objs, "Deployment", "slurm-accounting")["spec"]["template"]["spec"]
    init = next(c for c in spec["initContainers"] if c["name"] == "slurmdbd-conf")
    script = str(init["command"][2]).replace("/etc/slurm/", f"{tmp_path}/")
    return "\n".join(line for line in script.splitlines() if not line.startswith("chown "))


def write_conf(script: str, password: str) -> subprocess.CompletedProcess[str]:
    env = {"STORAGE_PASS": password, "PATH": "/usr/bin:/bin"}
    return subprocess.run(["sh", "-ec", script], env=env, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip


def read_back(conf: Path) -> str:
    """StoragePass as the image's entrypoint reads it (its model of Slurm's parser, checked
    against slurmdbd 26.05 itself: docs/accounting.md)."""
    text = ENTRYPOINT.read_text()
    function = text[text.index("storage_pass() {") :]
    function = function[: function.index("\n}\n") + 3]
    out = subprocess.run(["sh", "-c", f'{function}\nstorage_pass "$1"', "sh", str(conf)],
                         capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return out.stdout


@pytest.mark.parametrize(
    "password",
    ["p#ss w'rd", "a\\#b\\\\", 'ab"cd#e', '"x', "tab\tin#", "plain", "trailing\\", "$HOME`x`"],
)
def test_slurmdbd_conf_holds_the_password_as_it_is(password: str, tmp_path: Path) -> None:
    out = write_conf(slurmdbd_conf_script(tmp_path), password)
    assert out.returncode == 0, out.stderr
    conf = tmp_path / "slurmdbd.conf"
    assert read_back(conf) == password, conf.read_text()


@pytest.mark.parametrize(
    ("password", "problem"),
    [
        ('a "b', "a double quote and a blank"),
        ('"ab"', "double quotes around it"),
        ("a\nb", "a line break"),
    ],
)
def test_a_password_no_slurmdbd_conf_can_hold_is_refused_naming_the_secret(
    password: str, problem: str, tmp_path: Path
) -> None:
    out = write_conf(slurmdbd_conf_script(tmp_path), password)
    assert out.returncode != 0
    assert f"the database password (Secret slurm-mariadb, key password) holds {problem}" in (
        out.stderr
    )
    assert not (tmp_path / "slurmdbd.conf").exists()
