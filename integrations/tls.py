"""One TLS context per process for the HTTP clients: httpx's own default, made once.

Each `httpx.AsyncClient`/`Client` built its own context, loading the CA bundle again
(~50 ms of CPU each; a worker builds five at start, for clients that mostly speak plain
HTTP). The context is the same one httpx makes (`verify=True`), shared: a context may
serve any number of clients.
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
