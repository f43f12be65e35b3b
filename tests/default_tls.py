"""One default TLS context per test process, for every httpx client that asks for the default.

Every httpx client and transport builds its TLS context when it is made, even one that only
ever talks to http://127.0.0.1: `ssl.create_default_context(cafile=certifi.where())` loads
the whole CA bundle, ~45 ms of CPU each. The product makes a client per `CrusoeClient`, per
console, per agent reporter, and the unit lane made ~280 of them (~13 s of its CPU, more
than any other single cost). `tests/loopback.py` already serves the tests' own calls; this
covers the clients the product makes under test.

Only the default is shared (`verify=True`, no client certificate, `trust_env=True`, the same
`SSL_CERT_FILE`/`SSL_CERT_DIR`): a client given its own context or CA (the Kubernetes
emulator's HTTPS, kubectl's kubeconfig) still gets exactly what it asked for. The shared
context is configured as httpx configures each new one; httpx and httpcore change nothing
on it afterwards except the ALPN list of an https connection, which is the same list
(`http/1.1`) for every client here, none of which speaks HTTP/2.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

from httpx import _config
from httpx._transports import default

_made = _config.create_ssl_context
_shared: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def create_ssl_context(
    verify: Any = True, cert: Any = None, trust_env: bool = True
) -> ssl.SSLContext:
    if verify is not True or cert is not None or trust_env is not True:
        return _made(verify=verify, cert=cert, trust_env=trust_env)
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    ctx = _shared.get(key)
    if ctx is None:
        ctx = _shared[key] = _made(verify=verify, cert=cert, trust_env=trust_env)
    return ctx


def install() -> None:
    """httpx's transports call `create_ssl_context` by the name they imported."""
    default.create_ssl_context = create_ssl_context
