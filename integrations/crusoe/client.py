"""A small async client for the Crusoe API v1: VMs, node pools, AutoClusters remediation,
CMK (Kubernetes) clusters, Managed Slurm clusters.

Every request is signed (`CrusoeAuth`). 409 (another operation runs on the resource), 429
and 5xx are retried with exponential backoff, honouring `Retry-After`; a POST that creates
something is retried only where the API cannot have acted on it (409, 429, 503), because
Crusoe takes no idempotency key and a second create would make a second VM. Any other 4xx
raises `CrusoeRequestError` (non-retryable) carrying the API's own message.

Creating a Managed Slurm or a CMK cluster is refused with 409 `already_exists` when one of
that name exists: that 409 is an answer (not "busy"), so it is not retried; the caller adopts
the cluster by name.

Mutations answer with an async operation; `wait_operation` polls it on the endpoint of its
API family until it leaves IN_PROGRESS, and raises `CrusoeOperationFailed` with the
operation's `result.message` when it ends FAILED.

An answer that is not one is `CrusoeUnavailable` too, never an empty result: a 2xx whose
body is not JSON, a read answered with no body, a list answered with an error envelope or
something else than a list, a resource that does not parse. "No VMs" and "no such
operation" are answers only a working API gives.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from autoclusters.integrations.crusoe.credentials import CrusoeCredentials
from autoclusters.integrations.crusoe.errors import (
    CrusoeNotFound,
    CrusoeOperationFailed,
    CrusoeRequestError,
    CrusoeTimeout,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.resources import (
    KubernetesCluster,
    KubernetesCredentials,
    NodePool,
    Operation,
    OperationKind,
    SlurmCluster,
    Vm,
)
from autoclusters.integrations.crusoe.signing import CrusoeAuth
from autoclusters.integrations.tls import default_verify

__all__ = ["CrusoeClient", "VmAction"]

log = logging.getLogger(__name__)

# The power actions (the API also knows RESERVE, UNRESERVE and UPDATE, which we never send).
VmAction = Literal["RESET", "STOP", "START"]
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
# What a non-idempotent POST may retry: the API refused it before acting.
UNSAFE_RETRY_STATUSES = frozenset({409, 429, 503})
# A Slurm or CMK cluster create: 409 means "that name exists", which no retry changes.
CREATE_CLUSTER_RETRY_STATUSES = frozenset({429, 503})
# Where a list answer keeps its items.
_LIST_FIELDS = ("items", "vms", "instances")
M = TypeVar("M", bound=BaseModel)


def _seg(value: str) -> str:
    return quote(value, safe="")


def _api_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:500] or resp.reason_phrase
    if isinstance(body, dict):
        for field in ("message", "detail", "error", "code"):
            if body.get(field):
                return str(body[field])
    return str(body)[:500]


def _retry_after_s(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _parse(model: type[M], body: Any) -> M:
    """The answer as `model`; one that does not parse is no answer (CrusoeUnavailable)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise CrusoeUnavailable(f"the answer is not a {model.__name__}: {str(body)[:200]}") from e


def _operation(body: Any) -> Operation:
    return _parse(Operation, body.get("operation", body) if isinstance(body, dict) else body)


def _items(body: Any) -> list[Any]:
    """A list answer's items. `{}` (an empty list with its field left out) is empty; an
    error envelope or anything that is not a list is no answer."""
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        for field in _LIST_FIELDS:
            if isinstance(body.get(field), list):
                return list(body[field])
        if not any(body.get(k) for k in ("code", "message", "error", *_LIST_FIELDS)):
            return []
    raise CrusoeUnavailable(f"the answer is not a list: {str(body)[:200]}")


class CrusoeClient:
    """One project's view of the Crusoe API.

    Example:
        async with CrusoeClient(credentials=load_credentials()) as crusoe:
            op = await crusoe.patch_vm_action(vm.id, "RESET")
            await crusoe.wait_operation(op, "vm")

    Args:
        credentials: keys and endpoint (`load_credentials()`).
        project_id: the project; defaults to the credentials' `default_project`.
        timeout_s: per HTTP request.
        max_attempts: tries per request on 409/429/5xx and network errors.
        backoff_s: first retry delay; doubled per try, up to `max_backoff_s`.
        poll_s: how often `wait_operation` polls (Crusoe's Terraform provider uses 2 s).
        transport: an httpx transport (tests; a proxy).
    """

    def __init__(
        self,
        *,
        credentials: CrusoeCredentials,
        project_id: str | None = None,
        timeout_s: float = 30.0,
        max_attempts: int = 6,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        poll_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        project = project_id or credentials.default_project
        if not project:
            raise ValueError("no Crusoe project: pass project_id or set CRUSOE_DEFAULT_PROJECT")
        self.project_id = project
        self.poll_s = poll_s
        self._max_attempts = max(1, max_attempts)
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._http = httpx.AsyncClient(
            base_url=credentials.api_endpoint,
            auth=CrusoeAuth(credentials.access_key_id, credentials.secret_key),
            timeout=httpx.Timeout(timeout_s),
            headers={"Accept": "application/json"},
            transport=transport,
            verify=default_verify(),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> CrusoeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- VMs ------------------------------------------------------------------------------

    def _vms(self, suffix: str = "") -> str:
        return f"/projects/{_seg(self.project_id)}/compute/vms/instances{suffix}"

    async def get_vm(self, vm_id: str) -> Vm:
        return _parse(Vm, await self._request("GET", self._vms(f"/{_seg(vm_id)}")))

    async def list_vms(
        self,
        *,
        names: Sequence[str] | None = None,
        ids: Sequence[str] | None = None,
        states: Sequence[str] | None = None,
    ) -> list[Vm]:
        params: dict[str, str] = {}
        for field, values in (("names", names), ("ids", ids), ("states", states)):
            if values:
                params[field] = ",".join(values)
        vms: list[Vm] = []
        while True:
            body = await self._request("GET", self._vms(), params=params)
            vms += [_parse(Vm, v) for v in _items(body)]
            token = body.get("next_page_token") if isinstance(body, dict) else None
            if not token:
                return vms
            params["next_token"] = token

    async def find_vm_by_name(self, name: str) -> Vm | None:
        """The VM named `name`; of several (an old one still deleting), the newest."""
        found = [vm for vm in await self.list_vms(names=[name]) if vm.name == name]
        return max(found, key=lambda vm: vm.created_at) if found else None

    async def patch_vm_action(self, vm_id: str, action: VmAction) -> Operation:
        body = await self._request("PATCH", self._vms(f"/{_seg(vm_id)}"), json={"action": action})
        return _operation(body)

    async def create_vm(self, spec: Mapping[str, Any]) -> Operation:
        body = await self._request("POST", self._vms(), json=dict(spec), idempotent=False)
        return _operation(body)

    async def delete_vm(self, vm_id: str) -> Operation:
        return _operation(await self._request("DELETE", self._vms(f"/{_seg(vm_id)}")))

    # --- node pools and AutoClusters ------------------------------------------------------

    def _pools(self, suffix: str = "") -> str:
        return f"/projects/{_seg(self.project_id)}/kubernetes/nodepools{suffix}"

    async def get_node_pool(self, node_pool_id: str) -> NodePool:
        body = await self._request("GET", self._pools(f"/{_seg(node_pool_id)}"))
        return _parse(NodePool, body)

    async def list_node_pools(self) -> list[NodePool]:
        return [_parse(NodePool, p) for p in _items(await self._request("GET", self._pools()))]

    async def create_node_pool(self, spec: Mapping[str, Any]) -> Operation:
        """`POST .../kubernetes/nodepools` (`cluster_id`, `name`, `product_name`, `count`,
        `node_labels`, `transport_partition_id`, ...). Not idempotent: the caller makes sure
        one create runs per pool name (Crusoe takes no idempotency key)."""
        body = await self._request("POST", self._pools(), json=dict(spec), idempotent=False)
        return _operation(body)

    async def patch_node_pool(self, node_pool_id: str, changes: Mapping[str, Any]) -> Operation:
        """`PATCH .../nodepools/{id}` with `{count, node_labels, node_taints}` (action
        UPDATE): an absolute count, so a retry sets the same value."""
        path = self._pools(f"/{_seg(node_pool_id)}")
        return _operation(await self._request("PATCH", path, json=dict(changes)))

    async def delete_node_pool(self, node_pool_id: str) -> Operation:
        return _operation(await self._request("DELETE", self._pools(f"/{_seg(node_pool_id)}")))

    async def node_pool_vms(self, node_pool_id: str) -> list[Vm]:
        body = await self._request("GET", self._pools(f"/{_seg(node_pool_id)}/vms"))
        return [_parse(Vm, v) for v in _items(body)]

    async def remediate_vm(self, cluster_id: str, vm_id: str) -> Operation:
        """Ask AutoClusters to remediate the VM (today this always replaces the node)."""
        path = (
            f"/projects/{_seg(self.project_id)}/kubernetes/clusters/{_seg(cluster_id)}"
            f"/autoclusters/vms/{_seg(vm_id)}/remediate"
        )
        return _operation(await self._request("POST", path, idempotent=False))

    # --- CMK (Kubernetes) clusters -------------------------------------------------------

    def _kube_clusters(self, suffix: str = "") -> str:
        return f"/projects/{_seg(self.project_id)}/kubernetes/clusters{suffix}"

    async def get_kubernetes_cluster(self, cluster_id: str) -> KubernetesCluster:
        body = await self._request("GET", self._kube_clusters(f"/{_seg(cluster_id)}"))
        return _parse(KubernetesCluster, body)

    async def list_kubernetes_clusters(self) -> list[KubernetesCluster]:
        body = await self._request("GET", self._kube_clusters())
        return [_parse(KubernetesCluster, c) for c in _items(body)]

    async def create_kubernetes_cluster(self, spec: Mapping[str, Any]) -> Operation:
        """`POST .../kubernetes/clusters` (`name`, `location`, `version`, `add_ons`, ...); a
        name taken raises CrusoeUnavailable(status=409), as for a Slurm cluster."""
        body = await self._request(
            "POST",
            self._kube_clusters(),
            json=dict(spec),
            idempotent=False,
            retry_on=CREATE_CLUSTER_RETRY_STATUSES,
        )
        return _operation(body)

    async def delete_kubernetes_cluster(self, cluster_id: str) -> Operation:
        path = self._kube_clusters(f"/{_seg(cluster_id)}")
        return _operation(await self._request("DELETE", path))

    async def get_kubernetes_credentials(self, cluster_id: str) -> KubernetesCredentials:
        """`POST .../{id}/get-credentials`: reads, changes nothing, so it retries as a GET."""
        path = self._kube_clusters(f"/{_seg(cluster_id)}/get-credentials")
        return _parse(KubernetesCredentials, await self._request("POST", path))

    # --- Managed Slurm clusters -----------------------------------------------------------

    def _slurm(self, suffix: str = "") -> str:
        return f"/projects/{_seg(self.project_id)}/slurm/clusters{suffix}"

    async def create_slurm_cluster(self, spec: Mapping[str, Any]) -> Operation:
        """`POST .../slurm/clusters`; a name taken raises CrusoeUnavailable(status=409)."""
        body = await self._request(
            "POST",
            self._slurm(),
            json=dict(spec),
            idempotent=False,
            retry_on=CREATE_CLUSTER_RETRY_STATUSES,
        )
        return _operation(body)

    async def list_slurm_clusters(self) -> list[SlurmCluster]:
        body = await self._request("GET", self._slurm())
        return [_parse(SlurmCluster, c) for c in _items(body)]

    async def find_slurm_cluster(self, name: str) -> SlurmCluster | None:
        return next((c for c in await self.list_slurm_clusters() if c.name == name), None)

    async def get_slurm_cluster(self, cluster_id: str) -> SlurmCluster:
        body = await self._request("GET", self._slurm(f"/{_seg(cluster_id)}"))
        return _parse(SlurmCluster, body)

    async def delete_slurm_cluster(self, cluster_id: str) -> Operation:
        return _operation(await self._request("DELETE", self._slurm(f"/{_seg(cluster_id)}")))

    async def configure_slurm_cluster(
        self, cluster_id: str, configuration: Mapping[str, Any]
    ) -> Operation:
        """EXT (emulator-only, UNCONFIRMED in the public API): the whole node layout,
        `{"node_sets", "topology_conf", "drained"}`; idempotent, so a PUT retries safely."""
        path = self._slurm(f"/{_seg(cluster_id)}/configuration")
        return _operation(await self._request("PUT", path, json=dict(configuration)))

    async def add_slurm_user(self, cluster_id: str, user: Mapping[str, Any]) -> None:
        """EXT (emulator-only; Crusoe's SlurmUser CR): `{"name", "ssh_public_keys",
        "slurm_account"}`; idempotent by name."""
        path = self._slurm(f"/{_seg(cluster_id)}/users")
        await self._request("POST", path, json=dict(user))

    # --- operations -----------------------------------------------------------------------

    def _operation_path(self, operation_id: str, kind: OperationKind) -> str:
        pid, oid = _seg(self.project_id), _seg(operation_id)
        if kind == "vm":
            return self._vms(f"/operations/{oid}")
        if kind == "node_pool":
            return self._pools(f"/operations/{oid}")
        if kind == "slurm_cluster":
            return self._slurm(f"/operations/{oid}")
        if kind == "kubernetes_cluster":
            return self._kube_clusters(f"/operations/{oid}")
        return f"/projects/{pid}/kubernetes/autocluster-operations/{oid}"

    async def get_operation(self, operation_id: str, kind: OperationKind) -> Operation:
        return _operation(await self._request("GET", self._operation_path(operation_id, kind)))

    async def list_operations(
        self,
        kind: OperationKind,
        *,
        resource_id: str | None = None,
        since: datetime | None = None,
    ) -> list[Operation]:
        """The operations of an API family (`GET .../operations`), filtered by the resource
        they act on (`resource_id`, a VM id) and by start time (`lower_time_bound`).

        The API lists operations in flight and those completed but not queried yet: what
        a worker that died right after submitting one never got to poll.
        """
        params: dict[str, str] = {}
        if resource_id:
            params["resource_id"] = resource_id
        if since is not None:
            # Whole seconds, as the API's examples: rounded down, so nothing is left out.
            params["lower_time_bound"] = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        path = self._operation_path("", kind).rstrip("/")
        return [_operation(o) for o in _items(await self._request("GET", path, params=params))]

    async def wait_operation(
        self,
        op: Operation,
        kind: OperationKind,
        *,
        poll_s: float | None = None,
        timeout_s: float | None = None,
        on_poll: Callable[[Operation], object] | None = None,
    ) -> Operation:
        """Poll until the operation leaves IN_PROGRESS; return it SUCCEEDED or raise.

        `on_poll` sees the operation before every wait (an activity heartbeats through it);
        it may be a plain function or a coroutine function.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not op.done:
            if on_poll is not None:
                result = on_poll(op)
                if inspect.isawaitable(result):
                    await result
            if deadline is not None and loop.time() >= deadline:
                raise CrusoeTimeout(
                    f"Crusoe operation {op.operation_id} still {op.state} after {timeout_s}s"
                )
            await asyncio.sleep(self.poll_s if poll_s is None else poll_s)
            op = await self.get_operation(op.operation_id, kind)
        if op.state != "SUCCEEDED":
            raise CrusoeOperationFailed(op.operation_id, op.failure_message())
        return op

    # --- transport ------------------------------------------------------------------------

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        told = _retry_after_s(retry_after)
        if told is not None:
            return min(told, max(self._max_backoff_s, 60.0))
        base: float = min(self._max_backoff_s, self._backoff_s * 2.0 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)  # jitter: many workers must not retry in step

    @staticmethod
    def _answer(resp: httpx.Response, method: str, path: str) -> Any:
        """A 2xx's JSON. A read answered without a body, or any body that is not JSON (a
        proxy's page), is no answer."""
        if not resp.content:
            if method == "GET":
                raise CrusoeUnavailable(
                    f"{method} {path}: {resp.status_code} with no body", status=resp.status_code
                )
            return {}
        try:
            return resp.json()
        except ValueError as e:
            raise CrusoeUnavailable(
                f"{method} {path}: {resp.status_code} but not JSON: {resp.text.strip()[:200]!r}",
                status=resp.status_code,
            ) from e

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        idempotent: bool = True,
        retry_on: frozenset[int] | None = None,
    ) -> Any:
        if retry_on is None:
            retry_on = RETRY_STATUSES if idempotent else UNSAFE_RETRY_STATUSES
        for attempt in range(1, self._max_attempts + 1):
            last = attempt == self._max_attempts
            try:
                resp = await self._http.request(method, path, params=params, json=json)
            except httpx.TransportError as e:
                # A refused connection never reached the API, so even a create may retry.
                never_sent = isinstance(e, httpx.ConnectError | httpx.ConnectTimeout)
                if last or not (idempotent or never_sent):
                    raise CrusoeUnavailable(f"{method} {path}: {e!r}") from e
                delay = self._delay(attempt, None)
                log.warning("crusoe %s %s: %r; retry %d in %.1fs", method, path, e, attempt, delay)
                await asyncio.sleep(delay)
                continue
            status = resp.status_code
            if status < 300:
                return self._answer(resp, method, path)
            message = _api_message(resp)
            if status in retry_on and not last:
                delay = self._delay(attempt, resp.headers.get("Retry-After"))
                log.warning(
                    "crusoe %s %s: %d %s; retry %d in %.1fs",
                    method, path, status, message, attempt, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                continue
            if status in RETRY_STATUSES:
                raise CrusoeUnavailable(f"{method} {path}: {status} {message}", status=status)
            error = CrusoeNotFound if status == 404 else CrusoeRequestError
            raise error(status, message, method=method, path=path)
        raise AssertionError("unreachable")  # the loop returns or raises
