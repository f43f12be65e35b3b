"""One HTTP client for the tests' own calls to the emulators they start on loopback.

`httpx.request(...)` builds a client for each call, and every client loads the CA bundle
into a new TLS context (~25 ms of CPU here) even for plain http://127.0.0.1: the unit lane
made ~660 of them (~17 s of its CPU). This client keeps no connection alive between
calls, so each call opens its own connection as `httpx.request` did: a server that a test
stopped, and a later test's server on the same port, can never share a pooled connection.
"""

from __future__ import annotations

from typing import Any

import httpx

# Same defaults as `httpx.request` (trust_env, 5 s timeout); only the TLS context is built once.
CLIENT = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """`httpx.request(method, url, ...)` without building a client for the call."""
    return CLIENT.request(method, url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)
