"""Certificates and keys for the test bed's control plane, made with the openssl command."""

from __future__ import annotations

import subprocess
from pathlib import Path

APISERVER_NAMES = [
    "127.0.0.1",
    "10.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def ensure_pki(directory: Path) -> None:
    """Create a CA, an apiserver serving certificate (loopback names) and a service-account
    key pair in `directory`, unless they already exist."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "apiserver.crt").exists() and (directory / "sa.key").exists():
        return
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=directory)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-sha256",
        "-days",
        "3650",
        "-subj",
        "/CN=slinky-testbed-ca",
        "-out",
        "ca.crt",
        cwd=directory,
    )
    serving_cert(directory, "apiserver", APISERVER_NAMES)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


def _signed(directory: Path, name: str, subject: str, ext: str, ca: str = "ca") -> None:
    """`<name>.key` and `<name>.crt` for `subject`, signed by `<ca>.{crt,key}`, with the
    extensions `ext` (openssl extfile syntax)."""
    (directory / f"{name}.ext").write_text(ext)
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=directory)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", f"{name}.ext",
        "-out", f"{name}.crt",
        cwd=directory,
    )  # fmt: skip


def serving_cert(directory: Path, name: str, hosts: list[str]) -> tuple[Path, Path]:
    """A serving certificate signed by the test bed CA (for webhooks on loopback)."""
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    if not (crt.exists() and key.exists()):
        sans = ",".join(f"IP:{h}" if h[0].isdigit() else f"DNS:{h}" for h in hosts)
        ext = f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n"
        _signed(directory, name, f"/CN={name}", ext)
    return crt, key


def client_cert(directory: Path, name: str, *, user: str, group: str) -> tuple[Path, Path]:
    """A client certificate signed by the test bed CA: CN is the user, O the group (the way
    kubelets authenticate as `system:node:<name>` in `system:nodes`)."""
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    if not (crt.exists() and key.exists()):
        _signed(directory, name, f"/O={group}/CN={user}", "extendedKeyUsage=clientAuth\n")
    return crt, key


# ---------------------------------------------------------------- aggregation layer (issue 13)
# The apiserver proxies aggregated APIs (external.metrics.k8s.io) with a client certificate
# of its own, signed by a separate "front proxy" CA that the extension server trusts.

FRONT_PROXY_CLIENT = "front-proxy-client"


def ensure_front_proxy_pki(directory: Path) -> None:
    """`front-proxy-ca.{crt,key}` and the apiserver's `front-proxy-client.{crt,key}`."""
    if (directory / f"{FRONT_PROXY_CLIENT}.crt").exists():
        return
    _openssl("genrsa", "-out", "front-proxy-ca.key", "2048", cwd=directory)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "front-proxy-ca.key",
        "-sha256",
        "-days",
        "3650",
        "-subj",
        "/CN=slinky-testbed-front-proxy-ca",
        "-out",
        "front-proxy-ca.crt",
        cwd=directory,
    )
    _signed(
        directory,
        FRONT_PROXY_CLIENT,
        f"/CN={FRONT_PROXY_CLIENT}",
        "extendedKeyUsage=clientAuth\n",
        ca="front-proxy-ca",
    )
