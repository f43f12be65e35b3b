"""One TLS context per process for the HTTP clients: httpx's own default, made once.

Each `httpx.AsyncClient`/`Client`, and each one-shot `httpx.get`, built its own context,
loading certifi's CA bundle again (~20-50 ms of CPU each, for clients that mostly speak
plain HTTP on loopback): a worker built five at start, and `sandbox up` one at each
0.2 s poll of a daemon's readiness (a third of its own CPU). The context is the one httpx
makes for `verify=True`, shared: a context may serve any number of clients.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def default_verify(trust_env: bool = True) -> ssl.SSLContext:
    """httpx's default context (`verify=True`; with `trust_env`, SSL_CERT_FILE/SSL_CERT_DIR
    as httpx reads them), made at the first call and shared after it."""
    return httpx.create_ssl_context(trust_env=trust_env)
