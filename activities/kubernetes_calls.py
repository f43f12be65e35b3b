"""How the activities call the Kubernetes API, and what its failures mean.

One blocking client call runs off the event loop and is answered as the API's own JSON.
Failures: a Node that does not exist is `UnknownNode` (non-retryable); 409 is a retryable
conflict (`KubernetesRetryable`); other refusals (400/401/403/422) are non-retryable, since a
retry would repeat them. The API not answering is `KubernetesUnavailable` (retryable, an
outage the workflow waits out): 429 and 5xx, status 0 (the client's TLS failures), and the
client's connection errors and timeouts (urllib3's MaxRetryError, ProtocolError,
ReadTimeoutError, ...). A read that failed is never taken as "no pods" or "node absent".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import urllib3.exceptions
from kubernetes.client import ApiException
from temporalio.exceptions import ApplicationError

from autoclusters.core.kubernetes import Obj
from autoclusters.core.unavailable import Unavailable

KUBERNETES_API = "Kubernetes API"
KUBERNETES_UNAVAILABLE = "KubernetesUnavailable"
# What the kubernetes client raises when the API never answered: urllib3's errors
# (MaxRetryError around NewConnectionError or ReadTimeoutError, ProtocolError on a dropped
# connection, ...) and the socket's own (OSError: ConnectionError, TimeoutError).
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError)


class KubernetesUnavailable(Unavailable):
    """The Kubernetes API gave no answer to trust: 429/5xx/status 0, no connection, a
    timeout, or a body that is not the API's JSON. `status`: the HTTP status, if any."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(KUBERNETES_API, message)
        self.status = status


def status_body(e: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(e.body or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def is_outage_status(status: int | None) -> bool:
    """429 (the API server's overload filters), 5xx, or 0 (the client's TLS failures)."""
    return not status or status == 429 or status >= 500


def kubernetes_outage(e: BaseException) -> KubernetesUnavailable | None:
    """`e` as a `KubernetesUnavailable` when it says the API did not answer, else None."""
    if isinstance(e, KubernetesUnavailable):
        return e
    if isinstance(e, ApiException):
        if not is_outage_status(e.status):
            return None
        body = status_body(e)
        message = body.get("message") or str(e.body or "").strip()[:200] or e.reason
        return KubernetesUnavailable(f"{e.status or 0} {message}", status=e.status or 0)
    if isinstance(e, urllib3.exceptions.HTTPError):
        return KubernetesUnavailable(f"{type(e).__name__}: {e}")
    return None


def unavailable_error(e: KubernetesUnavailable) -> ApplicationError:
    """An outage as the workflow reads it: retryable, its type ends in "Unavailable"."""
    return ApplicationError(str(e), type=KUBERNETES_UNAVAILABLE)


def translate(e: ApiException, node: str | None) -> ApplicationError:
    outage = kubernetes_outage(e)
    if outage is not None:
        return unavailable_error(outage)
    body = status_body(e)
    message = body.get("message") or e.reason or str(e)
    status = e.status or 0
    if (
        node is not None
        and status == 404
        and (body.get("details") or {}).get("kind") in ("nodes", None)
    ):
        return ApplicationError(
            f"node {node} is not in this Kubernetes cluster", type="UnknownNode", non_retryable=True
        )
    if status in (401, 403):
        return ApplicationError(
            f"Kubernetes refused our credentials ({status}): {message}",
            type="KubernetesUnauthorized",
            non_retryable=True,
        )
    if status == 409:
        return ApplicationError(f"Kubernetes {status}: {message}", type="KubernetesRetryable")
    return ApplicationError(
        f"Kubernetes refused the request ({status}): {message}",
        type="KubernetesRejected",
        non_retryable=True,
    )


@contextmanager
def api_errors(node: str | None = None) -> Iterator[None]:
    """Kubernetes errors leave the block as ApplicationErrors (`node`: the Node the block is
    about, so a 404 is `UnknownNode`)."""
    try:
        yield
    except ApiException as e:
        raise translate(e, node) from e
    except KubernetesUnavailable as e:
        raise unavailable_error(e) from e


def items_of(doc: Obj, what: str) -> list[Obj]:
    """A list answer's items. A body without `items` is not a list the API sent (a proxy's
    answer, a truncated body): unavailable, never an empty list."""
    items = doc.get("items", ...)
    if items is ... or not isinstance(items, list | None):
        raise KubernetesUnavailable(f"the {what} list came back without items: {str(doc)[:200]}")
    return list(items or [])


async def call_json(fn: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Obj:
    """One blocking client call (and the read of its body), off the event loop, answered
    as the API's own JSON.

    Reading the raw JSON (not the client's models) keeps what we patch back exactly what
    the server sent. Refusals are the client's `ApiException`; no answer at all (no
    connection, a timeout, a body that is not a JSON object) is `KubernetesUnavailable`.
    """

    def call() -> bytes:
        resp = fn(*args, _request_timeout=timeout_s, _preload_content=False, **kwargs)
        data: bytes = resp.data
        return data

    try:
        data = await asyncio.to_thread(call)
    except TRANSPORT_ERRORS as e:
        raise KubernetesUnavailable(f"{type(e).__name__}: {e}") from e
    try:
        body = json.loads(data)
    except ValueError as e:  # a proxy's page, a cut-off body, or none at all
        raise KubernetesUnavailable(f"answered with no JSON: {data[:200]!r}") from e
    if not isinstance(body, dict):
        raise KubernetesUnavailable(f"answered with no JSON object: {data[:200]!r}")
    return body
