"""TLS for the emulator, because kubectl sends a bearer token only over TLS.

client-go merges a kubeconfig user's credentials (token, client certificate, exec plugin)
into its REST config only when the server's transport is TLS: against `http://` kubectl
sends no `Authorization` header and every request is a 401 ("You must be logged in to the
server"). The Python client has no such rule, so the plain-HTTP port stays for it and
the emulator can also serve the same API over HTTPS, with a certificate made at start-up
(`openssl`, an EC key, SANs 127.0.0.1 and localhost) and a kubeconfig that trusts it.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import yaml

CERT_DAYS = 3650


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A fresh certificate and key for 127.0.0.1/localhost in `directory`: (cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "openssl is needed for the emulator's TLS port (apt-get install openssl)"
        )
    cert, key = directory / "tls.crt", directory / "tls.key"
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


def kubeconfig(server: str, token: str, ca_pem: str, name: str = "emulator") -> str:
    """A kubeconfig for kubectl: the HTTPS server, its CA and the bearer token."""
    ca_data = base64.b64encode(ca_pem.encode()).decode()
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
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }
    )
