"""TLS for the emulator, because kubectl sends a bearer token only over TLS.

client-go merges a kubeconfig user's credentials (token, client certificate, exec plugin)
into its REST config only when the server's transport is TLS: against `http://` kubectl
sends no `Authorization` header and every request is a 401 ("You must be logged in to the
server"). So the emulator serves its API over HTTPS, with a certificate made once
(`openssl`, an EC key, SANs 127.0.0.1 and localhost) and kept, and one kubeconfig that
trusts it serves kubectl, the `kubernetes` Python client and the sandbox's own httpx calls.
"""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from pathlib import Path

import yaml

CERT_DAYS = 3650
CERT, KEY = "tls.crt", "tls.key"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A fresh certificate and key for 127.0.0.1/localhost in `directory`: (cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "openssl is needed for the emulator's TLS port (apt-get install openssl)"
        )
    cert, key = directory / CERT, directory / KEY
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", str(CERT_DAYS),
            "-subj", "/CN=autoclusters-k8s-emulator",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def certificate(directory: Path) -> tuple[Path, Path]:
    """The certificate and key kept in `directory`, made there the first time: a restarted
    emulator presents the same one, so the kubeconfigs handed out stay valid."""
    cert, key = directory / CERT, directory / KEY
    if cert.exists() and key.exists():
        return cert, key
    directory.mkdir(parents=True, exist_ok=True)
    return self_signed(directory)


def trusting(ca_pem: str) -> ssl.SSLContext:
    """A client TLS context that trusts the emulator's certificate (for httpx `verify=`)."""
    return ssl.create_default_context(cadata=ca_pem)


def kubeconfig(server: str, token: str, ca_pem: str, name: str = "emulator", user: str = "") -> str:
    """A kubeconfig: the HTTPS server, its CA and the bearer token (user `user`, else `name`)."""
    ca_data = base64.b64encode(ca_pem.encode()).decode()
    user = user or name
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {"server": server, "certificate-authority-data": ca_data},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
            "current-context": name,
        }
    )
